//! Allocator lab: a device's recorded workload served by each allocation policy of
//! [`fragscope_alloc::policy`], against the bounds no allocator beats.
//!
//! [`workload_of`] reduces a trace to requests and frees: each `alloc` is a request, its
//! `free_completed` (its `free_requested` in traces without completions) the moment its
//! memory may be reused, each recorded `oom` a request the recording could not serve
//! (a probe: served and freed at once by a policy that can). Blocks alive before the
//! trace (freed in it without being allocated in it, or live in the final `segments`
//! without an `alloc`) are requested first, in address order. Private pools (CUDA graphs,
//! `MemPool`s): every policy keeps its free memory per stream and never lends it to
//! another stream, so each (stream, private pool) pair is given to the policies as a
//! stream of its own ([`PoolLanes`]): no memory moves between a private pool and the
//! default pools, as in PyTorch. What that leaves out is said in the report's notes.
//!
//! [`lab`] runs every asked policy twice: on an unlimited device (peak reserved, the
//! ratio to peak live bytes, driver calls, speed) and on the recorded capacity (does the
//! recorded OOM, or none, happen?). The recorded capacity of a trace with an OOM is what
//! the process could have had: PyTorch's reserved bytes just before the OOM (recorded
//! settings, after its release of free cached segments) plus the free memory the OOM
//! recorded; otherwise the device size ([`super::driver::capacity_for`]).

use std::collections::HashMap;

use fragscope_alloc::policy::{
    drive, BestFitArenas, Bounds, DriveError, DriverCalls, Hybrid, LifetimeSegregated, Op, PageRemap, PagedBestFit,
    Planned, Policy, PyTorchCaching, Reclaim, Workload,
};
use fragscope_alloc::{AllocatorConfig, ConfigError, DeviceMemory, SimulatedDevice};
use fragscope_snapshot::{Action, BlockState, Snapshot};
use serde::Serialize;

use super::{recorded_config, AddrBuild};

/// A policy to run, as `--allocator` names it.
#[derive(Clone, Debug, PartialEq)]
pub enum PolicySpec {
    /// PyTorch's caching allocator: the recorded settings with this string on top.
    PyTorch(String),
    BestFit,
    /// Paged best fit, freed pages moved after a synchronisation as the [`Reclaim`] says.
    PagedBestFit(Reclaim),
    /// Page remapping for requests of at least this many bytes.
    PageRemap(u64, Reclaim),
    Lifetime,
    Planned,
    Hybrid,
}

/// Names `--allocator` takes (besides `pytorch:CONF`).
pub(crate) const POLICY_NAMES: &[&str] = &[
    "pytorch",
    "expandable",
    "best-fit",
    "page-remap",
    "page-remap:lazy",
    "paged-best-fit",
    "paged-best-fit:lazy",
    "lifetime",
    "planned",
    "hybrid",
    "all",
];

/// `NAME` → policies (`all` is every one; `pytorch:CONF` PyTorch with CONF on top of the
/// recorded settings; `expandable` = `pytorch:expandable_segments:True`; a `:lazy`
/// suffix on the paged policies: [`Reclaim::Lazy`]).
pub fn parse_policy(name: &str) -> Result<Vec<PolicySpec>, PolicyError> {
    Ok(match name {
        "all" => vec![
            PolicySpec::PyTorch(String::new()),
            PolicySpec::PyTorch("expandable_segments:True".into()),
            PolicySpec::BestFit,
            PolicySpec::PageRemap(2 << 20, Reclaim::Synchronize),
            PolicySpec::PageRemap(2 << 20, Reclaim::Lazy),
            PolicySpec::PagedBestFit(Reclaim::Synchronize),
            PolicySpec::PagedBestFit(Reclaim::Lazy),
            PolicySpec::Lifetime,
            PolicySpec::Planned,
            PolicySpec::Hybrid,
        ],
        "pytorch" => vec![PolicySpec::PyTorch(String::new())],
        "expandable" => vec![PolicySpec::PyTorch("expandable_segments:True".into())],
        "best-fit" => vec![PolicySpec::BestFit],
        "paged-best-fit" => vec![PolicySpec::PagedBestFit(Reclaim::Synchronize)],
        "paged-best-fit:lazy" => vec![PolicySpec::PagedBestFit(Reclaim::Lazy)],
        "page-remap" => vec![PolicySpec::PageRemap(2 << 20, Reclaim::Synchronize)],
        "page-remap:lazy" => vec![PolicySpec::PageRemap(2 << 20, Reclaim::Lazy)],
        "lifetime" => vec![PolicySpec::Lifetime],
        "planned" => vec![PolicySpec::Planned],
        "hybrid" => vec![PolicySpec::Hybrid],
        _ if name.starts_with("page-remap:") => {
            let rest = &name["page-remap:".len()..];
            let (rest, reclaim) = match rest.strip_suffix(":lazy") {
                Some(r) => (r, Reclaim::Lazy),
                None => (rest, Reclaim::Synchronize),
            };
            let mib = rest
                .parse::<u64>()
                .ok()
                .filter(|&m| (2..=1 << 20).contains(&m))
                .ok_or_else(|| PolicyError::PageSize(name.to_string()))?;
            vec![PolicySpec::PageRemap(mib << 20, reclaim)]
        }
        _ => match name.strip_prefix("pytorch:") {
            Some(conf) => {
                fragscope_alloc::parse_config(conf).map_err(PolicyError::Config)?;
                vec![PolicySpec::PyTorch(conf.to_string())]
            }
            None => return Err(PolicyError::Unknown(name.to_string())),
        },
    })
}

/// An allocator name [`parse_policy`] does not take.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PolicyError {
    /// Not one of [`POLICY_NAMES`], `pytorch:CONF` or `page-remap:MIB[:lazy]` (the name as given).
    Unknown(String),
    /// `page-remap:MIB` with a page size outside 2..=1048576 MiB (the name as given).
    PageSize(String),
    /// `pytorch:CONF` with a `CONF` PyTorch would refuse.
    Config(ConfigError),
}

impl std::fmt::Display for PolicyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PolicyError::Unknown(name) => write!(
                f,
                "unknown allocator '{name}'; one of: {}, pytorch:CONF or page-remap:MIB[:lazy]",
                POLICY_NAMES.join(", ")
            ),
            PolicyError::PageSize(name) => {
                write!(f, "page-remap:MIB takes a size in MiB from 2 to 1048576, not '{name}'")
            }
            PolicyError::Config(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for PolicyError {}

/// A policy's run that failed: the lab notes it in place of the policy's row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LabRunError {
    /// The policy's name ([`Policy::name`]).
    pub policy: String,
    /// The run on the recorded capacity (else the one on an unlimited device).
    pub on_recorded_capacity: bool,
    pub error: DriveError,
}

impl std::fmt::Display for LabRunError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let on = if self.on_recorded_capacity { " on the recorded capacity" } else { "" };
        write!(f, "{}{on}: {}", self.policy, self.error)
    }
}

impl std::error::Error for LabRunError {}

/// The workload of one device's trace, with where each op came from.
pub struct LabWorkload {
    pub workload: Workload,
    /// Trace index of each op (0 for the blocks alive before the trace).
    pub trace_index: Vec<usize>,
    /// Blocks alive before the trace.
    pub pre_existing: u64,
    /// Recorded OOMs: (trace index, `device_free` it recorded).
    pub recorded_ooms: Vec<(usize, u64)>,
    pub notes: Vec<String>,
}

/// The stream each request is served on by the lab's policies: its own stream in the
/// default pools, and a stream of its own for each (stream, private pool) pair, numbered
/// down from `u64::MAX` past every stream the trace or the segments use.
struct PoolLanes {
    used: std::collections::HashSet<u64>,
    lanes: HashMap<(u64, (u64, u64)), u64>,
    next: u64,
}

impl PoolLanes {
    fn new(snap: &Snapshot, device: i64) -> PoolLanes {
        let mut used: std::collections::HashSet<u64> = snap.trace(device).iter().map(|e| snap.stream(e)).collect();
        used.extend(snap.segments.iter().filter(|s| s.device == device).map(|s| s.stream));
        PoolLanes { used, lanes: HashMap::new(), next: u64::MAX }
    }

    fn lane(&mut self, stream: u64, pool: Option<(u64, u64)>) -> u64 {
        let Some(pool) = pool.filter(|&p| p != fragscope_alloc::DEFAULT_POOL) else { return stream };
        if let Some(&l) = self.lanes.get(&(stream, pool)) {
            return l;
        }
        while self.used.contains(&self.next) {
            self.next -= 1;
        }
        let l = self.next;
        self.used.insert(l);
        self.lanes.insert((stream, pool), l);
        l
    }

    /// The private pools met.
    fn pools(&self) -> usize {
        self.lanes.keys().map(|(_, p)| p).collect::<std::collections::HashSet<_>>().len()
    }
}

/// Reduce `device`'s trace to a [`Workload`] (see the module doc).
pub fn workload_of(snap: &Snapshot, device: i64) -> LabWorkload {
    let trace = snap.trace(device);
    let mut lanes = PoolLanes::new(snap, device);
    let release = if trace.iter().any(|e| e.action == Action::FreeCompleted) {
        Action::FreeCompleted
    } else {
        Action::FreeRequested
    };
    let site = |e: &fragscope_snapshot::TraceEvent| e.stack.map_or(0, |s| s.index() as u64 + 1);
    // Blocks alive before the trace: freed before any alloc of their address.
    let mut seen: HashMap<u64, bool, AddrBuild> = HashMap::default(); // addr -> currently live in trace
    let mut pre: Vec<(u64, u64, u64)> = Vec::new(); // (addr, size, stream)
    for e in trace {
        match e.action {
            Action::Alloc => {
                seen.insert(e.addr, true);
            }
            a if a == release => {
                if !seen.contains_key(&e.addr) {
                    pre.push((e.addr, e.size, lanes.lane(snap.stream(e), snap.pool_id(e))));
                }
                seen.insert(e.addr, false);
            }
            _ => {}
        }
    }
    let n_freed_pre = pre.len();
    for seg in snap.segments.iter().filter(|s| s.device == device) {
        for b in &seg.blocks {
            if b.state != BlockState::Inactive && !seen.contains_key(&b.address) {
                let lane = lanes.lane(seg.stream, seg.segment_pool_id);
                pre.push((b.address, b.requested_size.filter(|&r| r > 0).unwrap_or(b.size), lane));
            }
        }
    }
    pre.sort_unstable();
    let mut w = Workload::new();
    let mut trace_index = Vec::with_capacity(trace.len() + pre.len());
    let mut live: HashMap<u64, u32, AddrBuild> = HashMap::default();
    for &(addr, size, stream) in &pre {
        live.insert(addr, w.malloc(size, stream, 0));
        trace_index.push(0);
    }
    let mut notes = Vec::new();
    if !pre.is_empty() {
        notes.push(format!(
            "{} block(s) alive before the trace ({} freed in it), requested first",
            pre.len(),
            n_freed_pre
        ));
    }
    // Where the recording gave its cache back (`segment_free` / `segment_unmap`
    // bursts): explicit empty_cache() calls and PyTorch's release after a failed
    // cudaMalloc, as the verify replay infers them. Every policy is asked to give
    // back its free memory there (issue 21: the pytorch row ignored them).
    let (_, inferred) = super::driver::verify_inner(snap, device, &super::ReplayOptions::default());
    let mut releases: Vec<usize> = inferred.empty_cache_before.clone();
    releases.extend(&inferred.released_before);
    releases.sort_unstable();
    releases.dedup();
    if !releases.is_empty() {
        notes.push(format!(
            "the recording gave its cache back {} time(s) ({} empty_cache() call(s), {} release(s) after a failed \
             cudaMalloc): each policy is asked to give back its free memory there (pytorch rows release free \
             segments, paged policies their idle pages, the arena policies the free pages at their tops; \
             planned keeps its arenas)",
            releases.len(),
            inferred.empty_cache_before.len(),
            inferred.released_before.len()
        ));
    }
    let mut releases = releases.into_iter().peekable();
    let mut recorded_ooms = Vec::new();
    let mut realloc = 0u64;
    for (i, e) in trace.iter().enumerate() {
        while releases.next_if(|&k| k <= i).is_some() {
            w.empty_cache();
        }
        match e.action {
            Action::Alloc => {
                // An address allocated again while live (not allocator-consistent): the
                // older block stays live, as in the recording.
                let lane = lanes.lane(snap.stream(e), snap.pool_id(e));
                if live.insert(e.addr, w.malloc(e.size, lane, site(e))).is_some() {
                    realloc += 1;
                }
                trace_index.push(i);
            }
            Action::Oom => {
                w.probe(e.size, lanes.lane(snap.stream(e), snap.pool_id(e)), site(e));
                recorded_ooms.push((i, e.addr));
                trace_index.push(i);
            }
            a if a == release => {
                if let Some(id) = live.remove(&e.addr) {
                    if w.free(id) {
                        trace_index.push(i);
                    }
                }
            }
            _ => {}
        }
    }
    if realloc > 0 {
        notes.push(format!("{realloc} alloc(s) at an address still live: the older block was kept live"));
    }
    if release == Action::FreeRequested && trace.iter().any(|e| e.action == Action::FreeRequested) {
        notes.push("no free_completed in the trace: memory taken as reusable at free_requested".into());
    }
    if !lanes.lanes.is_empty() {
        notes.push(format!(
            "{} private pool(s) (CUDA graphs, MemPools): each (stream, pool) pair served apart, as a stream of its \
             own ({} in all), so no policy moves memory between a private pool and the default pools; not modelled: \
             a private pool's free memory is given back with the rest at empty_cache() and before an OOM, where \
             PyTorch gives it back only once the pool is freeable",
            lanes.pools(),
            lanes.lanes.len()
        ));
    }
    LabWorkload { workload: w, trace_index, pre_existing: pre.len() as u64, recorded_ooms, notes }
}

/// Driver calls, for reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Calls {
    pub cuda_malloc: u64,
    pub cuda_free: u64,
    pub map: u64,
    pub unmap: u64,
    /// Synchronisations made so that freed memory could be unmapped
    /// ([`DriverCalls::synchronize`]; a `cudaFree` synchronises by itself and is not
    /// counted here).
    pub synchronize: u64,
}

impl From<DriverCalls> for Calls {
    fn from(c: DriverCalls) -> Self {
        Calls {
            cuda_malloc: c.cuda_malloc,
            cuda_free: c.cuda_free,
            map: c.map,
            unmap: c.unmap,
            synchronize: c.synchronize,
        }
    }
}

/// The bounds, for reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct LabBounds {
    /// Peak live bytes (what was live; a recorded OOM's refused request is not).
    pub live: u64,
    pub live_512: u64,
    pub per_stream: u64,
    pub pages: u64,
    /// Peak of live bytes plus a refused request at its own step: what the program asked to
    /// hold at once. Above `live` only when a recorded OOM asked for more than was ever live.
    pub live_with_failed: u64,
}

impl From<Bounds> for LabBounds {
    fn from(b: Bounds) -> Self {
        LabBounds {
            live: b.live,
            live_512: b.live_512,
            per_stream: b.per_stream,
            pages: b.pages,
            live_with_failed: b.live_with_failed,
        }
    }
}

/// A policy's first refused request on the recorded capacity.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LabOom {
    /// Index of the trace entry (0 for a block alive before the trace).
    pub index: usize,
    pub requested: u64,
    pub reserved: u64,
}

/// One policy on one device.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LabRow {
    pub policy: String,
    /// On an unlimited device.
    pub peak_reserved: u64,
    /// `peak_reserved / bounds.live`.
    pub ratio: f64,
    pub final_reserved: u64,
    pub calls: Calls,
    /// Seconds of the unlimited run, construction included (the plan for `planned`):
    /// wall time of one thread, so at least its CPU time.
    pub seconds: f64,
    /// Workload ops per second of [`LabRow::seconds`].
    pub ops_per_second: f64,
    /// CPU seconds of the same run (10 ms resolution; null where unknown).
    pub cpu_seconds: Option<f64>,
    /// Trace events per CPU second (null when the run took under 0.1 CPU-s or CPU time
    /// is unknown).
    pub events_per_cpu_second: Option<f64>,
    /// Requests refused on the recorded capacity (recorded OOMs aside).
    pub ooms_at_capacity: u64,
    pub first_oom_at_capacity: Option<LabOom>,
    /// Recorded OOM requests served on the recorded capacity.
    pub recorded_ooms_served: u64,
    /// In words: does the recorded OOM (or none) happen on the recorded capacity?
    pub verdict: String,
    /// The smallest device (2 MiB steps) on which the policy serves every request the
    /// recording served, found by bisection between the peak live bytes and the peak
    /// reserved on an unlimited device ([`smallest_capacity`]); null unless asked
    /// ([`lab_with`]).
    pub min_capacity: Option<u64>,
}

/// [`lab`] for one device.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LabReport {
    pub device: i64,
    pub trace_events: usize,
    pub ops: usize,
    pub requests: u64,
    pub streams: usize,
    pub pre_existing_blocks: u64,
    pub recorded_ooms: usize,
    pub capacity: u64,
    /// How `capacity` was found.
    pub capacity_source: String,
    pub bounds: LabBounds,
    pub rows: Vec<LabRow>,
    pub notes: Vec<String>,
}

/// A fresh policy for `spec` (PyTorch's on top of `base`, the recorded settings) on a
/// simulated device of `cap` bytes; `w` is what the plan-based policies plan.
pub fn make_policy(spec: &PolicySpec, base: &AllocatorConfig, w: &Workload, cap: u64) -> Box<dyn Policy> {
    make_policy_on(spec, base, w, SimulatedDevice::synthetic(cap))
}

/// [`make_policy`] over any device (a test drives a strict one, `fragscope_alloc::StrictVmm`).
pub fn make_policy_on<D: DeviceMemory + 'static>(
    spec: &PolicySpec,
    base: &AllocatorConfig,
    w: &Workload,
    dev: D,
) -> Box<dyn Policy> {
    match spec {
        PolicySpec::PyTorch(extra) => Box::new(PyTorchCaching::new(config_on_top(base, extra), dev)),
        PolicySpec::BestFit => Box::new(BestFitArenas::new(dev)),
        PolicySpec::PagedBestFit(r) => Box::new(PagedBestFit::with_reclaim(dev, *r)),
        PolicySpec::PageRemap(min, r) => Box::new(PageRemap::with_options(dev, *min, *r)),
        PolicySpec::Lifetime => Box::new(LifetimeSegregated::new(dev)),
        PolicySpec::Planned => Box::new(Planned::new(w, dev)),
        PolicySpec::Hybrid => Box::new(Hybrid::new(w, dev)),
    }
}

/// `extra` on top of `base` (both valid: `extra` was checked by [`parse_policy`]).
fn config_on_top(base: &AllocatorConfig, extra: &str) -> AllocatorConfig {
    crate::settings::config_on_top(base, extra).unwrap_or_else(|_| base.clone())
}

/// CPU seconds (user + system) of the calling thread from `/proc/thread-self/stat`, in
/// clock ticks of 10 ms; `None` where that file does not exist (not Linux).
pub fn thread_cpu_seconds() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/thread-self/stat").ok()?;
    // Fields after the command name (which may hold spaces) start at its closing ')'.
    let rest = &s[s.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    Some((utime + stime) as f64 / 100.0)
}

/// Seconds since the first call (wall time of this thread's work; on an idle machine the
/// same as its CPU time, on a busy one more, so rates from it are conservative).
pub(crate) fn seconds() -> f64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START.get_or_init(std::time::Instant::now).elapsed().as_secs_f64()
}

/// The capacity the process could have had (see the module doc) and how it was found.
fn recorded_capacity(snap: &Snapshot, device: i64, lw: &LabWorkload, cfg: &AllocatorConfig) -> (u64, String) {
    if let Some(&(index, device_free)) = lw.recorded_ooms.first() {
        let k = lw.trace_index.iter().position(|&t| t == index).unwrap_or(lw.trace_index.len());
        let mut before = Workload::new();
        let mut ids: Vec<u32> = Vec::new();
        for op in &lw.workload.ops[..k] {
            match *op {
                Op::Malloc { size, stream, site, .. } => ids.push(before.malloc(size, stream, site)),
                Op::Probe { size, stream, site, .. } => ids.push(before.probe(size, stream, site)),
                Op::Free { id } => {
                    before.free(ids[id as usize]);
                }
            }
        }
        before.empty_cache_at = lw.workload.empty_cache_at.iter().copied().filter(|&j| j < k).collect();
        let mut p = PyTorchCaching::new(cfg.clone(), SimulatedDevice::synthetic(super::whatif::UNLIMITED));
        if drive(&mut p, &before, false, 0).is_ok() {
            p.empty_cache();
            let held = p.reserved();
            return (
                held + device_free,
                format!(
                    "PyTorch's reserved bytes before the recorded OOM at event {index} ({held}, recorded settings, \
                     free cached segments released) + the free memory it recorded ({device_free})"
                ),
            );
        }
    }
    let c = super::driver::capacity_for(snap, device, None, cfg);
    let how = if snap.device_capacity.contains_key(&device) {
        "the device size the file records"
    } else {
        "the device size (inferred or the 80 GiB default)"
    };
    (c, how.to_string())
}

/// The smallest device (a multiple of 2 MiB) on which `spec` serves every request of
/// `w` the recording served (recorded OOMs aside), by bisection between `lo` (a size
/// known to fail or the floor, such as the peak live bytes) and `hi` (a size known to
/// succeed: the policy's peak reserved on an unlimited device, which it never passes).
/// An allocator need not be monotone in the device size (a smaller device makes PyTorch
/// release its cache earlier), so this is the boundary bisection finds, checked to
/// succeed, not a proof that no smaller size works.
pub fn smallest_capacity(spec: &PolicySpec, base: &AllocatorConfig, w: &Workload, lo: u64, hi: u64) -> u64 {
    const STEP: u64 = 2 << 20;
    let ok = |cap: u64| {
        let mut p = make_policy(spec, base, w, cap);
        drive(p.as_mut(), w, false, 0).is_ok_and(|r| r.ooms == 0)
    };
    let (mut lo, mut hi) = (lo / STEP, hi.div_ceil(STEP));
    if ok(lo * STEP) {
        return lo * STEP;
    }
    if lo >= hi {
        return hi * STEP;
    }
    // Invariant: lo fails, hi succeeds.
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if ok(mid * STEP) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    hi * STEP
}

/// Run `specs` on `device`'s workload. `capacity` replaces the recorded capacity.
pub fn lab(snap: &Snapshot, device: i64, specs: &[PolicySpec], capacity: Option<u64>) -> LabReport {
    lab_with(snap, device, specs, capacity, false)
}

/// [`lab`]; with `min_capacity`, each row also gets the smallest device on which the
/// policy runs without an OOM ([`smallest_capacity`], a dozen or more runs per policy).
pub fn lab_with(
    snap: &Snapshot,
    device: i64,
    specs: &[PolicySpec],
    capacity: Option<u64>,
    min_capacity: bool,
) -> LabReport {
    let lw = workload_of(snap, device);
    let cfg = recorded_config(snap);
    let w = &lw.workload;
    // The unlimited run (peak reserved, the ratio's numerator) and the smallest device
    // serve what was live: a request the recording refused is left out, as from the
    // denominator (issue 21). The run on the recorded capacity keeps it, to say whether
    // the recorded OOM happens.
    let live_only = w.without_probes();
    let (cap, capacity_source) = match capacity {
        Some(c) => (c, "given".to_string()),
        None => recorded_capacity(snap, device, &lw, &cfg),
    };
    let mut notes = lw.notes.clone();
    if live_only.ops.len() < w.ops.len() {
        notes.push(format!(
            "the {} request(s) the recording refused (recorded OOMs) are left out of peak reserved and the \
             smallest device: those count what was live; the run on the recorded capacity tries them",
            w.ops.len() - live_only.ops.len()
        ));
    }
    let run = LabRun { snap, device, lw: &lw, cfg: &cfg, live_only: &live_only, cap, bounds: w.bounds(), min_capacity };
    let mut rows = Vec::new();
    let mut confs_run: Vec<String> = Vec::new();
    for spec in specs {
        if let PolicySpec::PyTorch(extra) = spec {
            // `all` asks for expandable segments beside the recorded settings: once is
            // enough when the recording already had them.
            let conf = config_on_top(&cfg, extra).to_conf_string();
            if confs_run.contains(&conf) {
                continue;
            }
            confs_run.push(conf);
        }
        match run.row(spec) {
            Ok(row) => rows.push(row),
            Err(e) => notes.push(e.to_string()),
        }
    }
    LabReport {
        device,
        trace_events: snap.trace(device).len(),
        ops: w.ops.len(),
        requests: w.requests as u64,
        streams: w.streams().len(),
        pre_existing_blocks: lw.pre_existing,
        recorded_ooms: lw.recorded_ooms.len(),
        capacity: cap,
        capacity_source,
        bounds: run.bounds.into(),
        rows,
        notes,
    }
}

/// What every row of one [`lab_with`] shares: the device's workload (whole, and without
/// the recorded OOMs' requests), the recorded settings and the recorded capacity.
struct LabRun<'a> {
    snap: &'a Snapshot,
    device: i64,
    lw: &'a LabWorkload,
    cfg: &'a AllocatorConfig,
    live_only: &'a Workload,
    cap: u64,
    bounds: Bounds,
    min_capacity: bool,
}

impl LabRun<'_> {
    /// One policy's row: a timed run of what was live on an unlimited device (peak
    /// reserved, speed), a run of the whole workload on the recorded capacity (does the
    /// recorded OOM happen?), and the smallest device when asked. A run that fails gives
    /// the note that replaces the row.
    #[inline(always)]
    fn row(&self, spec: &PolicySpec) -> Result<LabRow, LabRunError> {
        let (lw, live_only, bounds) = (self.lw, self.live_only, self.bounds);
        let (t0, c0) = (seconds(), thread_cpu_seconds());
        let mut p = make_policy(spec, self.cfg, live_only, super::whatif::UNLIMITED);
        let run = drive(p.as_mut(), live_only, false, 0);
        let secs = seconds() - t0;
        let cpu = c0.zip(thread_cpu_seconds()).map(|(a, b)| b - a);
        let name = p.name();
        let run = run.map_err(|error| LabRunError { policy: name.clone(), on_recorded_capacity: false, error })?;
        let mut pc = make_policy(spec, self.cfg, &lw.workload, self.cap);
        let at = drive(pc.as_mut(), &lw.workload, false, 0).map_err(|error| LabRunError {
            policy: name.clone(),
            on_recorded_capacity: true,
            error,
        })?;
        let first = at.first_oom.map(|(i, o)| LabOom {
            index: lw.trace_index.get(i).copied().unwrap_or(0),
            requested: o.requested,
            reserved: o.reserved,
        });
        let verdict = verdict(lw, at.probes_served, first.as_ref());
        let min_capacity = self
            .min_capacity
            .then(|| smallest_capacity(spec, self.cfg, live_only, bounds.live, run.peak_reserved.max(bounds.live)));
        let events = self.snap.trace(self.device).len();
        Ok(LabRow {
            policy: name,
            peak_reserved: run.peak_reserved,
            ratio: if bounds.live == 0 { 0.0 } else { run.peak_reserved as f64 / bounds.live as f64 },
            final_reserved: run.final_reserved,
            calls: run.calls.into(),
            seconds: secs,
            ops_per_second: if secs > 0.0 { live_only.ops.len() as f64 / secs } else { 0.0 },
            cpu_seconds: cpu,
            events_per_cpu_second: cpu.filter(|&c| c >= 0.1).map(|c| events as f64 / c),
            ooms_at_capacity: at.ooms,
            first_oom_at_capacity: first,
            recorded_ooms_served: at.probes_served,
            verdict,
            min_capacity,
        })
    }
}

fn verdict(lw: &LabWorkload, probes_served: u64, first: Option<&LabOom>) -> String {
    let recorded = lw.recorded_ooms.len() as u64;
    match (recorded, first) {
        (0, None) => "no OOM, as recorded".into(),
        (0, Some(o)) => format!("OOM at event {} (none recorded)", o.index),
        (r, None) if probes_served == r => "recorded OOM avoided".into(),
        (_, None) => "OOM as recorded".into(),
        (r, Some(o)) if probes_served == r => format!("recorded OOM avoided, but OOM at event {}", o.index),
        (_, Some(o)) => format!("OOM as recorded, and at event {}", o.index),
    }
}
