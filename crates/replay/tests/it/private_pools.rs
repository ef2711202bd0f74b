//! Private pools (CUDA graphs, `torch.compile` reduce-overhead, `MemPool` / `use_mem_pool`)
//! in the replay, from the rules of PyTorch's `CUDACachingAllocator.cpp` (docs/fidelity.md,
//! "Private pools"): a pool's blocks serve only its own requests; a request in a private
//! pool (a capture under way) gets no release-and-retry fallback; a pool whose use count
//! dropped to zero is released by `empty_cache()` and by a default-pool request's
//! fallback; `emptyCache(pool)` (a `MemPool` destroyed) releases that pool alone.
//!
//! Each test scripts a run through the allocator model, writes what PyTorch would record
//! (entries with their `pool_id`, segments with their `segment_pool_id`), and replays it
//! with `verify`: the replay, which does not see the script (when a pool became freeable,
//! which call released what), must reproduce every decision.

use std::collections::HashMap;

use fragscope_alloc::{
    AllocatorConfig, BlockState as EBlockState, CachingAllocator, Event, PoolId, SimulatedDevice, DEFAULT_POOL,
};
use fragscope_replay::{allocator_settings, simulate_with, verify, ReplayOptions, SimOptions, VerifyReport};
use fragscope_snapshot::{Action, Block, BlockState, EntryContext, Segment, SegmentType, Snapshot, TraceEvent};

const MIB: u64 = 1 << 20;
const GRAPH: PoolId = (1, 0);
const MEMPOOL: PoolId = (0, 1);

/// A scripted run, recorded as PyTorch records it (pool ids included).
struct Run {
    eng: CachingAllocator<SimulatedDevice>,
    snap: Snapshot,
    /// Pool of each live block and of each segment, by address.
    block_pool: HashMap<u64, PoolId>,
    seg_pool: HashMap<u64, PoolId>,
}

impl Run {
    fn new(capacity: u64) -> Run {
        let eng = CachingAllocator::new(AllocatorConfig::default(), SimulatedDevice::synthetic(capacity));
        let mut snap = Snapshot::default();
        snap.device_traces.push(Vec::new());
        Run { eng, snap, block_pool: HashMap::new(), seg_pool: HashMap::new() }
    }

    /// The events of the last call, written as trace entries; `pool` is the pool of the
    /// request that made them (a release names the pool of the segment it frees).
    fn record(&mut self, pool: PoolId) {
        for ev in self.eng.drain_events() {
            let (action, addr, size, stream, p) = match ev {
                Event::Alloc { addr, size, stream } => {
                    // PyTorch writes the pool of the block (`block->pool`): a default
                    // request served by a use-on-OOM pool names that pool.
                    let p = self.eng.pool_at(addr).unwrap_or(pool);
                    self.block_pool.insert(addr, p);
                    (Action::Alloc, addr, size, stream, p)
                }
                Event::FreeRequested { addr, size, stream } => {
                    (Action::FreeRequested, addr, size, stream, self.block_pool[&addr])
                }
                Event::FreeCompleted { addr, size, stream } => {
                    (Action::FreeCompleted, addr, size, stream, self.block_pool[&addr])
                }
                Event::SegmentAlloc { addr, size, stream } => {
                    self.seg_pool.insert(addr, pool);
                    (Action::SegmentAlloc, addr, size, stream, pool)
                }
                Event::SegmentFree { addr, size, stream } => {
                    (Action::SegmentFree, addr, size, stream, self.seg_pool.remove(&addr).unwrap())
                }
                Event::Oom { size, device_free, stream } => (Action::Oom, device_free, size, stream, pool),
                other => panic!("not scripted here: {other:?}"),
            };
            let mut te = TraceEvent::new(action, addr, size);
            te.context =
                self.snap.intern_context(EntryContext { stream, pool_id: Some(p), ..Default::default() }).unwrap();
            self.snap.device_traces[0].push(te);
        }
    }

    fn malloc(&mut self, n: u64, pool: PoolId) -> Option<u64> {
        let r = self.eng.malloc_in_pool(n, 0, pool).ok();
        self.record(pool);
        r
    }
    fn free(&mut self, addr: u64) {
        self.eng.free(addr).unwrap();
        self.record(DEFAULT_POOL);
    }
    fn empty_cache(&mut self) {
        self.eng.empty_cache();
        self.record(DEFAULT_POOL);
    }
    fn empty_cache_pool(&mut self, pool: PoolId) {
        self.eng.empty_cache_pool(pool);
        self.record(pool);
    }

    /// The snapshot PyTorch would dump now.
    fn finish(mut self) -> Snapshot {
        self.snap.segments = self
            .eng
            .segments()
            .into_iter()
            .map(|s| Segment {
                device: 0,
                address: s.address,
                total_size: s.total_size,
                allocated_size: s.allocated_size(),
                active_size: s.active_size(),
                requested_size: Some(s.requested_size()),
                stream: s.stream,
                segment_type: if s.is_large { SegmentType::Large } else { SegmentType::Small },
                segment_pool_id: Some(s.pool),
                is_expandable: Some(false),
                stack: None,
                blocks: s
                    .blocks
                    .iter()
                    .map(|b| Block {
                        address: b.address,
                        size: b.size,
                        requested_size: Some(b.requested_size),
                        state: match b.state {
                            EBlockState::Allocated => BlockState::ActiveAllocated,
                            EBlockState::PendingFree => BlockState::ActivePendingFree,
                            EBlockState::Free => BlockState::Inactive,
                        },
                        stack: None,
                        history: None,
                    })
                    .collect(),
            })
            .collect();
        self.snap.allocator_settings = Some(allocator_settings(self.eng.config(), ""));
        self.snap
    }
}

fn exact(snap: &Snapshot) -> VerifyReport {
    let r = verify(snap, 0, &ReplayOptions::default());
    assert!(r.undecidable.is_none(), "{:?}", r.undecidable);
    assert!(r.allocs > 0);
    assert_eq!(r.allocs_matched, r.allocs, "{:?}", r.first_divergence);
    assert_eq!(r.segment_events_matched, r.segment_events, "{:?}", r.first_divergence);
    assert_eq!(r.ooms_matched, r.ooms, "{:?}", r.first_divergence);
    assert!(r.first_divergence.is_none());
    assert_eq!(r.final_state_matches, Some(true));
    assert!(r.notes.iter().any(|n| n.contains("entries are in private pools")), "{:?}", r.notes);
    r
}

fn segment_frees(snap: &Snapshot) -> Vec<(u64, PoolId)> {
    snap.trace(0)
        .iter()
        .filter(|e| e.action == Action::SegmentFree)
        .map(|e| (e.addr, snap.pool_id(e).unwrap()))
        .collect()
}

#[test]
fn a_captured_pool_keeps_its_blocks_from_default_requests() {
    let mut run = Run::new(8 << 30);
    let w = run.malloc(6 * MIB, DEFAULT_POOL).unwrap();
    // Capture: the graph's temporaries in its pool, freed inside the capture.
    let t1 = run.malloc(4 * MIB, GRAPH).unwrap();
    let t2 = run.malloc(3000, GRAPH).unwrap();
    run.free(t1);
    run.free(t2);
    let out = run.malloc(4 * MIB, GRAPH).unwrap();
    assert_eq!(out, t1, "the pool reuses its own block");
    // After the capture: a default request of the same size cannot take the pool's
    // free remainder, nor a small one the pool's small segment.
    run.free(w);
    let d = run.malloc(12 * MIB, DEFAULT_POOL).unwrap();
    let s = run.malloc(3000, DEFAULT_POOL).unwrap();
    assert_eq!(d, w);
    assert_ne!(s, t2);
    let snap = run.finish();
    assert_eq!(snap.segments.iter().filter(|s| s.segment_pool_id == Some(GRAPH)).count(), 2);
    let bands = fragscope_replay::RecordedState::from_snapshot(&snap, 0).pool_bands();
    assert_eq!(bands.iter().map(|b| (b.pool, b.segments)).collect::<Vec<_>>(), vec![(DEFAULT_POOL, 2), (GRAPH, 2)]);
    let r = exact(&snap);
    assert_eq!(r.allocs, 6);
}

#[test]
fn a_freeable_pool_goes_at_empty_cache_and_the_replay_finds_when() {
    let mut run = Run::new(8 << 30);
    let d = run.malloc(4 * MIB, DEFAULT_POOL).unwrap();
    let g = run.malloc(4 * MIB, GRAPH).unwrap();
    run.free(g);
    run.free(d);
    // The graph still lives: empty_cache() keeps its pool.
    run.empty_cache();
    assert_eq!(segment_frees(&run.snap).len(), 1);
    let again = run.malloc(8 * MIB, GRAPH).unwrap();
    run.free(again);
    // The graph is reset (use count 0, not recorded); the next empty_cache() releases its pool.
    run.eng.set_pool_freeable(GRAPH, true);
    let keep = run.malloc(1000, DEFAULT_POOL).unwrap();
    run.empty_cache();
    assert_eq!(segment_frees(&run.snap).iter().filter(|f| f.1 == GRAPH).count(), 1);
    run.free(keep);
    let snap = run.finish();
    let r = exact(&snap);
    assert_eq!(r.empty_cache_calls, 2);
    assert!(
        r.notes.iter().any(|n| n.contains("1 private pool(s) found freeable") && n.contains("(1, 0)")),
        "{:?}",
        r.notes
    );
    // The what-if under the recorded settings makes the same calls and ends the same.
    let cfg = fragscope_replay::recorded_config(&snap);
    let w = simulate_with(&snap, 0, cfg, &SimOptions::default());
    assert_eq!(w.cuda_frees, 2);
    assert_eq!(w.final_reserved, snap.segments.iter().map(|s| s.total_size).sum::<u64>());
}

#[test]
fn a_destroyed_mempool_releases_its_own_cache_only() {
    let mut run = Run::new(8 << 30);
    let d = run.malloc(4 * MIB, DEFAULT_POOL).unwrap();
    let m = run.malloc(4 * MIB, MEMPOOL).unwrap();
    run.free(m);
    run.free(d);
    // `del pool`: releasePool, then emptyCache(pool); the default pool's free segment stays.
    run.eng.set_pool_freeable(MEMPOOL, true);
    run.empty_cache_pool(MEMPOOL);
    assert_eq!(segment_frees(&run.snap), vec![(m, MEMPOOL)]);
    let d2 = run.malloc(4 * MIB, DEFAULT_POOL).unwrap();
    assert_eq!(d2, d);
    let snap = run.finish();
    assert!(snap.segments.iter().all(|s| s.segment_pool_id == Some(DEFAULT_POOL)));
    let r = exact(&snap);
    assert_eq!(r.empty_cache_calls, 1);
    let cfg = fragscope_replay::recorded_config(&snap);
    let w = simulate_with(&snap, 0, cfg, &SimOptions::default());
    assert_eq!((w.cuda_frees, w.final_reserved), (1, 20 * MIB));
}

#[test]
fn an_oom_during_capture_releases_nothing() {
    let mut run = Run::new(64 * MIB);
    let d = run.malloc(30 * MIB, DEFAULT_POOL).unwrap();
    run.free(d);
    // 40 MiB in the graph's pool: cudaMalloc fails; during a capture PyTorch does not
    // release the default pool's cached 30 MiB, so the request fails.
    assert!(run.malloc(40 * MIB, GRAPH).is_none());
    assert!(segment_frees(&run.snap).is_empty());
    // The same request outside the capture releases it and succeeds.
    assert!(run.malloc(40 * MIB, DEFAULT_POOL).is_some());
    assert_eq!(segment_frees(&run.snap), vec![(d, DEFAULT_POOL)]);
    let snap = run.finish();
    let r = exact(&snap);
    assert_eq!((r.ooms, r.ooms_matched), (1, 1));
}

#[test]
fn a_default_request_fallback_releases_freeable_pools_too() {
    let mut run = Run::new(64 * MIB);
    let g = run.malloc(30 * MIB, GRAPH).unwrap();
    run.free(g);
    run.eng.set_pool_freeable(GRAPH, true);
    let d = run.malloc(20 * MIB, DEFAULT_POOL).unwrap();
    // 30 MiB more does not fit beside the 30 + 20 MiB held: the fallback's
    // release_cached_blocks releases the freeable pool's segment, and the retry succeeds.
    run.malloc(30 * MIB, DEFAULT_POOL).unwrap();
    assert_eq!(segment_frees(&run.snap), vec![(g, GRAPH)]);
    run.free(d);
    let snap = run.finish();
    let r = exact(&snap);
    assert_eq!(r.empty_cache_calls, 0, "a fallback, not an explicit call");
}

/// The verl/vLLM state (two `MemPool`s beside the default pools, no trace): each pool's
/// band adds up to what PyTorch itself wrote on the pool's segments (`total_size`,
/// `allocated_size`), and the bands together are the device.
#[test]
fn pool_bands_of_a_real_private_pool_state_add_up_to_the_recorded_segments() {
    let path = fragscope_testdata::real_file("verl-megatron-vllm-qwen2-private-pools-stateonly.pickle")
        .expect("in the repository");
    let snap = fragscope_snapshot::read_path(&path).unwrap();
    let bands = fragscope_replay::RecordedState::from_snapshot(&snap, 0).pool_bands();
    let pools: Vec<PoolId> = bands.iter().map(|b| b.pool).collect();
    assert_eq!(pools, vec![DEFAULT_POOL, (0, 1), (0, 2)]);
    for b in &bands {
        let segs: Vec<&Segment> = snap.segments.iter().filter(|s| s.segment_pool_id == Some(b.pool)).collect();
        assert_eq!(b.segments, segs.len() as u64, "{:?}", b.pool);
        assert_eq!(b.reserved_bytes, segs.iter().map(|s| s.total_size).sum::<u64>(), "{:?}", b.pool);
        assert_eq!(b.allocated_bytes, segs.iter().map(|s| s.allocated_size).sum::<u64>(), "{:?}", b.pool);
        let inactive: Vec<u64> = segs
            .iter()
            .flat_map(|s| s.blocks.iter())
            .filter(|k| k.state == BlockState::Inactive)
            .map(|k| k.size)
            .collect();
        assert_eq!(b.cached_free_bytes, inactive.iter().sum::<u64>(), "{:?}", b.pool);
        assert_eq!(b.largest_free_block_bytes, inactive.iter().copied().max().unwrap_or(0), "{:?}", b.pool);
    }
    assert_eq!(
        bands.iter().map(|b| b.reserved_bytes).sum::<u64>(),
        snap.segments.iter().map(|s| s.total_size).sum::<u64>()
    );
    // A file without private pools has no bands to show apart.
    let plain = fragscope_testdata::real_file("effdl-course-liger-ce.pickle").expect("in the repository");
    let plain = fragscope_snapshot::read_path(&plain).unwrap();
    assert!(fragscope_replay::RecordedState::from_snapshot(&plain, 0).pool_bands().is_empty());
}

/// The same `emptyCache(pool)` as the last thing the trace records: the what-if makes it
/// after its last op, as that pool's release alone.
#[test]
fn a_pool_release_at_the_end_of_the_trace_stays_a_pool_release_in_what_ifs() {
    let mut run = Run::new(8 << 30);
    let d = run.malloc(4 * MIB, DEFAULT_POOL).unwrap();
    let m = run.malloc(4 * MIB, MEMPOOL).unwrap();
    run.free(m);
    run.free(d);
    run.eng.set_pool_freeable(MEMPOOL, true);
    run.empty_cache_pool(MEMPOOL);
    let snap = run.finish();
    assert_eq!(snap.trace(0).last().map(|e| e.action), Some(Action::SegmentFree));
    let r = exact(&snap);
    assert_eq!(r.empty_cache_calls, 1);
    let cfg = fragscope_replay::recorded_config(&snap);
    let w = simulate_with(&snap, 0, cfg, &SimOptions { collect_snapshot: true, ..SimOptions::default() });
    assert_eq!((w.cuda_frees, w.final_reserved), (1, 20 * MIB));
    let kept: Vec<_> = w.snapshot.expect("collected").segments.iter().map(|s| s.segment_pool_id).collect();
    assert_eq!(kept, vec![Some(DEFAULT_POOL)], "the MemPool's segment went, the default pool's stayed");
}

/// A what-if's saved run (`replay --save-snapshot`) keeps each entry's pool: written,
/// read back and verified, it replays exactly, under the recorded settings and others.
#[test]
fn a_saved_what_if_run_keeps_its_pools_and_replays_exactly() {
    let mut run = Run::new(8 << 30);
    let d = run.malloc(6 * MIB, DEFAULT_POOL).unwrap();
    let t1 = run.malloc(4 * MIB, GRAPH).unwrap();
    let t2 = run.malloc(3000, GRAPH).unwrap();
    run.free(t1);
    let out = run.malloc(30 * MIB, GRAPH).unwrap();
    run.free(t2);
    run.free(d);
    let d2 = run.malloc(40 * MIB, DEFAULT_POOL).unwrap();
    run.free(out);
    run.eng.set_pool_freeable(GRAPH, true);
    run.empty_cache();
    run.free(d2);
    let snap = run.finish();
    exact(&snap);
    for conf in ["", "expandable_segments:True", "max_split_size_mb:32", "roundup_power2_divisions:4"] {
        let cfg = fragscope_alloc::parse_config(conf).unwrap();
        let w = simulate_with(&snap, 0, cfg, &SimOptions { collect_snapshot: true, ..SimOptions::default() });
        let sim = w.snapshot.expect("collected");
        assert!(sim.trace(0).iter().any(|e| sim.pool_id(e) == Some(GRAPH)), "[{conf}]");
        let mut bytes = Vec::new();
        fragscope_snapshot::pickle::write::write_snapshot(&sim, &mut bytes).unwrap();
        let back = fragscope_snapshot::read_from(&bytes[..]).unwrap();
        let r = exact(&back);
        assert!(r.allocs >= 5, "[{conf}]");
    }
}

/// The allocator lab serves a private pool's requests apart from the default pools (each
/// (stream, pool) pair a stream of its own to the policies): PyTorch's row reserves what
/// the recording reserved, a new segment for the graph's request though the default pool
/// holds a free block that fits, and every policy's peak counts the two apart.
#[test]
fn the_lab_serves_a_private_pool_apart() {
    let mut run = Run::new(8 << 30);
    let w = run.malloc(6 * MIB, DEFAULT_POOL).unwrap();
    run.free(w);
    let g = run.malloc(6 * MIB, GRAPH).unwrap();
    assert_ne!(g, w, "the graph's request takes a segment of its own");
    let snap = run.finish();
    let reserved: u64 = snap.segments.iter().map(|s| s.total_size).sum();
    assert_eq!(reserved, 40 * MIB, "two 20 MiB segments");
    exact(&snap);
    let lw = fragscope_replay::workload_of(&snap, 0);
    assert_eq!(lw.workload.streams().len(), 2, "the graph's pool is a stream of its own");
    assert!(
        lw.notes.iter().any(|n| n.starts_with("1 private pool(s)") && n.contains("served apart")),
        "{:?}",
        lw.notes
    );
    let specs = [fragscope_replay::PolicySpec::PyTorch(String::new()), fragscope_replay::PolicySpec::BestFit];
    let rep = fragscope_replay::lab(&snap, 0, &specs, None);
    let pytorch = rep.rows.iter().find(|r| r.policy.starts_with("pytorch")).unwrap();
    assert_eq!(pytorch.peak_reserved, reserved, "{:?}", rep.rows);
    // Best fit reuses nothing across streams either: at least the two requests.
    let best = rep.rows.iter().find(|r| !r.policy.starts_with("pytorch")).unwrap();
    assert!(best.peak_reserved >= 12 * MIB, "{:?}", rep.rows);
}

/// `MemPool(use_on_oom=True)`: a default-pool request whose `cudaMalloc` failed took a
/// cached block of the pool (`try_mempool_fallback`), and PyTorch wrote that pool's id on
/// the entry. The snapshot does not say which pools are use-on-OOM; the replay serves the
/// entry in the pool it names, from the same free-list search, so it replays exactly.
/// A what-if where a default request fails while such a block fits says by name that
/// the outcome rests on `use_on_oom`.
#[test]
fn a_use_on_oom_fallback_replays_in_the_pool_the_entry_names() {
    let mut run = Run::new(40 * MIB);
    run.eng.set_use_on_oom(MEMPOOL, true);
    let m = run.malloc(8 * MIB, MEMPOOL).unwrap();
    let d = run.malloc(12 * MIB, DEFAULT_POOL).unwrap();
    run.free(m);
    run.free(d);
    // 16 MiB in the default pool: cudaMalloc fails (32 + 16 > 40 MiB); the MemPool's
    // cached 20 MiB block serves it, nothing is released.
    let q = run.malloc(16 * MIB, DEFAULT_POOL).unwrap();
    assert_eq!(q, m);
    assert!(segment_frees(&run.snap).is_empty());
    assert_eq!(run.snap.trace(0).last().and_then(|e| run.snap.pool_id(e)), Some(MEMPOOL));
    run.free(q);
    let snap = run.finish();
    exact(&snap);
    // A what-if on a device too small for the pool's segment beside the default one: the
    // default request fails while the MemPool holds a block that fits; the notes say the
    // answer depends on use_on_oom, which the snapshot does not record.
    let cfg = fragscope_replay::recorded_config(&snap);
    let w = simulate_with(&snap, 0, cfg, &SimOptions { capacity: Some(24 * MIB), ..SimOptions::default() });
    assert!(w.first_oom.is_some());
    assert!(w.notes.iter().any(|n| n.contains("use_on_oom") && n.contains("(0, 1)")), "{:?}", w.notes);
}

/// `MemPool(no_split=True)`: every request in the pool takes a whole block. The snapshot
/// does not carry the flag; the replay reads it off the final state (a live block of the
/// pool that spans its segment with a remainder `should_split` would have split) and
/// replays the pool unsplit.
#[test]
fn a_no_split_pool_is_read_off_the_final_state_and_replays_exactly() {
    let mut run = Run::new(8 << 30);
    run.eng.set_no_split(MEMPOOL, true);
    let a = run.malloc(4 * MIB, MEMPOOL).unwrap();
    let b = run.malloc(4 * MIB, MEMPOOL).unwrap();
    let c = run.malloc(1000, MEMPOOL).unwrap();
    let d = run.malloc(4 * MIB, DEFAULT_POOL).unwrap();
    run.free(a);
    let a2 = run.malloc(2 * MIB, MEMPOOL).unwrap();
    assert_eq!(a2, a);
    run.free(c);
    let _ = (b, d);
    let snap = run.finish();
    assert_eq!(snap.segments.iter().filter(|s| s.segment_pool_id == Some(MEMPOOL)).count(), 3);
    let r = exact(&snap);
    assert!(r.notes.iter().any(|n| n.contains("no_split") && n.contains("(0, 1)")), "{:?}", r.notes);
    // What-ifs keep the pool unsplit: under the recorded settings the run ends where the
    // recording ended.
    let cfg = fragscope_replay::recorded_config(&snap);
    let w = simulate_with(&snap, 0, cfg, &SimOptions::default());
    assert_eq!(w.final_reserved, snap.segments.iter().map(|s| s.total_size).sum::<u64>());
    assert_eq!(w.peak_allocated, 20 * MIB + 20 * MIB + 2 * MIB + 4 * MIB);
}

/// A no-split `MemPool` whose final state does not show it (every block freed: each
/// segment one free block): the replay splits, diverges at the request the flag changed,
/// and says what would explain it.
#[test]
fn a_no_split_pool_the_final_state_hides_is_named_at_the_divergence() {
    let mut run = Run::new(8 << 30);
    run.eng.set_no_split(MEMPOOL, true);
    let a = run.malloc(4 * MIB, MEMPOOL).unwrap();
    let b = run.malloc(4 * MIB, MEMPOOL).unwrap();
    run.free(a);
    run.free(b);
    let snap = run.finish();
    let r = verify(&snap, 0, &ReplayOptions::default());
    let d = r.first_divergence.as_ref().expect("the model splits the first segment");
    assert_eq!(d.index, 3, "{d:?}");
    assert!(r.notes.iter().any(|n| n.contains("MemPool (0, 1)") && n.contains("no_split=True")), "{:?}", r.notes);
    assert!(!r.notes.iter().any(|n| n.contains("replayed as MemPool(no_split=True)")));
}
