//! Capacity first (issue 37 item 1): under a capacity the state a prediction starts from
//! counts like any other memory, and `max_fit` never answers a size that does not fit.

use fragscope_predict::{Program, Recording};
use fragscope_snapshot::Snapshot;

use crate::eval::{load, warm, FAMILIES};

/// The H200 batch family (shipped in the repository) at `sizes`, cut after the first
/// step: templates that start with the parameters, AdamW's state and a full cache.
fn warm_batches(sizes: &[u64]) -> Vec<Snapshot> {
    let f = FAMILIES.iter().find(|f| f.name == "h200-batch").expect("the family");
    sizes.iter().map(|&s| warm(&load(f, s).expect("shipped in the repository"), "h200 batch")).collect()
}

#[test]
fn a_start_over_the_capacity_does_not_fit() {
    let snaps = warm_batches(&[4, 8]);
    let recs = [Recording { snap: &snaps[0], size: 4 }, Recording { snap: &snaps[1], size: 8 }];
    let prog = Program::fit(&recs, Some(0)).expect("aligns");
    let cfg = prog.recorded_config.clone();
    let free = prog.predict(8, &cfg, None);
    // Blocks from before the trace still live at the allocated peak: fewer than at the start.
    let live = free.breakdown.before_trace;
    assert!(live > 1 << 30, "the warm template holds its parameters and optimizer state: {live}");
    // Below them: the run cannot start, whatever the trace does.
    let cap = live - (64 << 20);
    let p = prog.predict(8, &cfg, Some(cap));
    let over = p.start_over_capacity.as_ref().expect("the start does not fit");
    assert!(!p.fits());
    assert!(over.live >= live && over.capacity == cap, "{over:?}");
    assert!(over.reserved >= live && over.over == over.reserved - cap, "{over:?}");
    assert!(p.notes.iter().any(|n| n.contains("does not fit the capacity")), "{:?}", p.notes);
    // Unlimited: the same start fits.
    assert!(free.fits() && free.start_over_capacity.is_none());
}

#[test]
fn whatever_fits_stays_within_its_capacity() {
    let snaps = warm_batches(&[4, 8]);
    let recs = [Recording { snap: &snaps[0], size: 4 }, Recording { snap: &snaps[1], size: 8 }];
    let prog = Program::fit(&recs, Some(0)).expect("aligns");
    let cfg = prog.recorded_config.clone();
    let mut fitted = 0;
    for gib in [2u64, 3, 4, 5, 6, 8, 12] {
        let cap = gib << 30;
        for at in [2u64, 4, 8, 12, 16] {
            let p = prog.predict(at, &cfg, Some(cap));
            if p.fits() {
                fitted += 1;
                assert!(p.peak_reserved <= cap, "size {at} on {gib} GiB fits with {} reserved", p.peak_reserved);
            }
        }
    }
    assert!(fitted > 0);
}

#[test]
fn max_fit_answers_a_size_that_fits() {
    let snaps = warm_batches(&[4, 8]);
    let recs = [Recording { snap: &snaps[0], size: 4 }, Recording { snap: &snaps[1], size: 8 }];
    let prog = Program::fit(&recs, Some(0)).expect("aligns");
    let cfg = prog.recorded_config.clone();
    for gib in [3u64, 8, 16] {
        let cap = gib << 30;
        let m = prog.max_fit(&cfg, cap, 1 << 12);
        let Some(x) = m.largest else {
            // None fits: not even size 1 starts within the capacity.
            assert!(!prog.predict(1, &cfg, Some(cap)).fits(), "{gib} GiB");
            continue;
        };
        let p = prog.predict(x, &cfg, Some(cap));
        assert!(p.fits() && p.peak_reserved <= cap, "{gib} GiB: {x} answered, {p:?}");
        assert!(!prog.predict(x + 1, &cfg, Some(cap)).fits(), "{gib} GiB: {} fits too", x + 1);
    }
}

#[test]
fn max_fit_reports_the_sizes_below_it_that_do_not_fit() {
    // kk-2.7b training step (the corpus) on an H100 80GB less the CUDA context, under
    // garbage_collection_threshold:0.8,per_process_memory_fraction:0.95: bisection answers
    // 882, and sizes just below it run out of memory by the allocator's luck.
    let f = FAMILIES.iter().find(|f| f.name == "kk-step").expect("the family");
    let (Some(a), Some(b)) = (load(f, 128), load(f, 256)) else { return };
    let prog =
        Program::fit(&[Recording { snap: &a, size: 128 }, Recording { snap: &b, size: 256 }], Some(0)).expect("aligns");
    let cfg = fragscope_replay::config_on_top(
        &prog.recorded_config,
        "garbage_collection_threshold:0.8,per_process_memory_fraction:0.95",
    )
    .expect("a setting");
    let cap = 84_356_513_137;
    let m = prog.max_fit(&cfg, cap, 1 << 20);
    let x = m.largest.expect("fits");
    assert!(!m.fails_below.is_empty(), "{m:?}");
    for y in x.saturating_sub(fragscope_predict::MAX_FIT_BAND).max(1)..x {
        let fits = prog.predict(y, &cfg, Some(cap)).fits();
        assert_eq!(fits, !m.fails_below.contains(&y), "size {y}");
    }
    let fix = m.fails_below_fixed_by.as_deref().expect("a setting removes them");
    let fixed = fragscope_replay::config_on_top(&cfg, fix).expect("a setting");
    assert!(m.fails_below.iter().all(|&y| prog.predict(y, &fixed, Some(cap)).fits()));
    eprintln!("MAXFIT kk-step band: {x}, failing below {:?}, fixed by {fix}", m.fails_below);
}

#[test]
fn max_fit_reports_the_sizes_above_the_first_oom_that_fit() {
    // niu-train3 (in the repository) on 2 GB under expandable_segments:True: bisection
    // answers 297 and its first OOM is 298, yet 299 fits (the fit audit's finding); every
    // size of the band above the first OOM is as `fits_above` says. Near miss: under the
    // defaults the curve is monotone there and nothing is reported.
    let f = FAMILIES.iter().find(|f| f.name == "niu-train3").expect("the family");
    let snaps: Vec<Snapshot> = [100, 150, 200].iter().filter_map(|&s| load(f, s)).collect();
    if snaps.len() < 3 {
        return;
    }
    let recs: Vec<Recording> = snaps.iter().zip([100, 150, 200]).map(|(snap, size)| Recording { snap, size }).collect();
    let prog = Program::fit(&recs, Some(0)).expect("aligns");
    let cap = 2_000_000_000;
    let exp = fragscope_replay::config_on_top(&prog.recorded_config, "expandable_segments:True").expect("a setting");
    for (cfg, reported) in [(&exp, true), (&prog.recorded_config, false)] {
        let m = prog.max_fit(cfg, cap, 1 << 20);
        let next = m.next.as_ref().expect("bounded").at;
        assert_eq!(m.fits_above.is_empty(), !reported, "{:?}", m.fits_above);
        for y in next + 1..=next + fragscope_predict::MAX_FIT_BAND {
            assert_eq!(prog.predict(y, cfg, Some(cap)).fits(), m.fits_above.contains(&y), "size {y}");
        }
        eprintln!("MAXFIT niu-train3 band above: {:?}, first OOM {next}, fits above {:?}", m.largest, m.fits_above);
    }
}
