//! Degenerate inputs to [`crate::Program::fit`]: one recording given under two sizes, and
//! sizes given in the wrong order (the requests that vary shrink as the size grows).
//! Both would fit laws without complaint and predict nonsense: a recording twice makes
//! every law constant, swapped labels make every law decrease, and a prediction at a
//! larger size then "fits" a device it would not.

use fragscope_snapshot::TraceEvent;

use crate::{PredictError, Recording};

/// Refuses two recordings of `recs` whose traces on `device` are the same, entry for
/// entry (action, address, size, time): the same file given under two sizes.
pub(crate) fn same_recordings(recs: &[Recording<'_>], device: i64) -> Result<(), PredictError> {
    let key = |e: &TraceEvent| (e.action, e.addr, e.size, e.time_us);
    for (i, a) in recs.iter().enumerate() {
        for b in &recs[i + 1..] {
            let (ta, tb) = (a.snap.trace(device), b.snap.trace(device));
            if !ta.is_empty() && ta.len() == tb.len() && ta.iter().zip(tb).all(|(x, y)| key(x) == key(y)) {
                let (lo, hi) = (a.size.min(b.size), a.size.max(b.size));
                return Err(PredictError::SameRecording { a: lo, b: hi });
            }
        }
    }
    Ok(())
}

/// Least share of the requests whose size varies that must shrink as the size grows for
/// [`PredictError::SizesShrink`]; above half, a note says so.
pub const SHRINK_REFUSED: f64 = 0.9;

/// Whether the template's requests (their `(size, bytes)` `points` in every recording)
/// mostly shrink as the size parameter grows: refused when nearly all of those whose
/// size varies do ([`SHRINK_REFUSED`]), a note when most do, nothing otherwise.
pub(crate) fn shrinking(recs: &[Recording<'_>], points: &[Vec<(u64, u64)>]) -> Result<Option<String>, PredictError> {
    let (mut grow, mut shrink) = (0usize, 0usize);
    for p in points {
        let lo = p.iter().min_by_key(|x| x.0);
        let hi = p.iter().max_by_key(|x| x.0);
        if let (Some(lo), Some(hi)) = (lo, hi) {
            match hi.1.cmp(&lo.1) {
                std::cmp::Ordering::Greater => grow += 1,
                std::cmp::Ordering::Less => shrink += 1,
                std::cmp::Ordering::Equal => {}
            }
        }
    }
    let varying = grow + shrink;
    let sizes: Vec<u64> = recs.iter().map(|r| r.size).collect();
    if varying >= 10 && shrink as f64 >= SHRINK_REFUSED * varying as f64 {
        return Err(PredictError::SizesShrink { shrinking: shrink, varying, sizes });
    }
    Ok((shrink > grow).then(|| {
        format!(
            "{shrink} of the {varying} allocations whose size changes between the recordings get smaller as the \
             size grows: check that the sizes are given in file order (--sizes {}); predictions extrapolate these \
             laws as they are",
            sizes.iter().map(|s| s.to_string()).collect::<Vec<_>>().join(",")
        )
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Points of `n` requests growing from `a` to `b` bytes between sizes 1 and 2.
    fn points(grow: usize, shrink: usize, same: usize) -> Vec<Vec<(u64, u64)>> {
        let mut v = Vec::new();
        v.extend((0..grow).map(|_| vec![(2, 200), (1, 100)]));
        v.extend((0..shrink).map(|_| vec![(2, 100), (1, 200)]));
        v.extend((0..same).map(|_| vec![(2, 100), (1, 100)]));
        v
    }

    #[test]
    fn shrinking_refused_warned_or_silent() {
        let snap = fragscope_snapshot::Snapshot::default();
        let recs = [Recording { snap: &snap, size: 2 }, Recording { snap: &snap, size: 1 }];
        // Nearly every varying request shrinks: refused, constants aside.
        let e = shrinking(&recs, &points(1, 19, 50)).unwrap_err();
        assert_eq!(e, PredictError::SizesShrink { shrinking: 19, varying: 20, sizes: vec![2, 1] });
        // Most shrink: a note naming the sizes as given.
        let n = shrinking(&recs, &points(8, 12, 0)).unwrap().expect("a note");
        assert!(n.contains("12 of the 20") && n.contains("--sizes 2,1"), "{n}");
        // Most grow, or too few vary to tell: nothing.
        assert_eq!(shrinking(&recs, &points(12, 8, 0)), Ok(None));
        assert_eq!(shrinking(&recs, &points(0, 9, 0)).map(|n| n.is_some()), Ok(true));
    }
}
