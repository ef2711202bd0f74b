//! Fallback order (§3.7), memory fraction, GC (§5.5), OOM events.

use super::*;
use crate::{BlockState, Event, SimulatedDevice, DEFAULT_POOL};

fn oracle(c: AllocatorConfig) -> CachingAllocator<SimulatedDevice> {
    CachingAllocator::new(c, SimulatedDevice::oracle(80 * GIB))
}

#[test]
fn oracle_failure_release_retry_then_oom() {
    let mut a = oracle(AllocatorConfig::default());
    a.device_mut().push_oracle_segment(A0, 12 * MIB);
    let p = a.malloc(12 * MIB, 0).unwrap();
    a.free(p).unwrap();
    a.drain_events();
    // Nothing queued: cudaMalloc fails → release_cached_blocks → retry fails → OOM.
    let err = a.malloc(30 * MIB, 0).unwrap_err();
    assert_eq!(err.alloc_size, 30 * MIB);
    assert!(!err.rejected);
    assert_eq!(
        a.drain_events(),
        vec![
            Event::SegmentFree { addr: A0, size: 12 * MIB, stream: 0 },
            Event::Oom { size: 30 * MIB, device_free: 80 * GIB, stream: 0 },
        ]
    );
    let st = a.stats();
    assert_eq!((st.num_alloc_retries, st.num_ooms, st.num_sync_all_streams), (1, 1, 1));
    assert_eq!(a.device().malloc_calls(), 3);
    ok(&a);
}

#[test]
fn retry_succeeds_after_release_without_re_search() {
    let mut a = oracle(AllocatorConfig::default());
    a.device_mut().push_oracle_segment(A0, 12 * MIB);
    let p = a.malloc(12 * MIB, 0).unwrap();
    a.free_requested(p).unwrap();
    a.drain_events();
    // The pending block is unusable; cudaMalloc fails; the sync inside
    // release_cached_blocks completes p and its segment goes back; the retry
    // gets the recorded address. The free list is not searched again.
    a.device_mut().fail_next_malloc();
    a.device_mut().push_oracle_segment(A0 + GIB, 12 * MIB);
    let q = a.malloc(12 * MIB, 0).unwrap();
    assert_eq!(q, A0 + GIB);
    assert_eq!(
        a.drain_events(),
        vec![
            Event::FreeCompleted { addr: A0, size: 12 * MIB, stream: 0 },
            Event::SegmentFree { addr: A0, size: 12 * MIB, stream: 0 },
            Event::SegmentAlloc { addr: A0 + GIB, size: 12 * MIB, stream: 0 },
            Event::Alloc { addr: A0 + GIB, size: 12 * MIB, stream: 0 },
        ]
    );
    assert_eq!(a.stats().num_alloc_retries, 1);
    assert_eq!(a.stats().num_ooms, 0);
    ok(&a);
}

#[test]
fn release_available_frees_one_large_enough_block() {
    let mut a = oracle(cfg("max_split_size_mb:100"));
    a.device_mut().push_oracle_segment(A0, 200 * MIB);
    a.device_mut().push_oracle_segment(A0 + GIB, 300 * MIB);
    let p = a.malloc(200 * MIB, 0).unwrap();
    let q = a.malloc(300 * MIB, 0).unwrap();
    a.free(p).unwrap();
    a.free(q).unwrap();
    a.drain_events();
    // 250 MiB: no fit (300 ≥ 250 + 20). cudaMalloc fails; release_available
    // releases the first block ≥ 250 (300 MiB); the second cudaMalloc succeeds.
    a.device_mut().fail_next_malloc();
    a.device_mut().push_oracle_segment(A0 + 2 * GIB, 250 * MIB);
    let r = a.malloc(250 * MIB, 0).unwrap();
    assert_eq!(r, A0 + 2 * GIB);
    assert_eq!(
        a.drain_events(),
        vec![
            Event::SegmentFree { addr: A0 + GIB, size: 300 * MIB, stream: 0 },
            Event::SegmentAlloc { addr: A0 + 2 * GIB, size: 250 * MIB, stream: 0 },
            Event::Alloc { addr: A0 + 2 * GIB, size: 250 * MIB, stream: 0 },
        ]
    );
    assert_eq!(a.stats().num_alloc_retries, 0, "release_available is not a retry");
    ok(&a);
}

#[test]
fn release_available_walks_down_from_the_largest() {
    let mut a = oracle(cfg("max_split_size_mb:100"));
    for (k, mb) in [(0u64, 120u64), (1, 130), (2, 140)] {
        a.device_mut().push_oracle_segment(A0 + k * GIB, mb * MIB);
    }
    let ps: Vec<u64> = [120u64, 130, 140].iter().map(|&mb| a.malloc(mb * MIB, 0).unwrap()).collect();
    for p in ps {
        a.free(p).unwrap();
    }
    a.drain_events();
    // 250 MiB: no single block; release 140 then 130 (270 ≥ 250) and stop.
    a.device_mut().fail_next_malloc();
    a.device_mut().push_oracle_segment(A0 + 5 * GIB, 250 * MIB);
    a.malloc(250 * MIB, 0).unwrap();
    let ev = a.drain_events();
    assert_eq!(
        &ev[..2],
        &[
            Event::SegmentFree { addr: A0 + 2 * GIB, size: 140 * MIB, stream: 0 },
            Event::SegmentFree { addr: A0 + GIB, size: 130 * MIB, stream: 0 },
        ]
    );
    assert_eq!(a.segments().len(), 2);
    ok(&a);
}

#[test]
fn memory_fraction_fails_before_cuda() {
    let mut a = sim(AllocatorConfig::default());
    a.set_memory_fraction(0.5); // 40 GiB
    let p = a.malloc(30 * GIB, 0).unwrap();
    let calls = a.device().malloc_calls();
    let e = a.malloc(20 * GIB, 0).unwrap_err();
    assert_eq!(a.device().malloc_calls(), calls, "the fraction check fails before cudaMalloc");
    assert_eq!(e.alloc_size, 20 * GIB);
    assert_eq!(a.stats().num_ooms, 1);
    a.free(p).unwrap();
    ok(&a);
}

#[test]
fn throw_on_cudamalloc_oom_rejects_without_fallbacks() {
    let mut a = sim(cfg("throw_on_cudamalloc_oom:True"));
    let _p = a.malloc(60 * GIB, 0).unwrap();
    a.drain_events();
    let e = a.malloc(30 * GIB, 0).unwrap_err();
    assert!(e.rejected);
    assert!(a.drain_events().is_empty(), "no oom entry, no release");
    assert_eq!((a.stats().num_oom_rejections, a.stats().num_ooms), (1, 0));
}

#[test]
fn gc_releases_old_whole_segments_by_mean_age() {
    // 1 GiB device, fraction 0.5 → 512 MiB allowed; GC threshold 0.5 → 256 MiB.
    let mut c = cfg("garbage_collection_threshold:0.5");
    c.per_process_memory_fraction = 0.5;
    let mut a = CachingAllocator::new(c, SimulatedDevice::synthetic(GIB));
    // A small-pool miss also runs GC: create the small segment first.
    let s = a.malloc(1000, 20).unwrap();
    a.free(s).unwrap();
    let old = a.malloc(100 * MIB, 10).unwrap(); // large-pool search 1
    let mid = a.malloc(100 * MIB, 11).unwrap(); // 2
    let young = a.malloc(60 * MIB, 12).unwrap(); // 3
    let t = a.malloc(12 * MIB, 20).unwrap(); // 4
    a.free(old).unwrap(); // enters the free set at count 4
    a.free(t).unwrap();
    for _ in 0..3 {
        let t = a.malloc(12 * MIB, 20).unwrap(); // searches 5, 6, 7 (hits)
        a.free(t).unwrap();
    }
    a.free(mid).unwrap(); // count 7
    for _ in 0..2 {
        let t = a.malloc(12 * MIB, 20).unwrap(); // 8, 9
        a.free(t).unwrap();
    }
    a.free(young).unwrap(); // count 9
    for _ in 0..5 {
        let s = a.malloc(1000, 20).unwrap(); // small-pool hits do not age large blocks
        a.free(s).unwrap();
    }
    a.drain_events();
    assert_eq!(a.reserved_bytes(), 274 * MIB);
    // Next miss (search 10): ages old 6, mid 3, young 1, t 1; mean 2.75 → old
    // and mid go in one pass (set order), which reclaims more than 18 MiB.
    let n = a.malloc(30 * MIB, 1).unwrap();
    let ev = a.drain_events();
    assert_eq!(
        ev,
        vec![
            Event::SegmentFree { addr: old, size: 100 * MIB, stream: 10 },
            Event::SegmentFree { addr: mid, size: 100 * MIB, stream: 11 },
            Event::SegmentAlloc { addr: n, size: 30 * MIB, stream: 1 },
            Event::Alloc { addr: n, size: 30 * MIB, stream: 1 },
        ]
    );
    ok(&a);
}

#[test]
fn gc_is_off_without_a_fraction() {
    let mut a = sim(cfg("garbage_collection_threshold:0.1"));
    let p = a.malloc(100 * MIB, 0).unwrap();
    a.free(p).unwrap();
    a.drain_events();
    a.malloc(30 * MIB, 1).unwrap();
    assert!(!a.drain_events().iter().any(|e| matches!(e, Event::SegmentFree { .. })));
}

// ----- private pools (CUDA graphs, MemPools): docs/fidelity.md "Private pools" -----

const GRAPH: (u64, u64) = (1, 0);
const MEMPOOL: (u64, u64) = (0, 1);

#[test]
fn private_pool_request_never_takes_a_default_pool_block_and_vice_versa() {
    let mut a = sim(AllocatorConfig::default());
    let d = a.malloc(4 * MIB, 0).unwrap();
    let g = a.malloc_in_pool(4 * MIB, 0, GRAPH).unwrap();
    a.free(d).unwrap();
    a.free(g).unwrap();
    a.drain_events();
    // Each pool has a free 20 MiB segment; a request in either pool takes its own.
    let g2 = a.malloc_in_pool(4 * MIB, 0, GRAPH).unwrap();
    let d2 = a.malloc(4 * MIB, 0).unwrap();
    assert_eq!((g2, d2), (g, d));
    assert_eq!(a.block_at(g2).map(|b| b.address), Some(g));
    // A third pool gets neither: a new segment.
    a.drain_events();
    let m = a.malloc_in_pool(4 * MIB, 0, MEMPOOL).unwrap();
    assert!(m != g && m != d);
    assert!(matches!(a.drain_events()[..], [Event::SegmentAlloc { .. }, Event::Alloc { .. }]));
    let pools: Vec<_> = a.segments().iter().map(|s| s.pool).collect();
    assert_eq!(pools.iter().filter(|&&p| p == GRAPH).count(), 1);
    assert_eq!(pools.iter().filter(|&&p| p == MEMPOOL).count(), 1);
    ok(&a);
}

#[test]
fn private_pool_request_has_no_release_and_retry_fallback() {
    // During a capture (a request routed to a private pool) PyTorch skips
    // release_cached_blocks: the default pool's cached segment stays, no retry is
    // counted, and the request fails with an `oom` entry.
    let mut a = oracle(AllocatorConfig::default());
    a.device_mut().push_oracle_segment(A0, 12 * MIB);
    let p = a.malloc(12 * MIB, 0).unwrap();
    a.free(p).unwrap();
    a.drain_events();
    let err = a.malloc_in_pool(30 * MIB, 0, GRAPH).unwrap_err();
    assert_eq!(err.pool, GRAPH);
    assert!(matches!(a.drain_events()[..], [Event::Oom { size, stream: 0, .. }] if size == 30 * MIB));
    assert_eq!(a.segments().len(), 1, "the default pool's free segment was not released");
    let st = a.stats();
    assert_eq!((st.num_alloc_retries, st.num_ooms, st.num_sync_all_streams), (0, 1, 0));
    // The same request in the default pool releases it and retries (§3.7).
    let _ = a.malloc(30 * MIB, 0).unwrap_err();
    assert!(a.segments().is_empty());
    assert_eq!(a.stats().num_alloc_retries, 1);
    ok(&a);
}

#[test]
fn private_pool_request_keeps_the_max_split_release_in_its_own_pool() {
    // release_available_cached_blocks works on the request's pool, capture or not.
    let mut a = oracle(cfg("max_split_size_mb:100"));
    a.device_mut().push_oracle_segment(A0, 300 * MIB);
    a.device_mut().push_oracle_segment(A0 + GIB, 300 * MIB);
    let d = a.malloc(300 * MIB, 0).unwrap();
    let g = a.malloc_in_pool(300 * MIB, 0, GRAPH).unwrap();
    a.free(d).unwrap();
    a.free(g).unwrap();
    a.drain_events();
    a.device_mut().fail_next_malloc();
    a.device_mut().push_oracle_segment(A0 + 2 * GIB, 250 * MIB);
    let r = a.malloc_in_pool(250 * MIB, 0, GRAPH).unwrap();
    assert_eq!(r, A0 + 2 * GIB);
    assert_eq!(
        a.drain_events(),
        vec![
            Event::SegmentFree { addr: A0 + GIB, size: 300 * MIB, stream: 0 },
            Event::SegmentAlloc { addr: A0 + 2 * GIB, size: 250 * MIB, stream: 0 },
            Event::Alloc { addr: A0 + 2 * GIB, size: 250 * MIB, stream: 0 },
        ]
    );
    ok(&a);
}

#[test]
fn private_pool_request_does_not_process_events_first() {
    // cudaEventQuery is illegal during capture: a free waiting on another stream
    // stays pending through a private-pool request, and completes at the next
    // default-pool request.
    let mut a = sim(AllocatorConfig::default());
    let p = a.malloc(4 * MIB, 0).unwrap();
    a.record_stream(p, 7).unwrap();
    a.free(p).unwrap();
    let _ = a.malloc_in_pool(1000, 0, GRAPH).unwrap();
    assert_eq!(a.block_at(p).map(|b| b.state), Some(crate::BlockState::PendingFree));
    let _ = a.malloc(1000, 0).unwrap();
    assert!(a.block_at(p).is_none());
    ok(&a);
}

#[test]
fn pool_empty_cache_releases_only_a_freeable_pool() {
    let mut a = sim(AllocatorConfig::default());
    let d = a.malloc(4 * MIB, 0).unwrap();
    let m = a.malloc_in_pool(4 * MIB, 0, MEMPOOL).unwrap();
    let g = a.malloc_in_pool(4 * MIB, 0, GRAPH).unwrap();
    a.free(d).unwrap();
    a.free(m).unwrap();
    a.free(g).unwrap();
    a.drain_events();
    // In use: emptyCache(pool) does nothing.
    a.empty_cache_pool(MEMPOOL);
    assert_eq!(a.segments().len(), 3);
    // Freeable: only that pool's segment goes; the default pool and the graph pool keep theirs.
    a.set_pool_freeable(MEMPOOL, true);
    a.empty_cache_pool(MEMPOOL);
    assert_eq!(a.drain_events(), vec![Event::SegmentFree { addr: m, size: 20 * MIB, stream: 0 }]);
    let left: Vec<_> = a.segments().iter().map(|s| s.pool).collect();
    assert_eq!(left.len(), 2);
    assert!(!left.contains(&MEMPOOL));
    // Left without segments, the pool is erased: the id starts a new pool, in use.
    assert!(!a.private_pools().contains(&MEMPOOL));
    assert!(!a.is_pool_freeable(MEMPOOL));
    let m2 = a.malloc_in_pool(4 * MIB, 0, MEMPOOL).unwrap();
    a.free(m2).unwrap();
    a.empty_cache();
    let left: Vec<_> = a.segments().iter().map(|s| s.pool).collect();
    assert_eq!(left, vec![GRAPH, MEMPOOL], "the graph pool and the new pool are in use");
    ok(&a);
}

#[test]
fn pool_empty_cache_completes_only_its_own_pending_frees() {
    let mut a = sim(AllocatorConfig::default());
    let d = a.malloc(4 * MIB, 0).unwrap();
    let m = a.malloc_in_pool(4 * MIB, 0, MEMPOOL).unwrap();
    a.free_requested(d).unwrap();
    a.free_requested(m).unwrap();
    a.set_pool_freeable(MEMPOOL, true);
    a.drain_events();
    a.empty_cache_pool(MEMPOOL);
    assert_eq!(
        a.drain_events(),
        vec![
            Event::FreeCompleted { addr: m, size: 4 * MIB, stream: 0 },
            Event::SegmentFree { addr: m, size: 20 * MIB, stream: 0 },
        ]
    );
    assert_eq!(a.block_at(d).map(|b| b.state), Some(crate::BlockState::PendingFree));
    ok(&a);
}

#[test]
fn empty_cache_releases_freeable_pools_small_before_large_and_keeps_split_segments() {
    let mut a = sim(AllocatorConfig::default());
    let small = a.malloc_in_pool(1000, 0, GRAPH).unwrap();
    let large = a.malloc_in_pool(4 * MIB, 0, GRAPH).unwrap();
    let kept = a.malloc_in_pool(4 * MIB, 0, GRAPH).unwrap(); // same segment as `large`
    a.free(small).unwrap();
    a.free(large).unwrap();
    a.set_pool_freeable(GRAPH, true);
    a.drain_events();
    a.empty_cache();
    assert_eq!(a.drain_events(), vec![Event::SegmentFree { addr: small, size: 2 * MIB, stream: 0 }]);
    // The large segment is split (`kept` is live): not released, and the pool stays.
    assert!(a.private_pools().contains(&GRAPH));
    a.free(kept).unwrap();
    a.drain_events();
    a.empty_cache();
    assert_eq!(a.drain_events(), vec![Event::SegmentFree { addr: large, size: 20 * MIB, stream: 0 }]);
    assert!(a.private_pools().is_empty());
    ok(&a);
}

// ----- use-on-OOM and no-split MemPools (§3.7 step 1, §3.8) -----

fn state_at(a: &CachingAllocator<SimulatedDevice>, addr: u64) -> Option<BlockState> {
    a.segments().into_iter().flat_map(|s| s.blocks).find(|b| b.address == addr).map(|b| b.state)
}

/// A `MemPool` with a cached free 20 MiB block and a default pool with a cached free
/// 12 MiB segment, on a 40 MiB device: a 16 MiB default-pool request misses the
/// free list and its `cudaMalloc` fails (32 + 16 > 40 MiB).
fn pool_with_a_cached_block(c: AllocatorConfig) -> (CachingAllocator<SimulatedDevice>, u64, u64) {
    let mut a = CachingAllocator::new(c, SimulatedDevice::synthetic(40 * MIB));
    let m = a.malloc_in_pool(8 * MIB, 0, MEMPOOL).unwrap();
    let d = a.malloc(12 * MIB, 0).unwrap();
    a.free(m).unwrap();
    a.free(d).unwrap();
    a.drain_events();
    (a, m, d)
}

#[test]
fn use_on_oom_pool_serves_a_failed_default_request_before_any_release() {
    // Not use-on-OOM: release_cached_blocks frees the default segment, the retry succeeds.
    let (mut a, m, d) = pool_with_a_cached_block(AllocatorConfig::default());
    let q = a.malloc(16 * MIB, 0).unwrap();
    assert!(q != m);
    assert!(
        matches!(a.drain_events()[..], [Event::SegmentFree { addr, .. }, Event::SegmentAlloc { .. }, Event::Alloc { .. }] if addr == d)
    );
    assert_eq!(a.stats().num_alloc_retries, 1);
    // use_on_oom=True: the pool's cached block serves it (split: 4 MiB left > 1 MiB),
    // the block stays in the pool, nothing is released, no retry is counted.
    let (mut a, m, d) = pool_with_a_cached_block(AllocatorConfig::default());
    a.set_use_on_oom(MEMPOOL, true);
    assert!(a.is_use_on_oom(MEMPOOL));
    let q = a.malloc(16 * MIB, 0).unwrap();
    assert_eq!(q, m);
    assert_eq!(a.drain_events(), vec![Event::Alloc { addr: m, size: 16 * MIB, stream: 0 }]);
    assert_eq!(a.block_at(q).map(|b| b.size), Some(16 * MIB));
    assert_eq!(a.pool_at(q), Some(MEMPOOL));
    assert!(a.segments().iter().any(|s| s.address == d && s.pool == DEFAULT_POOL), "the default segment stays");
    assert_eq!(a.stats().num_alloc_retries, 0);
    // Freed, it goes back to the pool: the next failed default request takes it again.
    a.free(q).unwrap();
    assert_eq!(a.malloc(16 * MIB, 0).unwrap(), m);
    assert_eq!(a.pool_at(m), Some(MEMPOOL));
    ok(&a);
}

#[test]
fn use_on_oom_pool_serves_neither_a_private_request_nor_a_default_one_cuda_can_serve() {
    // A request already routed to a private pool goes straight to OOM (no capture fallback).
    let (mut a, m, _) = pool_with_a_cached_block(AllocatorConfig::default());
    a.set_use_on_oom(MEMPOOL, true);
    let err = a.malloc_in_pool(16 * MIB, 0, GRAPH).unwrap_err();
    assert_eq!(err.pool, GRAPH);
    assert_eq!(state_at(&a, m), Some(BlockState::Free));
    // A default request cudaMalloc can serve gets a new segment: the pool is a last resort.
    let mut a = sim(AllocatorConfig::default());
    let m = a.malloc_in_pool(8 * MIB, 0, MEMPOOL).unwrap();
    a.free(m).unwrap();
    a.set_use_on_oom(MEMPOOL, true);
    let q = a.malloc(8 * MIB, 0).unwrap();
    assert!(q != m);
    assert_eq!(a.pool_at(q), Some(DEFAULT_POOL));
    ok(&a);
}

#[test]
fn use_on_oom_fallback_skips_blocks_of_expandable_segments() {
    // try_mempool_fallback searches with is_expandable_segments_active = false, so a
    // free block of an expandable segment is passed over and the request fails.
    let mut a = CachingAllocator::new(cfg("expandable_segments:True"), SimulatedDevice::synthetic(30 * MIB));
    // Pages are 20 MiB: the pool maps one, the default request needs a second.
    let m = a.malloc_in_pool(8 * MIB, 0, MEMPOOL).unwrap();
    a.free(m).unwrap();
    a.set_use_on_oom(MEMPOOL, true);
    assert!(a.malloc(8 * MIB, 0).is_err());
    assert_eq!(state_at(&a, m), Some(BlockState::Free));
    ok(&a);
}

#[test]
fn no_split_pool_hands_out_whole_blocks() {
    let mut a = sim(AllocatorConfig::default());
    a.set_no_split(MEMPOOL, true);
    assert!(a.is_no_split(MEMPOOL));
    let x = a.malloc_in_pool(4 * MIB, 0, MEMPOOL).unwrap();
    let y = a.malloc_in_pool(4 * MIB, 0, MEMPOOL).unwrap();
    let z = a.malloc_in_pool(1000, 0, MEMPOOL).unwrap();
    // Each takes its whole new segment: 20 MiB, 20 MiB and the 2 MiB small buffer.
    assert_eq!([x, y, z].map(|p| a.block_at(p).unwrap().size), [20 * MIB, 20 * MIB, 2 * MIB]);
    assert_eq!(a.segments().iter().filter(|s| s.pool == MEMPOOL).count(), 3);
    // The default pool splits as always.
    let d = a.malloc(4 * MIB, 0).unwrap();
    assert_eq!(a.block_at(d).unwrap().size, 4 * MIB);
    assert_eq!(a.stats().allocated_bytes.all().current as u64, 46 * MIB);
    // A freed whole block serves the next request whole again.
    a.free(x).unwrap();
    assert_eq!(a.malloc_in_pool(2 * MIB, 0, MEMPOOL).unwrap(), x);
    assert_eq!(a.block_at(x).unwrap().size, 20 * MIB);
    ok(&a);
}
