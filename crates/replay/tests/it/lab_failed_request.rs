//! Issue 21 item 4: the allocator lab's denominator, peak live bytes, counts what was live,
//! not a request that failed with an OOM; the failed request is shown separately.
//!
//! codeloc-qwen3-gnn-expandable-oom-3gpu, device 1 (an OOM of 4.94 GiB): the bound used to
//! be 89.37 GB (83.23 GiB, the failed request counted as live); what was ever live is
//! 84.06 GB. Both are worked out here from the trace itself, independently of the lab.

use fragscope_replay::{lab, parse_policy};
use fragscope_snapshot::Action;
use fragscope_testdata::real_file;

#[test]
fn peak_live_does_not_count_the_failed_request() {
    let Some(path) = real_file("codeloc-qwen3-gnn-expandable-oom-3gpu.pickle") else { return };
    let snap = fragscope_snapshot::read_path(&path).unwrap();
    let dev = 1;
    // Independent walk: live bytes as requested, allocs minus completed frees (no block of
    // this device is alive before its trace); an `oom` entry adds nothing.
    let (mut live, mut peak, mut peak_with_failed) = (0u64, 0u64, 0u64);
    let mut sizes = std::collections::HashMap::new();
    for e in snap.trace(dev) {
        match e.action {
            Action::Alloc => {
                sizes.insert(e.addr, e.size);
                live += e.size;
                peak = peak.max(live);
            }
            Action::FreeCompleted => live -= sizes.remove(&e.addr).unwrap_or(0),
            Action::Oom => peak_with_failed = peak_with_failed.max(live + e.size),
            _ => {}
        }
    }
    assert!(peak_with_failed > peak, "the recorded OOM asked for more than was ever live");
    let specs = parse_policy("pytorch").unwrap();
    let r = lab(&snap, dev, &specs, None);
    assert_eq!(r.bounds.live, peak, "peak live bytes: what was live");
    assert_eq!((r.bounds.live as f64 / 1e7).round(), 8406.0, "84.06 GB");
    assert_eq!((peak_with_failed as f64 / 1e7).round(), 8937.0, "89.37 GB with the failed request");
    assert_eq!(r.bounds.live_with_failed, peak_with_failed.max(peak));
    assert!(r.bounds.live_512 >= r.bounds.live && r.bounds.live_512 < peak_with_failed);
}
