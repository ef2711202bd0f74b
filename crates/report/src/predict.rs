//! The page of `fragscope predict ... --report out.html`: each recording's reserved and
//! allocated curves beside the curves predicted at the sizes nobody recorded
//! ([`fragscope_predict`]), the predictions labelled as such.
//!
//! A curve is the maximum of reserved and of allocated bytes in each of at most
//! `buckets` equal runs of its trace's entries, so its highest bucket is the run's peak:
//! for a recording, the peak of [`fragscope_trace::timeline`] (`analyze`'s
//! `peak_reserved` / `peak_allocated`); for a prediction, the replay's own peak
//! statistics (`predict --json`'s `peak_reserved` / `peak_allocated`), which also
//! catch a peak inside one entry (a request that fails after the allocator grew).
//!
//! Principal types: [`PredictPage`] (what the page gets), [`Curve`], [`CurveBuilder`].

use fragscope_snapshot::Snapshot;
use fragscope_trace::{timeline_walk, OnLevels, TimelineOptions};
use serde::Serialize;

use crate::encode;

/// Curves drawn per page at most (recordings and predictions, every device): the rest
/// are listed in the page's table without a curve, so that the page's size does not grow
/// with the number of sizes asked.
pub const MAX_CURVES: usize = 48;
/// Values of the page's curves in all (each curve gets its share, 64 to 4096 buckets).
pub const CURVE_VALUES: usize = 1 << 16;

/// Buckets of each of `curves` curves sharing the page ([`CURVE_VALUES`]).
pub fn buckets_each(curves: usize) -> usize {
    (CURVE_VALUES / curves.clamp(1, MAX_CURVES)).clamp(64, 4096)
}

/// One run's curves over its own trace: `n` buckets of its `entries` trace entries;
/// arrays are base64 `Float64Array`s of `n` values (the maxima of each bucket) and the
/// first entry of each bucket.
#[derive(Serialize)]
pub struct Curve {
    pub n: usize,
    pub entries: usize,
    pub first: String,
    pub reserved: String,
    pub allocated: String,
}

/// Bucket maxima of a run's levels, fed entry by entry in order ([`CurveBuilder::level`]).
pub struct CurveBuilder {
    entries: usize,
    first: Vec<f64>,
    reserved: Vec<f64>,
    allocated: Vec<f64>,
}

impl CurveBuilder {
    /// Buckets for a trace of `entries` positions (entries, or states), at most `buckets`.
    pub fn new(entries: usize, buckets: usize) -> Self {
        let n = buckets.max(1).min(entries.max(1));
        let first = (0..n).map(|b| ((b * entries).div_ceil(n)) as f64).collect();
        CurveBuilder { entries, first, reserved: vec![f64::NAN; n], allocated: vec![f64::NAN; n] }
    }

    /// The levels at position `i` (0-based, `< entries`).
    pub fn level(&mut self, i: usize, reserved: u64, allocated: u64) {
        let n = self.first.len();
        let b = ((i as u128 * n as u128) / self.entries.max(1) as u128).min(n as u128 - 1) as usize;
        let m = |v: &mut f64, x: u64| *v = if v.is_nan() { x as f64 } else { v.max(x as f64) };
        m(&mut self.reserved[b], reserved);
        m(&mut self.allocated[b], allocated);
    }

    pub fn finish(self) -> Curve {
        Curve {
            n: self.first.len(),
            entries: self.entries,
            first: encode::f64s(&self.first),
            reserved: encode::f64s(&self.reserved),
            allocated: encode::f64s(&self.allocated),
        }
    }
}

/// A prediction's curve from [`fragscope_predict::Program::predict_observed`]'s
/// levels: each entry's reserved and allocated bytes after it, and, when a peak rose
/// during the entry, that peak (so the highest bucket is the replay's peak).
pub struct PredictedCurve {
    b: CurveBuilder,
    peaks: [u64; 2],
}

impl PredictedCurve {
    /// For a template trace of `entries` entries.
    pub fn new(entries: usize, buckets: usize) -> Self {
        PredictedCurve { b: CurveBuilder::new(entries, buckets), peaks: [0, 0] }
    }

    /// `levels` after entry `i`: `[reserved, allocated, peak reserved, peak allocated]`.
    pub fn observe(&mut self, i: usize, levels: [u64; 4]) {
        let [r, a, pr, pa] = levels;
        let r = if pr > self.peaks[0] { pr } else { r };
        let a = if pa > self.peaks[1] { pa } else { a };
        self.peaks = [self.peaks[0].max(pr), self.peaks[1].max(pa)];
        self.b.level(i, r, a);
    }

    pub fn finish(self) -> Curve {
        self.b.finish()
    }
}

/// A recording's curves: the timeline's levels at every state (before the first entry,
/// then after each), in at most `buckets` buckets.
pub fn recorded_curve(snap: &Snapshot, device: i64, buckets: usize) -> Curve {
    let states = snap.trace(device).len() + 1;
    let mut b = CurveBuilder::new(states, buckets);
    timeline_walk(
        snap,
        device,
        &TimelineOptions { points: 1 },
        &mut OnLevels(|s, l| b.level(s, l.reserved, l.allocated)),
    );
    b.finish()
}

/// A recording on the page.
#[derive(Serialize)]
pub struct Recorded {
    pub file: String,
    pub size: u64,
    pub device: i64,
    /// `None` when the page's curve budget was spent ([`MAX_CURVES`]).
    pub curve: Option<Curve>,
}

/// A prediction on the page: `predict --json`'s object and its curve.
#[derive(Serialize)]
pub struct Predicted {
    pub prediction: serde_json::Value,
    /// The recording whose trace was replayed with the fitted sizes.
    pub template_size: u64,
    pub curve: Option<Curve>,
}

/// Everything the predict page shows.
#[derive(Serialize)]
pub struct PredictPage {
    /// `predict --json`'s document (fits, predictions, max_fit), for the tables.
    pub json: serde_json::Value,
    pub recorded: Vec<Recorded>,
    pub predicted: Vec<Predicted>,
    /// What the curve budget left out, in words.
    pub note: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The buckets cover every position once, and the highest bucket is the highest
    /// level, peaks inside an entry included.
    #[test]
    fn curves_keep_the_peak_in_their_buckets() {
        let mut rng = fragscope_testdata::Rng(3);
        for _ in 0..200 {
            let entries = 1 + rng.below(500);
            let buckets = 1 + rng.below(80);
            let mut c = PredictedCurve::new(entries, buckets);
            let (mut peak_r, mut peak_a, mut cur) = (0u64, 0u64, 0u64);
            for i in 0..entries {
                cur = (cur + rng.below(100) as u64).saturating_sub(rng.below(100) as u64);
                // Sometimes a higher level inside the entry, gone after it.
                let inside = cur + if rng.below(10) == 0 { 50 + rng.below(100) as u64 } else { 0 };
                peak_r = peak_r.max(inside);
                peak_a = peak_a.max(cur);
                c.observe(i, [cur, cur, peak_r, peak_a]);
            }
            let b = c.b;
            let max = |v: &[f64]| v.iter().cloned().fold(0.0f64, f64::max) as u64;
            assert_eq!(max(&b.reserved), peak_r);
            assert_eq!(max(&b.allocated), peak_a);
            assert!(b.reserved.iter().all(|x| !x.is_nan()), "every bucket has an entry");
            assert_eq!(b.first[0], 0.0);
        }
    }
}
