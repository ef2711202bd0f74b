//! Speed of the allocator lab's policies on a long workload:
//!
//!     cargo run --release -p fragscope-bench --bin lab_bench -- FILE [REPEAT] [POLICY...]
//!
//! The workload of FILE's device 0 repeated REPEAT times (default 277, the repetition of
//! bench/make_large_snapshot.py), each repetition freeing at its end the blocks it left
//! live, as a training loop's iterations do (the repeated snapshot instead keeps them live
//! forever: its live bytes grow with every repetition). Prints, per policy, the CPU
//! seconds of serving it (construction, i.e. the plan, included), trace events per
//! CPU-second (the repetition's trace events count as REPEAT × the file's), and the peak
//! ratio.

use fragscope_alloc::policy::{drive, Op, Workload};
use fragscope_replay::{parse_policy, thread_cpu_seconds, workload_of};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(path) = args.first() else {
        eprintln!("usage: lab_bench FILE [REPEAT] [POLICY...]");
        std::process::exit(2);
    };
    let repeat: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(277);
    let names: Vec<String> = if args.len() > 2 { args[2..].to_vec() } else { vec!["all".into()] };
    let snap = fragscope_snapshot::read_path(std::path::Path::new(path)).unwrap_or_else(|e| {
        eprintln!("error: {e}");
        std::process::exit(2)
    });
    let one = workload_of(&snap, 0).workload;
    let events = snap.trace(0).len() * repeat;
    let mut w = Workload::new();
    for _ in 0..repeat {
        let mut ids: Vec<Option<u32>> = vec![None; one.requests as usize];
        for op in &one.ops {
            match *op {
                Op::Malloc { id, size, stream, site } => ids[id as usize] = Some(w.malloc(size, stream, site)),
                Op::Probe { size, stream, site, .. } => {
                    w.probe(size, stream, site);
                }
                Op::Free { id } => {
                    if let Some(n) = ids[id as usize].take() {
                        w.free(n);
                    }
                }
            }
        }
        for n in ids.into_iter().flatten() {
            w.free(n);
        }
    }
    let b = w.bounds();
    println!(
        "{path} x{repeat}: {} ops, {} requests, {events} trace events, peak live {} B",
        w.ops.len(),
        w.requests,
        b.live
    );
    let snap_cfg = fragscope_replay::recorded_config(&snap);
    for name in &names {
        for spec in parse_policy(name).unwrap_or_else(|e| {
            eprintln!("error: {e}");
            std::process::exit(2)
        }) {
            let c0 = thread_cpu_seconds().unwrap_or(0.0);
            let mut p = fragscope_replay::make_policy(&spec, &snap_cfg, &w, 1 << 50);
            let r = drive(p.as_mut(), &w, false, 0).expect("drive");
            let cpu = thread_cpu_seconds().unwrap_or(0.0) - c0;
            println!(
                "{:<34} cpu {:>7.2} s  {:>6.2} M events/CPU-s  peak reserved / live {:.4}",
                p.name(),
                cpu,
                events as f64 / cpu / 1e6,
                r.peak_reserved as f64 / b.live as f64
            );
        }
    }
}
