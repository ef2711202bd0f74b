//! Dev helper: verify every pickle given on the command line, print one line per device.
fn main() {
    for p in std::env::args().skip(1) {
        let snap = match fragscope_snapshot::read_path(p.as_ref()) {
            Ok(s) => s,
            Err(e) => {
                println!("{p}: {e}");
                continue;
            }
        };
        for d in fragscope_replay::replayable_devices(&snap) {
            let t = std::time::Instant::now();
            let r = fragscope_replay::verify(&snap, d, &Default::default());
            println!(
                "{} dev{} allocs {}/{} seg {}/{} ooms {}/{} div {} ec {} amb {} final {:?} {:?} ({:?})",
                p.rsplit('/').next().unwrap(),
                d,
                r.allocs_matched,
                r.allocs,
                r.segment_events_matched,
                r.segment_events,
                r.ooms_matched,
                r.ooms,
                r.divergences,
                r.empty_cache_calls,
                r.ambiguous_block_sizes,
                r.final_state_matches,
                r.undecidable,
                t.elapsed()
            );
            if let Some(fd) = &r.first_divergence {
                println!("   first: {}", serde_json::to_string(fd).unwrap());
            }
            for n in &r.notes {
                println!("   note: {n}");
            }
        }
    }
}
