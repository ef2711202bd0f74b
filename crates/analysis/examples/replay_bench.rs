//! Replay speed: `cargo run --release -p fragscope-analysis --example replay_bench -- FILE...`
//! replays each file's traces (verify: backward walk, seeding, forward replay, final
//! comparison) in a loop until at least 5 M events have gone through, then prints events/s.
use std::time::Instant;

fn main() {
    for p in std::env::args().skip(1) {
        let snap = fragscope_snapshot::read_path(p.as_ref()).expect("readable snapshot");
        let devs = fragscope_analysis::replay::replayable_devices(&snap);
        let per: usize = devs.iter().map(|&d| snap.trace(d).len()).sum();
        if per == 0 {
            continue;
        }
        let (mut events, mut reps) = (0usize, 0usize);
        let t = Instant::now();
        while events < 5_000_000 {
            for &d in &devs {
                let r = fragscope_analysis::replay::verify(&snap, d, &Default::default());
                std::hint::black_box(&r);
            }
            events += per;
            reps += 1;
        }
        let s = t.elapsed().as_secs_f64();
        println!("{:<50} {per:>7} events x {reps:>4}: {:>6.1} M events/s", p.rsplit('/').next().unwrap(), events as f64 / s / 1e6);
    }
}
