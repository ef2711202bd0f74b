//! The ranges' frozen check (issue 37 item 4): every prediction's `[low, high]` holds the
//! real peak. The cases of the frozen evaluation ([`super::eval`]: every family, cold,
//! warm, expandable and warm-expandable; leave-one-out, up 2× and 4×, down, the template's
//! own size), and far out: the H200 GPT step at batches 168–172 (defaults) and 228–232
//! (`expandable_segments:True`) run for real without recording (`fit.jsonl`), predicted
//! from batches 4, 8, 16 (10.6 times past them) and 4, 8, 16, 32 (5.3 times). The
//! width of each range (`(high − low) / real`) is printed
//! (`cargo test -p fragscope-predict --test it ranges -- --nocapture`) and copied into
//! docs/fidelity.md; the `--max-fit` range must admit the batches that really fit.

use fragscope_alloc::AllocatorConfig;
use fragscope_predict::{Prediction, Program, Recording};
use fragscope_snapshot::Snapshot;

use super::eval::{expandable, load, truth, warm, FAMILIES};

/// One case: its label, the prediction, and the real peaks (reserved, allocated).
struct Case {
    label: String,
    p: Prediction,
    real: (u64, u64),
}

impl Case {
    fn inside(&self) -> (bool, bool) {
        let r = self.p.range.as_ref().expect("predict gives a range");
        let within = |[lo, hi]: [u64; 2], x: u64| lo <= x && x <= hi;
        (within(r.reserved, self.real.0), within(r.allocated, self.real.1))
    }
    /// Widths of the reserved and allocated ranges, % of the real peaks.
    fn widths(&self) -> (f64, f64) {
        let r = self.p.range.as_ref().expect("a range");
        let w = |[lo, hi]: [u64; 2], x: u64| (hi - lo) as f64 / x as f64 * 100.0;
        (w(r.reserved, self.real.0), w(r.allocated, self.real.1))
    }
}

/// (kind, fitted sizes, target) of a family of ascending `sizes`: leave-one-out, up
/// from the two smallest, down from the two largest, a fitted size, the template's own.
fn cases(sizes: &[u64]) -> Vec<(&'static str, Vec<u64>, u64)> {
    let n = sizes.len();
    let mut out: Vec<(&'static str, Vec<u64>, u64)> = Vec::new();
    if n >= 3 {
        for k in 0..n {
            let fit = sizes.iter().enumerate().filter(|&(j, _)| j != k).map(|(_, &s)| s).collect();
            out.push(("loo", fit, sizes[k]));
        }
        out.extend(sizes[2..].iter().map(|&t| ("up", sizes[..2].to_vec(), t)));
        out.extend(sizes[..n - 2].iter().map(|&t| ("down", sizes[n - 2..].to_vec(), t)));
    } else {
        out.push(("self", sizes.to_vec(), sizes[0]));
    }
    out.push(("own", sizes.to_vec(), sizes[n - 1]));
    let mut seen = Vec::new();
    out.retain(|c| {
        let fresh = !seen.contains(&(c.1.clone(), c.2));
        seen.push((c.1.clone(), c.2));
        fresh
    });
    out
}

fn family_cases() -> Vec<Case> {
    let mut out = Vec::new();
    for f in FAMILIES {
        for form in ["cold", "warm", "expandable", "warm-expandable"] {
            if form.starts_with("warm") && !f.steps() {
                continue;
            }
            let Some(raw) = f.sizes().iter().map(|&s| load(f, s)).collect::<Option<Vec<_>>>() else { continue };
            let snaps: Vec<Snapshot> = raw
                .into_iter()
                .zip(f.sizes())
                .map(|(s, size)| {
                    let what = format!("{} at {size}", f.name);
                    match form {
                        "cold" => s,
                        "warm" => warm(&s, &what),
                        "expandable" => expandable(&s),
                        _ => warm(&expandable(&s), &what),
                    }
                })
                .collect();
            let by_size = |s: u64| &snaps[f.sizes().iter().position(|&x| x == s).expect("a family size")];
            for (kind, fit, target) in cases(f.sizes()) {
                let recs: Vec<Recording> = fit.iter().map(|&s| Recording { snap: by_size(s), size: s }).collect();
                let prog = Program::fit(&recs, Some(0)).unwrap_or_else(|e| panic!("{} {fit:?}: {e}", f.name));
                let p = prog.predict(target, &prog.recorded_config.clone(), None);
                let label = format!("{} {form} {kind} {fit:?}->{target}", f.name);
                out.push(Case { label, p, real: truth(by_size(target)) });
            }
        }
    }
    out
}

/// One line of `fit.jsonl`: a real run of the GPT step, not recorded.
#[derive(serde::Deserialize)]
struct RealRun {
    batch: u64,
    conf: String,
    free_at_start: u64,
    fits: bool,
    max_memory_reserved: u64,
    max_memory_allocated: u64,
}

fn real_runs() -> Vec<RealRun> {
    let p = fragscope_testdata::h200_dir().join("fit.jsonl");
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    text.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}"))).collect()
}

/// The far cases: each real run predicted from batches 4, 8, 16 and from 4, 8, 16, 32
/// under its settings; and the `--max-fit` ranges on its free memory, which must admit
/// every batch that really fit.
fn far_cases() -> Vec<Case> {
    let h = fragscope_testdata::h200_dir();
    let snaps: Vec<Snapshot> = [4u64, 8, 16, 32]
        .iter()
        .map(|b| {
            let p = h.join(format!("gpt-s512-b{b}.pickle.gz"));
            fragscope_snapshot::read_path(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        })
        .collect();
    let runs = real_runs();
    assert_eq!(runs.len(), 8, "fit.jsonl: batches 168-172 and 228-232");
    let mut out = Vec::new();
    for n in [3usize, 4] {
        let recs: Vec<Recording> =
            snaps[..n].iter().zip([4u64, 8, 16, 32]).map(|(s, size)| Recording { snap: s, size }).collect();
        let prog = Program::fit(&recs, Some(0)).expect("one program");
        let sizes: Vec<u64> = recs.iter().map(|r| r.size).collect();
        for conf in ["", "expandable_segments:True"] {
            let cfg: AllocatorConfig = fragscope_replay::config_on_top(&prog.recorded_config, conf).expect("a setting");
            let cap = runs[0].free_at_start;
            let m = prog.max_fit_range(&cfg, cap, 1 << 12);
            let r = m.range.expect("max_fit_range gives a range");
            assert!(
                r.certain <= m.largest && m.largest <= r.might,
                "{sizes:?} {conf}: for certain {:?} <= answer {:?} <= might {:?}",
                r.certain,
                m.largest,
                r.might
            );
            for run in runs.iter().filter(|r| r.conf == conf) {
                assert!(run.fits, "fit.jsonl: batch {} fit", run.batch);
                let p = prog.predict(run.batch, &cfg, None);
                eprintln!(
                    "POINT h200-batch {sizes:?}->{} {}: vanished {}, reserved {} (real {}, {:+.2}%), allocated {} (real {}, {:+.2}%)",
                    run.batch,
                    if conf.is_empty() { "defaults" } else { conf },
                    p.vanished_requests,
                    p.peak_reserved,
                    run.max_memory_reserved,
                    (p.peak_reserved as f64 / run.max_memory_reserved as f64 - 1.0) * 100.0,
                    p.peak_allocated,
                    run.max_memory_allocated,
                    (p.peak_allocated as f64 / run.max_memory_allocated as f64 - 1.0) * 100.0
                );
                let label = format!(
                    "h200-batch far {sizes:?}->{} {}",
                    run.batch,
                    if conf.is_empty() { "defaults" } else { conf }
                );
                out.push(Case { label, p, real: (run.max_memory_reserved, run.max_memory_allocated) });
                assert!(
                    r.might.is_some_and(|x| x >= run.batch),
                    "{sizes:?} {conf}: batch {} really fits but --max-fit says it might fit only up to {:?} (answer {:?}, for certain {:?})",
                    run.batch,
                    r.might,
                    m.largest,
                    r.certain
                );
            }
            eprintln!(
                "MAXFIT h200-batch {sizes:?} {}: largest {:?}, for certain {:?}, might {:?} (really fit: {})",
                if conf.is_empty() { "defaults" } else { conf },
                m.largest,
                r.certain,
                r.might,
                runs.iter().filter(|r| r.conf == conf).map(|r| r.batch.to_string()).collect::<Vec<_>>().join(", ")
            );
        }
    }
    out
}

#[test]
fn ranges_hold_the_real_peak() {
    let mut cases = family_cases();
    cases.extend(far_cases());
    eprintln!("| case | real reserved | range reserved | width | real allocated | range allocated | width | open |");
    eprintln!("|---|---:|---:|---:|---:|---:|---:|---:|");
    let mut outside = Vec::new();
    for c in &cases {
        let r = c.p.range.as_ref().expect("a range");
        let (wr, wa) = c.widths();
        let (ir, ia) = c.inside();
        let mark = |b: bool| if b { "" } else { " OUTSIDE" };
        eprintln!(
            "| {} | {} | {}–{}{} | {wr:.2}% | {} | {}–{}{} | {wa:.2}% | {} |",
            c.label,
            c.real.0,
            r.reserved[0],
            r.reserved[1],
            mark(ir),
            c.real.1,
            r.allocated[0],
            r.allocated[1],
            mark(ia),
            r.open_requests
        );
        if !(ir && ia) {
            outside.push(c.label.clone());
        }
    }
    // What the ranges are known not to hold (docs/fidelity.md), each counted: a warm
    // template's cache (the range extends by the largest error the rebuild makes at a
    // recorded size, 3 % at least; under expandable segments the range also holds the
    // first step rebuilt from the parameters, and that rebuild plus the pages of the
    // largest request, which a later step maps anew where it finds no free run
    // (warm::fresh_pages): none outside for reserved since; none for allocated under
    // expandable segments since the blocks live before the trace that scale are rebuilt
    // at the target size (warm::scaled_before); none without them since the allocated
    // range spans what the rebuilt cache handed out whole (warm::unsplit_bytes: niu-train3
    // 100 from 150, 200 was 0.22 % above its range));
    // far out under expandable_segments (none since the turning quadratics are held); and
    // `kk-step expandable own`, whose truth counted the cache its recording held before
    // the trace and released before its first request (none since the truth counts from
    // the first request, as predictions do: `eval::truth`).
    let known = |l: &str| {
        if l.contains(" warm") {
            Some("warm")
        } else if l.contains(" far ") && l.ends_with("expandable_segments:True") {
            Some("far expandable")
        } else if l == "kk-step expandable own [128, 256]->256" {
            Some("kk-step expandable own")
        } else {
            None
        }
    };
    let count = |k: &str| outside.iter().filter(|l| known(l) == Some(k)).count();
    let total = |k: &str| cases.iter().filter(|c| known(&c.label) == Some(k)).count();
    for k in ["warm", "far expandable", "kk-step expandable own"] {
        eprintln!("KNOWN {k}: outside in {} of {}", count(k), total(k));
    }
    // Frozen: these may only shrink.
    assert!(
        count("warm") == 0,
        "warm forms: {} outside (36 when frozen, 9 since the cache ratios, 4 since the first rebuilt step and the 3% floor, 3 since a warm expandable range holds the first step rebuilt from the parameters, 2 since it holds the largest request's pages more, 1 since the blocks before the trace that scale are rebuilt at the target size, 0 since the allocated range spans the blocks handed out whole)",
        count("warm")
    );
    assert!(
        count("far expandable") == 0,
        "far expandable: {} outside (4 when frozen, 0 since held)",
        count("far expandable")
    );
    assert!(
        count("kk-step expandable own") == 0,
        "kk-step expandable own outside (0 since the truth counts from the first request)"
    );
    for c in cases.iter().filter(|c| known(&c.label) == Some("far expandable")) {
        assert!(c.inside().1, "{}: the allocated peak must be inside its range", c.label);
    }
    let held: Vec<&String> = outside.iter().filter(|l| known(l).is_none()).collect();
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(0.0)
    };
    let exact = cases.iter().filter(|c| c.widths() == (0.0, 0.0)).count();
    eprintln!(
        "RANGES {} cases: real peaks inside in {}; exact (width 0) {exact}; median width reserved {:.2}%, allocated {:.2}%",
        cases.len(),
        cases.len() - outside.len(),
        median(cases.iter().map(|c| c.widths().0).collect()),
        median(cases.iter().map(|c| c.widths().1).collect())
    );
    assert!(cases.len() >= 50, "only {} cases ran", cases.len());
    assert!(held.is_empty(), "real peaks outside their range: {held:?}");
}
