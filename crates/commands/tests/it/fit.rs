//! `fit`: every option listed fits when replayed on its own (re-run here from the option's
//! own fields, not from the search's runs), and no cheaper single change the search left out
//! fits (brute force over every layer subset and rank count on small cases).

use std::path::{Path, PathBuf};

use fragscope_commands::fit::{evaluate, CardFit, CostClass, DeviceFit, Fit, FitOption, Request};
use fragscope_commands::{ErrorKind, Words};
use fragscope_diagnose::{simulate_change_sets, simulate_empty_cache, CheckpointLayers, EmptyCacheAt, RoleChange};
use fragscope_replay::{recorded_config, simulate, WhatIf};
use fragscope_snapshot::Snapshot;

fn h200(name: &str) -> PathBuf {
    fragscope_testdata::h200_dir().join(name)
}

fn read(p: &Path) -> Snapshot {
    fragscope_snapshot::read_path(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn fit(snap: &Snapshot, capacity: &str) -> Fit {
    let req = Request { capacity: capacity.into(), ..Default::default() };
    evaluate(&["f".into()], &[snap], &req).expect("fit")
}

/// The option replayed again from its fields alone, through the public replay API.
fn replay_option(snap: &Snapshot, device: i64, o: &FitOption, cap: u64) -> WhatIf {
    let cfg = fragscope_alloc::parse_config(&o.config).expect("the option's config parses");
    let mut changes = Vec::new();
    if let Some(z) = &o.zero {
        changes.push(RoleChange::ShardOptimizer(z.ranks));
        if z.stage == 2 {
            changes.push(RoleChange::ShardGradients(z.ranks));
        }
    }
    if o.set_to_none {
        changes.push(RoleChange::GradsSetToNone);
    }
    if !o.checkpoint_layers.is_empty() {
        changes.push(RoleChange::Checkpoint(CheckpointLayers::Some(o.checkpoint_layers.clone())));
    }
    if o.empty_cache_at_steps {
        assert!(changes.is_empty(), "empty_cache() is not combined with role changes: {}", o.change);
        return simulate_empty_cache(snap, device, cfg, Some(cap), &EmptyCacheAt::Steps).expect("replayable");
    }
    if changes.is_empty() {
        return simulate(snap, device, cfg, Some(cap));
    }
    let r = simulate_change_sets(snap, device, &[changes], cfg, Some(cap), &[]).remove(0);
    assert!(r.changes.iter().all(|c| c.applied), "{}: {:?}", o.change, r.changes);
    r.changed.expect("applied")
}

fn fits(w: &WhatIf, cap: u64) -> bool {
    w.ooms == 0 && w.peak_reserved <= cap
}

/// Every option of every card fits when replayed on its own, with the figures it shows;
/// returns how many options were checked.
fn check_options(snap: &Snapshot, f: &Fit) -> usize {
    let mut n = 0;
    for d in &f.files[0].devices {
        for c in &d.cards {
            let mut last = None;
            for o in &c.options {
                if o.size.is_some() {
                    continue; // a predicted size: not a replay of this recording
                }
                let w = replay_option(snap, d.device, o, c.capacity_bytes);
                assert!(
                    fits(&w, c.capacity_bytes),
                    "{} on {}: {} does not fit",
                    o.change,
                    c.capacity,
                    fs(w.peak_reserved)
                );
                assert_eq!((w.peak_reserved, w.peak_allocated), (o.peak_reserved, o.peak_allocated), "{}", o.change);
                assert_eq!(o.margin, c.capacity_bytes - w.peak_reserved);
                assert_eq!(
                    o.model,
                    o.zero.is_some() || o.set_to_none || !o.checkpoint_layers.is_empty(),
                    "{}",
                    o.change
                );
                // Ranked: classes never go down.
                assert!(last.is_none_or(|l| l <= o.cost_class), "{} ranked after a costlier class", o.change);
                last = Some(o.cost_class);
                n += 1;
            }
            assert_eq!(c.fits_as_recorded, c.options.first().is_some_and(|o| o.cost_class == CostClass::None));
            if c.options.is_empty() {
                assert!(
                    !c.smallest_capacity.is_empty(),
                    "nothing fits on {}: the smallest capacity is said",
                    c.capacity
                );
                for s in &c.smallest_capacity {
                    assert!(s.bytes > c.capacity_bytes, "{}: {} needs {} ≤ the card", c.capacity, s.change, s.bytes);
                }
            }
        }
    }
    n
}

fn fs(b: u64) -> String {
    fragscope_alloc::format_size(b)
}

/// Capacities around a device's peak: as recorded fits, then less and less.
fn capacities(snap: &Snapshot) -> String {
    let d = fragscope_replay::replayable_devices(snap)[0];
    let peak = simulate(snap, d, recorded_config(snap), None).peak_reserved;
    [1.05, 0.95, 0.85, 0.7, 0.5, 0.3]
        .iter()
        .map(|f| ((peak as f64 * f) as u64).to_string())
        .collect::<Vec<_>>()
        .join(",")
}

#[test]
fn every_option_listed_fits_when_replayed_on_its_own() {
    let mut files =
        vec![h200("gpt-s512-b16.pickle.gz"), h200("gpt-s1024-b8.pickle.gz"), h200("live-mlp-20-steps.pickle.gz")];
    files.extend(fragscope_testdata::grid_file("niu-train3-ctx200-fp32.pickle"));
    if fragscope_testdata::has_corpus() {
        files.extend(fragscope_testdata::real_file("cs336-2.7b-trainstep-ctx128-fp32.pickle"));
        files.extend(fragscope_testdata::real_file("pytorchblog-resnet50-train-cppframes.pickle"));
    } else {
        fragscope_testdata::skip("fit on the corpus's training recordings");
    }
    let (mut options, mut compute) = (0, 0);
    for p in &files {
        let snap = read(p);
        let f = fit(&snap, &capacities(&snap));
        let n = check_options(&snap, &f);
        assert!(n > 0, "{}: no option on any capacity", p.display());
        options += n;
        compute += f.files[0]
            .devices
            .iter()
            .flat_map(|d| &d.cards)
            .flat_map(|c| &c.options)
            .filter(|o| o.cost_class >= CostClass::Compute)
            .count();
    }
    assert!(options >= 3 * files.len(), "{options} options on {} files", files.len());
    assert!(compute > 0, "no option that costs compute or communication was found on any file");
}

/// The cheapest pure checkpointing option and pure ZeRO options of a card, if listed.
fn cheapest(c: &CardFit) -> (Option<&FitOption>, Option<&FitOption>, Option<&FitOption>) {
    let pure = |o: &&FitOption| o.setting.is_none() && !o.set_to_none && !o.empty_cache_at_steps;
    let ck = c.options.iter().filter(pure).find(|o| o.zero.is_none() && !o.checkpoint_layers.is_empty());
    let z = |st: u8| {
        c.options
            .iter()
            .filter(pure)
            .find(|o| o.checkpoint_layers.is_empty() && o.zero.as_ref().is_some_and(|z| z.stage == st))
    };
    (ck, z(1), z(2))
}

/// Brute force on the 8-layer GPT at capacities where compute or communication is needed:
/// no allocator setting, set_to_none or empty_cache() alone fits when the search says no
/// free change does; no subset of fewer layers (nor of less forward time) than the
/// cheapest checkpointing listed fits; no ZeRO over fewer ranks fits.
#[test]
fn no_cheaper_single_change_the_search_skipped_fits() {
    let p = h200("gpt-s512-b16.pickle.gz");
    let snap = read(&p);
    let d = 0;
    let recorded = recorded_config(&snap);
    let mut checked = 0;
    for cap_text in ["10GB", "9GB", "8GB"] {
        let f = fit(&snap, cap_text);
        let dev: &DeviceFit = &f.files[0].devices[0];
        let c = &dev.cards[0];
        let cap = c.capacity_bytes;
        assert!(!c.fits_as_recorded);
        let free_fits = c.options.iter().any(|o| o.cost_class <= CostClass::DriverCalls);
        if !free_fits {
            for alt in fragscope_replay::ALTERNATIVES {
                let cfg = fragscope_replay::config_on_top(&recorded, alt).unwrap();
                assert!(!fits(&simulate(&snap, d, cfg.clone(), Some(cap)), cap), "{alt} fits on {cap_text}");
                let ec = simulate_empty_cache(&snap, d, cfg, Some(cap), &EmptyCacheAt::Steps).unwrap();
                assert!(!fits(&ec, cap), "{alt} + empty_cache fits on {cap_text}");
            }
            let stn =
                simulate_change_sets(&snap, d, &[vec![RoleChange::GradsSetToNone]], recorded.clone(), Some(cap), &[]);
            assert!(!stn[0].changed.as_ref().is_some_and(|w| fits(w, cap)), "set_to_none fits on {cap_text}");
        }
        let (ck, z1, z2) = cheapest(c);
        let n = dev.layers;
        assert_eq!(n, 8, "the GPT has 8 layers");
        // Every subset of layers, replayed in one batch (one replay of the recording).
        let subsets: Vec<Vec<usize>> =
            (1u32..(1 << n)).map(|m| (0..n).filter(|j| m & (1 << j) != 0).collect()).collect();
        let sets: Vec<Vec<RoleChange>> =
            subsets.iter().map(|s| vec![RoleChange::Checkpoint(CheckpointLayers::Some(s.clone()))]).collect();
        let runs = simulate_change_sets(&snap, d, &sets, recorded.clone(), Some(cap), &[]);
        let time = |s: &[usize]| s.iter().map(|&j| dev.layer_forward_us[j].unwrap_or(0)).sum::<u64>();
        // The fewest layers and the least recomputation the pure checkpointing options list.
        let pure_ck = c
            .options
            .iter()
            .filter(|x| x.zero.is_none() && x.setting.is_none() && !x.set_to_none && !x.checkpoint_layers.is_empty());
        let fewest = pure_ck.clone().map(|x| x.checkpoint_layers.len()).min();
        let least = pure_ck.filter_map(|x| x.recompute_us_per_step).min();
        assert_eq!(fewest.is_some(), ck.is_some());
        for (s, r) in subsets.iter().zip(&runs) {
            let ok = r.changed.as_ref().is_some_and(|w| fits(w, cap));
            let cheaper = fewest.is_none_or(|k| s.len() < k) || least.is_some_and(|t| time(s) < t);
            assert!(
                !(ok && cheaper),
                "{cap_text}: checkpointing {s:?} fits, cheaper than every checkpointing option listed"
            );
            checked += 1;
        }
        for (stage, best) in [(1u8, z1), (2, z2)] {
            let limit = best.and_then(|o| o.zero.as_ref()).map_or(fragscope_commands::fit::MAX_RANKS + 1, |z| z.ranks);
            let sets: Vec<Vec<RoleChange>> = (2..limit)
                .map(|n| {
                    let mut v = vec![RoleChange::ShardOptimizer(n)];
                    if stage == 2 {
                        v.push(RoleChange::ShardGradients(n));
                    }
                    v
                })
                .collect();
            for (k, r) in simulate_change_sets(&snap, d, &sets, recorded.clone(), Some(cap), &[]).iter().enumerate() {
                assert!(
                    !r.changed.as_ref().is_some_and(|w| fits(w, cap)),
                    "{cap_text}: ZeRO-{stage} over {} fits",
                    k + 2
                );
                checked += 1;
            }
        }
    }
    assert!(checked > 3 * 255, "{checked} single changes brute-forced");
}

#[test]
fn with_sizes_the_largest_size_that_fits_is_an_option() {
    let names = ["niu-train3-ctx100-fp32.pickle", "niu-train3-ctx150-fp32.pickle", "niu-train3-ctx200-fp32.pickle"];
    let Some(paths) = names.iter().map(|n| fragscope_testdata::grid_file(n)).collect::<Option<Vec<_>>>() else {
        return;
    };
    let snaps: Vec<Snapshot> = paths.iter().map(|p| read(p)).collect();
    let refs: Vec<&Snapshot> = snaps.iter().collect();
    let top = &snaps[2];
    let peak = simulate(top, 0, recorded_config(top), None).peak_reserved;
    let req = Request {
        capacity: ((peak as f64 * 0.9) as u64).to_string(),
        sizes: vec![100, 150, 200],
        device: Some(0),
        at: None,
    };
    let f = evaluate(&names.map(String::from), &refs, &req).unwrap();
    assert_eq!(f.files[0].size, Some(200), "the largest recording is the run fitted");
    let c = &f.files[0].devices[0].cards[0];
    let o = c.options.iter().find(|o| o.size.is_some()).unwrap_or_else(|| panic!("no size option: {}", c.verdict));
    assert!(o.size.unwrap() < 200 && o.peak_reserved <= c.capacity_bytes && o.model, "{o:?}");
    assert_eq!(o.cost_class, CostClass::Size);
    check_options(top, &f);
}

#[test]
fn bad_requests_are_refused_naming_the_parameter() {
    let cases: &[(Request, usize, &str)] = &[
        (Request::default(), 1, "--capacity is required"),
        (Request { capacity: "40 potatoes".into(), ..Default::default() }, 1, "invalid capacity '40 potatoes'"),
        (Request { capacity: "A100-40GB,,L40S".into(), ..Default::default() }, 1, "invalid capacity"),
        (Request { capacity: "0".into(), ..Default::default() }, 1, "a device of 0 bytes"),
        (
            Request { capacity: "40GB".into(), sizes: vec![1, 2], ..Default::default() },
            3,
            "--sizes gives 2 size(s) for 3 file(s)",
        ),
        (Request { capacity: "40GB".into(), sizes: vec![2, 2], ..Default::default() }, 2, ""),
        (Request { capacity: "40GB".into(), ..Default::default() }, 0, "needs a snapshot"),
    ];
    for (req, files, want) in cases {
        let e = req.check(*files).expect_err(want);
        assert_eq!(e.kind, ErrorKind::InvalidArgument, "{want}");
        let line = e.render(Words::Cli);
        assert!(line.contains(want) && !line.contains('\n'), "{line:?} lacks {want:?}");
    }
    let e = Request::default().check(1).unwrap_err();
    assert!(e.render(Words::Python).starts_with("capacity is required"), "{}", e.render(Words::Python));
    let snap = read(&h200("gpt-s256-b8.pickle.gz"));
    let req = Request { capacity: "40GB".into(), device: Some(3), ..Default::default() };
    let e = evaluate(&["f".into()], &[&snap], &req).unwrap_err();
    assert!(e.render(Words::Cli).starts_with("--device=3: f has no replayable trace on device 3"), "{e:?}");
}

#[test]
fn a_list_of_gpus_gives_one_answer_per_card_and_the_smallest_capacity_when_nothing_fits() {
    let snap = read(&h200("gpt-s256-b8.pickle.gz"));
    let f = fit(&snap, "T4,1GB,H100-80GB");
    let cards = &f.files[0].devices[0].cards;
    assert_eq!(cards.iter().map(|c| c.capacity.as_str()).collect::<Vec<_>>(), ["T4", "1GB", "H100-80GB"]);
    assert!(cards[2].fits_as_recorded && cards[2].verdict.starts_with("fits on H100-80GB"), "{}", cards[2].verdict);
    let tiny = &cards[1];
    assert!(tiny.options.is_empty(), "{:?}", tiny.options);
    let s = &tiny.smallest_capacity[0];
    assert_eq!(s.change, "as recorded");
    // Found by replay: it fits there and not 2 MiB below.
    let cfg = recorded_config(&snap);
    assert!(fits(&simulate(&snap, 0, cfg.clone(), Some(s.bytes)), s.bytes));
    assert!(!fits(&simulate(&snap, 0, cfg, Some(s.bytes - (2 << 20))), s.bytes - (2 << 20)));
    assert!(s.gpus.contains(&"T4") == (s.bytes <= fragscope_replay::parse_capacity("T4").unwrap()));
    assert!(tiny.verdict.starts_with("nothing tried fits on 1GB"), "{}", tiny.verdict);
    check_options(&snap, &f);
}

/// `sizes` + `at`: the run predicted at a size nobody recorded is fitted; every option is
/// that prediction (or a smaller size) predicted again from its own fields and fits with
/// the figures it shows, and a size above the card's reach gets the largest size that fits.
#[test]
fn with_sizes_and_at_the_predicted_run_is_fitted() {
    let names = ["niu-train3-ctx100-fp32.pickle", "niu-train3-ctx150-fp32.pickle", "niu-train3-ctx200-fp32.pickle"];
    let Some(paths) = names.iter().map(|n| fragscope_testdata::grid_file(n)).collect::<Option<Vec<_>>>() else {
        fragscope_testdata::skip("fit of a predicted run: the niu-train3 grid");
        return;
    };
    let snaps: Vec<Snapshot> = paths.iter().map(|p| read(p)).collect();
    let refs: Vec<&Snapshot> = snaps.iter().collect();
    let recs: Vec<fragscope_predict::Recording> =
        refs.iter().zip([100, 150, 200]).map(|(&snap, size)| fragscope_predict::Recording { snap, size }).collect();
    let prog = fragscope_predict::Program::fit(&recs, Some(0)).unwrap();
    let at = 300;
    let cfg = recorded_config(&snaps[2]);
    let peak = prog.predict(at, &cfg, None).peak_reserved;
    let caps = [(peak as f64 * 1.1) as u64, (peak as f64 * 0.9) as u64, (peak as f64 * 0.2) as u64];
    let capacity = caps.map(|c| c.to_string()).join(",");
    let req = Request { capacity, sizes: vec![100, 150, 200], device: Some(0), at: Some(at) };
    let f = evaluate(&names.map(String::from), &refs, &req).unwrap();
    let file = &f.files[0];
    assert!(file.predicted && file.size == Some(at), "{file:?}");
    let d = &file.devices[0];
    assert_eq!(d.peak_reserved_unlimited, peak, "the unlimited figure is the prediction's");
    assert!(d.live_bytes_peak.is_none(), "no live bytes for a synthesised trace");
    let cards = &d.cards;
    assert!(cards[0].fits_as_recorded && cards[0].verdict.contains("as predicted"), "{}", cards[0].verdict);
    assert!(!cards[1].fits_as_recorded, "{}", cards[1].verdict);
    let mut sizes = 0;
    for c in cards {
        for o in &c.options {
            assert!(o.model && o.basis.starts_with("predicted at size"), "{o:?}");
            let cfg = fragscope_alloc::parse_config(&o.config).unwrap();
            let p = prog.predict(o.size.unwrap_or(at), &cfg, Some(c.capacity_bytes));
            assert!(p.fits() && p.peak_reserved <= c.capacity_bytes, "{} on {}", o.change, c.capacity);
            assert_eq!((p.peak_reserved, p.peak_allocated), (o.peak_reserved, o.peak_allocated), "{}", o.change);
            assert_eq!(o.margin, c.capacity_bytes - o.peak_reserved);
            if let Some(x) = o.size {
                assert!(x < at && o.cost_class == CostClass::Size, "{o:?}");
                // The largest: the next size up does not fit under the same settings.
                let next = prog.predict(x + 1, &cfg, Some(c.capacity_bytes));
                assert!(!(next.fits() && next.peak_reserved <= c.capacity_bytes), "{} fits too", x + 1);
                sizes += 1;
            }
        }
        let said = c.pruned.iter().any(|p| p.contains("not searched on a predicted run"));
        assert_eq!(said, !c.fits_as_recorded, "{:?}", c.pruned);
        if c.options.is_empty() {
            let s = &c.smallest_capacity[0];
            assert!(s.bytes > c.capacity_bytes && s.change == "as predicted", "{s:?}");
        }
    }
    assert!(sizes > 0, "no smaller size offered on a card the prediction overflows");
    // `at` needs `sizes`.
    let e = Request { capacity: "40GB".into(), at: Some(64), ..Default::default() }.check(1).unwrap_err();
    assert!(e.render(Words::Cli).starts_with("--at needs --sizes"), "{}", e.render(Words::Cli));
}

/// Replays `sets` of role-level changes under the recorded settings on `cap` bytes: which fit.
fn role_sets_fit(snap: &Snapshot, d: i64, sets: &[Vec<RoleChange>], cap: u64) -> Vec<bool> {
    simulate_change_sets(snap, d, sets, recorded_config(snap), Some(cap), &[])
        .iter()
        .map(|r| r.changes.iter().all(|c| c.applied) && r.changed.as_ref().is_some_and(|w| fits(w, cap)))
        .collect()
}

/// Every subset of `0..n` with fewer than `below` layers, when there are at most `budget`
/// of them (else the sizes up to the largest that keeps within it); the subset sizes covered.
fn subsets(n: usize, below: usize, budget: usize) -> (Vec<Vec<usize>>, usize) {
    let choose = |k: usize| (0..k).fold(1u128, |a, i| a * (n - i) as u128 / (i as u128 + 1));
    let (mut upto, mut total) = (0, 0u128);
    while upto + 1 < below && upto < n && total + choose(upto + 1) <= budget as u128 {
        upto += 1;
        total += choose(upto);
    }
    let mut v = Vec::new();
    let mut s: Vec<usize> = Vec::new();
    fn rec(j: usize, n: usize, upto: usize, s: &mut Vec<usize>, v: &mut Vec<Vec<usize>>) {
        if !s.is_empty() {
            v.push(s.clone());
        }
        if s.len() == upto {
            return;
        }
        for k in j..n {
            s.push(k);
            rec(k + 1, n, upto, s, v);
            s.pop();
        }
    }
    rec(0, n, upto, &mut s, &mut v);
    (v, upto)
}

/// Brute force on one snapshot at each capacity (issue 41, "Done means"): every listed
/// option fits replayed alone ([`check_options`]), and every single change the search can
/// make — each allocator setting, `set_to_none`, `empty_cache()` at the steps, ZeRO-1 and
/// ZeRO-2 over every rank count, checkpointing every subset of layers (all of them with
/// 10 layers or fewer; else every subset up to the size a budget of 600 replays allows) —
/// that fits has an option listed at least as cheap. Returns the single changes replayed.
fn brute_force(what: &str, snap: &Snapshot, fractions: &[f64]) -> usize {
    let d = fragscope_replay::replayable_devices(snap)[0];
    let recorded = recorded_config(snap);
    let peak = simulate(snap, d, recorded.clone(), None).peak_reserved;
    let caps: Vec<String> = fractions.iter().map(|f| ((peak as f64 * f) as u64).to_string()).collect();
    let f = fit(snap, &caps.join(","));
    check_options(snap, &f);
    let dev = f.files[0].devices.iter().find(|x| x.device == d).unwrap();
    let mut replayed = 0;
    for c in &dev.cards {
        let cap = c.capacity_bytes;
        let at = format!("{what} on {}", fs(cap));
        if c.fits_as_recorded {
            continue; // nothing is cheaper than no change
        }
        let listed = |p: &dyn Fn(&FitOption) -> bool| c.options.iter().any(p);
        let pure = |o: &FitOption| o.setting.is_none() && !o.set_to_none && !o.empty_cache_at_steps;
        // Free changes: each that fits is listed as it is.
        for alt in fragscope_replay::ALTERNATIVES {
            let cfg = fragscope_replay::config_on_top(&recorded, alt).unwrap();
            if cfg == recorded {
                continue;
            }
            let w = simulate(snap, d, cfg.clone(), Some(cap));
            let name = cfg.to_conf_string();
            if fits(&w, cap) {
                assert!(
                    listed(&|o| o.config == name
                        && !o.set_to_none
                        && !o.empty_cache_at_steps
                        && o.zero.is_none()
                        && o.checkpoint_layers.is_empty()),
                    "{at}: {alt} fits and is not listed"
                );
            }
            // Err: no step boundary to call it at (the search cannot apply it either).
            let ec = simulate_empty_cache(snap, d, cfg, Some(cap), &EmptyCacheAt::Steps);
            if ec.is_ok_and(|w| fits(&w, cap)) {
                assert!(listed(&|o| o.cost_class <= CostClass::DriverCalls), "{at}: {alt} + empty_cache() fits");
            }
            replayed += 2;
        }
        let ec = simulate_empty_cache(snap, d, recorded.clone(), Some(cap), &EmptyCacheAt::Steps);
        assert!(
            !ec.is_ok_and(|w| fits(&w, cap)) || listed(&|o| o.cost_class <= CostClass::DriverCalls),
            "{at}: empty_cache() fits"
        );
        if role_sets_fit(snap, d, &[vec![RoleChange::GradsSetToNone]], cap)[0] {
            assert!(listed(&|o| o.set_to_none && o.setting.is_none() && o.cost_class == CostClass::Free), "{at}: stn");
        }
        replayed += 2;
        // A free change fits: the costlier ones are not needed (the search stops there).
        if listed(&|o| o.cost_class <= CostClass::DriverCalls) {
            continue;
        }
        // ZeRO: no sharding cheaper than the cheapest listed fits (fewer ranks, then the
        // lower stage: ZeRO-1 over n ranks is listed instead of ZeRO-2 over n).
        let best = c
            .options
            .iter()
            .filter(|o| pure(o) && o.checkpoint_layers.is_empty())
            .filter_map(|o| o.zero.as_ref().map(|z| (z.ranks, z.stage)))
            .min()
            .unwrap_or((fragscope_commands::fit::MAX_RANKS + 1, 0));
        for stage in [1u8, 2] {
            let sets: Vec<Vec<RoleChange>> = (2..=fragscope_commands::fit::MAX_RANKS)
                .map(|n| {
                    let mut v = vec![RoleChange::ShardOptimizer(n)];
                    if stage == 2 {
                        v.push(RoleChange::ShardGradients(n));
                    }
                    v
                })
                .collect();
            for (k, ok) in role_sets_fit(snap, d, &sets, cap).into_iter().enumerate() {
                let n = k as u32 + 2;
                assert!(!(ok && (n, stage) < best), "{at}: ZeRO-{stage} over {n} fits, cheapest listed {best:?}");
            }
            replayed += sets.len();
        }
        // Checkpointing: no subset of fewer layers (nor of less forward time) than the
        // cheapest pure checkpointing listed fits.
        let n = dev.layers;
        if n == 0 {
            continue;
        }
        let ck = c.options.iter().filter(|o| pure(o) && o.zero.is_none() && !o.checkpoint_layers.is_empty());
        let fewest = ck.clone().map(|o| o.checkpoint_layers.len()).min();
        let least = ck.filter_map(|o| o.recompute_us_per_step).min();
        let (sets, _) = subsets(n, if least.is_some() { n + 1 } else { fewest.unwrap_or(n + 1) }, 600);
        let time = |s: &[usize]| s.iter().map(|&j| dev.layer_forward_us[j].unwrap_or(0)).sum::<u64>();
        let changes: Vec<Vec<RoleChange>> =
            sets.iter().map(|s| vec![RoleChange::Checkpoint(CheckpointLayers::Some(s.clone()))]).collect();
        for (s, ok) in sets.iter().zip(role_sets_fit(snap, d, &changes, cap)) {
            let cheaper = fewest.is_none_or(|k| s.len() < k) || least.is_some_and(|t| time(s) < t);
            assert!(!(ok && cheaper), "{at}: checkpointing {s:?} fits, cheaper than every checkpointing listed");
        }
        replayed += sets.len();
    }
    eprintln!("{what}: {} layers, {replayed} single changes replayed", dev.layers);
    replayed
}

/// The brute force on small cases: the in-repository H200 recordings (8-layer GPTs, every
/// layer subset) and the MLP, the niu-train3 grid, and corpus training recordings cut
/// short with the windowing (their first training step).
#[test]
fn brute_force_no_single_change_that_fits_is_skipped() {
    let mut n = 0;
    for name in ["gpt-s256-b8.pickle.gz", "gpt-s512-b4.pickle.gz", "live-mlp-20-steps.pickle.gz"] {
        n += brute_force(name, &read(&h200(name)), &[0.95, 0.8, 0.6]);
    }
    match fragscope_testdata::grid_file("niu-train3-ctx150-fp32.pickle") {
        Some(p) => n += brute_force("niu-train3-ctx150", &read(&p), &[0.95, 0.8]),
        None => {
            fragscope_testdata::skip("fit brute force on the niu-train3 grid");
        }
    }
    // Corpus training recordings, cut short: the first part of the trace (`--window ..N`).
    let windowed = [
        ("pytorchblog-resnet50-train-cppframes.pickle", 0.5, &[0.9, 0.7][..]),
        ("ckpttry-activation-ckpt-toy.pickle", 0.6, &[0.9, 0.7][..]),
        ("cs336-sidsoc12-trainstep-ctx128-fp32.pickle", 0.8, &[0.75, 0.6][..]),
    ];
    for (name, part, fractions) in windowed {
        let Some(p) = fragscope_testdata::real_file(name) else {
            fragscope_testdata::skip("fit brute force on windowed corpus recordings");
            continue;
        };
        let snap = read(&p);
        let d = fragscope_replay::replayable_devices(&snap)[0];
        let window = format!("..{}", (snap.trace(d).len() as f64 * part) as usize);
        let spec = fragscope_diagnose::WindowSpec::parse(&window).unwrap();
        let (cut, _) = fragscope_diagnose::cut_window(&snap, &spec).unwrap();
        n += brute_force(&format!("{name} [window {window}]"), &cut, fractions);
    }
    assert!(n > 3 * 255, "{n} single changes replayed");
}

/// A change the model cannot apply is said so, never "does not fit" (issue 42's walk-through:
/// ZeRO on a forward-only recording read "24 of 24 pairs do not fit even over 64 ranks"),
/// and a smallest capacity every GPU has is said in words, not as the whole list.
#[test]
fn zero_on_a_forward_only_run_cannot_be_applied() {
    let p = fragscope_testdata::in_repo_dir().join("decomfl-opt-zeroth-order-windows.pickle");
    let snap = read(&p);
    let f = fit(&snap, "1MB");
    let c = &f.files[0].devices[0].cards[0];
    assert!(c.options.is_empty());
    assert!(
        // Said up front with the reason, not found out by replaying 24 (stage, base) pairs.
        c.pruned.iter().any(|p| p.starts_with("ZeRO: not applicable: no training step found")),
        "{:?}",
        c.pruned
    );
    assert!(!c.pruned.iter().any(|p| p.contains("do not fit even over")), "{:?}", c.pruned);
    assert!(!c.pruned.iter().any(|p| p.contains("pairs cannot be applied")), "{:?}", c.pruned);
    assert!(c.verdict.contains("(every GPU listed has it)"), "{}", c.verdict);
    assert_eq!(c.smallest_capacity[0].gpus.len(), fragscope_replay::known_gpus().len());
}

/// Pairs the role model cannot apply are pruned with the role model's own reason, not a
/// list of what it might have been (issue 38's review: magma27's gradients became known,
/// and the line still said "no optimizer state or gradients found").
#[test]
fn zero_pairs_that_cannot_be_applied_say_why() {
    let Some(p) = fragscope_testdata::real_file("pytorchblog-resnet50-train-cppframes.pickle") else { return };
    let snap = read(&p);
    let f = fit(&snap, "400MB");
    let c = &f.files[0].devices[0].cards[0];
    let line =
        c.pruned.iter().find(|p| p.contains("pairs cannot be applied")).unwrap_or_else(|| panic!("{:?}", c.pruned));
    assert!(line.contains(": no optimizer state found ("), "{line}");
    assert!(!line.contains(", or a change of the base"), "{line}");
}

/// `fit` offers `empty_cache()` at every step under an allocator setting; `replay --config
/// SETTING --empty-cache-at step` must replay that same change (it replayed `empty_cache()`
/// under the recorded settings, dropping the setting: the fit audit's finding on the H200
/// checkpointed recording). Near miss: without `--config` the placement stays under the
/// recorded settings, unlabelled.
#[test]
fn replay_empty_cache_at_steps_runs_under_the_config_given() {
    use fragscope_commands::replay::{replay_snapshot, ReplayRequest};
    let snap = read(&h200("gpt-s512-b16-ckpt.pickle.gz"));
    let cap = 7_540_918_190u64;
    let run = |configs: Vec<String>| {
        let req = ReplayRequest {
            configs,
            capacity: Some(format!("{cap}B")),
            empty_cache_at: vec!["step".into()],
            ..Default::default()
        };
        let out = replay_snapshot(&req, &req.check().unwrap(), &snap, &mut None).unwrap();
        out[0].whatif.clone().expect("what-if runs").pop().expect("the empty_cache() run, last")
    };
    let cfg = fragscope_alloc::parse_config("expandable_segments:True").unwrap();
    let want = simulate_empty_cache(&snap, 0, cfg, Some(cap), &EmptyCacheAt::Steps).unwrap();
    let w = run(vec!["expandable_segments:True".into()]);
    assert_eq!(w.config, "expandable_segments:True");
    assert_eq!((w.peak_reserved, w.ooms), (want.peak_reserved, want.ooms));
    assert!(w.advice.as_deref().is_some_and(|a| a.ends_with(" under expandable_segments:True")), "{:?}", w.advice);
    // Near miss: no --config, the recorded settings (the defaults), and no "under".
    let plain = run(Vec::new());
    let recorded = simulate_empty_cache(&snap, 0, recorded_config(&snap), Some(cap), &EmptyCacheAt::Steps).unwrap();
    assert_eq!(plain.config, "");
    assert_eq!((plain.peak_reserved, plain.ooms), (recorded.peak_reserved, recorded.ooms));
    assert!(plain.advice.as_deref().is_some_and(|a| !a.contains(" under ")), "{:?}", plain.advice);
    assert_ne!((plain.peak_reserved, plain.ooms), (w.peak_reserved, w.ooms), "the two settings differ here");
}

/// With recordings at several sizes and a card below the parameters, `fit` says why no
/// smaller size helps (the fit audit found it silent: "nothing tried fits" and no word on
/// sizes); near miss: on a card that holds them, the smaller size is an option and no such
/// line is printed.
#[test]
fn fit_with_sizes_says_why_no_smaller_size_fits() {
    let names = ["128", "256", "512"].map(|c| format!("kk-2.7b-fwd-ctx{c}-fp32.pickle"));
    let Some(paths) = names.iter().map(|n| fragscope_testdata::grid_file(n)).collect::<Option<Vec<_>>>() else {
        return;
    };
    let snaps: Vec<Snapshot> = paths.iter().map(|p| read(p)).collect();
    let refs: Vec<&Snapshot> = snaps.iter().collect();
    let names: Vec<String> = names.to_vec();
    let run = |cap: &str| {
        let req = Request { capacity: cap.into(), sizes: vec![128, 256, 512], ..Default::default() };
        evaluate(&names, &refs, &req).unwrap().files[0].devices[0].cards[0].clone()
    };
    let small = run("10GB");
    assert!(small.options.is_empty(), "{:?}", small.options);
    let line = small.pruned.iter().find(|p| p.starts_with("a smaller size: none")).expect("the sizes' line");
    assert!(line.contains("even at size 1, the state before the trace"), "{line}");
    assert!(line.contains("over the card"), "{line}");
    let big = run("40GB");
    assert!(big.options.iter().any(|o| o.cost_class == CostClass::Size), "{:?}", big.options);
    assert!(big.pruned.iter().all(|p| !p.starts_with("a smaller size")), "{:?}", big.pruned);
}
