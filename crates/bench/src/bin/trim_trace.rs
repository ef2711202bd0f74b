//! Keep only the last entries of every device's trace, as PyTorch's ring buffer
//! (`_record_memory_history(max_entries=N)`) or a recording turned on mid-run would:
//! the allocator state at the new first entry (tensors already live, cached blocks,
//! mapped expandable ranges) is then known only from the final `segments` and the
//! entries that follow. Used to make real traces that begin mid-run from real traces
//! recorded from the start (issue 21: replays seeded with the state before the trace).
//!
//! `cargo run --release -p fragscope-bench --bin trim_trace -- IN OUT FRACTION`
//! drops the first FRACTION (0..1) of each device's entries.

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 4 {
        eprintln!("usage: trim_trace IN OUT FRACTION");
        std::process::exit(2);
    }
    let frac: f64 = match args[3].parse() {
        Ok(f) if (0.0..1.0).contains(&f) => f,
        _ => {
            eprintln!("trim_trace: FRACTION must be in [0, 1)");
            std::process::exit(2);
        }
    };
    let mut snap = match fragscope_snapshot::read_path(std::path::Path::new(&args[1])) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("trim_trace: {}: {e}", args[1]);
            std::process::exit(2);
        }
    };
    for t in &mut snap.device_traces {
        let cut = (t.len() as f64 * frac) as usize;
        t.drain(..cut);
    }
    let mut out = Vec::new();
    fragscope_snapshot::pickle::write::write_snapshot(&snap, &mut out).expect("writing to memory");
    if let Err(e) = std::fs::write(&args[2], out) {
        eprintln!("trim_trace: {}: {e}", args[2]);
        std::process::exit(2);
    }
}
