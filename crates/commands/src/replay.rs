//! `replay`: a snapshot's trace through the allocator model — the verification against the
//! recording, the same workload under other `PYTORCH_CUDA_ALLOC_CONF` settings or another
//! device size, the advice users are given (`empty_cache()` at a point, no caching)
//! replayed beside them, the role-level what-ifs (ZeRO sharding, `set_to_none`,
//! activation checkpointing), and the allocator lab ([`LabRequest`]).
//!
//! [`ReplayRequest`] is what a front end asks; [`ReplayRequest::check`] refuses a bad
//! request before any work, naming the parameter; [`replay_snapshot`] runs it on one
//! snapshot; [`json`] is the document (`fragscope.replay.verify/1`,
//! `fragscope.replay.whatif/2`).

use std::fmt::Write as _;
use std::path::PathBuf;

use fragscope_alloc::AllocatorConfig;
use fragscope_diagnose::{
    simulate_change_sets, simulate_empty_cache, simulate_uncached, CheckpointLayers, EmptyCacheAt, EmptyCacheAtError,
    RoleChange, RoleWhatIf,
};
use fragscope_replay::{
    self as replay, lab_with, parse_policy, recorded_config, replayable_devices, simulate_with, LabReport, PolicySpec,
    ReplayOptions, SimOptions, VerifyReport, WhatIf,
};
use fragscope_snapshot::Snapshot;
use serde::Serialize;

use crate::{msg, Error, Param};

/// A replay as a front end asks for it. Text fields are as a user writes them (a
/// `PYTORCH_CUDA_ALLOC_CONF` string, `80GB` or `H100-80GB`, `step`); [`check`] parses them.
///
/// [`check`]: ReplayRequest::check
#[derive(Debug, Default, Clone)]
pub struct ReplayRequest {
    /// Check the model against the recording instead of simulating.
    pub verify: bool,
    /// Settings to simulate, each on top of the recorded ones. Empty: the recorded
    /// settings and [`replay::ALTERNATIVES`].
    pub configs: Vec<String>,
    /// Device memory: bytes with a unit or a GPU name.
    pub capacity: Option<String>,
    /// Only this device.
    pub device: Option<i64>,
    /// Write the simulated run (first config) as a snapshot pickle.
    pub save_snapshot: Option<PathBuf>,
    /// Also replay with `torch.cuda.empty_cache()` at these points (`step`, a
    /// record_function name, `NAME@end`, `entry:N,...`).
    pub empty_cache_at: Vec<String>,
    /// Also replay with `PYTORCH_NO_CUDA_MEMORY_CACHING=1`.
    pub no_caching: bool,
    /// Role-level what-if: optimizer state sharded over N ranks (ZeRO-1).
    pub shard_optimizer: Option<u32>,
    /// Role-level what-if: gradients sharded over N ranks (ZeRO-2).
    pub shard_gradients: Option<u32>,
    /// Role-level what-if: `zero_grad(set_to_none=True)`.
    pub grads_set_to_none: bool,
    /// Role-level what-if: activation checkpointing of these layers (`all`, `0,2,5-7`).
    pub checkpoint: Option<String>,
}

/// A [`ReplayRequest`] parsed: what [`replay_snapshot`] runs.
#[derive(Debug, Clone)]
pub struct Checked {
    /// Bytes PyTorch's allocator may hold: a GPU name's total less the CUDA context, as
    /// `predict` and `fit` read it ([`parse_capacity`]).
    pub capacity: Option<u64>,
    /// For a GPU name: what was taken off its total and why (`None` for bytes as given).
    pub capacity_note: Option<String>,
    /// `empty_cache()` placements, and whether to replay without caching.
    pub advice: (Vec<EmptyCacheAt>, bool),
    pub changes: Vec<RoleChange>,
}

impl ReplayRequest {
    /// Parses and checks the request: bad settings, capacity, advice points or role
    /// changes are refused before any replay, naming the parameter.
    pub fn check(&self) -> Result<Checked, Error> {
        for c in &self.configs {
            fragscope_alloc::parse_config(c).map_err(|e| Error::argument(msg![e.to_string()]))?;
        }
        let (capacity, capacity_note) = crate::capacity::parse_capacity(self.capacity.as_deref())?;
        let advice = self.advice_requested()?;
        let changes = self.role_changes()?;
        if !changes.is_empty()
            && (self.verify || !self.empty_cache_at.is_empty() || self.no_caching || self.save_snapshot.is_some())
        {
            return Err(Error::argument(msg![
                "role-level what-ifs do not combine with verify, ",
                Param::EmptyCacheAt,
                ", ",
                Param::NoCaching,
                " or ",
                Param::SaveSnapshot
            ]));
        }
        Ok(Checked { capacity, capacity_note, advice, changes })
    }

    /// The advice to replay: (`empty_cache()` points, no caching). Without configs and
    /// without either, both defaults (every step, no caching).
    fn advice_requested(&self) -> Result<(Vec<EmptyCacheAt>, bool), Error> {
        if self.configs.is_empty() && self.empty_cache_at.is_empty() && !self.no_caching {
            return Ok((vec![EmptyCacheAt::Steps], true));
        }
        let at = self
            .empty_cache_at
            .iter()
            .map(|s| EmptyCacheAt::parse(s).map_err(empty_cache_at_error))
            .collect::<Result<Vec<_>, _>>()?;
        Ok((at, self.no_caching))
    }

    /// The role-level changes asked for (empty: none), checked.
    fn role_changes(&self) -> Result<Vec<RoleChange>, Error> {
        let mut v = Vec::new();
        let ranks = |p: Param, n: u32| {
            if n < 2 {
                Err(Error::argument(msg![p, format!(" {n}: sharding needs 2 ranks or more")]))
            } else {
                Ok(n)
            }
        };
        if let Some(n) = self.shard_optimizer {
            v.push(RoleChange::ShardOptimizer(ranks(Param::ShardOptimizer, n)?));
        }
        if let Some(n) = self.shard_gradients {
            v.push(RoleChange::ShardGradients(ranks(Param::ShardGradients, n)?));
        }
        if self.grads_set_to_none {
            v.push(RoleChange::GradsSetToNone);
        }
        if let Some(l) = &self.checkpoint {
            v.push(RoleChange::Checkpoint(
                CheckpointLayers::parse(l).map_err(|e| Error::argument(msg![e.to_string()]))?,
            ));
        }
        Ok(v)
    }
}

/// An `empty_cache_at` point that does not parse, its parameter in the reader's words.
fn empty_cache_at_error(e: EmptyCacheAtError) -> Error {
    use EmptyCacheAtError as E;
    match e {
        E::Empty { param } => Error::argument(msg![Param::from(param), " needs `step` or a record_function name"]),
        E::BadEntries { param, text } => Error::argument(msg![
            "invalid ",
            Param::from(param),
            format!(" '{text}': entry:N[,N...] takes trace entry indexes")
        ]),
    }
}

/// A capacity as a user writes it (`80GB`, `H100-80GB`), parsed to the bytes PyTorch's
/// allocator may hold: bytes as given, a GPU name's total less the CUDA context
/// ([`crate::capacity::parse_capacity`]: one meaning of a GPU name in every command).
pub fn parse_capacity(text: Option<&str>) -> Result<Option<u64>, Error> {
    Ok(crate::capacity::parse_capacity(text)?.0)
}

/// [`replay::config_on_top`], refused as an argument error (also `predict`'s).
pub fn config_on_top(base: &AllocatorConfig, extra: &str) -> Result<AllocatorConfig, Error> {
    replay::config_on_top(base, extra).map_err(|e| Error::argument(msg![e.to_string()]))
}

/// One device's replay: the verification and, unless verifying only, the what-if runs.
pub struct DeviceResult {
    pub verify: VerifyReport,
    pub whatif: Option<Vec<WhatIf>>,
    /// Advice that could not be replayed on this device, and why.
    pub notes: Vec<String>,
    /// Role-level what-ifs (one per configuration), when asked for.
    pub roles: Option<Vec<RoleWhatIf>>,
}

/// `device` must name a device whose trace can be replayed: an empty result for a
/// mistyped device would read as "nothing to report".
fn device_replayable(snap: &Snapshot, device: Option<i64>) -> Result<(), Error> {
    let Some(d) = device else { return Ok(()) };
    let have = replayable_devices(snap);
    if have.contains(&d) {
        return Ok(());
    }
    let why = if snap.devices().contains(&d) { "has no trace to replay on" } else { "has no" };
    Err(Error::argument(msg![
        Param::Device,
        format!("={d}: this snapshot {why} device {d} (devices with a replayable trace: {have:?})")
    ]))
}

/// Each `empty_cache_at` point must be found on at least one replayed device: a name that
/// matches nothing is a typo, not a what-if to leave out with a note.
fn empty_cache_found(specs: &[String], devices: &[DeviceResult]) -> Result<(), Error> {
    for s in specs {
        let Ok(at) = EmptyCacheAt::parse(s) else { continue };
        let prefix = format!("{}: not replayed, ", at.describe());
        let reasons: Vec<&str> =
            devices.iter().filter_map(|d| d.notes.iter().find_map(|n| n.strip_prefix(prefix.as_str()))).collect();
        if !devices.is_empty() && reasons.len() == devices.len() {
            return Err(Error::argument(msg![
                Param::EmptyCacheAt,
                format!("='{s}': not found on any device ({})", reasons[0])
            ]));
        }
    }
    Ok(())
}

/// Replays one snapshot as `req` asks (verify, and unless verifying only the what-if
/// runs), per replayable device. With `save_snapshot`, the first config's simulated run is
/// merged into `saved` (see [`save`]). A device the snapshot cannot replay, or an
/// `empty_cache_at` point found on no device, is an error rather than an empty answer.
pub fn replay_snapshot(
    req: &ReplayRequest,
    checked: &Checked,
    snap: &Snapshot,
    saved: &mut Option<Snapshot>,
) -> Result<Vec<DeviceResult>, Error> {
    device_replayable(snap, req.device)?;
    // Segments grouped by device once: each device's replay reads only its own.
    let devices = snap.with_device_index(|snap| replay_devices(req, checked, snap, saved))?;
    empty_cache_found(&req.empty_cache_at, &devices)?;
    Ok(devices)
}

fn replay_devices(
    req: &ReplayRequest,
    checked: &Checked,
    snap: &Snapshot,
    saved: &mut Option<Snapshot>,
) -> Result<Vec<DeviceResult>, Error> {
    let mut devs = replayable_devices(snap);
    if let Some(d) = req.device {
        devs.retain(|&x| x == d);
    }
    let capacity = checked.capacity;
    let mut results = Vec::new();
    for d in devs {
        let verify = replay::verify(snap, d, &ReplayOptions { capacity, ..Default::default() });
        let mut notes = Vec::new();
        if !checked.changes.is_empty() {
            let roles = role_whatifs(req, &checked.changes, snap, d, capacity)?;
            results.push(DeviceResult { verify, whatif: None, notes, roles: Some(roles) });
            continue;
        }
        let whatif = if req.verify {
            None
        } else {
            let recorded = recorded_config(snap);
            let cfgs = settings_to_replay(&req.configs, &recorded)?;
            // Each setting a replay of its own, side by side (seconds each on a long trace).
            let mut runs = fragscope_trace::par_map(cfgs.len(), fragscope_trace::par_threads(), |k| {
                let collect = k == 0 && req.save_snapshot.is_some();
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
            // `empty_cache()` is replayed under the first `--config` given (on top of the
            // recorded settings), as `fit` offers it with a setting: the flags together are
            // the change, never the setting silently dropped.
            let base = if req.configs.is_empty() { recorded.clone() } else { cfgs[0].clone() };
            runs.extend(run_advice(snap, d, &base, capacity, &checked.advice, &mut notes));
            Some(runs)
        };
        results.push(DeviceResult { verify, whatif, notes, roles: None });
    }
    Ok(results)
}

/// The settings a what-if replays: each of `configs` on top of the recorded ones, or
/// without any, the recorded settings and every alternative that differs from them.
fn settings_to_replay(configs: &[String], recorded: &AllocatorConfig) -> Result<Vec<AllocatorConfig>, Error> {
    if !configs.is_empty() {
        return configs_on_top(configs, recorded);
    }
    let mut cfgs = vec![recorded.clone()];
    for alt in replay::ALTERNATIVES {
        let c = config_on_top(recorded, alt)?;
        if c != *recorded {
            cfgs.push(c);
        }
    }
    Ok(cfgs)
}

/// Each of `configs` on top of the recorded settings.
fn configs_on_top(configs: &[String], recorded: &AllocatorConfig) -> Result<Vec<AllocatorConfig>, Error> {
    configs.iter().map(|c| config_on_top(recorded, c)).collect()
}

/// The role-level what-ifs of device `d`, under the recorded settings or each config.
fn role_whatifs(
    req: &ReplayRequest,
    changes: &[RoleChange],
    snap: &Snapshot,
    d: i64,
    capacity: Option<u64>,
) -> Result<Vec<RoleWhatIf>, Error> {
    let recorded = recorded_config(snap);
    let cfgs = if req.configs.is_empty() { vec![recorded] } else { configs_on_top(&req.configs, &recorded)? };
    let sets = [changes.to_vec()];
    Ok(cfgs.into_iter().flat_map(|c| simulate_change_sets(snap, d, &sets, c, capacity, &[])).collect())
}

/// The advice replays (`empty_cache()` placements under `base`, the settings they are
/// made under, then no caching), side by side and kept in order; a placement that cannot be
/// replayed on `d` becomes a note.
fn run_advice(
    snap: &Snapshot,
    d: i64,
    base: &AllocatorConfig,
    capacity: Option<u64>,
    (at, no_caching): &(Vec<EmptyCacheAt>, bool),
    notes: &mut Vec<String>,
) -> Vec<WhatIf> {
    let jobs = at.len() + usize::from(*no_caching);
    let done = fragscope_trace::par_map(jobs, fragscope_trace::par_threads(), |k| match at.get(k) {
        Some(a) => simulate_empty_cache(snap, d, base.clone(), capacity, a)
            .map(|mut w| {
                // Under a setting of the user's, the row says which.
                if !w.config.is_empty() && *base != recorded_config(snap) {
                    w.advice = w.advice.map(|x| format!("{x} under {}", w.config));
                }
                w
            })
            .map_err(|e| format!("{}: not replayed, {e}", a.describe())),
        None => Ok(simulate_uncached(snap, d, capacity)),
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

/// The advice table (docs: `replay --advice-table`): per file and device with a trace, the recorded settings against
/// empty_cache() at every step and no caching (Markdown).
pub fn advice_table(files: &[PathBuf], capacity: Option<u64>) -> String {
    let mut s = String::from(
        "| file | device | steps | recorded: peak reserved, cudaMalloc+cudaFree, syncs | empty_cache() every step: peak reserved, cudaMalloc+cudaFree, syncs | no caching: peak held, cudaMalloc+cudaFree, syncs |\n|---|---|---|---|---|---|\n",
    );
    let cell = |w: &WhatIf| {
        format!(
            "{}, {}+{}, {}",
            fragscope_alloc::format_size(w.peak_reserved),
            w.cuda_mallocs,
            w.cuda_frees,
            w.driver.syncs()
        )
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
            let (iters, ec) = match simulate_empty_cache(&snap, d, cfg, capacity, &EmptyCacheAt::Steps) {
                Ok(w) => (w.advice_points.clone().unwrap_or_default(), cell(&w)),
                Err(e) => (e.to_string(), "—".to_string()),
            };
            let nc = simulate_uncached(&snap, d, capacity);
            let _ = writeln!(s, "| {name} | {d} | {iters} | {} | {ec} | {} |", cell(&base), cell(&nc));
        }
    }
    let _ = writeln!(s, "\n{}", replay::SYNCS_NOTE);
    s
}

/// Writes the simulated run to `save_snapshot`, when asked and there is one.
pub fn save(req: &ReplayRequest, saved: Option<&Snapshot>) -> Result<(), Error> {
    if let (Some(path), Some(s)) = (&req.save_snapshot, saved) {
        crate::outfile::save_snapshot(s, path)
            .map_err(|e| Error::output(format!("cannot write {}: {e}", path.display())))?;
    }
    Ok(())
}

/// Several devices' simulated runs in one snapshot (one per device trace).
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

#[derive(Serialize)]
struct JsonOut<'a> {
    schema: &'static str,
    /// For a GPU name given as the capacity: the CUDA context taken off its total.
    #[serde(skip_serializing_if = "Option::is_none")]
    capacity_note: Option<&'a str>,
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

/// The document (`fragscope.replay.verify/1` with `verify`, else
/// `fragscope.replay.whatif/2`) of `(file name, device results)` per file.
/// `capacity_note`: [`Checked::capacity_note`], said once at the top (absent for bytes).
pub fn json(out: &[(String, Vec<DeviceResult>)], verify: bool, capacity_note: Option<&str>) -> Result<String, Error> {
    let j = JsonOut {
        schema: if verify { "fragscope.replay.verify/1" } else { "fragscope.replay.whatif/2" },
        capacity_note,
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
    crate::document::to_json(&j)
}

/// The allocator lab as a front end asks for it: policies by name (`pytorch`,
/// `expandable`, `pytorch:CONF`, `best-fit`, `page-remap`, `lifetime`, `planned`, `all`).
#[derive(Debug, Default, Clone)]
pub struct LabRequest {
    pub allocators: Vec<String>,
    pub capacity: Option<String>,
    pub device: Option<i64>,
    /// Also find each policy's smallest device without an OOM (bisection; slow).
    pub min_capacity: bool,
}

impl LabRequest {
    /// The policies named, each once: a bad name is an argument error.
    pub fn specs(&self) -> Result<Vec<PolicySpec>, Error> {
        let mut specs: Vec<PolicySpec> = Vec::new();
        for n in &self.allocators {
            for s in parse_policy(n).map_err(|e| Error::argument(msg![e.to_string()]))? {
                if !specs.contains(&s) {
                    specs.push(s);
                }
            }
        }
        Ok(specs)
    }
}

/// One snapshot through the lab: every replayable device (or the one asked, which must be
/// replayable) served by `specs`.
pub fn lab_snapshot(
    req: &LabRequest,
    capacity: Option<u64>,
    snap: &Snapshot,
    specs: &[PolicySpec],
) -> Result<Vec<LabReport>, Error> {
    device_replayable(snap, req.device)?;
    let mut devs = replayable_devices(snap);
    if let Some(d) = req.device {
        devs.retain(|&x| x == d);
    }
    Ok(devs.into_iter().map(|d| lab_with(snap, d, specs, capacity, req.min_capacity)).collect())
}

#[derive(Serialize)]
struct LabOut<'a> {
    schema: &'static str,
    files: Vec<LabFile<'a>>,
}

#[derive(Serialize)]
struct LabFile<'a> {
    file: &'a str,
    devices: &'a [LabReport],
}

/// The lab's document (`fragscope.replay.lab/2`) of `(file name, device reports)` per file.
pub fn lab_json(out: &[(String, Vec<LabReport>)]) -> Result<String, Error> {
    let j = LabOut {
        schema: "fragscope.replay.lab/2",
        files: out.iter().map(|(f, r)| LabFile { file: f, devices: r }).collect(),
    };
    crate::document::to_json(&j)
}
