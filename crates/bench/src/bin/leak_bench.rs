//! Leak-detection speed, on CPU time (the machine's wall clock is shared and noisy):
//!
//! `cargo run --release -p fragscope-bench --bin leak_bench -- [--reps N] FILE...`
//!
//! Each file is read once, then [`leaks_device`]
//! runs N times (default 3) on each device with a trace, with a peak of 0 as `analyze`
//! calls it. One line per file and device: `RESULT file=... device=... events=...
//! best_cpu_s=... suspects=... steps=SOURCE:COUNT`.
use fragscope_diagnose::leaks_device;

/// CPU seconds of this thread (user + system, from `/proc/thread-self/stat`, in clock
/// ticks of 10 ms: take the best of several repetitions of runs well over that).
fn cpu_s() -> f64 {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap_or_default();
    // Fields after the command name (which may hold spaces): utime and stime are the
    // 12th and 13th of them.
    let rest = stat.rsplit_once(')').map_or("", |x| x.1);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let tick = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (tick(11) + tick(12)) / 100.0
}

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut reps = 3usize;
    if let Some(p) = args.iter().position(|a| a == "--reps") {
        reps = args.get(p + 1).and_then(|v| v.parse().ok()).unwrap_or(3);
        args.drain(p..(p + 2).min(args.len()));
    }
    for f in &args {
        let snap = match fragscope_snapshot::read_path(std::path::Path::new(f)) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("error: {f}: {e}");
                std::process::exit(2);
            }
        };
        for d in snap.devices() {
            let events = snap.trace(d).len();
            if events == 0 {
                continue;
            }
            let mut best = f64::MAX;
            let mut last = None;
            for _ in 0..reps.max(1) {
                let t = cpu_s();
                let l = leaks_device(&snap, d);
                best = best.min(cpu_s() - t);
                last = Some(l);
            }
            let l = last.unwrap();
            println!(
                "RESULT file={f} device={d} events={events} best_cpu_s={best:.3} suspects={} steps={}:{}",
                l.suspects.len(),
                l.steps.source,
                l.steps.steps
            );
        }
    }
}
