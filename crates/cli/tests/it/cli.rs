//! Command-line behaviour: exit codes, one-line errors, JSON schema keys, the example.

use std::path::PathBuf;
use std::process::{Command, Output};

fn fragscope(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fragscope")).args(args).output().unwrap()
}

/// A file in a temporary folder of its own, removed when dropped (a failing test too).
struct TempFile {
    path: PathBuf,
    _dir: tempfile::TempDir,
}

impl std::ops::Deref for TempFile {
    type Target = std::path::Path;
    fn deref(&self) -> &std::path::Path {
        &self.path
    }
}

fn temp_file(name: &str, bytes: &[u8]) -> TempFile {
    let dir = tempfile::Builder::new().prefix("fragscope-cli-test-").tempdir().unwrap();
    let path = dir.path().join(name);
    std::fs::write(&path, bytes).unwrap();
    TempFile { path, _dir: dir }
}

fn assert_one_line_error(out: &Output, expect: &str) {
    assert_eq!(out.status.code(), Some(2), "exit code; stderr: {}", String::from_utf8_lossy(&out.stderr));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "one line on stderr, got: {err}");
    assert!(err.starts_with("error: "), "{err}");
    assert!(err.contains(expect), "expected {expect:?} in {err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(out.stdout.is_empty(), "nothing on stdout");
}

#[test]
fn empty_file_is_refused() {
    let p = temp_file("empty.pickle", b"");
    let out = fragscope(&["summary", p.to_str().unwrap()]);
    assert_one_line_error(&out, &format!("{} is not a memory snapshot: the file is empty", p.display()));
}

#[test]
fn random_bytes_are_refused() {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let bytes: Vec<u8> = (0..4096)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect();
    let p = temp_file("random.bin", &bytes);
    let out = fragscope(&["summary", "--json", p.to_str().unwrap()]);
    assert_one_line_error(&out, "is not a memory snapshot: ");
}

#[test]
fn global_pickle_is_refused_without_running_it() {
    // pickle.dumps of os.system("touch ...") via __reduce__, protocol 2 (GLOBAL + REDUCE).
    let marker_dir = tempfile::Builder::new().prefix("fragscope-pwned-").tempdir().unwrap();
    let marker = marker_dir.path().join("pwned");
    let cmd = format!("touch {}", marker.display());
    let mut bytes = b"\x80\x02cposix\nsystem\nq\x00X".to_vec();
    bytes.extend((cmd.len() as u32).to_le_bytes());
    bytes.extend(cmd.as_bytes());
    bytes.extend(b"q\x01\x85q\x02Rq\x03.");
    let p = temp_file("evil.pickle", &bytes);
    let out = fragscope(&["summary", p.to_str().unwrap()]);
    assert_one_line_error(&out, "is not a memory snapshot: pickle opcode GLOBAL");
    assert!(!marker.exists(), "the pickle was executed");
}

#[test]
fn missing_file_is_an_io_error() {
    let out = fragscope(&["summary", "/nonexistent/fragscope/snap.pickle"]);
    assert_one_line_error(&out, "cannot read /nonexistent/fragscope/snap.pickle: ");
}

#[test]
fn usage_errors_exit_2() {
    let out = fragscope(&["summary", "--no-such-flag"]);
    assert_eq!(out.status.code(), Some(2));
    let out = fragscope(&["no-such-command"]);
    assert_eq!(out.status.code(), Some(2));
    let out = fragscope(&[]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(fragscope(&["--help"]).status.code(), Some(0));
}

#[test]
fn example_runs_without_file() {
    let out = fragscope(&["summary"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("built-in example"), "{text}");
    assert!(text.contains("PyTorch CUDA memory summary, device ID 0"));
    assert!(text.contains("Fragmentation"));
    assert!(text.contains("train.py") || text.contains("Trace"));
    assert!(out.stderr.is_empty(), "no progress bar or noise on stderr");
}

#[test]
fn json_has_the_documented_keys() {
    let out = fragscope(&["summary", "--json"]);
    assert_eq!(out.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["schema"], "fragscope.summary/1");
    let f = &v["files"][0];
    assert_eq!(f["example"], true);
    for k in ["file", "format", "devices", "memviz_stats", "settings", "notes"] {
        assert!(f.get(k).is_some(), "file key {k}");
    }
    let d = &f["devices"][0];
    for k in [
        "device",
        "segments",
        "blocks",
        "reserved_bytes",
        "allocated_bytes",
        "active_bytes",
        "requested_bytes",
        "inactive_split_bytes",
        "largest_free_block_bytes",
        "trace_events",
    ] {
        assert!(d[k].is_u64() || d[k].is_i64(), "device key {k} is an integer: {}", d[k]);
    }
    for k in ["pools", "fragmentation", "trace"] {
        assert!(d[k].is_object(), "device key {k}");
    }
    for k in ["internal_free_bytes", "external_free_bytes", "free_space_fragmentation", "pinned_segments"] {
        assert!(d["fragmentation"].get(k).is_some(), "fragmentation.{k}");
    }
    for k in ["events", "by_action", "history", "live_bytes_coverage", "first_time_us"] {
        assert!(d["trace"].get(k).is_some(), "trace.{k}");
    }
}

/// `-` reads the snapshot from standard input (as `_memory_viz.py` does); a snapshot
/// piped in gives the same figures as the file, and bad input on stdin the same one line.
#[test]
fn dash_reads_standard_input() {
    use std::io::Write;
    // Write the built-in example as a pickle through replay --save-snapshot, then pipe it.
    let dir = tempfile::Builder::new().prefix("fragscope-stdin-").tempdir().unwrap();
    let pickle = dir.path().join("example.pickle");
    let saved = fragscope(&["replay", "--config", "", "--save-snapshot", pickle.to_str().unwrap()]);
    assert!(saved.status.success(), "{}", String::from_utf8_lossy(&saved.stderr));
    let bytes = std::fs::read(&pickle).unwrap();
    let by_path = fragscope(&["summary", "--json", pickle.to_str().unwrap()]);
    let mut child = Command::new(env!("CARGO_BIN_EXE_fragscope"))
        .args(["summary", "--json", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(&bytes).unwrap();
    let piped = child.wait_with_output().unwrap();
    assert!(piped.status.success());
    let figures = |o: &Output| {
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        v["files"][0]["devices"].clone()
    };
    assert_eq!(figures(&piped), figures(&by_path));
    let _ = std::fs::remove_file(&pickle);

    let mut child = Command::new(env!("CARGO_BIN_EXE_fragscope"))
        .args(["summary", "-"])
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"not a pickle").unwrap();
    let bad = child.wait_with_output().unwrap();
    assert_one_line_error(&bad, "<stdin> is not a memory snapshot");
}

/// A recorded settings string with a part the parser refuses: `summary`'s settings block
/// and `replay`'s notes name the part, and the replay still uses the parts it read.
#[test]
fn unreadable_recorded_settings_are_named_in_summary_and_replay() {
    use fragscope_snapshot::PyObj;
    let mut r = fragscope_replay::Recorder::new("large_segment_size_mb:12", 80 << 30, 1_000, 10).unwrap();
    let st = r.stack(&[("train.py", 10, "main")]);
    for _ in 0..3 {
        r.malloc(3 << 20, 0, st).unwrap();
    }
    let mut snap = r.finish();
    let Some(PyObj::Dict(items)) = snap.allocator_settings.as_mut() else { panic!("settings") };
    for (k, v) in items.iter_mut() {
        if k.as_str() == Some("PYTORCH_CUDA_ALLOC_CONF") {
            *v = PyObj::Str("large_segment_size_mb:12,some_future_option:7".into());
        }
    }
    let mut bytes = Vec::new();
    fragscope_snapshot::pickle::write::write_snapshot(&snap, &mut bytes).unwrap();
    let f = temp_file("unread.pickle", &bytes);
    let out = fragscope(&["summary", f.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    let row = text.lines().find(|l| l.trim_start().starts_with("not read")).unwrap_or_else(|| panic!("{text}"));
    assert!(row.contains("\"some_future_option:7\": Unrecognized key 'some_future_option'"), "{row}");
    let out = fragscope(&["summary", "--json", f.to_str().unwrap()]);
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["files"][0]["settings"]["unread"][0]["item"], "some_future_option:7", "{doc}");
    let out = fragscope(&["replay", f.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("part(s) fragscope cannot read") && text.contains("\"some_future_option:7\""), "{text}");
    assert!(text.contains("3/3"), "the 12 MiB segments replay exactly: {text}");
    // What-ifs run on top of the recorded settings: their notes say the part is missing
    // from them too (replay --config, analyze --what-if).
    let whatif_note = "this what-if runs without them too";
    let out = fragscope(&["replay", f.to_str().unwrap(), "--config", "expandable_segments:True"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    let note = text.lines().find(|l| l.contains(whatif_note)).unwrap_or_else(|| panic!("{text}"));
    assert!(note.contains("\"some_future_option:7\""), "{note}");
    let out = fragscope(&["analyze", "--what-if", f.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.lines().any(|l| l.contains(whatif_note) && l.contains("some_future_option:7")), "{text}");
}
