//! Replay stays linear in the number of distinct streams (issue 43: a pool's per-stream
//! free sets were a vector scanned per lookup, so 50 k allocations on distinct streams
//! took 30–40 s). The same recording shape at n and 4n streams: a linear replay takes
//! about 4× as long, a quadratic one 16×; see
//! [`fragscope_testdata::scaling`].

use fragscope_replay::{verify, ReplayOptions};
use fragscope_snapshot::{Action, Block, BlockState, Segment, SegmentType, Snapshot, TraceEvent};
use fragscope_testdata::scaling::{assert_linear, best_of_three};
use std::time::Duration;

const MIB: u64 = 1 << 20;

/// One device; on each of `n` streams a 2 MiB segment is created, a 512-byte tensor
/// made in it and freed, so the pool ends with one free block per stream. The final
/// segments are the trace's end state.
fn distinct_streams(n: u64) -> Snapshot {
    let mut snap = Snapshot::default();
    let mut trace = Vec::with_capacity(4 * n as usize);
    for k in 0..n {
        let (addr, stream) = ((k + 1) * 2 * MIB, k + 1);
        for (action, size) in [
            (Action::SegmentAlloc, 2 * MIB),
            (Action::Alloc, 512),
            (Action::FreeRequested, 512),
            (Action::FreeCompleted, 512),
        ] {
            let mut ev = TraceEvent::new(action, addr, size);
            assert!(snap.set_stream(&mut ev, stream));
            trace.push(ev);
        }
        snap.segments.push(Segment {
            device: 0,
            address: addr,
            total_size: 2 * MIB,
            allocated_size: 0,
            active_size: 0,
            requested_size: Some(0),
            stream,
            segment_type: SegmentType::Large,
            segment_pool_id: Some((0, 0)),
            is_expandable: Some(false),
            stack: None,
            blocks: vec![Block {
                address: addr,
                size: 2 * MIB,
                requested_size: Some(0),
                state: BlockState::Inactive,
                stack: None,
                history: None,
            }],
        });
    }
    snap.device_traces.push(trace);
    snap
}

fn timed(snap: &Snapshot, n: u64) -> Duration {
    best_of_three(|| {
        let r = verify(snap, 0, &ReplayOptions::default());
        assert_eq!((r.allocs, r.allocs_matched), (n, n), "every allocation replayed exactly");
        assert_eq!(r.segment_events_matched, n);
    })
}

#[test]
fn replay_is_linear_in_distinct_streams() {
    let n = 5_000;
    let (small, large) = (distinct_streams(n), distinct_streams(4 * n));
    assert_linear("streams", n, || (timed(&small, n), timed(&large, 4 * n)));
}
