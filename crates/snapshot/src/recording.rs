//! How a snapshot was recorded, as far as the file tells: whether
//! `_record_memory_history` was ever switched on, whether the file is a state-only or
//! one-pool snapshot (`memory_snapshot(include_traces=False)`, `MemPool.snapshot()`), and
//! which trace actions `_record_memory_history(skip_actions=[...])` (PyTorch 2.11+) left
//! out. None of this is written in the file (PyTorch records neither the options of
//! `_record_memory_history` nor `skip_actions`), so each finding here rests on evidence in
//! the trace that only a missing action explains, never on a missing count alone.
//!
//! The principal types: [`Recording`] (the findings, [`recording`] computes them),
//! [`Skipped`] (an action a device's trace lacks, with its evidence) and [`Restored`] (what
//! [`restore_skipped`] did so that the analyses read the trace as the allocator saw it).
//!
//! What a skipped action costs, per action (spec §10.5, §10.10):
//! * `free_requested`: nothing the replay needs. A block becomes reusable at its
//!   `free_completed`; a `free_requested` is restored just before each one whose block
//!   the trace allocated, so that every command reads the file as recorded with it
//!   (a free that `record_stream` deferred then reads as requested when it completed).
//! * `free_completed`: restored just after each `free_requested`: exact unless
//!   `record_stream` deferred a free (the model then reuses that block earlier than
//!   PyTorch did, which `replay --verify` shows as a divergence, never as a match).
//! * `alloc`: not restorable (when a block was handed out is lost): the device's trace is
//!   set aside and the snapshot analysed as state only.
//! * `segment_alloc` / `segment_free` (and `segment_map` / `segment_unmap`): when the
//!   allocator reserved or released memory is lost; kept as found and reported, so
//!   that reserved figures over the trace are read as unknown.
//! * `oom`, `snapshot`: nothing in the file shows they are missing; an OOM the program
//!   raised is then simply not in the trace.

use std::collections::HashMap;

use crate::model::{Action, Snapshot, SourceFormat, TraceEvent};

/// An action one device's trace lacks, and why that is certain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skipped {
    pub device: i64,
    /// The action, or for segment events the first of them (`segment_alloc`: every kind
    /// of segment event is missing).
    pub action: Action,
    /// The evidence, in words: the first trace entry that only the missing action
    /// explains.
    pub evidence: String,
}

/// What [`restore_skipped`] did to one device's trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Restored {
    pub device: i64,
    pub action: Action,
    /// Entries added (`free_requested`, `free_completed`), or entries set aside (`alloc`:
    /// the whole trace).
    pub entries: u64,
}

/// What the file says about how it was recorded ([`recording`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recording {
    /// `_record_memory_history` was never switched on: no trace entry on any device, and
    /// no segment or block with a recorded stack (`frames` absent or empty everywhere).
    pub history_off: bool,
    /// No trace entry on any device (a state-only snapshot: `enabled="state"`'s one-entry
    /// ring buffer still counts as a trace).
    pub state_only: bool,
    /// Every segment belongs to this one private pool (not the default `(0, 0)`): the
    /// file is one `MemPool`'s snapshot (`MemPool.snapshot()`, `memory_snapshot(mempool_id=...)`),
    /// and the rest of the device's memory is not in it.
    pub one_pool: Option<(u64, u64)>,
    /// The file is a bare list of segments with PyTorch 2.x keys (`requested_size`,
    /// `segment_pool_id`): what `torch.cuda.memory_snapshot()` returns (with or without
    /// `include_traces`, 2.11+, it keeps only `segments`) or `MemPool.snapshot()`, not a
    /// 1.13 snapshot, though both are lists.
    pub segment_list_2x: bool,
    /// Actions `skip_actions` left out, per device in device order.
    pub skipped: Vec<Skipped>,
    /// Devices whose trace has allocs but no segment event, with nothing to prove the
    /// events missing: every segment predates the recording (a warm cache), or
    /// `skip_actions` left them out; the file cannot tell which.
    pub no_segment_events: Vec<i64>,
    /// Of [`Recording::no_segment_events`], the devices a warm cache explains: replayed from
    /// the recorded state (every segment there before the first entry), the trace needs no
    /// `cudaMalloc` and every decision matches (`replay --verify` exact). Their line says
    /// the recording started warm, not that `skip_actions` may have dropped the segment
    /// events. Filled by [`prepare_with`]'s caller-given check (this crate cannot replay).
    pub started_warm: Vec<i64>,
}

/// The hint for a snapshot taken without `_record_memory_history`: one line.
pub const HISTORY_OFF_HINT: &str = "no allocation history: `_record_memory_history` was never switched on \
     (no trace, no stacks); call torch.cuda.memory._record_memory_history(max_entries=100000) before the \
     code to record, then _dump_snapshot(\"snap.pickle\")";

impl Recording {
    /// One line per finding, for the text of every command (empty when there is nothing to
    /// say).
    pub fn lines(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.history_off {
            out.push(HISTORY_OFF_HINT.to_string());
        }
        if self.segment_list_2x {
            out.push(
                "a list of segments with PyTorch 2.x keys: what torch.cuda.memory_snapshot() or MemPool.snapshot() \
                 returns, the state alone (no trace, whatever include_traces was); for the history, save \
                 torch.cuda.memory._dump_snapshot() instead"
                    .to_string(),
            );
        }
        if let Some((a, b)) = self.one_pool {
            out.push(format!(
                "one memory pool only: every segment is pool ({a}, {b}) (a MemPool snapshot); the default pool \
                 and any other pool's memory are not in this file"
            ));
        }
        for d in &self.no_segment_events {
            if self.started_warm.contains(d) {
                out.push(format!(
                    "device {d}: started warm: no cudaMalloc was needed (the trace allocates but holds no segment \
                     event, and replayed from the recorded state every block it needed was already cached; replay \
                     --verify is exact)"
                ));
                continue;
            }
            out.push(format!(
                "device {d}: the trace allocates but holds no segment event: either every segment predates the \
                 recording, or skip_actions left segment_alloc/segment_free out (then reserved memory over the trace \
                 is not known, and replay --verify diverges where PyTorch reserved memory)"
            ));
        }
        for s in &self.skipped {
            out.push(format!(
                "device {}: {} entries were not recorded (skip_actions): {}",
                s.device,
                skipped_names(s.action),
                s.evidence
            ));
        }
        out
    }
    /// Whether `device`'s trace lacks `action`.
    pub fn skips(&self, device: i64, action: Action) -> bool {
        self.skipped.iter().any(|s| s.device == device && s.action == action)
    }
}

/// The names a [`Skipped::action`] stands for.
pub fn skipped_names(a: Action) -> &'static str {
    match a {
        Action::SegmentAlloc => "segment_alloc/segment_free",
        other => other.as_str(),
    }
}

/// How the file was recorded ([`Recording`]).
pub fn recording(snap: &Snapshot) -> Recording {
    let state_only = snap.device_traces.iter().all(|t| t.is_empty());
    let any_stack = snap.segments.iter().any(|s| {
        has_frames(snap, s.stack)
            || s.blocks.iter().any(|b| {
                has_frames(snap, b.stack)
                    || b.history.as_ref().is_some_and(|h| h.iter().any(|e| has_frames(snap, e.stack)))
            })
    });
    let history_off = state_only && !snap.segments.is_empty() && !any_stack;
    let mut pools = snap.segments.iter().map(|s| s.segment_pool_id);
    let one_pool = match pools.next() {
        Some(Some(p)) if p != (0, 0) && pools.all(|q| q == Some(p)) => Some(p),
        _ => None,
    };
    let (mut skipped, mut no_segment_events) = (Vec::new(), Vec::new());
    // A profiler trace has no allocator state and no segment events of its own: none of
    // `_record_memory_history`'s options applies to it.
    let traces = if snap.format == SourceFormat::Kineto { &[][..] } else { &snap.device_traces[..] };
    for (d, trace) in traces.iter().enumerate() {
        let found = skipped_in(snap, d as i64, trace);
        let segments_proven = found.iter().any(|s| s.action == Action::SegmentAlloc);
        if !segments_proven && trace.iter().any(|e| e.action == Action::Alloc) && !has_segment_event(trace) {
            no_segment_events.push(d as i64);
        }
        skipped.extend(found);
    }
    let segment_list_2x = is_segment_list_2x(snap);
    Recording {
        history_off,
        state_only,
        one_pool,
        segment_list_2x,
        skipped,
        no_segment_events,
        started_warm: Vec::new(),
    }
}

/// Whether `snap` is a list of segments with 2.x keys ([`Recording::segment_list_2x`]).
pub fn is_segment_list_2x(snap: &Snapshot) -> bool {
    snap.format == SourceFormat::SegmentList
        && snap.segments.iter().any(|s| s.segment_pool_id.is_some() || s.requested_size.is_some())
}

fn has_frames(snap: &Snapshot, s: Option<crate::model::StackId>) -> bool {
    s.is_some_and(|s| !snap.frames.stack(s).is_empty())
}

/// The actions `trace` (of `device`) certainly lacks.
fn skipped_in(snap: &Snapshot, device: i64, trace: &[TraceEvent]) -> Vec<Skipped> {
    // Which of the three block actions occur: the rules below need no more, and a trace
    // that has all three (every recording without `skip_actions`) shows them within its
    // first entries. (A count in a map per entry was a tenth of `summary`'s CPU on a
    // 6.4 M-entry trace; a count of every entry, 2 %.)
    let mut seen = [false; Action::ALL.len()];
    let block_actions = [Action::Alloc, Action::FreeRequested, Action::FreeCompleted];
    for e in trace {
        seen[e.action as usize] = true;
        if block_actions.iter().all(|&a| seen[a as usize]) {
            break;
        }
    }
    let occurs = |a: Action| seen[a as usize];
    let mut out = Vec::new();
    let skip = |action: Action, evidence: String| Skipped { device, action, evidence };
    // What each address holds as the trace goes: the last block action seen there.
    let mut last: HashMap<u64, (Action, usize)> = HashMap::new();
    let (mut no_request, mut no_complete, mut no_alloc) = (None, None, None);
    // Each rule below looks for evidence only where one of the three block actions never
    // occurs; a trace with all three (what every recording without `skip_actions` has)
    // needs no walk by address (on 6.4 M entries, ~0.15 s of hashing).
    let walk = block_actions.into_iter().any(|a| !occurs(a));
    let walked = if walk { trace } else { &[][..] };
    for (i, e) in walked.iter().enumerate() {
        let prev = last.get(&e.addr).copied();
        match e.action {
            // A block the trace allocated completes its free: its free was requested
            // between the two, and that entry is missing.
            Action::FreeCompleted if !occurs(Action::FreeRequested) => {
                if let (Some((Action::Alloc, j)), None) = (prev, &no_request) {
                    no_request = Some(format!(
                        "entry {i} completes the free of the block entry {j} allocated at {:#x}, with no \
                         free_requested between them",
                        e.addr
                    ));
                }
            }
            // A block whose free was requested is handed out again: its free completed
            // between the two.
            Action::Alloc if !occurs(Action::FreeCompleted) => {
                if let (Some((Action::FreeRequested, j)), None) = (prev, &no_complete) {
                    no_complete = Some(format!(
                        "entry {i} hands out {:#x} again after entry {j} requested its free, with no \
                         free_completed between them",
                        e.addr
                    ));
                }
            }
            // The same address freed twice with no alloc between: the second block's
            // alloc is missing.
            Action::FreeRequested | Action::FreeCompleted if !occurs(Action::Alloc) => {
                if let (Some((a, j)), None) = (prev, &no_alloc) {
                    // A free requested again after the last one was requested or completed,
                    // or completed twice.
                    if a == Action::FreeCompleted || a == e.action {
                        no_alloc = Some(format!(
                            "entry {i} ({}) frees {:#x} again after entry {j} ({}), with no alloc between them",
                            e.action.as_str(),
                            e.addr,
                            a.as_str()
                        ));
                    }
                }
            }
            _ => {}
        }
        if matches!(e.action, Action::Alloc | Action::FreeRequested | Action::FreeCompleted) {
            last.insert(e.addr, (e.action, i));
        }
    }
    if let Some(ev) = no_alloc {
        out.push(skip(Action::Alloc, ev));
    }
    if let Some(ev) = no_request {
        out.push(skip(Action::FreeRequested, ev));
    }
    if let Some(ev) = no_complete {
        out.push(skip(Action::FreeCompleted, ev));
    }
    if !has_segment_event(trace) {
        if let Some(ev) = alloc_outside_segments(snap, device, trace) {
            out.push(skip(Action::SegmentAlloc, ev));
        }
    }
    out
}

/// Whether `device`'s trace certainly lacks its segment events (no segment event at all,
/// and an alloc in no segment of the final state): reserved memory over the trace cannot
/// be told. Cheaper than [`recording`] (stops at the first segment event).
pub fn segment_events_missing(snap: &Snapshot, device: i64) -> bool {
    let trace = snap.trace(device);
    snap.format != SourceFormat::Kineto
        && !has_segment_event(trace)
        && alloc_outside_segments(snap, device, trace).is_some()
}

fn has_segment_event(trace: &[TraceEvent]) -> bool {
    trace.iter().any(|e| {
        matches!(e.action, Action::SegmentAlloc | Action::SegmentFree | Action::SegmentMap | Action::SegmentUnmap)
    })
}

/// The first alloc of `trace` at an address no segment of the final state holds, in
/// words: its segment was released after it (its `segment_free` is missing; and with no
/// segment event at all, its `segment_alloc` too, or the segment predates the trace).
fn alloc_outside_segments(snap: &Snapshot, device: i64, trace: &[TraceEvent]) -> Option<String> {
    let mut ranges: Vec<(u64, u64)> =
        snap.device_segments(device).map(|s| (s.address, s.address.saturating_add(s.total_size))).collect();
    ranges.sort_unstable();
    let inside = |a: u64| {
        let k = ranges.partition_point(|&(lo, _)| lo <= a);
        k > 0 && a < ranges[k - 1].1
    };
    let (i, e) = trace.iter().enumerate().find(|(_, e)| e.action == Action::Alloc && !inside(e.addr))?;
    Some(format!(
        "entry {i} allocates at {:#x}, in no segment of the final state, and the trace has no segment event: \
         when memory was reserved and released cannot be told",
        e.addr
    ))
}

/// Restores what `skip_actions` left out where the trace determines it, and sets aside a
/// trace whose `alloc` entries are missing (see the module docs); one entry per change.
/// A restored `free_requested` takes the time, stream, pool and stack of its
/// `free_completed`, and a restored `free_completed` those of its `free_requested`.
pub fn restore_skipped(snap: &mut Snapshot, rec: &Recording) -> Vec<Restored> {
    let mut out = Vec::new();
    for s in &rec.skipped {
        let Some(trace) = usize::try_from(s.device).ok().and_then(|d| snap.device_traces.get_mut(d)) else {
            continue;
        };
        match s.action {
            Action::Alloc => {
                out.push(Restored { device: s.device, action: Action::Alloc, entries: trace.len() as u64 });
                trace.clear();
            }
            Action::FreeRequested | Action::FreeCompleted => {
                let (from, add) = if s.action == Action::FreeRequested {
                    (Action::FreeCompleted, Action::FreeRequested)
                } else {
                    (Action::FreeRequested, Action::FreeCompleted)
                };
                let mut added = 0u64;
                let mut new = Vec::with_capacity(trace.len() + trace.len() / 2);
                for e in trace.iter() {
                    let twin = TraceEvent { action: add, ..*e };
                    if e.action == from && add == Action::FreeRequested {
                        new.push(twin);
                        added += 1;
                    }
                    new.push(*e);
                    if e.action == from && add == Action::FreeCompleted {
                        new.push(twin);
                        added += 1;
                    }
                }
                *trace = new;
                out.push(Restored { device: s.device, action: add, entries: added });
            }
            _ => {}
        }
    }
    out
}

impl Restored {
    /// One line for the text of a command.
    pub fn line(&self) -> String {
        match self.action {
            Action::Alloc => format!(
                "device {}: alloc entries were not recorded (skip_actions), so the trace cannot be replayed; its {} \
                 entries are set aside and the device is analysed as a state-only snapshot",
                self.device, self.entries
            ),
            Action::FreeRequested => format!(
                "device {}: {} free_requested entries restored, one just before each free_completed (exact for the \
                 replay: a block is reused only after its free completes)",
                self.device, self.entries
            ),
            _ => format!(
                "device {}: {} free_completed entries restored, one just after each free_requested (exact unless \
                 record_stream deferred a free; replay --verify shows any such free as a divergence)",
                self.device, self.entries
            ),
        }
    }
}

/// What a front end does after reading: finds how the file was recorded ([`recording`]),
/// restores what `skip_actions` left out ([`restore_skipped`]), and writes one line per
/// finding and per change in [`crate::ReadNotes::recording`]. Returns the findings (as
/// they were before the restoring).
pub fn prepare(snap: &mut Snapshot) -> Recording {
    prepare_with(snap, &|_, _| false)
}

/// [`prepare`], with `warm_exact(snap, device)` deciding, for each device whose trace
/// allocates without a segment event, whether a warm cache explains it (the replay from
/// the recorded state is exact: [`Recording::started_warm`]). Front ends that can replay
/// pass `replay::verify`; the check runs only on such devices.
pub fn prepare_with(snap: &mut Snapshot, warm_exact: &dyn Fn(&Snapshot, i64) -> bool) -> Recording {
    let mut rec = recording(snap);
    let restored = restore_skipped(snap, &rec);
    rec.started_warm = rec.no_segment_events.iter().copied().filter(|&d| warm_exact(snap, d)).collect();
    let mut lines = rec.lines();
    lines.extend(restored.iter().map(Restored::line));
    snap.notes.recording = lines;
    rec
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Block, BlockState, Segment, SegmentType};

    fn ev(action: Action, addr: u64) -> TraceEvent {
        TraceEvent::new(action, addr, 512)
    }

    /// One segment at 0x1000 of 4 KiB on device 0, one free block, and `trace`.
    fn snap(trace: Vec<TraceEvent>) -> Snapshot {
        let block = Block {
            address: 0x1000,
            size: 4096,
            requested_size: None,
            state: BlockState::Inactive,
            stack: None,
            history: None,
        };
        let seg = Segment {
            device: 0,
            address: 0x1000,
            total_size: 4096,
            allocated_size: 0,
            active_size: 0,
            requested_size: None,
            stream: 0,
            segment_type: SegmentType::Small,
            segment_pool_id: Some((0, 0)),
            is_expandable: Some(false),
            stack: None,
            blocks: vec![block],
        };
        Snapshot { segments: vec![seg], device_traces: vec![trace], ..Default::default() }
    }

    use Action::{Alloc, FreeCompleted, FreeRequested, SegmentAlloc, SegmentFree};

    #[test]
    fn a_full_trace_lacks_nothing() {
        let s = snap(vec![
            TraceEvent::new(SegmentAlloc, 0x1000, 4096),
            ev(Alloc, 0x1000),
            ev(FreeRequested, 0x1000),
            ev(FreeCompleted, 0x1000),
            ev(Alloc, 0x1000),
        ]);
        let r = recording(&s);
        assert_eq!(r.skipped, vec![]);
        assert!(r.no_segment_events.is_empty());
        assert!(!r.history_off && !r.state_only && r.lines().is_empty());
    }

    #[test]
    fn free_requested_skipped_is_found_and_restored_before_each_completion() {
        let mut s =
            snap(vec![ev(Alloc, 0x1000), ev(FreeCompleted, 0x1000), ev(Alloc, 0x1200), ev(FreeCompleted, 0x1200)]);
        let r = prepare(&mut s);
        assert_eq!(r.skipped.len(), 1);
        assert_eq!(r.skipped[0].action, FreeRequested);
        assert!(r.skipped[0].evidence.starts_with("entry 1 completes the free of the block entry 0 allocated"));
        let actions: Vec<Action> = s.device_traces[0].iter().map(|e| e.action).collect();
        assert_eq!(actions, [Alloc, FreeRequested, FreeCompleted, Alloc, FreeRequested, FreeCompleted]);
        assert_eq!(s.device_traces[0][1].addr, 0x1000);
        assert!(
            s.notes.recording.iter().any(|l| l.contains("2 free_requested entries restored")),
            "{:?}",
            s.notes.recording
        );
    }

    #[test]
    fn free_completed_skipped_needs_a_reuse_and_is_restored_after_each_request() {
        // Requested, never reused: nothing proves the completion is missing.
        let s = snap(vec![ev(Alloc, 0x1000), ev(FreeRequested, 0x1000)]);
        assert!(recording(&s).skipped.is_empty());
        let mut s = snap(vec![ev(Alloc, 0x1000), ev(FreeRequested, 0x1000), ev(Alloc, 0x1000)]);
        let r = prepare(&mut s);
        assert_eq!(r.skipped.iter().map(|k| k.action).collect::<Vec<_>>(), [FreeCompleted]);
        let actions: Vec<Action> = s.device_traces[0].iter().map(|e| e.action).collect();
        assert_eq!(actions, [Alloc, FreeRequested, FreeCompleted, Alloc]);
    }

    #[test]
    fn alloc_skipped_sets_the_trace_aside() {
        // Frees of blocks from before the trace: possible in a full recording.
        let s = snap(vec![ev(FreeRequested, 0x1000), ev(FreeCompleted, 0x1000), ev(FreeRequested, 0x1200)]);
        assert!(recording(&s).skipped.is_empty());
        let mut s = snap(vec![ev(FreeRequested, 0x1000), ev(FreeCompleted, 0x1000), ev(FreeRequested, 0x1000)]);
        let r = prepare(&mut s);
        assert_eq!(r.skipped.iter().map(|k| k.action).collect::<Vec<_>>(), [Alloc]);
        assert!(s.device_traces[0].is_empty());
        assert!(s.notes.recording.iter().any(|l| l.contains("analysed as a state-only snapshot")));
    }

    #[test]
    fn segment_events_skipped_needs_an_alloc_outside_the_final_segments() {
        // Every alloc inside a final segment, no segment event: a warm cache or a skip,
        // said as such.
        let s = snap(vec![ev(Alloc, 0x1000)]);
        let r = recording(&s);
        assert!(r.skipped.is_empty());
        assert_eq!(r.no_segment_events, [0]);
        assert!(r.lines()[0].contains("either every segment predates the recording"));
        // When the caller's replay explains it by a warm cache, the line says so instead;
        // the check is asked only for the devices without segment events.
        let mut asked = std::cell::RefCell::new(Vec::new());
        let mut w = s.clone();
        let r = prepare_with(&mut w, &|_, d| {
            asked.borrow_mut().push(d);
            true
        });
        assert_eq!((asked.get_mut().as_slice(), r.started_warm.as_slice()), (&[0][..], &[0][..]));
        assert!(w.notes.recording[0].starts_with("device 0: started warm: no cudaMalloc was needed"), "{:?}", w.notes);
        assert!(!w.notes.recording[0].contains("skip_actions"));
        let mut w = s.clone();
        prepare_with(&mut w, &|_, _| false);
        assert!(w.notes.recording[0].contains("either every segment predates the recording"));
        let mut full = snap(vec![TraceEvent::new(SegmentAlloc, 0x1000, 4096), ev(Alloc, 0x1000)]);
        prepare_with(&mut full, &|_, _| panic!("asked only without segment events"));
        let mut s = snap(vec![ev(Alloc, 0x1000), ev(Alloc, 0x9000)]);
        // A profiler trace: no allocator recording, nothing to say.
        s.format = SourceFormat::Kineto;
        assert_eq!(recording(&s), Recording::default());
        assert!(!segment_events_missing(&s, 0));
        s.format = SourceFormat::Dict;
        let r = recording(&s);
        assert_eq!(r.skipped.iter().map(|k| k.action).collect::<Vec<_>>(), [SegmentAlloc]);
        assert!(r.lines()[0].contains("segment_alloc/segment_free entries were not recorded"), "{:?}", r.lines());
        assert!(r.no_segment_events.is_empty() && segment_events_missing(&s, 0));
        // With a segment event in the trace, the alloc outside is that event's business.
        let s = snap(vec![TraceEvent::new(SegmentFree, 0x9000, 4096), ev(Alloc, 0x9000)]);
        let r = recording(&s);
        assert!(r.skipped.is_empty() && r.no_segment_events.is_empty() && !segment_events_missing(&s, 0));
    }

    #[test]
    fn history_never_on_and_one_pool() {
        let mut s = snap(vec![]);
        let r = recording(&s);
        assert!(r.history_off && r.state_only);
        assert_eq!(r.lines(), [HISTORY_OFF_HINT]);
        // A stack on a block: history was on (state only).
        let st = s.frames.intern_py_stack(&[("a.py", 1, "f")]);
        s.segments[0].blocks[0].stack = Some(st);
        assert!(!recording(&s).history_off);
        // An empty stack is no stack.
        let empty = s.frames.intern_stack(&[]);
        s.segments[0].blocks[0].stack = Some(empty);
        assert!(recording(&s).history_off);
        s.segments[0].segment_pool_id = Some((0, 3));
        assert_eq!(recording(&s).one_pool, Some((0, 3)));
        let mut two = s.segments[0].clone();
        two.segment_pool_id = Some((0, 0));
        s.segments.push(two);
        assert_eq!(recording(&s).one_pool, None);
        // A list of 2.x segments (memory_snapshot()), not a 1.13 file.
        assert!(!recording(&s).segment_list_2x);
        s.format = SourceFormat::SegmentList;
        assert!(recording(&s).segment_list_2x);
        s.segments.iter_mut().for_each(|g| {
            g.segment_pool_id = None;
            g.requested_size = None;
        });
        assert!(!recording(&s).segment_list_2x, "1.13 segments have neither key");
    }
}
