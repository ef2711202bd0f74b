//! Planted-leak suite: leaks of several shapes planted ([`fragscope_plant`])
//! into real traces with histories, at call sites drawn at random (seeded) among those
//! with enough freed allocations: the detector must name every planted site and no
//! other, and the untouched traces must have no suspect at all.
//!
//! Shapes: `steady` (every alloc of the site from the second tenth of the run on),
//! `all` (every freed alloc of the site, from its first use),
//! `some_iters` (three tenths of the run only), `phase` (one quarter of the run),
//! `burst` (16 consecutive allocs), `small` (the site with the fewest bytes that still
//! makes a 4 MiB leak, under everything else the run allocates), `multi` (three sites
//! at once), `cpp` (a site whose stacks are made C++-only), `uneven` (a site whose
//! requests vary by 4x or more, every other alloc).
//!
//! Leaks are told across training steps only ([`fragscope_diagnose::leaks_device`]): a plant into a
//! trace with fewer than two complete steps is `untold`, and must get no suspect.
//!
//! The default set runs one seed on a handful of traces (bounded for debug builds);
//! `FRAGSCOPE_LEAK_SWEEP=N` runs N seeds on every trace. The table
//! (shape × trace: found / missed / false positives) is printed with `--nocapture`.

use std::collections::BTreeMap;

use fragscope_diagnose::leaks_device;
use fragscope_plant::{self as plant, Shape, SiteAllocs};
use fragscope_snapshot::Snapshot;
use fragscope_trace::{timeline, TimelineOptions};

/// Traces with an allocation history long enough to plant into (device 0 unless said).
const TRACES: &[(&str, i64)] = &[
    ("decomfl-opt-zeroth-order-windows.pickle", 0),
    ("cs336-2.7b-trainstep-ctx128-fp32.pickle", 0),
    ("cs336-sidsoc12-trainstep-ctx128-fp32.pickle", 0),
    ("cs336-small-fwd-annotated.pickle", 0),
    ("cs336-2.7b-fwd-annotated.pickle", 0),
    ("ftcourse-llama-qlora-notebook.pickle", 0),
    ("pytorchblog-resnet50-train-cppframes.pickle", 0),
    ("selectn-llama7b-offload-multistream.pickle", 0),
    ("sqattn-qwen2-compress-segment-churn.pickle", 0),
    ("effdl-aphelack-customfsdp-4gpu.pickle", 0),
    ("eor-cnn-counterfactuals.pickle", 0),
    ("codeloc-qwen3-gnn-expandable-oom-3gpu.pickle", 0),
    ("cs336-magma27-mostly-cached.pickle", 0),
    ("octree-nca-inference-huge-allocs.pickle", 0),
    ("cs336-2.7b-fwd-ctx128-bf16.pickle", 0),
];

/// The default (debug-build) set.
const DEFAULT_TRACES: &[&str] = &[
    "decomfl-opt-zeroth-order-windows.pickle",
    "pytorchblog-resnet50-train-cppframes.pickle",
    "ftcourse-llama-qlora-notebook.pickle",
    "sqattn-qwen2-compress-segment-churn.pickle",
    // A loop over growing shapes (iterations from its call sites).
    "octree-nca-inference-huge-allocs.pickle",
];

const SHAPES: &[&str] = &["steady", "all", "some_iters", "phase", "burst", "small", "multi", "cpp", "uneven"];

const MIB: u64 = 1 << 20;

/// Share of planted leaks the detector must find where leaks can be told (see
/// `planted_leak_suite`). With the detector on training steps (issue 19), a leak is told
/// only across two complete steps or more: of the default set only the resnet trace has
/// them, and it measured 7 of 9 found (78%; `burst` and `phase`, kept at one time rather
/// than step after step, are not growth across steps); the 32 plants into the traces of
/// one step or none are counted as `untold` and must get no suspect. (The periodicity-based
/// detector before it measured 36 of 44 over all five traces.)
const MIN_FOUND_SHARE: f64 = 0.7;

use fragscope_testdata::Rng;

fn read(name: &str) -> Option<Snapshot> {
    let p = fragscope_testdata::real_file(name)?;
    Some(fragscope_snapshot::read_path(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
}

fn peak_allocated(snap: &Snapshot, device: i64) -> u64 {
    timeline(snap, device, &TimelineOptions { points: 1 }).peak_allocated.bytes
}

fn bytes_of(snap: &Snapshot, device: i64, allocs: &[usize]) -> u64 {
    let cfg = fragscope_replay::recorded_config(snap);
    let t = snap.trace(device);
    allocs.iter().map(|&i| fragscope_alloc::rounding::round_size(t[i].size, &cfg)).sum()
}

/// Sites worth leaking: a real call site (not a placeholder) with at least 8 freed
/// allocs spread over the run (first in its first 40%, last in its last 40%).
fn eligible(sites: &[SiteAllocs], len: usize) -> Vec<&SiteAllocs> {
    sites
        .iter()
        .filter(|s| {
            let placeholder = s.site.starts_with("<no stack>") || s.site.starts_with("<allocated");
            let (a, b) = (s.freed.first().copied().unwrap_or(0), s.freed.last().copied().unwrap_or(0));
            !placeholder && s.freed.len() >= 8 && a * 10 < len * 4 && b * 10 > len * 6
        })
        .collect()
}

/// A planted case: the allocs to leak, chosen by shape and seed; `None` when the trace
/// has no site for that shape (with why).
fn choose(snap: &mut Snapshot, device: i64, shape: &str, rng: &mut Rng) -> Result<Vec<usize>, String> {
    let len = snap.trace(device).len();
    let min_bytes = (4 * MIB).max(peak_allocated(snap, device) / 1000);
    let sites = plant::site_allocs(snap, device);
    let el = eligible(&sites, len);
    // Allocs of one site picked by a shape, kept only when they make a leak worth
    // reporting (at least `min_bytes`).
    let worth = |snap: &Snapshot, v: Vec<usize>| (bytes_of(snap, device, &v) >= min_bytes).then_some(v);
    let pick_site = |rng: &mut Rng, cands: &[&SiteAllocs], f: &dyn Fn(&SiteAllocs, &mut Rng) -> Vec<usize>| {
        // Try the candidates in a seeded order; the first one big enough wins.
        let mut order: Vec<usize> = (0..cands.len()).collect();
        for k in 0..order.len() {
            let j = k + rng.below(order.len() - k);
            order.swap(k, j);
        }
        order.into_iter().find_map(|k| worth(snap, f(cands[k], rng)))
    };
    let from_second_tenth = |s: &SiteAllocs, _: &mut Rng| Shape::Windows(vec![(0.1, 1.0)]).pick(&s.freed, len);
    let v = match shape {
        "steady" => pick_site(rng, &el, &from_second_tenth),
        "all" => pick_site(rng, &el, &|s, _| Shape::All.pick(&s.freed, len)),
        "some_iters" => pick_site(rng, &el, &|s, rng| {
            let mut slots: Vec<usize> = (1..9).collect();
            let mut w = Vec::new();
            for _ in 0..3 {
                let k = slots.remove(rng.below(slots.len()));
                w.push((k as f64 / 10.0, (k + 1) as f64 / 10.0));
            }
            Shape::Windows(w).pick(&s.freed, len)
        }),
        "phase" => pick_site(rng, &el, &|s, rng| {
            let a = 0.15 + 0.35 * rng.unit();
            Shape::Windows(vec![(a, a + 0.25)]).pick(&s.freed, len)
        }),
        "burst" => {
            pick_site(rng, &el, &|s, rng| Shape::Burst { at: 0.2 + 0.4 * rng.unit(), count: 16 }.pick(&s.freed, len))
        }
        "small" => {
            // The eligible site whose leak from the second tenth on is smallest but
            // still worth reporting.
            let mut c: Vec<(u64, Vec<usize>)> = el
                .iter()
                .filter_map(|s| worth(snap, from_second_tenth(s, rng)))
                .map(|v| (bytes_of(snap, device, &v), v))
                .collect();
            c.sort();
            c.into_iter().next().map(|x| x.1)
        }
        "multi" => {
            let mut all = Vec::new();
            let mut used: Vec<&str> = Vec::new();
            for _ in 0..3 {
                let rest: Vec<&SiteAllocs> = el.iter().copied().filter(|s| !used.contains(&s.site.as_str())).collect();
                let Some(v) = pick_site(rng, &rest, &|s, _| Shape::Stride(2).pick(&s.freed, len)) else { break };
                let site = el.iter().find(|s| s.freed.contains(&v[0])).unwrap();
                used.push(site.site.as_str());
                all.extend(v);
            }
            all.sort_unstable();
            (used.len() == 3).then_some(all)
        }
        "uneven" => {
            let un: Vec<&SiteAllocs> =
                el.iter().copied().filter(|s| s.max_request >= 4 * s.min_request.max(1)).collect();
            pick_site(rng, &un, &|s, _| Shape::Stride(2).pick(&s.freed, len))
        }
        "cpp" => {
            // A site whose stacks keep C++ frames once the Python ones are dropped.
            let mut order: Vec<&SiteAllocs> = el.clone();
            for k in 0..order.len() {
                let j = k + rng.below(order.len() - k);
                order.swap(k, j);
            }
            let mut found = None;
            for s in order {
                let v = from_second_tenth(s, rng);
                if bytes_of(snap, device, &v) < min_bytes {
                    continue;
                }
                let mut trial = snap.clone();
                if plant::strip_python_frames(&mut trial, device, &s.site) > 0 {
                    *snap = trial;
                    found = Some(v);
                    break;
                }
            }
            found
        }
        _ => unreachable!(),
    };
    v.ok_or_else(|| "no site fits".to_string())
}

#[derive(Default)]
struct Tally {
    found: usize,
    missed: usize,
    fp: usize,
    na: usize,
    /// Planted into a trace where leaks cannot be told (fewer than two steady steps).
    untold: usize,
}

/// Plants every shape into each trace (`seeds` seeds) and returns the table and the
/// failures.
fn run(traces: &[(&str, i64)], seeds: std::ops::Range<u64>) -> (String, Vec<String>, BTreeMap<String, Tally>) {
    let mut table = String::new();
    let mut failures = Vec::new();
    let mut tallies: BTreeMap<String, Tally> = BTreeMap::new();
    for &(name, device) in traces {
        let Some(snap) = read(name) else { continue };
        let peak = peak_allocated(&snap, device);
        let base = leaks_device(&snap, device);
        let _ = peak;
        let base_fp = base.suspects.len();
        if base_fp > 0 {
            failures.push(format!(
                "{name}: untouched trace has suspects {:?}",
                base.suspects.iter().map(|s| &s.site.site).collect::<Vec<_>>()
            ));
        }
        table.push_str(&format!(
            "{name} (steps: {} {}{}, untouched false positives: {base_fp} {:?})\n",
            base.steps.source,
            base.steps.steps,
            base.steps.reason.as_ref().map_or(String::new(), |r| format!(" [{r}]")),
            base.suspects.iter().map(|s| (&s.site.site, s.growth_bytes_per_step)).collect::<Vec<_>>()
        ));
        for shape in SHAPES {
            for seed in seeds.clone() {
                let mut rng = Rng(seed.wrapping_mul(0x1000_0000_01b3) ^ name.len() as u64 ^ (shape.len() as u64) << 32);
                let mut s = snap.clone();
                let t = tallies.entry(shape.to_string()).or_default();
                let allocs = match choose(&mut s, device, shape, &mut rng) {
                    Ok(v) => v,
                    Err(why) => {
                        t.na += 1;
                        table.push_str(&format!("  {shape:<10} seed {seed}: n/a ({why})\n"));
                        continue;
                    }
                };
                let (planted_snap, p) = plant::plant(&s, device, &allocs).unwrap();
                let l = leaks_device(&planted_snap, device);
                let flagged: Vec<&str> = l.suspects.iter().map(|x| x.site.site.as_str()).collect();
                // A planted site must be named when its own planted bytes reach the
                // reporting threshold; a C++-only site split by operator can leave a
                // few KiB at a side operator (flagging it is no false positive).
                let min = (4 * MIB).max(peak_allocated(&planted_snap, device) / 1000);
                let mut per_site: BTreeMap<String, u64> = BTreeMap::new();
                for &i in &allocs {
                    let site = fragscope_trace::site_of(&s.frames, s.trace(device)[i].stack).site;
                    *per_site.entry(site).or_default() += bytes_of(&s, device, &[i]);
                }
                let missed: Vec<&String> = p
                    .sites
                    .iter()
                    .filter(|x| per_site.get(*x).copied().unwrap_or(0) >= min && !flagged.contains(&x.as_str()))
                    .collect();
                let fps: Vec<&&str> = flagged.iter().filter(|x| !p.sites.iter().any(|y| y == **x)).collect();
                let verdict = if !l.steps.can_tell {
                    "untold"
                } else if missed.is_empty() {
                    "found"
                } else {
                    "MISSED"
                };
                if !l.steps.can_tell {
                    // Fewer than two steady steps: leaks cannot be told, by definition
                    // (crate::leaks); the analysis must say so and name nothing.
                    t.untold += 1;
                    if !flagged.is_empty() {
                        failures.push(format!(
                            "{name} {shape} seed {seed}: suspects where leaks cannot be told {flagged:?}"
                        ));
                    }
                } else if missed.is_empty() {
                    t.found += 1;
                } else {
                    t.missed += 1;
                    failures.push(format!("{name} {shape} seed {seed}: missed {missed:?}"));
                }
                if !fps.is_empty() {
                    t.fp += 1;
                    failures.push(format!("{name} {shape} seed {seed}: false positives {fps:?}"));
                }
                table.push_str(&format!(
                    "  {shape:<10} seed {seed}: {verdict:<6} {} blocks {:.1} MiB at {:?}; steps {} {}; false positives {:?}\n",
                    p.allocs.len(),
                    p.bytes as f64 / MIB as f64,
                    p.sites,
                    l.steps.source,
                    l.steps.steps,
                    fps
                ));
            }
        }
    }
    (table, failures, tallies)
}

fn summary(tallies: &BTreeMap<String, Tally>) -> String {
    let mut s = String::from("shape       found missed fp  n/a untold\n");
    for (k, t) in tallies {
        s.push_str(&format!("{k:<11} {:>5} {:>6} {:>3} {:>4} {:>6}\n", t.found, t.missed, t.fp, t.na, t.untold));
    }
    s
}

/// The planted files stay consistent: the timeline needs no seeding beyond the
/// original's and counts no inconsistency, the final allocated bytes equal the
/// trace's, and the replay's backward walk accepts them.
#[test]
fn planted_files_are_consistent() {
    for &name in &DEFAULT_TRACES[..2] {
        let Some(snap) = read(name) else { return };
        let mut rng = Rng(7);
        let mut s = snap.clone();
        let allocs = choose(&mut s, 0, "steady", &mut rng).unwrap();
        let (p, what) = plant::plant(&s, 0, &allocs).unwrap();
        let a = timeline(&snap, 0, &TimelineOptions { points: 1 });
        let b = timeline(&p, 0, &TimelineOptions { points: 1 });
        assert_eq!(b.seeded.inconsistencies, 0, "{name}");
        assert_eq!(b.seeded.blocks, a.seeded.blocks, "{name}: nothing new seeded");
        assert_eq!(b.end.allocated, a.end.allocated + what.bytes, "{name}");
        let sum = fragscope_trace::summarize(&p);
        assert_eq!(sum.devices[0].all.allocated_bytes, b.end.allocated, "{name}: final state holds the leak");
        let v = fragscope_replay::verify(&p, 0, &Default::default());
        assert!(v.undecidable.is_none(), "{name}: {:?}", v.undecidable);
        // Written with the project's pickle writer and read back unchanged.
        let mut buf = Vec::new();
        fragscope_snapshot::pickle::write::write_snapshot(&p, &mut buf).unwrap();
        let back = fragscope_snapshot::read_from(&buf[..]).unwrap();
        assert_eq!(fragscope_snapshot::semantic_diff(&p, &back), None);
        eprintln!(
            "{name}: planted {} blocks, {} B; replay: {} divergences",
            what.allocs.len(),
            what.bytes,
            v.divergences
        );
    }
}

#[test]

fn planted_leak_suite() {
    let sweep: u64 = std::env::var("FRAGSCOPE_LEAK_SWEEP").ok().and_then(|v| v.parse().ok()).unwrap_or(0);
    let traces: Vec<(&str, i64)> = if sweep > 0 {
        TRACES.to_vec()
    } else {
        eprintln!(
            "note: default set ({} traces, 1 seed); FRAGSCOPE_LEAK_SWEEP=N runs N seeds on all {}",
            DEFAULT_TRACES.len(),
            TRACES.len()
        );
        TRACES.iter().copied().filter(|(n, _)| DEFAULT_TRACES.contains(n)).collect()
    };
    // FRAGSCOPE_LEAK_SEED_BASE=B draws the sites with seeds B.. instead of 0.. (a held-out
    // draw: sites nobody looked at while tuning).
    let base: u64 = std::env::var("FRAGSCOPE_LEAK_SEED_BASE").ok().and_then(|v| v.parse().ok()).unwrap_or(0);
    if base > 0 {
        eprintln!("note: FRAGSCOPE_LEAK_SEED_BASE={base}: seeds {base}..{}", base + sweep.max(1));
    }
    // FRAGSCOPE_LEAK_TRACES=TEXT keeps the traces whose name contains TEXT (debugging).
    let only = std::env::var("FRAGSCOPE_LEAK_TRACES").ok();
    let traces: Vec<(&str, i64)> =
        traces.into_iter().filter(|(n, _)| only.as_deref().is_none_or(|o| n.contains(o))).collect();
    if let Some(o) = &only {
        eprintln!("note: FRAGSCOPE_LEAK_TRACES={o}: {} traces", traces.len());
    }
    let (table, failures, tallies) = run(&traces, base..base + sweep.max(1));
    eprintln!("{table}\n{}", summary(&tallies));
    if std::env::var_os("FRAGSCOPE_LEAK_REPORT_ONLY").is_some() {
        eprintln!(
            "note: FRAGSCOPE_LEAK_REPORT_ONLY set: {} failures not asserted:\n{}",
            failures.len(),
            failures.join("\n")
        );
        return;
    }
    // False positives fail the suite; misses are counted against a floor (the share
    // found when the floor was last raised, measured on this set).
    let fps: Vec<&String> = failures.iter().filter(|f| !f.contains(": missed ")).collect();
    assert!(
        fps.is_empty(),
        "{} false positives:\n{}",
        fps.len(),
        fps.iter().map(|s| s.as_str()).collect::<Vec<_>>().join("\n")
    );
    let (found, tried) = tallies.values().fold((0, 0), |(f, t), x| (f + x.found, t + x.found + x.missed));
    let share = found as f64 / tried.max(1) as f64;
    eprintln!("found {found} of {tried} planted leaks ({:.0}%); misses:\n{}", share * 100.0, failures.join("\n"));
    if tried == 0 && !fragscope_testdata::has_corpus() {
        // The in-repository set has no default trace of two steps or more: every plant was
        // "untold" (and checked above to get no suspect); the found share needs the corpus.
        fragscope_testdata::skip(
            "planted_leak_suite's found share (no default trace of two steps or more in the in-repository set)",
        );
        return;
    }
    assert!(tried > 0, "no leak could be planted");
    assert!(share >= MIN_FOUND_SHARE, "found {found} of {tried} planted leaks, below the floor of {MIN_FOUND_SHARE}");
}

/// No suspect on any device of any untouched real file (every form the reader takes:
/// pickles, profiler traces, exported JSON).
#[test]
fn untouched_real_files_have_no_suspects() {
    let Some(dir) = fragscope_testdata::traces_dir() else { return };
    let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file() && p.extension().is_none_or(|e| e != "md"))
        .collect();
    files.sort();
    let mut checked = 0;
    let mut found = Vec::new();
    for f in &files {
        let Ok(snap) = fragscope_snapshot::read_path(f) else { continue };
        for d in snap.devices() {
            let l = leaks_device(&snap, d);
            checked += 1;
            for s in &l.suspects {
                found.push(format!("{} device {d}: {} ({} B/step)", f.display(), s.site.site, s.growth_bytes_per_step));
            }
        }
    }
    eprintln!("{checked} devices of {} files checked", files.len());
    assert!(checked >= fragscope_testdata::min_count(30, 7), "only {checked} devices read");
    assert!(found.is_empty(), "suspects on untouched files:\n{}", found.join("\n"));
}

/// A trace whose ring buffer dropped its first entries (`max_entries` reached) is as
/// steady as the whole one: no suspect on any untouched trace with its first quarter,
/// half or three quarters cut off (the blocks allocated there become state from before
/// the trace; a single training step cut there starts in its backward or optimizer step).
#[test]
fn untouched_traces_cut_at_the_start_have_no_suspects() {
    let mut checked = 0;
    let mut found = Vec::new();
    for &(name, device) in TRACES {
        let Some(snap) = read(name) else { continue };
        for (num, den) in [(1usize, 4usize), (1, 2), (3, 4)] {
            let mut s = snap.clone();
            let Ok(d) = usize::try_from(device) else { continue };
            let n = s.device_traces[d].len();
            s.device_traces[d].drain(..n * num / den);
            let l = leaks_device(&s, device);
            checked += 1;
            for x in &l.suspects {
                found.push(format!(
                    "{name} without its first {num}/{den}: {} ({} B/step; {} steps; {:?}; curve {:?}; grew in {:?})",
                    x.site.site, x.growth_bytes_per_step, l.steps.steps, x.evidence, x.curve, x.grew_in
                ));
            }
        }
    }
    eprintln!("{checked} cut traces checked");
    // 15 traces × 3 cuts with the corpus; decomfl and effdl in the repository's own set.
    assert!(checked >= fragscope_testdata::min_count(45, 6), "only {checked} cut traces checked");
    assert!(found.is_empty(), "suspects on cut traces:\n{}", found.join("\n"));
}
