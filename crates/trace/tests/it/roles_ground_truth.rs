//! Evaluation of steps and memory by role against ground truth that does not come from
//! this program: every figure below is taken from `../shared/traces/grids/GRIDS.md` and
//! `../shared/traces/SOURCES.md` (the models' configurations and the recording scripts),
//! never from fragscope's output. Frozen before the classifier was written; a change to a
//! figure here needs a reason from those documents.
//!
//! * `niu-train3-*` (GRIDS.md): a 4-layer model of 22,696,448 parameters, fp32:
//!   90,785,792 bytes; three training steps with a hand-written Adam recorded from an
//!   empty allocator: parameters = gradients = 90,785,792 B, optimizer state (Adam's two
//!   buffers per parameter) = 181,571,584 B, 3 steps, 4 layers.
//! * `kk-2.7b-step-*` (GRIDS.md) and `cs336-2.7b-trainstep-ctx128-fp32` (SOURCES.md A1,
//!   the same recording as `kk-2.7b-step-ctx128-fp32`): 3,406,809,600 parameters,
//!   13,627,238,400 bytes fp32, live before the trace; one step (`zero_grad`, forward,
//!   backward, `AdamW.step`, the first, so AdamW's two state tensors per parameter are
//!   allocated in the trace): gradients 13,627,238,400 B, optimizer state
//!   27,254,476,800 B; 32 layers.
//! * `cs336-sidsoc12-trainstep-ctx128-fp32` (SOURCES.md F): a 2.7B-class training step:
//!   1 step, 32 layers; its parameter count is not documented, so its role figures are
//!   printed, not checked.
//! * Forward-only recordings (`niu-fwd-*`, `kk-2.7b-fwd-*`; GRIDS.md): no training step,
//!   so no step, no gradient and no optimizer state.

use fragscope_snapshot::read_path;
use fragscope_trace::{device_roles, steps, DeviceRoles};

const NIU_PARAM_BYTES: u64 = 90_785_792;
const KK_PARAM_BYTES: u64 = 13_627_238_400;

/// Ground truth of one recording with a training step.
struct Truth {
    file: &'static str,
    grid: bool,
    steps: usize,
    layers: usize,
    /// parameters, gradients, optimizer_state (bytes), when documented.
    bytes: Option<(u64, u64, u64)>,
}

const TRAINING: &[Truth] = &[
    Truth {
        file: "niu-train3-ctx100-fp32.pickle",
        grid: true,
        steps: 3,
        layers: 4,
        bytes: Some((NIU_PARAM_BYTES, NIU_PARAM_BYTES, 2 * NIU_PARAM_BYTES)),
    },
    Truth {
        file: "niu-train3-ctx150-fp32.pickle",
        grid: true,
        steps: 3,
        layers: 4,
        bytes: Some((NIU_PARAM_BYTES, NIU_PARAM_BYTES, 2 * NIU_PARAM_BYTES)),
    },
    Truth {
        file: "niu-train3-ctx200-fp32.pickle",
        grid: true,
        steps: 3,
        layers: 4,
        bytes: Some((NIU_PARAM_BYTES, NIU_PARAM_BYTES, 2 * NIU_PARAM_BYTES)),
    },
    Truth {
        file: "kk-2.7b-step-ctx128-fp32.pickle",
        grid: true,
        steps: 1,
        layers: 32,
        bytes: Some((KK_PARAM_BYTES, KK_PARAM_BYTES, 2 * KK_PARAM_BYTES)),
    },
    Truth {
        file: "kk-2.7b-step-ctx256-fp32.pickle",
        grid: true,
        steps: 1,
        layers: 32,
        bytes: Some((KK_PARAM_BYTES, KK_PARAM_BYTES, 2 * KK_PARAM_BYTES)),
    },
    Truth {
        file: "cs336-2.7b-trainstep-ctx128-fp32.pickle",
        grid: false,
        steps: 1,
        layers: 32,
        bytes: Some((KK_PARAM_BYTES, KK_PARAM_BYTES, 2 * KK_PARAM_BYTES)),
    },
    Truth { file: "cs336-sidsoc12-trainstep-ctx128-fp32.pickle", grid: false, steps: 1, layers: 32, bytes: None },
];

/// Forward-only recordings: no step, no gradients, no optimizer state.
const FORWARD_ONLY: &[&str] = &[
    "niu-fwd-ctx100-fp32.pickle",
    "niu-fwd-ctx150-fp32.pickle",
    "niu-fwd-ctx200-fp32.pickle",
    "niu-fwd-ctx200-mixed.pickle",
    "kk-2.7b-fwd-ctx128-fp32.pickle",
    "kk-2.7b-fwd-ctx256-fp32.pickle",
    "kk-2.7b-fwd-ctx512-fp32.pickle",
    "kk-2.7b-fwd-ctx128-mixed.pickle",
    "kk-2.7b-fwd-ctx256-mixed.pickle",
];

fn path_of(file: &str, grid: bool) -> Option<std::path::PathBuf> {
    let p = if grid { fragscope_testdata::grid_file(file) } else { fragscope_testdata::real_file(file) };
    match p {
        Some(p) if p.is_file() => Some(p),
        _ => {
            fragscope_testdata::skip(file);
            None
        }
    }
}

fn role_max(r: &DeviceRoles, name: &str) -> u64 {
    r.by_role.get(name).unwrap_or_else(|| panic!("by_role has no {name:?}: {:?}", r.by_role.keys())).max
}

fn within_1pct(got: u64, want: u64) -> bool {
    (got as f64 - want as f64).abs() <= 0.01 * want as f64
}

#[test]
fn training_recordings_match_their_ground_truth() {
    let mut failures = Vec::new();
    let mut checked = 0;
    for t in TRAINING {
        let Some(path) = path_of(t.file, t.grid) else { continue };
        let snap = read_path(&path).unwrap();
        let st = steps(&snap, 0);
        let r = device_roles(&snap, 0);
        let (p, g, o) = (role_max(&r, "parameters"), role_max(&r, "gradients"), role_max(&r, "optimizer_state"));
        eprintln!(
            "{:<46} steps {} layers {:?} parameters {p} gradients {g} optimizer_state {o}",
            t.file,
            st.steps.len(),
            st.steps.iter().map(|s| s.layers).collect::<Vec<_>>()
        );
        checked += 1;
        if st.steps.len() != t.steps {
            failures.push(format!("{}: {} steps, want {}", t.file, st.steps.len(), t.steps));
        }
        for (i, s) in st.steps.iter().enumerate() {
            if s.layers != Some(t.layers) {
                failures.push(format!("{}: step {i} has layers {:?}, want {}", t.file, s.layers, t.layers));
            }
        }
        if let Some((wp, wg, wo)) = t.bytes {
            for (name, got, want) in [("parameters", p, wp), ("gradients", g, wg), ("optimizer_state", o, wo)] {
                if !within_1pct(got, want) {
                    failures.push(format!("{}: {name}.max {got}, want {want} ± 1 %", t.file));
                }
            }
        }
    }
    assert!(checked >= 3, "at least the three in-repository niu grids must be checked");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn forward_only_recordings_have_no_step_gradient_or_optimizer_state() {
    let mut failures = Vec::new();
    let mut checked = 0;
    for file in FORWARD_ONLY {
        let Some(path) = path_of(file, true) else { continue };
        let snap = read_path(&path).unwrap();
        let st = steps(&snap, 0);
        let r = device_roles(&snap, 0);
        checked += 1;
        if !st.steps.is_empty() {
            failures.push(format!("{file}: {} steps, want none", st.steps.len()));
        }
        for name in ["gradients", "optimizer_state"] {
            let got = role_max(&r, name);
            if got != 0 {
                failures.push(format!("{file}: {name}.max {got}, want 0"));
            }
        }
    }
    assert!(checked >= 4, "at least the four in-repository niu forward grids must be checked");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
