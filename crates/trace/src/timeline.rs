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
//! # Block sizes (`allocated_size_basis`)
//!
//! The trace records the unrounded request, not the block size (spec §10.11). A block
//! still live in the final snapshot gets its real size from there; every other block gets
//! the request rounded by PyTorch's rule ([`round_size`] with the recorded
//! `allocator_settings`). The two differ only for large blocks that were not split
//! (up to 1 MiB more, or more above `max_split_size`), so `allocated` can be slightly
//! below PyTorch's `allocated_bytes` while such blocks are live. `requested` is exact.
//!
//! # The state before recording began
//!
//! A trace starts when recording started or when the ring buffer last wrapped, so blocks
//! may already be live at its first entry. They are seeded at t = 0:
//! * blocks live in the final snapshot whose `alloc` is not in the trace (their real size,
//!   their allocation stack from the snapshot);
//! * blocks the trace frees without having allocated them ("frees of unknown
//!   addresses"): their request from the free entry, rounded; no stack (a free entry's
//!   `frames` are the *free* stack when recorded with `context="all"`, which would
//!   misattribute them). A block whose first entry is `free_completed` was already
//!   pending-free at t = 0: it counts as active, not allocated.
//!
//! Reserved bytes at t = 0 are the final segments' bytes minus the trace's net segment
//! growth (raised if needed so the curve never goes below zero). A profiler trace (Kineto)
//! has no segments: its `Total Reserved` samples are used instead (`reserved_source`).
//!
//! `history_complete` is true when nothing had to be seeded: no unknown frees, no
//! untraced live blocks, no `segment_free` of a segment never allocated in the trace.

use fragscope_alloc::rounding::round_size;
use fragscope_alloc::AllocatorConfig;
use fragscope_snapshot::{Action, BlockState, FxHashMap, Snapshot, StackId, TotalsSample, TraceEvent, NO_TIME};
use serde::Serialize;
use std::sync::Arc;

use crate::hugepages::HugePages;
use crate::lives::{BlockLives, LivesRecorder, SeededLife, TracedLife, LIVE_AT_END};
use crate::summary::request_of;

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

/// The four curves at one position.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Levels {
    /// Bytes of blocks allocated and not yet `free_requested` (block sizes, see module doc).
    pub allocated: u64,
    /// Bytes of blocks not yet `free_completed` (allocated + pending-free).
    pub active: u64,
    /// Unrounded requests of active blocks (PyTorch's `requested_bytes`).
    pub requested: u64,
    /// Bytes held from CUDA.
    pub reserved: u64,
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

/// What had to be assumed about the state before the first trace entry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Seeded {
    /// Blocks live at t = 0 (both kinds below).
    pub blocks: u64,
    /// Their `allocated` bytes at t = 0 (pending-free ones excluded).
    pub allocated_bytes: u64,
    /// Their `active` bytes at t = 0.
    pub active_bytes: u64,
    /// Blocks freed in the trace without an `alloc` in it (counted once per block).
    pub frees_of_unknown_blocks: u64,
    pub frees_of_unknown_bytes: u64,
    /// Blocks live at the end whose `alloc` is not in the trace.
    pub untraced_live_blocks: u64,
    pub untraced_live_bytes: u64,
    /// `segment_free`/`segment_unmap` of memory the trace never saw reserved.
    pub segment_frees_of_unknown_segments: u64,
    /// Reserved bytes at t = 0.
    pub reserved_bytes: u64,
    /// Profiler traces only: bytes the profiler's `Total Allocated` counts that no
    /// recorded block explains (allocated before profiling began), added to
    /// `allocated` and `active` from t = 0 without blocks.
    pub profiler_baseline_bytes: u64,
    /// Entries that contradict the rest (an `alloc` at a live address, a block the
    /// final state holds at an address the trace freed last, ...). 0 in every real file
    /// except the trimmed fixture.
    pub inconsistencies: u64,
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
    pub reserved_source: &'static str,
    /// Levels before the first event and after the last.
    pub start: Levels,
    pub end: Levels,
    pub peak_allocated: Peak,
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
    /// The first `oom` entry of the trace (the one [`crate::oom::oom_finding`] is about),
    /// seen in the walk so that callers need not look through millions of entries again
    /// (not serialised).
    #[serde(skip)]
    pub first_oom: Option<usize>,
}

/// Timelines of every device that has segments or trace events.
pub fn timelines(snap: &Snapshot, opts: &TimelineOptions) -> Vec<DeviceTimeline> {
    snap.devices().into_iter().map(|d| timeline(snap, d, opts)).collect()
}

/// A live block at some trace position.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Live {
    /// Block size (see module doc).
    pub size: u64,
    pub request: u64,
    pub stack: Option<StackId>,
    /// `time_us` of its `alloc`, [`NO_TIME`] when unknown.
    pub time_us: i64,
    /// Index of its `alloc` entry; `usize::MAX` for blocks seeded at t = 0.
    pub alloc_event: usize,
    /// Not yet `free_requested`.
    pub allocated: bool,
    /// Number of the block's life ([`crate::lives`]): traced blocks in `alloc` order,
    /// seeded ones as [`crate::lives::LivesRecorder::start`] numbers them. 32 bits: a
    /// trace of 4 G entries (40 bytes each in memory) could not be loaded.
    pub life: u32,
}

impl Live {
    pub fn before_trace(&self) -> bool {
        self.alloc_event == usize::MAX
    }
}

/// What `summary`'s trace figures ([`crate::summary`]'s `TraceSummary`) read from the
/// trace, gathered by [`Replayer::new`]'s pass so that `summary` walks the trace once for
/// them and for the block lives its roles need. The figures keep their own definitions
/// where they differ from the replay's bookkeeping (see the fields).
#[derive(Clone, Debug, Default)]
pub(crate) struct TraceFacts {
    /// Entries by action (indexed by the action's discriminant).
    pub counts: [u64; Action::ALL.len()],
    /// `free_requested` of an address no traced block holds (each such entry, even a
    /// second one for the same block), and `free_completed` with neither a traced block
    /// nor such a `free_requested` before it.
    pub unknown_frees: u64,
    /// `segment_free` of an address no `segment_alloc` of the trace reserved.
    pub unknown_segment_frees: u64,
    /// Addresses of the blocks the trace leaves live (allocated and not
    /// `free_completed`), each with its `alloc` entry.
    pub live_at_end: FxHashMap<u64, usize>,
}

/// The bookkeeping replay shared by the timeline, attribution and leak analyses.
///
/// Blocks are kept by *slot*, not by address: pass 1 ([`Replayer::new`]) gives each
/// address the trace's block entries name a dense number and notes it per entry, so
/// that the steps index an array instead of hashing the address (two hash-map
/// operations per entry, once in each pass, were most of the walk's cost on long
/// traces; now one lookup per entry, in pass 1).
pub(crate) struct Replayer<'a> {
    pub trace: &'a [TraceEvent],
    cfg: AllocatorConfig,
    /// (alloc event index, real block size) of the blocks still live at the end, by
    /// index: steps go through the trace in order, so a cursor finds each (a hash
    /// lookup per `alloc` was a visible share of the walk on long traces).
    final_sizes: Vec<(usize, u64)>,
    final_pos: usize,
    /// Per trace entry: the slot of its address (`alloc` and frees only; 0 for others).
    slot_of: Vec<u32>,
    /// Per slot: its address.
    addr_of: Vec<u64>,
    /// Per slot: the block live at its address, if any.
    live: Vec<Option<Live>>,
    /// Slots of the blocks seeded at state 0, in the order the replay has always listed
    /// them (the iteration order of the address-keyed map that seeds them), which
    /// numbers the seeded lives ([`crate::lives::LivesRecorder::start`]).
    seeded_order: Vec<u32>,
    pub cur: Levels,
    totals: &'a [TotalsSample],
    totals_pos: usize,
    pub reserved_source: &'static str,
    pub seeded: Seeded,
    /// [`Live::life`] of the next `alloc`.
    next_life: u32,
    /// `alloc` entries in the trace (counted in pass 1, so that the block lives are
    /// made at their size: growing a vector of millions of lives copies and faults in
    /// as much memory again).
    pub allocs: usize,
    /// What `summary` reads from the same pass ([`TraceFacts`]).
    pub facts: TraceFacts,
}

/// No `alloc` of the trace holds the slot ([`Replayer::new`]'s pass 1).
const NO_ALLOC: usize = usize::MAX;

/// The slot last found for each hash of an address, in pass 1 ([`Replayer::build`]): the
/// caching allocator hands the same blocks out again and again, so a trace names the
/// same few thousand addresses millions of times, and most entries find their slot here
/// with one compare instead of a probe of the map of every address (the walk's largest
/// cost per entry). Exact: a slot answers only for the address it has.
struct RecentSlots(Box<[u32; RecentSlots::LEN]>);

impl RecentSlots {
    const BITS: u32 = 14;
    const LEN: usize = 1 << Self::BITS;

    fn new() -> Self {
        RecentSlots(vec![u32::MAX; Self::LEN].into_boxed_slice().try_into().expect("LEN slots"))
    }

    /// The slot of `addr` (`addr_of`: each slot's address), else `find`'s, noted.
    #[inline(always)]
    fn slot(&mut self, addr: u64, addr_of: &[u64], find: impl FnOnce() -> u32) -> u32 {
        // Block addresses are multiples of 512: the bits above, mixed (Fibonacci hashing).
        let h = ((addr >> 9).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - Self::BITS)) as usize;
        let k = self.0[h];
        if addr_of.get(k as usize) == Some(&addr) {
            return k;
        }
        let k = find();
        self.0[h] = k;
        k
    }
}

/// The block lives made during [`Replayer::new`]'s pass 1 ([`Replayer::lives`]).
///
/// Between two entries that name an address, that address holds one block at most, and
/// the lifetime walk ends a block at the next entry that names its address, whatever
/// that entry is (an `alloc`: the free fell out of the trace; a `free_requested`; a
/// `free_completed` with no `free_requested` before it). So a traced life ends at the
/// next entry of its address after its `alloc`, and a block seeded at state 0 at the
/// first entry of its address: the lives need no second walk, only the first's slots.
struct LivesDraft {
    /// Traced lives in `alloc` order; their sizes are the rounded requests until
    /// [`Replayer::lives`] puts in the real sizes of the blocks live at the end.
    traced: Vec<TracedLife>,
    /// Per slot: 1 + the traced life its address holds and no entry has ended yet; 0 for
    /// none.
    pending: Vec<u32>,
    /// Per slot: the first entry that names its address.
    first_of: Vec<usize>,
    /// Rounded requests: a few sizes recur millions of times.
    rounded: Box<[(u64, u64); 256]>,
    /// Kept for the roles ([`crate::roles`]'s `LifeIndex`) when asked for: per traced
    /// life its request, and per entry 1 + the traced life it ended (0 for none).
    index: bool,
    req: Vec<u64>,
    ended: Vec<u32>,
}

impl LivesDraft {
    /// Entry `i` (an `alloc` or a free) names the address of slot `k`.
    #[inline(always)]
    fn entry(&mut self, i: usize, e: &TraceEvent, k: usize, cfg: &AllocatorConfig) {
        let p = std::mem::take(&mut self.pending[k]);
        if p != 0 {
            self.traced[p as usize - 1].end = i;
            if self.index {
                self.ended[i] = p;
            }
        }
        if e.action == Action::Alloc {
            let m = &mut self.rounded[(e.size.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as usize];
            if m.0 != e.size {
                *m = (e.size, round_size(e.size, cfg));
            }
            self.traced.push(TracedLife { alloc: i, end: LIVE_AT_END, size: m.1, stack: e.stack });
            if self.index {
                self.req.push(e.size);
            }
            // Lives are numbered in 32 bits ([`Live::life`]).
            self.pending[k] = self.traced.len() as u32;
        }
    }
}

/// What [`crate::roles`]' `LifeIndex` is made of, from the lifetime walk
/// ([`Replayer::lives`]): per traced life its request; per entry 1 + the life it ended
/// (a traced index, or the number of traced lives + a seeded index; 0 for none); the
/// (entry, life) that found their entry taken, sorted.
pub(crate) struct LifeIndexParts {
    pub req: Vec<u64>,
    pub ended: Vec<u32>,
    pub more: Vec<(usize, usize)>,
}

impl<'a> Replayer<'a> {
    /// Pass 1: works out the state at t = 0 (module doc). O(events), O(live) memory.
    pub fn new(snap: &'a Snapshot, device: i64) -> Self {
        Self::build::<false>(snap, device, None)
    }

    /// The block lives of the whole trace, from state 0, made in pass 1 ([`LivesDraft`]):
    /// what the steps tell a [`LivesRecorder`] (the same lives, numbered alike), without
    /// a second walk; also the trace's facts ([`TraceFacts`]) and, when `index`, the
    /// parts of the roles' index of the lives. The test below and `lives_real` hold them
    /// to the steps (and to a timeline walk's).
    pub fn lives(snap: &Snapshot, device: i64, index: bool) -> (BlockLives, TraceFacts, Option<LifeIndexParts>) {
        let n = snap.trace(device).len();
        // The per-entry index numbers lives in 32 bits.
        let index = index && n < u32::MAX as usize;
        let mut d = LivesDraft {
            // At most one life per entry: untouched capacity is address space, not
            // memory, and growing a vector of millions of lives would copy them.
            traced: Vec::with_capacity(n),
            pending: Vec::new(),
            first_of: Vec::new(),
            rounded: Box::new([(u64::MAX, 0); 256]),
            index,
            req: if index { Vec::with_capacity(n) } else { Vec::new() },
            ended: if index { vec![0; n] } else { Vec::new() },
        };
        // Tens of MB filled in one pass: in huge pages ([`crate::hugepages`]).
        d.traced.huge_pages();
        d.req.huge_pages();
        d.ended.huge_pages();
        let mut r = Replayer::build::<true>(snap, device, Some(&mut d));
        let facts = std::mem::take(&mut r.facts);
        let mut traced = d.traced;
        traced.shrink_to_fit();
        // The real sizes of the blocks live at the end (both lists in `alloc` order).
        let mut at = 0;
        for &(idx, size) in &r.final_sizes {
            at += traced[at..].partition_point(|l| l.alloc < idx);
            if let Some(l) = traced.get_mut(at).filter(|l| l.alloc == idx) {
                l.size = size;
            }
        }
        // Seeded as `LivesRecorder::start` numbers them; each ends at the first entry
        // of its address (none for a block no entry names).
        let mut seeded = Vec::new();
        let mut more = Vec::new();
        for &k in &r.seeded_order {
            let Some(b) = &r.live[k as usize] else { continue };
            if !b.allocated {
                continue;
            }
            let end = d.first_of.get(k as usize).copied().unwrap_or(LIVE_AT_END);
            if index && end != LIVE_AT_END {
                let life = traced.len() + seeded.len();
                match d.ended.get_mut(end) {
                    Some(s) if *s == 0 && life < u32::MAX as usize => *s = life as u32 + 1,
                    _ => more.push((end, life)),
                }
            }
            seeded.push(SeededLife {
                address: r.addr_of[k as usize],
                size: b.size,
                request: b.request,
                stack: b.stack,
                end,
            });
        }
        more.sort_unstable();
        let parts = index.then_some(LifeIndexParts { req: d.req, ended: d.ended, more });
        (BlockLives { device, seeded, traced }, facts, parts)
    }

    fn build<const LIVES: bool>(snap: &'a Snapshot, device: i64, mut draft: Option<&mut LivesDraft>) -> Self {
        let trace = snap.trace(device);
        let cfg = fragscope_replay::recorded_config(snap);
        let mut seeded = Seeded::default();
        // Address → slot, for every address an `alloc` or free of the trace names; per
        // slot, the `alloc` entry of the block the trace allocated there and has not
        // `free_completed` ([`NO_ALLOC`]), and whether a free of an unknown block there
        // is pending (its `free_requested` seen, not its `free_completed`).
        let mut slots: FxHashMap<u64, u32> = FxHashMap::default();
        let mut recent = RecentSlots::new();
        // Not kept for the lives alone: the steps read it, the lives are made in this pass.
        let mut slot_of: Vec<u32> = if LIVES { Vec::new() } else { vec![0; trace.len()] };
        let mut addr_of: Vec<u64> = Vec::new();
        let mut traced: Vec<usize> = Vec::new();
        let mut orphan_pending: Vec<bool> = Vec::new();
        // Address → seeded block for frees of unknown addresses. A map, not slots: it
        // is small, and its iteration order is the order the seeded lives are numbered.
        let mut initial: FxHashMap<u64, Live> = FxHashMap::default();
        let (mut net, mut min_net) = (0i128, 0i128);
        let mut seg_seen: FxHashMap<u64, ()> = FxHashMap::default();
        let mut has_segment_events = false;
        let seed = |e: &TraceEvent, allocated: bool, cfg: &AllocatorConfig| Live {
            size: round_size(e.size, cfg),
            request: e.size,
            stack: None,
            time_us: NO_TIME,
            alloc_event: usize::MAX,
            allocated,
            life: 0,
        };
        let mut facts = TraceFacts::default();
        // `segment_alloc`s not yet freed, for `TraceFacts::unknown_segment_frees` (the
        // replay's `seg_seen` also takes expandable segments' maps and unmaps).
        let mut seg_allocs: FxHashMap<u64, ()> = FxHashMap::default();
        for (i, e) in trace.iter().enumerate() {
            facts.counts[e.action as usize] += 1;
            if matches!(e.action, Action::Alloc | Action::FreeRequested | Action::FreeCompleted) {
                let next = addr_of.len() as u32;
                let k = recent.slot(e.addr, &addr_of, || *slots.entry(e.addr).or_insert(next));
                if k == next {
                    addr_of.push(e.addr);
                    traced.push(NO_ALLOC);
                    orphan_pending.push(false);
                    if let Some(d) = draft.as_mut().filter(|_| LIVES) {
                        d.pending.push(0);
                        d.first_of.push(i);
                    }
                }
                let k = k as usize;
                if LIVES {
                    if let Some(d) = draft.as_mut() {
                        d.entry(i, e, k, &cfg);
                    }
                } else {
                    slot_of[i] = k as u32;
                }
                match e.action {
                    Action::Alloc => {
                        if std::mem::replace(&mut traced[k], i) != NO_ALLOC {
                            seeded.inconsistencies += 1;
                        }
                    }
                    Action::FreeRequested => {
                        if traced[k] == NO_ALLOC {
                            facts.unknown_frees += 1;
                            if !orphan_pending[k] {
                                seeded.frees_of_unknown_blocks += 1;
                                if initial.insert(e.addr, seed(e, true, &cfg)).is_some() {
                                    seeded.inconsistencies += 1;
                                }
                                orphan_pending[k] = true;
                            }
                        }
                    }
                    _ => {
                        if std::mem::replace(&mut traced[k], NO_ALLOC) == NO_ALLOC
                            && !std::mem::replace(&mut orphan_pending[k], false)
                        {
                            // Its free_requested happened before recording: pending at t = 0.
                            facts.unknown_frees += 1;
                            seeded.frees_of_unknown_blocks += 1;
                            if initial.insert(e.addr, seed(e, false, &cfg)).is_some() {
                                seeded.inconsistencies += 1;
                            }
                        }
                    }
                }
                continue;
            }
            match e.action {
                Action::SegmentAlloc | Action::SegmentMap => {
                    has_segment_events = true;
                    net += e.size as i128;
                    seg_seen.insert(e.addr, ());
                    if e.action == Action::SegmentAlloc {
                        seg_allocs.insert(e.addr, ());
                    }
                }
                Action::SegmentFree | Action::SegmentUnmap => {
                    has_segment_events = true;
                    net -= e.size as i128;
                    min_net = min_net.min(net);
                    if seg_seen.remove(&e.addr).is_none() && e.action == Action::SegmentFree {
                        seeded.segment_frees_of_unknown_segments += 1;
                    }
                    if e.action == Action::SegmentFree && seg_allocs.remove(&e.addr).is_none() {
                        facts.unknown_segment_frees += 1;
                    }
                }
                _ => {}
            }
        }
        // The `alloc` entry of the traced block live at `address`, if any.
        let traced_at = |address: u64| slots.get(&address).map(|&k| traced[k as usize]).filter(|&idx| idx != NO_ALLOC);
        seeded.frees_of_unknown_bytes = initial.values().map(|b| b.size).sum();

        // Final state: real sizes of traced blocks, and untraced live blocks to seed.
        let mut final_sizes = Vec::new();
        let mut final_reserved = 0u64;
        let mut has_segments = false;
        for seg in snap.device_segments(device) {
            has_segments = true;
            final_reserved += seg.total_size;
            for b in seg.blocks.iter().filter(|b| b.state.is_active()) {
                if let Some(idx) = traced_at(b.address) {
                    final_sizes.push((idx, b.size));
                } else if let std::collections::hash_map::Entry::Vacant(e) = initial.entry(b.address) {
                    let stack = b.stack.or_else(|| b.history.as_ref().and_then(|h| h.first()).and_then(|h| h.stack));
                    seeded.untraced_live_blocks += 1;
                    seeded.untraced_live_bytes += b.size;
                    e.insert(Live {
                        size: b.size,
                        request: request_of(b),
                        stack,
                        time_us: NO_TIME,
                        alloc_event: usize::MAX,
                        allocated: b.state == BlockState::ActiveAllocated,
                        life: 0,
                    });
                } else {
                    // A pending free of a pre-recording block, still pending: already seeded.
                    if !slots.get(&b.address).is_some_and(|&k| orphan_pending[k as usize]) {
                        seeded.inconsistencies += 1;
                    }
                }
            }
        }
        if has_segments {
            let final_live: FxHashMap<u64, ()> = snap
                .device_segments(device)
                .flat_map(|s| s.blocks.iter().filter(|b| b.state.is_active()).map(|b| (b.address, ())))
                .collect();
            // Blocks the trace leaves live that the final state lacks (a trimmed file).
            seeded.inconsistencies += (traced.iter().zip(&addr_of))
                .filter(|&(&idx, a)| idx != NO_ALLOC && !final_live.contains_key(a))
                .count() as u64;
        }
        let totals: &[TotalsSample] =
            usize::try_from(device).ok().and_then(|d| snap.totals.get(d)).map_or(&[], |t| t.as_slice());
        let reserved_from_totals = !has_segments && !has_segment_events && totals.iter().any(|t| t.reserved.is_some());
        let reserved_source = if reserved_from_totals {
            "profiler_totals"
        } else if has_segments || has_segment_events {
            "segments"
        } else {
            "none"
        };
        let reserved0 = if reserved_from_totals {
            0
        } else {
            let r = final_reserved as i128 - net;
            r.max(-min_net).max(0) as u64
        };
        let mut cur = Levels { reserved: reserved0, ..Levels::default() };
        for b in initial.values() {
            cur.active += b.size;
            cur.requested += b.request;
            if b.allocated {
                cur.allocated += b.size;
            }
        }
        seeded.blocks = initial.len() as u64;
        seeded.allocated_bytes = cur.allocated;
        seeded.active_bytes = cur.active;
        seeded.reserved_bytes = reserved0;
        // The blocks live at the end of the trace, by address, for `summary`'s figures.
        let live_at_end: FxHashMap<u64, usize> =
            traced.iter().zip(&addr_of).filter(|&(&idx, _)| idx != NO_ALLOC).map(|(&idx, &a)| (a, idx)).collect();
        drop(traced);
        // The seeded blocks into their slots (one of their own for an address no
        // entry names: a block live at the end that the trace never touched).
        let mut live: Vec<Option<Live>> = vec![None; addr_of.len()];
        let mut seeded_order = Vec::with_capacity(initial.len());
        for (&address, b) in &initial {
            let next = addr_of.len() as u32;
            let k = *slots.entry(address).or_insert(next);
            if k == next {
                addr_of.push(address);
                live.push(None);
            }
            live[k as usize] = Some(*b);
            seeded_order.push(k);
        }
        drop(slots);
        let mut r = Replayer {
            trace,
            cfg,
            final_sizes: {
                final_sizes.sort_unstable();
                final_sizes
            },
            final_pos: 0,
            slot_of,
            addr_of,
            live,
            seeded_order,
            cur,
            totals: if reserved_from_totals { totals } else { &[] },
            totals_pos: 0,
            reserved_source,
            seeded,
            next_life: 0,
            allocs: facts.counts[Action::Alloc as usize] as usize,
            facts: TraceFacts { live_at_end, ..facts },
        };
        if reserved_from_totals {
            // One totals sample per profiler event (an alloc, or a free that the reader
            // split into free_requested + free_completed). The first sample's
            // `Total Allocated` minus what the first event leaves allocated is memory
            // allocated before profiling began: seed it.
            let first = trace.iter().position(|e| matches!(e.action, Action::Alloc | Action::FreeCompleted));
            if let (Some(i), Some(a)) = (first, totals.first().and_then(|t| t.allocated)) {
                let mut probe = Levels::default();
                let e = &trace[i];
                if e.action == Action::Alloc {
                    probe.allocated = round_size(e.size, &r.cfg);
                }
                let base = a.saturating_sub(probe.allocated);
                r.seeded.profiler_baseline_bytes = base;
                r.cur.allocated += base;
                r.cur.active += base;
                r.seeded.allocated_bytes += base;
                r.seeded.active_bytes += base;
            }
            r.advance_totals(trace.first().map_or(i64::MIN, |e| e.time_us));
        }
        r
    }

    /// Calls `f` with each block seeded at state 0 and its address, in the order the
    /// replay lists them (call before the first step: the state at t = 0).
    pub fn each_seeded(&mut self, mut f: impl FnMut(u64, &mut Live)) {
        for &k in &self.seeded_order {
            if let Some(b) = self.live[k as usize].as_mut() {
                f(self.addr_of[k as usize], b);
            }
        }
    }

    /// The blocks live now (in the allocated or the active set), with their addresses.
    pub fn live_blocks(&self) -> impl Iterator<Item = (u64, &Live)> + '_ {
        self.live.iter().zip(&self.addr_of).filter_map(|(b, &a)| b.as_ref().map(|b| (a, b)))
    }

    pub fn history_complete(&self) -> bool {
        let s = &self.seeded;
        s.blocks == 0 && s.segment_frees_of_unknown_segments == 0 && s.profiler_baseline_bytes == 0
    }

    fn advance_totals(&mut self, t: i64) {
        while let Some(s) = self.totals.get(self.totals_pos) {
            if s.time_us > t {
                break;
            }
            if let Some(r) = s.reserved {
                self.cur.reserved = r;
            }
            self.totals_pos += 1;
        }
    }

    /// Applies event `i`. `on_change(block, +1/−1)` is told when a block enters or leaves
    /// the allocated set (what attribution counts as live). Events are applied in trace
    /// order, each once, from 0.
    #[inline(always)]
    pub fn step(&mut self, i: usize, on_change: &mut impl FnMut(&Live, i64)) {
        let e = &self.trace[i];
        let c = &mut self.cur;
        match e.action {
            Action::Alloc => {
                while self.final_sizes.get(self.final_pos).is_some_and(|&(j, _)| j < i) {
                    self.final_pos += 1;
                }
                let size = match self.final_sizes.get(self.final_pos) {
                    Some(&(j, size)) if j == i => size,
                    _ => round_size(e.size, &self.cfg),
                };
                let b = Live {
                    size,
                    request: e.size,
                    stack: e.stack,
                    time_us: e.time_us,
                    alloc_event: i,
                    allocated: true,
                    life: self.next_life,
                };
                self.next_life = self.next_life.wrapping_add(1);
                if let Some(old) = self.live[self.slot_of[i] as usize].replace(b) {
                    // A free fell out of the trace: end the old block here.
                    c.active = c.active.saturating_sub(old.size);
                    c.requested = c.requested.saturating_sub(old.request);
                    if old.allocated {
                        c.allocated = c.allocated.saturating_sub(old.size);
                        on_change(&old, -1);
                    }
                }
                c.allocated += size;
                c.active += size;
                c.requested += e.size;
                on_change(&b, 1);
            }
            Action::FreeRequested => {
                if let Some(b) = self.live[self.slot_of[i] as usize].as_mut() {
                    if b.allocated {
                        b.allocated = false;
                        c.allocated = c.allocated.saturating_sub(b.size);
                        let b = *b;
                        on_change(&b, -1);
                    }
                }
            }
            Action::FreeCompleted => {
                if let Some(b) = self.live[self.slot_of[i] as usize].take() {
                    c.active = c.active.saturating_sub(b.size);
                    c.requested = c.requested.saturating_sub(b.request);
                    if b.allocated {
                        // No free_requested recorded (e.g. skip_actions): it ends here.
                        c.allocated = c.allocated.saturating_sub(b.size);
                        on_change(&b, -1);
                    }
                }
            }
            Action::SegmentAlloc | Action::SegmentMap if self.totals.is_empty() => {
                c.reserved += e.size;
            }
            Action::SegmentFree | Action::SegmentUnmap if self.totals.is_empty() => {
                c.reserved = c.reserved.saturating_sub(e.size);
            }
            _ => {}
        }
        if !self.totals.is_empty() {
            self.advance_totals(e.time_us);
        }
    }
}

fn opt_time(t: i64) -> Option<i64> {
    (t != NO_TIME).then_some(t)
}

/// The timeline of one device: O(events) time, O(live blocks + points) memory.
pub fn timeline(snap: &Snapshot, device: i64, opts: &TimelineOptions) -> DeviceTimeline {
    walk(snap, device, opts, false, |_, _| {}, |_, _| {})
}

/// [`timeline`] with [`DeviceTimeline::lives`] kept (for `analyze`, whose attribution
/// and leak detection read them instead of walking the trace again).
pub fn timeline_with_lives(snap: &Snapshot, device: i64, opts: &TimelineOptions) -> DeviceTimeline {
    walk(snap, device, opts, true, |_, _| {}, |_, _| {})
}

/// [`timeline`], and every state of the walk that makes it, for a front end that draws
/// more than the downsampled series and also needs the timeline (the HTML report gives
/// it to `analyze`, see [`crate::analyze::analyze_with_timelines`]): `on_change(state,
/// block)` is told when a block enters or leaves the allocated set (blocks live before
/// the trace at state 0); `on_state(state, levels)` follows, once per state 0..=events
/// (state `i + 1` is after event `i`). The timeline keeps its
/// [`DeviceTimeline::lives`], as [`timeline_with_lives`].
pub fn timeline_walk(
    snap: &Snapshot,
    device: i64,
    opts: &TimelineOptions,
    on_change: impl FnMut(usize, &AllocatedChange),
    on_state: impl FnMut(usize, &Levels),
) -> DeviceTimeline {
    walk(snap, device, opts, true, on_change, on_state)
}

fn walk(
    snap: &Snapshot,
    device: i64,
    opts: &TimelineOptions,
    keep_lives: bool,
    mut on_change: impl FnMut(usize, &AllocatedChange),
    mut on_state: impl FnMut(usize, &Levels),
) -> DeviceTimeline {
    let change =
        |b: &Live, delta: i64| AllocatedChange { stack: b.stack, size: b.size, delta, before_trace: b.before_trace() };
    let mut r = Replayer::new(snap, device);
    let mut lives = keep_lives.then(|| LivesRecorder::start(&mut r, device));
    r.each_seeded(|_, b| {
        if b.allocated {
            on_change(0, &change(b, 1));
        }
    });
    let n = r.trace.len();
    let states = n + 1;
    let buckets = opts.points.max(1).min(states);
    let mut series: Vec<SeriesPoint> = Vec::with_capacity(buckets);
    let start = r.cur;
    let mut peaks = [Peak::default(); 4];
    // Allocated bytes at the (first) reserved peak, kept as the peak moves.
    let mut alloc_at_res_peak = 0u64;
    let mut next_point = 0usize;
    let levels = |l: &Levels| [l.allocated, l.active, l.requested, l.reserved];
    let mut record = |state: usize, l: &Levels, t: i64, series: &mut Vec<SeriesPoint>, peaks: &mut [Peak; 4]| {
        let ev = state.checked_sub(1);
        for (k, (p, v)) in peaks.iter_mut().zip(levels(l)).enumerate() {
            // The first maximum wins (state 0 always sets the starting value).
            if state == 0 || v > p.bytes {
                *p = Peak { bytes: v, event_index: ev, time_us: opt_time(t) };
                if k == 3 {
                    alloc_at_res_peak = l.allocated;
                }
            }
        }
        // The point of `state` is `state * buckets / states` (at most one more than the
        // last one's, as buckets <= states); its first state is followed instead of a
        // division per event.
        if state >= next_point {
            next_point = ((series.len() + 1) * states).div_ceil(buckets);
            series.push(SeriesPoint { first_event: ev, last_event: ev, time_us: opt_time(t), max: *l });
        } else {
            let s = series.last_mut().unwrap();
            s.last_event = ev;
            if s.time_us.is_none() {
                s.time_us = opt_time(t);
            }
            s.max.allocated = s.max.allocated.max(l.allocated);
            s.max.active = s.max.active.max(l.active);
            s.max.requested = s.max.requested.max(l.requested);
            s.max.reserved = s.max.reserved.max(l.reserved);
        }
    };
    let mut first_oom = None;
    record(0, &start, NO_TIME, &mut series, &mut peaks);
    on_state(0, &start);
    for i in 0..n {
        r.step(i, &mut |b, d| {
            if let Some(l) = lives.as_mut() {
                l.change(i, b, d);
            }
            on_change(i + 1, &change(b, d))
        });
        let e = &r.trace[i];
        if e.action == Action::Oom && first_oom.is_none() {
            first_oom = Some(i);
        }
        let t = e.time_us;
        let cur = r.cur;
        record(i + 1, &cur, t, &mut series, &mut peaks);
        on_state(i + 1, &cur);
    }
    let [pa, pact, preq, pres] = peaks;
    let frac = |a: u64, r: u64| (r > 0).then(|| (1.0 - a as f64 / r as f64).max(0.0));
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
        peak_active: pact,
        peak_requested: preq,
        peak_reserved: pres,
        peak_fragmentation: frac(pa.bytes, pres.bytes),
        fragmentation_at_reserved_peak: frac(alloc_at_res_peak, pres.bytes),
        series,
        lives: lives.map(|l| Arc::new(l.finish())),
        first_oom,
    }
}

/// The four levels after event `after_event` (`None` = before the first event).
pub fn levels_at(snap: &Snapshot, device: i64, after_event: Option<usize>) -> Levels {
    let mut r = Replayer::new(snap, device);
    let stop = after_event.map_or(0, |i| (i + 1).min(r.trace.len()));
    for i in 0..stop {
        r.step(i, &mut |_, _| {});
    }
    r.cur
}

/// A block counted in `allocated` at some trace position.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LiveBlock {
    pub address: u64,
    /// Block size (see the module doc for the basis).
    pub size: u64,
    /// Unrounded request.
    pub requested: u64,
    /// Allocation stack (interned in the snapshot's frame table).
    #[serde(skip)]
    pub stack: Option<StackId>,
    /// Index of its `alloc` entry; `null` when it was live before the trace began.
    pub alloc_event: Option<usize>,
    pub alloc_time_us: Option<i64>,
    /// Innermost `external_annotations` scope open when it was allocated.
    pub annotation: Option<String>,
}

/// The allocated blocks after each of the given events (`None` = before the first),
/// in one walk. Results are in the order asked, blocks sorted by address.
pub fn live_sets_at(snap: &Snapshot, device: i64, positions: &[Option<usize>]) -> Vec<Vec<LiveBlock>> {
    let mut r = Replayer::new(snap, device);
    let n = r.trace.len();
    let state_of = |p: &Option<usize>| p.map_or(0, |i| (i + 1).min(n));
    let mut order: Vec<(usize, usize)> = positions.iter().enumerate().map(|(k, p)| (state_of(p), k)).collect();
    order.sort_unstable();
    let scopes = crate::attribution::Scopes::new(snap, device);
    let mut out: Vec<Vec<LiveBlock>> = vec![Vec::new(); positions.len()];
    let mut state = 0usize;
    for (target, k) in order {
        while state < target {
            r.step(state, &mut |_, _| {});
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

/// A block entering (`delta` +1) or leaving (−1) the allocated set, for [`timeline_walk`].
#[derive(Clone, Copy, Debug)]
pub struct AllocatedChange {
    /// Allocation stack.
    pub stack: Option<StackId>,
    /// Block size (see the module doc for the basis).
    pub size: u64,
    pub delta: i64,
    /// Allocated before the trace began (seeded at state 0).
    pub before_trace: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use fragscope_snapshot::{Block, Segment, SegmentType};

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

    /// The lives as the steps give them to a [`LivesRecorder`] (what the timeline's walk
    /// keeps): the definition [`Replayer::lives`] is held to.
    fn lives_by_steps(snap: &Snapshot, device: i64) -> BlockLives {
        let mut r = Replayer::new(snap, device);
        let mut rec = LivesRecorder::start(&mut r, device);
        for i in 0..r.trace.len() {
            r.step(i, &mut |b, d| rec.change(i, b, d));
        }
        rec.finish()
    }

    #[test]
    fn lives_without_the_levels_are_the_lives_of_the_steps() {
        // Random traces over a few addresses, so that every odd case comes up: an
        // `alloc` at a live address, frees of unknown blocks (before and after an alloc
        // there), a second `free_requested`, a `free_completed` alone, final blocks the
        // trace never saw or left free.
        let mut rng = fragscope_testdata::Rng(23);
        let actions = [Action::Alloc, Action::FreeRequested, Action::FreeCompleted, Action::SegmentAlloc];
        for _ in 0..400 {
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
            let want = lives_by_steps(&snap, 0);
            assert_eq!(Replayer::lives(&snap, 0, false).0, want, "{:?}", snap.device_traces[0]);
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
