//! Role-level what-ifs: the recorded training program changed the way its author would
//! change it, measured by replay. Each change is a transformation of the device's trace,
//! decided by the role of every block ([`fragscope_trace::Role`]) and the steps, phases and layers
//! of the program ([`fragscope_trace::steps`]); the transformed trace is replayed through the
//! allocator model ([`fragscope_replay::simulate_ops`]) under the recorded settings, from
//! the allocator state before the trace, beside a replay of the recording itself. The
//! result is **a model of the change, not a recording**, and says so ([`LABEL`]).
//!
//! The changes, exactly:
//!
//! * [`Change::ShardOptimizer`]`(N)` (ZeRO-1 style): every block whose role is
//!   `optimizer_state`, and every temporary the optimizer's step makes (the step runs on
//!   the rank's shard), is requested at `shard(size, N)` — its elements divided by N,
//!   rounded up to a whole element (4 bytes when the size is a multiple of 4, else 2,
//!   else 1), as a rank's slice of a flattened tensor is requested; the allocator then
//!   rounds it as it rounds any request. Blocks live before the trace are freed at the
//!   first entry and their shard requested there (their memory stays reserved: the
//!   cache held it). Lifetimes are unchanged.
//! * [`Change::ShardGradients`]`(N)` (ZeRO-2 style, with the above): every `gradients`
//!   block is requested at `shard(size, N)` from the moment it is made (as if reduced
//!   and scattered at once).
//! * [`Change::GradsSetToNone`]: `zero_grad(set_to_none=True)` before forward. A
//!   gradient block the recording keeps across a step boundary (live when the step's
//!   forward starts and still live when its backward starts) is freed where that forward
//!   starts, and requested again where the step's backward first writes it: where the
//!   backward pass frees the first temporary of the gradient's size (the incoming
//!   gradient that `AccumulateGrad` adds in place, and that PyTorch would keep as the new
//!   `.grad` instead), else where the backward pass starts (the earliest it can be
//!   written; then the saving is a lower bound).
//! * [`Change::Checkpoint`] (activation checkpointing of chosen layers, in forward order,
//!   0-based): the layers of each step's forward and backward passes come from
//!   [`fragscope_trace::layer_spans`] (forward layer `j` is backward layer `L−1−j`). The
//!   saved activations of a layer — `activations` blocks made inside its forward span —
//!   are freed where that span ends and requested again where the layer's backward span
//!   starts (or, for one the recording frees before then, where the backward layer that
//!   frees it starts), then freed where recorded. The last activation a layer makes is
//!   taken as its output, the next layer's input, which checkpointing keeps.
//!
//! Not modelled (each result lists them, [`RoleWhatIf::not_modelled`]): communication
//! buckets and the full-size gradient a rank holds while it is reduced (ZeRO-2), the
//! all-gather of updated parameters (ZeRO-1/2), the temporaries of the recomputed
//! forward (checkpointing), and any change of timing or of the kernels' own workspaces.
//!
//! Principal types: [`Change`], [`RoleWhatIf`], [`ChangeOutcome`]; entry point
//! [`simulate_changes`].

use std::collections::HashMap;

use fragscope_alloc::AllocatorConfig;
use fragscope_snapshot::{Action, Snapshot, TraceEvent};
use serde::Serialize;

use fragscope_replay::{simulate_ops, simulate_with, Op, SimOptions, WhatIf};
use fragscope_trace::{device_roles_with, layer_spans, BlockLives, Phase, Role, Roles, Steps, LIVE_AT_END};

/// How every role-level what-if is labelled.
pub(crate) const LABEL: &str =
    "a model of the change: the recorded trace transformed and replayed through the allocator model, not a recording";

/// What a role-level what-if leaves out (module doc).
pub(crate) const NOT_MODELLED: &[&str] = &[
    "communication buffers (all-reduce/reduce-scatter buckets, all-gathered parameters) of sharding",
    "the full-size gradient a rank holds until it is reduced (ZeRO-2 shards it at once)",
    "the temporaries of a checkpointed layer's recomputed forward",
    "changes of timing, streams or kernel workspaces",
];

/// Layers chosen for checkpointing, 0-based in forward order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Layers {
    All,
    Some(Vec<usize>),
}

/// Checkpointed layers [`Layers::parse`] does not take (the text as given).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayersError(pub String);

impl std::fmt::Display for LayersError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "invalid layers '{}': `all` or 0-based layers and ranges, e.g. 0,2,5-7", self.0)
    }
}

impl std::error::Error for LayersError {}

impl Layers {
    /// `all`, or a list of layers and ranges: `0,2,5-7`.
    pub fn parse(s: &str) -> Result<Layers, LayersError> {
        let s = s.trim();
        if s.eq_ignore_ascii_case("all") {
            return Ok(Layers::All);
        }
        let bad = || LayersError(s.to_string());
        let mut v = Vec::new();
        for part in s.split(',') {
            let part = part.trim();
            match part.split_once('-') {
                Some((a, b)) => {
                    let (a, b): (usize, usize) =
                        (a.trim().parse().map_err(|_| bad())?, b.trim().parse().map_err(|_| bad())?);
                    if a > b || b - a > 1_000_000 {
                        return Err(bad());
                    }
                    v.extend(a..=b);
                }
                None => v.push(part.parse().map_err(|_| bad())?),
            }
        }
        v.sort_unstable();
        v.dedup();
        Ok(Layers::Some(v))
    }
    fn describe(&self) -> String {
        match self {
            Layers::All => "all layers".into(),
            Layers::Some(v) if v.len() == 1 => format!("layer {}", v[0]),
            Layers::Some(v) => format!("layers {}", v.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(",")),
        }
    }
}

/// One change to the recorded program (module doc).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    ShardOptimizer(u32),
    ShardGradients(u32),
    GradsSetToNone,
    Checkpoint(Layers),
}

impl Change {
    pub fn describe(&self) -> String {
        match self {
            Change::ShardOptimizer(n) => format!("optimizer state sharded over {n} ranks (ZeRO-1)"),
            Change::ShardGradients(n) => format!("gradients sharded over {n} ranks (ZeRO-2)"),
            Change::GradsSetToNone => "zero_grad(set_to_none=True) before forward".into(),
            Change::Checkpoint(l) => format!("activation checkpointing of {}", l.describe()),
        }
    }
}

/// A rank's share of a tensor of `size` bytes over `n` ranks (module doc).
pub fn shard(size: u64, n: u32) -> u64 {
    let n = u64::from(n.max(1));
    let elem = if size.is_multiple_of(4) {
        4
    } else if size.is_multiple_of(2) {
        2
    } else {
        1
    };
    (size / elem).div_ceil(n) * elem
}

/// What one change did to the trace, or why it could not be made.
#[derive(Clone, Debug, Serialize)]
pub struct ChangeOutcome {
    pub change: String,
    pub applied: bool,
    /// Why it cannot be applied to this trace (`applied` false).
    pub cannot_apply: Option<String>,
    /// Blocks it changed.
    pub blocks: u64,
    /// Their requested bytes as recorded (each block once).
    pub bytes: u64,
    /// What it did, in words.
    pub detail: String,
}

/// The recording and the changed program, replayed (module doc).
#[derive(Clone, Debug, Serialize)]
pub struct RoleWhatIf {
    pub device: i64,
    pub label: &'static str,
    /// The steps the changes were placed by, in words.
    pub steps: String,
    pub changes: Vec<ChangeOutcome>,
    /// Whether any change was applied (else `changed` is `null`).
    pub applied: bool,
    /// The device size both replays ran on (`null`: unlimited).
    pub capacity: Option<u64>,
    /// The recorded trace replayed under the same settings and device.
    pub recorded: WhatIf,
    /// The transformed trace replayed.
    pub changed: Option<WhatIf>,
    /// Trace entry of the recording's first `oom`.
    pub recorded_oom: Option<usize>,
    /// Whether the changed program gets past the recorded OOM (`null`: no OOM recorded,
    /// or the replay of the recording does not reproduce it, so it cannot tell).
    pub oom_avoided: Option<bool>,
    /// With a capacity: whether the changed program runs without an OOM and within it.
    pub fits: Option<bool>,
    /// The result in one line.
    pub verdict: String,
    pub not_modelled: &'static [&'static str],
}

/// A block of the device: live before the trace, or made by the trace (its index in
/// [`BlockLives`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Life {
    Seeded(usize),
    Traced(usize),
}

/// What a transformation does to one block: its new request, and its gaps `(free
/// before entry f, request again before entry r)`, in order.
#[derive(Clone, Debug, Default)]
struct Plan {
    size: Option<u64>,
    gaps: Vec<(usize, usize)>,
}

struct Ctx<'a> {
    trace: &'a [TraceEvent],
    snap: &'a Snapshot,
    device: i64,
    lives: BlockLives,
    steps: Steps,
    roles: Roles,
}

impl Ctx<'_> {
    fn role(&self, l: Life) -> Role {
        match l {
            Life::Seeded(i) => self.roles.seeded[i].role,
            Life::Traced(i) => self.roles.traced[i].role,
        }
    }
    fn request(&self, l: Life) -> u64 {
        match l {
            Life::Seeded(i) => self.lives.seeded[i].request,
            Life::Traced(i) => self.trace[self.lives.traced[i].alloc()].size,
        }
    }
    /// Entry that ended its life ([`LIVE_AT_END`] when none did).
    fn end(&self, l: Life) -> usize {
        match l {
            Life::Seeded(i) => self.lives.seeded[i].end,
            Life::Traced(i) => self.lives.traced[i].end(),
        }
    }
    fn all(&self) -> impl Iterator<Item = Life> {
        (0..self.lives.seeded.len()).map(Life::Seeded).chain((0..self.lives.traced.len()).map(Life::Traced))
    }
}

type Plans = HashMap<Life, Plan>;

/// Why a change cannot be applied to the recording (`cannot_apply` of its outcome, in
/// words).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CannotApply {
    /// Sharding over fewer than 2 ranks.
    TooFewRanks(u32),
    /// No training step (`steps`: [`Steps::describe`]).
    NoStep {
        steps: String,
    },
    NoOptimizerState,
    NoGradient,
    /// One step, whose gradients are made in its own backward pass.
    OneStepGradients,
    /// The recording frees the gradients before forward already.
    NoGradientKept,
    NoForwardAndBackward,
    NoLayers,
    /// The two passes repeat different numbers of layers.
    LayersUnpaired {
        forward: usize,
        backward: usize,
    },
    /// A chosen layer past the model's `layers`.
    NoSuchLayer {
        layer: usize,
        layers: usize,
    },
    NoStepWithLayers,
    /// The chosen layers save nothing for backward but their outputs.
    NothingSaved,
}

impl std::fmt::Display for CannotApply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CannotApply::TooFewRanks(n) => write!(f, "sharding over {n} rank(s) changes nothing: give 2 or more"),
            CannotApply::NoStep { steps } => write!(f, "no training step in the trace ({steps})"),
            CannotApply::NoOptimizerState => f.write_str(
                "no optimizer state found (no block made by an optimizer's step and kept, nor \
                                          copies of the parameters made before it)",
            ),
            CannotApply::NoGradient => {
                f.write_str("no gradient found (no block made in a backward pass and kept, the size of a parameter)")
            }
            CannotApply::OneStepGradients => f.write_str(
                "one step, whose gradients are made in its backward pass: no step boundary they are kept across",
            ),
            CannotApply::NoGradientKept => f.write_str(
                "no gradient is kept across a step boundary: the recording already frees them before forward \
                 (zero_grad(set_to_none=True) is PyTorch's default since 2.0)",
            ),
            CannotApply::NoForwardAndBackward => f.write_str("no step with both a forward and a backward pass"),
            CannotApply::NoLayers => {
                f.write_str("no layers found: neither pass repeats a pattern of allocations (steps::layer_spans)")
            }
            CannotApply::LayersUnpaired { forward, backward } => write!(
                f,
                "the forward pass repeats {forward} layers and the backward pass {backward}: they cannot be paired"
            ),
            CannotApply::NoSuchLayer { layer, layers } => {
                write!(f, "layer {layer} does not exist: the model has {layers} layers (0-{})", layers - 1)
            }
            CannotApply::NoStepWithLayers => f.write_str("no step with layers"),
            CannotApply::NothingSaved => {
                f.write_str("the chosen layers keep no activation for backward besides their outputs")
            }
        }
    }
}

fn outcome(change: &Change, r: Result<(u64, u64, String), CannotApply>) -> ChangeOutcome {
    match r {
        Ok((blocks, bytes, detail)) => {
            ChangeOutcome { change: change.describe(), applied: true, cannot_apply: None, blocks, bytes, detail }
        }
        Err(why) => ChangeOutcome {
            change: change.describe(),
            applied: false,
            cannot_apply: Some(why.to_string()),
            blocks: 0,
            bytes: 0,
            detail: String::new(),
        },
    }
}

fn plan_shard(ctx: &Ctx, plans: &mut Plans, n: u32, what: Role) -> Result<(u64, u64, String), CannotApply> {
    if n < 2 {
        return Err(CannotApply::TooFewRanks(n));
    }
    let mut chosen: Vec<Life> = ctx.all().filter(|&l| ctx.role(l) == what).collect();
    if chosen.is_empty() {
        return Err(match (what, ctx.steps.steps.is_empty()) {
            (_, true) => CannotApply::NoStep { steps: ctx.steps.describe() },
            (Role::OptimizerState, _) => CannotApply::NoOptimizerState,
            _ => CannotApply::NoGradient,
        });
    }
    let whole = chosen.len();
    let mut temps = 0;
    if what == Role::OptimizerState {
        // The step runs on the shard: its temporaries shrink with it.
        for (i, l) in ctx.lives.traced.iter().enumerate() {
            if ctx.roles.traced[i].role == Role::Temporaries && ctx.steps.phase_at(l.alloc()) == Phase::Optimizer {
                chosen.push(Life::Traced(i));
                temps += 1;
            }
        }
    }
    let mut bytes = 0;
    for &l in &chosen {
        let q = ctx.request(l);
        bytes += q;
        plans.entry(l).or_default().size = Some(shard(q, n));
    }
    Ok((
        chosen.len() as u64,
        bytes,
        format!(
            "{whole} {} block(s){} requested at 1/{n} of their size",
            what.as_str().replace('_', " "),
            if temps > 0 { format!(" and {temps} temporaries of the optimizer's step") } else { String::new() }
        ),
    ))
}

fn plan_set_to_none(ctx: &Ctx, plans: &mut Plans) -> Result<(u64, u64, String), CannotApply> {
    let st = &ctx.steps;
    if st.steps.is_empty() {
        return Err(CannotApply::NoStep { steps: st.describe() });
    }
    let grads: Vec<Life> = ctx.all().filter(|&l| ctx.role(l) == Role::Gradients).collect();
    if grads.is_empty() {
        return Err(CannotApply::NoGradient);
    }
    let alloc_of = |l: Life| match l {
        Life::Seeded(_) => None,
        Life::Traced(i) => Some(ctx.lives.traced[i].alloc()),
    };
    let (mut blocks, mut bytes, mut gaps, mut matched) = (0u64, 0u64, 0u64, 0u64);
    let mut seen: std::collections::HashSet<Life> = Default::default();
    for s in &st.steps {
        let Some((bs, be)) = s.span(Phase::Backward) else { continue };
        let fs = s.span(Phase::Forward).map_or(s.start, |f| f.0);
        // Kept across the boundary: made before this step's forward, live until its backward.
        let kept: Vec<Life> =
            grads.iter().copied().filter(|&l| alloc_of(l).is_none_or(|a| a < fs) && ctx.end(l) >= bs).collect();
        if kept.is_empty() {
            continue;
        }
        // Where the backward pass frees each temporary of a gradient's size (the
        // incoming gradient AccumulateGrad adds), in order, by size.
        let mut frees: HashMap<u64, Vec<usize>> = HashMap::new();
        for (i, l) in ctx.lives.traced.iter().enumerate() {
            if l.alloc() >= bs
                && l.alloc() < be
                && ctx.roles.traced[i].role == Role::Temporaries
                && l.end() != LIVE_AT_END
                && l.end() < be
            {
                frees.entry(ctx.trace[l.alloc()].size).or_default().push(l.end());
            }
        }
        for v in frees.values_mut() {
            v.sort_unstable();
            v.reverse();
        }
        for l in kept {
            let q = ctx.request(l);
            let r = match frees.get_mut(&q).and_then(Vec::pop) {
                Some(e) if e < ctx.end(l) => {
                    matched += 1;
                    e
                }
                _ => bs,
            };
            if r <= fs || r > ctx.end(l) {
                continue;
            }
            plans.entry(l).or_default().gaps.push((fs, r));
            gaps += 1;
            if seen.insert(l) {
                blocks += 1;
                bytes += q;
            }
        }
    }
    if gaps == 0 {
        return Err(if st.steps.len() == 1 && grads.iter().all(|&l| alloc_of(l).is_some()) {
            CannotApply::OneStepGradients
        } else {
            CannotApply::NoGradientKept
        });
    }
    Ok((
        blocks,
        bytes,
        format!(
            "{gaps} gradient lifetime(s) cut at a step's forward: requested again where backward frees a temporary \
             of their size ({matched}) or where backward starts ({})",
            gaps - matched
        ),
    ))
}

fn plan_checkpoint(ctx: &Ctx, plans: &mut Plans, layers: &Layers) -> Result<(u64, u64, String), CannotApply> {
    let st = &ctx.steps;
    if st.steps.is_empty() {
        return Err(CannotApply::NoStep { steps: st.describe() });
    }
    let (mut blocks, mut bytes, mut kept_out, mut untouched, mut steps_done) = (0u64, 0u64, 0u64, 0u64, 0usize);
    let mut why_not: Option<CannotApply> = None;
    for s in &st.steps {
        if s.span(Phase::Backward).is_none() || s.span(Phase::Forward).is_none() {
            why_not.get_or_insert(CannotApply::NoForwardAndBackward);
            continue;
        }
        let fwd = layer_spans(ctx.snap, ctx.device, s, Phase::Forward);
        let bwd = layer_spans(ctx.snap, ctx.device, s, Phase::Backward);
        let (Some(fwd), Some(bwd)) = (fwd, bwd) else {
            why_not.get_or_insert(CannotApply::NoLayers);
            continue;
        };
        if fwd.len() != bwd.len() {
            why_not.get_or_insert(CannotApply::LayersUnpaired { forward: fwd.len(), backward: bwd.len() });
            continue;
        }
        let nl = fwd.len();
        let chosen: Vec<usize> = match layers {
            Layers::All => (0..nl).collect(),
            Layers::Some(v) => {
                if let Some(&bad) = v.iter().find(|&&j| j >= nl) {
                    why_not.get_or_insert(CannotApply::NoSuchLayer { layer: bad, layers: nl });
                    continue;
                }
                v.clone()
            }
        };
        steps_done += 1;
        // Backward layer starting before entry `e`, latest first: the layer that frees it.
        let bwd_layer_of = |e: usize| bwd.iter().rposition(|&(a, _)| a <= e);
        for j in chosen {
            let (fa, fb) = fwd[j];
            let mine: Vec<usize> = (ctx.lives.traced.partition_point(|l| l.alloc() < fa)
                ..ctx.lives.traced.partition_point(|l| l.alloc() < fb))
                .filter(|&i| ctx.roles.traced[i].role == Role::Activations)
                .collect();
            let Some((&out, saved)) = mine.split_last() else { continue };
            let _ = out; // the layer's output: the next layer's input, kept
            kept_out += 1;
            for &i in saved {
                let end = ctx.lives.traced[i].end();
                let mut r = bwd[nl - 1 - j].0;
                if end < r {
                    match bwd_layer_of(end) {
                        Some(k) => r = bwd[k].0,
                        None => {
                            untouched += 1;
                            continue;
                        }
                    }
                }
                if r <= fb || r > end {
                    untouched += 1;
                    continue;
                }
                plans.entry(Life::Traced(i)).or_default().gaps.push((fb, r));
                blocks += 1;
                bytes += ctx.trace[ctx.lives.traced[i].alloc()].size;
            }
        }
    }
    if steps_done == 0 {
        return Err(why_not.unwrap_or(CannotApply::NoStepWithLayers));
    }
    if blocks == 0 {
        return Err(CannotApply::NothingSaved);
    }
    Ok((
        blocks,
        bytes,
        format!(
            "{blocks} saved activation(s) freed at the end of their layer's forward and requested again at the start \
             of its backward, in {steps_done} step(s); {kept_out} layer output(s) kept{}",
            if untouched > 0 {
                format!("; {untouched} left as recorded (freed before any layer's backward)")
            } else {
                String::new()
            }
        ),
    ))
}

/// The stream of a block live before the trace: its segment's in the final state, else
/// the trace's first entry's.
fn seeded_stream(ctx: &Ctx, addr: u64) -> u64 {
    ctx.snap
        .segments
        .iter()
        .find(|s| s.device == ctx.device && s.address <= addr && addr < s.address + s.total_size)
        .map(|s| s.stream)
        .or_else(|| ctx.trace.first().map(|e| ctx.snap.stream(e)))
        .unwrap_or(0)
}

/// The transformed workload: the trace with each planned block's requests resized and
/// its gaps inserted (module doc).
fn transformed_ops(ctx: &Ctx, plans: &Plans) -> Vec<Op> {
    // Keys of blocks a gap re-allocates: above every device address.
    const SYNTHETIC: u64 = 1 << 62;
    let mut next_key = SYNTHETIC;
    // Inserted: (before entry, 0 = free / 1 = alloc, block).
    let mut ins: Vec<(usize, u8, Life)> = Vec::new();
    for (&l, p) in plans {
        if let (Life::Seeded(_), Some(_)) = (l, p.size) {
            ins.push((0, 0, l));
            ins.push((0, 1, l));
        }
        for &(f, r) in &p.gaps {
            ins.push((f, 0, l));
            ins.push((r, 1, l));
        }
    }
    ins.sort_unstable();
    // Per block: its current key, its first entry (the prototype of those inserted), its stream.
    let mut key: HashMap<Life, (u64, TraceEvent, u64)> = HashMap::new();
    let mut by_addr: HashMap<u64, Life> = HashMap::new();
    for (i, b) in ctx.lives.seeded.iter().enumerate() {
        by_addr.insert(b.address, Life::Seeded(i));
        let mut ev = TraceEvent::new(Action::Alloc, b.address, b.request);
        ev.stack = b.stack;
        key.insert(Life::Seeded(i), (b.address, ev, seeded_stream(ctx, b.address)));
    }
    let mut out = Vec::with_capacity(ctx.trace.len() + ins.len());
    let mut k = 0;
    let mut traced = 0usize;
    for (i, ev) in ctx.trace.iter().enumerate() {
        while k < ins.len() && ins[k].0 <= i {
            let (_, kind, l) = ins[k];
            k += 1;
            let Some((cur, proto, stream)) = key.get_mut(&l) else { continue };
            let (mut e, stream) = (*proto, *stream);
            if kind == 0 {
                e.addr = *cur;
                for a in [Action::FreeRequested, Action::FreeCompleted] {
                    e.action = a;
                    out.push(Op { at: i, inserted: true, ev: e, stream });
                }
            } else {
                next_key += 512;
                *cur = next_key;
                e.addr = next_key;
                e.action = Action::Alloc;
                e.size = plans[&l].size.unwrap_or(ctx.request(l));
                out.push(Op { at: i, inserted: true, ev: e, stream });
            }
        }
        let mut e = *ev;
        let stream = ctx.snap.stream(ev);
        match ev.action {
            Action::Alloc => {
                let l = Life::Traced(traced);
                traced += 1;
                by_addr.insert(ev.addr, l);
                if let Some(s) = plans.get(&l).and_then(|p| p.size) {
                    e.size = s;
                }
                key.insert(l, (ev.addr, e, stream));
            }
            Action::FreeRequested | Action::FreeCompleted => {
                if let Some(&l) = by_addr.get(&ev.addr) {
                    if let Some((cur, proto, _)) = key.get(&l) {
                        e.addr = *cur;
                        e.size = proto.size;
                    }
                    if ev.action == Action::FreeCompleted {
                        by_addr.remove(&ev.addr);
                    }
                }
            }
            _ => {}
        }
        out.push(Op { at: i, inserted: false, ev: e, stream });
    }
    out
}

/// Replays `device`'s recording and the recording changed by `changes` (module doc),
/// under `cfg`, on a device of `capacity` bytes (`None`: the recorded device's size when
/// the trace has an `oom` entry, else unlimited); `probes` as [`SimOptions::probes`],
/// read in both runs.
pub fn simulate_changes(
    snap: &Snapshot,
    device: i64,
    changes: &[Change],
    cfg: AllocatorConfig,
    capacity: Option<u64>,
    probes: &[usize],
) -> RoleWhatIf {
    let sets = [changes.to_vec()];
    simulate_change_sets(snap, device, &sets, cfg, capacity, probes).pop().expect("one set")
}

/// [`simulate_changes`] for several sets of changes, each replayed on its own against
/// one replay of the recording (the roles, steps and the recording's replay are made
/// once).
pub fn simulate_change_sets(
    snap: &Snapshot,
    device: i64,
    sets: &[Vec<Change>],
    cfg: AllocatorConfig,
    capacity: Option<u64>,
    probes: &[usize],
) -> Vec<RoleWhatIf> {
    let trace = snap.trace(device);
    let lives = BlockLives::replay(snap, device);
    let (_, steps, roles) = device_roles_with(snap, &lives);
    let ctx = Ctx { trace, snap, device, lives, steps, roles };
    let recorded_oom = trace.iter().position(|e| e.action == Action::Oom);
    let cap = capacity.or_else(|| recorded_oom.map(|_| fragscope_replay::capacity_for(snap, device, None, &cfg)));
    let mut probes = probes.to_vec();
    probes.sort_unstable();
    let opts = SimOptions { capacity: cap, probes, ..SimOptions::default() };
    let recorded = simulate_with(snap, device, cfg.clone(), &opts);
    sets.iter().map(|changes| one_set(&ctx, changes, &cfg, capacity, cap, &opts, &recorded, recorded_oom)).collect()
}

#[allow(clippy::too_many_arguments)]
fn one_set(
    ctx: &Ctx,
    changes: &[Change],
    cfg: &AllocatorConfig,
    capacity: Option<u64>,
    cap: Option<u64>,
    opts: &SimOptions,
    recorded: &WhatIf,
    recorded_oom: Option<usize>,
) -> RoleWhatIf {
    let mut plans = Plans::new();
    let mut outcomes = Vec::new();
    for c in changes {
        let r = match c {
            Change::ShardOptimizer(n) => plan_shard(ctx, &mut plans, *n, Role::OptimizerState),
            Change::ShardGradients(n) => plan_shard(ctx, &mut plans, *n, Role::Gradients),
            Change::GradsSetToNone => plan_set_to_none(ctx, &mut plans),
            Change::Checkpoint(l) => plan_checkpoint(ctx, &mut plans, l),
        };
        outcomes.push(outcome(c, r));
    }
    let applied = outcomes.iter().any(|o| o.applied);
    let changed = applied
        .then(|| simulate_ops(ctx.snap, ctx.device, cfg.clone(), opts, transformed_ops(ctx, &plans).into_iter()));
    let oom_avoided = match (recorded_oom, &changed) {
        (Some(r), Some(w)) if recorded.first_oom.as_ref().is_some_and(|o| o.index <= r) => {
            Some(w.first_oom.as_ref().is_none_or(|o| o.index > r) && w.recorded_ooms_that_fit > 0)
        }
        _ => None,
    };
    // Memory held before the trace is seeded whatever the device size: a run above the
    // capacity does not fit even without an OOM.
    let fits = match (capacity, &changed) {
        (Some(c), Some(w)) => Some(w.ooms == 0 && w.peak_reserved <= c),
        _ => None,
    };
    let fs = fragscope_alloc::format_size;
    let verdict = match &changed {
        None => format!(
            "not replayed: {}",
            outcomes
                .iter()
                .filter_map(|o| o.cannot_apply.as_ref().map(|w| format!("{}: {w}", o.change)))
                .collect::<Vec<_>>()
                .join("; ")
        ),
        Some(w) => {
            let mut v = format!(
                "peak reserved {} -> {}, peak allocated {} -> {}",
                fs(recorded.peak_reserved),
                fs(w.peak_reserved),
                fs(recorded.peak_allocated),
                fs(w.peak_allocated)
            );
            match (recorded_oom, oom_avoided) {
                (Some(_), Some(true)) => v.push_str("; the recorded OOM would be avoided"),
                (Some(_), Some(false)) => v.push_str("; the recorded OOM would not be avoided"),
                (Some(_), None) => v.push_str(&format!(
                    "; the replay of the recording does not run out of memory on {}: cannot tell whether the OOM \
                     would be avoided",
                    cap.map_or("an unlimited device".into(), fs)
                )),
                (None, _) => {}
            }
            if let (Some(c), Some(f)) = (capacity, fits) {
                v.push_str(&format!("; {} on {}", if f { "fits" } else { "does not fit" }, fs(c)));
            }
            if let Some(o) = outcomes.iter().find(|o| !o.applied) {
                v.push_str(&format!("; not applied: {} ({})", o.change, o.cannot_apply.as_deref().unwrap_or_default()));
            }
            if let Some(f) = reserved_floor(w) {
                v.push_str("; ");
                v.push_str(&f);
            }
            v
        }
    };
    RoleWhatIf {
        device: ctx.device,
        label: LABEL,
        steps: ctx.steps.describe(),
        changes: outcomes,
        applied,
        capacity: cap,
        recorded: recorded.clone(),
        changed,
        recorded_oom,
        oom_avoided,
        fits,
        verdict,
        not_modelled: NOT_MODELLED,
    }
}

/// When a replay's peak reserved is the memory reserved before the trace began (the
/// state before the trace is seeded as recorded, and a change of the program inside the
/// trace cannot lower it), says so, with the most the trace's own `cudaMalloc`s reach:
/// the changed program's peak reserved is then a floor set by the recording, not by the
/// change.
pub fn reserved_floor(w: &WhatIf) -> Option<String> {
    if w.reserved_before_trace == 0 || w.peak_reserved > w.reserved_before_trace {
        return None;
    }
    let fs = fragscope_alloc::format_size;
    let cached = w.reserved_before_trace.saturating_sub(w.allocated_before_trace);
    Some(format!(
        "peak reserved is the {} already reserved when the recording began ({} allocated, {} cached), which the \
         model keeps as recorded: a change inside the trace cannot lower it; {}",
        fs(w.reserved_before_trace),
        fs(w.allocated_before_trace),
        fs(cached),
        if w.peak_reserved_by_trace == 0 {
            "the trace's requests reserve no new memory".to_string()
        } else {
            format!("the trace's own cudaMallocs reach at most {} reserved", fs(w.peak_reserved_by_trace))
        }
    ))
}

/// The role-level what-ifs `analyze` replays (with `--what-if`, or at an exhaustion
/// OOM): the optimizer state sharded over 2, 4 and 8 ranks (ZeRO-1), with the gradients
/// too (ZeRO-2), `zero_grad(set_to_none=True)`, and checkpointing of every layer.
pub(crate) fn default_sets() -> Vec<Vec<Change>> {
    let mut v: Vec<Vec<Change>> = [2, 4, 8].iter().map(|&n| vec![Change::ShardOptimizer(n)]).collect();
    v.extend([2, 4, 8].iter().map(|&n| vec![Change::ShardOptimizer(n), Change::ShardGradients(n)]));
    v.push(vec![Change::GradsSetToNone]);
    v.push(vec![Change::Checkpoint(Layers::All)]);
    v
}

/// One row of [`RoleRows`]: one set of changes replayed, or why it cannot be.
#[derive(Clone, Debug, Serialize)]
pub struct RoleRow {
    /// The changes, in words, joined with " + ".
    pub change: String,
    pub applied: bool,
    /// Why (a change of the set) cannot be applied.
    pub cannot_apply: Option<String>,
    pub peak_reserved_bytes: Option<u64>,
    pub peak_allocated_bytes: Option<u64>,
    /// The most reserved just after a `cudaMalloc` of the trace's requests
    /// ([`WhatIf::peak_reserved_by_trace`]).
    pub peak_reserved_by_trace_bytes: Option<u64>,
    /// Why the peak reserved is a floor set by the recording ([`reserved_floor`]).
    pub reserved_floor: Option<String>,
    /// First request the changed program's replay could not serve.
    pub first_oom_index: Option<usize>,
    pub oom_avoided: Option<bool>,
}

/// Role-level what-ifs of one device as `analyze` shows them: each set of
/// [`default_sets`] replayed against one replay of the recording.
#[derive(Clone, Debug, Serialize)]
pub struct RoleRows {
    pub label: &'static str,
    pub steps: String,
    pub capacity_bytes: Option<u64>,
    pub recorded_peak_reserved_bytes: u64,
    pub recorded_peak_allocated_bytes: u64,
    pub recorded_first_oom_index: Option<usize>,
    /// One per set; a set that cannot be applied for a reason an earlier row gave is left
    /// out (ZeRO-1 at 4 and 8 ranks when there is no optimizer state).
    pub rows: Vec<RoleRow>,
    pub not_modelled: &'static [&'static str],
}

/// [`RoleRows`] of `device` on `capacity` bytes (`None`: as [`simulate_changes`]).
pub(crate) fn analyze_rows(snap: &Snapshot, device: i64, capacity: Option<u64>) -> RoleRows {
    let sets = default_sets();
    let cfg = fragscope_replay::recorded_config(snap);
    let runs = simulate_change_sets(snap, device, &sets, cfg, capacity, &[]);
    let first = &runs[0];
    let mut rows: Vec<RoleRow> = Vec::new();
    let mut refused_for: Vec<Option<String>> = Vec::new();
    for (set, w) in sets.iter().zip(&runs) {
        let refused = w.changes.iter().find(|c| !c.applied);
        let bare = refused.and_then(|c| c.cannot_apply.clone());
        // A set refused for a reason an earlier row gave says nothing new.
        if !w.applied && bare.is_some() && refused_for.contains(&bare) {
            continue;
        }
        if !w.applied {
            refused_for.push(bare.clone());
        }
        let why = refused.and_then(|c| {
            c.cannot_apply.as_ref().map(|y| if set.len() > 1 { format!("{}: {y}", c.change) } else { y.clone() })
        });
        rows.push(RoleRow {
            change: set.iter().map(Change::describe).collect::<Vec<_>>().join(" + "),
            applied: w.applied,
            cannot_apply: why,
            peak_reserved_bytes: w.changed.as_ref().map(|c| c.peak_reserved),
            peak_allocated_bytes: w.changed.as_ref().map(|c| c.peak_allocated),
            peak_reserved_by_trace_bytes: w.changed.as_ref().map(|c| c.peak_reserved_by_trace),
            reserved_floor: w.changed.as_ref().and_then(reserved_floor),
            first_oom_index: w.changed.as_ref().and_then(|c| c.first_oom.as_ref().map(|o| o.index)),
            oom_avoided: w.oom_avoided,
        });
    }
    // Every set refused for one reason (a trace without steps): one row says so for all.
    if rows.len() == 1 && !rows[0].applied && runs.iter().all(|w| !w.applied) {
        rows[0].change =
            "every role-level what-if (ZeRO-1/2 sharding, zero_grad(set_to_none=True), activation checkpointing)"
                .into();
    }
    RoleRows {
        label: LABEL,
        steps: first.steps.clone(),
        capacity_bytes: first.capacity,
        recorded_peak_reserved_bytes: first.recorded.peak_reserved,
        recorded_peak_allocated_bytes: first.recorded.peak_allocated,
        recorded_first_oom_index: first.recorded.first_oom.as_ref().map(|o| o.index),
        rows,
        not_modelled: NOT_MODELLED,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_are_whole_elements() {
        assert_eq!(shard(4096, 4), 1024);
        assert_eq!(shard(4100, 8), 516); // 1025 fp32 elements -> 129 each
        assert_eq!(shard(6, 4), 2); // 3 fp16 elements -> 1 each
        assert_eq!(shard(7, 2), 4);
        assert_eq!(shard(0, 4), 0);
    }

    /// With nothing planned the transformed workload is the recording: its replay gives
    /// the recording's figures exactly, at every probe too.
    #[test]
    fn the_empty_transformation_is_the_recording() {
        for name in ["niu-train3-ctx100-fp32.pickle", "kk-2.7b-step-ctx128-fp32.pickle"] {
            let Some(p) = fragscope_testdata::grid_file(name).filter(|p| p.is_file()) else { continue };
            let snap = fragscope_snapshot::read_path(&p).unwrap();
            let trace = snap.trace(0);
            let lives = BlockLives::replay(&snap, 0);
            let (_, steps, roles) = device_roles_with(&snap, &lives);
            let ctx = Ctx { trace, snap: &snap, device: 0, lives, steps, roles };
            let probes: Vec<usize> = (0..trace.len()).step_by(97).collect();
            let opts = SimOptions { probes, ..SimOptions::default() };
            let cfg = fragscope_replay::recorded_config(&snap);
            let a = simulate_with(&snap, 0, cfg.clone(), &opts);
            let ops = transformed_ops(&ctx, &Plans::new());
            assert_eq!(ops.len(), trace.len());
            let b = simulate_ops(&snap, 0, cfg, &opts, ops.into_iter());
            assert_eq!(
                (a.peak_reserved, a.peak_allocated, a.cuda_mallocs, a.cuda_frees, a.ooms),
                (b.peak_reserved, b.peak_allocated, b.cuda_mallocs, b.cuda_frees, b.ooms),
                "{name}"
            );
            assert_eq!(a.probes, b.probes, "{name}");
            assert!(a.probes.len() > 10);
        }
    }

    #[test]
    fn layers_parse() {
        assert_eq!(Layers::parse("all"), Ok(Layers::All));
        assert_eq!(Layers::parse("0,2,5-7"), Ok(Layers::Some(vec![0, 2, 5, 6, 7])));
        assert!(Layers::parse("3-1").is_err());
        assert!(Layers::parse("x").is_err());
        assert!(Layers::parse("").is_err());
    }
}
