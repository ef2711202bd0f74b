//! Leak suspects, on top of training steps ([`fragscope_trace::steps`]) and memory by role
//! ([`fragscope_trace::DeviceRoles`]).
//!
//! # What a leak is
//!
//! A leak is memory that **outlives the step that made it, grows across steps, and is not
//! parameters, gradients, optimizer state or a declared cache**. Growth inside one step
//! is activations (a forward pass keeps what backward needs, and backward gives it back),
//! not a leak. So leaks are told only at the boundaries between training steps, and only
//! when the trace holds two steps or more: with one step or none, growth across steps
//! cannot be seen, and the analysis says so, with how to record a trace that can tell
//! (two steps or more; steps the frames do not show marked with
//! `fragscope.torch.phase("step")`). Nothing falls back to the trace's periodicity: the
//! repeats inside a pass are its layers, not steps.
//!
//! # The test
//!
//! Steps are those the trace holds whole: a first step the recording began inside (its
//! backward or optimizer without its forward, after a ring buffer dropped the start) keeps
//! blocks made before the trace, which belong to no call site, and is left out.
//! Sample points are the start of the first step and the end of each step
//! ([`fragscope_trace::Step::end`], after its optimizer phase): at a step's end, activations
//! and temporaries are gone, and what is live is what the program keeps. Every block is
//! followed from its `alloc` to its free ([`fragscope_trace::BlockLives`]) and counted for its call site
//! (the innermost user frame, [`fragscope_trace::site_of`]). For each site, its live bytes at the
//! end of each step, y₁…yₙ, are compared step to step **after the first step** (a first
//! step makes the optimizer's state and the gradients once; they are then level or
//! replaced one for one): the site is a suspect when its live bytes rise in at least
//! [`MIN_GROWING_SHARE`] of those comparisons, yₙ > y₁, and at least half of the growth is
//! still held at the end of the trace (memory a cache gives back is not leaked). A leak that
//! moves (each step reallocates a larger buffer and frees the old one) grows the same way.
//!
//! Parameters, gradients and optimizer state are made once or replaced one for one, so their
//! live bytes do not grow after the first step; the roles of a suspect's kept blocks are
//! reported as evidence (`kept_roles`) — optimizer-phase blocks made and kept in every step
//! are not state whatever their phase says. Blocks allocated inside a declared cache
//! (`fragscope.torch.cache()`, a `record_function` scope named `fragscope.cache` or
//! `fragscope.cache:NAME`) are left out.
//!
//! Two shapes of program are not steady loops, and leaks are not told in them (the reason
//! says which):
//! * steps nested in a forward pass (update steps run inside a model's `forward`, test-time
//!   optimisation): the outer pass keeps its activations across the inner steps. Seen in
//!   the Python frames of the steps' optimizer or backward calls, when a module `forward`
//!   is their caller ([`fragscope_trace::step_inside_forward`]);
//! * backward passes without an optimizer whose ends keep most of what they allocate (more
//!   than [`MAX_KEPT_SHARE`] of the bytes allocated after the first grow the suspects):
//!   several backward passes can be parts of one computation that collects its results
//!   (per-sample gradients, Jacobian rows, attribution maps), a build-up, not a loop that
//!   frees its work. Optimizer steps and step annotations (`ProfilerStep#N`,
//!   `fragscope.torch.phase("step")`, also when backward passes bound the steps) are
//!   evidence of a loop; what outlives those steps and grows is reported whatever share of
//!   a step's allocations it is: a leak that dominates a small step (a unit test, a toy
//!   loop) is the plainest leak there is.
//!
//! # Evidence and confidence
//!
//! Each suspect carries its growth per step (`growth_bytes_per_step`: (yₙ − y₁)/(n − 1)),
//! the steps compared and how many grew, the curve y₀ (start of the first step), y₁…yₙ and
//! the end, the blocks made in the steps and never freed, and per step the blocks that
//! outlived it (`grew_in`). `confidence` (0–1) = share of growing comparisons × regularity
//! (R² of y₁…yₙ against the step number; 1 with one comparison) × (n − 1)/n (more steps,
//! more evidence) × the strength of the step evidence (optimizer steps 1, step annotations
//! 0.9, backward passes alone 0.8). Suspects are ranked by growth × confidence.
//!
//! Principal types: [`DeviceLeaks`], [`LeakSuspect`], [`LeakSteps`].

use std::collections::BTreeMap;

use fragscope_snapshot::{FrameTable, Snapshot, TraceEvent, NO_TIME};
use serde::Serialize;

use fragscope_trace::{
    annotated_spans, classify_roles, has_step_annotations, live_bytes_at, step_inside_forward, steps, BlockLives,
    Roles, Site, SiteTable, Step, StepSource, Steps, TracedLife, LIVE_AT_END,
};

/// Share of step-to-step comparisons (after the first step) in which a suspect's live
/// bytes must rise.
pub(crate) const MIN_GROWING_SHARE: f64 = 0.75;
/// Fewest training steps in which leaks can be told (growth across steps needs two).
pub(crate) const MIN_STEPS: usize = 2;
/// When the suspects' growth is more than this share of the bytes allocated after the
/// first step, steps bounded by backward passes alone keep most of their work: a build-up,
/// not a steady loop (module doc; not applied to optimizer steps or step annotations).
pub(crate) const MAX_KEPT_SHARE: f64 = 0.5;
/// Points of a suspect's curve, at most.
pub(crate) const CURVE_POINTS: usize = 48;
/// Steps listed in a suspect's `grew_in`, at most.
pub(crate) const MAX_SPANS: usize = 32;
/// Sample points the report's curves use, at most.
pub const MAX_SAMPLES: usize = 4096;
/// Name of a declared cache's `record_function` scope (`fragscope.torch.cache()`).
pub(crate) const CACHE_SCOPE: &str = "fragscope.cache";

/// Where the steps the leak test compared come from (`source` of [`LeakSteps`] in JSON).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LeakStepSource {
    /// Training steps from evidence ([`fragscope_trace::steps`]).
    Steps,
    /// No steps to compare: fewer than two, or steps that are not a steady loop
    /// (`reason` says which).
    None,
}

impl LeakStepSource {
    /// The name JSON gives it.
    pub fn as_str(self) -> &'static str {
        match self {
            LeakStepSource::Steps => "steps",
            LeakStepSource::None => "none",
        }
    }
}

impl std::fmt::Display for LeakStepSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The steps the leak test compared, and whether leaks can be told.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LeakSteps {
    /// Where the compared steps come from.
    pub source: LeakStepSource,
    /// Complete training steps in the trace (a first step the recording began inside is
    /// not counted).
    pub steps: usize,
    /// Whether leaks can be told from this trace (two steps or more, a steady loop).
    pub can_tell: bool,
    /// Sample points (trace entries; the state just before each): the start of the first
    /// step, then the end of each step. Empty when leaks cannot be told.
    pub boundaries: Vec<usize>,
    /// Why leaks cannot be told, and how to record a trace that can.
    pub reason: Option<String>,
}

/// A call site whose memory outlives its steps and grows across them.
#[derive(Clone, Debug, Serialize)]
pub struct LeakSuspect {
    /// `site` (`file:line:function`), `file`, `line`, `function`, `stack` (folded).
    #[serde(flatten)]
    pub site: Site,
    /// (Live bytes at the end of the last step − at the end of the first) / (steps − 1).
    pub growth_bytes_per_step: u64,
    /// Training steps compared (n).
    pub steps: usize,
    /// Step-to-step comparisons after the first step (n − 1), and how many rose.
    pub steps_compared: usize,
    pub growing_steps: usize,
    /// R² of the live bytes at the step ends against the step number.
    pub r_squared: f64,
    /// 0–1 (module doc).
    pub confidence: f64,
    /// Live bytes of the site at the end of the first step and of the last.
    pub first_bytes: u64,
    pub last_bytes: u64,
    /// Live bytes of the site at the end of the trace.
    pub end_bytes: u64,
    /// Blocks of the site allocated in the steps and never freed.
    pub never_freed_blocks: u64,
    pub never_freed_bytes: u64,
    /// Trace entries of the first and last of their `alloc`s.
    pub first_never_freed_entry: Option<usize>,
    pub last_never_freed_entry: Option<usize>,
    pub first_never_freed_time_us: Option<i64>,
    /// The site's allocations that the trace frees.
    pub freed_blocks: u64,
    /// Roles ([`fragscope_trace::Role`]) of the blocks the site made in the steps and still held at
    /// the end, in bytes (evidence: growth after the first step is not state, whatever
    /// the phase that made it).
    pub kept_roles: BTreeMap<&'static str, u64>,
    /// Live bytes of the site at the start of the first step, at the end of each step (at
    /// most [`CURVE_POINTS`]), then at the end of the trace (`entry` null).
    pub curve: Vec<CurvePoint>,
    /// Per step (`window` = step index, 0-based): the site's blocks made in it and still
    /// live at its end (they outlived the step that made them); at most [`MAX_SPANS`].
    pub grew_in: Vec<GrowthSpan>,
    /// The evidence, in words.
    pub evidence: Vec<String>,
}

/// Live bytes of a site just before a trace entry (`entry` null: at the end).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct CurvePoint {
    pub entry: Option<usize>,
    pub bytes: u64,
}

/// A site's blocks made in one step and still live at its end.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct GrowthSpan {
    /// Index of the step (0-based).
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
    pub steps: LeakSteps,
    /// Most growth × confidence first.
    pub suspects: Vec<LeakSuspect>,
}

/// Why leaks cannot be told from a trace with `st`'s steps (fewer than [`MIN_STEPS`]),
/// and how to record one that can.
/// How to record a trace from which leaks can be told.
pub(crate) const HOW_TO_RECORD: &str = "record two training steps or more (start recording before a step and dump after the next one), or mark each step with fragscope.torch.phase(\"step\")";

pub(crate) fn cannot_tell(st: &Steps) -> String {
    let how = HOW_TO_RECORD;
    match st.steps.len() {
        0 => format!(
            "{}: leaks (memory that outlives its step and grows across steps) cannot be told from this trace; {how}",
            st.describe()
        ),
        _ => format!(
            "{}: leaks cannot be told from one step (growth inside a step is activations); {how}",
            st.describe()
        ),
    }
}

/// Strength of the steps' evidence (module doc).
fn source_weight(source: StepSource) -> f64 {
    match source {
        StepSource::Optimizer => 1.0,
        StepSource::Annotation => 0.9,
        StepSource::Backward | StepSource::None => 0.8,
    }
}

/// Least-squares R² of `y` against 0, 1, 2, …
fn r_squared(y: &[f64]) -> f64 {
    let n = y.len() as f64;
    if y.len() < 3 {
        return 1.0;
    }
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
    if syy == 0.0 || sxx == 0.0 {
        0.0
    } else {
        (sxy * sxy) / (sxx * syy)
    }
}

/// Trace entries allocated inside a declared cache's scope (`fragscope.cache…`), as
/// sorted, disjoint intervals of entries.
fn declared_caches(snap: &Snapshot, device: i64) -> Vec<(usize, usize)> {
    let mut v: Vec<(usize, usize)> = annotated_spans(snap, device)
        .into_iter()
        .filter(|(_, _, name)| name == CACHE_SCOPE || name.starts_with("fragscope.cache:"))
        .map(|(a, b, _)| (a, b))
        .collect();
    v.sort_unstable();
    v
}

/// Leak suspects of one device, finding its steps, block lives and roles.
pub fn leaks_device(snap: &Snapshot, device: i64) -> DeviceLeaks {
    let lives = BlockLives::replay(snap, device);
    let st = steps(snap, device);
    let r = classify_roles(snap, &lives, &st);
    leaks_device_with(snap, device, &st, &lives, Some(&r))
}

/// [`leaks_device`] given the device's steps, block lives and (for the evidence) roles.
///
/// The rule groups, in order: the steps must be a steady loop (`begun_inside`,
/// `too_few_steps`, `nested_in_forward`); each site's live bytes at the step ends
/// (`SiteBytes`, declared caches left out) must grow (`growing_sites`); the growth must
/// not be a build-up (`build_up`); the suspects then carry their evidence
/// (`evidence_of`, `suspect`).
pub(crate) fn leaks_device_with(
    snap: &Snapshot,
    device: i64,
    st: &Steps,
    lives: &BlockLives,
    block_roles: Option<&Roles>,
) -> DeviceLeaks {
    let skip = begun_inside(st);
    let run = &st.steps[skip..];
    let n_steps = run.len();
    let none = |reason: String| DeviceLeaks {
        device,
        steps: LeakSteps {
            source: LeakStepSource::None,
            steps: n_steps,
            can_tell: false,
            boundaries: Vec::new(),
            reason: Some(reason),
        },
        suspects: Vec::new(),
    };
    if let Some(why) = too_few_steps(st, skip) {
        return none(why);
    }
    if let Some(why) = nested_in_forward(snap, device, st, run) {
        return none(why);
    }
    let trace = snap.trace(device);
    let pos = sample_points(run, trace.len());
    let caches = declared_caches(snap, device);
    let bytes = SiteBytes::measure(&snap.frames, snap.trace(lives.device), lives, &pos, &caches);
    let rows = &bytes.rows;
    let cands = growing_sites(rows, bytes.table.sites.len(), n_steps);
    let boundaries = pos.clone();
    let mut out = DeviceLeaks {
        device,
        steps: LeakSteps { source: LeakStepSource::Steps, steps: n_steps, can_tell: true, boundaries, reason: None },
        suspects: Vec::new(),
    };
    if cands.is_empty() {
        return out;
    }
    if let Some(reason) = build_up(snap, device, st, &lives.traced, &pos, rows, &cands) {
        out.steps.can_tell = false;
        out.steps.source = LeakStepSource::None;
        out.steps.reason = Some(reason);
        return out;
    }
    let acc = evidence_of(&lives.traced, &bytes.sites, &cands, &pos, block_roles);
    for ((s, growing), a) in cands.into_iter().zip(acc) {
        let y: Vec<u64> = (0..=n_steps + 1).map(|k| rows[k][s]).collect();
        let first_time = a.first_nf.map(|e| trace[e].time_us).filter(|&t| t != NO_TIME);
        out.suspects.push(suspect(bytes.table.sites[s].clone(), growing, &y, &pos, st.source, a, first_time));
    }
    out.suspects.sort_by(|a, b| {
        let ka = a.growth_bytes_per_step as f64 * a.confidence;
        let kb = b.growth_bytes_per_step as f64 * b.confidence;
        kb.total_cmp(&ka).then_with(|| a.site.site.cmp(&b.site.site))
    });
    out
}

/// The first steps that the recording began inside (`complete` false: the trace starts in
/// their backward or optimizer, after a ring buffer dropped the start): such a step keeps
/// at its end blocks made before the trace, which belong to no call site, so it is no
/// reference to compare the next steps with. The test starts after them.
fn begun_inside(st: &Steps) -> usize {
    st.steps.iter().take_while(|s| !s.complete).count()
}

/// Rule 1: leaks need [`MIN_STEPS`] complete steps (`skip` is the number of leading steps
/// the recording began inside). `Some(reason)` when there are fewer: why leaks cannot be
/// told, and how to record a trace that can.
fn too_few_steps(st: &Steps, skip: usize) -> Option<String> {
    let n_steps = st.steps.len() - skip;
    if n_steps >= MIN_STEPS {
        return None;
    }
    let mut why = cannot_tell(st);
    if skip > 0 {
        why = format!(
            "{n_steps} complete training step{} (the recording began inside the first of {}): leaks cannot be told; {HOW_TO_RECORD}",
            if n_steps == 1 { "" } else { "s" },
            st.describe(),
        );
    }
    Some(why)
}

/// Rule 2: update steps nested in a module's forward (half of `run` or more) are no steady
/// loop: the outer pass keeps its activations across them. `Some(reason)` when they are.
fn nested_in_forward(snap: &Snapshot, device: i64, st: &Steps, run: &[Step]) -> Option<String> {
    let nested = run.iter().filter(|s| step_inside_forward(snap, device, s)).count();
    (nested * 2 >= run.len()).then(|| {
        format!(
            "{}, {nested} of them run inside a module's forward (update steps nested in a pass): the outer pass keeps its memory across them, so leaks cannot be told from their boundaries; mark the outer loop's steps with fragscope.torch.phase(\"step\")",
            st.describe()
        )
    })
}

/// The sample points of the leak test, trace entries (the state just before each): the
/// start of the first step of `run`, then the end of each step (never before the previous
/// point, never past the `n` entries of the trace).
fn sample_points(run: &[Step], n: usize) -> Vec<usize> {
    let mut pos: Vec<usize> = Vec::with_capacity(run.len() + 1);
    pos.push(run[0].start);
    for s in run {
        pos.push(s.end.min(n).max(*pos.last().unwrap()));
    }
    pos
}

/// Every block's call site, and each site's live bytes at the sample points.
struct SiteBytes {
    table: SiteTable,
    /// Site of each traced block ([`BlockLives::traced`]); `None` inside a declared cache.
    sites: Vec<Option<u32>>,
    /// `rows[0]` = start of step 1, `rows[k]` = end of step k, `rows[n_steps + 1]` = end of
    /// the trace; each row indexed by site.
    rows: Vec<Vec<u64>>,
}

impl SiteBytes {
    /// Sites of every block (those live before the trace too: they are part of a site's
    /// live bytes, though never made in a step), and their live bytes at `pos`. Blocks
    /// allocated inside a declared cache (`caches`, sorted disjoint entry intervals) get no
    /// site.
    /// `trace`: the device's trace the lives were walked from (their stacks are their
    /// `alloc` entries').
    fn measure(
        frames: &FrameTable,
        trace: &[TraceEvent],
        lives: &BlockLives,
        pos: &[usize],
        caches: &[(usize, usize)],
    ) -> SiteBytes {
        let in_cache = |a: usize| {
            let k = caches.partition_point(|c| c.0 <= a);
            k > 0 && a < caches[k - 1].1
        };
        let mut table = SiteTable::default();
        let seeded_sites: Vec<usize> = lives.seeded.iter().map(|b| table.of_block(frames, b.stack, true)).collect();
        let blocks = lives.traced.as_slice();
        let sites: Vec<Option<u32>> = blocks
            .iter()
            .map(|l| (!in_cache(l.alloc())).then(|| table.of_block(frames, l.stack(trace), false) as u32))
            .collect();
        let nsites = table.sites.len();
        let rows = live_bytes_at(
            pos,
            nsites,
            lives.seeded.iter().zip(&seeded_sites).map(|(b, &s)| (s, None, b.end, b.size)).chain(
                blocks.iter().zip(&sites).filter_map(|(l, s)| Some(((*s)? as usize, Some(l.alloc()), l.end(), l.size))),
            ),
        );
        SiteBytes { table, sites, rows }
    }
}

/// Rule 3, the growth test: the sites (of `nsites`) whose live bytes at the step ends
/// (`rows`, as [`SiteBytes::rows`], over `n_steps` steps) rise in at least
/// [`MIN_GROWING_SHARE`] of the comparisons after the first step, end above where the
/// first step left them, and still hold at least half of that growth at the end of the
/// trace. Each as (site, growing comparisons), by site.
fn growing_sites(rows: &[Vec<u64>], nsites: usize, n_steps: usize) -> Vec<(usize, usize)> {
    let m = n_steps - 1; // comparisons after the first step
    let need = (MIN_GROWING_SHARE * m as f64).ceil() as usize;
    let mut cands: Vec<(usize, usize)> = Vec::new(); // (site, growing comparisons)
                                                     // A site's column across the rows, by step.
    #[allow(clippy::needless_range_loop)]
    for s in 0..nsites {
        let y = |k: usize| rows[k][s];
        let (first, last, end) = (y(1), y(n_steps), y(n_steps + 1));
        if last <= first || end < first + (last - first).div_ceil(2) {
            continue;
        }
        let growing = (2..=n_steps).filter(|&k| y(k) > y(k - 1)).count();
        if growing >= need.max(1) {
            cands.push((s, growing));
        }
    }
    cands
}

/// Rule 4, a build-up, not a loop: the candidates' growth against what the steps after the
/// first allocate. Only where backward passes alone bound the steps and nothing marks
/// them as a loop's (module doc): an optimizer step or a step annotation says the steps
/// are a loop's, and a leak that is most of what a small step allocates (a unit test
/// keeping a tensor per step) is a leak, not a build-up. `Some(reason)` for a build-up.
fn build_up(
    snap: &Snapshot,
    device: i64,
    st: &Steps,
    blocks: &[TracedLife],
    pos: &[usize],
    rows: &[Vec<u64>],
    cands: &[(usize, usize)],
) -> Option<String> {
    let n_steps = pos.len() - 1;
    let (from, to) = (pos[1], pos[n_steps]);
    let allocated: u64 = blocks.iter().filter(|b| b.alloc() >= from && b.alloc() < to).map(|b| b.size).sum();
    let grown: u64 = cands.iter().map(|&(s, _)| rows[n_steps][s] - rows[1][s]).sum();
    let build_up = st.source == StepSource::Backward
        && allocated > 0
        && grown as f64 > MAX_KEPT_SHARE * allocated as f64
        && !has_step_annotations(snap, device);
    build_up.then(|| {
        format!(
            "{}, but memory at the step ends grows by {:.0}% of what the steps after the first allocate, at {} call sites: a build-up (backward passes of one computation that keeps their results, or steps nested in a longer pass), not a loop that frees it; leaks cannot be told from these steps; if they are a training loop's steps, mark each with fragscope.torch.phase(\"step\")",
            st.describe(),
            100.0 * grown as f64 / allocated as f64,
            cands.len()
        )
    })
}

/// The evidence of one candidate site, from its blocks made in the steps.
#[derive(Default, Clone)]
struct SiteEvidence {
    /// Blocks (and bytes) made in the steps and never freed, and the first and last
    /// of their `alloc` entries.
    nf_blocks: u64,
    nf_bytes: u64,
    first_nf: Option<usize>,
    last_nf: Option<usize>,
    /// The site's allocations that the trace frees.
    freed: u64,
    /// Roles of the never-freed bytes.
    roles: BTreeMap<&'static str, u64>,
    /// Per step: the blocks made in it that outlived it.
    spans: BTreeMap<usize, GrowthSpan>,
}

/// Evidence per candidate (in the order of `cands`): each traced block of a candidate site
/// (`sites` as [`SiteBytes::sites`]), counted as freed or not, as outliving the step that
/// made it (by the sample points `pos`), and, when made in the steps and never freed, by
/// its role in `block_roles`.
fn evidence_of(
    blocks: &[TracedLife],
    sites: &[Option<u32>],
    cands: &[(usize, usize)],
    pos: &[usize],
    block_roles: Option<&Roles>,
) -> Vec<SiteEvidence> {
    let n_steps = pos.len() - 1;
    let cand_index: std::collections::HashMap<usize, usize> =
        cands.iter().enumerate().map(|(i, &(s, _))| (s, i)).collect();
    let mut acc = vec![SiteEvidence::default(); cands.len()];
    let step_start = pos[0];
    for (i, (l, s)) in blocks.iter().zip(sites).enumerate() {
        let Some(&ci) = s.and_then(|s| cand_index.get(&(s as usize))) else { continue };
        let a = &mut acc[ci];
        if l.end() != LIVE_AT_END {
            a.freed += 1;
        }
        if l.alloc() < step_start {
            continue;
        }
        let k = pos[1..].partition_point(|&e| e <= l.alloc()); // the step that made it (by ends)
        if k < n_steps && l.end() >= pos[k + 1] {
            let g = a.spans.entry(k).or_insert(GrowthSpan {
                window: k,
                first_entry: l.alloc(),
                last_entry: l.alloc(),
                blocks: 0,
                bytes: 0,
            });
            g.last_entry = l.alloc();
            g.blocks += 1;
            g.bytes += l.size;
        }
        if l.end() == LIVE_AT_END && l.alloc() < pos[n_steps] {
            a.nf_blocks += 1;
            a.nf_bytes += l.size;
            a.first_nf.get_or_insert(l.alloc());
            a.last_nf = Some(l.alloc());
            if let Some(r) = block_roles {
                *a.roles.entry(r.traced[i].role.as_str()).or_default() += l.size;
            }
        }
    }
    acc
}

/// The suspect of one candidate `site`: its live bytes `y` at the sample points `pos`
/// (then at the end of the trace), its growth per step and confidence (module doc; steps
/// bounded by `source`, [`source_weight`]), its curve and its evidence in words.
/// `first_time` is the time of its first never-freed `alloc`, when recorded.
fn suspect(
    site: Site,
    growing: usize,
    y: &[u64],
    pos: &[usize],
    source: StepSource,
    a: SiteEvidence,
    first_time: Option<i64>,
) -> LeakSuspect {
    let n_steps = pos.len() - 1;
    let m = n_steps - 1;
    let ends: Vec<f64> = y[1..=n_steps].iter().map(|&v| v as f64).collect();
    let r2 = r_squared(&ends);
    let share = growing as f64 / m as f64;
    let confidence = share * r2 * (m as f64 / n_steps as f64) * source_weight(source);
    let growth = (y[n_steps] - y[1]) / m as u64;
    let mut curve: Vec<CurvePoint> = Vec::new();
    let npts = n_steps + 1;
    let take = npts.min(CURVE_POINTS);
    for j in 0..take {
        let k = if take == npts { j } else { j * (npts - 1) / (take - 1) };
        curve.push(CurvePoint { entry: Some(pos[k]), bytes: y[k] });
    }
    curve.push(CurvePoint { entry: None, bytes: y[n_steps + 1] });
    let mut evidence = vec![format!(
        "live bytes at the step ends rose in {growing} of {m} steps after the first ({} → {}, steps {})",
        fragscope_alloc::format_size(y[1]),
        fragscope_alloc::format_size(y[n_steps]),
        source
    )];
    let outlived = a.spans.len();
    if outlived > 0 {
        evidence.push(format!("blocks made in {outlived} of {n_steps} steps outlived the step that made them"));
    }
    if a.nf_bytes > 0 {
        evidence.push(format!(
            "{} in {} blocks made in the steps never freed; {} of the site's allocations freed",
            fragscope_alloc::format_size(a.nf_bytes),
            a.nf_blocks,
            a.freed
        ));
    } else {
        evidence.push(
            "each step's blocks are freed later, but a larger set is held at every step end (the leak moves)".into(),
        );
    }
    LeakSuspect {
        site,
        growth_bytes_per_step: growth,
        steps: n_steps,
        steps_compared: m,
        growing_steps: growing,
        r_squared: r2,
        confidence,
        first_bytes: y[1],
        last_bytes: y[n_steps],
        end_bytes: y[n_steps + 1],
        never_freed_blocks: a.nf_blocks,
        never_freed_bytes: a.nf_bytes,
        first_never_freed_entry: a.first_nf,
        last_never_freed_entry: a.last_nf,
        first_never_freed_time_us: first_time,
        freed_blocks: a.freed,
        kept_roles: a.roles,
        curve,
        grew_in: a.spans.into_values().take(MAX_SPANS).collect(),
        evidence,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fragscope_snapshot::{Action, StackId};

    const MIB: u64 = 1 << 20;

    /// A synthetic training run of `steps` steps, each: forward (three activations, kept
    /// for backward, and `extra` more when `inside_step_growth`), backward (gradients made
    /// in the first step and kept; the activations freed), the optimizer (Adam's state made
    /// in the first step and kept; a temporary). `leak` keeps one 2 MiB forward block per
    /// step (at `model.py:20`); `moving` reallocates a growing buffer there instead, freeing
    /// the old one. `nested` calls the optimizer from inside a module's forward.
    struct Run {
        steps: usize,
        leak: bool,
        moving: bool,
        inside_step_growth: usize,
        nested: bool,
    }

    fn run(r: &Run) -> Snapshot {
        let mut snap = Snapshot::default();
        let mut stack = |frames: &[(&str, i64, &str)]| -> StackId { snap.frames.intern_py_stack(frames) };
        // Innermost first, as PyTorch records them.
        type F = (&'static str, i64, &'static str);
        let outer: &[F] = if r.nested {
            &[("/u/model.py", 5, "forward"), ("/u/train.py", 1, "main")]
        } else {
            &[("/u/train.py", 1, "main")]
        };
        let with = |inner: F| -> Vec<F> { std::iter::once(inner).chain(outer.iter().copied()).collect() };
        let fwd = |line: i64| vec![("/u/model.py", line, "forward"), ("/u/train.py", 1, "main")];
        let s_init = stack(&[("/u/model.py", 2, "__init__"), ("/u/train.py", 1, "main")]);
        let s_fwd: Vec<StackId> = (10..13).map(|l| stack(&fwd(l))).collect();
        let s_extra = stack(&fwd(15));
        let s_leak = stack(&fwd(20));
        let s_bwd = stack(&with(("/x/torch/_tensor.py", 600, "backward")));
        let s_opt = stack(&with(("/x/torch/optim/adam.py", 400, "_single_tensor_adam")));
        let mut t: Vec<TraceEvent> = Vec::new();
        let ev = |t: &mut Vec<TraceEvent>, action, addr: u64, size: u64, s: StackId| {
            let mut e = TraceEvent::new(action, addr, size);
            e.stack = Some(s);
            t.push(e);
        };
        let free = |t: &mut Vec<TraceEvent>, addr: u64, size: u64, s: StackId| {
            ev(t, Action::FreeRequested, addr, size, s);
            ev(t, Action::FreeCompleted, addr, size, s);
        };
        // Two parameters.
        ev(&mut t, Action::Alloc, 1 << 30, 4 * MIB, s_init);
        ev(&mut t, Action::Alloc, (1 << 30) + 4 * MIB, 8 * MIB, s_init);
        let mut moved: Option<(u64, u64)> = None;
        for k in 0..r.steps as u64 {
            let act = (2u64 << 30) + k * (1 << 28);
            let mut acts = Vec::new();
            for (j, &s) in s_fwd.iter().enumerate() {
                let a = act + j as u64 * 16 * MIB;
                ev(&mut t, Action::Alloc, a, 16 * MIB, s);
                acts.push((a, 16 * MIB, s));
            }
            for j in 0..r.inside_step_growth as u64 {
                let a = act + (4 + j) * 16 * MIB;
                ev(&mut t, Action::Alloc, a, 16 * MIB, s_extra);
                acts.push((a, 16 * MIB, s_extra));
            }
            if r.leak {
                ev(&mut t, Action::Alloc, (3u64 << 30) + k * 2 * MIB, 2 * MIB, s_leak);
            }
            if r.moving {
                let a = (4u64 << 30) + k * (1 << 26);
                ev(&mut t, Action::Alloc, a, (k + 1) * 2 * MIB, s_leak);
                if let Some((old, size)) = moved.replace((a, (k + 1) * 2 * MIB)) {
                    free(&mut t, old, size, s_leak);
                }
            }
            // Backward: gradients in the first step, activations freed.
            if k == 0 {
                ev(&mut t, Action::Alloc, 5u64 << 30, 4 * MIB, s_bwd);
                ev(&mut t, Action::Alloc, (5u64 << 30) + 4 * MIB, 8 * MIB, s_bwd);
            }
            let tmp = (6u64 << 30) + k * (1 << 28);
            ev(&mut t, Action::Alloc, tmp, MIB, s_bwd);
            free(&mut t, tmp, MIB, s_bwd);
            for (a, size, s) in acts {
                free(&mut t, a, size, s);
            }
            // Optimizer: state in the first step, a temporary every step.
            if k == 0 {
                for (j, size) in [4 * MIB, 4 * MIB, 8 * MIB, 8 * MIB].into_iter().enumerate() {
                    ev(&mut t, Action::Alloc, (7u64 << 30) + j as u64 * 8 * MIB, size, s_opt);
                }
            }
            let tmp = (8u64 << 30) + k * (1 << 28);
            ev(&mut t, Action::Alloc, tmp, MIB, s_opt);
            free(&mut t, tmp, MIB, s_opt);
        }
        snap.device_traces.push(t);
        snap
    }

    fn base(steps: usize) -> Run {
        Run { steps, leak: false, moving: false, inside_step_growth: 0, nested: false }
    }

    #[test]
    fn a_leak_that_outlives_its_step_and_grows_across_steps_is_found() {
        let snap = run(&Run { leak: true, ..base(3) });
        let l = leaks_device(&snap, 0);
        assert_eq!(
            (l.steps.source, l.steps.steps, l.steps.can_tell),
            (LeakStepSource::Steps, 3, true),
            "{:?}",
            l.steps
        );
        let sites: Vec<&str> = l.suspects.iter().map(|s| s.site.site.as_str()).collect();
        assert_eq!(sites, ["model.py:20:forward"], "{:?}", l.suspects);
        let s = &l.suspects[0];
        assert_eq!(s.growth_bytes_per_step, 2 * MIB);
        assert_eq!((s.steps, s.steps_compared, s.growing_steps), (3, 2, 2));
        assert_eq!((s.never_freed_blocks, s.never_freed_bytes), (3, 6 * MIB));
        assert_eq!(s.grew_in.len(), 3, "{:?}", s.grew_in);
        assert!(s.confidence > 0.5 && s.confidence <= 1.0, "{}", s.confidence);
        // The same program without the leak: nothing, though state was made in step 1.
        assert!(leaks_device(&run(&base(3)), 0).suspects.is_empty());
    }

    #[test]
    fn a_leak_that_moves_is_found() {
        let l = leaks_device(&run(&Run { moving: true, ..base(4) }), 0);
        let sites: Vec<&str> = l.suspects.iter().map(|s| s.site.site.as_str()).collect();
        assert_eq!(sites, ["model.py:20:forward"], "{:?}", l.suspects);
        assert_eq!(l.suspects[0].growth_bytes_per_step, 2 * MIB);
        assert_eq!(l.suspects[0].never_freed_blocks, 1);
    }

    #[test]
    fn growth_inside_one_step_is_activations_not_a_leak() {
        // Each step's forward keeps 8 more activations (128 MiB) until its backward: live
        // memory climbs inside every step, and the state made in the first step stays.
        let l = leaks_device(&run(&Run { inside_step_growth: 8, ..base(5) }), 0);
        assert!(l.steps.can_tell);
        assert!(l.suspects.is_empty(), "{:?}", l.suspects);
    }

    #[test]
    fn one_step_or_none_says_leaks_cannot_be_told() {
        let l = leaks_device(&run(&Run { leak: true, ..base(1) }), 0);
        assert_eq!((l.steps.source, l.steps.steps, l.steps.can_tell), (LeakStepSource::None, 1, false));
        assert!(l.suspects.is_empty());
        let why = l.steps.reason.unwrap();
        assert!(why.contains("cannot be told from one step"), "{why}");
        assert!(why.contains("two training steps or more") && why.contains("fragscope.torch.phase"), "{why}");
        // No step at all: forward passes only.
        let mut snap = run(&Run { leak: true, ..base(3) });
        let keep: Vec<_> = snap.device_traces[0]
            .iter()
            .filter(|e| {
                let s = e.stack.unwrap();
                snap.frames
                    .stack(s)
                    .iter()
                    .all(|&f| snap.frames.str(snap.frames.frame(f).filename) != "/x/torch/optim/adam.py")
                    && snap
                        .frames
                        .stack(s)
                        .iter()
                        .all(|&f| snap.frames.str(snap.frames.frame(f).filename) != "/x/torch/_tensor.py")
            })
            .cloned()
            .collect();
        snap.device_traces[0] = keep;
        let l = leaks_device(&snap, 0);
        assert_eq!((l.steps.steps, l.steps.can_tell), (0, false), "{:?}", l.steps);
        assert!(l.suspects.is_empty());
        assert!(l.steps.reason.unwrap().contains("cannot be told from this trace"));
    }

    #[test]
    fn update_steps_inside_a_forward_pass_are_not_a_loop() {
        let l = leaks_device(&run(&Run { leak: true, nested: true, ..base(6) }), 0);
        assert!(!l.steps.can_tell, "{:?}", l.steps);
        assert!(l.suspects.is_empty());
        assert!(l.steps.reason.unwrap().contains("inside a module's forward"));
    }

    #[test]
    fn a_declared_cache_is_not_a_leak() {
        // The same growth, allocated inside `fragscope.torch.cache("kv")` scopes.
        let mut snap = run(&Run { leak: true, ..base(3) });
        let mut anns = Vec::new();
        for (i, e) in snap.device_traces[0].iter_mut().enumerate() {
            e.time_us = 10 * i as i64;
            if e.action == Action::Alloc && e.size == 2 * MIB {
                for (t, stage) in [(e.time_us - 1, "START"), (e.time_us + 1, "END")] {
                    anns.push(fragscope_snapshot::Annotation {
                        device: 0,
                        time_us: t,
                        name: "fragscope.cache:kv".into(),
                        stage: stage.into(),
                        extra: Vec::new(),
                    });
                }
            }
        }
        assert_eq!(anns.len(), 6);
        // Control: the same run with times and no declaration has its suspect.
        let mut plain = run(&Run { leak: true, ..base(3) });
        for (i, e) in plain.device_traces[0].iter_mut().enumerate() {
            e.time_us = 10 * i as i64;
        }
        snap.external_annotations = Some(anns);
        assert_eq!(leaks_device(&plain, 0).suspects.len(), 1);
        assert!(leaks_device(&snap, 0).suspects.is_empty());
    }

    /// A small loop, as a unit test writes one: entries with times, Python stacks
    /// (innermost first), and `record_function` annotations.
    #[derive(Default)]
    struct Small {
        snap: Snapshot,
        trace: Vec<TraceEvent>,
        anns: Vec<fragscope_snapshot::Annotation>,
        clock: i64,
    }

    impl Small {
        fn stack(&mut self, frames: &[(&str, i64, &str)]) -> StackId {
            self.snap.frames.intern_py_stack(frames)
        }
        fn ev(&mut self, action: Action, addr: u64, size: u64, s: StackId) {
            self.clock += 10;
            let mut e = TraceEvent::new(action, addr, size);
            e.stack = Some(s);
            e.time_us = self.clock;
            self.trace.push(e);
        }
        fn alloc(&mut self, addr: u64, size: u64, s: StackId) {
            self.ev(Action::Alloc, addr, size, s);
        }
        fn free(&mut self, addr: u64, size: u64, s: StackId) {
            self.ev(Action::FreeRequested, addr, size, s);
            self.ev(Action::FreeCompleted, addr, size, s);
        }
        /// `record_function(name)`'s START (`start`) or END.
        fn mark(&mut self, name: &str, start: bool) {
            self.clock += 3;
            self.anns.push(fragscope_snapshot::Annotation {
                device: 0,
                time_us: self.clock,
                name: name.into(),
                stage: if start { "START" } else { "END" }.into(),
                extra: Vec::new(),
            });
        }
        fn done(mut self) -> Snapshot {
            self.snap.device_traces.push(self.trace);
            if !self.anns.is_empty() {
                self.snap.external_annotations = Some(self.anns);
            }
            self.snap
        }
    }

    /// The plugin's GPU case (tests/gpu/plugin_cases.py::test_leaks): each step, inside
    /// `fragscope.torch.phase("step")` (`annotate`), keeps a 32 MiB tensor (`leak`; else
    /// frees it) and frees a 16 MiB temporary; no optimizer, no backward. With `optimizer`,
    /// each step also runs a small module's forward and an optimizer on its parameter
    /// (torch/optim frames): a small model's training steps, which the leak dominates.
    fn kept_per_step(steps: usize, leak: bool, annotate: bool, optimizer: bool) -> Snapshot {
        let mut b = Small::default();
        let test =
            |line| [("/w/tests/test_mem.py", line, "test_leaks"), ("/v/_pytest/python.py", 157, "pytest_pyfunc_call")];
        let (s_keep, s_tmp, s_del) = (b.stack(&test(31)), b.stack(&test(32)), b.stack(&test(33)));
        let s_opt = b.stack(&[
            ("/v/torch/optim/sgd.py", 300, "_single_tensor_sgd"),
            ("/v/torch/optim/optimizer.py", 500, "wrapper"),
            ("/w/tests/test_mem.py", 34, "test_leaks"),
        ]);
        let s_fwd = b.stack(&[
            ("/v/torch/nn/modules/linear.py", 134, "forward"),
            ("/v/torch/nn/modules/module.py", 1790, "_call_impl"),
            ("/w/tests/test_mem.py", 30, "test_leaks"),
        ]);
        if optimizer {
            b.alloc(1 << 40, MIB, s_keep); // the parameter
        }
        for k in 0..steps as u64 {
            if annotate {
                b.mark("step", true);
            }
            if optimizer {
                b.alloc(1 << 39, MIB, s_fwd);
                b.free(1 << 39, MIB, s_del);
            }
            let keep = (1u64 << 30) + k * 64 * MIB;
            b.alloc(keep, 32 * MIB, s_keep);
            b.alloc(1 << 36, 16 * MIB, s_tmp);
            b.free(1 << 36, 16 * MIB, s_del);
            if !leak {
                b.free(keep, 32 * MIB, s_del);
            }
            if optimizer {
                b.alloc(1 << 38, MIB, s_opt);
                b.free(1 << 38, MIB, s_opt);
            }
            if annotate {
                b.mark("step", false);
            }
        }
        b.done()
    }

    #[test]
    fn a_leak_that_is_most_of_what_each_annotated_step_allocates_is_found() {
        for steps in [2, 3, 6] {
            let l = leaks_device(&kept_per_step(steps, true, true, false), 0);
            assert_eq!(
                (l.steps.source, l.steps.steps, l.steps.can_tell),
                (LeakStepSource::Steps, steps, true),
                "{:?}",
                l.steps
            );
            let sites: Vec<(&str, u64)> =
                l.suspects.iter().map(|s| (s.site.site.as_str(), s.growth_bytes_per_step)).collect();
            assert_eq!(sites, [("test_mem.py:31:test_leaks", 32 * MIB)], "{steps} steps");
            assert_eq!(l.suspects[0].never_freed_bytes, steps as u64 * 32 * MIB);
            // The same loop freeing its tensor: nothing.
            let l = leaks_device(&kept_per_step(steps, false, true, false), 0);
            assert!(l.steps.can_tell && l.suspects.is_empty(), "{:?} {:?}", l.steps, l.suspects);
        }
        // Without the annotations nothing bounds the steps, and the analysis says so.
        let l = leaks_device(&kept_per_step(6, true, false, false), 0);
        assert!(!l.steps.can_tell && l.suspects.is_empty(), "{:?}", l.steps);
        assert!(l.steps.reason.unwrap().contains("fragscope.torch.phase"));
    }

    #[test]
    fn a_leak_that_is_most_of_what_each_optimizer_step_allocates_is_found() {
        for annotate in [false, true] {
            let l = leaks_device(&kept_per_step(4, true, annotate, true), 0);
            assert!(l.steps.can_tell, "{:?}", l.steps);
            let sites: Vec<(&str, u64)> =
                l.suspects.iter().map(|s| (s.site.site.as_str(), s.growth_bytes_per_step)).collect();
            assert_eq!(sites, [("test_mem.py:31:test_leaks", 32 * MIB)], "annotated {annotate}");
            assert!(leaks_device(&kept_per_step(4, false, annotate, true), 0).suspects.is_empty());
        }
    }

    /// Backward passes without an optimizer, each keeping its result (a saliency map per
    /// input): a computation that collects its results, not a training loop, unless the
    /// program marks the passes as steps. Each pass works on two blocks of `work` bytes
    /// (4 MiB below, unless said).
    fn backward_results(annotate: bool) -> Snapshot {
        backward_results_of(annotate, 4 * MIB)
    }

    fn backward_results_of(annotate: bool, work: u64) -> Snapshot {
        let mut b = Small::default();
        let s_fwd = b.stack(&[("/w/model.py", 10, "forward"), ("/w/attr.py", 5, "main")]);
        let s_tmp = b.stack(&[("/v/torch/_tensor.py", 600, "backward"), ("/w/attr.py", 6, "main")]);
        let s_res = b.stack(&[("/v/torch/_tensor.py", 600, "backward"), ("/w/attr.py", 7, "main")]);
        for k in 0..5u64 {
            if annotate {
                b.mark("step", true);
            }
            b.alloc(1 << 36, work, s_fwd);
            b.alloc(1 << 37, work, s_tmp);
            b.free(1 << 37, work, s_tmp);
            b.free(1 << 36, work, s_tmp);
            b.alloc((1 << 30) + k * 64 * MIB, 32 * MIB, s_res);
            if annotate {
                b.mark("step", false);
            }
        }
        b.done()
    }

    #[test]
    fn backward_passes_that_keep_most_of_their_work_are_a_build_up_unless_marked_as_steps() {
        let l = leaks_device(&backward_results(false), 0);
        assert!(!l.steps.can_tell && l.suspects.is_empty(), "{:?} {:?}", l.steps, l.suspects);
        let why = l.steps.reason.unwrap();
        assert!(why.contains("5 steps (bounded by backward passes") && why.contains("build-up"), "{why}");
        let l = leaks_device(&backward_results(true), 0);
        assert!(l.steps.can_tell, "{:?}", l.steps);
        let sites: Vec<&str> = l.suspects.iter().map(|s| s.site.site.as_str()).collect();
        assert_eq!(sites, ["attr.py:7:main"]);
    }

    #[test]
    fn r_squared_of_lines() {
        assert_eq!(r_squared(&[1.0, 2.0]), 1.0);
        assert!((r_squared(&[1.0, 3.0, 5.0, 7.0]) - 1.0).abs() < 1e-12);
        assert!(r_squared(&[1.0, 5.0, 1.0, 5.0]) < 0.3);
    }

    // The rule groups of `leaks_device_with`, each on a minimal hand-built input.

    /// Steps as [`steps`] finds them, one per flag (`complete`), ten entries each.
    fn steps_of(complete: &[bool]) -> Steps {
        Steps {
            device: 0,
            source: StepSource::Optimizer,
            evidence: Vec::new(),
            steps: complete
                .iter()
                .enumerate()
                .map(|(i, &c)| Step { start: 10 * i, end: 10 * i + 10, phases: Vec::new(), complete: c, layers: None })
                .collect(),
            after_last_step: None,
            reason: None,
            phase_of: Vec::new(),
        }
    }

    #[test]
    fn too_few_steps_needs_two_complete_steps() {
        assert_eq!(too_few_steps(&steps_of(&[true, true]), 0), None);
        assert_eq!(too_few_steps(&steps_of(&[false, true, true]), 1), None);
        let one = too_few_steps(&steps_of(&[true]), 0).unwrap();
        assert!(one.contains("leaks cannot be told from one step"), "{one}");
        // A first step the recording began inside does not count.
        let begun_inside = too_few_steps(&steps_of(&[false, true]), 1).unwrap();
        assert!(begun_inside.starts_with("1 complete training step (the recording began inside"), "{begun_inside}");
        assert!(begun_inside.ends_with(HOW_TO_RECORD), "{begun_inside}");
        let none = too_few_steps(&steps_of(&[]), 0).unwrap();
        assert!(none.contains("cannot be told from this trace"), "{none}");
    }

    #[test]
    fn sample_points_are_the_first_start_then_each_end_within_the_trace() {
        let st = steps_of(&[true, true, true]);
        assert_eq!(sample_points(&st.steps, 100), vec![0, 10, 20, 30]);
        // A step that ends past the trace's last entry is cut at it.
        assert_eq!(sample_points(&st.steps[1..], 25), vec![10, 20, 25]);
    }

    /// Rows as `SiteBytes::rows`, given each site's column: its live bytes at the start of
    /// the first step, at the end of each step, then at the end of the trace.
    fn rows_of(cols: &[&[u64]]) -> Vec<Vec<u64>> {
        (0..cols[0].len()).map(|k| cols.iter().map(|c| c[k]).collect()).collect()
    }

    #[test]
    fn growing_sites_keeps_sites_that_grow_after_the_first_step_and_keep_the_growth() {
        // Three steps: the start, the ends of steps 1, 2 and 3, the end of the trace.
        let rows = rows_of(&[
            &[0, 4, 6, 8, 8], // grows in both comparisons and keeps it: a suspect
            &[0, 4, 4, 4, 4], // level after the first step (state made once)
            &[0, 4, 6, 8, 5], // grows, then gives most of it back (a cache)
            &[0, 4, 6, 5, 6], // grows in one comparison of two, under the 75% needed
            &[0, 8, 2, 4, 4], // ends below the first step's end
            &[0, 4, 6, 8, 6], // keeps exactly half of its growth: still a suspect
        ]);
        assert_eq!(growing_sites(&rows, 6, 3), vec![(0, 2), (5, 2)]);
        // Two steps: one comparison, which must rise.
        let rows = rows_of(&[&[0, 4, 5, 5], &[0, 4, 4, 4]]);
        assert_eq!(growing_sites(&rows, 2, 2), vec![(0, 1)]);
    }

    #[test]
    fn only_the_first_steps_can_be_begun_inside() {
        assert_eq!(begun_inside(&steps_of(&[false, true, true])), 1);
        assert_eq!(begun_inside(&steps_of(&[true, false, true])), 0);
    }

    #[test]
    fn nested_in_forward_when_a_modules_forward_calls_the_steps() {
        // The same run with its optimizer and backward called from a module's forward, and
        // (near miss) from the training loop.
        for nested in [true, false] {
            let snap = run(&Run { nested, ..base(3) });
            let st = steps(&snap, 0);
            assert_eq!(st.steps.len(), 3);
            let why = nested_in_forward(&snap, 0, &st, &st.steps);
            assert_eq!(why.is_some(), nested, "{why:?}");
            assert!(why.as_deref().is_none_or(|w| w.contains("3 of them run inside a module's forward")), "{why:?}");
        }
    }

    /// Rule 4 ([`build_up`]) on a whole snapshot, after the rules before it (which must
    /// find growing sites).
    fn build_up_of(snap: &Snapshot) -> Option<String> {
        let lives = BlockLives::replay(snap, 0);
        let st = steps(snap, 0);
        let pos = sample_points(&st.steps[begun_inside(&st)..], snap.trace(0).len());
        let bytes = SiteBytes::measure(&snap.frames, snap.trace(0), &lives, &pos, &[]);
        let cands = growing_sites(&bytes.rows, bytes.table.sites.len(), pos.len() - 1);
        assert!(!cands.is_empty());
        build_up(snap, 0, &st, &lives.traced, &pos, &bytes.rows, &cands)
    }

    #[test]
    fn a_build_up_is_backward_passes_alone_keeping_most_of_what_they_allocate() {
        // Each pass keeps 32 MiB of the 40 it allocates.
        let why = build_up_of(&backward_results(false)).unwrap();
        assert!(why.contains("grows by 80% of what the steps after the first allocate"), "{why}");
        // Near misses: 32 of 160 MiB; the passes marked as steps; a leak that is most of
        // what each optimizer step allocates.
        assert_eq!(build_up_of(&backward_results_of(false, 64 * MIB)), None);
        assert_eq!(build_up_of(&backward_results(true)), None);
        assert_eq!(build_up_of(&kept_per_step(4, true, false, true)), None);
    }

    #[test]
    fn a_declared_caches_blocks_get_no_site() {
        // One block in each scope: `fragscope.cache`, `fragscope.cache:NAME`, and (near
        // miss) a scope of another name.
        let mut b = Small::default();
        let s = b.stack(&[("/u/serve.py", 3, "main")]);
        for (k, name) in ["fragscope.cache", "fragscope.cache:kv", "kv_cache"].into_iter().enumerate() {
            b.mark(name, true);
            b.alloc(MIB * k as u64, MIB, s);
            b.mark(name, false);
        }
        let snap = b.done();
        assert_eq!(declared_caches(&snap, 0), [(0, 1), (1, 2)]);
        // The blocks made at entries 1 and 2, inside [2, 4) (entry 4 is past it), are left
        // out of the sites and of their live bytes.
        let life = |alloc: usize| TracedLife::new(alloc, LIVE_AT_END, 100);
        let lives = BlockLives { device: 0, seeded: Vec::new(), traced: (1..5).map(life).collect() };
        // Their `alloc` entries, without stacks.
        let trace = vec![TraceEvent::new(Action::Alloc, 0, 100); 5];
        let bytes = SiteBytes::measure(&snap.frames, &trace, &lives, &[0, 5], &[(2, 4)]);
        assert_eq!(bytes.sites.iter().map(Option::is_some).collect::<Vec<_>>(), [true, false, false, true]);
        assert_eq!(bytes.rows.iter().map(|r| r.iter().sum::<u64>()).collect::<Vec<_>>(), [0, 200, 200]);
    }

    #[test]
    fn evidence_of_counts_blocks_that_outlive_their_step_and_are_never_freed() {
        let life = |alloc: usize, end: usize, size: u64| TracedLife::new(alloc, end, size);
        // Three steps, ending at entries 10, 20 and 30.
        let pos = [0, 10, 20, 30];
        let blocks = [
            life(2, LIVE_AT_END, 100), // step 0, never freed
            life(12, 15, 50),          // step 1, freed inside it
            life(22, 40, 70),          // step 2, freed after it: outlived it
            life(5, LIVE_AT_END, 30),  // in a declared cache: no site
            life(3, LIVE_AT_END, 10),  // another site
        ];
        let sites = [Some(0), Some(0), Some(0), None, Some(1)];
        let ev = evidence_of(&blocks, &sites, &[(0, 2)], &pos, None);
        assert_eq!(ev.len(), 1);
        let a = &ev[0];
        assert_eq!((a.nf_blocks, a.nf_bytes, a.first_nf, a.last_nf, a.freed), (1, 100, Some(2), Some(2), 2));
        assert!(a.roles.is_empty());
        let spans: Vec<(usize, u64, u64)> = a.spans.values().map(|g| (g.window, g.blocks, g.bytes)).collect();
        assert_eq!(spans, vec![(0, 1, 100), (2, 1, 70)]);
    }
}
