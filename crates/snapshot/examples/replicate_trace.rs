//! Builds a large snapshot for benchmarks: the longest device trace of SOURCE repeated
//! until it has EVENTS entries, `time_us` shifted forward on every repetition, written
//! with this crate's pickle writer (frames shared through the memo, as PyTorch's files
//! share them). The same file as `bench/make_large_snapshot.py` makes, without holding
//! millions of Python dicts in memory: that script's peak RSS is 2.5 GB for 6.4 M
//! entries (about 12 GB for the 32 M of a 2 GB file); this one's 1.5 GB for 32 M.
//!
//! usage: cargo run --release -p fragscope-snapshot --example replicate_trace -- SOURCE OUT EVENTS

use fragscope_snapshot::{read_path, NO_TIME};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [src, out, events] = args.as_slice() else {
        eprintln!("usage: replicate_trace SOURCE OUT EVENTS");
        std::process::exit(2);
    };
    let events: usize = events.parse().unwrap_or_else(|_| {
        eprintln!("error: EVENTS must be a number, not {events:?}");
        std::process::exit(2)
    });
    let mut snap = read_path(src.as_ref()).unwrap_or_else(|e| {
        eprintln!("error: {src}: {e}");
        std::process::exit(2)
    });
    let Some(dev) = (0..snap.device_traces.len()).max_by_key(|&d| snap.device_traces[d].len()) else {
        eprintln!("error: {src} has no trace");
        std::process::exit(2)
    };
    let base = std::mem::take(&mut snap.device_traces[dev]);
    if base.is_empty() {
        eprintln!("error: {src} has no trace events");
        std::process::exit(2);
    }
    let times = base.iter().map(|e| e.time_us).filter(|&t| t != NO_TIME);
    let span = match (times.clone().min(), times.max()) {
        (Some(lo), Some(hi)) => hi - lo + 1,
        _ => 1,
    };
    let mut trace = Vec::with_capacity(events);
    let mut rep = 0i64;
    while trace.len() < events {
        for e in base.iter().take(events - trace.len()) {
            let mut e = *e;
            if e.time_us != NO_TIME {
                e.time_us += rep * span;
            }
            trace.push(e);
        }
        rep += 1;
    }
    snap.device_traces[dev] = trace;
    if let Err(e) = fragscope_snapshot::pickle::write::write_path(&snap, out.as_ref()) {
        eprintln!("error: {out}: {e}");
        std::process::exit(2);
    }
    let mb = std::fs::metadata(out).map(|m| m.len()).unwrap_or(0) as f64 / 1e6;
    println!("wrote {out}: {events} events on device {dev}, {mb:.0} MB ({rep} repetitions of {} events)", base.len());
}
