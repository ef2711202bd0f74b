//! `torch.cuda.memory_summary()`'s whole table — Cur Usage, Peak Usage, Tot Alloc and Tot
//! Freed — rebuilt from a snapshot with a trace, **over the recorded window** (from the
//! trace's first entry to the snapshot), not over the process's life as PyTorch's own
//! counters are: a snapshot holds no counters, only the ring buffer of events.
//!
//! How: the state at the first entry comes from the backward walk of [`crate::state`]
//! (the same walk `replay --verify` uses), then every entry is applied forwards with the
//! recorded addresses, so each block's size — the rounded or unsplit size PyTorch counts
//! in `allocated_bytes`, which the trace does not state — is known when it is allocated and
//! freed. The counters change as PyTorch's do (spec §8.1): `allocation` /
//! `allocated_bytes` at `alloc` and `free_requested`; `active` / `active_bytes` /
//! `requested_bytes` at `alloc` and `free_completed`; `segment` / `reserved_bytes` at
//! `segment_alloc` / `segment_free` (and `reserved_bytes` at `segment_map` / `segment_unmap`;
//! expandable segments are not counted in `segment`).
//!
//! Principal types: [`MemoryTable`] (one per device) of [`StatRow`]s, each with `all`,
//! `large_pool` and `small_pool` [`Stat`]s; [`WalkWatch`], shown the table walk's states
//! at the positions it asks for ([`watching`]; the HTML report's keyframes).

use fragscope_snapshot::{Action, FxHashMap, Snapshot, TraceEvent};
use serde::Serialize;

use crate::state::{
    backward_walk, home_of, Ambiguity, BState, BlockRec, Home, Inconsistency, RecordedState, SplitRules, Undone,
    SMALL_BUFFER,
};
use crate::{recorded_config, with_rules, RoundMemo};

/// A watcher of [`memory_table`]'s backward walk: it is shown the walk's state at the
/// positions it asks for, so that a caller who needs states of the same walk (the HTML
/// report's keyframes) need not walk the trace a second time. Installed for the calls
/// of [`memory_table`] made inside [`watching`], on that thread (the table is computed
/// deep inside the timeline's walk, which takes no such argument).
pub trait WalkWatch {
    /// Whether it watches the next walk (a call of [`memory_table`] made before it is
    /// ready walks unwatched, and leaves the watch to the next).
    fn ready(&self) -> bool;
    /// The first state (trace position: `n` = the end, `0` = before the first entry) it
    /// wants, given the final state `st`; `usize::MAX` for none.
    fn start(&mut self, st: &RecordedState) -> usize;
    /// The walk's state at `state`, as asked; returns the next (lower) state it wants,
    /// `usize::MAX` for none.
    fn at(&mut self, state: usize, st: &RecordedState) -> usize;
}

thread_local! {
    static WATCH: std::cell::RefCell<Option<Box<dyn WalkWatch>>> = const { std::cell::RefCell::new(None) };
}

/// Runs `f` with `watch` shown the backward walk of the first [`memory_table`] call
/// inside it on this thread (none: the watch sees nothing; the walk stops at an entry
/// it cannot undo: the watch sees the states down to there only).
pub fn watching<R>(watch: Box<dyn WalkWatch>, f: impl FnOnce() -> R) -> R {
    WATCH.with(|w| *w.borrow_mut() = Some(watch));
    let r = f();
    WATCH.with(|w| w.borrow_mut().take());
    r
}

/// The watch's next wanted state after showing it `state` (`usize::MAX`: none).
#[inline(never)]
fn show(watch: &mut Option<Box<dyn WalkWatch>>, state: usize, st: &RecordedState) -> usize {
    watch.as_mut().map_or(usize::MAX, |w| w.at(state, st))
}

/// One counter over the window: as `memory_stats()` names the metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Stat {
    /// At the first trace entry (reconstructed).
    pub start: u64,
    /// At the snapshot ("Cur Usage").
    pub current: u64,
    /// Highest value in the window ("Peak Usage").
    pub peak: u64,
    /// Sum of increases in the window ("Tot Alloc").
    pub allocated: u64,
    /// Sum of decreases in the window ("Tot Freed").
    pub freed: u64,
}

impl Stat {
    fn new(start: u64) -> Stat {
        Stat { start, current: start, peak: start, allocated: 0, freed: 0 }
    }
    fn add(&mut self, n: u64) {
        self.current += n;
        self.allocated += n;
        self.peak = self.peak.max(self.current);
    }
    fn sub(&mut self, n: u64) {
        self.current = self.current.saturating_sub(n);
        self.freed += n;
    }
}

/// A metric for all pools and per pool (the "from large pool" / "from small pool" rows).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct StatRow {
    pub all: Stat,
    pub large_pool: Stat,
    pub small_pool: Stat,
}

impl StatRow {
    fn new(large: u64, small: u64) -> StatRow {
        StatRow { all: Stat::new(large + small), large_pool: Stat::new(large), small_pool: Stat::new(small) }
    }
    fn add(&mut self, small: bool, n: u64) {
        self.all.add(n);
        if small { &mut self.small_pool } else { &mut self.large_pool }.add(n);
    }
    fn sub(&mut self, small: bool, n: u64) {
        self.all.sub(n);
        if small { &mut self.small_pool } else { &mut self.large_pool }.sub(n);
    }
}

/// Why [`memory_table`] has no table for a device.
#[derive(Clone, Debug, PartialEq)]
pub enum TableError {
    /// The device has no trace entry.
    NoTrace,
    /// The backward walk cannot undo an entry from the final state.
    Disagree(Inconsistency),
    /// The state the walk rebuilt cannot apply an entry forwards.
    NotReplayable(Inconsistency),
}

impl std::fmt::Display for TableError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TableError::NoTrace => f.write_str("no trace"),
            TableError::Disagree(e) => {
                write!(f, "the trace and the final state disagree at entry {}: {}", e.index, e.reason)
            }
            TableError::NotReplayable(e) => {
                write!(f, "the trace cannot be replayed at entry {}: {}", e.index, e.reason)
            }
        }
    }
}

impl std::error::Error for TableError {}

/// The rows of `memory_summary()` fragscope can rebuild from a trace, over the window.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MemoryTable {
    /// Always `"recorded window"`: the figures cover the trace, not the process's life.
    pub window: &'static str,
    /// Trace entries the window spans.
    pub entries: u64,
    /// "Allocated memory" (`allocated_bytes`).
    pub allocated_bytes: StatRow,
    /// "Active memory" (`active_bytes`).
    pub active_bytes: StatRow,
    /// "Requested memory" (`requested_bytes`).
    pub requested_bytes: StatRow,
    /// "GPU reserved memory" (`reserved_bytes`).
    pub reserved_bytes: StatRow,
    /// "Allocations" (`allocation`).
    pub allocations: StatRow,
    /// "Active allocs" (`active`).
    pub active_allocs: StatRow,
    /// "GPU reserved segments" (`segment`, expandable segments excluded).
    pub segments: StatRow,
}

/// Per-pool sums of a state: (large, small) for each of the seven counters.
fn sums(st: &RecordedState) -> [(u64, u64); 7] {
    let mut v = [(0u64, 0u64); 7];
    let mut put = |k: usize, small: bool, n: u64| {
        if small {
            v[k].1 += n
        } else {
            v[k].0 += n
        }
    };
    for s in st.segs.values() {
        put(3, s.small, s.size);
        if !s.expandable {
            put(6, s.small, 1);
        }
        for b in &s.blocks {
            match b.state {
                BState::Allocated => {
                    put(0, s.small, b.size);
                    put(4, s.small, 1);
                }
                BState::Pending | BState::Free => {}
            }
            if b.state != BState::Free {
                put(1, s.small, b.size);
                put(2, s.small, b.requested);
                put(5, s.small, 1);
            }
        }
    }
    v
}

/// The table for `device`, or why it cannot be built (no trace; the trace and the final
/// state disagree, as `replay --verify` would report).
///
/// One backward walk with the block layout (it also checks the trace against the final
/// state), which adds the counters up as it goes: each entry's change is the block it
/// made or freed (or the segment), as the walk finds it, and with the changes taken
/// latest first, Tot Alloc and Tot Freed are sums, Cur Usage the start value plus all
/// changes, and Peak Usage the start value plus the largest sum of the changes up to
/// any entry, which is all changes minus the smallest sum of the changes after it
/// ([`Tally`]). No second pass over the trace, no map of live blocks. The result is the
/// same as applying every entry forwards with the layout ([`memory_table_by_replay`],
/// the definition) whenever that forward application would reproduce the walk's states,
/// which the walk checks as it goes (see [`walk_counting`]); when it cannot tell, the
/// table is built by that replay instead.
pub fn memory_table(snap: &Snapshot, device: i64) -> Result<MemoryTable, TableError> {
    table(snap, device, true).0
}

/// [`memory_table`] by the definition: the backward walk, then every entry applied
/// forwards with the block layout. Slower (a second walk with the layout); kept as the
/// fallback of [`memory_table`] and for tests that compare the two.
#[doc(hidden)]
pub fn memory_table_by_replay(snap: &Snapshot, device: i64) -> Result<MemoryTable, TableError> {
    table(snap, device, false).0
}

/// [`memory_table`], and whether it was built by the walk's own counts (`false`: by the
/// replay, or no table). For tests, which check that the walk serves real traces.
#[doc(hidden)]
pub fn memory_table_noted(snap: &Snapshot, device: i64) -> (Result<MemoryTable, TableError>, bool) {
    table(snap, device, true)
}

fn table(snap: &Snapshot, device: i64, noting: bool) -> (Result<MemoryTable, TableError>, bool) {
    let trace = snap.trace(device);
    if trace.is_empty() {
        return (Err(TableError::NoTrace), false);
    }
    let cfg = recorded_config(snap);
    let home = |e: &TraceEvent| home_of(snap, e);
    let fin = RecordedState::from_snapshot(snap, device);
    let mut noted = false;
    let t = with_rules(&cfg, |rules| {
        let disagree = TableError::Disagree;
        let (st, tallies) = if noting {
            let mut watch = WATCH.with(|w| {
                let mut w = w.borrow_mut();
                w.as_ref().is_some_and(|w| w.ready()).then(|| w.take()).flatten()
            });
            walk_counting(fin, trace, &home, rules, &mut watch).map_err(disagree)?
        } else {
            (backward_walk(fin, trace, &home, rules).map_err(disagree)?.state, None)
        };
        let mut t = start_table(&st, trace.len());
        if let Some(Counted { tallies, requests_differ }) = tallies {
            let differ = !requests_differ.is_empty();
            if let Some(mut counted) = tallies.table(&t, differ) {
                if differ {
                    counted.requested_bytes = requested_forward(t.requested_bytes, &st, trace, requests_differ);
                }
                noted = true;
                return Ok(counted);
            }
        }
        replay_forward(&mut t, st, trace, &home, rules)?;
        Ok(t)
    });
    (t, noted)
}

/// The table at the first entry (every column at its start value).
fn start_table(st: &RecordedState, entries: usize) -> MemoryTable {
    let s = sums(st);
    let row = |k: usize| StatRow::new(s[k].0, s[k].1);
    MemoryTable {
        window: "recorded window",
        entries: entries as u64,
        allocated_bytes: row(0),
        active_bytes: row(1),
        requested_bytes: row(2),
        reserved_bytes: row(3),
        allocations: row(4),
        active_allocs: row(5),
        segments: row(6),
    }
}

/// Positions of the metrics in [`Tallies`], in [`MemoryTable`]'s order.
const ALLOCATED_BYTES: usize = 0;
const ACTIVE_BYTES: usize = 1;
const REQUESTED_BYTES: usize = 2;
const RESERVED_BYTES: usize = 3;
const ALLOCATIONS: usize = 4;
const ACTIVE_ALLOCS: usize = 5;
const SEGMENTS: usize = 6;

/// One counter's changes over the trace, added up by the backward walk (latest entry
/// first), for all pools (lane 0) and each pool (lane 1 large, lane 2 small). With
/// `suffix` the sum of the changes from an entry to the last, the counter after entry
/// *k* is its start value plus all changes minus the suffix after *k*: its highest value
/// is the start plus all changes minus the smallest suffix (the empty one, 0, included).
///
/// Its lowest value is not needed: the changes are the walk's own, each the block or
/// segment that an entry adds to or takes from the walk's state, so after every entry
/// the counter is a sum over the walk's state (of its allocated blocks' sizes, its
/// segments, …), never below zero, and the replay's `sub` ([`Stat::sub`]), which
/// saturates at zero, never does here. (`requested_bytes` only while each `alloc`
/// states the request its block holds; otherwise that row is counted forwards.)
///
/// The walk updates two lanes per change, in `i64` and with no branch on the pool (this
/// is most of the table's own cost per entry). Tot Freed is kept per pool, and Tot Alloc
/// follows (all changes plus Tot Freed; all pools is the pools' sum). The sums are exact
/// while no sum of changes reaches 2^63 in absolute value, which [`Tallies::table`]
/// checks from the largest change and the number of entries.
#[derive(Clone, Copy, Debug, Default)]
struct Tally {
    suffix: [i64; 3],
    min_suffix: [i64; 3],
    /// Decreases by pool (large, small).
    freed: [i64; 2],
}

impl Tally {
    #[inline(always)]
    fn add(&mut self, small: bool, n: u64) {
        let (l, n) = (1 + small as usize, n as i64);
        self.suffix[0] = self.suffix[0].wrapping_add(n);
        self.suffix[l] = self.suffix[l].wrapping_add(n);
    }
    #[inline(always)]
    fn sub(&mut self, small: bool, n: u64) {
        let n = n as i64;
        self.freed[small as usize] = self.freed[small as usize].wrapping_add(n);
        for l in [0, 1 + small as usize] {
            let s = self.suffix[l].wrapping_sub(n);
            self.suffix[l] = s;
            // A branch, not a conditional move: new lows are rare once the walk is under
            // way, and the store of the minimum is then skipped.
            if s < self.min_suffix[l] {
                self.min_suffix[l] = s;
            }
        }
    }
    /// Lane `l`'s counter from `start` as [`Stat::add`] and [`Stat::sub`] would leave it
    /// applying the changes forwards.
    fn stat(&self, l: usize, start: u64) -> Option<Stat> {
        let freed = match l {
            0 => self.freed[0] as i128 + self.freed[1] as i128,
            l => self.freed[l - 1] as i128,
        };
        let end = start as i128 + self.suffix[l] as i128;
        Some(Stat {
            start,
            current: u64::try_from(end).ok()?,
            peak: u64::try_from(end - self.min_suffix[l] as i128).ok()?,
            allocated: u64::try_from(self.suffix[l] as i128 + freed).ok()?,
            freed: u64::try_from(freed).ok()?,
        })
    }
    fn row(&self, start: &StatRow) -> Option<StatRow> {
        Some(StatRow {
            all: self.stat(0, start.all.start)?,
            large_pool: self.stat(1, start.large_pool.start)?,
            small_pool: self.stat(2, start.small_pool.start)?,
        })
    }
}

/// The seven metrics' tallies, by the positions above, and the changes each entry makes
/// to them (as [`replay_forward`] makes them).
///
/// While every free the walk has met is paired (its `free_requested` right before its
/// `free_completed`, as PyTorch writes a block's frees unless it waits for other
/// streams), `allocated_bytes` and `allocations` have the tallies of `active_bytes` and
/// `active_allocs`: an `alloc` adds the same block to both; a pair takes it from both,
/// one entry apart, and the suffix the `free_completed` leaves `active_bytes` is the one
/// the `free_requested` leaves `allocated_bytes` an entry later, so their smallest
/// suffixes are the same too. Only the latter are kept then (two of the five metrics an
/// entry changes), and the former are copied from them at the first free that is not
/// paired ([`Tallies::unpair`]), and counted apart from there on.
#[derive(Clone, Copy, Debug)]
struct Tallies {
    m: [Tally; 7],
    /// Every change's size, or-ed: at least the largest ([`Tallies::table`]).
    sizes: u64,
    /// Every free so far is paired: `allocated_bytes` and `allocations` are not kept.
    paired: bool,
}

impl Default for Tallies {
    fn default() -> Tallies {
        Tallies { m: Default::default(), sizes: 0, paired: true }
    }
}

impl Tallies {
    #[inline(always)]
    fn alloc(&mut self, small: bool, size: u64, requested: u64) {
        self.sizes |= size | requested;
        if !self.paired {
            self.m[ALLOCATED_BYTES].add(small, size);
            self.m[ALLOCATIONS].add(small, 1);
        }
        self.m[ACTIVE_BYTES].add(small, size);
        self.m[REQUESTED_BYTES].add(small, requested);
        self.m[ACTIVE_ALLOCS].add(small, 1);
    }
    /// A `free_requested` and its `free_completed` right after it, of a block of `size`
    /// that asked for `requested`.
    #[inline(always)]
    fn free_pair(&mut self, small: bool, size: u64, requested: u64) {
        self.free_completed_only(small, size, requested);
        if !self.paired {
            self.m[ALLOCATED_BYTES].sub(small, size);
            self.m[ALLOCATIONS].sub(small, 1);
        }
    }
    /// A `free_requested` without its `free_completed` right after it.
    #[inline(always)]
    fn free_requested(&mut self, small: bool, size: u64) {
        self.unpair();
        self.sizes |= size;
        self.m[ALLOCATED_BYTES].sub(small, size);
        self.m[ALLOCATIONS].sub(small, 1);
    }
    /// A `free_completed` without its `free_requested` right before it.
    #[inline(always)]
    fn free_completed(&mut self, small: bool, size: u64, requested: u64) {
        self.unpair();
        self.free_completed_only(small, size, requested);
    }
    #[inline(always)]
    fn free_completed_only(&mut self, small: bool, size: u64, requested: u64) {
        self.sizes |= size | requested;
        self.m[ACTIVE_BYTES].sub(small, size);
        self.m[REQUESTED_BYTES].sub(small, requested);
        self.m[ACTIVE_ALLOCS].sub(small, 1);
    }
    /// From here on `allocated_bytes` and `allocations` are counted apart, from the
    /// tallies they share so far.
    #[inline]
    fn unpair(&mut self) {
        if self.paired {
            self.paired = false;
            self.m[ALLOCATED_BYTES] = self.m[ACTIVE_BYTES];
            self.m[ALLOCATIONS] = self.m[ACTIVE_ALLOCS];
        }
    }
    #[inline(always)]
    fn segment(&mut self, small: bool, size: u64, made: bool) {
        self.sizes |= size;
        if made {
            self.m[RESERVED_BYTES].add(small, size);
            self.m[SEGMENTS].add(small, 1);
        } else {
            self.m[RESERVED_BYTES].sub(small, size);
            self.m[SEGMENTS].sub(small, 1);
        }
    }
    /// The table from the start values in `start` ([`start_table`]); `requested_bytes`
    /// left at its start values when `no_requested` (counted apart). `None` when a sum
    /// of changes might not fit the tallies' `i64`: each is at most the number of
    /// changes (no more than the trace's entries: one each) times the largest (below
    /// 2^bits of the or of all sizes), which must stay below 2^62 (for all pools, the two
    /// pools' sums: below 2^63).
    fn table(&self, start: &MemoryTable, no_requested: bool) -> Option<MemoryTable> {
        let bits = 64 - self.sizes.leading_zeros();
        if bits >= 62 || start.entries >= 1 << (62 - bits) {
            return None;
        }
        Some(MemoryTable {
            window: start.window,
            entries: start.entries,
            allocated_bytes: self.m[ALLOCATED_BYTES].row(&start.allocated_bytes)?,
            active_bytes: self.m[ACTIVE_BYTES].row(&start.active_bytes)?,
            requested_bytes: if no_requested {
                start.requested_bytes
            } else {
                self.m[REQUESTED_BYTES].row(&start.requested_bytes)?
            },
            reserved_bytes: self.m[RESERVED_BYTES].row(&start.reserved_bytes)?,
            allocations: self.m[ALLOCATIONS].row(&start.allocations)?,
            active_allocs: self.m[ACTIVE_ALLOCS].row(&start.active_allocs)?,
            segments: self.m[SEGMENTS].row(&start.segments)?,
        })
    }
}

/// What [`walk_counting`] adds up: the tallies, and the `alloc` entries (latest first)
/// whose request differs from the one the walk's block holds (see [`requested_forward`]).
struct Counted {
    tallies: Tallies,
    requests_differ: Vec<usize>,
}

/// The backward walk of [`backward_walk`] (same undo of each entry, same error), adding
/// up each entry's change to the counters ([`Tallies`]) as the replay of
/// [`memory_table_by_replay`] makes it: an `alloc` adds the block it made (the walk's
/// block there before undoing it) and its request; a `free_requested` and a
/// `free_completed` take away the block the walk finds them freeing; a segment entry
/// its size, in the segment's pool. Returns the state at the first entry and the
/// tallies, or no tallies when applying the entries forwards from that state might not
/// give back the walk's states, so that the replay might see other blocks:
///
/// * an `alloc` whose block the forward rules would not make from the free block the
///   walk leaves there (another size, or no free block starting at the address);
/// * a block whose size the walk chose and revised later on (an earlier entry proved
///   another size, [`BlockRec::guessed`] / [`BlockRec::may_grow`]): the walk's states
///   between its choice and the revision held the other size, so its
///   `free_completed`, `free_requested` and `alloc` must find one size. Every such
///   block's `free_completed` is undone in this walk (only that undo chooses sizes,
///   and the final state's blocks are not chosen), so the revision itself, which the
///   undo of the `free_completed` that needs it reports ([`Undone::revised`]), is
///   where the counts stop vouching: no map of the sizes chosen is kept;
/// * a `segment_alloc` whose segment's pool is not the one the forward rule gives it
///   (2 MiB = small), segments that overlap in the final state, and expandable segments
///   (`segment_map` / `segment_unmap`: the forward merge of mapped ranges depends on
///   their streams and pools, which the table does not otherwise need).
///
/// Without those, by induction from the first entry, applying entry `i` to the walk's
/// state before it gives the walk's state after it, so the replay's lookups find what
/// the walk found, and every block its frees take away is the one its alloc made.
/// Once one of those is met, the rest of the trace is only walked (its state and its
/// errors are still needed: the replay starts from the state at the first entry).
///
/// One figure is the replay's own: `requested_bytes` takes away, at a `free_completed`,
/// the request of the block's `alloc`, where the walk knows only the size the
/// `free_completed` states (the block's `requested_size` in PyTorch, so the same in its
/// traces). The `alloc` entries that state another request than the walk's block holds
/// are listed, and that row is then counted by [`requested_forward`].
fn walk_counting(
    mut st: RecordedState,
    trace: &[TraceEvent],
    home: &dyn Fn(&TraceEvent) -> Home,
    rules: &SplitRules,
    watch: &mut Option<Box<dyn WalkWatch>>,
) -> Result<(RecordedState, Option<Counted>), Inconsistency> {
    let mut exact = segments_apart(&st);
    // The next state the watch wants (`usize::MAX`: none, or no watch).
    let mut next = watch.as_mut().map_or(usize::MAX, |w| w.start(&st));
    if next == trace.len() {
        next = show(watch, next, &st);
    }
    // Where the blocks tile their segments, a `free_requested` right before its block's
    // `free_completed` is undone with it ([`RecordedState::undo_free_pair`]).
    let tiled = st.blocks_tile_segments();
    let mut t = Tallies::default();
    let mut requests_differ: Vec<usize> = Vec::new();
    let mut scratch = Vec::new();
    // The rounded requests, the walk's own: [`SplitRules::round`] keeps them too, but is
    // called through a pointer, a cost per `alloc` and paired `free_completed` larger
    // than the lookup.
    let rounded = RoundMemo::new();
    let mut i = trace.len();
    while exact && i > 0 {
        i -= 1;
        let ev = &trace[i];
        match ev.action {
            Action::Alloc => {
                // The block the alloc made, and the free block undoing it leaves, from
                // the undo's own lookup.
                let Undone { block: b, small, expandable, left, .. } = st.undo_alloc(i, ev)?;
                // The forward rule from that free block (§3.8) must make this block.
                let s = rounded.of(ev.size, rules.round);
                let fwd = match left {
                    Some(f) if f >= s => {
                        if rules.should_split(small, expandable, f, s) {
                            s
                        } else {
                            f
                        }
                    }
                    _ => u64::MAX,
                };
                if fwd != b.size {
                    exact = false;
                }
                // Its `free_completed` took away the request the walk gave the block.
                if b.requested != ev.size {
                    requests_differ.push(i);
                }
                t.alloc(small, b.size, ev.size);
            }
            Action::FreeRequested => {
                let Undone { block: b, small, .. } = st.undo_free_requested(i, ev)?;
                t.free_requested(small, b.size);
            }
            Action::FreeCompleted => {
                // Its `free_requested` right before it (the usual case): both at once.
                let fr = i.checked_sub(1).map(|k| &trace[k]);
                // (Not when the watch wants the state between the two.)
                let paired =
                    fr.filter(|fr| tiled && fr.action == Action::FreeRequested && fr.addr == ev.addr && next != i);
                let Undone { block: b, small, revised, .. } = match paired {
                    Some(fr) => st.undo_free_pair(i, ev, fr, rounded.of(ev.size, rules.round), rules, &mut scratch)?.0,
                    None => undo_lone_free_completed(&mut st, i, ev, rules, &mut scratch)?,
                };
                scratch.clear();
                if revised {
                    exact = false;
                }
                if paired.is_some() {
                    // The `free_requested`'s block is the same block, allocated again.
                    i -= 1;
                    t.free_pair(small, b.size, b.requested);
                } else {
                    t.free_completed(small, b.size, b.requested);
                }
            }
            Action::SegmentAlloc => {
                let small = st.seg_key(ev.addr).and_then(|k| st.segs.get(&k)).map(|s| s.small);
                st.undo_segment(i, ev, home(ev))?;
                if small != Some(ev.size == SMALL_BUFFER) {
                    exact = false;
                }
                t.segment(small.unwrap_or(false), ev.size, true);
            }
            Action::SegmentFree => {
                st.undo_segment(i, ev, home(ev))?;
                let small = st.seg_key(ev.addr).and_then(|k| st.segs.get(&k)).is_some_and(|s| s.small);
                t.segment(small, ev.size, false);
            }
            Action::SegmentMap | Action::SegmentUnmap => {
                st.undo_segment(i, ev, home(ev))?;
                exact = false;
            }
            _ => st.undo_segment(i, ev, home(ev))?,
        }
        if i == next {
            next = show(watch, i, &st);
        }
    }
    // The counts cannot vouch from here on: the walk alone.
    walk_rest(&mut st, &trace[..i], home, rules, watch, next)?;
    t.unpair();
    Ok((st, exact.then_some(Counted { tallies: t, requests_differ })))
}

/// The backward walk of the entries `trace` (the first ones), for [`walk_counting`] once
/// its counts cannot vouch: out of line, so that the undo of every action is not inlined
/// a second time into the function of the counting loop (see
/// [`undo_lone_free_completed`]).
#[inline(never)]
fn walk_rest(
    st: &mut RecordedState,
    trace: &[TraceEvent],
    home: &dyn Fn(&TraceEvent) -> Home,
    rules: &SplitRules,
    watch: &mut Option<Box<dyn WalkWatch>>,
    mut next: usize,
) -> Result<(), Inconsistency> {
    let mut scratch = Vec::new();
    for (i, ev) in trace.iter().enumerate().rev() {
        st.undo(i, ev, home(ev), rules, &mut scratch)?;
        scratch.clear();
        if i == next {
            next = show(watch, i, st);
        }
    }
    Ok(())
}

/// [`RecordedState::undo_free_completed`] for [`walk_counting`], out of its loop: a
/// `free_completed` away from its `free_requested` (a block that waited for other
/// streams) is the rarer case. With this undo (a second copy beside the one of
/// [`RecordedState::undo_free_pair`]) and [`walk_rest`]'s inlined into the counting
/// loop's function, the compiler no longer inlined the block list's shifts
/// (`Vec::remove`) there, which cost back what the tallies had saved (callgrind, on the
/// last 3% of `loopreq-6.9m`).
#[inline(never)]
fn undo_lone_free_completed(
    st: &mut RecordedState,
    i: usize,
    ev: &TraceEvent,
    rules: &SplitRules,
    scratch: &mut Vec<Ambiguity>,
) -> Result<Undone, Inconsistency> {
    st.undo_free_completed(i, ev, rules, scratch)
}

/// `requested_bytes` forwards from its start value, as the replay counts it, where some
/// `alloc` states another request than the walk's block holds (`differ`, latest first,
/// from [`walk_counting`]): an `alloc` adds its request, and the `free_completed` of
/// that block takes the same away, where the walk took away what the `free_completed`
/// states. Other blocks' `free_completed` take away what they state (the walk gave the
/// block that request, and kept it back to its `alloc` or the first entry).
///
/// Each entry's pool is its segment's: those alive at the first entry as the walk left
/// them, those the trace makes by the 2 MiB rule (the walk vouched for both, and for
/// no overlap). Only traces that state one block's request two ways need this pass
/// (`replicate_trace --loop` files before it kept requests in its neutral stretch);
/// PyTorch's `free_completed` states the block's `requested_size`.
fn requested_forward(start: StatRow, st: &RecordedState, trace: &[TraceEvent], mut differ: Vec<usize>) -> StatRow {
    let mut row = start;
    let mut pools = PoolsByAddr::new(st.segs.values().map(|s| (s.addr, s.end(), s.small)).collect());
    // The request of each block whose alloc is in `differ`, until its free_completed.
    let mut held: FxHashMap<u64, u64> = FxHashMap::default();
    let mut next = differ.pop();
    for (i, ev) in trace.iter().enumerate() {
        match ev.action {
            Action::Alloc => {
                row.add(pools.small(ev.addr), ev.size);
                if next == Some(i) {
                    held.insert(ev.addr, ev.size);
                    next = differ.pop();
                }
            }
            Action::FreeCompleted => {
                let requested = match held.is_empty() {
                    true => ev.size,
                    false => held.remove(&ev.addr).unwrap_or(ev.size),
                };
                row.sub(pools.small(ev.addr), requested);
            }
            Action::SegmentAlloc => pools.insert(ev.addr, ev.addr + ev.size, ev.size == SMALL_BUFFER),
            Action::SegmentFree => pools.remove(ev.addr),
            _ => {}
        }
    }
    row
}

/// The pool of the segment holding an address, for [`requested_forward`]: the segments
/// as `(start, end, small)` by start, and the one last found in each 2 MiB granule
/// (most lookups then skip the binary search, as in the walk's own segment map).
struct PoolsByAddr {
    segs: Vec<(u64, u64, bool)>,
    hints: Vec<u32>,
}

impl PoolsByAddr {
    const HINTS: usize = 4096;
    fn new(segs: Vec<(u64, u64, bool)>) -> PoolsByAddr {
        PoolsByAddr { segs, hints: vec![u32::MAX; Self::HINTS] }
    }
    /// Is `a` in a small-pool segment (`false` in none)?
    #[inline]
    fn small(&mut self, a: u64) -> bool {
        let h = (a >> 21) as usize & (Self::HINTS - 1);
        if let Some(&(s, e, small)) = self.segs.get(self.hints[h] as usize) {
            if s <= a && a < e {
                return small;
            }
        }
        let k = self.segs.partition_point(|s| s.0 <= a);
        if k > 0 && a < self.segs[k - 1].1 {
            self.hints[h] = (k - 1) as u32;
            self.segs[k - 1].2
        } else {
            false
        }
    }
    fn insert(&mut self, start: u64, end: u64, small: bool) {
        let k = self.segs.partition_point(|s| s.0 < start);
        self.segs.insert(k, (start, end, small));
        self.hints.fill(u32::MAX);
    }
    fn remove(&mut self, start: u64) {
        if let Ok(k) = self.segs.binary_search_by_key(&start, |s| s.0) {
            self.segs.remove(k);
            self.hints.fill(u32::MAX);
        }
    }
}

/// No two segments of the state overlap (the walk adds segments only where none is, so
/// then no state of the walk has overlapping segments either).
fn segments_apart(st: &RecordedState) -> bool {
    let mut end = 0;
    for s in st.segs.values() {
        if s.addr < end {
            return false;
        }
        end = s.end();
    }
    true
}

/// The counters by applying every entry forwards with the block layout from the state at
/// the first entry (the definition; see [`memory_table_by_replay`]).
fn replay_forward(
    t: &mut MemoryTable,
    mut st: RecordedState,
    trace: &[TraceEvent],
    home: &dyn Fn(&TraceEvent) -> Home,
    rules: &SplitRules,
) -> Result<(), TableError> {
    // The block each address holds from its `alloc` to its `free_completed` (its
    // size, request and pool do not change meanwhile): frees read it here rather
    // than search the segments again. Blocks from before the trace are searched for.
    let mut held: FxHashMap<u64, (BlockRec, bool)> = FxHashMap::default();
    for (i, ev) in trace.iter().enumerate() {
        // The block before the entry changes it (frees), and the pool of a segment
        // before it goes: looked up for those entries only (each lookup is a search
        // of the segments, and this loop runs once per entry of the trace).
        let before = match ev.action {
            Action::FreeRequested => {
                held.get(&ev.addr).copied().or_else(|| st.block_starting(ev.addr).map(|(b, small, _)| (b, small)))
            }
            Action::FreeCompleted => {
                held.remove(&ev.addr).or_else(|| st.block_starting(ev.addr).map(|(b, small, _)| (b, small)))
            }
            _ => None,
        };
        let seg_small_before = match ev.action {
            Action::SegmentFree | Action::SegmentUnmap => {
                st.seg_key(ev.addr).and_then(|k| st.segs.get(&k)).map(|s| s.small)
            }
            _ => None,
        };
        st.apply(i, ev, home(ev), rules).map_err(TableError::NotReplayable)?;
        match ev.action {
            Action::Alloc => {
                // ... and after it (the block an alloc made or took).
                let Some((b, small, _)) = st.block_starting(ev.addr) else { continue };
                held.insert(ev.addr, (b, small));
                t.allocated_bytes.add(small, b.size);
                t.active_bytes.add(small, b.size);
                t.requested_bytes.add(small, ev.size);
                t.allocations.add(small, 1);
                t.active_allocs.add(small, 1);
            }
            Action::FreeRequested => {
                if let Some((b, small)) = before {
                    t.allocated_bytes.sub(small, b.size);
                    t.allocations.sub(small, 1);
                }
            }
            Action::FreeCompleted => {
                if let Some((b, small)) = before {
                    t.active_bytes.sub(small, b.size);
                    t.requested_bytes.sub(small, b.requested);
                    t.active_allocs.sub(small, 1);
                }
            }
            Action::SegmentAlloc | Action::SegmentMap => {
                let small = st.seg_key(ev.addr).and_then(|k| st.segs.get(&k)).is_some_and(|s| s.small);
                t.reserved_bytes.add(small, ev.size);
                if ev.action == Action::SegmentAlloc {
                    t.segments.add(small, 1);
                }
            }
            Action::SegmentFree | Action::SegmentUnmap => {
                // The segment (or range) is gone after the entry: its pool from before.
                let small = seg_small_before.unwrap_or(false);
                t.reserved_bytes.sub(small, ev.size);
                if ev.action == Action::SegmentFree {
                    t.segments.sub(small, 1);
                }
            }
            _ => {}
        }
    }
    Ok(())
}
