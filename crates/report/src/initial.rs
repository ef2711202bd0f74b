//! Allocations live before the trace begins, for the timeline stacked by allocation.
//!
//! A trace starts when recording started or when its ring buffer last wrapped, so blocks
//! may already be allocated at its first entry (often most of the memory: the weights).
//! PyTorch's memory_viz draws them at the bottom of the stack from the first moment; so
//! does the page. They are, as [`fragscope_trace::timeline`] seeds them:
//! * blocks allocated in the final snapshot whose address no trace entry allocates or
//!   frees (live the whole trace; their real size, request and stack from the snapshot);
//! * frees of addresses the trace never allocated before (live until that free; the
//!   request of the free entry, rounded; no stack, as a free entry's frames are the free
//!   stack when recorded with `context="all"`).
//!
//! Records as [`crate::DeviceData::allocations`], with alloc state 0 and no alloc time.

use fragscope_alloc::rounding::round_size;
use fragscope_snapshot::{Action, BlockState, FxHashMap, Snapshot, StackId, TraceEvent, NO_TIME};

use crate::layout::Life;
use crate::{encode, StackTable};

/// The `top` largest allocations live at state 0 of a device, found from its trace and
/// final state alone ([`InitialScan`]: no walk of the blocks' lives), so that the report
/// can look for them beside the analysis' walk; [`Initial::encode`] gives them their
/// page stack indices afterwards, in the page's fixed order.
pub struct Initial {
    /// Records as [`crate::DeviceData::allocations`], in address order, with the stack
    /// field left at −1.
    lives: Vec<Life>,
    /// The stack of each record (`None` for a free of an unknown address).
    stacks: Vec<Option<StackId>>,
}

/// [`Initial`] being read, entry by entry, in the same pass over the trace as the
/// report's other figures: addresses the trace allocates, and frees of addresses not
/// allocated yet.
pub struct InitialScan {
    cfg: fragscope_alloc::AllocatorConfig,
    open: FxHashMap<u64, bool>,
    lives: Vec<(Life, Option<StackId>)>,
}

impl InitialScan {
    pub fn new(snap: &Snapshot) -> Self {
        InitialScan { cfg: fragscope_replay::recorded_config(snap), open: FxHashMap::default(), lives: Vec::new() }
    }

    /// Entry `i` of the device's trace, in order from 0.
    #[inline]
    pub fn entry(&mut self, i: usize, e: &TraceEvent) {
        match e.action {
            Action::Alloc => {
                self.open.insert(e.addr, true);
            }
            // A free of an address the trace never allocated: live from the start.
            Action::FreeRequested if self.open.insert(e.addr, false).is_none() => {
                let t = if e.time_us == NO_TIME { f64::NAN } else { e.time_us as f64 };
                let size = round_size(e.size, &self.cfg) as f64;
                self.lives.push((
                    Life {
                        address: e.addr as f64,
                        size,
                        requested: e.size as f64,
                        start: 0.0,
                        end: (i + 1) as f64,
                        stack: -1.0,
                        start_time_us: f64::NAN,
                        end_time_us: t,
                    },
                    None,
                ));
            }
            _ => {}
        }
    }

    /// The `top` largest, once every entry of `device`'s trace has been read.
    pub fn finish(self, snap: &Snapshot, device: i64, top: usize) -> Initial {
        let (open, mut lives) = (self.open, self.lives);
        for s in snap.device_segments(device) {
            for b in s.blocks.iter().filter(|b| b.state == BlockState::ActiveAllocated) {
                if !open.contains_key(&b.address) {
                    let req = b.requested_size.unwrap_or(b.size) as f64;
                    let life = Life {
                        address: b.address as f64,
                        size: b.size as f64,
                        requested: req,
                        start: 0.0,
                        end: -1.0,
                        stack: -1.0,
                        start_time_us: f64::NAN,
                        end_time_us: f64::NAN,
                    };
                    lives.push((life, b.stack));
                }
            }
        }
        // The largest, then back in address order for a stable page.
        lives.sort_unstable_by(|(a, _), (b, _)| b.size.total_cmp(&a.size).then(a.address.total_cmp(&b.address)));
        lives.truncate(top);
        lives.sort_unstable_by(|(a, _), (b, _)| a.address.total_cmp(&b.address));
        let (lives, stacks) = lives.into_iter().unzip();
        Initial { lives, stacks }
    }
}

impl Initial {
    /// The records for the page, their stacks entered in `table` in address order.
    pub fn encode(mut self, snap: &Snapshot, table: &mut StackTable) -> String {
        let mut v = Vec::with_capacity(self.lives.len() * Life::LEN);
        for (l, s) in self.lives.iter_mut().zip(&self.stacks) {
            l.stack = table.index(snap, *s) as f64;
            l.push_to(&mut v);
        }
        encode::f64s(&v)
    }
}
