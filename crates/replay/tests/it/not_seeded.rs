//! A simulation whose recorded start the allocator refuses (here: two final segments that
//! overlap, which no real allocator leaves) starts empty and says so — and still counts the
//! driver work of the run, as every other simulation does.

use fragscope_alloc::AllocatorConfig;
use fragscope_replay::{simulate, StartState};
use fragscope_snapshot::{Action, Block, BlockState, Segment, SegmentType, Snapshot, TraceEvent};

const MIB: u64 = 1 << 20;

fn seg(address: u64, total: u64, blocks: Vec<Block>) -> Segment {
    Segment {
        device: 0,
        address,
        total_size: total,
        allocated_size: 0,
        active_size: 0,
        requested_size: None,
        stream: 0,
        segment_type: SegmentType::Large,
        segment_pool_id: Some((0, 0)),
        is_expandable: Some(false),
        stack: None,
        blocks,
    }
}

fn blk(address: u64, size: u64, state: BlockState) -> Block {
    Block { address, size, requested_size: Some(size), state, stack: None, history: None }
}

#[test]
fn a_start_that_cannot_be_seeded_still_counts_the_driver_work() {
    let mut snap = Snapshot::default();
    // A 20 MiB segment holding a tensor from before the trace, and a second one inside it.
    snap.segments.push(seg(0, 20 * MIB, vec![blk(0, 20 * MIB, BlockState::ActiveAllocated)]));
    snap.segments.push(seg(4 * MIB, 20 * MIB, vec![blk(4 * MIB, 20 * MIB, BlockState::Inactive)]));
    // The trace uses the second segment: a 12 MiB tensor made and freed.
    snap.device_traces.push(vec![
        TraceEvent::new(Action::Alloc, 4 * MIB, 12 * MIB),
        TraceEvent::new(Action::FreeRequested, 4 * MIB, 12 * MIB),
        TraceEvent::new(Action::FreeCompleted, 4 * MIB, 12 * MIB),
    ]);
    let w = simulate(&snap, 0, AllocatorConfig::default(), None);
    assert_eq!(w.start_state, StartState::NotSeeded, "{:?}", w.notes);
    // Started empty, the 12 MiB request needs a segment of its own: one cudaMalloc.
    assert_eq!(w.cuda_mallocs, 1);
    let counted: u64 = w.driver.cuda_malloc_by_size.iter().map(|c| c.calls).sum();
    assert_eq!(counted, w.cuda_mallocs, "driver work of a run that started empty: {:?}", w.driver);
}
