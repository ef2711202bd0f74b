//! A trace list long enough for the mapped read's own paths: past 4 MB of entries the
//! pre-fault helper follows the list and the list is given the capacity for the rest of
//! the file at once (`reserve_for_rest` in the reader); the file is over no helper's
//! size, so the one that maps the file ahead is turned on too
//! ([`fragscope_snapshot::set_ahead_min`]). The snapshot read so is the same as the one
//! the streamed read (through a buffer, none of those paths) makes of the same bytes,
//! with one device's trace or with several.

use crate::common;

use fragscope_snapshot::model::Snapshot;
use fragscope_snapshot::pickle::write::write_path;
use fragscope_snapshot::{read_from, read_path, semantic_diff};
use std::path::Path;

/// The in-repository decomfl snapshot with its trace repeated to `n` entries on each of
/// `devices` devices (time shifted forward on every repetition, so the entries differ).
fn long_snapshot(n: usize, devices: usize) -> Snapshot {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/real/decomfl-opt-zeroth-order-windows.pickle");
    let mut snap = read_path(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    let base = snap.device_traces.iter().max_by_key(|t| t.len()).cloned().expect("a trace");
    assert!(!base.is_empty());
    let mut trace = Vec::with_capacity(n);
    let mut shift = 0;
    while trace.len() < n {
        for e in base.iter().take(n - trace.len()) {
            let mut e = *e;
            if let Some(t) = e.time() {
                e.time_us = t + shift;
            }
            trace.push(e);
        }
        shift += 1_000_000;
    }
    snap.device_traces = vec![trace; devices];
    snap
}

#[test]
fn a_long_trace_reads_the_same_mapped_and_streamed() {
    // 40-byte entries: 150,000 are 6 MB, past the 4 MB where the list gets its capacity.
    // Process-wide: held for the whole test, so that no test beside it changes it back.
    let ahead = common::AheadMin::take();
    ahead.set(0);
    let dir = common::scratch_dir("long_trace");
    for devices in [1, 3] {
        let snap = long_snapshot(150_000, devices);
        let p = dir.join(format!("long-{devices}.pickle"));
        write_path(&snap, &p).unwrap();
        let mapped = read_path(&p).unwrap_or_else(|e| panic!("{devices} devices, mapped: {e}"));
        let bytes = std::fs::read(&p).unwrap();
        let streamed = read_from(&bytes[..]).unwrap_or_else(|e| panic!("{devices} devices, streamed: {e}"));
        assert_eq!(mapped.device_traces.len(), devices);
        assert!(mapped.device_traces.iter().all(|t| t.len() == 150_000));
        assert_eq!(semantic_diff(&streamed, &mapped), None, "{devices} devices");
        assert_eq!(semantic_diff(&snap, &mapped), None, "{devices} devices, against what was written");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
