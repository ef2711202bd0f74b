//! Leak detection on a real trace: the steady decomfl run (two optimizer steps) has no
//! suspect, its periodicity (a short pattern repeated in two clusters) is not taken for
//! iterations, and a leak planted into it ([`fragscope_analysis::plant`]) is found at
//! the planted site with the planted blocks as its evidence.

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
