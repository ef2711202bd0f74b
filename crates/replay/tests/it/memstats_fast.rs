//! `memory_table` (one backward walk with the block layout, then a forward pass without
//! it) must give exactly what the definition gives, `memory_table_by_replay` (the walk,
//! then every entry applied forwards with the layout): the table, or the same reason why
//! there is none. Checked on every real snapshot, and on traces recorded through
//! fragscope's allocator model under several settings, with the recording begun mid-run
//! (blocks and segments alive before the trace, cached blocks taken whole, oversize
//! blocks, expandable segments, `empty_cache`).

use fragscope_replay::{memory_table_by_replay, memory_table_noted, Recorder};
use fragscope_snapshot::Snapshot;

/// Compares the two on every device of `snap`; returns how many devices had a table and
/// how many of those were built from the walk's notes (not by the fallback replay).
fn same_on(snap: &Snapshot, what: &str) -> (usize, usize) {
    let (mut tables, mut noted) = (0, 0);
    for d in snap.devices() {
        let (fast, by_notes) = memory_table_noted(snap, d);
        let def = memory_table_by_replay(snap, d);
        assert_eq!(fast, def, "{what} device {d}");
        tables += fast.is_ok() as usize;
        noted += by_notes as usize;
    }
    (tables, noted)
}

#[test]
fn the_fast_table_is_the_replayed_table_on_real_snapshots() {
    let files = fragscope_testdata::real_pickles();
    let (mut tables, mut noted, mut read) = (0, 0, 0);
    for p in &files {
        let Ok(snap) = fragscope_snapshot::read_path(p) else { continue };
        read += 1;
        let (t, n) = same_on(&snap, &p.display().to_string());
        eprintln!("{}: {t} tables, {n} from the walk's notes", p.display());
        (tables, noted) = (tables + t, noted + n);
    }
    eprintln!("memstats fast/replay: {read} snapshots, {tables} device tables compared, {noted} from the notes");
    assert!(tables >= 3, "too few tables compared ({tables} of {read} snapshots)");
    // The notes must serve most real traces (else the fast path is dead code).
    assert!(noted * 2 > tables, "only {noted} of {tables} tables from the walk's notes");
}

/// A small deterministic generator (xorshift), so failures reproduce.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A run of random allocations and frees on two streams, the recording begun after
/// `before` operations; sizes from small-pool requests to oversize ones.
fn recorded(conf: &str, seed: u64, before: usize, after: usize) -> Snapshot {
    let mut r = Recorder::new(conf, 4 << 30, 1_000_000, 10).unwrap();
    let st = r.stack(&[("train.py", 10, "main"), ("model.py", 42, "forward")]);
    let mut rng = Rng(seed);
    let mut live: Vec<u64> = Vec::new();
    for k in 0..before + after {
        if k == before {
            r.begin_trace_here();
        }
        let roll = rng.below(100);
        if roll < 2 {
            r.empty_cache();
        } else if roll < 50 || live.is_empty() {
            let n = match rng.below(4) {
                0 => 1 + rng.below(1 << 20),
                1 => (1 << 20) + rng.below(9 << 20),
                2 => (10 << 20) + rng.below(90 << 20),
                _ => 512 * (1 + rng.below(64)),
            };
            if let Ok(a) = r.malloc(n, rng.below(2), st) {
                live.push(a);
            }
        } else {
            let a = live.swap_remove(rng.below(live.len() as u64) as usize);
            r.free(a).unwrap();
        }
    }
    r.finish()
}

#[test]
fn the_fast_table_is_the_replayed_table_on_recorded_runs() {
    let confs = [
        "",
        "max_split_size_mb:64",
        "max_split_size_mb:32,max_non_split_rounding_mb:24",
        "roundup_power2_divisions:4",
        "expandable_segments:True",
    ];
    let (mut tables, mut noted) = (0, 0);
    for conf in confs {
        let (mut ct, mut cn) = (0, 0);
        for seed in 1..=12u64 {
            let snap = recorded(conf, seed.wrapping_mul(0x9E37_79B9_7F4A_7C15), 300, 1500);
            let (t, n) = same_on(&snap, &format!("conf {conf:?} seed {seed}"));
            (ct, cn) = (ct + t, cn + n);
        }
        eprintln!("conf {conf:?}: {ct} tables, {cn} from the walk's notes");
        (tables, noted) = (tables + ct, noted + cn);
    }
    eprintln!("recorded runs: {tables} tables, {noted} from the walk's notes");
    assert!(tables >= 40, "only {tables} recorded runs had a table");
    // Both ways are exercised: random requests of 1–100 MiB often leave a block whose size
    // the walk revises later (a cached block taken whole), which sends the table to the
    // replay; the rest come from the notes.
    assert!(noted >= 10 && noted < tables, "{noted} of {tables} tables from the walk's notes");
}

/// `free_completed` entries that state another request than their block's `alloc` (PyTorch
/// never writes them: its frees state the block's `requested_size`; but `replicate_trace
/// --loop` files made before it kept requests in its repeated stretch did): the walk then
/// counts `requested_bytes` forwards, which must still give the replay's table. Each
/// free's request is made one byte smaller, which leaves its rounded size (512-byte steps
/// under these settings) and so the walk's blocks as they were.
#[test]
fn the_fast_table_is_the_replayed_table_when_frees_state_other_requests() {
    use fragscope_snapshot::Action;
    let (mut tables, mut noted) = (0, 0);
    for conf in ["", "max_split_size_mb:64"] {
        for seed in 1..=12u64 {
            let mut snap = recorded(conf, seed.wrapping_mul(0x9E37_79B9_7F4A_7C15), 300, 1500);
            let mut changed = 0;
            for t in &mut snap.device_traces {
                for e in t.iter_mut().filter(|e| e.action == Action::FreeCompleted && e.size % 512 != 1) {
                    e.size -= 1;
                    changed += 1;
                }
            }
            assert!(changed > 100, "conf {conf:?} seed {seed}: only {changed} frees changed");
            let (t, n) = same_on(&snap, &format!("frees one byte short, conf {conf:?} seed {seed}"));
            (tables, noted) = (tables + t, noted + n);
        }
    }
    eprintln!("frees stating other requests: {tables} tables, {noted} from the walk");
    assert!(tables >= 16 && noted >= 3, "{noted} of {tables} tables from the walk");
}

/// Frees that are not paired (a block's `free_completed` away from its `free_requested`,
/// as PyTorch writes them for a block that waits for events on other streams): the walk
/// counts `allocated_bytes` and `allocations` apart from `active_bytes` and
/// `active_allocs` from the first such free on (before it, one tally serves both), which
/// must still give the replay's table. A free followed by an `alloc` in the other pool,
/// `free_requested(A) free_completed(A) alloc(C)`, becomes `free_requested(A) alloc(C)
/// free_completed(A)` (A pending while C is made, so the two counters differ there), but
/// not in the last quarter of the trace: the walk, from the end, first counts paired
/// frees, then meets the others.
#[test]
fn the_fast_table_is_the_replayed_table_when_frees_are_not_paired() {
    use fragscope_snapshot::Action;
    let (mut tables, mut noted) = (0, 0);
    for conf in ["", "max_split_size_mb:64"] {
        for seed in 1..=12u64 {
            let mut snap = recorded(conf, seed.wrapping_mul(0x9E37_79B9_7F4A_7C15), 300, 1500);
            // C from the other pool (small: requests up to 1 MiB) cannot take A's memory.
            let small = |n: u64| n <= 512 << 10;
            let large = |n: u64| n > 2 << 20;
            let mut changed = 0;
            for t in &mut snap.device_traces {
                let (mut k, end) = (0, t.len() * 3 / 4);
                while k + 2 < end {
                    let (fr, fc, c) = (&t[k], &t[k + 1], &t[k + 2]);
                    let moved = fr.action == Action::FreeRequested
                        && fc.action == Action::FreeCompleted
                        && c.action == Action::Alloc
                        && fr.addr == fc.addr
                        && ((small(fc.size) && large(c.size)) || (large(fc.size) && small(c.size)));
                    if moved {
                        t.swap(k + 1, k + 2);
                        changed += 1;
                        k += 3;
                    } else {
                        k += 1;
                    }
                }
            }
            assert!(changed > 10, "conf {conf:?} seed {seed}: only {changed} frees moved");
            let (t, n) = same_on(&snap, &format!("frees not paired, conf {conf:?} seed {seed}"));
            (tables, noted) = (tables + t, noted + n);
        }
    }
    eprintln!("frees not paired: {tables} tables, {noted} from the walk");
    assert!(tables >= 16 && noted >= 3, "{noted} of {tables} tables from the walk");
}
