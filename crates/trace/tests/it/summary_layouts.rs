//! `summary` runs its walks on two threads on a two-core machine (the steps before the
//! table on the calling thread, handed to the lifetime walk's thread) and on three on a
//! larger one (the steps on a thread of their own). Whichever layout a machine takes, the
//! summary is the same: checked here on every real snapshot, with and without the roles
//! (and, without them, the same as with them less the roles).

use fragscope_testdata::{min_count, real_pickles};
use fragscope_trace::summarize_device_threads;

#[test]
fn both_thread_layouts_give_the_same_summary() {
    let mut with_trace = 0;
    for p in real_pickles() {
        let name = p.file_name().unwrap().to_string_lossy().to_string();
        let snap = fragscope_snapshot::read_path(&p).unwrap_or_else(|e| panic!("{name}: {e}"));
        for d in snap.devices() {
            if !snap.trace(d).is_empty() {
                with_trace += 1;
            }
            let mut with_roles = None;
            for roles in [true, false] {
                let two = summarize_device_threads(&snap, d, roles, false);
                let three = summarize_device_threads(&snap, d, roles, true);
                assert_eq!(roles && !snap.trace(d).is_empty(), two.roles.is_some(), "{name} device {d}");
                assert_eq!(
                    serde_json::to_value(&two).unwrap(),
                    serde_json::to_value(&three).unwrap(),
                    "{name} device {d}, roles {roles}"
                );
                // Without the roles the trace's figures come from the walk's first pass
                // alone (no lives recorded): the same summary, less its roles.
                match with_roles.take() {
                    None => with_roles = Some(two),
                    Some(mut w) => {
                        w.roles = None;
                        assert_eq!(
                            serde_json::to_value(&w).unwrap(),
                            serde_json::to_value(&two).unwrap(),
                            "{name} device {d}: with the roles and without"
                        );
                    }
                }
            }
        }
    }
    // Devices with a trace, where the layouts differ in what runs where.
    assert!(with_trace >= min_count(20, 5), "only {with_trace} devices with a trace");
}
