//! Allocations live before the trace begins, for the timeline stacked by allocation.
//!
//! A trace starts when recording started or when its ring buffer last wrapped, so blocks
//! may already be allocated at its first entry (often most of the memory: the weights).
//! PyTorch's memory_viz draws them at the bottom of the stack from the first moment; so
//! does the page. They are the blocks the trace walk seeds as allocated at state 0
//! ([`BlockLives::seeded`], by the one rule of [`fragscope_trace::timeline`]: blocks of
//! the final snapshot the trace never allocated, and frees of addresses the trace never
//! allocated), each live until the entry that ended its `allocated` life in that walk. So
//! the allocations drawn from the first state add up to the timeline's allocated bytes at
//! state 0 by construction.
//!
//! Records as [`crate::DeviceData::allocations`] ([`Life`]), with start state 0 and no
//! start time.

use fragscope_snapshot::{Snapshot, NO_TIME};
use fragscope_trace::{BlockLives, SeededLife, LIVE_AT_END};

use crate::layout::Life;
use crate::{encode, StackTable};

/// The `top` largest of `lives`' seeded blocks (by size, the lower address first among
/// equals), in address order, as the page gets them, their stacks entered in `table` in
/// that order.
pub fn encode(snap: &Snapshot, device: i64, lives: &BlockLives, top: usize, table: &mut StackTable) -> String {
    let trace = snap.trace(device);
    let mut chosen: Vec<&SeededLife> = lives.seeded.iter().collect();
    chosen.sort_unstable_by(|a, b| b.size.cmp(&a.size).then(a.address.cmp(&b.address)));
    chosen.truncate(top);
    chosen.sort_unstable_by_key(|l| l.address);
    let mut v = Vec::with_capacity(chosen.len() * Life::LEN);
    for l in chosen {
        let ended = (l.end != LIVE_AT_END).then_some(l.end);
        let time = ended.and_then(|e| trace.get(e)).map(|e| e.time_us).filter(|&t| t != NO_TIME);
        Life {
            address: l.address as f64,
            size: l.size as f64,
            requested: l.request as f64,
            start: 0.0,
            end: ended.map_or(-1.0, |e| (e + 1) as f64),
            stack: table.index(snap, l.stack) as f64,
            start_time_us: f64::NAN,
            end_time_us: time.map_or(f64::NAN, |t| t as f64),
        }
        .push_to(&mut v);
    }
    encode::f64s(&v)
}
