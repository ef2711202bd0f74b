//! `fragscope replay FILE ...`: replay a snapshot's trace through the allocator model.
//!
//! * `--verify`: check the model against the recording (per device: allocations at the
//!   recorded address, segment events matched, first divergence).
//! * default ("what if"): the same workload under other `PYTORCH_CUDA_ALLOC_CONF`
//!   settings (`--config`, repeatable; without it the recorded settings and common
//!   alternatives) and/or another device size (`--capacity`).
//! * `--fidelity-table`: the Markdown table of docs/fidelity.md.
//! * `--empty-cache-at WHERE` / `--no-caching`: the advice users are given, replayed
//!   beside the settings (`replay::advice`); `--advice-table`: the Markdown table of what
//!   that advice costs and saves on each FILE.
//! * `--shard-optimizer N`, `--shard-gradients N`, `--grads-set-to-none`, `--checkpoint
//!   LAYERS`: role-level what-ifs (`replay::transform`): the recorded program changed
//!   (ZeRO-1/2 sharding, `zero_grad(set_to_none=True)`, activation checkpointing), the
//!   trace transformed by the roles of its blocks and replayed under the recorded
//!   settings (or each `--config`), beside the recording replayed the same way. A model
//!   of the change, not a recording.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use fragscope_alloc::AllocatorConfig;
use fragscope_diagnose::advice;
use fragscope_diagnose::role_whatif::{self, RoleWhatIf};
use fragscope_replay::{
    self as replay, cost, fidelity, recorded_config, replayable_devices, settings, simulate_with, ReplayOptions,
    SimOptions, VerifyReport, WhatIf,
};
use fragscope_snapshot::Snapshot;
use serde::Serialize;

use crate::output::{self, Align, Table};
use crate::{input, print_stdout, CliError};

#[derive(clap::Args, Debug, Default)]
pub struct Args {
    /// Snapshot files (pickles from torch.cuda.memory._dump_snapshot). Without FILE: the
    /// built-in example snapshot.
    pub files: Vec<PathBuf>,
    /// Check the allocator model against the recording instead of simulating.
    #[arg(long)]
    pub verify: bool,
    /// Print the Markdown fidelity table (docs/fidelity.md) for all FILEs.
    #[arg(long, conflicts_with_all = ["verify", "config", "save_snapshot"])]
    pub fidelity_table: bool,
    /// PYTORCH_CUDA_ALLOC_CONF string to simulate (repeatable). Applied on top of the
    /// recorded settings. Without it: the recorded settings and common alternatives.
    #[arg(long = "config", value_name = "STRING")]
    pub config: Vec<String>,
    /// Device memory: bytes with a unit (80GiB, 40GB, 24G) or a GPU name (H100-80GB,
    /// A100-40GB, A100-80GB, L40S, T4, RTX-4090, V100-32GB, ...), which gives the total a
    /// PyTorch process sees (the "total capacity" of its OOM messages).
    #[arg(long, value_name = "SIZE|GPU")]
    pub capacity: Option<String>,
    /// Only this device.
    #[arg(long)]
    pub device: Option<i64>,
    /// Write the simulated run (first --config) as a snapshot pickle.
    #[arg(long, value_name = "OUT")]
    pub save_snapshot: Option<PathBuf>,
    /// Also replay with torch.cuda.empty_cache() called at WHERE: `step` (the start of
    /// every training step: optimizer steps, backward passes or step annotations; the old
    /// name `iteration` is the same), a record_function name (when it starts) or NAME@end
    /// (repeatable). Without --config and these flags: step and --no-caching are
    /// replayed beside the alternatives.
    #[arg(long = "empty-cache-at", value_name = "WHERE")]
    pub empty_cache_at: Vec<String>,
    /// Also replay with PYTORCH_NO_CUDA_MEMORY_CACHING=1 (every allocation a cudaMalloc,
    /// every free a cudaFree).
    #[arg(long)]
    pub no_caching: bool,
    /// Print the Markdown table of what empty_cache() per step and no caching cost
    /// and save on each FILE.
    #[arg(long, conflicts_with_all = ["verify", "fidelity_table", "config", "save_snapshot"])]
    pub advice_table: bool,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// Allocator lab: serve the workload with this allocation policy (repeatable; `all` =
    /// every one): pytorch, expandable, pytorch:CONF, best-fit, page-remap, lifetime,
    /// planned. See docs/allocator-lab.md.
    #[arg(long = "allocator", value_name = "NAME", conflicts_with_all = ["verify", "config", "save_snapshot", "fidelity_table"])]
    pub allocator: Vec<String>,
    /// Allocator lab: also find, for each policy, the smallest device on which it runs
    /// without an OOM (bisection in 2 MiB steps; a dozen or more runs per policy)
    #[arg(long = "min-capacity", requires = "allocator")]
    pub min_capacity: bool,
    /// Role-level what-if (a model, replayed): the optimizer state sharded over N ranks,
    /// ZeRO-1 style (each optimizer-state block and the optimizer step's temporaries at
    /// 1/N of their size).
    #[arg(long, value_name = "N", conflicts_with_all = ROLE_CONFLICTS)]
    pub shard_optimizer: Option<u32>,
    /// Role-level what-if: the gradients sharded over N ranks, ZeRO-2 style (with
    /// --shard-optimizer N for the optimizer state too).
    #[arg(long, value_name = "N", conflicts_with_all = ROLE_CONFLICTS)]
    pub shard_gradients: Option<u32>,
    /// Role-level what-if: zero_grad(set_to_none=True): gradients kept across a step
    /// boundary freed where the next forward starts, made again in backward.
    #[arg(long, conflicts_with_all = ROLE_CONFLICTS)]
    pub grads_set_to_none: bool,
    /// Role-level what-if: activation checkpointing of LAYERS (`all`, or 0-based layers
    /// and ranges in forward order: `0,2,5-7`): their saved activations freed at the end
    /// of their forward and made again at the start of their backward.
    #[arg(long, value_name = "LAYERS", conflicts_with_all = ROLE_CONFLICTS)]
    pub checkpoint: Option<String>,
}

/// What the role-level what-ifs do not combine with.
const ROLE_CONFLICTS: [&str; 7] =
    ["verify", "fidelity_table", "advice_table", "allocator", "empty_cache_at", "no_caching", "save_snapshot"];

/// The role-level changes `args` asks for (empty: none), checked.
pub fn role_changes(args: &Args) -> Result<Vec<role_whatif::Change>, CliError> {
    let mut v = Vec::new();
    let ranks = |flag: &str, n: u32| {
        if n < 2 {
            Err(CliError::usage(format!("{flag} {n}: sharding needs 2 ranks or more")))
        } else {
            Ok(n)
        }
    };
    if let Some(n) = args.shard_optimizer {
        v.push(role_whatif::Change::ShardOptimizer(ranks("--shard-optimizer", n)?));
    }
    if let Some(n) = args.shard_gradients {
        v.push(role_whatif::Change::ShardGradients(ranks("--shard-gradients", n)?));
    }
    if args.grads_set_to_none {
        v.push(role_whatif::Change::GradsSetToNone);
    }
    if let Some(l) = &args.checkpoint {
        v.push(role_whatif::Change::Checkpoint(role_whatif::Layers::parse(l).map_err(CliError::usage)?));
    }
    Ok(v)
}

/// [`settings::config_on_top`], refused as a usage error (also `predict`'s).
pub(crate) fn config_on_top(base: &AllocatorConfig, extra: &str) -> Result<AllocatorConfig, CliError> {
    settings::config_on_top(base, extra).map_err(|e| CliError::usage(e.to_string()))
}

#[derive(Serialize)]
struct JsonOut<'a> {
    schema: &'static str,
    files: Vec<JsonFile<'a>>,
}

#[derive(Serialize)]
struct JsonFile<'a> {
    file: String,
    devices: Vec<JsonDevice<'a>>,
}

#[derive(Serialize)]
struct JsonDevice<'a> {
    #[serde(flatten)]
    verify: &'a VerifyReport,
    #[serde(skip_serializing_if = "Option::is_none")]
    whatif: Option<&'a [WhatIf]>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    advice_notes: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    role_whatif: Option<&'a [RoleWhatIf]>,
}

/// One device's replay: the verification and, unless `--verify`, the what-if runs.
pub struct DeviceResult {
    pub verify: VerifyReport,
    pub whatif: Option<Vec<WhatIf>>,
    /// Advice that could not be replayed on this device, and why.
    pub notes: Vec<String>,
    /// Role-level what-ifs (one per configuration), when asked for.
    pub roles: Option<Vec<RoleWhatIf>>,
}

pub fn run(args: &Args) -> Result<ExitCode, CliError> {
    // Bad config strings are bad usage: check them before any work.
    let capacity = capacity_of(args)?;
    advice_requested(args)?;
    role_changes(args)?;
    if args.advice_table {
        print_stdout(&advice_table(&args.files, capacity))?;
        return Ok(ExitCode::SUCCESS);
    }
    if !args.allocator.is_empty() {
        return super::lab::run(args, capacity);
    }
    if args.fidelity_table {
        let mut files = Vec::new();
        for f in &args.files {
            let name = f.file_name().map_or_else(|| f.display().to_string(), |n| n.to_string_lossy().into_owned());
            let snap = fragscope_snapshot::read_path_checked(f, &mut |_, _| {});
            files.push((name, snap));
        }
        print_stdout(&fidelity::fidelity_table(&files))?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut saved: Option<Snapshot> = None;
    let out: Vec<(String, Vec<DeviceResult>)> = input::each_snapshot(&args.files, args.json, |name, snap| {
        Ok((name, replay_snapshot(args, capacity, snap, &mut saved)?))
    })?;
    save(args, saved.as_ref())?;
    let text = if args.json { json(&out, args.verify)? } else { render_text(&out, args.verify) };
    print_stdout(&text)?;
    Ok(ExitCode::SUCCESS)
}

/// Checks `args`' config strings and returns its capacity (`--capacity` parsed): the
/// usage errors of `replay`, found before any work.
pub fn capacity_of(args: &Args) -> Result<Option<u64>, CliError> {
    for c in &args.config {
        fragscope_alloc::parse_config(c).map_err(|e| CliError::usage(e.to_string()))?;
    }
    args.capacity.as_deref().map(settings::parse_capacity).transpose().map_err(CliError::usage)
}

/// Replays one snapshot as `args` asks (verify, and unless `--verify` the what-if runs),
/// per replayable device. With `--save-snapshot`, the first config's simulated run is
/// merged into `saved` (see [`save`]).
pub fn replay_snapshot(
    args: &Args,
    capacity: Option<u64>,
    snap: &Snapshot,
    saved: &mut Option<Snapshot>,
) -> Result<Vec<DeviceResult>, CliError> {
    let mut devs = replayable_devices(snap);
    if let Some(d) = args.device {
        devs.retain(|&x| x == d);
    }
    let advice = advice_requested(args)?;
    let changes = role_changes(args)?;
    if !changes.is_empty()
        && (args.verify || !args.empty_cache_at.is_empty() || args.no_caching || args.save_snapshot.is_some())
    {
        // clap refuses these on the command line; this is for the other front ends.
        return Err(CliError::usage(
            "role-level what-ifs do not combine with verify, empty_cache_at, no_caching or save_snapshot",
        ));
    }
    let mut results = Vec::new();
    for d in devs {
        let verify = replay::verify(snap, d, &ReplayOptions { capacity, ..Default::default() });
        let mut notes = Vec::new();
        if !changes.is_empty() {
            let recorded = recorded_config(snap);
            let mut cfgs = vec![recorded.clone()];
            if !args.config.is_empty() {
                cfgs = args.config.iter().map(|c| config_on_top(&recorded, c)).collect::<Result<_, _>>()?;
            }
            let sets = [changes.clone()];
            let roles = cfgs
                .into_iter()
                .flat_map(|c| role_whatif::simulate_change_sets(snap, d, &sets, c, capacity, &[]))
                .collect();
            results.push(DeviceResult { verify, whatif: None, notes, roles: Some(roles) });
            continue;
        }
        let whatif = if args.verify {
            None
        } else {
            let recorded = recorded_config(snap);
            let mut cfgs: Vec<AllocatorConfig> = Vec::new();
            if args.config.is_empty() {
                cfgs.push(recorded.clone());
                for alt in settings::ALTERNATIVES {
                    let c = config_on_top(&recorded, alt)?;
                    if c != recorded {
                        cfgs.push(c);
                    }
                }
            } else {
                for c in &args.config {
                    cfgs.push(config_on_top(&recorded, c)?);
                }
            }
            // Each setting a replay of its own, side by side (seconds each on a long trace).
            let mut runs = fragscope_trace::par::map(cfgs.len(), fragscope_trace::par::threads(), |k| {
                let collect = k == 0 && args.save_snapshot.is_some();
                simulate_with(
                    snap,
                    d,
                    cfgs[k].clone(),
                    &SimOptions { capacity, collect_snapshot: collect, ..SimOptions::default() },
                )
            });
            for w in &mut runs {
                if let Some(s) = w.snapshot.take() {
                    merge_into(saved, s);
                }
            }
            runs.extend(run_advice(snap, d, &recorded, capacity, &advice, &mut notes));
            Some(runs)
        };
        results.push(DeviceResult { verify, whatif, notes, roles: None });
    }
    Ok(results)
}

/// Writes the simulated run to `--save-snapshot`, when asked and there is one.
pub fn save(args: &Args, saved: Option<&Snapshot>) -> Result<(), CliError> {
    if let (Some(path), Some(s)) = (&args.save_snapshot, saved) {
        fragscope_snapshot::pickle::write::write_path(s, path)
            .map_err(|e| CliError::usage(format!("cannot write {}: {e}", path.display())))?;
    }
    Ok(())
}

/// The `--json` document (`fragscope.replay.verify/1` with `verify`, else
/// `fragscope.replay.whatif/2`) of `(file name, device results)` per file.
pub fn json(out: &[(String, Vec<DeviceResult>)], verify: bool) -> Result<String, CliError> {
    let j = JsonOut {
        schema: if verify { "fragscope.replay.verify/1" } else { "fragscope.replay.whatif/2" },
        files: out
            .iter()
            .map(|(file, rs)| JsonFile {
                file: file.clone(),
                devices: rs
                    .iter()
                    .map(|r| JsonDevice {
                        verify: &r.verify,
                        whatif: r.whatif.as_deref(),
                        advice_notes: &r.notes,
                        role_whatif: r.roles.as_deref(),
                    })
                    .collect(),
            })
            .collect(),
    };
    crate::output::json_text(&j)
}

fn merge_into(acc: &mut Option<Snapshot>, s: Snapshot) {
    match acc {
        None => *acc = Some(s),
        Some(a) => {
            a.segments.extend(s.segments);
            for (i, t) in s.device_traces.into_iter().enumerate() {
                if a.device_traces.len() <= i {
                    a.device_traces.resize(i + 1, Vec::new());
                }
                if !t.is_empty() {
                    a.device_traces[i] = t;
                }
            }
        }
    }
}

fn frac(a: u64, b: u64) -> String {
    if b == 0 {
        "—".into()
    } else {
        format!("{a}/{b} ({})", output::percent(a as f64 / b as f64))
    }
}

fn render_text(out: &[(String, Vec<DeviceResult>)], verify_only: bool) -> String {
    let mut s = String::new();
    for (file, rs) in out {
        let _ = writeln!(s, "{file}");
        if rs.is_empty() {
            let _ = writeln!(s, "  no allocation trace to replay (state-only snapshot)\n");
            continue;
        }
        let mut t = Table::new(&[
            ("device", Align::Right),
            ("allocs matched", Align::Right),
            ("segment events matched", Align::Right),
            ("OOMs", Align::Right),
            ("first divergence", Align::Left),
        ]);
        for r in rs {
            let v = &r.verify;
            t.row([
                v.device.to_string(),
                frac(v.allocs_matched, v.allocs),
                frac(v.segment_events_matched, v.segment_events),
                frac(v.ooms_matched, v.ooms),
                fidelity::verdict(v).replace("exact", "none"),
            ]);
        }
        s.push_str(&t.render());
        // Every note a replay makes is printed, as in --json.
        for r in rs {
            for n in &r.verify.notes {
                let _ = writeln!(s, "  device {}: {n}", r.verify.device);
            }
        }
        if !verify_only {
            for r in rs {
                for w in r.roles.iter().flatten() {
                    role_text(&mut s, w);
                }
            }
            for r in rs {
                let Some(runs) = &r.whatif else { continue };
                whatif_text(&mut s, r, runs);
            }
        }
        s.push('\n');
    }
    s
}

/// Device `r`'s what-if runs (`runs`, its alternative settings replayed) as text: one
/// table row per run, the device's notes, each run's notes once with the runs they
/// concern, and whether the runs started from the same memory.
fn whatif_text(s: &mut String, r: &DeviceResult, runs: &[WhatIf]) {
    let _ = writeln!(s, "\n  device {}: what if", r.verify.device);
    let mut t = Table::new(&[
        ("PYTORCH_CUDA_ALLOC_CONF", Align::Left),
        ("peak reserved", Align::Right),
        ("peak allocated", Align::Right),
        ("fragmentation", Align::Right),
        ("cudaMalloc", Align::Right),
        ("cudaFree", Align::Right),
        ("syncs", Align::Right),
        ("retries", Align::Right),
        ("first OOM", Align::Left),
    ]);
    for w in runs {
        let name = whatif_label(w);
        t.row([
            name,
            output::bytes(w.peak_reserved),
            output::bytes(w.peak_allocated),
            output::percent(w.peak_fragmentation),
            w.cuda_mallocs.to_string(),
            w.cuda_frees.to_string(),
            w.driver.syncs().to_string(),
            w.alloc_retries.to_string(),
            match &w.first_oom {
                None => "none".into(),
                Some(o) => format!("event {}: {}", o.index, output::bytes(o.requested)),
            },
        ]);
    }
    s.push_str(&t.render());
    for n in &r.notes {
        let _ = writeln!(s, "  {n}");
    }
    // The runs' own notes, each once, with the runs it concerns.
    let mut seen: Vec<(&str, Vec<String>)> = Vec::new();
    for w in runs {
        for n in &w.notes {
            match seen.iter_mut().find(|(m, _)| *m == n.as_str()) {
                Some((_, who)) => who.push(whatif_label(w)),
                None => seen.push((n.as_str(), vec![whatif_label(w)])),
            }
        }
    }
    for (n, who) in seen {
        let whom = if who.len() == runs.len() { "all runs".to_string() } else { who.join(", ") };
        let _ = writeln!(s, "  note ({whom}): {n}");
    }
    if let Some(w) = runs.iter().find(|w| w.start_state.refusal().is_some()) {
        let _ = writeln!(
            s,
            "  These runs are not comparable: {} for {}; the rows do not start from the same memory.",
            w.start_state.refusal().unwrap_or_default(),
            whatif_label(w)
        );
    }
    let _ = writeln!(s, "  {}", cost::SYNCS_NOTE);
}

/// A role-level what-if as text: the changes (or why not), the recording and the
/// changed program replayed, the verdict, what is not modelled.
pub fn role_text(s: &mut String, w: &RoleWhatIf) {
    let _ = writeln!(s, "\n  device {}: what if the program changed: {}", w.device, w.label);
    let _ = writeln!(s, "  Steps: {}.", w.steps);
    for c in &w.changes {
        match &c.cannot_apply {
            None => {
                let _ = writeln!(
                    s,
                    "  * {}: {} ({} as recorded, each block once)",
                    c.change,
                    c.detail,
                    output::bytes(c.bytes)
                );
            }
            Some(why) => {
                let _ = writeln!(s, "  * {}: cannot be applied: {why}", c.change);
            }
        }
    }
    if let Some(ch) = &w.changed {
        let mut t = Table::new(&[
            ("run", Align::Left),
            ("peak reserved", Align::Right),
            ("peak allocated", Align::Right),
            ("cudaMalloc", Align::Right),
            ("first OOM", Align::Left),
        ]);
        for (name, x) in [("recorded program (replayed)", &w.recorded), ("changed program (model)", ch)] {
            t.row([
                name.to_string(),
                output::bytes(x.peak_reserved),
                output::bytes(x.peak_allocated),
                x.cuda_mallocs.to_string(),
                match &x.first_oom {
                    None => "none".into(),
                    Some(o) => format!("event {}: {}", o.index, output::bytes(o.requested)),
                },
            ]);
        }
        s.push_str(&t.render());
    }
    let on = w.capacity.map_or("an unlimited device".to_string(), |c| format!("a {} device", output::bytes(c)));
    let _ = writeln!(s, "  On {on}: {}.", w.verdict);
    let mut seen: Vec<&str> = Vec::new();
    for n in w.recorded.notes.iter().chain(w.changed.iter().flat_map(|c| &c.notes)) {
        if !seen.contains(&n.as_str()) {
            seen.push(n);
            let _ = writeln!(s, "  note: {n}");
        }
    }
    let _ = writeln!(s, "  Not modelled: {}.", w.not_modelled.join("; "));
}

/// The advice to replay: (`empty_cache()` points, no caching). Without `--config` and
/// without the flags, both defaults (every step, no caching).
fn advice_requested(args: &Args) -> Result<(Vec<advice::EmptyCacheAt>, bool), CliError> {
    if args.config.is_empty() && args.empty_cache_at.is_empty() && !args.no_caching {
        return Ok((vec![advice::EmptyCacheAt::Steps], true));
    }
    let at = args
        .empty_cache_at
        .iter()
        .map(|s| advice::EmptyCacheAt::parse(s).map_err(CliError::usage))
        .collect::<Result<Vec<_>, _>>()?;
    Ok((at, args.no_caching))
}

fn run_advice(
    snap: &Snapshot,
    d: i64,
    recorded: &AllocatorConfig,
    capacity: Option<u64>,
    (at, no_caching): &(Vec<advice::EmptyCacheAt>, bool),
    notes: &mut Vec<String>,
) -> Vec<WhatIf> {
    // The empty_cache() placements, then no caching: replays side by side, kept in order.
    let jobs = at.len() + usize::from(*no_caching);
    let done = fragscope_trace::par::map(jobs, fragscope_trace::par::threads(), |k| match at.get(k) {
        Some(a) => advice::simulate_empty_cache(snap, d, recorded.clone(), capacity, a)
            .map_err(|e| format!("{}: not replayed, {e}", a.describe())),
        None => Ok(advice::simulate_uncached(snap, d, capacity)),
    });
    let mut runs = Vec::new();
    for r in done {
        match r {
            Ok(w) => runs.push(w),
            Err(note) => notes.push(note),
        }
    }
    runs
}

/// The row name of a what-if: its advice, else its configuration string.
fn whatif_label(w: &WhatIf) -> String {
    match &w.advice {
        Some(a) if w.advice_points.is_some() => format!("{a} ({} calls)", w.empty_cache_added),
        Some(a) => a.clone(),
        None if w.config.is_empty() => "(defaults)".to_string(),
        None => w.config.clone(),
    }
}

/// `--advice-table`: per file and device with a trace, the recorded settings against
/// empty_cache() at every step and no caching (Markdown).
fn advice_table(files: &[PathBuf], capacity: Option<u64>) -> String {
    let mut s = String::from(
        "| file | device | steps | recorded: peak reserved, cudaMalloc+cudaFree, syncs | empty_cache() every step: peak reserved, cudaMalloc+cudaFree, syncs | no caching: peak held, cudaMalloc+cudaFree, syncs |\n|---|---|---|---|---|---|\n",
    );
    let cell = |w: &WhatIf| {
        format!("{}, {}+{}, {}", output::bytes(w.peak_reserved), w.cuda_mallocs, w.cuda_frees, w.driver.syncs())
    };
    for f in files {
        let name = f.file_name().map_or_else(|| f.display().to_string(), |n| n.to_string_lossy().into_owned());
        let snap = match fragscope_snapshot::read_path(f) {
            Ok(s) => s,
            Err(e) => {
                let _ = writeln!(s, "| {name} | — | unreadable: {e} | | | |");
                continue;
            }
        };
        for d in replayable_devices(&snap) {
            let cfg = recorded_config(&snap);
            let base = replay::simulate(&snap, d, cfg.clone(), capacity);
            let (iters, ec) = match advice::simulate_empty_cache(&snap, d, cfg, capacity, &advice::EmptyCacheAt::Steps)
            {
                Ok(w) => (w.advice_points.clone().unwrap_or_default(), cell(&w)),
                Err(e) => (e.to_string(), "—".to_string()),
            };
            let nc = advice::simulate_uncached(&snap, d, capacity);
            let _ = writeln!(s, "| {name} | {d} | {iters} | {} | {ec} | {} |", cell(&base), cell(&nc));
        }
    }
    let _ = writeln!(s, "\n{}", cost::SYNCS_NOTE);
    s
}
