//! Memory over time: the `allocated`, `active`, `requested` and `reserved` curves of one
//! device, rebuilt from the trace's bookkeeping (not from the allocator's policy), their
//! peaks, and the set of live blocks at any trace position.
//!
//! # What is replayed
//!
//! Only what the trace says happened: `alloc` adds a block, `free_requested` ends its
//! `allocated` life, `free_completed` its `active` life; `segment_alloc`/`segment_map`
//! add reserved bytes, `segment_free`/`segment_unmap` remove them. Which free block the
//! allocator chose does not matter for these sums, so no allocator model is involved and
//! the walk is O(events) time and O(live blocks) memory.
//!
//! The walk itself, the block sizes it counts and the state it seeds before the first
//! entry are [`crate::walk`]'s. The curves are one of its sinks ([`WalkSink`]); the block
//! lives another ([`crate::lives`]); [`timeline_walk`] lends the same walk to a sink of
//! the caller's.
//!
//! # Peak allocated
//!
//! [`DeviceTimeline::peak_allocated`] is *the* peak allocated of every surface
//! (docs/glossary.md): the block peak `torch.cuda.max_memory_allocated()` /
//! `memory_stats()["allocated_bytes.all.peak"]` would report over the recorded window. The
//! curves count a freed block at its rounded request (the trace does not state its size),
//! which misses the unsplit remainder PyTorch leaves in a block (up to 1 MiB in the large
//! pool); the block sizes are known only to the replay's walk with the block layout
//! ([`fragscope_replay::memory_table`]), so the peak's bytes come from there
//! ([`peak_allocated`]), and from the curves only where that walk cannot be made (the trace
//! and the final state disagree; profiler traces), which
//! [`DeviceTimeline::peak_allocated_source`] says. The requested-bytes peak is
//! [`DeviceTimeline::peak_requested`], named apart.
//!

use fragscope_snapshot::{Action, Snapshot, TraceEvent, NO_TIME};
use serde::Serialize;
use std::sync::Arc;

use crate::lives::{BlockLives, LivesRecorder};
use crate::scopes::Scopes;
use crate::walk::{opt_time, LifeIndexParts, Replayer, TraceFacts, WalkSink};
pub(crate) use crate::walk::{Levels, LiveBlock, ReservedSource, Seeded};

/// Default number of points of [`DeviceTimeline::series`].
pub const DEFAULT_POINTS: usize = 60;

/// Options of [`timeline`].
#[derive(Clone, Copy, Debug)]
pub struct TimelineOptions {
    /// At most this many points in the downsampled series (≥ 1).
    pub points: usize,
}

impl Default for TimelineOptions {
    fn default() -> Self {
        TimelineOptions { points: DEFAULT_POINTS }
    }
}

/// The maximum of one curve and where it first happens.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Peak {
    pub bytes: u64,
    /// Index (in the device's trace) of the event after which the peak holds; `null`
    /// when the peak is the state before the first event (e.g. a state-only snapshot).
    pub event_index: Option<usize>,
    /// `time_us` of that event, when recorded.
    pub time_us: Option<i64>,
}

/// One bucket of the downsampled series: the maximum of each curve over the states
/// `first_event..=last_event` (state *i* = after event *i*; `first_event` is `null` for
/// a bucket that starts with the state before the first event).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct SeriesPoint {
    pub first_event: Option<usize>,
    pub last_event: Option<usize>,
    /// `time_us` of the bucket's first event that has one.
    pub time_us: Option<i64>,
    #[serde(flatten)]
    pub max: Levels,
}

/// The timeline of one device.
#[derive(Clone, Debug, Serialize)]
pub struct DeviceTimeline {
    pub device: i64,
    /// Trace entries of this device.
    pub events: usize,
    /// True when no block or segment had to be seeded (see [`Seeded`]).
    pub history_complete: bool,
    pub seeded: Seeded,
    /// `"final_block_size_else_rounded_request"`: see the module doc.
    pub allocated_size_basis: &'static str,
    /// `"segments"` (segment events + final segments), `"profiler_totals"` (Kineto
    /// `Total Reserved`) or `"none"` (nothing says what was reserved).
    pub reserved_source: ReservedSource,
    /// Levels before the first event and after the last.
    pub start: Levels,
    pub end: Levels,
    /// The peak allocated (module doc, "Peak allocated"): bytes as `memory_stats()` counts
    /// them; `event_index` and `time_us` where the curves peak (the same entry unless the
    /// curves' rounded sizes moved the maximum).
    pub peak_allocated: Peak,
    /// Where `peak_allocated.bytes` comes from: `"memory_stats"` (the replay's block sizes,
    /// or a state without a trace) or `"trace_sizes"` (the curves' sizes, a lower bound:
    /// the replay could not count the window).
    pub peak_allocated_source: PeakAllocatedSource,
    pub peak_active: Peak,
    pub peak_requested: Peak,
    pub peak_reserved: Peak,
    /// `1 − peak_allocated / peak_reserved` (the GMLake / STAlloc definition: the share of
    /// the memory PyTorch had to reserve that tensors never used at once); `null` when
    /// nothing was reserved.
    pub peak_fragmentation: Option<f64>,
    /// `1 − allocated / reserved` at the reserved peak: how much of the reserved memory
    /// was unused at the moment the most was reserved.
    pub fragmentation_at_reserved_peak: Option<f64>,
    /// Downsampled curves (≤ `points` buckets, maximum per bucket), for sparklines.
    pub series: Vec<SeriesPoint>,
    /// The lives of every block, kept by [`timeline_with_lives`] and [`timeline_walk`]
    /// for attribution and leak detection (not serialised; `None` from [`timeline`]).
    #[serde(skip)]
    pub lives: Option<Arc<BlockLives>>,
    /// The first `oom` entry of the trace (the one `fragscope_diagnose::oom_finding` is about),
    /// seen in the walk so that callers need not look through millions of entries again
    /// (not serialised).
    #[serde(skip)]
    pub first_oom: Option<usize>,
    /// What `summary`'s trace figures read from the trace, from the walk's first pass, so
    /// that a caller with the timelines needs no walk for them
    /// ([`crate::summarize_from_timelines`]; not serialised).
    #[serde(skip)]
    pub(crate) facts: Arc<TraceFacts>,
}

/// Where [`DeviceTimeline::peak_allocated`]'s bytes come from (`"memory_stats"`,
/// `"trace_sizes"` in JSON).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PeakAllocatedSource {
    /// The block sizes PyTorch counts: the replay's walk with the block layout, or the
    /// final state's blocks when there is no trace.
    MemoryStats,
    /// The curves' sizes (freed blocks at their rounded request): a lower bound.
    TraceSizes,
}

/// The one peak allocated of `device` (module doc): `walked` = the curves' peak, whose
/// bytes are replaced by `memory_stats()`'s peak when the replay can count the window.
/// Every surface that says "peak allocated" reads it from [`DeviceTimeline::peak_allocated`]
/// or from here.
pub fn peak_allocated(snap: &Snapshot, device: i64, walked: Peak) -> (Peak, PeakAllocatedSource) {
    if snap.trace(device).is_empty() {
        // One moment, the final state's own block sizes.
        return (walked, PeakAllocatedSource::MemoryStats);
    }
    if snap.format == fragscope_snapshot::SourceFormat::Kineto {
        // A profiler trace has no blocks to lay out.
        return (walked, PeakAllocatedSource::TraceSizes);
    }
    match fragscope_replay::memory_table(snap, device) {
        Ok(t) => (Peak { bytes: t.allocated_bytes.all.peak, ..walked }, PeakAllocatedSource::MemoryStats),
        Err(_) => (walked, PeakAllocatedSource::TraceSizes),
    }
}

/// Timelines of every device that has segments or trace events.
pub fn timelines(snap: &Snapshot, opts: &TimelineOptions) -> Vec<DeviceTimeline> {
    snap.devices().into_iter().map(|d| timeline(snap, d, opts)).collect()
}

/// The timeline of one device: O(events) time, O(live blocks + points) memory.
pub fn timeline(snap: &Snapshot, device: i64, opts: &TimelineOptions) -> DeviceTimeline {
    walk(snap, device, opts, false, &mut (), None)
}

/// Told the block lives of a timeline's walk ([`timeline_with_lives_then`],
/// [`timeline_walk_then`]) as soon as its forward pass has made them: the timeline's last
/// part, memory_summary's table for its peak allocated ([`peak_allocated`]), is a backward
/// walk about as long, and a caller that reads the lives (the roles, the leak tests) can
/// start on another core meanwhile. With them, the roles' index of the lives the walk made
/// as it went ([`LivesIndex`], for [`crate::device_roles_prepared`]), where it could.
pub type OnLives<'a> = &'a mut dyn FnMut(&Arc<BlockLives>, Option<LivesIndex>);

/// The index of a timeline's block lives that the roles read (each traced life's request,
/// the lives in the order their entries ended them), made by the walk that made the lives
/// ([`OnLives`]): [`crate::device_roles_prepared`] takes it instead of making it from
/// the lives (a pass over them, and 4 bytes per trace entry while it runs: in `perf` of
/// `report` on the 6.4 M-entry consistent benchmark file, ~0.15 s of samples on the roles'
/// thread, and a sixth of its page faults).
pub struct LivesIndex(pub(crate) LifeIndexParts);

/// [`timeline`] with [`DeviceTimeline::lives`] kept (for `analyze`, whose attribution
/// and leak detection read them instead of walking the trace again).
pub fn timeline_with_lives(snap: &Snapshot, device: i64, opts: &TimelineOptions) -> DeviceTimeline {
    walk(snap, device, opts, true, &mut (), None)
}

/// [`timeline_with_lives`], with `lives` told the lives before the timeline's table
/// ([`OnLives`]).
pub fn timeline_with_lives_then(
    snap: &Snapshot,
    device: i64,
    opts: &TimelineOptions,
    lives: OnLives,
) -> DeviceTimeline {
    walk(snap, device, opts, true, &mut (), Some(lives))
}

/// [`timeline`], and every state of the walk that makes it, for a front end that draws
/// more than the downsampled series and also needs the timeline (the HTML report gives
/// it to `analyze`, see `fragscope_diagnose::analyze_with_timelines`): the same walk
/// reports to `sink` too ([`WalkSink`]: the blocks entering and leaving the allocated set,
/// the levels at every state 0..=events; [`crate::OnAllocated`] and [`crate::OnLevels`]
/// make a sink of a closure). The timeline keeps its [`DeviceTimeline::lives`], as
/// [`timeline_with_lives`].
pub fn timeline_walk(snap: &Snapshot, device: i64, opts: &TimelineOptions, sink: &mut impl WalkSink) -> DeviceTimeline {
    walk(snap, device, opts, true, sink, None)
}

/// [`timeline_walk`], with `lives` told the lives before the timeline's table
/// ([`OnLives`]).
pub fn timeline_walk_then(
    snap: &Snapshot,
    device: i64,
    opts: &TimelineOptions,
    sink: &mut impl WalkSink,
    lives: OnLives,
) -> DeviceTimeline {
    walk(snap, device, opts, true, sink, Some(lives))
}

/// The timeline's own sink: the peaks of the four curves, the downsampled series and the
/// first `oom` entry, from the levels at each state.
struct Curves {
    states: usize,
    buckets: usize,
    series: Vec<SeriesPoint>,
    /// Allocated, active, requested, reserved.
    peaks: [Peak; 4],
    /// Allocated bytes at the (first) reserved peak, kept as the peak moves.
    alloc_at_res_peak: u64,
    /// The first state of the next point of the series.
    next_point: usize,
    first_oom: Option<usize>,
}

impl Curves {
    fn new(states: usize, opts: &TimelineOptions) -> Self {
        let buckets = opts.points.max(1).min(states);
        Curves {
            states,
            buckets,
            series: Vec::with_capacity(buckets),
            peaks: [Peak::default(); 4],
            alloc_at_res_peak: 0,
            next_point: 0,
            first_oom: None,
        }
    }
}

impl WalkSink for Curves {
    #[inline(always)]
    fn levels(&mut self, state: usize, entry: Option<&TraceEvent>, l: &Levels) {
        let t = entry.map_or(NO_TIME, |e| e.time_us);
        if entry.is_some_and(|e| e.action == Action::Oom) && self.first_oom.is_none() {
            self.first_oom = Some(state - 1);
        }
        let ev = state.checked_sub(1);
        for (k, (p, v)) in self.peaks.iter_mut().zip([l.allocated, l.active, l.requested, l.reserved]).enumerate() {
            // The first maximum wins (state 0 always sets the starting value).
            if state == 0 || v > p.bytes {
                *p = Peak { bytes: v, event_index: ev, time_us: opt_time(t) };
                if k == 3 {
                    self.alloc_at_res_peak = l.allocated;
                }
            }
        }
        // The point of `state` is `state * buckets / states` (at most one more than the
        // last one's, as buckets <= states); its first state is followed instead of a
        // division per event.
        if state >= self.next_point {
            self.next_point = ((self.series.len() + 1) * self.states).div_ceil(self.buckets);
            self.series.push(SeriesPoint { first_event: ev, last_event: ev, time_us: opt_time(t), max: *l });
        } else {
            let s = self.series.last_mut().unwrap();
            s.last_event = ev;
            if s.time_us.is_none() {
                s.time_us = opt_time(t);
            }
            s.max.allocated = s.max.allocated.max(l.allocated);
            s.max.active = s.max.active.max(l.active);
            s.max.requested = s.max.requested.max(l.requested);
            s.max.reserved = s.max.reserved.max(l.reserved);
        }
    }
}

/// One walk feeding the curves, the lives when `keep_lives`, and `sink`.
fn walk(
    snap: &Snapshot,
    device: i64,
    opts: &TimelineOptions,
    keep_lives: bool,
    sink: &mut impl WalkSink,
    on_lives: Option<OnLives>,
) -> DeviceTimeline {
    let mut r = Replayer::new(snap, device);
    let n = r.trace.len();
    let start = r.cur;
    let mut curves = Curves::new(n + 1, opts);
    // The roles' index of the lives only for a caller told them (the roles read it there
    // rather than make it from the lives: a pass over them and 4 bytes per trace entry).
    let index = on_lives.is_some() && n < u32::MAX as usize;
    let mut lives = keep_lives.then(|| LivesRecorder::new(device, r.allocs, index));
    r.run(&mut (&mut curves, (&mut lives, sink)));
    let Curves { peaks: [pa, pact, preq, pres], alloc_at_res_peak, series, first_oom, .. } = curves;
    let (lives, index) = match lives.map(LivesRecorder::finish) {
        Some((l, ix)) => (Some(Arc::new(l)), ix),
        None => (None, None),
    };
    if let (Some(tell), Some(l)) = (on_lives, &lives) {
        tell(l, index.map(LivesIndex));
    }
    let (pa, peak_allocated_source) = peak_allocated(snap, device, pa);
    let frac = |a: u64, r: u64| (r > 0).then(|| (1.0 - a as f64 / r as f64).max(0.0));
    let facts = Arc::new(std::mem::take(&mut r.facts));
    DeviceTimeline {
        device,
        events: n,
        history_complete: r.history_complete(),
        seeded: r.seeded,
        allocated_size_basis: "final_block_size_else_rounded_request",
        reserved_source: r.reserved_source,
        start,
        end: r.cur,
        peak_allocated: pa,
        peak_allocated_source,
        peak_active: pact,
        peak_requested: preq,
        peak_reserved: pres,
        peak_fragmentation: frac(pa.bytes, pres.bytes),
        fragmentation_at_reserved_peak: frac(alloc_at_res_peak, pres.bytes),
        series,
        lives,
        first_oom,
        facts,
    }
}

/// The four levels after event `after_event` (`None` = before the first event).
pub fn levels_at(snap: &Snapshot, device: i64, after_event: Option<usize>) -> Levels {
    let mut r = Replayer::new(snap, device);
    let stop = after_event.map_or(0, |i| (i + 1).min(r.trace.len()));
    for i in 0..stop {
        r.step(i, &mut ());
    }
    r.cur
}

/// The allocated blocks after each of the given events (`None` = before the first),
/// in one walk. Results are in the order asked, blocks sorted by address.
pub fn live_sets_at(snap: &Snapshot, device: i64, positions: &[Option<usize>]) -> Vec<Vec<LiveBlock>> {
    let mut r = Replayer::new(snap, device);
    let n = r.trace.len();
    let state_of = |p: &Option<usize>| p.map_or(0, |i| (i + 1).min(n));
    let mut order: Vec<(usize, usize)> = positions.iter().enumerate().map(|(k, p)| (state_of(p), k)).collect();
    order.sort_unstable();
    let scopes = Scopes::new(snap, device);
    let mut out: Vec<Vec<LiveBlock>> = vec![Vec::new(); positions.len()];
    let mut state = 0usize;
    for (target, k) in order {
        while state < target {
            r.step(state, &mut ());
            state += 1;
        }
        let mut v: Vec<LiveBlock> = r
            .live_blocks()
            .filter(|(_, b)| b.allocated)
            .map(|(a, b)| LiveBlock {
                address: a,
                size: b.size,
                requested: b.request,
                stack: b.stack,
                alloc_event: (!b.before_trace()).then_some(b.alloc_event),
                alloc_time_us: opt_time(b.time_us),
                annotation: scopes.innermost_at(b.time_us).map(str::to_string),
            })
            .collect();
        v.sort_unstable_by_key(|b| b.address);
        out[k] = v;
    }
    out
}

/// The allocated blocks after `after_event` (`None` = before the first event).
pub fn live_at(snap: &Snapshot, device: i64, after_event: Option<usize>) -> Vec<LiveBlock> {
    live_sets_at(snap, device, &[after_event]).pop().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::walk::AllocatedChange;
    use fragscope_snapshot::{Action, Block, BlockState, Segment, SegmentType, TraceEvent};

    fn ev(a: Action, addr: u64, size: u64) -> TraceEvent {
        TraceEvent::new(a, addr, size)
    }

    fn seg(address: u64, total: u64, blocks: Vec<Block>) -> Segment {
        Segment {
            device: 0,
            address,
            total_size: total,
            allocated_size: 0,
            active_size: 0,
            requested_size: None,
            stream: 0,
            segment_type: SegmentType::Large,
            segment_pool_id: Some((0, 0)),
            is_expandable: Some(false),
            stack: None,
            blocks,
        }
    }

    fn blk(address: u64, size: u64, state: BlockState) -> Block {
        Block { address, size, requested_size: Some(size), state, stack: None, history: None }
    }

    const MIB: u64 = 1 << 20;

    #[test]
    fn seeds_keep_curves_nonnegative_and_peaks_are_found() {
        // Before recording: a 4 MiB block at 0x100 (freed in the trace) and an 8 MiB
        // block at 0x9000 (live at the end, never in the trace); one 20 MiB segment at
        // 0 existed, a second is allocated then freed.
        let mut snap = Snapshot::default();
        snap.segments.push(seg(
            0,
            20 * MIB,
            vec![
                blk(0x9000, 8 * MIB, BlockState::ActiveAllocated),
                blk(0x9000 + 8 * MIB, 12 * MIB, BlockState::Inactive),
            ],
        ));
        snap.device_traces.push(vec![
            ev(Action::SegmentAlloc, 1 << 30, 40 * MIB),
            ev(Action::Alloc, 1 << 30, 30 * MIB),
            ev(Action::FreeRequested, 0x100, 4 * MIB),
            ev(Action::FreeCompleted, 0x100, 4 * MIB),
            ev(Action::FreeRequested, 1 << 30, 30 * MIB),
            ev(Action::FreeCompleted, 1 << 30, 30 * MIB),
            ev(Action::SegmentFree, 1 << 30, 40 * MIB),
        ]);
        let t = timeline(&snap, 0, &TimelineOptions { points: 3 });
        assert!(!t.history_complete);
        assert_eq!(t.seeded.frees_of_unknown_blocks, 1);
        assert_eq!(t.seeded.untraced_live_blocks, 1);
        assert_eq!(t.start, Levels { allocated: 12 * MIB, active: 12 * MIB, requested: 12 * MIB, reserved: 20 * MIB });
        assert_eq!(t.peak_allocated, Peak { bytes: 42 * MIB, event_index: Some(1), time_us: None });
        assert_eq!(t.peak_reserved.bytes, 60 * MIB);
        assert_eq!(t.peak_reserved.event_index, Some(0));
        assert_eq!(t.end, Levels { allocated: 8 * MIB, active: 8 * MIB, requested: 8 * MIB, reserved: 20 * MIB });
        assert!((t.peak_fragmentation.unwrap() - (1.0 - 42.0 / 60.0)).abs() < 1e-12);
        // At the reserved peak (after event 0) 12 MiB of 60 were allocated.
        assert!((t.fragmentation_at_reserved_peak.unwrap() - 0.8).abs() < 1e-12);
        assert_eq!(t.series.len(), 3);
        assert_eq!(t.series.iter().map(|p| p.max.allocated).max(), Some(42 * MIB));
        let live = live_at(&snap, 0, Some(1));
        assert_eq!(live.iter().map(|b| b.size).sum::<u64>(), 42 * MIB);
        assert_eq!(live.iter().filter(|b| b.alloc_event.is_none()).count(), 2);
    }

    /// The lives as the walk reports them to a [`LivesRecorder`] (what the timeline's walk
    /// keeps): the definition [`BlockLives::replay`] is held to.
    fn lives_by_steps(snap: &Snapshot, device: i64) -> BlockLives {
        let mut r = Replayer::new(snap, device);
        let mut rec = LivesRecorder::new(device, r.allocs, false);
        r.run(&mut rec);
        rec.finish().0
    }

    /// A random trace over a few addresses, so that every odd case comes up: an `alloc` at
    /// a live address, frees of unknown blocks (before and after an alloc there), a second
    /// `free_requested`, a `free_completed` alone, final blocks the trace never saw or left
    /// free.
    fn random_snapshot(rng: &mut fragscope_testdata::Rng) -> Snapshot {
        let actions = [Action::Alloc, Action::FreeRequested, Action::FreeCompleted, Action::SegmentAlloc];
        let mut snap = Snapshot::default();
        let addrs: Vec<u64> = (0..1 + rng.below(6)).map(|k| 0x1000 * (k as u64 + 1)).collect();
        let trace: Vec<TraceEvent> = (0..rng.below(60))
            .map(|_| {
                let a = actions[rng.below(actions.len())];
                ev(a, addrs[rng.below(addrs.len())], 1 + rng.below(3 * MIB as usize) as u64)
            })
            .collect();
        let states = [BlockState::ActiveAllocated, BlockState::ActivePendingFree, BlockState::Inactive];
        let mut blocks: Vec<Block> = Vec::new();
        for &a in addrs.iter().chain(&[0x9000_0000]) {
            if rng.below(2) == 0 {
                blocks.push(blk(a, 512 * (1 + rng.below(8) as u64), states[rng.below(3)]));
            }
        }
        if !blocks.is_empty() {
            snap.segments.push(seg(0, 1 << 32, blocks));
        }
        snap.device_traces.push(trace);
        snap
    }

    #[test]
    fn lives_without_the_levels_are_the_lives_of_the_steps() {
        let mut rng = fragscope_testdata::Rng(23);
        for _ in 0..400 {
            let snap = random_snapshot(&mut rng);
            let want = lives_by_steps(&snap, 0);
            assert_eq!(BlockLives::replay(&snap, 0), want, "{:?}", snap.device_traces[0]);
        }
    }

    /// Reads both kinds of report: the allocated bytes the changes add up to, and the
    /// levels of every state with that sum beside them.
    #[derive(Default)]
    struct Both {
        sum: i64,
        seen: Vec<(usize, Levels, i64)>,
    }

    impl WalkSink for Both {
        fn allocated(&mut self, _state: usize, c: &AllocatedChange) {
            self.sum += c.size as i64 * c.delta;
        }
        fn levels(&mut self, state: usize, _entry: Option<&TraceEvent>, l: &Levels) {
            self.seen.push((state, *l, self.sum));
        }
    }

    #[test]
    fn a_sink_beside_the_timeline_sees_what_walks_of_their_own_see() {
        // One walk feeding the curves, the lives and a sink of the caller's (the report's
        // way) gives each what it gets alone: the timeline of `timeline`, the lives of a
        // replay, the levels of `levels_at` at every state, and changes that add up to the
        // allocated level.
        let mut rng = fragscope_testdata::Rng(29);
        for _ in 0..300 {
            let snap = random_snapshot(&mut rng);
            let opts = TimelineOptions { points: 1 + rng.below(8) };
            let mut both = Both::default();
            let mut tl = timeline_walk(&snap, 0, &opts, &mut both);
            let lives = tl.lives.take().expect("timeline_walk keeps the lives");
            assert_eq!(*lives, BlockLives::replay(&snap, 0));
            let alone = timeline(&snap, 0, &opts);
            assert_eq!(serde_json::to_string(&tl).unwrap(), serde_json::to_string(&alone).unwrap());
            let n = snap.trace(0).len();
            assert_eq!(both.seen.len(), n + 1);
            for (k, &(state, l, sum)) in both.seen.iter().enumerate() {
                assert_eq!(state, k);
                assert_eq!(l, levels_at(&snap, 0, k.checked_sub(1)), "state {k} of {:?}", snap.device_traces[0]);
                assert_eq!(sum, l.allocated as i64, "state {k} of {:?}", snap.device_traces[0]);
            }
        }
    }

    #[test]
    fn state_only_snapshot_peaks_at_start() {
        let mut snap = Snapshot::default();
        snap.segments.push(seg(
            0,
            2 * MIB,
            vec![blk(0, MIB, BlockState::ActiveAllocated), blk(MIB, MIB, BlockState::Inactive)],
        ));
        let t = timeline(&snap, 0, &TimelineOptions::default());
        assert_eq!(t.events, 0);
        assert_eq!(t.peak_allocated, Peak { bytes: MIB, event_index: None, time_us: None });
        assert_eq!(t.peak_fragmentation, Some(0.5));
        assert_eq!(t.series.len(), 1);
    }
}
