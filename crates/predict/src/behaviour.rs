//! What a recording's program does, beyond where it allocates: the same-program check
//! that [`crate::Program::fit`] makes before it aligns recordings call site by call site.
//!
//! Two recordings can make their requests from the same call sites in the same order and
//! still be different programs; and when they do not align, the user needs to know why.
//! From each recording ([`Behaviour::of`]):
//!
//! * **training or inference**: a backward pass and an optimizer step, from the trace's
//!   phases ([`fragscope_trace::steps`]);
//! * **grad mode**: under `torch.no_grad()` / `inference_mode()` a forward frees each
//!   activation once the next layer has used it, while a grad-enabled forward keeps what
//!   autograd saved for the backward pass: the share of the bytes a forward pass allocates
//!   that are still live when it ends ([`Behaviour::forward_kept`]);
//! * **precision**: `torch.autocast`'s frames in the stacks (C++ `at::autocast::cached_cast`,
//!   `torch/amp/autocast_mode.py`), else its casts: each linear layer casts its fp32 weight
//!   to a 16-bit copy in the forward, a request of exactly half a parameter's bytes
//!   ([`Behaviour::half_cast_share`]);
//! * **the model**: the sizes of the blocks held from before the first forward pass
//!   through it (parameters, buffers, optimizer state), compared as multisets
//!   ([`Behaviour::persistent`]).
//!
//! [`differences`] compares two of them and says each difference found with its evidence;
//! nothing is said where a recording has no evidence (no forward frames, no persistent
//! blocks).
//!
//! Principal types: [`Behaviour`], [`Difference`].

use std::collections::HashMap;

use fragscope_snapshot::{Action, BlockState, Snapshot, StackId};
use fragscope_trace::Phase;

/// Persistent blocks smaller than this are left out of the model's sizes (biases, norms,
/// scalars: shared by any two models).
const MIN_PARAM: u64 = 64 * 1024;

/// What one recording's program does on one device (module doc).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Behaviour {
    /// Requests made in a backward pass.
    pub backward_requests: usize,
    /// Requests made in an optimizer step.
    pub optimizer_requests: usize,
    /// Forward passes (maximal runs of forward requests) and their requests.
    pub forward_passes: usize,
    pub forward_requests: usize,
    /// Share (0–1) of the bytes requested in forward passes still live when the pass
    /// ends (`None`: no forward pass).
    pub forward_kept: Option<f64>,
    /// Entries whose stack shows autocast: PyTorch's C++ `at::autocast::` functions
    /// (`cached_cast`, `WrapFunction_`) or `torch/amp/autocast_mode.py`.
    pub autocast_entries: usize,
    /// Share (0–1) of the distinct persistent sizes that a forward request of exactly
    /// half their bytes matches (an fp32 weight cast to 16 bits by autocast); `None`
    /// without persistent blocks or forward requests.
    pub half_cast_share: Option<f64>,
    /// Sizes (bytes, at least 64 KiB) of the blocks allocated before the first forward
    /// pass and live when it ends, and of those allocated before the trace that it never
    /// frees, ascending.
    pub persistent: Vec<u64>,
}

/// One difference between two recordings' programs, said with its evidence.
#[derive(Clone, Debug, PartialEq)]
pub struct Difference {
    /// What differs: `training`, `grad_mode`, `precision`, `model`.
    pub what: &'static str,
    /// In words, naming the recordings by their sizes.
    pub text: String,
}

impl Behaviour {
    /// The behaviour of `snap`'s program on `device`.
    pub fn of(snap: &Snapshot, device: i64) -> Behaviour {
        let trace = snap.trace(device);
        let steps = fragscope_trace::steps(snap, device);
        let mut b = Behaviour::default();
        // Live blocks by address: (requested bytes, entry of the alloc).
        let mut live: HashMap<u64, (u64, usize)> = HashMap::new();
        // The current forward pass: its first entry and the bytes it requested.
        let mut pass: Option<(usize, u64)> = None;
        let (mut fwd_bytes, mut kept_bytes) = (0u64, 0u64);
        let mut fwd_sizes: Vec<u64> = Vec::new();
        // Blocks allocated before the first forward pass and live when it ends.
        let mut persistent: Option<Vec<u64>> = None;
        let mut autocast = StackNeedle::new(snap);
        let end_pass = |start: usize, bytes: u64, live: &HashMap<u64, (u64, usize)>, kept: &mut u64, all: &mut u64| {
            *all += bytes;
            *kept += live.values().filter(|(_, at)| *at >= start).map(|(s, _)| s).sum::<u64>();
        };
        for (i, ev) in trace.iter().enumerate() {
            let phase = steps.phase_at(i);
            if autocast.has(ev.stack) {
                b.autocast_entries += 1;
            }
            match ev.action {
                Action::Alloc => {
                    match phase {
                        Phase::Backward => b.backward_requests += 1,
                        Phase::Optimizer => b.optimizer_requests += 1,
                        _ => {}
                    }
                    if phase == Phase::Forward {
                        b.forward_requests += 1;
                        fwd_sizes.push(ev.size);
                        match &mut pass {
                            Some((_, n)) => *n += ev.size,
                            None => {
                                b.forward_passes += 1;
                                pass = Some((i, ev.size));
                            }
                        }
                    } else if let Some((s, n)) = pass.take() {
                        end_pass(s, n, &live, &mut kept_bytes, &mut fwd_bytes);
                        persistent.get_or_insert_with(|| held_since_before(&live, s));
                    }
                    live.insert(ev.addr, (ev.size, i));
                }
                Action::FreeRequested | Action::FreeCompleted => {
                    live.remove(&ev.addr);
                }
                _ => {}
            }
        }
        if let Some((s, n)) = pass.take() {
            end_pass(s, n, &live, &mut kept_bytes, &mut fwd_bytes);
            persistent.get_or_insert_with(|| held_since_before(&live, s));
        }
        if fwd_bytes > 0 {
            b.forward_kept = Some(kept_bytes as f64 / fwd_bytes as f64);
        }
        // Persistent: allocated before the first forward pass and live when it ended
        // (none without a forward pass: what is live at the end of a trace without phases
        // may be activations, whose sizes vary with the size), and the blocks allocated
        // before the trace that it never frees (the snapshot's).
        let mut persistent = persistent.unwrap_or_default();
        persistent.extend(blocks_before_trace(snap, device, trace));
        persistent.retain(|&s| s >= MIN_PARAM);
        persistent.sort_unstable();
        b.persistent = persistent;
        b.half_cast_share = half_cast_share(&b.persistent, &fwd_sizes);
        b
    }

    /// Whether the program trains: a backward pass and an optimizer step.
    fn trains(&self) -> bool {
        self.backward_requests > 0 && self.optimizer_requests > 0
    }

    /// The program's mode in words: what [`differences`] names.
    fn mode(&self) -> &'static str {
        match (self.backward_requests > 0, self.optimizer_requests > 0) {
            (true, true) => "a backward pass and an optimizer step",
            (true, false) => "a backward pass and no optimizer step",
            (false, true) => "an optimizer step and no backward pass",
            (false, false) => "no backward pass and no optimizer step",
        }
    }
}

/// Requested bytes of the blocks of `live` allocated before entry `start`.
fn held_since_before(live: &HashMap<u64, (u64, usize)>, start: usize) -> Vec<u64> {
    live.values().filter(|(_, at)| *at < start).map(|(s, _)| *s).collect()
}

/// [`Behaviour::half_cast_share`] of the sorted `persistent` sizes and the forward
/// requests' `fwd_sizes`.
fn half_cast_share(persistent: &[u64], fwd_sizes: &[u64]) -> Option<f64> {
    let mut distinct = persistent.to_vec();
    distinct.dedup();
    if distinct.is_empty() || fwd_sizes.is_empty() {
        return None;
    }
    let halves: std::collections::HashSet<u64> = fwd_sizes.iter().map(|&s| 2 * s).collect();
    Some(distinct.iter().filter(|w| halves.contains(w)).count() as f64 / distinct.len() as f64)
}

/// Whether a stack shows autocast, asked once per stack.
struct StackNeedle<'a> {
    snap: &'a Snapshot,
    seen: HashMap<StackId, bool>,
}

impl<'a> StackNeedle<'a> {
    fn new(snap: &'a Snapshot) -> Self {
        StackNeedle { snap, seen: HashMap::new() }
    }
    fn has(&mut self, stack: Option<StackId>) -> bool {
        let Some(id) = stack else { return false };
        let snap = self.snap;
        *self.seen.entry(id).or_insert_with(|| {
            snap.frames.resolved(id).any(|(file, _, name)| {
                name.contains("at::autocast::") || file.replace('\\', "/").ends_with("torch/amp/autocast_mode.py")
            })
        })
    }
}

/// Sizes of the blocks allocated when the trace began that the trace does not free: the
/// snapshot's active blocks whose address no trace entry frees or allocates.
fn blocks_before_trace(snap: &Snapshot, device: i64, trace: &[fragscope_snapshot::TraceEvent]) -> Vec<u64> {
    let touched: std::collections::HashSet<u64> = trace
        .iter()
        .filter(|e| matches!(e.action, Action::Alloc | Action::FreeRequested | Action::FreeCompleted))
        .map(|e| e.addr)
        .collect();
    snap.segments
        .iter()
        .filter(|s| s.device == device)
        .flat_map(|s| s.blocks.iter())
        .filter(|b| b.state == BlockState::ActiveAllocated && !touched.contains(&b.address))
        .map(|b| b.requested_size.unwrap_or(b.size))
        .collect()
}

/// Share (0–1) of the bytes of multiset `a` matched by an equal size in `b`, over the
/// smaller of the two totals (a recording made after warm-up holds optimizer state and
/// gradients as well as the parameters).
fn shared_share(a: &[u64], b: &[u64]) -> f64 {
    let (ta, tb): (u64, u64) = (a.iter().sum(), b.iter().sum());
    if ta == 0 || tb == 0 {
        return 1.0;
    }
    let (mut i, mut j, mut common) = (0, 0, 0u64);
    while i < a.len() && j < b.len() {
        match a[i].cmp(&b[j]) {
            std::cmp::Ordering::Equal => {
                common += a[i];
                i += 1;
                j += 1;
            }
            std::cmp::Ordering::Less => i += 1,
            std::cmp::Ordering::Greater => j += 1,
        }
    }
    common as f64 / ta.min(tb) as f64
}

/// The differences between the programs of recordings `a` (at size `sa`) and `b` (at
/// `sb`), most telling first; empty when none is found.
pub fn differences(a: &Behaviour, sa: u64, b: &Behaviour, sb: u64) -> Vec<Difference> {
    let mut out = Vec::new();
    if a.trains() != b.trains() || (a.backward_requests > 0) != (b.backward_requests > 0) {
        let (t, i) = if a.trains() || a.backward_requests > 0 { ((a, sa), (b, sb)) } else { ((b, sb), (a, sa)) };
        out.push(Difference {
            what: "training",
            text: format!(
                "the recording at size {} has {} ({} and {} requests), the one at size {} has {}: a training step \
                 and an inference run are different programs",
                t.1,
                t.0.mode(),
                t.0.backward_requests,
                t.0.optimizer_requests,
                i.1,
                i.0.mode()
            ),
        });
    }
    // Models are compared where both recordings show forward passes: without phases,
    // the blocks held before the trace may include a step's activations.
    let share = shared_share(&a.persistent, &b.persistent);
    if share < 0.5 && a.forward_passes > 0 && b.forward_passes > 0 {
        let mib = |v: &[u64]| v.iter().sum::<u64>() as f64 / (1u64 << 20) as f64;
        out.push(Difference {
            what: "model",
            text: format!(
                "the blocks held from before the first forward pass through it (parameters, buffers, optimizer \
                 state) differ: {} blocks, {:.1} MiB at size {sa}; {} blocks, {:.1} MiB at size {sb}; only {:.0}% of \
                 their bytes have a block of the same size in the other: two different models",
                a.persistent.len(),
                mib(&a.persistent),
                b.persistent.len(),
                mib(&b.persistent),
                share * 100.0
            ),
        });
        // Precision and grad mode are compared within one model only.
        return out;
    }
    if let Some(d) = precision(a, sa, b, sb) {
        out.push(d);
    }
    if let Some(d) = grad_mode(a, sa, b, sb) {
        out.push(d);
    }
    out
}

/// Autocast: one recording's stacks show autocast and the other's none; without such
/// frames in either, one recording's forward passes cast most parameter sizes to half
/// their bytes and the other's few.
fn precision(a: &Behaviour, sa: u64, b: &Behaviour, sb: u64) -> Option<Difference> {
    let (hi, lo) = if a.autocast_entries >= b.autocast_entries { ((a, sa), (b, sb)) } else { ((b, sb), (a, sa)) };
    if hi.0.autocast_entries >= 2 && lo.0.autocast_entries == 0 {
        return Some(Difference {
            what: "precision",
            text: format!(
                "the recording at size {} runs under torch.autocast ({} entries whose stacks show autocast's casts), \
                 the one at size {} does not: a mixed-precision run and an fp32 run are different programs; record \
                 every size with the same precision",
                hi.1, hi.0.autocast_entries, lo.1
            ),
        });
    }
    if a.autocast_entries > 0 || b.autocast_entries > 0 {
        return None;
    }
    let (ha, hb) = (a.half_cast_share?, b.half_cast_share?);
    let (hi, lo) = if ha >= hb { ((ha, sa), (hb, sb)) } else { ((hb, sb), (ha, sa)) };
    (hi.0 >= 0.8 && lo.0 <= 0.5).then(|| Difference {
        what: "precision",
        text: format!(
            "the forward passes of the recording at size {} make copies of half the bytes of {:.0}% of the \
             parameter sizes (fp32 weights cast to bf16/fp16: torch.autocast), those at size {} of {:.0}%: a \
             mixed-precision run and an fp32 run are different programs; record every size with the same precision",
            hi.1,
            hi.0 * 100.0,
            lo.1,
            lo.0 * 100.0
        ),
    })
}

/// Grad mode: one recording's forward passes keep what autograd saves, the other's free
/// their activations as they go (`torch.no_grad()`, `inference_mode()`).
fn grad_mode(a: &Behaviour, sa: u64, b: &Behaviour, sb: u64) -> Option<Difference> {
    let (ka, kb) = (a.forward_kept?, b.forward_kept?);
    let (hi, lo) = if ka >= kb { ((ka, sa), (kb, sb)) } else { ((kb, sb), (ka, sa)) };
    (hi.0 >= 0.3 && lo.0 * 3.0 <= hi.0).then(|| Difference {
        what: "grad_mode",
        text: format!(
            "the forward passes of the recording at size {} keep {:.0}% of the bytes they allocate until they end \
             (autograd's saved tensors: grad enabled), those at size {} {:.0}% (activations freed as they go: \
             torch.no_grad() or inference_mode()): different programs",
            hi.1,
            hi.0 * 100.0,
            lo.1,
            lo.0 * 100.0
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use fragscope_snapshot::TraceEvent;

    /// A trace without frames: `n` blocks of `bytes` allocated, the last kept.
    fn frameless(n: u64, bytes: u64) -> Snapshot {
        let mut t = Vec::new();
        for k in 0..n {
            t.push(TraceEvent::new(Action::Alloc, 0x1000 + k * 0x10_0000, bytes));
            if k + 1 < n {
                t.push(TraceEvent::new(Action::FreeRequested, 0x1000 + k * 0x10_0000, bytes));
                t.push(TraceEvent::new(Action::FreeCompleted, 0x1000 + k * 0x10_0000, bytes));
            }
        }
        Snapshot { device_traces: vec![t], ..Snapshot::default() }
    }

    #[test]
    fn no_evidence_no_difference() {
        // Without frames there are no phases: nothing is said, whatever differs in size
        // (what stays live at the end of such a trace may be activations).
        let (a, b) = (Behaviour::of(&frameless(8, 1 << 20), 0), Behaviour::of(&frameless(8, 4 << 20), 0));
        assert_eq!((a.forward_passes, a.backward_requests, a.autocast_entries), (0, 0, 0));
        assert!(a.persistent.is_empty() && a.forward_kept.is_none());
        assert!(differences(&a, 1, &b, 4).is_empty());
    }

    #[test]
    fn shared_share_counts_equal_sizes_over_the_smaller_total() {
        // Parameters only, against parameters, gradients and optimizer state: all shared.
        assert_eq!(shared_share(&[4, 8], &[4, 4, 8, 8, 8]), 1.0);
        assert_eq!(shared_share(&[4, 8], &[16, 32]), 0.0);
        assert!((shared_share(&[4, 8], &[8, 32]) - 8.0 / 12.0).abs() < 1e-12);
    }
}
