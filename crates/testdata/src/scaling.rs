//! Scaling tests: the same input shape at n and 4n, timed, must grow about linearly.
//! Linear work takes ×4 (×4.6 with a log factor), quadratic ×16; [`MAX_RATIO`] leaves
//! room for a loaded CI machine. Best of three runs each, so that a busy machine's pauses
//! do not count.

use std::time::{Duration, Instant};

/// 4× the input must cost less than this many times the time (the quadratic code issue 43
/// found measured ×11–20 in these tests).
pub const MAX_RATIO: f64 = 8.0;

/// The shortest of three runs of `run` (which checks its own result).
pub fn best_of_three(mut run: impl FnMut()) -> Duration {
    (0..3)
        .map(|_| {
            let t = Instant::now();
            run();
            t.elapsed()
        })
        .min()
        .unwrap_or_default()
}

/// Fails unless `measure` (timing the input at `n` `what` and at 4n) finds the larger one
/// took less than [`MAX_RATIO`] times the smaller in one of three tries: a loaded machine
/// can stall one measurement (a test once failed so under load, then passed twice), while
/// quadratic work fails every try.
pub fn assert_linear(what: &str, n: u64, mut measure: impl FnMut() -> (Duration, Duration)) {
    let mut tries = Vec::new();
    for _ in 0..3 {
        let (t1, t4) = measure();
        let r = t4.as_secs_f64() / t1.as_secs_f64().max(1e-4);
        if r < MAX_RATIO {
            return;
        }
        tries.push(format!("{t1:?} → {t4:?}: ×{r:.1}"));
    }
    panic!("{n} {what} → {} {what}, in each of 3 tries: {}; not linear", 4 * n, tries.join("; "));
}
