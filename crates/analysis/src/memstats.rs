//! `torch.cuda.memory_summary()`'s whole table — Cur Usage, Peak Usage, Tot Alloc and Tot
//! Freed — rebuilt from a snapshot with a trace, **over the recorded window** (from the
//! trace's first entry to the snapshot), not over the process's life as PyTorch's own
//! counters are: a snapshot holds no counters, only the ring buffer of events.
//!
//! How: the state at the first entry comes from the backward walk of [`crate::replay::state`]
//! (the same walk `replay --verify` uses), then every entry is applied forwards with the
//! recorded addresses, so each block's size — the rounded or unsplit size PyTorch counts
//! in `allocated_bytes`, which the trace does not state — is known when it is allocated and
//! freed. The counters change as PyTorch's do (spec §8.1): `allocation` /
//! `allocated_bytes` at `alloc` and `free_requested`; `active` / `active_bytes` /
//! `requested_bytes` at `alloc` and `free_completed`; `segment` / `reserved_bytes` at
//! `segment_alloc` / `segment_free` (and `reserved_bytes` at `segment_map` / `segment_unmap`;
//! expandable segments are not counted in `segment`).
//!
//! Principal types: [`MemoryTable`] (one per device) of [`StatRow`]s, each with `all`,
//! `large_pool` and `small_pool` [`Stat`]s.

use fragscope_snapshot::{Action, FxHashMap, Snapshot, TraceEvent};
use serde::Serialize;

use crate::replay::state::{backward_walk, BlockRec, RecordedState};
use crate::replay::{recorded_config, with_rules};

/// One counter over the window: as `memory_stats()` names the metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Stat {
    /// At the first trace entry (reconstructed).
    pub start: u64,
    /// At the snapshot ("Cur Usage").
    pub current: u64,
    /// Highest value in the window ("Peak Usage").
    pub peak: u64,
    /// Sum of increases in the window ("Tot Alloc").
    pub allocated: u64,
    /// Sum of decreases in the window ("Tot Freed").
    pub freed: u64,
}

impl Stat {
    fn new(start: u64) -> Stat {
        Stat { start, current: start, peak: start, allocated: 0, freed: 0 }
    }
    fn add(&mut self, n: u64) {
        self.current += n;
        self.allocated += n;
        self.peak = self.peak.max(self.current);
    }
    fn sub(&mut self, n: u64) {
        self.current = self.current.saturating_sub(n);
        self.freed += n;
    }
}

/// A metric for all pools and per pool (the "from large pool" / "from small pool" rows).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct StatRow {
    pub all: Stat,
    pub large_pool: Stat,
    pub small_pool: Stat,
}

impl StatRow {
    fn new(large: u64, small: u64) -> StatRow {
        StatRow { all: Stat::new(large + small), large_pool: Stat::new(large), small_pool: Stat::new(small) }
    }
    fn add(&mut self, small: bool, n: u64) {
        self.all.add(n);
        if small { &mut self.small_pool } else { &mut self.large_pool }.add(n);
    }
    fn sub(&mut self, small: bool, n: u64) {
        self.all.sub(n);
        if small { &mut self.small_pool } else { &mut self.large_pool }.sub(n);
    }
}

/// The rows of `memory_summary()` fragscope can rebuild from a trace, over the window.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MemoryTable {
    /// Always `"recorded window"`: the figures cover the trace, not the process's life.
    pub window: &'static str,
    /// Trace entries the window spans.
    pub entries: u64,
    /// "Allocated memory" (`allocated_bytes`).
    pub allocated_bytes: StatRow,
    /// "Active memory" (`active_bytes`).
    pub active_bytes: StatRow,
    /// "Requested memory" (`requested_bytes`).
    pub requested_bytes: StatRow,
    /// "GPU reserved memory" (`reserved_bytes`).
    pub reserved_bytes: StatRow,
    /// "Allocations" (`allocation`).
    pub allocations: StatRow,
    /// "Active allocs" (`active`).
    pub active_allocs: StatRow,
    /// "GPU reserved segments" (`segment`, expandable segments excluded).
    pub segments: StatRow,
}

/// Per-pool sums of a state: (large, small) for each of the seven counters.
fn sums(st: &RecordedState) -> [(u64, u64); 7] {
    let mut v = [(0u64, 0u64); 7];
    let mut put = |k: usize, small: bool, n: u64| {
        if small {
            v[k].1 += n
        } else {
            v[k].0 += n
        }
    };
    use crate::replay::state::BState;
    for s in st.segs.values() {
        put(3, s.small, s.size);
        if !s.expandable {
            put(6, s.small, 1);
        }
        for b in &s.blocks {
            match b.state {
                BState::Allocated => {
                    put(0, s.small, b.size);
                    put(4, s.small, 1);
                }
                BState::Pending | BState::Free => {}
            }
            if b.state != BState::Free {
                put(1, s.small, b.size);
                put(2, s.small, b.requested);
                put(5, s.small, 1);
            }
        }
    }
    v
}

/// The table for `device`, or why it cannot be built (no trace; the trace and the final
/// state disagree, as `replay --verify` would report).
pub fn memory_table(snap: &Snapshot, device: i64) -> Result<MemoryTable, String> {
    let trace = snap.trace(device);
    if trace.is_empty() {
        return Err("no trace".into());
    }
    let cfg = recorded_config(snap);
    let pool_of = |e: &TraceEvent| snap.pool_id(e).unwrap_or((0, 0));
    let fin = RecordedState::from_snapshot(snap, device);
    with_rules(&cfg, |rules| {
        let mut st = backward_walk(fin, trace, &pool_of, rules)
            .map_err(|e| format!("the trace and the final state disagree at entry {}: {}", e.index, e.reason))?
            .state;
        let s = sums(&st);
        let row = |k: usize| StatRow::new(s[k].0, s[k].1);
        let mut t = MemoryTable {
            window: "recorded window",
            entries: trace.len() as u64,
            allocated_bytes: row(0),
            active_bytes: row(1),
            requested_bytes: row(2),
            reserved_bytes: row(3),
            allocations: row(4),
            active_allocs: row(5),
            segments: row(6),
        };
        // The block each address holds from its `alloc` to its `free_completed` (its
        // size, request and pool do not change meanwhile): frees read it here rather
        // than search the segments again. Blocks from before the trace are searched for.
        let mut held: FxHashMap<u64, (BlockRec, bool)> = FxHashMap::default();
        for (i, ev) in trace.iter().enumerate() {
            // The block before the entry changes it (frees), and the pool of a segment
            // before it goes: looked up for those entries only (each lookup is a search
            // of the segments, and this loop runs once per entry of the trace).
            let before = match ev.action {
                Action::FreeRequested => {
                    held.get(&ev.addr).copied().or_else(|| st.block_starting(ev.addr).map(|(b, small, _)| (b, small)))
                }
                Action::FreeCompleted => {
                    held.remove(&ev.addr).or_else(|| st.block_starting(ev.addr).map(|(b, small, _)| (b, small)))
                }
                _ => None,
            };
            let seg_small_before = match ev.action {
                Action::SegmentFree | Action::SegmentUnmap => {
                    st.seg_key(ev.addr).and_then(|k| st.segs.get(&k)).map(|s| s.small)
                }
                _ => None,
            };
            st.apply(i, ev, pool_of(ev), rules)
                .map_err(|e| format!("the trace cannot be replayed at entry {}: {}", e.index, e.reason))?;
            match ev.action {
                Action::Alloc => {
                    // ... and after it (the block an alloc made or took).
                    let Some((b, small, _)) = st.block_starting(ev.addr) else { continue };
                    held.insert(ev.addr, (b, small));
                    t.allocated_bytes.add(small, b.size);
                    t.active_bytes.add(small, b.size);
                    t.requested_bytes.add(small, ev.size);
                    t.allocations.add(small, 1);
                    t.active_allocs.add(small, 1);
                }
                Action::FreeRequested => {
                    if let Some((b, small)) = before {
                        t.allocated_bytes.sub(small, b.size);
                        t.allocations.sub(small, 1);
                    }
                }
                Action::FreeCompleted => {
                    if let Some((b, small)) = before {
                        t.active_bytes.sub(small, b.size);
                        t.requested_bytes.sub(small, b.requested);
                        t.active_allocs.sub(small, 1);
                    }
                }
                Action::SegmentAlloc | Action::SegmentMap => {
                    let small = st.seg_key(ev.addr).and_then(|k| st.segs.get(&k)).is_some_and(|s| s.small);
                    t.reserved_bytes.add(small, ev.size);
                    if ev.action == Action::SegmentAlloc {
                        t.segments.add(small, 1);
                    }
                }
                Action::SegmentFree | Action::SegmentUnmap => {
                    // The segment (or range) is gone after the entry: its pool from before.
                    let small = seg_small_before.unwrap_or(false);
                    t.reserved_bytes.sub(small, ev.size);
                    if ev.action == Action::SegmentFree {
                        t.segments.sub(small, 1);
                    }
                }
                _ => {}
            }
        }
        Ok(t)
    })
}
