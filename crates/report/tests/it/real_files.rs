//! The report's data on every real pickle: the curves peak where `analyze`'s timeline
//! does, the state at the end sums to `summary`'s totals, and the page is well formed.
//! (The browser tests in tests/browser check the drawn page itself.)

use fragscope_diagnose::{analyze, AnalyzeOptions};
use fragscope_report::layout::{Block, Segment};
use fragscope_report::{file_data, render, ReportOptions};
use fragscope_trace::summarize;

use crate::decode::f64s;

/// The timeline stacked by role against `summary`'s `roles.by_role`, figure for figure, read
/// from the page's buckets as the page reads them: `at_peak` the roles at the finest
/// bucket with the most allocated (its allocated maximum), `max` the largest of the
/// buckets' maxima; a role the page leaves out held nothing.
fn check_roles(what: &str, d: &fragscope_report::DeviceData, want: Option<&fragscope_trace::DeviceRoles>) {
    let (Some(r), Some(want)) = (&d.roles, want) else {
        assert!(
            d.roles.is_none() && want.is_none(),
            "{what}: roles on the page and in summary disagree on being there"
        );
        return;
    };
    let alloc = f64s(&d.curves.allocated);
    let amax = f64s(&d.curves.amax);
    let (at, mx) = (f64s(&r.at_amax), f64s(&r.max));
    let k = r.roles.len();
    let n = alloc.len();
    assert_eq!(at.len(), n * k, "{what}: role buckets");
    let p = (1..n).fold(0, |p, i| if alloc[i] > alloc[p] { i } else { p });
    assert_eq!(amax[p] as usize, want.peak_state, "{what}: the page's allocated peak is the roles' peak state");
    for (name, b) in &want.by_role {
        match r.roles.iter().position(|x| x == name) {
            Some(j) => {
                assert_eq!(at[p * k + j] as u64, b.at_peak, "{what}: {name} at the peak");
                let m = (0..n).map(|i| mx[i * k + j]).fold(0.0f64, f64::max);
                assert_eq!(m as u64, b.max, "{what}: {name} max");
            }
            None => assert_eq!(b.max, 0, "{what}: {name} held bytes but is not drawn"),
        }
    }
}

/// The role bands on the grids with training steps (parameters, gradients and Adam's
/// state known), where every role is drawn, at the default budget and at a small one.
#[test]
fn roles_on_the_timeline_match_summary_on_training_grids() {
    for name in ["niu-train3-ctx100-fp32.pickle", "niu-train3-ctx200-fp32.pickle"] {
        let Some(path) = fragscope_testdata::grid_file(name) else { continue };
        let snap = fragscope_snapshot::read_path(&path).unwrap();
        let sum = summarize(&snap);
        for buckets in [8192, 700, 64] {
            let data = file_data(name, false, &snap, &ReportOptions { buckets, ..ReportOptions::default() });
            for d in &data.devices {
                let s = sum.devices.iter().find(|x| x.device == d.device).unwrap();
                let r = d.roles.as_ref().expect("a trace: roles drawn");
                for role in ["parameters", "gradients", "optimizer_state"] {
                    assert!(r.roles.contains(&role), "{name}: {role} drawn");
                }
                check_roles(&format!("{name}, {buckets} buckets"), d, s.roles.as_ref());
            }
        }
    }
}

#[test]
fn report_data_agrees_with_summary_and_analyze() {
    let files = fragscope_testdata::real_pickles();
    for path in &files {
        let snap = fragscope_snapshot::read_path(path).unwrap();
        let data = file_data(&path.display().to_string(), false, &snap, &ReportOptions::default());
        let sum = summarize(&snap);
        let ana = analyze(&snap, &AnalyzeOptions::default());
        for d in &data.devices {
            let a = ana.devices.iter().find(|x| x.device == d.device).unwrap();
            let t = &a.fragmentation.timeline;
            let max = |s: &str| f64s(s).into_iter().fold(0.0f64, f64::max) as u64;
            assert_eq!(max(&d.curves.reserved), t.peak_reserved.bytes, "{}: reserved peak", path.display());
            // The drawn curve is the trace's sizes (the timeline's own curves); peak allocated,
            // as memory_stats counts block bytes, is at or above it (docs/glossary.md).
            let curve_peak = t.series.iter().map(|p| p.max.allocated).max().unwrap_or(t.start.allocated);
            assert_eq!(max(&d.curves.allocated), curve_peak, "{}: allocated curve", path.display());
            assert!(curve_peak <= t.peak_allocated.bytes, "{}: allocated peak", path.display());
            if let Some(end) = d.moments.iter().find(|m| m.kinds.contains(&"end")) {
                let s = sum.devices.iter().find(|x| x.device == d.device).unwrap();
                let segs = f64s(&end.segments);
                let blocks = f64s(&end.blocks);
                let reserved: f64 = segs.chunks(Segment::LEN).map(|c| Segment::from_values(c).size).sum();
                let allocated: f64 =
                    blocks.chunks(Block::LEN).map(Block::from_values).filter(|b| b.state == 1.0).map(|b| b.size).sum();
                assert_eq!(reserved as u64, s.all.reserved_bytes, "{}: reserved at the end", path.display());
                assert_eq!(allocated as u64, s.all.allocated_bytes, "{}: allocated at the end", path.display());
            }
            let s = sum.devices.iter().find(|x| x.device == d.device).unwrap();
            check_roles(&path.display().to_string(), d, s.roles.as_ref());
            // The page's summary takes its roles from analyze: as `summary` gives them.
            let page = data.summary["devices"].as_array().unwrap().iter().find(|x| x["device"] == d.device).unwrap();
            // memory_summary's table is computed once per device, by the timeline's walk
            // for the peak allocated (issue 42): the summary beside it does not run it again.
            assert!(page["memory_table"].is_null(), "{}: the table computed twice", path.display());
            let page_peak = data.analysis["devices"]
                .as_array()
                .unwrap()
                .iter()
                .find(|x| x["device"] == d.device)
                .map(|x| x["fragmentation"]["timeline"]["peak_allocated"]["bytes"].as_u64());
            assert_eq!(page_peak, Some(Some(t.peak_allocated.bytes)), "{}: the page's peak allocated", path.display());
            if let Some(table) = &s.memory_table {
                assert_eq!(
                    table.allocated_bytes.all.peak,
                    t.peak_allocated.bytes,
                    "{}: peak allocated",
                    path.display()
                );
            }
            assert_eq!(
                page["roles"],
                serde_json::to_value(&s.roles).unwrap(),
                "{}: the page's summary roles",
                path.display()
            );
        }
        let html = render(&[data]);
        assert!(!html.contains("{{"), "{}: a placeholder was left", path.display());
        assert_eq!(html.matches("</script>").count(), 2, "{}: data or code closed a script early", path.display());
        assert!(
            !html.contains("http://") && !html.contains("https://"),
            "{}: the page names a web address",
            path.display()
        );
    }
    if files.is_empty() {
        eprintln!("note: no real pickles; nothing checked");
    }
}

/// The segment timeline's lives add up, at every state of every real file, to the reserved
/// bytes of `analyze`'s timeline (where the timeline reads them from the segments).
#[test]
fn segment_lives_add_up_to_the_reserved_curve() {
    use fragscope_trace::{timeline_walk, OnLevels, TimelineOptions};
    let files = fragscope_testdata::real_pickles();
    let mut checked = 0;
    for path in &files {
        let snap = fragscope_snapshot::read_path(path).unwrap();
        for d in snap.devices() {
            let mut reserved = Vec::new();
            let tl = timeline_walk(
                &snap,
                d,
                &TimelineOptions { points: 1 },
                &mut OnLevels(|_, l| reserved.push(l.reserved)),
            );
            if tl.reserved_source != fragscope_trace::ReservedSource::Segments {
                continue;
            }
            let lives = fragscope_report::segments::segment_lives(&snap, d);
            // Sweep: +size at start, −size at end.
            let mut delta = vec![0i128; reserved.len() + 1];
            for l in &lives {
                delta[l.start.min(reserved.len())] += l.size as i128;
                if l.end != usize::MAX {
                    delta[l.end.min(reserved.len())] -= l.size as i128;
                }
            }
            let mut cur = 0i128;
            for (s, &r) in reserved.iter().enumerate() {
                cur += delta[s];
                assert_eq!(cur, r as i128, "{} cuda:{d}: reserved at state {s}", path.display());
            }
            checked += 1;
        }
    }
    assert!(checked >= fragscope_testdata::min_files(30), "{checked} devices checked");
}

/// The allocations drawn from before the trace are the blocks the timeline's walk seeds at
/// state 0: with room for all of them, their bytes are the timeline's allocated bytes at
/// state 0, on every real file (one rule, the walk's, for both).
#[test]
fn allocations_before_the_trace_are_the_timelines_seeded_blocks() {
    use fragscope_report::layout::Life;
    use fragscope_trace::{timeline, TimelineOptions};
    let files = fragscope_testdata::real_pickles();
    let opts = ReportOptions { top_allocations: 100_000, ..ReportOptions::default() };
    let mut seeded = 0;
    for path in &files {
        let snap = fragscope_snapshot::read_path(path).unwrap();
        let data = file_data(&path.display().to_string(), false, &snap, &opts);
        for d in &data.devices {
            let t = timeline(&snap, d.device, &TimelineOptions { points: 1 });
            let lives: Vec<Life> = f64s(&d.initial_allocations).chunks(Life::LEN).map(Life::from_values).collect();
            assert!(lives.len() < 100_000, "{}: room for every seeded block", path.display());
            let bytes: f64 = lives.iter().map(|l| l.size).sum();
            assert_eq!(bytes as u64, t.seeded.allocated_bytes, "{} cuda:{}", path.display(), d.device);
            seeded += usize::from(!lives.is_empty());
        }
    }
    assert!(seeded >= fragscope_testdata::min_count(10, 1), "{seeded} devices with blocks before the trace");
}

/// The what-if curves are the analysis' replays: one per trial (the recorded settings,
/// then every setting tried, in the analysis' order), each with the trial's figures, and
/// each curve peaks at the peak reserved bytes the analysis measured (its replay was run
/// from the trial's own configuration).
#[test]
fn whatif_curves_are_the_analysis_replays() {
    // Every real file, and the built-in example (its OOM is measured by replay: the one
    // file with what-ifs when the corpus is absent).
    let files = fragscope_testdata::real_pickles();
    let mut drawn = 0;
    for k in 0..=files.len() {
        // One snapshot in memory at a time.
        let (name, snap) = match k.checked_sub(1) {
            None => ("<built-in example>".to_string(), fragscope_commands::example::snapshot()),
            Some(i) => (files[i].display().to_string(), fragscope_snapshot::read_path(&files[i]).unwrap()),
        };
        let data = file_data(&name, false, &snap, &ReportOptions::default());
        for d in &data.devices {
            let what = format!("{name} cuda:{}", d.device);
            let a = data.analysis["devices"].as_array().unwrap().iter().find(|a| a["device"] == d.device).unwrap();
            let r = &a["recommendations"];
            if r["baseline"].is_null() || r["measured"] != true {
                assert!(d.whatif.is_empty(), "{what}: curves without replays");
                continue;
            }
            let trials: Vec<&serde_json::Value> =
                std::iter::once(&r["baseline"]).chain(r["tried"].as_array().unwrap()).collect();
            assert_eq!(d.whatif.len(), trials.len(), "{what}: one curve per trial");
            for (c, t) in d.whatif.iter().zip(trials) {
                assert_eq!(c.setting, t["setting"].as_str().unwrap(), "{what}");
                assert_eq!(c.peak_reserved_bytes, t["peak_reserved_bytes"].as_u64().unwrap(), "{what}: {}", c.setting);
                assert_eq!(c.first_oom_index.map(|i| i as u64), t["first_oom_index"].as_u64(), "{what}: {}", c.setting);
                let peak = f64s(&c.reserved).into_iter().fold(0.0f64, f64::max);
                assert_eq!(peak as u64, c.peak_reserved_bytes, "{what}: {}: the curve's peak", c.setting);
                drawn += 1;
            }
        }
    }
    assert!(drawn >= fragscope_testdata::min_count(6, 2), "{drawn} what-if curves checked");
}

/// A page of several files carries their comparison (`ranks`), each file's row read from
/// its analysis (the device with the largest reserved peak, the first among equals), the
/// median of those peaks, and the outliers by the rule; a page of one file carries none.
#[test]
fn a_page_of_several_files_carries_their_comparison() {
    let files: Vec<_> = fragscope_testdata::real_pickles().into_iter().take(5).collect();
    assert!(files.len() >= 3, "{} real pickles", files.len());
    let data: Vec<_> = files
        .iter()
        .map(|p| {
            let snap = fragscope_snapshot::read_path(p).unwrap();
            file_data(&p.display().to_string(), false, &snap, &ReportOptions::default().share(files.len()))
        })
        .collect();
    let page_data = |html: &str| -> serde_json::Value {
        let start = html.find("application/json\">").unwrap() + "application/json\">".len();
        serde_json::from_str(&html[start..start + html[start..].find("</script>").unwrap()]).unwrap()
    };
    let page = page_data(&render(&data));
    let ranks = &page["ranks"];
    let mut peaks = Vec::new();
    for (i, f) in data.iter().enumerate() {
        let devices = f.analysis["devices"].as_array().unwrap();
        let best = devices.iter().fold(None::<&serde_json::Value>, |b, d| {
            let p = |d: &serde_json::Value| d["fragmentation"]["timeline"]["peak_reserved"]["bytes"].as_u64().unwrap();
            if b.is_some_and(|b| p(b) >= p(d)) {
                b
            } else {
                Some(d)
            }
        });
        let row = &ranks["ranks"][i];
        let want = best.map_or(0, |d| d["fragmentation"]["timeline"]["peak_reserved"]["bytes"].as_u64().unwrap());
        assert_eq!(row["peak_reserved"].as_u64(), Some(want), "{}", f.name);
        assert_eq!(row["device"], best.map_or(serde_json::Value::Null, |d| d["device"].clone()), "{}", f.name);
        assert_eq!(row["file"], f.name.as_str());
        peaks.push(want);
    }
    let mut sorted = peaks.clone();
    sorted.sort_unstable();
    let n = sorted.len();
    let median = if n % 2 == 1 { sorted[n / 2] as f64 } else { (sorted[n / 2 - 1] + sorted[n / 2]) as f64 / 2.0 };
    assert_eq!(ranks["median_peak_reserved"].as_f64(), Some(median));
    let outliers: Vec<u64> =
        ranks["outliers"].as_array().unwrap().iter().map(|o| o["rank"].as_u64().unwrap()).collect();
    let want: Vec<u64> = (0..n as u64).filter(|&i| peaks[i as usize] as f64 > 1.1 * median).collect();
    assert_eq!(outliers, want);
    assert!(page_data(&render(&data[..1]))["ranks"].is_null(), "one file: no comparison");
}

/// The state view's keyframes taken in memory_summary's table walk
/// ([`fragscope_report::state::SharedWalk`]) are the ones its own backward walk takes
/// (positions, marks and every segment and block), on every real file and device, at
/// two budgets too small for deltas (full keyframes, and coarse ones); and that walk
/// serves most devices.
#[test]
fn keyframes_of_the_table_walk_are_the_state_views_own() {
    use fragscope_report::{curves, state};
    let files = fragscope_testdata::real_pickles();
    let (mut served, mut devices) = (0, 0);
    for path in &files {
        let snap = fragscope_snapshot::read_path(path).unwrap();
        for d in snap.devices() {
            for state_values in [200_000, 2_000] {
                let opts = ReportOptions { state_values, ..ReportOptions::default() };
                let shared = state::SharedWalk::new(&snap, d, &opts);
                let sink = Some(shared.marks_sink());
                let (_, tl) = fragscope_replay::watching(shared.watch(), || {
                    curves::curves_and_timeline_marked(&snap, d, &opts, 8, sink, None)
                });
                let marks = state::Marks::new(&snap, &tl);
                let own = state::walk_at(&snap, d, Some(marks), &opts);
                devices += 1;
                let Some(got) = shared.finish(marks) else {
                    // Not served: deltas were planned (at the larger budget, or on a
                    // short trace; the walk may then turn to keyframes only), the walk
                    // stopped, or the table's walk could not be made.
                    let planned_exact = state_values > 2_000 || snap.trace(d).len() < 100;
                    assert!(
                        planned_exact
                            || own.note.is_some()
                            || own.first > 0
                            || fragscope_replay::memory_table(&snap, d).is_err(),
                        "{} cuda:{d}: a full walk of keyframes the table's walk did not serve",
                        path.display()
                    );
                    continue;
                };
                served += 1;
                let what = format!("{} cuda:{d} ({state_values} values)", path.display());
                assert!(!own.exact && own.note.is_none(), "{what}");
                assert_eq!((got.first, got.coarse), (own.first, own.coarse), "{what}");
                assert_eq!(got.captured.len(), own.captured.len(), "{what}: keyframes");
                for (g, o) in got.captured.iter().zip(&own.captured) {
                    assert_eq!((g.0, &g.1), (o.0, &o.1), "{what}: position and marks");
                    assert!(g.2 == o.2, "{what}: the state at {} differs", g.0);
                }
            }
        }
    }
    assert!(served * 4 >= devices && served >= fragscope_testdata::min_count(20, 1), "{served} of {devices} served");
}
