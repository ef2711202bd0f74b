//! Training steps and their phases, from evidence in the trace (being built: the types
//! the frozen evaluation `tests/roles_ground_truth.rs` reads; the detector comes next).

use fragscope_snapshot::Snapshot;
use serde::Serialize;

/// One training step of a device's trace.
#[derive(Clone, Debug, Serialize)]
pub struct Step {
    /// Layers found inside the step's forward (or backward) phase.
    pub layers: Option<usize>,
}

/// The steps of one device's trace.
#[derive(Clone, Debug, Serialize)]
pub struct Steps {
    pub device: i64,
    pub steps: Vec<Step>,
}

/// The steps of `device`'s trace. Not written yet.
pub fn steps(_snap: &Snapshot, _device: i64) -> Steps {
    unimplemented!("steps: the detector is not written yet")
}
