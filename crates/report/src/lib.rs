//! One self-contained HTML file that shows PyTorch memory snapshots: `fragscope report`.
//!
//! Everything the page needs is inline: the data (compact JSON, large arrays as base64
//! typed arrays), the JavaScript and the CSS (owned source files under `assets/`, pulled
//! in with `include_str!`). The page makes no network request and works from `file://`.
//!
//! The layout and the levels of detail are computed here, in Rust, so that a trace of
//! millions of events becomes a few MB the browser can draw with Canvas 2D:
//!
//! * [`curves::Curves`]: the allocated / requested / reserved curves of one device in
//!   fixed buckets of trace states (the maximum of each bucket, as
//!   [`fragscope_analysis::timeline`] counts them), with the live bytes of the top call
//!   sites at each bucket's allocated maximum; the page builds coarser zoom levels from
//!   these by pairwise maxima.
//! * [`state::Moment`]: the allocator state (segments split into blocks) at chosen trace
//!   positions — the OOM, the reserved and allocated peaks, evenly spaced moments and the
//!   end — rebuilt by walking the trace backwards from the snapshot's final `segments`.
//! * [`FileData`]: one file's report data: those two plus the `summary` and `analyze`
//!   results, phases from `external_annotations`, the largest allocations and the stacks
//!   they reference.
//!
//! [`render`] turns a list of [`FileData`] (several files: ranks side by side) into the
//! HTML text; [`file_data`] builds one from a snapshot, so that a caller holding many
//! large files keeps only one snapshot in memory at a time.

pub mod curves;
pub mod encode;
pub mod initial;
pub mod leakcurves;
pub mod state;
pub mod whatif;

use std::collections::{BinaryHeap, HashMap};
use std::sync::Arc;

use fragscope_analysis::analyze::{self, AnalyzeOptions};
use fragscope_analysis::lives::BlockLives;
use fragscope_analysis::summary;
use fragscope_snapshot::{Action, FxHashMap, Snapshot, StackId, TraceEvent};
use serde::Serialize;

/// Schema name written into the page's data (`fragscope.report/1`).
pub const SCHEMA: &str = "fragscope.report/1";

/// Options of [`file_data`].
#[derive(Clone, Copy, Debug)]
pub struct ReportOptions {
    /// Buckets of the finest curve level (the page merges them for coarser zoom levels).
    pub buckets: usize,
    /// Call sites whose live bytes are drawn as their own band (the rest: one band).
    pub top_sites: usize,
    /// Largest allocations listed (searchable by address, drawn as lifetimes).
    pub top_allocations: usize,
    /// Evenly spaced moments of the state view, at most (fewer on files with many blocks).
    pub moments: usize,
    /// Size budget of the state view of one device, in f64 values: keyframes plus
    /// per-event deltas (see [`state`]); ~8 bytes of data, 10.7 in the page, each.
    pub state_values: usize,
}

impl Default for ReportOptions {
    fn default() -> Self {
        ReportOptions { buckets: 8192, top_sites: 12, top_allocations: 2000, moments: 24, state_values: 1_200_000 }
    }
}

/// Interned stacks referenced by the page, as indices into its frame-string table.
#[derive(Default)]
pub struct StackTable {
    frames: Vec<String>,
    frame_index: HashMap<String, u32>,
    /// Each stack: frame indices, innermost first.
    stacks: Vec<Vec<u32>>,
    by_id: HashMap<StackId, u32>,
}

impl StackTable {
    /// Page index of a stack (`-1` for none).
    pub fn index(&mut self, snap: &Snapshot, s: Option<StackId>) -> i64 {
        let Some(id) = s else { return -1 };
        if let Some(&i) = self.by_id.get(&id) {
            return i as i64;
        }
        let mut v = Vec::new();
        for (file, line, name) in snap.frames.resolved(id) {
            let text = format!("{file}:{line}:{name}");
            let n = self.frames.len() as u32;
            let k = *self.frame_index.entry(text.clone()).or_insert_with(|| n);
            if k == n {
                self.frames.push(text);
            }
            v.push(k);
        }
        let i = self.stacks.len() as u32;
        self.stacks.push(v);
        self.by_id.insert(id, i);
        i as i64
    }
}

/// One `record_function` scope, in trace states.
#[derive(Serialize)]
pub struct Phase {
    pub name: String,
    /// First and last trace state inside the scope.
    pub start: usize,
    pub end: usize,
    /// Nesting depth (0 = outermost).
    pub depth: usize,
}

/// Everything the page shows about one device.
#[derive(Serialize)]
pub struct DeviceData {
    pub device: i64,
    pub events: usize,
    pub curves: curves::Curves,
    pub phases: Vec<Phase>,
    pub moments: Vec<state::Moment>,
    /// Why the state view has fewer moments than asked (e.g. the backward walk stopped).
    pub moments_note: Option<String>,
    /// Per-event deltas between the moments (the state at any event), when they fit.
    pub state_ops: state::StateOps,
    /// Largest allocations: `[address, size, requested, alloc state, free state (−1 =
    /// still live), stack, alloc time_us, free time_us (NaN = none)]` each, flattened,
    /// base64 Float64Array. The timeline draws them stacked, one polygon each.
    pub allocations: String,
    /// The largest allocations live before the trace begins, as `allocations` (alloc
    /// state 0), see [`initial`].
    pub initial_allocations: String,
    /// Distinct request sizes and how often each was made, for "which requests could
    /// this free block have served": `[size, count]` pairs, base64 Float64Array.
    pub requests: String,
    /// Reserved curves of the replays `analyze` ran (recorded settings first).
    pub whatif: Vec<whatif::WhatIfCurve>,
    /// Trace states of the iteration boundaries sampled for `leaks`.
    pub leak_boundaries: Vec<usize>,
    /// Live bytes of each leak suspect's call site at those boundaries.
    pub leaks: Vec<leakcurves::LeakCurve>,
}

/// One file of the report.
#[derive(Serialize)]
pub struct FileData {
    pub name: String,
    pub example: bool,
    pub summary: serde_json::Value,
    pub analysis: serde_json::Value,
    pub devices: Vec<DeviceData>,
    /// Frame strings (`file:line:name`) and stacks (indices, innermost first).
    pub frames: Vec<String>,
    pub stacks: Vec<Vec<u32>>,
}

/// Builds one file's report data (summary, analysis, curves, state moments, phases).
pub fn file_data(name: &str, example: bool, snap: &Snapshot, opts: &ReportOptions) -> FileData {
    let mut table = StackTable::default();
    let aopts = AnalyzeOptions::default();
    let device_list = snap.devices();
    // `analyze` runs beside the report's other walks of the trace; the curves are drawn
    // in the walk that makes analyze's timeline (one walk for both). Once every device
    // is walked, its curves are finished (their call sites' values, from the walk's
    // block lives) and its state view built here, while the analysis goes on with the
    // leak tests.
    let (tx, rx) = std::sync::mpsc::channel();
    let (scan_tx, scan_rx) = std::sync::mpsc::channel();
    let summary_cell = std::sync::OnceLock::new();
    let summary_slot = &summary_cell;
    let devices_scanned = &device_list;
    let (ana, drawn, lives_of) = std::thread::scope(|s| {
        let analysis = s.spawn(move || {
            let tx = std::sync::Mutex::new(tx);
            let timeline_of = |d: i64| {
                let (c, tl) = curves::curves_and_timeline(snap, d, opts, aopts.points);
                // The receiver waits for every device: a failed send cannot happen.
                let _ = tx.lock().expect("curves channel").send((d, c, tl.lives.clone(), state::Marks::new(snap, &tl)));
                tl
            };
            // What is read from the traces alone, then the summary, on the analysis'
            // thread beside the first walk (the core the walk does not use has room for
            // them; a thread of their own would share). The scans are sent as soon as
            // they are done: they are drawn once the walk ends.
            let scan_tx = std::sync::Mutex::new(scan_tx);
            let beside = move || {
                let scans: FxHashMap<i64, TraceScan> =
                    devices_scanned.iter().map(|&d| (d, TraceScan::new(snap, d, opts))).collect();
                // Received below, unless that thread has already failed.
                let _ = scan_tx.lock().expect("scan channel").send(scans);
                let _ = summary_slot.set(summary::summarize(snap));
            };
            analyze::analyze_with_timelines(snap, &aopts, &timeline_of, Some(&beside))
        });
        // The analysis walks every device, in this order, one message each (fewer only
        // when its thread ended early: it panicked, and the join below says so).
        let mut walked = FxHashMap::default();
        let mut lives_of = FxHashMap::default();
        for (d, c, lives, marks) in rx.iter().take(device_list.len()) {
            let lives = lives.unwrap_or_else(|| Arc::new(BlockLives::replay(snap, d)));
            walked.insert(d, (c, marks));
            // Kept for the curves' call sites, the largest allocations and the leak
            // suspects' curves.
            lives_of.insert(d, lives);
        }
        // A device the analysis did not walk (none today): its own walk.
        for &d in &device_list {
            if let std::collections::hash_map::Entry::Vacant(slot) = lives_of.entry(d) {
                let (c, tl) = curves::curves_and_timeline(snap, d, opts, aopts.points);
                let lives = tl.lives.clone().unwrap_or_else(|| Arc::new(BlockLives::replay(snap, d)));
                walked.insert(d, (c, state::Marks::new(snap, &tl)));
                slot.insert(lives);
            }
        }
        // The trace scans (done beside the walk, unless the analysis ended without
        // them: then here), and the largest allocations' ends from each device's lives.
        let mut scans = scan_rx.recv().unwrap_or_default();
        let parts: Vec<_> = device_list
            .iter()
            .map(|&d| {
                let scan = scans.remove(&d).unwrap_or_else(|| TraceScan::new(snap, d, opts));
                let largest = largest_lives(snap.trace(d), &lives_of[&d], &scan.largest);
                Part { device: d, largest, scan }
            })
            .collect();
        let drawn = draw(snap, opts, parts, walked, &lives_of, &mut table);
        (analysis.join().expect("the analysis thread panicked"), drawn, lives_of)
    });
    // The analysis runs `beside` exactly once.
    let sum = summary_cell.into_inner().unwrap_or_else(|| summary::summarize(snap));
    let mut devices = Vec::new();
    for (d, curves, allocations, initial_allocations, requests, phases, (marks, state)) in drawn {
        // The state view was built with the peaks of the walk the analysis took its
        // timeline from, and the trace's OOM entry: the analysis' own.
        debug_assert_eq!(Some(marks), state::Marks::of(snap, d, &ana), "device {d}");
        let (moments, moments_note, state_ops) = state;
        let (leak_boundaries, leaks) = leakcurves::curves(snap, d, &ana, &lives_of[&d]);
        devices.push(DeviceData {
            device: d,
            events: snap.trace(d).len(),
            curves,
            phases,
            moments,
            moments_note,
            state_ops,
            allocations,
            initial_allocations,
            requests,
            whatif: whatif::curves(snap, d, &ana),
            leak_boundaries,
            leaks,
        });
    }
    FileData {
        name: name.to_string(),
        example,
        summary: serde_json::to_value(&sum).unwrap_or(serde_json::Value::Null),
        analysis: serde_json::to_value(&ana).unwrap_or(serde_json::Value::Null),
        devices,
        frames: table.frames,
        stacks: table.stacks,
    }
}

/// What is drawn of a device besides its walk's curves: its trace scan (found beside the
/// analysis' walk) and its largest allocations' lives ([`largest_lives`]).
struct Part {
    device: i64,
    largest: Vec<(usize, usize)>,
    scan: TraceScan,
}

/// A walked device's curves as the walk leaves them and the state view's marks.
type Walked = (curves::CurvesWalk, state::Marks);

/// What [`file_data`] draws of a device before its analysis is done.
type Drawn = (i64, curves::Curves, String, String, String, Vec<Phase>, (state::Marks, state::StateView));

/// The curves, the largest allocations and the state view of every device, with page
/// stack indices given in a fixed order (each device's curve sites, its largest
/// allocations and those from before the trace; then each device's state view), so
/// that the page does not depend on the threads' timing.
fn draw(
    snap: &Snapshot,
    opts: &ReportOptions,
    parts: Vec<Part>,
    mut walked: FxHashMap<i64, Walked>,
    lives_of: &FxHashMap<i64, Arc<BlockLives>>,
    table: &mut StackTable,
) -> Vec<Drawn> {
    let drawn: Vec<_> = parts
        .into_iter()
        .map(|Part { device: d, largest, scan }| {
            let (c, marks) = walked.remove(&d).expect("every device is walked before it is drawn");
            let (c, sites) = c.finish(&lives_of[&d], scan.buckets);
            let curves = c.with_stacks(snap, &sites, table);
            let allocations = encode_allocations(snap, d, largest, table);
            let initial = scan.initial.encode(snap, table);
            (d, curves, allocations, initial, scan.requests, scan.phases, marks)
        })
        .collect();
    drawn
        .into_iter()
        .map(|(d, curves, allocations, initial, requests, phases, marks)| {
            let view = state::moments_at(snap, d, Some(marks), opts, table);
            (d, curves, allocations, initial, requests, phases, (marks, view))
        })
        .collect()
}

/// `record_function` scopes of a device from `external_annotations`, placed on the trace
/// by time (the first state at or after the START, the last before the END).
pub fn phases(snap: &Snapshot, device: i64) -> Vec<Phase> {
    let trace = snap.trace(device);
    let Some(anns) = &snap.external_annotations else { return Vec::new() };
    // Trace times are recorded in order; a file where they are not gets approximate bands.
    let state_at = |t: i64| trace.partition_point(|e| e.time_us < t);
    let mut open: Vec<(String, usize)> = Vec::new();
    let mut out = Vec::new();
    let mut sorted: Vec<_> = anns.iter().filter(|a| a.device == device || a.device < 0).collect();
    sorted.sort_by_key(|a| a.time_us);
    for a in sorted {
        match a.stage.as_str() {
            "START" => open.push((a.name.clone(), state_at(a.time_us))),
            "END" => {
                if let Some(k) = open.iter().rposition(|(n, _)| *n == a.name) {
                    let (name, start) = open.remove(k);
                    out.push(Phase { name, start, end: state_at(a.time_us).max(start), depth: k });
                }
            }
            _ => {}
        }
    }
    // Scopes never closed run to the end of the trace.
    for (k, (name, start)) in open.into_iter().enumerate() {
        out.push(Phase { name, start, end: trace.len(), depth: k });
    }
    out.sort_by_key(|p| (p.start, p.depth));
    out
}

/// What the page shows of a device that is read from its trace (and final state)
/// alone, without the block lives: found beside the analysis' walk ([`file_data`]).
struct TraceScan {
    /// Entries of the largest `alloc`s (see [`LargestAllocs`]).
    largest: Vec<usize>,
    /// [`DeviceData::requests`].
    requests: String,
    initial: initial::Initial,
    phases: Vec<Phase>,
    /// The figures of the curves' buckets read from the trace.
    buckets: curves::TraceBuckets,
}

impl TraceScan {
    fn new(snap: &Snapshot, device: i64, opts: &ReportOptions) -> Self {
        let trace = snap.trace(device);
        let mut largest = LargestAllocs::new(opts.top_allocations);
        let mut initial = initial::InitialScan::new(snap);
        let mut buckets = curves::TraceBuckets::scan(trace.len(), opts);
        // One pass over the entries for all three: a long trace is hundreds of MB, read
        // once rather than three times.
        for (i, e) in trace.iter().enumerate() {
            largest.entry(i, e);
            initial.entry(i, e);
            buckets.entry(i, e);
        }
        let (largest, requests) = largest.finish();
        TraceScan {
            largest,
            requests,
            initial: initial.finish(snap, device, opts.top_allocations),
            phases: phases(snap, device),
            buckets: buckets.finish(),
        }
    }
}

/// All of `trace` through [`LargestAllocs`] (for the tests).
#[cfg(test)]
fn largest_allocs(trace: &[TraceEvent], top: usize) -> (Vec<usize>, String) {
    let mut largest = LargestAllocs::new(top);
    for (j, e) in trace.iter().enumerate() {
        largest.entry(j, e);
    }
    largest.finish()
}

/// The `top` largest `alloc` entries of a trace (by request, the earlier first among
/// equals), and its distinct request sizes with their counts ([`encode_requests`]), read
/// entry by entry (in [`TraceScan::new`]'s one pass). Importance is size alone, as
/// PyTorch's memory_viz picks the allocations it draws (`max_entries`): the timeline
/// draws these one polygon each, and size (not bytes × lifetime) keeps the short-lived
/// large activations that make the peaks rather than only the long-lived weights.
struct LargestAllocs {
    top: usize,
    /// The `top` largest, kept in a min-heap: millions of entries on a long trace, nearly
    /// all rejected by one comparison with the smallest kept. Key: (size, earlier alloc
    /// first).
    heap: BinaryHeap<std::cmp::Reverse<(u64, std::cmp::Reverse<usize>)>>,
    requests: FxHashMap<u64, u64>,
}

impl LargestAllocs {
    fn new(top: usize) -> Self {
        LargestAllocs { top, heap: BinaryHeap::with_capacity(top + 1), requests: FxHashMap::default() }
    }

    /// Entry `j` of the trace, in order from 0.
    #[inline]
    fn entry(&mut self, j: usize, e: &TraceEvent) {
        if e.action != Action::Alloc {
            return;
        }
        *self.requests.entry(e.size).or_default() += 1;
        let key = (e.size, std::cmp::Reverse(j));
        if self.heap.len() < self.top {
            self.heap.push(std::cmp::Reverse(key));
        } else if self.heap.peek().is_some_and(|m| key > m.0) {
            self.heap.pop();
            self.heap.push(std::cmp::Reverse(key));
        }
    }

    /// The entries kept and the request sizes, encoded.
    fn finish(self) -> (Vec<usize>, String) {
        let largest = self.heap.into_iter().map(|std::cmp::Reverse((_, std::cmp::Reverse(j)))| j).collect();
        (largest, encode_requests(self.requests))
    }
}

/// The lifetimes of the given `alloc` entries (the largest, [`LargestAllocs`]): (alloc
/// entry, state of its free or `usize::MAX`), in trace order.
///
/// A life ends at the first `free_requested` or `alloc` at its address (memory_viz's
/// pairing). Both are read from the walk's block lives (one per `alloc` entry, in
/// order), whose ends agree except for a block whose `free_completed` came with no
/// `free_requested`: those few of the chosen are looked up in the trace.
fn largest_lives(trace: &[TraceEvent], lives: &BlockLives, allocs: &[usize]) -> Vec<(usize, usize)> {
    let mut chosen: Vec<(usize, usize)> = Vec::with_capacity(allocs.len());
    // Address → (entry of its `free_completed`, index in `chosen`) of lives still open
    // for memory_viz after the lives' end.
    let mut open: FxHashMap<u64, Vec<(usize, usize)>> = FxHashMap::default();
    for &j in allocs {
        // The lives are one per `alloc` entry, in order (the walk of the same trace made
        // them); an entry without one would be drawn as never freed.
        let life = lives.traced.get(lives.traced.partition_point(|l| l.alloc < j)).filter(|l| l.alloc == j);
        debug_assert!(life.is_some(), "alloc entry {j} has no life");
        let free = match life.and_then(|l| l.end_entry()) {
            None => usize::MAX,
            Some(e) if trace[e].action == Action::FreeCompleted => {
                open.entry(trace[j].addr).or_default().push((e, chosen.len()));
                usize::MAX
            }
            Some(e) => e + 1,
        };
        chosen.push((j, free));
    }
    if let Some(from) = open.values().flatten().map(|&(e, _)| e + 1).min() {
        for (i, e) in trace.iter().enumerate().skip(from) {
            if !matches!(e.action, Action::Alloc | Action::FreeRequested) {
                continue;
            }
            if let Some(v) = open.get_mut(&e.addr) {
                v.retain(|&(after, at)| {
                    let ends = after < i;
                    if ends {
                        chosen[at].1 = i + 1;
                    }
                    !ends
                });
                if v.is_empty() {
                    open.remove(&e.addr);
                    if open.is_empty() {
                        break;
                    }
                }
            }
        }
    }
    chosen.sort_unstable();
    chosen
}

/// [`largest_lives`] as the page gets them (see [`DeviceData::allocations`]).
fn encode_allocations(snap: &Snapshot, device: i64, lives: Vec<(usize, usize)>, table: &mut StackTable) -> String {
    let trace = snap.trace(device);
    let cfg = fragscope_analysis::replay::recorded_config(snap);
    let mut v = Vec::with_capacity(lives.len() * 8);
    let time = |i: usize| match trace.get(i).map(|e| e.time_us) {
        Some(t) if t != fragscope_snapshot::NO_TIME => t as f64,
        _ => f64::NAN,
    };
    for (j, free) in lives {
        let e = &trace[j];
        v.extend([
            e.addr as f64,
            fragscope_alloc::rounding::round_size(e.size, &cfg) as f64,
            e.size as f64,
            (j + 1) as f64,
            if free == usize::MAX { -1.0 } else { free as f64 },
            table.index(snap, e.stack) as f64,
            time(j),
            if free == usize::MAX { f64::NAN } else { time(free - 1) },
        ]);
    }
    encode::f64s(&v)
}

/// Distinct request sizes of the trace's `alloc` entries with their counts, as the page
/// gets them ([`DeviceData::requests`]).
fn encode_requests(m: FxHashMap<u64, u64>) -> String {
    let mut v: Vec<(u64, u64)> = m.into_iter().collect();
    v.sort_unstable();
    encode::f64s(&v.iter().flat_map(|&(s, c)| [s as f64, c as f64]).collect::<Vec<_>>())
}

const TEMPLATE: &str = include_str!("../assets/report.html");
const CSS: &str = include_str!("../assets/report.css");
const JS: &str = include_str!("../assets/report.js");

/// The whole HTML page for the given files (one or several: ranks side by side).
pub fn render(files: &[FileData]) -> String {
    render_with_diff(files, None)
}

/// [`render`], with the comparison of two runs (`fragscope diff`'s result, A = the first
/// file, B = the second) drawn beside the files.
pub fn render_with_diff(files: &[FileData], diff: Option<&fragscope_analysis::diff::Diff>) -> String {
    #[derive(Serialize)]
    struct Page<'a> {
        schema: &'static str,
        version: &'static str,
        files: &'a [FileData],
        diff: Option<&'a fragscope_analysis::diff::Diff>,
    }
    let page = Page { schema: SCHEMA, version: env!("CARGO_PKG_VERSION"), files, diff };
    let json = serde_json::to_string(&page).unwrap_or_else(|_| "{}".into());
    let title = match files {
        [one] if one.example => "fragscope report: built-in example".to_string(),
        [one] => format!("fragscope report: {}", one.name),
        many => format!("fragscope report: {} files", many.len()),
    };
    TEMPLATE
        .replace("{{TITLE}}", &html_escape(&title))
        .replace("{{CSS}}", CSS)
        .replace("{{JS}}", &JS.replace("</script", "<\\/script"))
        // `</` cannot end the data's script element: JSON allows `<\/`.
        .replace("{{DATA}}", &json.replace("</", "<\\/"))
}

fn html_escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;
    use fragscope_snapshot::TraceEvent;
    use fragscope_testdata::Rng;

    /// memory_viz's pairing, by a walk of its own: a life ends at the first
    /// `free_requested` or `alloc` at its address; `free_completed` ends nothing.
    fn paired(trace: &[TraceEvent]) -> Vec<(usize, usize)> {
        let mut open: FxHashMap<u64, usize> = FxHashMap::default();
        let mut out = Vec::new();
        for (i, e) in trace.iter().enumerate() {
            match e.action {
                Action::Alloc => {
                    if let Some(j) = open.insert(e.addr, i) {
                        out.push((j, i + 1));
                    }
                }
                Action::FreeRequested => {
                    if let Some(j) = open.remove(&e.addr) {
                        out.push((j, i + 1));
                    }
                }
                _ => {}
            }
        }
        out.extend(open.into_values().map(|j| (j, usize::MAX)));
        out
    }

    #[test]
    fn largest_lives_from_the_walk_pair_as_memory_viz() {
        let mut rng = Rng(11);
        for round in 0..300 {
            // Few addresses, so that they are reused; frees with and without their
            // `free_requested`, frees of unknown blocks, allocs over live blocks.
            let mut trace = Vec::new();
            for _ in 0..rng.below(80) {
                let addr = (1 + rng.below(6) as u64) << 20;
                let size = 512 * (1 + rng.below(40) as u64);
                let action = match rng.below(5) {
                    0 | 1 => Action::Alloc,
                    2 => Action::FreeRequested,
                    _ => Action::FreeCompleted,
                };
                trace.push(TraceEvent::new(action, addr, size, 0));
            }
            let mut snap = Snapshot::default();
            snap.device_traces.push(trace);
            let trace = snap.trace(0);
            let lives = BlockLives::replay(&snap, 0);
            for top in [0, 1, 3, 1000] {
                let got = largest_lives(trace, &lives, &largest_allocs(trace, top).0);
                let mut want = paired(trace);
                want.sort_by_key(|&(j, _)| (std::cmp::Reverse(trace[j].size), j));
                want.truncate(top);
                want.sort_unstable();
                assert_eq!(got, want, "round {round}, top {top}");
            }
        }
    }
}
