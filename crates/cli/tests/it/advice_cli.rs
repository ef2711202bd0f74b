//! The usual advice through the binary: `replay` rows for `empty_cache()` and no
//! caching with their cost column, `analyze` saying plainly that it would not have
//! avoided a real OOM (with the figures), and `oom` judging it from a message's figures.

use std::io::Write;
use std::process::{Command, Stdio};

use fragscope_testdata::real_file;
use serde_json::Value;

fn run(args: &[&str]) -> String {
    let o = Command::new(env!("CARGO_BIN_EXE_fragscope")).args(args).output().unwrap();
    assert!(o.status.success(), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).unwrap()
}

fn oom_text(fixture: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../oomtext/tests/data/oom").join(fixture);
    let input = std::fs::read_to_string(path).unwrap();
    let mut c = Command::new(env!("CARGO_BIN_EXE_fragscope"))
        .arg("oom")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    String::from_utf8(c.wait_with_output().unwrap().stdout).unwrap()
}

#[test]
fn replay_shows_the_advice_with_its_cost() {
    let Some(f) = real_file("cs336-2.7b-trainstep-ctx128-fp32.pickle") else { return };
    let t = run(&["replay", f.to_str().unwrap()]);
    // counts of the synchronisations the calls imply, and no time (issue 21 item 5)
    assert!(t.contains("| syncs |") && !t.contains("driver time") && !t.contains("50 µs"), "{t}");
    assert!(t.contains("No time is shown"), "{t}");
    let row =
        |key: &str| t.lines().find(|l| l.contains(key)).unwrap_or_else(|| panic!("no {key} row: {t}")).to_string();
    // No caching: one cudaMalloc per alloc entry (6,770) and one cudaFree per free (5,894),
    // the figures the independent walk (tests/independent/no_caching.py) computes.
    let nc = row("PYTORCH_NO_CUDA_MEMORY_CACHING=1");
    assert!(nc.contains("|       6770 |     5894 |"), "{nc}");
    // One training step: its 32 repeats are layers, so there is no step boundary to
    // empty the cache at, and the replay says so instead of inventing one (issue 19).
    let ec = row("empty_cache() at every step boundary");
    assert!(ec.contains("not replayed") && ec.contains("only 1 training step"), "{ec}");
    let j: Value =
        serde_json::from_str(&run(&["replay", f.to_str().unwrap(), "--json", "--no-caching", "--config", ""])).unwrap();
    let w = &j["files"][0]["devices"][0]["whatif"];
    let nc = w.as_array().unwrap().iter().find(|r| r["advice"] == "PYTORCH_NO_CUDA_MEMORY_CACHING=1").unwrap();
    assert_eq!(nc["cuda_mallocs"], 6770);
    // counts, not a time (issue 21 item 5): every cudaFree of no caching waits for the device
    assert!(nc.get("est_driver_seconds").is_none(), "{nc}");
    assert_eq!(nc["driver"]["device_syncs"], 5894);
}

#[test]
fn analyze_what_if_weighs_the_advice_on_a_run_without_oom() {
    let Some(f) = real_file("cs336-2.7b-trainstep-ctx128-fp32.pickle") else { return };
    let t = run(&["analyze", "--what-if", f.to_str().unwrap()]);
    // One step: no empty_cache() row (its repeats are layers), no caching still weighed.
    assert!(!t.contains("empty_cache() at every step boundary would"), "{t}");
    assert!(t.contains("for 6770 cudaMalloc + 5894 cudaFree instead of 782 + 430"), "{t}");
    // Three real training steps (niu-train3, in the repository): a call at each step's start.
    let Some(n) = fragscope_testdata::grid_file("niu-train3-ctx100-fp32.pickle") else { return };
    let t = run(&["analyze", "--what-if", n.to_str().unwrap()]);
    assert!(
        t.contains("empty_cache() at every step boundary would lower the peak memory taken from CUDA from 750.00 MiB to 730.00 MiB"),
        "{t}"
    );
    // Where it makes things worse, it says so.
    let Some(g) = real_file("pytorchblog-resnet50-train-cppframes.pickle") else { return };
    let t = run(&["analyze", "--what-if", g.to_str().unwrap()]);
    assert!(t.contains("empty_cache() at every step boundary would raise the peak memory taken from CUDA"), "{t}");
}

#[test]
fn replay_refuses_a_bad_empty_cache_point() {
    let o =
        Command::new(env!("CARGO_BIN_EXE_fragscope")).args(["replay", "--empty-cache-at", "entry:x"]).output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).starts_with("error: "));
}

#[test]
fn analyze_says_the_advice_would_not_have_avoided_the_real_oom() {
    let Some(f) = real_file("codeloc-qwen3-gnn-expandable-oom-3gpu.pickle") else { return };
    let j: Value = serde_json::from_str(&run(&["analyze", "--json", f.to_str().unwrap()])).unwrap();
    let d1 = j["files"][0]["devices"].as_array().unwrap().iter().find(|d| d["device"] == 1).unwrap();
    let advice = d1["oom"]["advice"].as_array().unwrap();
    assert!(advice.len() >= 2, "{advice:?}");
    for a in advice {
        assert_eq!(a["avoids_oom"], false, "{a}");
        assert_eq!(a["first_oom_index"], 421, "{a}");
    }
    let summary = d1["oom"]["advice_summary"].as_str().unwrap();
    assert!(summary.starts_with("The usual advice would not have avoided this OOM"), "{summary}");
    assert!(summary.contains("78.29 GiB") && summary.contains("4.94 GiB more"), "{summary}");
    let t = run(&["analyze", f.to_str().unwrap()]);
    assert!(t.contains("The usual advice, replayed the same way:"), "{t}");
}

#[test]
fn oom_judges_the_advice_from_the_message() {
    let frag = oom_text("v2.2-fragmentation.txt");
    assert!(frag.contains("empty_cache() would not have avoided this error"), "{frag}");
    assert!(frag.contains("the 6.39 GiB reserved but unallocated"), "{frag}");
    assert!(frag.contains("it would fit this once"), "{frag}");
    let exh = oom_text("v2.2-exhaustion.txt");
    assert!(exh.contains("PYTORCH_NO_CUDA_MEMORY_CACHING=1 would not help either"), "{exh}");
    assert!(exh.contains("15.49 GiB over"), "{exh}");
}
