//! Every figure right or "cannot tell", and the same program the same answer at every size
//! (issue 38): the parameters and gradients of every training recording and of its cuts
//! (`whole`, `at forward`, `at backward`, `warm`: the cut points of
//! `roles_optimizer_state`, found from the recording's own frames), against a frozen truth.
//!
//! The truth, frozen before the rules changed and never read from fragscope's output:
//! `crates/testdata/roles-truth/truth.json`'s `parameters` and `gradients` of each training
//! recording (from the programs' configurations in GRIDS.md and SOURCES.md), and for this
//! project's own H200 recordings (`crates/testdata/h200/gpt-*`: one program at sequence
//! lengths 256, 512 and 1024) the bytes the recording process counted from the tensors
//! (`*.truth.json`): `parameters_bytes`, and `gradients_bytes_if_kept` (one gradient per
//! parameter, live from the first backward pass to the `zero_grad` that frees them).
//!
//! Two rules are asserted:
//!
//! * **never a wrong figure**: a figure given (`cannot_tell` null) is the truth to the byte
//!   (the roles count the bytes requested, as the truths count the tensors' bytes: a
//!   tolerance of 1 % would pass gpt-s256-b8 begun at its first forward counting one
//!   32 KiB block of another role as gradients);
//! * **the same program, the same answer**: every such recording and cut gives both figures.
//!   Each of these recordings holds the evidence: the whole model state is made or used
//!   inside a whole step of the trace (a forward, its backward and an optimizer step, or
//!   the gradients accumulated by a backward pass over gradients live before it).

use super::roles_optimizer_state::recording_and_cuts;
use fragscope_trace::device_roles;
use serde_json::Value;

/// (file, device, parameter bytes, gradient bytes) of every training recording.
fn truth() -> Vec<(String, i64, u64, u64)> {
    let p = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../testdata/roles-truth/truth.json");
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    let mut v: Vec<(String, i64, u64, u64)> = doc["files"]
        .as_array()
        .expect("truth.json: `files`")
        .iter()
        .filter(|f| f["program"] == "training")
        .filter_map(|f| {
            let (p, g) = (f["parameters"].as_u64()?, f["gradients"].as_u64()?);
            Some((f["file"].as_str()?.to_string(), f["device"].as_i64()?, p, g))
        })
        .collect();
    let dir = fragscope_testdata::h200_dir();
    let mut h200: Vec<(String, i64, u64, u64)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            let stem = name.strip_suffix(".truth.json")?;
            let doc: Value = serde_json::from_str(&std::fs::read_to_string(dir.join(&name)).ok()?).ok()?;
            let (p, g) = (doc["parameters_bytes"].as_u64()?, doc["gradients_bytes_if_kept"].as_u64()?);
            Some((format!("h200/{stem}.pickle.gz"), 0, p, g))
        })
        .collect();
    h200.sort();
    v.extend(h200);
    v
}

#[test]
fn parameters_and_gradients_are_told_on_every_training_recording_and_its_cuts() {
    let truth = truth();
    assert!(truth.len() >= 9 + 11, "{} training recordings with a parameter truth", truth.len());
    let (mut judged, mut files, mut wrong, mut untold) = (0, 0, Vec::new(), Vec::new());
    for (file, device, params, grads) in &truth {
        let Some(cases) = recording_and_cuts(file, *device) else { continue };
        files += 1;
        for (name, s) in &cases {
            let r = device_roles(s, *device);
            for (role, want) in [("parameters", *params), ("gradients", *grads)] {
                let x = &r.by_role[role];
                println!("{file} {name}: {role} {} (truth {want}) cannot tell {:?}", x.max, x.cannot_tell);
                let line =
                    format!("{file} {name}: {role} {} B, truth {want} B, cannot tell {:?}", x.max, x.cannot_tell);
                if x.cannot_tell.is_some() {
                    untold.push(line);
                } else if x.max != want {
                    wrong.push(line);
                }
            }
            judged += 1;
        }
    }
    println!("{judged} recordings and cuts of {files} files judged");
    assert!(files >= fragscope_testdata::min_count(truth.len(), 3 + 11), "{files} files read");
    assert!(wrong.is_empty(), "{} wrong figures:\n{}", wrong.len(), wrong.join("\n"));
    assert!(untold.is_empty(), "{} cannot tell:\n{}", untold.len(), untold.join("\n"));
}
