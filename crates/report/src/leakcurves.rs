//! Per-step curves of the leak suspects: the live bytes of each suspect's call site
//! at each step boundary `analyze` used (the trace state just before the boundary
//! entry, thinned to at most [`MAX_LEAK_SAMPLES`] as `analyze` thins them), so the page can
//! draw the growth the suspect was reported for.
//!
//! Call sites are `analyze`'s ([`site_of`], by its `file:line:function` name); blocks
//! allocated before the trace began belong to no suspect, as in `analyze`. The bytes are
//! counted from the block lives ([`BlockLives`]) of the walk the analysis made.

use fragscope_diagnose::{Analysis, MAX_LEAK_SAMPLES};
use fragscope_snapshot::{FxHashMap, Snapshot, StackId};
use fragscope_trace::{live_bytes_at, site_of, BlockLives};
use serde::Serialize;

use crate::encode;

/// Samples of one suspect.
#[derive(Serialize)]
pub struct LeakCurve {
    /// The suspect's `site` (as in `analyze --json`).
    pub site: String,
    /// Live bytes at each boundary (base64 Float64Array).
    pub bytes: String,
}

/// Trace states sampled, and one curve per suspect (empty when `analyze` found none).
pub fn curves(snap: &Snapshot, device: i64, ana: &Analysis, lives: &BlockLives) -> (Vec<usize>, Vec<LeakCurve>) {
    let Some(d) = ana.devices.iter().find(|d| d.device == device) else { return (Vec::new(), Vec::new()) };
    if d.leak_suspects.is_empty() {
        return (Vec::new(), Vec::new());
    }
    let b = &d.leak_steps.boundaries;
    let used: Vec<usize> = if b.len() <= MAX_LEAK_SAMPLES {
        b.clone()
    } else {
        (0..MAX_LEAK_SAMPLES).map(|k| b[k * (b.len() - 1) / (MAX_LEAK_SAMPLES - 1)]).collect()
    };
    let names: Vec<&str> = d.leak_suspects.iter().map(|s| s.site.site.as_str()).collect();
    // The live bytes of each suspect's blocks at each boundary, from the block lives
    // of the walk the analysis made (`lives`), without another walk.
    let mut suspect_of: FxHashMap<Option<StackId>, Option<usize>> = FxHashMap::default();
    let mut suspect = |stack: Option<StackId>| {
        *suspect_of.entry(stack).or_insert_with(|| {
            let site = site_of(&snap.frames, stack).site;
            names.iter().position(|n| *n == site)
        })
    };
    let events = snap.trace(device);
    let rows = live_bytes_at(
        &used,
        names.len(),
        lives.traced.iter().filter_map(|l| Some((suspect(l.stack(events))?, Some(l.alloc()), l.end(), l.size))),
    );
    let samples: Vec<Vec<f64>> =
        (0..names.len()).map(|k| rows.iter().take(used.len()).map(|r| r[k] as f64).collect()).collect();
    let curves =
        names.iter().zip(samples).map(|(n, s)| LeakCurve { site: n.to_string(), bytes: encode::f64s(&s) }).collect();
    (used, curves)
}
