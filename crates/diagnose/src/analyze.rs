//! `fragscope analyze`: every finding about one snapshot, most important first.
//!
//! Per device:
//! 1. the OOM ([`crate::oom`]): verdict, state at the failure, measured fixes;
//! 2. fragmentation over time ([`fragscope_trace::timeline`]): the allocated / active / requested /
//!    reserved curves, peak fragmentation (1 − peak allocated / peak reserved), the
//!    free space at the reserved peak (rebuilt by the backward walk of §10.12), and
//!    pinned segments by call site ([`fragscope_trace::attribute`]);
//! 3. leak suspects ([`crate::leaks`]);
//! 4. who holds the memory at the allocated and the reserved peaks, by call site and by
//!    `record_function` scope ([`fragscope_trace::attribute`]);
//! 5. recommended settings ([`crate::recommend`]), measured by replay.
//!
//! Replays are the expensive part: they run only for a device with a recorded OOM (the
//! fixes and the recommendations share them), or for every device with
//! [`AnalyzeOptions::what_if`]. Everything else is a few O(events) walks; the trace's
//! bookkeeping is replayed once per device, by the timeline, which keeps every block's
//! life ([`fragscope_trace::BlockLives`]) for attribution and leak detection.

use serde::Serialize;
use std::sync::Arc;

use fragscope_snapshot::{Snapshot, SourceFormat};

use crate::imbalance::{imbalance, Imbalance};
use crate::leaks::{self, LeakSteps, LeakSuspect};
use crate::oom::{self, first_oom, OomFinding, OomLead, OomOptions, StateFigures};
use crate::recommend::{self, Era, Recommendations};
use fragscope_alloc::format_size as fs;
use fragscope_replay as replay;
use fragscope_trace::{
    attribute, describe_role_bytes, device_roles_from, device_roles_prepared, role_bytes_at, timeline_with_lives_then,
    AttributionOptions, BlockLives, DeviceAttribution, DeviceRoles, DeviceTimeline, LivesIndex, OnLives,
    PeakAttribution, PinnedSegments, ReservedSource, Role, Roles, Steps, TimelineOptions, DEFAULT_POINTS,
};

/// Schema name of `fragscope analyze --json`.
pub const SCHEMA: &str = "fragscope.analyze/2";

/// Options of [`analyze`].
#[derive(Clone, Copy, Debug)]
pub struct AnalyzeOptions {
    /// Call sites / scopes / suspects listed per table.
    pub top: usize,
    /// Replay candidate settings on every device, not only on devices with an OOM.
    pub what_if: bool,
    /// Threads for replays and independent analyses.
    pub threads: usize,
    /// Points of the downsampled curves.
    pub points: usize,
}

impl Default for AnalyzeOptions {
    fn default() -> Self {
        AnalyzeOptions { top: 10, what_if: false, threads: 2, points: DEFAULT_POINTS }
    }
}

/// One line of the findings list.
#[derive(Clone, Debug, Serialize)]
pub struct Finding {
    pub kind: FindingKind,
    pub severity: Severity,
    pub headline: String,
}

/// What a finding is about (`"oom"`, `"fragmentation"`, ... in JSON), in section order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FindingKind {
    Oom,
    Fragmentation,
    PinnedSegments,
    Leak,
    Peak,
    Advice,
    Recommendation,
    /// One device holding far more than its peers ([`mod@crate::imbalance`]); a file-level finding.
    DeviceImbalance,
}

/// How much a finding matters (`"high"`, `"medium"`, `"info"` in JSON and text); ordered
/// most important first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    High,
    Medium,
    Info,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::High => "high",
            Severity::Medium => "medium",
            Severity::Info => "info",
        }
    }
}

impl std::fmt::Display for Severity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Fragmentation over time.
#[derive(Clone, Debug, Serialize)]
pub struct FragmentationFindings {
    /// Curves, peaks, `peak_fragmentation`, `fragmentation_at_reserved_peak`, series.
    pub timeline: DeviceTimeline,
    /// Free space at the reserved peak (backward walk); `null` when it could not be rebuilt.
    pub at_reserved_peak: Option<StateFigures>,
    pub at_reserved_peak_note: Option<String>,
    pub pinned_segments: PinnedSegments,
}

/// Who holds the memory at the peaks.
#[derive(Clone, Debug, Serialize)]
pub struct Peaks {
    pub allocated_peak: PeakAttribution,
    pub reserved_peak: PeakAttribution,
}

/// Everything about one device.
#[derive(Clone, Debug, Serialize)]
pub struct DeviceAnalysis {
    pub device: i64,
    /// Headlines, most important first.
    pub findings: Vec<Finding>,
    pub oom: Option<OomFinding>,
    /// `1 − peak allocated / peak reserved`; `null` when nothing was reserved.
    pub peak_fragmentation: Option<f64>,
    pub fragmentation: FragmentationFindings,
    /// Memory that outlives its step and grows across steps ([`crate::leaks`]).
    pub leak_suspects: Vec<LeakSuspect>,
    /// The steps the leak test compared, and whether leaks can be told from the trace.
    pub leak_steps: LeakSteps,
    /// Training steps and their phases, from evidence ([`fragscope_trace::steps`]).
    pub steps: Steps,
    /// Memory by role ([`fragscope_trace::DeviceRoles`]), with the live set at the OOM by role when the
    /// trace has one.
    pub roles: DeviceRoles,
    pub peaks: Peaks,
    pub recommendations: Recommendations,
    /// Role-level what-ifs ([`crate::role_whatif`]: ZeRO-1/2 sharding,
    /// `zero_grad(set_to_none=True)`, checkpointing), a model of each change replayed;
    /// with `--what-if` or at an exhaustion OOM, else `null`.
    pub role_what_if: Option<crate::role_whatif::RoleRows>,
    /// Each block's role, for callers that draw the roles over time (the report's
    /// timeline stacked by role); not part of `--json`.
    #[serde(skip)]
    pub block_roles: Arc<Roles>,
}

/// The analysis of a file.
#[derive(Clone, Debug, Serialize)]
pub struct Analysis {
    /// `"dict"`, `"segment_list"` or `"kineto"`.
    pub format: SourceFormat,
    pub era: Era,
    /// Recorded `PYTORCH_CUDA_ALLOC_CONF` (canonical; `null` before 2.3 files).
    pub recorded_config: Option<String>,
    /// How the file was recorded, one line each (the snapshot's `notes.recording`:
    /// `skip_actions`, history never switched on, one `MemPool`, a warm start); absent from
    /// the JSON when empty. The text prints them before the analysis (`Recording: ...`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub recording: Vec<String>,
    /// The file's first OOM ([`crate::oom::first_oom`]): the device and entry every front end
    /// leads with; `null` without one.
    pub oom: Option<OomLead>,
    /// Findings about the file as a whole, before any device's: device imbalance
    /// ([`mod@crate::imbalance`]).
    pub findings: Vec<Finding>,
    /// One device holding far more than its peers, when one does.
    pub device_imbalance: Option<Imbalance>,
    pub devices: Vec<DeviceAnalysis>,
}

impl Analysis {
    /// The devices in the order a reader should meet them: the OOM's device first, then the
    /// others ascending.
    pub fn devices_oom_first(&self) -> Vec<&DeviceAnalysis> {
        let first = self.oom.as_ref().map(|o| o.device);
        let mut v: Vec<&DeviceAnalysis> = self.devices.iter().collect();
        v.sort_by_key(|d| Some(d.device) != first);
        v
    }
}

/// Analyses every device of `snap`.
pub fn analyze(snap: &Snapshot, opts: &AnalyzeOptions) -> Analysis {
    analyze_inner(snap, opts, None, None, None)
}

/// A device's timeline made by the caller (see [`analyze_with_timelines`]); the caller
/// tells the second argument the timeline's block lives as soon as its walk has made them
/// ([`fragscope_trace::OnLives`]), or not at all.
pub type TimelineOf<'a> = &'a (dyn Fn(i64, OnLives<'_>) -> DeviceTimeline + Sync);

/// Work of the caller's, run once beside the first device's walk (see
/// [`analyze_with_timelines`]).
pub type Beside<'a> = &'a (dyn Fn() + Sync);

/// Told a device's block roles as soon as they are made, on the thread that made them,
/// with the lives they were read from (see [`analyze_with_timelines`]): for a front end
/// whose own work on the roles (the report's role buckets) can then run beside the rest
/// of the analysis (memory_summary's table, attribution) instead of after it.
pub type OnRoles<'a> = &'a (dyn Fn(i64, &Arc<BlockLives>, &Roles) + Sync);

/// [`analyze`], with each device's timeline made by `timeline_of(device)`, which must
/// return what [`fragscope_trace::timeline`] returns with `opts.points`: for a front end that
/// walks the trace itself and gets the timeline from the same walk
/// ([`fragscope_trace::timeline_walk`]; the HTML report) instead of walking it twice. When the
/// timeline comes without its [`DeviceTimeline::lives`], attribution and leak detection
/// replay the trace for them.
///
/// `beside`, when given, runs once on the thread that works beside the first device's
/// walk (after the iterations and the era; on this thread when there are no devices or
/// no threads to spare): the front end's own look at the trace, kept off the walk's core.
///
/// `on_roles`, when given, is told each device's block roles as soon as they are made
/// ([`OnRoles`]): the same [`DeviceAnalysis::block_roles`] the analysis returns.
pub fn analyze_with_timelines(
    snap: &Snapshot,
    opts: &AnalyzeOptions,
    timeline_of: TimelineOf,
    beside: Option<Beside>,
    on_roles: Option<OnRoles>,
) -> Analysis {
    analyze_inner(snap, opts, Some(timeline_of), beside, on_roles)
}

fn analyze_inner(
    snap: &Snapshot,
    opts: &AnalyzeOptions,
    timeline_of: Option<TimelineOf>,
    beside: Option<Beside>,
    on_roles: Option<OnRoles>,
) -> Analysis {
    // Segments grouped by device once: every per-device step reads only its own.
    snap.with_device_index(|snap| analyze_indexed(snap, opts, timeline_of, FileWork::new(snap, beside, on_roles)))
}

fn analyze_indexed(
    snap: &Snapshot,
    opts: &AnalyzeOptions,
    timeline_of: Option<TimelineOf>,
    work: FileWork,
) -> Analysis {
    // One look at every trace entry for the era, shared by the devices; with threads to
    // spare it is taken on the thread that finds the first device's iterations, beside
    // its walk (only the recommendations need it).
    let devices: Vec<DeviceAnalysis> =
        snap.devices().into_iter().map(|d| analyze_device_inner(snap, d, opts, &work, timeline_of)).collect();
    work.beside_walk();
    // The lead is a device's OOM finding: without any, no look for the first `oom` entry
    // (a pass over every trace entry).
    let oom = devices
        .iter()
        .any(|d| d.oom.is_some())
        .then(|| first_oom(snap))
        .flatten()
        .and_then(|(dev, _)| devices.iter().find(|d| d.device == dev))
        .and_then(|d| d.oom.as_ref())
        .map(OomLead::of);
    let ooms: Vec<i64> = devices.iter().filter(|d| d.oom.is_some()).map(|d| d.device).collect();
    let device_imbalance = imbalance(&devices.iter().map(|d| &d.fragmentation.timeline).collect::<Vec<_>>(), &ooms);
    let findings = device_imbalance
        .iter()
        .map(|i| Finding {
            kind: FindingKind::DeviceImbalance,
            severity: if i.oom { Severity::High } else { Severity::Medium },
            headline: i.headline(),
        })
        .collect();
    Analysis {
        format: snap.format,
        recorded_config: snap.recorded_settings().map(|_| replay::recorded_config(snap).to_conf_string()),
        recording: snap.notes.recording.clone(),
        oom,
        findings,
        device_imbalance,
        devices,
        era: work.era().clone(),
    }
}

/// The file's [`Era`], inferred on first use (by whichever thread asks first), and the
/// caller's work: to run beside the first walk, and to be told each device's roles.
struct FileWork<'a> {
    snap: &'a Snapshot,
    era: std::sync::OnceLock<Era>,
    beside: Option<Beside<'a>>,
    beside_done: std::sync::Once,
    on_roles: Option<OnRoles<'a>>,
}

impl<'a> FileWork<'a> {
    fn new(snap: &'a Snapshot, beside: Option<Beside<'a>>, on_roles: Option<OnRoles<'a>>) -> Self {
        FileWork { snap, era: std::sync::OnceLock::new(), beside, beside_done: std::sync::Once::new(), on_roles }
    }

    /// Tells the caller device `device`'s block roles ([`OnRoles`]).
    fn roles_made(&self, device: i64, lives: &Arc<BlockLives>, roles: &Roles) {
        if let Some(f) = self.on_roles {
            f(device, lives, roles);
        }
    }

    fn era(&self) -> &Era {
        self.era.get_or_init(|| recommend::infer_era(self.snap))
    }

    /// The era, then the caller's work (once): what a thread beside a walk does.
    fn beside_walk(&self) {
        self.era();
        if let Some(f) = self.beside {
            self.beside_done.call_once(f);
        }
    }
}

/// One device's analysis: its parts, on threads beside this one ([`parts_beside`]) or in
/// turn ([`parts_in_turn`]), then the live set at the OOM by role, the recommendations, the
/// role what-ifs and the headline findings.
fn analyze_device_inner(
    snap: &Snapshot,
    device: i64,
    opts: &AnalyzeOptions,
    work: &FileWork,
    timeline_of: Option<TimelineOf>,
) -> DeviceAnalysis {
    let parts = if opts.threads.max(1) > 1 {
        parts_beside(snap, device, opts, work, timeline_of)
    } else {
        parts_in_turn(snap, device, opts, work, timeline_of)
    };
    let DeviceParts { mut timeline, attribution: attr, at_peak, at_peak_note, leaks: lk, oom: oom_f, quick, roles: rl } =
        parts;
    let (mut device_roles, steps, block_roles, lives) = rl;
    if let Some(f) = &oom_f {
        // The state before the `oom` entry: what was live when the request failed.
        let v = role_bytes_at(snap, &lives, &block_roles, f.event_index);
        device_roles.at_oom = Some(Role::ALL.iter().map(|r| (r.as_str(), v[*r as usize])).collect());
    }
    drop(lives);
    // The lives are for this function only: the analysis does not carry them.
    timeline.lives = None;

    let recommendations = match &oom_f {
        Some(f) => recommendations_at_oom(device, work.era(), f),
        None => quick.unwrap_or_else(|| recommendations_without_oom(snap, device, opts, work)),
    };
    let role_what_if = role_what_if(snap, device, opts, oom_f.as_ref());

    let frag = FragmentationFindings {
        timeline,
        at_reserved_peak: at_peak,
        at_reserved_peak_note: at_peak_note,
        pinned_segments: attr.pinned_segments,
    };
    let mut leak_suspects = lk.suspects;
    let leak_steps = lk.steps;
    leak_suspects.truncate(opts.top);
    let mut d = DeviceAnalysis {
        device,
        findings: Vec::new(),
        oom: oom_f,
        peak_fragmentation: frag.timeline.peak_fragmentation,
        fragmentation: frag,
        leak_suspects,
        leak_steps,
        steps,
        roles: device_roles,
        block_roles: Arc::new(block_roles),
        peaks: Peaks { allocated_peak: attr.allocated_peak, reserved_peak: attr.reserved_peak },
        recommendations,
        role_what_if,
    };
    d.findings = findings(&d);
    d
}

/// The parts of one device's analysis, before they are put together.
struct DeviceParts {
    /// The timeline, with the lives of every block when its walk kept them.
    timeline: DeviceTimeline,
    /// Attribution at the timeline's peaks, and the free space at the reserved peak (or
    /// why it is unknown).
    attribution: DeviceAttribution,
    at_peak: Option<StateFigures>,
    at_peak_note: Option<String>,
    leaks: leaks::DeviceLeaks,
    /// The OOM, with its replays (only for a device whose trace has an `oom` entry).
    oom: Option<OomFinding>,
    /// The recommendations, when they were taken beside the leak tests (no OOM, no
    /// `--what-if`: nothing to replay).
    quick: Option<Recommendations>,
    /// Memory by role, the steps and each block's role they were read from, and the lives.
    roles: (DeviceRoles, Steps, Roles, Arc<BlockLives>),
}

/// The parts on two threads besides this one: the iterations (and the era, and the
/// caller's work) beside the timeline walk, then the roles and the leak tests beside
/// attribution; the OOM replays last, so that they do not compete with the cheap parts
/// for the cores (they use `threads` threads themselves).
fn parts_beside(
    snap: &Snapshot,
    device: i64,
    opts: &AnalyzeOptions,
    work: &FileWork,
    timeline_of: Option<TimelineOf>,
) -> DeviceParts {
    std::thread::scope(|s| {
        // The iterations (no walk of the lives) beside the timeline walk, then the
        // leak tests beside attribution.
        let (it_tx, it_rx) = std::sync::mpsc::sync_channel(1);
        let h_it = s.spawn(move || {
            // Sent as soon as found: the leak tests start when the walk ends, even if
            // the work below is not done. With the steps, what else the roles read from
            // the trace alone (rule 8's passes), here beside the walk rather than on the
            // roles' thread after it.
            let prep = fragscope_trace::roles_prep(snap, device);
            let _ = it_tx.send(prep);
            // The era (a look at every entry) and the caller's work too, here rather
            // than on threads of their own: one helper beside the walk keeps the
            // walk's core to itself.
            work.beside_walk();
        });
        // The roles, then the leak tests (they read the roles: their evidence), start as
        // soon as the timeline's walk has made the lives, beside the rest of the timeline
        // (memory_summary's table, a backward walk) and then beside attribution. On a
        // 6.9 M-entry trace that table was 0.15–0.2 s of the report with one core idle.
        let (lives_tx, lives_rx) = std::sync::mpsc::sync_channel::<(Arc<BlockLives>, Option<LivesIndex>)>(1);
        let h_roles = s.spawn(move || {
            let (lives, index) = lives_rx.recv().ok()?;
            // No iterations only when that thread panicked: the caller joins it.
            let mut prep = it_rx.recv().ok()?;
            let (r, rr) = device_roles_prepared(snap, &lives, &mut prep, index);
            let st = prep.steps;
            let lk = leaks::leaks_device_with(snap, device, &st, &lives, Some(&rr));
            // The caller's work on the roles here too, beside memory_summary's table and
            // attribution on the walk's thread (this core was idle for their last part).
            work.roles_made(device, &lives, &rr);
            Some(((r, st, rr, lives), lk))
        });
        let mut told = false;
        let tl = device_timeline(snap, device, opts, timeline_of, &mut |l: &Arc<BlockLives>, index| {
            told = lives_tx.send((Arc::clone(l), index)).is_ok();
        });
        if !told {
            // A timeline without its lives (or a caller that did not tell them): a replay.
            let _ = lives_tx.send((lives_of(snap, device, &tl), None));
        }
        drop(lives_tx);
        let (attribution, at_peak, at_peak_note) = attribution_at_peaks(snap, device, opts, &tl);
        // Without an OOM entry (and without --what-if) nothing is replayed: the
        // recommendations are a look at the trace, taken while the leak tests run.
        // (`oom::oom_finding` makes a finding exactly for the trace's first `oom` entry.)
        let quick =
            (!opts.what_if && tl.first_oom.is_none()).then(|| recommendations_without_oom(snap, device, opts, work));
        let (roles, leaks) = match h_roles.join().expect("roles thread") {
            Some(parts) => parts,
            // Its steps never came: the steps thread's panic, here.
            None => std::panic::resume_unwind(h_it.join().unwrap_err()),
        };
        // The OOM replays start once the cheap parts are done, so they do not
        // compete with them for the cores (they use `threads` threads themselves).
        let oom = if quick.is_some() { None } else { oom_with_replays(snap, device, opts, work) };
        DeviceParts { timeline: tl, attribution, at_peak, at_peak_note, leaks, oom, quick, roles }
    })
}

/// The parts one after the other, on this thread (one thread to use).
fn parts_in_turn(
    snap: &Snapshot,
    device: i64,
    opts: &AnalyzeOptions,
    work: &FileWork,
    timeline_of: Option<TimelineOf>,
) -> DeviceParts {
    let tl = device_timeline(snap, device, opts, timeline_of, &mut |_, _| {});
    let lives = lives_of(snap, device, &tl);
    let st = fragscope_trace::steps(snap, device);
    let (r, rr) = device_roles_from(snap, &lives, &st);
    let leaks = leaks::leaks_device_with(snap, device, &st, &lives, Some(&rr));
    work.roles_made(device, &lives, &rr);
    let (attribution, at_peak, at_peak_note) = attribution_at_peaks(snap, device, opts, &tl);
    let oom = oom_with_replays(snap, device, opts, work);
    DeviceParts { timeline: tl, attribution, at_peak, at_peak_note, leaks, oom, quick: None, roles: (r, st, rr, lives) }
}

/// The device's timeline: the caller's, else a walk that keeps the lives of every block
/// ([`fragscope_trace::BlockLives`]): attribution and leak detection read them instead of
/// walking the trace again.
fn device_timeline(
    snap: &Snapshot,
    device: i64,
    opts: &AnalyzeOptions,
    timeline_of: Option<TimelineOf>,
    on_lives: OnLives,
) -> DeviceTimeline {
    match timeline_of {
        Some(f) => f(device, on_lives),
        None => timeline_with_lives_then(snap, device, &TimelineOptions { points: opts.points.max(1) }, on_lives),
    }
}

/// The lives the timeline kept, else a replay of the trace for them.
fn lives_of(snap: &Snapshot, device: i64, tl: &DeviceTimeline) -> Arc<BlockLives> {
    tl.lives.clone().unwrap_or_else(|| Arc::new(BlockLives::replay(snap, device)))
}

/// Attribution at the timeline's peaks, and the free space at the reserved peak (backward
/// walk; with why it is unknown when the state cannot be rebuilt or no segments were
/// recorded).
fn attribution_at_peaks(
    snap: &Snapshot,
    device: i64,
    opts: &AnalyzeOptions,
    tl: &DeviceTimeline,
) -> (DeviceAttribution, Option<StateFigures>, Option<String>) {
    let attr = attribute(snap, tl, &AttributionOptions { top: opts.top });
    let (at_peak, note) = if tl.reserved_source == ReservedSource::Segments && tl.peak_reserved.bytes > 0 {
        match oom::allocator_state_at(snap, device, tl.peak_reserved.event_index) {
            Ok(st) => (Some(oom::state_figures(&st, None)), None),
            Err(e) => (None, Some(format!("free space at the reserved peak unknown: {e}"))),
        }
    } else {
        (None, Some("no segments recorded: free space unknown".to_string()))
    };
    (attr, at_peak, note)
}

/// The OOM finding (only for a device whose trace has an `oom` entry), with its replays of
/// the era's candidate settings and the advice they give.
fn oom_with_replays(snap: &Snapshot, device: i64, opts: &AnalyzeOptions, work: &FileWork) -> Option<OomFinding> {
    let threads = opts.threads.max(1);
    let mut f = oom::oom_finding(snap, device, &OomOptions { top: opts.top, replay: false, threads })?;
    let cfg = replay::recorded_config(snap);
    let cands = recommend::candidates(&cfg, work.era());
    let (base, trials) = recommend::run_trials(snap, device, &cfg, &cands, Some(f.capacity_bytes), threads);
    oom::apply_trials(&mut f, base, trials);
    oom::advise(snap, device, &mut f);
    Some(f)
}

/// Recommendations of a device without an OOM (measured by replay with --what-if).
fn recommendations_without_oom(
    snap: &Snapshot,
    device: i64,
    opts: &AnalyzeOptions,
    work: &FileWork,
) -> Recommendations {
    let cap = snap.device_capacity.get(&device).copied();
    recommend::recommend_in_era(snap, device, work.era().clone(), opts.what_if, cap, opts.threads.max(1))
}

/// Recommendations of a device with an OOM: from the replays the OOM finding made.
fn recommendations_at_oom(device: i64, era: &Era, f: &OomFinding) -> Recommendations {
    let mut r = recommend::Recommendations {
        device,
        measured: false,
        note: None,
        era: era.clone(),
        capacity_bytes: Some(f.capacity_bytes),
        baseline: None,
        recommended: Vec::new(),
        tried: Vec::new(),
        advice: Vec::new(),
        advice_notes: Vec::new(),
        ranked: Vec::new(),
    };
    if let Some(base) = &f.baseline {
        recommend::from_trials(&mut r, base.clone(), f.fixes_tried.clone(), Some(f.event_index));
    }
    r
}

/// Role-level what-ifs: asked for, or the answer to an exhaustion OOM or one of a cap on
/// the process (the live set must shrink: would the usual remedies shrink it enough?).
fn role_what_if(
    snap: &Snapshot,
    device: i64,
    opts: &AnalyzeOptions,
    oom_f: Option<&OomFinding>,
) -> Option<crate::role_whatif::RoleRows> {
    let exhaustion =
        oom_f.is_some_and(|f| matches!(f.verdict, oom::Verdict::Exhaustion | oom::Verdict::MemoryFractionCap));
    ((opts.what_if || exhaustion) && replay::has_replayable_trace(snap, device)).then(|| {
        let cap = oom_f.map(|f| f.capacity_bytes).or_else(|| snap.device_capacity.get(&device).copied());
        crate::role_whatif::analyze_rows(snap, device, cap)
    })
}

fn pct(x: f64) -> String {
    format!("{:.1}%", x * 100.0)
}

/// The headline list of a device, most important first: by severity (`high`,
/// `medium`, `info`), then in section order (OOM, fragmentation, pinned segments, leaks,
/// peak, recommendation).
pub(crate) fn findings(d: &DeviceAnalysis) -> Vec<Finding> {
    let mut v = Vec::new();
    if let Some(o) = &d.oom {
        oom_findings(d, o, &mut v);
    }
    v.extend(fragmentation_finding(d));
    v.extend(pinned_segments_finding(&d.fragmentation.pinned_segments));
    for s in d.leak_suspects.iter().take(3) {
        v.push(leak_finding(s));
    }
    v.extend(peak_finding(d));
    recommendation_findings(d, &mut v);
    // Most important first: by severity, keeping the section order within a severity
    // (the sort is stable).
    v.sort_by_key(|f| f.severity);
    v
}

/// The OOM's findings, all `high`: its explanation; the settings that would have avoided
/// it in the replay, or, when none did, by how much the live set must shrink; the live
/// tensors at the OOM by role; the advice.
fn oom_findings(d: &DeviceAnalysis, o: &OomFinding, v: &mut Vec<Finding>) {
    v.push(Finding { kind: FindingKind::Oom, severity: Severity::High, headline: o.explanation.clone() });
    if !o.fixes.is_empty() {
        let names: Vec<&str> = o.fixes.iter().map(|f| f.setting.as_str()).collect();
        v.push(Finding {
            kind: FindingKind::Oom,
            severity: Severity::High,
            headline: format!("Replaying the trace, these settings would have avoided it: {}.", names.join(", ")),
        });
    } else if o.replay_reproduces_oom == Some(true) {
        let top = o.top_sites.first().map_or("unknown", |s| s.site.site.as_str());
        let headline = if o.verdict == oom::Verdict::MemoryFractionCap {
            // The cap is known only to lie between reserved and reserved + the segment.
            format!(
                "No allocator setting tried avoids it in the replay under a cap of {} (the least the cap can be); \
                 raise the cap, or shrink the live set at the OOM, by up to {} (top holder: {top}).",
                fs(o.capacity_bytes),
                fs(o.bytes_over_capacity)
            )
        } else {
            format!(
                "No allocator setting tried avoids it in the replay; the live set at the OOM must shrink by {} (top holder: {top}).",
                fs(o.bytes_over_capacity)
            )
        };
        v.push(Finding { kind: FindingKind::Oom, severity: Severity::High, headline });
    }
    if let Some(at) = &d.roles.at_oom {
        let rb: [u64; 7] = std::array::from_fn(|k| at.get(Role::ALL[k].as_str()).copied().unwrap_or(0));
        if rb.iter().any(|&b| b > 0) {
            v.push(Finding {
                kind: FindingKind::Oom,
                severity: Severity::High,
                headline: format!("The live tensors at the OOM, by role: {}.", describe_role_bytes(&rb, fs)),
            });
        }
    }
    if let Some(a) = &o.advice_summary {
        v.push(Finding { kind: FindingKind::Advice, severity: Severity::High, headline: a.clone() });
    }
}

/// Peak fragmentation (or, without a trace, fragmentation at the snapshot), with the free
/// space at the reserved peak; `high` from 30% and 1 GiB reserved but unallocated,
/// `medium` from 10% and 256 MiB.
fn fragmentation_finding(d: &DeviceAnalysis) -> Option<Finding> {
    let tl = &d.fragmentation.timeline;
    let pf = tl.peak_fragmentation?;
    let waste = tl.peak_reserved.bytes.saturating_sub(tl.peak_allocated.bytes);
    let severity = if pf >= 0.3 && waste >= 1 << 30 {
        Severity::High
    } else if pf >= 0.1 && waste >= 256 << 20 {
        Severity::Medium
    } else {
        Severity::Info
    };
    // Say only what the file shows: a snapshot without a trace has one moment, and a
    // trace that began mid-run shows peaks of the recorded window only.
    let mut h = if tl.events == 0 {
        format!(
            "Fragmentation {} at the snapshot: PyTorch reserved {} while tensors held {} ({} reserved but unallocated; the file has no trace, so this is one moment, not a peak).",
            pct(pf),
            fs(tl.peak_reserved.bytes),
            fs(tl.peak_allocated.bytes),
            fs(waste)
        )
    } else {
        format!(
            "Peak fragmentation {}: PyTorch reserved up to {} but tensors never held more than {} at once{} ({} never used together).",
            pct(pf),
            fs(tl.peak_reserved.bytes),
            fs(tl.peak_allocated.bytes),
            if tl.history_complete { "" } else { " during the recorded trace" },
            fs(waste)
        )
    };
    if let Some(s) = &d.fragmentation.at_reserved_peak {
        if s.cached_free_bytes > 0 {
            h.push_str(&format!(
                " {} {} was free in the cache and the largest free block was {}.",
                if tl.events == 0 { "There" } else { "At the reserved peak" },
                fs(s.cached_free_bytes),
                fs(s.largest_free_block_bytes)
            ));
        }
    }
    Some(Finding { kind: FindingKind::Fragmentation, severity, headline: h })
}

/// Segments kept reserved by a few small live blocks, with their largest group by site;
/// `medium` from 1 GiB free inside them.
fn pinned_segments_finding(p: &PinnedSegments) -> Option<Finding> {
    if p.segments == 0 {
        return None;
    }
    let mut h = format!(
        "{} segment{} ({}) {} kept reserved by a few small live blocks ({} free inside, which empty_cache() cannot return).",
        p.segments,
        if p.segments == 1 { "" } else { "s" },
        fs(p.reserved_bytes),
        if p.segments == 1 { "is" } else { "are" },
        fs(p.free_bytes)
    );
    if let Some(g) = p.by_site.first() {
        h.push_str(&format!(" Largest group: {}.", g.describe(fs)));
    }
    let severity = if p.free_bytes >= 1 << 30 { Severity::Medium } else { Severity::Info };
    Some(Finding { kind: FindingKind::PinnedSegments, severity, headline: h })
}

/// One leak suspect; `high` from a confidence of 0.5.
fn leak_finding(s: &LeakSuspect) -> Finding {
    let headline = format!(
        "Possible leak: {} grows by {} per step after the first ({} of {} steps grew; {} → {} at the step ends; confidence {:.2}).",
        s.site.site,
        fs(s.growth_bytes_per_step),
        s.growing_steps,
        s.steps_compared,
        fs(s.first_bytes),
        fs(s.last_bytes),
        s.confidence
    );
    Finding {
        kind: FindingKind::Leak,
        severity: if s.confidence >= 0.5 { Severity::High } else { Severity::Medium },
        headline,
    }
}

/// The call site holding the most at the allocated peak (`info`).
fn peak_finding(d: &DeviceAnalysis) -> Option<Finding> {
    let tl = &d.fragmentation.timeline;
    let ap = &d.peaks.allocated_peak;
    let top = ap.sites.first()?;
    Some(Finding {
        kind: FindingKind::Peak,
        severity: Severity::Info,
        // Profiler traces can hold bytes allocated before profiling that no block
        // explains; name the peak as the timeline measured it, not the attributed sum.
        headline: format!(
            "{} ({}), {} holds the most: {} ({} of the attributed {}).",
            if tl.events == 0 { "At the snapshot" } else { "At the allocated peak" },
            fs(tl.peak_allocated.bytes.max(ap.live_bytes)),
            top.site.site,
            fs(top.bytes),
            pct(top.share),
            fs(ap.live_bytes)
        ),
    })
}

/// The one ranking's first entry (`high` when it avoids an OOM, else `medium`;
/// [`Recommendations::headline`]: never a debugging-only setting), then, without an OOM,
/// the usual advice replayed (`medium` when a piece of it that is not debugging-only saves
/// at least the ranking's threshold, else `info`): findings and recommendations read the
/// same ranking ([`crate::recommend`], "One ranking").
fn recommendation_findings(d: &DeviceAnalysis, v: &mut Vec<Finding>) {
    let r = &d.recommendations;
    if let Some(best) = r.headline() {
        let why = match best.cost {
            recommend::Cost::Free => String::new(),
            c => format!(" (cost: {})", c.as_str()),
        };
        v.push(Finding {
            kind: if best.kind == "setting" { FindingKind::Recommendation } else { FindingKind::Advice },
            severity: if best.avoids_oom { Severity::High } else { Severity::Medium },
            headline: format!(
                "{} {}{}: {}{why}.",
                if best.kind == "setting" { "Set" } else { "Call" },
                if best.kind == "setting" { best.paste.as_str() } else { best.setting.as_str() },
                best.extra_call.as_ref().map_or(String::new(), |c| format!(" and call {c}")),
                best.reason
            ),
        });
    }
    if let (None, Some(h)) = (&d.oom, r.baseline.as_ref().and_then(|b| recommend::advice_headline(b, &r.advice))) {
        // Advice worth reading is in the ranking and not debugging-only.
        let helps = r.ranked.iter().any(|x| x.kind == "advice" && x.cost != recommend::Cost::DebuggingOnly);
        v.push(Finding {
            kind: FindingKind::Advice,
            severity: if helps { Severity::Medium } else { Severity::Info },
            headline: h,
        });
    }
}
