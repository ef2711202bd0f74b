//! `analyze` stays linear in devices (issue 43: every device's steps filtered all
//! segments). The same snapshot shape at n and 4n devices: a linear analysis takes about
//! 4× as long, a quadratic one 16×; see
//! [`fragscope_testdata::scaling`].

use fragscope_diagnose::{analyze, AnalyzeOptions};
use fragscope_snapshot::{Block, BlockState, Segment, SegmentType, Snapshot};
use fragscope_testdata::scaling::{assert_linear, best_of_three};
use std::time::Duration;

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

fn timed(snap: &Snapshot, n: u64) -> Duration {
    let opts = AnalyzeOptions { what_if: false, threads: 1, ..AnalyzeOptions::default() };
    best_of_three(|| assert_eq!(analyze(snap, &opts).devices.len() as u64, n))
}

#[test]
fn analyze_is_linear_in_devices() {
    let n = 6_000;
    let (small, large) = (devices(n), devices(4 * n));
    assert_linear("devices", n, || (timed(&small, n), timed(&large, 4 * n)));
}
