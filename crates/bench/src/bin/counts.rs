//! Prints per-file counts (segments, blocks, events per action) for quick checks.
fn main() {
    for p in std::env::args().skip(1) {
        let t = std::time::Instant::now();
        match fragscope_snapshot::read_path(p.as_ref()) {
            Ok(s) => {
                let blocks: usize = s.segments.iter().map(|x| x.blocks.len()).sum();
                let mut acts = std::collections::BTreeMap::new();
                for t in &s.device_traces {
                    for e in t {
                        *acts.entry(e.action.as_str()).or_insert(0) += 1;
                    }
                }
                println!(
                    "{p}: segs {} blocks {} traces {:?} acts {:?} stacks {} frames {} notes {:?} ({:?})",
                    s.segments.len(),
                    blocks,
                    s.device_traces.iter().map(|t| t.len()).collect::<Vec<_>>(),
                    acts,
                    s.frames.num_stacks(),
                    s.frames.num_frames(),
                    s.notes,
                    t.elapsed()
                );
            }
            Err(e) => println!("{p}: error: {e}"),
        }
    }
}
