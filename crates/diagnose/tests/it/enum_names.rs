//! The enums of the JSON documents serialize as their `as_str` (and `Display`) says: the
//! text front ends print and the JSON they emit cannot drift apart.

use fragscope_diagnose::{
    LeakStepSource, LimitKind, OomCapacitySource, OomStateSource, PoolKind, WindowBy, WindowEndState,
};

fn same<T: serde::Serialize + std::fmt::Display>(values: &[T], names: &[&str]) {
    assert_eq!(values.len(), names.len());
    for (v, name) in values.iter().zip(names) {
        assert_eq!(serde_json::to_string(v).unwrap(), format!("\"{name}\""));
        assert_eq!(v.to_string(), *name);
    }
}

#[test]
fn json_names_are_the_display_names() {
    same(&[PoolKind::Large, PoolKind::Small], &["large", "small"]);
    // Free space is listed by (stream, pool id, pool): the order JSON's names sort in.
    assert!(PoolKind::Large < PoolKind::Small);
    same(
        &[
            OomCapacitySource::File,
            OomCapacitySource::EstimateReservedPlusDeviceFree,
            OomCapacitySource::EstimateMemoryFractionCap,
        ],
        &["file", "estimate_reserved_plus_device_free", "estimate_memory_fraction_cap"],
    );
    same(&[OomStateSource::BackwardWalk, OomStateSource::Timeline], &["backward_walk", "timeline"]);
    same(&[WindowEndState::Recorded, WindowEndState::BackwardWalk], &["recorded", "backward_walk"]);
    same(&[WindowBy::Index, WindowBy::Time], &["index", "time"]);
    same(
        &[LimitKind::MaxReserved, LimitKind::MaxAllocated, LimitKind::MaxPeakFragmentation, LimitKind::NoLeaks],
        &["max_reserved", "max_allocated", "max_peak_fragmentation", "no_leaks"],
    );
    same(&[LeakStepSource::Steps, LeakStepSource::None], &["steps", "none"]);
}
