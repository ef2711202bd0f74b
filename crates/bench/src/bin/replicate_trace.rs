//! Builds a large snapshot for benchmarks: the longest device trace of SOURCE repeated
//! until it has EVENTS entries, `time_us` shifted forward on every repetition, written
//! with this crate's pickle writer (frames shared through the memo, as PyTorch's files
//! share them). The same file as `bench/make_large_snapshot.py` makes, without holding
//! millions of Python dicts in memory: that script's peak RSS is 2.5 GB for 6.4 M
//! entries (about 12 GB for the 32 M of a 2 GB file); this one's 1.5 GB for 32 M.
//!
//! With `--loop`, what is repeated is the longest stretch of the trace that leaves the
//! allocator's state as it found it (the same blocks, of the same requests, at the same
//! addresses in the same states, the same segments: found by a running hash of the
//! state's changes), between
//! the entries before it and those after it. The result is then consistent from end to
//! start: the final state is the source's, and walking the trace backwards from it never
//! meets an entry that contradicts it, so the report's state view reaches every entry.
//! Plain repetition does not have this property (a trace seldom ends in the state it
//! started in), and cutting the last repetition short breaks even the end.
//!
//! With `--fresh-stacks`, every entry's `frames` is a list of its own (its frame dicts
//! shared through the memo), as in PyTorch's dumps, where a list is shared only by the
//! entries that hold one captured traceback: files shaped like real ones, larger per entry.
//!
//! usage: cargo run --release -p fragscope-bench --bin replicate_trace -- SOURCE OUT EVENTS [--loop] [--fresh-stacks]

use fragscope_snapshot::pickle::write::WriteOptions;
use fragscope_snapshot::{read_path, NO_TIME};

/// `--fresh-stacks`: every entry's `frames` written as a list of its own, as most entries
/// of PyTorch's own files are (see [`WriteOptions::fresh_stacks`]).
static FRESH: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let looped = args.iter().any(|a| a == "--loop");
    let fresh = args.iter().any(|a| a == "--fresh-stacks");
    FRESH.store(fresh, std::sync::atomic::Ordering::Relaxed);
    args.retain(|a| a != "--loop" && a != "--fresh-stacks");
    let [src, out, events] = args.as_slice() else {
        eprintln!("usage: replicate_trace SOURCE OUT EVENTS [--loop] [--fresh-stacks]");
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
    if looped {
        let Some((p, q)) = longest_neutral_stretch(&base) else {
            eprintln!("error: {src}: no stretch of its trace leaves the state as it found it");
            std::process::exit(2)
        };
        let times = base[p..q].iter().map(|e| e.time_us).filter(|&t| t != NO_TIME);
        let span = match (times.clone().min(), times.max()) {
            (Some(lo), Some(hi)) => hi - lo + 1,
            _ => 0,
        };
        let (len, rest) = (q - p, base.len() - (q - p));
        let reps = events.saturating_sub(rest).div_ceil(len).max(1);
        let mut trace = Vec::with_capacity(rest + reps * len);
        trace.extend_from_slice(&base[..p]);
        let shifted = |e: &fragscope_snapshot::TraceEvent, by: i64| {
            let mut e = *e;
            if e.time_us != NO_TIME {
                e.time_us += by;
            }
            e
        };
        for rep in 0..reps as i64 {
            trace.extend(base[p..q].iter().map(|e| shifted(e, rep * span)));
        }
        trace.extend(base[q..].iter().map(|e| shifted(e, (reps as i64 - 1) * span)));
        let n = trace.len();
        snap.device_traces[dev] = trace;
        write(&snap, out);
        println!("wrote {out}: {n} events on device {dev} (entries {p}..{q} of {} repeated {reps} times)", base.len());
        return;
    }
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
    write(&snap, out);
    let mb = std::fs::metadata(out).map(|m| m.len()).unwrap_or(0) as f64 / 1e6;
    println!("wrote {out}: {events} events on device {dev}, {mb:.0} MB ({rep} repetitions of {} events)", base.len());
}

fn write(snap: &fragscope_snapshot::Snapshot, out: &str) {
    let opts = WriteOptions { fresh_stacks: FRESH.load(std::sync::atomic::Ordering::Relaxed) };
    if let Err(e) = fragscope_snapshot::pickle::write::write_path_with(snap, out.as_ref(), &opts) {
        eprintln!("error: {out}: {e}");
        std::process::exit(2);
    }
}

/// The longest stretch `p..q` of entries after which the allocator's state is what it
/// was before them. The state after each entry is summarised by an XOR of one hash per
/// fact it holds (a block of some request allocated at an address, one pending free
/// there, a segment of some size at an address); an entry toggles the facts it changes, so two positions
/// with equal sums hold the same facts (up to hash collisions, which the report's state
/// walk would then show as a contradiction).
fn longest_neutral_stretch(trace: &[fragscope_snapshot::TraceEvent]) -> Option<(usize, usize)> {
    use fragscope_snapshot::Action;
    let fact = |kind: u64, addr: u64, size: u64| {
        // splitmix64 of the fact.
        let mut z =
            addr.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ size.rotate_left(29) ^ kind.wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    let (allocated, pending, segment) = (1, 2, 3);
    let mut first_seen: std::collections::HashMap<u64, usize> = std::collections::HashMap::new();
    let mut h = 0u64;
    first_seen.insert(h, 0);
    let mut best: Option<(usize, usize)> = None;
    for (i, e) in trace.iter().enumerate() {
        // A block's facts hold its request too: PyTorch's `free_requested` and
        // `free_completed` state the block's `requested_size`, the request of its
        // `alloc`, so a stretch neutral for addresses only could repeat a free whose
        // request is not its block's (one the allocator never writes).
        h ^= match e.action {
            Action::Alloc => fact(allocated, e.addr, e.size),
            Action::FreeRequested => fact(allocated, e.addr, e.size) ^ fact(pending, e.addr, e.size),
            Action::FreeCompleted => fact(pending, e.addr, e.size),
            Action::SegmentAlloc | Action::SegmentMap | Action::SegmentFree | Action::SegmentUnmap => {
                fact(segment, e.addr, e.size)
            }
            _ => 0,
        };
        let at = *first_seen.entry(h).or_insert(i + 1);
        if i + 1 - at > best.map_or(0, |(p, q)| q - p) {
            best = Some((at, i + 1));
        }
    }
    best
}
