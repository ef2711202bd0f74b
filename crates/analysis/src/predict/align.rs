//! Align the requests of two recordings of one program, event by event.
//!
//! A *request* is a trace entry that asks the allocator for memory: `alloc`, or `oom`
//! (a request that failed). Two recordings of the same program at different sizes make
//! the same requests from the same call sites in the same order; what legitimately
//! differs is left out or skipped:
//!
//! * the allocator's own entries (`segment_alloc`/`free`/`map`/`unmap`: cache flushes,
//!   the release-and-retry after a failed `cudaMalloc`) are not requests at all;
//! * requests that happen at some sizes only (a kernel that needs a workspace past some
//!   size, a chunked loop with one more chunk) are skipped on either side: at a mismatch
//!   the nearest point where the two sequences agree again (for a few requests in a row)
//!   is found within a window, the cheapest resynchronisation first.
//!
//! A call site is the allocation's stack, frame by frame as `(file, function)`: line
//! numbers are left out, because the recordings are usually made by editing the size
//! in the script, which moves the lines of everything below it.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};

use fragscope_snapshot::{Action, FxHasher, Snapshot, StackId, TraceEvent};

/// How far (in requests, on each side) a mismatch may be resolved.
const WINDOW: usize = 512;
/// How many requests in a row must agree after a resynchronisation point.
const CONFIRM: usize = 4;

/// The trace entries of `trace` that are requests (`alloc`, `oom`), in order.
pub fn requests(trace: &[TraceEvent]) -> Vec<usize> {
    trace.iter().enumerate().filter(|(_, e)| matches!(e.action, Action::Alloc | Action::Oom)).map(|(i, _)| i).collect()
}

/// One key per request: its call site (stack without line numbers), stream and pool.
pub fn keys(snap: &Snapshot, trace: &[TraceEvent], reqs: &[usize]) -> Vec<u64> {
    let mut by_stack: HashMap<Option<StackId>, u64> = HashMap::new();
    reqs.iter()
        .map(|&i| {
            let e = &trace[i];
            let site = *by_stack.entry(e.stack).or_insert_with(|| {
                let mut h = FxHasher::default();
                if let Some(s) = e.stack {
                    for &f in snap.frames.stack(s) {
                        let fr = snap.frames.frame(f);
                        snap.frames.str(fr.filename).hash(&mut h);
                        snap.frames.str(fr.name).hash(&mut h);
                    }
                }
                h.finish()
            });
            let mut h = FxHasher::default();
            (site, e.stream, snap.pool_id(e)).hash(&mut h);
            h.finish()
        })
        .collect()
}

/// For each request of `a`, the index of the request of `b` it aligns with.
pub fn align(a: &[u64], b: &[u64]) -> Vec<Option<usize>> {
    // Where each key occurs in `b`, ascending, to find the next occurrence quickly.
    let mut pos: HashMap<u64, Vec<usize>> = HashMap::new();
    for (j, &k) in b.iter().enumerate() {
        pos.entry(k).or_default().push(j);
    }
    let agree = |i: usize, j: usize| (0..CONFIRM).all(|d| i + d >= a.len() || j + d >= b.len() || a[i + d] == b[j + d]);
    let mut out = vec![None; a.len()];
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        if a[i] == b[j] {
            out[i] = Some(j);
            i += 1;
            j += 1;
            continue;
        }
        // The cheapest (p skipped in a, q skipped in b) with a[i+p] == b[j+q] and the
        // next few agreeing.
        let mut best: Option<(usize, usize)> = None;
        for p in 0..WINDOW.min(a.len() - i) {
            if best.is_some_and(|(bp, bq)| p >= bp + bq) {
                break;
            }
            let Some(list) = pos.get(&a[i + p]) else { continue };
            let start = list.partition_point(|&x| x < j);
            for &jj in &list[start..] {
                let q = jj - j;
                if q >= WINDOW || best.is_some_and(|(bp, bq)| p + q >= bp + bq) {
                    break;
                }
                if agree(i + p, jj) {
                    best = Some((p, q));
                    break;
                }
            }
        }
        match best {
            Some((p, q)) => {
                i += p;
                j += q;
            }
            // Nothing agrees again nearby: count both as unaligned and move on.
            None => {
                i += 1;
                j += 1;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skips_requests_present_on_one_side() {
        let a = [1, 2, 3, 9, 4, 5, 6, 7, 8];
        let b = [1, 2, 3, 4, 5, 6, 7, 7, 8];
        let m = align(&a, &b);
        assert_eq!(m, vec![Some(0), Some(1), Some(2), None, Some(3), Some(4), Some(5), Some(6), Some(8)]);
        // Different programs: nothing aligns.
        let c = [10, 11, 12, 13];
        assert!(align(&a, &c).iter().all(|x| x.is_none()));
    }
}
