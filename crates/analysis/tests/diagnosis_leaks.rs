//! Leak detection on real traces: the steady decomfl run (two optimizer steps) has no
//! suspect, its periodicity (a short pattern repeated in two clusters) is not taken for
//! iterations, and a leak planted into it ([`fragscope_analysis::plant`]) is found at
//! the planted site with the planted blocks as its evidence. A loop whose shapes change
//! from step to step (octree NCA levels) and a forward over layers (codeloc) get their
//! iterations from site periodicity, and leaks planted at sites drawn at random (seeded)
//! are found there: every other allocation kept, and three such sites at once.

use fragscope_analysis::leaks;
use fragscope_analysis::plant::{self, Shape};
use fragscope_snapshot::Snapshot;

fn read(name: &str) -> Option<Snapshot> {
    let p = fragscope_testdata::real_file(name)?;
    Some(fragscope_snapshot::read_path(&p).unwrap())
}

const DECOMFL: &str = "decomfl-opt-zeroth-order-windows.pickle";
const DECOMFL_PEAK: u64 = 1786608128;

#[test]
fn steady_decomfl_run_has_no_suspects() {
    let Some(snap) = read(DECOMFL) else { return };
    let l = leaks::leaks_device(&snap, 0, DECOMFL_PEAK);
    // 24 repeats of a 32-alloc pattern, in two clusters 12,637 entries apart: the
    // layers of two forward passes, not 24 iterations.
    assert_eq!(l.iterations.source, "none");
    assert!(l.iterations.reason.as_deref().unwrap().contains("clustered"), "{:?}", l.iterations.reason);
    assert!(l.suspects.is_empty(), "{:?}", l.suspects);
}

#[test]
fn planted_leak_is_found_at_its_site() {
    let Some(snap) = read(DECOMFL) else { return };
    let n = snap.trace(0).len();
    // The real call site with the most freed allocations; its frees in the second half
    // of the run are dropped.
    let sites = plant::site_allocs(&snap, 0);
    let site = sites.iter().find(|s| !s.site.starts_with('<')).unwrap();
    let allocs = Shape::Windows(vec![(0.5, 1.0)]).pick(&site.freed, n);
    let (planted, what) = plant::plant(&snap, 0, &allocs).unwrap();
    assert_eq!(what.sites, vec![site.site.clone()]);
    let l = leaks::leaks_device(&planted, 0, DECOMFL_PEAK);
    eprintln!("planted {} blocks, {} B at {}: {:?}", what.allocs.len(), what.bytes, site.site, l.suspects);
    assert_eq!(l.suspects.len(), 1, "{:?}", l.suspects);
    let s = &l.suspects[0];
    assert_eq!(s.site.site, site.site);
    assert!(s.detected_by.contains(&"never_freed"));
    // The evidence is planted blocks (the site had none live at the end before): all
    // but those of the run's last fifth, which have not outlived enough of it.
    assert!(s.never_freed_blocks <= what.allocs.len() as u64 && s.never_freed_bytes <= what.bytes);
    // Exactly the planted blocks allocated before the run's last fifth (the new
    // segments hold the planted blocks).
    let old: std::collections::HashSet<u64> = snap.segments.iter().map(|g| g.address).collect();
    let fresh: std::collections::HashSet<u64> =
        planted.segments.iter().map(|g| g.address).filter(|a| !old.contains(a)).collect();
    let pt = planted.trace(0);
    let early: Vec<u64> = pt
        .iter()
        .enumerate()
        .filter(|(i, e)| {
            e.action == fragscope_snapshot::Action::Alloc && fresh.contains(&e.addr) && (pt.len() - i) * 5 >= pt.len()
        })
        .map(|(_, e)| {
            fragscope_alloc::rounding::round_size(e.size, &fragscope_analysis::replay::recorded_config(&planted))
        })
        .collect();
    assert_eq!((s.never_freed_blocks, s.never_freed_bytes), (early.len() as u64, early.iter().sum::<u64>()));
    assert_eq!(s.end_bytes, what.bytes);
    assert!(s.first_never_freed_entry.unwrap() * 2 >= n, "allocated in the second half");
    assert_eq!(s.grew_in.iter().map(|g| g.bytes).sum::<u64>(), s.never_freed_bytes);
    assert_eq!(s.curve.last().unwrap().bytes, what.bytes, "the curve ends at the kept bytes");
}

const OCTREE: &str = "octree-nca-inference-huge-allocs.pickle";
const CODELOC: &str = "codeloc-qwen3-gnn-expandable-oom-3gpu.pickle";

fn peak(snap: &Snapshot, device: i64) -> u64 {
    use fragscope_analysis::timeline::{self, TimelineOptions};
    timeline::timeline(snap, device, &TimelineOptions { points: 1 }).peak_allocated.bytes
}

/// Real call sites with at least 8 freed allocs spread over the run (first in its first
/// 40%, last in its last 40%), in a seeded random order.
fn random_sites(snap: &Snapshot, device: i64, seed: u64) -> Vec<plant::SiteAllocs> {
    let n = snap.trace(device).len();
    let mut v: Vec<plant::SiteAllocs> = plant::site_allocs(snap, device)
        .into_iter()
        .filter(|s| {
            let (a, b) = (s.freed.first().copied().unwrap_or(0), s.freed.last().copied().unwrap_or(0));
            !s.site.starts_with('<') && s.freed.len() >= 8 && a * 10 < n * 4 && b * 10 > n * 6
        })
        .collect();
    let mut rng = fragscope_testdata::Rng(seed);
    for k in 0..v.len() {
        let j = k + rng.below(v.len() - k);
        v.swap(k, j);
    }
    v
}

/// Plants `stride:2` (every other freed alloc kept, from the site's first) at the first
/// `count` sites of `random_sites(seed)` whose leak reaches the threshold; returns the
/// planted sites and the suspects' sites.
fn plant_every_other(snap: &Snapshot, device: i64, seed: u64, count: usize) -> (Vec<String>, Vec<String>) {
    let n = snap.trace(device).len();
    let min = leaks::never_freed_threshold(peak(snap, device));
    let cfg = fragscope_analysis::replay::recorded_config(snap);
    let t = snap.trace(device);
    let mut allocs = Vec::new();
    let mut sites = 0;
    for s in random_sites(snap, device, seed) {
        let v = Shape::Stride(2).pick(&s.freed, n);
        let bytes: u64 = v.iter().map(|&i| fragscope_alloc::rounding::round_size(t[i].size, &cfg)).sum();
        if bytes >= min {
            allocs.extend(v);
            sites += 1;
            if sites == count {
                break;
            }
        }
    }
    assert_eq!(sites, count, "seed {seed}: not enough sites to plant into");
    allocs.sort_unstable();
    let (planted, what) = plant::plant(snap, device, &allocs).unwrap();
    let l = leaks::leaks_device(&planted, device, peak(&planted, device));
    for s in &l.suspects {
        assert!(!s.detected_by.is_empty() && !s.grew_in.is_empty(), "{s:?}: evidence");
    }
    let mut found: Vec<String> = l.suspects.iter().map(|s| s.site.site.clone()).collect();
    found.sort();
    (what.sites, found)
}

#[test]
fn loop_of_changing_shapes_gets_iterations_from_its_sites() {
    let Some(snap) = read(OCTREE) else { return };
    // Each octree level runs the same NCA steps on 4x larger tensors, from other call
    // paths: no (size, stack) signature repeats over the run, the sites do.
    let l = leaks::leaks_device(&snap, 0, peak(&snap, 0));
    assert_eq!(l.iterations.source, "periodicity", "{:?}", l.iterations);
    assert!(l.iterations.boundaries.len() >= 50, "{:?}", l.iterations.boundaries.len());
    assert!(l.suspects.is_empty(), "untouched: {:?}", l.suspects);
}

#[test]
fn every_other_alloc_kept_at_random_sites_is_found() {
    // Seeded draws of sites, not chosen ones; each planted file has exactly its planted
    // site as suspect.
    for (name, seeds) in [(OCTREE, 0..3u64), (CODELOC, 0..3u64)] {
        let Some(snap) = read(name) else { return };
        for seed in seeds {
            let (planted, found) = plant_every_other(&snap, 0, seed, 1);
            eprintln!("{name} seed {seed}: planted {planted:?}, suspects {found:?}");
            assert_eq!(found, planted, "{name} seed {seed}");
        }
    }
}

#[test]
fn several_sites_leaking_at_once_in_steps_of_changing_size() {
    let Some(snap) = read(OCTREE) else { return };
    let mut all_named = 0;
    for seed in 0..4u64 {
        let (planted, found) = plant_every_other(&snap, 0, seed, 3);
        eprintln!("{OCTREE} seed {seed}: planted {planted:?}, suspects {found:?}");
        // Never a site that was not planted; all three named in most draws.
        assert!(found.iter().all(|f| planted.contains(f)), "seed {seed}: false positive in {found:?}");
        all_named += (found.len() == planted.len()) as usize;
    }
    assert!(all_named >= 3, "all three sites named in {all_named} of 4 draws");
}
