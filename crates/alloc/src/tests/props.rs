//! Property tests: random alloc/free streams under several configs; after
//! every operation the structure and every stat must agree (check_invariants),
//! and the snapshot view must tile and stay disjoint.

use super::*;
use crate::{BlockState, FreeError, SimulatedDevice};
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Op {
    Malloc { size: u64, stream: u64, private: bool },
    Free(usize),
    FreeRequested(usize),
    FreeCompleted(usize),
    RecordStream(usize, u64),
    EmptyCache,
    FreeBogus(u64),
}

fn size() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => 1u64..=MIB,
        3 => MIB..=10 * MIB,
        2 => 10 * MIB..=100 * MIB,
        1 => prop::sample::select(vec![512u64, MIB, 2 * MIB, 10 * MIB, 20 * MIB, 40 * MIB]),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        10 => (size(), 0u64..3, prop::bool::weighted(0.1)).prop_map(|(size, stream, private)| Op::Malloc { size, stream, private }),
        6 => any::<usize>().prop_map(Op::Free),
        2 => any::<usize>().prop_map(Op::FreeRequested),
        2 => any::<usize>().prop_map(Op::FreeCompleted),
        1 => (any::<usize>(), 0u64..3).prop_map(|(i, s)| Op::RecordStream(i, s)),
        1 => Just(Op::EmptyCache),
        1 => any::<u64>().prop_map(Op::FreeBogus),
    ]
}

fn check_view(a: &CachingAllocator<SimulatedDevice>) {
    let segs = a.segments();
    let mut last_end = 0;
    for s in &segs {
        assert!(s.address >= last_end, "segments overlap at {:#x}", s.address);
        let mut at = s.address;
        for b in &s.blocks {
            assert_eq!(b.address, at, "blocks do not tile segment {:#x}", s.address);
            assert!(b.size > 0 && b.size % 512 == 0);
            at += b.size;
        }
        assert_eq!(at, s.address + s.total_size);
        last_end = at;
    }
    let st = a.stats();
    let alloc: u64 = segs.iter().map(|s| s.allocated_size()).sum();
    let active: u64 = segs.iter().map(|s| s.active_size()).sum();
    let reserved: u64 = segs.iter().map(|s| s.total_size).sum();
    let requested: u64 = segs.iter().map(|s| s.requested_size()).sum();
    assert_eq!(st.allocated_bytes.all().current as u64, alloc);
    assert_eq!(st.active_bytes.all().current as u64, active);
    assert_eq!(st.reserved_bytes.all().current as u64, reserved);
    assert_eq!(st.requested_bytes.all().current as u64, requested);
    for arr in
        [&st.allocated_bytes, &st.reserved_bytes, &st.active_bytes, &st.requested_bytes, &st.inactive_split_bytes]
    {
        for s in &arr.0 {
            assert!(s.peak >= s.current && s.current >= 0);
        }
    }
}

fn run(c: AllocatorConfig, ops: Vec<Op>) {
    let mut a = CachingAllocator::new(c, SimulatedDevice::synthetic(GIB));
    let mut live: Vec<u64> = Vec::new();
    let mut pending: Vec<u64> = Vec::new();
    for op in ops {
        match op {
            Op::Malloc { size, stream, private } => {
                let pool = if private { (1, 0) } else { (0, 0) };
                // A malloc may complete record_stream'ed frees (step 0) or sync
                // pending ones (fallback release): re-read the pending list after.
                if let Ok(p) = a.malloc_in_pool(size, stream, pool) {
                    assert!(!live.contains(&p));
                    live.push(p);
                }
                pending.retain(|&p| a.block_at(p).is_some_and(|b| b.state == BlockState::PendingFree));
            }
            Op::Free(i) if !live.is_empty() => {
                let p = live.swap_remove(i % live.len());
                a.free(p).unwrap();
                if a.block_at(p).is_some() {
                    pending.push(p);
                }
            }
            Op::FreeRequested(i) if !live.is_empty() => {
                let p = live.swap_remove(i % live.len());
                a.free_requested(p).unwrap();
                pending.push(p);
            }
            Op::FreeCompleted(i) if !pending.is_empty() => {
                let p = pending.swap_remove(i % pending.len());
                a.free_completed(p).unwrap();
                assert_eq!(a.free_completed(p), Err(FreeError::UnknownAddress(p)));
            }
            Op::RecordStream(i, s) if !live.is_empty() => {
                a.record_stream(live[i % live.len()], s).unwrap();
            }
            Op::EmptyCache => {
                a.empty_cache();
                pending.clear();
            }
            Op::FreeBogus(addr) if !live.contains(&addr) && !pending.contains(&addr) => {
                assert!(a.free(addr).is_err());
            }
            _ => {}
        }
        if let Err(e) = a.check_invariants() {
            panic!("invariant broken after {op:?}: {e}");
        }
        check_view(&a);
    }
    // Free everything: the cache must return to empty.
    for p in live {
        a.free(p).unwrap();
    }
    a.empty_cache();
    a.set_pool_freeable((1, 0), true);
    a.empty_cache();
    ok(&a);
    assert_eq!(a.stats().reserved_bytes.all().current, 0, "{:?}", a.segments());
    assert!(a.segments().is_empty());
    assert_eq!(a.device().used(), 0);
}

fn configs() -> Vec<AllocatorConfig> {
    let mut gc = cfg("garbage_collection_threshold:0.6,max_split_size_mb:40");
    gc.per_process_memory_fraction = 0.75;
    let mut reg = cfg("roundup_power2_divisions:[1:4,>:8]");
    reg.tie_break = crate::TieBreak::RegistrationOrder;
    vec![
        AllocatorConfig::default(),
        cfg("max_split_size_mb:40"),
        cfg("expandable_segments:True"),
        cfg("expandable_segments:True,max_split_size_mb:40"),
        gc,
        reg,
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn random_streams_default(ops in prop::collection::vec(op(), 1..300)) {
        run(configs()[0].clone(), ops);
    }
    #[test]
    fn random_streams_max_split(ops in prop::collection::vec(op(), 1..300)) {
        run(configs()[1].clone(), ops);
    }
    #[test]
    fn random_streams_expandable(ops in prop::collection::vec(op(), 1..300)) {
        run(configs()[2].clone(), ops);
    }
    #[test]
    fn random_streams_expandable_max_split(ops in prop::collection::vec(op(), 1..300)) {
        run(configs()[3].clone(), ops);
    }
    #[test]
    fn random_streams_gc_fraction(ops in prop::collection::vec(op(), 1..300)) {
        run(configs()[4].clone(), ops);
    }
    #[test]
    fn random_streams_rounding_registration(ops in prop::collection::vec(op(), 1..300)) {
        run(configs()[5].clone(), ops);
    }
}
