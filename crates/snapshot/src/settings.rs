//! Typed access to `allocator_settings` (2.3+), which the model keeps verbatim.

use crate::model::Snapshot;
use crate::pyobj::PyObj;

/// The allocator settings a snapshot recorded, in the form the replay needs.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RecordedSettings {
    /// `PYTORCH_CUDA_ALLOC_CONF` as last parsed (may be empty).
    pub conf: Option<String>,
    /// `None` = unlimited (written as −1 or 2^64−1).
    pub max_split_size: Option<u64>,
    pub garbage_collection_threshold: Option<f64>,
    pub expandable_segments: Option<bool>,
    /// `(interval start in MiB, divisions)` in key order.
    pub roundup_power2_divisions: Vec<(u64, u64)>,
}

impl Snapshot {
    /// `None` when the file has no `allocator_settings` (before 2.3).
    pub fn recorded_settings(&self) -> Option<RecordedSettings> {
        let s = self.allocator_settings.as_ref()?;
        let max_split_size = match s.get("max_split_size") {
            Some(PyObj::Int(i)) if *i < 0 => None,
            Some(v) => v.as_u64().filter(|&v| v != u64::MAX && v != i64::MAX as u64),
            None => None,
        };
        let mut divs = Vec::new();
        if let Some(PyObj::Dict(d)) = s.get("roundup_power2_divisions") {
            for (k, v) in d {
                if let (Some(k), Some(v)) = (k.as_str().and_then(|k| k.parse().ok()), v.as_u64()) {
                    divs.push((k, v));
                }
            }
        }
        Some(RecordedSettings {
            conf: s.get("PYTORCH_CUDA_ALLOC_CONF").and_then(|v| v.as_str()).map(str::to_string),
            max_split_size,
            garbage_collection_threshold: s.get("garbage_collection_threshold").and_then(PyObj::as_f64),
            expandable_segments: s.get("expandable_segments").and_then(PyObj::as_bool),
            roundup_power2_divisions: divs,
        })
    }
}
