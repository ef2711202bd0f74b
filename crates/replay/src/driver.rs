//! The forward replay of [`verify`]: drive the allocator model with the recorded
//! events and compare each decision.
//!
//! How recorded events map onto model calls:
//!
//! * `segment_*` entries are not acted on when they are read; they are buffered and
//!   become the segment events the model must reproduce at the next *trigger*.
//! * `alloc` (trigger): the buffered `segment_alloc`s are queued in the oracle device
//!   (the model's `cudaMalloc` succeeds only with a queued address, so "no cudaMalloc
//!   here" and a recorded failure happen by construction); a buffered `segment_map`
//!   outside every known reservation gives the base of a new reservation. Buffered
//!   `segment_free`/`segment_unmap`s in front are either an explicit `empty_cache()`
//!   (when the request would hit the cache, or no new memory follows) or the
//!   `release_cached_blocks` fallback after a failed `cudaMalloc` (we make the first
//!   device call fail). Both release the same segments in the same order.
//! * `oom` (trigger): the request (`size` = rounded) is replayed with a device that
//!   has no memory left, so the model runs its fallbacks and fails.
//! * `free_requested` / `free_completed` (triggers): a buffered burst of releases in
//!   front of them is an explicit `empty_cache()`; then the free is replayed as is.
//!
//! On a divergence the model is rebuilt from the *recorded* state right after the
//! diverging entry ([`RecordedState::apply`] from the state at entry 0), so the rest
//! of the trace is still compared step by step.

use std::collections::HashSet;

use fragscope_alloc::rounding::{is_small, round_size, SMALL_BUFFER};
use fragscope_alloc::{
    AllocatorConfig, BlockState as EBlockState, CachingAllocator, DeviceMemory, Event, SeedBlock, SeedError,
    SeedSegment, SimulatedDevice, DEFAULT_POOL,
};
use fragscope_snapshot::{Action, Snapshot, TraceEvent};

use super::state::{
    backward_walk_counted, bstate_of, home_of, walk_live_at_start, BState, Home, Inconsistency, Initial, RecordedState,
    TraceCounts, TraceScan,
};
use super::{recorded_config, with_rules, Divergence, EventView, ReplayOptions, VerifyReport, DEFAULT_CAPACITY};

type Engine = CachingAllocator<SimulatedDevice>;

/// Replay `device`'s trace through the model and compare every decision.
pub fn verify(snap: &Snapshot, device: i64, opts: &ReplayOptions) -> VerifyReport {
    let mut rep = verify_inner(snap, device, opts).0;
    rep.notes.extend(cuda_rules_note(snap, device, opts));
    rep
}

/// For a recording replayed under another accelerator's rules (NPU, XPU: its file showed
/// the signs, `settings::detect_accelerator`), the same replay under CUDA's rules, said in
/// one note: how much of the recording CUDA's rules reproduce and where they first differ.
/// `None` for CUDA and ROCm recordings and when the caller chose the settings.
fn cuda_rules_note(snap: &Snapshot, device: i64, opts: &ReplayOptions) -> Option<String> {
    use fragscope_alloc::Accelerator;
    let cfg = recorded_config(snap);
    if opts.config.is_some() || matches!(cfg.accelerator, Accelerator::Cuda | Accelerator::Rocm) {
        return None;
    }
    let cuda = AllocatorConfig { accelerator: Accelerator::Cuda, ..cfg };
    let r = verify_inner(snap, device, &ReplayOptions { config: Some(cuda), ..opts.clone() }).0;
    let first = match (&r.first_divergence, &r.undecidable) {
        (Some(d), _) => format!("; first divergence at entry {}: {}", d.index, d.model),
        (None, Some(u)) => format!("; {u}"),
        (None, None) => String::new(),
    };
    Some(format!(
        "under CUDA's rules instead: {}/{} allocations and {}/{} segment events match{first}",
        r.allocs_matched, r.allocs, r.segment_events_matched, r.segment_events
    ))
}

/// What the replay inferred about the recording, reused by the what-if mode.
#[derive(Clone, Debug, Default)]
pub(crate) struct Inferred {
    /// `empty_cache()` was called right before these trace entries (len = at the end).
    pub empty_cache_before: Vec<usize>,
    /// PyTorch released its free cached segments after a failed `cudaMalloc`
    /// (`release_cached_blocks`, §3.7) right before these entries.
    pub released_before: Vec<usize>,
    /// State at entry 0, if the backward walk succeeded.
    pub initial: Option<RecordedState>,
    /// Private pools found freeable right before these entries: their use count had
    /// dropped to zero (`releasePool`), which the trace does not record; the first
    /// release of one of their segments shows it.
    pub pool_freeable_before: Vec<(usize, PoolId)>,
    /// `emptyCache(pool)` of one private pool right before these entries (a burst that
    /// releases private-pool segments only, as a `MemPool`'s destructor does).
    pub pool_empty_cache_before: Vec<(usize, PoolId)>,
    /// Private pools the final state shows to be `MemPool(no_split=True)`
    /// ([`crate::pools::no_split_pools`]); the model never splits their blocks.
    pub no_split_pools: Vec<PoolId>,
}

/// Device memory for the replay: given, else stated by the file, else inferred from
/// the layout of expandable reservations, else [`DEFAULT_CAPACITY`].
pub fn capacity_for(snap: &Snapshot, device: i64, given: Option<u64>, cfg: &AllocatorConfig) -> u64 {
    capacity_knowing_maps(snap, device, given, cfg, true)
}

/// [`capacity_for`]; `has_maps = false` says the trace holds no `segment_map`
/// (counted by the walk), so the inference skips its pass over the trace.
fn capacity_knowing_maps(
    snap: &Snapshot,
    device: i64,
    given: Option<u64>,
    cfg: &AllocatorConfig,
    has_maps: bool,
) -> u64 {
    given
        .or_else(|| snap.device_capacity.get(&device).copied())
        .or_else(|| infer_capacity(snap, device, cfg, has_maps))
        .unwrap_or(DEFAULT_CAPACITY)
}

/// Expandable reservations are `ceil(9/8 · total / page)` pages each (§6.1) and never
/// overlap, so the distance from the first address of one reservation kind
/// (stream, pool, small/large) to the next kind's first address bounds the device's
/// total memory. The trace does not state the total; this is the largest total that
/// keeps the recorded reservations apart.
pub fn infer_expandable_capacity(snap: &Snapshot, device: i64, cfg: &AllocatorConfig) -> Option<u64> {
    infer_capacity(snap, device, cfg, true)
}

/// A memory pool id as PyTorch writes it: `(graph id, pool id)`.
pub(crate) type PoolId = (u64, u64);
/// What makes expandable reservations separate: `(stream, pool, small)`.
type ReservationKind = (u64, PoolId, bool);

/// [`infer_expandable_capacity`]; the trace is scanned for `segment_map`s only
/// when `has_maps` (without any, the scan finds nothing).
fn infer_capacity(snap: &Snapshot, device: i64, cfg: &AllocatorConfig, has_maps: bool) -> Option<u64> {
    let trace = if has_maps { snap.trace(device) } else { &[] };
    let mut first: Vec<(ReservationKind, u64)> = Vec::new();
    let mut note = |kind: ReservationKind, addr: u64| match first.iter_mut().find(|(k, _)| *k == kind) {
        Some((_, a)) => *a = (*a).min(addr),
        None => first.push((kind, addr)),
    };
    for s in snap.device_segments(device).filter(|s| s.is_expandable == Some(true)) {
        let small = s.segment_type == fragscope_snapshot::SegmentType::Small;
        note((s.stream, s.segment_pool_id.unwrap_or(DEFAULT_POOL), small), s.address);
    }
    for (i, e) in trace.iter().enumerate() {
        if e.action != Action::SegmentMap {
            continue;
        }
        // The map serves the next allocation on its stream.
        let stream = snap.stream(e);
        if let Some(a) = trace[i + 1..].iter().find(|a| a.action == Action::Alloc && snap.stream(a) == stream) {
            let small = is_small(round_size(a.size, cfg));
            note((stream, snap.pool_id(e).unwrap_or(DEFAULT_POOL), small), e.addr);
        }
    }
    first.sort_by_key(|&(_, a)| a);
    let mut bound: Option<u64> = None;
    for w in first.windows(2) {
        let ((k, a), (_, b)) = (w[0], w[1]);
        let page = if k.2 { SMALL_BUFFER } else { cfg.large_segment_size };
        let room = (b - a) / page * page;
        let t = (room as u128 * 8 / 9) as u64;
        bound = Some(bound.map_or(t, |x| x.min(t)));
    }
    bound
}

pub(crate) fn verify_inner(snap: &Snapshot, device: i64, opts: &ReplayOptions) -> (VerifyReport, Inferred) {
    let cfg = opts.config.clone().unwrap_or_else(|| recorded_config(snap));
    let trace = snap.trace(device);
    let mut rep = VerifyReport {
        device,
        config: cfg.to_conf_string(),
        events: trace.len(),
        allocs: 0,
        allocs_matched: 0,
        segment_events: 0,
        segment_events_matched: 0,
        ooms: 0,
        ooms_matched: 0,
        divergences: 0,
        first_divergence: None,
        undecidable: None,
        empty_cache_calls: 0,
        ambiguous_block_sizes: 0,
        final_state_matches: None,
        initial_segments: 0,
        notes: Vec::new(),
    };
    if let Some(done) = verify_fast(snap, device, opts, &cfg, &rep) {
        return done;
    }
    let home = |e: &TraceEvent| home_of(snap, e);
    let final_state = RecordedState::from_snapshot(snap, device);
    if final_state.segs.is_empty() {
        // The test below needs the counts before the walk (rare: no segments).
        let c = TraceCounts::of(trace);
        if c.segment_events == 0 && c.allocs > 0 {
            set_counts(&mut rep, c);
            rep.undecidable = Some(
                "undecidable at event 0 because the file records no segments and no segment events \
                 (allocations without allocator state, e.g. a profiler trace)"
                    .to_string(),
            );
            return (rep, Inferred::default());
        }
    }
    // The walk counts the entries as it goes (one pass over the trace, not two).
    let initial = with_rules(&cfg, |r| backward_walk_counted(final_state, trace, &home, r));
    let (initial, counts) = match initial {
        Ok(i) => i,
        Err(inc) => {
            set_counts(&mut rep, TraceCounts::of(trace));
            rep.undecidable = Some(undecidable_text(&inc));
            return (rep, Inferred::default());
        }
    };
    let d = replay_forward(snap, device, opts, &cfg, rep, initial, counts, false);
    let Driver { rep, inferred, .. } = d;
    (rep, inferred)
}

fn set_counts(rep: &mut VerifyReport, c: TraceCounts) {
    rep.allocs = c.allocs;
    rep.segment_events = c.segment_events;
    rep.ooms = c.ooms;
}

/// `verify` without the full backward walk, for traces where that walk is
/// implied by the forward replay: the walk rebuilds only the segments that exist
/// at entry 0 ([`walk_live_at_start`]); the forward replay then runs in a strict
/// mode where it gives up at the first difference of any kind (a divergence, an
/// event the model emits that the trace does not hold in full: address, size,
/// stream, a final state that differs, pool kind included). When it does not
/// give up, every entry inside a segment the trace creates is a step of the
/// model from a whole free segment to the recorded final state (or to a whole
/// free segment at its `segment_free`), and the full walk over those entries
/// succeeds (see [`walk_live_at_start`]), so the report is the one the full
/// path gives; otherwise `None`, and the caller takes the full path.
///
/// Only without expandable segments and `max_split_size` (an oversize block
/// taken whole can have a free neighbour that the walk's size choice would
/// swallow) and with the final segments in strictly ascending address order.
fn verify_fast(
    snap: &Snapshot,
    device: i64,
    opts: &ReplayOptions,
    cfg: &AllocatorConfig,
    rep: &VerifyReport,
) -> Option<(VerifyReport, Inferred)> {
    if cfg.expandable_segments || cfg.max_split_size.is_some() {
        return None;
    }
    let mut last = None;
    for s in snap.device_segments(device) {
        if s.is_expandable == Some(true) || last.is_some_and(|a| a >= s.address) {
            return None;
        }
        last = Some(s.address);
    }
    last?;
    let trace = snap.trace(device);
    let scan = TraceScan::of(trace);
    let home = |e: &TraceEvent| home_of(snap, e);
    let initial = with_rules(cfg, |r| walk_live_at_start(snap, device, trace, &scan, &home, r))?;
    let d = replay_forward(snap, device, opts, cfg, rep.clone(), initial, scan.counts, true);
    if d.bailed || d.stopped || d.rep.final_state_matches != Some(true) || d.rep.undecidable.is_some() {
        return None;
    }
    let Driver { rep, inferred, .. } = d;
    Some((rep, inferred))
}

/// Seed the model with `initial` and replay the trace forwards (see [`Driver`]).
#[allow(clippy::too_many_arguments)]
fn replay_forward<'a>(
    snap: &'a Snapshot,
    device: i64,
    opts: &ReplayOptions,
    cfg: &AllocatorConfig,
    mut rep: VerifyReport,
    initial: Initial,
    counts: TraceCounts,
    strict: bool,
) -> Driver<'a> {
    set_counts(&mut rep, counts);
    // `initial.ambiguous` lists only blocks alive at entry 0: for the others the
    // alloc is in the trace (the walk drops those choices as it passes the alloc).
    rep.ambiguous_block_sizes = initial.ambiguous.len() as u64;
    if let Some(a) = initial.ambiguous.first() {
        rep.notes.push(format!(
            "{} block(s) alive before the trace were freed with a size the trace does not fix; \
             the rounded request was used (first: event {} at {:#x}, {} B, could be up to {} B)",
            initial.ambiguous.len(),
            a.index,
            a.addr,
            a.chosen,
            a.max_possible
        ));
    }
    if let Some((a, size)) = initial.decided.first() {
        rep.notes.push(format!(
            "{} block(s) alive before the trace hold an unsplit remainder (a cached block taken whole, \
             the ≤ 1 MiB rest kept, §3.8) that a later placement proves (first: event {} at {:#x}, \
             {} B rounded request, {} B block)",
            initial.decided.len(),
            a.index,
            a.addr,
            a.chosen,
            size
        ));
    }
    if let Some(note) = private_pool_note(snap, device) {
        rep.notes.push(note);
    }
    let no_split_pools = crate::pools::no_split_pools(snap, device, cfg);
    rep.notes.extend(crate::pools::no_split_note(&no_split_pools));
    rep.notes.extend(crate::settings::recording_remarks(snap, cfg));
    rep.initial_segments = initial.state.segs.len();
    let capacity = capacity_knowing_maps(snap, device, opts.capacity, cfg, counts.segment_maps > 0);
    let mut d = Driver {
        snap,
        trace: snap.trace(device),
        cfg: cfg.clone(),
        capacity,
        eng: new_engine(cfg, capacity),
        pend: Vec::new(),
        evbuf: Vec::new(),
        rep,
        cursor: None,
        cursor_pos: 0,
        resv: Vec::new(),
        inferred: Inferred { initial: Some(initial.state), no_split_pools, ..Inferred::default() },
        freeable: Vec::new(),
        unknown_sizes: initial.ambiguous,
        stopped: false,
        no_resync: opts.no_resync,
        strict,
        bailed: false,
    };
    let st = d.inferred.initial.take().expect("just set");
    let r = d.reseed(&st);
    d.inferred.initial = Some(st);
    if let Err(e) = r {
        d.rep.undecidable = Some(format!("undecidable at event 0 because the initial state cannot be seeded: {e}"));
        return d;
    }
    d.run();
    if !d.stopped {
        d.rep.final_state_matches = Some(same_state(&d.eng, snap, device, strict));
    }
    if let Some(div) = &d.rep.first_divergence {
        let note = crate::pools::no_split_divergence_note(snap, device, div, &d.inferred.no_split_pools);
        d.rep.notes.extend(note);
    }
    if let Some(&(at, _)) = d.inferred.pool_freeable_before.first() {
        let pools: Vec<String> =
            d.inferred.pool_freeable_before.iter().map(|&(_, (a, b))| format!("({a}, {b})")).collect();
        d.rep.notes.push(format!(
            "{} private pool(s) found freeable (no graph or MemPool used them any more) by the release of \
             their segments: {} (first before event {at})",
            pools.len(),
            pools.join(", ")
        ));
    }
    d
}

/// How the replay treats private pools (CUDA graphs, `MemPool`), said when the trace
/// has entries in one (docs/fidelity.md, "Private pools"). Each pool keeps its own
/// blocks; a request in a private pool is made during a capture or a `use_mem_pool`
/// context, so it gets no release-and-retry fallback; the moment a pool's use count
/// drops to zero (`releasePool`) is not in the trace and is inferred from the first
/// release of its segments.
pub(crate) fn private_pool_note(snap: &Snapshot, device: i64) -> Option<String> {
    let n = snap.trace(device).iter().filter(|e| snap.pool_id(e).is_some_and(|p| p != DEFAULT_POOL)).count();
    (n > 0).then(|| {
        format!(
            "{n} entries are in private pools (CUDA graphs, MemPools): each pool serves only its own \
             requests, and a request in one gets no release-and-retry before an OOM (a capture is under \
             way); when a pool became freeable is not in the trace and is taken from the first release \
             of its segments"
        )
    })
}

fn undecidable_text(inc: &Inconsistency) -> String {
    format!(
        "undecidable at event {} because the trace and the final state disagree: {} ({} at {:#x}, {} B)",
        inc.index,
        inc.reason,
        inc.event.action.as_str(),
        inc.event.addr,
        inc.event.size
    )
}

pub(crate) fn new_engine(cfg: &AllocatorConfig, capacity: u64) -> Engine {
    CachingAllocator::new(cfg.clone(), SimulatedDevice::oracle(capacity))
}

/// Size of a new expandable reservation (§6.1), as the engine computes it.
pub(crate) fn reservation_size(capacity: u64, page: u64) -> u64 {
    (capacity + capacity / 8).div_ceil(page).max(1) * page
}

pub(crate) fn seed_segments<D: DeviceMemory>(
    eng: &mut CachingAllocator<D>,
    st: &RecordedState,
) -> Result<(), SeedError> {
    for s in st.segs.values() {
        let seed = SeedSegment {
            address: s.addr,
            size: s.size,
            stream: s.stream,
            pool: s.pool,
            is_large: !s.small,
            is_expandable: s.expandable,
            registration: None,
            blocks: s
                .blocks
                .iter()
                .map(|b| SeedBlock {
                    address: b.addr,
                    size: b.size,
                    requested_size: b.requested,
                    state: match b.state {
                        BState::Free => EBlockState::Free,
                        BState::Allocated => EBlockState::Allocated,
                        BState::Pending => EBlockState::PendingFree,
                    },
                })
                .collect(),
        };
        eng.seed_segment(seed)?;
    }
    Ok(())
}

/// The model's segments and blocks equal the snapshot's `segments` (as
/// [`RecordedState::from_snapshot`] reads them: by address, a later segment at
/// the same address replacing an earlier one, a segment without blocks being
/// one free block). `pool_kind`: the pool kinds (small / large) must agree too.
fn same_state(eng: &Engine, snap: &Snapshot, device: i64, pool_kind: bool) -> bool {
    let want: Vec<&fragscope_snapshot::Segment> = snap.device_segments(device).collect();
    if !want.windows(2).all(|w| w[0].address < w[1].address) {
        // Unusual order or duplicate addresses: compare with the state as read.
        return !pool_kind && same_recorded_state(eng, &RecordedState::from_snapshot(snap, device));
    }
    let got = eng.segments();
    if got.len() != want.len() {
        return false;
    }
    got.iter().zip(want).all(|(g, w)| {
        let same_blocks = if w.blocks.is_empty() {
            g.blocks.len() == 1
                && g.blocks[0].address == w.address
                && g.blocks[0].size == w.total_size
                && g.blocks[0].state == EBlockState::Free
        } else {
            g.blocks.len() == w.blocks.len()
                && g.blocks.iter().zip(&w.blocks).all(|(gb, wb)| {
                    gb.address == wb.address && gb.size == wb.size && same_block_state(gb.state, bstate_of(wb.state))
                })
        };
        g.address == w.address
            && g.total_size == w.total_size
            && same_blocks
            && w.segment_pool_id.is_none_or(|p| p == g.pool)
            && (!pool_kind || g.is_large == (w.segment_type != fragscope_snapshot::SegmentType::Small))
    })
}

fn same_block_state(g: EBlockState, w: BState) -> bool {
    matches!(
        (g, w),
        (EBlockState::Free, BState::Free)
            | (EBlockState::Allocated, BState::Allocated)
            | (EBlockState::PendingFree, BState::Pending)
    )
}

fn same_recorded_state(eng: &Engine, want: &RecordedState) -> bool {
    let got = eng.segments();
    if got.len() != want.segs.len() {
        return false;
    }
    got.iter().zip(want.segs.values()).all(|(g, w)| {
        g.address == w.addr
            && g.total_size == w.size
            && g.blocks.len() == w.blocks.len()
            && g.blocks
                .iter()
                .zip(&w.blocks)
                .all(|(gb, wb)| gb.address == wb.addr && gb.size == wb.size && same_block_state(gb.state, wb.state))
    })
}

/// Whether the model's segment event `m` is the recorded entry `r` (on stream `r_stream`).
fn same_segment_event(r: &TraceEvent, r_stream: u64, m: &Event) -> bool {
    let (a, addr, size, stream) = match *m {
        Event::SegmentAlloc { addr, size, stream } => (Action::SegmentAlloc, addr, size, stream),
        Event::SegmentFree { addr, size, stream } => (Action::SegmentFree, addr, size, stream),
        Event::SegmentMap { addr, size, stream } => (Action::SegmentMap, addr, size, stream),
        Event::SegmentUnmap { addr, size, stream } => (Action::SegmentUnmap, addr, size, stream),
        _ => return false,
    };
    r.action == a && r.addr == addr && r.size == size && r_stream == stream
}

fn model_segment_event(m: &Event) -> bool {
    matches!(
        m,
        Event::SegmentAlloc { .. } | Event::SegmentFree { .. } | Event::SegmentMap { .. } | Event::SegmentUnmap { .. }
    )
}

struct Driver<'a> {
    snap: &'a Snapshot,
    trace: &'a [TraceEvent],
    cfg: AllocatorConfig,
    capacity: u64,
    eng: Engine,
    /// Recorded segment events not yet reproduced (indices into the trace).
    pend: Vec<usize>,
    evbuf: Vec<Event>,
    rep: VerifyReport,
    /// Recorded state at `cursor_pos` (for re-seeding); made from the initial
    /// state at the first divergence.
    cursor: Option<RecordedState>,
    cursor_pos: usize,
    /// Known expandable reservations `(base, size, stream, pool, small)`.
    resv: Vec<(u64, u64, u64, PoolId, bool)>,
    inferred: Inferred,
    /// Private pools found freeable so far (kept across re-seeding).
    freeable: Vec<PoolId>,
    /// Blocks alive at entry 0 whose size the trace does not fix (the walk's
    /// choices), to say so at a divergence next to one.
    unknown_sizes: Vec<super::state::Ambiguity>,
    stopped: bool,
    no_resync: bool,
    /// Give up at the first difference of any kind (see [`verify_fast`]).
    strict: bool,
    /// Gave up (strict mode only).
    bailed: bool,
}

impl Driver<'_> {
    fn run(&mut self) {
        let trace = self.trace;
        for (i, ev) in trace.iter().enumerate() {
            if self.stopped {
                break;
            }
            match ev.action {
                Action::SegmentAlloc | Action::SegmentFree | Action::SegmentMap | Action::SegmentUnmap => {
                    self.pend.push(i)
                }
                Action::Alloc => self.step_malloc(i, false),
                Action::Oom => self.step_malloc(i, true),
                Action::FreeRequested | Action::FreeCompleted => {
                    if !self.pend.is_empty() {
                        self.flush(i);
                        if self.stopped {
                            break;
                        }
                    }
                    let r = if ev.action == Action::FreeRequested {
                        self.eng.free_requested(ev.addr)
                    } else {
                        self.eng.free_completed(ev.addr)
                    };
                    if let Err(e) = r {
                        self.take_model_events();
                        self.diverged(i, &[], format!("the model cannot replay it: {e}"), None, i + 1);
                    } else {
                        if self.strict {
                            self.strict_check(Some(ev));
                        }
                        self.eng.clear_events();
                    }
                }
                _ => {}
            }
        }
        if !self.stopped && !self.pend.is_empty() {
            self.flush(trace.len());
        }
    }

    /// The model's events of this step, for a divergence report (the engine's
    /// buffer holds them; it is read in place and cleared when the step matched).
    fn take_model_events(&mut self) {
        self.evbuf.clear();
        self.eng.drain_events_into(&mut self.evbuf);
    }

    /// Compare the model's segment events of this step (still in the engine's
    /// buffer) with the buffered recorded ones. Returns true when they agree
    /// exactly; counts positional matches.
    fn compare_segments(&mut self) -> bool {
        let mut k = 0;
        let mut ok = true;
        for m in self.eng.events().iter().filter(|m| model_segment_event(m)) {
            match self.pend.get(k) {
                Some(&ri) if same_segment_event(&self.trace[ri], self.snap.stream(&self.trace[ri]), m) => {
                    self.rep.segment_events_matched += 1
                }
                _ => ok = false,
            }
            k += 1;
        }
        ok && k == self.pend.len()
    }

    /// A burst of releases no malloc explains: an explicit `empty_cache()`.
    fn flush(&mut self, at: usize) {
        let trace = self.trace;
        let unexplained_new =
            self.pend.iter().any(|&k| matches!(trace[k].action, Action::SegmentAlloc | Action::SegmentMap));
        self.explicit_empty_cache(at, unexplained_new);
        let ok = self.compare_segments();
        if !ok || unexplained_new {
            self.take_model_events();
            let what = if unexplained_new {
                "recorded new memory with no allocation after it".to_string()
            } else {
                "empty_cache() released other segments".to_string()
            };
            let idx = self.pend[0];
            let pend = std::mem::take(&mut self.pend);
            // Re-seed with the whole burst applied (state right before `at`).
            self.diverged(idx, &pend, what, None, at);
        } else {
            if self.strict {
                self.strict_check(None);
            }
            self.eng.clear_events();
        }
        self.pend.clear();
    }

    /// The private pools whose segments the buffered releases give back, in the order
    /// of their first release, and whether a default-pool segment is released too.
    fn released_pools(&self) -> (Vec<PoolId>, bool) {
        let mut private = Vec::new();
        let mut default = false;
        for &k in &self.pend {
            let e = &self.trace[k];
            if !matches!(e.action, Action::SegmentFree | Action::SegmentUnmap) {
                continue;
            }
            match home_of(self.snap, e).pool {
                DEFAULT_POOL => default = true,
                p if !private.contains(&p) => private.push(p),
                _ => {}
            }
        }
        (private, default)
    }

    /// A private pool whose segment is released was freeable (PyTorch releases a
    /// private pool's cache only then): mark it so in the model, before entry `at`.
    fn mark_freeable(&mut self, at: usize, pools: &[PoolId]) {
        for &p in pools {
            if !self.freeable.contains(&p) {
                self.freeable.push(p);
                self.eng.set_pool_freeable(p, true);
                self.inferred.pool_freeable_before.push((at, p));
            }
        }
    }

    /// The buffered releases are an explicit call before entry `at`: `emptyCache(pool)`
    /// of each private pool when they release private-pool segments only (a `MemPool`
    /// destroyed; also what `empty_cache()` does during a capture), else
    /// `torch.cuda.empty_cache()`. `whole`: the default call whatever was released.
    fn explicit_empty_cache(&mut self, at: usize, whole: bool) {
        let (private, default) = self.released_pools();
        self.mark_freeable(at, &private);
        if private.is_empty() || default || whole {
            self.eng.empty_cache();
            self.inferred.empty_cache_before.push(at);
        } else {
            for &p in &private {
                self.eng.empty_cache_pool(p);
                self.inferred.pool_empty_cache_before.push((at, p));
            }
        }
        self.rep.empty_cache_calls += 1;
    }

    fn in_known_reservation(&self, addr: u64, stream: u64, pool: (u64, u64), small: bool) -> bool {
        self.resv.iter().any(|&(b, s, st, p, sm)| addr >= b && addr < b + s && st == stream && p == pool && sm == small)
    }

    fn step_malloc(&mut self, i: usize, recorded_oom: bool) {
        let trace = self.trace;
        let ev = &trace[i];
        let (n, Home { stream, pool }) = (ev.size, home_of(self.snap, ev));
        // Oracle: the recorded new memory of this step.
        self.eng.device_mut().clear_oracle();
        if self.pend.is_empty() && !recorded_oom {
            // The usual step: no recorded segment event to reproduce. When the
            // model's only event is the allocation at the recorded address, the
            // step matched (what the comparison below concludes, strict or not).
            let r = self.eng.malloc_in_pool(n, stream, pool);
            if r == Ok(ev.addr) && self.eng.events().len() == 1 {
                self.rep.allocs_matched += 1;
                self.eng.clear_events();
                return;
            }
            self.after_malloc(i, r, false);
            return;
        }
        let mut has_release = false;
        let mut has_new = false;
        for idx in 0..self.pend.len() {
            let r = trace[self.pend[idx]];
            match r.action {
                Action::SegmentAlloc => {
                    has_new = true;
                    self.eng.device_mut().push_oracle_segment(r.addr, r.size);
                }
                Action::SegmentMap => {
                    has_new = true;
                    let s = round_size(n, &self.cfg);
                    let page = if is_small(s) { SMALL_BUFFER } else { self.cfg.large_segment_size };
                    let small = is_small(s);
                    if !self.in_known_reservation(r.addr, stream, pool, small) {
                        self.eng.device_mut().push_oracle_reservation(r.addr);
                        self.resv.push((r.addr, reservation_size(self.capacity, page), stream, pool, small));
                    }
                }
                _ => has_release = true,
            }
        }
        let mut fallback = false;
        if has_release && recorded_oom {
            // The OOM's own fallbacks release them (private pools freeable).
            let (private, _) = self.released_pools();
            self.mark_freeable(i, &private);
        }
        if has_release && !recorded_oom {
            // A request in a private pool has no release_cached_blocks fallback (a capture
            // is under way), only the max_split_size release in its own pool.
            let fallback_possible = pool == DEFAULT_POOL || self.cfg.max_split_size.is_some();
            if !has_new || !fallback_possible || self.eng.would_hit_cache(n, stream, pool) {
                self.explicit_empty_cache(i, false);
            } else {
                let (private, _) = self.released_pools();
                self.mark_freeable(i, &private);
                fallback = true;
                self.inferred.released_before.push(i);
                if self.cfg.expandable_segments {
                    self.eng.device_mut().fail_next_map();
                } else {
                    self.eng.device_mut().fail_next_malloc();
                }
            }
        }
        let _ = fallback;
        let r = if recorded_oom {
            // No memory left on the device: the model runs its fallbacks and fails.
            let dev = self.eng.device_mut();
            dev.set_enforce_capacity(true);
            dev.set_capacity(0);
            let r = self.eng.malloc_in_pool(n, stream, pool);
            let cap = self.capacity;
            let dev = self.eng.device_mut();
            dev.set_capacity(cap);
            dev.set_enforce_capacity(false);
            r
        } else {
            self.eng.malloc_in_pool(n, stream, pool)
        };
        self.after_malloc(i, r, recorded_oom);
    }

    /// Compare the model's malloc of entry `i` (result `r`, events in the
    /// engine's buffer) with the recording.
    fn after_malloc(&mut self, i: usize, r: Result<u64, fragscope_alloc::Oom>, recorded_oom: bool) {
        let trace = self.trace;
        let ev = &trace[i];
        let (n, Home { stream, pool }) = (ev.size, home_of(self.snap, ev));
        let seg_ok = self.compare_segments();
        let (main_ok, what) = if recorded_oom {
            let s = round_size(n, &self.cfg);
            let oom_ok =
                r.is_err() && self.eng.events().iter().any(|e| matches!(e, Event::Oom { size, .. } if *size == s));
            if oom_ok {
                self.rep.ooms_matched += 1;
                (true, String::new())
            } else {
                match r {
                    Ok(a) => (false, format!("the model allocated at {a:#x} where the recording ran out of memory")),
                    Err(_) => (false, "the model ran out of memory with another size".to_string()),
                }
            }
        } else {
            match r {
                Ok(a) if a == ev.addr => {
                    self.rep.allocs_matched += 1;
                    (true, String::new())
                }
                Ok(a) => (false, format!("the model allocated at {a:#x} (offset {:+} B)", a as i128 - ev.addr as i128)),
                Err(o) => (false, format!("the model ran out of memory (asked the device for {} B)", o.alloc_size)),
            }
        };
        if seg_ok && main_ok {
            if self.strict {
                self.strict_check(Some(ev));
            }
            self.pend.clear();
            self.eng.clear_events();
            return;
        }
        self.take_model_events();
        if let Ok(a) = r {
            self.note_unknown_size(i, a);
        }
        let what = if main_ok { "the model's segment events differ".to_string() } else { what };
        let pend = std::mem::take(&mut self.pend);
        self.diverged(i, &pend, what, Some((n, stream, pool)), i + 1);
    }

    /// The model served entry `i` at `addr`, against the recording: when `addr` is
    /// the free space right after a live block whose size the trace does not fix
    /// (the walk gave it its rounded request; it may hold an unsplit remainder),
    /// the divergence may come from that size, and the report says so.
    fn note_unknown_size(&mut self, i: usize, addr: u64) {
        let Some(a) = self.unknown_sizes.iter().find(|a| i < a.index && a.addr + a.chosen == addr) else { return };
        let note = format!(
            "the divergence at event {i} may come from a block alive before the trace whose size the trace \
             does not fix: the model placed the request right after the block at {:#x}, given {} B, which \
             could be up to {} B (freed at event {})",
            a.addr, a.chosen, a.max_possible, a.index
        );
        if self.rep.notes.iter().filter(|n| n.contains("whose size the trace does not fix")).count() < 3 {
            self.rep.notes.push(note);
        }
    }

    /// Record a divergence at entry `i`, then re-seed from the recorded state after it.
    fn diverged(
        &mut self,
        i: usize,
        pend: &[usize],
        what: String,
        request: Option<(u64, u64, (u64, u64))>,
        resync_at: usize,
    ) {
        if self.strict {
            self.bail();
            return;
        }
        self.rep.divergences += 1;
        let first = self.rep.first_divergence.is_none();
        if first {
            // Candidates in the state right before the step (recorded = model state
            // up to here, since every earlier step matched).
            let candidates = match request {
                Some((n, stream, pool)) => {
                    let start = pend.first().copied().unwrap_or(i).min(i);
                    match self.advance_cursor(start) {
                        Ok(()) => {
                            let mut e = new_engine(&self.cfg, self.capacity);
                            for &p in &self.inferred.no_split_pools {
                                e.set_no_split(p, true);
                            }
                            match seed_segments(&mut e, self.cursor.as_ref().expect("advanced")) {
                                Ok(()) => e.free_candidates(n, stream, pool),
                                Err(_) => Vec::new(),
                            }
                        }
                        Err(_) => Vec::new(),
                    }
                }
                None => Vec::new(),
            };
            self.rep.first_divergence = Some(Divergence {
                index: i,
                recorded: EventView::of_trace(self.snap, &self.trace[i]),
                recorded_segment_events: pend.iter().map(|&k| EventView::of_trace(self.snap, &self.trace[k])).collect(),
                model: what,
                model_events: self.evbuf.iter().map(EventView::of_model).collect(),
                candidates,
                resynchronised: !self.no_resync,
            });
        }
        if self.no_resync {
            self.stop(resync_at);
            return;
        }
        self.resync_to(resync_at);
    }

    fn advance_cursor(&mut self, to: usize) -> Result<(), Inconsistency> {
        if to < self.cursor_pos {
            return Ok(());
        }
        let (trace, snap, cfg) = (self.trace, self.snap, self.cfg.clone());
        let from = self.cursor_pos;
        if self.cursor.is_none() {
            self.cursor = self.inferred.initial.clone();
        }
        let cursor = self.cursor.as_mut().expect("the initial state is known");
        let res = with_rules(&cfg, |r| {
            for (k, ev) in trace.iter().enumerate().take(to).skip(from) {
                cursor.apply(k, ev, home_of(snap, ev), r)?;
            }
            Ok(())
        });
        self.cursor_pos = to;
        res
    }

    fn resync_to(&mut self, to: usize) {
        match self.advance_cursor(to) {
            Ok(()) => {
                let st = self.cursor.take().expect("advanced");
                let r = self.reseed(&st);
                self.cursor = Some(st);
                if let Err(e) = r {
                    self.rep.notes.push(format!("re-seeding after event {} failed: {e}; comparison stopped", to - 1));
                    self.stop(to);
                }
            }
            Err(inc) => {
                self.rep.notes.push(format!(
                    "the recorded state cannot be rebuilt after event {}: {}; comparison stopped",
                    inc.index, inc.reason
                ));
                self.stop(to);
            }
        }
    }

    fn reseed(&mut self, st: &RecordedState) -> Result<(), SeedError> {
        self.eng = new_engine(&self.cfg, self.capacity);
        self.resv.clear();
        for s in st.segs.values().filter(|s| s.expandable) {
            if !self.in_known_reservation(s.addr, s.stream, s.pool, s.small) {
                let page = if s.small { SMALL_BUFFER } else { self.cfg.large_segment_size };
                self.resv.push((s.addr, reservation_size(self.capacity, page), s.stream, s.pool, s.small));
            }
        }
        self.pend.clear();
        for &p in &self.freeable {
            self.eng.set_pool_freeable(p, true);
        }
        for &p in &self.inferred.no_split_pools {
            self.eng.set_no_split(p, true);
        }
        seed_segments(&mut self.eng, st)
    }

    /// Strict mode: give up (the caller takes the full path).
    #[cold]
    fn bail(&mut self) {
        self.bailed = true;
        self.stopped = true;
    }

    /// Strict mode: the model's events of a step are the recorded segment events
    /// (already compared) and then exactly `want`, the step's own entry, if any.
    #[inline]
    fn strict_check(&mut self, want: Option<&TraceEvent>) {
        let evs = self.eng.events();
        // The usual step: the model emitted exactly the entry.
        if let (Some(r), [m]) = (want, evs) {
            if is_entry(r, self.snap.stream(r), m) {
                return;
            }
        }
        self.strict_check_slow(want);
    }

    #[cold]
    #[inline(never)]
    fn strict_check_slow(&mut self, want: Option<&TraceEvent>) {
        let evs = self.eng.events();
        let own = evs.iter().filter(|m| !model_segment_event(m)).count();
        let ok = match want {
            None => own == 0,
            Some(r) => own == 1 && evs.last().is_some_and(|m| is_entry(r, self.snap.stream(r), m)),
        };
        if !ok {
            self.bail();
        }
    }

    /// Stop comparing at entry `from`: the events not compared count as unmatched.
    fn stop(&mut self, _from: usize) {
        self.stopped = true;
        self.rep.final_state_matches = None;
    }
}

/// Devices whose trace a replay can check, ascending.
pub fn replayable_devices(snap: &Snapshot) -> Vec<i64> {
    let set: HashSet<i64> = snap.devices().into_iter().filter(|&d| super::has_replayable_trace(snap, d)).collect();
    let mut v: Vec<i64> = set.into_iter().collect();
    v.sort_unstable();
    v
}

/// Whether the model's event `m` is the recorded entry `r`: the same action, and the same
/// address, size and stream (the same size, for an OOM); `r_stream` is `r`'s stream.
#[inline]
fn is_entry(r: &TraceEvent, r_stream: u64, m: &Event) -> bool {
    match *m {
        Event::Alloc { addr, size, stream } => {
            r.action == Action::Alloc && (r.addr, r.size, r_stream) == (addr, size, stream)
        }
        Event::FreeRequested { addr, size, stream } => {
            r.action == Action::FreeRequested && (r.addr, r.size, r_stream) == (addr, size, stream)
        }
        Event::FreeCompleted { addr, size, stream } => {
            r.action == Action::FreeCompleted && (r.addr, r.size, r_stream) == (addr, size, stream)
        }
        Event::Oom { size, .. } => r.action == Action::Oom && r.size == size,
        _ => false,
    }
}
