//! `fragscope analyze` on every real snapshot and `fragscope oom` on every real OOM text
//! fixture, through the binary.
//!
//! The snapshots are not in the repository: when `../shared/traces` is missing the
//! snapshot tests fail if `CI` is set, and otherwise print a note and pass.

use std::io::Write;
use std::path::{Path, PathBuf};

use fragscope_testdata::traces_dir;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_fragscope"))
}

fn run(args: &[&str]) -> Output {
    bin().args(args).output().unwrap()
}

fn run_stdin(args: &[&str], input: &str) -> Output {
    let mut c = bin().args(args).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    c.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    c.wait_with_output().unwrap()
}

fn text(o: &Output) -> (String, String) {
    (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
}

#[test]
fn analyze_json_on_every_real_trace() {
    let Some(dir) = traces_dir() else { return };
    let mut files: Vec<PathBuf> =
        std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).filter(|p| p.is_file()).collect();
    files.sort();
    let mut ok = 0;
    for p in files {
        let name = p.file_name().unwrap().to_string_lossy().to_string();
        if name.ends_with(".md") || name.ends_with(".csv") {
            continue;
        }
        let path = p.to_str().unwrap();
        // A file `summary` refuses (not a snapshot) is refused the same way: exit 2.
        let summary_rc = run(&["summary", "--json", path]).status.code();
        let out = run(&["analyze", "--json", path]);
        let (stdout, stderr) = text(&out);
        if summary_rc == Some(2) {
            assert_eq!(out.status.code(), Some(2), "{name}: {stderr}");
            assert_eq!(stderr.lines().count(), 1, "{name}: {stderr}");
            continue;
        }
        assert_eq!(out.status.code(), Some(0), "{name}: {stderr}");
        let v: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(v["schema"], "fragscope.analyze/2");
        for d in v["files"][0]["devices"].as_array().unwrap() {
            for k in ["device", "oom", "peak_fragmentation", "leak_suspects", "findings", "recommendations"] {
                assert!(d.get(k).is_some(), "{name}: no {k}");
            }
            for s in d["leak_suspects"].as_array().unwrap() {
                assert!(s["site"].is_string() && s["growth_bytes_per_step"].is_u64(), "{name}");
            }
        }
        ok += 1;
    }
    assert!(ok >= fragscope_testdata::min_files(20), "{ok}");
}

#[test]
fn analyze_codeloc_oom() {
    let Some(path) = fragscope_testdata::real_file("codeloc-qwen3-gnn-expandable-oom-3gpu.pickle") else { return };
    let out = run(&["analyze", "--json", "--top", "3", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out).1);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let devs = v["files"][0]["devices"].as_array().unwrap();
    assert_eq!(devs.len(), 3);
    assert!(devs[0]["oom"].is_null() && devs[2]["oom"].is_null());
    let o = &devs[1]["oom"];
    assert_eq!(devs[1]["device"], 1);
    assert_eq!(o["request_bytes"], 5_308_694_528u64);
    assert_eq!(o["verdict"], "exhaustion");
    assert_eq!(o["fixes"], Value::Array(vec![]));
    assert_eq!(o["top_sites"].as_array().unwrap().len(), 3);
    assert_eq!(devs[1]["findings"][0]["kind"], "oom");
    let out = run(&["analyze", path.to_str().unwrap()]);
    let (t, _) = text(&out);
    assert!(t.contains("This OOM was exhaustion"), "{t}");
    assert!(t.contains("5,308,694,528 bytes"), "{t}");
    assert!(t.contains("Fragmentation over time") && t.contains("peak"), "{t}");
}

#[test]
fn analyze_bad_input_exits_2() {
    let out = run(&["analyze", "/nonexistent/snapshot.pickle"]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(text(&out).1.lines().count(), 1);
}

#[test]
fn analyze_without_file_runs_on_the_example_and_finds_its_leak() {
    let out = run(&["analyze", "--json"]);
    assert_eq!(out.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let suspects = v["files"][0]["devices"][0]["leak_suspects"].as_array().unwrap();
    // The example keeps every step's loss alive at train.py:63 (see crates/commands/src/example.rs).
    assert_eq!(suspects.len(), 1, "{suspects:?}");
    assert_eq!(suspects[0]["site"], "train.py:63:<listcomp>");
    // It ends in an evaluation request that fails by fragmentation, and replay shows that
    // expandable segments would have fitted it (see crates/commands/src/example.rs).
    let oom = &v["files"][0]["devices"][0]["oom"];
    assert_eq!(oom["verdict"], "fragmentation", "{oom}");
    assert_eq!(oom["request_bytes"], 20_100u64 << 20);
    let fixes: Vec<&str> = oom["fixes"].as_array().unwrap().iter().filter_map(|f| f["setting"].as_str()).collect();
    assert!(fixes.contains(&"expandable_segments:True"), "{oom}");
}

fn fixtures() -> Vec<(String, String)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../oomtext/tests/data/oom");
    let mut v: Vec<(String, String)> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "txt"))
        .map(|p| {
            let raw = std::fs::read_to_string(&p).unwrap();
            // The first line names the source; the rest is the message as found.
            let body = match raw.split_once('\n') {
                Some((first, rest)) if first.starts_with("# source:") => rest.to_string(),
                _ => raw,
            };
            (p.file_name().unwrap().to_string_lossy().into_owned(), body)
        })
        .collect();
    v.sort();
    assert!(v.len() >= 10, "fixtures missing");
    v
}

#[test]
fn oom_on_every_fixture() {
    for (name, body) in fixtures() {
        // stdin, text form
        let out = run_stdin(&["oom"], &body);
        let (t, e) = text(&out);
        assert_eq!(out.status.code(), Some(0), "{name}: {e}");
        assert!(t.contains("Fragmentation the likely cause:"), "{name}: {t}");
        assert!(t.contains("Next steps:"), "{name}: {t}");
        // argument, JSON form
        let out = run(&["oom", "--json", &body]);
        assert_eq!(out.status.code(), Some(0), "{name}: {}", text(&out).1);
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["schema"], "fragscope.oom/2");
        assert!(v["message"]["form"].is_string(), "{name}");
        let verdict = v["explanation"]["verdict"].as_str().unwrap();
        assert_eq!(v["fragmentation_likely"], verdict == "fragmentation", "{name}");
        let steps = v["explanation"]["next_steps"].to_string();
        assert!(steps.contains("_record_memory_history") || steps.contains("fragscope analyze"), "{name}: {steps}");
    }
}

#[test]
fn oom_figures_of_a_fragmentation_message() {
    let (_, body) = fixtures().into_iter().find(|(n, _)| n == "v2.2-fragmentation.txt").unwrap();
    let out = run_stdin(&["oom", "-"], &body);
    let (t, _) = text(&out);
    assert!(t.contains("Fragmentation the likely cause: yes"), "{t}");
    assert!(t.contains("6.39 GiB of the 21.12 GiB PyTorch held was reserved but unallocated"), "{t}");
    assert!(t.contains("_record_memory_history"), "{t}");
}

#[test]
fn oom_unparseable_text_exits_2_with_one_line() {
    let out = run(&["oom", "hello, this is not an error message"]);
    assert_eq!(out.status.code(), Some(2));
    let (_, e) = text(&out);
    assert_eq!(e.lines().count(), 1, "{e}");
    assert!(e.contains("no CUDA out-of-memory message found"), "{e}");
    let out = run_stdin(&["oom"], "RuntimeError: CUDA error: out of memory\n");
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(text(&out).1.lines().count(), 1);
}
