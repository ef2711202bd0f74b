//! Issue 21 item 2: an `empty_cache()` replayed while a free is pending completes it, as
//! PyTorch's does (it synchronises the streams first, spec §5.2); the trace's later
//! `free_completed` of that block is then "already completed by empty_cache()", not a free
//! "skipped: their allocation failed".
//!
//! On a real trace shipped in the repository (effdl-course-liger-ce, in-repo so this runs on
//! every clone): `empty_cache()` is inserted right before each `free_completed` that follows
//! its `free_requested`, i.e. while that free is pending.

use fragscope_replay::{has_replayable_trace, recorded_config, simulate_with, SimOptions};
use fragscope_snapshot::Action;
use fragscope_testdata::real_file;

#[test]
fn empty_cache_while_a_free_is_pending_completes_it() {
    let path = real_file("effdl-course-liger-ce.pickle").expect("in the repository");
    let snap = fragscope_snapshot::read_path(&path).unwrap();
    let mut checked = 0;
    for dev in 0..snap.device_traces.len() as i64 {
        if !has_replayable_trace(&snap, dev) {
            continue;
        }
        let trace = snap.trace(dev);
        // each free_completed whose free_requested came just before: pending in between
        let points: Vec<usize> = (1..trace.len())
            .filter(|&i| {
                trace[i].action == Action::FreeCompleted
                    && trace[i - 1].action == Action::FreeRequested
                    && trace[i - 1].addr == trace[i].addr
            })
            .collect();
        if points.is_empty() {
            continue;
        }
        let cfg = recorded_config(&snap);
        let w = simulate_with(&snap, dev, cfg, &SimOptions { empty_cache_at: points.clone(), ..Default::default() });
        let notes = w.notes.join("\n");
        assert!(!notes.contains("skipped"), "device {dev}: {notes}");
        assert!(
            notes.contains(&format!("{} free_completed entries already completed by empty_cache()", points.len())),
            "device {dev}: {notes}"
        );
        assert_eq!(w.ooms, 0, "device {dev}");
        checked += 1;
    }
    assert!(checked > 0, "no device with a pending free to test");
}
