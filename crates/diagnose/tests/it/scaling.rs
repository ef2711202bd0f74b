//! `analyze` stays linear in devices (issue 43: every device's steps filtered all
//! segments). The same snapshot shape at n and 4n devices: a linear analysis takes about
//! 4× as long, a quadratic one 16×; the test fails past 6×. Best of three runs each, so
//! that a busy machine's pauses do not count.

use fragscope_diagnose::{analyze, AnalyzeOptions};
use fragscope_snapshot::{Block, BlockState, Segment, SegmentType, Snapshot};
use std::time::{Duration, Instant};

/// 4× the input must cost less than this many times the time: linear work is ×4 (×4.6 with
/// a log factor), quadratic ×16; 8 leaves room for a loaded CI machine (the old code
/// measured ×11–20 here).
const MAX_RATIO: f64 = 8.0;

const MIB: u64 = 1 << 20;

/// `n` devices, each with one 2 MiB segment holding a 512-byte tensor; no trace.
fn devices(n: u64) -> Snapshot {
    let mut snap = Snapshot::default();
    for k in 0..n {
        let address = (k + 1) * 2 * MIB;
        let block = |address, size, state| Block {
            address,
            size,
            requested_size: Some(size),
            state,
            stack: None,
            history: None,
        };
        snap.segments.push(Segment {
            device: k as i64,
            address,
            total_size: 2 * MIB,
            allocated_size: 512,
            active_size: 512,
            requested_size: Some(512),
            stream: 0,
            segment_type: SegmentType::Large,
            segment_pool_id: Some((0, 0)),
            is_expandable: Some(false),
            stack: None,
            blocks: vec![
                block(address, 512, BlockState::ActiveAllocated),
                block(address + 512, 2 * MIB - 512, BlockState::Inactive),
            ],
        });
    }
    snap
}

fn best_of_three(snap: &Snapshot, n: u64) -> Duration {
    let opts = AnalyzeOptions { what_if: false, threads: 1, ..AnalyzeOptions::default() };
    (0..3)
        .map(|_| {
            let t = Instant::now();
            let a = analyze(snap, &opts);
            let took = t.elapsed();
            assert_eq!(a.devices.len() as u64, n);
            took
        })
        .min()
        .unwrap()
}

#[test]
fn analyze_is_linear_in_devices() {
    let n = 6_000;
    let (small, large) = (devices(n), devices(4 * n));
    let (t1, t4) = (best_of_three(&small, n), best_of_three(&large, 4 * n));
    let r = t4.as_secs_f64() / t1.as_secs_f64().max(1e-4);
    assert!(r < MAX_RATIO, "{n} devices {t1:?}, {} devices {t4:?}: ×{r:.1}, not linear", 4 * n);
}
