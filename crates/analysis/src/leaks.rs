//! Leak suspects: call sites that keep memory they do not give back, found on runs of
//! any shape: with iterations (a training loop) or without (one phase, a burst, a run
//! whose loop the trace does not show).
//!
//! # Iterations
//!
//! 1. From `external_annotations` (`record_function` scopes) when the trace has times:
//!    the outermost scope name that repeats like a loop (below), the most frequent at
//!    that depth. Top-level names count whatever they are called; a nested name only
//!    when it says it is a step (`step_like`: `step`, `iteration`, `epoch`, `batch`,
//!    `train`, `forward`, a number), so a `step` inside one outer `train` scope is found
//!    and the layers inside a step are not. Numbered names are one name (`ProfilerStep#12`,
//!    `iteration 3`, `step_7` become `ProfilerStep#N`, `iteration N`, `step_N`).
//!    Compiler and library internals are never iterations ([`is_internal_scope`]:
//!    `torch.compile`'s `... (dynamo_timed)` phases, `CachingAutotuner.benchmark_all_configs`,
//!    Inductor/dynamo scopes, aten ops, collectives, FSDP's per-module scopes). Scopes
//!    that do not say they are steps (`attention`) get the build-up check below, as
//!    periodicity does.
//! 2. Otherwise from the trace's periodicity: each `alloc` gets a signature (request
//!    size, allocation stack). Candidate periods are the most common gaps between two
//!    occurrences of the same signature; the period is the smallest candidate whose
//!    autocorrelation is within 5% of the best one and at least [`MIN_AUTOCORRELATION`].
//!    Boundaries are the occurrences of one anchor signature. When that finds no loop,
//!    the signature is the site alone (innermost user frame): a loop whose shapes or
//!    call paths change from step to step (variable lengths, a model run at growing
//!    resolutions) repeats its sites, not its sizes.
//!
//! Either way the boundaries must look like a loop: at least [`MIN_ITERATIONS`],
//! covering at least [`MIN_LOOP_COVERAGE`] of the trace, with no gap over
//! [`MAX_GAP_RATIO`] median gaps. A short pattern repeated in one or two clusters (the
//! layers of two forward passes, with the growth in between) is rejected, and
//! `iterations.reason` says why; the analysis then reads the run in [`WINDOWS`]
//! equal windows. Periodicity also finds the layers of a single pass; when periods keep
//! more than [`MAX_RETAINED_SHARE`] of what they allocate (a build-up), or when the
//! memory the trace frees later ("transient") trends across them, they are not taken
//! for steps.
//!
//! # Two tests
//!
//! Every block the trace allocates is followed to its free (or the end). Sites are the
//! innermost user frame ([`crate::attribution`]; C++-only stacks by operator and
//! autograd node).
//!
//! * **growth** (needs iterations): live bytes of the site at each boundary, y₀…y_K,
//!   grow in at least [`MIN_GROWING_SHARE`] of the steps, y_K > y₀, at least half of the
//!   growth is still held at the end, the least-squares slope is at least
//!   [`growth_threshold`], and with periodicity-derived iterations the rest of memory
//!   and the transient memory are steady (slope at most [`MAX_REST_TREND`] of the
//!   site's). `confidence` = share of growing steps × R². (The never-freed test's
//!   over-iterations check of the rest leaves the other candidates out of the rest,
//!   so that several leaks at once do not make each other's rest trend.)
//! * **never freed** (iterations or none): blocks of the site never freed that
//!   - come after at least one free of the same site (the site makes temporaries),
//!   - outlived at least one iteration boundary (without iterations: at least
//!     [`MIN_OUTLIVED_SHARE`] of the trace), and
//!   - were followed by at least [`MIN_FREED_AFTER`] freed allocations of the same site
//!     (a burst or a phase that kept what the site normally frees), or belong to an
//!     accumulation (kept blocks in [`MIN_ACCUMULATION_WINDOWS`] iterations) or to
//!     several phases of the site's activity.
//!
//!   A site that keeps blocks from its first active window on, with no earlier free,
//!   is how state starts (optimizer state, the gradients of a first backward) unless
//!   they accumulate over trusted iterations (loop annotations, or periodicity with
//!   level transient memory) or recur in two or more separate phases
//!   of the site's activity (a gap over 1/[`PHASE_GAP_DIVISOR`] of the trace). The kept
//!   bytes must reach [`never_freed_threshold`], and of what the device allocates after
//!   the first kept block (the site's own and already confirmed suspects' kept blocks
//!   left out) at most [`MAX_RETAINED_SHARE`] may still be live at the end: a forward
//!   pass keeps its activations, a run that goes on frees what it allocates.
//!   `confidence` = 1 − that share.
//!
//!   On the windows of the run a site may also be kept by the **spread** rule, which needs no
//!   free of the site (a site whose every allocation leaks): its never-freed blocks
//!   were allocated all over the run rather than at one time (at least
//!   [`MIN_SPREAD_WINDOWS`] windows, at least half of those between the first and the
//!   last, [`MIN_SPREAD_SHARE`] of the trace apart, no window with more than
//!   [`MAX_SPREAD_WINDOW_SHARE`] of the bytes) and across a trough of transient
//!   memory (a step boundary: one pass, a forward or one backward, has none at
//!   [`TROUGH_DEPTH`] of its peak). State is made once, when its site first runs; a
//!   leak goes on over the steps. Such a site is judged once against everything else
//!   the device keeps, other candidates included, with the stricter
//!   [`MAX_SPREAD_RETAINED_SHARE`] (passes that each keep their activations do not
//!   vouch for each other).
//!
//!   Over periodicity iterations whose rest and transient memory trend (steps that
//!   change size), a site still counts when what the rest keeps for good does not
//!   trend (other candidates left out) and transient memory does not fall: a backward
//!   pass keeps gradients at each boundary while it frees activations, a loop over
//!   growing shapes does neither. Over iterations, kept blocks in three or more
//!   iterations after the first one the site kept in (whose blocks may be state) count
//!   once the site has freed something before them.
//!
//!   Two checks say "state, not a leak" for any candidate: its live bytes (blocks from
//!   before the trace included) do not grow by half of what it keeps from just before
//!   the first kept block to the end (a new block for each old one: optimizer state
//!   replaced); or its kept blocks start within a tenth of the trace of the site's first
//!   use and are, for 90% of their bytes, one per tensor already held, size for size
//!   (`shadows_resident`: the weights' gradients of a first backward, optimizer state
//!   at a first step; a trace whose ring buffer dropped the start of a training step
//!   shows these without the step before them).
//!
//! Each suspect carries its evidence: the blocks never freed (count, bytes, first and
//! last `alloc` entry), its freed allocations, its live bytes per iteration or window
//! (`curve`) and when it grew (`grew_in`).
//!
//! Memory: one u32 signature per `alloc` for the periodicity search, one record per
//! traced block, and one counter per site per sample (boundaries thinned evenly to at
//! most [`MAX_SAMPLES`]). `FRAGSCOPE_LEAK_DEBUG=TEXT` prints the never-freed test's
//! decision for sites containing TEXT (for tuning on planted files,
//! [`crate::plant`]).

use fragscope_snapshot::{Action, FxHashMap, Snapshot, StackId, NO_TIME};
use serde::Serialize;

use crate::attribution::{Scopes, Site, SiteTable};
use crate::lives::{self, BlockLives, TracedLife, LIVE_AT_END};
use crate::timeline::{self, TimelineOptions};

/// With periodicity-derived iterations, the rest of memory may trend by at most this
/// share of a suspect's own growth per iteration (see `leaks_device`).
pub const MAX_REST_TREND: f64 = 0.25;
/// Fewest iterations worth analysing.
pub const MIN_ITERATIONS: usize = 3;
/// Weakest autocorrelation accepted as a period.
pub const MIN_AUTOCORRELATION: f64 = 0.5;
/// Boundaries sampled at most.
pub const MAX_SAMPLES: usize = 4096;
/// Periodicity-derived iterations that keep more than this share of what they
/// allocate are a build-up, not steps (see [`leaks_device`]).
pub const MAX_RETAINED_SHARE: f64 = 0.5;
/// Share of growing steps a suspect needs.
pub const MIN_GROWING_SHARE: f64 = 0.75;
/// Iterations must cover at least this share of the trace.
pub const MIN_LOOP_COVERAGE: f64 = 0.5;
/// No gap between two iteration boundaries may exceed this many median gaps.
pub const MAX_GAP_RATIO: usize = 4;
/// Without iterations, the never-freed test samples the run at this many windows.
pub const WINDOWS: usize = 20;
/// Without iterations, a never-freed block must have outlived this share of the trace.
pub const MIN_OUTLIVED_SHARE: f64 = 0.2;
/// A never-freed block must be followed by at least this many allocations of the same
/// site that the trace frees.
pub const MIN_FREED_AFTER: usize = 3;
/// Never-freed blocks allocated in at least this many iterations (or windows) are an
/// accumulation, followed by freed siblings or not.
pub const MIN_ACCUMULATION_WINDOWS: usize = 3;
/// A gap of more than 1/this of the trace between two allocs of a site starts a new
/// phase of its activity (see `outliving`).
pub const PHASE_GAP_DIVISOR: usize = 40;
/// Periodicity-derived iterations are trusted as steps when transient memory drifts by
/// at most this share of its peak across them.
pub const MAX_TRANSIENT_DRIFT: f64 = 0.1;
/// Never-freed blocks of a site allocated in at least this many windows of the run
/// (see `spread_over_run`) are a leak that goes on over the run, not state made once.
pub const MIN_SPREAD_WINDOWS: usize = 5;
/// ... with the first and the last at least this share of the trace apart.
pub const MIN_SPREAD_SHARE: f64 = 0.4;
/// ... and no window holding more than this share of their bytes.
pub const MAX_SPREAD_WINDOW_SHARE: f64 = 0.5;
/// A trough of transient memory must be this share of its peak below the highs on
/// both sides (see `transient_troughs`).
pub const TROUGH_DEPTH: f64 = 0.25;
/// Positions at which transient memory is sampled to find troughs.
pub const TROUGH_SAMPLES: usize = 400;
/// Of what the device allocates after the first block kept by the spread rule, at
/// most this share may still be live at the end (see `leaks_device`).
pub const MAX_SPREAD_RETAINED_SHARE: f64 = 0.25;
/// Points of a suspect's curve, at most.
pub const CURVE_POINTS: usize = 48;
/// Growth spans listed per suspect, at most.
pub const MAX_SPANS: usize = 32;

/// How the iterations were found.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Iterations {
    /// `"steps"` (training steps from evidence, [`crate::steps`]), `"annotation"`,
    /// `"periodicity"` or `"none"`.
    pub source: &'static str,
    /// The scope name (annotation source).
    pub scope: Option<String>,
    /// Period in `alloc` entries and its autocorrelation (periodicity source).
    pub period_allocs: Option<usize>,
    pub autocorrelation: Option<f64>,
    /// Trace index of each iteration's first entry.
    pub boundaries: Vec<usize>,
    /// Why none were found (`source` `"none"`), or why suspects were not reported.
    pub reason: Option<String>,
    /// (Live bytes at the last boundary − at the first) / bytes allocated in between.
    pub retained_share: Option<f64>,
}

/// A call site whose live bytes grow across iterations.
#[derive(Clone, Debug, Serialize)]
pub struct LeakSuspect {
    /// `site` (`file:line:function`), `file`, `line`, `function`, `stack` (folded).
    #[serde(flatten)]
    pub site: Site,
    /// Slope of the least-squares line through the per-iteration live bytes.
    pub growth_bytes_per_iteration: u64,
    /// Samples the fit used (iteration boundaries).
    pub iterations: usize,
    /// Share of growing steps × R², 0–1.
    pub confidence: f64,
    pub growing_steps: usize,
    pub r_squared: f64,
    /// Live bytes of the site at the first and last boundary.
    pub first_bytes: u64,
    pub last_bytes: u64,
    /// Which tests found it: `"growth"` (live bytes grow across iterations) and/or
    /// `"never_freed"` (blocks kept while the site's later allocations are freed).
    pub detected_by: Vec<&'static str>,
    /// Blocks of the site allocated in the trace and never freed: those the
    /// never-freed test counted, else every one live at the end.
    pub never_freed_blocks: u64,
    pub never_freed_bytes: u64,
    /// Trace entries of the first and last of their `alloc`s.
    pub first_never_freed_entry: Option<usize>,
    pub last_never_freed_entry: Option<usize>,
    pub first_never_freed_time_us: Option<i64>,
    /// The site's allocations that the trace frees.
    pub freed_blocks: u64,
    /// Live bytes of the site at the end of the trace.
    pub end_bytes: u64,
    /// Never-freed test: of what the device allocated after the first never-freed
    /// block (never-freed blocks of all suspects left out), the share still live at
    /// the end (a build-up keeps most of it; a run that goes on frees it).
    pub kept_share_after: Option<f64>,
    /// Live bytes of the site at each iteration boundary (or each of [`WINDOWS`]
    /// windows of the run), at most [`CURVE_POINTS`] of them, then at the end
    /// (`entry` null).
    pub curve: Vec<CurvePoint>,
    /// `"iteration"` (the curve's points are iteration boundaries) or `"window"`.
    pub curve_unit: &'static str,
    /// When it grew: the never-freed blocks grouped by the iteration (or window) that
    /// allocated them, at most [`MAX_SPANS`].
    pub grew_in: Vec<GrowthSpan>,
    /// `"iteration"` or `"window"` (of [`WINDOWS`] equal shares of the trace): what
    /// `grew_in[].window` counts.
    pub grew_in_unit: &'static str,
}

/// Live bytes of a site just before a trace entry (`entry` null: at the end).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct CurvePoint {
    pub entry: Option<usize>,
    pub bytes: u64,
}

/// Never-freed blocks allocated in one iteration (or window) of the run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct GrowthSpan {
    /// Index of the iteration (or window; see `iterations.source`).
    pub window: usize,
    pub first_entry: usize,
    pub last_entry: usize,
    pub blocks: u64,
    pub bytes: u64,
}

/// Leak analysis of one device.
#[derive(Clone, Debug, Serialize)]
pub struct DeviceLeaks {
    pub device: i64,
    pub iterations: Iterations,
    /// Smallest slope reported, bytes per iteration.
    pub threshold_bytes_per_iteration: u64,
    /// Most growth first.
    pub suspects: Vec<LeakSuspect>,
}

/// One name for every numbered occurrence of a scope: a trailing number after `#`, a
/// space, `_`, `-`, `:` or `=` (`ProfilerStep#12`, `iteration 3`, `step_7`,
/// `epoch=2`) becomes `N`.
fn normalize_scope(name: &str) -> String {
    let digits = name.bytes().rev().take_while(u8::is_ascii_digit).count();
    let head = &name[..name.len() - digits];
    if digits > 0 && head.ends_with(['#', ' ', '_', '-', ':', '=']) {
        return format!("{head}N");
    }
    name.to_string()
}

/// Whether a scope name says it is a step of a loop (`step`, `iteration`, `epoch`,
/// `batch`, a training or forward/backward marker, or a number: `ProfilerStep#3`).
/// Nested scopes must, to be iterations: a named scope inside a step is a phase or a
/// layer of it.
fn step_like(name: &str) -> bool {
    let l = name.to_ascii_lowercase();
    normalize_scope(name) != name
        || ["step", "iter", "epoch", "batch", "train", "forward", "fwd", "backward", "bwd", "loop"]
            .iter()
            .any(|k| l.contains(k))
}

/// Scope names that mark compiler or library internals, not the user's loop:
/// `torch.compile`'s timed phases (`... (dynamo_timed)`, `CachingAutotuner.*`,
/// `pad_mm_benchmark`), Inductor / dynamo / compiled regions, aten ops, collectives and
/// FSDP's per-module scopes (they repeat per layer, not per step).
pub fn is_internal_scope(name: &str) -> bool {
    let l = name.to_ascii_lowercase();
    ["dynamo", "inductor", "autotun", "benchmark", "compile", "graphlowering", "cudagraph", "triton"]
        .iter()
        .any(|k| l.contains(k))
        || ["aten::", "nccl:", "fsdp::", "c10d::", "cuda", "memcpy", "memset"].iter().any(|p| l.starts_with(p))
}

/// Iterations must look like a loop over the run: at least [`MIN_ITERATIONS`], covering
/// at least [`MIN_LOOP_COVERAGE`] of the trace, with no gap between two boundaries
/// over [`MAX_GAP_RATIO`] times the median gap (a short pattern repeated in one or two
/// clusters, with the run's real work in between, is not a loop).
fn looks_like_a_loop(b: &[usize], n: usize) -> Result<(), String> {
    if b.len() < MIN_ITERATIONS {
        return Err(format!("{} repeats are too few", b.len()));
    }
    let mut gaps: Vec<usize> = b.windows(2).map(|w| w[1] - w[0]).collect();
    gaps.sort_unstable();
    let median = gaps[gaps.len() / 2].max(1);
    let largest = *gaps.last().unwrap();
    let covered = b.last().unwrap() - b[0] + median;
    if covered * 100 < n * (MIN_LOOP_COVERAGE * 100.0) as usize {
        return Err(format!(
            "{} repeats cover {:.0}% of the trace (a loop covers at least {:.0}%)",
            b.len(),
            100.0 * covered as f64 / n.max(1) as f64,
            MIN_LOOP_COVERAGE * 100.0
        ));
    }
    if largest > MAX_GAP_RATIO * median {
        return Err(format!(
            "{} repeats are clustered: one gap is {} entries, {}x the median gap of {}",
            b.len(),
            largest,
            largest / median,
            median
        ));
    }
    Ok(())
}

fn from_annotations(snap: &Snapshot, device: i64) -> Option<Iterations> {
    let trace = snap.trace(device);
    if trace.is_empty() || trace.iter().any(|e| e.time_us == NO_TIME) {
        return None;
    }
    let scopes = Scopes::new(snap, device);
    // Outermost occurrences of each name (a scope inside another of the same name is
    // the same step), with the smallest depth the name was seen at. Top-level names
    // count whatever they are called; nested ones only when they say they are steps
    // (`step_like`: a user's `record_function("step")` inside `"train"`).
    let mut starts: FxHashMap<String, (usize, Vec<(i64, i64)>)> = FxHashMap::default();
    for (s, e, n, depth) in scopes.occurrences() {
        let name = &scopes.names[n];
        if s == i64::MIN || is_internal_scope(name) || (depth > 0 && !step_like(name)) {
            continue;
        }
        let entry = starts.entry(normalize_scope(name)).or_insert((depth, Vec::new()));
        entry.0 = entry.0.min(depth);
        if entry.1.last().is_none_or(|&(_, end)| s >= end) {
            entry.1.push((s, e));
        }
    }
    // The outermost name that repeats like a loop (the most frequent at that depth):
    // an outer `train` scope that runs once does not hide the `step`s inside it, and
    // the steps win over the phases or layers inside them.
    let mut cands: Vec<(usize, String, Vec<usize>)> = starts
        .into_iter()
        .map(|(name, (depth, times))| {
            let mut b: Vec<usize> = times
                .iter()
                .map(|&(t, _)| trace.partition_point(|e| e.time_us < t))
                .filter(|&i| i < trace.len())
                .collect();
            b.dedup();
            (depth, name, b)
        })
        .filter(|(_, _, b)| looks_like_a_loop(b, trace.len()).is_ok())
        .collect();
    cands.sort_by(|a, b| a.0.cmp(&b.0).then(b.2.len().cmp(&a.2.len())).then_with(|| a.1.cmp(&b.1)));
    let (_, name, boundaries) = cands.into_iter().next()?;
    Some(Iterations { source: "annotation", scope: Some(name), boundaries, ..Iterations::default() })
}

/// Iterations from the trace's periodicity. `sized`: an alloc's signature is its request
/// size and stack; otherwise its site alone (the innermost user frame): a loop whose
/// shapes or call paths change from step to step (variable sequence lengths, a model
/// run at growing resolutions) repeats its sites.
fn from_periodicity(snap: &Snapshot, device: i64, sized: bool) -> Result<Iterations, String> {
    let trace = snap.trace(device);
    // Signatures of allocs, interned to small ids.
    let mut ids: FxHashMap<(u64, u64), u32> = FxHashMap::default();
    let mut sites = SiteTable::default();
    let mut site_of_stack: FxHashMap<Option<StackId>, u64> = FxHashMap::default();
    let mut seq: Vec<u32> = Vec::new();
    let mut pos: Vec<usize> = Vec::new(); // trace index of each alloc
    for (i, e) in trace.iter().enumerate() {
        if e.action == Action::Alloc {
            let n = ids.len() as u32;
            let key = if sized {
                (e.size, e.stack.map_or(0, |s| s.index() as u64 + 1))
            } else {
                (
                    0,
                    *site_of_stack
                        .entry(e.stack)
                        .or_insert_with(|| sites.of_block(&snap.frames, e.stack, false) as u64),
                )
            };
            seq.push(*ids.entry(key).or_insert(n));
            pos.push(i);
        }
    }
    let n = seq.len();
    if n < 2 * MIN_ITERATIONS {
        return Err(format!("{n} allocations are too few to find iterations"));
    }
    // Gap histogram between consecutive occurrences of each signature.
    // (Counted in an array: gaps are at most n / MIN_ITERATIONS, and a hash update per
    // allocation was most of this function's time on a long trace.)
    let mut last: Vec<usize> = vec![usize::MAX; ids.len()];
    let mut gaps: Vec<u64> = vec![0; n / MIN_ITERATIONS + 1];
    for (i, &s) in seq.iter().enumerate() {
        let l = last[s as usize];
        if l != usize::MAX && i - l <= n / MIN_ITERATIONS {
            gaps[i - l] += 1;
        }
        last[s as usize] = i;
    }
    let mut cand: Vec<(usize, u64)> = gaps.iter().enumerate().filter(|g| *g.1 > 0).map(|(g, &c)| (g, c)).collect();
    cand.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    cand.truncate(24);
    if cand.is_empty() {
        return Err("no allocation repeats".into());
    }
    let ac = |p: usize| {
        let m = n - p;
        // Pairwise over two slices, which the compiler turns into vector compares.
        let same = seq[..m].iter().zip(&seq[p..]).filter(|(a, b)| a == b).count();
        same as f64 / m as f64
    };
    let scored: Vec<(usize, f64)> = cand.iter().map(|&(p, _)| (p, ac(p))).collect();
    let best = scored.iter().map(|s| s.1).fold(0.0, f64::max);
    if best < MIN_AUTOCORRELATION {
        return Err(format!("no periodic pattern (best autocorrelation {best:.2})"));
    }
    let (period, corr) = scored.iter().filter(|s| s.1 >= best * 0.95).min_by_key(|s| s.0).copied().unwrap();
    // Anchor: the signature whose consecutive gaps equal the period most often.
    let mut hits: Vec<(u32, u32, usize)> = vec![(0, 0, usize::MAX); ids.len()]; // (exact gaps, count, first)
    let mut last = vec![usize::MAX; ids.len()];
    for (i, &s) in seq.iter().enumerate() {
        let h = &mut hits[s as usize];
        let l = last[s as usize];
        if l == usize::MAX {
            h.2 = i;
        } else if i - l == period {
            h.0 += 1;
        }
        h.1 += 1;
        last[s as usize] = i;
    }
    // Most exact gaps, but a signature that also repeats inside the period (more
    // occurrences than gaps of one period) is a worse anchor.
    let anchor = (0..ids.len())
        .max_by(|&a, &b| {
            let (x, y) = (hits[a], hits[b]);
            let score = |h: (u32, u32, usize)| h.0 as i64 * 2 - h.1 as i64;
            score(x).cmp(&score(y)).then(y.2.cmp(&x.2))
        })
        .unwrap() as u32;
    let boundaries: Vec<usize> = seq.iter().enumerate().filter(|(_, &s)| s == anchor).map(|(i, _)| pos[i]).collect();
    if boundaries.len() < MIN_ITERATIONS {
        return Err(format!("period of {period} allocations repeats fewer than {MIN_ITERATIONS} times"));
    }
    Ok(Iterations {
        source: "periodicity",
        scope: None,
        period_allocs: Some(period),
        autocorrelation: Some(corr),
        boundaries,
        reason: None,
        retained_share: None,
    })
}

/// The iterations of one device's trace (module doc).
pub fn iterations(snap: &Snapshot, device: i64) -> Iterations {
    if let Some(it) = from_annotations(snap, device) {
        return it;
    }
    let trace = snap.trace(device);
    let n = trace.len();
    let periodic =
        |sized| from_periodicity(snap, device, sized).and_then(|it| looks_like_a_loop(&it.boundaries, n).map(|_| it));
    match periodic(true) {
        Ok(it) => it,
        // Steps whose request sizes change (the same code on other shapes) repeat
        // their stacks only.
        Err(reason) => match periodic(false).ok().filter(|_| trace.iter().any(|e| e.stack.is_some())) {
            Some(it) => it,
            None => Iterations { source: "none", reason: Some(reason), ..Iterations::default() },
        },
    }
}

/// The iterations of one device's trace from its training steps ([`crate::steps`]) when
/// it has any: the steps' starts when there are [`MIN_ITERATIONS`] or more (source
/// `"steps"`); none when there are fewer (one or two steps: growth across steps cannot be
/// told, and the repeats inside a step are its layers, not iterations); the annotations
/// or the periodicity ([`iterations`]) when the trace shows no step at all.
pub fn iterations_with_steps(snap: &Snapshot, device: i64, st: &crate::steps::Steps) -> Iterations {
    match st.steps.len() {
        0 => iterations(snap, device),
        n if n < MIN_ITERATIONS => Iterations {
            source: "none",
            reason: Some(format!(
                "only {n} training step{} in the trace ({}): leaks across steps cannot be told from it (growth inside a step is activations); record {MIN_ITERATIONS} steps or more, or mark them with fragscope.torch.phase(\"step\")",
                if n == 1 { "" } else { "s" },
                st.describe()
            )),
            ..Iterations::default()
        },
        _ => Iterations {
            source: "steps",
            scope: None,
            boundaries: st.steps.iter().map(|s| s.start).collect(),
            ..Iterations::default()
        },
    }
}

/// The blocks of each site, in alloc order: `by_site[s]` is a slice of block indices
/// (one list for all sites, cut at `start`, instead of a vector per site).
struct BySite {
    start: Vec<usize>,
    blocks: Vec<usize>,
    /// Per site: how many of its blocks are never freed, and its first free (the
    /// never-freed tests start from these, and most sites keep nothing).
    never_freed: Vec<usize>,
    first_free: Vec<Option<usize>>,
}

impl BySite {
    fn new(blocks: &[TracedLife], sites: &[u32], nsites: usize) -> Self {
        let mut start = vec![0usize; nsites + 1];
        let mut never_freed = vec![0usize; nsites];
        let mut first_free: Vec<Option<usize>> = vec![None; nsites];
        for (b, &site) in blocks.iter().zip(sites) {
            let s = site as usize;
            start[s + 1] += 1;
            match b.end_entry() {
                None => never_freed[s] += 1,
                Some(f) => first_free[s] = Some(first_free[s].map_or(f, |x| x.min(f))),
            }
        }
        for s in 0..nsites {
            start[s + 1] += start[s];
        }
        let mut next = start.clone();
        let mut list = vec![0usize; sites.len()];
        for (k, &site) in sites.iter().enumerate() {
            list[next[site as usize]] = k;
            next[site as usize] += 1;
        }
        BySite { start, blocks: list, never_freed, first_free }
    }
}

impl std::ops::Index<usize> for BySite {
    type Output = [usize];
    fn index(&self, s: usize) -> &[usize] {
        &self.blocks[self.start[s]..self.start[s + 1]]
    }
}

/// What one walk over the trace gives the leak analysis.
struct Walk<'a> {
    table: SiteTable,
    /// Live bytes per site at each sample position, then one more row: the end.
    samples: Vec<Vec<u64>>,
    /// Bytes allocated between the first and the last sample position.
    allocated_between: u64,
    /// Blocks allocated in the trace, in `alloc` order (the block lives, read in place:
    /// millions per device), and the site of each.
    blocks: &'a [TracedLife],
    sites: Vec<u32>,
    /// Sizes of the blocks allocated before the trace began (weights, state).
    resident: Vec<u64>,
}

/// Live bytes per site at each position (the state before that trace entry) and at the
/// end, and the life of every block the trace allocates, from the block lives
/// ([`crate::lives`]). O(blocks · log positions + positions · sites).
fn walk<'a>(snap: &Snapshot, lives: &'a BlockLives, positions: &[usize]) -> Walk<'a> {
    let frames = &snap.frames;
    // Sites are numbered in the order the blocks appear: those live at t = 0, then the
    // blocks the trace allocates, in `alloc` order.
    let mut table = SiteTable::default();
    let seeded: Vec<usize> = lives.seeded.iter().map(|b| table.of_block(frames, b.stack, true)).collect();
    let blocks = lives.traced.as_slice();
    // Sites are far fewer than 2^32 (they are distinct call stacks).
    let sites: Vec<u32> = blocks.iter().map(|l| table.of_block(frames, l.stack, false) as u32).collect();
    let first = positions.first().copied().unwrap_or(0);
    let last = positions.last().copied().unwrap_or(0);
    let allocated_between = blocks.iter().filter(|b| b.alloc >= first && b.alloc < last).map(|b| b.size).sum();
    let samples = lives::live_bytes_at(
        positions,
        table.sites.len(),
        lives
            .seeded
            .iter()
            .zip(&seeded)
            .map(|(b, &site)| (site, None, b.end, b.size))
            .chain(blocks.iter().zip(&sites).map(|(l, &site)| (site as usize, Some(l.alloc), l.end, l.size))),
    );
    let resident = lives.seeded.iter().map(|b| b.size).collect();
    Walk { table, samples, allocated_between, blocks, sites, resident }
}

/// Bytes of blocks from some block index to the last (blocks in `alloc` order): all of
/// them, those still live at the end, those freed.
#[derive(Clone, Copy, Default, Debug, PartialEq)]
struct Sums {
    alloc: u64,
    live: u64,
    freed: u64,
}

impl Sums {
    fn add(&mut self, b: &TracedLife) {
        self.alloc += b.size;
        if b.end_entry().is_none() {
            self.live += b.size;
        } else {
            self.freed += b.size;
        }
    }
}

/// [`Sums`] from each of a few block indices to the end, from one pass over the blocks.
struct SuffixSums {
    /// (block index, sums from it to the end), by index.
    at: Vec<(usize, Sums)>,
}

impl SuffixSums {
    fn new(blocks: &[TracedLife], from: &[usize]) -> Self {
        let mut idx = from.to_vec();
        idx.sort_unstable();
        idx.dedup();
        // Sums before each index, then the total: suffix = total − prefix.
        let mut before = Vec::with_capacity(idx.len());
        let mut acc = Sums::default();
        let mut next = idx.iter().peekable();
        for (k, b) in blocks.iter().enumerate() {
            while next.next_if(|&&i| i == k).is_some() {
                before.push((k, acc));
            }
            acc.add(b);
        }
        let at = before
            .into_iter()
            .map(|(k, p)| (k, Sums { alloc: acc.alloc - p.alloc, live: acc.live - p.live, freed: acc.freed - p.freed }))
            .collect();
        SuffixSums { at }
    }

    fn at(&self, k: usize) -> Sums {
        self.at.binary_search_by_key(&k, |x| x.0).map_or(Sums::default(), |i| self.at[i].1)
    }
}

/// [`Sums`] of a few blocks (sorted indices) from any block index to the end.
struct SubsetSums {
    idx: Vec<usize>,
    /// `suffix[j]`: sums of the blocks `idx[j..]`.
    suffix: Vec<Sums>,
}

impl SubsetSums {
    fn new(blocks: &[TracedLife], mut idx: Vec<usize>) -> Self {
        idx.sort_unstable();
        let mut suffix = vec![Sums::default(); idx.len() + 1];
        for j in (0..idx.len()).rev() {
            suffix[j] = suffix[j + 1];
            suffix[j].add(&blocks[idx[j]]);
        }
        SubsetSums { idx, suffix }
    }

    fn from(&self, k: usize) -> Sums {
        self.suffix[self.idx.partition_point(|&j| j < k)]
    }
}

/// Least squares of y against 0..n: (slope, R²).
fn fit(y: &[f64]) -> (f64, f64) {
    let n = y.len() as f64;
    let mx = (n - 1.0) / 2.0;
    let my = y.iter().sum::<f64>() / n;
    let (mut sxy, mut sxx, mut syy) = (0.0, 0.0, 0.0);
    for (i, &v) in y.iter().enumerate() {
        let dx = i as f64 - mx;
        let dy = v - my;
        sxy += dx * dy;
        sxx += dx * dx;
        syy += dy * dy;
    }
    if sxx == 0.0 {
        return (0.0, 0.0);
    }
    let slope = sxy / sxx;
    let r2 = if syy == 0.0 { 0.0 } else { (sxy * sxy) / (sxx * syy) };
    (slope, r2)
}

/// Smallest growth per iteration reported by the growth test: min(1 MiB, 1% of the
/// device's peak allocated bytes).
pub fn growth_threshold(peak_allocated: u64) -> u64 {
    (1u64 << 20).min(peak_allocated / 100).max(1)
}

/// Fewest never-freed bytes reported by the never-freed test: 4 MiB, or 0.1% of the
/// device's peak allocated bytes when that is more (a few MB kept for good is not a
/// problem on a GPU of tens of GB; a few MB per step is, and the growth test sees it).
pub fn never_freed_threshold(peak_allocated: u64) -> u64 {
    (4u64 << 20).max(peak_allocated / 1000)
}

/// Whether a suspect clears the thresholds of a device whose peak allocated bytes are
/// `peak_allocated` (`leaks_device` computes suspects against its own thresholds;
/// `analyze` runs it before the peak is known and filters with this).
pub fn reportable(s: &LeakSuspect, peak_allocated: u64) -> bool {
    (s.detected_by.contains(&"growth") && s.growth_bytes_per_iteration >= growth_threshold(peak_allocated))
        || (s.detected_by.contains(&"never_freed") && s.never_freed_bytes >= never_freed_threshold(peak_allocated))
}

/// Sample positions: the iteration boundaries (thinned evenly to [`MAX_SAMPLES`]), else
/// [`WINDOWS`] + 1 evenly spaced trace positions.
fn sample_positions(it: &Iterations, n: usize) -> Vec<usize> {
    let b = &it.boundaries;
    if b.len() >= MIN_ITERATIONS {
        if b.len() <= MAX_SAMPLES {
            b.clone()
        } else {
            (0..MAX_SAMPLES).map(|k| b[k * (b.len() - 1) / (MAX_SAMPLES - 1)]).collect()
        }
    } else {
        let mut v: Vec<usize> = (0..=WINDOWS).map(|k| k * n / WINDOWS).collect();
        v.dedup();
        v
    }
}

/// The spread rule of the never-freed test, on the windows of the run (module doc):
/// the site's blocks never freed that outlived [`MIN_OUTLIVED_SHARE`] of the run, when
/// they were allocated over the run rather than at one time. State is made once, when
/// its site first runs (weights loaded, optimizer state at the first step, gradients
/// at the first backward): one or two windows. A leak goes on allocating while the
/// run goes on: the kept blocks fall in at least [`MIN_SPREAD_WINDOWS`] windows, in at
/// least half of the windows between the first and the last of them, at least
/// [`MIN_SPREAD_SHARE`] of the trace apart, with no window holding more than
/// [`MAX_SPREAD_WINDOW_SHARE`] of their bytes, with at least one of `troughs`
/// ([`transient_troughs`]: step boundaries) between the first and the last. This
/// needs no free of the site at all (a site whose every allocation leaks).
fn spread_over_run(
    blocks: &[TracedLife],
    site_blocks: &[usize],
    n: usize,
    windows: &[usize],
    troughs: &[usize],
) -> Option<Vec<usize>> {
    let kept: Vec<usize> = site_blocks
        .iter()
        .copied()
        .filter(|&k| blocks[k].end_entry().is_none() && (n - blocks[k].alloc) as f64 >= MIN_OUTLIVED_SHARE * n as f64)
        .collect();
    let (first, last) = (blocks[*kept.first()?].alloc, blocks[*kept.last()?].alloc);
    // A trough of transient memory between them: kept in two or more steps.
    let cycles = troughs.partition_point(|&t| t <= last) - troughs.partition_point(|&t| t <= first);
    if ((last - first) as f64) < MIN_SPREAD_SHARE * n as f64 || cycles == 0 {
        return None;
    }
    let mut per_window: Vec<(usize, u64)> = Vec::new();
    for &k in &kept {
        let w = windows.partition_point(|&x| x <= blocks[k].alloc);
        match per_window.last_mut() {
            Some((lw, b)) if *lw == w => *b += blocks[k].size,
            _ => per_window.push((w, blocks[k].size)),
        }
    }
    let total: u64 = per_window.iter().map(|x| x.1).sum();
    let (w0, w1) = (per_window[0].0, per_window[per_window.len() - 1].0);
    let biggest = per_window.iter().map(|x| x.1).max().unwrap_or(0);
    (per_window.len() >= MIN_SPREAD_WINDOWS
        && 2 * per_window.len() > w1 - w0
        && biggest as f64 <= MAX_SPREAD_WINDOW_SHARE * total as f64)
        .then_some(kept)
}

/// `pos.partition_point(|&p| p <= x)` for the evenly spaced positions
/// `k * n / TROUGH_SAMPLES`, k = 0..=TROUGH_SAMPLES, without a search: the number of k
/// with k·n < (x + 1)·TROUGH_SAMPLES.
fn even_slot(x: usize, n: usize) -> usize {
    // In 64 bits when the product fits (always, for real traces): a 128-bit division
    // per block was a visible share of the leak tests.
    if let Some(p) = (x as u64).checked_add(1).and_then(|x1| x1.checked_mul(TROUGH_SAMPLES as u64)) {
        return p.div_ceil(n.max(1) as u64).min(TROUGH_SAMPLES as u64 + 1) as usize;
    }
    let s = TROUGH_SAMPLES as u128;
    (((x as u128 + 1) * s).div_ceil(n.max(1) as u128)).min(s + 1) as usize
}

/// Trace positions where transient memory (blocks the trace frees later) is at the
/// bottom of a full cycle: it rose by at least [`TROUGH_DEPTH`] of its peak since the
/// previous trough and fell back by as much. A training step's forward builds
/// activations up and its backward frees them; one pass (a forward, one backward)
/// has no trough inside, a loop has one between each two steps. Sampled at
/// [`TROUGH_SAMPLES`] positions.
fn transient_troughs(blocks: &[TracedLife], n: usize) -> Vec<usize> {
    let pos: Vec<usize> = (0..=TROUGH_SAMPLES).map(|k| k * n / TROUGH_SAMPLES).collect();
    let mut diff = vec![0i128; pos.len() + 1];
    for b in blocks {
        if let Some(f) = b.end_entry() {
            diff[even_slot(b.alloc, n)] += b.size as i128;
            diff[even_slot(f, n)] -= b.size as i128;
        }
    }
    let mut acc = 0i128;
    let y: Vec<i128> = diff[..pos.len()]
        .iter()
        .map(|d| {
            acc += d;
            acc
        })
        .collect();
    let peak = y.iter().copied().max().unwrap_or(0);
    let h = (peak as f64 * TROUGH_DEPTH) as i128;
    if h <= 0 {
        return Vec::new();
    }
    // Looking for a rise (high = None) from the lowest point so far, or for a fall
    // from the highest; a low counts as a trough once a peak came before it and the
    // curve rose again after it.
    let mut out = Vec::new();
    let (mut low, mut low_at) = (y[0], 0usize);
    let mut high: Option<i128> = None;
    let mut had_peak = false;
    for (k, &v) in y.iter().enumerate() {
        match high {
            None if v < low => (low, low_at) = (v, k),
            None if v >= low + h => {
                if had_peak {
                    out.push(pos[low_at]);
                }
                high = Some(v);
            }
            Some(hi) if v > hi => high = Some(v),
            Some(hi) if v <= hi - h => {
                had_peak = true;
                (low, low_at, high) = (v, k, None);
            }
            _ => {}
        }
    }
    out
}

/// The never-freed test of one site (module doc). Returns the indices (into `blocks`)
/// of the site's blocks that were never freed although the site had freed an earlier
/// allocation, that outlived at least one iteration boundary (without iterations,
/// [`MIN_OUTLIVED_SHARE`] of the run), and that either were followed by at least
/// [`MIN_FREED_AFTER`] freed allocations of the same site (a burst or a phase that
/// kept what the site normally frees) or belong to an accumulation (such blocks
/// allocated in at least [`MIN_ACCUMULATION_WINDOWS`] iterations or windows) or to
/// several phases of the site's activity. `trusted`: the iterations are trusted as
/// steps. The error says why nothing qualified (`FRAGSCOPE_LEAK_DEBUG`).
fn outliving(
    blocks: &[TracedLife],
    by_site: &BySite,
    site: usize,
    n: usize,
    positions: &[usize],
    iterations: bool,
    trusted: bool,
) -> Result<Vec<usize>, String> {
    let site_blocks = &by_site[site];
    let first_free = by_site.first_free[site];
    // Most sites free everything they allocate: they keep nothing.
    if by_site.never_freed[site] == 0 {
        return Err(format!(
            "no block kept long enough (0 never freed, first at None of {n}, first free {first_free:?})"
        ));
    }
    // The site's blocks' (alloc, end), gathered once: the passes below read them in
    // order instead of looking each up among millions of blocks again.
    let own: Vec<(usize, usize)> = site_blocks.iter().map(|&k| (blocks[k].alloc, blocks[k].end)).collect();
    let freed = |j: usize| own[j].1 != LIVE_AT_END;
    // Frees of the site (only the first and counts before a position are asked, so they
    // are not sorted); freed blocks counted from the end in alloc order.
    let frees_before = |x: usize| own.iter().filter(|&&(_, e)| e != LIVE_AT_END && e < x).count();
    let mut freed_after = vec![0usize; own.len() + 1];
    for j in (0..own.len()).rev() {
        freed_after[j] = freed_after[j + 1] + freed(j) as usize;
    }
    // (index in blocks, followed by enough freed siblings, window, index in site_blocks)
    let kept: Vec<(usize, bool, usize, usize)> = (0..own.len())
        .filter_map(|j| {
            let alloc = own[j].0;
            if freed(j) || first_free.is_none_or(|f| f >= alloc) {
                return None;
            }
            let window = positions.partition_point(|&x| x <= alloc);
            let after_boundaries = positions.len() - window;
            let long =
                if iterations { after_boundaries >= 1 } else { (n - alloc) as f64 >= MIN_OUTLIVED_SHARE * n as f64 };
            long.then_some((site_blocks[j], freed_after[j + 1] >= MIN_FREED_AFTER, window, j))
        })
        .collect();
    let Some(&(_, _, w0, _)) = kept.first() else {
        let never: Vec<usize> = own.iter().filter(|&&(_, e)| e == LIVE_AT_END).map(|&(a, _)| a).collect();
        return Err(format!(
            "no block kept long enough ({} never freed, first at {:?} of {n}, first free {:?})",
            never.len(),
            never.first(),
            first_free
        ));
    };
    let mut windows: Vec<usize> = kept.iter().map(|x| x.2).collect();
    windows.dedup();
    // Windows a kept block can be in (those followed by a boundary, or early enough).
    let eligible =
        if iterations { positions.len() } else { positions.len() - (MIN_OUTLIVED_SHARE * WINDOWS as f64) as usize };
    let accumulates = windows.len() >= MIN_ACCUMULATION_WINDOWS.min(eligible.saturating_sub(1)).max(2);
    // Blocks kept from the first window (iteration) the site keeps anything in, with
    // no free of the site before that window, are how the site starts: state made
    // once (optimizer state, gradients of a first backward), not a leak. An
    // accumulation over trusted iterations counts anyway, and so do kept blocks in two
    // or more separate phases of the site's activity, which one-time state is not.
    let start = if w0 == 0 { 0 } else { positions[w0 - 1] };
    // Over iterations, one earlier free is enough for blocks kept in several of them:
    // a site that keeps every other allocation keeps its third after freeing its second.
    let freed_before = frees_before(start);
    let freed_before_w0 = freed_before >= MIN_FREED_AFTER || (iterations && accumulates && freed_before >= 1);
    // Phases of the site's activity: runs of its allocs with no gap over
    // max(n / PHASE_GAP_DIVISOR, 8 × its median gap). A site used once per step
    // (forward, backward, optimizer) has one phase per step; one-time state is made
    // in one phase.
    let allocs: Vec<usize> = own.iter().map(|&(a, _)| a).collect();
    let mut gaps: Vec<usize> = allocs.windows(2).map(|w| w[1] - w[0]).collect();
    // The median gap (the element a sort would put in the middle).
    let mid = gaps.len() / 2;
    let median = if gaps.is_empty() { 0 } else { *gaps.select_nth_unstable(mid).1 };
    let gap = (n / PHASE_GAP_DIVISOR).max(8 * median).max(1);
    let mut phase_of = Vec::with_capacity(allocs.len());
    let mut phase = 0usize;
    for (j, &a) in allocs.iter().enumerate() {
        if j > 0 && a - allocs[j - 1] > gap {
            phase += 1;
        }
        phase_of.push(phase);
    }
    let mut kept_phases: Vec<usize> = kept.iter().map(|&(_, _, _, j)| phase_of[j]).collect();
    kept_phases.dedup();
    let repeated = kept_phases.len() >= 2;
    // Periodicity can take the layers of one backward pass for iterations, so only
    // trusted iterations vouch for an accumulation on their own.
    let vouched = freed_before_w0 || (trusted && accumulates) || repeated;
    if !vouched {
        // What the site kept in its first iteration may be state made once; what it
        // keeps again in later iterations, after freeing in the first, accumulates.
        let later: Vec<usize> = kept.iter().filter(|x| x.2 > w0).map(|x| x.0).collect();
        let mut later_windows: Vec<usize> = kept.iter().filter(|x| x.2 > w0).map(|x| x.2).collect();
        later_windows.dedup();
        if iterations
            && w0 < positions.len()
            && later_windows.len() >= MIN_ACCUMULATION_WINDOWS
            && first_free.is_some_and(|f| f < positions[w0])
        {
            return Ok(later);
        }
        return Err(format!(
            "kept from its first active window {w0} with no earlier free, in {} windows and one phase",
            windows.len()
        ));
    }
    let v: Vec<usize> =
        kept.into_iter().filter(|&(_, followed, _, _)| followed || accumulates || repeated).map(|x| x.0).collect();
    if v.is_empty() {
        return Err(format!("kept blocks not followed by {MIN_FREED_AFTER} freed ones and not accumulating"));
    }
    Ok(v)
}

/// Whether the kept blocks `chosen` of site `site` are one per tensor already held
/// (`resident`: sizes of the blocks from before the trace, counted; and of
/// `kept_for_good`, the traced blocks never freed in alloc order, those of other sites
/// allocated before the first of them), size for size, for at least 90% of their bytes: gradients of the
/// weights at a first backward, optimizer state at a first step. A leak keeps more
/// than one block per weight, or blocks of other sizes (activations).
fn shadows_resident(
    blocks: &[TracedLife],
    sites: &[u32],
    resident: &FxHashMap<u64, u32>,
    kept_for_good: &[usize],
    site: usize,
    chosen: &[usize],
) -> bool {
    let Some(&first) = chosen.first() else { return false };
    let mut held = resident.clone();
    for &k in kept_for_good.iter().take_while(|&&k| k < first) {
        if sites[k] as usize != site {
            *held.entry(blocks[k].size).or_default() += 1;
        }
    }
    let (mut matched, mut total) = (0u64, 0u64);
    for &k in chosen {
        let size = blocks[k].size;
        total += size;
        if let Some(c) = held.get_mut(&size).filter(|c| **c > 0) {
            *c -= 1;
            matched += size;
        }
    }
    matched * 10 >= total * 9
}

/// Downsamples a curve to at most [`CURVE_POINTS`] points (evenly, keeping both ends).
fn thin_curve(pos: &[usize], y: &[u64]) -> Vec<CurvePoint> {
    let n = y.len();
    let pick: Vec<usize> = if n <= CURVE_POINTS {
        (0..n).collect()
    } else {
        (0..CURVE_POINTS).map(|k| k * (n - 1) / (CURVE_POINTS - 1)).collect()
    };
    pick.into_iter().map(|k| CurvePoint { entry: pos.get(k).copied(), bytes: y[k] }).collect()
}

/// Leak suspects of one device; `peak_allocated` sets the thresholds (module doc).
pub fn leaks_device(snap: &Snapshot, device: i64, peak_allocated: u64) -> DeviceLeaks {
    leaks_device_with(snap, device, peak_allocated, iterations(snap, device), &BlockLives::replay(snap, device), 2)
}

/// [`leaks_device`] given the device's [`iterations`] and its block lives (`analyze`
/// takes them from its timeline walk, [`crate::timeline::timeline_with_lives`]).
pub fn leaks_device_with(
    snap: &Snapshot,
    device: i64,
    peak_allocated: u64,
    mut it: Iterations,
    lives: &BlockLives,
    threads: usize,
) -> DeviceLeaks {
    let threshold = growth_threshold(peak_allocated);
    let n = snap.trace(device).len();
    let mut suspects: Vec<LeakSuspect> = Vec::new();
    if n == 0 {
        return DeviceLeaks { device, iterations: it, threshold_bytes_per_iteration: threshold, suspects };
    }
    let has_iterations = it.boundaries.len() >= MIN_ITERATIONS;
    let used = sample_positions(&it, n);
    let w = walk(snap, lives, &used);
    let mut samples = w.samples;
    let at_end = samples.pop().unwrap();
    let nsites = w.table.sites.len();
    let total = |row: &Vec<u64>| row.iter().sum::<u64>() as f64;
    // A "period" that keeps most of what it allocates is a stack of layers in one
    // forward pass (saved activations) or a loading phase, not a training step:
    // a step frees its temporaries, and a leak keeps a small part of them.
    let kept = total(samples.last().unwrap()) - total(&samples[0]);
    let retained = if w.allocated_between == 0 { 0.0 } else { kept / w.allocated_between as f64 };
    // Annotation scopes that do not say they are steps (`attn`, `layer_N`) can be the
    // layers of one pass as well, and are judged the same way.
    let inferred = it.source == "periodicity" || it.scope.as_deref().is_some_and(|n| !step_like(n));
    let builds_up = has_iterations && inferred && retained > MAX_RETAINED_SHARE;
    if has_iterations {
        it.retained_share = Some(retained);
        if builds_up {
            it.reason = Some(format!(
                "each period keeps {:.0}% of the bytes it allocates: a build-up (layers of one pass, loading), not repeated steps; growth per iteration not tested",
                retained * 100.0
            ));
        }
    }
    // The never-freed test's time axis: iterations when they are steps, else windows.
    let steps = has_iterations && !builds_up;
    let windows: Vec<usize> = sample_positions(&Iterations::default(), n);

    // Blocks of each site, in alloc order.
    let by_site = BySite::new(w.blocks, &w.sites, nsites);
    let bytes_of = |v: &[usize]| v.iter().map(|&k| w.blocks[k].size).sum::<u64>();

    // The never-freed test over windows of the run (and the spread rule) does not depend
    // on the iterations or on the rest of memory: once per site, on a second thread
    // beside the transient-memory, growth and over-iterations tests.
    let by_windows = || -> Vec<(Result<Vec<usize>, String>, bool)> {
        let troughs = transient_troughs(w.blocks, n);
        (0..nsites)
            .map(|s| {
                let mut by_win = outliving(w.blocks, &by_site, s, n, &windows, false, false);
                let mut spread = false;
                let spread_of = || spread_over_run(w.blocks, &by_site[s], n, &windows, &troughs);
                if let Some(v) = (by_site.never_freed[s] > 0).then(spread_of).flatten() {
                    if by_win.as_deref().map_or(0, bytes_of) < bytes_of(&v) {
                        by_win = Ok(v);
                        spread = true;
                    }
                }
                (by_win, spread)
            })
            .collect()
    };
    let (transient_slope, grows, over_iters, by_win_of) = std::thread::scope(|scope| {
        let windows_thread = (threads > 1).then(|| scope.spawn(by_windows));

        // Transient memory (blocks the trace frees later) at each sample position. Across
        // real steps it returns to one level at each boundary whatever leaks beside it;
        // across the layers of one pass it trends (activations saved, then freed).
        let mut diff = vec![0i128; used.len() + 1];
        let mut from = 0usize; // blocks come in alloc order: no search for the alloc side
        let after = lives::PositionIndex::new(&used);
        for b in w.blocks.iter() {
            while from < used.len() && used[from] <= b.alloc {
                from += 1;
            }
            if let Some(f) = b.end_entry() {
                // Live at sample position p when alloc < p <= free.
                let to = after.count_le(f);
                diff[from] += b.size as i128;
                diff[to] -= b.size as i128;
            }
        }
        let mut acc = 0i128;
        let transient: Vec<f64> = diff[..used.len()]
            .iter()
            .map(|d| {
                acc += d;
                acc as f64
            })
            .collect();
        let transient_slope = if transient.len() >= 2 { fit(&transient).0 } else { 0.0 };
        // Iterations vouch for an accumulation on their own when they come from loop
        // annotations, or from periodicity with transient memory that drifts by at most
        // MAX_TRANSIENT_DRIFT of its peak over the whole run (steps, not layers).
        let peak_transient = transient.iter().copied().fold(0.0, f64::max);
        let trusted_steps = steps
            && (it.source == "annotation"
                || it.source == "steps"
                || (transient_slope.abs() * transient.len() as f64) <= MAX_TRANSIENT_DRIFT * peak_transient);

        // 1. Growth across iterations (module doc).
        let mut grows: Vec<Option<(f64, f64, usize)>> = vec![None; nsites];
        for (s, g) in grows.iter_mut().enumerate().filter(|_| has_iterations && !builds_up) {
            let y: Vec<u64> = samples.iter().map(|row| row.get(s).copied().unwrap_or(0)).collect();
            let steps = y.len() - 1;
            let growing = y.windows(2).filter(|w| w[1] > w[0]).count();
            let share = growing as f64 / steps as f64;
            // Growth handed back before the trace ends (activations freed by the
            // backward pass) is not a leak: keep at least half of it at the end.
            let end = at_end.get(s).copied().unwrap_or(0);
            if share < MIN_GROWING_SHARE || y[steps] <= y[0] || end < y[0] + (y[steps] - y[0]) / 2 {
                continue;
            }
            let yf: Vec<f64> = y.iter().map(|&v| v as f64).collect();
            let (slope, r2) = fit(&yf);
            if slope < threshold as f64 {
                continue;
            }
            // Periodicity also finds the layers of one pass (backward: each layer frees
            // activations and keeps gradients). Across real steps everything else returns
            // to the same level at each boundary; across layers it trends. So with
            // periodicity-derived iterations, the rest of memory must be steady.
            if it.source == "periodicity" {
                let rest: Vec<f64> = samples.iter().zip(&y).map(|(row, &v)| total(row) - v as f64).collect();
                let (rest_slope, _) = fit(&rest);
                let allowed = (threshold as f64).max(slope * MAX_REST_TREND);
                if rest_slope.abs() > allowed || transient_slope.abs() > allowed {
                    continue;
                }
            }
            *g = Some((slope, (share * r2).clamp(0.0, 1.0), growing));
        }

        // 2. Blocks never freed while the site's later allocations are (module doc).
        // The never-freed test over iterations, once per site (it does not depend on the
        // rest); sites it keeps enough of are left out of each other's rest below.
        let over_iters: Vec<Result<Vec<usize>, String>> = (0..nsites)
            .map(|s| {
                if steps {
                    outliving(w.blocks, &by_site, s, n, &used, true, trusted_steps)
                } else {
                    Err("no iterations".into())
                }
            })
            .collect();
        let by_win_of = match windows_thread {
            Some(h) => h.join().expect("the leak tests' second thread panicked"),
            None => by_windows(),
        };
        (transient_slope, grows, over_iters, by_win_of)
    });
    let min_kept = never_freed_threshold(peak_allocated);
    // FRAGSCOPE_LEAK_DEBUG=TEXT prints the never-freed test's decision for sites
    // containing TEXT (for tuning on planted files).
    let debug = std::env::var("FRAGSCOPE_LEAK_DEBUG").ok();
    let mut kept: Vec<Vec<usize>> = vec![Vec::new(); nsites];
    // Per site: kept blocks and whether they were judged over iterations (else over
    // windows of the run). Both axes are tried: periodicity can find the layers of
    // one pass rather than steps, and then the windows still see a leak.
    let mut over_iterations = vec![false; nsites];
    let mut spread = vec![false; nsites];
    // Several leaks at once: each is part of the others' "rest of memory", which then
    // trends. Candidates (kept blocks on either axis, or growth) are taken out of the
    // rest and the sites that failed only on the rest's trend are tried again, until
    // nothing changes. The build-up check below still judges every candidate.
    let site_row = |s: usize| samples.iter().map(|row| row.get(s).copied().unwrap_or(0) as f64).collect::<Vec<_>>();
    let mut out_of_rest = vec![0f64; samples.len()];
    let mut taken = vec![false; nsites];
    for s in (0..nsites).filter(|&s| grows[s].is_some()) {
        out_of_rest.iter_mut().zip(site_row(s)).for_each(|(o, v)| *o += v);
        taken[s] = true;
    }
    // Bytes of blocks never freed (kept to the end) at each sample position: of one
    // site, and of the whole device.
    let kept_row = |blocks: &mut dyn Iterator<Item = usize>| {
        let mut d = vec![0f64; used.len() + 1];
        for k in blocks {
            let b = w.blocks[k];
            if b.end_entry().is_none() {
                d[used.partition_point(|&p| p <= b.alloc)] += b.size as f64;
            }
        }
        let mut acc = 0.0;
        d[..used.len()]
            .iter()
            .map(|x| {
                acc += x;
                acc
            })
            .collect::<Vec<f64>>()
    };
    // Tensors held for good (sizes of the blocks from before the trace; the traced
    // blocks never freed), for `shadows_resident`: computed when first needed.
    let held = std::cell::OnceCell::new();
    // Only needed when a site's rest trends (rare on a steady run): computed then.
    let kept_total = std::cell::OnceCell::new();
    let provisional: Vec<bool> =
        over_iters.iter().map(|r| r.as_deref().is_ok_and(|v| bytes_of(v) >= min_kept)).collect();
    let mut rest_trended = vec![true; nsites];
    let mut again = true;
    while again {
        let taken_out = out_of_rest.clone();
        let todo: Vec<usize> = (0..nsites).filter(|&s| rest_trended[s]).collect();
        for s in todo {
            rest_trended[s] = false;
            let mut by_iter = over_iters[s].clone();
            // With periodicity-derived iterations the rest of memory must be steady across
            // them (as for the growth test): in one backward pass, gradients are kept layer
            // by layer while activations are freed.
            if it.source == "periodicity" && by_iter.is_ok() {
                let y: Vec<f64> = samples.iter().map(|row| row.get(s).copied().unwrap_or(0) as f64).collect();
                let rest: Vec<f64> =
                    samples.iter().zip(&y).zip(&taken_out).map(|((row, &v), &o)| total(row) - v - o).collect();
                let (site_slope, _) = fit(&y);
                let (rest_slope, _) = fit(&rest);
                let allowed = (threshold as f64).max(site_slope.abs() * MAX_REST_TREND);
                // Steps whose sizes change (a loop over growing resolutions, variable
                // lengths) make the rest and the transient memory trend as well. What a
                // backward pass shows, and a loop does not, is the rest keeping more
                // for good at each boundary (gradients) while transient memory falls
                // (activations freed).
                let steps_of_changing_size = || {
                    let mut others = (0..nsites)
                        .filter(|&x| x == s || taken[x] || provisional[x])
                        .flat_map(|x| by_site[x].iter().copied());
                    let own = kept_row(&mut others);
                    let all = kept_total.get_or_init(|| kept_row(&mut (0..w.blocks.len())));
                    let rest_kept: Vec<f64> = all.iter().zip(&own).map(|(t, o)| t - o).collect();
                    fit(&rest_kept).0.abs() <= allowed && transient_slope >= -allowed
                };
                if (rest_slope.abs() > allowed || transient_slope.abs() > allowed) && !steps_of_changing_size() {
                    rest_trended[s] = transient_slope.abs() <= allowed;
                    by_iter = Err(format!(
                        "rest of memory trends {rest_slope:.0} B/iteration (blocks freed later: {transient_slope:.0})"
                    ));
                }
            }
            let (by_win, spread_won) = by_win_of[s].clone();
            spread[s] |= spread_won;
            if let Some(d) = debug.as_deref().filter(|d| w.table.sites[s].site.contains(d)) {
                let show =
                    |r: &Result<Vec<usize>, String>| r.as_ref().map(|v| (v.len(), bytes_of(v))).map_err(String::clone);
                eprintln!(
                    "leaks: {d}: {}: iterations {:?}, windows {:?} (min {min_kept} bytes)",
                    w.table.sites[s].site,
                    show(&by_iter),
                    show(&by_win)
                );
            }
            let bi = by_iter.as_deref().map_or(0, bytes_of);
            let bw = by_win.as_deref().map_or(0, bytes_of);
            if bi.max(bw) < min_kept {
                continue;
            }
            let chosen = if bi >= bw { by_iter.unwrap_or_default() } else { by_win.unwrap_or_default() };
            // A leak makes the site hold more: from just before its first kept block to
            // the end, its live bytes (blocks from before the trace included) grow by at
            // least half of what it keeps. A site that keeps a new block for each old
            // one it frees (optimizer state replaced, a cache rebuilt) does not grow.
            let before = used.partition_point(|&p| p <= w.blocks[chosen[0]].alloc).saturating_sub(1);
            let held_before = samples.get(before).and_then(|row| row.get(s)).copied().unwrap_or(0);
            let grew = at_end.get(s).copied().unwrap_or(0).saturating_sub(held_before);
            if 2 * grew < bytes_of(&chosen) {
                if debug.as_deref().is_some_and(|d| w.table.sites[s].site.contains(d)) {
                    eprintln!(
                        "leaks: {}: live bytes grew by {grew} only, keeping {}",
                        w.table.sites[s].site,
                        bytes_of(&chosen)
                    );
                }
                continue;
            }
            // State is made when its site first runs: only kept blocks that start within
            // a tenth of the trace of the site's first allocation can be state.
            let first_use = by_site[s].first().map_or(0, |&k| w.blocks[k].alloc);
            if w.blocks[chosen[0]].alloc - first_use <= n / 10 {
                let (resident, kept_for_good) = held.get_or_init(|| {
                    let mut r: FxHashMap<u64, u32> = FxHashMap::default();
                    for &size in &w.resident {
                        *r.entry(size).or_default() += 1;
                    }
                    let k: Vec<usize> = (0..w.blocks.len()).filter(|&k| w.blocks[k].end_entry().is_none()).collect();
                    (r, k)
                });
                if shadows_resident(w.blocks, &w.sites, resident, kept_for_good, s, &chosen) {
                    if debug.as_deref().is_some_and(|d| w.table.sites[s].site.contains(d)) {
                        eprintln!("leaks: {}: one kept block per tensor held before: state", w.table.sites[s].site);
                    }
                    continue;
                }
            }
            over_iterations[s] = bi >= bw;
            let was_kept = !kept[s].is_empty();
            kept[s] = chosen;
            if !was_kept && grows[s].is_none() {
                out_of_rest.iter_mut().zip(site_row(s)).for_each(|(o, v)| *o += v);
                taken[s] = true;
            }
        }
        // Another pass only when a site was taken out of the rest in this one.
        again = rest_trended.iter().any(|&r| r) && out_of_rest != taken_out;
    }
    // Build-up check: of what the whole device allocates after a candidate's first
    // never-freed block, at most MAX_RETAINED_SHARE may still be live at the end. A
    // forward pass that keeps its activations keeps most of it; a run that goes on in
    // steps frees it. The site's own never-freed blocks are left out, and so are those
    // of sites already confirmed (several leaks at once must not hide each other);
    // confirmation repeats until nothing changes.
    // Sites kept by the spread rule alone have no free of their own to compare with:
    // they are judged once, against everything else the device keeps (other
    // candidates included), with the stricter MAX_SPREAD_RETAINED_SHARE; several
    // passes that each keep their activations do not confirm each other.
    let by_spread: Vec<bool> = (0..nsites).map(|s| spread[s] && !over_iterations[s]).collect();
    let mut confirmed = vec![false; nsites];
    let mut kept_after_share: Vec<Option<f64>> = vec![None; nsites];
    let mut first_round = true;
    // Sums over the blocks from each candidate's first kept block to the end: of all
    // blocks, once, less those of the few blocks left out in each round (kept blocks),
    // instead of suffix sums over millions of blocks per round.
    let firsts: Vec<usize> = kept.iter().filter_map(|v| v.first().copied()).collect();
    let from_first = SuffixSums::new(w.blocks, &firsts);
    loop {
        let excluded =
            SubsetSums::new(w.blocks, (0..nsites).filter(|&s| confirmed[s]).flat_map(|s| kept[s].clone()).collect());
        let mut changed = false;
        for s in 0..nsites {
            if confirmed[s] || (by_spread[s] && !first_round) {
                continue;
            }
            let Some(&k0) = kept[s].first() else { continue };
            let own: u64 = kept[s].iter().map(|&k| w.blocks[k].size).sum();
            let (all, out) = (from_first.at(k0), excluded.from(k0));
            let (a, l) = (all.alloc - out.alloc - own, all.live - out.live - own);
            let share = if a == 0 { 0.0 } else { l as f64 / a as f64 };
            kept_after_share[s] = Some(share);
            if share <= if by_spread[s] { MAX_SPREAD_RETAINED_SHARE } else { MAX_RETAINED_SHARE } {
                confirmed[s] = true;
                changed = true;
            } else if debug.as_deref().is_some_and(|d| w.table.sites[s].site.contains(d)) {
                eprintln!("leaks: {}: the rest keeps {share:.2} of what it allocates after", w.table.sites[s].site);
            }
        }
        first_round = false;
        if !changed {
            break;
        }
    }
    // Several large leaks at once can each keep the others' blocks above the share.
    // Left out all together, they still count when the rest of the run frees what it
    // allocates and frees more than all of them keep (a forward pass keeps more
    // activations than it frees temporaries, so it stays out).
    let candidates = SubsetSums::new(w.blocks, kept.iter().flatten().copied().collect());
    for s in 0..nsites {
        if confirmed[s] || by_spread[s] {
            continue;
        }
        let Some(&k0) = kept[s].first() else { continue };
        let (all, c) = (from_first.at(k0), candidates.from(k0));
        // (alloc, live, freed) of the rest, and what the candidates keep.
        let (a, l, f, c) = (all.alloc - c.alloc, all.live - c.live, all.freed - c.freed, c.alloc);
        let share = if a == 0 { 1.0 } else { l as f64 / a as f64 };
        if share <= MAX_RETAINED_SHARE && f > c {
            kept_after_share[s] = Some(share);
            confirmed[s] = true;
        }
    }
    for s in 0..nsites {
        if !confirmed[s] {
            kept[s].clear();
        }
    }

    for s in 0..nsites {
        let g = grows[s];
        if g.is_none() && kept[s].is_empty() {
            continue;
        }
        let y: Vec<u64> = samples.iter().map(|row| row.get(s).copied().unwrap_or(0)).collect();
        let mut curve_pos = used.clone();
        curve_pos.truncate(y.len());
        let mut y_end = y.clone();
        y_end.push(at_end.get(s).copied().unwrap_or(0));
        // The evidence: the site's blocks never freed (the never-freed test's, else
        // every traced block of the site live at the end), its freed blocks, and where
        // the kept ones were allocated.
        let nf: Vec<usize> = if kept[s].is_empty() {
            by_site[s].iter().copied().filter(|&k| w.blocks[k].end_entry().is_none()).collect()
        } else {
            kept[s].clone()
        };
        let freed_blocks = by_site[s].iter().filter(|&&k| w.blocks[k].end_entry().is_some()).count() as u64;
        let mut grew: Vec<GrowthSpan> = Vec::new();
        for &k in &nf {
            let b = w.blocks[k];
            let axis = if over_iterations[s] { &used } else { &windows };
            let slot = axis.partition_point(|&p| p <= b.alloc).saturating_sub(1);
            match grew.last_mut() {
                Some(g) if g.window == slot => {
                    g.last_entry = b.alloc;
                    g.blocks += 1;
                    g.bytes += b.size;
                }
                _ => grew.push(GrowthSpan {
                    window: slot,
                    first_entry: b.alloc,
                    last_entry: b.alloc,
                    blocks: 1,
                    bytes: b.size,
                }),
            }
        }
        let nf_bytes: u64 = nf.iter().map(|&k| w.blocks[k].size).sum();
        let mut detected_by = Vec::new();
        if g.is_some() {
            detected_by.push("growth");
        }
        if !kept[s].is_empty() {
            detected_by.push("never_freed");
        }
        let spans = y.len().saturating_sub(1).max(1) as f64;
        let (slope, confidence, growing, r2) = match g {
            Some((slope, conf, growing)) => {
                let yf: Vec<f64> = y.iter().map(|&v| v as f64).collect();
                (slope, conf, growing, fit(&yf).1)
            }
            None => {
                let yf: Vec<f64> = y_end.iter().map(|&v| v as f64).collect();
                let (_, r2) = fit(&yf);
                let growing = y_end.windows(2).filter(|w| w[1] > w[0]).count();
                // Never-freed: how cleanly the rest of the run frees what it allocates.
                let conf = 1.0 - kept_after_share[s].unwrap_or(1.0);
                (nf_bytes as f64 / spans, conf.clamp(0.0, 1.0), growing, r2)
            }
        };
        grew.truncate(MAX_SPANS);
        suspects.push(LeakSuspect {
            site: w.table.sites[s].clone(),
            growth_bytes_per_iteration: slope.round().max(0.0) as u64,
            iterations: y.len(),
            confidence,
            growing_steps: growing,
            r_squared: r2,
            first_bytes: y[0],
            last_bytes: *y.last().unwrap(),
            detected_by,
            never_freed_blocks: nf.len() as u64,
            never_freed_bytes: nf_bytes,
            first_never_freed_entry: nf.first().map(|&k| w.blocks[k].alloc),
            last_never_freed_entry: nf.last().map(|&k| w.blocks[k].alloc),
            first_never_freed_time_us: nf
                .first()
                .map(|&k| snap.trace(device)[w.blocks[k].alloc].time_us)
                .filter(|&t| t != NO_TIME),
            freed_blocks,
            end_bytes: at_end.get(s).copied().unwrap_or(0),
            kept_share_after: kept_after_share[s],
            curve: {
                let mut c = thin_curve(&curve_pos, &y);
                c.push(CurvePoint { entry: None, bytes: at_end.get(s).copied().unwrap_or(0) });
                c
            },
            grew_in: grew,
            grew_in_unit: if over_iterations[s] { "iteration" } else { "window" },
            curve_unit: if has_iterations { "iteration" } else { "window" },
        });
    }
    suspects.sort_by(|a, b| {
        b.growth_bytes_per_iteration.cmp(&a.growth_bytes_per_iteration).then_with(|| a.site.site.cmp(&b.site.site))
    });
    DeviceLeaks { device, iterations: it, threshold_bytes_per_iteration: threshold, suspects }
}

/// Leak suspects of every device (computes the timelines for the thresholds).
pub fn leaks(snap: &Snapshot) -> Vec<DeviceLeaks> {
    timeline::timelines(snap, &TimelineOptions { points: 1 })
        .iter()
        .map(|tl| leaks_device(snap, tl.device, tl.peak_allocated.bytes))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use fragscope_snapshot::TraceEvent;

    #[test]
    fn scope_names_with_step_numbers_are_one_name() {
        assert_eq!(normalize_scope("ProfilerStep#12"), "ProfilerStep#N");
        assert_eq!(normalize_scope("Optimizer.step#AdamW.step"), "Optimizer.step#AdamW.step");
    }

    #[test]
    fn numbered_scopes_are_one_name_and_steps() {
        for (name, norm) in [
            ("iteration 3", "iteration N"),
            ("step_17", "step_N"),
            ("epoch=2", "epoch=N"),
            ("## forward ##", "## forward ##"),
            ("conv1", "conv1"),
        ] {
            assert_eq!(normalize_scope(name), norm, "{name}");
        }
        for name in ["ProfilerStep#3", "## forward ##", "step", "iteration 4", "train_batch", "layer_7"] {
            assert!(step_like(name), "{name}");
        }
        for name in ["attention", "mlp", "## loss ##"] {
            assert!(!step_like(name), "{name}");
        }
    }

    /// A trace of `steps` steps of 4 allocs each (freed at once), annotated with
    /// `scopes`: (name, depth); `{k}` in a name is the step's number. Depth 0 wraps
    /// each step; depth 1 the same inside one outer `"train"` scope around the whole
    /// run; `None`: one scope per alloc inside the step (the layers of a pass).
    fn annotated(names: &[(&str, Option<usize>)], steps: usize) -> Snapshot {
        use fragscope_snapshot::Annotation;
        let mut snap = Snapshot::default();
        let mut t = Vec::new();
        let mut anns = Vec::new();
        let ann = |name: &str, time_us: i64, stage: &str| Annotation {
            device: 0,
            time_us,
            name: name.to_string(),
            stage: stage.to_string(),
            extra: Vec::new(),
        };
        if names.iter().any(|n| n.1 == Some(1)) {
            anns.push(ann("train", 0, "START"));
            anns.push(ann("train", (steps * 10) as i64 + 5, "END"));
        }
        for k in 0..steps {
            let t0 = (k * 10) as i64 + 1;
            for &(name, depth) in names {
                let name = name.replace("{k}", &k.to_string());
                if depth.is_some() {
                    anns.push(ann(&name, t0, "START"));
                    anns.push(ann(&name, t0 + 8, "END"));
                } else {
                    for j in 0..4 {
                        anns.push(ann(&name, t0 + 2 * j, "START"));
                        anns.push(ann(&name, t0 + 2 * j + 1, "END"));
                    }
                }
            }
            for j in 0..4u64 {
                let addr = (k as u64) << 24 | j << 20;
                let mut e = TraceEvent::new(Action::Alloc, addr, 1 << 20, 0);
                e.time_us = t0 + 2 * j as i64;
                t.push(e);
                let mut f = TraceEvent::new(Action::FreeCompleted, addr, 1 << 20, 0);
                f.time_us = t0 + 2 * j as i64 + 1;
                t.push(f);
            }
        }
        snap.device_traces.push(t);
        snap.external_annotations = Some(anns);
        snap
    }

    #[test]
    fn loop_annotations_are_iterations_and_compiler_scopes_are_not() {
        for (names, want) in [
            (vec![("ProfilerStep#{k}", Some(0))], Some("ProfilerStep#N")),
            (vec![("## forward ##", Some(0))], Some("## forward ##")),
            (vec![("iteration {k}", Some(0))], Some("iteration N")),
            (vec![("step", Some(0))], Some("step")),
            // Inside an outer scope that runs once.
            (vec![("step", Some(1))], Some("step")),
            (vec![("step_{k}", Some(1)), ("## attention ##", None)], Some("step_N")),
            // Compiler internals, and named phases nested in something else.
            (vec![("CachingAutotuner.benchmark_all_configs (dynamo_timed)", Some(0))], None),
            (vec![("compile_fx_inner (dynamo_timed)", Some(0))], None),
            (vec![("torch._inductor.some_pass", Some(0))], None),
            (vec![("## attention ##", Some(1))], None),
        ] {
            let it = iterations(&annotated(&names, 8), 0);
            match want {
                Some(scope) => {
                    assert_eq!(it.source, "annotation", "{names:?}: {it:?}");
                    assert_eq!(it.scope.as_deref(), Some(scope), "{names:?}");
                    assert_eq!(it.boundaries.len(), 8, "{names:?}");
                }
                None => assert_ne!(it.source, "annotation", "{names:?}: {it:?}"),
            }
        }
    }

    /// A loop of `steps` steps over growing shapes (step k allocates k+1 times more):
    /// each step allocates at `model.py:10` and `:11` (freed in the step) and at `:12`,
    /// freed too unless `leak` and the step is odd (every other one kept).
    fn growing_loop(steps: u64, leak: bool) -> Snapshot {
        use fragscope_snapshot::Frame;
        let mut snap = Snapshot::default();
        let mut site = |line: i64| {
            let t = &mut snap.frames;
            let frame = Frame { filename: t.intern_str("/home/u/model.py"), line, name: t.intern_str("forward") };
            let f = t.intern_frame(frame);
            t.intern_stack(&[f])
        };
        let stacks = [site(10), site(11), site(12)];
        let mib = 1u64 << 20;
        let mut t = Vec::new();
        let ev = |action, addr, size, stack| {
            let mut e = TraceEvent::new(action, addr, size, 0);
            e.stack = Some(stack);
            e
        };
        for k in 0..steps {
            let base = (k + 1) << 36;
            let sizes = [2 * (k + 1) * mib, 4 * (k + 1) * mib, (k + 1) * mib];
            let mut addr = base;
            let mut live = Vec::new();
            for (j, &size) in sizes.iter().enumerate() {
                t.push(ev(Action::Alloc, addr, size, stacks[j]));
                live.push((addr, size, stacks[j], j == 2 && leak && k % 2 == 1));
                addr += size;
            }
            for (a, size, stack, kept) in live {
                if !kept {
                    t.push(ev(Action::FreeRequested, a, size, stack));
                    t.push(ev(Action::FreeCompleted, a, size, stack));
                }
            }
        }
        snap.device_traces.push(t);
        snap
    }

    #[test]
    fn loop_over_growing_shapes_and_its_leak() {
        let steady = growing_loop(12, false);
        let it = iterations(&steady, 0);
        // Sizes never repeat: the iterations come from the sites.
        assert_eq!((it.source, it.boundaries.len()), ("periodicity", 12), "{it:?}");
        assert!(leaks_device(&steady, 0, 100 << 20).suspects.is_empty());
        let leaky = growing_loop(12, true);
        let l = leaks_device(&leaky, 0, 100 << 20);
        let sites: Vec<&str> = l.suspects.iter().map(|s| s.site.site.as_str()).collect();
        assert_eq!(sites, ["model.py:12:forward"], "{:?}", l.suspects);
        assert!(l.suspects[0].detected_by.contains(&"never_freed"));
    }

    #[test]
    fn even_slots_are_the_search() {
        for n in [1usize, 7, 400, 401, 999, 123_457] {
            let pos: Vec<usize> = (0..=TROUGH_SAMPLES).map(|k| k * n / TROUGH_SAMPLES).collect();
            for x in (0..n + 3).step_by((n / 500).max(1)) {
                assert_eq!(even_slot(x, n), pos.partition_point(|&p| p <= x), "n {n} x {x}");
            }
        }
    }

    #[test]
    fn fit_of_a_line() {
        let (s, r2) = fit(&[1.0, 3.0, 5.0, 7.0]);
        assert!((s - 2.0).abs() < 1e-12 && (r2 - 1.0).abs() < 1e-12);
    }

    /// A synthetic loop: each iteration allocates a, b (freed) and c (kept: the leak).
    fn looped(iters: usize, leak: bool) -> Snapshot {
        let mut snap = Snapshot::default();
        let mib = 1u64 << 20;
        let mut t = Vec::new();
        for k in 0..iters as u64 {
            let base = 1u64 << 32;
            t.push(TraceEvent::new(Action::Alloc, base, 4 * mib, 0));
            t.push(TraceEvent::new(Action::Alloc, base + 4 * mib, 8 * mib, 0));
            t.push(TraceEvent::new(Action::Alloc, (1 << 40) + k * 2 * mib, 2 * mib, 0));
            for a in [base, base + 4 * mib] {
                let s = if a == base { 4 * mib } else { 8 * mib };
                t.push(TraceEvent::new(Action::FreeRequested, a, s, 0));
                t.push(TraceEvent::new(Action::FreeCompleted, a, s, 0));
            }
            if !leak {
                t.push(TraceEvent::new(Action::FreeRequested, (1 << 40) + k * 2 * mib, 2 * mib, 0));
                t.push(TraceEvent::new(Action::FreeCompleted, (1 << 40) + k * 2 * mib, 2 * mib, 0));
            }
        }
        snap.device_traces.push(t);
        snap
    }

    #[test]
    fn periodicity_finds_the_loop_and_the_leak() {
        let snap = looped(10, true);
        let it = iterations(&snap, 0);
        assert_eq!(it.source, "periodicity");
        assert_eq!(it.period_allocs, Some(3));
        assert_eq!(it.boundaries.len(), 10);
        let l = leaks_device(&snap, 0, 20 << 20);
        assert_eq!(l.suspects.len(), 1, "{:?}", l.suspects);
        assert_eq!(l.suspects[0].growth_bytes_per_iteration, 2 << 20);
        assert_eq!(l.suspects[0].site.site, crate::attribution::NO_STACK);
        let steady = leaks_device(&looped(10, false), 0, 20 << 20);
        assert!(steady.suspects.is_empty());
    }
}
