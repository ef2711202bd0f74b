//! Leak suspects: call sites whose live bytes grow from one iteration to the next.
//!
//! # Iterations
//!
//! 1. From `external_annotations` (`record_function` scopes) when the trace has times:
//!    the scope name that starts most often at the top level (no other scope open), if
//!    it starts at least [`MIN_ITERATIONS`] times. Names ending in `#<digits>`
//!    (`ProfilerStep#12`) are counted as one name (`ProfilerStep#N`). Iteration *k* starts
//!    at the first trace entry at or after the scope's *k*-th START. Nested scopes
//!    (`pad_mm_benchmark` inside a `torch.compile`, a per-layer scope inside `forward`)
//!    are not iterations and are ignored.
//! 2. Otherwise from the trace's periodicity: each `alloc` gets a signature (request
//!    size, allocation stack). Candidate periods are the most common gaps between two
//!    occurrences of the same signature; the period is the smallest candidate whose
//!    autocorrelation (share of positions *i* with `sig[i] == sig[i + p]`) is within 5% of
//!    the best one and at least [`MIN_AUTOCORRELATION`]. Taking the smallest near-best
//!    lag skips multiples of the period; requiring near-best skips sub-periods such as a
//!    transformer layer, which match only inside the layer stack. Boundaries are the
//!    occurrences of one anchor signature, the one whose gaps equal the period most
//!    often (earliest on ties), so the phase stays put even when an iteration has a few
//!    extra allocations.
//!
//! # Suspects
//!
//! At each boundary (the state just before the iteration's first entry) live bytes are
//! summed per call site (innermost user frame, see [`crate::attribution`]; the same
//! `allocated` set and block sizes as [`crate::timeline`]). With samples y₀…y_K, a site is
//! a suspect when
//! * it grows (y_{j+1} > y_j) in at least 75% of the K steps,
//! * y_K > y₀, and
//! * at the end of the trace it still holds at least half of that growth (what the
//!   backward pass gives back was activations, not a leak), and
//! * the least-squares slope is at least the threshold: min(1 MiB, 1% of the device's
//!   peak allocated) per iteration.
//!
//! `confidence` = (share of growing steps) × R² of the linear fit, in 0–1.
//!
//! Periodicity cannot tell the steps of a training loop from the layers of a single
//! forward pass (same code, same sizes, repeated): with autograd on, every layer keeps
//! its activations, which looks like a leak per "iteration". So when iterations come
//! from periodicity and, between the first and last boundary, live bytes grow by more
//! than [`MAX_RETAINED_SHARE`] of the bytes allocated, nothing is reported and
//! `iterations.reason` says why (`retained_share` gives the figure). A real step frees
//! its temporaries; a leak keeps a small part of what a step allocates. And a suspect
//! found over periodicity-derived iterations counts only if the rest of memory is steady
//! across the boundaries (slope at most [`MAX_REST_TREND`] of the suspect's): in the
//! backward pass of one step, gradients grow layer by layer while activations shrink.
//! Memory: one u32 signature per `alloc` for the periodicity search, and one counter per
//! site per boundary (boundaries are thinned evenly to at most [`MAX_SAMPLES`]).

use fragscope_snapshot::{Action, FxHashMap, Snapshot, StackId, NO_TIME};
use serde::Serialize;

use crate::attribution::{Scopes, Site, SiteTable};
use crate::timeline::{self, Replayer, TimelineOptions};

/// With periodicity-derived iterations, the rest of memory may trend by at most this
/// share of a suspect's own growth per iteration (see `leaks_device`).
pub const MAX_REST_TREND: f64 = 0.25;
/// Fewest iterations worth analysing.
pub const MIN_ITERATIONS: usize = 3;
/// Weakest autocorrelation accepted as a period.
pub const MIN_AUTOCORRELATION: f64 = 0.5;
/// Boundaries sampled at most.
pub const MAX_SAMPLES: usize = 4096;
/// Periodicity-derived iterations that keep more than this share of what they
/// allocate are a build-up, not steps (see [`leaks_device`]).
pub const MAX_RETAINED_SHARE: f64 = 0.5;
/// Share of growing steps a suspect needs.
pub const MIN_GROWING_SHARE: f64 = 0.75;

/// How the iterations were found.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Iterations {
    /// `"annotation"`, `"periodicity"` or `"none"`.
    pub source: &'static str,
    /// The scope name (annotation source).
    pub scope: Option<String>,
    /// Period in `alloc` entries and its autocorrelation (periodicity source).
    pub period_allocs: Option<usize>,
    pub autocorrelation: Option<f64>,
    /// Trace index of each iteration's first entry.
    pub boundaries: Vec<usize>,
    /// Why none were found (`source` `"none"`), or why suspects were not reported.
    pub reason: Option<String>,
    /// (Live bytes at the last boundary − at the first) / bytes allocated in between.
    pub retained_share: Option<f64>,
}

/// A call site whose live bytes grow across iterations.
#[derive(Clone, Debug, Serialize)]
pub struct LeakSuspect {
    /// `site` (`file:line:function`), `file`, `line`, `function`, `stack` (folded).
    #[serde(flatten)]
    pub site: Site,
    /// Slope of the least-squares line through the per-iteration live bytes.
    pub growth_bytes_per_iteration: u64,
    /// Samples the fit used (iteration boundaries).
    pub iterations: usize,
    /// Share of growing steps × R², 0–1.
    pub confidence: f64,
    pub growing_steps: usize,
    pub r_squared: f64,
    /// Live bytes of the site at the first and last boundary.
    pub first_bytes: u64,
    pub last_bytes: u64,
}

/// Leak analysis of one device.
#[derive(Clone, Debug, Serialize)]
pub struct DeviceLeaks {
    pub device: i64,
    pub iterations: Iterations,
    /// Smallest slope reported, bytes per iteration.
    pub threshold_bytes_per_iteration: u64,
    /// Most growth first.
    pub suspects: Vec<LeakSuspect>,
}

fn normalize_scope(name: &str) -> String {
    if let Some(p) = name.rfind('#') {
        let tail = &name[p + 1..];
        if !tail.is_empty() && tail.bytes().all(|b| b.is_ascii_digit()) {
            return format!("{}#N", &name[..p]);
        }
    }
    name.to_string()
}

fn from_annotations(snap: &Snapshot, device: i64) -> Option<Iterations> {
    let trace = snap.trace(device);
    if trace.is_empty() || trace.iter().any(|e| e.time_us == NO_TIME) {
        return None;
    }
    let scopes = Scopes::new(snap, device);
    let mut starts: FxHashMap<String, Vec<i64>> = FxHashMap::default();
    for (s, _, n, depth) in scopes.occurrences() {
        if depth == 0 && s != i64::MIN {
            starts.entry(normalize_scope(&scopes.names[n])).or_default().push(s);
        }
    }
    let (name, times) = starts
        .into_iter()
        .filter(|(_, v)| v.len() >= MIN_ITERATIONS)
        .max_by(|a, b| a.1.len().cmp(&b.1.len()).then_with(|| b.0.cmp(&a.0)))?;
    let mut boundaries: Vec<usize> =
        times.iter().map(|&t| trace.partition_point(|e| e.time_us < t)).filter(|&i| i < trace.len()).collect();
    boundaries.dedup();
    (boundaries.len() >= MIN_ITERATIONS).then(|| Iterations {
        source: "annotation",
        scope: Some(name),
        boundaries,
        ..Iterations::default()
    })
}

fn from_periodicity(snap: &Snapshot, device: i64) -> Result<Iterations, String> {
    let trace = snap.trace(device);
    // Signatures of allocs, interned to small ids.
    let mut ids: FxHashMap<(u64, Option<StackId>), u32> = FxHashMap::default();
    let mut seq: Vec<u32> = Vec::new();
    let mut pos: Vec<usize> = Vec::new(); // trace index of each alloc
    for (i, e) in trace.iter().enumerate() {
        if e.action == Action::Alloc {
            let n = ids.len() as u32;
            seq.push(*ids.entry((e.size, e.stack)).or_insert(n));
            pos.push(i);
        }
    }
    let n = seq.len();
    if n < 2 * MIN_ITERATIONS {
        return Err(format!("{n} allocations are too few to find iterations"));
    }
    // Gap histogram between consecutive occurrences of each signature.
    let mut last: Vec<usize> = vec![usize::MAX; ids.len()];
    let mut gaps: FxHashMap<usize, u64> = FxHashMap::default();
    for (i, &s) in seq.iter().enumerate() {
        let l = last[s as usize];
        if l != usize::MAX && i - l <= n / MIN_ITERATIONS {
            *gaps.entry(i - l).or_default() += 1;
        }
        last[s as usize] = i;
    }
    let mut cand: Vec<(usize, u64)> = gaps.into_iter().collect();
    cand.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    cand.truncate(24);
    if cand.is_empty() {
        return Err("no allocation repeats".into());
    }
    let ac = |p: usize| {
        let m = n - p;
        let same = (0..m).filter(|&i| seq[i] == seq[i + p]).count();
        same as f64 / m as f64
    };
    let scored: Vec<(usize, f64)> = cand.iter().map(|&(p, _)| (p, ac(p))).collect();
    let best = scored.iter().map(|s| s.1).fold(0.0, f64::max);
    if best < MIN_AUTOCORRELATION {
        return Err(format!("no periodic pattern (best autocorrelation {best:.2})"));
    }
    let (period, corr) = scored.iter().filter(|s| s.1 >= best * 0.95).min_by_key(|s| s.0).copied().unwrap();
    // Anchor: the signature whose consecutive gaps equal the period most often.
    let mut hits: Vec<(u32, u32, usize)> = vec![(0, 0, usize::MAX); ids.len()]; // (exact gaps, count, first)
    let mut last = vec![usize::MAX; ids.len()];
    for (i, &s) in seq.iter().enumerate() {
        let h = &mut hits[s as usize];
        let l = last[s as usize];
        if l == usize::MAX {
            h.2 = i;
        } else if i - l == period {
            h.0 += 1;
        }
        h.1 += 1;
        last[s as usize] = i;
    }
    // Most exact gaps, but a signature that also repeats inside the period (more
    // occurrences than gaps of one period) is a worse anchor.
    let anchor = (0..ids.len())
        .max_by(|&a, &b| {
            let (x, y) = (hits[a], hits[b]);
            let score = |h: (u32, u32, usize)| h.0 as i64 * 2 - h.1 as i64;
            score(x).cmp(&score(y)).then(y.2.cmp(&x.2))
        })
        .unwrap() as u32;
    let boundaries: Vec<usize> = seq.iter().enumerate().filter(|(_, &s)| s == anchor).map(|(i, _)| pos[i]).collect();
    if boundaries.len() < MIN_ITERATIONS {
        return Err(format!("period of {period} allocations repeats fewer than {MIN_ITERATIONS} times"));
    }
    Ok(Iterations {
        source: "periodicity",
        scope: None,
        period_allocs: Some(period),
        autocorrelation: Some(corr),
        boundaries,
        reason: None,
        retained_share: None,
    })
}

/// The iterations of one device's trace (module doc).
pub fn iterations(snap: &Snapshot, device: i64) -> Iterations {
    if let Some(it) = from_annotations(snap, device) {
        return it;
    }
    match from_periodicity(snap, device) {
        Ok(it) => it,
        Err(reason) => Iterations { source: "none", reason: Some(reason), ..Iterations::default() },
    }
}

/// Live bytes per site at each boundary: (site table, samples[boundary][site]).
/// Also returns the bytes allocated between the first and the last boundary.
pub(crate) fn site_bytes_at(snap: &Snapshot, device: i64, boundaries: &[usize]) -> (SiteTable, Vec<Vec<u64>>, u64) {
    let mut r = Replayer::new(snap, device);
    let mut table = SiteTable::default();
    let mut bytes: Vec<i128> = Vec::new();
    // Blocks live at t = 0.
    for b in r.live.values().filter(|b| b.allocated) {
        let i = table.of_block(&snap.frames, b.stack, b.before_trace());
        if bytes.len() <= i {
            bytes.resize(i + 1, 0);
        }
        bytes[i] += b.size as i128;
    }
    let mut samples = Vec::with_capacity(boundaries.len());
    let mut state = 0usize;
    let mut allocated_between = 0u64;
    let first = boundaries.first().copied().unwrap_or(0);
    let frames = &snap.frames;
    for &b in boundaries {
        while state < b.min(r.trace.len()) {
            r.step(state, &mut |blk, sign| {
                let i = table.of_block(frames, blk.stack, blk.before_trace());
                if bytes.len() <= i {
                    bytes.resize(i + 1, 0);
                }
                bytes[i] += sign as i128 * blk.size as i128;
                if sign > 0 && state >= first {
                    allocated_between += blk.size;
                }
            });
            state += 1;
        }
        samples.push(bytes.iter().map(|&v| v.max(0) as u64).collect());
    }
    // One more sample: the end of the trace (see `leaks_device`).
    while state < r.trace.len() {
        r.step(state, &mut |blk, sign| {
            let i = table.of_block(frames, blk.stack, blk.before_trace());
            if bytes.len() <= i {
                bytes.resize(i + 1, 0);
            }
            bytes[i] += sign as i128 * blk.size as i128;
        });
        state += 1;
    }
    samples.push(bytes.iter().map(|&v| v.max(0) as u64).collect());
    (table, samples, allocated_between)
}

/// Least squares of y against 0..n: (slope, R²).
fn fit(y: &[f64]) -> (f64, f64) {
    let n = y.len() as f64;
    let mx = (n - 1.0) / 2.0;
    let my = y.iter().sum::<f64>() / n;
    let (mut sxy, mut sxx, mut syy) = (0.0, 0.0, 0.0);
    for (i, &v) in y.iter().enumerate() {
        let dx = i as f64 - mx;
        let dy = v - my;
        sxy += dx * dy;
        sxx += dx * dx;
        syy += dy * dy;
    }
    if sxx == 0.0 {
        return (0.0, 0.0);
    }
    let slope = sxy / sxx;
    let r2 = if syy == 0.0 { 0.0 } else { (sxy * sxy) / (sxx * syy) };
    (slope, r2)
}

/// Leak suspects of one device; `peak_allocated` sets the threshold (module doc).
pub fn leaks_device(snap: &Snapshot, device: i64, peak_allocated: u64) -> DeviceLeaks {
    let threshold = (1u64 << 20).min(peak_allocated / 100).max(1);
    let mut it = iterations(snap, device);
    let mut suspects = Vec::new();
    if it.boundaries.len() >= MIN_ITERATIONS {
        // Thin evenly to at most MAX_SAMPLES boundaries.
        let b = &it.boundaries;
        let used: Vec<usize> = if b.len() <= MAX_SAMPLES {
            b.clone()
        } else {
            (0..MAX_SAMPLES).map(|k| b[k * (b.len() - 1) / (MAX_SAMPLES - 1)]).collect()
        };
        let (table, mut samples, allocated_between) = site_bytes_at(snap, device, &used);
        let at_end = samples.pop().unwrap();
        let nsites = table.sites.len();
        // A "period" that keeps most of what it allocates is a stack of layers in one
        // forward pass (saved activations) or a loading phase, not a training step:
        // a step frees its temporaries, and a leak keeps a small part of them.
        let total = |row: &Vec<u64>| row.iter().sum::<u64>() as f64;
        let kept = total(samples.last().unwrap()) - total(&samples[0]);
        let retained = if allocated_between == 0 { 0.0 } else { kept / allocated_between as f64 };
        it.retained_share = Some(retained);
        let builds_up = it.source == "periodicity" && retained > MAX_RETAINED_SHARE;
        if builds_up {
            it.reason = Some(format!(
                "each period keeps {:.0}% of the bytes it allocates: a build-up (layers of one pass, loading), not repeated steps; no suspects reported",
                retained * 100.0
            ));
        }
        for s in (0..nsites).filter(|_| !builds_up) {
            let y: Vec<u64> = samples.iter().map(|row| row.get(s).copied().unwrap_or(0)).collect();
            let steps = y.len() - 1;
            let growing = y.windows(2).filter(|w| w[1] > w[0]).count();
            let share = growing as f64 / steps as f64;
            // Growth handed back before the trace ends (activations freed by the
            // backward pass) is not a leak: keep at least half of it at the end.
            let end = at_end.get(s).copied().unwrap_or(0);
            if share < MIN_GROWING_SHARE || y[steps] <= y[0] || end < y[0] + (y[steps] - y[0]) / 2 {
                continue;
            }
            let yf: Vec<f64> = y.iter().map(|&v| v as f64).collect();
            let (slope, r2) = fit(&yf);
            if slope < threshold as f64 {
                continue;
            }
            // Periodicity also finds the layers of one pass (backward: each layer frees
            // activations and keeps gradients). Across real steps everything else returns
            // to the same level at each boundary; across layers it trends. So with
            // periodicity-derived iterations, the rest of memory must be steady.
            if it.source == "periodicity" {
                let rest: Vec<f64> = samples.iter().zip(&y).map(|(row, &v)| total(row) - v as f64).collect();
                let (rest_slope, _) = fit(&rest);
                if rest_slope.abs() > (threshold as f64).max(slope * MAX_REST_TREND) {
                    continue;
                }
            }
            suspects.push(LeakSuspect {
                site: table.sites[s].clone(),
                growth_bytes_per_iteration: slope.round() as u64,
                iterations: y.len(),
                confidence: (share * r2).clamp(0.0, 1.0),
                growing_steps: growing,
                r_squared: r2,
                first_bytes: y[0],
                last_bytes: y[steps],
            });
        }
        suspects.sort_by(|a, b| {
            b.growth_bytes_per_iteration.cmp(&a.growth_bytes_per_iteration).then_with(|| a.site.site.cmp(&b.site.site))
        });
    }
    DeviceLeaks { device, iterations: it, threshold_bytes_per_iteration: threshold, suspects }
}

/// Leak suspects of every device (computes the timelines for the thresholds).
pub fn leaks(snap: &Snapshot) -> Vec<DeviceLeaks> {
    timeline::timelines(snap, &TimelineOptions { points: 1 })
        .iter()
        .map(|tl| leaks_device(snap, tl.device, tl.peak_allocated.bytes))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use fragscope_snapshot::TraceEvent;

    #[test]
    fn scope_names_with_step_numbers_are_one_name() {
        assert_eq!(normalize_scope("ProfilerStep#12"), "ProfilerStep#N");
        assert_eq!(normalize_scope("Optimizer.step#AdamW.step"), "Optimizer.step#AdamW.step");
    }

    #[test]
    fn fit_of_a_line() {
        let (s, r2) = fit(&[1.0, 3.0, 5.0, 7.0]);
        assert!((s - 2.0).abs() < 1e-12 && (r2 - 1.0).abs() < 1e-12);
    }

    /// A synthetic loop: each iteration allocates a, b (freed) and c (kept: the leak).
    fn looped(iters: usize, leak: bool) -> Snapshot {
        let mut snap = Snapshot::default();
        let mib = 1u64 << 20;
        let mut t = Vec::new();
        for k in 0..iters as u64 {
            let base = 1u64 << 32;
            t.push(TraceEvent::new(Action::Alloc, base, 4 * mib, 0));
            t.push(TraceEvent::new(Action::Alloc, base + 4 * mib, 8 * mib, 0));
            t.push(TraceEvent::new(Action::Alloc, (1 << 40) + k * 2 * mib, 2 * mib, 0));
            for a in [base, base + 4 * mib] {
                let s = if a == base { 4 * mib } else { 8 * mib };
                t.push(TraceEvent::new(Action::FreeRequested, a, s, 0));
                t.push(TraceEvent::new(Action::FreeCompleted, a, s, 0));
            }
            if !leak {
                t.push(TraceEvent::new(Action::FreeRequested, (1 << 40) + k * 2 * mib, 2 * mib, 0));
                t.push(TraceEvent::new(Action::FreeCompleted, (1 << 40) + k * 2 * mib, 2 * mib, 0));
            }
        }
        snap.device_traces.push(t);
        snap
    }

    #[test]
    fn periodicity_finds_the_loop_and_the_leak() {
        let snap = looped(10, true);
        let it = iterations(&snap, 0);
        assert_eq!(it.source, "periodicity");
        assert_eq!(it.period_allocs, Some(3));
        assert_eq!(it.boundaries.len(), 10);
        let l = leaks_device(&snap, 0, 20 << 20);
        assert_eq!(l.suspects.len(), 1, "{:?}", l.suspects);
        assert_eq!(l.suspects[0].growth_bytes_per_iteration, 2 << 20);
        assert_eq!(l.suspects[0].site.site, crate::attribution::NO_STACK);
        let steady = leaks_device(&looped(10, false), 0, 20 << 20);
        assert!(steady.suspects.is_empty());
    }
}
