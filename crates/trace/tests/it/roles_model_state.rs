//! Model state from the structure of the blocks that hold it (rule 7 of `roles`), on
//! real recordings: forward-only recordings get their parameters from the model's layer
//! structure, and a state that holds copies of the parameters beyond them (gradients,
//! optimizer moments) leaves those roles open rather than reporting them as 0 (issue 38
//! items 1 and 3). The figures asserted come from GRIDS.md (the models' configurations),
//! never from fragscope's output; the parameters' bytes of every forward-only recording
//! are checked by the frozen evaluation (`roles_truth`), not here.

use fragscope_snapshot::{read_path, Snapshot};
use fragscope_trace::{device_roles, steps, DeviceRoles, Phase};

/// GRIDS.md: the kk 2.7B model, fp32, 32 layers.
const KK_PARAM_BYTES: u64 = 13_627_238_400;
/// GRIDS.md: the niu model, fp32, 4 layers.
const NIU_PARAM_BYTES: u64 = 90_785_792;

fn grid(file: &str) -> Option<Snapshot> {
    match fragscope_testdata::grid_file(file) {
        Some(p) if p.is_file() => Some(read_path(&p).unwrap()),
        _ => {
            fragscope_testdata::skip(file);
            None
        }
    }
}

/// `snap` as a recording begun at trace entry `from` of device 0: the entries before it
/// dropped, so that what they made and kept is live before the trace (the final state
/// is the same).
fn begun_at(snap: &Snapshot, from: usize) -> Snapshot {
    let mut s = snap.clone();
    s.device_traces[0] = s.device_traces[0][from..].to_vec();
    s
}

fn within_1pct(got: u64, want: u64) -> bool {
    (got as f64 - want as f64).abs() <= 0.01 * want as f64
}

#[test]
fn forward_only_recordings_show_the_documented_layers() {
    let mut checked = 0;
    for (file, layers) in [
        ("kk-2.7b-fwd-ctx128-fp32.pickle", 32),
        ("kk-2.7b-fwd-ctx128-mixed.pickle", 32),
        ("kk-2.7b-fwd-ctx512-fp32.pickle", 32),
        ("niu-fwd-ctx100-fp32.pickle", 4),
    ] {
        let Some(snap) = grid(file) else { continue };
        let r = device_roles(&snap, 0);
        let m = r.model_state.as_ref().unwrap_or_else(|| panic!("{file}: no model_state"));
        assert_eq!((m.layers, m.copies), (layers, 1), "{file}: {m:?}");
        let p = &r.by_role["parameters"];
        assert!(p.cannot_tell.is_none() && p.max == m.copy_bytes, "{file}: {p:?}");
        checked += 1;
    }
    // The niu grid is in the repository.
    assert!(checked >= 1);
}

/// A training recording begun after its first optimizer step (the trace cut there): the
/// state before the trace holds the parameters, the gradients and AdamW's two moments.
/// Parameters, gradients and optimizer state are each either found or open
/// (`cannot_tell`), never 0 while undecided memory could hold them; and every text
/// counts all the undecided memory.
#[test]
fn a_state_of_parameter_copies_before_the_trace_is_never_zero_gradients_or_state() {
    let mut checked = 0;
    for (file, param_bytes) in
        [("kk-2.7b-step-ctx128-fp32.pickle", KK_PARAM_BYTES), ("niu-train3-ctx100-fp32.pickle", NIU_PARAM_BYTES)]
    {
        let Some(snap) = grid(file) else { continue };
        let st = steps(&snap, 0);
        let (_, opt_end) = st.steps[0].span(Phase::Optimizer).expect("an optimizer step");
        for frames in [true, false] {
            let mut cut = begun_at(&snap, opt_end);
            if !frames {
                // `_record_memory_history` called late: no stack for blocks made before.
                for b in cut.segments.iter_mut().flat_map(|s| s.blocks.iter_mut()) {
                    b.stack = None;
                }
            }
            let r: DeviceRoles = device_roles(&cut, 0);
            let mut undecided_texts = Vec::new();
            for role in ["parameters", "gradients", "optimizer_state"] {
                let b = &r.by_role[role];
                assert!(
                    b.max > 0 || b.cannot_tell.is_some(),
                    "{file} cut at {opt_end}: {role} is 0 and decided: {b:?}"
                );
                undecided_texts.extend(b.cannot_tell.clone());
            }
            // One figure of undecided memory in every text.
            let firsts: Vec<&str> = undecided_texts.iter().map(|t| t.split(" live before").next().unwrap()).collect();
            assert!(firsts.windows(2).all(|w| w[0] == w[1]), "{file}: {undecided_texts:?}");
            let p = &r.by_role["parameters"];
            if p.cannot_tell.is_none() {
                assert!(within_1pct(p.max, param_bytes), "{file}: parameters {} want {param_bytes}", p.max);
            }
            if st.steps.len() == 1 && !frames {
                // Nothing of the step left in the trace and no frames: the sizes alone show
                // the four copies (weights, gradients, two moments).
                let m = r.model_state.as_ref().unwrap_or_else(|| panic!("{file}: no model_state"));
                assert_eq!(m.copies, 4, "{file}: {m:?}");
                assert!(within_1pct(m.copy_bytes, param_bytes), "{file}: {m:?}");
                assert!(p.cannot_tell.is_none());
            }
            checked += 1;
        }
    }
    assert!(checked >= 1);
}

/// Rule 8 on real forward-only recordings: both grids run their forwards with autograd
/// on (no `no_grad` in the source programs, GRIDS.md): each pass's layers keep their
/// saved tensors to its end, so the passes' memory is activations and temporaries, none
/// of it left `other` for want of a step; and the activations grow with the sequence
/// length, at the allocated peak (the end of a pass) among them.
#[test]
fn grad_enabled_forward_passes_keep_activations_growing_with_the_sequence() {
    let mut checked = 0;
    for files in [
        &["niu-fwd-ctx100-fp32.pickle", "niu-fwd-ctx150-fp32.pickle", "niu-fwd-ctx200-fp32.pickle"][..],
        &["kk-2.7b-fwd-ctx128-fp32.pickle", "kk-2.7b-fwd-ctx256-fp32.pickle"][..],
    ] {
        let mut last = 0;
        for file in files {
            let Some(snap) = grid(file) else { continue };
            let r = device_roles(&snap, 0);
            let act = &r.by_role["activations"];
            assert!(act.at_peak > 0 && act.max > last, "{file}: {act:?} after {last}");
            assert!(r.by_role["temporaries"].max > 0, "{file}");
            let undecided =
                r.by_role["other"].evidence.iter().any(|e| e.evidence == fragscope_trace::Reason::OtherNoSteps);
            assert!(!undecided, "{file}: {:?}", r.by_role["other"]);
            last = act.max;
            checked += 1;
        }
    }
    // The niu grid is in the repository.
    assert!(checked >= 3);
}
