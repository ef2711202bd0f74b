//! Expandable segments (§6): placement, growth, potential-size rule, unmapping.

use super::*;
use crate::{BlockState, Event};

fn exp() -> CachingAllocator<crate::SimulatedDevice> {
    sim(cfg("expandable_segments:True"))
}

fn sizes(a: &CachingAllocator<crate::SimulatedDevice>) -> Vec<Vec<(u64, BlockState)>> {
    a.segments().iter().map(|s| s.blocks.iter().map(|b| (b.size / (MIB / 2), b.state)).collect()).collect()
}

#[test]
fn maps_pages_and_grows_in_place() {
    use BlockState::*;
    let mut a = exp();
    let p = a.malloc(5 * MIB, 0).unwrap();
    assert_eq!(p, A0);
    assert_eq!(
        a.drain_events(),
        vec![
            Event::SegmentMap { addr: A0, size: 20 * MIB, stream: 0 },
            Event::Alloc { addr: A0, size: 5 * MIB, stream: 0 }
        ]
    );
    assert_eq!(a.stats().segment.all().current, 0, "mappings are not segments");
    assert_eq!(a.stats().reserved_bytes.large_pool().current as u64, 20 * MIB);
    // 30 MiB: the 15 MiB free tail plus one more page, at the lowest address.
    let q = a.malloc(30 * MIB, 0).unwrap();
    assert_eq!(q, A0 + 5 * MIB);
    assert_eq!(
        a.drain_events(),
        vec![
            Event::SegmentMap { addr: A0 + 20 * MIB, size: 20 * MIB, stream: 0 },
            Event::Alloc { addr: q, size: 30 * MIB, stream: 0 }
        ]
    );
    let segs = a.segments();
    assert_eq!(segs.len(), 1);
    assert!(segs[0].is_expandable);
    assert_eq!((segs[0].address, segs[0].total_size), (A0, 40 * MIB));
    assert_eq!(sizes(&a), vec![vec![(10, Allocated), (60, Allocated), (10, Free)]]);
    assert_eq!(a.stats().num_device_alloc, 2);
    assert_eq!(a.stats().inactive_split.all().current, 0, "expandable blocks are not inactive_split");
    ok(&a);

    // Release: only whole interior pages are unmapped.
    a.free(q).unwrap();
    a.drain_events();
    a.empty_cache();
    assert_eq!(a.drain_events(), vec![Event::SegmentUnmap { addr: A0 + 20 * MIB, size: 20 * MIB, stream: 0 }]);
    assert_eq!(sizes(&a), vec![vec![(10, Allocated), (30, Free)]]);
    assert_eq!(a.stats().reserved_bytes.all().current as u64, 20 * MIB);
    assert_eq!(a.stats().num_device_free, 1);
    ok(&a);
    a.free(p).unwrap();
    a.drain_events();
    a.empty_cache();
    assert_eq!(a.drain_events(), vec![Event::SegmentUnmap { addr: A0, size: 20 * MIB, stream: 0 }]);
    assert!(a.segments().is_empty(), "fully unmapped reservation is destroyed");
    assert_eq!(a.reserved_bytes(), 0);
    ok(&a);
}

#[test]
fn partial_pages_stay_mapped() {
    use BlockState::*;
    let mut a = exp();
    let p = a.malloc(15 * MIB, 0).unwrap(); // page 0
    let q = a.malloc(20 * MIB, 0).unwrap(); // 5 MiB of page 0 + page 1
    let r = a.malloc(10 * MIB, 0).unwrap(); // 5 MiB of page 1... then page 2
    assert_eq!((q, r), (p + 15 * MIB, p + 35 * MIB));
    a.free(q).unwrap(); // free [15, 35): contains no whole page besides [20, 40)? no: page 1 is [20, 40)
    a.drain_events();
    a.empty_cache();
    // [15, 35) holds no whole page: nothing to unmap.
    assert!(a.drain_events().is_empty());
    assert_eq!(sizes(&a), vec![vec![(30, Allocated), (40, Free), (20, Allocated), (30, Free)]]);
    ok(&a);
}

#[test]
fn potential_size_prefers_a_block_that_cannot_grow() {
    use BlockState::*;
    let mut a = exp();
    let p1 = a.malloc(6 * MIB, 0).unwrap();
    let _p2 = a.malloc(9 * MIB, 0).unwrap(); // leaves a 5 MiB growable tail
    a.free(p1).unwrap(); // 6 MiB block that cannot grow
    assert_eq!(a.free_candidates(5 * MIB, 0, (0, 0)), vec![(A0 + 15 * MIB, 5 * MIB), (A0, 6 * MIB)]);
    let x = a.malloc(5 * MIB, 0).unwrap();
    assert_eq!(x, A0, "the 6 MiB block wins over the growable 5 MiB tail");
    // Split remainder ≥ 512 even in the large pool.
    assert_eq!(sizes(&a), vec![vec![(10, Allocated), (2, Free), (18, Allocated), (10, Free)]]);
    ok(&a);
}

#[test]
fn small_pool_uses_2mib_pages_and_own_reservation() {
    let mut a = exp();
    let p = a.malloc(1000, 0).unwrap();
    let q = a.malloc(5 * MIB, 0).unwrap();
    let ev = a.drain_events();
    assert_eq!(ev[0], Event::SegmentMap { addr: p, size: 2 * MIB, stream: 0 });
    assert!(matches!(ev[2], Event::SegmentMap { size, .. } if size == 20 * MIB));
    assert_ne!(p, q);
    let segs = a.segments();
    assert_eq!(segs.len(), 2);
    assert_eq!(segs.iter().filter(|s| s.is_large).count(), 1);
    // 9/8 of 80 GiB of VA per reservation: the second one starts 90 GiB later.
    assert_eq!(q.max(p) - q.min(p), 90 * GIB);
    ok(&a);
}

#[test]
fn stream_gets_its_own_reservation() {
    let mut a = exp();
    let p = a.malloc(MIB * 4, 1).unwrap();
    let q = a.malloc(MIB * 4, 2).unwrap();
    assert_eq!(q - p, 90 * GIB);
    ok(&a);
}

#[test]
fn map_failure_runs_the_fallbacks() {
    let mut a = exp();
    let p = a.malloc(30 * MIB, 0).unwrap();
    a.free(p).unwrap(); // 40 MiB mapped, free
    a.drain_events();
    a.device_mut().fail_next_map();
    // 50 MiB: the free 40 MiB block + one page; the map fails; release
    // unmaps everything, which destroys the reservation; the retry creates a
    // new one (the synthetic device never reuses VA) and maps 60 MiB.
    let q = a.malloc(50 * MIB, 0).unwrap();
    let fresh = A0 + 90 * GIB;
    assert_eq!(q, fresh);
    assert_eq!(
        a.drain_events(),
        vec![
            Event::SegmentUnmap { addr: A0, size: 40 * MIB, stream: 0 },
            Event::SegmentMap { addr: fresh, size: 60 * MIB, stream: 0 },
            Event::Alloc { addr: fresh, size: 50 * MIB, stream: 0 },
        ]
    );
    assert_eq!(a.stats().num_alloc_retries, 1);
    ok(&a);
}

#[test]
fn seeded_expandable_ranges_share_a_reservation() {
    use crate::{SeedBlock, SeedSegment};
    let mut a = exp();
    let base = 0x2_0000_0000u64;
    let seg = |addr: u64, blocks: Vec<(u64, BlockState)>| {
        let mut at = addr;
        let blocks: Vec<SeedBlock> = blocks
            .into_iter()
            .map(|(size, state)| {
                let b = SeedBlock { address: at, size, requested_size: size, state };
                at += size;
                b
            })
            .collect();
        SeedSegment {
            address: addr,
            size: at - addr,
            stream: 0,
            pool: (0, 0),
            is_large: true,
            is_expandable: true,
            registration: None,
            blocks,
        }
    };
    a.seed_segment(seg(base, vec![(8 * MIB, BlockState::Allocated), (12 * MIB, BlockState::Free)])).unwrap();
    a.seed_segment(seg(base + 60 * MIB, vec![(20 * MIB, BlockState::Allocated)])).unwrap();
    assert_eq!(a.segments().len(), 2);
    assert_eq!(a.stats().reserved_bytes.all().current as u64, 40 * MIB);
    ok(&a);
    // Growing from the first range maps the hole between them.
    let p = a.malloc(30 * MIB, 0).unwrap();
    assert_eq!(p, base + 8 * MIB);
    assert_eq!(
        a.drain_events(),
        vec![
            Event::SegmentMap { addr: base + 20 * MIB, size: 20 * MIB, stream: 0 },
            Event::Alloc { addr: p, size: 30 * MIB, stream: 0 }
        ]
    );
    ok(&a);
}

/// A non-expandable segment seeded into an allocator run under `expandable_segments:True`
/// (a cache the recorded settings made before the trace) with `blocks`, at `addr`.
fn seed_plain(a: &mut CachingAllocator<crate::SimulatedDevice>, addr: u64, blocks: &[(u64, BlockState)]) {
    use crate::{SeedBlock, SeedSegment};
    let mut at = addr;
    let blocks: Vec<SeedBlock> = blocks
        .iter()
        .map(|&(size, state)| {
            let b = SeedBlock { address: at, size, requested_size: size, state };
            at += size;
            b
        })
        .collect();
    let seg = SeedSegment {
        address: addr,
        size: at - addr,
        stream: 0,
        pool: (0, 0),
        is_large: true,
        is_expandable: false,
        registration: None,
        blocks,
    };
    a.seed_segment(seg).unwrap();
}

#[test]
fn a_failed_map_releases_whole_seeded_segments_but_not_split_ones() {
    use BlockState::*;
    // A 200 MiB device holding a 100 MiB non-expandable segment from before the trace.
    // A 120 MiB request finds no free block of its size and maps 6 pages: over the
    // device. PyTorch's fallback, release_cached_blocks (§3.7, §5.2), returns the
    // segment when it is wholly free, and the retried map fits.
    let mut a = CachingAllocator::new(cfg("expandable_segments:True"), crate::SimulatedDevice::synthetic(200 * MIB));
    seed_plain(&mut a, 0x2_0000_0000, &[(100 * MIB, Free)]);
    a.drain_events();
    let p = a.malloc(120 * MIB, 0).unwrap();
    let ev = a.drain_events();
    assert!(matches!(ev[0], Event::SegmentFree { addr: 0x2_0000_0000, size, .. } if size == 100 * MIB), "{ev:?}");
    assert!(matches!(ev[1], Event::SegmentMap { size, .. } if size == 120 * MIB), "{ev:?}");
    assert_eq!(a.block_at(p).map(|b| b.size), Some(120 * MIB));
    assert_eq!(a.stats().num_alloc_retries, 1);
    ok(&a);
    // Near miss: the same segment holding a 10 MiB live tensor keeps its 90 MiB free
    // piece (too small for the request, never released): the map fails twice, OOM.
    let mut a = CachingAllocator::new(cfg("expandable_segments:True"), crate::SimulatedDevice::synthetic(200 * MIB));
    seed_plain(&mut a, 0x2_0000_0000, &[(10 * MIB, Allocated), (90 * MIB, Free)]);
    a.drain_events();
    let e = a.malloc(120 * MIB, 0).unwrap_err();
    assert_eq!(e.reserved, 100 * MIB);
    assert!(matches!(a.drain_events()[..], [Event::Oom { size, .. }] if size == 120 * MIB));
    assert_eq!(a.segments().len(), 1, "the split segment stays");
    assert_eq!(a.stats().num_alloc_retries, 1);
    ok(&a);
}
