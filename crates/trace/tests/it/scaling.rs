//! `summary` stays linear in devices and in segments (issue 43: every device's steps
//! filtered all segments, so 100 k devices took 200 s). The same snapshot shape at n and
//! 4n: a linear summary takes about 4× as long, a quadratic one 16×; see
//! [`fragscope_testdata::scaling`].

use fragscope_snapshot::{Block, BlockState, Segment, SegmentType, Snapshot};
use fragscope_testdata::scaling::{assert_linear, best_of_three};
use fragscope_trace::summarize;
use std::time::Duration;

const MIB: u64 = 1 << 20;

/// `n` segments of 2 MiB, each with a 512-byte tensor live at its start, on device
/// `device(k)` for the k-th; no trace.
fn segments(n: u64, device: impl Fn(u64) -> i64) -> Snapshot {
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
            device: device(k),
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

fn timed(snap: &Snapshot, devices: usize, reserved: u64) -> Duration {
    best_of_three(|| {
        let s = summarize(snap);
        assert_eq!(s.devices.len(), devices);
        assert_eq!(s.devices.iter().map(|d| d.all.reserved_bytes).sum::<u64>(), reserved);
    })
}

/// `shape(n)` and `shape(4n)` (a snapshot and its device count) summarised, timed.
fn both(n: u64, shape: impl Fn(u64) -> (Snapshot, usize)) -> (Duration, Duration) {
    let ((small, d1), (large, d4)) = (shape(n), shape(4 * n));
    (timed(&small, d1, n * 2 * MIB), timed(&large, d4, 4 * n * 2 * MIB))
}

#[test]
fn summary_is_linear_in_devices() {
    let n = 6_000;
    assert_linear("devices", n, || both(n, |n| (segments(n, |k| k as i64), n as usize)));
}

#[test]
fn summary_is_linear_in_segments() {
    let n = 5_000;
    assert_linear("segments", n, || both(n, |n| (segments(n, |_| 0), 1)));
}
