//! Snapshot tests of every command's text and JSON (insta): what a user sees, on the
//! snapshots that every checkout has (the built-in example, the licence-compatible real
//! files of `crates/testdata/real/` and their grids, our H200 recordings). A refactoring
//! that changes a byte of any output fails here, on a fresh clone as under CI; a change
//! meant to alter output is reviewed as a diff of the stored `.snap` files
//! (`INSTA_UPDATE=always cargo test -p fragscope --test it snapshots::`, then `git diff`).
//!
//! Left out: `report` (an HTML page of megabytes; the browser tests read it), the allocator
//! lab (`replay --allocator`: it prints its own timings) and `export` (Parquet bytes; its
//! tables are checked in `cli.rs`).

use std::path::Path;
use std::process::Command;

/// The command's stdout, stderr and exit code, as one text.
fn run(args: &[&str]) -> String {
    let o = Command::new(env!("CARGO_BIN_EXE_fragscope"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        // clap wraps help to COLUMNS when built with `wrap_help`: one width for every
        // machine should that feature be turned on.
        .env("COLUMNS", "100")
        .output()
        .expect("the fragscope binary runs");
    let mut s = String::from_utf8_lossy(&o.stdout).into_owned();
    if !o.stderr.is_empty() {
        s.push_str("--- stderr\n");
        s.push_str(&String::from_utf8_lossy(&o.stderr));
    }
    s.push_str(&format!("--- exit {}\n", o.status.code().unwrap_or(-1)));
    s
}

/// `crates/testdata/...` from the CLI crate, as the commands are given it (their output
/// names the file as given, so the path must not depend on the machine).
fn file(rel: &str) -> String {
    let p = format!("../testdata/{rel}");
    assert!(Path::new(env!("CARGO_MANIFEST_DIR")).join(&p).is_file(), "{p} is in the repository");
    p
}

fn snap(name: &str, args: &[&str]) {
    let mut settings = insta::Settings::clone_current();
    settings.set_prepend_module_to_snapshot(false);
    settings.set_description(format!("fragscope {}", args.join(" ")));
    settings.set_omit_expression(true);
    settings.bind(|| insta::assert_snapshot!(name, run(args)));
}

/// Real files that every checkout has (crates/testdata/real, NOTICE.md), by short name.
const REAL: &[(&str, &str)] = &[
    ("decomfl", "real/decomfl-opt-zeroth-order-windows.pickle"),
    ("fsdp4", "real/effdl-aphelack-customfsdp-4gpu.pickle"),
    ("liger", "real/effdl-course-liger-ce.pickle"),
    ("flexgen-oom", "real/flexgen-opt-oom-v2.0-history-format.pickle"),
    ("nuggets-trimmed", "real/nuggets-mini-snapshot-trimmed.pickle"),
    ("sketchkv-stateonly", "real/sketchkv-llama-kvquant-stateonly.pickle"),
    ("verl-pools", "real/verl-megatron-vllm-qwen2-private-pools-stateonly.pickle"),
];

#[test]
fn the_example() {
    snap("example-summary", &["summary"]);
    snap("example-summary-json", &["summary", "--json"]);
    snap("example-analyze", &["analyze"]);
    snap("example-analyze-json", &["analyze", "--json"]);
    snap("example-replay", &["replay"]);
    snap("example-state", &["state"]);
}

#[test]
fn summary_of_each_real_file() {
    for (name, rel) in REAL {
        let f = file(rel);
        snap(&format!("{name}-summary"), &["summary", &f]);
        snap(&format!("{name}-summary-json"), &["summary", "--json", &f]);
    }
}

#[test]
fn analyze_of_each_real_file() {
    for (name, rel) in REAL {
        let f = file(rel);
        snap(&format!("{name}-analyze"), &["analyze", &f]);
        snap(&format!("{name}-analyze-json"), &["analyze", "--json", "--what-if", &f]);
    }
}

#[test]
fn replay_of_each_real_file() {
    for (name, rel) in REAL {
        let f = file(rel);
        snap(&format!("{name}-replay-verify"), &["replay", "--verify", &f]);
        snap(&format!("{name}-replay-json"), &["replay", "--json", &f]);
    }
    let f = file("h200/gpt-s512-b8.pickle.gz");
    snap(
        "gpt-b8-replay-role-whatifs",
        &["replay", "--grads-set-to-none", "--shard-optimizer", "4", "--checkpoint", "all", &f],
    );
    snap("gpt-b8-replay-capacity", &["replay", "--json", "--capacity", "A100-40GB", &f]);
}

#[test]
fn state_check_and_diff() {
    for (name, rel) in REAL {
        let f = file(rel);
        snap(&format!("{name}-state-json"), &["state", "--json", &f]);
        snap(&format!("{name}-check"), &["check", "--no-leaks", "--max-peak-fragmentation", "0.5", &f]);
    }
    let liger = file("real/effdl-course-liger-ce.pickle");
    // Each limit echoed as typed, with its bytes (not `40GB` printed back as 37.25 GiB).
    snap("liger-check-decimal-limit", &["check", "--max-reserved", "40GB", "--max-allocated", "200MB", &liger]);
    // No limit: refused (exit 2), never "passed" with nothing checked.
    snap("liger-check-no-limit", &["check", &liger]);
    // One holder of one block: "1 block", and the pools' "1 segment".
    snap("liger-state", &["state", &liger]);
    let b8 = file("h200/gpt-s512-b8.pickle.gz");
    snap("gpt-b8-state-by-role", &["state", "--by", "role", &b8]);
    snap("gpt-b8-state-at", &["state", "--at", "1000", "--by", "annotation", &b8]);
    snap("gpt-b8-vs-b16-diff", &["diff", &b8, &file("h200/gpt-s512-b16.pickle.gz")]);
    snap("gpt-b8-vs-b16-diff-json", &["diff", "--json", &b8, &file("h200/gpt-s512-b16.pickle.gz")]);
}

#[test]
fn predict_on_the_grids() {
    let (b4, b8) = (file("h200/gpt-s512-b4.pickle.gz"), file("h200/gpt-s512-b8.pickle.gz"));
    snap("gpt-predict", &["predict", "--sizes", "4,8", "--at", "16,32", &b4, &b8]);
    snap(
        "gpt-predict-json",
        &["predict", "--json", "--sizes", "4,8", "--at", "16,32", "--capacity", "H100-80GB", &b4, &b8],
    );
    snap("gpt-predict-max-fit", &["predict", "--sizes", "4,8", "--capacity", "40GB", "--max-fit", &b4, &b8]);
    let (n100, n150) =
        (file("real/grids/niu-train3-ctx100-fp32.pickle"), file("real/grids/niu-train3-ctx150-fp32.pickle"));
    snap("niu-train3-predict", &["predict", "--sizes", "100,150", "--at", "200", &n100, &n150]);
}

#[test]
fn oom_of_each_saved_message() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../oomtext/tests/data/oom");
    let mut names: Vec<String> =
        std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    assert!(names.len() >= 20, "{} messages", names.len());
    for n in names {
        let f = format!("../oomtext/tests/data/oom/{n}");
        let stem = n.trim_end_matches(".txt");
        snap(&format!("oom-{stem}"), &["oom", &f]);
        snap(&format!("oom-{stem}-json"), &["oom", "--json", &f]);
    }
}

#[test]
fn refusals_are_one_line_and_exit_2() {
    snap("refused-missing-file", &["summary", "no-such-file.pickle"]);
    snap("refused-bad-capacity", &["replay", "--capacity", "lots", &file("real/effdl-course-liger-ce.pickle")]);
    snap("refused-bad-config", &["replay", "--config", "no_such_option:1", &file("real/effdl-course-liger-ce.pickle")]);
}

/// The commands `fragscope --help` lists (its `Commands:` section, `help` left out).
fn commands() -> Vec<String> {
    let top = run(&["--help"]);
    let list = top.split("Commands:\n").nth(1).expect("`fragscope --help` lists its commands");
    list.lines()
        .take_while(|l| !l.trim().is_empty())
        .filter(|l| l.starts_with("  ") && !l.starts_with("   "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(str::to_string)
        .collect()
}

/// Every command's `--help`, and the top-level one, so that a help text cannot regress
/// unseen (a hidden command's text shown for another, a stale tool count).
#[test]
fn help_of_every_command() {
    snap("help", &["--help"]);
    let cmds = commands();
    assert!(cmds.len() >= 12, "{cmds:?}");
    for c in ["summary", "analyze", "check", "fit", "state", "export"] {
        assert!(cmds.iter().any(|x| x == c), "{c} is listed: {cmds:?}");
    }
    for c in &cmds {
        snap(&format!("help-{c}"), &[c, "--help"]);
    }
}
