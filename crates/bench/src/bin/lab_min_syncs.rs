//! Synchronisations each policy makes on the smallest device on which it runs without an
//! OOM (the lab reports the calls of its unlimited run only):
//!
//!     cargo run -p fragscope-bench --bin lab_min_syncs -- FILE... [--allocator NAME]...
//!
//! Per file and replayable device: the policy, the smallest device (`smallest_capacity`,
//! the lab's bisection, on the workload of what was live) as a ratio to peak live bytes,
//! and the synchronisations (`calls.synchronize`) of the unlimited run and of the run on
//! that device.

use fragscope_alloc::policy::drive;
use fragscope_replay::{
    make_policy, parse_policy, recorded_config, replayable_devices, smallest_capacity, workload_of,
};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut files = Vec::new();
    let mut names = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--allocator" {
            names.push(it.next().cloned().unwrap_or_default());
        } else {
            files.push(a.clone());
        }
    }
    if names.is_empty() {
        names = vec!["paged-best-fit".into(), "paged-best-fit:lazy".into()];
    }
    let specs: Vec<_> = names.iter().flat_map(|n| parse_policy(n).unwrap_or_else(|e| panic!("{e}"))).collect();
    println!("file\tdevice\trequests\tpolicy\tmin_capacity/live\tsyncs_unlimited\tsyncs_at_min_capacity");
    for f in &files {
        let Ok(snap) = fragscope_snapshot::read_path(std::path::Path::new(f)) else { continue };
        let name = std::path::Path::new(f).file_name().unwrap().to_string_lossy().to_string();
        for d in replayable_devices(&snap) {
            let lw = workload_of(&snap, d);
            let w = lw.workload.without_probes();
            let b = w.bounds();
            if w.requests == 0 || b.live == 0 {
                continue;
            }
            let cfg = recorded_config(&snap);
            for spec in &specs {
                let mut p = make_policy(spec, &cfg, &w, 1 << 50);
                let Ok(unl) = drive(p.as_mut(), &w, false, 0) else { continue };
                let c = smallest_capacity(spec, &cfg, &w, b.live, unl.peak_reserved.max(b.live));
                let mut p = make_policy(spec, &cfg, &w, c);
                let Ok(at) = drive(p.as_mut(), &w, false, 0) else { continue };
                println!(
                    "{name}\t{d}\t{}\t{}\t{:.3}\t{}\t{}",
                    w.requests,
                    p.name(),
                    c as f64 / b.live as f64,
                    unl.calls.synchronize,
                    at.calls.synchronize
                );
            }
        }
    }
}
