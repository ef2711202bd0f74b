//! Builds a multi-GB snapshot for the report benchmark without Python's memory cost:
//! reads SOURCE (e.g. the 6.4 M-event file of bench/make_large_snapshot.py), repeats the
//! longest device trace TIMES times with `time_us` shifted forward on each repetition, as
//! that script does, and writes it with fragscope's own pickle writer (protocol 4).
//!
//! usage: cargo run --release -p fragscope-bench --bin repeat_trace SOURCE OUT TIMES

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, src, out, times] = args.as_slice() else {
        eprintln!("usage: repeat_trace SOURCE OUT TIMES");
        std::process::exit(2);
    };
    let times: usize = times.parse().expect("TIMES must be a number");
    let mut snap = fragscope_snapshot::read_path(std::path::Path::new(src)).expect("cannot read SOURCE");
    let dev = (0..snap.device_traces.len()).max_by_key(|&d| snap.device_traces[d].len()).expect("no trace");
    let base = std::mem::take(&mut snap.device_traces[dev]);
    let timed = base.iter().filter_map(|e| e.time());
    let (lo, hi) = timed.fold((i64::MAX, i64::MIN), |(l, h), t| (l.min(t), h.max(t)));
    let span = if hi >= lo { hi - lo + 1 } else { 1 };
    let mut trace = Vec::with_capacity(base.len() * times);
    for rep in 0..times {
        trace.extend(base.iter().map(|e| {
            let mut e = *e;
            if let Some(t) = e.time() {
                e.time_us = t + rep as i64 * span;
            }
            e
        }));
    }
    let n = trace.len();
    snap.device_traces[dev] = trace;
    fragscope_snapshot::pickle::write::write_path(&snap, std::path::Path::new(out)).expect("cannot write OUT");
    let mb = std::fs::metadata(out).map(|m| m.len()).unwrap_or(0) as f64 / 1e6;
    println!("wrote {out}: {n} events on device {dev}, {mb:.0} MB");
}
