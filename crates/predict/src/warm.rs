//! What a template that started warm carries from one step to the next: the blocks live
//! before its trace that the trace frees (the previous step's leftovers: gradients, the
//! loss, ...) matched with the blocks the trace allocates and leaves live at its end (this
//! step's leftovers, which the next step frees). With the match a predicted step can be
//! replayed again from its own end ([`Carry`]), which is how a prediction rebuilds the
//! cache the target size would build instead of keeping the template's.

use std::collections::HashMap;

use fragscope_replay::Seeded;
use fragscope_snapshot::{Action, TraceEvent};

/// The step-to-step carry of a template's trace (module doc).
#[derive(Clone, Debug, Default)]
pub(crate) struct Carry {
    /// `(address before the trace, request)`: the block live before the trace at that
    /// address is freed by the trace and stands for what request `q` (an index into the
    /// template's requests) leaves live at the trace's end.
    pub(crate) pairs: Vec<(u64, usize)>,
}

/// The carry of `trace`, whose requests are `req_index` and whose state before it is
/// `seeded`: each block live before the trace and freed in it, in the order of the frees,
/// paired with the first unpaired request live at the end whose requested bytes are the
/// block's (the same tensor one step later).
pub(crate) fn carry(trace: &[TraceEvent], req_index: &[usize], seeded: &Seeded) -> Carry {
    let mut before: HashMap<u64, u64> = seeded.live_blocks().map(|b| (b.addr, b.requested)).collect();
    let mut q_of: HashMap<usize, usize> = HashMap::new();
    for (q, &i) in req_index.iter().enumerate() {
        q_of.insert(i, q);
    }
    let mut live: HashMap<u64, usize> = HashMap::new();
    let mut freed_before: Vec<(u64, u64)> = Vec::new();
    for (i, ev) in trace.iter().enumerate() {
        match ev.action {
            Action::Alloc => {
                if let Some(&q) = q_of.get(&i) {
                    live.insert(ev.addr, q);
                }
            }
            Action::FreeRequested | Action::FreeCompleted if live.remove(&ev.addr).is_none() => {
                if let Some(req) = before.remove(&ev.addr) {
                    freed_before.push((ev.addr, req));
                }
            }
            _ => {}
        }
    }
    let mut live_at_end: Vec<usize> = live.into_values().collect();
    live_at_end.sort_unstable();
    let mut taken = vec![false; live_at_end.len()];
    let mut pairs = Vec::new();
    for (addr, req) in freed_before {
        let hit = live_at_end.iter().enumerate().find(|&(k, &q)| !taken[k] && trace[req_index[q]].size == req);
        if let Some((k, &q)) = hit {
            taken[k] = true;
            pairs.push((addr, q));
        }
    }
    Carry { pairs }
}
