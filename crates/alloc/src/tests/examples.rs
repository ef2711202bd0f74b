//! Spec §3.8 worked examples, merge rules, deferred frees, tie-breaks.

use super::*;
use crate::config::TieBreak;
use crate::{BlockState, Event, FreeError};

#[test]
fn spec_3_8_default_sequence() {
    let mut a = sim(AllocatorConfig::default());
    // 1,000 B → small pool, new 2 MiB segment, split.
    let p1 = a.malloc(1000, 0).unwrap();
    assert_eq!(p1, A0);
    assert_eq!(
        a.drain_events(),
        vec![
            Event::SegmentAlloc { addr: A0, size: 2 * MIB, stream: 0 },
            Event::Alloc { addr: A0, size: 1000, stream: 0 }
        ]
    );
    let seg = &a.segments()[0];
    assert_eq!(seg.blocks.len(), 2);
    assert_eq!(seg.blocks[1].size, 2_096_128);
    assert_eq!(a.stats().inactive_split.small_pool().current, 1);

    // 5 MiB → large pool, 20 MiB segment B, split (R = 15 MiB).
    let b = slot(1);
    let p2 = a.malloc(5 * MIB, 0).unwrap();
    assert_eq!(p2, b);
    assert_eq!(
        a.drain_events(),
        vec![
            Event::SegmentAlloc { addr: b, size: 20 * MIB, stream: 0 },
            Event::Alloc { addr: b, size: 5 * MIB, stream: 0 }
        ]
    );
    // 12 MiB → best fit is the 15 MiB remainder, no CUDA call, R = 3 MiB split.
    let p3 = a.malloc(12 * MIB, 0).unwrap();
    assert_eq!(p3, b + 5 * MIB);
    assert_eq!(a.drain_events(), vec![Event::Alloc { addr: b + 5 * MIB, size: 12 * MIB, stream: 0 }]);
    // 14.5 MiB → only a 3 MiB block is cached: new 16 MiB segment, R = 1.5 MiB > 1 MiB → split.
    let c = slot(11);
    let p4 = a.malloc(29 * MIB / 2, 0).unwrap();
    assert_eq!(p4, c);
    assert_eq!(
        a.drain_events(),
        vec![
            Event::SegmentAlloc { addr: c, size: 16 * MIB, stream: 0 },
            Event::Alloc { addr: c, size: 29 * MIB / 2, stream: 0 }
        ]
    );
    let segs = a.segments();
    assert_eq!(segs.len(), 3);
    assert_eq!(segs[2].blocks.iter().map(|b| b.size).collect::<Vec<_>>(), vec![29 * MIB / 2, 3 * MIB / 2]);
    let st = a.stats();
    assert_eq!(st.segment.all().current, 3);
    assert_eq!(st.reserved_bytes.all().current as u64, 38 * MIB);
    assert_eq!(st.allocated_bytes.all().current as u64, 1024 + 5 * MIB + 12 * MIB + 29 * MIB / 2);
    assert_eq!(st.requested_bytes.all().current as u64, 1000 + 5 * MIB + 12 * MIB + 29 * MIB / 2);
    assert_eq!(st.num_device_alloc, 3);
    ok(&a);
}

#[test]
fn no_split_at_half_mib_remainder() {
    // 19.5 MiB with a cached 20 MiB block: R = 0.5 MiB → whole block, allocated +20 MiB.
    let mut a = sim(AllocatorConfig::default());
    let p = a.malloc(20 * MIB, 0).unwrap();
    a.free(p).unwrap();
    a.drain_events();
    let q = a.malloc(39 * MIB / 2, 0).unwrap();
    assert_eq!(q, p);
    assert_eq!(a.drain_events(), vec![Event::Alloc { addr: p, size: 39 * MIB / 2, stream: 0 }]);
    assert_eq!(a.stats().allocated_bytes.all().current as u64, 20 * MIB);
    assert_eq!(a.stats().requested_bytes.all().current as u64, 39 * MIB / 2);
    assert_eq!(a.segments()[0].blocks.len(), 1);
    ok(&a);
}

#[test]
fn split_thresholds() {
    // Large pool: split only if R > 1 MiB strictly.
    let mut a = sim(AllocatorConfig::default());
    let p = a.malloc(12 * MIB, 0).unwrap();
    a.free(p).unwrap();
    a.malloc(11 * MIB, 0).unwrap();
    assert_eq!(a.segments()[0].blocks.len(), 1, "R = 1 MiB: no split");
    let mut a = sim(AllocatorConfig::default());
    let p = a.malloc(12 * MIB, 0).unwrap();
    a.free(p).unwrap();
    a.malloc(11 * MIB - 512, 0).unwrap();
    assert_eq!(a.segments()[0].blocks.len(), 2, "R = 1 MiB + 512: split");
    // Small pool: split if R >= 512.
    let mut a = sim(AllocatorConfig::default());
    a.malloc(MIB, 0).unwrap();
    a.malloc(MIB - 512, 0).unwrap();
    let blocks: Vec<u64> = a.segments()[0].blocks.iter().map(|b| b.size).collect();
    assert_eq!(blocks, vec![MIB, MIB - 512, 512]);
    ok(&a);
}

#[test]
fn max_split_size_oversize_rules() {
    let c = cfg("max_split_size_mb:100");
    let mut a = sim(c);
    let p160 = a.malloc(160 * MIB, 0).unwrap();
    let p171 = a.malloc(171 * MIB, 0).unwrap(); // a 172 MiB block (2 MiB rounding)
    let st = a.stats();
    assert_eq!(st.oversize_segments.current, 2);
    assert_eq!(st.oversize_allocations.current, 2);
    a.free(p160).unwrap();
    a.free(p171).unwrap();
    // 150 MiB takes the cached 160 MiB block whole (160 < 150 + 20)...
    assert!(a.would_hit_cache(150 * MIB, 0, (0, 0)));
    assert_eq!(a.free_candidates(150 * MIB, 0, (0, 0)), vec![(p160, 160 * MIB), (p171, 172 * MIB)]);
    let q = a.malloc(150 * MIB, 0).unwrap();
    assert_eq!(q, p160);
    assert_eq!(a.stats().allocated_bytes.all().current as u64, 160 * MIB, "oversize blocks are never split");
    // ... but not the 172 MiB block (172 ≥ 150 + 20): a new segment instead.
    let before = a.stats().num_device_alloc;
    let r = a.malloc(150 * MIB, 0).unwrap();
    assert_ne!(r, p171);
    assert_eq!(a.stats().num_device_alloc, before + 1);
    // A 50 MiB request never takes a cached block ≥ 100 MiB.
    assert!(!a.would_hit_cache(50 * MIB, 0, (0, 0)));
    a.free(r).unwrap();
    assert!(!a.would_hit_cache(50 * MIB, 0, (0, 0)));
    ok(&a);
}

#[test]
fn max_non_split_rounding_widens_the_slack() {
    let mut a = sim(cfg("max_split_size_mb:100,max_non_split_rounding_mb:40"));
    let p = a.malloc(171 * MIB, 0).unwrap();
    a.free(p).unwrap();
    assert!(a.would_hit_cache(150 * MIB, 0, (0, 0)), "171 < 150 + 40");
}

#[test]
fn streams_never_share_blocks() {
    let mut a = sim(AllocatorConfig::default());
    let p = a.malloc(4 * MIB, 1).unwrap();
    a.free(p).unwrap();
    assert!(!a.would_hit_cache(4 * MIB, 2, (0, 0)));
    let q = a.malloc(4 * MIB, 2).unwrap();
    assert_ne!(q, p);
    assert_eq!(a.stats().segment.all().current, 2);
    ok(&a);
}

#[test]
fn best_fit_lowest_address_among_equal_sizes() {
    let mut a = sim(AllocatorConfig::default());
    // Two 12 MiB segments, freed in reverse order.
    let x = a.malloc(12 * MIB, 0).unwrap();
    let y = a.malloc(12 * MIB, 0).unwrap();
    a.free(y).unwrap();
    a.free(x).unwrap();
    assert_eq!(a.malloc(12 * MIB, 0).unwrap(), x.min(y));
}

#[test]
fn registration_order_tie_break() {
    // Same layout under both tie-breaks: an older segment at a higher address.
    let run = |tb: TieBreak| {
        let c = AllocatorConfig { tie_break: tb, ..Default::default() };
        let mut dev = crate::SimulatedDevice::oracle(80 * GIB);
        dev.push_oracle_segment(A0 + 100 * MIB, 12 * MIB); // registered first, high address
        dev.push_oracle_segment(A0, 12 * MIB); // registered second, low address
        let mut a = crate::CachingAllocator::new(c, dev);
        let hi = a.malloc(12 * MIB, 0).unwrap();
        let lo = a.malloc(12 * MIB, 0).unwrap();
        assert_eq!((hi, lo), (A0 + 100 * MIB, A0));
        a.free(lo).unwrap();
        a.free(hi).unwrap();
        let segs = a.segments();
        assert_eq!(segs[0].registration, 1);
        assert_eq!(segs[1].registration, 0);
        a.malloc(12 * MIB, 0).unwrap()
    };
    assert_eq!(run(TieBreak::Address), A0, "lowest address wins");
    assert_eq!(run(TieBreak::RegistrationOrder), A0 + 100 * MIB, "oldest segment wins");
}

#[test]
fn merge_prev_then_next_and_whole_segment_again() {
    let mut a = sim(AllocatorConfig::default());
    let p1 = a.malloc(4 * MIB, 0).unwrap();
    let p2 = a.malloc(4 * MIB, 0).unwrap();
    let p3 = a.malloc(4 * MIB, 0).unwrap();
    assert_eq!((p2, p3), (p1 + 4 * MIB, p1 + 8 * MIB));
    assert_eq!(a.stats().inactive_split.all().current, 1); // the 8 MiB tail
    a.free(p1).unwrap();
    a.free(p3).unwrap(); // merges with the tail
    assert_eq!(a.stats().inactive_split.all().current, 2);
    assert_eq!(a.stats().inactive_split_bytes.all().current as u64, 4 * MIB + 12 * MIB);
    a.free(p2).unwrap(); // merges prev and next: whole segment
    let segs = a.segments();
    assert_eq!(
        segs[0].blocks,
        vec![crate::BlockInfo { address: p1, size: 20 * MIB, requested_size: 4 * MIB, state: BlockState::Free }]
    );
    assert_eq!(a.stats().inactive_split.all().current, 0);
    assert_eq!(a.stats().inactive_split_bytes.all().current, 0);
    ok(&a);
    a.drain_events();
    a.empty_cache();
    assert_eq!(
        a.drain_events(),
        vec![Event::SegmentFree { addr: p1, size: 20 * MIB, stream: 0 }],
        "a whole free segment goes back"
    );
    assert_eq!(a.stats().num_sync_all_streams, 1);
    ok(&a);
}

#[test]
fn split_segments_are_not_released() {
    let mut a = sim(AllocatorConfig::default());
    let p = a.malloc(4 * MIB, 0).unwrap();
    let _q = a.malloc(4 * MIB, 0).unwrap();
    a.free(p).unwrap();
    a.drain_events();
    a.empty_cache();
    assert!(a.drain_events().is_empty());
    assert_eq!(a.stats().inactive_split_bytes.all().current as u64, 16 * MIB);
}

#[test]
fn deferred_free_blocks_reuse_and_merge() {
    let mut a = sim(AllocatorConfig::default());
    let p1 = a.malloc(4 * MIB, 0).unwrap();
    let p2 = a.malloc(4 * MIB, 0).unwrap();
    a.drain_events();
    a.free_requested(p1).unwrap();
    assert_eq!(a.drain_events(), vec![Event::FreeRequested { addr: p1, size: 4 * MIB, stream: 0 }]);
    assert_eq!(a.stats().allocation.all().current, 1);
    assert_eq!(a.stats().active.all().current, 2, "pending free is still active");
    assert_eq!(a.block_at(p1).unwrap().state, BlockState::PendingFree);
    // The pending block is unusable: a 4 MiB request goes to the tail.
    assert_eq!(a.malloc(4 * MIB, 0).unwrap(), p2 + 4 * MIB);
    // A pending neighbour does not merge: free p2 → stays separate from p1.
    a.free(p2).unwrap();
    assert_eq!(a.segments()[0].blocks.len(), 4);
    assert_eq!(a.free(p1), Err(FreeError::NotAllocated(p1)));
    a.drain_events();
    a.free_completed(p1).unwrap();
    assert_eq!(a.drain_events(), vec![Event::FreeCompleted { addr: p1, size: 4 * MIB, stream: 0 }]);
    assert_eq!(a.segments()[0].blocks.len(), 3, "p1 merged with p2's free block");
    assert_eq!(a.free_completed(p1), Err(FreeError::UnknownAddress(p1)));
    ok(&a);
}

#[test]
fn record_stream_defers_until_next_malloc() {
    let mut a = sim(AllocatorConfig::default());
    let p = a.malloc(1000, 7).unwrap();
    a.record_stream(p, 9).unwrap();
    a.drain_events();
    a.free(p).unwrap();
    assert_eq!(a.drain_events(), vec![Event::FreeRequested { addr: p, size: 1000, stream: 7 }]);
    // Step 0 of the next malloc completes it, before the malloc's own events.
    let q = a.malloc(1000, 7).unwrap();
    assert_eq!(q, p);
    assert_eq!(
        a.drain_events(),
        vec![Event::FreeCompleted { addr: p, size: 1000, stream: 7 }, Event::Alloc { addr: p, size: 1000, stream: 7 }]
    );
    // record_stream on the block's own stream does not defer.
    a.record_stream(q, 7).unwrap();
    a.free(q).unwrap();
    assert_eq!(a.drain_events().len(), 2);
    ok(&a);
}

#[test]
fn empty_cache_syncs_pending_frees_first() {
    let mut a = sim(AllocatorConfig::default());
    let p = a.malloc(12 * MIB, 0).unwrap();
    a.free_requested(p).unwrap();
    a.drain_events();
    a.empty_cache();
    assert_eq!(
        a.drain_events(),
        vec![
            Event::FreeCompleted { addr: p, size: 12 * MIB, stream: 0 },
            Event::SegmentFree { addr: p, size: 12 * MIB, stream: 0 }
        ]
    );
    ok(&a);
}

#[test]
fn release_order_large_pool_first_in_set_order() {
    let mut a = sim(AllocatorConfig::default());
    let s1 = a.malloc(1000, 0).unwrap();
    let l1 = a.malloc(16 * MIB, 0).unwrap();
    let l2 = a.malloc(12 * MIB, 0).unwrap();
    let l3 = a.malloc(12 * MIB, 5).unwrap();
    for p in [s1, l1, l2, l3] {
        a.free(p).unwrap();
    }
    a.drain_events();
    a.empty_cache();
    let order: Vec<u64> = a
        .drain_events()
        .into_iter()
        .map(|e| match e {
            Event::SegmentFree { addr, .. } => addr,
            e => panic!("{e:?}"),
        })
        .collect();
    assert_eq!(order, vec![l2, l1, l3, s1], "(stream, size, address), large before small");
}

#[test]
fn free_errors_are_values() {
    let mut a = sim(AllocatorConfig::default());
    assert_eq!(a.free(123), Err(FreeError::UnknownAddress(123)));
    let p = a.malloc(1 << 12, 0).unwrap();
    assert_eq!(a.free(p + 512), Err(FreeError::UnknownAddress(p + 512)));
    assert_eq!(a.free_completed(p), Err(FreeError::NotPending(p)));
    assert_eq!(a.record_stream(p + 1, 3), Err(FreeError::UnknownAddress(p + 1)));
    a.free(p).unwrap();
    assert_eq!(a.free(p), Err(FreeError::UnknownAddress(p)));
    ok(&a);
}

#[test]
fn private_pools_are_separate_and_released_when_freeable() {
    let mut a = sim(AllocatorConfig::default());
    let pool = (1, 0);
    let p = a.malloc_in_pool(4 * MIB, 0, pool).unwrap();
    a.free(p).unwrap();
    assert!(!a.would_hit_cache(4 * MIB, 0, (0, 0)));
    assert!(a.would_hit_cache(4 * MIB, 0, pool));
    assert_eq!(a.segments()[0].pool, pool);
    a.empty_cache();
    assert_eq!(a.segments().len(), 1, "a pool in use keeps its segments");
    a.set_pool_freeable(pool, true);
    a.empty_cache();
    assert!(a.segments().is_empty());
    ok(&a);
}

#[test]
fn seeding_counts_stats_without_events() {
    use crate::{SeedBlock, SeedSegment};
    let mut a = sim(AllocatorConfig::default());
    let base = 0x1_0000_0000;
    let blk =
        |off: u64, size: u64, req: u64, state| SeedBlock { address: base + off, size, requested_size: req, state };
    a.seed_segment(SeedSegment {
        address: base,
        size: 20 * MIB,
        stream: 0,
        pool: (0, 0),
        is_large: true,
        is_expandable: false,
        registration: None,
        blocks: vec![
            blk(0, 4 * MIB, 4 * MIB - 7, BlockState::Allocated),
            blk(4 * MIB, 4 * MIB, 4 * MIB, BlockState::PendingFree),
            blk(8 * MIB, 12 * MIB, 0, BlockState::Free),
        ],
    })
    .unwrap();
    assert!(a.drain_events().is_empty());
    let st = a.stats();
    assert_eq!(st.segment.all().current, 1);
    assert_eq!(st.allocation.all().current, 1);
    assert_eq!(st.active.all().current, 2);
    assert_eq!(st.inactive_split_bytes.all().current as u64, 12 * MIB);
    ok(&a);
    // Overlap is an error, not a panic.
    let bad = SeedSegment {
        address: base + 2 * MIB,
        size: 2 * MIB,
        stream: 0,
        pool: (0, 0),
        is_large: true,
        is_expandable: false,
        registration: None,
        blocks: vec![SeedBlock { address: base + 2 * MIB, size: 2 * MIB, requested_size: 1, state: BlockState::Free }],
    };
    assert!(matches!(a.seed_segment(bad), Err(crate::SeedError::Overlap { .. })));
    let gap = SeedSegment {
        address: 0x9_0000_0000,
        size: 2 * MIB,
        stream: 0,
        pool: (0, 0),
        is_large: false,
        is_expandable: false,
        registration: None,
        blocks: vec![SeedBlock { address: 0x9_0000_0000, size: MIB, requested_size: 1, state: BlockState::Free }],
    };
    assert!(matches!(a.seed_segment(gap), Err(crate::SeedError::BadTiling { .. })));
    // The seeded state behaves: complete the pending free, then it merges.
    a.free_completed(base + 4 * MIB).unwrap();
    a.free(base).unwrap();
    assert_eq!(a.segments()[0].blocks.len(), 1);
    a.empty_cache();
    assert!(a.segments().is_empty());
    ok(&a);
}

#[test]
fn absurd_sizes_are_ooms_not_panics() {
    let mut a = sim(AllocatorConfig::default());
    assert!(a.malloc(u64::MAX, 0).is_err());
    assert!(a.malloc(u64::MAX / 2, 0).is_err());
    let mut a = sim(cfg("expandable_segments:True,roundup_power2_divisions:4"));
    assert!(a.malloc(u64::MAX, 0).is_err());
    assert!(a.malloc(100 * GIB, 0).is_err());
    let c = AllocatorConfig { roundup_power2_divisions: [1 << 62; 16], ..Default::default() };
    assert_eq!(crate::rounding::round_size(u64::MAX, &c), u64::MAX);
    ok(&a);
}

/// Throughput check: `cargo test --release -p fragscope-alloc -- --ignored --nocapture throughput`.
#[test]
#[ignore]
fn throughput() {
    let mut a = sim(AllocatorConfig::default());
    a.set_record_events(true);
    let mut live: Vec<u64> = Vec::new();
    let mut x: u64 = 0x2545F4914F6CDD1D;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut events = Vec::with_capacity(1 << 16);
    let mut count = 0u64;
    let t = std::time::Instant::now();
    for _ in 0..3_000_000 {
        let r = rnd();
        if live.len() < 2000 && (r % 2 == 0 || live.is_empty()) {
            let size = match r % 10 {
                0..=5 => 512 + (r >> 8) % MIB,
                6..=8 => MIB + (r >> 8) % (9 * MIB),
                _ => 10 * MIB + (r >> 8) % (40 * MIB),
            };
            if let Ok(p) = a.malloc(size, (r >> 40) % 2) {
                live.push(p);
            }
        } else {
            let i = (r >> 16) as usize % live.len();
            let p = live.swap_remove(i);
            a.free(p).unwrap();
        }
        a.drain_events_into(&mut events);
        count += events.len() as u64;
        events.clear();
    }
    let dt = t.elapsed().as_secs_f64();
    println!("{count} events in {dt:.3} s: {:.1} M events/s; {} segments", count as f64 / dt / 1e6, a.segments().len());
}
