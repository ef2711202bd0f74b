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
    limited_to(4_000_000, args, stdin, feed)
}

/// [`limited`] under `ulimit -v KIB`.
fn limited_to(
    kib: u64,
    args: &[&str],
    stdin: Stdio,
    feed: Option<Box<dyn FnOnce(std::process::ChildStdin) + Send>>,
) -> (i32, String, String) {
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(format!("ulimit -v {kib} && exec \"$0\" \"$@\""))
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

/// A stored (uncompressed) zip entry's local header, as torch.save writes them: sizes and
/// CRC-32 known up front, no data descriptor.
fn local_header(name: &str, crc: u32, len: u32) -> Vec<u8> {
    let mut v = b"PK\x03\x04".to_vec();
    v.extend(20u16.to_le_bytes()); // version needed
    v.extend([0u8; 6]); // flags, method (stored), time
    v.extend(0x21u16.to_le_bytes()); // date: 1980-01-01
    v.extend(crc.to_le_bytes());
    v.extend(len.to_le_bytes());
    v.extend(len.to_le_bytes());
    v.extend((name.len() as u16).to_le_bytes());
    v.extend(0u16.to_le_bytes());
    v.extend(name.as_bytes());
    v
}

/// The central directory entry of a stored entry whose local header is at `offset`.
fn central_entry(name: &str, crc: u32, len: u32, offset: u32) -> Vec<u8> {
    let mut v = b"PK\x01\x02".to_vec();
    v.extend(20u16.to_le_bytes()); // version made by
    v.extend(20u16.to_le_bytes()); // version needed
    v.extend([0u8; 6]);
    v.extend(0x21u16.to_le_bytes());
    v.extend(crc.to_le_bytes());
    v.extend(len.to_le_bytes());
    v.extend(len.to_le_bytes());
    v.extend((name.len() as u16).to_le_bytes());
    v.extend([0u8; 12]); // extra, comment, disk, attributes
    v.extend(offset.to_le_bytes());
    v.extend(name.as_bytes());
    v
}

/// A zip archive of `pickle` as a torch.save writes it: `archive/data.pkl`, stored.
fn stored_zip(pickle: &[u8]) -> Vec<u8> {
    let mut c = flate2::Crc::new();
    c.update(pickle);
    let (crc, len) = (c.sum(), pickle.len() as u32);
    let mut v = local_header("archive/data.pkl", crc, len);
    v.extend(pickle);
    let cd_at = v.len() as u32;
    let cd = central_entry("archive/data.pkl", crc, len, 0);
    v.extend(&cd);
    v.extend(b"PK\x05\x06\0\0\0\0\x01\0\x01\0");
    v.extend((cd.len() as u32).to_le_bytes());
    v.extend(cd_at.to_le_bytes());
    v.extend(0u16.to_le_bytes());
    v
}

#[test]
fn pickle_bombs_in_a_torch_save_zip_on_stdin_end_in_one_line() {
    // The archive goes through the stdin spill (a temporary file), plain and gzip'd.
    let zip = stored_zip(&memo_doubling());
    one_line_exit_2(limited(&["summary", "-"], Stdio::piped(), bytes_in(zip.clone())), "memo references copied");
    one_line_exit_2(limited(&["summary", "-"], Stdio::piped(), bytes_in(gzip(&zip))), "memo references copied");
    let mut long = b"\x80\x04\x8e".to_vec();
    long.extend((6u64 << 30).to_le_bytes());
    long.extend(std::iter::repeat_n(0u8, 8 << 20));
    one_line_exit_2(
        limited(&["summary", "-"], Stdio::piped(), bytes_in(gzip(&stored_zip(&long)))),
        "longer than any memory snapshot holds (limit 64 MiB)",
    );
    // An archive that ends early: one line, not a hang or a panic.
    one_line_exit_2(limited(&["summary", "-"], Stdio::piped(), bytes_in(zip[..zip.len() / 2].to_vec())), "zip");
}

#[test]
fn a_torch_save_zip_on_stdin_is_not_held_in_memory() {
    // Issue 43: a torch.save archive on stdin was read whole into memory (the zip reader
    // seeks): memory grew with the stream (a 3 GB one took 2.1 GB before "out of memory").
    // Here a real snapshot as `archive/data.pkl`, then a 512 MiB tensor storage
    // (`archive/data/0`, zeros), streamed under a 300 MB address-space limit: only a
    // reader that does not hold the archive in memory gets through it.
    let pickle = std::fs::read(fragscope_testdata::in_repo_dir().join("effdl-course-liger-ce.pickle")).unwrap();
    const STORAGE: u32 = 512 << 20;
    let zeros = vec![0u8; 1 << 20];
    let mut crc = flate2::Crc::new();
    for _ in 0..STORAGE >> 20 {
        crc.update(&zeros);
    }
    let (crc_storage, crc_pickle) = (crc.sum(), {
        let mut c = flate2::Crc::new();
        c.update(&pickle);
        c.sum()
    });
    let len = pickle.len() as u32;
    let mut head = local_header("archive/data.pkl", crc_pickle, len);
    head.extend(&pickle);
    let storage_at = head.len() as u32;
    head.extend(local_header("archive/data/0", crc_storage, STORAGE));
    let mut tail = central_entry("archive/data.pkl", crc_pickle, len, 0);
    tail.extend(central_entry("archive/data/0", crc_storage, STORAGE, storage_at));
    let cd_size = tail.len() as u32;
    tail.extend(b"PK\x05\x06\0\0\0\0\x02\0\x02\0");
    tail.extend(cd_size.to_le_bytes());
    tail.extend((head.len() as u32 + STORAGE).to_le_bytes());
    tail.extend(0u16.to_le_bytes());
    let feed: Box<dyn FnOnce(std::process::ChildStdin) + Send> = Box::new(move |mut w| {
        let _ = (|| -> std::io::Result<()> {
            w.write_all(&head)?;
            for _ in 0..STORAGE >> 20 {
                w.write_all(&zeros)?;
            }
            w.write_all(&tail)
        })();
    });
    let (code, out, err) = limited_to(300_000, &["summary", "--json", "-"], Stdio::piped(), Some(feed));
    assert_eq!(code, 0, "{err}");
    // The same figures as the pickle read from its file.
    let by_path = Command::new(env!("CARGO_BIN_EXE_fragscope"))
        .args(["summary", "--json"])
        .arg(fragscope_testdata::in_repo_dir().join("effdl-course-liger-ce.pickle"))
        .output()
        .unwrap();
    let devices = |b: &[u8]| serde_json::from_slice::<serde_json::Value>(b).unwrap()["files"][0]["devices"].clone();
    assert_eq!(devices(out.as_bytes()), devices(&by_path.stdout));
}

#[test]
fn byte_totals_past_2_64_are_refused_in_one_line() {
    // Issue 43: bounds capped each entry, not their sums; 2^16 segments of 256 TiB (each
    // within its bound) add up to 2^64 bytes. By path, on stdin and gzip'd on stdin.
    use fragscope_snapshot::{Block, BlockState, Segment, Snapshot};
    let size = fragscope_snapshot::bounds::MAX_BYTES;
    let segment = |k: u64| Segment {
        blocks: vec![Block {
            address: k << 41,
            size,
            requested_size: None,
            state: BlockState::Inactive,
            stack: None,
            history: None,
        }],
        ..Segment::new(0, k << 41, size)
    };
    let snap = Snapshot { segments: (0..1u64 << 16).map(segment).collect(), ..Default::default() };
    let dir = tempfile::Builder::new().prefix("fragscope-sums-").tempdir().unwrap();
    let f = dir.path().join("sums.pickle");
    fragscope_snapshot::pickle::write::write_path(&snap, &f).unwrap();
    let want = "the segments' total_size add up to 18446744073709551616 bytes, more than 2^64";
    let bytes = std::fs::read(&f).unwrap();
    for args in [&["summary", f.to_str().unwrap()][..], &["analyze", f.to_str().unwrap()]] {
        one_line_exit_2(limited(args, Stdio::null(), None), want);
    }
    one_line_exit_2(limited(&["summary", "-"], Stdio::piped(), bytes_in(bytes.clone())), want);
    one_line_exit_2(limited(&["replay", "-"], Stdio::piped(), bytes_in(gzip(&bytes))), want);
}

#[test]
fn terminal_escapes_in_names_are_escaped_in_text() {
    let src = fragscope_testdata::in_repo_dir().join("effdl-course-liger-ce.pickle");
    let tmp = tempfile::Builder::new().prefix("fragscope-escapes-").tempdir().unwrap();
    let dir = tmp.path();
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
