//! Predictions on the grids (`../shared/traces/grids/GRIDS.md`): fit on some sizes of a
//! program, predict another recorded size, compare with its recording. The niu grids
//! ship in the repository; the kk grids need the corpus (visible skip without it).

use super::*;
use fragscope_trace::{timeline, TimelineOptions};

fn load(name: &str) -> Option<Snapshot> {
    let p = fragscope_testdata::grid_file(&format!("{name}.pickle"))?;
    Some(fragscope_snapshot::read_path(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
}

/// Signed errors (%) of one prediction against the recording.
struct Outcome {
    reserved: f64,
    allocated: f64,
}

/// Fit on `fit` (grid name, size), predict `target`, print and return the signed errors.
fn leave_out(grid: &str, fit: &[u64], target: u64) -> Option<Outcome> {
    let name = |s: u64| grid.replace("{}", &s.to_string());
    let snaps: Vec<Snapshot> = fit.iter().map(|&s| load(&name(s))).collect::<Option<_>>()?;
    let want = load(&name(target))?;
    let recs: Vec<Recording> = snaps.iter().zip(fit).map(|(s, &size)| Recording { snap: s, size }).collect();
    let prog = Program::fit(&recs, None).expect("the recordings align");
    let p = prog.predict(target, &prog.recorded_config.clone(), None);
    assert!(p.oom.is_none(), "no capacity given: nothing can run out");
    // The recorded peaks as PyTorch's memory_stats() counts them (allocated_bytes: whole
    // blocks, unsplit remainders included): the model's replay of the recording, which
    // reproduces every recorded decision (checked), from its first request.
    let v = fragscope_replay::verify(&want, prog.device, &fragscope_replay::ReplayOptions::default());
    assert!(v.fully_matched(), "{}: the model does not reproduce the recording", name(target));
    let own = own_peaks(&want, prog.device);
    let (rr, ra) = own;
    // The timeline's figures (allocated: final block size, else the rounded request).
    let tl = timeline(&want, prog.device, &TimelineOptions::default());
    let e = |p: u64, r: u64| (p as f64 - r as f64) / r as f64 * 100.0;
    let out = Outcome { reserved: e(p.peak_reserved, rr), allocated: e(p.peak_allocated, ra) };
    eprintln!(
        "PREDICT {} fit {fit:?} -> {target}: aligned {:.4}, reserved {} vs recorded {} ({:+.3}%), allocated {} vs \
         recorded {} ({:+.3}%), timeline reserved {} ({:+.3}%) allocated {} ({:+.3}%), extrapolated share {:.3}, \
         unexplained {}",
        name(target),
        prog.quality.aligned_fraction,
        p.peak_reserved,
        rr,
        out.reserved,
        p.peak_allocated,
        ra,
        out.allocated,
        tl.peak_reserved.bytes,
        e(p.peak_reserved, tl.peak_reserved.bytes),
        tl.peak_allocated.bytes,
        e(p.peak_allocated, tl.peak_allocated.bytes),
        p.extrapolated_share,
        prog.quality.unexplained_total
    );
    Some(out)
}

/// Peak reserved and allocated of a recording replayed as itself (one recording "fitted"
/// and predicted at its own size is its own trace): the reference predictions compare with.
fn own_peaks(snap: &Snapshot, device: i64) -> (u64, u64) {
    let prog = own_program(snap, device);
    let p = prog.predict(1, &prog.recorded_config.clone(), None);
    (p.peak_reserved, p.peak_allocated)
}

/// One recording as a program of its own (size 1): every request at its recorded size.
fn own_program(snap: &Snapshot, device: i64) -> Program<'_> {
    let s = snap.trace(device);
    let req_index = align::requests(s);
    let fits: Vec<SizeFit> = req_index.iter().map(|&i| fit::fit(&[(1, s[i].size)])).collect();
    Program {
        alts: vec![Vec::new(); fits.len()],
        device,
        template: snap,
        template_size: 1,
        sizes: vec![1],
        req_index,
        fits,
        quality: FitQuality::default(),
        seeded: Seeded::rebuild(snap, device),
        recorded_config: recorded_config(snap),
        notes: Vec::new(),
        started_warm: false,
        carry: warm::Carry::default(),
        warm_peaks: Vec::new(),
        first_step_plan: None,
        scaled_before: Vec::new(),
    }
}

/// Leave one out on a three-size grid: every pair predicts the third.
fn three_sizes(grid: &str, sizes: [u64; 3], tolerance: f64) -> usize {
    let mut ran = 0;
    for k in 0..3 {
        let fit: Vec<u64> = (0..3).filter(|&j| j != k).map(|j| sizes[j]).collect();
        if let Some(o) = leave_out(grid, &fit, sizes[k]) {
            ran += 1;
            assert!(o.reserved.abs() <= tolerance, "{grid} at {}: reserved off by {:+.3}%", sizes[k], o.reserved);
            assert!(o.allocated.abs() <= tolerance, "{grid} at {}: allocated off by {:+.3}%", sizes[k], o.allocated);
        }
    }
    ran
}

#[test]
fn niu_forward_leave_one_out_within_half_a_percent() {
    // Shipped in the repository: runs on a fresh clone.
    assert_eq!(three_sizes("niu-fwd-ctx{}-fp32", [100, 150, 200], 0.5), 3);
}

#[test]
fn niu_training_leave_one_out_within_half_a_percent() {
    assert_eq!(three_sizes("niu-train3-ctx{}-fp32", [100, 150, 200], 0.5), 3);
}

#[test]
fn kk_forward_leave_one_out_within_a_tenth_of_a_percent() {
    // 128 and 256 predict 512 (2× the largest fitted, the largest extrapolation the grids
    // allow), and each interpolation.
    three_sizes("kk-2.7b-fwd-ctx{}-fp32", [128, 256, 512], 0.1);
}

#[test]
fn two_recordings_reproduce_themselves() {
    // Predicting a fitted size replays that recording's own requests: its peaks exactly.
    for (grid, fit) in [("niu-train3-ctx{}-fp32", [100u64, 200]), ("kk-2.7b-step-ctx{}-fp32", [128, 256])] {
        for &s in &fit {
            if let Some(o) = leave_out(grid, &fit, s) {
                if s == fit[1] {
                    assert_eq!((o.reserved, o.allocated), (0.0, 0.0), "{grid} at {s}");
                } else {
                    // The smaller one is replayed through the larger's trace: requests seen
                    // only there are kept at the larger's sizes.
                    assert!(o.reserved.abs() < 0.5 && o.allocated.abs() < 0.5, "{grid} at {s}");
                }
            }
        }
    }
}

#[test]
fn every_kk_size_fits_a_law_confirmed_by_the_two_recordings() {
    // The kk model's tensors are c·s or c·s² bytes (activations, attention scores): with two
    // recordings each one-parameter law is confirmed by the recording it was not fitted to.
    let (Some(a), Some(b)) = (load("kk-2.7b-fwd-ctx128-fp32"), load("kk-2.7b-fwd-ctx256-fp32")) else { return };
    let prog =
        Program::fit(&[Recording { snap: &a, size: 128 }, Recording { snap: &b, size: 256 }], None).expect("aligns");
    assert_eq!(prog.quality.unexplained_total, 0);
    assert!(prog.quality.by_law.iter().any(|(l, n)| l == "c*x^2" && *n > 0), "{:?}", prog.quality.by_law);
    let p = prog.predict(1024, &prog.recorded_config.clone(), None);
    assert_eq!(p.breakdown.determined + p.breakdown.unfitted, 0);
    assert!(p.breakdown.total() > 0);
}

#[test]
fn max_fit_is_the_last_size_that_fits() {
    let (Some(a), Some(b)) = (load("niu-train3-ctx100-fp32"), load("niu-train3-ctx150-fp32")) else { return };
    let prog =
        Program::fit(&[Recording { snap: &a, size: 100 }, Recording { snap: &b, size: 150 }], None).expect("aligns");
    let cfg = prog.recorded_config.clone();
    let cap = 8u64 << 30;
    let m = prog.max_fit(&cfg, cap, 1 << 20);
    let x = m.largest.expect("some size fits on 8 GiB");
    assert!(m.bounded && x > 200, "{m:?}");
    // The replay check: x fits, x + 1 does not.
    assert!(prog.predict(x, &cfg, Some(cap)).oom.is_none());
    let next = prog.predict(x + 1, &cfg, Some(cap));
    assert!(next.oom.is_some());
    assert_eq!(m.next.as_ref().map(|p| p.at), Some(x + 1));
    eprintln!(
        "MAXFIT niu-train3 on 8 GiB: {x} (peak reserved {}), {} replays",
        m.fits_at.unwrap().peak_reserved,
        m.replays
    );
}

#[test]
fn autocast_is_not_predicted_from_fp32() {
    // Autocast casts the weights per use: another sequence of allocations. Predicting the
    // mixed run from fp32 recordings is refused, plainly.
    let (Some(f), Some(m)) = (load("niu-fwd-ctx100-fp32"), load("niu-fwd-ctx200-mixed")) else { return };
    let e = Program::fit(&[Recording { snap: &f, size: 100 }, Recording { snap: &m, size: 200 }], None)
        .err()
        .expect("refused");
    assert!(matches!(e, PredictError::NotSameProgram { size: 100, template_size: 200, .. }), "{e:?}");
    let e = e.to_string();
    assert!(e.contains("not the same program") && e.contains("autocast"), "{e}");
    if let (Some(f), Some(m)) = (load("kk-2.7b-fwd-ctx128-fp32"), load("kk-2.7b-fwd-ctx256-mixed")) {
        let e = Program::fit(&[Recording { snap: &f, size: 128 }, Recording { snap: &m, size: 256 }], None);
        assert!(e.is_err());
    }
}

#[test]
fn different_programs_and_bad_sizes_are_refused() {
    let (Some(f), Some(t)) = (load("niu-fwd-ctx100-fp32"), load("niu-train3-ctx150-fp32")) else { return };
    let e = Program::fit(&[Recording { snap: &f, size: 100 }, Recording { snap: &t, size: 150 }], None).err().unwrap();
    assert!(e.to_string().contains("not the same program"), "{e}");
    let one = Program::fit(&[Recording { snap: &f, size: 100 }], None).err().unwrap();
    assert_eq!(one, PredictError::TooFewRecordings(1));
    let one = one.to_string();
    assert!(one.contains("fragscope.torch.record") && !one.contains('\n'), "{one}");
    let zero = Program::fit(&[Recording { snap: &f, size: 0 }, Recording { snap: &t, size: 150 }], None).err();
    assert!(zero.unwrap().to_string().contains("size of 0"));
    let same = Program::fit(&[Recording { snap: &f, size: 7 }, Recording { snap: &f, size: 7 }], None).err();
    assert_eq!(same, Some(PredictError::DuplicateSize(7)));
    assert!(same.unwrap().to_string().contains("different size"));
}

/// `snap` cut after its first step, as `--window` cuts it.
fn after_first_step(snap: &Snapshot) -> Snapshot {
    let start = fragscope_trace::steps(snap, 0).steps[1].start;
    let spec = fragscope_diagnose::WindowSpec::parse(&format!("{start}..")).expect("a window");
    fragscope_diagnose::cut_window(snap, &spec).expect("cut").0
}

#[test]
fn an_expandable_recording_is_predicted_from_its_recorded_state() {
    // A real recording under expandable_segments:True, cut after its first step: its state
    // before the trace holds the H200's expandable reservations (small and large pool).
    // Seeded on an unlimited device they used to overlap ("started empty"): the parameters
    // and optimizer state vanished from the prediction.
    let p = fragscope_testdata::h200_dir().join("gpt-s512-b16-expandable.pickle.gz");
    let snap = after_first_step(&fragscope_snapshot::read_path(&p).expect("shipped in the repository"));
    let seeded = Seeded::rebuild(&snap, 0);
    assert!(seeded.segments().any(|s| s.expandable), "expandable reservations before the trace");
    let live = live_bytes(&seeded);
    let cfg = recorded_config(&snap);
    assert!(cfg.expandable_segments);
    let (rr, ra) = own_peaks(&snap, 0);
    let truth = fragscope_replay::simulate(&snap, 0, cfg.clone(), None);
    assert_eq!(truth.start_state, fragscope_replay::StartState::Rebuilt, "{:?}", truth.notes);
    assert_eq!((rr, ra), (truth.peak_reserved, truth.peak_allocated), "the replay as itself");
    assert!(ra > live, "the peak holds what was live before the trace ({live} B): {ra}");
    // Without a capacity, the same answer as with a large one.
    let prog = own_program(&snap, 0);
    let big = prog.predict(1, &cfg, Some(140 << 30));
    let free = prog.predict(1, &cfg, None);
    assert!(free.notes.iter().all(|n| !n.contains("started empty")), "{:?}", free.notes);
    assert_eq!((free.peak_reserved, free.peak_allocated), (big.peak_reserved, big.peak_allocated));
    assert!(big.fits());
}

#[test]
fn a_warm_expandable_template_keeps_its_parameters_at_the_reservation_start() {
    // h200 batch 32 replayed under expandable_segments:True, written back and cut after its
    // first step, as the frozen evaluation's warm-expandable form: its blocks carry no
    // stacks, so the parameters are told from AdamW's state (same sizes) by address
    // (`warm::parameters_first`). Counted in seeding order instead, the "parameters" spanned
    // 8.4 GB of the reservation and the embedding at its start was called optimizer state.
    let p = fragscope_testdata::h200_dir().join("gpt-s512-b32.pickle.gz");
    let cold = fragscope_snapshot::read_path(&p).expect("shipped in the repository");
    let mut cfg = recorded_config(&cold);
    cfg.expandable_segments = true;
    let opts = fragscope_replay::SimOptions { collect_snapshot: true, ..Default::default() };
    let written = fragscope_replay::simulate_with(&cold, 0, cfg, &opts).snapshot.expect("collected");
    let snap = after_first_step(&written);
    let seeded = Seeded::rebuild(&snap, 0);
    let first = snap.trace(0).iter().position(|e| e.action == Action::Alloc).expect("a request");
    let plan = warm::first_step(&snap, 0, first, &seeded).expect("a training template");
    let dropped: std::collections::HashSet<u64> = plan.dropped.iter().copied().collect();
    let large = seeded.segments().find(|s| s.expandable && !s.small).expect("the large pool's reservation");
    let kept: Vec<(u64, u64)> = large
        .blocks
        .iter()
        .filter(|b| b.state == fragscope_replay::BState::Allocated && !dropped.contains(&b.addr))
        .map(|b| (b.addr, b.size))
        .collect();
    let bytes: u64 = kept.iter().map(|b| b.1).sum();
    let lo = kept.iter().map(|b| b.0).min().expect("parameters in the large pool");
    let hi = kept.iter().map(|b| b.0 + b.1).max().expect("parameters in the large pool");
    assert_eq!(lo, large.addr, "the first parameter at the reservation's start");
    assert!(bytes > 600 << 20, "the large parameters ({bytes} B)");
    assert!(hi - lo < bytes + bytes / 10, "parameters span {} B for {bytes} B", hi - lo);
}

#[test]
fn inside_and_overlaps_read_sorted_ranges() {
    let ranges = [(100, 200), (300, 400)];
    assert!(inside(&ranges, 100) && inside(&ranges, 199) && inside(&ranges, 300));
    assert!(!inside(&ranges, 99) && !inside(&ranges, 200) && !inside(&ranges, 250) && !inside(&ranges, 400));
    assert!(overlaps(&ranges, 150, 10) && overlaps(&ranges, 50, 51) && overlaps(&ranges, 399, 5));
    assert!(!overlaps(&ranges, 200, 100) && !overlaps(&ranges, 0, 100) && !overlaps(&ranges, 400, 10));
    assert!(!inside(&[], 5) && !overlaps(&[], 5, 5));
}
