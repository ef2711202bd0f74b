//! Hostile input through the command line (issue 43), under a 4 GB address-space limit
//! (`ulimit -v 4000000`): each case ends with exit 2 and one line on stderr, never an
//! abort, an endless read or a terminal escape reaching the terminal. The reader's own
//! tests (crates/snapshot/tests/it/limits.rs) hold the same cases in more forms.

use std::io::Write;
use std::process::{Command, Stdio};

/// Runs `fragscope ARGS` under `ulimit -v 4000000` with `stdin` fed to it (from a
/// thread, so that a child that stops reading early does not block the test); exit code,
/// stdout, stderr.
fn limited(
    args: &[&str],
    stdin: Stdio,
    feed: Option<Box<dyn FnOnce(std::process::ChildStdin) + Send>>,
) -> (i32, String, String) {
    let mut child = Command::new("sh")
        .arg("-c")
        .arg("ulimit -v 4000000 && exec \"$0\" \"$@\"")
        .arg(env!("CARGO_BIN_EXE_fragscope"))
        .args(args)
        .stdin(stdin)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let feeder = match (child.stdin.take(), feed) {
        (Some(w), Some(f)) => Some(std::thread::spawn(move || f(w))),
        _ => None,
    };
    let o = child.wait_with_output().unwrap();
    if let Some(t) = feeder {
        t.join().unwrap();
    }
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into(),
        String::from_utf8_lossy(&o.stderr).into(),
    )
}

/// Feeds `bytes` then closes stdin (a closed pipe is the child's business).
fn bytes_in(bytes: Vec<u8>) -> Option<Box<dyn FnOnce(std::process::ChildStdin) + Send>> {
    Some(Box::new(move |mut w| {
        let _ = w.write_all(&bytes);
    }))
}

#[track_caller]
fn one_line_exit_2((code, _, err): (i32, String, String), want: &str) {
    assert_eq!(code, 2, "{err}");
    assert_eq!(err.lines().count(), 1, "one line: {err:?}");
    assert!(err.contains(want), "{err:?} lacks {want:?}");
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

/// `{'segments': [], 'evil': L_64}`, `L_k = [L_{k-1}, L_{k-1}]` shared through the memo.
fn memo_doubling() -> Vec<u8> {
    let mut v = b"\x80\x04}(\x8c\x08segments]\x8c\x04evil]q\x00".to_vec();
    for k in 1..=64u8 {
        v.extend([b'0', b'(', b'h', k - 1, b'h', k - 1, b'l', b'q', k]);
    }
    v.extend(b"u.");
    v
}

#[test]
fn pickle_bombs_on_stdin_end_in_one_line() {
    let pickle = memo_doubling();
    one_line_exit_2(limited(&["summary", "-"], Stdio::piped(), bytes_in(pickle.clone())), "memo references copied");
    one_line_exit_2(limited(&["summary", "-"], Stdio::piped(), bytes_in(gzip(&pickle))), "memo references copied");
    // 60 M EMPTY_LISTs, gzip'd to about 60 KB.
    let mut lists = b"\x80\x04".to_vec();
    lists.extend(std::iter::repeat_n(b']', 60_000_000));
    one_line_exit_2(
        limited(&["summary", "-"], Stdio::piped(), bytes_in(gzip(&lists))),
        "the pickle's values grow past",
    );
    // A declared 6 GiB byte string with 64 MiB of zeros behind it, gzip'd.
    let mut long = b"\x80\x04\x8e".to_vec();
    long.extend((6u64 << 30).to_le_bytes());
    long.extend(std::iter::repeat_n(0u8, 64 << 20));
    one_line_exit_2(
        limited(&["summary", "-"], Stdio::piped(), bytes_in(gzip(&long))),
        "longer than any memory snapshot holds (limit 64 MiB)",
    );
}

#[test]
fn endless_zeros_stop_at_once() {
    // `(printf '{'; cat /dev/zero) | fragscope summary -`
    let endless: Box<dyn FnOnce(std::process::ChildStdin) + Send> = Box::new(|mut w| {
        let zeros = vec![0u8; 1 << 16];
        if w.write_all(b"{").is_ok() {
            while w.write_all(&zeros).is_ok() {}
        }
    });
    one_line_exit_2(limited(&["summary", "-"], Stdio::piped(), Some(endless)), "control byte 0x00 at byte 1");
    // `fragscope oom < /dev/zero`
    let zero = std::fs::File::open("/dev/zero").unwrap();
    one_line_exit_2(limited(&["oom"], Stdio::from(zero), None), "stdin holds a NUL byte at byte 0");
}

#[test]
fn terminal_escapes_in_names_are_escaped_in_text() {
    let src = fragscope_testdata::in_repo_dir().join("effdl-course-liger-ce.pickle");
    let dir = std::env::temp_dir().join(format!("fragscope-escapes-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // An OSC window title, a clear screen and a right-to-left override in a file name.
    let path = dir.join("a\u{1b}]0;pwned\u{7}\u{1b}[2J\u{202e}b.pickle");
    std::fs::copy(&src, &path).unwrap();
    let (code, out, err) = limited(&["summary", path.to_str().unwrap()], Stdio::null(), None);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("a\\u001b]0;pwned\\u0007\\u001b[2J\\u202eb.pickle"), "{out}");
    assert!(!out.contains('\u{1b}') && !out.contains('\u{202e}') && !out.contains('\u{7}'), "{out:?}");
    // In an error line too.
    let missing = dir.join("gone\u{1b}[2J.pickle");
    let (code, _, err) = limited(&["summary", missing.to_str().unwrap()], Stdio::null(), None);
    assert_eq!(code, 2);
    assert!(err.contains("gone\\u001b[2J.pickle") && !err.contains('\u{1b}'), "{err:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn argument_errors_are_one_line() {
    for args in [
        &["summary", "--jsn", "x"][..],
        &["nosuchcommand"],
        &["diff", "x"],
        &["summary", "x", "y", "--bogus"],
        &["summary", "--json", "--json", "x"],
    ] {
        let (code, out, err) = limited(args, Stdio::null(), None);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(out.is_empty(), "{args:?}: {out}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err:?}");
        assert!(err.starts_with("error: ") && err.contains("Usage: fragscope"), "{args:?}: {err:?}");
    }
}
