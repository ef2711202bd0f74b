//! Memory by role judged against a frozen ground truth (issue 38, "Done means"): the true
//! bytes of each recording's parameters (and, where the source gives them, gradients and
//! optimizer state), derived from the programs' configurations in
//! `../shared/traces/grids/GRIDS.md`, `../shared/traces/SOURCES.md` and the recording
//! scripts — never from fragscope's output. The figures and their arithmetic are data:
//! `crates/testdata/roles-truth/truth.json` (one object per recording: `file` relative to
//! `../shared/traces`, `program`, the bytes per role, `derivation`, `source`). A third of
//! the forward-only and inference recordings are held out of the repository, so that the
//! rules are judged on files they were not tuned to.
//!
//! The roles are those `analyze --json` reports (`DeviceRoles::by_role`, see
//! docs/json-schema.md), from [`fragscope_trace::device_roles`]. Per role with a truth, a
//! reported figure (`cannot_tell` null) must be within 1 % of the truth: a wrong figure
//! fails. "Cannot tell" passes only with its reason, and only when the bytes it did find
//! (`max`, then a lower bound) do not already exceed the truth. Each file's line is
//! printed (truth, reported figure, cannot-tell text), with the coverage: how many files
//! got a parameter figure. Files absent here are skipped visibly and named.
//!
//! The held-out set, in the same form outside the repository, is judged by the same test
//! when `FRAGSCOPE_ROLES_HELDOUT` names its file (`FRAGSCOPE_ROLES_HELDOUT=/path/roles.json
//! cargo test -p fragscope-trace --test it roles_truth -- --nocapture`).

use std::path::PathBuf;

use fragscope_snapshot::read_path;
use fragscope_trace::{device_roles, DeviceRoles};
use serde_json::Value;

/// One recording of `truth.json`.
struct Truth {
    file: String,
    device: i64,
    program: String,
    /// (role name as in `by_role`, true bytes), for the roles the source gives.
    roles: Vec<(&'static str, u64)>,
}

const ROLES: [&str; 3] = ["parameters", "gradients", "optimizer_state"];

fn truth_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../testdata/roles-truth/truth.json")
}

fn load_truth(p: &std::path::Path) -> Vec<Truth> {
    let text = std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    let doc: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    let files = doc["files"].as_array().expect("truth.json: `files` is an array");
    files
        .iter()
        .map(|f| {
            let s = |k: &str| f[k].as_str().unwrap_or_else(|| panic!("truth.json: {f}: `{k}` is not a string"));
            for k in ["derivation", "source"] {
                assert!(!s(k).trim().is_empty(), "truth.json: {}: empty `{k}`", s("file"));
            }
            let roles: Vec<(&'static str, u64)> =
                ROLES.iter().filter_map(|&r| f.get(r).map(|v| (r, v.as_u64().expect("bytes")))).collect();
            assert!(roles.first().is_some_and(|(r, _)| *r == "parameters"), "truth.json: {}: no parameters", s("file"));
            Truth {
                file: s("file").to_string(),
                device: f["device"].as_i64().expect("device"),
                program: s("program").to_string(),
                roles,
            }
        })
        .collect()
}

/// The file through the test-data helpers (`grids/…` from the grids, the rest from the
/// corpus or the in-repository set); `None` after a visible skip.
fn resolve(file: &str) -> Option<PathBuf> {
    let p = match file.strip_prefix("grids/") {
        Some(name) => fragscope_testdata::grid_file(name),
        None => fragscope_testdata::real_file(file),
    }?;
    if p.is_file() {
        Some(p)
    } else {
        fragscope_testdata::skip(&format!("roles truth on {file}: {} absent", p.display()));
        None
    }
}

fn within_1pct(got: u64, want: u64) -> bool {
    got.abs_diff(want) as f64 <= 0.01 * want as f64
}

/// What one role's report says against its truth: `Ok(told)` (whether a figure was
/// given) or `Err(why it is wrong)`; and the line to print.
fn judge(r: &DeviceRoles, role: &str, want: u64) -> (Result<bool, String>, String) {
    let Some(b) = r.by_role.get(role) else {
        return (Err(format!("by_role has no {role:?}")), format!("{role} missing"));
    };
    match &b.cannot_tell {
        None => {
            let line = format!("{role} {} (truth {want})", b.max);
            if within_1pct(b.max, want) {
                (Ok(true), line)
            } else {
                (Err(format!("{role} {} B, truth {want} B (not within 1 %)", b.max)), line)
            }
        }
        Some(why) => {
            let line = format!("{role} cannot tell, found {} (truth {want}): {why}", b.max);
            if why.trim().is_empty() {
                (Err(format!("{role}: cannot tell without a reason")), line)
            } else if b.max > want && !within_1pct(b.max, want) {
                (Err(format!("{role}: cannot tell, yet found {} B, more than the truth {want} B", b.max)), line)
            } else {
                (Ok(false), line)
            }
        }
    }
}

/// Every recording of `truth.json`: each role's figure within 1 % of the truth, or
/// "cannot tell" with a reason. Prints one line per file and the coverage.
#[test]
fn roles_match_the_frozen_truth_or_say_they_cannot_tell() {
    let mut truth = load_truth(&truth_path());
    let in_repo = truth.len();
    if let Some(held) = std::env::var_os("FRAGSCOPE_ROLES_HELDOUT") {
        let held = load_truth(std::path::Path::new(&held));
        println!("held-out set: {} more recordings", held.len());
        truth.extend(held);
    }
    let (mut read, mut told, mut fwd_read, mut fwd_told) = (0, 0, 0, 0);
    let (mut failures, mut skipped) = (Vec::new(), Vec::new());
    for t in &truth {
        let Some(path) = resolve(&t.file) else {
            skipped.push(t.file.as_str());
            continue;
        };
        let snap = read_path(&path).unwrap_or_else(|e| panic!("{}: {e}", t.file));
        let r = device_roles(&snap, t.device);
        let forward = t.program != "training";
        read += 1;
        fwd_read += usize::from(forward);
        let mut lines = Vec::new();
        for &(role, want) in &t.roles {
            let (verdict, line) = judge(&r, role, want);
            lines.push(line);
            match verdict {
                Ok(figure) if role == "parameters" => {
                    told += usize::from(figure);
                    fwd_told += usize::from(figure && forward);
                }
                Ok(_) => {}
                Err(e) => failures.push(format!("{}: {e}", t.file)),
            }
        }
        println!("{} [{}]: {}", t.file, t.program, lines.join("; "));
    }
    println!(
        "coverage: {told} of {read} files got a parameter figure ({fwd_told} of {fwd_read} forward-only or \
         inference); skipped {}: {skipped:?}",
        skipped.len()
    );
    assert!(read >= fragscope_testdata::min_count(in_repo, 7), "read {read} of {} files", truth.len());
    assert!(failures.is_empty(), "{} wrong:\n{}", failures.len(), failures.join("\n"));
}

/// The data is what the test thinks it is: every file named once (and none of those left
/// out, each of which gives its reason), every byte figure a
/// whole number of 2-byte elements, and a forward-only or inference run has no gradient or
/// optimizer state.
#[test]
fn truth_json_is_well_formed() {
    let truth = load_truth(&truth_path());
    assert!(truth.len() >= 10, "{} recordings", truth.len());
    let mut names: Vec<&str> = truth.iter().map(|t| t.file.as_str()).collect();
    names.sort_unstable();
    let n = names.len();
    names.dedup();
    assert_eq!(names.len(), n, "a file named twice");
    // The files left out say why, and none of them has a truth too.
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(truth_path()).unwrap()).unwrap();
    for l in doc["left_out"].as_array().expect("truth.json: `left_out` is an array") {
        let (file, why) = (l["file"].as_str().expect("file"), l["reason"].as_str().expect("reason"));
        assert!(!why.trim().is_empty(), "{file}: left out without a reason");
        assert!(names.binary_search(&file).is_err(), "{file}: both judged and left out");
    }
    for t in &truth {
        assert!(matches!(t.program.as_str(), "forward" | "inference" | "training"), "{}: {}", t.file, t.program);
        for &(role, b) in &t.roles {
            assert_eq!(b % 2, 0, "{}: {role} {b} B is no whole number of 2-byte elements", t.file);
            if t.program != "training" && role != "parameters" {
                assert_eq!(b, 0, "{}: a forward-only run has no {role}", t.file);
            }
        }
    }
}
