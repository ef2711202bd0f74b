//! Predict the memory of a run nobody recorded: the same program at another batch size,
//! sequence length or any other size parameter, from two or more recordings at small
//! sizes — replayed through the allocator model, rounding, caching and settings included.
//!
//! The method, "transform the trace, replay it exactly":
//!
//! 1. **Align** ([`align`]) the recordings request by request: the same call sites in
//!    the same order, the allocator's own segment events left out, requests present at
//!    some sizes only skipped. Recordings that do not align, or that align but do
//!    something else ([`behaviour`]: a training step and an inference run, grad
//!    enabled or not, autocast or fp32, another model), are not the same program and
//!    are refused with the difference found ([`PredictError::NotSameProgram`]); so is
//!    one recording given under two sizes, and sizes under which nearly every varying
//!    request shrinks as the size grows (labels in the wrong order).
//! 2. **Fit** ([`fit`]) each aligned request's requested bytes as the simplest exact
//!    law of the size parameter (constant, `c·x`, `c·x²`, affine, quadratic): requested
//!    sizes are exact tensor bytes, the allocator's rounding comes later, in the model.
//! 3. **Synthesise and replay** ([`Program::predict`]): the trace of the largest
//!    recording (the *template*), every request at its fitted size, replayed through
//!    [`fragscope_alloc::CachingAllocator`] from the template's state before the trace
//!    (blocks live before recording began, rebuilt by the replay's backward walk:
//!    [`fragscope_replay::Seeded`]), with the `empty_cache()` calls the template made,
//!    under the recorded settings or any other, on a device of any size: peaks, and
//!    where the first OOM would be.
//! 4. **Largest size that fits** ([`Program::max_fit`]): bisection over such replays.
//! 5. **Ranges, not false precision** ([`Range`], [`Program::max_fit_range`]): where the
//!    recordings leave a law open (only determined, step-like, no law, or the target more
//!    than [`FAR_BEYOND`] times past them), the same replay under the low and the high
//!    [`Scenario`] (each open request at the least or the most of its plausible
//!    alternatives, [`fit::alternatives`]) bounds the peaks; `--max-fit` reports the
//!    largest size that fits for certain and the largest that might.
//!
//! Principal types: [`Recording`] (a snapshot and its size), [`Program`] (the fitted
//! program of one device), [`Prediction`] (one replay at one size, with its [`Range`]),
//! [`MaxFit`] (with its [`MaxFitRange`]), [`behaviour::Behaviour`] (what one recording's
//! program does, for the same-program check).
//!
//! What it cannot know is said, not hidden: requests whose size follows no law
//! ([`Law::Unfit`]) or that were seen at one size only are listed; each prediction says
//! how much of its peak comes from sizes that are constant, confirmed by a recording
//! they were not fitted to, only determined by the recordings, or guessed
//! ([`PeakBreakdown`]). Blocks live before the trace are the template's, unscaled.

mod align;
pub mod behaviour;
mod degenerate;
mod fit;
mod warm;

use std::collections::HashMap;

use fragscope_alloc::rounding::round_size;
use fragscope_alloc::{AllocatorConfig, CachingAllocator, PoolId, SimulatedDevice, StreamId, DEFAULT_POOL};
use fragscope_snapshot::{Action, FxHashMap, Snapshot, TraceEvent};
use serde::Serialize;

pub use fit::{alternatives, Evidence, Law, SizeFit};
use fragscope_replay::{
    capacity_for, recorded_config, replayable_devices, stack_strings, BlockMap, Seeded, StartError, UNLIMITED,
};
use fragscope_trace::site_of;

/// Least share of requests that must align for two recordings to count as one program.
pub const MIN_ALIGNED: f64 = 0.8;

/// One recording and the value of the size parameter it was made at.
#[derive(Clone, Copy, Debug)]
pub struct Recording<'a> {
    pub snap: &'a Snapshot,
    pub size: u64,
}

/// Why no prediction can be made; `Display` says it in one line.
#[derive(Clone, Debug, PartialEq)]
pub enum PredictError {
    /// Fewer than two recordings (how many). The message ends with
    /// [`recording_recipe`], which names the CLI's `--sizes` and `--at`.
    TooFewRecordings(usize),
    /// A size of 0.
    ZeroSize,
    /// Two recordings at this size.
    DuplicateSize(u64),
    /// The template recording (at `size`) has no allocation on `device`.
    NothingToFit { size: u64, device: i64 },
    /// No device has a trace in every recording.
    NoCommonDevice,
    /// The recordings at `size` and `template_size` are not the same program: they
    /// align on only `aligned` (0–1) of their allocations, below [`MIN_ALIGNED`], or
    /// what they do differs ([`behaviour::differences`]: training or inference, grad
    /// mode, precision, model), each difference in words with its evidence.
    NotSameProgram { size: u64, template_size: u64, aligned: f64, differences: Vec<String> },
    /// The recordings at sizes `a` and `b` have the same trace, entry for entry (the
    /// same file given twice): nothing varies with the size.
    SameRecording { a: u64, b: u64 },
    /// Of the `varying` requests whose size changes between the recordings, `shrinking`
    /// get smaller as the size parameter (`sizes`, in the order given) grows: the sizes
    /// are given in the wrong order, or the parameter is not one the memory grows with.
    SizesShrink { shrinking: usize, varying: usize, sizes: Vec<u64> },
    /// The template's (at `size`) state before the trace was rebuilt but the allocator
    /// model cannot hold it under the recorded settings (why): predictions would start
    /// empty, without the memory live before the trace.
    StartNotHeld { size: u64, why: String },
}

impl std::fmt::Display for PredictError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PredictError::TooFewRecordings(n) => write!(
                f,
                "predict needs two or more recordings of one program at different sizes, got {n}: {}",
                recording_recipe()
            ),
            PredictError::ZeroSize => f.write_str(
                "a size of 0: sizes are the batch size, sequence length, ... of each recording, \
                                 all at least 1",
            ),
            PredictError::DuplicateSize(s) => {
                write!(f, "two recordings at size {s}: each recording must be at a different size")
            }
            PredictError::NothingToFit { size, device } => write!(
                f,
                "the recording at size {size} has no allocation in its trace on device {device}: nothing to fit"
            ),
            PredictError::NoCommonDevice => {
                f.write_str("the recordings share no device with a trace: nothing to align")
            }
            PredictError::NotSameProgram { size, template_size, aligned, differences } if !differences.is_empty() => {
                write!(
                    f,
                    "the recordings at sizes {size} and {template_size} are not the same program: {} ({:.0}% of \
                     their allocations align: same call sites in the same order)",
                    differences.join("; "),
                    aligned * 100.0
                )
            }
            PredictError::NotSameProgram { size, template_size, aligned, .. } => write!(
                f,
                "the recordings at sizes {size} and {template_size} are not the same program: {:.0}% of their \
                 allocations align (same call sites in the same order; {:.0}% needed), and they do not differ in \
                 training or inference, grad mode, precision or model: the script or the code path it takes \
                 changed between the recordings; record every size with the same script and settings",
                aligned * 100.0,
                MIN_ALIGNED * 100.0
            ),
            PredictError::SameRecording { a, b } => write!(
                f,
                "the recordings at sizes {a} and {b} are the same recording (identical traces, entry for entry): \
                 the same file given twice? Record the program once at each size"
            ),
            PredictError::SizesShrink { shrinking, varying, sizes } => write!(
                f,
                "{shrinking} of the {varying} allocations whose size changes between the recordings get smaller as \
                 the size grows (sizes given: {}): the sizes are likely given in the wrong order (--sizes lists each \
                 file's size, in file order); if the memory really shrinks as this parameter grows (micro-batches, \
                 devices), give the size it grows with instead (the micro-batch size)",
                sizes.iter().map(|s| s.to_string()).collect::<Vec<_>>().join(",")
            ),
            PredictError::StartNotHeld { size, why } => write!(
                f,
                "the recording at size {size}: its allocator state before the trace could not be held ({why}); a \
                 prediction would start without the memory live then"
            ),
        }
    }
}
impl std::error::Error for PredictError {}

/// What to record when only one recording is at hand: the same step at two sizes, with
/// `fragscope.torch.record`, then the command that predicts from them.
pub fn recording_recipe() -> &'static str {
    "record the same step at two sizes, e.g. `for n in (8, 16): with fragscope.torch.record(dump_to=f\"step-{n}.pickle\"): \
     train_step(batch_size=n)`, then `fragscope predict step-8.pickle step-16.pickle --sizes 8,16 --at 64`"
}

/// How one recording aligned with the template.
#[derive(Clone, Debug, Serialize)]
pub struct Alignment {
    /// Size parameter of the recording.
    pub size: u64,
    /// Requests (`alloc`, `oom`) in the recording's trace.
    pub requests: usize,
    /// Of them, aligned with a request of the template.
    pub aligned: usize,
    /// `aligned / max(requests, template requests)`.
    pub fraction: f64,
}

/// A request whose size no law explains, or seen at one size only.
#[derive(Clone, Debug, Serialize)]
pub struct Unexplained {
    /// Index of the entry in the template's trace.
    pub index: usize,
    pub law: Law,
    /// `(size parameter, requested bytes)` as recorded.
    pub recorded: Vec<(u64, u64)>,
    /// Call site as analyses name it (`file.py:line:function`, else the innermost
    /// meaningful C++ frame).
    pub site: String,
}

/// Counts of requests by the law their size follows.
#[derive(Clone, Debug, Default, Serialize)]
pub struct FitQuality {
    /// Requests in the template.
    pub requests: usize,
    /// Requests aligned in every recording.
    pub aligned_in_all: usize,
    /// `aligned_in_all / requests`.
    pub aligned_fraction: f64,
    /// By law (`constant`, `c*x`, `c*x^2`, `a+b*x`, ..., `unfit`, `single`).
    pub by_law: Vec<(String, usize)>,
    /// By evidence (`constant`, `confirmed`, `determined`, `unfitted`).
    pub by_evidence: Vec<(String, usize)>,
    /// Per recording other than the template.
    pub alignments: Vec<Alignment>,
    /// The unexplained requests, largest first (at most 20 listed).
    pub unexplained: Vec<Unexplained>,
    pub unexplained_total: usize,
}

/// The fitted program of one device: the template's trace and each request's law.
pub struct Program<'a> {
    pub device: i64,
    template: &'a Snapshot,
    /// Size parameter of the template (the largest recording).
    pub template_size: u64,
    /// The recorded sizes, ascending.
    pub sizes: Vec<u64>,
    /// Trace indices of the template's requests, and the fit of each.
    req_index: Vec<usize>,
    fits: Vec<SizeFit>,
    /// The plausible alternatives of each request's law ([`fit::alternatives`]): what a
    /// prediction's [`Range`] replays.
    alts: Vec<Vec<SizeFit>>,
    pub quality: FitQuality,
    /// The template's state before the trace (unknown: replays start empty) and the
    /// `empty_cache()` calls it made.
    seeded: Seeded,
    /// Settings the template recorded.
    pub recorded_config: AllocatorConfig,
    pub notes: Vec<String>,
    /// The template held a cache at its first request (recorded after warm-up steps):
    /// predictions rebuild the cache of their own size ([`Program::predict_observed`]).
    pub started_warm: bool,
    /// What the template's trace carries from one step to the next.
    carry: warm::Carry,
    /// A warm program's recordings replayed as themselves: `(size, peak reserved)`, what
    /// a range holds the rebuilt cache's error to ([`warm::cache_ratios`]). Empty for a
    /// cold program.
    warm_peaks: Vec<(u64, u64)>,
    /// How a warm training template's first rebuilt step starts: what it releases of the
    /// state before the trace, and where it creates again what the trace never frees (the
    /// optimizer's state at the first optimizer phase, [`warm::FirstStep`]). None for a
    /// cold template, one without an optimizer phase, or one whose parameters or state
    /// are replaced each step.
    first_step_plan: Option<warm::FirstStep>,
    /// The blocks live before a warm template's trace that the trace never frees and whose
    /// size the recordings show scales: `(template address, law)`, rebuilt at the target
    /// size ([`warm::scaled_before`]). Empty for a cold template.
    scaled_before: Vec<(u64, SizeFit)>,
}

/// Bytes live at the predicted peak of allocated memory, by how far their sizes can be
/// trusted (each block counted at its rounded size).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PeakBreakdown {
    /// Blocks live before the trace (the template's, unscaled).
    pub before_trace: u64,
    /// Requests of the same size in every recording.
    pub constant: u64,
    /// Laws confirmed by a recording they were not determined by.
    pub confirmed: u64,
    /// Laws only determined by the recordings (as many parameters as recordings).
    pub determined: u64,
    /// Requests no law explains or seen at one size only.
    pub unfitted: u64,
}

impl PeakBreakdown {
    fn add(&mut self, cat: Cat, n: u64) {
        *self.slot(cat) += n;
    }
    fn sub(&mut self, cat: Cat, n: u64) {
        let s = self.slot(cat);
        *s = s.saturating_sub(n);
    }
    fn slot(&mut self, cat: Cat) -> &mut u64 {
        match cat {
            Cat::Before => &mut self.before_trace,
            Cat::Fit(Evidence::Constant) => &mut self.constant,
            Cat::Fit(Evidence::Confirmed) => &mut self.confirmed,
            Cat::Fit(Evidence::Determined) => &mut self.determined,
            Cat::Fit(Evidence::Unfitted) => &mut self.unfitted,
        }
    }
    pub fn total(&self) -> u64 {
        self.before_trace + self.constant + self.confirmed + self.determined + self.unfitted
    }
    /// Share of the peak whose size is extrapolated without a check (determined or
    /// unfitted), 0 to 1.
    pub fn extrapolated_share(&self) -> f64 {
        let t = self.total();
        if t == 0 {
            0.0
        } else {
            (self.determined + self.unfitted) as f64 / t as f64
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cat {
    Before,
    Fit(Evidence),
}

/// The first request the predicted run could not serve.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PredictedOom {
    /// Index of the entry in the template's trace.
    pub index: usize,
    /// Predicted (unrounded) request, and its law.
    pub requested: u64,
    pub law: Law,
    pub rounded: u64,
    /// What was asked of the device ("Tried to allocate").
    pub alloc_size: u64,
    pub reserved: u64,
    pub allocated: u64,
    /// Call site as analyses name it.
    pub site: String,
    /// Allocation stack, innermost first, `file:line:name`.
    pub stack: Vec<String>,
}

/// How far past the recordings a prediction may go before it says so: the laws are
/// checked only on the recorded sizes, and a program can switch kernels or algorithms at
/// larger ones.
pub const FAR_BEYOND: u64 = 4;

/// A note when `at` lies more than [`FAR_BEYOND`] times past the largest recorded size.
/// Measured on real runs (docs/fidelity.md, an H200): a GPT-style program predicted at
/// batch 16 and 32 from batches 4 and 8 matched its real runs to the byte, but at batch
/// 170 from 4, 8 and 16 (10.6 times the largest) the allocated peak came out 13.6 % high
/// and the reserved peak 12–74 % high.
fn far_beyond(at: u64, sizes: &[u64]) -> Option<String> {
    let &max = sizes.iter().max()?;
    (max > 0 && at > max.saturating_mul(FAR_BEYOND)).then(|| {
        format!(
            "size {at} is {:.1} times the largest recording ({max}): the fitted laws were checked only up to \
             {max}, and programs can change kernels or algorithms at larger sizes (a real run predicted 10.6 times \
             past its recordings came out 13.6% below the predicted allocated peak); record once nearer {at} to \
             confirm",
            at as f64 / max as f64
        )
    })
}

/// The state a prediction starts from (the template's state before the trace) does not
/// fit the device: the run cannot even begin at this size on this capacity.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct StartOverCapacity {
    /// Bytes of the blocks live before the trace (allocated, or pending their free).
    pub live: u64,
    /// Bytes reserved before the trace that no release can return: the segments that
    /// hold live blocks, once the cache's free segments are released (as the allocator
    /// releases them when a `cudaMalloc` fails).
    pub reserved: u64,
    pub capacity: u64,
    /// `reserved - capacity`.
    pub over: u64,
}

/// The first step's peaks of a prediction from a template that started warm, where they
/// differ from the steady state's (the prediction's own peaks).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct FirstStep {
    pub peak_reserved: u64,
    pub peak_allocated: u64,
}

/// One synthesised run: the program at size `at`, replayed.
#[derive(Clone, Debug, Serialize)]
pub struct Prediction {
    pub at: u64,
    pub device: i64,
    /// `PYTORCH_CUDA_ALLOC_CONF` in force (canonical; empty = defaults).
    pub config: String,
    /// Device memory replayed against; `None` = unlimited.
    pub capacity: Option<u64>,
    pub peak_reserved: u64,
    pub peak_allocated: u64,
    /// Null when every request was served.
    pub oom: Option<PredictedOom>,
    /// Set when the state before the trace alone exceeds `capacity` (absent otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_over_capacity: Option<StartOverCapacity>,
    /// Set when the template's state before the trace could not be held under `config`
    /// (why): the replay started empty, its figures are not a prediction (absent
    /// otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_refused: Option<String>,
    /// A warm template's first step from an empty cache, where its peaks differ from the
    /// steady state's (absent otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_step: Option<FirstStep>,
    pub breakdown: PeakBreakdown,
    /// Share of the allocated peak extrapolated without a check (0 to 1).
    pub extrapolated_share: f64,
    /// Requests whose law gives no positive size at `at` (left out).
    pub vanished_requests: u64,
    /// The peaks under the plausible alternatives of the laws ([`Range`]); absent from
    /// the replays a search makes ([`Program::predict_scenario`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub range: Option<Range>,
    pub notes: Vec<String>,
}

impl Prediction {
    /// Whether the run fits its capacity: the state before the trace was held and fits,
    /// and every request was served.
    pub fn fits(&self) -> bool {
        self.oom.is_none() && self.start_over_capacity.is_none() && self.start_refused.is_none()
    }
}

/// Which sizes the requests of a replay take: their laws' (the point estimate), or the
/// least or the most of the plausible alternatives ([`fit::alternatives`]), the growth
/// past the recordings slowed or sped up by [`far_margin`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Scenario {
    Point,
    Low,
    High,
}

/// The peaks a prediction may have, given what the recordings leave open: the point
/// estimate and the replays of the low and high [`Scenario`] (and a warm template's first
/// step), least and most.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Range {
    /// `[low, high]` of the peak reserved bytes.
    pub reserved: [u64; 2],
    /// `[low, high]` of the peak allocated bytes.
    pub allocated: [u64; 2],
    /// The low scenario (or the point) fits the capacity: the size might fit.
    pub low_fits: bool,
    /// The high scenario and the point fit: the size fits for certain (as far as the
    /// alternatives go).
    pub high_fits: bool,
    /// Requests whose size at this size the recordings leave open (a law only
    /// determined, a step-like size, a size no law explains, or growth far past the
    /// recordings).
    pub open_requests: usize,
    /// The share by which growth past the largest recording is slowed and sped up
    /// ([`far_margin`]): 0 up to [`FAR_BEYOND`] times the largest recording.
    pub far_margin: f64,
    /// A warm template's rebuilt-cache ratios `[low, high]` ([`warm::cache_ratios`]): the
    /// least and most of 1 and each recording's peak reserved over its own prediction,
    /// by which the reserved range extends around the point.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warm_cache: Option<[f64; 2]>,
}

/// The share of a peak a prediction's range adds on each side whatever the laws: the
/// model's residual where every law is confirmed. Measured on the frozen evaluation's
/// cold and expandable cases with nothing left open: at most 0.15 % (kk-2.7b training
/// step, reserved; most are within 0.02 %), from requests one recording makes and another
/// does not (a workspace at some sizes only) and blocks live before the trace.
pub const RESIDUAL: f64 = 0.002;

/// The largest share by which a prediction's range lets sizes grow slower or faster than
/// their laws past the recordings ([`far_margin`]). Measured: a GPT step predicted at
/// batch 170 from batches up to 16 and up to 32 (`crates/testdata/h200/fit.jsonl`) grew
/// 13.5 % and 15.1 % less from the largest recording than its confirmed laws said (one
/// logits-sized tensor fewer at the peak, past 2³¹ elements); 0.2 covers both.
pub const FAR_MARGIN: f64 = 0.2;

/// The growth margin of a prediction at `at`: [`FAR_MARGIN`] past [`FAR_BEYOND`] times
/// the largest of `sizes` (where [`far_beyond`]'s note says the laws were not checked),
/// none nearer (every case measured up to four times the largest recording, up to 8× the
/// smallest, matched its laws: `crates/predict/tests/it/eval.rs`).
pub fn far_margin(at: u64, sizes: &[u64]) -> f64 {
    match sizes.iter().max() {
        Some(&max) if at > max.saturating_mul(FAR_BEYOND) => FAR_MARGIN,
        _ => 0.0,
    }
}

/// Result of [`Program::max_fit`].
#[derive(Clone, Debug, Serialize)]
pub struct MaxFit {
    pub device: i64,
    pub config: String,
    pub capacity: u64,
    /// The largest size that fits; `None` when none fits (`fits_at` is then absent) or
    /// every size tried fits (see `bounded`).
    pub largest: Option<u64>,
    /// False when even the largest size tried fits (`largest` is then that size, a
    /// lower bound).
    pub bounded: bool,
    /// The replay at `largest` (no OOM).
    pub fits_at: Option<Prediction>,
    /// The replay at `largest + 1` (the first OOM), when bounded.
    pub next: Option<Prediction>,
    /// Replays the search made (the band check's included).
    pub replays: u32,
    /// Sizes just below `largest` (the [`MAX_FIT_BAND`] sizes under it) whose own replay
    /// does not fit: the allocator's luck (a cached block of the right size, a split
    /// that happens to leave room) makes the curve non-monotone there, and a user who
    /// picks one of them runs out of memory. Empty when every size checked fits.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub fails_below: Vec<u64>,
    /// `PYTORCH_CUDA_ALLOC_CONF` (on top of the settings searched) under which every
    /// size of `fails_below` fits, when one of [`fragscope_replay::ALTERNATIVES`] does.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fails_below_fixed_by: Option<String>,
    /// Sizes just above `next` (the [`MAX_FIT_BAND`] sizes over the first OOM) whose own
    /// replay fits: the same luck the other way, so that `largest` is the largest size below
    /// the first OOM the bisection met, not the largest that fits (the fit audit found
    /// 458–460 fitting over an answer of 454). Empty when none does.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub fits_above: Vec<u64>,
    /// The answer's range ([`Program::max_fit_range`]; absent from [`Program::max_fit`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub range: Option<MaxFitRange>,
}

/// What [`Program::search`] found: the largest size that fits (0: none) and its replay,
/// the smallest that does not and its replay (None: every size tried fits).
struct Found {
    lo: u64,
    lo_p: Option<Prediction>,
    hi: Option<(u64, Prediction)>,
}

/// The range of a [`MaxFit`] answer ([`Program::max_fit_range`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct MaxFitRange {
    /// The largest size that fits under the high scenario too (at most the answer):
    /// fits whichever plausible law holds. `None`: no size does.
    pub certain: Option<u64>,
    /// The largest size that fits under the low scenario (at least the answer): fits if
    /// the lowest plausible laws hold.
    pub might: Option<u64>,
    /// False when every size tried fits under the low scenario (`might` is a lower bound).
    pub might_bounded: bool,
}

/// How many sizes right below a `max_fit` answer are replayed too ([`MaxFit::fails_below`]).
pub const MAX_FIT_BAND: u64 = 16;

impl<'a> Program<'a> {
    /// Align and fit `recs` (two or more, of one program, distinct non-zero sizes) on
    /// `device` (default: the first device every recording can replay).
    pub fn fit(recs: &[Recording<'a>], device: Option<i64>) -> Result<Program<'a>, PredictError> {
        check_sizes(recs)?;
        let mut order: Vec<usize> = (0..recs.len()).collect();
        order.sort_by_key(|&k| recs[k].size);
        let t = *order.last().expect("two or more");
        let template = recs[t].snap;
        let device = match device {
            Some(d) => d,
            None => common_device(recs, template)?,
        };
        let trace = template.trace(device);
        let req_index = align::requests(trace);
        if req_index.is_empty() {
            return Err(PredictError::NothingToFit { size: recs[t].size, device });
        }
        degenerate::same_recordings(recs, device)?;
        let (points, in_all, alignments) = align_recordings(recs, &order, t, device, &req_index)?;
        let shrink_note = degenerate::shrinking(recs, &points)?;
        let fits: Vec<SizeFit> = points.iter().map(|p| fit::fit(p)).collect();
        let alts: Vec<Vec<SizeFit>> = points.iter().zip(&fits).map(|(p, f)| fit::alternatives(p, f)).collect();
        let quality = fit_quality(template, trace, &req_index, &fits, &points, &in_all, alignments);
        let (seeded, mut notes) = state_before(recs, &order, t, device);
        notes.extend(shrink_note);
        let recorded = recorded_config(template);
        let warm = started_warm(&seeded, &recorded, &req_index);
        let carry = warm::carry(trace, &req_index, &seeded);
        if let Err(StartError::NotSeeded(e)) = seeded.allocator(recorded.clone(), UNLIMITED) {
            return Err(PredictError::StartNotHeld { size: recs[t].size, why: e.to_string() });
        }
        let mut sizes: Vec<u64> = recs.iter().map(|r| r.size).collect();
        sizes.sort_unstable();
        let warm_peaks = if warm { warm::recorded_peaks(recs, device) } else { Vec::new() };
        let first_step_plan = if warm { warm::first_step(template, device, req_index[0], &seeded) } else { None };
        let scaled_before = if warm { warm::scaled_before(recs, t, device, &seeded) } else { Vec::new() };
        if !scaled_before.is_empty() {
            for n in notes.iter_mut().filter(|n| n.starts_with("blocks live before the trace differ")) {
                *n = n.replace("(the state before the trace is not scaled)", "but for the blocks below");
            }
            notes.push(format!(
                "{} block(s) live before the trace that it never frees differ in size from one recording to the \
                 next as the size does: the rebuilt start holds them at the target size",
                scaled_before.len()
            ));
        }
        let mut prog = Program {
            device,
            template,
            template_size: recs[t].size,
            sizes,
            req_index,
            fits,
            alts,
            quality,
            started_warm: warm,
            carry,
            warm_peaks,
            first_step_plan,
            scaled_before,
            seeded,
            recorded_config: recorded,
            notes,
        };
        let placed = prog.place_lazies();
        if let Some(plan) = prog.first_step_plan.as_mut().filter(|_| !placed.is_empty()) {
            for (addr, at) in placed {
                if let Some(l) = plan.lazy.iter_mut().find(|l| l.0 == addr) {
                    l.1 = at;
                }
            }
            // Stable: the optimizer's state keeps `_init_group`'s order.
            plan.lazy.sort_by_key(|&(_, at)| at);
        }
        Ok(prog)
    }

    /// When the first step of a warm template recorded under expandable segments made the
    /// blocks it made once and kept ([`warm::FirstStep::unknown`]: a cuBLAS workspace at
    /// the first matrix product of a pass, ...), as `(template address, entry)`. Why the
    /// address tells: an expandable reservation maps its pages from its start on demand
    /// and a request takes the best-fitting free run (spec §6.2, §6.3), so a block lies
    /// where such a request was served when it was made; the first step rebuilt at the
    /// template's own size (from the parameters, [`warm::FirstStep`]) makes each one at the
    /// first entry at which a request of its size is served at its template address
    /// ([`Program::place_at`]). Made at the step's first request instead, the 32 MiB
    /// workspaces of the H200 GPT recordings sat under the optimizer's state, and the
    /// rebuilt third step found room for a logits-sized request where the real one mapped
    /// it anew: -6.0 % at batch 4, -6.2 % at bf16 16, -5.6 % at sequence 256; so placed
    /// (at the forward's 12th and the backward's 10th entry, where the real first steps
    /// made them at the 15th and the 12th), every one of those H200 cases within 0.4 %.
    /// Empty where nothing is to place; a block never so served keeps the first request.
    fn place_lazies(&self) -> Vec<(u64, usize)> {
        let Some(f) = self.first_step_plan.as_ref() else { return Vec::new() };
        let cfg = &self.recorded_config;
        if !self.started_warm || !cfg.expandable_segments || f.unknown.is_empty() {
            return Vec::new();
        }
        let mut refused = None;
        let (eng, blocks, live, cat_of) = self.seeded_engine(cfg, self.replay_capacity(cfg, None), &mut refused);
        if refused.is_some() {
            return Vec::new();
        }
        let mut run = Run {
            eng,
            blocks,
            live,
            cat_of,
            oom: None,
            vanished: 0,
            scenario: Scenario::Point,
            pending: Vec::new(),
            placing: None,
        };
        self.rebuild_start(self.template_size, cfg, &mut run);
        for p in run.pending.iter_mut().filter(|p| f.unknown.contains(&p.1)) {
            p.0 = usize::MAX;
        }
        // Still last first (stable), the blocks to place at the bottom.
        run.pending.sort_by_key(|p| std::cmp::Reverse(p.0));
        run.placing = Some(Placing { placed: Vec::new(), first_end: f.first_end });
        self.pass(self.template_size, cfg, &mut run, &mut |_, _| {});
        run.placing.map(|p| p.placed).unwrap_or_default()
    }

    /// Entries of the template's trace (the entries [`Program::predict_observed`] reports).
    pub fn template_entries(&self) -> usize {
        self.template.trace(self.device).len()
    }

    /// The requested size of each template request at `at` (None: vanishes there).
    pub fn sizes_at(&self, at: u64) -> Vec<Option<u64>> {
        self.fits.iter().map(|f| f.at(at)).collect()
    }

    /// Synthesise the trace at size `at` and replay it under `cfg` on a device of
    /// `capacity` bytes (`None`: unlimited).
    pub fn predict(&self, at: u64, cfg: &AllocatorConfig, capacity: Option<u64>) -> Prediction {
        self.predict_observed(at, cfg, capacity, |_, _| {})
    }

    /// [`Program::predict`] under one [`Scenario`] of the laws, without a range: what
    /// [`Program::predict`]'s range and [`Program::max_fit_range`] replay.
    pub fn predict_scenario(&self, at: u64, cfg: &AllocatorConfig, capacity: Option<u64>, sc: Scenario) -> Prediction {
        self.replay_at(at, cfg, capacity, sc, &mut |_, _| {})
    }

    /// The requested size of template request `q` at `at` under scenario `sc`: its law's
    /// ([`Scenario::Point`]), or the least or the most of its law and its alternatives,
    /// with the growth past the recordings slowed or sped up by [`far_margin`].
    fn size_at(&self, q: usize, at: u64, sc: Scenario) -> Option<u64> {
        let f = &self.fits[q];
        if sc == Scenario::Point {
            return f.at(at);
        }
        // A size that reaches nothing is an artefact of a law that bends down (a
        // quadratic through a cap), not a plausible size: the least among those left.
        let all = std::iter::once(f).chain(&self.alts[q]).filter_map(|g| Some((g.at(at)?, g)));
        let (n, g) = if sc == Scenario::Low { all.min_by_key(|x| x.0) } else { all.max_by_key(|x| x.0) }?;
        let m = far_margin(at, &self.sizes);
        let top = *self.sizes.last()?;
        match g.at(top) {
            Some(base) if m > 0.0 && n > base => {
                let k = if sc == Scenario::Low { 1.0 - m } else { 1.0 + m };
                Some(base + ((n - base) as f64 * k).round() as u64)
            }
            _ => Some(n),
        }
    }

    /// The largest request of the template's step at `at` (its point size).
    fn largest_request(&self, at: u64) -> u64 {
        (0..self.fits.len()).filter_map(|q| self.size_at(q, at, Scenario::Point)).max().unwrap_or(0)
    }

    /// How many template requests have a size at `at` that their alternatives or the
    /// margin past the recordings leave open.
    fn open_requests(&self, at: u64) -> usize {
        (0..self.fits.len())
            .filter(|&q| self.size_at(q, at, Scenario::Low) != self.size_at(q, at, Scenario::High))
            .count()
    }

    /// The range of the prediction `p` (the point): the low and high scenarios replayed,
    /// with the point's own peaks and a warm template's first step among them.
    fn range_of(&self, p: &Prediction, cfg: &AllocatorConfig) -> Range {
        let open = self.open_requests(p.at);
        // Peaks from replays without the capacity: a replay that runs out of memory stops
        // counting at its OOM, which would cut the range's high end short.
        let free = |sc: Scenario| self.predict_scenario(p.at, cfg, None, sc);
        let point = if p.capacity.is_some() && !p.fits() { free(Scenario::Point) } else { p.clone() };
        let mut r = Range {
            reserved: [point.peak_reserved; 2],
            allocated: [point.peak_allocated; 2],
            low_fits: p.fits(),
            high_fits: p.fits(),
            open_requests: open,
            far_margin: far_margin(p.at, &self.sizes),
            warm_cache: None,
        };
        let mut widen = |x: &Prediction, overhead: Option<u64>| {
            let mut w = |res: u64, alloc: u64| {
                r.reserved = [r.reserved[0].min(res), r.reserved[1].max(res)];
                r.allocated = [r.allocated[0].min(alloc), r.allocated[1].max(alloc)];
            };
            w(x.peak_reserved, x.peak_allocated);
            if let Some(o) = overhead {
                w(x.peak_allocated + o, x.peak_allocated);
            }
            if let Some(f) = &x.first_step {
                w(f.peak_reserved, f.peak_allocated);
            }
        };
        widen(&point, None);
        if open > 0 {
            let (lo, hi) = (free(Scenario::Low), free(Scenario::High));
            // A scenario moves every open size its own way, and the cache's overhead over
            // the live bytes (reserved less allocated at their peaks) with them: each
            // replay's overhead on each scenario's allocated peak is as plausible (far
            // out under expandable segments the low scenario kept 12 GB over allocated,
            // the high one and the real run under 1 GB).
            let over = |x: &Prediction| x.peak_reserved.saturating_sub(x.peak_allocated);
            for x in [&lo, &hi] {
                for o in [over(&point), over(&lo), over(&hi)] {
                    widen(x, Some(o));
                }
            }
            if p.capacity.is_some() {
                let fits = |sc: Scenario| self.predict_scenario(p.at, cfg, p.capacity, sc).fits();
                r.low_fits = p.fits() || fits(Scenario::Low);
                r.high_fits = p.fits() && fits(Scenario::High);
            }
        }
        // Under expandable segments, what a later step adds on top of the program's
        // history as rebuilt from the parameters where one request finds no free run of
        // its size (warm::fresh_pages): which step's layout leaves no hole for it depends
        // on where each block of the first step went, which the rebuild infers.
        if self.started_warm && cfg.expandable_segments && self.first_step_plan.is_some() {
            let fresh = warm::fresh_pages(self.largest_request(p.at), cfg.large_segment_size);
            r.reserved[1] = r.reserved[1].max(point.peak_reserved + fresh);
        }
        // A warm template's cache: rebuilt by the predicted step, while the real one was
        // built by a first step the recording does not hold (warm::cache_ratios).
        if self.started_warm && p.start_refused.is_none() {
            let predicted =
                |s: u64| self.predict_scenario(s, &self.recorded_config, None, Scenario::Point).peak_reserved;
            let [lo, hi] = warm::cache_ratios(&self.warm_peaks, predicted);
            r.warm_cache = Some([lo, hi]);
            let at = |k: f64| (point.peak_reserved as f64 * k).round() as u64;
            r.reserved = [r.reserved[0].min(at(lo)), r.reserved[1].max(at(hi))];
        }
        // A warm template's rebuilt cache without expandable segments: which cached block
        // serves each request decides what it counts whole (spec §3.8: a large-pool block
        // is split only where more than 1 MiB would remain, and allocated bytes count the
        // block), and the real cache is not the rebuilt one. What the point's layout left
        // unsplit at its peak, another layout may leave as much again or none of.
        if self.started_warm && p.start_refused.is_none() && !cfg.expandable_segments {
            let unsplit = warm::unsplit_bytes(point.peak_allocated, point.breakdown.total());
            r.allocated = [
                r.allocated[0].min(point.peak_allocated - unsplit),
                r.allocated[1].max(point.peak_allocated + unsplit),
            ];
        }
        // The model's own residual, whatever the laws: the allocator's decisions on
        // requests the template does not share with the target.
        let widen_by = |[lo, hi]: [u64; 2]| {
            [(lo as f64 * (1.0 - RESIDUAL)).floor() as u64, (hi as f64 * (1.0 + RESIDUAL)).ceil() as u64]
        };
        r.reserved = widen_by(r.reserved);
        r.allocated = widen_by(r.allocated);
        r
    }

    /// [`Program::predict`], calling `observe(i, levels)` after each entry `i` of the
    /// template's trace from the first request on (the peaks count from there), with the
    /// replay's reserved and allocated bytes then and their peaks so far (`[reserved,
    /// allocated, peak reserved, peak allocated]`): the predicted curves the report draws.
    pub fn predict_observed(
        &self,
        at: u64,
        cfg: &AllocatorConfig,
        capacity: Option<u64>,
        mut observe: impl FnMut(usize, [u64; 4]),
    ) -> Prediction {
        let mut p = self.replay_at(at, cfg, capacity, Scenario::Point, &mut observe);
        let r = self.range_of(&p, cfg);
        if let Some([_, hi]) = r.warm_cache {
            p.notes.push(format!(
                "the reserved range spans ±{:.1}% around the point for the rebuilt cache: the most by which \
                 a recording's peak reserved differs from the prediction of its own size, 3% at least (the real \
                 cache was built by a first step the recording does not hold)",
                (hi - 1.0) * 100.0
            ));
        }
        if self.started_warm && cfg.expandable_segments && self.first_step_plan.is_some() {
            p.notes.push(
                "under expandable_segments the reserved range also holds the largest request's pages more than the \
                 point (pages stay mapped until empty_cache(), and a later step whose largest request finds no free \
                 run of its size maps it anew)"
                    .to_string(),
            );
        }
        p.range = Some(r);
        p
    }

    /// One prediction under scenario `sc` (module doc of [`Program::predict_observed`]),
    /// without its range.
    fn replay_at(
        &self,
        at: u64,
        cfg: &AllocatorConfig,
        capacity: Option<u64>,
        sc: Scenario,
        observe: &mut dyn FnMut(usize, [u64; 4]),
    ) -> Prediction {
        let mut notes = Vec::new();
        let cap = self.replay_capacity(cfg, capacity);
        let mut start_refused = None;
        let (mut eng, blocks, live, cat_of) = self.seeded_engine(cfg, cap, &mut start_refused);
        notes.extend(start_refused.clone());
        let start_over_capacity = start_within(&mut eng, cap, live.before_trace, &mut notes);
        let mut run =
            Run { eng, blocks, live, cat_of, oom: None, vanished: 0, scenario: sc, pending: Vec::new(), placing: None };
        let warm = self.started_warm && start_refused.is_none() && start_over_capacity.is_none();
        if warm {
            self.rebuild_start(at, cfg, &mut run);
        }
        // A template that started warm: the step again from its own end until the reserved
        // bytes at its end repeat (the cache the target size builds), the last pass
        // reported; a cold one: once.
        let mut first: Option<PassPeaks> = None;
        let mut last;
        let mut passes = 0u32;
        loop {
            let mut seen = Vec::new();
            last = self.pass(at, cfg, &mut run, &mut |i, l| seen.push((i, l)));
            passes += 1;
            let repeat = first.as_ref().is_some_and(|_| last.end_reserved == last.start_reserved);
            if !warm || run.oom.is_some() || repeat || passes >= MAX_PASSES {
                for (i, l) in seen {
                    observe(i, l);
                }
                break;
            }
            if first.is_none() {
                first = Some(last.clone());
            }
            self.carry_over(&mut run);
        }
        let first_step = first.filter(|f| (f.reserved, f.allocated) != (last.reserved, last.allocated));
        if warm {
            notes.push(warm_note(passes, first_step.as_ref(), &last));
        }
        self.size_notes(at, run.vanished, &mut notes);
        Prediction {
            at,
            device: self.device,
            config: cfg.to_conf_string(),
            capacity,
            peak_reserved: last.reserved,
            peak_allocated: last.allocated,
            oom: run.oom,
            start_over_capacity,
            start_refused,
            first_step: first_step.map(|f| FirstStep { peak_reserved: f.reserved, peak_allocated: f.allocated }),
            breakdown: last.at_peak,
            extrapolated_share: last.at_peak.extrapolated_share(),
            vanished_requests: run.vanished,
            range: None,
            notes,
        }
    }

    /// One pass of the template's trace at size `at` on `run`, calling `observe` after
    /// each entry from the first request on: its peaks, which count from that request.
    fn pass(
        &self,
        at: u64,
        cfg: &AllocatorConfig,
        run: &mut Run,
        observe: &mut dyn FnMut(usize, [u64; 4]),
    ) -> PassPeaks {
        let snap = self.template;
        let trace = snap.trace(self.device);
        let start_reserved = run.eng.reserved_bytes();
        let mut at_peak = run.live;
        let mut peak_alloc = 0;
        // Peaks count from the first request: cached segments the template held before
        // the trace (history of what ran earlier in its process, at its own size) and
        // released by an `empty_cache()` before any request are not part of this run.
        let mut started = false;
        let mut ec = self.seeded.empty_cache_before().iter().copied().peekable();
        let mut q = 0usize; // next template request
        for (i, ev) in trace.iter().enumerate() {
            // The entry before this one is done (entries end early with `continue`).
            if started {
                observe(i - 1, levels(&run.eng));
            }
            while ec.peek().is_some_and(|&k| k <= i) {
                ec.next();
                run.eng.empty_cache();
            }
            let pool = snap.pool_id(ev).unwrap_or(DEFAULT_POOL);
            self.create_lazy(i, cfg, run);
            match ev.action {
                Action::Alloc | Action::Oom => {
                    debug_assert_eq!(self.req_index[q], i);
                    if !started {
                        started = true;
                        run.eng.reset_peak_stats();
                        peak_alloc = run.eng.stats().allocated_bytes.all().current.max(0) as u64;
                        at_peak = run.live;
                    }
                    let f = self.fits[q];
                    let size = self.size_at(q, at, run.scenario);
                    q += 1;
                    let Some(n) = size else {
                        run.vanished += 1;
                        if ev.action == Action::Alloc {
                            run.blocks.allocated(ev.addr, None);
                        }
                        continue;
                    };
                    match run.eng.malloc_in_pool(n, snap.stream(ev), pool) {
                        Ok(a) => {
                            if ev.action == Action::Oom {
                                let _ = run.eng.free(a);
                            } else {
                                run.blocks.allocated(ev.addr, Some(a));
                                let r = round_size(n, cfg);
                                run.live.add(Cat::Fit(f.evidence), r);
                                run.cat_of.insert(a, (Cat::Fit(f.evidence), r));
                                let cur = run.eng.stats().allocated_bytes.all().current.max(0) as u64;
                                if cur > peak_alloc {
                                    peak_alloc = cur;
                                    at_peak = run.live;
                                }
                            }
                        }
                        Err(o) => {
                            if ev.action == Action::Alloc {
                                run.blocks.allocated(ev.addr, None);
                            }
                            if run.oom.is_none() {
                                run.oom = Some(predicted_oom(snap, i, ev, &f, &o));
                            }
                        }
                    }
                }
                Action::FreeRequested | Action::FreeCompleted => {
                    replay_free(&mut run.eng, &mut run.blocks, &mut run.cat_of, &mut run.live, ev);
                }
                _ => {}
            }
        }
        if started {
            observe(trace.len() - 1, levels(&run.eng));
        }
        let st = run.eng.stats();
        PassPeaks {
            reserved: st.reserved_bytes.all().peak.max(0) as u64,
            allocated: st.allocated_bytes.all().peak.max(0) as u64,
            at_peak,
            start_reserved,
            end_reserved: run.eng.reserved_bytes(),
        }
    }

    /// The start of a warm template's prediction at size `at`: the previous step's
    /// leftovers (blocks live before the trace that the trace frees, [`warm::Carry`])
    /// replaced by their counterparts at `at`, and the template's cache released, so that
    /// the step builds the cache of its own size. A training template with a
    /// [`warm::FirstStep`] starts instead as its program's first step did: from the
    /// parameters alone ([`Program::first_step_start`]).
    fn rebuild_start(&self, at: u64, cfg: &AllocatorConfig, run: &mut Run) {
        let trace = self.template.trace(self.device);
        for &(addr, _) in &self.carry.pairs {
            if let Some(a) = run.blocks.target(addr) {
                let _ = run.eng.free(a);
                if let Some((c, n)) = run.cat_of.remove(&a) {
                    run.live.sub(c, n);
                }
                run.blocks.completed(addr);
            }
        }
        // Under expandable segments too, since the blocks the first step made once are
        // made where their addresses say (`Program::place_lazies`): no page is unmapped
        // between `empty_cache()` calls, so what the first steps mapped stays, and each
        // step maps more where the large blocks it keeps across the step boundary (the last
        // logits) land on a layout the previous steps left, which starts with the first
        // step's. The steady-state rebuild below keeps the template's optimizer state where
        // the template's first step put it, among holes of the template's size: +9.6 % and
        // +11.1 % at h200 batch 16 from 32 and 32 from 16 (warm, expandable); rebuilt from
        // the parameters with the workspaces made at the first request, -6.0 % at batch 4
        // (the real third step mapped a 250 MiB logits gradient anew).
        if let Some(f) = self.first_step_plan.as_ref() {
            self.first_step_start(f, at, cfg, run);
            return;
        }
        self.rescale_before(at, cfg, run, self.scaled_before.iter().map(|s| s.0).collect());
        run.eng.empty_cache();
        for &(addr, q) in &self.carry.pairs {
            let ev = &trace[self.req_index[q]];
            let Some(n) = self.size_at(q, at, run.scenario) else { continue };
            let pool = self.template.pool_id(ev).unwrap_or(DEFAULT_POOL);
            self.malloc_before(run, cfg, addr, n, self.template.stream(ev), pool);
        }
    }

    /// Releases the blocks live before the trace at template addresses `addrs` (those the
    /// run still holds), returning each one's requested bytes, stream and pool.
    fn release_before(&self, run: &mut Run, addrs: impl Iterator<Item = u64>) -> HashMap<u64, (u64, StreamId, PoolId)> {
        let mut where_: HashMap<u64, (StreamId, PoolId)> = HashMap::new();
        for seg in run.eng.segments() {
            for b in &seg.blocks {
                where_.insert(b.address, (seg.stream, seg.pool));
            }
        }
        let mut requested = HashMap::new();
        for addr in addrs {
            let Some(a) = run.blocks.target(addr) else { continue };
            if let (Some(info), Some(&(stream, pool))) = (run.eng.block_at(a), where_.get(&a)) {
                requested.insert(addr, (info.requested_size, stream, pool));
            }
            let _ = run.eng.free(a);
            if let Some((c, n)) = run.cat_of.remove(&a) {
                run.live.sub(c, n);
            }
            run.blocks.completed(addr);
        }
        requested
    }

    /// The blocks live before the trace at template addresses `addrs` that the
    /// recordings show scale ([`warm::scaled_before`]) made again at their size at `at`,
    /// each at once where it was released: the block the program made at that size lives
    /// where the template's did, as far as it fits (kept in place, it put a small segment
    /// more into the rebuilt cache once the `empty_cache()` after it released the old).
    fn rescale_before(&self, at: u64, cfg: &AllocatorConfig, run: &mut Run, addrs: Vec<u64>) {
        for addr in addrs {
            let Some(law) = self.scaled_before.iter().find(|s| s.0 == addr).map(|s| s.1) else { continue };
            // Where its size at `at` is the template's, the block stays as it is.
            let now = run.blocks.target(addr).and_then(|a| run.eng.block_at(a)).map(|b| b.requested_size);
            if now.is_none() || now == law.at(at) {
                continue;
            }
            let released = self.release_before(run, std::iter::once(addr));
            if let (Some(&(_, stream, pool)), Some(n)) = (released.get(&addr), law.at(at)) {
                self.malloc_before(run, cfg, addr, n, stream, pool);
            }
        }
    }

    /// A block of `n` bytes standing for the block live before the trace at template
    /// address `addr` (a leftover carried over, a block rebuilt at the target size).
    fn malloc_before(&self, run: &mut Run, cfg: &AllocatorConfig, addr: u64, n: u64, stream: StreamId, pool: PoolId) {
        if let Ok(a) = run.eng.malloc_in_pool(n, stream, pool) {
            run.blocks.allocated(addr, Some(a));
            let r = round_size(n, cfg);
            run.live.add(Cat::Before, r);
            run.cat_of.insert(a, (Cat::Before, r));
        }
    }

    /// The start of the first rebuilt step of a warm training template ([`warm::FirstStep`]):
    /// every block live before the trace but the parameters released, the template's cache
    /// with them, and those the first step creates lazily queued for their entry; the
    /// blocks the recordings show scale ([`warm::scaled_before`]) at their size at `at`
    /// (made again at once where the counting took them for parameters).
    fn first_step_start(&self, f: &warm::FirstStep, at: u64, cfg: &AllocatorConfig, run: &mut Run) {
        let law = |addr: u64| self.scaled_before.iter().find(|s| s.0 == addr).map(|s| s.1);
        self.rescale_before(
            at,
            cfg,
            run,
            self.scaled_before.iter().map(|s| s.0).filter(|a| !f.dropped.contains(a)).collect(),
        );
        let requested = self.release_before(run, f.dropped.iter().copied());
        run.eng.empty_cache();
        run.pending = f
            .lazy
            .iter()
            .filter_map(|&(addr, entry)| {
                let &(n, stream, pool) = requested.get(&addr)?;
                let n = match law(addr) {
                    Some(l) => l.at(at)?,
                    None => n,
                };
                Some((entry, addr, n, stream, pool))
            })
            .collect();
        run.pending.reverse();
    }

    /// The blocks the first rebuilt step creates lazily at or before entry `i`
    /// ([`warm::FirstStep::lazy`]), live from then on as blocks of the state before the
    /// trace (the trace never frees them).
    fn create_lazy(&self, i: usize, cfg: &AllocatorConfig, run: &mut Run) {
        if run.placing.as_ref().is_some_and(|p| i < p.first_end) {
            self.place_at(i, cfg, run);
        }
        while run.pending.last().is_some_and(|p| p.0 <= i) {
            let Some(item) = run.pending.pop() else { break };
            self.make_lazy(i, item, cfg, run);
        }
    }

    /// [`Program::place_lazies`] at entry `i`: each block still to place (entry
    /// `usize::MAX` in `run.pending`) whose template address is mapped and whose range no
    /// block holds, and which a request of its size, tried now, gets at its template
    /// address, is made here. A request tried and served elsewhere is freed again; where
    /// it mapped pages to be served (a free block at the top of the mapping extended,
    /// spec §6.2), they stay mapped in this run, which only says when.
    fn place_at(&self, i: usize, cfg: &AllocatorConfig, run: &mut Run) {
        if !run.pending.iter().any(|p| p.0 == usize::MAX) {
            return;
        }
        let segs = run.eng.segments();
        let mut mapped: Vec<(u64, u64)> =
            segs.iter().filter(|s| s.is_expandable).map(|s| (s.address, s.address + s.total_size)).collect();
        mapped.sort_unstable();
        let mut taken: Vec<(u64, u64)> = segs
            .iter()
            .flat_map(|s| s.blocks.iter())
            .filter(|b| b.state != fragscope_alloc::BlockState::Free)
            .map(|b| (b.address, b.address + b.size))
            .collect();
        taken.sort_unstable();
        let mut now = Vec::new();
        for k in 0..run.pending.len() {
            let (entry, a, n, stream, pool) = run.pending[k];
            let r = round_size(n, cfg);
            if entry != usize::MAX || !inside(&mapped, a) || overlaps(&taken, a, r) {
                continue;
            }
            if let Ok(got) = run.eng.malloc_in_pool(n, stream, pool) {
                let _ = run.eng.free(got);
                if got == a {
                    now.push(k);
                }
            }
        }
        // Made in the stack's order (last first).
        let items: Vec<_> = now.iter().rev().map(|&k| run.pending.remove(k)).collect();
        if let Some(p) = run.placing.as_mut() {
            p.placed.extend(items.iter().map(|item| (item.1, i)));
        }
        for item in items {
            self.make_lazy(i, item, cfg, run);
        }
    }

    /// One block of [`Program::create_lazy`], made at entry `i`.
    fn make_lazy(&self, i: usize, item: (usize, u64, u64, StreamId, PoolId), cfg: &AllocatorConfig, run: &mut Run) {
        let (_, addr, n, stream, pool) = item;
        match run.eng.malloc_in_pool(n, stream, pool) {
            Ok(a) => {
                run.blocks.allocated(addr, Some(a));
                let r = round_size(n, cfg);
                run.live.add(Cat::Before, r);
                run.cat_of.insert(a, (Cat::Before, r));
            }
            // Not served under the capacity: the run does not fit, here.
            Err(o) if run.oom.is_none() => {
                run.oom = Some(PredictedOom {
                    index: i,
                    requested: o.requested,
                    law: Law::Constant,
                    rounded: o.rounded,
                    alloc_size: o.alloc_size,
                    reserved: o.reserved,
                    allocated: o.allocated,
                    site: "a block live before the trace, made by the first step (optimizer state, workspace)"
                        .to_string(),
                    stack: Vec::new(),
                });
            }
            Err(_) => {}
        }
    }

    /// Between two passes: what this pass left live stands for the blocks the next pass
    /// frees before allocating them ([`warm::Carry`]).
    fn carry_over(&self, run: &mut Run) {
        let trace = self.template.trace(self.device);
        let key = |q: usize| trace[self.req_index[q]].addr;
        let targets: Vec<(u64, Option<u64>)> =
            self.carry.pairs.iter().map(|&(addr, q)| (addr, run.blocks.target(key(q)))).collect();
        for &(_, q) in &self.carry.pairs {
            run.blocks.completed(key(q));
        }
        for (addr, a) in targets {
            run.blocks.allocated(addr, a);
        }
    }

    /// The device size a prediction replays on: `capacity`, else (`None`) the template's
    /// device when `cfg` sets a memory fraction (a fraction of it), else unlimited.
    fn replay_capacity(&self, cfg: &AllocatorConfig, capacity: Option<u64>) -> u64 {
        match capacity {
            Some(c) => c,
            None if cfg.per_process_memory_fraction < 1.0 => capacity_for(self.template, self.device, None, cfg),
            None => UNLIMITED,
        }
    }

    /// The allocator a prediction replays on (`cfg`, a device of `cap` bytes), seeded
    /// with the template's state before the trace when it is known: the engine, the
    /// template's addresses mapped to its blocks, the live bytes by category, and the
    /// category and size of each live block. Expandable reservations made before the trace
    /// keep the size the recording's device gave them ([`Seeded::allocator`]), whatever
    /// `cap` is: seeded at an unlimited device's size, two of them overlapped and the
    /// prediction started empty. When the state still cannot be held, `refused` says why
    /// and the engine starts empty: the prediction does not fit ([`Prediction::fits`]).
    fn seeded_engine(
        &self,
        cfg: &AllocatorConfig,
        cap: u64,
        refused: &mut Option<String>,
    ) -> (CachingAllocator<SimulatedDevice>, BlockMap, PeakBreakdown, CatOf) {
        let empty = || {
            let mut e = CachingAllocator::new(cfg.clone(), SimulatedDevice::synthetic(cap));
            e.set_record_events(false);
            e
        };
        let mut blocks = BlockMap::default();
        // Live bytes by category, and the category of each live block.
        let mut live = PeakBreakdown::default();
        let mut cat_of: CatOf = HashMap::default();
        let eng = match self.seeded.allocator(cfg.clone(), cap) {
            Ok(mut eng) => {
                eng.set_record_events(false);
                for b in self.seeded.live_blocks() {
                    blocks.seeded(b.addr);
                    live.add(Cat::Before, b.size);
                    cat_of.insert(b.addr, (Cat::Before, b.size));
                }
                eng
            }
            Err(StartError::NotSeeded(e)) => {
                *refused = Some(format!(
                    "the state before the trace could not be held under {} ({e}): no prediction from an empty start",
                    conf_or_defaults(&cfg.to_conf_string())
                ));
                empty()
            }
            // Unknown: said once, in the program's notes ([`state_before`]).
            Err(StartError::Unknown(_)) => empty(),
        };
        (eng, blocks, live, cat_of)
    }

    /// Notes on the size `at` a prediction was made for: the requests whose fitted size
    /// reaches zero there (`vanished`), and how far it is beyond the recorded sizes.
    fn size_notes(&self, at: u64, vanished: u64, notes: &mut Vec<String>) {
        if vanished > 0 {
            notes.push(format!("{vanished} request(s) whose fitted size reaches zero at size {at} left out"));
        }
        if let Some(n) = far_beyond(at, &self.sizes) {
            notes.push(n);
        }
    }

    /// The largest size that fits on `capacity` bytes under `cfg`: bisection over
    /// replays, assuming memory grows with the size (the fitted laws are checked to
    /// give no request that shrinks as the size grows past the template; otherwise the
    /// search still runs and says so in the notes of `fits_at`). Sizes up to `limit`.
    pub fn max_fit(&self, cfg: &AllocatorConfig, capacity: u64, limit: u64) -> MaxFit {
        let mut replays = 0u32;
        let found = self.search(cfg, capacity, limit, Scenario::Point, &mut replays);
        let Some(hi) = found.hi else {
            return MaxFit {
                device: self.device,
                config: cfg.to_conf_string(),
                capacity,
                largest: Some(found.lo),
                bounded: false,
                fits_at: found.lo_p,
                next: None,
                replays,
                fails_below: Vec::new(),
                fails_below_fixed_by: None,
                fits_above: Vec::new(),
                range: None,
            };
        };
        let lo = found.lo;
        // The band below the answer: bisection assumed a monotone curve.
        let fails_below: Vec<u64> = (lo.saturating_sub(MAX_FIT_BAND).max(1)..lo)
            .filter(|&x| {
                replays += 1;
                !self.predict_scenario(x, cfg, Some(capacity), Scenario::Point).fits()
            })
            .collect();
        let fails_below_fixed_by = self.band_fix(cfg, capacity, &fails_below, &mut replays);
        // The band above the first OOM: sizes a user would be told do not fit.
        let fits_above: Vec<u64> = (hi.0 + 1..=hi.0.saturating_add(MAX_FIT_BAND).min(limit))
            .filter(|&x| {
                replays += 1;
                self.predict_scenario(x, cfg, Some(capacity), Scenario::Point).fits()
            })
            .collect();
        MaxFit {
            device: self.device,
            config: cfg.to_conf_string(),
            capacity,
            largest: (lo > 0).then_some(lo),
            bounded: true,
            fits_at: found.lo_p,
            next: Some(hi.1),
            replays,
            fails_below,
            fails_below_fixed_by,
            fits_above,
            range: None,
        }
    }

    /// [`Program::max_fit`] with its range ([`MaxFitRange`]): the same search under the
    /// high scenario (the largest size that fits for certain) and the low one (the
    /// largest that might), each capped or floored by the point's answer.
    pub fn max_fit_range(&self, cfg: &AllocatorConfig, capacity: u64, limit: u64) -> MaxFit {
        let mut m = self.max_fit(cfg, capacity, limit);
        let mut replays = 0u32;
        let point = m.largest.unwrap_or(0);
        let high = self.search(cfg, capacity, limit, Scenario::High, &mut replays);
        let low = self.search(cfg, capacity, limit, Scenario::Low, &mut replays);
        let certain = high.lo.min(point);
        m.range = Some(MaxFitRange {
            certain: (certain > 0).then_some(certain),
            might: (low.lo.max(point) > 0).then_some(low.lo.max(point)),
            might_bounded: low.hi.is_some() || !m.bounded,
        });
        m.replays += replays;
        m
    }

    /// Bracket and bisection of the sizes up to `limit` that fit on `capacity` under `cfg`
    /// and scenario `sc`, from the template's size, assuming a monotone curve;
    /// `replays` counts the replays made.
    fn search(&self, cfg: &AllocatorConfig, capacity: u64, limit: u64, sc: Scenario, replays: &mut u32) -> Found {
        let mut run = |x: u64| {
            *replays += 1;
            self.predict_scenario(x, cfg, Some(capacity), sc)
        };
        // Bracket: lo fits (0: nothing does), hi does not (None: every size tried fits).
        let start = self.template_size.clamp(1, limit.max(1));
        let p0 = run(start);
        let mut f = Found { lo: 0, lo_p: None, hi: None };
        if p0.fits() {
            (f.lo, f.lo_p) = (start, Some(p0));
            let mut x = start;
            while x < limit {
                x = x.saturating_mul(2).min(limit);
                let p = run(x);
                if p.fits() {
                    (f.lo, f.lo_p) = (x, Some(p));
                } else {
                    f.hi = Some((x, p));
                    break;
                }
            }
        } else {
            f.hi = Some((start, p0));
        }
        let Some((mut h, mut hp)) = f.hi.take() else { return f };
        while h - f.lo > 1 {
            let mid = f.lo + (h - f.lo) / 2;
            let p = run(mid);
            if p.fits() {
                (f.lo, f.lo_p) = (mid, Some(p));
            } else {
                (h, hp) = (mid, p);
            }
        }
        f.hi = Some((h, hp));
        f
    }

    /// The first of [`fragscope_replay::ALTERNATIVES`] (on top of `cfg`) under which every
    /// size of `failing` fits on `capacity` bytes; `replays` counts the replays made.
    fn band_fix(&self, cfg: &AllocatorConfig, capacity: u64, failing: &[u64], replays: &mut u32) -> Option<String> {
        if failing.is_empty() {
            return None;
        }
        fragscope_replay::ALTERNATIVES.iter().find_map(|alt| {
            let c = fragscope_replay::config_on_top(cfg, alt).ok().filter(|c| c != cfg)?;
            let all = failing.iter().all(|&x| {
                *replays += 1;
                self.predict_scenario(x, &c, Some(capacity), Scenario::Point).fits()
            });
            all.then(|| alt.to_string())
        })
    }
}

/// Holds the seeded engine `eng` to the device's `cap` bytes
/// ([`fragscope_replay::release_cache_over`], as the what-ifs do): the seeding adopts the
/// recorded segments whatever the device's size, and a replay whose start already exceeds
/// the device would serve requests from a cache no real run of that size could hold. When
/// the start exceeds `cap`, the cache's free segments are released with a note; what is
/// left over `cap` (segments holding the `live` bytes) means the run does not fit.
fn start_within(
    eng: &mut CachingAllocator<SimulatedDevice>,
    cap: u64,
    live: u64,
    notes: &mut Vec<String>,
) -> Option<StartOverCapacity> {
    let (reserved, kept) = fragscope_replay::release_cache_over(eng, cap)?;
    if kept <= cap {
        notes.push(format!(
            "the template's state before the trace reserved {reserved} B, more than the capacity ({cap} B): its \
             cached free segments ({} B) were released before the trace, as the allocator does when cudaMalloc fails",
            reserved - kept
        ));
        return None;
    }
    notes.push(format!(
        "the state before the trace does not fit the capacity: {live} B live in {kept} B of segments, {} B over \
         {cap} B",
        kept - cap
    ));
    Some(StartOverCapacity { live, reserved: kept, capacity: cap, over: kept - cap })
}

/// Whether the template held a cache at its first request: free bytes in its segments
/// once the `empty_cache()` calls before that request are made, more than 5 % of what it
/// reserved (the free tails of segments that hold live blocks are not a cache).
fn started_warm(seeded: &Seeded, cfg: &AllocatorConfig, req_index: &[usize]) -> bool {
    let Ok(mut eng) = seeded.allocator(cfg.clone(), UNLIMITED) else { return false };
    let first = req_index.first().copied().unwrap_or(0);
    if seeded.empty_cache_before().iter().any(|&k| k <= first) {
        eng.empty_cache();
    }
    let reserved = eng.reserved_bytes();
    let live = live_bytes(seeded);
    reserved.saturating_sub(live) * 20 > reserved
}

/// Passes a warm template's prediction makes at most before it reports the last.
const MAX_PASSES: u32 = 4;

/// The replay state of one predicted run, carried from pass to pass.
struct Run {
    eng: CachingAllocator<SimulatedDevice>,
    /// Template addresses → the run's blocks.
    blocks: BlockMap,
    /// Live bytes by category, and the category of each live block.
    live: PeakBreakdown,
    cat_of: CatOf,
    oom: Option<PredictedOom>,
    vanished: u64,
    /// Which sizes the requests take.
    scenario: Scenario,
    /// Blocks the first rebuilt step creates lazily, last first: `(entry, template
    /// address, requested bytes, stream, pool)` ([`warm::FirstStep`]).
    pending: Vec<(usize, u64, u64, StreamId, PoolId)>,
    /// Set while [`Program::place_lazies`] finds when the first step made each block.
    placing: Option<Placing>,
}

/// What [`Program::place_lazies`] records: `(template address, entry)` of each block
/// made so far, the first step's end (no block is placed past it).
struct Placing {
    placed: Vec<(u64, usize)>,
    first_end: usize,
}

/// Ranges `[start, end)` sorted by start, not overlapping: whether one holds `a`.
fn inside(ranges: &[(u64, u64)], a: u64) -> bool {
    let k = ranges.partition_point(|r| r.0 <= a);
    k > 0 && a < ranges[k - 1].1
}

/// Ranges `[start, end)` sorted by start, not overlapping: whether `[a, a + n)` meets one.
fn overlaps(ranges: &[(u64, u64)], a: u64, n: u64) -> bool {
    let k = ranges.partition_point(|r| r.0 < a + n);
    k > 0 && ranges[k - 1].1 > a
}

/// What one pass over the template's trace measured.
#[derive(Clone)]
struct PassPeaks {
    reserved: u64,
    allocated: u64,
    at_peak: PeakBreakdown,
    /// Reserved bytes when the pass began and when it ended.
    start_reserved: u64,
    end_reserved: u64,
}

/// The note of a warm template's prediction: how its cache was rebuilt, and the first
/// step's peaks where they differ from the steady state's.
fn warm_note(passes: u32, first: Option<&PassPeaks>, last: &PassPeaks) -> String {
    let mut n = format!(
        "the template started warm (a cache built before its trace): the cache was rebuilt at this size by \
         replaying the predicted step {passes} time(s) from the live state; peaks are the last pass's"
    );
    if let Some(f) = first {
        n.push_str(&format!(
            " (steady state: {} B reserved, {} B allocated; the first step from an empty cache: {} B, {} B)",
            last.reserved, last.allocated, f.reserved, f.allocated
        ));
    }
    n
}

/// Bytes of the blocks live at the first entry (allocated, or pending their free).
fn live_bytes(seeded: &Seeded) -> u64 {
    seeded.live_blocks().map(|b| b.size).sum()
}

/// The first device every recording of `recs` can replay (the template's order), for
/// [`Program::fit`] when no device is named.
fn common_device(recs: &[Recording<'_>], template: &Snapshot) -> Result<i64, PredictError> {
    let mut common = replayable_devices(template);
    for r in recs {
        let d = replayable_devices(r.snap);
        common.retain(|x| d.contains(x));
    }
    common.first().copied().ok_or(PredictError::NoCommonDevice)
}

/// The template's requests (`req_index`, entries of recording `t`'s trace on `device`)
/// aligned with those of every other recording of `recs` (`order`: by size): for each
/// template request, its (size, requested bytes) in every recording where it aligns,
/// whether it aligns in all of them, and each other recording's alignment.
///
/// An error when a recording aligns less than [`MIN_ALIGNED`]: not the same program.
#[allow(clippy::type_complexity)]
fn align_recordings(
    recs: &[Recording<'_>],
    order: &[usize],
    t: usize,
    device: i64,
    req_index: &[usize],
) -> Result<(Vec<Vec<(u64, u64)>>, Vec<bool>, Vec<Alignment>), PredictError> {
    let template = recs[t].snap;
    let trace = template.trace(device);
    let tkeys = align::keys(template, trace, req_index);
    // points[k]: (size, requested bytes) of template request k in every recording.
    let mut points: Vec<Vec<(u64, u64)>> = req_index.iter().map(|&i| vec![(recs[t].size, trace[i].size)]).collect();
    let mut in_all = vec![true; req_index.len()];
    let mut alignments = Vec::new();
    let tb = behaviour::Behaviour::of(template, device);
    for &k in order.iter().filter(|&&k| k != t) {
        let r = &recs[k];
        let rt = r.snap.trace(device);
        let rreq = align::requests(rt);
        let rkeys = align::keys(r.snap, rt, &rreq);
        let m = align::align(&tkeys, &rkeys);
        let aligned = m.iter().filter(|x| x.is_some()).count();
        let fraction = aligned as f64 / rreq.len().max(req_index.len()) as f64;
        // What the programs do, compared whether or not their call sites align: a
        // `no_grad` forward makes the requests of a grad-enabled one.
        let diffs = behaviour::differences(&behaviour::Behaviour::of(r.snap, device), r.size, &tb, recs[t].size);
        if fraction < MIN_ALIGNED || !diffs.is_empty() {
            return Err(PredictError::NotSameProgram {
                size: r.size,
                template_size: recs[t].size,
                aligned: fraction,
                differences: diffs.into_iter().map(|d| d.text).collect(),
            });
        }
        for (q, j) in m.iter().enumerate() {
            match j {
                Some(j) => points[q].push((r.size, rt[rreq[*j]].size)),
                None => in_all[q] = false,
            }
        }
        alignments.push(Alignment { size: r.size, requests: rreq.len(), aligned, fraction });
    }
    Ok((points, in_all, alignments))
}

/// How well the template's requests (`req_index`, entries of `trace`) fit: counts by law
/// and by evidence, the share aligned in every recording (`in_all`), and the requests no
/// law explains (the 20 largest by recorded size, from their `points`).
fn fit_quality(
    template: &Snapshot,
    trace: &[TraceEvent],
    req_index: &[usize],
    fits: &[SizeFit],
    points: &[Vec<(u64, u64)>],
    in_all: &[bool],
    alignments: Vec<Alignment>,
) -> FitQuality {
    let mut by_law: Vec<(String, usize)> = Vec::new();
    let mut by_ev: Vec<(String, usize)> = Vec::new();
    for f in fits {
        bump(&mut by_law, f.law.as_str());
        bump(&mut by_ev, evidence_name(f.evidence));
    }
    let mut unexplained: Vec<Unexplained> = fits
        .iter()
        .enumerate()
        .filter(|(_, f)| matches!(f.law, Law::Unfit | Law::Single))
        .map(|(q, f)| {
            let mut rec = points[q].clone();
            rec.sort_unstable();
            let i = req_index[q];
            Unexplained { index: i, law: f.law, recorded: rec, site: site_of(&template.frames, trace[i].stack).site }
        })
        .collect();
    let unexplained_total = unexplained.len();
    unexplained.sort_by_key(|u| std::cmp::Reverse(u.recorded.iter().map(|p| p.1).max().unwrap_or(0)));
    unexplained.truncate(20);
    let aligned_in_all = in_all.iter().filter(|&&b| b).count();
    FitQuality {
        requests: req_index.len(),
        aligned_in_all,
        aligned_fraction: aligned_in_all as f64 / req_index.len() as f64,
        by_law,
        by_evidence: by_ev,
        alignments,
        unexplained,
        unexplained_total,
    }
}

/// The template's (recording `t`'s) state before the trace on `device` and the
/// `empty_cache()` calls it made, with notes when that state is unknown or when the
/// blocks live before the trace differ between recordings (they are not scaled).
fn state_before(recs: &[Recording<'_>], order: &[usize], t: usize, device: i64) -> (Seeded, Vec<String>) {
    let template = recs[t].snap;
    let mut notes = Vec::new();
    let seeded = Seeded::rebuild(template, device);
    if let Some(why) = seeded.unknown_reason() {
        notes.push(format!("the state before the trace is unknown ({why}); replays start empty"));
    }
    // Blocks live before the trace are not scaled: say so when they differ.
    let before = |s: &Snapshot| live_bytes(&Seeded::rebuild(s, device));
    let tb = live_bytes(&seeded);
    for &k in order.iter().filter(|&&k| k != t) {
        let b = before(recs[k].snap);
        if b != tb {
            notes.push(format!(
                "blocks live before the trace differ: {b} B at size {}, {tb} B at size {}; predictions keep \
                 the latter (the state before the trace is not scaled)",
                recs[k].size, recs[t].size
            ));
        }
    }
    (seeded, notes)
}

/// The category and (rounded) size of each live block of a predicted run, by address.
type CatOf = FxHashMap<u64, (Cat, u64)>;

/// The replay's reserved and allocated bytes now and their peaks so far (`[reserved,
/// allocated, peak reserved, peak allocated]`): what [`Program::predict_observed`]
/// observes after each entry.
fn levels(eng: &CachingAllocator<SimulatedDevice>) -> [u64; 4] {
    let st = eng.stats();
    let (r, a) = (st.reserved_bytes.all(), st.allocated_bytes.all());
    [r.current, a.current, r.peak, a.peak].map(|x| x.max(0) as u64)
}

/// Replays the free entry `ev` of a predicted run: the block the template's address now
/// names (if the run allocated one) is freed and its bytes leave the live categories; a
/// completed free ends the address' mapping.
fn replay_free(
    eng: &mut CachingAllocator<SimulatedDevice>,
    blocks: &mut BlockMap,
    cat_of: &mut CatOf,
    live: &mut PeakBreakdown,
    ev: &TraceEvent,
) {
    if let Some(a) = blocks.target(ev.addr) {
        let _ = if ev.action == Action::FreeRequested { eng.free_requested(a) } else { eng.free_completed(a) };
        if let Some((c, n)) = cat_of.remove(&a) {
            live.sub(c, n);
        }
    }
    if ev.action == Action::FreeCompleted {
        blocks.completed(ev.addr);
    }
}

/// The predicted OOM at entry `i` (`ev`, of the template `snap`): the request fitted by
/// `f` that the allocator could not serve (`o`), with its call site and stack.
fn predicted_oom(
    snap: &Snapshot,
    i: usize,
    ev: &TraceEvent,
    f: &SizeFit,
    o: &fragscope_alloc::engine::Oom,
) -> PredictedOom {
    PredictedOom {
        index: i,
        requested: o.requested,
        law: f.law,
        rounded: o.rounded,
        alloc_size: o.alloc_size,
        reserved: o.reserved,
        allocated: o.allocated,
        site: site_of(&snap.frames, ev.stack).site,
        stack: stack_strings(snap, ev.stack),
    }
}

/// A canonical `PYTORCH_CUDA_ALLOC_CONF`, or "the default settings" when empty.
fn conf_or_defaults(c: &str) -> String {
    if c.is_empty() {
        "the default settings".into()
    } else {
        c.to_string()
    }
}

fn bump(v: &mut Vec<(String, usize)>, k: &str) {
    match v.iter_mut().find(|(n, _)| n == k) {
        Some((_, c)) => *c += 1,
        None => v.push((k.to_string(), 1)),
    }
}

fn evidence_name(e: Evidence) -> &'static str {
    match e {
        Evidence::Constant => "constant",
        Evidence::Confirmed => "confirmed",
        Evidence::Determined => "determined",
        Evidence::Unfitted => "unfitted",
    }
}

/// The usage errors of a set of recordings and sizes, before any work.
pub fn check_sizes(recs: &[Recording]) -> Result<(), PredictError> {
    if recs.len() < 2 {
        return Err(PredictError::TooFewRecordings(recs.len()));
    }
    check_size_list(&recs.iter().map(|r| r.size).collect::<Vec<_>>())
}

/// Sizes must be non-zero and distinct.
pub fn check_size_list(sizes: &[u64]) -> Result<(), PredictError> {
    if sizes.contains(&0) {
        return Err(PredictError::ZeroSize);
    }
    let mut s = sizes.to_vec();
    s.sort_unstable();
    if let Some(w) = s.windows(2).find(|w| w[0] == w[1]) {
        return Err(PredictError::DuplicateSize(w[0]));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
