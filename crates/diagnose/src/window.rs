//! Time windows: a snapshot cut to a stretch of its trace, so that every command runs
//! unchanged on "what happened between entry 1000 and entry 5000" or "between 12.5 s
//! and 14 s".
//!
//! A window is half-open, `[start, end)`, given by trace entry index (`1000..5000`) or by
//! time since the first trace entry of the file (`12.5s..14s`, `200ms..`, `..3000000us`,
//! read from the entries' `time_us`, i.e. wall clock). Either end may be left out.
//!
//! [`cut`] gives a [`Snapshot`] that is what PyTorch would have dumped at the window's
//! end had the ring buffer held only the window's entries:
//!
//! * the trace of each device is its entries inside the window;
//! * the final state (`segments` and their blocks) is the allocator state after the
//!   window's last entry, rebuilt by the backward walk (spec §10.12) from the recorded
//!   final state over the entries after the window
//!   ([`crate::oom::allocator_state_at`]). When the window reaches the end of the trace
//!   the recorded segments are kept as they are. A live block's frames are those of the
//!   `alloc` entry that made it (or, for a block older than the trace, those of its
//!   later free or of the recorded block); a segment's those of its `segment_alloc`;
//! * annotations and profiler totals are those inside the window's time span: from the
//!   given start time, else from the window's first entry (from the beginning when that
//!   is the file's first entry), to the given end time, else to the first entry after the
//!   window (to the end when there is none).
//!
//! When the trace after the window cannot be undone from the recorded final state (the
//! two disagree), the state at the window's end is unknown and [`cut`] says so instead of
//! guessing. Pinned host memory (`host_segments`, `host_traces`) is left out of a window.
//!
//! [`WindowInfo`] is what the front ends print so that figures say which window they
//! cover (the `window` object of the JSON schemas).

use fragscope_snapshot::{Action, Block, BlockState, Segment, SegmentType, Snapshot, StackId, TraceEvent};
use serde::Serialize;

use fragscope_replay::{BState, RecordedState};

use crate::oom::StateAtError;

/// One end of a window as the user wrote it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Bound {
    /// A trace entry index.
    Index(usize),
    /// Microseconds since the first trace entry of the file.
    TimeUs(i64),
}

/// A parsed `--window START..END`.
#[derive(Clone, Debug, PartialEq)]
pub struct WindowSpec {
    /// The text as given (shown back in every output).
    pub text: String,
    pub start: Option<Bound>,
    pub end: Option<Bound>,
}

fn parse_bound(s: &str) -> Result<Option<Bound>, WindowError> {
    let s = s.trim();
    if s.is_empty() {
        return Ok(None);
    }
    if s.bytes().all(|b| b.is_ascii_digit()) {
        return s
            .parse::<usize>()
            .map(|i| Some(Bound::Index(i)))
            .map_err(|error| WindowError::BadIndex { text: s.to_string(), error });
    }
    let (num, scale) = if let Some(n) = s.strip_suffix("us") {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix("ms") {
        (n, 1e3)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1e6)
    } else {
        return Err(WindowError::BadBound(s.to_string()));
    };
    let v: f64 = num.trim().parse().map_err(|_| WindowError::BadTime(s.to_string()))?;
    if !v.is_finite() || v < 0.0 || v * scale > 1e18 {
        return Err(WindowError::TimeOutOfRange(s.to_string()));
    }
    Ok(Some(Bound::TimeUs((v * scale).round() as i64)))
}

impl WindowSpec {
    /// Parses `START..END` (`1000..5000`, `12.5s..14s`, `1000..`, `..2s`).
    pub fn parse(text: &str) -> Result<WindowSpec, WindowError> {
        let (a, b) = text.split_once("..").ok_or_else(|| WindowError::NoRange(text.to_string()))?;
        let (start, end) = (parse_bound(a)?, parse_bound(b)?);
        match (start, end) {
            (Some(Bound::Index(_)), Some(Bound::TimeUs(_))) | (Some(Bound::TimeUs(_)), Some(Bound::Index(_))) => {
                return Err(WindowError::MixedBounds(text.to_string()));
            }
            (Some(Bound::Index(x)), Some(Bound::Index(y))) if y <= x => {
                return Err(WindowError::EndNotAfterStart(text.to_string()));
            }
            (Some(Bound::TimeUs(x)), Some(Bound::TimeUs(y))) if y <= x => {
                return Err(WindowError::EndNotAfterStart(text.to_string()));
            }
            _ => {}
        }
        Ok(WindowSpec { text: text.to_string(), start, end })
    }
    fn by_time(&self) -> bool {
        matches!(self.start, Some(Bound::TimeUs(_))) || matches!(self.end, Some(Bound::TimeUs(_)))
    }
}

/// A window that cannot be read or cut.
#[derive(Clone, Debug, PartialEq)]
pub enum WindowError {
    /// An entry index too large for this machine (the bound as given).
    BadIndex { text: String, error: std::num::ParseIntError },
    /// Neither an entry index nor a time with a unit (the bound as given).
    BadBound(String),
    /// A time whose number does not read (the bound as given).
    BadTime(String),
    /// A negative or absurdly large time (the bound as given).
    TimeOutOfRange(String),
    /// No `..` (the window as given).
    NoRange(String),
    /// One end an entry index, the other a time (the window as given).
    MixedBounds(String),
    /// The end at or before the start (the window as given).
    EndNotAfterStart(String),
    /// A window by time, in a file whose trace entries do not all record `time_us`.
    Untimed,
    /// A window by time, in a device trace without `time_us`.
    NoTimes,
    /// The file has no trace at all.
    NoTrace,
    /// The window selects no entry of any device's trace.
    Empty { window: String, traces: Vec<TraceExtent> },
    /// The state at the window's end (after entry `entry - 1`) cannot be rebuilt.
    EndState { device: i64, entry: usize, error: StateAtError },
}

/// What a device's trace spans, to say where a window could be: its entries, and the
/// seconds of its first and last entry after the file's first, when recorded.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceExtent {
    pub device: i64,
    pub entries: usize,
    pub seconds: Option<(f64, f64)>,
}

impl std::fmt::Display for WindowError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        const BY_INDEX: &str = "give the window by entry index";
        match self {
            WindowError::BadIndex { text, error } => write!(f, "bad entry index {text:?}: {error}"),
            WindowError::BadBound(s) => write!(
                f,
                "bad window bound {s:?}: give an entry index (1000) or a time with a unit (12.5s, 300ms, 50us)"
            ),
            WindowError::BadTime(s) => write!(f, "bad window time {s:?}"),
            WindowError::TimeOutOfRange(s) => write!(f, "bad window time {s:?}: a time since the first entry is >= 0"),
            WindowError::NoRange(t) => {
                write!(f, "bad window {t:?}: expected START..END, e.g. 1000..5000 or 12.5s..14s")
            }
            WindowError::MixedBounds(t) => write!(f, "bad window {t:?}: both ends are entry indices or both are times"),
            WindowError::EndNotAfterStart(t) => write!(f, "bad window {t:?}: the end must come after the start"),
            WindowError::Untimed => write!(f, "this file's trace entries do not all record time_us: {BY_INDEX}"),
            WindowError::NoTimes => write!(f, "this file's trace records no time_us: {BY_INDEX}"),
            WindowError::NoTrace => f.write_str("this file has no trace to cut a window from"),
            WindowError::Empty { window, traces } => {
                let sizes: Vec<String> = traces
                    .iter()
                    .map(|t| {
                        let span = match t.seconds {
                            Some((a, b)) => format!(", {a:.3} s to {b:.3} s after the first entry"),
                            None => String::new(),
                        };
                        format!(
                            "device {}: {} {}{span}",
                            t.device,
                            t.entries,
                            if t.entries == 1 { "entry" } else { "entries" }
                        )
                    })
                    .collect();
                write!(f, "window {window} holds no trace entry ({})", sizes.join(", "))
            }
            WindowError::EndState { device, entry, error } => write!(
                f,
                "cannot rebuild the allocator state of device {device} at the window's end (entry {entry}): {error}"
            ),
        }
    }
}

impl std::error::Error for WindowError {}

/// How the state at a window's end was obtained (`end_state` in JSON).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EndState {
    /// The window reaches the end of the trace: the file's own segments.
    Recorded,
    /// Rebuilt by undoing the `undone_entries` entries after the window from the recorded
    /// state.
    BackwardWalk,
}

impl EndState {
    /// The name JSON gives it.
    pub fn as_str(self) -> &'static str {
        match self {
            EndState::Recorded => "recorded",
            EndState::BackwardWalk => "backward_walk",
        }
    }
}

impl std::fmt::Display for EndState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a window was given (`by` in JSON): entry indices or times.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WindowBy {
    Index,
    Time,
}

impl WindowBy {
    /// The name JSON gives it.
    pub fn as_str(self) -> &'static str {
        match self {
            WindowBy::Index => "index",
            WindowBy::Time => "time",
        }
    }
}

impl std::fmt::Display for WindowBy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The window of one device's trace.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DeviceWindow {
    pub device: i64,
    /// First entry inside the window (index in the file's trace of this device).
    pub start_index: usize,
    /// One past the last entry inside the window.
    pub end_index: usize,
    /// Entries of this device's trace in the whole file.
    pub file_entries: usize,
    /// `time_us` of the first and last entry inside the window, when recorded.
    pub first_time_us: Option<i64>,
    pub last_time_us: Option<i64>,
    /// The same, in seconds since the first trace entry of the file.
    pub first_s: Option<f64>,
    pub last_s: Option<f64>,
    /// How the state at the window's end was obtained.
    pub end_state: EndState,
    pub undone_entries: usize,
}

/// What a windowed result covers (the `window` object of the JSON schemas).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WindowInfo {
    /// The window as given (`1000..5000`, `12.5s..14s`).
    pub spec: String,
    /// How the window was given.
    pub by: WindowBy,
    pub devices: Vec<DeviceWindow>,
}

impl WindowInfo {
    /// One line for text outputs.
    pub fn line(&self) -> String {
        let mut parts = Vec::new();
        for d in &self.devices {
            let mut p =
                format!("device {}: entries {}..{} of {}", d.device, d.start_index, d.end_index, d.file_entries);
            if let (Some(a), Some(b)) = (d.first_s, d.last_s) {
                p.push_str(&format!(" ({a:.3} s to {b:.3} s after the first entry)"));
            }
            if d.end_state == EndState::BackwardWalk {
                p.push_str(&format!("; state at its end rebuilt by undoing {} later entries", d.undone_entries));
            }
            parts.push(p);
        }
        if parts.is_empty() {
            parts.push("no device has a trace".into());
        }
        format!("Window {} (figures cover only this window): {}", self.spec, parts.join("; "))
    }
}

/// Time of the first trace entry of the file (all devices), the origin of time windows.
fn first_time(snap: &Snapshot) -> Option<i64> {
    snap.device_traces.iter().filter_map(|t| t.first().and_then(|e| e.time())).min()
}

/// `[start, end)` entry indices of `trace` for `spec`.
fn bounds_of(spec: &WindowSpec, trace: &[TraceEvent], t0: Option<i64>) -> Result<(usize, usize), WindowError> {
    let n = trace.len();
    let at = |b: Option<Bound>, open: usize| -> Result<usize, WindowError> {
        match b {
            None => Ok(open),
            Some(Bound::Index(i)) => Ok(i.min(n)),
            Some(Bound::TimeUs(us)) => {
                let t0 = t0.ok_or(WindowError::NoTimes)?;
                let t = t0.saturating_add(us);
                // Entries are written in time order; the first at or after `t`.
                Ok(trace.partition_point(|e| e.time_us < t))
            }
        }
    };
    Ok((at(spec.start, 0)?, at(spec.end, n)?))
}

/// Cuts `snap` to `spec`; see the module doc. `Err` is one line: a window that selects
/// nothing, or a state at the window's end that cannot be rebuilt.
pub fn cut(snap: &Snapshot, spec: &WindowSpec) -> Result<(Snapshot, WindowInfo), WindowError> {
    let t0 = first_time(snap);
    if spec.by_time() {
        let untimed = snap.device_traces.iter().flatten().any(|e| e.time().is_none());
        if t0.is_none() || untimed {
            return Err(WindowError::Untimed);
        }
    }
    let mut out = window_skeleton(snap);
    if snap.host_segments.is_some() || snap.host_traces.is_some() {
        out.notes.remarks.push("pinned host memory (host_segments, host_traces) is left out of a window".into());
    }
    let mut info = WindowInfo {
        spec: spec.text.clone(),
        by: if spec.by_time() { WindowBy::Time } else { WindowBy::Index },
        devices: vec![],
    };
    // Time span of each device's window, for annotations and totals: (device, from, to).
    let mut spans: Vec<(i64, i64, i64)> = Vec::new();
    let mut any_entry = false;
    let devices = snap.devices();
    for (d, trace) in snap.device_traces.iter().enumerate() {
        let device = d as i64;
        if trace.is_empty() {
            out.device_traces.push(Vec::new());
            continue;
        }
        let (s, e) = bounds_of(spec, trace, t0)?;
        let e = e.max(s);
        any_entry |= e > s;
        out.device_traces.push(trace[s..e].to_vec());
        let n = trace.len();
        let end_state = if e == n { EndState::Recorded } else { EndState::BackwardWalk };
        let rel = |t: Option<i64>| t.zip(t0).map(|(t, z)| (t - z) as f64 / 1e6);
        let (ft, lt) = if e > s { (trace[s].time(), trace[e - 1].time()) } else { (None, None) };
        info.devices.push(DeviceWindow {
            device,
            start_index: s,
            end_index: e,
            file_entries: n,
            first_time_us: ft,
            last_time_us: lt,
            first_s: rel(ft),
            last_s: rel(lt),
            end_state,
            undone_entries: n - e,
        });
        let (lo, hi) = time_span(spec, trace, s, e, t0);
        spans.push((device, lo, hi));
    }
    if !any_entry {
        return Err(empty_window(snap, spec, &info, t0));
    }
    // Final state at each window's end.
    for &device in &devices {
        let w = info.devices.iter().find(|w| w.device == device);
        match w {
            Some(w) if w.end_state == EndState::BackwardWalk => {
                let st = crate::oom::allocator_state_at(snap, device, w.end_index.checked_sub(1))
                    .map_err(|error| WindowError::EndState { device, entry: w.end_index, error })?;
                out.segments.extend(segments_of_state(snap, device, &st, w.end_index));
            }
            _ => out.segments.extend(snap.device_segments(device).cloned()),
        }
    }
    let (glo, ghi) = spans.iter().fold((i64::MAX, i64::MIN), |(a, b), &(_, lo, hi)| (a.min(lo), b.max(hi)));
    let inside = |device: i64, t: i64| match spans.iter().find(|s| s.0 == device) {
        Some(&(_, lo, hi)) => lo <= t && t < hi,
        None => glo <= t && t < ghi,
    };
    out.external_annotations =
        snap.external_annotations.as_ref().map(|v| v.iter().filter(|a| inside(a.device, a.time_us)).cloned().collect());
    out.totals = snap
        .totals
        .iter()
        .enumerate()
        .map(|(d, v)| v.iter().filter(|t| inside(d as i64, t.time_us)).copied().collect())
        .collect();
    Ok((out, info))
}

/// The window's snapshot before its traces and state: what a window keeps of the file
/// (settings, contexts, frames, capacity, notes), no segments, traces or totals yet, and
/// no pinned host memory.
fn window_skeleton(snap: &Snapshot) -> Snapshot {
    Snapshot {
        segments: Vec::new(),
        device_traces: Vec::with_capacity(snap.device_traces.len()),
        allocator_settings: snap.allocator_settings.clone(),
        external_annotations: None,
        host_segments: None,
        host_traces: None,
        extra: snap.extra.clone(),
        contexts: snap.contexts.clone(),
        totals: Vec::new(),
        device_capacity: snap.device_capacity.clone(),
        frames: snap.frames.clone(),
        format: snap.format,
        notes: snap.notes.clone(),
        device_index: Default::default(),
    }
}

/// The time span of a window of entries `s..e` of `trace`: the given times, else from
/// its first entry (or the start of time when it starts at the first entry) to the first
/// entry after it (or the end of time), as (from, to) in the trace's `time_us`.
fn time_span(spec: &WindowSpec, trace: &[TraceEvent], s: usize, e: usize, t0: Option<i64>) -> (i64, i64) {
    let n = trace.len();
    let lo = match spec.start {
        Some(Bound::TimeUs(us)) => t0.unwrap_or(0).saturating_add(us),
        _ if s == 0 => i64::MIN,
        _ => trace.get(s).and_then(|e| e.time()).unwrap_or(i64::MAX),
    };
    let hi = match spec.end {
        Some(Bound::TimeUs(us)) => t0.unwrap_or(0).saturating_add(us),
        _ if e >= n => i64::MAX,
        _ => trace[e].time().unwrap_or(i64::MAX),
    };
    (lo, hi)
}

/// Why a window holds no trace entry (one line): the file has no trace, or the window
/// lies outside every device's entries, listed with their spans.
fn empty_window(snap: &Snapshot, spec: &WindowSpec, info: &WindowInfo, t0: Option<i64>) -> WindowError {
    let traces: Vec<TraceExtent> = info
        .devices
        .iter()
        .map(|d| {
            let tr = snap.trace(d.device);
            let seconds = match (tr.first().and_then(|e| e.time()), tr.last().and_then(|e| e.time()), t0) {
                (Some(a), Some(b), Some(z)) => Some(((a - z) as f64 / 1e6, (b - z) as f64 / 1e6)),
                _ => None,
            };
            TraceExtent { device: d.device, entries: d.file_entries, seconds }
        })
        .collect();
    if traces.is_empty() {
        WindowError::NoTrace
    } else {
        WindowError::Empty { window: spec.text.clone(), traces }
    }
}

/// `segments` of `device` for the rebuilt state `st` after entry `end - 1`.
fn segments_of_state(snap: &Snapshot, device: i64, st: &RecordedState, end: usize) -> Vec<Segment> {
    let (block_stack, seg_stack) = stacks_at(snap.trace(device), end);
    let recorded: Vec<&Segment> = snap.device_segments(device).collect();
    let recorded_block = |addr: u64| {
        recorded.iter().flat_map(|s| &s.blocks).find(|b| b.address == addr && b.state.is_active()).and_then(|b| b.stack)
    };
    // Keep the file's shape: optional keys present only when the file has them.
    let any = snap.segments.first();
    let has_pool = any.is_none_or(|s| s.segment_pool_id.is_some());
    let has_expandable = any.is_none_or(|s| s.is_expandable.is_some());
    let has_requested = any.is_none_or(|s| s.requested_size.is_some());
    st.segs
        .values()
        .map(|s| {
            let blocks: Vec<Block> = s
                .blocks
                .iter()
                .map(|b| {
                    let state = match b.state {
                        BState::Allocated => BlockState::ActiveAllocated,
                        BState::Pending => BlockState::ActivePendingFree,
                        BState::Free => BlockState::Inactive,
                    };
                    let stack = if state.is_active() {
                        match block_stack.get(&b.addr) {
                            Some(s) => *s,
                            None => recorded_block(b.addr),
                        }
                    } else {
                        None
                    };
                    Block {
                        address: b.addr,
                        size: b.size,
                        requested_size: has_requested.then_some(if state.is_active() { b.requested } else { 0 }),
                        state,
                        stack,
                        history: None,
                    }
                })
                .collect();
            let sum = |f: &dyn Fn(&Block) -> bool, v: &dyn Fn(&Block) -> u64| -> u64 {
                blocks.iter().filter(|b| f(b)).map(v).sum()
            };
            let stack = match seg_stack.get(&s.addr) {
                Some(st) => *st,
                None => recorded.iter().find(|r| r.address == s.addr).and_then(|r| r.stack),
            };
            Segment {
                device,
                address: s.addr,
                total_size: s.size,
                allocated_size: sum(&|b| b.state == BlockState::ActiveAllocated, &|b| b.size),
                active_size: sum(&|b| b.state.is_active(), &|b| b.size),
                requested_size: has_requested
                    .then(|| sum(&|b| b.state.is_active(), &|b| b.requested_size.unwrap_or(0))),
                stream: s.stream,
                segment_type: if s.small { SegmentType::Small } else { SegmentType::Large },
                segment_pool_id: has_pool.then_some(s.pool),
                is_expandable: has_expandable.then_some(s.expandable),
                stack,
                blocks,
            }
        })
        .collect()
}

/// Frames of the blocks and segments live at the window's end (before entry `end` of
/// `trace`), by address: a live block's are its alloc's before the end; else (older than
/// the trace) those of the first free of it after the end (context="alloc" frees carry the
/// allocation's frames), `None` when a later allocation at the address comes first (the
/// recorded block is then not this one), and absent when the trace says nothing (the
/// recorded block's then); likewise for segments.
fn stacks_at(trace: &[TraceEvent], end: usize) -> (StackMap, StackMap) {
    let (before, after) = trace.split_at(end);
    let mut block_stack: StackMap = Default::default();
    let mut seg_stack: StackMap = Default::default();
    for e in before {
        match e.action {
            Action::Alloc => {
                block_stack.insert(e.addr, e.stack);
            }
            Action::SegmentAlloc | Action::SegmentMap => {
                seg_stack.insert(e.addr, e.stack);
            }
            _ => {}
        }
    }
    for e in after {
        match e.action {
            Action::FreeRequested | Action::FreeCompleted => {
                block_stack.entry(e.addr).or_insert(e.stack);
            }
            Action::Alloc => {
                // A later allocation at the address: the recorded block is not this one.
                block_stack.entry(e.addr).or_insert(None);
            }
            Action::SegmentFree | Action::SegmentUnmap => {
                seg_stack.entry(e.addr).or_insert(e.stack);
            }
            Action::SegmentAlloc | Action::SegmentMap => {
                seg_stack.entry(e.addr).or_insert(None);
            }
            _ => {}
        }
    }
    (block_stack, seg_stack)
}

/// Frames by address (a block's or a segment's).
type StackMap = fragscope_snapshot::FxHashMap<u64, Option<StackId>>;
