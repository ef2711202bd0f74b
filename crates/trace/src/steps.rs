//! Training steps and their phases, from evidence in the trace rather than from
//! periodicity alone.
//!
//! A *step* of training is bounded by evidence that PyTorch or the user's program left in
//! the snapshot:
//!
//! * the optimizer's step: Python frames in `torch/optim/` (`Optimizer.step`'s profiling
//!   `wrapper`, `_single_tensor_adam`, `_multi_tensor_*`, `_fused_*`, `_init_group`), fused
//!   optimizer kernels in C++ frames (`fused_adam`, `_fused_adamw`, `multi_tensor_apply`),
//!   a user optimizer's `step` in a file named for optimizers, and the `Optimizer.step#...`
//!   annotations that `torch.optim.Optimizer` records with `record_function`;
//! * `zero_grad` (a frame, or the `Optimizer.zero_grad#...` annotation);
//! * the backward pass, when no optimizer shows (each backward ends a step);
//! * `ProfilerStep#N` annotations, a user's `record_function("step")`, or
//!   `fragscope.torch.phase("step")` markers, when neither shows.
//!
//! The *phases* inside a step come from the frames, Python or C++: backward is the autograd
//! engine (`torch::autograd::Engine::*`, `*Backward0::apply`, `AccumulateGrad`,
//! `torch/autograd/__init__.py:backward`, `torch/_tensor.py:backward`) — on traces recorded
//! with Python stacks only, the engine thread's allocations carry no frame, and fall in the
//! backward pass between its first tagged entry and the optimizer; forward is a module's
//! `forward` (or `nn.Module._call_impl`); the optimizer is the step's evidence above. An
//! entry without evidence belongs to the phase around it (a loss computed outside a module
//! between forward and backward is forward).
//!
//! Periodic structure inside a phase is *layers* (a transformer's blocks repeat the same
//! allocations), never steps: [`Step::layers`].
//!
//! Principal types: [`Steps`] (per device), [`Step`], [`PhaseSpan`], [`Phase`].

use fragscope_snapshot::{Action, FrameId, FxHashMap, Snapshot, StackId, NO_TIME};
use serde::Serialize;

use crate::hugepages::HugePages;
use crate::scopes::Scopes;

/// What the program was doing at a trace entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Outside every phase: set-up (building the model), between steps (loading a
    /// batch), `zero_grad`, or a trace without steps.
    Outside,
    Forward,
    Backward,
    Optimizer,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Outside => "outside",
            Phase::Forward => "forward",
            Phase::Backward => "backward",
            Phase::Optimizer => "optimizer",
        }
    }
}

/// A run of trace entries in one phase: entries `start..end`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct PhaseSpan {
    pub phase: Phase,
    pub start: usize,
    /// One past the last entry.
    pub end: usize,
}

/// One training step of a device's trace: entries `start..end`.
#[derive(Clone, Debug, Serialize)]
pub struct Step {
    pub start: usize,
    /// One past the last entry (the end of its optimizer phase, or of its backward pass
    /// when the step is bounded by backward passes).
    pub end: usize,
    /// The phases inside the step, in order (`outside` runs left out).
    pub phases: Vec<PhaseSpan>,
    /// Whether the trace holds the whole step: a forward (or `zero_grad`) before its
    /// backward or optimizer. `false` for a step the recording began inside.
    pub complete: bool,
    /// Layers: how many times the forward pass (else the backward pass) repeats one
    /// pattern of allocations, when it does (two or more).
    pub layers: Option<usize>,
}

impl Step {
    /// First and one-past-last entry of the step's `phase` (its first to its last span).
    pub fn span(&self, phase: Phase) -> Option<(usize, usize)> {
        let mut it = self.phases.iter().filter(|p| p.phase == phase);
        let first = it.next()?;
        let last = self.phases.iter().rev().find(|p| p.phase == phase).unwrap();
        Some((first.start, last.end))
    }
}

/// What bounded the steps (`source` in JSON).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StepSource {
    /// The optimizer's steps.
    Optimizer,
    /// The backward passes (no optimizer step seen).
    Backward,
    /// Step annotations (`record_function` scopes, `fragscope.torch.phase("step")`).
    Annotation,
    /// No step found.
    None,
}

impl StepSource {
    /// The name JSON gives it.
    pub fn as_str(self) -> &'static str {
        match self {
            StepSource::Optimizer => "optimizer",
            StepSource::Backward => "backward",
            StepSource::Annotation => "annotation",
            StepSource::None => "none",
        }
    }
}

impl std::fmt::Display for StepSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The steps of one device's trace (module doc).
#[derive(Clone, Debug, Serialize)]
pub struct Steps {
    pub device: i64,
    /// What bounded the steps.
    pub source: StepSource,
    /// The evidence, in words (frames and annotations seen, and how often).
    pub evidence: Vec<String>,
    pub steps: Vec<Step>,
    /// Forward or backward work after the last step (a step the recording ended inside):
    /// its first entry.
    pub after_last_step: Option<usize>,
    /// Why there is no step (`source` `"none"`), in words.
    pub reason: Option<String>,
    /// Phase of every trace entry.
    #[serde(skip)]
    pub phase_of: Vec<Phase>,
}

impl Steps {
    /// Phase of trace entry `i` (`outside` past the trace).
    pub fn phase_at(&self, i: usize) -> Phase {
        self.phase_of.get(i).copied().unwrap_or(Phase::Outside)
    }
    /// Index of the step holding trace entry `i`.
    pub fn step_of(&self, i: usize) -> Option<usize> {
        let k = self.steps.partition_point(|s| s.start <= i);
        k.checked_sub(1).filter(|&k| i < self.steps[k].end)
    }
    /// In words: "3 steps (optimizer steps)", "1 step ...", "no step: ...".
    pub fn describe(&self) -> String {
        match self.steps.len() {
            0 => format!("no training step found ({})", self.reason.as_deref().unwrap_or("no evidence")),
            n => format!(
                "{n} step{} ({}){}",
                if n == 1 { "" } else { "s" },
                match self.source {
                    StepSource::Optimizer => "bounded by optimizer steps",
                    StepSource::Backward => "bounded by backward passes; no optimizer step seen",
                    StepSource::Annotation => "from step annotations",
                    StepSource::None => "",
                },
                match self.steps.iter().find_map(|s| s.layers) {
                    Some(l) => format!(", {l} layers in a pass"),
                    None => String::new(),
                }
            ),
        }
    }
}

// Evidence of one frame or stack, as bits.
const OPT: u8 = 1;
const ZERO: u8 = 2;
const BWD: u8 = 4;
const FWD: u8 = 8;
const PY: u8 = 16;
/// A user optimizer's `step` (weaker than `torch/optim`).
const USER_OPT: u8 = 32;
/// An optimizer's frames, `torch/optim` or a user optimizer's `step` (for roles).
pub(crate) const OPTIMIZER: u8 = OPT | USER_OPT;
/// The backward pass's frames (for roles).
pub(crate) const BACKWARD: u8 = BWD;
/// Frames of any phase, `zero_grad` included (for roles: a block whose frames show
/// none of them could have been made anywhere).
pub(crate) const PHASES: u8 = OPT | USER_OPT | BWD | FWD | ZERO;
/// A library's workspace (cuBLAS's `getNewWorkspace`), from C++ frames.
pub(crate) const WORKSPACE: u8 = 64;
const KNOWN: u8 = 128;

/// The evidence of one frame (`file`, function `name`), as bits: the phase it is in
/// ([`optimizer_frame`], `zero_grad`, [`backward_frame`], [`forward_frame`]), a library's
/// workspace ([`workspace_frame`]), and whether it is Python's.
fn frame_bits(file: &str, name: &str) -> u8 {
    let file_n: std::borrow::Cow<str> = if file.contains('\\') { file.replace('\\', "/").into() } else { file.into() };
    let file = file_n.as_ref();
    let py = file.ends_with(".py");
    let mut b = if py { PY } else { 0 };
    // `Optimizer.zero_grad`, or a module's: between steps, whatever else the stack says.
    if name == "zero_grad" || name.contains("::zero_grad") {
        return b | ZERO;
    }
    b |= optimizer_frame(file, name, py);
    if backward_frame(file, name, py) {
        b |= BWD;
    }
    if py && forward_frame(file, name) {
        b |= FWD;
    }
    if !py && workspace_frame(name) {
        b |= WORKSPACE;
    }
    b
}

/// Whether a frame is an optimizer's step: `OPT` for Python frames in `torch/optim/`
/// (`Optimizer.step`'s profiling `wrapper`, `_single_tensor_adam`, `_multi_tensor_*`,
/// `_fused_*`, `_init_group`; not a constructor, which runs at set-up) and for fused
/// optimizer kernels in C++ frames (`fused_adam`, `_fused_adamw`, `fused_sgd`,
/// `multi_tensor_apply`); `USER_OPT` (weaker) for a user optimizer's `step` in a file
/// named for optimizers; else 0.
fn optimizer_frame(file: &str, name: &str, py: bool) -> u8 {
    if py {
        let base = file.rsplit('/').next().unwrap_or(file).to_ascii_lowercase();
        if file.contains("torch/optim/") && name != "__init__" {
            OPT
        } else if name == "step" && base.contains("optim") {
            USER_OPT
        } else {
            0
        }
    } else {
        let l = name.to_ascii_lowercase();
        let fused = l.contains("fused_adam")
            || l.contains("fused_sgd")
            || l.contains("multi_tensor_apply")
            || l.contains("fusedadam");
        if fused {
            OPT
        } else {
            0
        }
    }
}

/// Whether a frame is the backward pass's. Python: `Tensor.backward`,
/// `torch.autograd.backward` and `grad`, the engine's `_engine_run_backward`, and
/// activation checkpointing's recomputation. C++: the autograd engine and its nodes.
fn backward_frame(file: &str, name: &str, py: bool) -> bool {
    if py {
        // Activation checkpointing recomputes a layer's forward inside the backward pass:
        // the engine calls `torch/utils/checkpoint.py`'s saved-tensor hook (`unpack_hook`,
        // `recompute_fn`; `unpack` before PyTorch 2.1), or the reentrant variant's
        // `CheckpointFunction.backward`. Those entries carry the module's `forward` frames
        // too, and are backward (seen on an H200 recording, crates/testdata/h200: without
        // this the recomputation split each backward pass into forwards, and no gradient
        // was found).
        (file.ends_with("torch/autograd/__init__.py") && (name == "backward" || name == "grad"))
            || (file.ends_with("torch/autograd/graph.py") && name == "_engine_run_backward")
            || (file.ends_with("torch/_tensor.py") && name == "backward")
            || (file.ends_with("torch/utils/checkpoint.py")
                && matches!(name, "unpack_hook" | "recompute_fn" | "unpack" | "backward"))
    } else {
        // Not `torch::autograd::VariableType` or `THPVariable_*`: those are the dispatcher
        // and the Python bindings, on every op. Only a node's `apply` (run by the
        // engine), not its `release_variables` or its deleter: a forward-only program
        // frees the graph's saved tensors from those.
        name.contains("torch::autograd::Engine::")
            || (name.contains("::apply") && (name.contains("AccumulateGrad") || is_backward_node(name)))
    }
}

/// Whether a Python frame is a module's forward pass: a `forward` method, or
/// `nn.Module`'s `_call_impl` / `_wrapped_call_impl` (what `module(x)` runs).
fn forward_frame(file: &str, name: &str) -> bool {
    name == "forward"
        || (file.ends_with("torch/nn/modules/module.py") && (name == "_call_impl" || name == "_wrapped_call_impl"))
}

/// Whether a C++ frame makes a library's workspace: cuBLAS's `getNewWorkspace`, or a
/// BLAS or cuDNN function named for its workspace. Such a block is no tensor of the
/// model, whatever phase makes it.
fn workspace_frame(name: &str) -> bool {
    let l = name.to_ascii_lowercase();
    l.contains("getnewworkspace") || (l.contains("workspace") && (l.contains("blas") || l.contains("cudnn")))
}

/// `FooBackward0::apply`, `FooBackward1`: an autograd node's name.
fn is_backward_node(name: &str) -> bool {
    let mut rest = name;
    while let Some(p) = rest.find("Backward") {
        let after = &rest[p + "Backward".len()..];
        if after.starts_with(|c: char| c.is_ascii_digit()) {
            return true;
        }
        rest = after;
    }
    false
}

/// Evidence bits of stacks, computed once per stack and frame.
pub(crate) struct StackEvidence<'a> {
    snap: &'a Snapshot,
    frames: Vec<u8>,
    stacks: Vec<u8>,
    /// [`StackEvidence::mentions`]'s answers: a stack is asked about once per needle.
    mentioned: std::collections::HashMap<(StackId, &'static str), bool>,
}

impl<'a> StackEvidence<'a> {
    pub fn new(snap: &'a Snapshot) -> Self {
        StackEvidence {
            snap,
            frames: vec![0; snap.frames.num_frames()],
            stacks: vec![0; snap.frames.num_stacks()],
            mentioned: std::collections::HashMap::new(),
        }
    }
    fn frame(&mut self, f: FrameId) -> u8 {
        let k = f.index();
        if self.frames[k] & KNOWN == 0 {
            let fr = self.snap.frames.frame(f);
            self.frames[k] = KNOWN | frame_bits(self.snap.frames.str(fr.filename), self.snap.frames.str(fr.name));
        }
        self.frames[k] & !KNOWN
    }
    // Asked once per block by the roles: the known answer inlined, the first look not.
    #[inline]
    pub fn of(&mut self, s: Option<StackId>) -> u8 {
        let Some(s) = s else { return 0 };
        let b = self.stacks[s.index()];
        if b & KNOWN != 0 {
            return b & !KNOWN;
        }
        self.first_look(s)
    }
    #[inline(never)]
    fn first_look(&mut self, s: StackId) -> u8 {
        let mut b = 0;
        for i in 0..self.snap.frames.stack(s).len() {
            let f = self.snap.frames.stack(s)[i];
            b |= self.frame(f);
        }
        self.stacks[s.index()] = KNOWN | b;
        b
    }
    /// The snapshot whose stacks these are.
    pub fn snap(&self) -> &'a Snapshot {
        self.snap
    }
    /// Whether any frame of the stack names `needle` (function or file), case-insensitive.
    pub fn mentions(&mut self, s: Option<StackId>, needle: &'static str) -> bool {
        let Some(s) = s else { return false };
        let snap = self.snap;
        *self.mentioned.entry((s, needle)).or_insert_with(|| {
            snap.frames.stack(s).iter().any(|&f| {
                let fr = snap.frames.frame(f);
                snap.frames.str(fr.filename).to_ascii_lowercase().contains(needle)
                    || snap.frames.str(fr.name).to_ascii_lowercase().contains(needle)
            })
        })
    }
}

/// A phase tag of one entry, strongest evidence first.
fn tag_of(bits: u8) -> Option<Tag> {
    if bits & ZERO != 0 {
        Some(Tag::Zero)
    } else if bits & (OPT | USER_OPT) != 0 && bits & BWD == 0 {
        Some(Tag::Opt)
    } else if bits & BWD != 0 {
        Some(Tag::Bwd)
    } else if bits & FWD != 0 {
        Some(Tag::Fwd)
    } else {
        None
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tag {
    Zero,
    Opt,
    Bwd,
    Fwd,
}

fn phase_of_tag(t: Tag) -> Phase {
    match t {
        Tag::Zero => Phase::Outside,
        Tag::Opt => Phase::Optimizer,
        Tag::Bwd => Phase::Backward,
        Tag::Fwd => Phase::Forward,
    }
}

/// Annotated intervals of entries: (start entry, end entry, name).
pub fn annotated(snap: &Snapshot, device: i64) -> Vec<(usize, usize, String)> {
    let trace = snap.trace(device);
    if trace.iter().any(|e| e.time_us == NO_TIME) {
        return Vec::new();
    }
    annotated_timed(snap, device)
}

/// [`annotated`] of a trace whose entries all have a time.
fn annotated_timed(snap: &Snapshot, device: i64) -> Vec<(usize, usize, String)> {
    let trace = snap.trace(device);
    if trace.is_empty() {
        return Vec::new();
    }
    let scopes = Scopes::new(snap, device);
    scopes
        .occurrences()
        .into_iter()
        .map(|(s, e, n, _)| {
            let a = if s == i64::MIN { 0 } else { trace.partition_point(|x| x.time_us < s) };
            let b = trace.partition_point(|x| x.time_us <= e);
            (a, b, scopes.names[n].clone())
        })
        .collect()
}

/// Whether an annotation names a step of a loop: `ProfilerStep#N`, `step`, `train_step`,
/// `iteration N`, `step_7` (fragscope.torch.phase("step") writes `step`).
fn step_annotation(name: &str) -> bool {
    let l = name.to_ascii_lowercase();
    if l.starts_with("profilerstep#") {
        return true;
    }
    let head = l.trim_end_matches(|c: char| c.is_ascii_digit()).trim_end_matches(['#', ' ', '_', '-', ':', '=']);
    matches!(head, "step" | "train_step" | "training_step" | "iteration" | "iter" | "train step" | "training step")
}

/// Whether `device`'s trace has a step annotation ([`step_annotation`]): the program
/// marks its loop's steps, whatever else bounds them.
pub fn has_step_annotations(snap: &Snapshot, device: i64) -> bool {
    annotated(snap, device).iter().any(|(_, _, name)| step_annotation(name))
}

/// The steps of `device`'s trace (module doc).
pub fn steps(snap: &Snapshot, device: i64) -> Steps {
    let mut ev = StackEvidence::new(snap);
    steps_with(snap, device, &mut ev)
}

pub(crate) fn steps_with(snap: &Snapshot, device: i64, ev: &mut StackEvidence) -> Steps {
    let trace = snap.trace(device);
    let n = trace.len();
    // 1. Evidence of each entry: its stack, and the optimizer's own annotations.
    let has_frames = trace.iter().any(|e| e.stack.is_some_and(|s| !snap.frames.stack(s).is_empty()));
    let mut t = entry_tags(snap, trace, ev);
    let anns = if t.untimed { Vec::new() } else { annotated_timed(snap, device) };
    let (ann_opt, ann_zero) = optimizer_annotations(&anns, &mut t);
    // 2. Phases: a tagged entry is in its tag's phase; an untagged one in the phase
    // around it (module doc).
    // An `alloc` without frames in a trace with frames (the autograd engine's thread).
    let frameless_alloc = |k: usize| {
        let e = &trace[k];
        has_frames && e.action == Action::Alloc && e.stack.is_none_or(|s| snap.frames.stack(s).is_empty())
    };
    let mut phase_of = phases_from_tags(&t.tags, frameless_alloc);
    if !t.frees_tell {
        frees_stay_in_their_phase(trace, &t, &mut phase_of);
    }
    // The maximal runs of one phase, each with whether a `zero_grad` entry is in it:
    // the steps and their phases are read from these rather than entry by entry.
    let rle = phase_runs(&phase_of, &t.tags);
    let mut evidence = phase_evidence(&t, &rle, ann_opt, ann_zero);

    // 3. Steps: bounded by the optimizer's steps, else by the backward passes, else by
    // step annotations.
    let opt_runs = joined_runs(&rle, Phase::Optimizer);
    let (source, ends): (StepSource, Vec<(usize, usize)>) = if !opt_runs.is_empty() {
        (StepSource::Optimizer, opt_runs)
    } else {
        let bwd = joined_runs(&rle, Phase::Backward);
        if !bwd.is_empty() {
            (StepSource::Backward, bwd)
        } else if let Some(steps) = annotated_steps(snap, device, &anns, &rle, &mut evidence) {
            let source = StepSource::Annotation;
            return Steps { device, source, evidence, steps, after_last_step: None, reason: None, phase_of };
        } else {
            let reason = Some(no_step_reason(n, has_frames, t.counts[Tag::Fwd as usize] > 0));
            return Steps {
                device,
                source: StepSource::None,
                evidence,
                steps: Vec::new(),
                after_last_step: None,
                reason,
                phase_of,
            };
        }
    };
    let steps = bounded_steps(snap, device, &phase_of, &t.tags, &rle, &ends);
    let prev_end = steps.last().map_or(0, |s| s.end);
    let after_last_step = (prev_end..n).find(|&k| matches!(phase_of[k], Phase::Forward | Phase::Backward));
    Steps { device, source, evidence, steps, after_last_step, reason: None, phase_of }
}

/// Group 3 of [`steps_with`]: the steps that `ends` bound (per step, the run that ends
/// it: its optimizer's, else its backward pass's; [`joined_runs`]). A step starts at the
/// first `zero_grad`, forward or backward entry after the previous step: set-up and
/// batch loading before it stay outside.
fn bounded_steps(
    snap: &Snapshot,
    device: i64,
    phase_of: &[Phase],
    tags: &[Option<Tag>],
    rle: &[PhaseRun],
    ends: &[(usize, usize)],
) -> Vec<Step> {
    let trace = snap.trace(device);
    let mut steps = Vec::with_capacity(ends.len());
    let mut prev_end = 0;
    for &(rs, re) in ends {
        let start = (prev_end..rs).find(|&k| phase_of[k] != Phase::Outside || tags[k] == Some(Tag::Zero)).unwrap_or(rs);
        let phases = spans_in(rle, start, re);
        let complete = !steps.is_empty() || first_step_whole(trace, phase_of, tags, start, re, &phases);
        let layers = layers_in(snap, device, &phases);
        steps.push(Step { start, end: re, phases, complete, layers });
        prev_end = re;
    }
    steps
}

/// Whether the trace holds the whole of the first step, entries `start..end` (of
/// `phases`): it starts with `zero_grad`, or with a forward pass that did not begin
/// before the trace ([`forward_began_before`]). A recording begun inside a step (a ring
/// buffer that dropped its start, `_record_memory_history` called mid-step) holds its
/// backward or optimizer without what its forward made; every later step is whole.
fn first_step_whole(
    trace: &[fragscope_snapshot::TraceEvent],
    phase_of: &[Phase],
    tags: &[Option<Tag>],
    start: usize,
    end: usize,
    phases: &[PhaseSpan],
) -> bool {
    tags[start] == Some(Tag::Zero)
        || (phases.first().map(|p| p.phase) == Some(Phase::Forward)
            && !forward_began_before(trace, phase_of, start, end))
}

/// What group 1 of [`steps_with`] reads of each entry ([`entry_tags`]).
struct EntryTags {
    /// Per entry, the phase its evidence tags it with, if any.
    tags: Vec<Option<Tag>>,
    /// Entries by tag (`Tag as usize`).
    counts: [usize; 4],
    /// Whether a user optimizer's step was seen (its frames without `torch/optim`'s).
    user_opt: bool,
    /// Whether an entry has no time (then no annotation can be placed).
    untimed: bool,
    /// Whether frees are evidence of the phase they are in ([`frees_carry_alloc_stacks`]).
    frees_tell: bool,
    /// Without (`frees_tell` false): per entry, the tag of the allocation a free frees.
    made_by: Vec<Option<Tag>>,
}

/// Group 1 of [`steps_with`]: the tag of each entry from its stack (the frames of the
/// optimizer, `zero_grad`, backward or forward; [`tag_of`]), and the counts by tag.
fn entry_tags(snap: &Snapshot, trace: &[fragscope_snapshot::TraceEvent], ev: &mut StackEvidence) -> EntryTags {
    let n = trace.len();
    let mut counts = [0usize; 4];
    let mut user_opt = false;
    // Per stack, what its evidence makes of an entry, worked out at the stack's first
    // entry (millions of entries, a few thousand stacks): 0 not yet, else
    // `SEEN | USER_ONLY? | tag code` (the code: index into `TAGS`).
    const SEEN: u8 = 0x80;
    const USER_ONLY: u8 = 0x40;
    const TAGS: [Option<Tag>; 8] =
        [None, Some(Tag::Zero), Some(Tag::Opt), Some(Tag::Bwd), Some(Tag::Fwd), None, None, None];
    let mut by_stack: Vec<u8> = vec![0; snap.frames.num_stacks()];
    // An entry without a time (then no annotation can be placed).
    let mut untimed = false;
    // Entries by code: the counts by tag, and whether a user optimizer's step was seen,
    // from these (one increment per entry, no branch).
    let mut by_code = [0usize; 256];
    let mut tags: Vec<Option<Tag>> = crate::hugepages::filled(n, None);
    // Frees recorded with `context="alloc"` carry the stack of the allocation they free,
    // which says where the block was made, not what the program was doing when it was
    // freed (a gradient freed by zero_grad would read as backward): then only the
    // allocations are evidence.
    let frees_tell = !frees_carry_alloc_stacks(trace);
    // Without: the tag of the allocation each free frees (below).
    let mut made_by: Vec<Option<Tag>> = if frees_tell { Vec::new() } else { Vec::with_capacity(n) };
    made_by.huge_pages();
    for (t, e) in tags.iter_mut().zip(trace) {
        untimed |= e.time_us == NO_TIME;
        let free = matches!(e.action, Action::FreeRequested | Action::FreeCompleted);
        let relevant = e.action == Action::Alloc || free;
        let mut code = match e.stack {
            Some(s) if relevant => {
                let c = by_stack[s.index()];
                if c != 0 {
                    c
                } else {
                    let bits = ev.of(Some(s)) & !WORKSPACE;
                    let tag = tag_of(bits).map_or(0, |t| t as u8 + 1);
                    let user = if bits & USER_OPT != 0 && bits & OPT == 0 { USER_ONLY } else { 0 };
                    by_stack[s.index()] = SEEN | user | tag;
                    SEEN | user | tag
                }
            }
            _ => 0,
        };
        if !frees_tell {
            made_by.push(if free { TAGS[(code & 7) as usize] } else { None });
            if free {
                code &= !7; // no tag; a user optimizer's frames still count
            }
        }
        by_code[code as usize] += 1;
        *t = TAGS[(code & 7) as usize];
    }
    for (code, &k) in by_code.iter().enumerate().filter(|x| *x.1 > 0) {
        user_opt |= code as u8 & USER_ONLY != 0;
        if let Some(t) = TAGS[code & 7] {
            counts[t as usize] += k;
        }
    }
    EntryTags { tags, counts, user_opt, untimed, frees_tell, made_by }
}

/// Group 1, continued: the optimizer's own annotations (`Optimizer.step#...`,
/// `Optimizer.zero_grad#...`, which `torch.optim.Optimizer` records with
/// `record_function`) tag the entries inside them, over what their stacks said. Returns
/// how many of each.
fn optimizer_annotations(anns: &[(usize, usize, String)], t: &mut EntryTags) -> (usize, usize) {
    let n = t.tags.len();
    let mut ann_opt = 0;
    let mut ann_zero = 0;
    for (a, b, name) in anns {
        let tag = if name.starts_with("Optimizer.step#") {
            ann_opt += 1;
            Tag::Opt
        } else if name.starts_with("Optimizer.zero_grad#") {
            ann_zero += 1;
            Tag::Zero
        } else {
            continue;
        };
        for x in t.tags.iter_mut().take((*b).min(n)).skip(*a) {
            if let Some(old) = *x {
                t.counts[old as usize] -= 1;
            }
            t.counts[tag as usize] += 1;
            *x = Some(tag);
        }
    }
    (ann_opt, ann_zero)
}

/// Group 2 of [`steps_with`]: the phase of each entry. A tagged entry is in its tag's
/// phase; an untagged run in the phase around it, from the tags on either side (module
/// doc). `frameless_alloc(k)`: entry `k` is an `alloc` without frames in a trace with
/// frames (the autograd engine's thread).
fn phases_from_tags(tags: &[Option<Tag>], frameless_alloc: impl Fn(usize) -> bool) -> Vec<Phase> {
    let n = tags.len();
    let mut phase_of = crate::hugepages::filled(n, Phase::Outside);
    // The tag of the last tagged entry before `i`.
    let mut prev: Option<Tag> = None;
    let mut i = 0;
    while i < n {
        // Tagged entries (most of them on a trace with Python frames), in a loop of
        // their own.
        while let (Some(&Some(t)), Some(p)) = (tags.get(i), phase_of.get_mut(i)) {
            *p = phase_of_tag(t);
            prev = Some(t);
            i += 1;
        }
        if i == n {
            break;
        }
        let j = tags[i..].iter().position(Option::is_some).map_or(n, |k| i + k);
        let next = tags.get(j).copied().flatten();
        let fill = match (prev, next) {
            (None, _) => Phase::Outside,
            (Some(Tag::Opt), Some(Tag::Opt)) => Phase::Optimizer,
            (Some(Tag::Opt), _) | (Some(Tag::Zero), _) => Phase::Outside,
            (Some(Tag::Bwd), Some(Tag::Fwd)) | (Some(Tag::Bwd), Some(Tag::Zero)) => Phase::Outside,
            (Some(Tag::Bwd), _) => Phase::Backward,
            (Some(Tag::Fwd), Some(Tag::Fwd)) | (Some(Tag::Fwd), Some(Tag::Bwd)) => Phase::Forward,
            // Forward, then nothing tagged until the optimizer or the next step: the
            // autograd engine's thread allocates without Python frames, so on a trace
            // recorded with Python stacks only the backward pass starts at the first
            // frameless allocation.
            (Some(Tag::Fwd), _) => match (i..j).find(|&k| frameless_alloc(k)) {
                Some(k) if next.is_some() => {
                    phase_of[i..k].fill(Phase::Forward);
                    phase_of[k..j].fill(Phase::Backward);
                    i = j;
                    continue;
                }
                _ => Phase::Forward,
            },
        };
        phase_of[i..j].fill(fill);
        i = j;
    }
    // A backward pass that follows a forward pass without tagged entries after it
    // (frameless backward to the end of the trace) is left as forward: nothing bounds it.
    phase_of
}

/// Group 2, continued, for frees that tell nothing (`context="alloc"`): the frees that
/// follow a phase's last allocation, before the next allocation, of blocks that phase
/// made (its temporaries) or of blocks without frames, are that phase's own, not the
/// next phase's.
fn frees_stay_in_their_phase(trace: &[fragscope_snapshot::TraceEvent], t: &EntryTags, phase_of: &mut [Phase]) {
    for k in 1..trace.len() {
        let p = phase_of[k - 1];
        let free = matches!(trace[k].action, Action::FreeRequested | Action::FreeCompleted);
        // A free of a block made elsewhere ends the run; one whose allocation left
        // no evidence (made before the trace, or without frames) does not.
        let own = match t.made_by[k] {
            Some(tag) => !free || phase_of_tag(tag) == p,
            None => true,
        };
        if t.tags[k].is_none() && trace[k].action != Action::Alloc && p != Phase::Outside && own {
            phase_of[k] = p;
        }
    }
}

/// The evidence of the phases, in words ([`Steps::evidence`]).
fn phase_evidence(t: &EntryTags, rle: &[PhaseRun], ann_opt: usize, ann_zero: usize) -> Vec<String> {
    let counts = &t.counts;
    let mut phase_counts = [0usize; 4];
    for r in rle {
        phase_counts[r.phase as usize] += r.end - r.start;
    }
    let mut evidence = Vec::new();
    let count = |p: Phase| phase_counts[p as usize];
    if counts[Tag::Opt as usize] > 0 {
        evidence.push(format!(
            "{} entries in the optimizer's step ({}{})",
            count(Phase::Optimizer),
            if ann_opt > 0 { format!("{ann_opt} Optimizer.step annotations, ") } else { String::new() },
            if t.user_opt { "frames of a user optimizer's step" } else { "torch/optim or fused-optimizer frames" }
        ));
    }
    if counts[Tag::Zero as usize] > 0 {
        evidence.push(format!(
            "zero_grad ({} entries{})",
            counts[Tag::Zero as usize],
            if ann_zero > 0 { format!(", {ann_zero} annotations") } else { String::new() }
        ));
    }
    if counts[Tag::Bwd as usize] > 0 {
        evidence.push(format!(
            "{} entries in backward passes (autograd engine, *Backward nodes, AccumulateGrad or Tensor.backward frames)",
            count(Phase::Backward)
        ));
    }
    if counts[Tag::Fwd as usize] > 0 {
        evidence.push(format!("{} entries in forward passes (module forward frames)", count(Phase::Forward)));
    }
    evidence
}

/// Group 3 of [`steps_with`]: the runs of phase `p` that bound steps, (start, end).
/// Runs separated only by entries outside every phase are one (an optimizer step, then
/// a scheduler's step after a few frees), unless a `zero_grad` is among them.
fn joined_runs(rle: &[PhaseRun], p: Phase) -> Vec<(usize, usize)> {
    let mut v: Vec<(usize, usize)> = Vec::new();
    // Index in `rle` of the last run of `p`.
    let mut last_run = usize::MAX;
    for (r, run) in rle.iter().enumerate() {
        if run.phase != p {
            continue;
        }
        // Runs are maximal: one outside run between, or none.
        let joined = last_run != usize::MAX
            && r == last_run + 2
            && rle[last_run + 1].phase == Phase::Outside
            && !rle[last_run + 1].zero_grad;
        match v.last_mut() {
            Some(last) if joined => last.1 = run.end,
            _ => v.push((run.start, run.end)),
        }
        last_run = r;
    }
    v
}

/// Group 3, without an optimizer step or a backward pass: the steps the step
/// annotations bound ([`step_annotation`]), if any, their evidence added to `evidence`.
fn annotated_steps(
    snap: &Snapshot,
    device: i64,
    anns: &[(usize, usize, String)],
    rle: &[PhaseRun],
    evidence: &mut Vec<String>,
) -> Option<Vec<Step>> {
    let n = snap.trace(device).len();
    let mut st: Vec<(usize, usize)> =
        anns.iter().filter(|(_, _, name)| step_annotation(name)).map(|&(a, b, _)| (a, b.min(n))).collect();
    st.sort_unstable();
    st.dedup();
    if st.is_empty() {
        return None;
    }
    evidence.push(format!("{} step annotations ({})", st.len(), {
        let mut names: Vec<&str> =
            anns.iter().filter(|(_, _, x)| step_annotation(x)).map(|(_, _, x)| x.as_str()).collect();
        names.dedup();
        names.into_iter().take(3).collect::<Vec<_>>().join(", ")
    }));
    let steps = st
        .into_iter()
        .map(|(a, b)| {
            let phases = spans_in(rle, a, b);
            let layers = layers_in(snap, device, &phases);
            Step { start: a, end: b, phases, complete: true, layers }
        })
        .collect();
    Some(steps)
}

/// Why a trace of `n` entries has no step, in words ([`Steps::reason`]).
fn no_step_reason(n: usize, has_frames: bool, forward_seen: bool) -> String {
    if n == 0 {
        "the snapshot has no trace".to_string()
    } else if !has_frames {
        "the trace has no stack frames and no step annotation".to_string()
    } else if forward_seen {
        "forward passes only: no backward pass, optimizer step or step annotation".to_string()
    } else {
        "no optimizer step, backward pass or step annotation in the trace".to_string()
    }
}

/// Whether the forward pass of the step in entries `start..end` began before the trace:
/// its backward pass frees a block the trace did not allocate (an activation saved by
/// the part of the forward that was not recorded). A block freed in forward instead
/// says nothing: the last step's outputs are freed there when overwritten.
fn forward_began_before(
    trace: &[fragscope_snapshot::TraceEvent],
    phase_of: &[Phase],
    start: usize,
    end: usize,
) -> bool {
    let mut made: FxHashMap<u64, ()> = FxHashMap::default();
    for (i, e) in trace.iter().enumerate().take(end) {
        match e.action {
            Action::Alloc => {
                made.insert(e.addr, ());
            }
            Action::FreeRequested if i >= start && phase_of[i] == Phase::Backward && !made.contains_key(&e.addr) => {
                return true;
            }
            _ => {}
        }
    }
    false
}

/// Whether the trace's frees carry the stacks of the allocations they free (recorded
/// with `context="alloc"`) rather than their own (`context="all"`, PyTorch's default):
/// among the first frees (up to 4096) of blocks the trace allocated, with a stack, nine
/// in ten or more carry their allocation's (a free at the same line as its allocation
/// happens, but seldom for most of them).
fn frees_carry_alloc_stacks(trace: &[fragscope_snapshot::TraceEvent]) -> bool {
    let mut made: FxHashMap<u64, StackId> = FxHashMap::default();
    let (mut same, mut seen) = (0usize, 0usize);
    for e in trace {
        match e.action {
            Action::Alloc => {
                if let Some(s) = e.stack {
                    made.insert(e.addr, s);
                }
            }
            Action::FreeRequested => {
                if let (Some(a), Some(s)) = (made.remove(&e.addr), e.stack) {
                    seen += 1;
                    same += usize::from(a == s);
                    if seen == 4096 {
                        break;
                    }
                }
            }
            _ => {}
        }
    }
    seen >= 16 && same * 10 >= seen * 9
}

/// Whether step `s`'s optimizer (else its backward) is called from inside a module's
/// `forward`: in the Python frames of its entries (innermost first), an optimizer or
/// `backward()` frame with a module `forward` outside it. Update steps nested in one
/// pass (test-time optimisation, a model that trains a sub-model in its forward) are not
/// the steps of a training loop: the outer pass keeps its memory across them.
/// Looks at the first few entries with such a frame; `false` without Python frames.
pub fn step_inside_forward(snap: &Snapshot, device: i64, s: &Step) -> bool {
    let trace = snap.trace(device);
    let Some((a, b)) = s.span(Phase::Optimizer).or_else(|| s.span(Phase::Backward)) else { return false };
    let mut looked = 0;
    for e in &trace[a.min(trace.len())..b.min(trace.len())] {
        let Some(sid) = e.stack else { continue };
        let mut inner = false;
        for &f in snap.frames.stack(sid) {
            let fr = snap.frames.frame(f);
            let bits = frame_bits(snap.frames.str(fr.filename), snap.frames.str(fr.name));
            if bits & (OPT | USER_OPT | BWD) != 0 {
                inner = true;
            } else if inner && bits & FWD != 0 && bits & PY != 0 {
                return true;
            }
        }
        if inner {
            looked += 1;
            if looked >= 8 {
                return false;
            }
        }
    }
    false
}

/// A maximal run of one phase: entries `start..end`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct PhaseRun {
    phase: Phase,
    start: usize,
    end: usize,
    /// A `zero_grad` entry is in it (only in outside runs).
    zero_grad: bool,
}

/// The maximal runs of `phase_of`, in order.
fn phase_runs(phase_of: &[Phase], tags: &[Option<Tag>]) -> Vec<PhaseRun> {
    let mut v: Vec<PhaseRun> = Vec::new();
    let mut k = 0;
    while k < phase_of.len() {
        let (p, s) = (phase_of[k], k);
        k = run_end(phase_of, k);
        let zero_grad = tags[s..k].iter().fold(false, |z, &t| z | (t == Some(Tag::Zero)));
        v.push(PhaseRun { phase: p, start: s, end: k, zero_grad });
    }
    v
}

/// The end of the run of one phase that starts at entry `k`. A pass runs for hundreds
/// or thousands of entries: they are compared a block at a time, with a test without
/// branches that the compiler makes a few vector instructions, rather than one by one.
pub(crate) fn run_end(phase_of: &[Phase], mut k: usize) -> usize {
    const BLOCK: usize = 32;
    let p = phase_of[k];
    while let Some(block) = phase_of.get(k..k + BLOCK) {
        if !block.iter().fold(true, |same, &q| same & (q == p)) {
            break;
        }
        k += BLOCK;
    }
    k + phase_of[k..].iter().take_while(|&&q| q == p).count()
}

/// `spans` of entries `start..end`, from the runs of the whole trace.
fn spans_in(runs: &[PhaseRun], start: usize, end: usize) -> Vec<PhaseSpan> {
    let from = runs.partition_point(|r| r.end <= start);
    runs[from..]
        .iter()
        .take_while(|r| r.start < end)
        .filter(|r| r.phase != Phase::Outside)
        .map(|r| PhaseSpan { phase: r.phase, start: r.start.max(start), end: r.end.min(end) })
        .filter(|s| s.start < s.end)
        .collect()
}

/// The runs of `phase_of` (which starts at entry `base`), outside runs left out (the
/// definition of [`spans_in`], which the tests check it against).
#[cfg(test)]
fn spans(phase_of: &[Phase], base: usize) -> Vec<PhaseSpan> {
    let mut v: Vec<PhaseSpan> = Vec::new();
    for (k, &p) in phase_of.iter().enumerate() {
        match v.last_mut() {
            Some(l) if l.phase == p && l.end == base + k => l.end += 1,
            _ if p == Phase::Outside => {}
            _ => v.push(PhaseSpan { phase: p, start: base + k, end: base + k + 1 }),
        }
    }
    v
}

/// Layers of a step: the repeats of the forward pass's pattern of allocations (else the
/// backward pass's).
fn layers_in(snap: &Snapshot, device: i64, phases: &[PhaseSpan]) -> Option<usize> {
    [Phase::Forward, Phase::Backward].into_iter().find_map(|p| {
        let trace = snap.trace(device);
        let allocs: Vec<(u64, Option<StackId>)> = phases
            .iter()
            .filter(|s| s.phase == p)
            .flat_map(|s| trace[s.start..s.end].iter())
            .filter(|e| e.action == Action::Alloc)
            .map(|e| (e.size, e.stack))
            .collect();
        repeats(&allocs)
    })
}

/// How many times a sequence of signatures repeats one pattern: the period with the
/// highest autocorrelation (among the gaps between equal signatures), then the longest
/// chain of one signature at exactly that period. `None` under two repeats or a weak
/// pattern.
fn repeats<T: Eq + std::hash::Hash + Copy>(seq: &[T]) -> Option<usize> {
    repeat_chain(seq).map(|(layers, _, _)| layers)
}

/// [`repeats`] with where the repeats are: `(layers, period, first)`, the chain of one
/// signature at `first`, `first + period`, ... (of the signatures with the longest chain,
/// the one that starts first: the layers' boundaries are then at their first repeated
/// allocation).
fn repeat_chain<T: Eq + std::hash::Hash + Copy>(seq: &[T]) -> Option<(usize, usize, usize)> {
    if seq.len() < 4 {
        return None;
    }
    // FxHash: SipHash of each (size, stack) signature was most of this function's cost.
    let mut ids: FxHashMap<T, u32> = FxHashMap::default();
    let s: Vec<u32> = seq
        .iter()
        .map(|x| {
            let k = ids.len() as u32;
            *ids.entry(*x).or_insert(k)
        })
        .collect();
    repeat_chain_numbered(&s, ids.len())
}

/// [`repeat_chain`] of signatures numbered `0..distinct` (equal signatures, equal
/// numbers; only their equality matters).
fn repeat_chain_numbered(s: &[u32], distinct: usize) -> Option<(usize, usize, usize)> {
    let n = s.len();
    if n < 4 {
        return None;
    }
    let ids = 0..distinct;
    let mut last = vec![usize::MAX; ids.len()];
    let mut gaps = vec![0u32; n / 2 + 1];
    for (i, &x) in s.iter().enumerate() {
        let l = last[x as usize];
        if l != usize::MAX && i - l <= n / 2 {
            gaps[i - l] += 1;
        }
        last[x as usize] = i;
    }
    let mut cand: Vec<(usize, u32)> = gaps.iter().enumerate().filter(|g| *g.1 > 0).map(|(g, &c)| (g, c)).collect();
    cand.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    cand.truncate(24);
    let ac = |p: usize| s[..n - p].iter().zip(&s[p..]).filter(|(a, b)| a == b).count() as f64 / (n - p) as f64;
    let scored: Vec<(usize, f64)> = cand.iter().map(|&(p, _)| (p, ac(p))).collect();
    let best = scored.iter().map(|x| x.1).fold(0.0, f64::max);
    if best < 0.5 {
        return None;
    }
    let period = scored.iter().filter(|x| x.1 >= best * 0.95).map(|x| x.0).min()?;
    // Longest chain of one signature spaced exactly `period` apart.
    let mut chain = vec![(0usize, 0usize); ids.len()]; // (length, first position)
    let mut best_chain = vec![(0usize, 0usize); ids.len()];
    let mut last = vec![usize::MAX; ids.len()];
    for (i, &x) in s.iter().enumerate() {
        let k = x as usize;
        chain[k] = if last[k] != usize::MAX && i - last[k] == period { (chain[k].0 + 1, chain[k].1) } else { (1, i) };
        if chain[k].0 > best_chain[k].0 {
            best_chain[k] = chain[k];
        }
        last[k] = i;
    }
    let layers = best_chain.iter().map(|c| c.0).max()?;
    let first = best_chain.iter().filter(|c| c.0 == layers).map(|c| c.1).min()?;
    (layers >= 2 && layers * period * 2 >= n).then_some((layers, period, first))
}

/// The layers of one phase of a step, as runs of trace entries `[start, end)` in time
/// order (for the backward pass the last layer of the model comes first): each starts
/// at an allocation of the repeated pattern ([`repeat_chain`]); the last ends one period
/// of allocations later (or where the phase ends). `None` when the phase does not repeat
/// a pattern two or more times. Entries before the first layer (an embedding) and after
/// the last (a head, the loss) belong to no layer.
pub fn layer_spans(snap: &Snapshot, device: i64, step: &Step, phase: Phase) -> Option<Vec<(usize, usize)>> {
    let trace = snap.trace(device);
    let spans: Vec<&PhaseSpan> = step.phases.iter().filter(|s| s.phase == phase).collect();
    let entries: Vec<usize> =
        spans.iter().flat_map(|s| (s.start..s.end).filter(|&k| trace[k].action == Action::Alloc)).collect();
    let sigs: Vec<(u64, Option<StackId>)> = entries.iter().map(|&k| (trace[k].size, trace[k].stack)).collect();
    let (layers, period, first) = repeat_chain(&sigs)?;
    Some(layers_at(|p| entries.get(p).copied(), layers, period, first, spans.last()?.end))
}

/// The layers `repeat_chain` found (`layers` of `period` allocations from `first`) as
/// entry spans, over the `alloc` entries of a run that ends at `end` (`entry(p)`: the
/// `p`-th, `None` past the last).
fn layers_at(
    entry: impl Fn(usize) -> Option<usize>,
    layers: usize,
    period: usize,
    first: usize,
    end: usize,
) -> Vec<(usize, usize)> {
    (0..layers)
        .map(|j| {
            let a = entry(first + j * period).unwrap_or(end);
            let b = entry(first + (j + 1) * period).unwrap_or(end);
            (a, b)
        })
        .collect()
}

/// A run's `alloc` entries by position, ascending: a list of them, or rule 8's sparse
/// index over the trace ([`crate::roles::passes`], which on a long forward-only trace
/// would otherwise hold millions of them at `summary`'s peak memory).
pub(crate) trait Allocs {
    /// How many.
    fn count(&self) -> usize;
    /// The entry of the `p`-th (`p < count()`).
    fn entry(&self, p: usize) -> usize;
    /// How many come before entry `e`.
    fn before(&self, e: usize) -> usize;
}

impl Allocs for [usize] {
    fn count(&self) -> usize {
        self.len()
    }
    fn entry(&self, p: usize) -> usize {
        self[p]
    }
    fn before(&self, e: usize) -> usize {
        self.partition_point(|&k| k < e)
    }
}

/// [`layer_spans`] of one run of entries that ends at `end`, from its `alloc` entries
/// (`allocs`, positions `lo..lo + sigs.len()` of them) and their `(size, stack)`
/// signatures as numbers (`sigs[i]` of the allocation at position `lo + i`; equal
/// signatures, equal numbers), for a caller that asks for the layers of many parts of one
/// run: it reads the trace once for the run and hands each part its slices (rule 8 of the
/// roles, on a 6.4 M-entry forward-only trace, read it three times over otherwise, and
/// hashed each signature twice). `numbered`: `Some(distinct)` when `sigs` are already
/// numbered `0..distinct` in the order each first occurs (the whole run, as its reader
/// numbered it), which numbering them again would not change.
pub(crate) fn layer_spans_of<A: Allocs + ?Sized>(
    allocs: &A,
    lo: usize,
    sigs: &[u32],
    end: usize,
    numbered: Option<usize>,
) -> Option<Vec<(usize, usize)>> {
    debug_assert!(lo + sigs.len() <= allocs.count());
    if sigs.len() < 4 {
        return None;
    }
    let (layers, period, first) = match numbered {
        Some(distinct) => repeat_chain_numbered(sigs, distinct)?,
        None => {
            // Numbered again from 0 in this part (a part of a long run holds few of its
            // signatures): the arrays by number stay the part's size.
            let mut local: FxHashMap<u32, u32> = FxHashMap::default();
            let s: Vec<u32> = sigs
                .iter()
                .map(|&x| {
                    let k = local.len() as u32;
                    *local.entry(x).or_insert(k)
                })
                .collect();
            repeat_chain_numbered(&s, local.len())?
        }
    };
    let entry = |p: usize| (p < sigs.len()).then(|| allocs.entry(lo + p));
    Some(layers_at(entry, layers, period, first, end))
}

#[cfg(test)]
mod tests {
    use super::*;
    use fragscope_snapshot::TraceEvent;

    #[test]
    fn backward_nodes_and_engine_frames_are_backward_but_bindings_are_not() {
        assert!(frame_bits("??", "torch::autograd::generated::MmBackward0::apply(x)") & BWD != 0);
        assert!(frame_bits("??", "torch::autograd::Engine::evaluate_function(x)") & BWD != 0);
        assert!(frame_bits("", "torch::autograd::AccumulateGrad::apply(x)") & BWD != 0);
        assert_eq!(frame_bits("", "torch::autograd::generated::BmmBackward0::release_variables()") & BWD, 0);
        assert_eq!(frame_bits("??", "torch::autograd::THPVariable_empty(_object*)") & BWD, 0);
        assert_eq!(frame_bits("VariableType_1.cpp", "torch::autograd::VariableType::mm") & BWD, 0);
        assert!(frame_bits("/x/torch/optim/adam.py", "_single_tensor_adam") & OPT != 0);
        assert!(frame_bits("C:\\v\\torch\\optim\\optimizer.py", "wrapper") & OPT != 0);
        assert!(frame_bits("/x/torch/optim/optimizer.py", "zero_grad") & ZERO != 0);
        assert_eq!(frame_bits("/x/torch/optim/adam.py", "__init__") & OPT, 0);
        assert!(frame_bits("/x/torch/nn/modules/module.py", "_call_impl") & FWD != 0);
        assert!(frame_bits("??", "at::cuda::getNewWorkspace()") & WORKSPACE != 0);
    }

    #[test]
    fn layers_from_numbered_signatures_are_those_from_the_trace() {
        // Passes of layers (a pattern of sizes, some entries frees), noise between: the
        // layers of any span, from the run's signatures numbered once and sliced
        // (`layer_spans_of`), are `layer_spans`' of that span read from the trace.
        let mut rng = fragscope_testdata::Rng(11);
        let (mut found, mut whole) = (0, 0);
        for round in 0..100 {
            let mut trace = Vec::new();
            for _ in 0..1 + rng.below(4) {
                let period = 2 + rng.below(5);
                for _ in 0..rng.below(8) {
                    for k in 0..period {
                        trace.push(TraceEvent::new(Action::Alloc, 0, 512 * (1 + k as u64)));
                        if rng.below(3) == 0 {
                            trace.push(TraceEvent::new(Action::FreeRequested, 0, 512));
                        }
                    }
                }
                for _ in 0..rng.below(4) {
                    trace.push(TraceEvent::new(Action::Alloc, 0, 512 * (100 + rng.below(3) as u64)));
                }
            }
            let n = trace.len();
            let (mut allocs, mut sigs) = (Vec::new(), Vec::new());
            let mut ids: FxHashMap<u64, u32> = FxHashMap::default();
            for (k, e) in trace.iter().enumerate().filter(|(_, e)| e.action == Action::Alloc) {
                allocs.push(k);
                let next = ids.len() as u32;
                sigs.push(*ids.entry(e.size).or_insert(next));
            }
            let again = layer_spans_of(&allocs[..], 0, &sigs, n, None);
            assert_eq!(layer_spans_of(&allocs[..], 0, &sigs, n, Some(ids.len())), again, "round {round}, whole run");
            whole += again.is_some() as usize;
            let mut snap = Snapshot::default();
            snap.device_traces.push(trace);
            for _ in 0..20 {
                let a = rng.below(n + 1);
                let b = a + rng.below(n + 1 - a);
                let step = Step {
                    start: a,
                    end: b,
                    phases: vec![PhaseSpan { phase: Phase::Forward, start: a, end: b }],
                    complete: true,
                    layers: None,
                };
                let (lo, hi) = (allocs.partition_point(|&k| k < a), allocs.partition_point(|&k| k < b));
                let got = layer_spans_of(&allocs[..], lo, &sigs[lo..hi], b, None);
                assert_eq!(got, layer_spans(&snap, 0, &step, Phase::Forward), "round {round}, entries {a}..{b}");
                found += got.is_some() as usize;
            }
        }
        // Spans with layers, not only spans without.
        assert!(found >= 100, "only {found} spans with layers");
        // A whole run's signatures as numbered when read: the same layers without the
        // numbering again.
        assert!(whole >= 20, "only {whole} whole runs with layers");
    }

    #[test]
    fn repeats_counts_the_layers_of_a_pass() {
        // A prologue, 5 layers of the same 4 allocations, an epilogue.
        let mut seq = vec![100, 101];
        for _ in 0..5 {
            seq.extend([1, 2, 3, 2]);
        }
        seq.extend([200, 201]);
        assert_eq!(repeats(&seq), Some(5));
        assert_eq!(repeats(&[1, 2, 3, 4, 5, 6, 7, 8]), None);
    }

    #[test]
    fn spans_from_the_runs_are_the_spans_of_the_entries() {
        let mut rng = fragscope_testdata::Rng(5);
        let phases = [Phase::Outside, Phase::Forward, Phase::Backward, Phase::Optimizer];
        for _ in 0..300 {
            let n = rng.below(40);
            let phase_of: Vec<Phase> = (0..n).map(|_| phases[rng.below(4)]).collect();
            let tags: Vec<Option<Tag>> = phase_of.iter().map(|_| (rng.below(5) == 0).then_some(Tag::Zero)).collect();
            let runs = phase_runs(&phase_of, &tags);
            for _ in 0..10 {
                let a = rng.below(n + 1);
                let b = a + rng.below(n + 1 - a);
                assert_eq!(spans_in(&runs, a, b), spans(&phase_of[a..b], a), "{phase_of:?} {a}..{b}");
            }
        }
    }

    #[test]
    fn step_annotations() {
        for n in ["ProfilerStep#3", "step", "train_step", "iteration 4", "step_7"] {
            assert!(step_annotation(n), "{n}");
        }
        for n in ["forward", "Optimizer.step#Adam.step", "layer_3", "## forward ##"] {
            assert!(!step_annotation(n), "{n}");
        }
    }

    #[test]
    fn untagged_entries_take_the_phase_around_them() {
        use Phase::*;
        let (f, b, o, z) = (Some(Tag::Fwd), Some(Tag::Bwd), Some(Tag::Opt), Some(Tag::Zero));
        let tags = [None, f, None, f, None, None, o, None, o, None, z, b, None, f, None];
        // Entries 4 and 14: allocations without frames (the autograd engine's thread).
        let phases = phases_from_tags(&tags, |k| k == 4 || k == 14);
        assert_eq!(
            phases,
            [
                Outside,   // nothing tagged before
                Forward,   //
                Forward,   // between two forward entries
                Forward,   //
                Backward,  // from the first frameless allocation to the optimizer
                Backward,  //
                Optimizer, //
                Optimizer, // between two optimizer entries
                Optimizer, //
                Outside,   // after the optimizer
                Outside,   // zero_grad
                Backward,  //
                Outside,   // between backward and the next forward
                Forward,   //
                Forward,   // frameless, but nothing tagged after it bounds a backward pass
            ]
        );
    }

    // Each rule group on the smallest trace that fires it, and on a near miss.

    #[test]
    fn optimizer_frames() {
        // torch/optim (not its constructors), fused kernels, a user optimizer's `step`.
        assert_eq!(optimizer_frame("/x/torch/optim/adam.py", "_single_tensor_adam", true), OPT);
        assert_eq!(optimizer_frame("??", "at::native::multi_tensor_apply_kernel<...>", false), OPT);
        assert_eq!(optimizer_frame("/u/lion_optimizer.py", "step", true), USER_OPT);
        assert_eq!(optimizer_frame("/x/torch/optim/adam.py", "__init__", true), 0);
        assert_eq!(optimizer_frame("/u/train.py", "step", true), 0);
        assert_eq!(optimizer_frame("??", "at::native::add_kernel", false), 0);
        // Through frame_bits: zero_grad in torch/optim is between steps, not the step.
        assert_eq!(frame_bits("/x/torch/optim/optimizer.py", "zero_grad"), PY | ZERO);
    }

    #[test]
    fn backward_forward_and_workspace_frames() {
        // Activation checkpointing's recomputation runs a forward inside backward.
        assert!(backward_frame("/x/torch/utils/checkpoint.py", "unpack_hook", true));
        assert!(!backward_frame("/x/torch/utils/checkpoint.py", "checkpoint", true));
        assert!(backward_frame("/x/torch/_tensor.py", "backward", true));
        assert!(!backward_frame("/u/model.py", "backward", true));
        assert!(forward_frame("/x/torch/nn/modules/module.py", "_wrapped_call_impl"));
        assert!(!forward_frame("/u/model.py", "_wrapped_call_impl"));
        assert!(workspace_frame("at::cuda::getNewWorkspace()"));
        assert!(workspace_frame("cudnn::cudnnGetWorkspaceSize"));
        assert!(!workspace_frame("at::native::workspace_for_scan"));
    }

    fn entry_tags_of(tags: Vec<Option<Tag>>) -> EntryTags {
        let mut counts = [0; 4];
        for t in tags.iter().flatten() {
            counts[*t as usize] += 1;
        }
        EntryTags { tags, counts, user_opt: false, untimed: false, frees_tell: true, made_by: Vec::new() }
    }

    #[test]
    fn the_optimizers_annotations_tag_the_entries_inside_them() {
        let f = Some(Tag::Fwd);
        let mut t = entry_tags_of(vec![f, f, None, f]);
        let anns = [(1, 3, "Optimizer.step#Adam.step".to_string())];
        assert_eq!(optimizer_annotations(&anns, &mut t), (1, 0));
        assert_eq!(t.tags, [f, Some(Tag::Opt), Some(Tag::Opt), f]);
        assert_eq!(t.counts, [0, 2, 0, 2]);
        // Near miss: another annotation over the same entries.
        let mut t = entry_tags_of(vec![f, f, None, f]);
        assert_eq!(optimizer_annotations(&[(1, 3, "ProfilerStep#1".to_string())], &mut t), (0, 0));
        assert_eq!(t.tags, [f, f, None, f]);
    }

    #[test]
    fn with_context_alloc_a_free_stays_in_the_phase_that_made_its_block() {
        use Phase::*;
        // A backward allocation, then (context="alloc": frees carry their allocation's
        // stack, no tag) frees of a block backward made, and of one forward made.
        let trace: Vec<TraceEvent> = [Action::Alloc, Action::FreeRequested, Action::FreeRequested]
            .into_iter()
            .map(|a| TraceEvent::new(a, 0, 512))
            .collect();
        let mut t = entry_tags_of(vec![Some(Tag::Bwd), None, None]);
        t.frees_tell = false;
        t.made_by = vec![None, Some(Tag::Bwd), Some(Tag::Fwd)];
        let mut phase_of = vec![Backward, Outside, Outside];
        frees_stay_in_their_phase(&trace, &t, &mut phase_of);
        assert_eq!(phase_of, [Backward, Backward, Outside]);
    }

    #[test]
    fn frees_carry_their_allocations_stacks_when_nine_in_ten_do() {
        let mut snap = Snapshot::default();
        let (a, b) =
            (snap.frames.intern_py_stack(&[("/u/m.py", 1, "f")]), snap.frames.intern_py_stack(&[("/u/m.py", 2, "g")]));
        // `pairs` allocations and their frees, `other` of the frees with a stack of their own.
        let trace = |pairs: u64, other: u64| -> Vec<TraceEvent> {
            let mut v = Vec::new();
            for i in 0..pairs {
                for (action, s) in [(Action::Alloc, a), (Action::FreeRequested, if i < other { b } else { a })] {
                    let mut e = TraceEvent::new(action, 512 * i, 512);
                    e.stack = Some(s);
                    v.push(e);
                }
            }
            v
        };
        assert!(frees_carry_alloc_stacks(&trace(16, 1)));
        // Near misses: too few frees to tell, or two in sixteen with their own stack.
        assert!(!frees_carry_alloc_stacks(&trace(15, 0)));
        assert!(!frees_carry_alloc_stacks(&trace(16, 2)));
    }

    /// A minimal recording: entries with the frames given (innermost first, as PyTorch
    /// records them), ten microseconds apart, and `record_function` annotations.
    #[derive(Default)]
    struct Rec {
        snap: Snapshot,
        trace: Vec<TraceEvent>,
        anns: Vec<fragscope_snapshot::Annotation>,
    }

    type Frames<'a> = &'a [(&'a str, i64, &'a str)];
    const MAIN: (&str, i64, &str) = ("/u/train.py", 1, "main");
    const FORWARD: Frames = &[("/u/model.py", 10, "forward"), MAIN];
    const BACKWARD: Frames = &[("/x/torch/_tensor.py", 600, "backward"), MAIN];
    const ADAM: Frames = &[("/x/torch/optim/adam.py", 400, "_single_tensor_adam"), MAIN];
    const ZERO_GRAD: Frames = &[("/x/torch/optim/optimizer.py", 900, "zero_grad"), MAIN];

    impl Rec {
        fn ev(&mut self, action: Action, addr: u64, frames: Frames) -> &mut Self {
            let mut e = TraceEvent::new(action, addr, 512);
            e.stack = Some(self.snap.frames.intern_py_stack(frames));
            e.time_us = 10 * (self.trace.len() as i64 + 1);
            self.trace.push(e);
            self
        }
        fn alloc(&mut self, addr: u64, frames: Frames) -> &mut Self {
            self.ev(Action::Alloc, addr, frames)
        }
        fn free(&mut self, addr: u64, frames: Frames) -> &mut Self {
            self.ev(Action::FreeRequested, addr, frames)
        }
        /// `record_function(name)`'s START (`start`) or END, between two entries.
        fn mark(&mut self, name: &str, start: bool) -> &mut Self {
            self.anns.push(fragscope_snapshot::Annotation {
                device: 0,
                time_us: 10 * self.trace.len() as i64 + 5,
                name: name.into(),
                stage: if start { "START" } else { "END" }.into(),
                extra: Vec::new(),
            });
            self
        }
        /// One step: forward makes two activations, backward frees them (and makes a
        /// gradient in the first step), the optimizer a temporary when `optimizer`.
        fn step(&mut self, k: u64, optimizer: bool) -> &mut Self {
            let (a, b) = (0x1000 * (2 * k + 1), 0x1000 * (2 * k + 2));
            self.alloc(a, FORWARD).alloc(b, FORWARD);
            if k == 0 {
                self.alloc(0x100_0000, BACKWARD);
            }
            self.free(a, BACKWARD).free(b, BACKWARD);
            if optimizer {
                self.alloc(0x200_0000, ADAM).free(0x200_0000, ADAM);
            }
            self
        }
        fn done(&mut self) -> Snapshot {
            let mut snap = std::mem::take(&mut self.snap);
            snap.device_traces.push(std::mem::take(&mut self.trace));
            if !self.anns.is_empty() {
                snap.external_annotations = Some(std::mem::take(&mut self.anns));
            }
            snap
        }
    }

    #[test]
    fn steps_are_bounded_by_the_optimizer_else_backward_else_annotations() {
        let describe = |snap: &Snapshot| steps(snap, 0).describe();
        let snap = Rec::default().step(0, true).step(1, true).done();
        assert_eq!(describe(&snap), "2 steps (bounded by optimizer steps)");
        let st = steps(&snap, 0);
        let phases: Vec<Vec<Phase>> = st.steps.iter().map(|s| s.phases.iter().map(|p| p.phase).collect()).collect();
        use Phase::*;
        assert_eq!(phases, [vec![Forward, Backward, Optimizer], vec![Forward, Backward, Optimizer]]);
        assert_eq!((st.steps[0].start, st.steps[0].end, st.steps[1].start), (0, 7, 7));
        // Near miss: no optimizer step, the backward passes bound them.
        let snap = Rec::default().step(0, false).step(1, false).done();
        assert_eq!(describe(&snap), "2 steps (bounded by backward passes; no optimizer step seen)");
        // Neither: the program's step annotations, else no step.
        let mut r = Rec::default();
        for k in 0..2 {
            r.mark("ProfilerStep#7", true).alloc(k, FORWARD).free(k, FORWARD).mark("ProfilerStep#7", false);
        }
        assert_eq!(describe(&r.done()), "2 steps (from step annotations)");
        let snap = Rec::default().alloc(1, FORWARD).free(1, FORWARD).done();
        assert_eq!(
            describe(&snap),
            "no training step found (forward passes only: no backward pass, optimizer step or step annotation)"
        );
    }

    #[test]
    fn a_first_step_the_recording_began_inside_is_not_whole() {
        let complete = |snap: &Snapshot| steps(snap, 0).steps.iter().map(|s| s.complete).collect::<Vec<_>>();
        // Begun in the backward pass: it frees activations the trace never made.
        let mut r = Rec::default();
        r.free(0x9000, BACKWARD).alloc(0x200_0000, ADAM).free(0x200_0000, ADAM);
        assert_eq!(complete(&r.step(1, true).done()), [false, true]);
        // Near misses: begun in forward (all its activations made in the trace), or
        // with zero_grad.
        assert_eq!(complete(&Rec::default().step(0, true).done()), [true]);
        let mut r = Rec::default();
        r.free(0x9000, ZERO_GRAD).alloc(0x9000, FORWARD).free(0x9000, BACKWARD);
        assert_eq!(complete(&r.alloc(0x200_0000, ADAM).done()), [true]);
        // Begun in forward, but backward frees what the unrecorded part of it saved.
        let mut r = Rec::default();
        r.alloc(1, FORWARD).free(1, BACKWARD).free(0x9000, BACKWARD);
        assert_eq!(complete(&r.alloc(0x200_0000, ADAM).done()), [false]);
    }

    #[test]
    fn an_update_step_called_from_a_modules_forward_is_nested_in_it() {
        let nested: Frames =
            &[("/x/torch/optim/adam.py", 400, "_single_tensor_adam"), ("/u/model.py", 5, "forward"), MAIN];
        // Near miss: a forward called from inside the optimizer's step (a closure).
        let closure: Frames = &[("/u/model.py", 5, "forward"), ("/x/torch/optim/lbfgs.py", 300, "step"), MAIN];
        for (frames, inside) in [(nested, true), (closure, false), (ADAM, false)] {
            let mut r = Rec::default();
            r.alloc(1, FORWARD).free(1, BACKWARD).alloc(2, frames);
            let snap = r.done();
            let st = steps(&snap, 0);
            assert_eq!(st.steps.len(), 1, "{frames:?}");
            assert_eq!(step_inside_forward(&snap, 0, &st.steps[0]), inside, "{frames:?}");
        }
    }

    #[test]
    fn runs_apart_by_outside_entries_alone_bound_one_step() {
        use Phase::*;
        let run = |phase, start, end, zero_grad| PhaseRun { phase, start, end, zero_grad };
        // An optimizer step, a scheduler's few frees, more of the step; then zero_grad
        // between two optimizer runs, and a forward run between two more.
        let rle = [
            run(Optimizer, 0, 2, false),
            run(Outside, 2, 3, false),
            run(Optimizer, 3, 5, false),
            run(Outside, 5, 6, true),
            run(Optimizer, 6, 7, false),
            run(Forward, 7, 8, false),
            run(Optimizer, 8, 9, false),
        ];
        assert_eq!(joined_runs(&rle, Optimizer), [(0, 5), (6, 7), (8, 9)]);
        assert!(joined_runs(&rle, Backward).is_empty());
    }
}
