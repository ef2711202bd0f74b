//! Role-level what-ifs (`replay::transform`) checked on real traces against an
//! independent computation of the live bytes they must leave.
//!
//! The expected figure at a chosen moment is computed here from the trace's own entries
//! (a walk of `alloc` / `free_completed`, with the bytes live before the trace taken from
//! the final `segments` less the trace's net change), then the change applied to it by
//! its definition: the blocks of the changed role live at that moment, found by this
//! walk, lose what the change takes from them. The replayed model's `requested_bytes` at
//! the same moment (a probe of the simulated allocator) must equal it exactly; the
//! replay of the recording must equal the walk itself.

use std::collections::HashMap;

use fragscope_diagnose::{reserved_floor, shard_size, simulate_changes, CheckpointLayers, RoleChange, RoleWhatIf};
use fragscope_replay::recorded_config;
use fragscope_snapshot::{Action, BlockState, Snapshot};
use fragscope_trace::{device_roles_with, layer_spans, steps, BlockLives, Phase, Role};

/// One block of the walk: its alloc entry, its free_completed entry (`usize::MAX` when
/// live at the end), its request and its role.
struct Blk {
    alloc: usize,
    freed: usize,
    size: u64,
    role: Role,
}

/// The walk: bytes live before the trace, and every traced block with its role (the
/// k-th `alloc` entry has the role `roles` gives the k-th traced life).
fn walk(snap: &Snapshot, dev: i64) -> (u64, Vec<Blk>) {
    let trace = snap.trace(dev);
    let lives = BlockLives::replay(snap, dev);
    let (_, _, r) = device_roles_with(snap, &lives);
    let mut blocks: Vec<Blk> = Vec::new();
    let mut open: HashMap<u64, usize> = HashMap::new();
    let mut net: i128 = 0;
    for (i, e) in trace.iter().enumerate() {
        match e.action {
            Action::Alloc => {
                open.insert(e.addr, blocks.len());
                let role = r.traced[blocks.len()].role;
                blocks.push(Blk { alloc: i, freed: usize::MAX, size: e.size, role });
                net += e.size as i128;
            }
            Action::FreeCompleted => {
                if let Some(k) = open.remove(&e.addr) {
                    blocks[k].freed = i;
                }
                net -= e.size as i128;
            }
            _ => {}
        }
    }
    let at_end: u64 = snap
        .segments
        .iter()
        .filter(|s| s.device == dev)
        .flat_map(|s| &s.blocks)
        .filter(|b| b.state != BlockState::Inactive)
        .map(|b| b.requested_size.unwrap_or(b.size))
        .sum();
    let before = at_end as i128 - net;
    assert!(before >= 0, "live bytes before the trace: {before}");
    (before as u64, blocks)
}

/// Requested bytes live before entry `p` (the entries before it applied).
fn live_at(before: u64, blocks: &[Blk], p: usize) -> u64 {
    before + blocks.iter().filter(|b| b.alloc < p && b.freed >= p).map(|b| b.size).sum::<u64>()
}

fn probe(w: &fragscope_replay::WhatIf, p: usize) -> u64 {
    w.probes.iter().find(|x| x.at == p).unwrap_or_else(|| panic!("no probe at {p}")).requested
}

fn print(name: &str, r: &RoleWhatIf) {
    let Some(c) = r.changed.as_ref() else { panic!("{name}: not applied: {:?}", r.changes) };
    println!(
        "{name}: {} | peak reserved {} -> {}, peak allocated {} -> {} | {}",
        r.changes.iter().map(|c| format!("{} ({})", c.change, c.detail)).collect::<Vec<_>>().join(", "),
        r.recorded.peak_reserved,
        c.peak_reserved,
        r.recorded.peak_allocated,
        c.peak_allocated,
        r.verdict
    );
}

/// Checks the recorded replay against the walk at every probe, and the changed one
/// against `expect(p)`.
fn check(name: &str, r: &RoleWhatIf, before: u64, blocks: &[Blk], probes: &[usize], expect: impl Fn(usize) -> u64) {
    assert!(r.applied, "{name}: {:?}", r.changes);
    let c = r.changed.as_ref().unwrap();
    for &p in probes {
        let rec = live_at(before, blocks, p);
        assert_eq!(probe(&r.recorded, p), rec, "{name}: the recording's replay at entry {p}");
        let want = expect(p);
        println!("  {name} at entry {p}: recorded {rec} B, changed model {} B, expected {want} B", probe(c, p));
        assert_eq!(probe(c, p), want, "{name}: changed model at entry {p}");
    }
}

const NIU: &str = "niu-train3-ctx100-fp32.pickle";
const PARAM_BYTES: u64 = 90_785_792;

fn load(name: &str) -> Option<Snapshot> {
    let grid = name.starts_with("niu-") || name.starts_with("kk-");
    let p = if grid { fragscope_testdata::grid_file(name) } else { fragscope_testdata::real_file(name) }?;
    Some(fragscope_snapshot::read_path(&p).unwrap())
}

/// ZeRO-1 on niu-train3: optimizer state (2× the parameters' bytes) and the step's
/// temporaries at 1/N; checked at every optimizer step's end and mid-backward.
#[test]
fn shard_optimizer_on_niu_train3() {
    let Some(snap) = load(NIU) else { return };
    let (before, blocks) = walk(&snap, 0);
    let st = steps(&snap, 0);
    assert_eq!(st.steps.len(), 3);
    let opt_bytes_at_end: u64 =
        blocks.iter().filter(|b| b.role == Role::OptimizerState && b.freed == usize::MAX).map(|b| b.size).sum();
    assert_eq!(opt_bytes_at_end, 2 * PARAM_BYTES, "optimizer state is 2x the parameters");
    let mut probes = Vec::new();
    for s in &st.steps {
        probes.push(s.span(Phase::Optimizer).unwrap().1);
        let (bs, be) = s.span(Phase::Backward).unwrap();
        probes.push((bs + be) / 2);
    }
    for n in [2u32, 4, 8] {
        let r = simulate_changes(&snap, 0, &[RoleChange::ShardOptimizer(n)], recorded_config(&snap), None, &probes);
        print(&format!("niu shard-optimizer {n}"), &r);
        let opt_phase = |b: &Blk| st.phase_at(b.alloc) == Phase::Optimizer;
        check("niu shard-optimizer", &r, before, &blocks, &probes, |p| {
            live_at(before, &blocks, p)
                - blocks
                    .iter()
                    .filter(|b| b.alloc < p && b.freed >= p)
                    .filter(|b| b.role == Role::OptimizerState || (b.role == Role::Temporaries && opt_phase(b)))
                    .map(|b| b.size - shard_size(b.size, n))
                    .sum::<u64>()
        });
        let c = r.changed.as_ref().unwrap();
        assert!(c.peak_allocated < r.recorded.peak_allocated, "sharding lowers the peak");
        // At the end the state is 1/N: 2 x 90,785,792 / N (every tensor's elements divide).
        let end = *probes.iter().rev().nth(1).unwrap();
        assert_eq!(live_at(before, &blocks, end) - probe(c, end), 2 * PARAM_BYTES - 2 * PARAM_BYTES / n as u64);
    }
}

/// ZeRO-2 on niu-train3: gradients (= the parameters' bytes) at 1/N too; checked when the
/// optimizer's step starts (every gradient live).
#[test]
fn shard_gradients_on_niu_train3() {
    let Some(snap) = load(NIU) else { return };
    let (before, blocks) = walk(&snap, 0);
    let st = steps(&snap, 0);
    let probes: Vec<usize> = st.steps.iter().map(|s| s.span(Phase::Optimizer).unwrap().0).collect();
    let n = 4;
    let changes = [RoleChange::ShardOptimizer(n), RoleChange::ShardGradients(n)];
    let r = simulate_changes(&snap, 0, &changes, recorded_config(&snap), None, &probes);
    print("niu zero-2 4", &r);
    let opt_phase = |b: &Blk| st.phase_at(b.alloc) == Phase::Optimizer;
    for &p in &probes {
        let g: u64 =
            blocks.iter().filter(|b| b.alloc < p && b.freed >= p && b.role == Role::Gradients).map(|b| b.size).sum();
        assert_eq!(g, PARAM_BYTES, "every gradient live when the step starts");
    }
    check("niu zero-2", &r, before, &blocks, &probes, |p| {
        live_at(before, &blocks, p)
            - blocks
                .iter()
                .filter(|b| b.alloc < p && b.freed >= p)
                .filter(|b| {
                    matches!(b.role, Role::OptimizerState | Role::Gradients)
                        || (b.role == Role::Temporaries && opt_phase(b))
                })
                .map(|b| b.size - shard_size(b.size, n))
                .sum::<u64>()
    });
}

/// niu-train3 already frees its gradients before forward (set_to_none, PyTorch's
/// default): the change says it cannot be applied, and why.
#[test]
fn set_to_none_is_refused_where_the_recording_already_does_it() {
    let Some(snap) = load(NIU) else { return };
    let r = simulate_changes(&snap, 0, &[RoleChange::GradsSetToNone], recorded_config(&snap), None, &[]);
    assert!(!r.applied && r.changed.is_none());
    let why = r.changes[0].cannot_apply.as_deref().unwrap();
    assert!(why.contains("already frees them"), "{why}");
    assert!(r.verdict.starts_with("not replayed"), "{}", r.verdict);
}

/// The saved activations of layers `fwd` that are live at `p`: every activation made
/// inside a layer's forward span but its last (the layer's output), not freed before the
/// first layer's backward starts (`first_bwd`).
fn saved_live(blocks: &[Blk], fwd: &[(usize, usize)], first_bwd: usize, p: usize) -> u64 {
    let mut s = 0;
    for &(a, b) in fwd {
        let acts: Vec<&Blk> =
            blocks.iter().filter(|x| x.alloc >= a && x.alloc < b && x.role == Role::Activations).collect();
        if let Some((_, saved)) = acts.split_last() {
            s += saved
                .iter()
                .filter(|x| x.alloc < p && x.freed >= p && x.freed >= first_bwd)
                .map(|x| x.size)
                .sum::<u64>();
        }
    }
    s
}

fn checkpoint_case(name: &str, snap: &Snapshot) {
    let (before, blocks) = walk(snap, 0);
    let st = steps(snap, 0);
    let mut probes = Vec::new();
    let mut expect_drop: HashMap<usize, u64> = HashMap::new();
    for s in &st.steps {
        let fwd = layer_spans(snap, 0, s, Phase::Forward).expect("layers");
        let bwd = layer_spans(snap, 0, s, Phase::Backward).expect("layers");
        assert_eq!(fwd.len(), bwd.len());
        let bs = s.span(Phase::Backward).unwrap().0;
        // When backward starts: every layer's saved activations are gone.
        expect_drop.insert(bs, saved_live(&blocks, &fwd, bwd[0].0, bs));
        // After the first layer's forward: its own saved activations are gone.
        expect_drop.insert(fwd[0].1, saved_live(&blocks, &fwd[..1], bwd[0].0, fwd[0].1));
        // When the backward pass ends: back to the recording.
        expect_drop.insert(s.span(Phase::Backward).unwrap().1, 0);
        probes.extend([fwd[0].1, bs, s.span(Phase::Backward).unwrap().1]);
    }
    probes.sort_unstable();
    let r = simulate_changes(
        snap,
        0,
        &[RoleChange::Checkpoint(CheckpointLayers::All)],
        recorded_config(snap),
        None,
        &probes,
    );
    print(name, &r);
    assert!(expect_drop.values().any(|&d| d > 0));
    check(name, &r, before, &blocks, &probes, |p| live_at(before, &blocks, p) - expect_drop[&p]);
    let c = r.changed.as_ref().unwrap();
    assert!(c.peak_allocated <= r.recorded.peak_allocated);
}

#[test]
fn checkpoint_all_layers_on_niu_train3() {
    let Some(snap) = load(NIU) else { return };
    checkpoint_case("niu checkpoint all", &snap);
}

#[test]
fn checkpoint_all_layers_on_kk_step() {
    let Some(snap) = load("kk-2.7b-step-ctx128-fp32.pickle") else { return };
    checkpoint_case("kk checkpoint all", &snap);
}

/// kk-2.7b-step: one AdamW step of 13,627,238,400 parameter bytes, parameters live
/// before the trace: ZeRO-1 and ZeRO-2 at N = 4, checked when the optimizer's step ends
/// and when it starts.
#[test]
fn shard_on_kk_step() {
    let Some(snap) = load("kk-2.7b-step-ctx128-fp32.pickle") else { return };
    let (before, blocks) = walk(&snap, 0);
    let st = steps(&snap, 0);
    let s = &st.steps[0];
    let (os, oe) = s.span(Phase::Optimizer).unwrap();
    let probes = vec![os, oe];
    let n = 4;
    let changes = [RoleChange::ShardOptimizer(n), RoleChange::ShardGradients(n)];
    let r = simulate_changes(&snap, 0, &changes, recorded_config(&snap), None, &probes);
    print("kk zero-2 4", &r);
    let opt_phase = |b: &Blk| st.phase_at(b.alloc) == Phase::Optimizer;
    check("kk zero-2", &r, before, &blocks, &probes, |p| {
        live_at(before, &blocks, p)
            - blocks
                .iter()
                .filter(|b| b.alloc < p && b.freed >= p)
                .filter(|b| {
                    matches!(b.role, Role::OptimizerState | Role::Gradients)
                        || (b.role == Role::Temporaries && opt_phase(b))
                })
                .map(|b| b.size - shard_size(b.size, n))
                .sum::<u64>()
    });
    let g: u64 =
        blocks.iter().filter(|b| b.role == Role::Gradients && b.alloc < oe && b.freed >= oe).map(|b| b.size).sum();
    assert!((g as f64 - 13_627_238_400.0).abs() / 13_627_238_400.0 < 0.01, "gradients {g}");
}

/// Checks zero_grad(set_to_none=True) on `snap`: at each step's forward start the
/// gradients kept from before are gone; when its backward ends they are back. `Err`
/// with the refusal when the change cannot be applied.
fn set_to_none_case(name: &str, snap: &Snapshot) -> Result<RoleWhatIf, String> {
    let (before, blocks) = walk(snap, 0);
    let st = steps(snap, 0);
    // Gradients live before the trace (a program without zero_grad: cs336-magma27), with
    // the entry that ends each.
    let lives = BlockLives::replay(snap, 0);
    let (_, _, roles) = device_roles_with(snap, &lives);
    let seeded: Vec<(u64, usize)> = (lives.seeded.iter().zip(&roles.seeded))
        .filter(|(_, r)| r.role == Role::Gradients)
        .map(|(b, _)| (b.request, b.end))
        .collect();
    let mut probes = Vec::new();
    let mut drop: HashMap<usize, u64> = HashMap::new();
    for s in &st.steps {
        let Some((bs, be)) = s.span(Phase::Backward) else { continue };
        let fs = s.span(Phase::Forward).map_or(s.start, |f| f.0);
        // Gradients live at the forward's start and kept until backward: freed there.
        let kept: u64 = blocks
            .iter()
            .filter(|b| b.role == Role::Gradients && b.alloc < fs && b.freed >= bs)
            .map(|b| b.size)
            .chain(seeded.iter().filter(|g| g.1 >= bs).map(|g| g.0))
            .sum();
        drop.insert(fs, kept);
        probes.push(fs);
        // A backward pass that ends the trace (cs336-magma27) has no entry at its end to
        // probe before.
        if be < snap.trace(0).len() {
            drop.insert(be, 0);
            probes.push(be);
        }
    }
    probes.sort_unstable();
    probes.dedup();
    let r = simulate_changes(snap, 0, &[RoleChange::GradsSetToNone], recorded_config(snap), None, &probes);
    if !r.applied {
        return Err(r.changes[0].cannot_apply.clone().unwrap());
    }
    print(name, &r);
    assert!(drop.values().any(|&d| d > 0), "{name}: applied, but no gradient kept by the walk");
    check(name, &r, before, &blocks, &probes, |p| live_at(before, &blocks, p) - drop[&p]);
    Ok(r)
}

/// A training loop that keeps its gradients (zero_grad(set_to_none=False), PyTorch's
/// default before 2.0), recorded through the allocator model: 4 parameters made in
/// `__init__`, 3 steps of forward (activations kept for backward), backward (an incoming
/// gradient per parameter, accumulated in place into `.grad` after the first step) and
/// an Adam step (two moments per parameter, made in the first step).
fn keeps_gradients() -> Snapshot {
    use fragscope_replay::Recorder;
    const MIB: u64 = 1 << 20;
    let mut r = Recorder::new("", 8 << 30, 1_000_000, 10).unwrap();
    let init = r.stack(&[("train.py", 3, "<module>"), ("model.py", 5, "__init__")]);
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
    let acc = r.stack(&[
        ("train.py", 12, "<module>"),
        ("/x/torch/_tensor.py", 1, "backward"),
        ("??", 0, "torch::autograd::Engine::evaluate_function"),
        ("??", 0, "torch::autograd::AccumulateGrad::apply"),
    ]);
    let opt = r.stack(&[("train.py", 13, "<module>"), ("/x/torch/optim/adam.py", 1, "_single_tensor_adam")]);
    let sizes = [6 * MIB, 6 * MIB, 3 * MIB, 2 * MIB];
    let _params: Vec<u64> = sizes.iter().map(|&n| r.malloc(n, 0, init).unwrap()).collect();
    let mut grads: Vec<Option<u64>> = vec![None; 4];
    let mut state: Vec<u64> = Vec::new();
    for step in 0..3 {
        let mut acts = Vec::new();
        for _layer in 0..4 {
            acts.push(r.malloc(16 * MIB, 0, fwd).unwrap());
            let t = r.malloc(4 * MIB, 0, fwd).unwrap();
            r.free(t).unwrap();
            acts.push(r.malloc(8 * MIB, 0, fwd).unwrap());
        }
        let l = r.malloc(512, 0, loss).unwrap();
        for k in (0..4).rev() {
            let incoming = r.malloc(sizes[k], 0, bwd).unwrap();
            if grads[k].is_none() {
                grads[k] = Some(r.malloc(sizes[k], 0, acc).unwrap());
            }
            r.free(incoming).unwrap();
            r.free(acts.pop().unwrap()).unwrap();
            r.free(acts.pop().unwrap()).unwrap();
        }
        r.free(l).unwrap();
        for &size in &sizes {
            if step == 0 {
                state.push(r.malloc(size, 0, opt).unwrap());
                state.push(r.malloc(size, 0, opt).unwrap());
            }
            let t = r.malloc(size, 0, opt).unwrap();
            r.free(t).unwrap();
        }
    }
    r.finish()
}

#[test]
fn set_to_none_on_a_loop_that_keeps_its_gradients() {
    let snap = keeps_gradients();
    let r = set_to_none_case("kept-gradients loop", &snap).unwrap();
    let c = r.changed.as_ref().unwrap();
    assert!(c.peak_allocated < r.recorded.peak_allocated, "{} vs {}", c.peak_allocated, r.recorded.peak_allocated);
    assert_eq!(r.changes[0].blocks, 4);
}

/// Every real training trace at hand: zero_grad(set_to_none=True) either says why it
/// cannot be applied (all the recordings at hand already free their gradients before
/// forward) or meets the independent check.
#[test]
fn set_to_none_on_real_training_traces() {
    let mut files: Vec<std::path::PathBuf> = fragscope_testdata::real_pickles();
    for g in ["niu-train3-ctx100-fp32.pickle", "kk-2.7b-step-ctx128-fp32.pickle"] {
        files.extend(fragscope_testdata::grid_file(g).filter(|p| p.is_file()));
    }
    let mut seen = 0;
    for p in files {
        let Ok(snap) = fragscope_snapshot::read_path(&p) else { continue };
        if !fragscope_replay::has_replayable_trace(&snap, 0) || steps(&snap, 0).steps.is_empty() {
            continue;
        }
        seen += 1;
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        match set_to_none_case(&name, &snap) {
            Ok(_) => {}
            Err(why) => {
                println!("{name}: set_to_none not applied: {why}");
                assert!(
                    why.contains("already frees") || why.contains("no gradient") || why.contains("one step"),
                    "{why}"
                );
            }
        }
    }
    assert!(seen >= 2, "{seen} training traces");
}

/// Traces without steps, optimizer state or layers: every change says why it cannot be
/// applied; nothing is replayed as if it had been.
#[test]
fn refusals_say_why() {
    let Some(snap) = load("niu-fwd-ctx100-fp32.pickle") else { return };
    let all = [
        RoleChange::ShardOptimizer(4),
        RoleChange::ShardGradients(4),
        RoleChange::GradsSetToNone,
        RoleChange::Checkpoint(CheckpointLayers::All),
    ];
    let r = simulate_changes(&snap, 0, &all, recorded_config(&snap), None, &[]);
    assert!(!r.applied && r.changed.is_none());
    for c in &r.changes {
        let why = c.cannot_apply.as_deref().unwrap();
        assert!(why.contains("no training step"), "{}: {why}", c.change);
    }
    let Some(snap) = load(NIU) else { return };
    let r = simulate_changes(
        &snap,
        0,
        &[RoleChange::Checkpoint(CheckpointLayers::Some(vec![9]))],
        recorded_config(&snap),
        None,
        &[],
    );
    let why = r.changes[0].cannot_apply.as_deref().unwrap();
    assert!(why.contains("layer 9 does not exist"), "{why}");
    let r = simulate_changes(&snap, 0, &[RoleChange::ShardOptimizer(1)], recorded_config(&snap), None, &[]);
    assert!(!r.applied);
}

/// Reserved bytes walked from the trace's own segment entries: (reserved before the
/// trace, the most reserved right after a `segment_alloc`/`segment_map` entry). The
/// state before the trace is the final segments' total less the trace's net change.
fn reserved_walk(snap: &Snapshot, dev: i64) -> (u64, u64) {
    let at_end: i128 = snap.segments.iter().filter(|s| s.device == dev).map(|s| s.total_size as i128).sum();
    let trace = snap.trace(dev);
    let delta = |e: &fragscope_snapshot::TraceEvent| match e.action {
        Action::SegmentAlloc | Action::SegmentMap => e.size as i128,
        Action::SegmentFree | Action::SegmentUnmap => -(e.size as i128),
        _ => 0,
    };
    let before = at_end - trace.iter().map(delta).sum::<i128>();
    let (mut cur, mut peak) = (before, 0i128);
    for e in trace {
        cur += delta(e);
        if delta(e) > 0 {
            peak = peak.max(cur);
        }
    }
    (before as u64, peak as u64)
}

/// A recording that begins with memory reserved before it (a warm-up's cache) and frees
/// it at once (`empty_cache()`), then trains one step. Sharding lowers what the step
/// needs below that starting reservation, so the changed program's peak reserved is the
/// reservation made before the recording: the result must say so, with the peak the
/// trace's own cudaMallocs reach; the figures checked against a walk of the trace's
/// segment entries.
#[test]
fn a_peak_reserved_before_the_trace_is_named_as_such() {
    use fragscope_replay::Recorder;
    const MIB: u64 = 1 << 20;
    let mut r = Recorder::new("", 8 << 30, 1_000_000, 10).unwrap();
    let warm = r.stack(&[("train.py", 2, "<module>"), ("bench.py", 7, "warm_up")]);
    let init = r.stack(&[("train.py", 3, "<module>"), ("model.py", 5, "__init__")]);
    let fwd = r.stack(&[("train.py", 10, "<module>"), ("model.py", 20, "forward")]);
    let bwd = r.stack(&[
        ("train.py", 12, "<module>"),
        ("/x/torch/_tensor.py", 1, "backward"),
        ("??", 0, "torch::autograd::generated::MmBackward0::apply"),
    ]);
    let opt = r.stack(&[("train.py", 13, "<module>"), ("/x/torch/optim/adamw.py", 2, "_init_group")]);
    let sizes = [128 * MIB, 128 * MIB, 64 * MIB, 32 * MIB];
    let params: Vec<u64> = sizes.iter().map(|&n| r.malloc(n, 0, init).unwrap()).collect();
    let cache: Vec<u64> = (0..8).map(|_| r.malloc(96 * MIB, 0, warm).unwrap()).collect();
    for a in cache {
        r.free(a).unwrap();
    }
    r.begin_trace_here();
    r.empty_cache();
    let acts: Vec<u64> = (0..4).map(|_| r.malloc(40 * MIB, 0, fwd).unwrap()).collect();
    for (k, a) in acts.into_iter().enumerate().rev() {
        let _g = r.malloc(sizes[k], 0, bwd).unwrap();
        r.free(a).unwrap();
    }
    for &n in &sizes {
        r.malloc(n, 0, opt).unwrap();
        r.malloc(n, 0, opt).unwrap();
    }
    let _ = params;
    let snap = r.finish();
    let (before, by_trace) = reserved_walk(&snap, 0);
    let changes = [RoleChange::ShardOptimizer(4), RoleChange::ShardGradients(4)];
    let w = simulate_changes(&snap, 0, &changes, recorded_config(&snap), None, &[]);
    let c = w.changed.as_ref().unwrap();
    println!(
        "walk: before {before}, by trace {by_trace}; recorded {} / {} / {}; changed {} / {} / {}; {}",
        w.recorded.peak_reserved,
        w.recorded.reserved_before_trace,
        w.recorded.peak_reserved_by_trace,
        c.peak_reserved,
        c.reserved_before_trace,
        c.peak_reserved_by_trace,
        w.verdict
    );
    assert_eq!(w.recorded.reserved_before_trace, before);
    assert_eq!(w.recorded.peak_reserved_by_trace, by_trace);
    assert_eq!(c.reserved_before_trace, before);
    // The recording needs more than it started with; the sharded step does not.
    assert!(w.recorded.peak_reserved > before && w.recorded.peak_reserved == by_trace);
    assert_eq!(c.peak_reserved, before);
    assert!(c.peak_reserved_by_trace > 0 && c.peak_reserved_by_trace < before);
    assert!(reserved_floor(&w.recorded).is_none());
    let f = reserved_floor(c).unwrap();
    assert!(f.contains("already reserved when the recording began") && f.contains("cudaMallocs reach"), "{f}");
    assert!(w.verdict.contains(&f), "{}", w.verdict);
}

/// The same on kk-2.7b-step-ctx128 (recorded after the model and a forward benchmark
/// ran; its first 430 entries release 28.8 GiB cached before it): ZeRO-1/2 at 2, 4 and
/// 8 ranks all peaked at the 41.64 GiB reserved when the recording began.
#[test]
fn kk_step_sharding_floor_is_the_reservation_before_the_trace() {
    let Some(snap) = load("kk-2.7b-step-ctx128-fp32.pickle") else { return };
    let (before, by_trace) = reserved_walk(&snap, 0);
    for n in [2, 4, 8] {
        let changes = [RoleChange::ShardOptimizer(n), RoleChange::ShardGradients(n)];
        let w = simulate_changes(&snap, 0, &changes, recorded_config(&snap), None, &[]);
        let c = w.changed.as_ref().unwrap();
        println!(
            "kk ZeRO-2 x{n}: peak reserved {} (before the trace {before}, by the trace {}), allocated {}",
            c.peak_reserved, c.peak_reserved_by_trace, c.peak_allocated
        );
        assert_eq!((w.recorded.reserved_before_trace, w.recorded.peak_reserved_by_trace), (before, by_trace));
        assert_eq!(c.reserved_before_trace, before);
        assert_eq!(c.peak_reserved, before, "x{n}");
        assert!(c.peak_reserved_by_trace < before, "x{n}");
        assert!(w.verdict.contains("already reserved when the recording began"), "{}", w.verdict);
    }
}
