//! Everything `verify` and `simulate` report, on many inputs, one block per case:
//! run it before and after a change to the replay and diff the outputs (the
//! reports must not change).
//!
//! `cargo run --release -p fragscope-bench --bin replay_digest -- [--mutants N] [--light] FILE...`
//!
//! `--light` (for files of millions of entries): only `verify` with and without
//! re-seeding and `simulate` under the recorded settings.
//!
//! Per file and replayable device: `verify` under the recorded settings (also
//! without re-seeding, and under a few overriding configurations), `simulate`
//! under the recorded settings, then `verify` of the simulated run saved as a
//! snapshot under several settings, and `verify` of N mutants of the trace (an
//! entry dropped, duplicated, swapped with the next, or with its address or size
//! changed), so the inconsistent and diverging paths are compared too.
use fragscope_replay::{self as replay, ReplayOptions, SimOptions};
use fragscope_snapshot::{Action, Snapshot};

const CONFIGS: &[&str] = &[
    "",
    "expandable_segments:True",
    "max_split_size_mb:64",
    "max_split_size_mb:20",
    "roundup_power2_divisions:4",
    "max_split_size_mb:64,expandable_segments:True",
    "garbage_collection_threshold:0.5",
];

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn verify_case(label: &str, snap: &Snapshot, d: i64, opts: &ReplayOptions) {
    let r = replay::verify(snap, d, opts);
    println!("== {label} dev {d}\n{r:?}");
}

fn mutate(snap: &Snapshot, d: i64, rng: &mut Rng) -> (String, Snapshot) {
    let mut m = snap.clone();
    let t = &mut m.device_traces[d as usize];
    let n = t.len();
    let i = rng.below(n);
    // Prefer block and segment entries near a random point.
    let kind = rng.below(8);
    let desc = match kind {
        0 => {
            t.remove(i);
            format!("drop {i}")
        }
        1 => {
            let e = t[i];
            t.insert(i, e);
            format!("dup {i}")
        }
        2 if i + 1 < n => {
            t.swap(i, i + 1);
            format!("swap {i}")
        }
        3 => {
            t[i].addr = t[i].addr.wrapping_add(512);
            format!("addr+512 {i}")
        }
        4 => {
            // A free's size changed (only the backward walk reads it).
            let j = (i..n).chain(0..i).find(|&j| t[j].action == Action::FreeCompleted).unwrap_or(i);
            t[j].size = t[j].size * 3 + 1024;
            format!("free size x3 {j}")
        }
        5 => {
            let j = (i..n).chain(0..i).find(|&j| t[j].action == Action::FreeCompleted).unwrap_or(i);
            t[j].size /= 2;
            format!("free size /2 {j}")
        }
        6 => {
            let j = (i..n)
                .chain(0..i)
                .find(|&j| matches!(t[j].action, Action::SegmentAlloc | Action::SegmentFree | Action::SegmentMap))
                .unwrap_or(i);
            t[j].size += 2 << 20;
            format!("segment size +2MiB {j}")
        }
        _ => {
            let j = (i..n).chain(0..i).find(|&j| t[j].action == Action::FreeRequested).unwrap_or(i);
            let mut e = t[j];
            let stream = m.stream(&e) ^ 1;
            m.set_stream(&mut e, stream);
            m.device_traces[d as usize][j] = e;
            format!("free_requested stream {j}")
        }
    };
    (desc, m)
}

fn main() {
    let mut mutants = 12usize;
    let mut light = false;
    let mut files = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--mutants" => mutants = args.next().and_then(|v| v.parse().ok()).expect("--mutants N"),
            "--light" => light = true,
            _ => files.push(a),
        }
    }
    for p in files {
        let name = p.rsplit('/').next().unwrap().to_string();
        let snap = match fragscope_snapshot::read_path(p.as_ref()) {
            Ok(s) => s,
            Err(e) => {
                println!("== {name}: unreadable: {e}");
                continue;
            }
        };
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ name.len() as u64);
        for d in replay::replayable_devices(&snap) {
            verify_case(&name, &snap, d, &ReplayOptions::default());
            verify_case(
                &format!("{name} no_resync"),
                &snap,
                d,
                &ReplayOptions { no_resync: true, ..Default::default() },
            );
            if light {
                let w = replay::simulate(&snap, d, replay::recorded_config(&snap), None);
                println!("== {name} simulate dev {d}\n{w:?}");
                continue;
            }
            for conf in ["max_split_size_mb:64", "roundup_power2_divisions:8", "expandable_segments:True"] {
                let cfg = fragscope_alloc::parse_config(conf).unwrap();
                verify_case(
                    &format!("{name} config {conf}"),
                    &snap,
                    d,
                    &ReplayOptions { config: Some(cfg), ..Default::default() },
                );
            }
            let w = replay::simulate(&snap, d, replay::recorded_config(&snap), None);
            println!("== {name} simulate dev {d}\n{w:?}");
            for conf in CONFIGS {
                let cfg = fragscope_alloc::parse_config(conf).unwrap();
                let w = replay::simulate_with(
                    &snap,
                    d,
                    cfg,
                    &SimOptions { capacity: None, collect_snapshot: true, ..SimOptions::default() },
                );
                let Some(sim) = w.snapshot.clone() else { continue };
                let mut w = w;
                w.snapshot = None;
                println!("== {name} simulate [{conf}] dev {d}\n{w:?}");
                if sim.trace(d).len() > 3_000_000 {
                    continue;
                }
                verify_case(&format!("{name} sim [{conf}]"), &sim, d, &ReplayOptions::default());
                for k in 0..mutants / 3 {
                    let (desc, m) = mutate(&sim, d, &mut rng);
                    verify_case(&format!("{name} sim [{conf}] mutant {k}: {desc}"), &m, d, &ReplayOptions::default());
                }
            }
            if snap.trace(d).len() > 3_000_000 {
                continue;
            }
            for k in 0..mutants {
                let (desc, m) = mutate(&snap, d, &mut rng);
                verify_case(&format!("{name} mutant {k}: {desc}"), &m, d, &ReplayOptions::default());
                let w = replay::simulate(&m, d, replay::recorded_config(&m), None);
                println!("== {name} mutant {k} simulate dev {d}\n{w:?}");
            }
        }
    }
}
