//! A snapshot file that another process truncates or rewrites while fragscope reads it
//! (a training job that dumps its snapshot to the same path every few steps opens it with
//! `O_TRUNC`) gives a clean [`ReadError::Changed`], never a SIGBUS that kills the process
//! (the mapped read) nor a snapshot made of two files. The change is made from the
//! reader's progress callback, so it lands in the middle of the read every time.

use crate::common;

use fragscope_snapshot::error::ReadError;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// A real snapshot in the repository (2 MB: hundreds of pages of the mapping).
fn source() -> Vec<u8> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/real/decomfl-opt-zeroth-order-windows.pickle");
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// `bytes` written to a scratch file dated a day back (so that a rewrite now changes its
/// modification time even on a file system with coarse timestamps).
fn scratch_file(tag: &str, name: &str, bytes: &[u8]) -> (common::Scratch, PathBuf) {
    let dir = common::scratch_dir(tag);
    let p = dir.join(name);
    let mut f = std::fs::File::create(&p).unwrap();
    f.write_all(bytes).unwrap();
    f.set_modified(SystemTime::now() - Duration::from_secs(86_400)).unwrap();
    (dir, p)
}

/// Runs `case` without, then with, the helper that maps a file ahead of its reader, one
/// test at a time (the setting is process-wide: [`common::AheadMin`]).
fn both_ways(case: impl Fn(&str)) {
    let ahead = common::AheadMin::take();
    for (min, how) in [(usize::MAX, "faulted in by the reader"), (0, "mapped ahead by the helper")] {
        ahead.set(min);
        case(how);
    }
}

/// Reads `path`, calling `change` on the file once, at the reader's first progress report.
fn read_while(path: &Path, change: impl FnOnce(&Path)) -> Result<fragscope_snapshot::model::Snapshot, ReadError> {
    let mut change = Some(change);
    fragscope_snapshot::read_path_with_progress(path, &mut |_, _| {
        if let Some(c) = change.take() {
            c(path)
        }
    })
}

fn truncate(path: &Path, len: u64) {
    std::fs::OpenOptions::new().write(true).open(path).unwrap().set_len(len).unwrap();
}

fn assert_changed(r: Result<fragscope_snapshot::model::Snapshot, ReadError>, what: &str) {
    match r {
        Err(ReadError::Changed) => {}
        Err(e) => panic!("{what}: expected ReadError::Changed, got {e}"),
        Ok(s) => panic!("{what}: read a snapshot ({} segments) from a file that changed", s.segments.len()),
    }
}

#[test]
fn an_untouched_file_reads() {
    let bytes = source();
    // The snapshot as read from memory: the mapped read, either way, must give the same.
    let want = fragscope_snapshot::read_from(&bytes[..]).unwrap();
    both_ways(|how| {
        let (_dir, p) = scratch_file("changed", "same.pickle", &bytes);
        let snap = read_while(&p, |_| {}).expect("the file did not change");
        assert!(!snap.segments.is_empty());
        assert_eq!(fragscope_snapshot::semantic_diff(&want, &snap), None, "{how}");
    });
}

#[test]
fn a_file_truncated_while_mapped_is_a_clean_error() {
    let bytes = source();
    both_ways(|how| {
        for (name, keep) in [("empty.pickle", 0), ("half.pickle", bytes.len() as u64 / 2), ("page.pickle", 4096)] {
            let (_dir, p) = scratch_file("changed", name, &bytes);
            assert_changed(read_while(&p, |p| truncate(p, keep)), &format!("{name}, {how}"));
        }
    });
}

#[test]
fn a_file_rewritten_while_read_is_a_clean_error() {
    let bytes = source();
    both_ways(|how| {
        // Truncated and written again with the very same bytes: every page is readable
        // again, but the file was rewritten under the reader (it could as well be another
        // snapshot).
        let (_dir, p) = scratch_file("changed", "rewritten.pickle", &bytes);
        assert_changed(
            read_while(&p, |p| {
                truncate(p, 0);
                std::fs::OpenOptions::new().write(true).open(p).unwrap().write_all(&bytes).unwrap();
            }),
            &format!("rewritten, {how}"),
        );
    });
    // Streamed (gzip-compressed), cut short.
    let gz = common::gzip(&bytes);
    let (_dir, p) = scratch_file("changed", "cut.pickle.gz", &gz);
    assert_changed(read_while(&p, |p| truncate(p, gz.len() as u64 / 3)), "gzip, cut short");
}

#[test]
fn the_error_says_what_happened() {
    let text = ReadError::Changed.to_string();
    assert!(text.contains("changed while it was being read") && !text.contains('\n'), "{text}");
}
