//! `summary` stays linear in devices and in segments (issue 43: every device's steps
//! filtered all segments, so 100 k devices took 200 s). The same snapshot shape at n and
//! 4n: a linear summary takes about 4× as long, a quadratic one 16×; the test fails
//! past 6×. Best of three runs each, so that a busy machine's pauses do not count.

use fragscope_snapshot::{Block, BlockState, Segment, SegmentType, Snapshot};
use fragscope_trace::summarize;
use std::time::{Duration, Instant};

/// 4× the input must cost less than this many times the time: linear work is ×4 (×4.6 with
/// a log factor), quadratic ×16; 8 leaves room for a loaded CI machine (the old code
/// measured ×11–20 here).
const MAX_RATIO: f64 = 8.0;

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

fn best_of_three(snap: &Snapshot, devices: usize, reserved: u64) -> Duration {
    (0..3)
        .map(|_| {
            let t = Instant::now();
            let s = summarize(snap);
            let took = t.elapsed();
            assert_eq!(s.devices.len(), devices);
            assert_eq!(s.devices.iter().map(|d| d.all.reserved_bytes).sum::<u64>(), reserved);
            took
        })
        .min()
        .unwrap()
}

fn ratio(n: u64, shape: impl Fn(u64) -> (Snapshot, usize)) -> (Duration, Duration, f64) {
    let ((small, d1), (large, d4)) = (shape(n), shape(4 * n));
    let t1 = best_of_three(&small, d1, n * 2 * MIB);
    let t4 = best_of_three(&large, d4, 4 * n * 2 * MIB);
    (t1, t4, t4.as_secs_f64() / t1.as_secs_f64().max(1e-4))
}

#[test]
fn summary_is_linear_in_devices() {
    let n = 6_000;
    let (t1, t4, r) = ratio(n, |n| (segments(n, |k| k as i64), n as usize));
    assert!(r < MAX_RATIO, "{n} devices {t1:?}, {} devices {t4:?}: ×{r:.1}, not linear", 4 * n);
}

#[test]
fn summary_is_linear_in_segments() {
    let n = 5_000;
    let (t1, t4, r) = ratio(n, |n| (segments(n, |_| 0), 1));
    assert!(r < MAX_RATIO, "{n} segments {t1:?}, {} segments {t4:?}: ×{r:.1}, not linear", 4 * n);
}
