//! The bookkeeping walk of one device's trace that every analysis of this crate shares:
//! [`Replayer`] applies the entries in order to the set of live blocks and the four
//! levels ([`Levels`]), after seeding the state before the first entry ([`Seeded`]). Only
//! what the trace says happened is applied (no allocator model): `alloc` adds a block,
//! `free_requested` ends its `allocated` life, `free_completed` its `active` life;
//! segment entries add and remove reserved bytes.
//!
//! # What the walk reports
//!
//! [`Replayer::run`] tells a [`WalkSink`] what happens, in trace order: each block that
//! enters or leaves the `allocated` set ([`AllocatedChange`]; the blocks live before the
//! trace enter at state 0), and the levels at every state. Its consumers — the timeline's
//! curves and peaks, the block lives ([`crate::lives`]), a front end's own curves — are
//! sinks, and one walk feeds any number of them (a tuple of sinks is a sink). A sink
//! implements the methods it reads; the others do nothing, and since the walk is generic
//! over its sink they cost nothing either.
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

use crate::blocks::request_of;

/// What the reserved curve is read from (`reserved_source` in JSON).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ReservedSource {
    /// Segment entries of the trace and the final segments.
    Segments,
    /// A profiler trace's `Total Reserved` samples (Kineto has no segments).
    ProfilerTotals,
    /// Nothing in the file says what was reserved.
    None,
}

impl ReservedSource {
    /// The name JSON gives it.
    pub fn as_str(self) -> &'static str {
        match self {
            ReservedSource::Segments => "segments",
            ReservedSource::ProfilerTotals => "profiler_totals",
            ReservedSource::None => "none",
        }
    }
}

impl std::fmt::Display for ReservedSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
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

/// A block allocated by the trace.
///
/// 16 bytes: its entries as 32-bit numbers (a snapshot to analyse is refused past
/// [`fragscope_snapshot::bounds::MAX_TRACE_ENTRIES`]), its stack and time its `alloc` entry's
/// ([`TracedLife::stack`]). Millions of lives on a long trace, each byte of them a fresh
/// page's worth of zeroing: at 24 bytes the lives of a 6.4 M-entry trace were 53 MB.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TracedLife {
    /// Index of its `alloc` entry ([`TracedLife::alloc`]).
    alloc_at: u32,
    /// Index of the entry that ended its life, `u32::MAX` for none ([`TracedLife::end`]).
    end_at: u32,
    /// Block size (see [`mod@crate::timeline`]'s module doc for the basis).
    pub size: u64,
}

const _: () = assert!(std::mem::size_of::<TracedLife>() == 16);

/// A block seeded as allocated at state 0 (live before the trace began).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SeededLife {
    pub address: u64,
    pub size: u64,
    pub request: u64,
    pub stack: Option<StackId>,
    /// As [`TracedLife::end`].
    pub end: usize,
}

/// [`TracedLife::end`] of a block still allocated after the last entry.
pub const LIVE_AT_END: usize = usize::MAX;

impl TracedLife {
    /// The life of a block allocated at entry `alloc`, ended at entry `end` ([`LIVE_AT_END`]
    /// when none did), of `size` bytes. Entries are below `u32::MAX` (the reader's bound).
    #[inline]
    pub fn new(alloc: usize, end: usize, size: u64) -> Self {
        debug_assert!(alloc < u32::MAX as usize && (end < u32::MAX as usize || end == LIVE_AT_END));
        TracedLife { alloc_at: alloc as u32, end_at: end.min(u32::MAX as usize) as u32, size }
    }

    /// Index of its `alloc` entry (address and request are that entry's).
    #[inline]
    pub fn alloc(&self) -> usize {
        self.alloc_at as usize
    }

    /// Index of the entry that ended its `allocated` life; [`LIVE_AT_END`] when none did.
    #[inline]
    pub fn end(&self) -> usize {
        if self.end_at == u32::MAX {
            LIVE_AT_END
        } else {
            self.end_at as usize
        }
    }

    /// Ends its life at entry `end` ([`LIVE_AT_END`]: live at the end).
    #[inline]
    pub fn set_end(&mut self, end: usize) {
        self.end_at = end.min(u32::MAX as usize) as u32;
    }

    /// Its allocation stack: its `alloc` entry's (`trace` is the device's trace the
    /// lives were walked from). Read in `alloc` order, as the lives are kept, the
    /// entries are read forward.
    #[inline]
    pub fn stack(&self, trace: &[TraceEvent]) -> Option<StackId> {
        trace[self.alloc()].stack
    }

    /// The entry that ended its life, `None` when it is live at the end.
    pub fn end_entry(&self) -> Option<usize> {
        (self.end_at != u32::MAX).then_some(self.end_at as usize)
    }
}

/// A block entering (`delta` +1) or leaving (−1) the allocated set, as the walk reports
/// it to a [`WalkSink`].
#[derive(Clone, Copy, Debug)]
pub struct AllocatedChange {
    /// Allocation stack.
    pub stack: Option<StackId>,
    /// Block size (see the module doc for the basis).
    pub size: u64,
    pub delta: i64,
    /// Allocated before the trace began (seeded at state 0).
    pub before_trace: bool,
    /// The block's address.
    pub address: u64,
    /// Unrounded request.
    pub request: u64,
    /// Index of its `alloc` entry; `None` when it was live before the trace began.
    pub alloc_event: Option<usize>,
    /// Its life: the index of its [`TracedLife`] among the blocks the trace allocates
    /// (`alloc` order), or, `before_trace`, of its [`SeededLife`] among the blocks seeded
    /// as allocated (the order the walk reports them at state 0) — the indexes of
    /// `BlockLives::traced` and `BlockLives::seeded`.
    pub life: usize,
}

impl AllocatedChange {
    #[inline(always)]
    fn of(address: u64, b: &Live, delta: i64) -> Self {
        AllocatedChange {
            stack: b.stack,
            size: b.size,
            delta,
            before_trace: b.before_trace(),
            address,
            request: b.request,
            alloc_event: (!b.before_trace()).then_some(b.alloc_event),
            life: b.life as usize,
        }
    }
}

/// What [`Replayer::run`] reports, one method per kind of report, in this order: the
/// blocks allocated at state 0 ([`WalkSink::allocated`] with state 0), the levels at
/// state 0, then for each entry `i` the blocks it made or ended (state `i + 1`) and the
/// levels after it. State `s` is the state after the first `s` entries.
///
/// Every method does nothing unless implemented. `()` is the sink that reads nothing,
/// `(A, B)` feeds both, `Option<S>` feeds `S` when there is one, `&mut S` lends one;
/// [`OnAllocated`] and [`OnLevels`] make a sink of a closure.
pub trait WalkSink {
    /// `change.delta` = +1: a block entered the allocated set at `state`; −1: it left it.
    #[inline(always)]
    fn allocated(&mut self, state: usize, change: &AllocatedChange) {
        let _ = (state, change);
    }
    /// The levels at `state`, after its changes; `entry` is the trace entry that led to
    /// it (`None` for state 0).
    #[inline(always)]
    fn levels(&mut self, state: usize, entry: Option<&TraceEvent>, levels: &Levels) {
        let _ = (state, entry, levels);
    }
}

impl WalkSink for () {}

impl<S: WalkSink + ?Sized> WalkSink for &mut S {
    #[inline(always)]
    fn allocated(&mut self, state: usize, change: &AllocatedChange) {
        (**self).allocated(state, change)
    }
    #[inline(always)]
    fn levels(&mut self, state: usize, entry: Option<&TraceEvent>, levels: &Levels) {
        (**self).levels(state, entry, levels)
    }
}

impl<S: WalkSink> WalkSink for Option<S> {
    #[inline(always)]
    fn allocated(&mut self, state: usize, change: &AllocatedChange) {
        if let Some(s) = self {
            s.allocated(state, change)
        }
    }
    #[inline(always)]
    fn levels(&mut self, state: usize, entry: Option<&TraceEvent>, levels: &Levels) {
        if let Some(s) = self {
            s.levels(state, entry, levels)
        }
    }
}

impl<A: WalkSink, B: WalkSink> WalkSink for (A, B) {
    #[inline(always)]
    fn allocated(&mut self, state: usize, change: &AllocatedChange) {
        self.0.allocated(state, change);
        self.1.allocated(state, change);
    }
    #[inline(always)]
    fn levels(&mut self, state: usize, entry: Option<&TraceEvent>, levels: &Levels) {
        self.0.levels(state, entry, levels);
        self.1.levels(state, entry, levels);
    }
}

/// A sink of the allocated changes only: `f(state, change)` ([`WalkSink::allocated`]).
pub struct OnAllocated<F: FnMut(usize, &AllocatedChange)>(pub F);

impl<F: FnMut(usize, &AllocatedChange)> WalkSink for OnAllocated<F> {
    #[inline(always)]
    fn allocated(&mut self, state: usize, change: &AllocatedChange) {
        (self.0)(state, change)
    }
}

/// A sink of the levels only: `f(state, levels)` ([`WalkSink::levels`]).
pub struct OnLevels<F: FnMut(usize, &Levels)>(pub F);

impl<F: FnMut(usize, &Levels)> WalkSink for OnLevels<F> {
    #[inline(always)]
    fn levels(&mut self, state: usize, _entry: Option<&TraceEvent>, levels: &Levels) {
        (self.0)(state, levels)
    }
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
    /// Number of the block's life ([`AllocatedChange::life`]): traced blocks in `alloc`
    /// order, seeded ones (allocated at state 0) in the order the walk reports them
    /// ([`Replayer::number_seeded`]). 32 bits: a trace of 4 G entries (40 bytes each in
    /// memory) could not be loaded.
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
    pub(crate) final_sizes: Vec<(usize, u64)>,
    final_pos: usize,
    /// Per trace entry: the slot of its address (`alloc` and frees only; 0 for others).
    slot_of: Vec<u32>,
    /// Per slot: its address.
    pub(crate) addr_of: Vec<u64>,
    /// Per slot: the block live at its address, if any.
    pub(crate) live: Vec<Option<Live>>,
    /// Slots of the blocks seeded at state 0, in the order the replay has always listed
    /// them (the iteration order of the address-keyed map that seeds them), which
    /// numbers the seeded lives ([`Replayer::number_seeded`]).
    pub(crate) seeded_order: Vec<u32>,
    pub cur: Levels,
    totals: &'a [TotalsSample],
    totals_pos: usize,
    pub reserved_source: ReservedSource,
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

/// The block lives made during [`Replayer::new`]'s pass 1 ([`BlockLives::replay_with_facts`](crate::lives::BlockLives::replay_with_facts)).
///
/// Between two entries that name an address, that address holds one block at most, and
/// the lifetime walk ends a block at the next entry that names its address, whatever
/// that entry is (an `alloc`: the free fell out of the trace; a `free_requested`; a
/// `free_completed` with no `free_requested` before it). So a traced life ends at the
/// next entry of its address after its `alloc`, and a block seeded at state 0 at the
/// first entry of its address: the lives need no second walk, only the first's slots.
pub(crate) struct LivesDraft {
    /// Traced lives in `alloc` order; their sizes are the rounded requests until
    /// [`BlockLives::replay_with_facts`](crate::lives::BlockLives::replay_with_facts) puts in the real sizes of the blocks live at the end.
    pub(crate) traced: Vec<TracedLife>,
    /// Per slot: 1 + the traced life its address holds and no entry has ended yet; 0 for
    /// none.
    pub(crate) pending: Vec<u32>,
    /// Per slot: the first entry that names its address.
    pub(crate) first_of: Vec<usize>,
    /// Rounded requests: a few sizes recur millions of times.
    pub(crate) rounded: Box<[(u64, u64); 256]>,
    /// Kept for the roles ([`crate::roles`]'s `LifeIndex`) when asked for: per traced
    /// life its request, and the traced lives in the order of the entries that ended them.
    pub(crate) index: bool,
    pub(crate) req: Vec<u64>,
    pub(crate) by_end: Vec<u32>,
}

impl LivesDraft {
    /// Entry `i` (an `alloc` or a free) names the address of slot `k`.
    #[inline(always)]
    fn entry(&mut self, i: usize, e: &TraceEvent, k: usize, cfg: &AllocatorConfig) {
        let p = std::mem::take(&mut self.pending[k]);
        if p != 0 {
            self.traced[p as usize - 1].set_end(i);
            if self.index {
                // Entries come in order, and each ends at most this one life.
                self.by_end.push(p - 1);
            }
        }
        if e.action == Action::Alloc {
            let m = &mut self.rounded[(e.size.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as usize];
            if m.0 != e.size {
                *m = (e.size, round_size(e.size, cfg));
            }
            self.traced.push(TracedLife::new(i, LIVE_AT_END, m.1));
            if self.index {
                self.req.push(e.size);
            }
            // Lives are numbered in 32 bits ([`Live::life`]).
            self.pending[k] = self.traced.len() as u32;
        }
    }
}

/// What [`crate::roles`]' `LifeIndex` is made of, from the lifetime walk
/// ([`BlockLives::replay_with_facts`](crate::lives::BlockLives::replay_with_facts)): per
/// traced life its request; the traced lives in the order of the entries that ended them
/// (the roles place the seeded lives among them).
pub(crate) struct LifeIndexParts {
    pub req: Vec<u64>,
    pub by_end: Vec<u32>,
}

/// A block live before the trace that entry `e`, a free of an address no traced block
/// holds, frees: its request from the free, rounded; no stack (a free's frames are the
/// *free* stack when recorded with `context="all"`). `allocated`: its `free_requested`
/// is in the trace (else it was pending-free at t = 0).
#[inline(always)]
fn seed_unknown(e: &TraceEvent, allocated: bool, cfg: &AllocatorConfig) -> Live {
    Live {
        size: round_size(e.size, cfg),
        request: e.size,
        stack: None,
        time_us: NO_TIME,
        alloc_event: usize::MAX,
        allocated,
        life: 0,
    }
}

/// The segment entries of pass 1 ([`Replayer::build`]), for the reserved bytes at t = 0
/// and the unknown segments.
#[derive(Default)]
struct SegmentEvents {
    /// The trace's net segment growth so far, and its lowest point.
    net: i128,
    min_net: i128,
    /// Segments allocated or mapped and not freed (the replay's `seg_seen`: expandable
    /// segments' maps and unmaps too).
    seg_seen: FxHashMap<u64, ()>,
    /// `segment_alloc`s not yet freed, for `TraceFacts::unknown_segment_frees`.
    seg_allocs: FxHashMap<u64, ()>,
    /// Whether the trace has a segment entry.
    seen: bool,
}

impl SegmentEvents {
    /// Entry `e`, any but an `alloc` or a free of a block.
    #[inline(always)]
    fn entry(&mut self, e: &TraceEvent, seeded: &mut Seeded, facts: &mut TraceFacts) {
        match e.action {
            Action::SegmentAlloc | Action::SegmentMap => {
                self.seen = true;
                self.net += e.size as i128;
                self.seg_seen.insert(e.addr, ());
                if e.action == Action::SegmentAlloc {
                    self.seg_allocs.insert(e.addr, ());
                }
            }
            Action::SegmentFree | Action::SegmentUnmap => {
                self.seen = true;
                self.net -= e.size as i128;
                self.min_net = self.min_net.min(self.net);
                if self.seg_seen.remove(&e.addr).is_none() && e.action == Action::SegmentFree {
                    seeded.segment_frees_of_unknown_segments += 1;
                }
                if e.action == Action::SegmentFree && self.seg_allocs.remove(&e.addr).is_none() {
                    facts.unknown_segment_frees += 1;
                }
            }
            _ => {}
        }
    }

    /// Reserved bytes at t = 0: the final segments' bytes (`final_reserved`) minus the
    /// trace's net segment growth, raised if needed so the curve never goes below zero.
    fn reserved_at_start(&self, final_reserved: u64) -> u64 {
        let r = final_reserved as i128 - self.net;
        r.max(-self.min_net).max(0) as u64
    }
}

/// What pass 1 ([`Replayer::build`]) found besides the slots: the blocks seeded from
/// frees of unknown addresses, the segment entries, the seeding's counts and
/// `summary`'s facts.
struct Pass1 {
    initial: FxHashMap<u64, Live>,
    segs: SegmentEvents,
    seeded: Seeded,
    facts: TraceFacts,
}

/// The slots pass 1 ([`Replayer::build`]) made: address → slot; per slot its address,
/// the `alloc` entry of the traced block live there ([`NO_ALLOC`]), and whether a free
/// of an unknown block there is pending.
struct SlotTables {
    slots: FxHashMap<u64, u32>,
    addr_of: Vec<u64>,
    traced: Vec<usize>,
    orphan_pending: Vec<bool>,
}

/// What the final snapshot's segments say ([`SlotTables::final_state`]).
struct FinalState {
    /// (alloc entry, real block size) of the traced blocks live at the end, sorted.
    sizes: Vec<(usize, u64)>,
    /// The final segments' bytes.
    reserved: u64,
    /// Whether the snapshot has segments for the device.
    has_segments: bool,
}

impl SlotTables {
    /// The `alloc` entry of the traced block live at `address`, if any.
    fn traced_at(&self, address: u64) -> Option<usize> {
        self.slots.get(&address).map(|&k| self.traced[k as usize]).filter(|&idx| idx != NO_ALLOC)
    }

    /// The final state: real sizes of traced blocks, and untraced live blocks to seed
    /// (into `initial`, with their real size and their allocation stack from the
    /// snapshot); what disagrees with the trace counts as an inconsistency.
    fn final_state(
        &self,
        snap: &Snapshot,
        device: i64,
        initial: &mut FxHashMap<u64, Live>,
        seeded: &mut Seeded,
    ) -> FinalState {
        let mut sizes = Vec::new();
        let mut reserved = 0u64;
        let mut has_segments = false;
        for seg in snap.device_segments(device) {
            has_segments = true;
            reserved += seg.total_size;
            for b in seg.blocks.iter().filter(|b| b.state.is_active()) {
                if let Some(idx) = self.traced_at(b.address) {
                    sizes.push((idx, b.size));
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
                    if !self.slots.get(&b.address).is_some_and(|&k| self.orphan_pending[k as usize]) {
                        seeded.inconsistencies += 1;
                    }
                }
            }
        }
        if has_segments {
            // Sized at once (only looked up): grown by doubling, its tables were 5 % of
            // `summary`'s page faults on a trace that leaves 114 k blocks live.
            let active = || snap.device_segments(device).flat_map(|s| s.blocks.iter()).filter(|b| b.state.is_active());
            let mut final_live: FxHashMap<u64, ()> =
                FxHashMap::with_capacity_and_hasher(active().count(), Default::default());
            final_live.extend(active().map(|b| (b.address, ())));
            // Blocks the trace leaves live that the final state lacks (a trimmed file).
            seeded.inconsistencies += (self.traced.iter().zip(&self.addr_of))
                .filter(|&(&idx, a)| idx != NO_ALLOC && !final_live.contains_key(a))
                .count() as u64;
        }
        sizes.sort_unstable();
        FinalState { sizes, reserved, has_segments }
    }

    /// The blocks the trace leaves live, by address, with their `alloc` entry.
    fn live_at_end(&self) -> FxHashMap<u64, usize> {
        // Sized at once (only looked up and counted, never read in its order).
        let n = self.traced.iter().filter(|&&idx| idx != NO_ALLOC).count();
        let mut m = FxHashMap::with_capacity_and_hasher(n, Default::default());
        m.extend(self.traced.iter().zip(&self.addr_of).filter(|&(&idx, _)| idx != NO_ALLOC).map(|(&idx, &a)| (a, idx)));
        m
    }

    /// The seeded blocks into their slots (one of their own for an address no entry
    /// names: a block live at the end that the trace never touched): the slots'
    /// addresses, the block live in each, and the seeded blocks' slots in `initial`'s
    /// order.
    fn seed_slots(self, initial: &FxHashMap<u64, Live>) -> (Vec<u64>, Vec<Option<Live>>, Vec<u32>) {
        let SlotTables { mut slots, mut addr_of, traced, orphan_pending } = self;
        drop((traced, orphan_pending));
        let mut live: Vec<Option<Live>> = vec![None; addr_of.len()];
        let mut seeded_order = Vec::with_capacity(initial.len());
        for (&address, b) in initial {
            let next = addr_of.len() as u32;
            let k = *slots.entry(address).or_insert(next);
            if k == next {
                addr_of.push(address);
                live.push(None);
            }
            live[k as usize] = Some(*b);
            seeded_order.push(k);
        }
        (addr_of, live, seeded_order)
    }
}

/// The levels at t = 0: the seeded blocks' bytes and `reserved0`, noted in `seeded`.
fn seed_levels(initial: &FxHashMap<u64, Live>, reserved0: u64, seeded: &mut Seeded) -> Levels {
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
    cur
}

impl<'a> Replayer<'a> {
    /// Pass 1: works out the state at t = 0 (module doc). O(events), O(live) memory.
    pub fn new(snap: &'a Snapshot, device: i64) -> Self {
        Self::build::<false, true>(snap, device, None)
    }

    /// Pass 1 alone, for what `summary`'s trace figures read ([`TraceFacts`]): for a
    /// caller that needs neither the walk nor the lives (the report's summary, whose roles
    /// come from `analyze`'s walk), which then fills no per-entry slot table and records
    /// no life (on a 6.4 M-entry trace, 25 MB and 2.2 M lives).
    pub(crate) fn facts(snap: &'a Snapshot, device: i64) -> TraceFacts {
        Self::build::<false, false>(snap, device, None).facts
    }

    /// Pass 1 ([`Replayer::new`]); with `LIVES`, the lives recorded into `draft`; with
    /// `SLOTS`, each entry's slot kept for the walk (never both: the lives are made in
    /// this pass, the walk is not taken).
    pub(crate) fn build<const LIVES: bool, const SLOTS: bool>(
        snap: &'a Snapshot,
        device: i64,
        mut draft: Option<&mut LivesDraft>,
    ) -> Self {
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
        let mut slot_of: Vec<u32> = if SLOTS { vec![0; trace.len()] } else { Vec::new() };
        let mut addr_of: Vec<u64> = Vec::new();
        let mut traced: Vec<usize> = Vec::new();
        let mut orphan_pending: Vec<bool> = Vec::new();
        // Address → seeded block for frees of unknown addresses. A map, not slots: it
        // is small, and its iteration order is the order the seeded lives are numbered.
        let mut initial: FxHashMap<u64, Live> = FxHashMap::default();
        let mut segs = SegmentEvents::default();
        let mut facts = TraceFacts::default();
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
                } else if SLOTS {
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
                                if initial.insert(e.addr, seed_unknown(e, true, &cfg)).is_some() {
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
                            if initial.insert(e.addr, seed_unknown(e, false, &cfg)).is_some() {
                                seeded.inconsistencies += 1;
                            }
                        }
                    }
                }
                continue;
            }
            segs.entry(e, &mut seeded, &mut facts);
        }
        let pass = SlotTables { slots, addr_of, traced, orphan_pending };
        Self::finish(snap, device, cfg, slot_of, pass, Pass1 { initial, segs, seeded, facts })
    }

    /// The end of pass 1 ([`Replayer::build`]): the final snapshot's blocks, the reserved
    /// bytes and the levels at t = 0, and the seeded blocks into their slots.
    fn finish(
        snap: &'a Snapshot,
        device: i64,
        cfg: AllocatorConfig,
        slot_of: Vec<u32>,
        pass: SlotTables,
        found: Pass1,
    ) -> Self {
        let Pass1 { mut initial, segs, mut seeded, facts } = found;
        let trace = snap.trace(device);
        seeded.frees_of_unknown_bytes = initial.values().map(|b| b.size).sum();
        let fin = pass.final_state(snap, device, &mut initial, &mut seeded);
        let totals: &[TotalsSample] =
            usize::try_from(device).ok().and_then(|d| snap.totals.get(d)).map_or(&[], |t| t.as_slice());
        let reserved_from_totals = !fin.has_segments && !segs.seen && totals.iter().any(|t| t.reserved.is_some());
        let reserved_source = if reserved_from_totals {
            ReservedSource::ProfilerTotals
        } else if fin.has_segments || segs.seen {
            ReservedSource::Segments
        } else {
            ReservedSource::None
        };
        let reserved0 = if reserved_from_totals { 0 } else { segs.reserved_at_start(fin.reserved) };
        let cur = seed_levels(&initial, reserved0, &mut seeded);
        // The blocks live at the end of the trace, by address, for `summary`'s figures.
        let live_at_end = pass.live_at_end();
        let (addr_of, live, seeded_order) = pass.seed_slots(&initial);
        let mut r = Replayer {
            trace,
            cfg,
            final_sizes: fin.sizes,
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
            r.seed_profiler_baseline();
        }
        r.number_seeded();
        r
    }

    /// Numbers the blocks seeded as allocated ([`Live::life`]) in the order the walk
    /// reports them at state 0, the order of `BlockLives::seeded` (pending-free ones are
    /// never reported allocated).
    fn number_seeded(&mut self) {
        let mut n = 0u32;
        for &k in &self.seeded_order {
            if let Some(b) = self.live[k as usize].as_mut().filter(|b| b.allocated) {
                b.life = n;
                n += 1;
            }
        }
    }

    /// A profiler trace (Kineto) has no segments: one totals sample per profiler event
    /// (an alloc, or a free that the reader split into free_requested +
    /// free_completed). The first sample's `Total Allocated` minus what the first event
    /// leaves allocated is memory allocated before profiling began: seed it.
    fn seed_profiler_baseline(&mut self) {
        let trace = self.trace;
        let first = trace.iter().position(|e| matches!(e.action, Action::Alloc | Action::FreeCompleted));
        if let (Some(i), Some(a)) = (first, self.totals.first().and_then(|t| t.allocated)) {
            let mut probe = Levels::default();
            let e = &trace[i];
            if e.action == Action::Alloc {
                probe.allocated = round_size(e.size, &self.cfg);
            }
            let base = a.saturating_sub(probe.allocated);
            self.seeded.profiler_baseline_bytes = base;
            self.cur.allocated += base;
            self.cur.active += base;
            self.seeded.allocated_bytes += base;
            self.seeded.active_bytes += base;
        }
        self.advance_totals(trace.first().map_or(i64::MIN, |e| e.time_us));
    }

    /// The whole walk from state 0, reported to `sink` ([`WalkSink`]'s order): the blocks
    /// seeded as allocated, in the order the replay lists them, and the levels at state 0;
    /// then each entry's changes and the levels after it.
    #[inline(always)]
    pub fn run(&mut self, sink: &mut impl WalkSink) {
        for &k in &self.seeded_order {
            if let Some(b) = self.live[k as usize].as_ref().filter(|b| b.allocated) {
                sink.allocated(0, &AllocatedChange::of(self.addr_of[k as usize], b, 1));
            }
        }
        sink.levels(0, None, &self.cur);
        let trace = self.trace;
        for (i, e) in trace.iter().enumerate() {
            self.step(i, sink);
            sink.levels(i + 1, Some(e), &self.cur);
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

    /// Applies event `i`, telling `sink` ([`WalkSink::allocated`], at state `i + 1`) when a
    /// block enters or leaves the allocated set (what attribution counts as live). Events
    /// are applied in trace order, each once, from 0.
    #[inline(always)]
    pub fn step(&mut self, i: usize, sink: &mut impl WalkSink) {
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
                        sink.allocated(i + 1, &AllocatedChange::of(e.addr, &old, -1));
                    }
                }
                c.allocated += size;
                c.active += size;
                c.requested += e.size;
                sink.allocated(i + 1, &AllocatedChange::of(e.addr, &b, 1));
            }
            Action::FreeRequested => {
                if let Some(b) = self.live[self.slot_of[i] as usize].as_mut() {
                    if b.allocated {
                        b.allocated = false;
                        c.allocated = c.allocated.saturating_sub(b.size);
                        let b = *b;
                        sink.allocated(i + 1, &AllocatedChange::of(e.addr, &b, -1));
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
                        sink.allocated(i + 1, &AllocatedChange::of(e.addr, &b, -1));
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

pub(crate) fn opt_time(t: i64) -> Option<i64> {
    (t != NO_TIME).then_some(t)
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
