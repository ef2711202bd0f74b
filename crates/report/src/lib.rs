//! One self-contained HTML file that shows PyTorch memory snapshots: `fragscope report`.
//!
//! Everything the page needs is inline: the data (compact JSON, large arrays as base64
//! typed arrays), the JavaScript and the CSS (owned source files under `assets/`, pulled
//! in with `include_str!`; the script's modules, `assets/js/*.js`, bundled into one by
//! `build.rs`). The page makes no network request and works from `file://`.
//!
//! The layout and the levels of detail are computed here, in Rust, so that a trace of
//! millions of events becomes a few MB the browser can draw with Canvas 2D:
//!
//! * [`curves::Curves`]: the allocated / requested / reserved curves of one device in
//!   fixed buckets of trace states (the maximum of each bucket, as
//!   [`fragscope_trace::timeline`] counts them), with the live bytes of the top call
//!   sites at each bucket's allocated maximum; the page builds coarser zoom levels from
//!   these by pairwise maxima.
//! * [`state::Moment`]: the allocator state (segments split into blocks) at chosen trace
//!   positions — the OOM, the reserved and allocated peaks, evenly spaced moments and the
//!   end — rebuilt by walking the trace backwards from the snapshot's final `segments`.
//! * [`FileData`]: one file's report data: those two plus the `summary` and `analyze`
//!   results, phases from `external_annotations`, the largest allocations and the stacks
//!   they reference.
//!
//! [`render`] turns a list of [`FileData`] (several files: ranks side by side, compared
//! by [`fragscope_diagnose::compare_ranks`]) into the HTML text; [`file_data`] builds one
//! from a snapshot, so that a caller holding many large files keeps only one snapshot in
//! memory at a time.

pub mod curves;
pub mod encode;
pub mod initial;
pub mod layout;
pub mod leakcurves;
pub mod pools;
pub mod predict;
pub mod rolecurves;
pub mod segments;
pub mod state;
pub mod whatif;

use std::collections::{BinaryHeap, HashMap};
use std::io::Write;
use std::sync::Arc;

use fragscope_diagnose::{analyze_with_timelines, Analysis, AnalyzeOptions, OnRoles};
use fragscope_snapshot::{Action, FxHashMap, Snapshot, StackId, TraceEvent};
use fragscope_trace::{summarize_from_timelines, BlockLives, Summary};
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
    /// Size budget of the event list of one device, in f64 values ([`EVENT_LEN`] per
    /// trace entry): the whole trace when it fits, else windows around the OOM, the
    /// peaks and the end ([`event_windows`]).
    pub event_values: usize,
    /// Replay the candidate settings on every device, as `analyze --what-if` does
    /// ([`AnalyzeOptions::what_if`]); without it only devices with an OOM are replayed.
    pub what_if: bool,
}

impl Default for ReportOptions {
    fn default() -> Self {
        ReportOptions {
            buckets: 8192,
            top_sites: 12,
            top_allocations: 2000,
            moments: 24,
            state_values: 1_200_000,
            event_values: 150_000,
            what_if: false,
        }
    }
}

impl ReportOptions {
    /// The budgets of one of `parts` devices or files sharing a page: the curves' buckets,
    /// the largest allocations and the state view's values are the page's, divided (with
    /// floors that keep every view usable: 512 buckets, 100 allocations, 30 k values), so
    /// that the page's size does not grow with the number of files or devices.
    pub fn share(&self, parts: usize) -> ReportOptions {
        let p = parts.max(1);
        ReportOptions {
            buckets: (self.buckets / p).max(512.min(self.buckets)),
            top_allocations: (self.top_allocations / p).max(100.min(self.top_allocations)),
            state_values: (self.state_values / p).max(30_000.min(self.state_values)),
            event_values: (self.event_values / p).max(5_000.min(self.event_values)),
            ..*self
        }
    }
}

/// Interned stacks referenced by the page, as indices into its frame-string table.
#[derive(Default)]
pub struct StackTable {
    frames: Vec<String>,
    frame_index: HashMap<String, u32>,
    /// Each stack: frame indices, innermost first.
    stacks: Vec<Vec<u32>>,
    /// Each stack's call site, as every output names it
    /// ([`fragscope_trace::site_of`]).
    sites: Vec<String>,
    by_id: HashMap<StackId, u32>,
    /// Stream ids that an f64 cannot hold exactly (≥ 2^53), as decimal text; the page's
    /// arrays refer to them as −(index + 1) ([`StackTable::stream`]).
    streams: Vec<String>,
}

impl StackTable {
    /// A stream id as the page's arrays hold it: itself when an f64 holds it exactly,
    /// else −(index + 1) into the file's `streams` (raw `cudaStream_t` values are
    /// pointers; a file may hold any integer).
    pub fn stream(&mut self, s: u64) -> f64 {
        if s < 1 << 53 {
            return s as f64;
        }
        let text = s.to_string();
        let i = self.streams.iter().position(|x| *x == text).unwrap_or_else(|| {
            self.streams.push(text);
            self.streams.len() - 1
        });
        -(i as f64) - 1.0
    }

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
        self.sites.push(fragscope_trace::site_of(&snap.frames, Some(id)).site);
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

/// Values in a base64 `Float64Array` ([`encode::f64s`]).
fn f64_count(b64: &str) -> usize {
    let pad = b64.bytes().rev().take_while(|&c| c == b'=').count();
    (b64.len() / 4 * 3).saturating_sub(pad) / 8
}

/// What a device's views show less of, with the budgets `per` (its share of the page),
/// than a page of this device alone would (`full`), in words: only what the sharing
/// actually cut (a short trace loses nothing to fewer buckets).
fn left_out(d: &DeviceData, per: &ReportOptions, full: &ReportOptions) -> Vec<String> {
    let mut out = Vec::new();
    if per.buckets < full.buckets && d.events + 1 > per.buckets {
        out.push(format!(
            "the curves in {} buckets (of {} for a page of its own)",
            per.buckets,
            full.buckets.min(d.events + 1)
        ));
    }
    let drawn = f64_count(&d.allocations) / layout::Life::LEN;
    if per.top_allocations < full.top_allocations && drawn >= per.top_allocations {
        out.push(format!("its {} largest allocations drawn one by one (of {})", drawn, full.top_allocations));
    }
    if per.state_values < full.state_values && !d.state_ops.exact && d.events > 0 {
        let coarse = d.moments.iter().any(|m| m.figures.is_some());
        out.push(format!(
            "the allocator state at {} keyframes{} instead of every event",
            d.moments.len(),
            if coarse { ", small blocks merged," } else { "" }
        ));
    }
    let listed: usize = d.event_list.iter().map(|w| f64_count(&w.entries) / EVENT_LEN).sum();
    if per.event_values < full.event_values && listed < d.events {
        out.push(format!("{listed} of its {} trace entries in the event list", d.events));
    }
    out
}

/// Values (f64) per trace entry of the event list ([`layout::Event`]).
pub const EVENT_LEN: usize = layout::Event::LEN;

/// A run of consecutive trace entries the page lists (see [`event_windows`]).
#[derive(Serialize)]
pub struct EventWindow {
    /// Trace index of the first entry.
    pub first: usize,
    /// Entries ([`layout::Event`] records), base64 `Float64Array`.
    pub entries: String,
}

/// The trace entries of a device listed by the page: every entry when the budget
/// allows, else equal windows centred on the OOM, the two peaks and the end (merged
/// where they overlap), so that the entries around each marked moment can be read.
pub fn event_windows(
    snap: &Snapshot,
    device: i64,
    marks: Option<state::Marks>,
    opts: &ReportOptions,
    table: &mut StackTable,
) -> Vec<EventWindow> {
    let trace = snap.trace(device);
    let n = trace.len();
    if n == 0 {
        return Vec::new();
    }
    let fit = (opts.event_values / EVENT_LEN).max(1);
    let mut ranges: Vec<(usize, usize)> = if n <= fit {
        vec![(0, n)]
    } else {
        let mut centres = vec![n];
        if let Some(m) = marks {
            centres.extend(m.oom);
            centres.extend([m.reserved_peak, m.allocated_peak]);
        }
        let half = fit / centres.len() / 2;
        let mut r: Vec<(usize, usize)> =
            centres.iter().map(|&c| (c.saturating_sub(half + 1), (c + half).min(n))).collect();
        r.sort_unstable();
        r
    };
    // Merge overlapping windows.
    let mut merged: Vec<(usize, usize)> = Vec::new();
    for (a, b) in ranges.drain(..) {
        match merged.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => merged.push((a, b)),
        }
    }
    merged
        .into_iter()
        .map(|(a, b)| {
            let mut v = Vec::with_capacity((b - a) * EVENT_LEN);
            for e in &trace[a..b] {
                let action = Action::ALL.iter().position(|&x| x == e.action).unwrap_or(0);
                layout::Event {
                    action: action as f64,
                    address: e.addr as f64,
                    size: e.size as f64,
                    stream: table.stream(snap.stream(e)),
                    stack: table.index(snap, e.stack) as f64,
                }
                .push_to(&mut v);
            }
            EventWindow { first: a, entries: encode::f64s(&v) }
        })
        .collect()
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
    /// Largest allocations ([`layout::Life`] records: alloc state + 1 to free state, −1
    /// when still live), base64 Float64Array. The timeline draws them stacked, one
    /// polygon each.
    pub allocations: String,
    /// The largest allocations live before the trace begins, as `allocations` (alloc
    /// state 0), see [`initial`].
    pub initial_allocations: String,
    /// Distinct request sizes and how often each was made, for "which requests could
    /// this free block have served": [`layout::RequestCount`] records, base64
    /// Float64Array.
    pub requests: String,
    /// Reserved curves of the replays `analyze` ran (recorded settings first).
    pub whatif: Vec<whatif::WhatIfCurve>,
    /// Trace states of the step boundaries sampled for `leaks`.
    pub leak_boundaries: Vec<usize>,
    /// Live bytes of each leak suspect's call site at those boundaries.
    pub leaks: Vec<leakcurves::LeakCurve>,
    /// The trace entries of the event list ([`event_windows`]).
    pub event_list: Vec<EventWindow>,
    /// The timeline stacked by role ([`rolecurves`]); `None` without a trace.
    pub roles: Option<rolecurves::RoleCurves>,
    /// The largest segments over their lives (the segment timeline, [`segments`]), as
    /// `allocations` is encoded; `segment_count` of them in all.
    pub segments: String,
    pub segment_count: usize,
    /// Each pool apart when the device has private pools ([`pools`]); empty otherwise.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub pools: Vec<pools::PoolBand>,
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
    /// The call site of each stack, named as `analyze` names it.
    pub sites: Vec<String>,
    /// Stream ids too large for the page's f64 arrays, which refer to them as
    /// −(index + 1).
    pub streams: Vec<String>,
    /// What the page's size budget left out of this file (several devices or files
    /// share it), in words; `None` when nothing.
    pub budget_note: Option<String>,
    /// What the comparison of several files reads of this one (from its analysis): the
    /// page's `ranks` ([`fragscope_diagnose::compare_ranks`]).
    #[serde(skip)]
    pub rank: fragscope_diagnose::RankFigures,
    /// `fragscope report --fit CAPACITY`: this file's entry of the `fit` document
    /// (`fragscope.fit/1`'s `files[i]`: per device and card the options, each replayed),
    /// computed by the command and drawn as it is (view 4b); absent without `--fit`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fit: Option<serde_json::Value>,
}

/// Builds one file's report data (summary, analysis, curves, state moments, phases).
///
/// `opts` are the file's budgets (a page of several files gives each its share,
/// [`ReportOptions::share`]); its devices share them.
pub fn file_data(name: &str, example: bool, snap: &Snapshot, opts: &ReportOptions) -> FileData {
    file_data_shared(name, example, snap, opts, None)
}

/// [`file_data`] of one of several files of a page: `page` is the whole page's budgets
/// (`opts` the file's share), for the note that says what the sharing left out.
pub fn file_data_shared(
    name: &str,
    example: bool,
    snap: &Snapshot,
    opts: &ReportOptions,
    page: Option<(&ReportOptions, usize)>,
) -> FileData {
    let ndev = snap.devices().len();
    let per_device = opts.share(ndev);
    let (full, why) = page_budget(opts, page, ndev);
    let mut table = StackTable::default();
    let (ana, drawn, lives_of, mut sum, role_curves) = walk_and_draw(snap, &per_device, &mut table);
    summary_roles(snap, &mut sum, &ana);
    let devices = device_data(snap, &ana, &lives_of, drawn, role_curves);
    let budget_note = budget_note(&devices, &per_device, &full, &why);
    FileData {
        name: name.to_string(),
        example,
        summary: serde_json::to_value(&sum).unwrap_or(serde_json::Value::Null),
        analysis: serde_json::to_value(&ana).unwrap_or(serde_json::Value::Null),
        devices,
        frames: table.frames,
        stacks: table.stacks,
        sites: table.sites,
        streams: table.streams,
        budget_note,
        rank: fragscope_diagnose::RankFigures::of(&ana),
        fit: None,
    }
}

/// The budgets of the whole page the file's share is taken from (`page`, or the file's
/// own `opts` when it is alone), and the start of the note that says who shares them.
fn page_budget(opts: &ReportOptions, page: Option<(&ReportOptions, usize)>, ndev: usize) -> (ReportOptions, String) {
    match page {
        Some((full, files)) if files > 1 => (
            *full,
            format!(
                "The page's size budget is shared by {files} files{}",
                if ndev > 1 { format!(" ({ndev} devices in this one)") } else { String::new() }
            ),
        ),
        _ => (*opts, format!("The page's size budget is shared by this file's {ndev} devices")),
    }
}

/// A device's block lives (from the analysis' walk, or its own), by device.
type LivesOf = FxHashMap<i64, Arc<BlockLives>>;

/// The role buckets of the devices whose analysis gave them ([`role_curves`]), by device.
type RoleCurvesOf = FxHashMap<i64, rolecurves::RoleCurves>;

/// A device's role buckets ([`rolecurves::role_buckets`]) over the analysis' block roles,
/// for a page of `states` states with the curves' buckets `amax`; `None` for a trace of
/// one state or a device the analysis does not have.
fn role_curves(
    snap: &Snapshot,
    ana: &Analysis,
    d: i64,
    lives: &BlockLives,
    states: usize,
    amax: &[usize],
) -> Option<rolecurves::RoleCurves> {
    let a = ana.devices.iter().find(|a| a.device == d).filter(|_| states > 1)?;
    Some(rolecurves::role_buckets(snap, lives, &a.block_roles, states, amax).encode())
}

/// Runs the analysis and draws every device beside it (`opts`: a device's budgets), with
/// the call sites drawn into `table`: the analysis, each device's drawn parts, its block
/// lives, the summary (without its roles: [`summary_roles`]) and the role buckets
/// (made on the analysis' roles thread as soon as it has the roles, [`OnRoles`]).
///
/// `analyze` runs beside the report's other walks of the trace; the curves are drawn in
/// the walk that makes analyze's timeline (one walk for both). Once every device is
/// walked, its curves are finished (their call sites' values, from the walk's block
/// lives) and its state view built here, while the analysis goes on with the leak tests.
fn walk_and_draw(
    snap: &Snapshot,
    opts: &ReportOptions,
    table: &mut StackTable,
) -> (Analysis, Vec<Drawn>, LivesOf, Summary, RoleCurvesOf) {
    let aopts = AnalyzeOptions { what_if: opts.what_if, ..AnalyzeOptions::default() };
    let device_list = snap.devices();
    let (tx, rx) = std::sync::mpsc::channel();
    let (scan_tx, scan_rx) = std::sync::mpsc::channel();
    let devices_scanned = &device_list;
    let ((ana, role_curves_of, sum), drawn, lives_of) = std::thread::scope(|s| {
        let analysis = s.spawn(move || {
            let tx = std::sync::Mutex::new(tx);
            // The role buckets' inputs from each device's walk (its states and its
            // curves' allocated maxima), set before the walk tells the analysis its lives,
            // and the role buckets made from them as soon as the analysis has the roles:
            // on the roles' thread, beside memory_summary's table and attribution on the
            // walk's (this core was idle for ~0.1 s of the report there on the 6.9 M-entry
            // allocator-consistent benchmark file).
            let walked_buckets = std::sync::Mutex::new(FxHashMap::<i64, (usize, Vec<usize>)>::default());
            let made_role_curves = std::sync::Mutex::new(RoleCurvesOf::default());
            let on_roles = |d: i64, lives: &Arc<BlockLives>, roles: &fragscope_trace::Roles| {
                let inputs = walked_buckets.lock().expect("role buckets' inputs").remove(&d);
                if let Some((states, amax)) = inputs.filter(|(states, _)| *states > 1) {
                    let rc = rolecurves::role_buckets(snap, lives, roles, states, &amax).encode();
                    made_role_curves.lock().expect("role buckets").insert(d, rc);
                }
            };
            let timeline_of = |d: i64, on_lives: fragscope_trace::OnLives| {
                // The state view's keyframes are taken in the walk of memory_summary's
                // table that the timeline makes for its peak allocated (one backward walk
                // for both; `None` where that walk cannot serve: then its own).
                let shared = state::SharedWalk::new(snap, d, opts);
                let sink = Some(shared.marks_sink());
                let states = snap.trace(d).len() + 1;
                let mut on_walked = |l: &Arc<BlockLives>, ix: Option<fragscope_trace::LivesIndex>, amax: &[usize]| {
                    walked_buckets.lock().expect("role buckets' inputs").insert(d, (states, amax.to_vec()));
                    on_lives(l, ix)
                };
                let (c, tl) = fragscope_replay::watching(shared.watch(), || {
                    curves::curves_and_timeline_marked(snap, d, opts, aopts.points, sink, Some(&mut on_walked))
                });
                let marks = state::Marks::new(snap, &tl);
                let keyframes = shared.finish(marks);
                // The receiver waits for every device: a failed send cannot happen.
                let _ = tx.lock().expect("curves channel").send((d, c, tl.lives.clone(), marks, keyframes));
                tl
            };
            // What is read from the traces alone, on the analysis' thread beside the
            // first walk (the core the walk does not use has room for it; a thread of its
            // own would share). The scans are sent as soon as they are done: they are
            // drawn once the walk ends. (The summary no longer walks each trace here for
            // its figures beside the timeline's own walk: it reads that walk's, below.)
            let scan_tx = std::sync::Mutex::new(scan_tx);
            let beside = move || {
                let scans: FxHashMap<i64, TraceScan> =
                    devices_scanned.iter().map(|&d| (d, TraceScan::new(snap, d, opts))).collect();
                // Received below, unless that thread has already failed.
                let _ = scan_tx.lock().expect("scan channel").send(scans);
            };
            let on_roles: OnRoles = &on_roles;
            let ana = analyze_with_timelines(snap, &aopts, &timeline_of, Some(&beside), Some(on_roles));
            // A device whose roles' thread did not make them gets them when it is drawn
            // ([`device_data`]).
            let role_curves_of = made_role_curves.into_inner().expect("role buckets");
            // The summary, from the timelines' own first passes (no walk of its own);
            // without its roles: analyze's are the same figures over the same block lives
            // (set by `summary_roles`); without memory_summary's table: the timeline's
            // walk computes it for the peak allocated, and the page draws no other figure
            // of it.
            let timeline_of = |d: i64| ana.devices.iter().find(|a| a.device == d).map(|a| &a.fragmentation.timeline);
            let sum = summarize_from_timelines(snap, &timeline_of);
            (ana, role_curves_of, sum)
        });
        // The analysis walks every device, in this order, one message each (fewer only
        // when its thread ended early: it panicked, and the join below says so).
        let mut walked = FxHashMap::default();
        let mut lives_of = FxHashMap::default();
        for (d, c, lives, marks, keyframes) in rx.iter().take(device_list.len()) {
            let lives = lives.unwrap_or_else(|| Arc::new(BlockLives::replay(snap, d)));
            walked.insert(d, (c, marks, keyframes));
            // Kept for the curves' call sites, the largest allocations and the leak
            // suspects' curves.
            lives_of.insert(d, lives);
        }
        // A device the analysis did not walk (none today): its own walk.
        for &d in &device_list {
            if let std::collections::hash_map::Entry::Vacant(slot) = lives_of.entry(d) {
                let (c, tl) = curves::curves_and_timeline(snap, d, opts, aopts.points);
                let lives = tl.lives.clone().unwrap_or_else(|| Arc::new(BlockLives::replay(snap, d)));
                walked.insert(d, (c, state::Marks::new(snap, &tl), None));
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
        let drawn = draw(snap, opts, parts, walked, &lives_of, table);
        (analysis.join().expect("the analysis thread panicked"), drawn, lives_of)
    });
    (ana, drawn, lives_of, sum, role_curves_of)
}

/// Gives the summary `sum` analyze's roles (as `summary` computes them: without the live
/// set at the OOM, which only `analyze` gives), for every device with a trace.
fn summary_roles(snap: &Snapshot, sum: &mut Summary, ana: &Analysis) {
    for s in &mut sum.devices {
        if let Some(a) = ana.devices.iter().find(|a| a.device == s.device).filter(|_| !snap.trace(s.device).is_empty())
        {
            s.roles = Some(fragscope_trace::DeviceRoles { at_oom: None, ..a.roles.clone() });
        }
    }
}

/// Each drawn device's page data: its drawn parts, with the leak curves, the role
/// buckets and the what-if curves of the analysis `ana` over its block lives.
fn device_data(
    snap: &Snapshot,
    ana: &Analysis,
    lives_of: &LivesOf,
    drawn: Vec<Drawn>,
    mut role_curves_of: RoleCurvesOf,
) -> Vec<DeviceData> {
    let mut devices = Vec::new();
    for (
        d,
        curves,
        allocations,
        initial_allocations,
        requests,
        phases,
        (marks, state, event_list, ((states, amax), segs)),
    ) in drawn
    {
        // The state view was built with the peaks of the walk the analysis took its
        // timeline from, and the trace's OOM entry: the analysis' own.
        debug_assert_eq!(Some(marks), state::Marks::of(snap, d, ana), "device {d}");
        let (moments, moments_note, state_ops) = state;
        let (leak_boundaries, leaks) = leakcurves::curves(snap, d, ana, &lives_of[&d]);
        // The roles of the analysis' blocks, over the same lives, in the curves' buckets
        // (taken beside the drawing, unless the walk kept no lives).
        let roles = role_curves_of.remove(&d).or_else(|| role_curves(snap, ana, d, &lives_of[&d], states, &amax));
        let pools = pools::bands(snap, d, curves.n, curves.states);
        devices.push(DeviceData {
            pools,
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
            whatif: whatif::curves(snap, d, ana),
            leak_boundaries,
            leaks,
            event_list,
            roles,
            segments: segs.0,
            segment_count: segs.1,
        });
    }
    devices
}

/// What the size budget shared with other devices or files (`full`: the page's budgets,
/// `per_device`: a device's share) left out of `devices`, in words after `why`; `None`
/// when nothing.
fn budget_note(devices: &[DeviceData], per_device: &ReportOptions, full: &ReportOptions, why: &str) -> Option<String> {
    let parts: Vec<String> = devices
        .iter()
        .filter_map(|d| {
            let l = left_out(d, per_device, full);
            (!l.is_empty()).then(|| format!("cuda:{} shows {}", d.device, l.join(", ")))
        })
        .collect();
    (!parts.is_empty()).then(|| format!("{why}: {}", parts.join("; ")))
}

/// What is drawn of a device besides its walk's curves: its trace scan (found beside the
/// analysis' walk) and its largest allocations' lives ([`largest_lives`]).
struct Part {
    device: i64,
    largest: Vec<(usize, usize)>,
    scan: TraceScan,
}

/// A walked device's curves as the walk leaves them, the state view's marks, and its
/// keyframes when memory_summary's table walk took them ([`state::SharedWalk`]).
type Walked = (curves::CurvesWalk, state::Marks, Option<state::Walk>);

/// What [`file_data`] draws of a device before its analysis is done.
type Drawn = (
    i64,
    curves::Curves,
    String,
    String,
    String,
    Vec<Phase>,
    (state::Marks, state::StateView, Vec<EventWindow>, ((usize, Vec<usize>), (String, usize))),
);

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
    // The keyframes' coarse records read only the captured states: made on a thread of
    // their own while this one finishes the curves and encodes the allocations.
    let mut keyframes: FxHashMap<i64, Option<state::Walk>> = walked.iter_mut().map(|(d, w)| (*d, w.2.take())).collect();
    let (drawn, mut coarse) = std::thread::scope(|s| {
        let coarse = s.spawn(|| {
            keyframes
                .iter()
                .filter_map(|(d, w)| Some((*d, state::coarse_keyframes(w.as_ref()?))))
                .collect::<FxHashMap<i64, Vec<state::CoarseKeyframe>>>()
        });
        let drawn: Vec<_> = parts
            .into_iter()
            .map(|Part { device: d, largest, scan }| {
                let (c, marks, _) = walked.remove(&d).expect("every device is walked before it is drawn");
                let amax = (c.states(), c.amax().to_vec());
                let (c, sites) = c.finish(snap.trace(d), &lives_of[&d], scan.buckets);
                let curves = c.with_stacks(snap, &sites, table);
                let allocations = encode_allocations(snap, d, largest, table);
                let initial = initial::encode(snap, d, &lives_of[&d], opts.top_allocations, table);
                let segs = segments::encode(snap, d, scan.segments, opts.top_allocations, table);
                (d, curves, allocations, initial, scan.requests, scan.phases, marks, (amax, segs))
            })
            .collect();
        (drawn, coarse.join().expect("the keyframes' thread panicked"))
    });
    drawn
        .into_iter()
        .map(|(d, curves, allocations, initial, requests, phases, marks, amax)| {
            let walk = keyframes.remove(&d).flatten();
            let view = state::moments_from(snap, d, Some(marks), opts, table, walk, coarse.remove(&d));
            let events = event_windows(snap, d, Some(marks), opts, table);
            (d, curves, allocations, initial, requests, phases, (marks, view, events, amax))
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

/// What the page shows of a device that is read from its trace alone, without the
/// block lives: found beside the analysis' walk ([`file_data`]).
struct TraceScan {
    /// Entries of the largest `alloc`s (see [`LargestAllocs`]).
    largest: Vec<usize>,
    /// [`DeviceData::requests`].
    requests: String,
    phases: Vec<Phase>,
    /// The figures of the curves' buckets read from the trace.
    buckets: curves::TraceBuckets,
    /// The segment timeline's lives ([`segments::segment_lives`]).
    segments: Vec<segments::SegmentLife>,
}

impl TraceScan {
    fn new(snap: &Snapshot, device: i64, opts: &ReportOptions) -> Self {
        let trace = snap.trace(device);
        let mut largest = LargestAllocs::new(opts.top_allocations);
        let mut buckets = curves::TraceBuckets::scan(trace.len(), opts);
        let mut segs = segments::SegmentScan::default();
        // One pass over the entries for all three: a long trace is hundreds of MB, read
        // once rather than three times.
        for (i, e) in trace.iter().enumerate() {
            largest.entry(i, e);
            buckets.entry(i, e);
            segs.entry(i, e);
        }
        let (largest, requests) = largest.finish();
        let segments = segs.finish(snap, device);
        TraceScan { largest, requests, phases: phases(snap, device), buckets: buckets.finish(), segments }
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
        let life = lives.traced.get(lives.traced.partition_point(|l| l.alloc() < j)).filter(|l| l.alloc() == j);
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
    let cfg = fragscope_replay::recorded_config(snap);
    let mut v = Vec::with_capacity(lives.len() * layout::Life::LEN);
    let time = |i: usize| match trace.get(i).map(|e| e.time_us) {
        Some(t) if t != fragscope_snapshot::NO_TIME => t as f64,
        _ => f64::NAN,
    };
    for (j, free) in lives {
        let e = &trace[j];
        layout::Life {
            address: e.addr as f64,
            size: fragscope_alloc::rounding::round_size(e.size, &cfg) as f64,
            requested: e.size as f64,
            start: (j + 1) as f64,
            end: if free == usize::MAX { -1.0 } else { free as f64 },
            stack: table.index(snap, e.stack) as f64,
            start_time_us: time(j),
            end_time_us: if free == usize::MAX { f64::NAN } else { time(free - 1) },
        }
        .push_to(&mut v);
    }
    encode::f64s(&v)
}

/// Distinct request sizes of the trace's `alloc` entries with their counts, as the page
/// gets them ([`DeviceData::requests`]).
fn encode_requests(m: FxHashMap<u64, u64>) -> String {
    let mut v: Vec<(u64, u64)> = m.into_iter().collect();
    v.sort_unstable();
    let mut out = Vec::with_capacity(v.len() * layout::RequestCount::LEN);
    for (size, count) in v {
        layout::RequestCount { size: size as f64, count: count as f64 }.push_to(&mut out);
    }
    encode::f64s(&out)
}

const TEMPLATE: &str = include_str!("../assets/report.html");
const CSS: &str = include_str!("../assets/report.css");
/// The page's script: the modules of `assets/js/` bundled by `build.rs`.
const JS: &str = include_str!(concat!(env!("OUT_DIR"), "/report.js"));

/// The whole HTML page for the given files (one or several: ranks side by side).
pub fn render(files: &[FileData]) -> String {
    render_with_diff(files, None)
}

/// [`render`], with the comparison of two runs (`fragscope diff`'s result, A = the first
/// file, B = the second) drawn beside the files.
pub fn render_with_diff(files: &[FileData], diff: Option<&fragscope_diagnose::Diff>) -> String {
    page_string(|w| write_report(w, files, diff).map(|_| ()))
}

/// [`render_with_diff`], written to `out` as it is made (the page's JSON is never a
/// string of its own: ~19 MB on the benchmark files); returns the bytes written.
pub fn write_report(
    out: &mut dyn Write,
    files: &[FileData],
    diff: Option<&fragscope_diagnose::Diff>,
) -> std::io::Result<u64> {
    let title = match files {
        [one] if one.example => "fragscope report: built-in example".to_string(),
        [one] => format!("fragscope report: {}", one.name),
        many => format!("fragscope report: {} files", many.len()),
    };
    let mut counted = Counted { out, n: 0 };
    write_page(&mut counted, &title, files, diff, None)?;
    Ok(counted.n)
}

/// The page of `fragscope predict --report`: the recorded and predicted curves
/// ([`predict`]).
pub fn render_predict(p: &predict::PredictPage) -> String {
    page_string(|w| write_page(w, "fragscope predict: recorded and predicted memory", &[], None, Some(p)))
}

/// A page written by `write` into memory.
fn page_string(write: impl FnOnce(&mut dyn Write) -> std::io::Result<()>) -> String {
    let mut v = Vec::new();
    // Writing into memory fails only where serializing the page does (it cannot: its
    // maps have string or integer keys); the page is then empty JSON, as it was.
    if write(&mut v).is_err() {
        v.clear();
        let _ = fill_template(&mut v, TEMPLATE, "", CSS, "", |w| w.write_all(b"{}"));
    }
    // Every escape replaces ASCII or a whole character: the bytes stay UTF-8.
    String::from_utf8(v).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// A writer that counts what passes through it.
struct Counted<'a> {
    out: &'a mut dyn Write,
    n: u64,
}

impl Write for Counted<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.out.write(buf)?;
        self.n += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

fn write_page(
    out: &mut dyn Write,
    title: &str,
    files: &[FileData],
    diff: Option<&fragscope_diagnose::Diff>,
    predict: Option<&predict::PredictPage>,
) -> std::io::Result<()> {
    #[derive(Serialize)]
    struct Page<'a> {
        schema: &'static str,
        version: &'static str,
        files: &'a [FileData],
        diff: Option<&'a fragscope_diagnose::Diff>,
        /// Several files compared (the median, the outliers and their call sites), for
        /// the page's table of files; only with several files.
        #[serde(skip_serializing_if = "Option::is_none")]
        ranks: Option<fragscope_diagnose::RankComparison>,
        #[serde(skip_serializing_if = "Option::is_none")]
        predict: Option<&'a predict::PredictPage>,
    }
    let ranks = (files.len() > 1).then(|| {
        let each: Vec<(&str, Result<&fragscope_diagnose::RankFigures, &str>)> =
            files.iter().map(|f| (f.name.as_str(), Ok(&f.rank))).collect();
        fragscope_diagnose::compare_ranks(&each)
    });
    let page = Page { schema: SCHEMA, version: env!("CARGO_PKG_VERSION"), files, diff, ranks, predict };
    let js = JS.replace("</script", "<\\/script");
    fill_template(out, TEMPLATE, &html_escape(title), CSS, &js, |w| {
        let mut data = ScriptData::new(w);
        serde_json::to_writer(&mut data, &page)?;
        data.finish()
    })
}

/// The page from its template, each `{{NAME}}` replaced once, in one pass over the
/// template only: a value that contains `{{DATA}}` or `{{JS}}` (a file name, a frame) is
/// never itself searched for placeholders. `{{DATA}}` is what `data` writes (the page's
/// JSON, through [`ScriptData`]).
fn fill_template(
    out: &mut dyn Write,
    template: &str,
    title: &str,
    css: &str,
    js: &str,
    data: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let mut data = Some(data);
    let mut rest = template;
    while let Some(at) = rest.find("{{") {
        out.write_all(&rest.as_bytes()[..at])?;
        let tail = &rest[at..];
        let (value, key) = [("{{TITLE}}", title), ("{{CSS}}", css), ("{{JS}}", js), ("{{DATA}}", "")]
            .into_iter()
            .find(|(k, _)| tail.starts_with(k))
            .map_or(("{{", "{{"), |(k, v)| (v, k));
        // The page's one `{{DATA}}` (a second would be left empty).
        let write = if key == "{{DATA}}" { data.take() } else { None };
        match write {
            Some(write) => write(out)?,
            None => out.write_all(value.as_bytes())?,
        }
        rest = &tail[key.len()..];
    }
    out.write_all(rest.as_bytes())
}

/// JSON text made safe inside `<script type="application/json">`: in the HTML
/// script-data state `</script` ends the element and `<!--` followed by `<script` makes
/// the parser look for two `</script>`s (the page then never loads), so every `<`, `>`
/// and `&` is written as its JSON `\u` escape, as are U+2028 and U+2029 (line terminators
/// for older JavaScript parsers). JSON's syntax uses none of them outside strings, and
/// inside a string the escape reads back as the same character.
pub fn script_data(json: &str) -> String {
    let mut data = ScriptData::new(Vec::with_capacity(json.len() + json.len() / 64));
    // Writing into memory does not fail.
    let _ = data.write_all(json.as_bytes()).and_then(|_| data.finish());
    String::from_utf8(data.out).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// [`script_data`] as a writer: the JSON written through it reaches `out` made safe, in
/// whatever pieces it comes (a U+2028 or U+2029 split between two writes is held back
/// until its last byte comes).
struct ScriptData<W: Write> {
    out: W,
    /// The first bytes (E2, or E2 80) of what may be a U+2028 or U+2029 whose rest is in
    /// the next write, and how many.
    held: ([u8; 2], usize),
}

/// The escape of the character that starts `b` when it is one to escape, and its length
/// in bytes; `None` when it is not (or `b` ends before it is known: see [`is_line_start`]).
fn escape_at(b: &[u8]) -> Option<(&'static str, usize)> {
    match b {
        [b'<', ..] => Some(("\\u003c", 1)),
        [b'>', ..] => Some(("\\u003e", 1)),
        [b'&', ..] => Some(("\\u0026", 1)),
        // U+2028 and U+2029 are E2 80 A8 and E2 80 A9 in UTF-8.
        [0xE2, 0x80, 0xA8, ..] => Some(("\\u2028", 3)),
        [0xE2, 0x80, 0xA9, ..] => Some(("\\u2029", 3)),
        _ => None,
    }
}

/// Whether `b` (shorter than three bytes) may be the start of U+2028 or U+2029.
fn is_line_start(b: &[u8]) -> bool {
    matches!(b, [0xE2] | [0xE2, 0x80])
}

impl<W: Write> ScriptData<W> {
    fn new(out: W) -> Self {
        ScriptData { out, held: ([0; 2], 0) }
    }

    /// Writes the bytes held back (they did not become an escape).
    fn finish(&mut self) -> std::io::Result<()> {
        let (h, n) = std::mem::take(&mut self.held);
        self.out.write_all(&h[..n])
    }
}

impl<W: Write> Write for ScriptData<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.write_all(buf)?;
        Ok(buf.len())
    }

    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        let mut b = buf;
        if self.held.1 > 0 {
            // The held bytes and what follows them: an escape, still a start, or neither.
            let (h, n) = self.held;
            let take = (3 - n).min(b.len());
            let mut seq = [0u8; 3];
            seq[..n].copy_from_slice(&h[..n]);
            seq[n..n + take].copy_from_slice(&b[..take]);
            let seq = &seq[..n + take];
            if let Some((esc, _)) = escape_at(seq) {
                self.out.write_all(esc.as_bytes())?;
                b = &b[take..];
            } else if is_line_start(seq) {
                self.held.0[..seq.len()].copy_from_slice(seq);
                self.held.1 = seq.len();
                return Ok(());
            } else {
                self.out.write_all(&h[..n])?;
            }
            self.held.1 = 0;
        }
        /// Bytes looked at together: most of the page is base64 text, with nothing to
        /// escape; a block's test compiles to a few vector comparisons, where a test per
        /// byte was ~2 % of the report's CPU.
        const BLOCK: usize = 32;
        let mut from = 0;
        let mut i = 0;
        while i < b.len() {
            if let Some(block) = b.get(i..i + BLOCK) {
                let any =
                    block.iter().fold(false, |any, &c| any | (c == b'<') | (c == b'>') | (c == b'&') | (c == 0xE2));
                if !any {
                    i += BLOCK;
                    continue;
                }
            }
            if let Some((esc, len)) = escape_at(&b[i..]) {
                self.out.write_all(&b[from..i])?;
                self.out.write_all(esc.as_bytes())?;
                i += len;
                from = i;
            } else if b.len() - i < 3 && is_line_start(&b[i..]) {
                // The write ends in what may be the start of U+2028 or U+2029.
                self.out.write_all(&b[from..i])?;
                self.held.0[..b.len() - i].copy_from_slice(&b[i..]);
                self.held.1 = b.len() - i;
                return Ok(());
            } else {
                i += 1;
            }
        }
        self.out.write_all(&b[from..])
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
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

    /// Strings that have broken or could break a page: the script-data state's escapes,
    /// line terminators, the template's own placeholders.
    pub(crate) const HOSTILE: &[&str] = &[
        "<!--<script>",
        "</script><script>document.title='pwned'</script>",
        "</SCRIPT >",
        "]]>&amp;&lt;",
        "a\u{2028}b\u{2029}c",
        "{{DATA}}{{JS}}{{CSS}}{{TITLE}}",
        "$& $' $` $1",
        "\"'\\\u{0}\u{202e}\u{1F600}",
        "__proto__",
    ];

    #[test]
    fn script_data_escapes_what_the_html_parser_reads_and_reads_back_the_same() {
        for s in HOSTILE {
            let json = serde_json::to_string(&serde_json::json!({ "k": s, "v": [s, s] })).unwrap();
            let safe = script_data(&json);
            for bad in ["<", ">", "&", "\u{2028}", "\u{2029}"] {
                assert!(!safe.contains(bad), "{s:?}: {bad:?} left in {safe}");
            }
            let back: serde_json::Value = serde_json::from_str(&safe).unwrap();
            assert_eq!(back["k"], *s, "{s:?}");
            assert_eq!(back["v"][1], *s, "{s:?}");
        }
    }

    /// [`script_data`] as it was before it looked at blocks of bytes: a test per byte.
    fn script_data_reference(json: &str) -> String {
        let b = json.as_bytes();
        let mut out = String::new();
        let mut from = 0;
        for (i, &c) in b.iter().enumerate() {
            let esc = match c {
                b'<' => "\\u003c",
                b'>' => "\\u003e",
                b'&' => "\\u0026",
                0xE2 if b.get(i + 1) == Some(&0x80) && b.get(i + 2) == Some(&0xA8) => "\\u2028",
                0xE2 if b.get(i + 1) == Some(&0x80) && b.get(i + 2) == Some(&0xA9) => "\\u2029",
                _ => continue,
            };
            out.push_str(&json[from..i]);
            out.push_str(esc);
            from = if c == 0xE2 { i + 3 } else { i + 1 };
        }
        out.push_str(&json[from..]);
        out
    }

    /// Long texts with the characters to escape (and others that start like U+2028) at
    /// every offset of a block, alone or in runs: the bytes of the test per byte.
    #[test]
    fn script_data_by_blocks_gives_the_bytes_of_a_test_per_byte() {
        let mut rng = Rng(21);
        let pieces = ["<", ">", "&", "\u{2028}", "\u{2029}", "\u{2027}", "\u{20ac}", "é", "a", "bc", "QUJD"];
        for round in 0..300 {
            let mut text = "x".repeat(rng.below(70));
            for _ in 0..rng.below(12) {
                text.push_str(pieces[rng.below(pieces.len())]);
                text.push_str(&"y".repeat(rng.below(40)));
            }
            let json = serde_json::to_string(&text).unwrap();
            let want = script_data_reference(&json);
            assert_eq!(script_data(&json), want, "round {round}: {json}");
            let page = filled("<p>{{DATA}}</p>", "", "", "", &json);
            assert_eq!(page, format!("<p>{want}</p>"), "round {round}");
            // Through the writer in pieces of every size, cut anywhere (inside a
            // U+2028 too): the same bytes.
            let mut data = ScriptData::new(Vec::new());
            let mut rest = json.as_bytes();
            while !rest.is_empty() {
                let (piece, tail) = rest.split_at((1 + rng.below(9)).min(rest.len()));
                data.write_all(piece).unwrap();
                rest = tail;
            }
            data.finish().unwrap();
            assert_eq!(String::from_utf8(data.out).unwrap(), want, "round {round}: in pieces");
        }
    }

    /// [`fill_template`] into a string, with `json` as the page's data.
    fn filled(template: &str, title: &str, css: &str, js: &str, json: &str) -> String {
        let mut out = Vec::new();
        fill_template(&mut out, template, title, css, js, |w| {
            let mut data = ScriptData::new(w);
            data.write_all(json.as_bytes())?;
            data.finish()
        })
        .unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn the_template_is_filled_in_one_pass() {
        let page = filled("<t>{{TITLE}}</t>{{CSS}}|{{JS}}|{{DATA}}|{{OTHER}}", "{{DATA}}", "c{{JS}}", "j", "d");
        assert_eq!(page, "<t>{{DATA}}</t>c{{JS}}|j|d|{{OTHER}}");
    }

    /// The page written to a writer is the page [`render`] gives, and its length is the
    /// count [`write_report`] returns.
    #[test]
    fn the_page_written_is_the_page_rendered() {
        let path = fragscope_testdata::real_file("effdl-course-liger-ce.pickle").expect("in the repository");
        let snap = fragscope_snapshot::read_path(&path).unwrap();
        let data = file_data("liger<ce>&.pickle", false, &snap, &ReportOptions::default());
        let files = std::slice::from_ref(&data);
        let mut out = Vec::new();
        let n = write_report(&mut out, files, None).unwrap();
        assert_eq!(n, out.len() as u64);
        assert_eq!(String::from_utf8(out).unwrap(), render(files));
        assert!(render(files).contains("\"schema\""), "the page has its data");
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
                trace.push(TraceEvent::new(action, addr, size));
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
