//! Independent jobs on a few threads: the replays of several allocator settings over one
//! trace (each a whole walk of the trace through the allocator model, seconds on a long
//! one) have nothing to share but the snapshot they read.

/// `f(0) .. f(n - 1)`, in that order, computed on up to `threads` threads that take the
/// next job as they finish one (the jobs' costs differ: a setting that never frees
/// replays faster). One thread, or one job: in the caller's thread.
pub fn map<R: Send>(n: usize, threads: usize, f: impl Fn(usize) -> R + Sync) -> Vec<R> {
    let threads = threads.clamp(1, n.max(1));
    if threads == 1 {
        return (0..n).map(f).collect();
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let done = std::sync::Mutex::new(Vec::with_capacity(n));
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if k >= n {
                    break;
                }
                let r = f(k);
                done.lock().unwrap_or_else(|e| e.into_inner()).push((k, r));
            });
        }
    });
    let mut done = done.into_inner().unwrap_or_else(|e| e.into_inner());
    done.sort_unstable_by_key(|x| x.0);
    done.into_iter().map(|x| x.1).collect()
}

/// The threads to use for such jobs: the machine's cores.
pub fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

#[cfg(test)]
mod tests {
    #[test]
    fn results_come_in_job_order_whatever_the_threads() {
        for threads in [0, 1, 2, 3, 8] {
            for n in [0, 1, 2, 7, 50] {
                let got = super::map(n, threads, |k| {
                    // Later jobs finish first on several threads.
                    std::thread::sleep(std::time::Duration::from_micros(((n - k) * 50) as u64));
                    k * k
                });
                assert_eq!(got, (0..n).map(|k| k * k).collect::<Vec<_>>(), "n {n}, threads {threads}");
            }
        }
    }
}
