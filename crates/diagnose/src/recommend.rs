//! Recommendations: allocator settings measured by replaying the recorded trace through
//! the allocator model, ranked, with the line to paste.
//!
//! # Candidates
//!
//! Each candidate changes one option of the *recorded* configuration (the recorded
//! options stay, so the paste line is complete):
//!
//! | setting | valid from | why |
//! |---|---|---|
//! | `expandable_segments:True` | 2.1 | one growable segment per stream: no split-segment waste |
//! | `max_split_size_mb:128/256/512` | 1.10 | large blocks are never split, oversize blocks are released first on OOM |
//! | `garbage_collection_threshold:0.6/0.8` + `set_per_process_memory_fraction(0.99)` | 1.12 | free unused cached segments before reaching the limit; GC runs only under a memory fraction, so the replay sets one |
//! | `roundup_power2_divisions:4` | 1.13 | fewer distinct block sizes, better reuse |
//!
//! Settings already in force are skipped, and settings newer than the file's PyTorch era
//! ([`infer_era`]) are left out.
//!
//! # Measured effect and ranking
//!
//! Every candidate and the recorded settings themselves (the baseline) are replayed with
//! [`fragscope_replay::simulate`] on the same device size. A candidate is recommended when
//! it avoids an OOM the baseline replay hits, or lowers the peak reserved bytes by at
//! least [`MIN_GAIN`] without running out of memory where the baseline did not.
//! Nothing is recommended when nothing beats the recorded settings by that margin.
//!
//! # One ranking
//!
//! Settings and the usual advice (`empty_cache()` at step boundaries,
//! `PYTORCH_NO_CUDA_MEMORY_CACHING=1`) are ranked together by [`rank_key`], the one ranking
//! `analyze`'s findings, its recommendations, the report and MCP read
//! ([`Recommendations::ranked`]). The saving decides what is listed at all (an avoided OOM,
//! or at least [`MIN_GAIN`] less peak reserved); among what is listed:
//!
//! 1. what avoids the recorded OOM first;
//! 2. then by cost ([`Cost`]): `free` (no more synchronisations than the recorded run)
//!    before `synchronisation` (more `cudaFree` calls, each a device-wide synchronisation);
//!    `debugging_only` (`PYTORCH_NO_CUDA_MEMORY_CACHING=1`: every free a `cudaFree`, made
//!    for memory checkers, not for training) always last, whatever it saves, and never a
//!    headline;
//! 3. then the larger saving (the lower peak reserved), fewer `cudaMalloc` calls, the name.

use fragscope_alloc::AllocatorConfig;
use fragscope_snapshot::{Action, Snapshot, SourceFormat};
use serde::Serialize;

use fragscope_replay::{self as replay, simulate};

/// Smallest relative cut of the peak reserved bytes worth recommending.
pub(crate) const MIN_GAIN: f64 = 0.05;

/// Memory fraction set with the GC candidates (GC is inert without one, §5.5).
pub(crate) const GC_FRACTION: f64 = 0.99;

/// The PyTorch version range a file's format points to (SOURCES.md "version era").
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Era {
    /// Oldest version consistent with the file, `[major, minor]`.
    pub min: [u32; 2],
    /// Newest version consistent with the file, when the format says.
    pub max: Option<[u32; 2]>,
    /// `"2.8+"`, `"2.0–2.1"`, `"unknown"`.
    pub label: String,
    /// The keys that decided it.
    pub evidence: Vec<String>,
}

impl Era {
    pub fn at_least(&self, v: [u32; 2]) -> bool {
        self.min >= v
    }
}

/// Infers the PyTorch era from the keys a file has (newest evidence wins for `min`).
pub fn infer_era(snap: &Snapshot) -> Era {
    let mut min = [0u32, 0];
    let mut max: Option<[u32; 2]> = None;
    let mut ev: Vec<String> = Vec::new();
    let raise = |v: [u32; 2], why: &str, min: &mut [u32; 2], ev: &mut Vec<String>| {
        if v > *min {
            *min = v;
        }
        ev.push(format!("{why} → ≥ {}.{}", v[0], v[1]));
    };
    match snap.format {
        SourceFormat::Kineto => {
            return Era {
                min: [0, 0],
                max: None,
                label: "unknown".into(),
                evidence: vec!["profiler trace: no allocator format".into()],
            }
        }
        SourceFormat::SegmentList => {
            return Era {
                min: [1, 13],
                max: Some([1, 13]),
                label: "1.13".into(),
                evidence: vec!["top level is a list of segments → 1.13".into()],
            }
        }
        SourceFormat::Dict => raise([2, 0], "dict with segments/device_traces", &mut min, &mut ev),
    }
    // What the trace entries show, in one pass over them (millions on a long trace).
    #[derive(Default)]
    struct Seen {
        segment_map: bool,
        non_snapshot: bool,
        time: bool,
        stack: bool,
        compile_context: bool,
        user_metadata: bool,
    }
    let mut seen = Seen::default();
    // An entry's context is mostly the one of the entry before it: looked up when it changes.
    let mut context = fragscope_snapshot::ContextId::NONE;
    for e in snap.device_traces.iter().flatten() {
        seen.segment_map |= matches!(e.action, Action::SegmentMap | Action::SegmentUnmap);
        seen.non_snapshot |= e.action != Action::Snapshot;
        seen.time |= e.time().is_some();
        seen.stack |= e.stack.is_some();
        if e.context != context {
            context = e.context;
            let c = snap.context(e);
            seen.compile_context |= c.compile_context.is_some();
            seen.user_metadata |= c.user_metadata.is_some();
        }
    }
    let any_block_history = snap.segments.iter().flat_map(|s| &s.blocks).any(|b| b.history.is_some());
    if any_block_history {
        max = Some([2, 0]);
        ev.push("blocks carry `history` lists → 2.0".into());
    }
    if snap.segments.iter().any(|s| s.is_expandable.is_some()) || seen.segment_map {
        raise([2, 1], "segments have `is_expandable` / segment_map entries", &mut min, &mut ev);
    }
    if seen.time {
        raise([2, 2], "trace entries have `time_us`", &mut min, &mut ev);
    } else if seen.non_snapshot && seen.stack && max.is_none() {
        max = Some([2, 1]);
        ev.push("trace entries have `frames` but no `time_us` → ≤ 2.1".into());
    }
    if let Some(s) = &snap.allocator_settings {
        raise([2, 3], "`allocator_settings`", &mut min, &mut ev);
        if s.get("graph_capture_record_stream_reuse").is_some() {
            raise([2, 9], "`allocator_settings.graph_capture_record_stream_reuse`", &mut min, &mut ev);
        }
    }
    if snap.external_annotations.is_some() {
        raise([2, 5], "`external_annotations`", &mut min, &mut ev);
    }
    if seen.compile_context {
        raise([2, 8], "trace entries have `compile_context`", &mut min, &mut ev);
    }
    if seen.user_metadata {
        raise([2, 10], "trace entries have `user_metadata`", &mut min, &mut ev);
    }
    if let Some(m) = max {
        if m < min {
            max = None;
        }
    }
    let label = match max {
        Some(m) if m == min => format!("{}.{}", m[0], m[1]),
        Some(m) => format!("{}.{}–{}.{}", min[0], min[1], m[0], m[1]),
        None => format!("{}.{}+", min[0], min[1]),
    };
    Era { min, max, label, evidence: ev }
}

/// One setting to replay.
#[derive(Clone, Debug)]
pub struct Candidate {
    /// The option changed, as written in the config string.
    pub setting: String,
    pub config: AllocatorConfig,
    /// A call needed besides the environment variable.
    pub extra_call: Option<String>,
    /// First PyTorch version with the option.
    pub min_version: &'static str,
}

/// The candidates of the module table that differ from `recorded` and fit `era`.
pub fn candidates(recorded: &AllocatorConfig, era: &Era) -> Vec<Candidate> {
    let mut v = Vec::new();
    let mut push = |setting: String, cfg: AllocatorConfig, extra: Option<String>, min_version: &'static str| {
        if &cfg != recorded {
            v.push(Candidate { setting, config: cfg, extra_call: extra, min_version });
        }
    };
    if era.at_least([2, 1]) && !recorded.expandable_segments {
        let mut c = recorded.clone();
        c.expandable_segments = true;
        push("expandable_segments:True".into(), c, None, "2.1");
    }
    for mb in [128u64, 256, 512] {
        let mut c = recorded.clone();
        c.max_split_size = Some(mb << 20);
        push(format!("max_split_size_mb:{mb}"), c, None, "1.10");
    }
    for t in [0.6, 0.8] {
        let mut c = recorded.clone();
        c.garbage_collection_threshold = t;
        if c.per_process_memory_fraction >= 1.0 {
            c.per_process_memory_fraction = GC_FRACTION;
        }
        let extra = (recorded.per_process_memory_fraction >= 1.0).then(|| {
            format!("torch.cuda.set_per_process_memory_fraction({GC_FRACTION}) (GC runs only under a memory fraction)")
        });
        push(format!("garbage_collection_threshold:{t}"), c, extra, "1.12");
    }
    {
        let mut c = recorded.clone();
        c.roundup_power2_divisions = [4; 16];
        push("roundup_power2_divisions:4".into(), c, None, "1.13");
    }
    v
}

/// The outcome of replaying one setting.
#[derive(Clone, Debug, Serialize)]
pub struct Trial {
    /// The option changed (`"recorded"` for the baseline).
    pub setting: String,
    /// The whole configuration replayed (canonical string; empty = defaults).
    pub config: String,
    /// `PYTORCH_CUDA_ALLOC_CONF=<config>`.
    pub paste: String,
    pub extra_call: Option<String>,
    pub min_version: Option<&'static str>,
    pub capacity_bytes: Option<u64>,
    pub peak_reserved_bytes: u64,
    pub peak_allocated_bytes: u64,
    pub peak_fragmentation: f64,
    pub cuda_mallocs: u64,
    /// `cudaFree` calls (released segments and unmapped pages).
    pub cuda_frees: u64,
    /// `empty_cache()` calls made (the recording's own, as inferred, plus any added).
    pub empty_cache_calls: u64,
    /// Synchronisations the driver calls imply (`replay::cost`): one per `cudaFree`, one
    /// per unmapped range of an expandable segment. A count; no time is estimated.
    pub syncs: u64,
    pub alloc_retries: u64,
    pub ooms: u64,
    /// Trace index of the first request the replay could not serve.
    pub first_oom_index: Option<usize>,
    /// Recorded `oom` entries whose request this replay served.
    pub recorded_ooms_that_fit: u64,
    /// What the replay started from; trials are compared only when every one started
    /// from the rebuilt state (`replay::StartState`).
    pub start_state: replay::StartState,
    pub notes: Vec<String>,
}

fn trial_of(setting: &str, cand: Option<&Candidate>, cfg: &AllocatorConfig, w: replay::WhatIf) -> Trial {
    let config = cfg.to_conf_string();
    // A fraction the candidate set for GC is pasted as the call in `extra_call` (the
    // `per_process_memory_fraction` key exists only from 2.10).
    let paste_cfg = match cand {
        Some(c) if c.extra_call.is_some() => {
            AllocatorConfig { per_process_memory_fraction: 1.0, ..cfg.clone() }.to_conf_string()
        }
        _ => config.clone(),
    };
    Trial {
        setting: setting.to_string(),
        paste: format!("PYTORCH_CUDA_ALLOC_CONF={paste_cfg}"),
        config,
        extra_call: cand.and_then(|c| c.extra_call.clone()),
        min_version: cand.map(|c| c.min_version),
        capacity_bytes: w.capacity,
        peak_reserved_bytes: w.peak_reserved,
        peak_allocated_bytes: w.peak_allocated,
        peak_fragmentation: w.peak_fragmentation,
        cuda_mallocs: w.cuda_mallocs,
        cuda_frees: w.cuda_frees,
        empty_cache_calls: w.empty_cache_calls,
        syncs: w.driver.syncs(),
        alloc_retries: w.alloc_retries,
        ooms: w.ooms,
        first_oom_index: w.first_oom.as_ref().map(|o| o.index),
        recorded_ooms_that_fit: w.recorded_ooms_that_fit,
        start_state: w.start_state,
        notes: w.notes,
    }
}

/// Replays the recorded configuration and every candidate on `device`, on `threads`
/// threads. Returns (baseline, trials in candidate order).
pub(crate) fn run_trials(
    snap: &Snapshot,
    device: i64,
    recorded: &AllocatorConfig,
    cands: &[Candidate],
    capacity: Option<u64>,
    threads: usize,
) -> (Trial, Vec<Trial>) {
    // Job 0 is the baseline.
    let jobs: Vec<(Option<&Candidate>, &AllocatorConfig)> =
        std::iter::once((None, recorded)).chain(cands.iter().map(|c| (Some(c), &c.config))).collect();
    let run = |k: usize| {
        let (c, cfg) = jobs[k];
        let w = simulate(snap, device, cfg.clone(), capacity);
        trial_of(c.map_or("recorded", |c| c.setting.as_str()), c, cfg, w)
    };
    let mut it = fragscope_trace::par_map(jobs.len(), threads, run).into_iter();
    let base = it.next().expect("baseline");
    (base, it.collect())
}

/// What a setting or a piece of advice costs besides memory (module doc, "One ranking");
/// ordered cheapest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Cost {
    /// No more synchronisations than the recorded run.
    Free,
    /// More `cudaFree` calls (or unmapped ranges) than the recorded run: each synchronises
    /// the device.
    Synchronisation,
    /// A setting made for debugging (`PYTORCH_NO_CUDA_MEMORY_CACHING=1`), never advice to
    /// train with.
    DebuggingOnly,
}

impl Cost {
    pub fn as_str(self) -> &'static str {
        match self {
            Cost::Free => "free",
            Cost::Synchronisation => "synchronisation",
            Cost::DebuggingOnly => "debugging only",
        }
    }

    /// The cost of replay `t` against the recorded settings' replay `base`.
    pub fn of(t: &Trial, base: &Trial) -> Cost {
        if t.setting == crate::advice::NO_CACHING {
            Cost::DebuggingOnly
        } else if t.syncs > base.syncs {
            Cost::Synchronisation
        } else {
            Cost::Free
        }
    }
}

/// The one ranking (module doc): the key that sorts settings and advice, best first.
pub fn rank_key(avoids_oom: bool, cost: Cost, peak_reserved: u64, cuda_mallocs: u64) -> impl Ord {
    (cost == Cost::DebuggingOnly, !avoids_oom, cost, peak_reserved, cuda_mallocs)
}

/// One entry of the one ranking: a setting or a piece of advice that saves.
#[derive(Clone, Debug, Serialize)]
pub struct Ranked {
    pub rank: usize,
    /// The option, or the advice in words.
    pub setting: String,
    /// `"setting"` (an allocator option, also in `recommended`) or `"advice"`.
    pub kind: &'static str,
    pub paste: String,
    pub extra_call: Option<String>,
    pub avoids_oom: bool,
    pub cost: Cost,
    /// `1 − peak reserved / baseline peak reserved`.
    pub peak_reserved_saving: f64,
    pub peak_reserved_bytes: u64,
    pub syncs: u64,
    pub baseline_syncs: u64,
    /// Why, in words, with the measured figures and the cost.
    pub reason: String,
}

/// A ranked setting.
#[derive(Clone, Debug, Serialize)]
pub struct Recommendation {
    pub rank: usize,
    pub setting: String,
    pub paste: String,
    pub extra_call: Option<String>,
    pub min_version: Option<&'static str>,
    /// Why, in words, with the measured figures.
    pub reason: String,
    pub avoids_oom: bool,
    pub peak_reserved_bytes: u64,
    pub baseline_peak_reserved_bytes: u64,
    /// `1 − peak reserved / baseline peak reserved` (negative = more).
    pub peak_reserved_saving: f64,
    pub cuda_mallocs: u64,
    pub baseline_cuda_mallocs: u64,
    /// What it costs besides memory ([`Cost`]).
    pub cost: Cost,
}

/// Recommendations of one device.
#[derive(Clone, Debug, Serialize)]
pub struct Recommendations {
    pub device: i64,
    /// Whether replays were run (`false`: no OOM and no `--what-if`, or nothing to replay).
    pub measured: bool,
    /// Why not, when not measured or nothing is recommended.
    pub note: Option<String>,
    pub era: Era,
    pub capacity_bytes: Option<u64>,
    pub baseline: Option<Trial>,
    pub recommended: Vec<Recommendation>,
    pub tried: Vec<Trial>,
    /// The usual advice replayed beside the settings (`setting` = the advice in words:
    /// `empty_cache()` at every step boundary, no caching); never ranked as a recommendation,
    /// compared with `baseline` in [`advice_headline`].
    pub advice: Vec<Trial>,
    /// Advice that could not be replayed, and why.
    pub advice_notes: Vec<String>,
    /// Settings and advice that save, in the one ranking (module doc): what the findings'
    /// headline, the report and MCP read first.
    pub ranked: Vec<Ranked>,
}

impl Recommendations {
    /// Fills [`Recommendations::ranked`] from `recommended` and `advice` (call after both).
    pub fn rank_all(&mut self) {
        let Some(base) = &self.baseline else {
            self.ranked.clear();
            return;
        };
        let mut v: Vec<Ranked> = self
            .recommended
            .iter()
            .map(|x| {
                let syncs = self.tried.iter().find(|t| t.setting == x.setting).map_or(base.syncs, |t| t.syncs);
                Ranked {
                    rank: 0,
                    setting: x.setting.clone(),
                    kind: "setting",
                    paste: x.paste.clone(),
                    extra_call: x.extra_call.clone(),
                    avoids_oom: x.avoids_oom,
                    cost: x.cost,
                    peak_reserved_saving: x.peak_reserved_saving,
                    peak_reserved_bytes: x.peak_reserved_bytes,
                    syncs,
                    baseline_syncs: base.syncs,
                    reason: x.reason.clone(),
                }
            })
            .collect();
        if refusal(base, &self.advice).is_none() {
            for t in &self.advice {
                let saving = saving_of(base, t);
                let avoids = avoids_baseline_oom(base, t, None);
                if !(avoids || (saving >= MIN_GAIN && !(base.ooms == 0 && t.ooms > 0))) {
                    continue;
                }
                let cost = Cost::of(t, base);
                v.push(Ranked {
                    rank: 0,
                    setting: t.setting.clone(),
                    kind: "advice",
                    paste: t.paste.clone(),
                    extra_call: t.extra_call.clone(),
                    avoids_oom: avoids,
                    cost,
                    peak_reserved_saving: saving,
                    peak_reserved_bytes: t.peak_reserved_bytes,
                    syncs: t.syncs,
                    baseline_syncs: base.syncs,
                    reason: format!(
                        "peak reserved {} instead of {} ({:.1}% less), {} synchronisations instead of {}",
                        fragscope_alloc::format_size(t.peak_reserved_bytes),
                        fragscope_alloc::format_size(base.peak_reserved_bytes),
                        saving * 100.0,
                        t.syncs,
                        base.syncs
                    ),
                });
            }
        }
        v.sort_by(|a, b| {
            rank_key(a.avoids_oom, a.cost, a.peak_reserved_bytes, 0)
                .cmp(&rank_key(b.avoids_oom, b.cost, b.peak_reserved_bytes, 0))
                .then_with(|| a.setting.cmp(&b.setting))
        });
        for (i, r) in v.iter_mut().enumerate() {
            r.rank = i + 1;
        }
        self.ranked = v;
    }

    /// The entry a headline may name: the first of the ranking, unless it is
    /// debugging-only (module doc).
    pub fn headline(&self) -> Option<&Ranked> {
        self.ranked.first().filter(|r| r.cost != Cost::DebuggingOnly)
    }
}

/// `1 − t's peak reserved / base's` (0 when the baseline reserved nothing).
fn saving_of(base: &Trial, t: &Trial) -> f64 {
    if base.peak_reserved_bytes == 0 {
        0.0
    } else {
        1.0 - t.peak_reserved_bytes as f64 / base.peak_reserved_bytes as f64
    }
}

/// Does the baseline run out of memory where `t` does not (at or before `oom_at`, the
/// recorded OOM, when there is one)?
fn avoids_baseline_oom(base: &Trial, t: &Trial, oom_at: Option<usize>) -> bool {
    let base_oom = match (base.first_oom_index, oom_at) {
        (Some(i), Some(r)) => i <= r,
        (Some(_), None) => true,
        (None, _) => false,
    };
    if !base_oom {
        return false;
    }
    match oom_at {
        Some(r) => t.first_oom_index.is_none_or(|i| i > r) && t.recorded_ooms_that_fit > 0,
        None => t.ooms == 0,
    }
}

/// Ranks replayed trials against the baseline (module doc). `oom_at` = the recorded
/// OOM's trace index, when the device has one.
pub(crate) fn rank(base: &Trial, trials: &[Trial], oom_at: Option<usize>) -> Vec<Recommendation> {
    let mut v: Vec<Recommendation> = Vec::new();
    for t in trials {
        let avoids = avoids_baseline_oom(base, t, oom_at);
        let saving = saving_of(base, t);
        let new_oom = base.ooms == 0 && t.ooms > 0;
        if !(avoids || (saving >= MIN_GAIN && !new_oom)) {
            continue;
        }
        let fs = fragscope_alloc::format_size;
        let mut reason = if avoids {
            format!("the replay gets past the OOM with it (peak reserved {})", fs(t.peak_reserved_bytes))
        } else {
            format!(
                "peak reserved {} instead of {} ({:.1}% less)",
                fs(t.peak_reserved_bytes),
                fs(base.peak_reserved_bytes),
                saving * 100.0
            )
        };
        if t.cuda_mallocs != base.cuda_mallocs {
            reason.push_str(&format!(", {} cudaMalloc calls instead of {}", t.cuda_mallocs, base.cuda_mallocs));
        }
        let cost = Cost::of(t, base);
        if cost == Cost::Synchronisation {
            reason.push_str(&format!(", {} synchronisations instead of {}", t.syncs, base.syncs));
        }
        v.push(Recommendation {
            rank: 0,
            setting: t.setting.clone(),
            paste: t.paste.clone(),
            extra_call: t.extra_call.clone(),
            min_version: t.min_version,
            reason,
            avoids_oom: avoids,
            peak_reserved_bytes: t.peak_reserved_bytes,
            baseline_peak_reserved_bytes: base.peak_reserved_bytes,
            peak_reserved_saving: saving,
            cuda_mallocs: t.cuda_mallocs,
            baseline_cuda_mallocs: base.cuda_mallocs,
            cost,
        });
    }
    v.sort_by(|a, b| {
        rank_key(a.avoids_oom, a.cost, a.peak_reserved_bytes, a.cuda_mallocs)
            .cmp(&rank_key(b.avoids_oom, b.cost, b.peak_reserved_bytes, b.cuda_mallocs))
            .then_with(|| a.setting.cmp(&b.setting))
    });
    for (i, r) in v.iter_mut().enumerate() {
        r.rank = i + 1;
    }
    v
}

/// Recommendations of `device`, in the file's era (inferred once, [`infer_era`] looks at
/// every trace entry): replays (on `threads` threads) when `measure`. `capacity` = the
/// device size to replay on (`None` = unlimited).
pub(crate) fn recommend_in_era(
    snap: &Snapshot,
    device: i64,
    era: Era,
    measure: bool,
    capacity: Option<u64>,
    threads: usize,
) -> Recommendations {
    let mut r = Recommendations {
        device,
        measured: false,
        note: None,
        era,
        capacity_bytes: capacity,
        baseline: None,
        recommended: Vec::new(),
        tried: Vec::new(),
        advice: Vec::new(),
        advice_notes: Vec::new(),
        ranked: Vec::new(),
    };
    if !replay::has_replayable_trace(snap, device) {
        r.note = Some("no allocation trace to replay on this device".into());
        return r;
    }
    if !measure {
        r.note = Some(
            "settings are measured by replay only for a device with an OOM; run with --what-if to measure them".into(),
        );
        return r;
    }
    let cfg = replay::recorded_config(snap);
    let cands = candidates(&cfg, &r.era);
    let (base, trials) = run_trials(snap, device, &cfg, &cands, capacity, threads);
    from_trials(&mut r, base, trials, None);
    let (advice, notes) = advice_trials(snap, device, &cfg, capacity);
    r.advice = advice;
    r.advice_notes = notes;
    r.rank_all();
    r
}

/// `empty_cache()` at every step boundary and `PYTORCH_NO_CUDA_MEMORY_CACHING=1`,
/// replayed under `cfg` (`replay::advice`), as trials; and why any could not be.
pub fn advice_trials(
    snap: &Snapshot,
    device: i64,
    cfg: &AllocatorConfig,
    capacity: Option<u64>,
) -> (Vec<Trial>, Vec<String>) {
    use crate::advice::{simulate_empty_cache, simulate_uncached, EmptyCacheAt, NO_CACHING};
    let mut v = Vec::new();
    let mut notes = Vec::new();
    let at = EmptyCacheAt::Steps;
    match simulate_empty_cache(snap, device, cfg.clone(), capacity, &at) {
        Ok(w) => v.push(trial_of(&at.describe(), None, cfg, w)),
        Err(e) => notes.push(format!("{} was not replayed: {e}", at.describe())),
    }
    let w = simulate_uncached(snap, device, capacity);
    let mut t = trial_of(NO_CACHING, None, cfg, w);
    t.paste = NO_CACHING.to_string();
    v.push(t);
    (v, notes)
}

/// One sentence per piece of advice against the recorded settings: what it saves in
/// peak reserved and what it costs in driver calls (an estimate in time).
pub fn advice_headline(base: &Trial, advice: &[Trial]) -> Option<String> {
    let fs = fragscope_alloc::format_size;
    if let Some(why) = refusal(base, advice) {
        return (!advice.is_empty())
            .then(|| format!("The usual advice was replayed but is not compared with the recorded settings: {why}."));
    }
    let parts: Vec<String> = advice
        .iter()
        .map(|t| {
            let effect = if base.ooms == 0 && t.ooms > 0 {
                format!("would run out of memory at entry {}", t.first_oom_index.map_or("?".into(), |i| i.to_string()))
            } else if t.peak_reserved_bytes < base.peak_reserved_bytes {
                let saved = base.peak_reserved_bytes - t.peak_reserved_bytes;
                format!(
                    "would lower the peak memory taken from CUDA from {} to {} ({:.1}% less)",
                    fs(base.peak_reserved_bytes),
                    fs(t.peak_reserved_bytes),
                    saved as f64 * 100.0 / base.peak_reserved_bytes as f64
                )
            } else if t.peak_reserved_bytes == base.peak_reserved_bytes {
                format!("would not change the peak memory taken from CUDA ({})", fs(base.peak_reserved_bytes))
            } else {
                format!(
                    "would raise the peak memory taken from CUDA from {} to {}",
                    fs(base.peak_reserved_bytes),
                    fs(t.peak_reserved_bytes)
                )
            };
            // A debugging setting is said to be one, wherever it is named.
            let debug = if Cost::of(t, base) == Cost::DebuggingOnly { " (a debugging setting)" } else { "" };
            format!(
                "{}{debug} {effect}, for {} cudaMalloc + {} cudaFree instead of {} + {} ({} synchronisations instead of {})",
                t.setting, t.cuda_mallocs, t.cuda_frees, base.cuda_mallocs, base.cuda_frees, t.syncs, base.syncs
            )
        })
        .collect();
    (!parts.is_empty()).then(|| format!("Replayed on this run: {}.", parts.join("; ")))
}

/// Why replays cannot be compared with the baseline, if they cannot: one of them did
/// not start from the allocator state the backward walk rebuilt (tensors live before
/// the trace held in one run and dropped in another would decide the comparison).
pub fn refusal(base: &Trial, trials: &[Trial]) -> Option<String> {
    let t = std::iter::once(base).chain(trials).find(|t| t.start_state.refusal().is_some())?;
    let why = t.start_state.refusal()?;
    let detail =
        t.notes.iter().find(|n| n.contains("state before the trace")).map_or(String::new(), |n| format!(": {n}"));
    Some(format!("{why} for the {} replay{detail}", t.setting))
}

/// Fills `r` from replays already made.
pub fn from_trials(r: &mut Recommendations, base: Trial, trials: Vec<Trial>, oom_at: Option<usize>) {
    r.measured = true;
    if let Some(why) = refusal(&base, &trials) {
        r.note = Some(format!("settings not compared: {why}"));
        r.baseline = Some(base);
        r.tried = trials;
        return;
    }
    r.recommended = rank(&base, &trials, oom_at);
    if r.recommended.is_empty() {
        r.note = Some(format!(
            "no setting beats the recorded one ({}) by at least {:.0}% peak reserved or by avoiding an OOM",
            if base.config.is_empty() { "defaults".to_string() } else { base.config.clone() },
            MIN_GAIN * 100.0
        ));
    }
    r.baseline = Some(base);
    r.tried = trials;
    r.rank_all();
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn trial(setting: &str, peak_reserved: u64, syncs: u64) -> Trial {
        Trial {
            setting: setting.into(),
            config: String::new(),
            paste: format!("PYTORCH_CUDA_ALLOC_CONF={setting}"),
            extra_call: None,
            min_version: None,
            capacity_bytes: None,
            peak_reserved_bytes: peak_reserved,
            peak_allocated_bytes: 40 * GIB,
            peak_fragmentation: 0.0,
            cuda_mallocs: 100,
            cuda_frees: syncs,
            empty_cache_calls: 0,
            syncs,
            alloc_retries: 0,
            ooms: 0,
            first_oom_index: None,
            recorded_ooms_that_fit: 0,
            start_state: replay::StartState::Rebuilt,
            notes: Vec::new(),
        }
    }

    fn recommendations(base: Trial, settings: Vec<Trial>, advice: Vec<Trial>) -> Recommendations {
        let mut r = Recommendations {
            device: 0,
            measured: false,
            note: None,
            era: Era { min: [2, 10], max: None, label: "2.10+".into(), evidence: Vec::new() },
            capacity_bytes: None,
            baseline: None,
            recommended: Vec::new(),
            tried: Vec::new(),
            advice,
            advice_notes: Vec::new(),
            ranked: Vec::new(),
        };
        from_trials(&mut r, base, settings, None);
        r
    }

    /// The 2.7B training step of issue 42 in figures: no caching saves the most but costs
    /// 14× the synchronisations; expandable segments save 8.9% for nothing.
    #[test]
    fn a_debugging_setting_never_ranks_above_a_free_one_that_saves() {
        let base = trial("recorded", 100 * GIB, 430);
        let free = trial("expandable_segments:True", 91 * GIB, 430);
        let gc = trial("garbage_collection_threshold:0.6", 90 * GIB, 709);
        let no_cache = trial(crate::advice::NO_CACHING, 80 * GIB, 5894);
        let r = recommendations(base, vec![gc, free], vec![no_cache]);
        let order: Vec<(&str, Cost)> = r.ranked.iter().map(|x| (x.setting.as_str(), x.cost)).collect();
        assert_eq!(
            order,
            [
                ("expandable_segments:True", Cost::Free),
                ("garbage_collection_threshold:0.6", Cost::Synchronisation),
                (crate::advice::NO_CACHING, Cost::DebuggingOnly),
            ]
        );
        // The settings' own list is in the same order.
        let settings: Vec<&str> = r.recommended.iter().map(|x| x.setting.as_str()).collect();
        assert_eq!(settings, ["expandable_segments:True", "garbage_collection_threshold:0.6"]);
        assert_eq!(r.headline().map(|x| x.setting.as_str()), Some("expandable_segments:True"));
    }

    #[test]
    fn a_debugging_setting_is_never_the_headline() {
        // Nothing but no caching saves: it is ranked, last and alone, and no headline names it.
        let base = trial("recorded", 100 * GIB, 430);
        let r = recommendations(
            base,
            vec![trial("roundup_power2_divisions:4", 99 * GIB, 430)],
            vec![trial(crate::advice::NO_CACHING, 50 * GIB, 9000)],
        );
        assert_eq!(r.ranked.len(), 1);
        assert_eq!(r.ranked[0].cost, Cost::DebuggingOnly);
        assert!(r.headline().is_none());
    }

    #[test]
    fn an_avoided_oom_ranks_first_whatever_it_costs() {
        let mut base = trial("recorded", 100 * GIB, 10);
        base.ooms = 1;
        base.first_oom_index = Some(50);
        let mut gc = trial("garbage_collection_threshold:0.8", 99 * GIB, 40);
        gc.ooms = 0;
        let free = trial("expandable_segments:True", 80 * GIB, 10);
        let mut free_oom = free.clone();
        free_oom.ooms = 1;
        free_oom.first_oom_index = Some(40);
        let r = recommendations(base, vec![free_oom, gc], Vec::new());
        assert_eq!(r.ranked[0].setting, "garbage_collection_threshold:0.8");
        assert!(r.ranked[0].avoids_oom);
        assert_eq!(r.ranked[0].cost, Cost::Synchronisation);
    }
}
