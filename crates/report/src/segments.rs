//! The segment timeline (memory_viz's "Active Cached Segment Timeline"): the memory the
//! caching allocator reserved from CUDA, one polygon per segment over its life, stacked as
//! the timeline stacks allocations.
//!
//! A segment lives from its `segment_alloc` to its `segment_free`. An expandable segment
//! grows and shrinks by `segment_map` / `segment_unmap` of address ranges: each mapped
//! range is a piece with a life of its own, and an unmap ends the parts of the pieces it
//! covers (the rest of a piece stays mapped). Memory freed or unmapped in the trace that
//! the trace never saw reserved, and the final state's segments the trace did not make,
//! were reserved before the trace: they start at state 0.
//!
//! Principal type: [`SegmentLife`]; [`segment_lives`] makes them, [`encode`](fn@encode) gives the
//! page the largest.

use std::collections::BTreeMap;

use fragscope_snapshot::{Action, Snapshot, StackId, TraceEvent, NO_TIME};

use crate::layout::Life;
use crate::{encode, StackTable};

/// One segment, or one mapped range of an expandable segment, over its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentLife {
    pub address: u64,
    pub size: u64,
    /// First state it is reserved in (0: before the trace).
    pub start: usize,
    /// First state it is no longer reserved in (`usize::MAX`: reserved at the end).
    pub end: usize,
    /// The stack of its `segment_alloc` / `segment_map` (or of the final state's segment).
    pub stack: Option<StackId>,
}

/// Every segment life of a device's trace, in no particular order.
pub fn segment_lives(snap: &Snapshot, device: i64) -> Vec<SegmentLife> {
    let mut scan = SegmentScan::default();
    for (i, e) in snap.trace(device).iter().enumerate() {
        scan.entry(i, e);
    }
    scan.finish(snap, device)
}

/// [`segment_lives`] read entry by entry, so that the report's one pass over a trace
/// (`TraceScan`) makes them too: a long trace is hundreds of MB, read once rather than
/// twice.
#[derive(Default)]
pub struct SegmentScan {
    out: Vec<SegmentLife>,
    /// Reserved ranges open now: start address → (size, start state, stack).
    open: BTreeMap<u64, (u64, usize, Option<StackId>)>,
}

impl SegmentScan {
    /// Entry `i` of the trace, in order from 0.
    #[inline]
    pub fn entry(&mut self, i: usize, e: &TraceEvent) {
        match e.action {
            Action::SegmentAlloc | Action::SegmentMap => {
                self.open.insert(e.addr, (e.size, i + 1, e.stack));
            }
            Action::SegmentFree | Action::SegmentUnmap => {
                let (a, z) = (e.addr, e.addr.saturating_add(e.size));
                // Open ranges that overlap [a, z): the one starting before a, and those in it.
                let mut hit: Vec<u64> = self.open.range(a..z).map(|(&k, _)| k).collect();
                if let Some((&k, &(s, _, _))) = self.open.range(..a).next_back() {
                    if k.saturating_add(s) > a {
                        hit.insert(0, k);
                    }
                }
                let mut covered = 0u64;
                for k in hit {
                    let (s, start, stack) = self.open.remove(&k).expect("an open range");
                    let (lo, hi) = (k.max(a), k.saturating_add(s).min(z));
                    covered += hi - lo;
                    self.out.push(SegmentLife { address: lo, size: hi - lo, start, end: i + 1, stack });
                    // What the free leaves of the range stays reserved.
                    if k < lo {
                        self.open.insert(k, (lo - k, start, stack));
                    }
                    if k.saturating_add(s) > hi {
                        self.open.insert(hi, (k + s - hi, start, stack));
                    }
                }
                // Freed but never seen reserved: reserved before the trace.
                if covered < e.size {
                    self.out.push(SegmentLife {
                        address: a,
                        size: e.size - covered,
                        start: 0,
                        end: i + 1,
                        stack: e.stack,
                    });
                }
            }
            _ => {}
        }
    }

    /// The lives, once every entry of `device`'s trace has been read.
    pub fn finish(self, snap: &Snapshot, device: i64) -> Vec<SegmentLife> {
        let SegmentScan { mut out, open } = self;
        // The final state's segments: the parts the trace did not reserve were reserved
        // before it. Only the open ranges that start less than the largest open size
        // before a segment can reach into it: the rest are not visited (all of them per
        // segment was 2 % of the report's CPU on the allocator-consistent benchmark file).
        let reach = open.values().map(|&(s, _, _)| s).max().unwrap_or(0);
        for seg in snap.device_segments(device) {
            let (a, z) = (seg.address, seg.address.saturating_add(seg.total_size));
            let mut covered = 0u64;
            for (&k, &(s, _, _)) in open.range(a.saturating_sub(reach)..z) {
                let (lo, hi) = (k.max(a), k.saturating_add(s).min(z));
                if hi > lo {
                    covered += hi - lo;
                }
            }
            if covered < seg.total_size {
                out.push(SegmentLife {
                    address: a,
                    size: seg.total_size - covered,
                    start: 0,
                    end: usize::MAX,
                    stack: seg.stack,
                });
            }
        }
        out.extend(open.into_iter().map(|(address, (size, start, stack))| SegmentLife {
            address,
            size,
            start,
            end: usize::MAX,
            stack,
        }));
        out
    }
}

/// The `top` largest lives (by size; the earlier first among equals) as the page's
/// allocations are encoded ([`crate::DeviceData::allocations`]: [`Life`] records whose
/// request is the segment's size), and how many there were.
pub fn encode(
    snap: &Snapshot,
    device: i64,
    mut lives: Vec<SegmentLife>,
    top: usize,
    table: &mut StackTable,
) -> (String, usize) {
    let n = lives.len();
    lives.sort_unstable_by_key(|l| (std::cmp::Reverse(l.size), l.start, l.address));
    lives.truncate(top);
    lives.sort_unstable_by_key(|l| (l.start, l.address));
    let trace = snap.trace(device);
    let time = |state: usize| match state.checked_sub(1).and_then(|i| trace.get(i)).map(|e| e.time_us) {
        Some(t) if t != NO_TIME => t as f64,
        _ => f64::NAN,
    };
    let mut v = Vec::with_capacity(lives.len() * Life::LEN);
    for l in &lives {
        let live = l.end == usize::MAX;
        Life {
            address: l.address as f64,
            size: l.size as f64,
            requested: l.size as f64,
            start: l.start as f64,
            end: if live { -1.0 } else { l.end as f64 },
            stack: table.index(snap, l.stack) as f64,
            start_time_us: time(l.start),
            end_time_us: if live { f64::NAN } else { time(l.end) },
        }
        .push_to(&mut v);
    }
    (encode::f64s(&v), n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use fragscope_snapshot::TraceEvent;

    fn reserved_at(lives: &[SegmentLife], s: usize) -> u64 {
        lives.iter().filter(|l| l.start <= s && s < l.end).map(|l| l.size).sum()
    }

    /// Segments made and freed in the trace, one freed that was made before it, and an
    /// expandable segment mapped in three ranges and unmapped across two of them.
    #[test]
    fn lives_follow_the_segment_events() {
        let mb = 1u64 << 20;
        let t = vec![
            TraceEvent::new(Action::SegmentAlloc, 10 * mb, 2 * mb),
            TraceEvent::new(Action::SegmentFree, 50 * mb, 4 * mb),
            TraceEvent::new(Action::SegmentMap, 100 * mb, 2 * mb),
            TraceEvent::new(Action::SegmentMap, 102 * mb, 2 * mb),
            TraceEvent::new(Action::SegmentMap, 104 * mb, 2 * mb),
            TraceEvent::new(Action::SegmentUnmap, 103 * mb, 2 * mb),
            TraceEvent::new(Action::SegmentFree, 10 * mb, 2 * mb),
        ];
        let mut snap = Snapshot::default();
        snap.device_traces.push(t);
        let lives = segment_lives(&snap, 0);
        let want = [4, 6, 2, 4, 6, 8, 6, 4];
        for (s, &w) in want.iter().enumerate() {
            assert_eq!(reserved_at(&lives, s), w * mb, "state {s}: {lives:?}");
        }
        // The unmap split the second and third ranges: 100..103 and 105..106 stay.
        let mut live: Vec<(u64, u64)> =
            lives.iter().filter(|l| l.end == usize::MAX).map(|l| (l.address / mb, l.size / mb)).collect();
        live.sort();
        assert_eq!(live, [(100, 2), (102, 1), (105, 1)]);
    }

    /// The final state's segments: what no range the trace left open covers was reserved
    /// before the trace, found also where the covering range starts far before the
    /// segment (a large range, with smaller ones between it and the segment).
    #[test]
    fn final_segments_count_what_the_trace_left_open() {
        use fragscope_snapshot::Segment;
        let mb = 1u64 << 20;
        let t = vec![
            TraceEvent::new(Action::SegmentMap, 0, 64 * mb),
            TraceEvent::new(Action::SegmentAlloc, 70 * mb, 2 * mb),
            TraceEvent::new(Action::SegmentAlloc, 100 * mb, 2 * mb),
        ];
        let mut snap = Snapshot::default();
        snap.device_traces.push(t);
        for (address, total_size) in [(32 * mb, 48 * mb), (101 * mb, 4 * mb), (200 * mb, 2 * mb)] {
            snap.segments.push(Segment::new(0, address, total_size));
        }
        let lives = segment_lives(&snap, 0);
        let mut before: Vec<(u64, u64)> =
            lives.iter().filter(|l| l.start == 0).map(|l| (l.address / mb, l.size / mb)).collect();
        before.sort();
        // 32..80 MB: 32..64 and 70..72 open, 14 MB not; 101..105: 101..102 open, 3 not.
        assert_eq!(before, [(32, 14), (101, 3), (200, 2)]);
        assert!(lives.iter().all(|l| l.end == usize::MAX), "{lives:?}");
    }
}
