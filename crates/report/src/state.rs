//! The allocator state at chosen moments: segments as rows of blocks.
//!
//! The snapshot's `segments` are the state at the end of the trace. Earlier states are
//! rebuilt by undoing trace events from there (the backward walk of
//! [`fragscope_analysis::replay::state`], spec §10.12), and captured at the OOM, the
//! reserved and allocated peaks, evenly spaced moments, and the end. A file whose trace
//! and final state disagree gets the moments after the disagreement only (said in
//! [`crate::DeviceData::moments_note`]).
//!
//! Allocated and pending-free blocks carry the stack of the `alloc` that made them (a
//! forward pass over the trace; blocks allocated before recording began keep the stack
//! the final state records for them, when they are still there).

use fragscope_alloc::rounding::round_size;
use fragscope_analysis::analyze::Analysis;
use fragscope_analysis::replay::recorded_config;
use fragscope_analysis::replay::state::{BState, RecordedState, SegRec, SplitRules};
use fragscope_snapshot::{Action, FxHashMap, Snapshot, StackId};
use serde::Serialize;

use crate::{encode, ReportOptions, StackTable};

/// `pool_id` of the default pools.
const DEFAULT_POOL: (u64, u64) = (0, 0);

/// One captured state.
#[derive(Serialize)]
pub struct Moment {
    /// Trace state (0 = before the first event, `events` = the end).
    pub state: usize,
    /// Why it was chosen: `"oom"`, `"reserved_peak"`, `"allocated_peak"`, `"end"`, `"step"`.
    pub kinds: Vec<&'static str>,
    /// Per segment `[address, size, stream, flags]` (flags: 1 small pool, 2 expandable,
    /// 4 private pool), base64 `Float64Array`.
    pub segments: String,
    /// Per block `[segment index, address, size, requested, state, stack]` (state 0 free,
    /// 1 allocated, 2 pending free; stack −1 when unknown), base64 `Float64Array`.
    pub blocks: String,
}

/// The moments of one device (module doc) and a note when some could not be rebuilt.
pub fn moments(
    snap: &Snapshot,
    device: i64,
    ana: &Analysis,
    opts: &ReportOptions,
    table: &mut StackTable,
) -> (Vec<Moment>, Option<String>) {
    let trace = snap.trace(device);
    let n = trace.len();
    let final_state = RecordedState::from_snapshot(snap, device);
    if final_state.segs.is_empty() {
        return (Vec::new(), Some("the file records no segments for this device".into()));
    }
    // Which states to capture.
    let mut wanted: Vec<(usize, &'static str)> = vec![(n, "end")];
    if let Some(d) = ana.devices.iter().find(|d| d.device == device) {
        if let Some(o) = &d.oom {
            wanted.push((o.event_index.min(n), "oom"));
        }
        let t = &d.fragmentation.timeline;
        wanted.push((t.peak_reserved.event_index.map_or(0, |i| i + 1), "reserved_peak"));
        wanted.push((t.peak_allocated.event_index.map_or(0, |i| i + 1), "allocated_peak"));
    }
    let end_blocks: usize = final_state.segs.values().map(|s| s.blocks.len()).sum::<usize>().max(1);
    if n > 0 {
        let steps = (opts.block_budget / end_blocks).clamp(1, opts.moments.max(1));
        for k in 0..steps {
            wanted.push((k * n / steps, "step"));
        }
    }
    wanted.sort_unstable_by_key(|w| std::cmp::Reverse(w.0));

    // Backward walk, capturing on the way.
    let cfg = recorded_config(snap);
    let round = |x: u64| round_size(x, &cfg);
    let rules = SplitRules {
        round: &round,
        max_split_size: cfg.max_split_size,
        max_non_split_rounding: cfg.max_non_split_rounding,
    };
    let mut st = final_state;
    let mut captured: Vec<(usize, Vec<&'static str>, Vec<SegRec>)> = Vec::new();
    let mut note = None;
    let mut want = wanted.iter().peekable();
    let mut scratch = Vec::new();
    let mut take =
        |state: usize, st: &RecordedState, want: &mut std::iter::Peekable<std::slice::Iter<(usize, &'static str)>>| {
            let mut kinds = Vec::new();
            while let Some(&&(s, k)) = want.peek() {
                if s != state {
                    break;
                }
                if !kinds.contains(&k) {
                    kinds.push(k);
                }
                want.next();
            }
            if !kinds.is_empty() {
                captured.push((state, kinds, st.segs.values().cloned().collect()));
            }
        };
    take(n, &st, &mut want);
    for i in (0..n).rev() {
        if want.peek().is_none() {
            break;
        }
        let ev = &trace[i];
        if let Err(inc) = st.undo(i, ev, snap.pool_id(ev).unwrap_or(DEFAULT_POOL), &rules, &mut scratch) {
            note = Some(format!(
                "the state before trace event {} could not be rebuilt ({}); earlier moments are not shown",
                inc.index, inc.reason
            ));
            break;
        }
        take(i, &st, &mut want);
    }
    captured.reverse();

    // Stacks of the blocks: the latest alloc at each address before the moment.
    let mut stack_at: FxHashMap<u64, Option<StackId>> = FxHashMap::default();
    let traced: FxHashMap<u64, ()> = trace.iter().filter(|e| e.action == Action::Alloc).map(|e| (e.addr, ())).collect();
    for s in snap.device_segments(device) {
        for b in s.blocks.iter().filter(|b| b.state.is_active() && !traced.contains_key(&b.address)) {
            stack_at.insert(b.address, b.stack);
        }
    }
    let mut pos = 0usize;
    let mut out = Vec::with_capacity(captured.len());
    for (state, kinds, segs) in captured {
        while pos < state {
            let e = &trace[pos];
            if e.action == Action::Alloc {
                stack_at.insert(e.addr, e.stack);
            }
            pos += 1;
        }
        let mut sv = Vec::with_capacity(segs.len() * 4);
        let mut bv = Vec::new();
        for (si, s) in segs.iter().enumerate() {
            let flags = s.small as u8 | (s.expandable as u8) << 1 | ((s.pool != DEFAULT_POOL) as u8) << 2;
            sv.extend([s.addr as f64, s.size as f64, s.stream as f64, flags as f64]);
            for b in &s.blocks {
                let (code, stack) = match b.state {
                    BState::Free => (0.0, -1),
                    BState::Allocated => (1.0, stack_at.get(&b.addr).map_or(-1, |&s| table.index(snap, s))),
                    BState::Pending => (2.0, stack_at.get(&b.addr).map_or(-1, |&s| table.index(snap, s))),
                };
                bv.extend([si as f64, b.addr as f64, b.size as f64, b.requested as f64, code, stack as f64]);
            }
        }
        out.push(Moment { state, kinds, segments: encode::f64s(&sv), blocks: encode::f64s(&bv) });
    }
    (out, note)
}
