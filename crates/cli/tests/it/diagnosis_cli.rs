//! `fragscope check` exit codes (0 / 1 / 2) and `fragscope diff` on real files from
//! `../shared/traces` (fail when missing and `CI` is set, else skip).

use std::path::PathBuf;
use std::process::{Command, Output};

fn trace(name: &str) -> Option<PathBuf> {
    fragscope_testdata::real_file(name)
}

fn fragscope(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fragscope")).args(args).output().unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn check_exit_codes() {
    let Some(f) = trace("cs336-2.7b-fwd-ctx128-bf16.pickle") else { return };
    let f = f.to_str().unwrap();

    let o = fragscope(&["check", f, "--max-reserved", "20GiB"]);
    assert_eq!(o.status.code(), Some(1));
    // The limit echoed as given, with the bytes it was read as.
    assert_eq!(
        stdout(&o),
        "check failed: peak reserved 22.58 GiB on device 0 exceeds --max-reserved 20GiB (21,474,836,480 bytes)\n"
    );

    let o = fragscope(&[
        "check",
        f,
        "--max-reserved",
        "30GiB",
        "--max-allocated",
        "23GiB",
        "--max-peak-fragmentation",
        "0.15",
        "--no-leaks",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    assert_eq!(stdout(&o).lines().count(), 1);
    assert!(
        stdout(&o).starts_with(
            "check passed (--max-reserved 30GiB (32,212,254,720 bytes), --max-allocated 23GiB (24,696,061,952 bytes), \
             --max-peak-fragmentation 0.15 (15.0%), --no-leaks): "
        ),
        "{}",
        stdout(&o)
    );

    // 24,245,174,272 bytes reserved: above 24 GB (decimal units).
    let o = fragscope(&["check", f, "--max-reserved", "24GB"]);
    assert_eq!(o.status.code(), Some(1));
    // A decimal limit stays as typed: not "22.35 GiB", which reads as another budget.
    assert!(stdout(&o).ends_with("exceeds --max-reserved 24GB (24,000,000,000 bytes)\n"), "{}", stdout(&o));
    let o = fragscope(&["check", f, "--max-reserved", "25GB", "--max-peak-fragmentation", "0.5%"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stdout(&o)
            .starts_with("check failed: peak fragmentation 0.9% on device 0 exceeds --max-peak-fragmentation 0.5%"),
        "{}",
        stdout(&o)
    );

    // The limit's name before it was called after its metric is still accepted.
    let o = fragscope(&["check", f, "--max-reserved", "25GB", "--max-fragmentation", "0.5%", "--json"]);
    assert_eq!(o.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["schema"], "fragscope.check/1");
    assert_eq!(v["failures"][0]["limit"], "max_peak_fragmentation");
    assert_eq!(v["limits"]["max_peak_fragmentation"], 0.005);

    let o = fragscope(&["check", f, "--max-reserved", "20GiB", "--max-allocated", "1GiB", "--json"]);
    assert_eq!(o.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["ok"], false);
    assert_eq!(v["failures"][0]["limit"], "max_reserved");
    assert_eq!(v["failures"][0]["measured"], 24245174272u64);
    assert_eq!(v["failures"][1]["limit"], "max_allocated");
    assert_eq!(v["devices"][0]["peak_allocated"], 24024505344u64); // memory_stats' block peak (docs/glossary.md)

    for bad in [
        &["check", f, "--max-reserved", "20 lightyears"][..],
        &["check", f, "--max-peak-fragmentation", "1.5"],
        &["check", "/nonexistent.pickle"],
        // No limit: nothing would be checked, so no "passed" (there is no default budget).
        &["check", f],
        &["check", f, "--json"],
    ] {
        let o = fragscope(bad);
        assert_eq!(o.status.code(), Some(2), "{bad:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.starts_with("error: "), "{err}");
    }
}

#[test]
fn diff_of_two_real_files() {
    let (Some(a), Some(b)) = (trace("cs336-2.7b-fwd-ctx128-fp32.pickle"), trace("cs336-2.7b-fwd-ctx128-bf16.pickle"))
    else {
        return;
    };
    let o = fragscope(&["diff", a.to_str().unwrap(), b.to_str().unwrap(), "--json"]);
    assert_eq!(o.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["schema"], "fragscope.diff/1");
    let d = &v["devices"][0];
    assert_eq!(d["delta"]["peak_reserved"], 24245174272i64 - 19667091456);
    assert_eq!(d["sites"][0]["site"], "_backends.py:288:einsum");
    let o = fragscope(&["diff", a.to_str().unwrap(), b.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0));
    assert!(stdout(&o).contains("| peak reserved      | 18.32 GiB | 22.58 GiB | +4.26 GiB |"), "{}", stdout(&o));
}

/// `--no-leaks` on a trace where leaks cannot be told (forward only: no training step)
/// passes and says it did not check, in text and JSON; on a three-step training trace it
/// checks (no reason given). Both grids ship in the repository.
#[test]
fn check_no_leaks_says_when_leaks_cannot_be_told() {
    let (Some(fwd), Some(train)) = (
        fragscope_testdata::grid_file("niu-fwd-ctx100-fp32.pickle"),
        fragscope_testdata::grid_file("niu-train3-ctx100-fp32.pickle"),
    ) else {
        return;
    };
    let (fwd, train) = (fwd.to_str().unwrap(), train.to_str().unwrap());
    let o = fragscope(&["check", fwd, "--no-leaks"]);
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    assert!(stdout(&o).contains("(--no-leaks not checked: "), "{}", stdout(&o));
    assert!(stdout(&o).contains("cannot be told"), "{}", stdout(&o));
    let v: serde_json::Value =
        serde_json::from_slice(&fragscope(&["check", fwd, "--no-leaks", "--json"]).stdout).unwrap();
    assert_eq!(v["devices"][0]["leak_suspects"], 0);
    assert!(v["devices"][0]["leaks_not_told"].as_str().unwrap().contains("cannot be told"));

    let o = fragscope(&["check", train, "--no-leaks"]);
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    assert!(!stdout(&o).contains("not checked"), "{}", stdout(&o));
    let v: serde_json::Value =
        serde_json::from_slice(&fragscope(&["check", train, "--no-leaks", "--json"]).stdout).unwrap();
    assert!(v["devices"][0]["leaks_not_told"].is_null());
    // Without --no-leaks nothing about leaks is said.
    let v: serde_json::Value =
        serde_json::from_slice(&fragscope(&["check", fwd, "--max-reserved", "1TiB", "--json"]).stdout).unwrap();
    assert!(v["devices"][0]["leaks_not_told"].is_null() && v["devices"][0]["leak_suspects"].is_null());
}
