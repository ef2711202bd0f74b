//! The allocator state at any trace position: segments as rows of blocks.
//!
//! The snapshot's `segments` are the state at the end of the trace. Earlier states are
//! rebuilt by undoing trace events from there (the backward walk of
//! [`fragscope_replay::backward_walk`], spec §10.12). The page gets two things:
//!
//! * **keyframes** ([`Moment`]): full states (every segment and block) at chosen trace
//!   positions — the OOM, the reserved and allocated peaks, the end, and evenly spaced
//!   positions;
//! * **deltas** ([`StateOps`]), when they fit the size budget: for every event, the blocks
//!   and segments it removed and added. The page rebuilds the state at *any* event from
//!   the nearest keyframe before it ([`StateOps::exact`]). On a trace too long for that,
//!   there are no deltas and the keyframes are as dense as the budget allows; the page
//!   snaps to the nearest keyframe and says to which event.
//!
//! **Levels of detail.** The state view has a size budget independent of the input
//! ([`ReportOptions::state_values`]): exact (deltas) when they fit; else as many full
//! keyframes as fit, when at least [`MIN_FULL_KEYS`] do; else (a state of hundreds of
//! thousands of blocks) [`ReportOptions::moments`] *coarse* keyframes, whose small
//! neighbouring blocks are merged into one record each (state [`MERGED`]) until the
//! keyframe fits its share ([`coarsen`]), with the keyframe's exact figures beside them
//! ([`MomentFigures`]).
//!
//! A file whose trace and final state disagree gets the positions after the disagreement
//! only (said in [`crate::DeviceData::moments_note`]).
//!
//! Allocated and pending-free blocks carry the stack of the `alloc` that made them (a
//! forward pass over the trace; blocks allocated before recording began keep the stack
//! the final state records for them, when they are still there).
//!
//! **One backward walk.** `analyze`'s timeline makes memory_summary's table
//! ([`fragscope_replay::memory_table`]) for its peak allocated, itself a backward walk
//! from the final state; the keyframes are taken in that walk ([`SharedWalk`], watching
//! it through [`fragscope_replay::watching`]) when no deltas are embedded, and
//! [`walk_at`] walks only where that walk cannot serve (deltas; a trace it cannot undo).
//!
//! [`state_at`] is the same backward walk stopped at one position, for the page's tests
//! and for `fragscope report --state-at`.

use fragscope_alloc::rounding::round_size;
use fragscope_diagnose::Analysis;
use fragscope_replay::{home_of, recorded_config, BState, BlockRec, Inconsistency, RecordedState, SegRec, SplitRules};
use fragscope_snapshot::{Action, FxHashMap, Snapshot, StackId};
use fragscope_trace::DeviceTimeline;
use serde::Serialize;

use crate::{encode, layout, ReportOptions, StackTable};

/// `pool_id` of the default pools.
const DEFAULT_POOL: (u64, u64) = (0, 0);

/// Values (f64) of one delta record (see [`StateOps::ops`]).
pub const OP_LEN: usize = layout::StateOp::LEN;
/// Values of one block record of a keyframe (see [`Moment::blocks`]).
const BLOCK_LEN: usize = layout::Block::LEN;
/// In exact mode, one keyframe every this many events at least (the page applies at
/// most this many events' deltas after a keyframe: a few thousand records, < 1 ms).
const EXACT_KEY_EVERY: usize = 2048;

/// Full keyframes that must fit the budget for the state view to use them; with fewer,
/// the keyframes are coarse (module doc).
pub const MIN_FULL_KEYS: usize = 8;
/// Block state code of a coarse keyframe's record standing for several neighbouring
/// blocks of one segment: its `requested` is their allocated bytes and its `stack` the
/// number of blocks merged (see [`Moment::blocks`]).
pub const MERGED: u64 = 3;

/// Exact figures of a coarse keyframe (whose merged records cannot give them).
#[derive(Serialize, Debug, Clone, PartialEq, Default)]
pub struct MomentFigures {
    pub reserved: u64,
    pub allocated: u64,
    pub pending: u64,
    pub free: u64,
    pub largest: u64,
    /// Rounding slack of the allocated blocks (size − request).
    pub slack: u64,
    /// Blocks the state holds (records drawn: fewer).
    pub blocks: usize,
}

/// One captured state (a keyframe).
#[derive(Serialize)]
pub struct Moment {
    /// Trace state (0 = before the first event, `events` = the end).
    pub state: usize,
    /// Why it was chosen: `"oom"`, `"reserved_peak"`, `"allocated_peak"`, `"end"`, `"step"`.
    pub kinds: Vec<&'static str>,
    /// Its segments ([`layout::Segment`] records), base64 `Float64Array`.
    pub segments: String,
    /// Its blocks ([`layout::Block`] records: state 0 free, 1 allocated, 2 pending free;
    /// stack −1 when unknown), base64 `Float64Array`. In a coarse keyframe, also state 3
    /// ([`MERGED`]): several neighbouring blocks, `requested` = their allocated bytes,
    /// `stack` = how many.
    pub blocks: String,
    /// The exact figures, for a coarse keyframe only (`None`: the blocks are exact).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub figures: Option<MomentFigures>,
}

/// The per-event changes of the state between keyframes.
#[derive(Serialize, Default)]
pub struct StateOps {
    /// Every trace state from `first` to the end can be rebuilt exactly (deltas of every
    /// event are embedded); when false, the page can show the keyframes only.
    pub exact: bool,
    /// Earliest state that can be shown (0 unless the backward walk stopped).
    pub first: usize,
    /// Records ([`layout::StateOp`]), in event order (base64 `Float64Array`): event `i`
    /// turns state `i` into state `i + 1`. Removals come before additions.
    pub ops: String,
    /// Number of records.
    pub count: usize,
}

/// One delta record before its stack is known: (event, kind, address, size, a, b).
type RawOp = (usize, u8, u64, u64, u64, u64);

/// What the backward walk produced (see [`walk`]).
pub struct Walk {
    /// Keyframes in trace order: (state, kinds, segments).
    pub captured: Vec<(usize, Vec<&'static str>, Vec<SegRec>)>,
    /// Deltas in event order (empty unless `exact`).
    pub ops: Vec<RawOp>,
    pub exact: bool,
    pub first: usize,
    pub note: Option<String>,
    /// Coarse keyframes: at most this many block records each (module doc).
    pub coarse: Option<usize>,
    /// [`final_stacks`], found by the walk as it meets the `alloc` entries (the entries
    /// below the walk's last are scanned after it); `None` when the walk did not run.
    pub final_stacks: Option<FxHashMap<u64, Option<StackId>>>,
}

fn seg_flags(s: &SegRec) -> u64 {
    s.small as u64 | (s.expandable as u64) << 1 | ((s.pool != DEFAULT_POOL) as u64) << 2
}
fn state_code(b: BState) -> u64 {
    match b {
        BState::Free => 0,
        BState::Allocated => 1,
        BState::Pending => 2,
    }
}

/// Forward deltas of event `i` from `old` (the segments it touched, state `i`) to `new`
/// (the same range, state `i + 1`). Both in address order.
fn diff_segments(i: usize, old: &[SegRec], new: &[SegRec], out: &mut Vec<RawOp>) {
    let same_header = |a: &SegRec, b: &SegRec| {
        a.addr == b.addr && a.size == b.size && a.stream == b.stream && seg_flags(a) == seg_flags(b)
    };
    let mut adds = Vec::new();
    for o in old {
        match new.iter().find(|n| same_header(o, n)) {
            Some(n) => {
                // Same segment: only the blocks between the common prefix and suffix changed.
                let p = o.blocks.iter().zip(&n.blocks).take_while(|(a, b)| a == b).count();
                let rest = (o.blocks.len() - p).min(n.blocks.len() - p);
                let s = o.blocks.iter().rev().zip(n.blocks.iter().rev()).take(rest).take_while(|(a, b)| a == b).count();
                for b in &o.blocks[p..o.blocks.len() - s] {
                    out.push((i, 0, b.addr, b.size, 0, 0));
                }
                adds.extend(n.blocks[p..n.blocks.len() - s].iter().copied());
            }
            None => out.push((i, 2, o.addr, o.size, 0, 0)),
        }
    }
    for n in new {
        if !old.iter().any(|o| same_header(o, n)) {
            out.push((i, 3, n.addr, n.size, n.stream, seg_flags(n)));
            adds.extend(n.blocks.iter().copied());
        }
    }
    for b in adds {
        out.push((i, 1, b.addr, b.size, b.requested, state_code(b.state)));
    }
}

/// The segments event `ev` can change, cloned: the one holding its block, or for a
/// segment event every segment touching its range (an expandable segment's map or unmap
/// can grow, shrink, split or join segments).
fn touched(st: &RecordedState, ev: &fragscope_snapshot::TraceEvent) -> Vec<SegRec> {
    match ev.action {
        Action::Alloc | Action::FreeRequested | Action::FreeCompleted => {
            st.seg_key(ev.addr).and_then(|k| st.segs.get(&k)).into_iter().cloned().collect()
        }
        Action::SegmentAlloc | Action::SegmentFree | Action::SegmentMap | Action::SegmentUnmap => {
            let (lo, hi) = (ev.addr, ev.addr.saturating_add(ev.size));
            st.segs.values().filter(|s| s.addr <= hi && s.end() >= lo).cloned().collect()
        }
        _ => Vec::new(),
    }
}

/// Undo rules of the recorded allocator settings.
fn with_rules<R>(snap: &Snapshot, f: impl FnOnce(&SplitRules) -> R) -> R {
    let cfg = recorded_config(snap);
    let round = |x: u64| round_size(x, &cfg);
    let rules = SplitRules {
        round: &round,
        max_split_size: cfg.max_split_size,
        max_non_split_rounding: cfg.max_non_split_rounding,
    };
    f(&rules)
}

/// The trace positions the state view preselects besides the end: the OOM, the
/// reserved and the allocated peaks (states, as the page counts them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Marks {
    pub oom: Option<usize>,
    pub reserved_peak: usize,
    pub allocated_peak: usize,
}

impl Marks {
    /// From a device's timeline and its trace's first `oom` entry (what `analyze`
    /// reports: its OOM finding is made exactly for that entry).
    pub fn new(snap: &Snapshot, timeline: &DeviceTimeline) -> Marks {
        Marks::at(snap, timeline, timeline.first_oom)
    }

    /// From `analyze`'s results (`None` for a device it did not analyse).
    pub fn of(snap: &Snapshot, device: i64, ana: &Analysis) -> Option<Marks> {
        let d = ana.devices.iter().find(|d| d.device == device)?;
        Some(Marks::at(snap, &d.fragmentation.timeline, d.oom.as_ref().map(|o| o.event_index)))
    }

    fn at(snap: &Snapshot, t: &DeviceTimeline, oom: Option<usize>) -> Marks {
        Marks {
            oom: oom.map(|i| i.min(snap.trace(t.device).len())),
            reserved_peak: t.peak_reserved.event_index.map_or(0, |i| i + 1),
            allocated_peak: t.peak_allocated.event_index.map_or(0, |i| i + 1),
        }
    }
}

/// The backward walk of one device: keyframes (module doc) and, when they fit
/// `opts.state_values`, every event's deltas.
pub fn walk(snap: &Snapshot, device: i64, ana: &Analysis, opts: &ReportOptions) -> Walk {
    walk_at(snap, device, Marks::of(snap, device, ana), opts)
}

/// [`walk`], given the positions to preselect.
pub fn walk_at(snap: &Snapshot, device: i64, marks: Option<Marks>, opts: &ReportOptions) -> Walk {
    let trace = snap.trace(device);
    let n = trace.len();
    let final_state = RecordedState::from_snapshot(snap, device);
    let mut w = Walk {
        captured: Vec::new(),
        ops: Vec::new(),
        exact: false,
        first: n,
        note: None,
        coarse: None,
        final_stacks: None,
    };
    if final_state.segs.is_empty() {
        w.note = Some("the file records no segments for this device".into());
        return w;
    }
    let wanted = plan(n, &final_state, marks, opts, &mut w);

    let mut st = final_state;
    let mut want = wanted.iter().peekable();
    let mut scratch = Vec::new();
    // The final blocks' stacks, less those of addresses an `alloc` names ([`final_stacks`]),
    // removed as the walk meets each `alloc` (the entry is at hand: no second pass over
    // the trace); `lowest` is the first entry met.
    let mut stacks = final_block_stacks(snap, device);
    let mut lowest = n;
    let mut take =
        |state: usize, st: &RecordedState, want: &mut std::iter::Peekable<std::slice::Iter<(usize, &'static str)>>| {
            let mut kinds = Vec::new();
            while let Some(&&(s, k)) = want.peek() {
                if s != state {
                    break;
                }
                if !kinds.contains(&k) {
                    kinds.push(k);
                }
                want.next();
            }
            if !kinds.is_empty() {
                w.captured.push((state, kinds, st.segs.values().cloned().collect()));
            }
        };
    take(n, &st, &mut want);
    w.first = n;
    // Deltas are collected backwards (newest first) and reversed after the walk.
    let mut ops: Vec<RawOp> = Vec::new();
    let budget_ops = opts.state_values / OP_LEN;
    with_rules(snap, |rules| {
        for i in (0..n).rev() {
            if want.peek().is_none() && !w.exact {
                break;
            }
            let ev = &trace[i];
            if ev.action == Action::Alloc && !stacks.is_empty() {
                stacks.remove(&ev.addr);
            }
            lowest = i;
            let new = if w.exact { touched(&st, ev) } else { Vec::new() };
            if let Err(inc) = st.undo(i, ev, home_of(snap, ev), rules, &mut scratch) {
                w.note = Some(format!(
                    "the state before trace event {} could not be rebuilt ({}); earlier positions are not shown",
                    inc.index, inc.reason
                ));
                break;
            }
            if w.exact {
                let old = touched(&st, ev);
                let at = ops.len();
                diff_segments(i, &old, &new, &mut ops);
                // This event's records in forward order once the whole list is reversed.
                ops[at..].reverse();
                if ops.len() > budget_ops {
                    // More changes than estimated: keyframes only (those captured so far
                    // are exact positions; the rest come evenly spaced from `wanted`).
                    w.exact = false;
                    ops = Vec::new();
                }
            }
            w.first = i;
            take(i, &st, &mut want);
        }
    });
    // States before `first` cannot be shown; deltas are kept only down to the earliest
    // keyframe (the page starts from a keyframe).
    ops.reverse();
    if w.exact {
        let k0 = w.captured.last().map_or(n, |c| c.0);
        ops.retain(|o| o.0 >= k0);
        w.first = k0;
    } else {
        w.first = w.captured.last().map_or(n, |c| c.0);
    }
    w.ops = ops;
    w.captured.reverse();
    forget_allocated(&mut stacks, &trace[..lowest]);
    w.final_stacks = Some(stacks);
    w
}

/// The state view's keyframes taken in memory_summary's table walk
/// ([`fragscope_replay::memory_table`], which `analyze`'s timeline makes for its peak
/// allocated) rather than in a backward walk of their own: the two walks undo the same
/// entries from the same final state. The timeline's walk runs forwards first; its peaks
/// and first `oom` entry, which the keyframes mark, are followed here as it goes
/// ([`MarksSink`]) and known when the table's walk starts. Keyframes only (no deltas:
/// [`walk_at`] makes those, for traces short enough to have them), and only when that
/// walk reaches the first entry and the marks followed are the timeline's own
/// ([`SharedWalk::finish`]); otherwise [`walk_at`] walks again, as before.
pub struct SharedWalk {
    inner: std::rc::Rc<std::cell::RefCell<Shared>>,
}

/// What [`SharedWalk`]'s watch and its [`MarksSink`] share.
struct Shared {
    n: usize,
    opts: ReportOptions,
    /// The marks as the timeline's walk has found them so far.
    marks: Marks,
    /// The timeline's walk has passed its last state: the marks are final.
    marked: bool,
    /// The marks the keyframes were planned with.
    planned: Option<Marks>,
    /// The positions planned ([`plan`]), newest first, and how many are captured.
    wanted: Vec<(usize, &'static str)>,
    done: usize,
    walk: Option<Walk>,
}

impl SharedWalk {
    /// For device `device`'s trace, with its budgets `opts`.
    pub fn new(snap: &Snapshot, device: i64, opts: &ReportOptions) -> SharedWalk {
        let marks = Marks { oom: None, reserved_peak: 0, allocated_peak: 0 };
        let shared = Shared {
            n: snap.trace(device).len(),
            opts: *opts,
            marks,
            marked: false,
            planned: None,
            wanted: Vec::new(),
            done: 0,
            walk: None,
        };
        SharedWalk { inner: std::rc::Rc::new(std::cell::RefCell::new(shared)) }
    }

    /// The watch to install around the timeline's walk ([`fragscope_replay::watching`]).
    pub fn watch(&self) -> Box<dyn fragscope_replay::WalkWatch> {
        Box::new(Watch(self.inner.clone()))
    }

    /// The sink that follows the marks in the timeline's walk.
    pub fn marks_sink(&self) -> MarksSink {
        let last = self.inner.borrow().n;
        MarksSink { shared: self.inner.clone(), allocated: 0, reserved: 0, last }
    }

    /// The keyframes, when the table's walk took all of them with `marks` (the
    /// timeline's own, [`Marks::new`]) marked.
    pub fn finish(self, marks: Marks) -> Option<Walk> {
        let mut sh = self.inner.borrow_mut();
        if sh.planned != Some(marks) || sh.done != sh.wanted.len() {
            return None;
        }
        let mut w = sh.walk.take()?;
        w.first = w.captured.last().map_or(sh.n, |c| c.0);
        w.captured.reverse();
        Some(w)
    }
}

/// [`SharedWalk`]'s watch of the table's walk.
struct Watch(std::rc::Rc<std::cell::RefCell<Shared>>);

impl fragscope_replay::WalkWatch for Watch {
    fn ready(&self) -> bool {
        // Not before the timeline's walk has found the marks (the walk's seeding may
        // make a table of its own first).
        self.0.borrow().marked
    }

    fn start(&mut self, st: &RecordedState) -> usize {
        let mut sh = self.0.borrow_mut();
        let sh = &mut *sh;
        if st.segs.is_empty() {
            return usize::MAX;
        }
        let mut w = Walk {
            captured: Vec::new(),
            ops: Vec::new(),
            exact: false,
            first: sh.n,
            note: None,
            coarse: None,
            final_stacks: None,
        };
        let mut marks = sh.marks;
        marks.oom = marks.oom.map(|o| o.min(sh.n));
        sh.wanted = plan(sh.n, st, Some(marks), &sh.opts, &mut w);
        if w.exact {
            // Deltas too: [`walk_at`]'s.
            return usize::MAX;
        }
        sh.planned = Some(marks);
        sh.walk = Some(w);
        sh.wanted.first().map_or(usize::MAX, |w| w.0)
    }

    fn at(&mut self, state: usize, st: &RecordedState) -> usize {
        let mut sh = self.0.borrow_mut();
        let sh = &mut *sh;
        // As [`walk_at`]'s `take`: every mark of this position, once each.
        let mut kinds = Vec::new();
        while let Some(&(s, k)) = sh.wanted.get(sh.done) {
            if s != state {
                break;
            }
            if !kinds.contains(&k) {
                kinds.push(k);
            }
            sh.done += 1;
        }
        if let (false, Some(w)) = (kinds.is_empty(), sh.walk.as_mut()) {
            w.captured.push((state, kinds, st.segs.values().cloned().collect()));
        }
        sh.wanted.get(sh.done).map_or(usize::MAX, |w| w.0)
    }
}

/// Follows, in the timeline's walk, what [`Marks::new`] reads from the timeline: the
/// first state with the most allocated bytes, the first with the most reserved bytes
/// (as the timeline's peaks: the first maximum wins), and the first `oom` entry.
pub struct MarksSink {
    shared: std::rc::Rc<std::cell::RefCell<Shared>>,
    allocated: u64,
    reserved: u64,
    /// The walk's last state (the trace's length).
    last: usize,
}

impl fragscope_trace::WalkSink for MarksSink {
    #[inline(always)]
    fn levels(&mut self, state: usize, entry: Option<&fragscope_snapshot::TraceEvent>, l: &fragscope_trace::Levels) {
        let oom = entry.is_some_and(|e| e.action == Action::Oom);
        if state == 0 || l.allocated > self.allocated || l.reserved > self.reserved || oom || state == self.last {
            self.note(state, oom, l);
        }
    }
}

impl MarksSink {
    #[inline(never)]
    fn note(&mut self, state: usize, oom: bool, l: &fragscope_trace::Levels) {
        let mut sh = self.shared.borrow_mut();
        if state == 0 || l.allocated > self.allocated {
            self.allocated = l.allocated;
            sh.marks.allocated_peak = state;
        }
        if state == 0 || l.reserved > self.reserved {
            self.reserved = l.reserved;
            sh.marks.reserved_peak = state;
        }
        if oom && sh.marks.oom.is_none() {
            sh.marks.oom = Some(state - 1);
        }
        if state == self.last {
            sh.marked = true;
        }
    }
}

/// The positions of device trace `n` entries long whose states the backward walk `w`
/// captures, newest first, each with what it marks: the end, the `marks`, and evenly
/// spaced steps. Sets `w.exact` (deltas of every entry fit `opts.state_values`) and
/// `w.coarse` (only coarse keyframes fit), from the size of `final_state`.
fn plan(
    n: usize,
    final_state: &RecordedState,
    marks: Option<Marks>,
    opts: &ReportOptions,
    w: &mut Walk,
) -> Vec<(usize, &'static str)> {
    let mut wanted: Vec<(usize, &'static str)> = vec![(n, "end")];
    if let Some(m) = marks {
        if let Some(o) = m.oom {
            wanted.push((o, "oom"));
        }
        wanted.push((m.reserved_peak, "reserved_peak"));
        wanted.push((m.allocated_peak, "allocated_peak"));
    }
    // The size budget (in f64 values): deltas (~3 records per event) plus keyframes
    // of about the final state's size each. Exact when they fit, else as many evenly
    // spaced full keyframes as fit beside the marked ones, else coarse keyframes (module
    // doc).
    let end_values = BLOCK_LEN * final_state.segs.values().map(|s| s.blocks.len()).sum::<usize>().max(1);
    let exact_keys = n / EXACT_KEY_EVERY + 1;
    let exact_cost = 3 * n * OP_LEN + exact_keys * end_values;
    w.exact = n > 0 && exact_cost <= opts.state_values;
    let marked = wanted.len();
    let full = (opts.state_values / end_values).saturating_sub(marked);
    let steps = if w.exact {
        exact_keys
    } else if full >= MIN_FULL_KEYS {
        full.min(n)
    } else {
        let steps = opts.moments.max(1).min(n);
        w.coarse = Some((opts.state_values / (steps + marked) / BLOCK_LEN).max(16));
        steps
    };
    if n > 0 {
        for k in 0..steps {
            wanted.push((k * n / steps, "step"));
        }
    } else if full < 1 {
        // The final state alone is over the budget.
        w.coarse = Some((opts.state_values / BLOCK_LEN).max(16));
    }
    wanted.sort_unstable_by_key(|w| std::cmp::Reverse(w.0));
    wanted
}

/// The keyframes and deltas of one device as the page gets them (module doc) and a note
/// when some positions could not be rebuilt.
pub fn moments(
    snap: &Snapshot,
    device: i64,
    ana: &Analysis,
    opts: &ReportOptions,
    table: &mut StackTable,
) -> (Vec<Moment>, Option<String>, StateOps) {
    moments_at(snap, device, Marks::of(snap, device, ana), opts, table)
}

/// What [`moments`] returns: the keyframes, a note when some positions could not be
/// rebuilt, and the deltas.
pub type StateView = (Vec<Moment>, Option<String>, StateOps);

/// [`moments`], given the positions to preselect.
pub fn moments_at(
    snap: &Snapshot,
    device: i64,
    marks: Option<Marks>,
    opts: &ReportOptions,
    table: &mut StackTable,
) -> StateView {
    moments_from(snap, device, marks, opts, table, None, None)
}

/// [`moments_at`], from the keyframes of a [`SharedWalk`] when there are (`walked`).
pub fn moments_from(
    snap: &Snapshot,
    device: i64,
    marks: Option<Marks>,
    opts: &ReportOptions,
    table: &mut StackTable,
    walked: Option<Walk>,
    coarse_ahead: Option<Vec<CoarseKeyframe>>,
) -> StateView {
    let trace = snap.trace(device);
    let mut w = walked.unwrap_or_else(|| walk_at(snap, device, marks, opts));
    // Stacks of the blocks: the latest alloc at each address before the position.
    let mut stack_at = w.final_stacks.take().unwrap_or_else(|| final_stacks(snap, device));
    // One forward pass over the trace serves the keyframes and the deltas, in order.
    let mut pos = 0usize;
    let advance = |to: usize, pos: &mut usize, stack_at: &mut FxHashMap<u64, Option<StackId>>| {
        while *pos < to {
            let e = &trace[*pos];
            if e.action == Action::Alloc {
                stack_at.insert(e.addr, e.stack);
            }
            *pos += 1;
        }
    };
    let mut out = Vec::with_capacity(w.captured.len());
    let mut ov = Vec::with_capacity(w.ops.len() * OP_LEN);
    let mut oi = 0usize;
    let mut emit_ops_until =
        |state: usize, pos: &mut usize, stack_at: &mut FxHashMap<u64, Option<StackId>>, table: &mut StackTable| {
            while let Some(&(i, kind, addr, size, a, b)) = w.ops.get(oi) {
                if i >= state {
                    break;
                }
                advance(i + 1, pos, stack_at);
                let stack = if kind == 1 { stack_index(snap, addr, b, table, stack_at) } else { -1 };
                // Kind 3 adds a segment: `a` is its stream.
                let a = if kind == 3 { table.stream(a) } else { a as f64 };
                layout::StateOp {
                    event: i as f64,
                    kind: kind as f64,
                    address: addr as f64,
                    size: size as f64,
                    a,
                    b: b as f64,
                    stack: stack as f64,
                }
                .push_to(&mut ov);
                oi += 1;
            }
        };
    // The coarse records made ahead for these keyframes (of `walked`'s, by index), else here.
    let mut ahead = coarse_ahead.filter(|a| a.len() == w.captured.len());
    for (k, (state, kinds, segs)) in w.captured.iter().enumerate() {
        emit_ops_until(*state, &mut pos, &mut stack_at, table);
        advance(*state, &mut pos, &mut stack_at);
        let coarse = match ahead.as_mut() {
            Some(a) => a[k].take(),
            None => coarse_keyframe(segs, w.coarse),
        };
        out.push(keyframe(snap, *state, kinds, segs, coarse, table, &stack_at));
    }
    emit_ops_until(usize::MAX, &mut pos, &mut stack_at, table);
    let count = ov.len() / OP_LEN;
    let ops = StateOps { exact: w.exact, first: w.first, ops: encode::f64s(&ov), count };
    (out, w.note, ops)
}

/// The blocks of device `device`'s final state whose addresses no `alloc` entry of the
/// trace names, with their own stacks: the stacks they start with before the first
/// position (a small set, looked up per alloc, rather than a set of every address the
/// trace allocates).
fn final_stacks(snap: &Snapshot, device: i64) -> FxHashMap<u64, Option<StackId>> {
    let mut stack_at = final_block_stacks(snap, device);
    forget_allocated(&mut stack_at, snap.trace(device));
    stack_at
}

/// The stacks of device `device`'s allocated and pending-free blocks in its final state,
/// by address.
fn final_block_stacks(snap: &Snapshot, device: i64) -> FxHashMap<u64, Option<StackId>> {
    let mut stack_at: FxHashMap<u64, Option<StackId>> = FxHashMap::default();
    for s in snap.device_segments(device) {
        for b in s.blocks.iter().filter(|b| b.state.is_active()) {
            stack_at.insert(b.address, b.stack);
        }
    }
    stack_at
}

/// Removes from `stack_at` every address an `alloc` of `entries` names.
fn forget_allocated(stack_at: &mut FxHashMap<u64, Option<StackId>>, entries: &[fragscope_snapshot::TraceEvent]) {
    for e in entries.iter().filter(|e| e.action == Action::Alloc) {
        if stack_at.is_empty() {
            break;
        }
        stack_at.remove(&e.addr);
    }
}

/// The page's index of the stack of the block at `addr` (state `code`; free blocks, code
/// 0, have none: -1), from the latest alloc at that address (`stack_at`).
fn stack_index(
    snap: &Snapshot,
    addr: u64,
    code: u64,
    table: &mut StackTable,
    stack_at: &FxHashMap<u64, Option<StackId>>,
) -> i64 {
    if code == 0 {
        -1
    } else {
        stack_at.get(&addr).map_or(-1, |&s| table.index(snap, s))
    }
}

/// A block record of a keyframe ([`layout::Block`]).
fn block_record(segment: usize, address: u64, size: u64, requested: u64, state: u64, stack: i64) -> layout::Block {
    layout::Block {
        segment: segment as f64,
        address: address as f64,
        size: size as f64,
        requested: requested as f64,
        state: state as f64,
        stack: stack as f64,
    }
}

/// A coarse keyframe's block records and its state's figures ([`coarsen`],
/// [`figures_of`]); `None` for a keyframe drawn block by block.
pub type CoarseKeyframe = Option<(Vec<(usize, Group)>, MomentFigures)>;

/// The coarse records of a captured state `segs` when it has more blocks than `coarse`
/// allows ([`Walk::coarse`]).
fn coarse_keyframe(segs: &[SegRec], coarse: Option<usize>) -> CoarseKeyframe {
    let nblocks: usize = segs.iter().map(|s| s.blocks.len()).sum();
    let max = coarse.filter(|&max| nblocks > max)?;
    Some((coarsen(segs, max), figures_of(segs)))
}

/// The coarse records of each of `w`'s keyframes, in order, for [`moments_from`]: they
/// read only the captured states, so a caller can make them on another core while it
/// draws the rest (on the 6.9 M-entry allocator-consistent benchmark file, 25 keyframes
/// of up to 120 k blocks, ~0.1 s, were a quarter of the report's last stretch, on one
/// thread; capturing them is ~45 ms).
pub fn coarse_keyframes(w: &Walk) -> Vec<CoarseKeyframe> {
    w.captured.iter().map(|(_, _, segs)| coarse_keyframe(segs, w.coarse)).collect()
}

/// The keyframe of the captured state at position `state` (`kinds`: what it marks,
/// `segs`: its segments) as the page gets it: its segments' and blocks' records, the
/// blocks merged into `coarse`'s records when it has them (then with the state's
/// figures), each block with its stack's index from `stack_at`.
fn keyframe(
    snap: &Snapshot,
    state: usize,
    kinds: &[&'static str],
    segs: &[SegRec],
    coarse: CoarseKeyframe,
    table: &mut StackTable,
    stack_at: &FxHashMap<u64, Option<StackId>>,
) -> Moment {
    let mut sv = Vec::with_capacity(segs.len() * layout::Segment::LEN);
    let mut bv = Vec::new();
    for s in segs.iter() {
        layout::Segment {
            address: s.addr as f64,
            size: s.size as f64,
            stream: table.stream(s.stream),
            flags: seg_flags(s) as f64,
        }
        .push_to(&mut sv);
    }
    let (groups, figures) = coarse.unzip();
    if let Some(groups) = groups {
        for (si, g) in groups {
            let code = if g.count > 1 { MERGED } else { state_code(g.state) };
            let stack = match code {
                MERGED => g.count as i64,
                _ => stack_index(snap, g.addr, code, table, stack_at),
            };
            let req = if code == MERGED { g.allocated } else { g.requested };
            block_record(si, g.addr, g.size, req, code, stack).push_to(&mut bv);
        }
    } else {
        for (si, s) in segs.iter().enumerate() {
            for b in &s.blocks {
                let code = state_code(b.state);
                let stack = stack_index(snap, b.addr, code, table, stack_at);
                block_record(si, b.addr, b.size, b.requested, code, stack).push_to(&mut bv);
            }
        }
    }
    Moment { state, kinds: kinds.to_vec(), segments: encode::f64s(&sv), blocks: encode::f64s(&bv), figures }
}

/// Figures of the allocator state at one trace position (what the page's state view
/// shows there), from its own backward walk.
#[derive(Serialize, Debug, Clone, PartialEq)]
pub struct StateFigures {
    pub device: i64,
    pub state: usize,
    pub reserved_bytes: u64,
    pub allocated_bytes: u64,
    pub pending_free_bytes: u64,
    pub free_bytes: u64,
    pub largest_free_block_bytes: u64,
    pub segments: usize,
    /// `[address, size, requested, state]` of every block (state 0 free, 1 allocated,
    /// 2 pending free), in address order.
    pub blocks: Vec<[u64; 4]>,
}

/// An entry [`state_at`]'s backward walk cannot undo: the trace and the final state
/// disagree there.
#[derive(Clone, Debug, PartialEq)]
pub struct StateAtError(pub Inconsistency);

impl std::fmt::Display for StateAtError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the state before trace event {} cannot be rebuilt ({})", self.0.index, self.0.reason)
    }
}

impl std::error::Error for StateAtError {}

/// The state of `device` at trace state `state` (clamped to the end), or why it cannot
/// be rebuilt.
pub fn state_at(snap: &Snapshot, device: i64, state: usize) -> Result<StateFigures, StateAtError> {
    let trace = snap.trace(device);
    let state = state.min(trace.len());
    let mut st = RecordedState::from_snapshot(snap, device);
    let mut scratch = Vec::new();
    with_rules(snap, |rules| {
        for i in (state..trace.len()).rev() {
            let ev = &trace[i];
            st.undo(i, ev, home_of(snap, ev), rules, &mut scratch).map_err(StateAtError)?;
        }
        Ok::<_, StateAtError>(())
    })?;
    let blocks: Vec<&BlockRec> = st.segs.values().flat_map(|s| &s.blocks).collect();
    let sum = |c: BState| blocks.iter().filter(|b| b.state == c).map(|b| b.size).sum::<u64>();
    Ok(StateFigures {
        device,
        state,
        reserved_bytes: st.reserved(),
        allocated_bytes: sum(BState::Allocated),
        pending_free_bytes: sum(BState::Pending),
        free_bytes: sum(BState::Free),
        largest_free_block_bytes: blocks.iter().filter(|b| b.state == BState::Free).map(|b| b.size).max().unwrap_or(0),
        segments: st.segs.len(),
        blocks: blocks.iter().map(|b| [b.addr, b.size, b.requested, state_code(b.state)]).collect(),
    })
}

/// Exact figures of a state (what the page computes from exact blocks).
pub fn figures_of(segs: &[SegRec]) -> MomentFigures {
    let mut f = MomentFigures::default();
    for s in segs {
        f.reserved += s.size;
        for b in &s.blocks {
            f.blocks += 1;
            match b.state {
                BState::Free => {
                    f.free += b.size;
                    f.largest = f.largest.max(b.size);
                }
                BState::Allocated => {
                    f.allocated += b.size;
                    f.slack += b.size.saturating_sub(b.requested);
                }
                BState::Pending => f.pending += b.size,
            }
        }
    }
    f
}

/// Neighbouring blocks of one segment drawn as one record of a coarse keyframe.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Group {
    pub addr: u64,
    pub size: u64,
    /// Blocks in it (1: an exact block).
    pub count: usize,
    /// The block's state and request when `count` is 1.
    pub state: BState,
    pub requested: u64,
    /// Allocated bytes in it.
    pub allocated: u64,
}

/// The blocks of `segs` in at most `max` records (as few merges as that takes): a
/// block larger than a threshold stays alone; consecutive smaller ones of a segment
/// are merged while their sum stays under it. The threshold is the smallest (found by
/// bisection) that gives at most `max` records, so the large blocks, which make the
/// picture, stay exact. Returns (segment index, group) in address order.
pub fn coarsen(segs: &[SegRec], max: usize) -> Vec<(usize, Group)> {
    let groups = |t: u64, out: Option<&mut Vec<(usize, Group)>>| -> usize {
        let mut n = 0;
        let mut out = out;
        for (si, s) in segs.iter().enumerate() {
            let mut cur: Option<Group> = None;
            for b in &s.blocks {
                let alloc = if b.state == BState::Allocated { b.size } else { 0 };
                let one = Group {
                    addr: b.addr,
                    size: b.size,
                    count: 1,
                    state: b.state,
                    requested: b.requested,
                    allocated: alloc,
                };
                match cur.as_mut() {
                    Some(g) if b.size < t && g.size + b.size <= t => {
                        g.size += b.size;
                        g.count += 1;
                        g.allocated += alloc;
                    }
                    _ => {
                        if let Some(g) = cur.take() {
                            n += 1;
                            if let Some(o) = out.as_deref_mut() {
                                o.push((si, g));
                            }
                        }
                        // A block at least the threshold stays alone.
                        cur = Some(one);
                        if b.size >= t {
                            n += 1;
                            if let Some(o) = out.as_deref_mut() {
                                o.push((si, one));
                            }
                            cur = None;
                        }
                    }
                }
            }
            if let Some(g) = cur {
                n += 1;
                if let Some(o) = out.as_deref_mut() {
                    o.push((si, g));
                }
            }
        }
        n
    };
    // The bisection counts the records of ~30 thresholds: each count from the block
    // sizes alone, in one flat list (a segment's start marked by `u64::MAX` before it),
    // rather than by building every group of every block (3 % of the report's CPU on
    // the 6.9 M-entry allocator-consistent benchmark file).
    let mut sizes = Vec::with_capacity(segs.len() + segs.iter().map(|s| s.blocks.len()).sum::<usize>());
    for s in segs {
        sizes.push(u64::MAX);
        sizes.extend(s.blocks.iter().map(|b| b.size));
    }
    let (mut lo, mut hi) = (0u64, segs.iter().map(|s| s.size).max().unwrap_or(0).saturating_add(1));
    // The list shrinks as the bisection narrows (`settle`): what every threshold left
    // in (lo, hi] groups the same way is counted once, in `fixed`. (25 keyframes of up
    // to 120 k blocks, ~28 counts each, were 9 % of the report's main thread on the
    // 6.9 M-entry allocator-consistent benchmark file.)
    let mut fixed = 0usize;
    let count = |t: u64, sizes: &[u64], fixed: usize| {
        let c = fixed + count_groups(sizes, t);
        // Checked against the grouping itself in debug builds (the tests).
        debug_assert_eq!(c, groups(t, None), "threshold {t}");
        c
    };
    if count(lo, &sizes, fixed) > max {
        // Bisect the smallest threshold whose records fit (`hi` always does: one record
        // per segment). The list is settled again when the bracket has narrowed enough
        // to take more out (`lo` doubled or `hi` halved): a pass that takes nothing out
        // costs as much as a count.
        let mut settled = (0u64, hi);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if count(mid, &sizes, fixed) <= max {
                hi = mid;
            } else {
                lo = mid;
            }
            if lo / 2 >= settled.0.max(1) || hi <= settled.1 / 2 {
                fixed += settle(&mut sizes, lo, hi);
                settled = (lo, hi);
            }
        }
    } else {
        hi = lo;
    }
    let mut out = Vec::new();
    groups(hi, Some(&mut out));
    out
}

/// Takes out of `sizes` (a [`count_groups`] list) what groups the same way for every
/// threshold `t` with `lo < t <= hi`, and returns how many records that is: a block of at
/// least `hi` is always alone (a separator, as a segment's start is), and a run between
/// separators whose bytes are at most `lo + 1` is always one record (no block in it is
/// larger than `t`; one block of exactly `t` is alone in it). What is kept is each other
/// run, after a segment mark, so that [`count_groups`] of the rest plus the returned
/// number is the count of the whole list for every such `t`.
fn settle(sizes: &mut Vec<u64>, lo: u64, hi: u64) -> usize {
    let mut fixed = 0usize;
    let mut kept = 0usize;
    // The current run: where it starts in `sizes` and its bytes.
    let (mut start, mut sum) = (0usize, 0u64);
    let n = sizes.len();
    let flush = |sizes: &mut Vec<u64>, start: usize, end: usize, sum: u64, kept: &mut usize| {
        if end == start {
            return 0;
        }
        if sum <= lo.saturating_add(1) {
            return 1;
        }
        // A run after a separator (`start` > 0) has room for its mark before it: what is
        // kept never outgrows what was read. The list's first run needs none.
        if start > 0 {
            sizes[*kept] = u64::MAX;
            *kept += 1;
        }
        sizes.copy_within(start..end, *kept);
        *kept += end - start;
        0
    };
    // Entries are read before the kept ones overwrite them (`kept` never passes `i`).
    for i in 0..n {
        let x = sizes[i];
        if x == u64::MAX || x >= hi {
            fixed += flush(sizes, start, i, sum, &mut kept);
            fixed += (x != u64::MAX) as usize;
            (start, sum) = (i + 1, 0);
        } else {
            sum = sum.saturating_add(x);
        }
    }
    fixed += flush(sizes, start, n, sum, &mut kept);
    sizes.truncate(kept);
    fixed
}

/// The number of records [`coarsen`]'s grouping makes with threshold `t` (its `groups`,
/// counting only), from the blocks' sizes in address order, each segment's preceded by
/// `u64::MAX` (a block size never is: blocks lie inside a segment's address range).
fn count_groups(sizes: &[u64], t: u64) -> usize {
    let mut n = 0usize;
    // The size of the group being built, `None` when there is none.
    let mut cur: Option<u64> = None;
    for &size in sizes {
        if size == u64::MAX {
            // A new segment: the open group ends.
            n += cur.take().is_some() as usize;
            continue;
        }
        match cur.as_mut() {
            Some(g) if size < t && *g + size <= t => *g += size,
            _ => {
                n += cur.is_some() as usize;
                if size >= t {
                    n += 1;
                    cur = None;
                } else {
                    cur = Some(size);
                }
            }
        }
    }
    n + cur.is_some() as usize
}

#[cfg(test)]
mod tests {
    use super::*;
    use fragscope_testdata::Rng;

    #[test]
    fn settled_lists_count_as_the_whole_for_every_threshold_in_the_bracket() {
        let mut rng = Rng(11);
        for _ in 0..2000 {
            let mut sizes = Vec::new();
            for _ in 0..1 + rng.below(40) {
                if rng.below(5) == 0 {
                    sizes.push(u64::MAX);
                }
                sizes.push(1 + rng.below(64) as u64);
            }
            let lo = rng.below(70) as u64;
            let hi = lo + 1 + rng.below(70) as u64;
            let mut settled = sizes.clone();
            let fixed = settle(&mut settled, lo, hi);
            assert!(settled.len() <= sizes.len());
            for t in lo + 1..=hi {
                assert_eq!(fixed + count_groups(&settled, t), count_groups(&sizes, t), "{sizes:?} ({lo}, {hi}] t={t}");
            }
        }
    }

    #[test]
    fn coarsen_fits_the_budget_keeps_the_bytes_and_the_large_blocks() {
        let mut rng = Rng(5);
        for round in 0..200 {
            let mut segs = Vec::new();
            let mut addr = 1u64 << 30;
            for _ in 0..1 + rng.below(12) {
                let mut blocks = Vec::new();
                let start = addr;
                for _ in 0..1 + rng.below(60) {
                    let span = if rng.below(10) == 0 { 4000 } else { 8 };
                    let size = 512 * (1 + rng.below(span) as u64);
                    let state = [BState::Free, BState::Allocated, BState::Pending][rng.below(3)];
                    blocks.push(BlockRec { addr, size, requested: size - 100, state, guessed: false, may_grow: 0 });
                    addr += size;
                }
                segs.push(SegRec {
                    addr: start,
                    size: addr - start,
                    stream: 0,
                    pool: DEFAULT_POOL,
                    small: false,
                    expandable: false,
                    blocks,
                });
                addr += 1 << 20;
            }
            let n: usize = segs.iter().map(|s| s.blocks.len()).sum();
            for max in [1, segs.len(), n / 3 + 1, n / 2 + 1, n, n + 5] {
                let g = coarsen(&segs, max);
                assert!(g.len() <= max.max(segs.len()), "round {round}: {} records for {max}", g.len());
                if max >= n {
                    assert_eq!(g.len(), n, "round {round}: nothing merged when all fit");
                }
                // Every byte once, in address order, inside its segment; allocated bytes kept.
                for (si, s) in segs.iter().enumerate() {
                    let mine: Vec<_> = g.iter().filter(|x| x.0 == si).map(|x| x.1).collect();
                    assert_eq!(mine.iter().map(|x| x.size).sum::<u64>(), s.size, "round {round}");
                    assert_eq!(mine.iter().map(|x| x.count).sum::<usize>(), s.blocks.len(), "round {round}");
                    let alloc: u64 = s.blocks.iter().filter(|b| b.state == BState::Allocated).map(|b| b.size).sum();
                    assert_eq!(mine.iter().map(|x| x.allocated).sum::<u64>(), alloc, "round {round}");
                    let mut at = s.addr;
                    for x in &mine {
                        assert_eq!(x.addr, at, "round {round}: contiguous");
                        at += x.size;
                    }
                }
            }
        }
    }
}
