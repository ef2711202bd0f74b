//! The built-in example snapshot that fragscope's commands show without FILE.
//!
//! It is made here, by fragscope's own code: a small deterministic workload (a toy
//! transformer trained with AdamW on variable sequence lengths — the classic
//! fragmentation trigger — plus a loss kept in a Python list every step, a deliberate
//! leak, and a final evaluation request that runs out of memory by fragmentation) run
//! through fragscope's faithful model of PyTorch's caching allocator
//! (`fragscope-alloc`) and recorded as `_record_memory_history` would record it. No file
//! from anyone else is involved.

use fragscope_replay::Recorder;
use fragscope_snapshot::Snapshot;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// The example's device: an L4-sized GPU, so the numbers look like a real small run.
pub const CAPACITY: u64 = 22 * GIB + 500 * MIB;
/// The evaluation request that fails (see the end of [`snapshot`]).
pub const EVAL_REQUEST: u64 = 20_100 * MIB;

pub fn snapshot() -> Snapshot {
    let mut r = Recorder::new("", CAPACITY, 1_718_000_000_000_000, 37).expect("empty config is valid");
    let main = ("train.py", 120, "<module>");
    let s_init = r.stack(&[main, ("train.py", 21, "build_model"), ("model.py", 14, "__init__")]);
    let s_qkv =
        r.stack(&[main, ("train.py", 57, "train_step"), ("model.py", 31, "forward"), ("model.py", 66, "attention")]);
    let s_mlp = r.stack(&[main, ("train.py", 57, "train_step"), ("model.py", 33, "forward"), ("model.py", 80, "mlp")]);
    let s_tmp =
        r.stack(&[main, ("train.py", 57, "train_step"), ("model.py", 34, "forward"), ("functional.py", 2900, "gelu")]);
    let s_logits = r.stack(&[main, ("train.py", 57, "train_step"), ("model.py", 40, "head")]);
    let s_loss = r.stack(&[main, ("train.py", 58, "train_step"), ("train.py", 47, "loss_fn")]);
    let s_grad = r.stack(&[main, ("train.py", 59, "train_step"), ("autograd/__init__.py", 266, "backward")]);
    let s_opt = r.stack(&[main, ("train.py", 60, "train_step"), ("optim/adamw.py", 483, "_multi_tensor_adamw")]);
    let s_leak = r.stack(&[main, ("train.py", 63, "train_step"), ("train.py", 63, "<listcomp>")]);

    // 12 layers of a d_model=1024 transformer in fp32: qkv, proj, fc1, fc2 weights.
    let d = 1024u64;
    let layer_weights = [3 * d * d * 4, d * d * 4, 4 * d * d * 4, 4 * d * d * 4, 4 * d * 4, d * 4];
    let mut weights = Vec::new();
    for _ in 0..12 {
        for &w in &layer_weights {
            weights.push(r.malloc(w, 0, s_init).expect("weights fit"));
        }
    }
    let embed = r.malloc(50_304 * d * 4, 0, s_init).expect("embedding fits");
    weights.push(embed);
    let sizes: Vec<u64> = (0..12).flat_map(|_| layer_weights).chain([50_304 * d * 4]).collect();

    let mut adam: Vec<u64> = Vec::new();
    let mut kept_losses = Vec::new();
    // Variable sequence lengths: every step's activations differ in size, so the cache
    // fills with blocks that the next step's requests do not fit exactly.
    let seq_lens = [512u64, 1536, 768, 2048, 384, 1280, 896, 1792];
    let batch = 4u64;
    for (step, &seq) in seq_lens.iter().enumerate() {
        let name = format!("ProfilerStep#{step}");
        r.annotate(&name, "START");
        let tokens = batch * seq;
        let mut saved = Vec::new();
        for _ in 0..12 {
            saved.push(r.malloc(tokens * 3 * d * 4, 0, s_qkv).expect("fits"));
            saved.push(r.malloc(batch * 16 * seq * seq * 2, 0, s_qkv).expect("fits"));
            let t = r.malloc(tokens * 4 * d * 4, 0, s_tmp).expect("fits");
            saved.push(r.malloc(tokens * 4 * d * 4, 0, s_mlp).expect("fits"));
            r.free(t).unwrap();
            saved.push(r.malloc(tokens * 4 * 2, 0, s_mlp).expect("fits")); // a small mask
        }
        let logits = r.malloc(tokens * 50_304 * 2, 0, s_logits).expect("fits");
        let loss = r.malloc(4, 0, s_loss).expect("fits");
        // The leak: `losses.append(loss)` keeps each step's loss and a slice of its graph.
        kept_losses.push(r.malloc(tokens * d * 4, 0, s_leak).expect("fits"));
        // Backward: gradients for every weight, activations freed as it goes.
        r.free(logits).unwrap();
        let mut grads = Vec::new();
        for (i, a) in saved.into_iter().enumerate().rev() {
            if i % 4 == 0 {
                let w = sizes[(i / 4 * 6) % sizes.len()];
                grads.push(r.malloc(w, 0, s_grad).expect("fits"));
            }
            r.free(a).unwrap();
        }
        grads.push(r.malloc(50_304 * d * 4, 0, s_grad).expect("fits"));
        r.free(loss).unwrap();
        // AdamW: state on the first step, then the update with a temporary per tensor.
        if adam.is_empty() {
            for &w in &sizes {
                adam.push(r.malloc(w, 0, s_opt).expect("fits"));
                adam.push(r.malloc(w, 0, s_opt).expect("fits"));
            }
        }
        for &w in sizes.iter().step_by(3) {
            let t = r.malloc(w, 0, s_opt).expect("fits");
            r.free(t).unwrap();
        }
        for g in grads {
            r.free(g).unwrap();
        }
        r.annotate(&name, "END");
    }
    let _ = (weights, kept_losses);
    // Evaluation asks for one 19.6 GiB buffer. About 20.1 GiB is free in total (cache plus
    // device), but the kept losses pin the cached segments, so no piece is big enough: a
    // fragmentation OOM, recorded like `_dump_snapshot` in an `except OutOfMemoryError`.
    let s_eval = r.stack(&[main, ("train.py", 95, "evaluate"), ("model.py", 40, "head")]);
    let oom = r.malloc(EVAL_REQUEST, 0, s_eval);
    debug_assert!(oom.is_err(), "the example is meant to end in an OOM");
    r.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use fragscope_snapshot::{Action, BlockState};

    #[test]
    fn example_is_a_consistent_complete_snapshot() {
        let s = snapshot();
        assert!(!s.segments.is_empty());
        for seg in &s.segments {
            let mut at = seg.address;
            for b in &seg.blocks {
                assert_eq!(b.address, at, "blocks tile their segment");
                at += b.size;
            }
            assert_eq!(at, seg.address + seg.total_size);
        }
        let t = &s.device_traces[0];
        let allocs = t.iter().filter(|e| e.action == Action::Alloc).count();
        let frees = t.iter().filter(|e| e.action == Action::FreeCompleted).count();
        let live = s.segments.iter().flat_map(|s| &s.blocks).filter(|b| b.state == BlockState::ActiveAllocated).count();
        assert_eq!(allocs - frees, live, "the trace explains every live block");
        assert!(t.iter().any(|e| e.action == Action::SegmentAlloc));
        let oom = t.last().unwrap();
        assert_eq!(oom.action, Action::Oom, "the example ends in the evaluation OOM");
        assert_eq!(oom.size, EVAL_REQUEST, "oom entries carry the rounded request");
    }

    #[test]
    fn example_replays_exactly() {
        let s = snapshot();
        let r = fragscope_replay::verify(&s, 0, &Default::default());
        assert_eq!(r.allocs, r.allocs_matched);
        assert_eq!(r.segment_events, r.segment_events_matched);
        assert!(r.first_divergence.is_none());
    }
}
