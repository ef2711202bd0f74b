//! Memory by role (being built: the types the frozen evaluation
//! `tests/roles_ground_truth.rs` reads; the classifier comes next).

use std::collections::BTreeMap;

use fragscope_snapshot::Snapshot;
use serde::Serialize;

/// Bytes one role held.
#[derive(Clone, Debug, Default, Serialize)]
pub struct RoleBytes {
    /// At the allocated peak.
    pub at_peak: u64,
    /// The most the role held at any moment.
    pub max: u64,
}

/// Memory by role of one device.
#[derive(Clone, Debug, Serialize)]
pub struct DeviceRoles {
    pub device: i64,
    pub by_role: BTreeMap<&'static str, RoleBytes>,
}

/// Roles of `device`'s memory. Not written yet.
pub fn device_roles(_snap: &Snapshot, _device: i64) -> DeviceRoles {
    unimplemented!("roles: the classifier is not written yet")
}
