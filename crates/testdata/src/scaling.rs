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

/// Fails unless `t4` (the input 4× as large as `n` `what`) took less than [`MAX_RATIO`]
/// times `t1`.
pub fn assert_linear(what: &str, n: u64, t1: Duration, t4: Duration) {
    let r = t4.as_secs_f64() / t1.as_secs_f64().max(1e-4);
    assert!(r < MAX_RATIO, "{n} {what} {t1:?}, {} {what} {t4:?}: ×{r:.1}, not linear", 4 * n);
}
