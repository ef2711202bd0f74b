//! The fit audit (issue 37: "a largest-size-that-fits that really fits; and the cheapest
//! change that makes a run fit, every option replayed"), frozen: every answer `fit --json`
//! and `predict --max-fit --json` give is re-checked through the other commands, as a user
//! who bets a GPU-hour on it would check it, on recordings unlike the unit tests' cases
//! (H200 recordings, the grids, corpus training steps, and their warm and expandable forms).
//!
//! * Every option `fit` lists is replayed again on its own: the same change through
//!   `replay`'s what-if flags (`--config`, `--empty-cache-at step`, `--grads-set-to-none`,
//!   `--checkpoint`, `--shard-optimizer`/`--shard-gradients`), a smaller size or a predicted
//!   run through `predict --at`, on the card's bytes (a GPU name already less the CUDA
//!   context): no OOM, peak reserved within the card, and the figures `fit` printed.
//! * What `fit` says does not fit must not: the run as recorded (or as predicted), each
//!   allocator setting `fit` tries that it does not list, a capacity below the parameters.
//! * The JSON agrees with itself: ranks 1…n, margins, cost classes in order, the verdict's
//!   cheapest option, the smallest capacity fitting.
//! * `--max-fit`: the answer fits at its own size, the first size reported failing fails,
//!   every size of `fails_below` fails, sizes further below fit, `certain ≤ answer ≤ might`,
//!   and `fit --sizes` offers the same size.
//!
//! A failing check is a finding; the test fails when any is left, and prints them all.

use std::path::{Path, PathBuf};
use std::process::Command;

use fragscope_replay::{recorded_config, simulate_with, SimOptions, ALTERNATIVES};
use serde_json::Value;

/// Checks made and the ones that failed.
#[derive(Default)]
struct Audit {
    checks: usize,
    findings: Vec<String>,
    cases: usize,
}

impl Audit {
    fn check(&mut self, ok: bool, what: impl FnOnce() -> String) {
        self.checks += 1;
        if !ok {
            self.findings.push(what());
        }
    }

    /// Prints the audit's counts and findings, then asserts that at least `least` cases
    /// and `checks` checks ran (fewer: files went missing) and that nothing was found.
    fn finish(&self, name: &str, least: usize, checks: usize) {
        eprintln!("fit audit{name}: {} cases, {} checks, {} findings", self.cases, self.checks, self.findings.len());
        for f in &self.findings {
            eprintln!("finding: {f}");
        }
        assert!(self.cases >= least && self.checks >= checks, "{} cases, {} checks", self.cases, self.checks);
        assert!(self.findings.is_empty(), "{} findings:\n{}", self.findings.len(), self.findings.join("\n"));
    }
}

fn json_of(args: &[String]) -> Value {
    let o = Command::new(env!("CARGO_BIN_EXE_fragscope")).args(args).output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

fn s(x: impl ToString) -> String {
    x.to_string()
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a number: {v}"))
}

fn h200(name: &str) -> Option<PathBuf> {
    Some(fragscope_testdata::h200_dir().join(name)).filter(|p| p.exists())
}

fn grid(name: &str) -> Option<PathBuf> {
    fragscope_testdata::grid_file(name).filter(|p| p.exists())
}

fn corpus(name: &str) -> Option<PathBuf> {
    let p = fragscope_testdata::real_file(name);
    if p.is_none() {
        fragscope_testdata::skip(&format!("fit audit: {name} (corpus)"));
    }
    p
}

/// `src` cut after its first step (the window `--window START..` takes, START the second
/// step's first entry), written to `dir`: a recording begun warm.
fn warm(src: &Path, dir: &Path) -> PathBuf {
    let snap = fragscope_snapshot::read_path(src).unwrap();
    let steps = fragscope_trace::steps(&snap, 0);
    let start = steps.steps.get(1).unwrap_or_else(|| panic!("{}: {}", src.display(), steps.describe())).start;
    let spec = fragscope_diagnose::WindowSpec::parse(&format!("{start}..")).unwrap();
    let cut = fragscope_diagnose::cut_window(&snap, &spec).unwrap().0;
    let out = dir.join(format!("warm-{}", src.file_name().unwrap().to_string_lossy().replace(".gz", "")));
    fragscope_snapshot::pickle::write::write_path(&cut, &out).unwrap();
    out
}

/// `src` replayed under `expandable_segments:True` and written back: a recording made with
/// expandable segments.
fn expandable(src: &Path, dir: &Path) -> PathBuf {
    let snap = fragscope_snapshot::read_path(src).unwrap();
    let mut cfg = recorded_config(&snap);
    cfg.expandable_segments = true;
    let w = simulate_with(&snap, 0, cfg, &SimOptions { collect_snapshot: true, ..Default::default() });
    let out = dir.join(format!("exp-{}", src.file_name().unwrap().to_string_lossy().replace(".gz", "")));
    fragscope_snapshot::pickle::write::write_path(&w.snapshot.unwrap(), &out).unwrap();
    out
}

/// (peak reserved, fits) of `replay FILE` with the change of option `o` on `cap` bytes.
fn replay_option(file: &str, dev: u64, cap: u64, o: &Value) -> (u64, bool) {
    let mut a = vec![s("replay"), s(file), s("--device"), s(dev), s("--capacity"), format!("{cap}B"), s("--json")];
    let config = o["config"].as_str().unwrap_or("");
    if !config.is_empty() {
        a.extend([s("--config"), s(config)]);
    }
    let mut role = false;
    if o["set_to_none"] == true {
        a.push(s("--grads-set-to-none"));
        role = true;
    }
    let layers: Vec<String> = o["checkpoint_layers"].as_array().unwrap().iter().map(|x| x.to_string()).collect();
    if !layers.is_empty() {
        a.extend([s("--checkpoint"), layers.join(",")]);
        role = true;
    }
    if let Some(z) = o["zero"].as_object() {
        let n = u(&z["ranks"]);
        a.extend([s("--shard-optimizer"), s(n)]);
        if u(&z["stage"]) >= 2 {
            a.extend([s("--shard-gradients"), s(n)]);
        }
        role = true;
    }
    let ec = o["empty_cache_at_steps"] == true;
    if ec {
        a.extend([s("--empty-cache-at"), s("step")]);
    }
    let v = json_of(&a);
    let d = &v["files"][0]["devices"][0];
    if role {
        let r = &d["role_whatif"][0];
        let applied = r["changes"].as_array().unwrap().iter().all(|c| c["applied"] == true);
        let w = &r["changed"];
        return (u(&w["peak_reserved"]), applied && u(&w["ooms"]) == 0 && u(&w["peak_reserved"]) <= cap);
    }
    // The run asked for comes first (the recorded settings, or `--config` on top of them);
    // `--empty-cache-at` adds its run last.
    let runs = d["whatif"].as_array().unwrap();
    let w = if ec { runs.last() } else { runs.first() }.unwrap_or_else(|| panic!("{a:?}: no run"));
    (u(&w["peak_reserved"]), u(&w["ooms"]) == 0 && u(&w["peak_reserved"]) <= cap)
}

/// (peak reserved, fits) of `predict FILES --sizes SIZES --at x [--config c]` on `cap` bytes.
fn predict_at(files: &[String], sizes: &str, x: u64, config: &str, cap: u64) -> (u64, bool) {
    let mut a = vec![s("predict")];
    a.extend(files.iter().cloned());
    a.extend([s("--sizes"), s(sizes), s("--at"), s(x), s("--capacity"), format!("{cap}B"), s("--json")]);
    if !config.is_empty() {
        a.extend([s("--config"), s(config)]);
    }
    let v = json_of(&a);
    let p = &v["predictions"][0];
    (u(&p["peak_reserved"]), p["fits"] == true && u(&p["peak_reserved"]) <= cap)
}

const CLASSES: [&str; 6] = ["none", "free", "driver_calls", "compute", "communication", "size"];

/// One `fit` case: every card's answer re-checked. `sizes`: the recordings' sizes (the files
/// are then one program); `at`: a predicted run.
fn audit_fit(a: &mut Audit, files: &[PathBuf], capacity: &str, sizes: Option<&str>, at: Option<u64>) {
    a.cases += 1;
    let names: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
    let mut args = vec![s("fit")];
    args.extend(names.iter().cloned());
    args.extend([s("--capacity"), s(capacity), s("--json")]);
    if let Some(z) = sizes {
        args.extend([s("--sizes"), s(z)]);
    }
    if let Some(x) = at {
        args.extend([s("--at"), s(x)]);
    }
    let v = json_of(&args);
    let case =
        format!("fit {} --capacity {capacity}{}", names.join(" "), at.map_or(String::new(), |x| format!(" --at {x}")));
    for f in v["files"].as_array().unwrap() {
        let file = f["file"].as_str().unwrap();
        let predicted = f["predicted"] == true;
        for d in f["devices"].as_array().unwrap() {
            let dev = u(&d["device"]);
            for c in d["cards"].as_array().unwrap() {
                let cap = u(&c["capacity_bytes"]);
                let what = format!("{case}: device {dev}, card {}", c["capacity"]);
                audit_card(a, &what, c, cap, |o: &Value, cap: u64| {
                    if predicted || o["size"].is_u64() {
                        let x = o["size"].as_u64().or(at).unwrap();
                        let cfg = o["setting"].as_str().unwrap_or("");
                        predict_at(&names, sizes.unwrap(), x, cfg, cap)
                    } else {
                        replay_option(file, dev, cap, o)
                    }
                });
                // The run itself, re-checked: fits_as_recorded says whether it does.
                let none = serde_json::json!({"config": "", "checkpoint_layers": [], "set_to_none": false});
                let (_, fits) = match at {
                    Some(x) => predict_at(&names, sizes.unwrap(), x, "", cap),
                    None => replay_option(file, dev, cap, &none),
                };
                a.check(fits == (c["fits_as_recorded"] == true), || {
                    format!("{what}: fits_as_recorded {} but the replay says {fits}", c["fits_as_recorded"])
                });
                // Each allocator setting fit tries and does not list alone must not fit.
                if !predicted && c["fits_as_recorded"] == false {
                    for alt in ALTERNATIVES {
                        let listed = c["options"].as_array().unwrap().iter().any(|o| {
                            o["setting"] == *alt
                                && o["set_to_none"] == false
                                && o["empty_cache_at_steps"] == false
                                && o["zero"].is_null()
                                && o["checkpoint_layers"].as_array().unwrap().is_empty()
                        });
                        if listed {
                            continue;
                        }
                        let o = serde_json::json!({"config": alt, "checkpoint_layers": [], "set_to_none": false});
                        let (r, fits) = replay_option(file, dev, cap, &o);
                        a.check(!fits, || {
                            format!("{what}: {alt} not listed, but the replay fits it (peak reserved {r})")
                        });
                    }
                }
                // With sizes, a card with no size option says why no smaller size fits.
                let opts = c["options"].as_array().unwrap();
                if sizes.is_some() && c["fits_as_recorded"] == false && !opts.iter().any(|o| o["cost_class"] == "size")
                {
                    let said = c["pruned"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .any(|p| p.as_str().unwrap().starts_with("a smaller size"));
                    a.check(said, || format!("{what}: no smaller size offered and no word why: {}", c["pruned"]));
                }
                // The largest size that fits: the same answer as predict --max-fit.
                if let (Some(z), None) = (sizes, at) {
                    if let Some(o) = c["options"].as_array().unwrap().iter().find(|o| o["cost_class"] == "size") {
                        let mut m = vec![s("predict")];
                        m.extend(names.iter().cloned());
                        m.extend([s("--sizes"), s(z), s("--max-fit"), s("--capacity"), format!("{cap}B"), s("--json")]);
                        let mv = json_of(&m);
                        let largest = &mv["max_fit"][0]["largest"];
                        a.check(*largest == o["size"], || {
                            format!("{what}: size option {} but predict --max-fit says {largest}", o["size"])
                        });
                    }
                }
            }
        }
    }
}

/// The checks of one card: its own figures, each option re-checked by `recheck`, the
/// smallest capacity re-checked the same way.
fn audit_card(a: &mut Audit, what: &str, c: &Value, cap: u64, recheck: impl Fn(&Value, u64) -> (u64, bool)) {
    let opts = c["options"].as_array().unwrap();
    let verdict = c["verdict"].as_str().unwrap();
    let mut last_class = 0;
    for (k, o) in opts.iter().enumerate() {
        let change = o["change"].as_str().unwrap();
        let w = format!("{what}: option {} ({change})", k + 1);
        a.check(u(&o["rank"]) == k as u64 + 1, || format!("{w}: rank {}", o["rank"]));
        let r = u(&o["peak_reserved"]);
        a.check(r <= cap, || format!("{w}: peak reserved {r} above the card's {cap}"));
        a.check(u(&o["margin"]) == cap.saturating_sub(r), || format!("{w}: margin {} for {cap} − {r}", o["margin"]));
        let class = CLASSES.iter().position(|x| o["cost_class"] == *x).unwrap();
        a.check(class >= last_class, || format!("{w}: cost class {} after a costlier one", o["cost_class"]));
        last_class = class;
        let (rr, fits) = recheck(o, cap);
        a.check(fits, || format!("{w}: listed as fitting, the re-check does not fit (peak reserved {rr} on {cap})"));
        a.check(rr == r, || format!("{w}: peak reserved {r} in fit, {rr} re-checked"));
    }
    if c["fits_as_recorded"] == true {
        a.check(opts.first().is_some_and(|o| o["cost_class"] == "none"), || {
            format!("{what}: fits, first option {opts:?}")
        });
        a.check(verdict.starts_with("fits on"), || format!("{what}: fits, verdict {verdict}"));
    } else if let Some(o) = opts.first() {
        let ch = o["change"].as_str().unwrap();
        a.check(verdict.contains(ch), || format!("{what}: verdict {verdict:?} does not name the cheapest, {ch}"));
    } else {
        a.check(verdict.starts_with("nothing tried fits"), || format!("{what}: no option, verdict {verdict}"));
        for sc in c["smallest_capacity"].as_array().unwrap() {
            let b = u(&sc["bytes"]);
            a.check(b > cap, || format!("{what}: nothing fits, yet the smallest capacity {b} is within the card"));
            let Some(o) = change_of_words(sc["change"].as_str().unwrap()) else { continue };
            let (rb, fb) = recheck(&o, b);
            a.check(fb, || {
                format!("{what}: smallest capacity {b} for {}: the re-check there does not fit ({rb})", sc["change"])
            });
            // The smallest: 2 MiB less (the bisection's resolution) does not fit.
            let (rs, fs) = recheck(&o, b - (2 << 20));
            a.check(!fs, || format!("{what}: smallest capacity {b} for {}, yet 2 MiB less fits ({rs})", sc["change"]));
        }
    }
}

/// The change of a `smallest_capacity` entry, from its words, as an option's fields
/// (`None`: words this audit does not read).
fn change_of_words(w: &str) -> Option<Value> {
    let mut o = serde_json::json!({"config": "", "checkpoint_layers": [], "set_to_none": false});
    if w == "as recorded" || w == "as predicted" {
        return Some(o);
    }
    for part in w.split(" + ") {
        if part == "zero_grad(set_to_none=True)" {
            o["set_to_none"] = true.into();
        } else if let Some(n) = part.strip_prefix("checkpoint all ").and_then(|r| r.strip_suffix(" layers")) {
            let n: u64 = n.parse().ok()?;
            o["checkpoint_layers"] = (0..n).collect::<Vec<u64>>().into();
        } else if let Some(r) = part.strip_prefix("ZeRO-") {
            let (stage, ranks) = r.strip_suffix(" ranks")?.split_once(" over ")?;
            o["zero"] = serde_json::json!({"stage": stage.parse::<u64>().ok()?, "ranks": ranks.parse::<u64>().ok()?});
        } else {
            return None;
        }
    }
    Some(o)
}

/// One `predict --max-fit` case: every answer re-checked.
fn audit_max_fit(a: &mut Audit, files: &[PathBuf], sizes: &str, capacity: &str) {
    a.cases += 1;
    let names: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
    let mut args = vec![s("predict")];
    args.extend(names.iter().cloned());
    args.extend([s("--sizes"), s(sizes), s("--max-fit"), s("--capacity"), s(capacity), s("--json")]);
    let v = json_of(&args);
    let case = format!("predict {} --sizes {sizes} --max-fit --capacity {capacity}", names.join(" "));
    for m in v["max_fit"].as_array().unwrap() {
        let cap = u(&m["capacity"]);
        let cfg = m["config"].as_str().unwrap();
        let what = format!("{case}: under {cfg:?}");
        let Some(x) = m["largest"].as_u64() else {
            // Nothing fits: size 1 must not fit.
            let (r, fits) = predict_at(&names, sizes, 1, cfg, cap);
            a.check(!fits, || format!("{what}: no size fits, but size 1 does (peak reserved {r})"));
            continue;
        };
        let (r, fits) = predict_at(&names, sizes, x, cfg, cap);
        a.check(fits, || format!("{what}: the answer {x} does not fit when predicted (peak reserved {r} on {cap})"));
        let fr = u(&m["fits_at"]["peak_reserved"]);
        a.check(fr == r, || format!("{what}: fits_at says {fr}, predict --at {x} says {r}"));
        if m["bounded"] == true {
            let next = u(&m["next"]["at"]);
            let (r, fits) = predict_at(&names, sizes, next, cfg, cap);
            a.check(!fits, || format!("{what}: {next}, reported failing, fits when predicted ({r} on {cap})"));
            // Above the first OOM: a size that fits again is reported (`fits_above`).
            let above: Vec<u64> = m["fits_above"].as_array().map_or(Vec::new(), |v| v.iter().map(u).collect());
            for y in next + 1..=next + 16 {
                let (r, fits) = predict_at(&names, sizes, y, cfg, cap);
                a.check(fits == above.contains(&y), || {
                    format!("{what}: {y}, above the first OOM {next}: fits {fits} ({r}), reported {above:?}")
                });
            }
        }
        for b in m["fails_below"].as_array().map_or(&[][..], |v| v) {
            let (r, fits) = predict_at(&names, sizes, u(b), cfg, cap);
            a.check(!fits, || format!("{what}: {b}, reported failing below the answer, fits ({r})"));
        }
        // Sizes further below: a user takes the answer to mean they fit.
        for y in [x / 2, x * 3 / 4, x.saturating_sub(17)] {
            if y == 0 || y >= x {
                continue;
            }
            let (r, fits) = predict_at(&names, sizes, y, cfg, cap);
            a.check(fits, || format!("{what}: {y}, below the answer {x}, does not fit ({r} on {cap})"));
        }
        if let Some(rg) = m["range"].as_object() {
            let certain = rg["certain"].as_u64().unwrap_or(0);
            a.check(certain <= x, || format!("{what}: certain {certain} above the answer {x}"));
            if let Some(might) = rg["might"].as_u64() {
                a.check(might >= x, || format!("{what}: might {might} below the answer {x}"));
            }
        }
    }
}

/// A capacity below the parameters' bytes: nothing fits, with the reason; never a fit.
fn audit_below_parameters(a: &mut Audit, file: &Path, capacity: &str, params: u64) {
    a.cases += 1;
    let f = file.display().to_string();
    let v = json_of(&[s("fit"), f.clone(), s("--capacity"), s(capacity), s("--json")]);
    for d in v["files"][0]["devices"].as_array().unwrap() {
        for c in d["cards"].as_array().unwrap() {
            let what = format!("fit {f} --capacity {capacity}");
            a.check(c["options"].as_array().unwrap().is_empty(), || format!("{what}: options below the parameters"));
            let verdict = c["verdict"].as_str().unwrap();
            a.check(verdict.starts_with("nothing tried fits"), || format!("{what}: verdict {verdict}"));
            a.check(
                c["pruned"].as_array().unwrap().iter().any(|p| p.as_str().unwrap().contains("live tensors reach")),
                || format!("{what}: no reason given: {}", c["pruned"]),
            );
            for sc in c["smallest_capacity"].as_array().unwrap() {
                a.check(u(&sc["bytes"]) >= params, || {
                    format!("{what}: smallest capacity {} below the parameters", sc["bytes"])
                });
            }
        }
    }
}

#[test]
fn fit_and_max_fit_answers_hold_when_rechecked() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = Audit::default();
    let (b4, b8, b16) = (h200("gpt-s512-b4.pickle.gz"), h200("gpt-s512-b8.pickle.gz"), h200("gpt-s512-b16.pickle.gz"));
    let (b4, b8, b16) = (b4.unwrap(), b8.unwrap(), b16.unwrap());
    // Single recordings: cold, warm (cut after the first step), expandable, warm expandable.
    audit_fit(&mut a, std::slice::from_ref(&b16), "10GB,8GB,H100-80GB", None, None);
    let w16 = warm(&b16, dir.path());
    audit_fit(&mut a, &[w16], "10GB,8GB", None, None);
    audit_fit(&mut a, &[h200("gpt-s512-b16-expandable.pickle.gz").unwrap()], "10GB,8GB", None, None);
    let e16 = expandable(&b16, dir.path());
    audit_fit(&mut a, &[warm(&e16, dir.path())], "10GB", None, None);
    let niu = grid("niu-train3-ctx200-fp32.pickle").unwrap();
    audit_fit(&mut a, std::slice::from_ref(&niu), "1.2GB,1GB", None, None);
    audit_fit(&mut a, &[warm(&niu, dir.path())], "1.2GB,1GB", None, None);
    audit_fit(&mut a, &[warm(&expandable(&niu, dir.path()), dir.path())], "1GB", None, None);
    // Corpus training steps, on the cards of the guide.
    for name in ["cs336-sidsoc12-trainstep-ctx128-fp32.pickle", "pytorchblog-resnet50-train-cppframes.pickle"] {
        if let Some(f) = corpus(name) {
            audit_fit(&mut a, &[f], "A100-40GB,L40S,RTX-4090", None, None);
        }
    }
    if let Some(f) = grid("kk-2.7b-step-ctx128-fp32.pickle") {
        audit_fit(&mut a, &[f], "A100-80GB,60GB", None, None);
    }
    // Several sizes of one program: the size option, and a predicted run.
    let h = [b4.clone(), b8.clone(), b16.clone()];
    audit_fit(&mut a, &h, "10GB,6GB", Some("4,8,16"), None);
    audit_fit(&mut a, &h, "20GB,12GB", Some("4,8,16"), Some(32));
    let n: Vec<PathBuf> =
        ["100", "150", "200"].iter().map(|c| grid(&format!("niu-train3-ctx{c}-fp32.pickle")).unwrap()).collect();
    audit_fit(&mut a, &n, "1GB", Some("100,150,200"), Some(400));
    let w: Vec<PathBuf> = h.iter().map(|f| warm(f, dir.path())).collect();
    audit_fit(&mut a, &w, "10GB,6GB", Some("4,8,16"), None);
    // The largest size that fits: the H200's bytes at the start of the fit.jsonl processes,
    // a 40 GB card, warm and expandable templates.
    audit_max_fit(&mut a, &h, "4,8,16", "149557477376B");
    audit_max_fit(&mut a, &h, "4,8,16", "H100-80GB");
    audit_max_fit(&mut a, &w, "4,8,16", "40GB");
    let e: Vec<PathBuf> = h.iter().map(|f| expandable(f, dir.path())).collect();
    audit_max_fit(&mut a, &e, "4,8,16", "40GB");
    // Predicted runs from warm and expandable templates, and both at once.
    audit_fit(&mut a, &w, "20GB,12GB", Some("4,8,16"), Some(32));
    audit_fit(&mut a, &e, "20GB,12GB", Some("4,8,16"), Some(32));
    let we: Vec<PathBuf> = e.iter().map(|f| warm(f, dir.path())).collect();
    audit_fit(&mut a, &we, "20GB,12GB", Some("4,8,16"), Some(32));
    audit_fit(&mut a, &we, "10GB,6GB", Some("4,8,16"), None);
    audit_max_fit(&mut a, &we, "4,8,16", "40GB");
    audit_max_fit(&mut a, &n, "100,150,200", "2GB");
    let kk: Vec<PathBuf> =
        ["128", "256", "512"].iter().filter_map(|c| grid(&format!("kk-2.7b-fwd-ctx{c}-fp32.pickle"))).collect();
    if kk.len() == 3 {
        audit_max_fit(&mut a, &kk, "128,256,512", "40GB");
        audit_max_fit(&mut a, &kk, "128,256,512", "10GB");
        // 13,627,238,400 bytes of parameters (GRIDS.md).
        audit_below_parameters(&mut a, &kk[0], "10GB", 13_627_238_400);
    }
    // 27 with the corpus; 21 with the in-repository files only (the skips are counted).
    let least = if fragscope_testdata::has_corpus() { 27 } else { 21 };
    a.finish("", least, 200);
}

/// Capacities at `fractions` of the file's peak reserved on an unlimited device (its first
/// device), in bytes: the sweep a user makes over the cards they might rent.
fn sweep(file: &Path, fractions: &[f64]) -> String {
    let v = json_of(&[s("fit"), file.display().to_string(), s("--capacity"), s("100TB"), s("--json")]);
    let peak = u(&v["files"][0]["devices"][0]["peak_reserved_unlimited"]) as f64;
    fractions.iter().map(|f| format!("{}B", (peak * f) as u64)).collect::<Vec<_>>().join(",")
}

#[test]
fn fit_answers_hold_on_a_sweep_of_capacities() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = Audit::default();
    let fr = [0.97, 0.9, 0.8, 0.65];
    let mut files: Vec<PathBuf> = Vec::new();
    for name in [
        "oom-fragmentation.pickle.gz",
        "oom-exhaustion.pickle.gz",
        "live-mlp-20-steps.pickle.gz",
        "gpt-s512-b8-amp.pickle.gz",
        "gpt-s512-b16-ckpt.pickle.gz",
    ] {
        files.push(h200(name).unwrap());
    }
    for name in [
        "cs336-2.7b-trainstep-ctx128-fp32.pickle",
        "codeloc-qwen3-gnn-expandable-oom-3gpu.pickle",
        "selectn-llama7b-offload-multistream.pickle",
        "ckpttry-activation-ckpt-toy.pickle",
        "effdl26-dmasloff-liger-fused-linear-ce.pickle",
        "eor-cnn-counterfactuals.pickle",
        "mlsysexp-linear-toy.pkl",
        "effdl-aphelack-customfsdp-4gpu.pickle",
    ] {
        files.extend(corpus(name));
    }
    let live = h200("live-mlp-20-steps.pickle.gz").unwrap();
    files.push(warm(&live, dir.path()));
    files.push(warm(&expandable(&live, dir.path()), dir.path()));
    for f in &files {
        let caps = sweep(f, &fr);
        audit_fit(&mut a, std::slice::from_ref(f), &caps, None, None);
    }
    // 15 with the corpus; 8 with the in-repository files only (the skips are counted).
    let least = if fragscope_testdata::has_corpus() { 15 } else { 8 };
    a.finish(" (sweep)", least, 200);
}

/// The requests a user makes around the recorded sizes: files not in size order, a size
/// below every recording, a recorded size, far up, a capacity below the parameters with a
/// predicted run, two recordings only.
#[test]
fn fit_and_max_fit_answers_hold_around_the_recorded_sizes() {
    let mut a = Audit::default();
    let (b4, b8, b16) = (h200("gpt-s512-b4.pickle.gz"), h200("gpt-s512-b8.pickle.gz"), h200("gpt-s512-b16.pickle.gz"));
    let (b4, b8, b16) = (b4.unwrap(), b8.unwrap(), b16.unwrap());
    let h = [b4.clone(), b8.clone(), b16.clone()];
    audit_fit(&mut a, &[b16.clone(), b4.clone(), b8.clone()], "10GB,6GB", Some("16,4,8"), None);
    audit_fit(&mut a, &h, "3GB,2GB", Some("4,8,16"), Some(2));
    audit_fit(&mut a, &h, "10GB,7GB", Some("4,8,16"), Some(8));
    audit_fit(&mut a, &[b8.clone(), b16.clone()], "40GB,20GB", Some("8,16"), Some(64));
    audit_max_fit(&mut a, &[b8, b16], "8,16", "20GB");
    let amp: Vec<PathBuf> =
        ["4", "8", "16"].iter().map(|b| h200(&format!("gpt-s512-b{b}-amp.pickle.gz")).unwrap()).collect();
    audit_max_fit(&mut a, &amp, "4,8,16", "L40S");
    let seq: Vec<PathBuf> =
        ["256", "512", "1024"].iter().map(|q| h200(&format!("gpt-s{q}-b8.pickle.gz")).unwrap()).collect();
    audit_max_fit(&mut a, &seq, "256,512,1024", "24GB");
    audit_fit(&mut a, &seq, "24GB,10GB", Some("256,512,1024"), Some(2048));
    let nf: Vec<PathBuf> =
        ["100", "150", "200"].iter().map(|c| grid(&format!("niu-fwd-ctx{c}-fp32.pickle")).unwrap()).collect();
    audit_max_fit(&mut a, &nf, "100,150,200", "500MB");
    let kk: Vec<PathBuf> =
        ["128", "256", "512"].iter().filter_map(|c| grid(&format!("kk-2.7b-fwd-ctx{c}-fp32.pickle"))).collect();
    if kk.len() == 3 {
        audit_fit(&mut a, &kk, "40GB,20GB", Some("128,256,512"), Some(2048));
        audit_fit(&mut a, &kk, "10GB", Some("128,256,512"), Some(256));
        audit_fit(&mut a, &kk, "10GB", Some("128,256,512"), None);
    }
    let ks: Vec<PathBuf> =
        ["128", "256"].iter().filter_map(|c| grid(&format!("kk-2.7b-step-ctx{c}-fp32.pickle"))).collect();
    if ks.len() == 2 {
        audit_max_fit(&mut a, &ks, "128,256", "A100-80GB");
        audit_fit(&mut a, &ks, "A100-80GB,H100-NVL", Some("128,256"), None);
    }
    // 14 with the corpus; 9 with the in-repository files only (the skips are counted).
    let least = if fragscope_testdata::has_corpus() { 14 } else { 9 };
    a.finish(" (around)", least, 100);
}

/// The measured truth (`crates/testdata/h200/fit.jsonl`: batches run on the H200 from
/// batches 4, 8, 16 of the same program): every batch that really fit is predicted to fit
/// on the bytes free at the start of its process, under its settings, and its measured peak
/// reserved lies inside the predicted range.
#[test]
fn max_fit_agrees_with_the_h200_measurements() {
    let mut a = Audit::default();
    let h: Vec<String> = ["4", "8", "16"]
        .iter()
        .map(|b| h200(&format!("gpt-s512-b{b}.pickle.gz")).unwrap().display().to_string())
        .collect();
    let text = std::fs::read_to_string(fragscope_testdata::h200_dir().join("fit.jsonl")).unwrap();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let row: Value = serde_json::from_str(line).unwrap();
        let (batch, conf, free) = (u(&row["batch"]), row["conf"].as_str().unwrap(), u(&row["free_at_start"]));
        a.cases += 1;
        let what = format!("H200 batch {batch} under {conf:?} (measured fits: {})", row["fits"]);
        let (r, fits) = predict_at(&h, "4,8,16", batch, conf, free);
        a.check(fits == (row["fits"] == true), || {
            format!("{what}: predicted fits {fits} (peak reserved {r} on {free})")
        });
        let mut args = vec![s("predict")];
        args.extend(h.iter().cloned());
        args.extend([s("--sizes"), s("4,8,16"), s("--at"), s(batch), s("--json")]);
        if !conf.is_empty() {
            args.extend([s("--config"), s(conf)]);
        }
        let v = json_of(&args);
        let range = &v["predictions"][0]["range"]["reserved"];
        let (lo, hi) = (u(&range[0]), u(&range[1]));
        if let Some(m) = row["max_memory_reserved"].as_u64() {
            a.check(lo <= m && m <= hi, || format!("{what}: measured peak reserved {m} outside [{lo}, {hi}]"));
        }
    }
    a.finish(" (H200 measured)", 8, 0);
}
