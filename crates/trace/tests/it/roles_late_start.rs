//! Memory by role on recordings that begin after training started: users call
//! `_record_memory_history` after a warm-up step, or the ring buffer
//! (`max_entries`) kept only the last entries. The parameters, the optimizer's state and
//! (depending on where the recording began) the gradients of the last step and the
//! activations of the current one are then live before the trace, known only from the
//! final `segments`; without frames when recording began late, with them when the ring
//! buffer dropped the entries.
//!
//! Training loops of PyTorch 2.x shape are run through the allocator model
//! ([`Recorder`]), each block labelled with the role the program gave it; the trace then
//! begins at a chosen point of a later step. Every block's role must be its true role,
//! or `other` with a reason that says the evidence does not decide it — never a
//! confident wrong role; and where the evidence decides the totals, `by_role` must give
//! them exactly.

use std::collections::HashMap;

use fragscope_replay::Recorder;
use fragscope_snapshot::{Snapshot, StackId};
use fragscope_trace::{device_roles, device_roles_with, BlockLives, DeviceRoles, Reason, Role};

const MIB: u64 = 1 << 20;
/// Weights and biases of a small model: two of one size, to make sizes repeat.
const PARAMS: [u64; 6] = [8 * MIB, 8 * MIB, 4 * MIB, 2 * MIB, 4096, 4096];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Opt {
    /// `torch.optim.AdamW(foreach=True)`: its two moments per parameter made by
    /// `_init_group` in its first step, updated in place; `_multi_tensor_adamw`'s
    /// temporaries freed in the step.
    ForeachAdamW,
    /// A hand-written Adam that updates out of place (`p.data = p - lr * ...`): every
    /// step makes a new parameter and new moments and frees the old ones.
    OutOfPlaceAdam,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Begin {
    /// After the warm-up step's `optimizer.step()`, before the next `zero_grad`: the
    /// last step's gradients are live before the trace and freed at its start.
    AfterOptimizerStep,
    /// After `zero_grad(set_to_none=True)`: no gradient live before the trace.
    AfterZeroGrad,
    /// Inside the forward pass (a ring buffer cut): activations of the step live before.
    InForward,
    /// Inside the backward pass: activations and some gradients live before.
    InBackward,
}

#[derive(Clone, Copy, Debug)]
struct Case {
    opt: Opt,
    begin: Begin,
    /// Whether the blocks made before the trace keep their stacks (ring buffer) or have
    /// none (`_record_memory_history` called late).
    frames: bool,
    /// Steps after the warm-up step.
    steps: usize,
    /// Free entries carry the stack of the free (`context="all"`, PyTorch's default), or
    /// of the allocation they free (`context="alloc"`).
    free_stacks: bool,
}

/// The run's truth: the role of each block live when the trace began (by address) and
/// of each block the trace allocates (in `alloc` order).
struct Truth {
    seeded: HashMap<u64, Role>,
    traced: Vec<Role>,
}

struct Run {
    r: Recorder,
    live: HashMap<u64, Role>,
    recording: bool,
    seeded: HashMap<u64, Role>,
    traced: Vec<Role>,
    frames: bool,
    free_stacks: bool,
}

impl Run {
    fn malloc(&mut self, n: u64, s: StackId, role: Role) -> u64 {
        let a = self.r.malloc(n, 0, s).unwrap();
        self.live.insert(a, role);
        if self.recording {
            self.traced.push(role);
        }
        a
    }
    fn free(&mut self, a: u64, at: StackId) {
        if self.free_stacks {
            self.r.free_at(a, at).unwrap();
        } else {
            self.r.free(a).unwrap();
        }
        self.live.remove(&a);
    }
    fn begin(&mut self) {
        if self.frames {
            self.r.begin_trace_here();
        } else {
            self.r.begin_recording_here();
        }
        self.recording = true;
        self.seeded = self.live.clone();
    }
}

fn run(c: Case) -> (Snapshot, Truth) {
    let mut r = Recorder::new("", 8 << 30, 1_000_000, 10).unwrap();
    let init = r.stack(&[("train.py", 3, "<module>"), ("model.py", 5, "__init__")]);
    let batch = r.stack(&[("train.py", 9, "<module>"), ("data.py", 40, "to_device")]);
    let fwd = r.stack(&[
        ("train.py", 10, "<module>"),
        ("/x/torch/nn/modules/module.py", 1, "_call_impl"),
        ("model.py", 20, "forward"),
    ]);
    let loss = r.stack(&[("train.py", 11, "<module>"), ("/x/torch/nn/functional.py", 1, "cross_entropy")]);
    let bwd = r.stack(&[
        ("train.py", 12, "<module>"),
        ("/x/torch/_tensor.py", 1, "backward"),
        ("??", 0, "torch::autograd::Engine::evaluate_function"),
        ("??", 0, "torch::autograd::generated::MmBackward0::apply"),
    ]);
    let init_group = r.stack(&[
        ("train.py", 13, "<module>"),
        ("/x/torch/optim/optimizer.py", 1, "wrapper"),
        ("/x/torch/optim/adamw.py", 1, "step"),
        ("/x/torch/optim/adamw.py", 2, "_init_group"),
    ]);
    let foreach = r.stack(&[
        ("train.py", 13, "<module>"),
        ("/x/torch/optim/optimizer.py", 1, "wrapper"),
        ("/x/torch/optim/adamw.py", 1, "step"),
        ("/x/torch/optim/adamw.py", 3, "_multi_tensor_adamw"),
    ]);
    let user_step = r.stack(&[("train.py", 13, "<module>"), ("my_optim.py", 30, "step")]);
    let zero_grad = r.stack(&[("train.py", 8, "<module>"), ("/x/torch/optim/optimizer.py", 1, "zero_grad")]);
    let top = r.stack(&[("train.py", 14, "<module>")]);
    let mut run = Run {
        r,
        live: HashMap::new(),
        recording: false,
        seeded: HashMap::new(),
        traced: Vec::new(),
        frames: c.frames,
        free_stacks: c.free_stacks,
    };
    let mut params: Vec<u64> = PARAMS.iter().map(|&n| run.malloc(n, init, Role::Parameters)).collect();
    let mut grads: Vec<Option<u64>> = vec![None; PARAMS.len()];
    let mut moments: Vec<(u64, u64)> = Vec::new();
    // Step 0 is the warm-up; the trace begins in step 1.
    for step in 0..=c.steps {
        let here = |b: Begin| step == 1 && c.begin == b;
        if here(Begin::AfterOptimizerStep) {
            run.begin();
        }
        // zero_grad(set_to_none=True)
        for g in grads.iter_mut() {
            if let Some(a) = g.take() {
                run.free(a, zero_grad);
            }
        }
        if here(Begin::AfterZeroGrad) {
            run.begin();
        }
        let x = run.malloc(MIB, batch, Role::Inputs);
        let y = run.malloc(8192, batch, Role::Inputs);
        let mut acts = Vec::new();
        for layer in 0..4 {
            if here(Begin::InForward) && layer == 2 {
                run.begin();
            }
            acts.push(run.malloc(16 * MIB, fwd, Role::Activations));
            let t = run.malloc(4 * MIB, fwd, Role::Temporaries);
            run.free(t, fwd);
            acts.push(run.malloc(12 * MIB, fwd, Role::Activations));
        }
        let l = run.malloc(512, loss, Role::Activations);
        for k in (0..PARAMS.len()).rev() {
            if here(Begin::InBackward) && k == 2 {
                run.begin();
            }
            let t = run.malloc(6 * MIB, bwd, Role::Temporaries);
            grads[k] = Some(run.malloc(PARAMS[k], bwd, Role::Gradients));
            run.free(t, bwd);
            if k % 2 == 0 {
                run.free(acts.pop().unwrap(), bwd);
                run.free(acts.pop().unwrap(), bwd);
            }
        }
        while let Some(a) = acts.pop() {
            run.free(a, bwd);
        }
        run.free(l, top);
        match c.opt {
            Opt::ForeachAdamW => {
                if moments.is_empty() {
                    for &n in &PARAMS {
                        let m = run.malloc(n, init_group, Role::OptimizerState);
                        let v = run.malloc(n, init_group, Role::OptimizerState);
                        moments.push((m, v));
                    }
                }
                let temps: Vec<u64> = PARAMS.iter().map(|&n| run.malloc(n, foreach, Role::Temporaries)).collect();
                for t in temps {
                    run.free(t, foreach);
                }
            }
            Opt::OutOfPlaceAdam => {
                if moments.is_empty() {
                    for &n in &PARAMS {
                        let m = run.malloc(n, user_step, Role::OptimizerState);
                        let v = run.malloc(n, user_step, Role::OptimizerState);
                        moments.push((m, v));
                    }
                }
                for (k, &n) in PARAMS.iter().enumerate() {
                    let t = run.malloc(n, user_step, Role::Temporaries);
                    let m = run.malloc(n, user_step, Role::OptimizerState);
                    run.free(moments[k].0, user_step);
                    let v = run.malloc(n, user_step, Role::OptimizerState);
                    run.free(moments[k].1, user_step);
                    moments[k] = (m, v);
                    let p = run.malloc(n, user_step, Role::Parameters);
                    run.free(params[k], user_step);
                    params[k] = p;
                    run.free(t, user_step);
                }
            }
        }
        run.free(x, top);
        run.free(y, top);
    }
    let truth = Truth { seeded: run.seeded, traced: run.traced };
    (run.r.finish(), truth)
}

/// Reasons that say the evidence does not decide a block's role: `other` for want of
/// evidence, and the parameters and optimizer state counted by size (their totals are
/// decided, and the reason says that which block is which is not).
fn cannot_tell(r: Reason) -> bool {
    matches!(
        r,
        Reason::OtherBeforeTrace
            | Reason::OtherUndecided
            | Reason::OtherNoSteps
            | Reason::OtherReplacesUnknown
            | Reason::ParamBeforeTraceCounted
            | Reason::OptBeforeTraceCounted
    )
}

/// Every block's role is its truth or "cannot tell"; returns the blocks that could not
/// be told, and the wrong ones (described).
fn check(c: Case) -> (usize, Vec<String>, DeviceRoles, Truth) {
    let (snap, truth) = run(c);
    let lives = BlockLives::replay(&snap, 0);
    let (dr, _st, r) = device_roles_with(&snap, &lives);
    assert_eq!(lives.traced.len(), truth.traced.len(), "{c:?}: traced blocks");
    assert_eq!(lives.seeded.len(), truth.seeded.len(), "{c:?}: seeded blocks");
    let mut wrong = Vec::new();
    let mut untold = 0;
    for (b, br) in lives.seeded.iter().zip(&r.seeded) {
        let t = truth.seeded[&b.address];
        if br.role != t {
            if cannot_tell(br.reason) {
                untold += 1;
            } else {
                wrong.push(format!(
                    "seeded {} B (freed at {}) is {:?}, called {:?} ({:?})",
                    b.request,
                    if b.end == usize::MAX { "end".into() } else { b.end.to_string() },
                    t,
                    br.role,
                    br.reason
                ));
            }
        }
    }
    let trace = snap.trace(0);
    for (i, (l, br)) in lives.traced.iter().zip(&r.traced).enumerate() {
        let t = truth.traced[i];
        if br.role != t {
            if cannot_tell(br.reason) {
                untold += 1;
            } else {
                wrong.push(format!(
                    "traced #{i} {} B at entry {} is {t:?}, called {:?} ({:?})",
                    trace[l.alloc()].size,
                    l.alloc(),
                    br.role,
                    br.reason
                ));
            }
        }
    }
    (untold, wrong, dr, truth)
}

fn all_cases() -> Vec<Case> {
    let mut v = Vec::new();
    for opt in [Opt::ForeachAdamW, Opt::OutOfPlaceAdam] {
        for begin in [Begin::AfterOptimizerStep, Begin::AfterZeroGrad, Begin::InForward, Begin::InBackward] {
            for frames in [false, true] {
                for steps in [1, 3] {
                    for free_stacks in [true, false] {
                        v.push(Case { opt, begin, frames, steps, free_stacks });
                    }
                }
            }
        }
    }
    v
}

const PARAM_BYTES: u64 = 8 * MIB + 8 * MIB + 4 * MIB + 2 * MIB + 4096 + 4096;

/// No block of any late-start shape gets a confident wrong role.
#[test]
fn no_block_live_before_the_trace_gets_a_wrong_role() {
    let mut bad = Vec::new();
    for c in all_cases() {
        let (untold, wrong, _, _) = check(c);
        println!("{c:?}: {} wrong, {untold} cannot tell", wrong.len());
        for w in wrong.iter().take(4) {
            println!("    {w}");
        }
        if !wrong.is_empty() {
            bad.push(format!("{c:?}: {}", wrong.join("; ")));
        }
    }
    assert!(bad.is_empty(), "{} cases with wrong roles:\n{}", bad.len(), bad.join("\n"));
}

/// Where the trace holds a whole step, the totals are decided: parameters, gradients
/// and optimizer state (Adam: two moments per parameter) exactly, with or without the
/// frames of the blocks made before the trace, and nothing says it cannot tell. Where
/// it does not (the recording began inside the only step), each total is exact or says
/// it cannot tell.
#[test]
fn late_start_totals_are_exact_or_say_they_cannot_tell() {
    let mut bad = Vec::new();
    let (mut exact, mut untold) = (0, 0);
    for c in all_cases() {
        let whole = c.steps > 1 || matches!(c.begin, Begin::AfterOptimizerStep | Begin::AfterZeroGrad);
        let (_, _, dr, _) = check(c);
        let want = [("parameters", PARAM_BYTES), ("gradients", PARAM_BYTES), ("optimizer_state", 2 * PARAM_BYTES)];
        for (k, w) in want {
            let b = &dr.by_role[k];
            match (&b.cannot_tell, b.max == w) {
                (None, true) => exact += 1,
                (Some(_), _) if !whole => untold += 1,
                (why, _) => bad.push(format!("{c:?}: {k} {} (truth {w}), cannot tell: {why:?}", b.max)),
            }
        }
    }
    println!("{exact} totals exact, {untold} cannot tell");
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// Roles of one device's blocks, by what identifies a block across a cut: the blocks
/// live at state `c` by address, and the blocks allocated at or after entry `c` by their
/// `alloc` entry.
struct ByCut {
    live: HashMap<u64, (Role, Reason)>,
    made: HashMap<usize, (Role, Reason)>,
}

fn by_cut(snap: &Snapshot, c: usize) -> ByCut {
    let trace = snap.trace(0);
    let lives = BlockLives::replay(snap, 0);
    let (_, _, r) = device_roles_with(snap, &lives);
    let mut live = HashMap::new();
    for (b, br) in lives.seeded.iter().zip(&r.seeded) {
        if b.end >= c {
            live.insert(b.address, (br.role, br.reason));
        }
    }
    let mut made = HashMap::new();
    for (l, br) in lives.traced.iter().zip(&r.traced) {
        if l.alloc() < c && l.end() >= c {
            live.insert(trace[l.alloc()].addr, (br.role, br.reason));
        } else if l.alloc() >= c {
            made.insert(l.alloc(), (br.role, br.reason));
        }
    }
    ByCut { live, made }
}

/// Cuts of real training traces recorded from the start (the in-repository niu-train3
/// grids: three steps of a 4-layer model with a hand-written Adam; their roles are the
/// frozen ground truth's): the trace is cut at points of every phase, as a late
/// `_record_memory_history` or a ring buffer would begin it. Every block of the cut
/// trace gets the role the whole trace gives it, or says it cannot tell; where the cut
/// leaves a whole step (after the forward pass has begun, the first step is partial),
/// parameters and optimizer state are the ground truth's exactly.
#[test]
fn cuts_of_real_training_traces_keep_their_roles() {
    const PARAMS: u64 = 90_785_792; // GRIDS.md: 22,696,448 fp32 parameters
    let mut cuts_checked = 0;
    let mut bad = Vec::new();
    for name in ["niu-train3-ctx100-fp32.pickle", "niu-train3-ctx150-fp32.pickle", "niu-train3-ctx200-fp32.pickle"] {
        let Some(p) = fragscope_testdata::grid_file(name).filter(|p| p.is_file()) else { continue };
        let full = fragscope_snapshot::read_path(&p).unwrap();
        let st = fragscope_trace::steps(&full, 0);
        assert_eq!(st.steps.len(), 3, "{name}");
        // Points of every phase of the first two steps: each phase's start and middle.
        let mut points = Vec::new();
        for s in &st.steps[..2] {
            points.push(s.start);
            for ph in &s.phases {
                points.extend([ph.start, (ph.start + ph.end) / 2]);
            }
            points.push(s.end);
        }
        points.sort_unstable();
        points.dedup();
        for &c in &points {
            let whole = by_cut(&full, c);
            let mut cut = full.clone();
            cut.device_traces[0].drain(..c);
            let part = by_cut(&cut, 0);
            let mut wrong = Vec::new();
            let mut told = 0;
            for (a, (role, reason)) in &part.live {
                let Some(&(truth, why)) = whole.live.get(a) else {
                    wrong.push(format!("block at {a:#x} live at the cut is not live in the whole trace"));
                    continue;
                };
                if *role == truth {
                    told += 1;
                } else if !cannot_tell(*reason) {
                    wrong.push(format!("live at the cut: {truth:?} ({why:?}) called {role:?} ({reason:?})"));
                }
            }
            for (k, (role, reason)) in &part.made {
                let (truth, why) = whole.made[&(k + c)];
                if *role != truth && !cannot_tell(*reason) {
                    wrong.push(format!("made at {}: {truth:?} ({why:?}) called {role:?} ({reason:?})", k + c));
                }
            }
            // Totals, where a whole step follows the cut: the first step's forward not
            // yet begun, or any cut before the second step's.
            let r = device_roles(&cut, 0);
            let whole_step_after = c <= st.steps[1].span(fragscope_trace::Phase::Forward).unwrap().0;
            let (pm, om) = (r.by_role["parameters"].max, r.by_role["optimizer_state"].max);
            println!(
                "{name} cut at {c}: {} live at the cut ({told} told), {} made after; parameters {pm}, optimizer state \
                 {om}; {} wrong",
                part.live.len(),
                part.made.len(),
                wrong.len()
            );
            for (k, got, truth) in [("parameters", pm, PARAMS), ("optimizer_state", om, 2 * PARAMS)] {
                let untold = &r.by_role[k].cannot_tell;
                // Exact where a whole step follows the cut; elsewhere exact or "cannot tell".
                let ok =
                    if whole_step_after { got == truth && untold.is_none() } else { got == truth || untold.is_some() };
                if !ok {
                    wrong.push(format!("{k} {got} (truth {truth}), cannot tell: {untold:?}"));
                }
            }
            if !wrong.is_empty() {
                bad.push(format!(
                    "{name} cut at {c}: {}",
                    wrong.iter().take(5).cloned().collect::<Vec<_>>().join("; ")
                ));
            }
            cuts_checked += 1;
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
    assert!(cuts_checked >= 10, "{cuts_checked} cuts");
}

/// A forward-only recording begun late (the in-repository niu-fwd grids, cut): the
/// parameters are live before the trace and no backward pass gives their sizes. With the
/// stacks a ring buffer keeps they are the blocks made while building the model, as in the
/// whole trace; without stacks the parameters come from the model's layer structure or
/// cannot be told (never "0"), while no gradient or optimizer state is claimed (no
/// training step in the trace).
#[test]
fn forward_only_cuts_do_not_claim_zero_parameters() {
    let mut seen = 0;
    for name in ["niu-fwd-ctx100-fp32.pickle", "niu-fwd-ctx200-fp32.pickle"] {
        let Some(p) = fragscope_testdata::grid_file(name).filter(|p| p.is_file()) else { continue };
        let full = fragscope_snapshot::read_path(&p).unwrap();
        let whole = device_roles(&full, 0);
        let params = whole.by_role["parameters"].max;
        assert!(params > 0, "{name}: the whole trace finds its parameters by their frames");
        let n = full.trace(0).len();
        for c in [n / 3, n / 2, 2 * n / 3] {
            for frames in [true, false] {
                let mut cut = full.clone();
                cut.device_traces[0].drain(..c);
                if !frames {
                    // `_record_memory_history` called late: no stack for blocks made before.
                    for seg in cut.segments.iter_mut() {
                        for b in seg.blocks.iter_mut() {
                            b.stack = None;
                        }
                    }
                }
                let r = device_roles(&cut, 0);
                let p = &r.by_role["parameters"];
                println!("{name} cut at {c}, frames {frames}: parameters {} cannot tell {:?}", p.max, p.cannot_tell);
                if frames {
                    // Found by their frames; blocks without frames live before the trace
                    // may still make it say it cannot tell the whole.
                    assert_eq!(p.max, params, "{name} cut at {c}");
                } else {
                    // Or the model's layer structure from the sizes alone (rule 7): exact
                    // but for frameless blocks outside the layers that share their width
                    // (here cuBLAS's 8.1 MiB workspace, made at the first matmul, is
                    // counted: sizes alone do not tell it from a tensor outside the
                    // layers) — a known limit, bounded here so that it stays visible.
                    let by_structure = r.model_state.as_ref().is_some_and(|m| m.layers == 4)
                        && p.max >= params
                        && p.max - params <= 8_519_680;
                    assert!(
                        p.max == params || p.cannot_tell.is_some() || by_structure,
                        "{name} cut at {c}: {} {:?}",
                        p.max,
                        r.model_state
                    );
                }
                // No gradient or optimizer state claimed; left open where undecided
                // memory could hold it (issue 38 item 3), never a figure.
                for k in ["gradients", "optimizer_state"] {
                    assert_eq!(r.by_role[k].max, 0, "{name} {k}");
                }
                seen += 1;
            }
        }
    }
    assert!(seen >= 6, "{seen} cuts");
}

/// A recording that begins inside a forward pass holds no whole first step: the step's
/// backward frees activations the trace never saw made. One that begins at a step's
/// start (or before its zero_grad) holds it whole. On the synthetic loops and on cuts of
/// the niu-train3 grids.
#[test]
fn a_step_the_recording_began_inside_is_not_complete() {
    for c in all_cases() {
        let (snap, _) = run(c);
        let st = fragscope_trace::steps(&snap, 0);
        let want = !matches!(c.begin, Begin::InForward | Begin::InBackward);
        assert_eq!(st.steps[0].complete, want, "{c:?}");
        assert!(st.steps[1..].iter().all(|s| s.complete), "{c:?}");
    }
    for name in ["niu-train3-ctx100-fp32.pickle", "niu-train3-ctx200-fp32.pickle"] {
        let Some(p) = fragscope_testdata::grid_file(name).filter(|p| p.is_file()) else { continue };
        let full = fragscope_snapshot::read_path(&p).unwrap();
        let st = fragscope_trace::steps(&full, 0);
        let s1 = &st.steps[1];
        let (fa, fb) = s1.span(fragscope_trace::Phase::Forward).unwrap();
        for (c, whole) in [(s1.start, true), ((fa + fb) / 2, false), (fb - 1, false)] {
            let mut cut = full.clone();
            cut.device_traces[0].drain(..c);
            let cs = fragscope_trace::steps(&cut, 0);
            println!("{name} cut at {c}: {} steps, first complete {}", cs.steps.len(), cs.steps[0].complete);
            assert_eq!(cs.steps.len(), 2, "{name} cut at {c}");
            assert_eq!(cs.steps[0].complete, whole, "{name} cut at {c}");
        }
    }
}

/// The first step recorded after the model was built (kk-2.7b-step: parameters live
/// before the trace, AdamW's state made in the trace's optimizer step, a few frameless
/// blocks of other roles live before it): every total is told, and is GRIDS.md's.
#[test]
fn a_first_step_recorded_after_the_model_was_built_is_told_whole() {
    const PARAMS: u64 = 13_627_238_400;
    let Some(p) = fragscope_testdata::grid_file("kk-2.7b-step-ctx128-fp32.pickle").filter(|p| p.is_file()) else {
        return;
    };
    let snap = fragscope_snapshot::read_path(&p).unwrap();
    let r = device_roles(&snap, 0);
    for (k, want) in [("parameters", PARAMS), ("gradients", PARAMS), ("optimizer_state", 2 * PARAMS)] {
        let b = &r.by_role[k];
        assert_eq!((b.max, b.cannot_tell.as_deref()), (want, None), "{k}");
    }
}

/// ResNet-50's recording (pytorchblog, model and SGD momentum buffers made before the
/// trace; BatchNorm running statistics share the sizes of the BatchNorm weights, so the
/// blocks of a gradient's size are no whole multiple of the gradients): the parameters
/// are still told, as many per size as gradients: 25,557,032 fp32 parameters.
#[test]
fn parameters_are_told_among_other_blocks_of_their_sizes() {
    let Some(p) = fragscope_testdata::real_file("pytorchblog-resnet50-train-cppframes.pickle") else { return };
    let snap = fragscope_snapshot::read_path(&p).unwrap();
    let r = device_roles(&snap, 0);
    let b = &r.by_role["parameters"];
    assert_eq!((b.max, b.cannot_tell.as_deref()), (102_228_128, None));
    assert_eq!(r.by_role["gradients"].max, 102_228_128);
}

/// A recording begun inside the last step's forward pass holds that step's backward
/// and optimizer whole: the gradients, parameters and optimizer state are told (niu-train3
/// cut in its third forward pass).
#[test]
fn a_step_begun_inside_its_forward_still_tells_its_gradients() {
    const PARAMS: u64 = 90_785_792;
    let Some(p) = fragscope_testdata::grid_file("niu-train3-ctx100-fp32.pickle").filter(|p| p.is_file()) else {
        return;
    };
    let full = fragscope_snapshot::read_path(&p).unwrap();
    let st = fragscope_trace::steps(&full, 0);
    let (fa, fb) = st.steps[2].span(fragscope_trace::Phase::Forward).unwrap();
    let mut cut = full.clone();
    cut.device_traces[0].drain(..(fa + fb) / 2);
    let r = device_roles(&cut, 0);
    assert_eq!(r.step_count, 1);
    for (k, want) in [("parameters", PARAMS), ("gradients", PARAMS), ("optimizer_state", 2 * PARAMS)] {
        let b = &r.by_role[k];
        assert_eq!((b.max, b.cannot_tell.as_deref()), (want, None), "{k}");
    }
}
