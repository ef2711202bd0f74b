//! Leak detection on real traces: none on the steady decomfl run, and a leak planted
//! into it (in memory) is found at the planted site with the planted growth.

use std::path::PathBuf;

use fragscope_alloc::rounding::round_size;
use fragscope_analysis::attribution::site_of;
use fragscope_analysis::leaks;
use fragscope_analysis::replay::recorded_config;
use fragscope_snapshot::{Action, Block, BlockState, FxHashMap, Segment, SegmentType, Snapshot};

fn read(name: &str) -> Option<Snapshot> {
    let p: PathBuf = fragscope_testdata::real_file(name)?;
    Some(fragscope_snapshot::read_path(&p).unwrap())
}

const DECOMFL: &str = "decomfl-opt-zeroth-order-windows.pickle";

#[test]
fn steady_decomfl_run_has_no_suspects() {
    let Some(snap) = read(DECOMFL) else { return };
    let l = leaks::leaks_device(&snap, 0, 1786608128);
    assert_eq!(l.iterations.source, "periodicity");
    assert_eq!(l.iterations.period_allocs, Some(32));
    assert_eq!(l.iterations.boundaries.len(), 24);
    assert!(l.suspects.is_empty(), "{:?}", l.suspects);
}

/// Drops the frees of every block allocated at `site` after the first boundary (and
/// freed later), moves those blocks to fresh addresses (so that later allocations that
/// reuse the old address stay valid) and adds them to the final state in a new segment,
/// so the snapshot stays consistent. Returns the planted bytes per iteration.
fn plant(snap: &mut Snapshot, site: &str, boundaries: &[usize]) -> Vec<u64> {
    let cfg = recorded_config(snap);
    let trace = snap.device_traces[0].clone();
    // Which allocs are freed later.
    let mut open: FxHashMap<u64, usize> = FxHashMap::default();
    let mut freed = vec![false; trace.len()];
    for (i, e) in trace.iter().enumerate() {
        match e.action {
            Action::Alloc => {
                open.insert(e.addr, i);
            }
            Action::FreeCompleted => {
                if let Some(j) = open.remove(&e.addr) {
                    freed[j] = true;
                }
            }
            _ => {}
        }
    }
    let base = 0x7f00_0000_0000u64;
    let mut next = base;
    let mut moved: FxHashMap<u64, ()> = FxHashMap::default();
    let mut out = Vec::with_capacity(trace.len());
    let mut blocks = Vec::new();
    let mut per_iter = vec![0u64; boundaries.len()];
    for (i, e) in trace.iter().enumerate() {
        let mut e = *e;
        match e.action {
            Action::Alloc if i >= boundaries[0] && freed[i] && site_of(&snap.frames, e.stack).site == site => {
                moved.insert(e.addr, ());
                let size = round_size(e.size, &cfg);
                e.addr = next;
                blocks.push(Block {
                    address: next,
                    size,
                    requested_size: Some(e.size),
                    state: BlockState::ActiveAllocated,
                    stack: e.stack,
                    history: None,
                });
                next += size;
                let k = boundaries.partition_point(|&b| b <= i) - 1;
                per_iter[k] += size;
            }
            Action::FreeRequested if moved.contains_key(&e.addr) => continue,
            Action::FreeCompleted if moved.remove(&e.addr).is_some() => continue,
            _ => {}
        }
        out.push(e);
    }
    snap.device_traces[0] = out;
    let total = next - base;
    snap.segments.push(Segment {
        device: 0,
        address: base,
        total_size: total,
        allocated_size: total,
        active_size: total,
        requested_size: None,
        stream: 0,
        segment_type: SegmentType::Large,
        segment_pool_id: Some((0, 0)),
        is_expandable: Some(false),
        stack: None,
        blocks,
    });
    per_iter
}

#[test]
fn planted_leak_is_found_at_its_site() {
    let Some(mut snap) = read(DECOMFL) else { return };
    let it = leaks::iterations(&snap, 0);
    let b = it.boundaries.clone();
    // Sites that allocate in every iteration, with their bytes per iteration.
    let trace = snap.trace(0);
    let mut per: FxHashMap<String, Vec<u64>> = FxHashMap::default();
    for (i, e) in trace.iter().enumerate().filter(|(i, e)| e.action == Action::Alloc && *i >= b[0]) {
        let k = b.partition_point(|&x| x <= i) - 1;
        per.entry(site_of(&snap.frames, e.stack).site).or_insert_with(|| vec![0; b.len()])[k] += e.size;
    }
    // The smallest site allocating at least 1 MiB in every full iteration: the hardest
    // to see among its peers.
    let mut cands: Vec<(u64, String)> = per
        .into_iter()
        .filter(|(s, v)| !s.starts_with('<') && v[..v.len() - 1].iter().all(|&x| x >= 1 << 20))
        .map(|(s, v)| (v[..v.len() - 1].iter().sum::<u64>() / (v.len() as u64 - 1), s))
        .collect();
    cands.sort();
    let (_, site) = cands.first().cloned().expect("a site that allocates in every iteration");
    let planted = plant(&mut snap, &site, &b);
    // The planted live bytes at boundary k are the planted bytes of iterations 0..k;
    // the expected growth is the least-squares slope through them (one iteration
    // plants 12x the others, so the plain mean would not be the fitted slope).
    let y: Vec<f64> = (0..planted.len()).map(|k| planted[..k].iter().sum::<u64>() as f64).collect();
    let n = y.len() as f64;
    let (mx, my) = ((n - 1.0) / 2.0, y.iter().sum::<f64>() / n);
    let sxy: f64 = y.iter().enumerate().map(|(i, v)| (i as f64 - mx) * (v - my)).sum();
    let sxx: f64 = (0..y.len()).map(|i| (i as f64 - mx).powi(2)).sum();
    let expect = sxy / sxx;
    eprintln!("candidates {:?}; planted per iteration {:?}", &cands[..cands.len().min(5)], planted);
    let l = leaks::leaks_device(&snap, 0, 1786608128);
    assert_eq!(l.iterations.boundaries.len(), b.len(), "planting keeps the iterations");
    let top = l.suspects.first().unwrap_or_else(|| panic!("planted leak at {site} not found"));
    assert_eq!(top.site.site, site);
    assert_eq!(l.suspects.len(), 1, "{:?}", l.suspects);
    let g = top.growth_bytes_per_iteration as f64;
    assert!((g - expect).abs() <= 0.01 * expect, "growth {g} vs planted {expect} per iteration at {site}");
    assert!(top.confidence > 0.9, "{}", top.confidence);
    eprintln!("planted {expect} B/iteration at {site}: found {g} B/iteration, confidence {:.3}", top.confidence);
}
