//! Role-level what-ifs through the binary: `replay --shard-optimizer/--shard-gradients/
//! --grads-set-to-none/--checkpoint` (text and `--json`), their refusals and usage errors,
//! and `analyze --what-if`'s rows. The figures themselves are checked against an
//! independent computation in crates/diagnose/tests/it/role_whatif.rs.

use std::process::Command;

use fragscope_testdata::grid_file;
use serde_json::Value;

fn run(args: &[&str]) -> (i32, String, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_fragscope")).args(args).output().unwrap();
    (o.status.code().unwrap_or(-1), String::from_utf8(o.stdout).unwrap(), String::from_utf8(o.stderr).unwrap())
}

#[test]
fn replay_role_flags_text_and_json() {
    let Some(f) = grid_file("niu-train3-ctx100-fp32.pickle") else { return };
    let f = f.to_str().unwrap();
    let (rc, t, e) = run(&["replay", f, "--shard-optimizer", "4", "--checkpoint", "all", "--grads-set-to-none"]);
    assert_eq!(rc, 0, "{e}");
    assert!(t.contains("not a recording"), "{t}");
    assert!(t.contains("optimizer state sharded over 4 ranks (ZeRO-1)"), "{t}");
    assert!(t.contains("zero_grad(set_to_none=True) before forward: cannot be applied"), "{t}");
    assert!(t.contains("changed program (model)") && t.contains("Not modelled:"), "{t}");

    let (rc, j, e) = run(&["replay", f, "--shard-optimizer", "4", "--shard-gradients", "4", "--json"]);
    assert_eq!(rc, 0, "{e}");
    let v: Value = serde_json::from_str(&j).unwrap();
    let d = &v["files"][0]["devices"][0];
    assert!(d.get("whatif").is_none());
    let w = &d["role_whatif"][0];
    assert_eq!(w["applied"], true);
    assert_eq!(w["changes"].as_array().unwrap().len(), 2);
    let before = w["recorded"]["peak_allocated"].as_u64().unwrap();
    let after = w["changed"]["peak_allocated"].as_u64().unwrap();
    assert!(after < before, "{before} -> {after}");
    assert!(w["label"].as_str().unwrap().contains("not a recording"));
}

#[test]
fn replay_role_flags_refuse_and_reject() {
    let Some(f) = grid_file("niu-fwd-ctx100-fp32.pickle") else { return };
    let f = f.to_str().unwrap();
    // No training step: said, with the reason; not replayed as if applied.
    let (rc, j, _) = run(&["replay", f, "--checkpoint", "all", "--json"]);
    assert_eq!(rc, 0);
    let v: Value = serde_json::from_str(&j).unwrap();
    let w = &v["files"][0]["devices"][0]["role_whatif"][0];
    assert_eq!(w["applied"], false);
    assert!(w["changed"].is_null());
    assert!(w["changes"][0]["cannot_apply"].as_str().unwrap().contains("no training step"), "{w}");
    // Usage errors: exit 2, one line.
    for bad in [
        vec!["--shard-optimizer", "1"],
        vec!["--shard-gradients", "0"],
        vec!["--checkpoint", "3-1"],
        vec!["--checkpoint", "all", "--verify"],
    ] {
        let mut a = vec!["replay", f];
        a.extend(bad.iter().copied());
        let (rc, _, e) = run(&a);
        assert_eq!(rc, 2, "{bad:?}: {e}");
        assert!(!e.contains("panicked"), "{e}");
    }
}

#[test]
fn analyze_what_if_has_role_rows() {
    let Some(f) = grid_file("niu-train3-ctx100-fp32.pickle") else { return };
    let (rc, j, e) = run(&["analyze", "--what-if", "--json", f.to_str().unwrap()]);
    assert_eq!(rc, 0, "{e}");
    let v: Value = serde_json::from_str(&j).unwrap();
    let r = &v["files"][0]["devices"][0]["role_what_if"];
    let rows = r["rows"].as_array().unwrap();
    assert!(rows.iter().any(|x| x["applied"] == true && x["change"].as_str().unwrap().contains("ZeRO-1")));
    assert!(rows.iter().any(|x| x["applied"] == false && !x["cannot_apply"].is_null()));
    let (_, t, _) = run(&["analyze", "--what-if", f.to_str().unwrap()]);
    assert!(t.contains("If the program changed") && t.contains("activation checkpointing of all layers"), "{t}");
    // Without --what-if and without an OOM: not run.
    let (_, j, _) = run(&["analyze", "--json", f.to_str().unwrap()]);
    let v: Value = serde_json::from_str(&j).unwrap();
    assert!(v["files"][0]["devices"][0]["role_what_if"].is_null());
}
