//! Memory by role: what each block of a device's memory is for — the model's
//! `parameters`, their `gradients`, the `optimizer_state` (Adam's two moments per
//! parameter), `activations` (made in forward, kept until backward), `temporaries` (freed
//! within the phase that made them), `inputs` (a batch and its targets) or `other`
//! (persistent buffers, KV caches, workspaces, anything the evidence does not decide).
//!
//! Every allocation of the trace and every block live before it gets a role, a
//! confidence (0–1) and the reason that decided it. Evidence, strongest first:
//!
//! * **phase and lifetime**, from [`mod@crate::steps`]: a block made in a backward pass and
//!   still live when the pass ends is a gradient; one made in the optimizer's step and
//!   kept after it is optimizer state; one made in forward and still live when backward
//!   starts, freed by the step's end (or the next step's), is an activation; one freed
//!   inside the phase that made it is a temporary;
//! * **identities**: a parameter has its gradient's size, so the blocks live before the
//!   backward pass (before the trace, or made while setting up) matching the gradients'
//!   sizes one for one are the parameters; optimizer state made before the first step
//!   (an optimizer that allocates its moments in its constructor) is recognised by its
//!   sizes being whole copies of the parameters' and its living across the steps. Before
//!   the trace, a block the first backward pass frees or whose frames show it made in a
//!   forward pass is neither (a saved activation or a workspace may share a parameter's
//!   size at one batch or sequence length, and must not change the answer there); a
//!   block still live when the trace's first backward pass makes every gradient is none
//!   of the last step's gradients (a parameter has one `.grad`); of two copies of the
//!   model's layer structure, the one a backward pass accumulates into (it makes and
//!   frees a block of each parameter's size, keeping none) is the gradients;
//! * **the layers of a forward pass** that no step bounds (a forward-only or inference
//!   recording, [`passes`]): a grad-enabled pass keeps memory in every layer to its end
//!   (activations), a `no_grad` / `inference_mode` pass frees each layer's output in the
//!   next (temporaries, no activations);
//! * **frames** only where neither decides (a block made while building the model, with
//!   no backward pass to confirm it, is a parameter at low confidence). Nothing is put in
//!   a role on a name alone.
//!
//! `by_role` gives, per role, the bytes held at the allocated peak (`at_peak`) and the
//! most held at any moment (`max`), over the same block lives as the timeline
//! ([`crate::lives`]).
//!
//! Principal types: [`DeviceRoles`] (the figures), [`Roles`] (each block's role),
//! [`Role`].

use std::collections::{BTreeMap, HashMap};

use fragscope_snapshot::{FxHashMap, Snapshot};
use serde::Serialize;

use crate::lives::{BlockLives, TracedLife, LIVE_AT_END};
use crate::steps::{self, Phase, StackEvidence, Steps, OPTIMIZER, WORKSPACE};
use crate::walk::LifeIndexParts;

pub mod passes;
pub mod structure;
use structure::Found;
pub use structure::Structure;

/// A step's backward and optimizer spans (entries `start..end`), and where its forward
/// starts.
type StepSpans = (Option<(usize, usize)>, Option<(usize, usize)>, Option<usize>);

/// What a block of memory is for (module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    Parameters,
    Gradients,
    OptimizerState,
    Activations,
    Temporaries,
    Inputs,
    Other,
}

impl Role {
    pub const ALL: [Role; 7] = [
        Role::Parameters,
        Role::Gradients,
        Role::OptimizerState,
        Role::Activations,
        Role::Temporaries,
        Role::Inputs,
        Role::Other,
    ];
    /// The name used in `--json` (`by_role`'s keys) and in text.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Parameters => "parameters",
            Role::Gradients => "gradients",
            Role::OptimizerState => "optimizer_state",
            Role::Activations => "activations",
            Role::Temporaries => "temporaries",
            Role::Inputs => "inputs",
            Role::Other => "other",
        }
    }
}

/// Why a block got its role: one reason per rule, with the rule's confidence.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Reason {
    ParamBeforeTraceMatchesGradient,
    ParamBeforeTraceFrames,
    ParamBeforeTraceCounted,
    ParamSetupMatchesGradient,
    ParamBuiltNoBackward,
    GradOutlivesBackward,
    GradOutlivesBackwardUnmatched,
    ParamReplacedInStep,
    OptReplacedInStep,
    OptMadeInStepKept,
    OptSetupCopiesOfParams,
    OptSetupOptimizerFrames,
    OptBeforeTraceCopiesOfParams,
    OptBeforeTraceFrames,
    OptBeforeTraceCounted,
    GradBeforeTraceFreedBeforeBackward,
    ActKeptForBackward,
    ActKeptLastStep,
    TempFreedInPhase,
    TempFreedBetweenSteps,

    InputBeforeForward,
    InputBeforePass,
    OtherOutlivesStep,
    OtherBackwardNoParameter,
    OtherWorkspace,
    OtherNoSteps,
    OtherBeforeTrace,
    OtherReplacesUnknown,
    ParamLayerStructure,
    ParamLayerStructureCasts,
    ParamModelStateCounted,
    OtherModelStateCopies,
    ActSavedInPass,
    TempFreedInPass,
    TempNoGradPass,
    OtherOutlivesNoGradPass,
    GradAccumulatedBeforeTrace,
    /// Last: the tally of [`summarize_with`] counts the reasons up to it.
    OtherUndecided,
}

impl Reason {
    fn role(self) -> Role {
        use Reason::*;
        match self {
            ParamBeforeTraceMatchesGradient
            | ParamBeforeTraceFrames
            | ParamBeforeTraceCounted
            | ParamSetupMatchesGradient
            | ParamBuiltNoBackward
            | ParamLayerStructure
            | ParamLayerStructureCasts
            | ParamModelStateCounted
            | ParamReplacedInStep => Role::Parameters,
            GradOutlivesBackward
            | GradOutlivesBackwardUnmatched
            | GradBeforeTraceFreedBeforeBackward
            | GradAccumulatedBeforeTrace => Role::Gradients,
            OptMadeInStepKept
            | OptReplacedInStep
            | OptSetupCopiesOfParams
            | OptSetupOptimizerFrames
            | OptBeforeTraceCopiesOfParams
            | OptBeforeTraceFrames
            | OptBeforeTraceCounted => Role::OptimizerState,
            ActKeptForBackward | ActKeptLastStep | ActSavedInPass => Role::Activations,
            TempFreedInPhase | TempFreedBetweenSteps | TempFreedInPass | TempNoGradPass => Role::Temporaries,
            InputBeforeForward | InputBeforePass => Role::Inputs,
            OtherOutlivesStep
            | OtherBackwardNoParameter
            | OtherWorkspace
            | OtherNoSteps
            | OtherBeforeTrace
            | OtherReplacesUnknown
            | OtherModelStateCopies
            | OtherOutlivesNoGradPass
            | OtherUndecided => Role::Other,
        }
    }
    /// How sure the rule is: identities and phase+lifetime together high, one of them
    /// alone lower, frames alone low.
    pub fn confidence(self) -> f64 {
        use Reason::*;
        match self {
            ParamBeforeTraceMatchesGradient | ParamSetupMatchesGradient => 0.9,
            ParamBuiltNoBackward => 0.4,
            ParamReplacedInStep | OptReplacedInStep => 0.85,
            GradOutlivesBackward => 0.9,
            GradOutlivesBackwardUnmatched => 0.6,
            OptMadeInStepKept => 0.9,
            OptSetupCopiesOfParams | OptBeforeTraceCopiesOfParams => 0.85,
            OptSetupOptimizerFrames => 0.6,
            ActKeptForBackward => 0.85,
            ActKeptLastStep => 0.5,
            TempFreedInPhase => 0.9,
            TempFreedBetweenSteps => 0.6,
            OtherNoSteps => 0.3,
            InputBeforeForward | InputBeforePass => 0.6,
            OtherOutlivesStep | OtherBackwardNoParameter => 0.4,
            OtherWorkspace => 0.9,
            OtherBeforeTrace | OtherUndecided | OtherReplacesUnknown => 0.3,
            ParamBeforeTraceFrames | OptBeforeTraceFrames => 0.85,
            // The totals are decided, the block's own role is not.
            ParamBeforeTraceCounted | OptBeforeTraceCounted => 0.5,
            GradBeforeTraceFreedBeforeBackward => 0.7,
            // Sizes and the backward pass's lifetimes together, no frame to confirm.
            GradAccumulatedBeforeTrace => 0.7,
            // Sizes alone: a repeated layer is strong evidence of a model, not of which
            // blocks of a size are its weights; casts at the reading layer confirm them.
            ParamLayerStructure => 0.75,
            ParamLayerStructureCasts => 0.85,
            ParamModelStateCounted | OtherModelStateCopies => 0.5,
            // Lifetime against the pass's layers (rule 8): whether the layers keep memory
            // tells grad mode, with no frame to confirm it.
            ActSavedInPass | TempNoGradPass | OtherOutlivesNoGradPass => 0.7,
            TempFreedInPass => 0.8,
        }
    }
    /// The evidence, in words.
    pub fn describe(self) -> &'static str {
        use Reason::*;
        match self {
            ParamBeforeTraceMatchesGradient => "live before the trace, one for one the size of a gradient",
            ParamSetupMatchesGradient => "made before the first backward pass and kept, one for one the size of a gradient",
            ParamBuiltNoBackward => "made while building the model (__init__, .to(), load_state_dict) and kept; no backward pass to confirm",
            GradOutlivesBackward => "made in a backward pass (autograd engine, AccumulateGrad) and still live when it ends, the size of a parameter",
            GradOutlivesBackwardUnmatched => "made in a backward pass and still live when it ends (no parameter of its size found)",
            OptMadeInStepKept => "made in the optimizer's step and kept after it",
            ParamReplacedInStep => "made in the optimizer's step and kept, replacing a parameter of its size freed in the same step (an out-of-place update)",
            OptReplacedInStep => "made in the optimizer's step and kept, replacing optimizer state of its size freed in the same step (an out-of-place update)",
            OtherWorkspace => "a library's workspace (cuBLAS's getNewWorkspace in its C++ frames)",
            OtherBackwardNoParameter => "made in a backward pass and kept, but no parameter has its size (a library workspace such as cuBLAS's, or a leak)",
            OptSetupCopiesOfParams => "made before the first step and kept across steps; their sizes are whole copies of the parameters' (one buffer per parameter per moment)",
            OptSetupOptimizerFrames => "made by the optimizer's constructor before the first step and kept",
            OptBeforeTraceCopiesOfParams => "live before the trace; their sizes are whole copies of the parameters', besides the parameters themselves",
            ActKeptForBackward => "made in forward and still live when backward starts, freed by the next step",
            ActKeptLastStep => "made in the last step's forward, still live when backward starts and at the end of the trace",
            TempFreedInPhase => "freed in the phase that made it",
            TempFreedBetweenSteps => "made and freed outside the steps' phases",
            OtherNoSteps => "made in a pass that no training step bounds, whose layers do not show whether it keeps memory for a backward pass (under three repeated layers found, or some layers' memory outlives the layers after them and some does not): activations cannot be told from temporaries",
            ActSavedInPass => "made in a grad-enabled forward pass that no training step bounds and kept through its layers (still live when the last layer starts, or made in it and live when the pass ends): every layer keeps memory, live bytes growing layer after layer (saved for backward)",
            TempFreedInPass => "made in a grad-enabled forward pass that no training step bounds and freed within its layers (before the last layer starts, or made in it and freed before the pass ends)",
            TempNoGradPass => "made in a forward pass under no_grad / inference_mode (no layer's memory outlives the next layer: nothing accumulates across layers, so no activations) and freed",
            OtherOutlivesNoGradPass => "made in a forward pass under no_grad / inference_mode and kept after it ends (its output, a cache)",
            InputBeforeForward => "made outside the steps' phases and still live when the next forward pass starts",
            InputBeforePass => "made before a forward pass that no training step bounds, still live when it starts and freed after it ends (a batch the pass reads)",
            OtherOutlivesStep => "made in forward and kept beyond the next step",
            OtherBeforeTrace => "live before the trace, not matched to a parameter or optimizer state",
            OtherUndecided => "no rule decided it",
            OtherReplacesUnknown => "made in the optimizer's step and kept, replacing a block of its size live before the trace whose role is not known (parameter or optimizer state)",
            ParamBeforeTraceFrames => "live before the trace, the size of a gradient, made while building the model (its frames); as many as the gradients of its size",
            OptBeforeTraceFrames => "live before the trace, the size of a gradient, made by the optimizer (torch/optim or an optimizer's step in its frames); whole copies of the parameters' sizes",
            ParamBeforeTraceCounted => "live before the trace among more blocks of a gradient's size than gradients (the optimizer's state, a BatchNorm's running statistics), without frames that tell them apart: counted by size (as many parameters as gradients of each size; the total is exact, which block is which cannot be told)",
            OptBeforeTraceCounted => "live before the trace with the parameters, both the sizes of the gradients and without frames that tell them apart: counted by size (the copies beyond the parameters; the totals are exact, which block is which cannot be told)",
            GradBeforeTraceFreedBeforeBackward => "live before the trace and freed outside every phase (zero_grad) before a backward pass that makes the gradients again; no more of its size than there are gradients",
            ParamLayerStructure => "kept to the end of the trace, made before it or while loading the model; its size is one of the model's layer structure (one multiset of sizes repeated once per layer, the vocabulary-sized matrices and norms outside the layers; model_state)",
            ParamLayerStructureCasts => "kept to the end of the trace, made before it or while loading the model; its size is one of the model's layer structure (model_state), and autocast makes a half-size cast of the layer weights at the layer that reads them",
            ParamModelStateCounted => "kept through the trace; one of several whole copies of the model's layer structure (model_state): as many counted as parameters as one copy holds (the total is exact, which copy is the weights cannot be told)",
            OtherModelStateCopies => "kept through the trace; the copies of the model's layer structure beyond the parameters (model_state): gradients or optimizer state, which the sizes do not tell apart",
            GradAccumulatedBeforeTrace => "kept through the trace; the one copy of the model's layer structure beyond the parameters (model_state), into which a whole backward pass that keeps no gradient accumulates them: it makes and frees a block of each parameter's size (AccumulateGrad adds the new gradient into the .grad live before the trace, in place)",
        }
    }
}

/// A block's role.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockRole {
    pub role: Role,
    pub reason: Reason,
}

impl BlockRole {
    fn of(reason: Reason) -> Self {
        BlockRole { role: reason.role(), reason }
    }
}

/// The role of every block of one device: `seeded[i]` of `lives.seeded[i]`, `traced[i]`
/// of `lives.traced[i]`.
#[derive(Clone, Debug, Default)]
pub struct Roles {
    pub seeded: Vec<BlockRole>,
    pub traced: Vec<BlockRole>,
    /// Out-of-place updates: traced block → the state from which it holds its role (the
    /// block it replaces is freed then); before, it counts as a temporary of the step.
    pub from_state: HashMap<usize, usize>,
    /// Roles whose totals the trace cannot decide, with why ([`RoleBytes::cannot_tell`]).
    pub cannot_tell: BTreeMap<Role, String>,
    /// The model's layer structure, where rule 7 read it ([`structure`]).
    pub model_state: Option<Structure>,
}

/// One reason's share of a role.
#[derive(Clone, Debug, Serialize)]
pub struct RoleEvidence {
    /// The rule that decided it; in JSON its words ([`Reason::describe`]).
    #[serde(serialize_with = "reason_words")]
    pub evidence: Reason,
    pub blocks: u64,
    /// Bytes of those blocks summed over their lives (each block once).
    pub bytes: u64,
    pub confidence: f64,
}

fn reason_words<S: serde::Serializer>(r: &Reason, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(r.describe())
}

/// Bytes one role held. In JSON (docs/json-schema.md), `at_peak` and `max` are `null`
/// when the total cannot be told (`cannot_tell`), and `found_at_peak`/`found_max` give
/// the bytes of the blocks given the role (the same figures; a lower bound then).
#[derive(Clone, Debug, Default)]
pub struct RoleBytes {
    /// At the allocated peak.
    pub at_peak: u64,
    /// The most the role held at any moment.
    pub max: u64,
    /// Blocks given the role (each once).
    pub blocks: u64,
    /// The blocks' confidences, weighted by their bytes (0 without blocks).
    pub confidence: f64,
    /// What decided it, most bytes first.
    pub evidence: Vec<RoleEvidence>,
    /// Set when the trace cannot tell the role's total: memory live before the trace
    /// whose role is not decided may hold more of it. `at_peak` and `max` then count only
    /// the blocks given the role (a lower bound), and this says why.
    pub cannot_tell: Option<String>,
}

impl Serialize for RoleBytes {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        // A total the trace cannot tell is not given as a number: a reader of `max` would
        // take the lower bound for the answer.
        let told = self.cannot_tell.is_none();
        let mut st = s.serialize_struct("RoleBytes", 8)?;
        st.serialize_field("at_peak", &told.then_some(self.at_peak))?;
        st.serialize_field("max", &told.then_some(self.max))?;
        st.serialize_field("found_at_peak", &self.at_peak)?;
        st.serialize_field("found_max", &self.max)?;
        st.serialize_field("blocks", &self.blocks)?;
        st.serialize_field("confidence", &self.confidence)?;
        st.serialize_field("evidence", &self.evidence)?;
        st.serialize_field("cannot_tell", &self.cannot_tell)?;
        st.end()
    }
}

/// Memory by role of one device (module doc).
#[derive(Clone, Debug, Serialize)]
pub struct DeviceRoles {
    pub device: i64,
    /// The steps, in words (`steps::Steps::describe`), and how many.
    pub steps: String,
    pub step_count: usize,
    /// State of the allocated peak (entries applied), and the bytes allocated then.
    pub peak_state: usize,
    pub peak_allocated: u64,
    /// Keyed by [`Role::as_str`]; every role present.
    pub by_role: BTreeMap<&'static str, RoleBytes>,
    /// Tensor bytes by role just before the trace's first `oom` entry (`analyze` fills
    /// it; `null` without an OOM).
    pub at_oom: Option<BTreeMap<&'static str, u64>>,
    /// The model's layer structure and its copies, where the blocks' sizes show it on a
    /// recording without a backward pass (rule 7); absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model_state: Option<Structure>,
}

/// The roles of one device's blocks (module doc).
pub fn classify(snap: &Snapshot, lives: &BlockLives, st: &Steps) -> Roles {
    let mut ev = StackEvidence::new(snap);
    classify_with(snap, lives, st, &mut ev, &LifeIndex::new(snap, lives), None)
}

/// What classifying and summing the roles both read about the lives, made once: each
/// traced block's tensor size, and the lives by the entry that ended them.
#[cfg_attr(test, derive(Debug, PartialEq))]
struct LifeIndex {
    /// `req[i]`: the request of `lives.traced[i]` (its `alloc` entry's size), read in
    /// `alloc` order once rather than from the trace at every use.
    req: Vec<u64>,
    ends: Ends,
}

impl LifeIndex {
    fn new(snap: &Snapshot, lives: &BlockLives) -> Self {
        let trace = snap.trace(lives.device);
        LifeIndex {
            req: lives.traced.iter().map(|l| trace[l.alloc()].size).collect(),
            ends: Ends::new(lives, trace.len()),
        }
    }

    /// The index the lifetime walk made as it went ([`crate::walk::LifeIndexParts`]),
    /// the same as [`LifeIndex::new`]'s: `summary` reads it there, where the requests
    /// and the ends are at hand, instead of reading the trace again.
    fn from_walk_or_new(snap: &Snapshot, lives: &BlockLives, parts: Option<LifeIndexParts>) -> Self {
        match parts {
            Some(p) => LifeIndex::from_walk(lives, p),
            None => LifeIndex::new(snap, lives),
        }
    }

    fn from_walk(lives: &BlockLives, parts: LifeIndexParts) -> Self {
        let LifeIndexParts { req, by_end } = parts;
        LifeIndex { req, ends: Ends::from_walk(lives, by_end) }
    }
}

/// A life found by [`Ends`]: an index into `lives.traced` or `lives.seeded`.
#[derive(Clone, Copy)]
enum Ended {
    Traced(usize),
    Seeded(usize),
}

/// The lives by the entry that ended them. Both the sweep of [`summarize_with`] and the
/// out-of-place updates of [`classify`] take the lives in the order they ended; sorting
/// millions of lives by their ends was a tenth of `summary`'s time on a long trace. The
/// lifetime walk ends at most one block per entry (an `alloc` the block its address held,
/// a free the block it frees), and ends them in entry order: a list of the lives in that
/// order holds them, each life's entry read from the life itself (4 bytes a life ended;
/// a slot per entry, as this was, took 4 bytes per entry of the trace, 25 MB of
/// `summary`'s peak on a 6.4 M-entry trace). A second life at one entry (lives not made
/// by that walk) goes to a sorted list.
#[cfg_attr(test, derive(Debug, PartialEq))]
struct Ends {
    /// The lives with an entry of their own, in the order of those entries (one life per
    /// entry), each numbered as a traced index, or the number of traced lives + a seeded
    /// index. Empty when that numbering does not fit 32 bits.
    by_end: Vec<u32>,
    /// (entry, life as numbered in `by_end`) of the lives that found their entry taken
    /// (or no room in `by_end`), sorted.
    more: Vec<(usize, usize)>,
    traced: usize,
}

impl Ends {
    fn new(lives: &BlockLives, entries: usize) -> Self {
        let traced = lives.traced.len();
        let fits = traced + lives.seeded.len() < u32::MAX as usize;
        // A slot per entry while the lives are placed (they come in `alloc` order), read
        // out in entry order.
        let mut slot = vec![0u32; if fits { entries } else { 0 }];
        let mut more = Vec::new();
        let mut put = |end: usize, k: usize| {
            if end == LIVE_AT_END {
                return;
            }
            match slot.get_mut(end) {
                Some(s) if *s == 0 => *s = k as u32 + 1,
                _ => more.push((end, k)),
            }
        };
        for (i, l) in lives.traced.iter().enumerate() {
            put(l.end(), i);
        }
        for (j, b) in lives.seeded.iter().enumerate() {
            put(b.end, traced + j);
        }
        more.sort_unstable();
        let by_end = slot.iter().filter(|&&k| k != 0).map(|&k| k - 1).collect();
        Ends { by_end, more, traced }
    }

    /// [`Ends`] from the lifetime walk's list (`by_end`: the traced lives in the order of
    /// the entries that ended them) and the seeded lives' ends, placed as [`Ends::new`]
    /// places them: each at its entry when no life holds that entry yet, else in `more`.
    fn from_walk(lives: &BlockLives, mut by_end: Vec<u32>) -> Self {
        let traced = lives.traced.len();
        let mut more = Vec::new();
        // The seeded lives that take an entry of their own, by entry; the first of them
        // (in seeded order) at an entry no traced life ended.
        let mut own: Vec<(usize, u32)> = Vec::new();
        let mut taken: FxHashMap<usize, ()> = FxHashMap::default();
        for (j, b) in lives.seeded.iter().enumerate().filter(|(_, b)| b.end != LIVE_AT_END) {
            let k = traced + j;
            let at = by_end.partition_point(|&t| lives.traced[t as usize].end() < b.end);
            let traced_there = by_end.get(at).is_some_and(|&t| lives.traced[t as usize].end() == b.end);
            if k < u32::MAX as usize && !traced_there && taken.insert(b.end, ()).is_none() {
                own.push((b.end, k as u32));
            } else {
                more.push((b.end, k));
            }
        }
        if !own.is_empty() {
            own.sort_unstable();
            let mut merged = Vec::with_capacity(by_end.len() + own.len());
            let mut o = own.into_iter().peekable();
            for t in by_end {
                let e = lives.traced[t as usize].end();
                while let Some(x) = o.next_if(|x| x.0 < e) {
                    merged.push(x.1);
                }
                merged.push(t);
            }
            merged.extend(o.map(|x| x.1));
            by_end = merged;
        }
        more.sort_unstable();
        Ends { by_end, more, traced }
    }

    fn life(&self, k: usize) -> Ended {
        if k < self.traced {
            Ended::Traced(k)
        } else {
            Ended::Seeded(k - self.traced)
        }
    }

    /// The entry that ended life `k` (as `by_end` numbers them).
    #[inline(always)]
    fn end_of(&self, lives: &BlockLives, k: u32) -> usize {
        let k = k as usize;
        if k < self.traced {
            lives.traced[k].end()
        } else {
            lives.seeded[k - self.traced].end
        }
    }

    /// Every life that an entry of `entries` ended, with that entry.
    fn each_in(&self, lives: &BlockLives, entries: std::ops::Range<usize>, mut f: impl FnMut(usize, Ended)) {
        let lo = self.by_end.partition_point(|&k| self.end_of(lives, k) < entries.start);
        for &k in &self.by_end[lo..] {
            let e = self.end_of(lives, k);
            if e >= entries.end {
                break;
            }
            f(e, self.life(k as usize));
        }
        let from = self.more.partition_point(|x| x.0 < entries.start);
        for &(e, k) in self.more[from..].iter().take_while(|x| x.0 < entries.end) {
            f(e, self.life(k));
        }
    }
}

/// [`Steps::step_of`] for entries met in increasing order (the lives, in `alloc` order):
/// a cursor over the steps (in `start` order) instead of a binary search per block,
/// which was two fifths of classifying a long trace.
struct StepCursor<'a> {
    steps: &'a [steps::Step],
    /// The steps that start at or before the last entry asked:
    /// `steps.partition_point(|s| s.start <= entry)`.
    started: usize,
}

impl<'a> StepCursor<'a> {
    fn new(st: &'a Steps) -> Self {
        StepCursor { steps: &st.steps, started: 0 }
    }

    /// `st.step_of(entry)`, for `entry` no less than the one asked before.
    #[inline]
    fn at(&mut self, entry: usize) -> Option<usize> {
        while self.steps.get(self.started).is_some_and(|s| s.start <= entry) {
            self.started += 1;
        }
        self.started.checked_sub(1).filter(|&k| entry < self.steps[k].end)
    }
}

/// The roles of the lives of `lives` (module doc): the rules in order, evidence strongest
/// first, each later rule reading the roles the earlier ones gave.
fn classify_with(
    snap: &Snapshot,
    lives: &BlockLives,
    st: &Steps,
    ev: &mut StackEvidence,
    ix: &LifeIndex,
    layered: Option<passes::Layered>,
) -> Roles {
    let mut c = Classifier::new(snap, lives, st, ev, ix, layered);
    c.workspaces_before_trace();
    let found = c.by_phase_and_lifetime();
    let params = c.parameters(&found);
    c.unmatched_gradients(&found.grads, &params.sizes);
    let first_opt = c.spans.iter().find_map(|s| s.1);
    if let Some((os, _)) = first_opt.filter(|_| !params.sizes.is_empty()) {
        c.optimizer_state_made_in_setup(&found.outside, &params.sizes, os);
        c.optimizer_state_before_trace(&params.sizes, os);
    }
    let (from_state, replace_unknown) = c.out_of_place_updates(&found.kept);
    c.outside_the_phases(&found.outside, params.first_bwd.is_none());
    let model =
        if params.sizes.is_empty() && params.grad_sizes.is_empty() { c.layer_structure() } else { Found::Nothing };
    c.forward_passes();
    let cannot_tell = c.cannot_tell(&params, &replace_unknown, &model);
    let model_state = match model {
        Found::One(s) => Some(s),
        _ => None,
    };
    Roles { seeded: c.seeded, traced: c.traced, from_state, cannot_tell, model_state }
}

/// What the classifier's rules read (the lives, the steps, the frames) and the roles
/// they give: each block's role so far, which the later rules read and refine.
struct Classifier<'a, 'e> {
    snap: &'a Snapshot,
    lives: &'a BlockLives,
    st: &'a Steps,
    ev: &'a mut StackEvidence<'e>,
    /// Identities compare tensor sizes (the requests): a block can be larger than its
    /// tensor (a large-pool block is not split for a remainder of 1 MiB or less), and a
    /// parameter and its gradient need not land in blocks of one size.
    req: &'a [u64],
    ends: &'a Ends,
    /// Entries in the device's trace.
    n: usize,
    /// Per step: its backward and optimizer spans, and where its forward starts.
    spans: Vec<StepSpans>,
    /// The forward passes no step holds (rules 5 and 8), entries `start..end`.
    passes: Vec<(usize, usize)>,
    /// Rule 8's passes with their layers ([`passes::layered`] of `passes`) when the
    /// caller found them beside the lifetime walk (with `passes`); else rule 8 finds them.
    layered: Option<Vec<passes::Pass>>,
    traced: Vec<BlockRole>,
    seeded: Vec<BlockRole>,
}

/// What rule 1 ([`Classifier::by_phase_and_lifetime`]) leaves for the later rules: the
/// blocks they look at again, in `alloc` order, so that they need not walk every block.
/// (Counts by size in FxHashMaps, here and below: SipHash on the sizes was a tenth of
/// classifying.)
struct PhaseFindings {
    /// Per step, the gradients its backward pass kept, counted by request.
    grads_by_step: Vec<FxHashMap<u64, usize>>,
    /// The blocks made outside the phases (rules 2, 3 and 5).
    outside: Vec<usize>,
    /// The gradients (rule 2 asks whether a parameter has their size).
    grads: Vec<usize>,
    /// Per step, with their `alloc`, the blocks its optimizer made and kept (the
    /// out-of-place updates of rule 4; the `alloc`s read here, not from a few scattered
    /// lives there).
    kept: Vec<Vec<(usize, usize)>>,
}

/// What rule 2 ([`Classifier::parameters`]) found.
struct Parameters {
    /// The step whose gradients give the parameters' sizes ([`gradient_step`]).
    grad_step: Option<usize>,
    /// That step's gradients, counted by request.
    grad_sizes: FxHashMap<u64, usize>,
    /// Whether every gradient found a parameter.
    matched: bool,
    /// The parameters found, counted by request.
    sizes: FxHashMap<u64, usize>,
    /// Where the first backward pass starts.
    first_bwd: Option<usize>,
}

impl<'a, 'e> Classifier<'a, 'e> {
    fn new(
        snap: &'a Snapshot,
        lives: &'a BlockLives,
        st: &'a Steps,
        ev: &'a mut StackEvidence<'e>,
        ix: &'a LifeIndex,
        layered: Option<passes::Layered>,
    ) -> Self {
        let none = BlockRole::of(Reason::OtherUndecided);
        let (passes, layered) = match layered {
            Some(l) => (l.runs, Some(l.passes)),
            None => (passes::unbounded(st), None),
        };
        Classifier {
            snap,
            passes,
            layered,
            lives,
            st,
            ev,
            req: &ix.req,
            ends: &ix.ends,
            n: snap.trace(lives.device).len(),
            spans: st
                .steps
                .iter()
                .map(|s| (s.span(Phase::Backward), s.span(Phase::Optimizer), s.span(Phase::Forward).map(|f| f.0)))
                .collect(),
            traced: crate::hugepages::filled(lives.traced.len(), none),
            seeded: vec![none; lives.seeded.len()],
        }
    }

    /// Rule 0. Library workspaces live before the trace, from their C++ frames
    /// (cuBLAS's `getNewWorkspace`): never a tensor of the model, whatever their size
    /// says. (Traced workspaces are found by rule 1, as it meets them.)
    fn workspaces_before_trace(&mut self) {
        for (i, b) in self.lives.seeded.iter().enumerate() {
            if self.ev.of(b.stack) & WORKSPACE != 0 {
                self.seeded[i] = BlockRole::of(Reason::OtherWorkspace);
            }
        }
    }

    /// Rule 1. Blocks made inside a phase, by phase and lifetime: made in a backward
    /// pass and still live when it ends, a gradient; made in the optimizer's step and
    /// kept after it, optimizer state; made in forward and live when backward starts, an
    /// activation; freed inside the phase that made it, a temporary. Blocks made outside
    /// the phases wait for the later rules (once parameters are known).
    // Not inlined: the one rule that visits every block shows apart in a profile (the
    // instructions are the same either way).
    #[inline(never)]
    fn by_phase_and_lifetime(&mut self) -> PhaseFindings {
        let (lives, st, req, n) = (self.lives, self.st, self.req, self.n);
        let trace = self.snap.trace(lives.device);
        let spans: &[StepSpans] = &self.spans;
        // The roles and the findings in vectors of this function's own while the loop
        // runs (as the rules were first written): behind `self` or in one struct, the
        // stack evidence's calls would make the loop read their addresses and lengths
        // again per block (a few percent of classifying).
        let (mut traced, ev) = (std::mem::take(&mut self.traced), &mut *self.ev);
        let mut grads_by_step: Vec<FxHashMap<u64, usize>> = vec![FxHashMap::default(); st.steps.len()];
        let (mut outside, mut grads) = (Vec::new(), Vec::new());
        let mut kept: Vec<Vec<(usize, usize)>> = vec![Vec::new(); st.steps.len()];
        let mut step_of = StepCursor::new(st);
        for (i, l) in lives.traced.iter().enumerate() {
            let a = l.alloc();
            let e = l.end(); // LIVE_AT_END is past every entry
            let k = step_of.at(a);
            if ev.of(l.stack(trace)) & WORKSPACE != 0 {
                traced[i] = BlockRole::of(Reason::OtherWorkspace);
                continue;
            }
            let reason = match (st.phase_at(a), k) {
                (Phase::Backward, Some(k)) => {
                    let reason = made_in_backward(st, spans, k, e);
                    if reason == Reason::GradOutlivesBackward {
                        *grads_by_step[k].entry(req[i]).or_default() += 1;
                        grads.push(i);
                    }
                    reason
                }
                (Phase::Optimizer, Some(k)) => {
                    let reason = made_in_optimizer(st, spans, k, e);
                    if reason == Reason::OptMadeInStepKept {
                        kept[k].push((i, a));
                    }
                    reason
                }
                (Phase::Forward, Some(k)) => made_in_forward(st, spans, n, k, e),
                (Phase::Outside, _) => {
                    outside.push(i); // below, once parameters are known
                    continue;
                }
                // A phase outside every step (work after the last step, or a trace without
                // steps): nothing bounds the phase, so activations cannot be told from
                // temporaries (a forward-only trace is one long forward "phase").
                (_, None) => Reason::OtherNoSteps,
            };
            traced[i] = BlockRole::of(reason);
        }
        self.traced = traced;
        PhaseFindings { grads_by_step, outside, grads, kept }
    }

    /// Rule 2. Parameters: the gradients' sizes, one for one, among the blocks live at
    /// the first backward pass and made before it (before the trace first, then in
    /// set-up order: a model's parameters are made before its optimizer's buffers). A
    /// parameter's gradient has its size; nothing else ties a block to a parameter as
    /// surely.
    fn parameters(&mut self, found: &PhaseFindings) -> Parameters {
        let grad_step = gradient_step(self.st, &found.grads_by_step);
        let grad_sizes: FxHashMap<u64, usize> = grad_step.map(|k| found.grads_by_step[k].clone()).unwrap_or_default();
        let first_bwd = self.spans.iter().find_map(|s| s.0).map(|b| b.0);
        let mut p = Parameters { grad_step, grad_sizes, matched: false, sizes: FxHashMap::default(), first_bwd };
        let Some(fb) = first_bwd else { return p };
        let (lives, req) = (self.lives, self.req);
        let mut left = p.grad_sizes.clone();
        let bwd_starts: Vec<usize> = self.spans.iter().filter_map(|s| s.0.map(|b| b.0)).collect();
        let live_at_fb = lineages_live_at(lives, &found.kept, &self.spans, &self.traced, req, self.ends, fb);
        // The gradients the trace's first backward pass keeps, by request.
        let first_made = self.spans.iter().position(|s| s.0.is_some()).map(|k| &found.grads_by_step[k]);
        let bwd = Backwards { starts: &bwd_starts, first_made: first_made.unwrap_or(&p.grad_sizes) };
        before_trace(lives, self.st, self.ev, &p.grad_sizes, &bwd, &live_at_fb, &mut self.seeded);
        for (i, b) in lives.seeded.iter().enumerate() {
            if self.seeded[i].role == Role::Parameters {
                if let Some(c) = left.get_mut(&b.request).filter(|c| **c > 0) {
                    *c -= 1;
                }
                *p.sizes.entry(b.request).or_default() += 1;
            }
        }
        for &i in &found.outside {
            let l = &lives.traced[i];
            if l.alloc() >= fb {
                break;
            }
            if l.end() >= fb && self.traced[i].reason == Reason::OtherUndecided {
                if let Some(c) = left.get_mut(&req[i]).filter(|c| **c > 0) {
                    *c -= 1;
                    self.traced[i] = BlockRole::of(Reason::ParamSetupMatchesGradient);
                    *p.sizes.entry(req[i]).or_default() += 1;
                }
            }
        }
        // A size no parameter has, kept from the gradient step's backward pass but made
        // in no other whole step's backward pass that makes gradients, is no gradient (a
        // parameter's gradient is made again in every step after `zero_grad` frees it;
        // cuBLAS's workspace on the autograd thread is made once, at its first matmul:
        // gpt-s512's 32 MiB). Rule 2, continued, makes it `other`; the parameters match
        // the gradients without it. (One step, or gradients kept across steps, leave
        // nothing to compare: such a size still leaves the match undecided.)
        let again: Vec<&FxHashMap<u64, usize>> = (0..found.grads_by_step.len())
            .filter(|&k| Some(k) != grad_step && backward_whole(self.st, k) && !found.grads_by_step[k].is_empty())
            .map(|k| &found.grads_by_step[k])
            .collect();
        let made_once =
            |s: &u64| !p.sizes.contains_key(s) && !again.is_empty() && again.iter().all(|g| !g.contains_key(s));
        p.matched = !p.grad_sizes.is_empty() && left.iter().all(|(s, &c)| c == 0 || made_once(s));
        p
    }

    /// Rule 2, continued. Kept blocks of a backward pass that no parameter's size
    /// explains are not gradients (cuBLAS makes its workspace on the autograd thread's
    /// first matmul); without any parameter found, they stay gradients at lower
    /// confidence.
    fn unmatched_gradients(&mut self, grads: &[usize], param_sizes: &FxHashMap<u64, usize>) {
        for &i in grads {
            if !param_sizes.contains_key(&self.req[i]) {
                self.traced[i] = BlockRole::of(if param_sizes.is_empty() {
                    Reason::GradOutlivesBackwardUnmatched
                } else {
                    Reason::OtherBackwardNoParameter
                });
            }
        }
    }

    /// Rule 3. Optimizer state made before the first step (an optimizer that allocates
    /// its moments in its constructor): made outside the phases before the first
    /// optimizer step (entry `os`), live when it starts, parameter-sized, and whole
    /// copies of the parameters' sizes; failing the copies, those the optimizer's frames
    /// made.
    fn optimizer_state_made_in_setup(&mut self, outside: &[usize], param_sizes: &FxHashMap<u64, usize>, os: usize) {
        let (lives, req) = (self.lives, self.req);
        let trace = self.snap.trace(lives.device);
        let setup: Vec<usize> = outside
            .iter()
            .copied()
            .take_while(|&i| lives.traced[i].alloc() < os)
            .filter(|&i| {
                self.traced[i].reason == Reason::OtherUndecided
                    && lives.traced[i].end() >= os
                    && param_sizes.contains_key(&req[i])
            })
            .collect();
        let mut found: FxHashMap<u64, usize> = FxHashMap::default();
        for &i in &setup {
            *found.entry(req[i]).or_default() += 1;
        }
        if whole_copies(param_sizes, &found) {
            for &i in &setup {
                self.traced[i] = BlockRole::of(Reason::OptSetupCopiesOfParams);
            }
        } else {
            for &i in &setup {
                if self.ev.mentions(lives.traced[i].stack(trace), "optim") {
                    self.traced[i] = BlockRole::of(Reason::OptSetupOptimizerFrames);
                }
            }
        }
    }

    /// Rule 3, before the trace: the blocks live before it that no rule decided, live
    /// when the first optimizer step (entry `os`) starts and parameter-sized, when they
    /// are whole copies of the parameters' sizes.
    fn optimizer_state_before_trace(&mut self, param_sizes: &FxHashMap<u64, usize>, os: usize) {
        let lives = self.lives;
        // Not a block whose frames show it made in another phase (a forward pass's
        // workspace), as in `before_trace`.
        let before: Vec<usize> = (0..lives.seeded.len())
            .filter(|&i| {
                self.seeded[i].reason == Reason::OtherUndecided
                    && lives.seeded[i].end >= os
                    && param_sizes.contains_key(&lives.seeded[i].request)
            })
            .filter(|&i| open_to(self.ev.of(lives.seeded[i].stack), Role::OptimizerState))
            .collect();
        let mut found: FxHashMap<u64, usize> = FxHashMap::default();
        for &i in &before {
            *found.entry(lives.seeded[i].request).or_default() += 1;
        }
        if whole_copies(param_sizes, &found) {
            for &i in &before {
                self.seeded[i] = BlockRole::of(Reason::OptBeforeTraceCopiesOfParams);
            }
        }
    }

    /// Rule 4. Out-of-place updates: a block the optimizer's step makes and keeps takes
    /// the role of the parameter or optimizer state of its size that the same step
    /// frees, in order (an optimizer visits its parameters in one order every step).
    /// Steps in order, so that the roles carry from step to step. Gives
    /// [`Roles::from_state`], and the blocks that replace one of unknown role (rule 6).
    fn out_of_place_updates(&mut self, kept: &[Vec<(usize, usize)>]) -> (HashMap<usize, usize>, Vec<usize>) {
        let mut from_state: HashMap<usize, usize> = HashMap::new();
        let mut replace_unknown = Vec::new();
        // `kept` has a list per step, as `spans` an entry.
        for (k, kept) in kept.iter().enumerate() {
            let Some((os, oe)) = self.spans[k].1 else { continue };
            let mut freed = self.freed_in_optimizer(os, oe);
            for &(i, alloc) in kept {
                if alloc < os || alloc >= oe || self.traced[i].reason != Reason::OptMadeInStepKept {
                    continue;
                }
                if let Some((old_end, was)) = freed.get_mut(&self.req[i]).and_then(Vec::pop) {
                    if old_end > alloc {
                        from_state.insert(i, old_end + 1);
                    }
                    self.traced[i] = BlockRole::of(successor(was));
                    if self.traced[i].reason == Reason::OtherReplacesUnknown {
                        replace_unknown.push(i);
                    }
                }
            }
        }
        (from_state, replace_unknown)
    }

    /// For rule 4: the parameters, optimizer state and blocks of unknown role that the
    /// optimizer phase `os..oe` frees, by request, earliest last (popped from the back).
    /// The blocks come by the entry that ended them ([`Ends`]), so that each step looks
    /// only at those its optimizer phase frees (not at every block: a long run has
    /// thousands of steps).
    fn freed_in_optimizer(&self, os: usize, oe: usize) -> FxHashMap<u64, Vec<(usize, Reason)>> {
        let mut freed: FxHashMap<u64, Vec<(usize, Reason)>> = FxHashMap::default();
        self.ends.each_in(self.lives, os..oe, |end, life| {
            let (r, size) = match life {
                Ended::Seeded(i) => (self.seeded[i], self.lives.seeded[i].request),
                Ended::Traced(i) => (self.traced[i], self.req[i]),
            };
            // A block live before the trace that no rule decided, replaced here: its
            // successor cannot be told either (parameter or optimizer state).
            let unknown = match life {
                Ended::Seeded(_) => r.reason == Reason::OtherUndecided,
                Ended::Traced(_) => r.reason == Reason::OtherReplacesUnknown,
            };
            if matches!(r.role, Role::Parameters | Role::OptimizerState) || unknown {
                freed.entry(size).or_default().push((end, r.reason));
            }
        });
        // Sorted by (end, role): the order the blocks were found in does not matter.
        for v in freed.values_mut() {
            v.sort_unstable();
            v.reverse(); // popped from the back: earliest first
        }
        freed
    }

    /// Rule 5. The rest made outside the phases: inputs when live as the next forward
    /// pass starts, temporaries when freed before it, parameters at low confidence when
    /// made while building a model that no backward pass confirms (`no_backward`). The
    /// blocks live before the trace that no rule decided are left `other`, or such
    /// parameters by the frames a ring buffer keeps.
    fn outside_the_phases(&mut self, outside: &[usize], no_backward: bool) {
        let (lives, n) = (self.lives, self.n);
        let trace = self.snap.trace(lives.device);
        let forward_starts: Vec<usize> = self.spans.iter().filter_map(|s| s.2).collect();
        for &i in outside {
            let l = &lives.traced[i];
            if self.traced[i].reason != Reason::OtherUndecided {
                continue;
            }
            let next_fwd = forward_starts.get(forward_starts.partition_point(|&f| f <= l.alloc())).copied();
            let reason = match next_fwd {
                Some(f) if l.end() >= f => {
                    if self.ev.mentions(l.stack(trace), "__init__") {
                        Reason::OtherUndecided
                    } else {
                        Reason::InputBeforeForward
                    }
                }
                Some(_) => Reason::TempFreedBetweenSteps,
                None if self.read_by_pass(l.alloc(), l.end()) => Reason::InputBeforePass,
                None if no_backward && l.end() == LIVE_AT_END && built_model(self.ev, l.stack(trace)) => {
                    Reason::ParamBuiltNoBackward
                }
                None if l.end() < n => Reason::TempFreedBetweenSteps,
                None => Reason::OtherUndecided,
            };
            self.traced[i] = BlockRole::of(reason);
        }
        let ev = &mut *self.ev;
        for (i, r) in self.seeded.iter_mut().enumerate().filter(|(_, r)| r.reason == Reason::OtherUndecided) {
            // The frames a ring buffer keeps say the same as a traced block's would.
            let b = &lives.seeded[i];
            *r = BlockRole::of(if no_backward && b.end == LIVE_AT_END && built_model(ev, b.stack) {
                Reason::ParamBuiltNoBackward
            } else {
                Reason::OtherBeforeTrace
            });
        }
    }

    /// For rule 5: whether a block made at entry `alloc` and freed at `end` is a batch that
    /// a forward pass no step holds reads: live when the next such pass starts, freed after
    /// it ends (and before the trace does).
    fn read_by_pass(&self, alloc: usize, end: usize) -> bool {
        let next = self.passes.partition_point(|p| p.0 <= alloc);
        self.passes.get(next).is_some_and(|&(s, e)| end >= s.max(e) && end < self.n)
    }

    /// Rule 8. Forward passes that no training step bounds ([`passes`]): the blocks made
    /// in one that no rule decided, by what the pass's layers keep. Grad-enabled, those
    /// still live when the pass ends are activations and those freed in it temporaries;
    /// under `no_grad` / `inference_mode`, those freed are temporaries and those kept
    /// after the pass `other`. A pass whose layers do not tell stays `other`.
    fn forward_passes(&mut self) {
        let layered = match self.layered.take() {
            Some(l) => l,
            None => passes::layered(self.snap.trace(self.lives.device), self.passes.clone()).passes,
        };
        for p in &layered {
            self.forward_pass(p.start, p.end, &p.layers);
        }
    }

    /// For rule 8: one pass `start..end` with its layers. Grad-enabled, a block made
    /// before the last layer starts is an activation when still live then, one made
    /// later when still live as the pass ends; the rest temporaries. The blocks no
    /// earlier rule decided are read from the roles twice (to judge the pass, then to
    /// decide them), not listed: the list of a 2.2 M-life pass was 17 MB of fresh pages.
    /// A long pass is read in two halves on two threads (a forward-only trace can be one
    /// pass of millions of lives, the longest part of `summary`'s roles, while the
    /// steps' thread has ended its work).
    fn forward_pass(&mut self, start: usize, end: usize, layers: &[(usize, usize)]) {
        /// Below this many lives a pass is read on one thread.
        const HALVES_FROM: usize = 1 << 16;
        let lives = self.lives;
        let req = self.req;
        let from = lives.traced.partition_point(|l| l.alloc() < start);
        let to = from + lives.traced[from..].partition_point(|l| l.alloc() < end);
        let mid = (to - from >= HALVES_FROM && crate::par::threads() >= 2).then_some(from + (to - from) / 2);
        let open = |r: &BlockRole| r.reason == Reason::OtherNoSteps;
        let traced = &self.traced;
        let tally =
            |a: usize, b: usize| passes::kept_by_layer(lives, req, (a..b).filter(|&i| open(&traced[i])), layers);
        let kept = match mid {
            None => tally(from, to),
            Some(mid) => {
                let (mut first, second) = std::thread::scope(|s| {
                    let first = s.spawn(|| tally(from, mid));
                    let second = tally(mid, to);
                    (first.join().expect("rule 8's thread panicked"), second)
                });
                for (x, y) in first.iter_mut().zip(second) {
                    *x += y;
                }
                first
            }
        };
        let grad = match passes::verdict(&kept) {
            passes::PassKind::Undecided => return,
            kind => kind == passes::PassKind::Grad,
        };
        let mark = layers.last().map_or(end, |l| l.0);
        let decide = |lives: &[TracedLife], roles: &mut [BlockRole]| {
            for (l, r) in lives.iter().zip(roles) {
                if !open(r) {
                    continue;
                }
                let kept = if l.alloc() < mark { l.end() >= mark } else { l.end() >= end };
                *r = BlockRole::of(match (grad, kept) {
                    (true, true) => Reason::ActSavedInPass,
                    (true, false) => Reason::TempFreedInPass,
                    // `no_grad`: kept past the pass's end or not.
                    (false, _) if l.end() >= end => Reason::OtherOutlivesNoGradPass,
                    (false, _) => Reason::TempNoGradPass,
                });
            }
        };
        let (lv, rs) = (&lives.traced[from..to], &mut self.traced[from..to]);
        match mid {
            None => decide(lv, rs),
            Some(mid) => {
                let ((l1, l2), (r1, r2)) = (lv.split_at(mid - from), rs.split_at_mut(mid - from));
                std::thread::scope(|s| {
                    s.spawn(|| decide(l1, r1));
                    decide(l2, r2);
                });
            }
        }
    }

    /// Rule 7. The model's layer structure, on a recording whose backward passes give no
    /// parameter sizes (forward-only, inference, or begun after training): the blocks kept
    /// through the trace that no rule decided, made before it (or, when the recording
    /// holds the whole history, before the first forward pass), grouped by size
    /// ([`structure::find`]). One structure of one copy: its blocks are the parameters;
    /// of `k` copies: one copy's worth of each size counted as the parameters and the
    /// rest gradients or optimizer state, undecided (rule 6 says so). Two models' layers
    /// decide nothing.
    fn layer_structure(&mut self) -> Found {
        let (lives, req) = (self.lives, self.req);
        let trace = self.snap.trace(lives.device);
        // Before the trace: blocks whose frames (where a ring buffer kept them) do not
        // say they were made in a pass (an activation, a library's workspace made at a
        // pass's first matmul).
        let seeded: Vec<usize> = (0..lives.seeded.len())
            .filter(|&i| {
                let b = &lives.seeded[i];
                b.end == LIVE_AT_END
                    && match self.seeded[i].reason {
                        Reason::ParamBuiltNoBackward => true,
                        Reason::OtherBeforeTrace => self.ev.of(b.stack) & (steps::PHASES | WORKSPACE) == 0,
                        _ => false,
                    }
            })
            .collect();
        // Where frames show blocks being built with the model, a block whose frames do
        // not is none of its weights (a workspace, a batch).
        let built = |r: &BlockRole| r.reason == Reason::ParamBuiltNoBackward;
        let seeded: Vec<usize> = if seeded.iter().any(|&i| built(&self.seeded[i])) {
            seeded.into_iter().filter(|&i| built(&self.seeded[i]) || lives.seeded[i].stack.is_none()).collect()
        } else {
            seeded
        };
        // A whole history: the model is built in the trace, and kept to its end (where a
        // pass begins is no bound: loading a model runs modules' code too).
        let traced: Vec<usize> = if seeded.is_empty() {
            (0..lives.traced.len())
                .filter(|&i| {
                    lives.traced[i].end() == LIVE_AT_END
                        && self.ev.of(lives.traced[i].stack(trace)) & (steps::PHASES | WORKSPACE) == 0
                        && matches!(
                            self.traced[i].reason,
                            Reason::ParamBuiltNoBackward | Reason::OtherUndecided | Reason::OtherNoSteps
                        )
                })
                .collect()
        } else {
            Vec::new()
        };
        let built_t: Vec<bool> = traced
            .iter()
            .map(|&i| built(&self.traced[i]) || built_model(self.ev, lives.traced[i].stack(trace)))
            .collect();
        let traced: Vec<usize> = if built_t.iter().any(|&b| b) {
            traced
                .iter()
                .zip(&built_t)
                .filter(|(&i, &b)| b || lives.traced[i].stack(trace).is_none())
                .map(|(&i, _)| i)
                .collect()
        } else {
            traced
        };
        let mut counts: BTreeMap<u64, usize> = BTreeMap::new();
        for &i in &seeded {
            *counts.entry(lives.seeded[i].request).or_default() += 1;
        }
        for &i in &traced {
            *counts.entry(req[i]).or_default() += 1;
        }
        let mut found = structure::find(&counts);
        let Found::One(model) = &mut found else { return found };
        if let Some(n) = self.st.steps.iter().find_map(|s| s.layers) {
            *model = structure::with_pass_layers(model.clone(), n);
        }
        model.half_size_casts = self.half_size_casts(model);
        let param = match (model.copies, model.half_size_casts) {
            (1, 0) => Reason::ParamLayerStructure,
            (1, _) => Reason::ParamLayerStructureCasts,
            _ => Reason::ParamModelStateCounted,
        };
        // Per size, one copy's worth the parameters, the rest the other copies (any
        // choice of blocks gives the same totals).
        let mut left: BTreeMap<u64, (usize, usize)> = BTreeMap::new();
        for &s in counts.keys() {
            let p = model.per_copy(s);
            if p > 0 {
                left.insert(s, (p, p * (model.copies - 1)));
            }
        }
        let mut give = |size: u64| -> Option<BlockRole> {
            let l = left.get_mut(&size)?;
            if l.0 > 0 {
                l.0 -= 1;
                Some(BlockRole::of(param))
            } else if l.1 > 0 {
                l.1 -= 1;
                Some(BlockRole::of(Reason::OtherModelStateCopies))
            } else {
                None
            }
        };
        for &i in &seeded {
            if let Some(r) = give(lives.seeded[i].request) {
                self.seeded[i] = r;
            }
        }
        for &i in &traced {
            if let Some(r) = give(req[i]) {
                self.traced[i] = r;
            }
        }
        if model.copies == 2 && self.accumulates_gradients(model) {
            let grads = BlockRole::of(Reason::GradAccumulatedBeforeTrace);
            for r in self.seeded.iter_mut().chain(self.traced.iter_mut()) {
                if r.reason == Reason::OtherModelStateCopies {
                    *r = grads;
                }
            }
        }
        found
    }

    /// For rule 7: whether a whole backward pass of the trace accumulates the gradients
    /// into a copy of the model's state live through it. Rule 7 runs only where no
    /// backward pass keeps a gradient; a pass that yet makes and frees, within it, at
    /// least one block of each of the model's tensor sizes per tensor (AccumulateGrad's
    /// new gradient, added in place into the `.grad` live before the trace and freed) has
    /// gradients to add them to: of two copies, the one beyond the parameters (a program
    /// that runs backward passes without `zero_grad`; cs336-magma27's warm-up passes).
    /// With more copies, which of them are gradients and which optimizer state is not in
    /// the sizes.
    fn accumulates_gradients(&self, model: &Structure) -> bool {
        let (lives, req) = (self.lives, self.req);
        (0..self.st.steps.len()).filter(|&k| backward_whole(self.st, k)).any(|k| {
            let Some((bs, be)) = self.spans[k].0 else { return false };
            let from = lives.traced.partition_point(|l| l.alloc() < bs);
            let mut made: FxHashMap<u64, usize> = FxHashMap::default();
            for i in (from..lives.traced.len()).take_while(|&i| lives.traced[i].alloc() < be) {
                if lives.traced[i].end() < be {
                    *made.entry(req[i]).or_default() += 1;
                }
            }
            model
                .per_layer
                .iter()
                .chain(&model.outside_layers)
                .all(|&(s, _)| made.get(&s).copied().unwrap_or(0) >= model.per_copy(s))
        })
    }

    /// For rule 7: how many of the model's per-layer sizes the trace shows autocast's
    /// half-size casts of: blocks made outside the backward and optimizer phases, of half
    /// a per-layer size, at least once per layer for each tensor of that size.
    fn half_size_casts(&self, model: &Structure) -> usize {
        let mut half: FxHashMap<u64, usize> = FxHashMap::default();
        for &(s, _) in &model.per_layer {
            if s % 2 == 0 {
                half.insert(s / 2, 0);
            }
        }
        for (i, l) in self.lives.traced.iter().enumerate() {
            if let Some(c) = half.get_mut(&self.req[i]) {
                if matches!(self.st.phase_at(l.alloc()), Phase::Forward | Phase::Outside) {
                    *c += 1;
                }
            }
        }
        model.per_layer.iter().filter(|(s, m)| s % 2 == 0 && half[&(s / 2)] >= m * model.layers).count()
    }

    /// Rule 6. Roles the trace cannot total: memory live before the trace whose role no
    /// rule decided (and the blocks that replace it, `replace_unknown`; and the copies of
    /// the model beyond its parameters, rule 7) may hold parameters, gradients or
    /// optimizer state, unless what was found is whole: the parameters one for one with
    /// the gradients of a whole step (one the recording did not begin inside) or the one
    /// model of rule 7, and the optimizer state whole copies of those parameters when
    /// that step's optimizer ends. A block whose frames say where it was made (a forward
    /// pass, say) only leaves open the roles made there; once the parameters' sizes are
    /// known, only a block of one of them can be a gradient or optimizer state. Every
    /// text counts all the undecided memory, and says how much of it could hold the role.
    fn cannot_tell(&mut self, params: &Parameters, replace_unknown: &[usize], model: &Found) -> BTreeMap<Role, String> {
        let st = self.st;
        // (request, frames' evidence, a copy of the model's state beyond its parameters)
        let mut unknown: Vec<(u64, u8, bool)> = Vec::new();
        for (b, r) in self.lives.seeded.iter().zip(&self.seeded) {
            match r.reason {
                Reason::OtherBeforeTrace => unknown.push((b.request, self.ev.of(b.stack), false)),
                Reason::OtherModelStateCopies => unknown.push((b.request, 0, true)),
                _ => {}
            }
        }
        for (i, r) in self.traced.iter().enumerate() {
            if r.reason == Reason::OtherModelStateCopies {
                unknown.push((self.req[i], 0, true));
            }
        }
        unknown.extend(replace_unknown.iter().map(|&i| (self.req[i], steps::OPTIMIZER, false)));
        let mut cannot_tell = BTreeMap::new();
        if unknown.is_empty() {
            return cannot_tell;
        }
        let fs = fragscope_alloc::format_size;
        let all: u64 = unknown.iter().map(|x| x.0).sum();
        let what = |v: &[&(u64, u8, bool)]| {
            let part: u64 = v.iter().map(|x| x.0).sum();
            let could = if part == all { String::new() } else { format!(", {} of it could", fs(part)) };
            format!(
                "{} live before the trace or kept through it ({} block(s)) has a role the trace does not decide{could}",
                fs(all),
                unknown.len()
            )
        };
        // The parameters' sizes, where all are known (every gradient of a whole step
        // matched, or one model's structure): a gradient or a moment has one of them. A
        // step the recording began in the backward pass of is whole too when its
        // optimizer made its state for each of those gradients (`state_made_per_gradient`).
        let whole_step =
            params.grad_step.filter(|&k| backward_whole(st, k) || self.state_made_per_gradient(k, &params.grad_sizes));
        let mut sizes: FxHashMap<u64, usize> =
            if params.matched && whole_step.is_some() { params.sizes.clone() } else { FxHashMap::default() };
        if let Found::One(m) = model {
            for &(s, _) in m.per_layer.iter().chain(&m.outside_layers) {
                sizes.insert(s, 1);
            }
        }
        let could = |role: Role| -> Vec<&(u64, u8, bool)> {
            unknown
                .iter()
                .filter(|x| match role {
                    Role::Parameters => !x.2 && open_to(x.1, role),
                    _ => x.2 || (open_to(x.1, role) && (sizes.is_empty() || sizes.contains_key(&x.0))),
                })
                .collect()
        };
        let copies = match model {
            Found::One(m) if m.copies > 1 => format!(
                "; the model's state is {} whole copies of its layer structure, {} each: the parameters and {} cop{} of gradients or optimizer state, which the sizes do not tell apart",
                m.copies,
                fs(m.copy_bytes),
                m.copies - 1,
                if m.copies == 2 { "y" } else { "ies" }
            ),
            _ => String::new(),
        };
        let p = could(Role::Parameters);
        let one_model = matches!(model, Found::One(_));
        if !p.is_empty() && !one_model && (!params.matched || whole_step.is_none()) {
            let why = if let Found::Several(layers) = model {
                let l: Vec<String> = layers.iter().map(|l| l.to_string()).collect();
                format!(
                    "the blocks kept through the trace show the layers of more than one model ({} layers): which one the recording runs is not in their sizes",
                    l.join(" and ")
                )
            } else if let Found::Mixed(layers, sizes) = model {
                format!(
                    "the blocks kept through the trace repeat over {layers} layers in {sizes} distinct sizes per layer, more than a layer's weights: per-layer state besides them (a KV cache, buffers) repeats with them, and the sizes do not tell which is which"
                )
            } else if params.grad_sizes.is_empty() {
                "no backward pass gives the parameters' sizes, and their sizes show no repeated layer".into()
            } else if whole_step.is_none() {
                "the recording began inside the only step with gradients, so they may not all be in it".into()
            } else {
                "the parameters found do not match the gradients one for one".into()
            };
            cannot_tell.insert(Role::Parameters, format!("{}; {why}", what(&p)));
        }
        let g = could(Role::Gradients);
        if !g.is_empty() && whole_step.is_none() {
            let why = if st.steps.is_empty() {
                "no backward pass in the trace"
            } else {
                "no whole step's backward pass makes the gradients in the trace"
            };
            cannot_tell.insert(Role::Gradients, format!("{}; {why}{copies}", what(&g)));
        }
        let o = could(Role::OptimizerState);
        if !o.is_empty() {
            // Parameters and optimizer state live when the whole step's optimizer ends
            // (an optimizer makes its state in its first step).
            let at = whole_step.and_then(|k| self.spans[k].1).map(|x| x.1);
            if !at.is_some_and(|t| self.state_copies_parameters_at(t)) {
                let why = if st.steps.is_empty() {
                    "no optimizer step in the trace"
                } else {
                    "the optimizer state found is not whole copies of the parameters of a whole step"
                };
                cannot_tell.insert(Role::OptimizerState, format!("{}; {why}{copies}", what(&o)));
            }
        }
        cannot_tell
    }

    /// For rule 6: whether step `k`, which the recording may have begun inside its
    /// backward pass, holds all its gradients (`grads`, counted by request): its optimizer
    /// phase follows the backward pass in the trace and made and kept the same whole
    /// number (≥ 1) of blocks of each gradient's size per gradient, and of no other size.
    /// `torch.optim` makes a parameter's state in the first `step()` that finds its
    /// `.grad` (Adam's `exp_avg` and `exp_avg_sq` in `_init_group`), for every parameter
    /// with a gradient: a gradient made before the trace would have its moments made here
    /// all the same, one size or one count too many. The 0-dim `state_steps` tensors that
    /// `capturable` and `fused` keep on the device (8 B or less) are no copy of a
    /// parameter and are not counted. Without this, a recording begun at `loss.backward()`
    /// (or a ring buffer that dropped the forward pass) left parameters, gradients and the
    /// moments it found whole undecided, where the same program recorded from its forward
    /// pass told them (issue 38, item 4).
    fn state_made_per_gradient(&self, k: usize, grads: &FxHashMap<u64, usize>) -> bool {
        let (Some((_, be)), Some((os, oe))) = (self.spans[k].0, self.spans[k].1) else { return false };
        if be > os || grads.is_empty() {
            return false;
        }
        let lives = &self.lives.traced;
        let mut made: FxHashMap<u64, usize> = FxHashMap::default();
        for i in lives.partition_point(|l| l.alloc() < os)..lives.partition_point(|l| l.alloc() < oe) {
            if self.traced[i].reason == Reason::OptMadeInStepKept && self.req[i] > 8 {
                *made.entry(self.req[i]).or_default() += 1;
            }
        }
        whole_copies(grads, &made)
    }

    /// For rule 6: whether the optimizer state live at entry `t` is whole copies of the
    /// parameters live then (the same number of copies of every parameter's size).
    fn state_copies_parameters_at(&self, t: usize) -> bool {
        let (lives, req) = (self.lives, self.req);
        let mut opt: FxHashMap<u64, usize> = FxHashMap::default();
        let mut par: FxHashMap<u64, usize> = FxHashMap::default();
        let mut count = |role: Role, q: u64| match role {
            Role::OptimizerState => *opt.entry(q).or_default() += 1,
            Role::Parameters => *par.entry(q).or_default() += 1,
            _ => {}
        };
        for (b, r) in lives.seeded.iter().zip(&self.seeded) {
            if b.end >= t {
                count(r.role, b.request);
            }
        }
        // The blocks made before `t`, the role read first: few of them hold one of these
        // two roles, and the roles are a smaller array than the lives.
        let made = lives.traced.partition_point(|l| l.alloc() < t);
        for (i, r) in self.traced[..made].iter().enumerate() {
            if matches!(r.role, Role::OptimizerState | Role::Parameters) && lives.traced[i].end() >= t {
                count(r.role, req[i]);
            }
        }
        let k: Vec<Option<usize>> =
            par.iter().map(|(s, &c)| opt.get(s).filter(|&&n| n % c == 0).map(|n| n / c)).collect();
        !par.is_empty() && k.iter().all(|x| x.is_some_and(|x| x >= 1) && *x == k[0])
    }
}

/// Rule 1 for a block made in step `k`'s backward pass and ended at entry `e`: a
/// gradient when still live as the pass ends, a temporary when freed inside it. The
/// autograd engine's `AccumulateGrad` nodes write each parameter's `.grad` during the
/// pass and keep it for the optimizer (until `zero_grad`, or the next backward pass adds
/// to it); what else the pass makes (the gradients of activations, a node's buffers) it
/// frees before it returns. A step without its backward's span ends the pass with the
/// step.
#[inline(always)]
fn made_in_backward(st: &Steps, spans: &[StepSpans], k: usize, e: usize) -> Reason {
    let bwd_end = spans[k].0.map_or(st.steps[k].end, |b| b.1);
    if e >= bwd_end {
        Reason::GradOutlivesBackward
    } else {
        Reason::TempFreedInPhase
    }
}

/// Rule 1 for a block made in step `k`'s optimizer step and ended at entry `e`:
/// optimizer state when kept after the step, a temporary when freed inside it.
/// `torch.optim` makes its state lazily, in the first `step()` (Adam's `exp_avg` and
/// `exp_avg_sq` in `_init_group`), and keeps it in `optimizer.state`; the
/// `_foreach_*` and fused paths' intermediates are freed before `step()` returns.
#[inline(always)]
fn made_in_optimizer(st: &Steps, spans: &[StepSpans], k: usize, e: usize) -> Reason {
    let opt_end = spans[k].1.map_or(st.steps[k].end, |o| o.1);
    if e >= opt_end {
        Reason::OptMadeInStepKept
    } else {
        Reason::TempFreedInPhase
    }
}

/// Rule 1 for a block made in step `k`'s forward pass and ended at entry `e`: an
/// activation when still live as the step's backward starts and freed by the next
/// step's end (or, in the last step, live at the end of the trace, at lower
/// confidence); a temporary when freed before backward. A step without backward (the
/// optimizer alone) tells only what forward frees.
#[inline(always)]
fn made_in_forward(st: &Steps, spans: &[StepSpans], n: usize, k: usize, e: usize) -> Reason {
    match spans[k].0 {
        Some((bwd_start, _)) if e >= bwd_start => {
            let next_end = st.steps.get(k + 1).map(|s| s.end);
            match next_end {
                Some(ne) if e < ne => Reason::ActKeptForBackward,
                None if e < n => Reason::ActKeptForBackward,
                None if Some(k) == st.steps.len().checked_sub(1) => Reason::ActKeptLastStep,
                _ => Reason::OtherOutlivesStep,
            }
        }
        Some(_) => Reason::TempFreedInPhase,
        // A step without backward (the optimizer alone): freed in forward or not.
        None if e < n && st.phase_at(e) == Phase::Forward => Reason::TempFreedInPhase,
        None => Reason::OtherUndecided,
    }
}

/// Whether the trace holds step `k`'s backward pass whole: the step is complete, or the
/// recording began inside its forward (one begun inside its backward or optimizer may
/// lack some gradients).
fn backward_whole(st: &Steps, k: usize) -> bool {
    let s = &st.steps[k];
    s.complete || s.phases.first().is_some_and(|p| p.phase == Phase::Forward)
}

/// For rule 2: the step whose backward pass keeps the most gradient bytes, among the
/// steps whose backward pass the trace holds whole first ([`backward_whole`]), else
/// among all.
fn gradient_step(st: &Steps, grads_by_step: &[FxHashMap<u64, usize>]) -> Option<usize> {
    let grad_bytes = |k: usize| grads_by_step[k].iter().map(|(s, c)| s * *c as u64).sum::<u64>();
    (0..grads_by_step.len())
        .filter(|&k| backward_whole(st, k) && !grads_by_step[k].is_empty())
        .max_by_key(|&k| grad_bytes(k))
        .or_else(|| (0..grads_by_step.len()).max_by_key(|&k| grad_bytes(k)).filter(|&k| !grads_by_step[k].is_empty()))
}

/// For rule 3: whether `found` (blocks counted by request) is whole copies of the
/// parameters' sizes: the same number k ≥ 1 of blocks of each parameter's size per
/// parameter (one buffer per parameter per moment), and no other size.
fn whole_copies(param_sizes: &FxHashMap<u64, usize>, found: &FxHashMap<u64, usize>) -> bool {
    let Some(k) = param_sizes.iter().next().map(|(s, c)| found.get(s).copied().unwrap_or(0) / c) else {
        return false;
    };
    k >= 1
        && found.len() == param_sizes.len()
        && param_sizes.iter().all(|(s, c)| found.get(s).copied().unwrap_or(0) == k * c)
}

/// For rule 4: the reason of a block that replaces one freed with reason `was`.
fn successor(was: Reason) -> Reason {
    match was {
        // Counted by size, or not known: the successor is no surer.
        Reason::ParamBeforeTraceCounted | Reason::OptBeforeTraceCounted | Reason::OtherReplacesUnknown => was,
        Reason::OtherUndecided => Reason::OtherReplacesUnknown,
        _ if was.role() == Role::Parameters => Reason::ParamReplacedInStep,
        _ => Reason::OptReplacedInStep,
    }
}

/// For rule 6: whether a block whose frames have evidence `bits` could hold `role`.
/// Frames of no phase leave every role open; a phase's frames only the role made there.
fn open_to(bits: u8, role: Role) -> bool {
    let phase = bits & steps::PHASES;
    phase == 0
        || match role {
            Role::Gradients => phase & steps::BACKWARD != 0,
            Role::OptimizerState => phase & steps::OPTIMIZER != 0,
            _ => false,
        }
}

/// Per block live before the trace: whether it, or the block that replaces it in an
/// optimizer step (an out-of-place update: `p.data = p - lr * ...`), and so on, is live
/// when the first backward pass (entry `fb`) starts. A recording begun after training
/// started may hold the parameters and the optimizer's state only through their
/// replacements by then. The replacements are matched as step 4 of [`classify_with`]
/// matches them: per optimizer step, a block made in it and kept takes the place of the
/// earliest-ended block of its size that the step frees (`kept`: per step, the blocks
/// its optimizer made and kept, with their `alloc`).
fn lineages_live_at(
    lives: &BlockLives,
    kept: &[Vec<(usize, usize)>],
    spans: &[StepSpans],
    traced: &[BlockRole],
    req: &[u64],
    ends: &Ends,
    fb: usize,
) -> Vec<bool> {
    let mut live: Vec<bool> = lives.seeded.iter().map(|b| b.end >= fb).collect();
    // Traced block -> the block live before the trace it descends from.
    let mut root: FxHashMap<usize, usize> = FxHashMap::default();
    for (k, sp) in spans.iter().enumerate() {
        let Some((os, oe)) = sp.1 else { continue };
        if os >= fb {
            break;
        }
        let mut freed: FxHashMap<u64, Vec<(usize, usize)>> = FxHashMap::default();
        ends.each_in(lives, os..oe, |end, life| {
            let (r, size) = match life {
                Ended::Seeded(i) => (Some(i), lives.seeded[i].request),
                Ended::Traced(i) => (root.get(&i).copied(), req[i]),
            };
            if let Some(r) = r {
                freed.entry(size).or_default().push((end, r));
            }
        });
        for v in freed.values_mut() {
            v.sort_unstable();
            v.reverse();
        }
        for &(i, alloc) in &kept[k] {
            if alloc < os || alloc >= oe || traced[i].reason != Reason::OptMadeInStepKept {
                continue;
            }
            if let Some((_, r)) = freed.get_mut(&req[i]).and_then(Vec::pop) {
                root.insert(i, r);
                if alloc < fb && lives.traced[i].end() >= fb {
                    live[r] = true;
                }
            }
        }
    }
    live
}

/// Blocks live before the trace that have the sizes of the gradients (a recording begun
/// after training started: `_record_memory_history` called after a warm-up step, or a
/// ring buffer that kept the last entries). Sets `seeded` for the ones the evidence
/// decides; leaves the rest undecided.
///
/// * Freed outside every phase (`zero_grad`) before a later backward pass, no more of a
///   size than the gradients of that size (else those `zero_grad` frees): the last
///   step's gradients.
/// * Live when the first backward pass starts (themselves or their replacements,
///   `live_at_fb`), not freed by that pass, and not made in a forward or backward pass
///   by their frames: the parameters, and with an optimizer
///   that keeps state, its buffers (Adam: two per parameter, each a parameter's size).
///   Per size, as many as the gradients: the parameters, one for one. A whole multiple
///   `(1 + k)` of them, with one `k` for every size: the parameters and `k` state
///   buffers each — told apart by their frames when they have them (a ring buffer keeps
///   the stacks of blocks whose entries it dropped), else counted by size (the totals
///   are exact, which block is which is not known, and the reason says so). Counts that
///   fit neither (other blocks of those sizes: a BatchNorm's running statistics) give
///   per size as many parameters as gradients (counted where the size has more blocks)
///   and leave the rest undecided.
fn before_trace(
    lives: &BlockLives,
    st: &Steps,
    ev: &mut StackEvidence,
    grad_sizes: &FxHashMap<u64, usize>,
    bwd: &Backwards,
    live_at_fb: &[bool],
    seeded: &mut [BlockRole],
) {
    let bwd_starts = bwd.starts;
    if bwd_starts.is_empty() {
        return;
    }
    let undecided = |r: &BlockRole| r.reason == Reason::OtherUndecided;
    gradients_freed_before_backward(lives, st, ev, grad_sizes, bwd, seeded);
    // Parameters and optimizer state: live at the first backward pass. Not a block whose
    // frames show it made in a forward or backward pass (as rule 6's `open_to` reads
    // them): a workspace a matmul made in the first forward, kept, can have a
    // parameter's size (gpt-s256-b8: cuBLAS's 1 MiB, the size of the 256 × 1024
    // position embedding), and counted here it made the copies per gradient no whole
    // number, leaving AdamW's moments undecided at that sequence length alone.
    // Nor one the first backward pass frees (`fb..fbe`): a tensor saved for it (an
    // activation; gpt-s512's 8 × 512 × 1,024 floats are the size of its 4,096 × 1,024
    // weights, its 512 int64 positions of its 1,024-float norms), where a parameter and
    // a moment outlive the pass. Counted with them they made the counts per size no
    // whole number, or were counted as the parameters, on a recording begun there.
    let fb = bwd_starts[0];
    let fbe = st.steps.iter().find_map(|s| s.span(Phase::Backward)).map_or(fb, |b| b.1);
    let live: Vec<usize> = (0..lives.seeded.len())
        .filter(|&i| undecided(&seeded[i]) && live_at_fb[i] && grad_sizes.contains_key(&lives.seeded[i].request))
        .filter(|&i| !(fb..fbe).contains(&lives.seeded[i].end))
        .filter(|&i| {
            let bits = ev.of(lives.seeded[i].stack);
            open_to(bits, Role::Parameters) || open_to(bits, Role::OptimizerState)
        })
        .collect();
    let mut count: FxHashMap<u64, usize> = FxHashMap::default();
    for &i in &live {
        *count.entry(lives.seeded[i].request).or_default() += 1;
    }
    if live.is_empty() {
        return;
    }
    // Copies per gradient, per size: one number for every size, or nothing decided.
    let ratio: Vec<Option<usize>> =
        count.iter().map(|(s, c)| (c % grad_sizes[s] == 0).then(|| c / grad_sizes[s])).collect();
    let q = match ratio.first() {
        Some(&Some(q)) if ratio.iter().all(|r| *r == Some(q)) => q,
        _ => 0,
    };
    // Parameters with k state buffers each (every gradient size present: an optimizer
    // holds state for every parameter it updates). Otherwise (one block per gradient, or
    // counts that are no whole multiple: a BatchNorm's running statistics share its
    // weight's size): per size, as many parameters as gradients — one for one where the
    // size has exactly that many, else counted — and the rest undecided.
    if q < 2 || count.len() != grad_sizes.len() {
        let mut left = grad_sizes.clone();
        // Counted, the longest-lived of a size first: a parameter lives through every
        // step, where a block that shares its size is freed (gpt-s512-b4-amp's bf16
        // logits, 4 × 512 × 32,000, are the size of its fp32 embedding; taken for a
        // parameter, the parameters were no longer whole once the logits were freed).
        let mut live = live;
        live.sort_by_key(|&i| std::cmp::Reverse(lives.seeded[i].end));
        for &i in &live {
            let size = lives.seeded[i].request;
            let l = left.get_mut(&size).unwrap();
            if *l > 0 {
                *l -= 1;
                seeded[i] = BlockRole::of(if count[&size] <= grad_sizes[&size] {
                    Reason::ParamBeforeTraceMatchesGradient
                } else {
                    Reason::ParamBeforeTraceCounted
                });
            }
        }
        return;
    }
    parameters_and_state_before_trace(lives, ev, grad_sizes, &live, q - 1, seeded);
}

/// The backward passes of the trace, for [`before_trace`]: where each starts, and the
/// gradients the first one keeps, counted by request.
struct Backwards<'b> {
    starts: &'b [usize],
    first_made: &'b FxHashMap<u64, usize>,
}

/// [`before_trace`]'s last step's gradients: blocks live before the trace of a
/// gradient's size, freed outside every phase (`zero_grad`) before a backward pass that
/// makes the gradients again, per size when there are no more of it than gradients, or
/// else those freed under `zero_grad`'s frames when no more than the gradients.
///
/// A parameter has one `.grad`: a gradient the trace's first backward pass makes is one
/// no gradient live before the trace holds then (`zero_grad` freed it, or none was made
/// yet). So among the blocks still live when that pass starts, a size holds no more of
/// the last step's gradients than that pass leaves unmade (none when it makes them all:
/// a recording begun at a forward pass; some when it began inside the backward pass);
/// those freed before it starts may be any of the gradients.
fn gradients_freed_before_backward(
    lives: &BlockLives,
    st: &Steps,
    ev: &mut StackEvidence,
    grad_sizes: &FxHashMap<u64, usize>,
    bwd: &Backwards,
    seeded: &mut [BlockRole],
) {
    // Per (size, whether live when the first backward pass starts).
    let mut old: FxHashMap<(u64, bool), Vec<usize>> = FxHashMap::default();
    for (i, b) in lives.seeded.iter().enumerate() {
        if seeded[i].reason == Reason::OtherUndecided
            && grad_sizes.contains_key(&b.request)
            && b.end != LIVE_AT_END
            && st.phase_at(b.end) == Phase::Outside
            && bwd.starts.iter().any(|&s| s > b.end)
        {
            old.entry((b.request, b.end >= bwd.starts[0])).or_default().push(i);
        }
    }
    // Per size: a size with more of them than gradients holds something else too (the
    // last batch, freed when the next is made: gpt-s256-b8's 8 × 256 int64 tokens are the
    // size of its 4,096-float biases), and then those `zero_grad` frees (their free
    // entry's frames) are the gradients, if no more than the gradients. Live through the
    // first backward pass, they are no more than the gradients it leaves unmade: the
    // batch of gpt-s256-b8 begun at its first forward, freed as the second step's is made,
    // outlives a pass that makes every gradient, and is none of them.
    let trace = ev.snap().trace(lives.device);
    for ((size, through_first), v) in old {
        let made = bwd.first_made.get(&size).copied().unwrap_or(0);
        let g = if through_first { grad_sizes[&size].saturating_sub(made) } else { grad_sizes[&size] };
        if g == 0 {
            continue;
        }
        let v = if v.len() <= g {
            v
        } else {
            let z: Vec<usize> = v
                .into_iter()
                .filter(|&i| ev.mentions(trace.get(lives.seeded[i].end).and_then(|e| e.stack), "zero_grad"))
                .collect();
            if z.len() > g {
                continue;
            }
            z
        };
        for i in v {
            seeded[i] = BlockRole::of(Reason::GradBeforeTraceFreedBeforeBackward);
        }
    }
}

/// [`before_trace`]'s parameters with `k` state buffers each, among the blocks `live`
/// at the first backward pass: told apart by their frames when every size's blocks
/// split into as many built with the model as gradients and `k` times as many made by
/// the optimizer; else counted by size (the first of each size the parameters).
fn parameters_and_state_before_trace(
    lives: &BlockLives,
    ev: &mut StackEvidence,
    grad_sizes: &FxHashMap<u64, usize>,
    live: &[usize],
    k: usize,
    seeded: &mut [BlockRole],
) {
    let is_opt = |ev: &mut StackEvidence, s| ev.of(s) & OPTIMIZER != 0 || ev.mentions(s, "optim");
    let mut by_frames: FxHashMap<u64, (usize, usize)> = FxHashMap::default();
    let mut frames_decide = true;
    for &i in live {
        let b = &lives.seeded[i];
        let (o, p) = (is_opt(ev, b.stack), built_model(ev, b.stack));
        let e = by_frames.entry(b.request).or_default();
        match (p, o) {
            (true, false) => e.0 += 1,
            (false, true) => e.1 += 1,
            _ => frames_decide = false,
        }
    }
    frames_decide &= by_frames.iter().all(|(s, &(p, o))| p == grad_sizes[s] && o == k * grad_sizes[s]);
    let mut params_left = grad_sizes.clone();
    for &i in live {
        let b = &lives.seeded[i];
        seeded[i] = BlockRole::of(if frames_decide {
            if is_opt(ev, b.stack) {
                Reason::OptBeforeTraceFrames
            } else {
                Reason::ParamBeforeTraceFrames
            }
        } else {
            // Counted: the first of each size (in the order they are seeded) as the
            // parameters; any choice gives the same totals.
            let left = params_left.get_mut(&b.request).unwrap();
            if *left > 0 {
                *left -= 1;
                Reason::ParamBeforeTraceCounted
            } else {
                Reason::OptBeforeTraceCounted
            }
        });
    }
}

/// Frames of building a model: a constructor, `Module._apply` (`.to()`, `.cuda()`),
/// `load_state_dict`, `from_pretrained`.
fn built_model(ev: &mut StackEvidence, s: Option<fragscope_snapshot::StackId>) -> bool {
    ["__init__", "_apply", "load_state_dict", "from_pretrained"].iter().any(|k| ev.mentions(s, k))
}

/// Tensor bytes (requests) per role at one state (entries applied: state 0 is before
/// the first entry), indexed by `Role as usize`.
pub fn bytes_at(snap: &Snapshot, lives: &BlockLives, roles: &Roles, state: usize) -> [u64; 7] {
    let trace = snap.trace(lives.device);
    let mut v = [0u64; 7];
    for (b, r) in lives.seeded.iter().zip(&roles.seeded) {
        if b.end >= state {
            v[r.role as usize] += b.request;
        }
    }
    let k = lives.traced.partition_point(|l| l.alloc() < state);
    for (i, (l, r)) in lives.traced[..k].iter().zip(&roles.traced).enumerate() {
        if l.end() >= state {
            let role = match roles.from_state.get(&i) {
                Some(&f) if state < f => Role::Temporaries,
                _ => r.role,
            };
            v[role as usize] += trace[l.alloc()].size;
        }
    }
    v
}

/// The most each role held (`max`), the allocated peak (block bytes) and its state, and
/// each role's bytes then (`at_peak`), over the states of a trace of `entries` entries.
type Figures = ([i64; 7], i64, usize, [i64; 7]);

/// The highs of the sweep, read at the states where a figure can rise.
struct Highs {
    max: [i64; 7],
    peak: i64,
    peak_state: usize,
    at_peak: [i64; 7],
}

impl Highs {
    /// Reads the figures at state `s`, where only the roles in `touched` (a bit per
    /// role) changed.
    #[inline]
    fn read(&mut self, s: usize, mut touched: u8, cur: &[i64; 7], blk: i64) {
        while touched != 0 {
            let k = touched.trailing_zeros() as usize;
            self.max[k] = self.max[k].max(cur[k]);
            touched &= touched - 1;
        }
        if blk > self.peak {
            (self.peak, self.peak_state, self.at_peak) = (blk, s, *cur);
        }
    }
}

/// Sweeps the states: a block enters at alloc + 1 and leaves at end + 1 (the lives an
/// entry ended, from `ix.ends`); an out-of-place update moves from temporaries to its
/// role at `from_state` (a few blocks: sorted). Tensor bytes (`req`) give the figures;
/// block bytes find the allocated peak. A figure can rise only where a block enters or
/// moves: the figures are read there, and at the rest of the states (ends alone, which
/// lower them) only where a size past `i64` made an end raise one. (Every state read
/// in full was 60 instructions a state on a long trace.)
fn sweep(lives: &BlockLives, roles: &Roles, ix: &LifeIndex, entries: usize) -> Figures {
    /// Below this many traced lives the states are swept on one thread.
    const HALVES_FROM: usize = 1 << 18;
    let n = lives.traced.len();
    let mid = (n >= HALVES_FROM && crate::par::threads() >= 2).then(|| lives.traced[n / 2].alloc() + 1);
    sweep_halves(lives, roles, ix, entries, mid)
}

/// [`sweep`], the states before `mid` on a thread of their own beside those from `mid`
/// on (`None`, or a `mid` outside the states: all in one sweep). The second sweep starts
/// from the figures at state `mid − 1`, summed from the lives (every change at a state
/// before `mid`: an `alloc`, a move, an end), not swept to; each reads the highs of its
/// own states, and the two are merged: a role's maximum is the larger, the allocated
/// peak the first state that reaches the larger (the first sweep's on a tie).
fn sweep_halves(lives: &BlockLives, roles: &Roles, ix: &LifeIndex, entries: usize, mid: Option<usize>) -> Figures {
    const TEMP: usize = Role::Temporaries as usize;
    let req = &ix.req;
    let mut moves: Vec<(usize, usize)> = roles.from_state.iter().map(|(&i, &f)| (f, i)).collect();
    moves.sort_unstable();
    // The last state anything happens at: ends are entries of the trace (a life ended
    // past it, which the lifetime walk never makes, is still counted).
    let last = entries
        .max(ix.ends.more.last().map_or(0, |x| x.0 + 1))
        .max(moves.last().map_or(0, |x| x.0))
        .max(lives.traced.last().map_or(0, |l| l.alloc() + 1));
    // A move at state 0 held back every move (the sweep starts at state 1).
    if moves.first().is_some_and(|x| x.0 == 0) {
        moves.clear();
    }
    // The lives that move (sorted), met in `alloc` order as `a` goes up: a cursor, not
    // a lookup per life.
    let mut moved: Vec<usize> = roles.from_state.keys().copied().collect();
    moved.sort_unstable();
    // The states `s < stop` where a figure can rise, in order, from the life `a` and the
    // move `m` on: an `alloc`'s (alloc + 1; the lives are in `alloc` order), a move's;
    // then the ends up to state `stop - 1`.
    let run = |mut r: Running, mut a: usize, mut m: usize, stop: usize| -> Highs {
        let mut mv = moved.partition_point(|&i| i < a);
        loop {
            let s =
                lives.traced.get(a).map_or(usize::MAX, |l| l.alloc() + 1).min(moves.get(m).map_or(usize::MAX, |x| x.0));
            if s > last || s >= stop {
                break;
            }
            r.ends_until(s - 1);
            let mut touched = r.end_entry(s - 1).0;
            r.e = s;
            while a < lives.traced.len() && lives.traced[a].alloc() + 1 == s {
                while mv < moved.len() && moved[mv] < a {
                    mv += 1;
                }
                let role = if moved.get(mv) == Some(&a) { TEMP } else { roles.traced[a].role as usize };
                r.cur[role] += req[a] as i64;
                r.blk += lives.traced[a].size as i64;
                touched |= 1 << role;
                a += 1;
            }
            while m < moves.len() && moves[m].0 == s {
                let i = moves[m].1;
                let role = roles.traced[i].role as usize;
                r.cur[TEMP] -= req[i] as i64;
                r.cur[role] += req[i] as i64;
                touched |= 1 << TEMP | 1 << role;
                m += 1;
            }
            r.hi.read(s, touched, &r.cur, r.blk);
        }
        r.ends_until(stop - 1);
        r.hi
    };
    let whole = last + 1;
    let Some(mid) = mid.filter(|&m| m >= 2 && m <= last) else {
        let hi = run(Running::new(lives, roles, ix), 0, 0, whole);
        return (hi.max, hi.peak, hi.peak_state, hi.at_peak);
    };
    // The figures at state `mid - 1`: every change at a state up to it.
    let second_start = || {
        let upto = mid - 1;
        let mut r = Running::new(lives, roles, ix);
        let mut mv = 0;
        for (k, l) in lives.traced.iter().enumerate() {
            let (q, size, role) = (req[k] as i64, l.size as i64, roles.traced[k].role as usize);
            if l.alloc() < upto {
                while mv < moved.len() && moved[mv] < k {
                    mv += 1;
                }
                r.cur[if moved.get(mv) == Some(&k) { TEMP } else { role }] += q;
                r.blk += size;
            }
            if l.end() != LIVE_AT_END && l.end() < upto {
                r.cur[role] -= q;
                r.blk -= size;
            }
        }
        for (b, role) in lives.seeded.iter().zip(&roles.seeded) {
            if b.end != LIVE_AT_END && b.end < upto {
                r.cur[role.role as usize] -= b.request as i64;
                r.blk -= b.size as i64;
            }
        }
        for &(_, i) in moves.iter().take_while(|x| x.0 <= upto) {
            r.cur[TEMP] -= req[i] as i64;
            r.cur[roles.traced[i].role as usize] += req[i] as i64;
        }
        // The ends applied: those of the entries before `upto`.
        let ends = &ix.ends;
        r.e = upto;
        r.at = ends.by_end.partition_point(|&k| ends.end_of(lives, k) < upto);
        r.more_at = ends.more.partition_point(|x| x.0 < upto);
        // Its own highs, from nothing: the state it starts at is the first sweep's.
        r.hi = Highs { max: [i64::MIN; 7], peak: i64::MIN, peak_state: 0, at_peak: r.cur };
        let a = lives.traced.partition_point(|l| l.alloc() + 1 < mid);
        let m = moves.partition_point(|x| x.0 < mid);
        run(r, a, m, whole)
    };
    let (first, second) = std::thread::scope(|sc| {
        let first = sc.spawn(|| run(Running::new(lives, roles, ix), 0, 0, mid));
        let second = second_start();
        (first.join().expect("the roles' sweep thread panicked"), second)
    });
    let max = std::array::from_fn(|k| first.max[k].max(second.max[k]));
    let peak = if second.peak > first.peak { &second } else { &first };
    (max, peak.peak, peak.peak_state, peak.at_peak)
}

/// What [`sweep`] carries from state to state: each role's tensor bytes (`cur`) and the
/// block bytes (`blk`) at the state reached, the highs read so far, and how far the
/// lives' ends are applied (the entries before `e`, and the first `more_at` of
/// `ends.more`).
struct Running<'a> {
    lives: &'a BlockLives,
    roles: &'a Roles,
    req: &'a [u64],
    ends: &'a Ends,
    cur: [i64; 7],
    blk: i64,
    hi: Highs,
    e: usize,
    /// The first of `ends.by_end` not applied.
    at: usize,
    more_at: usize,
}

impl<'a> Running<'a> {
    /// State 0: the blocks live before the trace.
    fn new(lives: &'a BlockLives, roles: &'a Roles, ix: &'a LifeIndex) -> Self {
        let mut cur = [0i64; 7];
        let mut blk: i64 = 0;
        for (b, r) in lives.seeded.iter().zip(&roles.seeded) {
            cur[r.role as usize] += b.request as i64;
            blk += b.size as i64;
        }
        let hi = Highs { max: cur, peak: blk, peak_state: 0, at_peak: cur };
        Running { lives, roles, req: &ix.req, ends: &ix.ends, cur, blk, hi, e: 0, at: 0, more_at: 0 }
    }

    /// What the end of life `k` (as [`Ends`] numbers them) takes away: its role, tensor
    /// bytes, block bytes.
    #[inline(always)]
    fn gone(&self, k: usize) -> (usize, i64, i64) {
        let traced_n = self.ends.traced;
        if k < traced_n {
            (self.roles.traced[k].role as usize, self.req[k] as i64, self.lives.traced[k].size as i64)
        } else {
            let (j, lives) = (k - traced_n, self.lives);
            (self.roles.seeded[j].role as usize, lives.seeded[j].request as i64, lives.seeded[j].size as i64)
        }
    }

    /// The ends of entry `e`, applied: the roles touched, and whether one raised a figure.
    #[inline(always)]
    fn end_entry(&mut self, e: usize) -> (u8, bool) {
        let (mut touched, mut raised) = (0u8, false);
        let mut take = |r: &mut Self, k: usize| {
            let (role, q, size) = r.gone(k);
            r.cur[role] -= q;
            r.blk -= size;
            touched |= 1 << role;
            raised |= q < 0 || size < 0;
        };
        let ends: &'a Ends = self.ends;
        if let Some(&k) = ends.by_end.get(self.at).filter(|&&k| ends.end_of(self.lives, k) == e) {
            take(self, k as usize);
            self.at += 1;
        }
        while let Some(&(_, k)) = ends.more.get(self.more_at).filter(|x| x.0 == e) {
            take(self, k);
            self.more_at += 1;
        }
        (touched, raised)
    }

    /// The ends of the entries `self.e..upto`, each its own state.
    #[inline(always)]
    fn ends_until(&mut self, upto: usize) {
        let ends: &'a Ends = self.ends;
        let (by_end, more, lives) = (&ends.by_end, &ends.more, self.lives);
        while self.e < upto {
            let e = self.e;
            // Entries with no end in `more`: the lives they ended, in bulk (the sums in
            // locals while the loop runs).
            let stop = upto.min(more.get(self.more_at).map_or(usize::MAX, |x| x.0)).max(e);
            let (mut cur, mut blk) = (self.cur, self.blk);
            while let Some(&k) = by_end.get(self.at) {
                let end = ends.end_of(lives, k);
                if end >= stop {
                    break;
                }
                let (r, q, size) = self.gone(k as usize);
                cur[r] -= q;
                blk -= size;
                if q < 0 || size < 0 {
                    self.hi.read(end + 1, 1 << r, &cur, blk);
                }
                self.at += 1;
            }
            (self.cur, self.blk, self.e) = (cur, blk, stop);
            if stop < upto {
                let (touched, raised) = self.end_entry(stop);
                if raised {
                    self.hi.read(stop + 1, touched, &self.cur, self.blk);
                }
                self.e = stop + 1;
            }
        }
    }
}

fn summarize_with(snap: &Snapshot, lives: &BlockLives, roles: &Roles, st: &Steps, ix: &LifeIndex) -> DeviceRoles {
    let req = &ix.req;
    let (max, peak, peak_state, at_peak) = sweep(lives, roles, ix, snap.trace(lives.device).len());
    // Blocks, bytes and confidence by role and reason.
    // Tallied in an array by reason (a map entry per block was a visible cost on
    // millions of blocks), then the reasons met, in their order.
    const REASONS: usize = Reason::OtherUndecided as usize + 1;
    let mut tally = [(None::<Reason>, 0u64, 0u64); REASONS];
    let mut count = |r: Reason, bytes: u64| {
        let x = &mut tally[r as usize];
        x.0 = Some(r);
        x.1 += 1;
        x.2 += bytes;
    };
    for (b, r) in lives.seeded.iter().zip(&roles.seeded) {
        count(r.reason, b.request);
    }
    for (&q, r) in req.iter().zip(&roles.traced) {
        count(r.reason, q);
    }
    let by_reason: BTreeMap<Reason, (u64, u64)> =
        tally.iter().filter_map(|&(r, blocks, bytes)| r.map(|r| (r, (blocks, bytes)))).collect();
    let mut by_role: BTreeMap<&'static str, RoleBytes> = BTreeMap::new();
    for role in Role::ALL {
        let k = role as usize;
        let mut evidence: Vec<RoleEvidence> = by_reason
            .iter()
            .filter(|(r, _)| r.role() == role)
            .map(|(r, &(blocks, bytes))| RoleEvidence { evidence: *r, blocks, bytes, confidence: r.confidence() })
            .collect();
        evidence.sort_by_key(|x| std::cmp::Reverse(x.bytes));
        let bytes: u64 = evidence.iter().map(|x| x.bytes).sum();
        let confidence = if bytes == 0 {
            0.0
        } else {
            evidence.iter().map(|x| x.confidence * x.bytes as f64).sum::<f64>() / bytes as f64
        };
        by_role.insert(
            role.as_str(),
            RoleBytes {
                at_peak: at_peak[k].max(0) as u64,
                max: max[k].max(0) as u64,
                blocks: evidence.iter().map(|x| x.blocks).sum(),
                confidence: (confidence * 100.0).round() / 100.0,
                evidence,
                cannot_tell: roles.cannot_tell.get(&role).cloned(),
            },
        );
    }
    DeviceRoles {
        device: lives.device,
        steps: st.describe(),
        step_count: st.steps.len(),
        peak_state,
        peak_allocated: peak.max(0) as u64,
        by_role,
        at_oom: None,
        model_state: roles.model_state.clone(),
    }
}

/// Steps, lives and roles of one device, from scratch (for callers without a walk of
/// their own to take the lives from).
pub fn device_roles(snap: &Snapshot, device: i64) -> DeviceRoles {
    let lives = BlockLives::replay(snap, device);
    device_roles_with(snap, &lives).0
}

/// [`device_roles`] from the lives of a walk already made; also returns the steps and
/// each block's role.
pub fn device_roles_with(snap: &Snapshot, lives: &BlockLives) -> (DeviceRoles, Steps, Roles) {
    let mut ev = StackEvidence::new(snap);
    let st = steps::steps_with(snap, lives.device, &mut ev);
    let ix = LifeIndex::new(snap, lives);
    let roles = classify_with(snap, lives, &st, &mut ev, &ix, None);
    (summarize_with(snap, lives, &roles, &st, &ix), st, roles)
}

/// The lives of `device`'s blocks and each one's role, as `summary` gets them (one
/// lifetime walk that builds the roles' index as it goes, and the steps with the stacks'
/// evidence they gathered, which the classifier reads again), without the sums by role
/// ([`DeviceRoles`]) that callers needing only each block's role do not read. `export`'s
/// per-allocation roles: [`classify`] on the lives of [`BlockLives::replay`] reads the
/// trace once more for the index (`LifeIndex::new`, ~40 % of `export`'s page faults on a
/// 6.9 M-entry trace) and gathers the stacks' evidence twice.
///
/// The steps (and rule 8's passes) read only the trace: they are found on a thread of
/// their own beside the lifetime walk, as `summary`'s steps thread finds them.
pub fn device_block_roles(snap: &Snapshot, device: i64) -> (BlockLives, Roles) {
    let ((lives, facts, parts), (st, mut ev, layered)) = std::thread::scope(|s| {
        let steps = s.spawn(|| steps_and_passes(snap, device));
        let walk = BlockLives::replay_with_facts(snap, device, true);
        (walk, steps.join().expect("the steps thread panicked"))
    });
    drop(facts);
    let ix = LifeIndex::from_walk_or_new(snap, &lives, parts);
    let roles = classify_with(snap, &lives, &st, &mut ev, &ix, Some(layered));
    (lives, roles)
}

/// The steps of `device`'s trace, the stacks' evidence they gathered (the classifier reads
/// it again) and rule 8's forward passes with their layers ([`passes::layered`], which read
/// only the trace and the steps): what `summary` computes on its steps' thread and
/// [`device_block_roles`] before classifying.
pub(crate) fn steps_and_passes<'s>(snap: &'s Snapshot, device: i64) -> (Steps, StackEvidence<'s>, passes::Layered) {
    let mut ev = StackEvidence::new(snap);
    let st = steps::steps_with(snap, device, &mut ev);
    let layered = passes::layered(snap.trace(device), passes::unbounded(&st));
    (st, ev, layered)
}

/// What the roles read besides the lives, from the trace alone: the steps, the stacks'
/// evidence they gathered (the classifier reads it again) and rule 8's forward passes
/// with their layers ([`roles_prep`]). For a caller that finds them on another thread
/// while the lives are being made (`analyze` beside its timeline's walk), as `summary`
/// does: [`device_roles_prepared`] then classifies without finding them again.
pub struct RolesPrep<'s> {
    pub steps: Steps,
    ev: StackEvidence<'s>,
    layered: Option<passes::Layered>,
}

/// [`RolesPrep`] of `device`'s trace.
pub fn roles_prep(snap: &Snapshot, device: i64) -> RolesPrep<'_> {
    let (steps, ev, layered) = steps_and_passes(snap, device);
    RolesPrep { steps, ev, layered: Some(layered) }
}

/// The roles of `device` from its lives and what [`roles_prep`] found, with the index of
/// the lives the timeline's walk made with them ([`crate::OnLives`]; `None`: made here
/// from the lives). Its passes are taken: a second call finds them again.
pub fn device_roles_prepared(
    snap: &Snapshot,
    lives: &BlockLives,
    prep: &mut RolesPrep,
    index: Option<crate::LivesIndex>,
) -> (DeviceRoles, Roles) {
    let RolesPrep { steps, ev, layered } = prep;
    device_roles_from_ev(snap, lives, steps, ev, index.map(|i| i.0), layered.take())
}

/// [`device_roles_with`] with the steps already found.
pub fn device_roles_from(snap: &Snapshot, lives: &BlockLives, st: &Steps) -> (DeviceRoles, Roles) {
    device_roles_from_ev(snap, lives, st, &mut StackEvidence::new(snap), None, None)
}

/// [`device_roles_from`] with the stacks' evidence the steps gathered, the index of the
/// lives when the lifetime walk made it, and rule 8's passes with their layers when the
/// steps' thread found them ([`passes::layered`]).
pub(crate) fn device_roles_from_ev(
    snap: &Snapshot,
    lives: &BlockLives,
    st: &Steps,
    ev: &mut StackEvidence,
    parts: Option<LifeIndexParts>,
    layered: Option<passes::Layered>,
) -> (DeviceRoles, Roles) {
    let ix = LifeIndex::from_walk_or_new(snap, lives, parts);
    let roles = classify_with(snap, lives, st, ev, &ix, layered);
    (summarize_with(snap, lives, &roles, st, &ix), roles)
}

/// "parameters 12.7 GiB, gradients 12.7 GiB, ..." of the roles with bytes in `v`
/// (as [`bytes_at`] returns), largest first.
pub fn describe_bytes(v: &[u64; 7], fmt: impl Fn(u64) -> String) -> String {
    let mut r: Vec<(Role, u64)> = Role::ALL.iter().map(|&r| (r, v[r as usize])).filter(|x| x.1 > 0).collect();
    r.sort_by_key(|x| std::cmp::Reverse(x.1));
    r.iter().map(|(role, b)| format!("{} {}", role.as_str().replace('_', " "), fmt(*b))).collect::<Vec<_>>().join(", ")
}

/// The roles as text, for `analyze` and `summary`: the steps, then one line per role
/// with bytes (`fmt`), its confidence and its main evidence.
pub fn text(r: &DeviceRoles, fmt: impl Fn(u64) -> String) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let _ = writeln!(o, "  Steps: {}.", r.steps);
    let _ = writeln!(o, "  {:<16} {:>12} {:>12}  {:>4}  evidence (most bytes)", "role", "at peak", "max", "conf");
    let mut rows: Vec<(&&str, &RoleBytes)> =
        r.by_role.iter().filter(|(_, b)| b.blocks > 0 || b.cannot_tell.is_some()).collect();
    rows.sort_by_key(|x| std::cmp::Reverse(x.1.max));
    for (name, b) in rows {
        match &b.cannot_tell {
            None => {
                let _ = writeln!(
                    o,
                    "  {:<16} {:>12} {:>12}  {:.2}  {}",
                    name,
                    fmt(b.at_peak),
                    fmt(b.max),
                    b.confidence,
                    b.evidence.first().map_or("", |e| e.evidence.describe())
                );
            }
            // A lower bound: say so rather than print it as the total.
            Some(why) => {
                let _ = writeln!(
                    o,
                    "  {:<16} {:>12} {:>12}  {:>4}  cannot tell: {why}",
                    name,
                    format!(">= {}", fmt(b.at_peak)),
                    format!(">= {}", fmt(b.max)),
                    "-"
                );
            }
        }
    }
    if let Some(m) = &r.model_state {
        let _ = writeln!(o, "  Model state (from the sizes of the blocks kept through the trace): {}.", m.describe());
    }
    if let Some(at) = &r.at_oom {
        let v: [u64; 7] = std::array::from_fn(|k| at.get(Role::ALL[k].as_str()).copied().unwrap_or(0));
        let _ = writeln!(o, "  At the OOM: {}.", describe_bytes(&v, &fmt));
    }
    let _ = writeln!(
        o,
        "  (tensor bytes; \"at peak\" at the allocated peak, \"max\" the most the role held at any moment)"
    );
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lives::SeededLife;
    use fragscope_snapshot::{Action, TraceEvent};

    /// The sweep as it was first written, every state read in full: the definition
    /// [`sweep`] is held to.
    fn sweep_by_states(lives: &BlockLives, roles: &Roles, ix: &LifeIndex, entries: usize) -> Figures {
        const TEMP: usize = Role::Temporaries as usize;
        let req = &ix.req;
        let mut moves: Vec<(usize, usize)> = roles.from_state.iter().map(|(&i, &f)| (f, i)).collect();
        moves.sort_unstable();
        let mut cur = [0i64; 7];
        let mut blk: i64 = 0;
        for (b, r) in lives.seeded.iter().zip(&roles.seeded) {
            cur[r.role as usize] += b.request as i64;
            blk += b.size as i64;
        }
        let mut max = cur;
        let (mut peak, mut peak_state, mut at_peak) = (blk, 0usize, cur);
        let last = entries
            .max(ix.ends.more.last().map_or(0, |x| x.0 + 1))
            .max(moves.last().map_or(0, |x| x.0))
            .max(lives.traced.last().map_or(0, |l| l.alloc() + 1));
        let (mut a, mut m) = (0usize, 0usize);
        for s in 1..=last {
            while a < lives.traced.len() && lives.traced[a].alloc() + 1 == s {
                let role = if roles.from_state.contains_key(&a) { TEMP } else { roles.traced[a].role as usize };
                cur[role] += req[a] as i64;
                blk += lives.traced[a].size as i64;
                a += 1;
            }
            ix.ends.each_in(lives, s - 1..s, |_, life| {
                let (role, q, size) = match life {
                    Ended::Traced(i) => (roles.traced[i].role, req[i], lives.traced[i].size),
                    Ended::Seeded(i) => (roles.seeded[i].role, lives.seeded[i].request, lives.seeded[i].size),
                };
                cur[role as usize] -= q as i64;
                blk -= size as i64;
            });
            while m < moves.len() && moves[m].0 == s {
                let i = moves[m].1;
                cur[TEMP] -= req[i] as i64;
                cur[roles.traced[i].role as usize] += req[i] as i64;
                m += 1;
            }
            for k in 0..7 {
                max[k] = max[k].max(cur[k]);
            }
            if blk > peak {
                (peak, peak_state, at_peak) = (blk, s, cur);
            }
        }
        (max, peak, peak_state, at_peak)
    }

    #[test]
    fn the_sweep_reads_the_figures_of_every_state() {
        // Random lives over a short trace: several ending at one entry (the `more`
        // list), ends past the trace, moves before, at and after a block's end, now
        // and then a size past i64 (an end that raises a figure; near u64::MAX, so that
        // the sums stay small and debug builds do not overflow).
        let mut rng = fragscope_testdata::Rng(19);
        let reasons = [Reason::ParamSetupMatchesGradient, Reason::GradOutlivesBackward, Reason::TempFreedInPhase];
        for round in 0..500 {
            let n = rng.below(40);
            let mut snap = Snapshot::default();
            let size = |rng: &mut fragscope_testdata::Rng| {
                if round % 3 == 1 && rng.below(8) == 0 {
                    u64::MAX - rng.below(1000) as u64
                } else {
                    1 + rng.below(5000) as u64
                }
            };
            let trace: Vec<TraceEvent> = (0..n).map(|_| TraceEvent::new(Action::Alloc, 0, size(&mut rng))).collect();
            snap.device_traces.push(trace);
            let end = |rng: &mut fragscope_testdata::Rng, from: usize| match rng.below(4) {
                0 => LIVE_AT_END,
                _ => from + rng.below(n + 3),
            };
            let sparse = 2 + round % 3;
            let mut allocs: Vec<usize> = (0..n).filter(|_| rng.below(sparse) == 0).collect();
            allocs.dedup();
            let traced: Vec<TracedLife> =
                allocs.iter().map(|&a| TracedLife::new(a, end(&mut rng, a + 1), size(&mut rng))).collect();
            let seeded: Vec<SeededLife> = (0..rng.below(4))
                .map(|_| SeededLife {
                    address: 0,
                    size: size(&mut rng),
                    request: size(&mut rng),
                    stack: None,
                    end: end(&mut rng, 0),
                })
                .collect();
            let role = |rng: &mut fragscope_testdata::Rng| BlockRole::of(reasons[rng.below(reasons.len())]);
            let mut roles = Roles {
                seeded: seeded.iter().map(|_| role(&mut rng)).collect(),
                traced: traced.iter().map(|_| role(&mut rng)).collect(),
                from_state: HashMap::new(),
                cannot_tell: Default::default(),
                model_state: None,
            };
            for (i, l) in traced.iter().enumerate() {
                if rng.below(5) == 0 {
                    roles.from_state.insert(i, l.alloc() + 1 + rng.below(n + 2));
                }
            }
            let lives = BlockLives { device: 0, seeded, traced };
            let ix = LifeIndex::new(&snap, &lives);
            let want = sweep_by_states(&lives, &roles, &ix, n);
            assert_eq!(sweep(&lives, &roles, &ix, n), want, "round {round}");
            // Cut in two at every state.
            for mid in 0..n + 4 {
                assert_eq!(sweep_halves(&lives, &roles, &ix, n, Some(mid)), want, "round {round}, halves at {mid}");
            }
        }
    }

    #[test]
    fn the_walk_makes_the_index_of_the_lives() {
        // Random traces over a few addresses (an `alloc` at a live address, frees of
        // unknown blocks, a second `free_requested`, final blocks the trace never saw):
        // the index the lifetime walk makes is the one made from its lives.
        use fragscope_snapshot::{Block, BlockState, Segment, SegmentType};
        let mut rng = fragscope_testdata::Rng(31);
        let actions = [Action::Alloc, Action::FreeRequested, Action::FreeCompleted, Action::SegmentAlloc];
        let states = [BlockState::ActiveAllocated, BlockState::ActivePendingFree, BlockState::Inactive];
        let mut made_by_timeline = 0;
        for _ in 0..400 {
            let mut snap = Snapshot::default();
            let addrs: Vec<u64> = (0..1 + rng.below(6)).map(|k| 0x1000 * (k as u64 + 1)).collect();
            let trace: Vec<TraceEvent> = (0..rng.below(60))
                .map(|_| {
                    let a = actions[rng.below(actions.len())];
                    TraceEvent::new(a, addrs[rng.below(addrs.len())], 1 + rng.below(3 << 20) as u64)
                })
                .collect();
            let mut blocks = Vec::new();
            for &a in addrs.iter().chain(&[0x9000_0000]) {
                if rng.below(2) == 0 {
                    let size = 512 * (1 + rng.below(8) as u64);
                    let state = states[rng.below(3)];
                    blocks.push(Block {
                        address: a,
                        size,
                        requested_size: Some(size),
                        state,
                        stack: None,
                        history: None,
                    });
                }
            }
            if !blocks.is_empty() {
                snap.segments.push(Segment {
                    device: 0,
                    address: 0,
                    total_size: 1 << 32,
                    allocated_size: 0,
                    active_size: 0,
                    requested_size: None,
                    stream: 0,
                    segment_type: SegmentType::Large,
                    segment_pool_id: Some((0, 0)),
                    is_expandable: Some(false),
                    stack: None,
                    blocks,
                });
            }
            snap.device_traces.push(trace);
            let (lives, _, parts) = BlockLives::replay_with_facts(&snap, 0, true);
            let parts = parts.expect("a short trace has its index");
            assert_eq!(
                LifeIndex::from_walk(&lives, parts),
                LifeIndex::new(&snap, &lives),
                "{:?}",
                snap.device_traces[0]
            );
            // The timeline's walk makes it too, for the caller it tells the lives.
            let mut told = None;
            let opts = crate::TimelineOptions::default();
            crate::timeline_with_lives_then(&snap, 0, &opts, &mut |l, ix| told = Some((std::sync::Arc::clone(l), ix)));
            let (tl_lives, ix) = told.expect("the timeline tells its lives");
            assert_eq!(*tl_lives, lives, "{:?}", snap.device_traces[0]);
            if let Some(ix) = ix {
                made_by_timeline += 1;
                assert_eq!(
                    LifeIndex::from_walk(&lives, ix.0),
                    LifeIndex::new(&snap, &lives),
                    "{:?}",
                    snap.device_traces[0]
                );
            }
        }
        // Dropped only where two lives end at one entry.
        assert!(made_by_timeline > 300, "{made_by_timeline} of 400 timelines made the index");
    }

    /// A minimal hand-built trace for the rules: `n` entries, each an `alloc` of its own
    /// size (512 × (i + 1)) unless a block below is given a request; steps of the given
    /// phases; the blocks the trace makes (in `alloc` order) and those live before it,
    /// with frames when a rule reads them. Entries need not be the frees that end the
    /// lives: the rules read the lives.
    struct Mini {
        snap: Snapshot,
        steps: Vec<crate::steps::Step>,
        phase_of: Vec<Phase>,
        traced: Vec<TracedLife>,
        seeded: Vec<SeededLife>,
    }

    /// Frames, innermost first, as PyTorch records them.
    type Frames<'a> = &'a [(&'a str, i64, &'a str)];

    impl Mini {
        fn new(n: usize) -> Self {
            let mut snap = Snapshot::default();
            snap.device_traces.push((0..n).map(|i| TraceEvent::new(Action::Alloc, 0, 512 * (i as u64 + 1))).collect());
            Mini { snap, steps: Vec::new(), phase_of: vec![Phase::Outside; n], traced: Vec::new(), seeded: Vec::new() }
        }

        /// A step of these phases (phase, first entry, one past the last), in order.
        fn step(mut self, phases: &[(Phase, usize, usize)]) -> Self {
            use crate::steps::{PhaseSpan, Step};
            for &(p, s, e) in phases {
                self.phase_of[s..e].fill(p);
            }
            let spans: Vec<PhaseSpan> =
                phases.iter().map(|&(phase, start, end)| PhaseSpan { phase, start, end }).collect();
            let (start, end) = (spans[0].start, spans.last().unwrap().end);
            self.steps.push(Step { start, end, phases: spans, complete: true, layers: None });
            self
        }

        /// The last step is one the recording began inside.
        fn begun_inside(mut self) -> Self {
            self.steps.last_mut().unwrap().complete = false;
            self
        }

        fn stack(&mut self, frames: Frames) -> Option<fragscope_snapshot::StackId> {
            (!frames.is_empty()).then(|| self.snap.frames.intern_py_stack(frames))
        }

        /// A block the trace makes at entry `alloc` and ends at `end`: its request the
        /// entry's own size, or `request`.
        fn made(self, alloc: usize, end: usize) -> Self {
            let request = self.snap.device_traces[0][alloc].size;
            self.made_by(alloc, end, request, &[])
        }

        fn made_sized(self, alloc: usize, end: usize, request: u64) -> Self {
            self.made_by(alloc, end, request, &[])
        }

        fn made_by(mut self, alloc: usize, end: usize, request: u64, frames: Frames) -> Self {
            assert!(self.traced.last().is_none_or(|l| l.alloc() < alloc), "lives in `alloc` order");
            self.snap.device_traces[0][alloc].size = request;
            // A life's stack is its `alloc` entry's.
            self.snap.device_traces[0][alloc].stack = self.stack(frames);
            self.traced.push(TracedLife::new(alloc, end, request.max(512)));
            self
        }

        /// A block live before the trace, of `request` bytes, ended at `end`.
        fn before(self, request: u64, end: usize) -> Self {
            self.before_by(request, end, &[])
        }

        fn before_by(mut self, request: u64, end: usize, frames: Frames) -> Self {
            let stack = self.stack(frames);
            self.seeded.push(SeededLife { address: 0, size: request, request, stack, end });
            self
        }

        fn build(self) -> (Snapshot, BlockLives, Steps) {
            let st = Steps {
                device: 0,
                source: crate::steps::StepSource::Optimizer,
                evidence: Vec::new(),
                steps: self.steps,
                after_last_step: None,
                reason: None,
                phase_of: self.phase_of,
            };
            (self.snap, BlockLives { device: 0, traced: self.traced, seeded: self.seeded }, st)
        }

        /// Every rule, as `classify` runs them.
        fn classify(self) -> Roles {
            let (snap, lives, st) = self.build();
            classify(&snap, &lives, &st)
        }
    }

    /// A hand-built trace of `n` allocations (entry `i` of size 512 × (i + 1)), one
    /// step of the given phases, and the lives `traced` (alloc, end) and `seeded`
    /// (request, end), no frames.
    fn one_step(
        n: usize,
        phases: &[(Phase, usize, usize)],
        traced: &[(usize, usize)],
        seeded: &[(u64, usize)],
    ) -> (Snapshot, BlockLives, Steps) {
        let mut m = Mini::new(n).step(phases);
        for &(alloc, end) in traced {
            m = m.made(alloc, end);
        }
        for &(request, end) in seeded {
            m = m.before(request, end);
        }
        m.build()
    }

    fn reasons(roles: &[BlockRole]) -> Vec<Reason> {
        roles.iter().map(|r| r.reason).collect()
    }

    /// Rule 8's synthetic pair: a batch (entry 0), one forward pass of `layers` layers of
    /// five allocations (sizes 4096, 8192, 1024, 2048, 3072, the same each layer) that no
    /// step bounds, two entries after it. Each layer's first block is its output: kept
    /// until after the pass when `grad` (autograd saves it), else freed in the next layer
    /// (the last layer's, read by the head, after the pass). The next three are freed at
    /// once, within the layer; its fifth entry's block is not followed.
    fn forward_pass(layers: usize, grad: impl Fn(usize) -> bool) -> Roles {
        let pass_end = 1 + 5 * layers;
        let mut m = Mini::new(pass_end + 2);
        m.phase_of[1..pass_end].fill(Phase::Forward);
        m = m.made_sized(0, pass_end + 1, 100);
        for j in 0..layers {
            let a = 1 + 5 * j;
            let out_end = if grad(j) || j + 1 == layers { pass_end } else { a + 6 };
            m = m.made_sized(a, out_end, 4096);
            m = m.made_sized(a + 1, a + 2, 8192).made_sized(a + 2, a + 3, 1024).made_sized(a + 3, a + 4, 2048);
            m.snap.device_traces[0][a + 4].size = 3072;
        }
        m.classify()
    }

    #[test]
    fn rule_8_a_grad_enabled_pass_keeps_activations_a_no_grad_pass_none() {
        use Reason::*;
        let grad = forward_pass(6, |_| true);
        let r = reasons(&grad.traced);
        assert_eq!(r[0], InputBeforePass, "the batch, read by the pass and freed after it");
        for j in 0..6 {
            assert_eq!(r[1 + 4 * j..5 + 4 * j], [ActSavedInPass, TempFreedInPass, TempFreedInPass, TempFreedInPass]);
        }
        assert_eq!(r.len(), 25);
        let no_grad = forward_pass(6, |_| false);
        let r = reasons(&no_grad.traced);
        assert_eq!(r[0], InputBeforePass);
        assert!(!r.iter().any(|x| x.role() == Role::Activations), "{r:?}");
        assert_eq!(r[1..21].iter().filter(|&&x| x == TempNoGradPass).count(), 20, "{r:?}");
        // The last layer's output, read after the pass: kept past it, not an activation.
        assert_eq!(r[21], OtherOutlivesNoGradPass);
        assert_eq!(r[22..], [TempNoGradPass; 3]);
    }

    #[test]
    fn rule_8_layers_that_do_not_agree_or_too_few_decide_nothing() {
        use Reason::*;
        // Half the layers keep their output: neither a graph nor no_grad.
        let mixed = forward_pass(6, |j| j % 2 == 0);
        assert!(reasons(&mixed.traced)[1..].iter().all(|&x| x == OtherNoSteps));
        // Two layers: only the last two, which no_grad keeps too.
        let short = forward_pass(2, |_| true);
        assert!(reasons(&short.traced)[1..].iter().all(|&x| x == OtherNoSteps));
    }

    #[test]
    fn rule_1_reads_phase_and_lifetime() {
        use Phase::*;
        // Forward 1..4, backward 4..7, optimizer 7..9 of a trace of 10 entries.
        let (snap, lives, st) = one_step(
            10,
            &[(Forward, 1, 4), (Backward, 4, 7), (Optimizer, 7, 9)],
            &[(0, LIVE_AT_END), (1, 2), (2, 5), (4, 6), (5, LIVE_AT_END), (7, 8), (8, LIVE_AT_END)],
            &[],
        );
        let ix = LifeIndex::new(&snap, &lives);
        let mut ev = StackEvidence::new(&snap);
        let mut c = Classifier::new(&snap, &lives, &st, &mut ev, &ix, None);
        let found = c.by_phase_and_lifetime();
        use Reason::*;
        assert_eq!(
            reasons(&c.traced),
            [
                OtherUndecided, // made outside the phases: for the later rules
                TempFreedInPhase,
                ActKeptForBackward,
                TempFreedInPhase,
                GradOutlivesBackward,
                TempFreedInPhase,
                OptMadeInStepKept,
            ]
        );
        assert_eq!(found.outside, [0]);
        assert_eq!(found.grads, [4]);
        // The gradient's request: entry 5's.
        assert_eq!(found.grads_by_step[0].iter().map(|(&s, &c)| (s, c)).collect::<Vec<_>>(), [(3072, 1)]);
        assert_eq!(found.kept, [vec![(6, 8)]]);
    }

    #[test]
    fn rule_5_tells_inputs_from_temporaries_outside_the_phases() {
        use Phase::*;
        // Forward 3..5, backward 5..7: the forward pass starts at entry 3.
        let (snap, lives, st) = one_step(
            10,
            &[(Forward, 3, 5), (Backward, 5, 7)],
            &[(0, LIVE_AT_END), (1, 2), (2, LIVE_AT_END), (8, 9), (9, LIVE_AT_END)],
            &[(512, LIVE_AT_END)],
        );
        let ix = LifeIndex::new(&snap, &lives);
        let mut ev = StackEvidence::new(&snap);
        let mut c = Classifier::new(&snap, &lives, &st, &mut ev, &ix, None);
        // Decided by an earlier rule: left alone.
        c.traced[2] = BlockRole::of(Reason::ParamSetupMatchesGradient);
        c.outside_the_phases(&[0, 1, 2, 3, 4], false);
        use Reason::*;
        assert_eq!(
            reasons(&c.traced),
            [
                InputBeforeForward,        // live as the forward pass starts
                TempFreedBetweenSteps,     // freed before it
                ParamSetupMatchesGradient, // decided before
                TempFreedBetweenSteps,     // after the last step, freed in the trace
                OtherUndecided,            // after the last step, live at its end
            ]
        );
        assert_eq!(reasons(&c.seeded), [OtherBeforeTrace]);
    }

    // Each rule group on the smallest trace that fires it, and on a near miss. Sizes of
    // parameters (`R`, `P`) and of no parameter (`S`), apart from the entries' own.
    const R: u64 = 3 << 20;
    const P: u64 = 5 << 20;
    const S: u64 = 7 << 20;
    const END: usize = LIVE_AT_END;
    /// cuBLAS's workspace, from its C++ frames; and a matmul's frames without it.
    const CUBLAS: Frames = &[("??", 0, "at::cuda::getNewWorkspace()"), ("??", 0, "at::cuda::blas::gemm<float>")];
    const GEMM: Frames = &[("??", 0, "at::cuda::blas::gemm<float>")];
    const BUILT: Frames = &[("/u/model.py", 5, "__init__"), ("/u/train.py", 1, "main")];
    const ADAM: Frames = &[("/x/torch/optim/adam.py", 80, "_init_group"), ("/u/train.py", 9, "main")];

    /// Forward 2..4, backward 4..6, optimizer 6..8: set-up at entries 0 and 1.
    fn after_setup() -> Mini {
        Mini::new(9).step(&[(Phase::Forward, 2, 4), (Phase::Backward, 4, 6), (Phase::Optimizer, 6, 8)])
    }

    #[test]
    fn rule_0_a_library_workspace_is_no_tensor_of_the_model() {
        use Reason::*;
        // Live before the trace, a gradient's size: cuBLAS's workspace is `other`, the
        // block a matmul made without it (near miss) is the parameter.
        let roles = after_setup().made_sized(4, END, R).before_by(R, END, CUBLAS).before_by(R, END, GEMM).classify();
        assert_eq!(reasons(&roles.seeded), [OtherWorkspace, ParamBeforeTraceMatchesGradient]);
        // Traced (rule 1 meets it): kept past the backward pass that made it, still not a
        // gradient.
        let roles = after_setup().made_sized(0, END, R).made_by(4, END, R, CUBLAS).made_by(5, END, R, GEMM).classify();
        assert_eq!(reasons(&roles.traced), [ParamSetupMatchesGradient, OtherWorkspace, GradOutlivesBackward]);
    }

    #[test]
    fn rule_1_kept_past_the_phase_or_freed_in_it() {
        use Reason::*;
        // Two steps: forward 0..2, backward 2..4, optimizer 4..6; the same at 6..12.
        let m = Mini::new(14)
            .step(&[(Phase::Forward, 0, 2), (Phase::Backward, 2, 4), (Phase::Optimizer, 4, 6)])
            .step(&[(Phase::Forward, 6, 8), (Phase::Backward, 8, 10), (Phase::Optimizer, 10, 12)]);
        let (snap, lives, st) = m.build();
        let ix = LifeIndex::new(&snap, &lives);
        let mut ev = StackEvidence::new(&snap);
        let c = Classifier::new(&snap, &lives, &st, &mut ev, &ix, None);
        let spans = &c.spans;
        // Freed at the phase's end (the first entry after it) is kept past it; at its
        // last entry, freed in it.
        assert_eq!(made_in_backward(&st, spans, 0, 4), GradOutlivesBackward);
        assert_eq!(made_in_backward(&st, spans, 0, 3), TempFreedInPhase);
        assert_eq!(made_in_optimizer(&st, spans, 0, 6), OptMadeInStepKept);
        assert_eq!(made_in_optimizer(&st, spans, 0, 5), TempFreedInPhase);
        // Forward: live as backward starts (entry 2) and freed by the next step's end.
        assert_eq!(made_in_forward(&st, spans, 14, 0, 2), ActKeptForBackward);
        assert_eq!(made_in_forward(&st, spans, 14, 0, 1), TempFreedInPhase);
        assert_eq!(made_in_forward(&st, spans, 14, 0, 11), ActKeptForBackward);
        assert_eq!(made_in_forward(&st, spans, 14, 0, 12), OtherOutlivesStep);
        // The last step: freed in the trace, or kept to its end (less sure).
        assert_eq!(made_in_forward(&st, spans, 14, 1, 13), ActKeptForBackward);
        assert_eq!(made_in_forward(&st, spans, 14, 1, END), ActKeptLastStep);
    }

    #[test]
    fn rule_2_parameters_are_the_gradients_sizes_one_for_one() {
        use Reason::*;
        // Made in set-up, live as backward starts, a gradient's size: the parameter.
        let roles = after_setup().made_sized(0, END, R).made_sized(4, END, R).classify();
        assert_eq!(reasons(&roles.traced), [ParamSetupMatchesGradient, GradOutlivesBackward]);
        // Near misses: of no gradient's size, or freed before backward starts. The
        // gradient then has no parameter, and says so at lower confidence.
        for setup in [(S, END), (R, 3)] {
            let roles = after_setup().made_sized(0, setup.1, setup.0).made_sized(4, END, R).classify();
            assert_eq!(reasons(&roles.traced), [InputBeforeForward, GradOutlivesBackwardUnmatched], "{setup:?}");
        }
    }

    #[test]
    fn rule_2_a_kept_block_of_no_parameters_size_is_no_gradient() {
        use Reason::*;
        // The backward pass keeps a block of the parameter's size and one of no
        // parameter's (cuBLAS's workspace on the autograd thread, without its frames).
        let roles = after_setup().made_sized(0, END, R).made_sized(4, END, R).made_sized(5, END, S).classify();
        assert_eq!(reasons(&roles.traced), [ParamSetupMatchesGradient, GradOutlivesBackward, OtherBackwardNoParameter]);
    }

    #[test]
    fn rule_3_optimizer_state_made_before_the_first_step() {
        use Phase::*;
        use Reason::*;
        // Set-up 0..3: a parameter and Adam's two moments (made in its constructor), then
        // one step, whose backward makes the gradient.
        let step = [(Forward, 3, 5), (Backward, 5, 7), (Optimizer, 7, 9)];
        let m = Mini::new(10).step(&step).made_sized(0, END, R).made_sized(1, END, R).made_sized(2, END, R);
        let roles = m.made_sized(5, END, R).classify();
        assert_eq!(
            reasons(&roles.traced),
            [ParamSetupMatchesGradient, OptSetupCopiesOfParams, OptSetupCopiesOfParams, GradOutlivesBackward]
        );
        // Near miss: two parameters, and state that is not whole copies of them (one
        // moment of `P`): not state by its sizes; by the optimizer's frames, when made
        // there.
        let step = [(Forward, 5, 7), (Backward, 7, 9), (Optimizer, 9, 11)];
        for (frames, want) in [(&[][..], InputBeforeForward), (ADAM, OptSetupOptimizerFrames)] {
            let m = Mini::new(12).step(&step).made_sized(0, END, R).made_sized(1, END, P);
            let m = m.made_by(2, END, R, frames).made_by(3, END, R, frames).made_by(4, END, P, frames);
            let roles = m.made_sized(7, END, R).made_sized(8, END, P).classify();
            assert_eq!(
                reasons(&roles.traced)[..5],
                [ParamSetupMatchesGradient, ParamSetupMatchesGradient, want, want, want]
            );
        }
    }

    #[test]
    fn rule_3_optimizer_state_live_before_the_trace() {
        // The rule alone, on blocks no earlier rule decided: live as the first optimizer
        // step starts (entry 6), of the parameters' sizes.
        let m = after_setup().before(R, END).before(R, END).before(P, 1);
        let (snap, lives, st) = m.build();
        let ix = LifeIndex::new(&snap, &lives);
        let mut ev = StackEvidence::new(&snap);
        let mut c = Classifier::new(&snap, &lives, &st, &mut ev, &ix, None);
        c.optimizer_state_before_trace(&[(R, 1)].into_iter().collect(), 6);
        use Reason::*;
        assert_eq!(reasons(&c.seeded), [OptBeforeTraceCopiesOfParams, OptBeforeTraceCopiesOfParams, OtherUndecided]);
        // Near miss: with a parameter of `P` too, no copy of it is live then.
        let mut c = Classifier::new(&snap, &lives, &st, &mut ev, &ix, None);
        c.optimizer_state_before_trace(&[(R, 1), (P, 1)].into_iter().collect(), 6);
        assert_eq!(reasons(&c.seeded), [OtherUndecided; 3]);
    }

    #[test]
    fn rule_4_an_out_of_place_update_takes_the_role_it_replaces() {
        use Phase::*;
        use Reason::*;
        // The optimizer (4..7) makes a block of the parameter's size at 4 and frees the
        // parameter at 5 (`p.data = p - lr * g`); near miss: a block of no freed block's
        // size, made there and kept.
        let step = [(Forward, 1, 2), (Backward, 2, 4), (Optimizer, 4, 7)];
        let m = Mini::new(8).step(&step).made_sized(0, 5, R).made_sized(2, END, R);
        let (snap, lives, st) = m.made_sized(4, END, R).made_sized(6, END, S).build();
        let roles = classify(&snap, &lives, &st);
        assert_eq!(
            reasons(&roles.traced),
            [ParamSetupMatchesGradient, GradOutlivesBackward, ParamReplacedInStep, OptMadeInStepKept]
        );
        // A temporary of the step until the parameter it replaces is freed (state 6).
        assert_eq!(roles.from_state, [(2, 6)].into_iter().collect());
        let bytes = |state| bytes_at(&snap, &lives, &roles, state);
        assert_eq!(bytes(5)[Role::Parameters as usize], R);
        assert_eq!(bytes(5)[Role::Temporaries as usize], R);
        assert_eq!(bytes(6)[Role::Parameters as usize], R);
        assert_eq!(bytes(6)[Role::Temporaries as usize], 0);
    }

    #[test]
    fn rule_5_made_while_building_a_model_with_no_backward_pass() {
        use Reason::*;
        // No step: a block kept to the end, made in a constructor, is a parameter (low
        // confidence); without those frames (near miss), nothing decides it.
        let roles =
            Mini::new(3).made_by(0, END, R, BUILT).made_sized(1, END, R).before_by(R, END, BUILT).before(R, END);
        let roles = roles.classify();
        assert_eq!(reasons(&roles.traced), [ParamBuiltNoBackward, OtherUndecided]);
        assert_eq!(reasons(&roles.seeded), [ParamBuiltNoBackward, OtherBeforeTrace]);
        // Live at the next forward pass but made in a constructor: no input.
        let roles = after_setup().made_by(0, END, S, BUILT).made_sized(1, END, S).classify();
        assert_eq!(reasons(&roles.traced), [OtherUndecided, InputBeforeForward]);
    }

    #[test]
    fn rule_6_a_block_of_unknown_role_leaves_the_totals_open() {
        // No step, one block live before the trace: it could be a parameter, and no
        // backward pass gives their sizes.
        // Nor any other role: with no parameter size known, it could be a gradient or
        // a moment too (undecided is never zero), and each text counts all of it.
        let roles = Mini::new(2).before(R, END).classify();
        assert_eq!(
            roles.cannot_tell.keys().collect::<Vec<_>>(),
            [&Role::Parameters, &Role::Gradients, &Role::OptimizerState]
        );
        assert!(roles.cannot_tell[&Role::Parameters].ends_with("their sizes show no repeated layer"));
        assert!(roles.cannot_tell[&Role::Gradients].ends_with("no backward pass in the trace"));
        for why in roles.cannot_tell.values() {
            assert!(why.starts_with(&format!("{} live before", fragscope_alloc::format_size(R))), "{why}");
        }
        // Near misses: its frames say it was made in a forward pass; no such block.
        let forward: Frames = &[("/u/model.py", 3, "forward"), ("/u/train.py", 1, "main")];
        assert!(Mini::new(2).before_by(R, END, forward).classify().cannot_tell.is_empty());
        assert!(Mini::new(2).made(0, END).classify().cannot_tell.is_empty());
    }

    #[test]
    fn rule_6_a_step_begun_at_its_backward_pass_is_whole_when_its_optimizer_made_state_per_gradient() {
        use Phase::*;
        // A recording begun at `loss.backward()` of a first step: the parameters (`R`,
        // `P`) and an activation (2,000 B, freed in backward) live before the trace; the
        // backward pass makes `gradients` (entries 0 and 1), the optimizer's first step
        // Adam's two moments per parameter (entries 4 to 7), a 0-dim step counter kept
        // on the device (entry 8) and a temporary.
        let mini = |gradients: &[u64]| {
            let step = [(Backward, 0, 4), (Optimizer, 4, 11)];
            let mut m = Mini::new(11).step(&step).begun_inside();
            for (i, &g) in gradients.iter().enumerate() {
                m = m.made_sized(i, END, g);
            }
            m = m.made_sized(4, END, R).made_sized(5, END, R).made_sized(6, END, P).made_sized(7, END, P);
            m = m.made_sized(8, END, 4).made_sized(9, 10, R);
            m.before(R, END).before(P, END).before(2000, 1)
        };
        // Every gradient in the trace: the moments are two per gradient, so the step's
        // gradients are all here; every total is told.
        let roles = mini(&[R, P]).classify();
        assert!(roles.cannot_tell.is_empty(), "{:?}", roles.cannot_tell);
        assert_eq!(roles.seeded[..2].iter().map(|r| r.role).collect::<Vec<_>>(), [Role::Parameters; 2]);
        // Near misses: a gradient made before the trace (live before it, of `P`): its
        // moments are made all the same, one size the trace's gradients lack. And a step
        // whose optimizer makes no state (it was made by an earlier step).
        let roles = mini(&[R]).before(P, END).classify();
        assert_eq!(
            roles.cannot_tell.keys().collect::<Vec<_>>(),
            [&Role::Parameters, &Role::Gradients, &Role::OptimizerState]
        );
    }

    /// A model of `layers` layers (3 MLP, 4 attention matrices and 2 norms each), an
    /// embedding and a head and a final norm, `copies` times, live before a trace with
    /// no step, and one block of another size besides.
    fn model_before(layers: usize, copies: usize) -> Mini {
        model_before_in(Mini::new(2), layers, copies)
    }

    /// [`model_before`] in a trace of one's own.
    fn model_before_in(m: Mini, layers: usize, copies: usize) -> Mini {
        let (mlp, att, norm, vocab) = (3 * MIB_, MIB_, 4096, 5 * MIB_);
        let mut m = m.before(777, END);
        for _ in 0..copies {
            for _ in 0..layers {
                m = m.before(mlp, END).before(mlp, END).before(mlp, END);
                m = m.before(att, END).before(att, END).before(att, END).before(att, END);
                m = m.before(norm, END).before(norm, END);
            }
            m = m.before(vocab, END).before(vocab, END).before(norm, END);
        }
        m
    }
    const MIB_: u64 = 1 << 20;

    #[test]
    fn rule_7_the_layer_structure_gives_the_parameters_without_a_backward_pass() {
        use Reason::*;
        let one = 6 * (3 * 3 * MIB_ + 4 * MIB_ + 2 * 4096) + 2 * 5 * MIB_ + 4096;
        let roles = model_before(6, 1).classify();
        let m = roles.model_state.clone().expect("a structure");
        assert_eq!((m.layers, m.copies, m.copy_bytes), (6, 1, one));
        let reasons = reasons(&roles.seeded);
        assert_eq!(reasons[0], OtherBeforeTrace, "the odd block is no parameter");
        assert!(reasons[1..].iter().all(|&r| r == ParamLayerStructure), "{reasons:?}");
        // The block of another size cannot be a gradient (no parameter has its size),
        // nor is the parameters' total open.
        assert!(roles.cannot_tell.is_empty(), "{:?}", roles.cannot_tell);
        // Four copies: the weights counted, three copies gradients or optimizer state,
        // undecided, and the texts count them (and the odd block) whole.
        let roles = model_before(6, 4).classify();
        let m = roles.model_state.clone().expect("a structure");
        assert_eq!((m.layers, m.copies, m.copy_bytes), (6, 4, one));
        let count = |r: Reason| roles.seeded.iter().filter(|x| x.reason == r).count();
        assert_eq!((count(ParamModelStateCounted), count(OtherModelStateCopies)), (6 * 9 + 3, 3 * (6 * 9 + 3)));
        let undecided = fragscope_alloc::format_size(3 * one + 777);
        for role in [Role::Gradients, Role::OptimizerState] {
            let why = &roles.cannot_tell[&role];
            assert!(why.starts_with(&format!("{undecided} live before")) && why.contains("4 whole copies"), "{why}");
        }
        assert!(!roles.cannot_tell.contains_key(&Role::Parameters));
        // Near miss: without the repeated layers, nothing is decided.
        let roles = Mini::new(2).before(3 * MIB_, END).before(MIB_, END).classify();
        assert!(roles.model_state.is_none());
        assert!(roles.cannot_tell.contains_key(&Role::Parameters));
    }

    #[test]
    fn rule_7_two_copies_and_a_backward_pass_that_accumulates_into_them_are_parameters_and_gradients() {
        use Reason::*;
        // `model_before(6, 2)` and one forward and backward pass (entries 0..2, 2..70)
        // that keeps no gradient; its backward pass makes and frees a block of each of
        // the model's tensors (AccumulateGrad's new gradients, added into the live
        // `.grad`): the second copy is the gradients, and no role is left open. Near
        // miss: one of the vocabulary-sized tensors has no such block: undecided.
        let (mlp, att, norm, vocab) = (3 * MIB_, MIB_, 4096, 5 * MIB_);
        let mut one_copy: Vec<u64> = Vec::new();
        for _ in 0..6 {
            one_copy.extend([mlp, mlp, mlp, att, att, att, att, norm, norm]);
        }
        one_copy.extend([vocab, vocab, norm]);
        for whole in [true, false] {
            let trace = Mini::new(72).step(&[(Phase::Forward, 0, 2), (Phase::Backward, 2, 70)]);
            let mut m = model_before_in(trace, 6, 2);
            let made = if whole { &one_copy[..] } else { &one_copy[..one_copy.len() - 2] };
            for (j, &size) in made.iter().enumerate() {
                m = m.made_sized(2 + j, 3 + j, size);
            }
            let roles = m.classify();
            let count = |r: Reason| roles.seeded.iter().filter(|x| x.reason == r).count();
            if whole {
                assert_eq!((count(ParamModelStateCounted), count(GradAccumulatedBeforeTrace)), (57, 57));
                assert!(roles.cannot_tell.is_empty(), "{:?}", roles.cannot_tell);
            } else {
                assert_eq!((count(OtherModelStateCopies), count(GradAccumulatedBeforeTrace)), (57, 0));
                assert!(roles.cannot_tell.contains_key(&Role::Gradients));
            }
        }
    }

    #[test]
    fn before_the_trace_what_outlives_a_backward_pass_that_makes_every_gradient_is_none() {
        use Reason::*;
        // Two steps (forward, backward, optimizer: 1..7 and 8..13), each backward pass
        // making the gradients of `R` and `S`, freed at 7 and at the end; live before the
        // trace, the parameters and a block of `R` freed at 7, outside the phases, before
        // the second backward pass (the last batch, freed as the next is made). The first
        // backward pass made the gradient of `R`: the block is none (a parameter has one
        // `.grad`). Near miss: the first backward pass makes no gradient of `R` (a
        // recording begun inside it, after `R`'s): the block is the last step's gradient.
        for first_makes_r in [true, false] {
            let steps = [(Phase::Forward, 1, 3), (Phase::Backward, 3, 5), (Phase::Optimizer, 5, 7)];
            let mut m = Mini::new(14).step(&steps).step(&[
                (Phase::Forward, 8, 10),
                (Phase::Backward, 10, 12),
                (Phase::Optimizer, 12, 13),
            ]);
            if first_makes_r {
                m = m.made_sized(3, 7, R);
            }
            m = m.made_sized(4, 7, S).made_sized(10, END, R).made_sized(11, END, S);
            let roles = m.before(R, END).before(S, END).before(R, 7).classify();
            // Undecided, the batch is a second block of `R` live at the first backward
            // pass: the parameter of `R` is counted, the longest-lived.
            let (param, batch) = if first_makes_r {
                (ParamBeforeTraceCounted, OtherBeforeTrace)
            } else {
                (ParamBeforeTraceMatchesGradient, GradBeforeTraceFreedBeforeBackward)
            };
            assert_eq!(reasons(&roles.seeded), [param, ParamBeforeTraceMatchesGradient, batch]);
        }
    }

    #[test]
    fn rule_2_a_size_kept_from_one_backward_pass_only_leaves_the_parameters_matched() {
        // Two whole steps whose backward passes make the gradient of `R`; the first also
        // keeps a block of `S` that no parameter has (cuBLAS's workspace, made once).
        // Live before the trace: the parameter of `R` and a block of another size, of no
        // decided role. The parameters are told. Near miss: the second backward pass makes
        // a block of `S` too (as a gradient is made each step): whether a parameter of `S`
        // is missing is open.
        for again in [false, true] {
            let mut m = Mini::new(14)
                .step(&[(Phase::Forward, 1, 3), (Phase::Backward, 3, 5), (Phase::Optimizer, 5, 7)])
                .step(&[(Phase::Forward, 8, 10), (Phase::Backward, 10, 12), (Phase::Optimizer, 12, 13)])
                .made_sized(3, 7, R)
                .made_sized(4, END, S)
                .made_sized(10, END, R);
            if again {
                m = m.made_sized(11, END, S);
            }
            let roles = m.before(R, END).before(777, END).classify();
            assert_eq!(reasons(&roles.seeded)[0], Reason::ParamBeforeTraceMatchesGradient);
            assert_eq!(roles.cannot_tell.contains_key(&Role::Parameters), again, "{:?}", roles.cannot_tell);
        }
    }

    #[test]
    fn before_the_trace_parameters_and_state_by_count_and_by_frames() {
        use Reason::*;
        let grad = |m: Mini| m.made_sized(4, END, R);
        // Twice a gradient's size: a parameter and one state buffer, told apart by their
        // frames when they have them, else counted by size.
        let roles = grad(after_setup().before(R, END).before(R, END)).classify();
        assert_eq!(reasons(&roles.seeded), [ParamBeforeTraceCounted, OptBeforeTraceCounted]);
        let roles = grad(after_setup().before_by(R, END, ADAM).before_by(R, END, BUILT)).classify();
        assert_eq!(reasons(&roles.seeded), [OptBeforeTraceFrames, ParamBeforeTraceFrames]);
        // Near miss: three blocks for two gradients, no whole multiple: two parameters
        // counted, the third undecided.
        let m = after_setup().before(R, END).before(R, END).before(R, END).made_sized(4, END, R);
        let roles = m.made_sized(5, END, R).classify();
        assert_eq!(reasons(&roles.seeded), [ParamBeforeTraceCounted, ParamBeforeTraceCounted, OtherBeforeTrace]);
    }

    #[test]
    fn before_the_trace_gradients_freed_by_zero_grad() {
        use Reason::*;
        // Freed at entry 0, outside the phases (zero_grad), before a backward pass that
        // makes a gradient of its size: the last step's gradient. Near miss: two of them
        // for one gradient.
        let roles = after_setup().before(R, 0).before(R, END).made_sized(4, END, R).classify();
        assert_eq!(reasons(&roles.seeded), [GradBeforeTraceFreedBeforeBackward, ParamBeforeTraceMatchesGradient]);
        let roles = after_setup().before(R, 0).before(R, 0).made_sized(4, END, R).classify();
        assert_eq!(reasons(&roles.seeded), [OtherBeforeTrace, OtherBeforeTrace]);
    }

    #[test]
    fn before_the_trace_the_last_steps_gradients_by_size_and_by_their_zero_grad_frees() {
        use Reason::*;
        // Freed outside the phases before a backward pass that makes gradients of `R`
        // and `S`: two blocks of `R` for one gradient (the gradient, freed by
        // `zero_grad`, entry 0, and the last batch, freed at 1 as the next is made), one
        // of `S`. The zero_grad free is the gradient; `S` is decided whatever `R` holds.
        // Near miss: no zero_grad frames on the free, `R` undecided.
        let zero: Frames = &[("/x/torch/optim/optimizer.py", 9, "zero_grad"), ("/u/train.py", 1, "main")];
        for frames in [true, false] {
            let mut m = after_setup();
            if frames {
                m.snap.device_traces[0][0].stack = m.stack(zero);
            }
            let m = m.before(R, 0).before(R, 1).before(S, 0).before(R, END).before(S, END);
            let roles = m.made_sized(4, END, R).made_sized(5, END, S).classify();
            let r0 = if frames { GradBeforeTraceFreedBeforeBackward } else { OtherBeforeTrace };
            assert_eq!(
                reasons(&roles.seeded),
                [
                    r0,
                    OtherBeforeTrace,
                    GradBeforeTraceFreedBeforeBackward,
                    ParamBeforeTraceMatchesGradient,
                    ParamBeforeTraceMatchesGradient
                ]
            );
        }
    }

    #[test]
    fn before_the_trace_what_the_backward_pass_frees_or_a_forward_made_is_no_model_state() {
        use Reason::*;
        // A parameter and Adam's two moments of `R` live before the trace, and a fourth
        // block of `R`: an activation the backward pass (4..6) frees, or a workspace a
        // forward pass made (its frames) and kept. Neither is a copy of the parameter:
        // the parameter and two moments, counted. Near miss: the kept block without
        // frames, which the sizes alone count as a third copy.
        let forward: Frames = &[("/u/model.py", 3, "forward"), ("/u/train.py", 1, "main")];
        let model = || after_setup().before(R, END).before(R, END).before(R, END).made_sized(4, END, R);
        for m in [model().before(R, 5), model().before_by(R, END, forward)] {
            let roles = m.classify();
            assert_eq!(
                reasons(&roles.seeded),
                [ParamBeforeTraceCounted, OptBeforeTraceCounted, OptBeforeTraceCounted, OtherBeforeTrace]
            );
        }
        let roles = model().before(R, END).classify();
        assert_eq!(reasons(&roles.seeded)[3], OptBeforeTraceCounted);
    }

    #[test]
    fn before_the_trace_counted_parameters_are_the_longest_lived_of_their_size() {
        use Reason::*;
        // Gradients of `R` and `S`; before the trace a block of `R` freed after the step
        // (entry 8: the last logits, when the next are made), then the parameters. No
        // whole number of copies: per size as many parameters as gradients, the
        // longest-lived first; the logits undecided.
        let m = after_setup().before(R, 8).before(R, END).before(S, END);
        let roles = m.made_sized(4, END, R).made_sized(5, END, S).classify();
        assert_eq!(
            reasons(&roles.seeded),
            [OtherBeforeTrace, ParamBeforeTraceCounted, ParamBeforeTraceMatchesGradient]
        );
    }

    #[test]
    fn before_the_trace_a_parameter_replaced_before_the_first_backward_pass() {
        use Phase::*;
        use Reason::*;
        // The recording began in step 0's optimizer (0..2), which replaces the parameter
        // (freed at 1) with a block made at 0; step 1's backward makes its gradient. Near
        // miss: the block made there is of another size: no replacement.
        let run = |size| {
            let m = Mini::new(10).step(&[(Optimizer, 0, 2)]).begun_inside();
            let m = m.step(&[(Forward, 3, 5), (Backward, 5, 7), (Optimizer, 7, 9)]);
            m.before(R, 1).made_sized(0, END, size).made_sized(5, END, R).classify()
        };
        let roles = run(R);
        assert_eq!(reasons(&roles.seeded), [ParamBeforeTraceMatchesGradient]);
        assert_eq!(reasons(&roles.traced), [ParamReplacedInStep, GradOutlivesBackward]);
        let roles = run(S);
        assert_eq!(reasons(&roles.seeded), [OtherBeforeTrace]);
        assert_eq!(reasons(&roles.traced), [OptMadeInStepKept, GradOutlivesBackwardUnmatched]);
    }

    #[test]
    fn whole_copies_of_the_parameters() {
        let m = |v: &[(u64, usize)]| -> FxHashMap<u64, usize> { v.iter().copied().collect() };
        let params = m(&[(100, 2), (300, 1)]);
        // Adam's two moments: two buffers per parameter.
        assert!(whole_copies(&params, &m(&[(100, 4), (300, 2)])));
        assert!(whole_copies(&params, &m(&[(100, 2), (300, 1)])));
        // Not the same number of copies of every size, a size besides, or none.
        assert!(!whole_copies(&params, &m(&[(100, 4), (300, 1)])));
        assert!(!whole_copies(&params, &m(&[(100, 2), (300, 1), (7, 1)])));
        assert!(!whole_copies(&params, &m(&[])));
        assert!(!whole_copies(&m(&[]), &m(&[(100, 1)])));
    }

    #[test]
    fn a_replacement_takes_the_role_it_replaces() {
        assert_eq!(successor(Reason::ParamSetupMatchesGradient), Reason::ParamReplacedInStep);
        assert_eq!(successor(Reason::OptSetupCopiesOfParams), Reason::OptReplacedInStep);
        assert_eq!(successor(Reason::OptBeforeTraceCounted), Reason::OptBeforeTraceCounted);
        assert_eq!(successor(Reason::OtherUndecided), Reason::OtherReplacesUnknown);
    }
}
