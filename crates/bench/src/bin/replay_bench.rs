//! Replay speed, on CPU time (this machine's wall clock is shared and noisy):
//!
//! `cargo run --release -p fragscope-bench --bin replay_bench -- [--mode M] [--min-events N] FILE...`
//!
//! Each file is read once (timed apart), then its replayable devices are replayed in a
//! loop until at least N trace events (default 5 M) have gone through. Modes:
//!
//! * `verify` (default): [`verify`](fragscope_replay::verify) — walk of the
//!   segments alive at entry 0 (the full backward walk when the strict replay gives up),
//!   seeding, forward replay comparing every decision, final-state comparison;
//! * `simulate`: [`simulate`](fragscope_replay::simulate) under the recorded
//!   settings (synthetic addresses; includes the verify pass it builds on);
//! * `walk`: the full backward walk alone (what `verify` falls back on; `oom` analysis uses it);
//! * `table`: memory_summary's table ([`memory_table`](fragscope_replay::memory_table),
//!   `summary`'s backward walk with the block layout); `matched` = 1 when it was built by the
//!   walk itself, 0 when by the fallback replay or when there is none.
//!
//! events/s = trace events replayed / CPU seconds of the replay loop
//! (`CLOCK_PROCESS_CPUTIME_ID`), excluding reading. One machine-readable line per file:
//! `RESULT file=... mode=... events=... reps=... read_cpu_s=... replay_cpu_s=...
//! events_per_s=... rss_after_read_mb=... peak_rss_mb=... allocs=... matched=...`.
use fragscope_replay as replay;

#[repr(C)]
struct Timespec {
    sec: i64,
    nsec: i64,
}

extern "C" {
    fn clock_gettime(clk: i32, ts: *mut Timespec) -> i32;
}

/// CPU seconds used by this process (all threads).
fn cpu_seconds() -> f64 {
    const CLOCK_PROCESS_CPUTIME_ID: i32 = 2;
    let mut ts = Timespec { sec: 0, nsec: 0 };
    // SAFETY: plain libc call with a valid out pointer.
    unsafe { clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    ts.sec as f64 + ts.nsec as f64 * 1e-9
}

/// Peak resident set (VmHWM) in MB.
fn peak_rss_mb() -> f64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb * 1024.0 / 1e6)
}

fn main() {
    let mut mode = "verify".to_string();
    let mut min_events = 5_000_000usize;
    let mut files = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--mode" => mode = args.next().expect("--mode verify|simulate|walk|table"),
            "--min-events" => min_events = args.next().and_then(|v| v.parse().ok()).expect("--min-events N"),
            _ => files.push(a),
        }
    }
    for p in files {
        let t0 = cpu_seconds();
        let snap = fragscope_snapshot::read_path(p.as_ref()).expect("readable snapshot");
        let read_cpu = cpu_seconds() - t0;
        let rss_after_read = peak_rss_mb();
        let devs = replay::replayable_devices(&snap);
        let per: usize = devs.iter().map(|&d| snap.trace(d).len()).sum();
        if per == 0 {
            continue;
        }
        let (mut events, mut reps, mut allocs, mut matched) = (0usize, 0usize, 0u64, 0u64);
        let t = cpu_seconds();
        while events < min_events.max(1) {
            for &d in &devs {
                match mode.as_str() {
                    "verify" => {
                        let r = replay::verify(&snap, d, &Default::default());
                        allocs = r.allocs;
                        matched = r.allocs_matched;
                        std::hint::black_box(&r);
                    }
                    "simulate" => {
                        let c = replay::recorded_config(&snap);
                        let r = replay::simulate(&snap, d, c, None);
                        std::hint::black_box(&r);
                    }
                    "walk" => {
                        let c = replay::recorded_config(&snap);
                        let round = |n: u64| fragscope_alloc::rounding::round_size(n, &c);
                        let rules = replay::SplitRules {
                            round: &round,
                            max_split_size: c.max_split_size,
                            max_non_split_rounding: c.max_non_split_rounding,
                        };
                        let fin = replay::RecordedState::from_snapshot(&snap, d);
                        let home = |e: &fragscope_snapshot::TraceEvent| replay::home_of(&snap, e);
                        let r = replay::backward_walk(fin, snap.trace(d), &home, &rules);
                        std::hint::black_box(&r.is_ok());
                    }
                    "table" => {
                        let (t, by_walk) = fragscope_replay::memory_table_noted(&snap, d);
                        allocs = t.as_ref().map_or(0, |t| t.allocations.all.allocated);
                        matched = by_walk as u64;
                        std::hint::black_box(&t);
                    }
                    m => panic!("unknown mode {m}"),
                }
            }
            events += per;
            reps += 1;
        }
        let s = cpu_seconds() - t;
        let name = p.rsplit('/').next().unwrap();
        println!(
            "{name:<50} {mode:<8} {per:>8} events x {reps:>3}: {:>6.2} M events/CPU-s (read {read_cpu:.2} CPU-s, peak RSS {:.0} MB)",
            events as f64 / s / 1e6,
            peak_rss_mb()
        );
        println!(
            "RESULT file={name} mode={mode} events={per} reps={reps} read_cpu_s={read_cpu:.4} replay_cpu_s={s:.4} \
             events_per_s={:.0} rss_after_read_mb={rss_after_read:.1} peak_rss_mb={:.1} allocs={allocs} matched={matched}",
            events as f64 / s,
            peak_rss_mb()
        );
    }
}
