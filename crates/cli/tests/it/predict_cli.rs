//! `fragscope predict` through the binary: the JSON schema on the niu grids (shipped in
//! the repository), and every bad input a one-line error with exit code 2.

use std::process::{Command, Output};

use serde_json::Value;

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fragscope")).args(args).output().unwrap()
}

fn grid(name: &str) -> Option<String> {
    fragscope_testdata::grid_file(&format!("{name}.pickle")).map(|p| p.display().to_string())
}

#[test]
fn predict_json_on_the_niu_grid() {
    let (Some(a), Some(b)) = (grid("niu-train3-ctx100-fp32"), grid("niu-train3-ctx150-fp32")) else { return };
    let o = run(&["predict", &a, &b, "--sizes", "100,150", "--at", "200,400", "--capacity", "4GiB", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["schema"], "fragscope.predict/2");
    let preds = v["predictions"].as_array().unwrap();
    assert_eq!(preds.len(), 2);
    for p in preds {
        for k in ["at", "device", "peak_reserved", "peak_allocated", "oom", "fits", "fit_quality", "breakdown"] {
            assert!(p.get(k).is_some(), "{k} missing: {p}");
        }
        assert!(p["fit_quality"]["aligned_fraction"].as_f64().unwrap() > 0.95);
    }
    // The recorded run at 200 reserved 1,390,411,776 bytes, as the model replays it (the
    // analysis tests compare every grid size).
    assert_eq!(preds[0]["peak_reserved"], 1_390_411_776u64);
    assert!(preds[0]["oom"].is_null() && preds[0]["fits"] == true);
    assert_eq!(v["fits"][0]["template_size"], 150);
}

#[test]
fn predict_max_fit_with_its_replay_check() {
    let (Some(a), Some(b)) = (grid("niu-fwd-ctx100-fp32"), grid("niu-fwd-ctx150-fp32")) else { return };
    let o = run(&["predict", &a, &b, "--sizes", "100,150", "--max-fit", "--capacity", "4GiB", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let m = v["max_fit"].as_array().unwrap();
    assert_eq!(m.len(), 6, "the settings in force and the five alternatives");
    let x = m[0]["largest"].as_u64().unwrap();
    assert!(m[0]["fits_at"]["oom"].is_null());
    assert!(!m[0]["next"]["oom"].is_null());
    // The check, as a user would run it: x fits, x + 1 does not.
    let at = format!("{x},{}", x + 1);
    let o = run(&["predict", &a, &b, "--sizes", "100,150", "--at", &at, "--capacity", "4GiB", "--json"]);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["predictions"][0]["fits"], true);
    assert_eq!(v["predictions"][1]["fits"], false);
}

#[test]
fn predict_bad_input_is_one_line_and_exit_2() {
    let Some(a) = grid("niu-fwd-ctx100-fp32") else { return };
    let Some(t) = grid("niu-train3-ctx150-fp32") else { return };
    let Some(m) = grid("niu-fwd-ctx200-mixed") else { return };
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["predict", &a, "--sizes", "100", "--at", "200"], "fragscope.torch.record"),
        (vec!["predict", &a, &t, "--sizes", "100", "--at", "200"], "one size per recording"),
        (vec!["predict", &a, &t, "--sizes", "0,150", "--at", "200"], "size of 0"),
        (vec!["predict", &a, &t, "--sizes", "100,100", "--at", "200"], "different size"),
        (vec!["predict", &a, &t, "--sizes", "100,x", "--at", "200"], "whole numbers"),
        (vec!["predict", &a, &t, "--sizes", "100,150", "--at", "0"], "size of 0"),
        (vec!["predict", &a, &t, "--sizes", "100,150"], "--at is required"),
        (vec!["predict", &a, &t, "--sizes", "100,150", "--max-fit"], "needs --capacity"),
        (vec!["predict", &a, &t, "--sizes", "100,150", "--at", "200"], "not the same program"),
        (vec!["predict", &a, &m, "--sizes", "100,200", "--at", "400"], "autocast"),
        (vec!["predict", &a, "/nonexistent.pickle", "--sizes", "1,2", "--at", "3"], "cannot read"),
    ];
    for (args, want) in cases {
        let o = run(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
}
