//! Behaviour tests against the spec's worked examples, and property tests.

mod examples;
mod expandable;
mod fallbacks;
mod options;
mod props;

use crate::device::{SimulatedDevice, SYNTHETIC_ALIGN, SYNTHETIC_BASE};
use crate::{AllocatorConfig, CachingAllocator};

pub(crate) const MIB: u64 = 1 << 20;
pub(crate) const GIB: u64 = 1 << 30;
/// First synthetic segment address.
pub(crate) const A0: u64 = SYNTHETIC_BASE;

/// The n-th synthetic 2 MiB slot.
pub(crate) fn slot(n: u64) -> u64 {
    SYNTHETIC_BASE + n * SYNTHETIC_ALIGN
}

pub(crate) fn sim(cfg: AllocatorConfig) -> CachingAllocator<SimulatedDevice> {
    CachingAllocator::new(cfg, SimulatedDevice::synthetic(80 * GIB))
}

pub(crate) fn cfg(s: &str) -> AllocatorConfig {
    crate::config::parse(s).unwrap()
}

pub(crate) fn ok<D: crate::DeviceMemory>(a: &CachingAllocator<D>) {
    if let Err(e) = a.check_invariants() {
        panic!("invariant broken: {e}");
    }
}
