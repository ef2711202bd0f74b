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
            (site, snap.stream(e), snap.pool_id(e)).hash(&mut h);
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
    let mut pos_a: HashMap<u64, Vec<usize>> = HashMap::new();
    for (i, &k) in a.iter().enumerate() {
        pos_a.entry(k).or_default().push(i);
    }
    // Far searches that found nothing: past FAR_FAILURES the sequences are taken for
    // different programs, and a mismatch is simply stepped over.
    let mut far_failures = 0;
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
        // Nothing nearby: look further, for a long run of agreement (a recording whose
        // ring buffer, `max_entries`, kept another part of the program).
        let best = best.or_else(|| {
            if far_failures >= FAR_FAILURES {
                return None;
            }
            let f = far(a, b, i, j, &pos, &pos_a);
            far_failures += usize::from(f.is_none());
            f
        });
        match best {
            Some((p, q)) => {
                i += p;
                j += q;
            }
            // Nothing agrees again: count both as unaligned and move on.
            None => {
                i += 1;
                j += 1;
            }
        }
    }
    out
}

/// The cheapest far resynchronisation of `a[i..]` and `b[j..]`: one of the next
/// [`FAR_STARTS`] requests on either side found anywhere ahead on the other, followed
/// by [`FAR_CONFIRM`] agreeing requests.
fn far(
    a: &[u64],
    b: &[u64],
    i: usize,
    j: usize,
    pos_b: &HashMap<u64, Vec<usize>>,
    pos_a: &HashMap<u64, Vec<usize>>,
) -> Option<(usize, usize)> {
    let agree = |x: usize, y: usize| {
        x + FAR_CONFIRM <= a.len() && y + FAR_CONFIRM <= b.len() && a[x..x + FAR_CONFIRM] == b[y..y + FAR_CONFIRM]
    };
    let mut best: Option<(usize, usize)> = None;
    let better = |best: Option<(usize, usize)>, p: usize, q: usize| best.is_none_or(|(bp, bq)| p + q < bp + bq);
    for p in 0..FAR_STARTS.min(a.len() - i) {
        if let Some(list) = pos_b.get(&a[i + p]) {
            let start = list.partition_point(|&x| x < j);
            for &jj in list[start..].iter().take(FAR_OCCURRENCES) {
                if better(best, p, jj - j) && agree(i + p, jj) {
                    best = Some((p, jj - j));
                    break;
                }
            }
        }
    }
    // The other way round: a request of `b` found ahead in `a`.
    for q in 0..FAR_STARTS.min(b.len() - j) {
        if let Some(list) = pos_a.get(&b[j + q]) {
            let start = list.partition_point(|&x| x < i);
            for &ii in list[start..].iter().take(FAR_OCCURRENCES) {
                if better(best, ii - i, q) && agree(ii, j + q) {
                    best = Some((ii - i, q));
                    break;
                }
            }
        }
    }
    best
}

/// Far resynchronisation: requests tried on each side, occurrences tried for each, and
/// the run of agreement that confirms one.
const FAR_STARTS: usize = 32;
const FAR_OCCURRENCES: usize = 64;
const FAR_CONFIRM: usize = 16;
const FAR_FAILURES: usize = 64;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skips_requests_present_on_one_side() {
        let a = [1, 2, 3, 9, 4, 5, 6, 7, 8];
        let b = [1, 2, 3, 4, 5, 6, 7, 7, 8];
        let m = align(&a, &b);
        assert_eq!(m, vec![Some(0), Some(1), Some(2), None, Some(3), Some(4), Some(5), Some(6), Some(8)]);
        // A ring buffer that kept a later part of the program: the start of `a` is skipped.
        let long: Vec<u64> = (0..2000u64).map(|k| k.wrapping_mul(2_654_435_761) % 1_000_003).collect();
        let m = align(&long, &long[1300..]);
        assert!(m[..1300].iter().all(|x| x.is_none()));
        assert!(m[1300..].iter().enumerate().all(|(k, x)| *x == Some(k)));
        // And the other way round: `b` holds more of the program than `a`.
        let m = align(&long[1300..], &long);
        assert!(m.iter().enumerate().all(|(k, x)| *x == Some(k + 1300)));
        // Different programs: nothing aligns.
        let c = [10, 11, 12, 13];
        assert!(align(&a, &c).iter().all(|x| x.is_none()));
    }
}
