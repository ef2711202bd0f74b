//! `read_path_checked` / `read_from_checked` (the bound the pickle reader keeps while it
//! reads, and the trace walked again only when that bound is out of limits) give exactly
//! what reading and then `bounds::check` gives: the same snapshot or the same error, naming
//! the same first offender. On every real file, and on real files with one value moved to
//! the limits or past them, in a device trace (at eleven positions from first to last: the
//! batch decoder, the learned layouts and the generic path all make entries), in a segment, and
//! in a file whose entries carry lists of their own (PyTorch's shape).

use crate::common;

use std::path::Path;

use fragscope_snapshot::bounds::{MAX_ADDRESS, MAX_BYTES};
use fragscope_snapshot::pickle::write::{write_path_with, WriteOptions};
use fragscope_snapshot::{read_from, read_from_checked, read_path, read_path_checked, Snapshot};

/// Reading then checking, as a message or the snapshot's trace lengths.
fn two_step(r: Result<Snapshot, fragscope_snapshot::ReadError>) -> Result<Vec<usize>, String> {
    let s = r.map_err(|e| e.to_string())?;
    fragscope_snapshot::bounds::check(&s).map_err(|e| e.to_string())?;
    Ok(s.device_traces.iter().map(Vec::len).collect())
}

fn one_step(r: Result<Snapshot, fragscope_snapshot::ReadError>) -> Result<Vec<usize>, String> {
    r.map(|s| s.device_traces.iter().map(Vec::len).collect()).map_err(|e| e.to_string())
}

/// The checked reads of `path` (mapped, streamed, gzip-streamed) against read-then-check.
fn same_verdict(path: &Path) -> Result<Vec<usize>, String> {
    let want = two_step(read_path(path));
    assert_eq!(one_step(read_path_checked(path, &mut |_, _| {})), want, "{}: mapped", path.display());
    let bytes = std::fs::read(path).unwrap();
    assert_eq!(one_step(read_from_checked(&bytes[..])), want, "{}: streamed", path.display());
    assert_eq!(two_step(read_from(&bytes[..])), want, "{}: read_from then check", path.display());
    if !bytes.starts_with(&[0x1f, 0x8b]) {
        let gz = common::gzip(&bytes);
        assert_eq!(one_step(read_from_checked(&gz[..])), want, "{}: gzip", path.display());
    }
    want
}

#[test]
fn checked_reads_equal_read_then_check_on_real_files() {
    let dir = fragscope_testdata::traces_dir().unwrap();
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let p = entry.unwrap().path();
        if !p.is_file() || p.extension().is_some_and(|e| e == "md") {
            continue;
        }
        same_verdict(&p).ok();
        n += 1;
    }
    assert!(n >= fragscope_testdata::min_files(30), "only {n} files in {}", dir.display());
}

/// Values at the limits (accepted) and just past them (refused), written into a real file.
#[test]
fn out_of_bounds_values_are_found_wherever_they_are() {
    let Some(p) = fragscope_testdata::real_file("decomfl-opt-zeroth-order-windows.pickle") else { return };
    let base = read_path(&p).unwrap();
    let dir = common::scratch_dir("bounds");
    let (d, len) = base.device_traces.iter().enumerate().map(|(d, t)| (d, t.len())).max_by_key(|x| x.1).unwrap();
    assert!(len > 3000, "a trace long enough for several APPENDS batches: {len}");
    let (mut accepted, mut refused) = (0, 0);
    for fresh in [false, true] {
        // Eleven positions: the reader's batch decoder takes long runs of entries and hands
        // the odd one to the generic path, and either may make the entry moved.
        let positions: Vec<usize> = (0..=10).map(|k| (len - 1) * k / 10).collect();
        for &i in &positions {
            for (field, v) in [
                ("addr", MAX_ADDRESS - 1),
                ("addr", MAX_ADDRESS),
                ("addr", u64::MAX),
                ("size", MAX_BYTES),
                ("size", MAX_BYTES + 1),
                ("size", u64::MAX),
            ] {
                let mut s = base.clone();
                let e = &mut s.device_traces[d][i];
                if field == "addr" {
                    e.addr = v;
                } else {
                    e.size = v;
                }
                let f = dir.join(format!("trace-{fresh}-{i}-{field}-{v}.pickle"));
                write_path_with(&s, &f, &WriteOptions { fresh_stacks: fresh }).unwrap();
                match same_verdict(&f) {
                    Ok(_) => accepted += 1,
                    Err(msg) => {
                        assert!(msg.contains(&format!("entry {i} ")), "{msg}");
                        refused += 1;
                    }
                }
            }
        }
    }
    // A segment's size past the limit: refused even though every trace entry is fine.
    let mut s = base.clone();
    s.segments[0].total_size = MAX_BYTES + 1;
    let f = dir.join("segment.pickle");
    write_path_with(&s, &f, &WriteOptions::default()).unwrap();
    let msg = same_verdict(&f).unwrap_err();
    assert!(msg.contains("segments[0] total_size"), "{msg}");
    // Per position and layout: MAX_ADDRESS - 1 and MAX_BYTES accepted, the other four refused.
    assert_eq!((accepted, refused), (2 * 11 * 2, 2 * 11 * 4));
}
