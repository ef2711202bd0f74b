//! Times `summary`'s analysis (what follows the read) in process, on a snapshot loaded
//! once: [`summarize`](fragscope_trace::summarize) as `fragscope summary`
//! runs it (its threads side by side), wall and CPU seconds, best of REPEAT; then, one
//! thread each, the parts its threads run, so that a change to one part can be judged
//! on its own (device 0 only):
//!
//! * `lives`: the lifetime walk ([`BlockLives::replay`](fragscope_trace::BlockLives::replay));
//! * `steps`: the steps ([`steps`](fragscope_trace::steps));
//! * `roles`: the roles from the lives and the steps
//!   ([`device_roles_from`](fragscope_trace::device_roles_from));
//! * `table`: memory_summary's table ([`memory_table`](fragscope_replay::memory_table)).
//!
//! usage: cargo run --release -p fragscope-bench --bin summary_times -- FILE \[REPEAT\]
//!        (ONLY=summary: the summary alone; REPEAT 0: the load alone; NO_AHEAD=1: the
//!        file read without the helper that maps it ahead of the reader)

use std::time::Instant;

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

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (file, repeat) = match args.as_slice() {
        [_, f] => (f, 3),
        [_, f, r] => (f, r.parse().expect("REPEAT must be a number")),
        _ => {
            eprintln!("usage: summary_times FILE [REPEAT]");
            std::process::exit(2);
        }
    };
    if std::env::var_os("NO_AHEAD").is_some() {
        fragscope_snapshot::set_ahead_min(usize::MAX);
    }
    let t = Instant::now();
    let snap = fragscope_snapshot::read_path(std::path::Path::new(file)).unwrap_or_else(|e| {
        eprintln!("summary_times: {file}: {e}");
        std::process::exit(2)
    });
    println!("load      {:.3} s", t.elapsed().as_secs_f64());
    // `perf stat` of a run with ONLY=summary less one with REPEAT 0 (the load alone):
    // the summary's instructions.
    let only_summary = std::env::var("ONLY").is_ok_and(|v| v == "summary");
    if repeat == 0 {
        return;
    }
    // Best wall and best CPU seconds of REPEAT runs of `f`.
    let best = |label: &str, f: &mut dyn FnMut()| {
        let (mut wall, mut cpu) = (f64::INFINITY, f64::INFINITY);
        for _ in 0..repeat {
            let (t, c) = (Instant::now(), cpu_seconds());
            f();
            wall = wall.min(t.elapsed().as_secs_f64());
            cpu = cpu.min(cpu_seconds() - c);
        }
        println!("{label:9} {wall:.3} s wall  {cpu:.3} s cpu");
    };
    best("summary", &mut || {
        std::hint::black_box(fragscope_trace::summarize(&snap));
    });
    if only_summary {
        return;
    }
    let d = 0;
    let mut lives = None;
    best("lives", &mut || {
        lives = Some(fragscope_trace::BlockLives::replay(&snap, d));
    });
    let mut st = None;
    best("steps", &mut || {
        st = Some(fragscope_trace::steps(&snap, d));
    });
    if let (Some(lives), Some(st)) = (&lives, &st) {
        best("roles", &mut || {
            std::hint::black_box(fragscope_trace::device_roles_from(&snap, lives, st));
        });
    }
    best("table", &mut || {
        std::hint::black_box(fragscope_replay::memory_table(&snap, d).is_ok());
    });
}
