//! Prints the steps and the memory by role of each device of the snapshots named on the
//! command line (`DUMP_ROLE=gradients` also lists every block given that role): `cargo run --release -p fragscope-bench --bin roles_dump -- FILE...`.
fn main() {
    for p in std::env::args().skip(1) {
        let snap = match fragscope_snapshot::read_path(std::path::Path::new(&p)) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("{p}: {e}");
                continue;
            }
        };
        for d in snap.devices() {
            if snap.trace(d).is_empty() {
                continue;
            }
            let lives = fragscope_trace::BlockLives::replay(&snap, d);
            let (r, st, _) = fragscope_trace::device_roles_with(&snap, &lives);
            println!("{} dev {d}: {} | {}", p.rsplit('/').next().unwrap(), st.describe(), st.evidence.join("; "));
            for (k, s) in st.steps.iter().enumerate().take(6) {
                let ph: Vec<String> =
                    s.phases.iter().map(|x| format!("{}[{}..{}]", x.phase.as_str(), x.start, x.end)).take(8).collect();
                println!(
                    "    step {k} {}..{} complete {} layers {:?} {}",
                    s.start,
                    s.end,
                    s.complete,
                    s.layers,
                    ph.join(" ")
                );
            }
            if std::env::var("DUMP_ROLE").is_ok() {
                let want = std::env::var("DUMP_ROLE").unwrap();
                let (_, _, roles) = fragscope_trace::device_roles_with(&snap, &lives);
                for (l, rr) in lives.traced.iter().zip(&roles.traced) {
                    if rr.role.as_str() == want {
                        let end = if l.end() == usize::MAX {
                            "live".to_string()
                        } else {
                            format!("{} {}", l.end(), st.phase_at(l.end()).as_str())
                        };
                        println!(
                            "   {want} size {} alloc {} {} end {end} {:?}",
                            l.size,
                            l.alloc(),
                            st.phase_at(l.alloc()).as_str(),
                            rr.reason
                        );
                    }
                }
            }
            for (name, b) in &r.by_role {
                println!(
                    "  {name:<16} max {:>15} at_peak {:>15} blocks {:>6} conf {:.2}",
                    b.max, b.at_peak, b.blocks, b.confidence
                );
                for e in &b.evidence {
                    println!("      {:>6} blocks {:>15} B  {}", e.blocks, e.bytes, e.evidence.describe());
                }
            }
        }
    }
}
