//! The OOM finding: what the allocator held when a recorded `oom` entry was written,
//! why the request could not be served, and which settings would have avoided it.
//!
//! # Where the facts come from
//!
//! * **The request.** An `oom` trace entry records `size` = the rounded request `s`
//!   (§10.5) and, in place of `addr`, `device_free` (what `cudaMemGetInfo` said was free).
//!   `request_bytes` is `size` exactly as recorded; `alloc_size_bytes` is what PyTorch
//!   asked of CUDA for it and printed as "Tried to allocate" (§1.5 `get_allocation_size`).
//!   The stream, the private pool (`pool_id`, when recorded) and the stack come from the
//!   same entry.
//! * **The allocator state at the OOM.** The entry is written after every fallback ran
//!   (§3.7: `release_cached_blocks` already returned whole free segments, and those
//!   `segment_free` / `segment_unmap` entries precede the `oom` one), so the state *after*
//!   the entry is the state the failure saw. It is rebuilt by the backward walk of §10.12
//!   ([`fragscope_replay::state_before_entry`]): the final `segments`, with every later trace entry
//!   undone. That gives reserved bytes (segments), allocated bytes (blocks in use), and
//!   the free blocks per `(stream, pool)`. When the walk finds the trace inconsistent
//!   with the final state, the totals come from [`fragscope_trace::levels_at`] instead
//!   and the free-block detail is absent (`state_source: "timeline"`).
//! * **Capacity.** Stated by the file (Kineto `deviceProperties`), else estimated as
//!   `reserved + device_free` at the OOM: what this process held plus what CUDA still had.
//!   The estimate is a lower bound (other processes and the CUDA context are not in it)
//!   and is labelled as such (`capacity_source`).
//!
//! # Verdict
//!
//! With `s` the rounded request, `active` the bytes of blocks in use (allocated or
//! waiting for a cross-stream free), `C` the capacity, and free bytes counted in free
//! cached blocks:
//!
//! 1. `exhaustion`: `active + s > C`: the live tensors plus the request need more than
//!    the GPU has, whatever the allocator does with its cache.
//! 2. `fragmentation`: free cached bytes on the request's stream and pool (some), plus
//!    `device_free`, cover `s`, yet the request failed: the free bytes were there but no
//!    single free block (or growable run) was large enough.
//! 3. `stranded`: only counting free cached bytes of other streams or pools (some) is
//!    there enough in total; a block never crosses streams or pools (§2.2, §7).
//! 4. Otherwise `exhaustion` as well: the rest of the GPU was held outside this
//!    allocator (other processes, the CUDA context), which `bytes_outside_allocator`
//!    quantifies when the capacity is known.
//!
//! **A cap on the process.** When `device_free` at the OOM covers the `cudaMalloc` the
//! request needed (with a margin), the device did not refuse it: PyTorch did, because
//! `reserved + alloc_size` would pass a cap on this process
//! (`torch.cuda.set_per_process_memory_fraction()`, `per_process_memory_fraction` in
//! `PYTORCH_CUDA_ALLOC_CONF`), which snapshots do not record. The device's free memory then
//! counts for nothing: the capacity is the cap, known only to lie between `reserved` and
//! `reserved + alloc_size` (`capacity_source: "estimate_memory_fraction_cap"`, the lower
//! bound). Free cached bytes of the request's stream and pool ≥ `s` is still
//! `fragmentation`, of other streams or pools `stranded`; otherwise the verdict is
//! `memory_fraction_cap`: the process needs more than its cap (how much more cannot be
//! told, the cap being unknown) — raise the cap or shrink the live set. Seen on an H200
//! with PyTorch 2.11 (tests/gpu): before this rule such an OOM was called fragmentation
//! with "0 bytes free in the cache".
//!
//! # Fixes
//!
//! Each candidate setting of [`crate::recommend::candidates`] is replayed through the
//! allocator model ([`fragscope_replay::simulate`]) on a device of the capacity above. A
//! setting counts as a fix only if the replay of the *recorded* settings reproduces an
//! OOM at or before the recorded one (otherwise the model cannot tell), and the replay
//! with the setting serves the recorded OOM's request and does not run out of memory
//! before or at that entry.

use fragscope_alloc::rounding::{allocation_size, is_small};
use fragscope_alloc::DEFAULT_POOL;
use fragscope_snapshot::{Action, FrameTable, Snapshot, StackId};
use serde::Serialize;

use crate::recommend::{self, Trial};
use fragscope_alloc::format_size;
use fragscope_replay::{recorded_config, BState, Inconsistency, RecordedState};
use fragscope_trace::{bytes_by_site, is_library_frame, levels_at, live_at, site_of, Site, SiteBytes};

/// Free device memory beyond a request's segment that still counts as "the device had
/// room" (module doc, "A cap on the process"): a cudaMalloc also needs page tables, and
/// `device_free` is read an instant after the failure.
const CAP_MARGIN: u64 = 64 << 20;

/// `oom` verdicts (module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Fragmentation,
    Exhaustion,
    Stranded,
    MemoryFractionCap,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Fragmentation => "fragmentation",
            Verdict::Exhaustion => "exhaustion",
            Verdict::Stranded => "stranded",
            Verdict::MemoryFractionCap => "memory_fraction_cap",
        }
    }
}

/// Which of PyTorch's two pools a block or segment is in (§2: blocks of at most 1 MiB are
/// served from small segments). Ordered as JSON's names sort: large first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PoolKind {
    Large,
    Small,
}

impl PoolKind {
    /// The pool of a block or segment, from whether it is small.
    pub fn of(small: bool) -> PoolKind {
        if small {
            PoolKind::Small
        } else {
            PoolKind::Large
        }
    }
    /// The name JSON gives it.
    pub fn as_str(self) -> &'static str {
        match self {
            PoolKind::Large => "large",
            PoolKind::Small => "small",
        }
    }
}

impl std::fmt::Display for PoolKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where an OOM's device capacity comes from (`capacity_source` in JSON; module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CapacitySource {
    /// Stated by the file.
    File,
    /// Reserved plus the device's free memory at the OOM.
    EstimateReservedPlusDeviceFree,
    /// The device had room: a cap on the process, at least the reserved bytes.
    EstimateMemoryFractionCap,
}

impl CapacitySource {
    /// The name JSON gives it.
    pub fn as_str(self) -> &'static str {
        match self {
            CapacitySource::File => "file",
            CapacitySource::EstimateReservedPlusDeviceFree => "estimate_reserved_plus_device_free",
            CapacitySource::EstimateMemoryFractionCap => "estimate_memory_fraction_cap",
        }
    }
}

impl std::fmt::Display for CapacitySource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How the allocator state at an OOM was obtained (`state_source` in JSON).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StateSource {
    /// Rebuilt by the backward walk: the full block state.
    BackwardWalk,
    /// The timeline's levels: totals only.
    Timeline,
}

impl StateSource {
    /// The name JSON gives it.
    pub fn as_str(self) -> &'static str {
        match self {
            StateSource::BackwardWalk => "backward_walk",
            StateSource::Timeline => "timeline",
        }
    }
}

impl std::fmt::Display for StateSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Free cached memory of one `(stream, pool)` at the OOM.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FreeSpace {
    pub stream: u64,
    /// `segment_pool_id`; `[0, 0]` = the default pools.
    pub pool_id: (u64, u64),
    pub pool: PoolKind,
    pub segments: u64,
    pub reserved_bytes: u64,
    pub free_bytes: u64,
    pub free_blocks: u64,
    pub largest_free_block_bytes: u64,
    /// This is the stream and pool the failed request was for.
    pub is_request_pool: bool,
}

/// Free space of a rebuilt allocator state.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct StateFigures {
    pub reserved_bytes: u64,
    pub allocated_bytes: u64,
    /// Allocated + pending-free (blocks a request cannot use).
    pub active_bytes: u64,
    /// Bytes of free (inactive) cached blocks, all streams and pools.
    pub cached_free_bytes: u64,
    pub largest_free_block_bytes: u64,
    /// `1 − largest free block / cached free`; `null` when nothing is free.
    pub free_space_fragmentation: Option<f64>,
    /// Per `(stream, pool)`, most free bytes first.
    pub free_by_stream_pool: Vec<FreeSpace>,
}

/// The allocator state after trace entry `after_event` (`None` = before the first), by
/// the backward walk from the final `segments` (§10.12). `Err` names the entry that could
/// not be undone.
pub fn allocator_state_at(
    snap: &Snapshot,
    device: i64,
    after_event: Option<usize>,
) -> Result<RecordedState, StateAtError> {
    let from = after_event.map_or(0, |i| (i + 1).min(snap.trace(device).len()));
    fragscope_replay::state_before_entry(snap, device, from)
        .map_err(|e| StateAtError { entry: e.index + from, undo: e })
}

/// A trace entry the backward walk of [`allocator_state_at`] cannot undo from the final
/// state: the trace and the final state disagree there.
#[derive(Clone, Debug, PartialEq)]
pub struct StateAtError {
    /// The entry's index in the device's whole trace.
    pub entry: usize,
    /// What the walk found (its `index` counts from where the walk began).
    pub undo: Inconsistency,
}

impl std::fmt::Display for StateAtError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let e = &self.undo;
        write!(f, "trace entry {} ({}) cannot be undone: {}", self.entry, e.event.action.as_str(), e.reason)
    }
}

impl std::error::Error for StateAtError {}

/// Figures of a rebuilt state; `request` marks the `(stream, pool, small)` of a request.
pub fn state_figures(st: &RecordedState, request: Option<(u64, (u64, u64), bool)>) -> StateFigures {
    let mut f = StateFigures::default();
    let mut groups: Vec<FreeSpace> = Vec::new();
    for seg in st.segs.values() {
        f.reserved_bytes += seg.size;
        let pool = PoolKind::of(seg.small);
        let gi = match groups.iter().position(|g| g.stream == seg.stream && g.pool_id == seg.pool && g.pool == pool) {
            Some(i) => i,
            None => {
                groups.push(FreeSpace {
                    stream: seg.stream,
                    pool_id: seg.pool,
                    pool,
                    segments: 0,
                    reserved_bytes: 0,
                    free_bytes: 0,
                    free_blocks: 0,
                    largest_free_block_bytes: 0,
                    is_request_pool: request == Some((seg.stream, seg.pool, seg.small)),
                });
                groups.len() - 1
            }
        };
        let g = &mut groups[gi];
        g.segments += 1;
        g.reserved_bytes += seg.size;
        for b in &seg.blocks {
            match b.state {
                BState::Free => {
                    g.free_bytes += b.size;
                    g.free_blocks += 1;
                    g.largest_free_block_bytes = g.largest_free_block_bytes.max(b.size);
                }
                BState::Allocated => {
                    f.allocated_bytes += b.size;
                    f.active_bytes += b.size;
                }
                BState::Pending => f.active_bytes += b.size,
            }
        }
    }
    f.cached_free_bytes = groups.iter().map(|g| g.free_bytes).sum();
    f.largest_free_block_bytes = groups.iter().map(|g| g.largest_free_block_bytes).max().unwrap_or(0);
    f.free_space_fragmentation =
        (f.cached_free_bytes > 0).then(|| 1.0 - f.largest_free_block_bytes as f64 / f.cached_free_bytes as f64);
    groups.sort_by(|a, b| {
        b.free_bytes.cmp(&a.free_bytes).then_with(|| (a.stream, a.pool_id, a.pool).cmp(&(b.stream, b.pool_id, b.pool)))
    });
    f.free_by_stream_pool = groups;
    f
}

/// A stack as `file:line:function` strings, innermost first, each run of library frames
/// (see [`is_library_frame`]) folded into one `… N library frames` entry.
pub(crate) fn folded_frames(frames: &FrameTable, stack: Option<StackId>) -> Vec<String> {
    let Some(id) = stack else { return Vec::new() };
    let mut out = Vec::new();
    let mut run = 0usize;
    let flush = |run: &mut usize, out: &mut Vec<String>| {
        if *run > 0 {
            out.push(format!("… {} library frame{}", *run, if *run == 1 { "" } else { "s" }));
            *run = 0;
        }
    };
    for (file, line, name) in frames.resolved(id) {
        if is_library_frame(file, line) {
            run += 1;
        } else {
            flush(&mut run, &mut out);
            let base = file.rsplit(['/', '\\']).next().unwrap_or(file);
            out.push(format!("{base}:{line}:{name}"));
        }
    }
    flush(&mut run, &mut out);
    out
}

/// A setting that replay showed would have avoided the OOM.
#[derive(Clone, Debug, Serialize)]
pub struct Fix {
    /// The option changed (`expandable_segments:True`).
    pub setting: String,
    /// The line to paste: `PYTORCH_CUDA_ALLOC_CONF=...` with the recorded options kept.
    pub paste: String,
    /// A call the setting needs besides the variable (GC needs a memory fraction).
    pub extra_call: Option<String>,
    pub peak_reserved_bytes: u64,
    pub cuda_mallocs: u64,
}

/// Where a file's OOM is, for the first line of every surface: the device and trace entry
/// of the file's first recorded `oom` entry ([`first_oom`]), its verdict in one sentence,
/// and the command to run next.
#[derive(Clone, Debug, Serialize)]
pub struct OomLead {
    pub device: i64,
    /// Index of the `oom` entry in the device's trace (what `state --at` takes).
    pub event_index: usize,
    pub time_us: Option<i64>,
    pub verdict: Verdict,
    /// The verdict in one sentence, with its figures: the first sentence of the finding's
    /// `explanation`, without its "This OOM was " (`"exhaustion: tensors in use held …"`).
    pub headline: String,
}

impl OomLead {
    /// The lead of a finding already made.
    pub fn of(f: &OomFinding) -> OomLead {
        OomLead {
            device: f.device,
            event_index: f.event_index,
            time_us: f.time_us,
            verdict: f.verdict,
            headline: {
                // "This OOM was exhaustion: …" reads "OOM on device 1 at entry 421: exhaustion: …".
                let s = first_sentence(&f.explanation);
                s.strip_prefix("This OOM was ").unwrap_or(s).to_string()
            },
        }
    }

    /// The lead of `snap`'s first OOM ([`first_oom`]), without the replays of the fixes (the
    /// verdict needs only the state at the OOM); `None` when no device recorded one.
    pub fn of_file(snap: &Snapshot) -> Option<OomLead> {
        let (device, _) = first_oom(snap)?;
        oom_finding(snap, device, &OomOptions { top: 1, replay: false, threads: 1 }).map(|f| OomLead::of(&f))
    }
}

/// Up to the first full stop followed by a space (sizes such as `4.94 GiB` have none).
fn first_sentence(s: &str) -> &str {
    s.find(". ").map_or(s, |i| &s[..=i])
}

/// The device and trace index of a file's first recorded OOM: the earliest `oom` entry by
/// `time_us` over all devices (a process usually stops at its first), the lowest device
/// when the entries have no time; `None` when no device recorded one. Every surface that
/// leads with the OOM, or defaults to it (`state`, MCP `top_holders`), asks this.
pub fn first_oom(snap: &Snapshot) -> Option<(i64, usize)> {
    snap.devices()
        .into_iter()
        .filter_map(|d| {
            let t = snap.trace(d);
            let i = t.iter().position(|e| e.action == Action::Oom)?;
            Some((t[i].time().unwrap_or(i64::MAX), d, i))
        })
        .min()
        .map(|(_, d, i)| (d, i))
}

/// The OOM of one device.
#[derive(Clone, Debug, Serialize)]
pub struct OomFinding {
    pub device: i64,
    /// `"trace_oom_entry"`.
    pub source: &'static str,
    /// Index of the (first) `oom` entry in the device's trace.
    pub event_index: usize,
    /// `oom` entries in the trace (the first is analysed).
    pub oom_entries: u64,
    pub time_us: Option<i64>,
    /// The `oom` entry's `size`, as recorded: the rounded request.
    pub request_bytes: u64,
    /// What PyTorch asked CUDA for ("Tried to allocate", §1.5).
    pub alloc_size_bytes: u64,
    pub pool: PoolKind,
    pub pool_id: (u64, u64),
    pub stream: u64,
    /// The failing allocation's call site and stack (innermost first, library runs folded).
    pub site: Site,
    pub stack: Vec<String>,
    pub capacity_bytes: u64,
    pub capacity_source: CapacitySource,
    pub device_free_bytes: u64,
    pub state_source: StateSource,
    pub state_note: Option<String>,
    /// Allocator state right at the OOM.
    #[serde(flatten)]
    pub state: StateFigures,
    /// Free cached bytes the request's stream and pool could use.
    pub usable_free_bytes: u64,
    /// Free cached bytes on other streams or pools.
    pub stranded_free_bytes: u64,
    /// `capacity − reserved − device_free` when the capacity is known (0 for an estimate).
    pub bytes_outside_allocator: u64,
    pub verdict: Verdict,
    /// Plain-words explanation.
    pub explanation: String,
    /// `active + request − capacity`: how much smaller the live set would have had to be.
    pub bytes_over_capacity: u64,
    /// Call sites holding the most live bytes at the OOM.
    pub top_sites: Vec<SiteBytes>,
    /// Whether the replay of the recorded settings reproduces an OOM at or before this one
    /// (without it, fixes cannot be measured).
    pub replay_reproduces_oom: Option<bool>,
    /// Settings the replay showed would have avoided the OOM.
    pub fixes: Vec<Fix>,
    /// Every setting replayed, with its outcome.
    pub fixes_tried: Vec<Trial>,
    /// The replay of the recorded settings on the same device size.
    pub baseline: Option<Trial>,
    /// The advice users are given (`empty_cache()`, no caching), replayed at this OOM
    /// ([`advise`]).
    pub advice: Vec<AdviceOutcome>,
    /// One plain sentence: would that advice have helped here, with the figures.
    pub advice_summary: Option<String>,
}

/// One piece of the usual advice, replayed up to this OOM on the same device size.
#[derive(Clone, Debug, Serialize)]
pub struct AdviceOutcome {
    /// `empty_cache() at every step boundary`, `PYTORCH_NO_CUDA_MEMORY_CACHING=1`, ...
    pub advice: String,
    /// The replay got past the recorded OOM, serving its request.
    pub avoids_oom: bool,
    pub first_oom_index: Option<usize>,
    /// Peak reserved (no caching: peak bytes held by tensors).
    pub peak_reserved_bytes: u64,
    pub cuda_mallocs: u64,
    pub cuda_frees: u64,
    /// `empty_cache()` calls the advice added.
    pub empty_cache_calls_added: u64,
    /// Synchronisations the driver calls imply (`replay::cost`): a count, no time.
    pub syncs: u64,
}

/// Replays the usual advice up to the OOM of `f` (same device size as the fixes):
/// `empty_cache()` right before the failing request (what PyTorch already does before
/// raising), at every step boundary when the trace has two training steps or more, and
/// `PYTORCH_NO_CUDA_MEMORY_CACHING=1`; fills `advice` and `advice_summary`. Needs the
/// baseline replay to reproduce the OOM (otherwise nothing can be measured).
pub(crate) fn advise(snap: &Snapshot, device: i64, f: &mut OomFinding) {
    use crate::advice::{simulate_empty_cache, simulate_uncached, EmptyCacheAt};
    if f.replay_reproduces_oom != Some(true) {
        return;
    }
    let idx = f.event_index;
    let cap = Some(f.capacity_bytes);
    let cfg = recorded_config(snap);
    let outcome = |w: fragscope_replay::WhatIf| AdviceOutcome {
        advice: w.advice.clone().unwrap_or_default(),
        avoids_oom: w.first_oom.as_ref().is_none_or(|o| o.index > idx) && w.recorded_ooms_that_fit > 0,
        first_oom_index: w.first_oom.as_ref().map(|o| o.index),
        peak_reserved_bytes: w.peak_reserved,
        cuda_mallocs: w.cuda_mallocs,
        cuda_frees: w.cuda_frees,
        empty_cache_calls_added: w.empty_cache_added,
        syncs: w.driver.syncs(),
    };
    let mut notes = Vec::new();
    // Replays that did not start from the rebuilt state are not compared (issue 21).
    let mut refused: Option<String> = None;
    let mut check = |w: &fragscope_replay::WhatIf| {
        if let (None, Some(why)) = (&refused, w.start_state.refusal()) {
            refused = Some(format!("{why} for {}", w.advice.as_deref().unwrap_or("a replay")));
        }
    };
    for at in [EmptyCacheAt::Entries(vec![idx]), EmptyCacheAt::Steps] {
        match simulate_empty_cache(snap, device, cfg.clone(), cap, &at) {
            Ok(mut w) => {
                if matches!(at, EmptyCacheAt::Entries(_)) {
                    w.advice = Some("empty_cache() before the request".into());
                }
                check(&w);
                f.advice.push(outcome(w))
            }
            Err(e) => notes.push(format!("{} was not replayed: {e}", at.describe())),
        }
    }
    let uncached = simulate_uncached(snap, device, cap);
    check(&uncached);
    let live_at_oom = uncached.first_oom.as_ref().filter(|o| o.index == idx).map(|o| o.reserved);
    f.advice.push(outcome(uncached));
    if let Some(why) = refused {
        f.advice_summary = Some(format!(
            "The usual advice was replayed but is not compared with the recorded run: {why}, so the \
             runs do not start from the same memory"
        ));
        return;
    }
    let part = |a: &AdviceOutcome| {
        let result = if a.avoids_oom {
            format!("avoids it (peak {})", format_size(a.peak_reserved_bytes))
        } else {
            match a.first_oom_index {
                Some(i) if i == idx => format!("still fails at entry {i}"),
                Some(i) => format!("fails earlier, at entry {i}"),
                None => "the request still fails".to_string(),
            }
        };
        format!(
            "{}: {result}, {} cudaMalloc + {} cudaFree ({} synchronisations)",
            a.advice, a.cuda_mallocs, a.cuda_frees, a.syncs
        )
    };
    let parts: Vec<String> = f.advice.iter().map(part).collect();
    let helped: Vec<&str> = f.advice.iter().filter(|a| a.avoids_oom).map(|a| a.advice.as_str()).collect();
    let mut s = if helped.is_empty() {
        format!(
            "The usual advice would not have avoided this OOM, replayed on this run: {}. PyTorch already frees every \
             cached segment that holds no tensor and retries before it raises an OOM, so calling \
             torch.cuda.empty_cache() yourself cannot make this request fit",
            parts.join("; ")
        )
    } else {
        format!(
            "Of the usual advice, {} would have avoided this OOM in the replay: {}",
            helped.join(" and "),
            parts.join("; ")
        )
    };
    if let Some(live) = live_at_oom.filter(|_| helped.is_empty()) {
        s.push_str(&format!(
            "; without caching the tensors alive at the OOM already hold {} and the request needs {} more",
            format_size(live),
            format_size(f.request_bytes)
        ));
    }
    for n in notes {
        s.push_str(&format!("; {n}"));
    }
    s.push('.');
    f.advice_summary = Some(s);
}

/// Options of [`oom_finding`].
#[derive(Clone, Copy, Debug)]
pub struct OomOptions {
    /// Call sites listed.
    pub top: usize,
    /// Replay candidate settings to find fixes.
    pub replay: bool,
    /// Threads for the replays.
    pub threads: usize,
}

impl Default for OomOptions {
    fn default() -> Self {
        OomOptions { top: 10, replay: true, threads: 2 }
    }
}

/// The OOM finding of `device`, or `None` when its trace has no `oom` entry.
///
/// A snapshot dumped from an OOM handler without a trace entry (e.g. a 2.0 file with a
/// one-entry ring buffer) carries no signal that proves it was taken at an OOM, so no
/// finding is made for it.
pub fn oom_finding(snap: &Snapshot, device: i64, opts: &OomOptions) -> Option<OomFinding> {
    let trace = snap.trace(device);
    let idx = trace.iter().position(|e| e.action == Action::Oom)?;
    let ev = &trace[idx];
    let oom_entries = trace.iter().filter(|e| e.action == Action::Oom).count() as u64;
    let cfg = recorded_config(snap);
    let s = ev.size;
    let small = is_small(s);
    let pool_id = snap.pool_id(ev).unwrap_or(DEFAULT_POOL);
    let device_free = ev.device_free().unwrap_or(0);

    let (state_source, state_note, state) = state_at_oom(snap, device, idx, (snap.stream(ev), pool_id, small));
    let alloc_size = allocation_size(s, &cfg);
    // The device had room for the segment this request needed (the margin covers the page
    // tables a cudaMalloc also needs): the refusal was PyTorch's cap on the process.
    let capped = ev.device_free().is_some_and(|f| f >= alloc_size.saturating_add(CAP_MARGIN));
    let (capacity, capacity_source) = match snap.device_capacity.get(&device) {
        _ if capped => (state.reserved_bytes, CapacitySource::EstimateMemoryFractionCap),
        Some(&c) => (c, CapacitySource::File),
        None => (state.reserved_bytes + device_free, CapacitySource::EstimateReservedPlusDeviceFree),
    };
    let detailed = state_source == StateSource::BackwardWalk;
    let usable_cached: u64 = if detailed {
        state.free_by_stream_pool.iter().filter(|g| g.is_request_pool).map(|g| g.free_bytes).sum()
    } else {
        state.cached_free_bytes
    };
    let stranded_free = state.cached_free_bytes - usable_cached.min(state.cached_free_bytes);
    let outside = if capacity_source == CapacitySource::File {
        capacity.saturating_sub(state.reserved_bytes + device_free)
    } else {
        0
    };
    let over = (state.active_bytes + s).saturating_sub(capacity);
    let fig = OomFigures {
        state: &state,
        request: s,
        alloc_size,
        device_free,
        capped,
        capacity,
        capacity_source,
        usable_cached,
        stranded_free,
        outside,
        over,
    };
    let verdict = fig.verdict();
    let explanation = fig.explanation(verdict, snap.stream(ev), small, pool_id);
    let live = live_at(snap, device, Some(idx));
    let mut top_sites = bytes_by_site(snap, &live);
    top_sites.truncate(opts.top);

    let mut finding = OomFinding {
        device,
        source: "trace_oom_entry",
        event_index: idx,
        oom_entries,
        time_us: ev.time(),
        request_bytes: s,
        alloc_size_bytes: alloc_size,
        pool: PoolKind::of(small),
        pool_id,
        stream: snap.stream(ev),
        site: site_of(&snap.frames, ev.stack),
        stack: folded_frames(&snap.frames, ev.stack),
        capacity_bytes: capacity,
        capacity_source,
        device_free_bytes: device_free,
        state_source,
        state_note,
        state,
        usable_free_bytes: usable_cached,
        stranded_free_bytes: stranded_free,
        bytes_outside_allocator: outside,
        verdict,
        explanation,
        bytes_over_capacity: over,
        top_sites,
        replay_reproduces_oom: None,
        fixes: Vec::new(),
        fixes_tried: Vec::new(),
        baseline: None,
        advice: Vec::new(),
        advice_summary: None,
    };
    if opts.replay {
        let era = recommend::infer_era(snap);
        let cands = recommend::candidates(&cfg, &era);
        let (base, trials) = recommend::run_trials(snap, device, &cfg, &cands, Some(capacity), opts.threads);
        apply_trials(&mut finding, base, trials);
    }
    Some(finding)
}

/// The allocator's state just before the `oom` entry `idx`, as (`state_source`,
/// `state_note`, figures): rebuilt by the backward walk, with the free blocks the request
/// (`request` = its stream, pool and whether it is small) could use; else, when the walk
/// cannot rebuild it, the timeline's levels alone, with why the free blocks are unknown.
fn state_at_oom(
    snap: &Snapshot,
    device: i64,
    idx: usize,
    request: (u64, (u64, u64), bool),
) -> (StateSource, Option<String>, StateFigures) {
    match allocator_state_at(snap, device, Some(idx)) {
        Ok(st) => (StateSource::BackwardWalk, None, state_figures(&st, Some(request))),
        Err(e) => {
            let l = levels_at(snap, device, Some(idx));
            let f = StateFigures {
                reserved_bytes: l.reserved,
                allocated_bytes: l.allocated,
                active_bytes: l.active,
                cached_free_bytes: l.reserved.saturating_sub(l.active),
                ..StateFigures::default()
            };
            (StateSource::Timeline, Some(format!("free blocks unknown: {e}")), f)
        }
    }
}

/// The figures of an OOM that its verdict and its explanation read (the fields of
/// [`OomFinding`] of the same names).
struct OomFigures<'a> {
    state: &'a StateFigures,
    /// The request's size, as the `oom` entry records it.
    request: u64,
    /// The segment PyTorch would have asked CUDA for.
    alloc_size: u64,
    device_free: u64,
    /// The device had room for the segment: a cap on the process refused it.
    capped: bool,
    capacity: u64,
    capacity_source: CapacitySource,
    usable_cached: u64,
    stranded_free: u64,
    outside: u64,
    over: u64,
}

impl OomFigures<'_> {
    /// What caused the OOM: under a cap, the device's free memory is out of reach; else
    /// live tensors over the capacity are exhaustion, free cached bytes of the request's
    /// stream and pool that would have held it (with the device's) fragmentation, those of
    /// other streams or pools stranded memory.
    fn verdict(&self) -> Verdict {
        let (s, state, usable_cached) = (self.request, self.state, self.usable_cached);
        if self.capped {
            // Under a cap the device's free memory is out of reach.
            if usable_cached >= s {
                Verdict::Fragmentation
            } else if state.cached_free_bytes >= s {
                Verdict::Stranded
            } else {
                Verdict::MemoryFractionCap
            }
        } else if self.over > 0 {
            Verdict::Exhaustion
        } else if usable_cached > 0 && usable_cached + self.device_free >= s {
            // Free cached bytes there were, and with the device's enough: split.
            Verdict::Fragmentation
        } else if self.stranded_free > 0 && state.cached_free_bytes + self.device_free >= s {
            Verdict::Stranded
        } else {
            Verdict::Exhaustion
        }
    }

    /// The finding's `explanation`: `verdict` in words, with the figures that show it, for
    /// a request on `stream` (`small` pool or large, private pool `pool_id`).
    fn explanation(&self, verdict: Verdict, stream: u64, small: bool, pool_id: (u64, u64)) -> String {
        let (s, state, capacity, device_free) = (self.request, self.state, self.capacity, self.device_free);
        let (usable_cached, over) = (self.usable_cached, self.over);
        let largest_usable = state
            .free_by_stream_pool
            .iter()
            .filter(|g| g.is_request_pool)
            .map(|g| g.largest_free_block_bytes)
            .max()
            .unwrap_or(0);
        let fsz = format_size;
        let cap_words = if self.capacity_source == CapacitySource::File {
            format!("the GPU's {}", fsz(capacity))
        } else {
            format!("about {} the GPU could give this process (reserved + free at the OOM, an estimate)", fsz(capacity))
        };
        // What the device's free memory meant for the request: reachable, or behind the cap.
        let device_words = if self.capped {
            format!(
                "the device had {} free, but a cap on this process stopped it at {} reserved",
                fsz(device_free),
                fsz(state.reserved_bytes)
            )
        } else {
            format!("plus {} free on the device", fsz(device_free))
        };
        let (alloc_size, outside, stranded_free) = (self.alloc_size, self.outside, self.stranded_free);
        match verdict {
            Verdict::Exhaustion if over > 0 => format!(
                "This OOM was exhaustion: tensors in use held {} and the request needed {} more, {} over {}. \
                 Only {} was free in PyTorch's cache and {} on the device; no allocator setting can fit this, \
                 the live set must shrink by at least {}.",
                fsz(state.active_bytes),
                fsz(s),
                fsz(over),
                cap_words,
                fsz(state.cached_free_bytes),
                fsz(device_free),
                fsz(over)
            ),
            // Nothing cached to use, and the device just short of the segment with the page
            // tables and context memory a cudaMalloc also needs (past that margin: the cap).
            Verdict::Exhaustion if state.cached_free_bytes + device_free >= s => format!(
                "This OOM was exhaustion of the memory this process could get: nothing usable was free in PyTorch's \
                 cache ({}), and the {} free on the device did not take the {} segment PyTorch asked CUDA for (a \
                 cudaMalloc also needs page tables and room for the CUDA context); {} of the GPU was held outside this \
                 allocator.",
                fsz(state.cached_free_bytes),
                fsz(device_free),
                fsz(alloc_size),
                fsz(outside)
            ),
            Verdict::Exhaustion => format!(
                "This OOM was exhaustion of the memory this process could get: {} was free in PyTorch's cache and {} on \
                 the device, less than the {} requested; {} of the GPU was held outside this allocator (other processes, \
                 the CUDA context).",
                fsz(state.cached_free_bytes),
                fsz(device_free),
                fsz(s),
                fsz(outside)
            ),
            Verdict::Fragmentation => format!(
                "This OOM was fragmentation: {} was free in PyTorch's cache for this request's stream and pool ({}) \
                 but the largest free block was {}; the request needed {} in one piece.",
                fsz(usable_cached),
                device_words,
                fsz(largest_usable),
                fsz(s)
            ),
            Verdict::Stranded => format!(
                "This OOM was stranded memory: {} was free in PyTorch's cache, but {} of it belongs to other streams or \
                 private pools, which a request on stream {} ({} pool{}) cannot use; its own stream and pool had {} free \
                 ({}) for a {} request.",
                fsz(state.cached_free_bytes),
                fsz(stranded_free),
                stream,
                if small { "small" } else { "large" },
                if pool_id == DEFAULT_POOL { String::new() } else { format!(", private pool {:?}", pool_id) },
                fsz(usable_cached),
                device_words,
                fsz(s)
            ),
            Verdict::MemoryFractionCap => format!(
                "This OOM was the memory cap of this process, not the GPU: the device had {} free, enough for the {} \
                 PyTorch would have asked CUDA for, so the refusal came from a limit on this process \
                 (torch.cuda.set_per_process_memory_fraction() or per_process_memory_fraction in PYTORCH_CUDA_ALLOC_CONF; \
                 snapshots do not record it), reached with {} reserved: the cap lies between {} and {}. Tensors in use \
                 held {} and PyTorch's cache had {} free, less than the {} requested: the lever is the cap or the live set \
                 (raise the cap, or shrink what is live), not an allocator setting.",
                fsz(device_free),
                fsz(alloc_size),
                fsz(state.reserved_bytes),
                fsz(state.reserved_bytes),
                fsz(state.reserved_bytes + alloc_size),
                fsz(state.active_bytes),
                fsz(state.cached_free_bytes),
                fsz(s)
            ),
        }
    }
}

/// Fills `fixes` from replays already made (baseline = recorded settings).
pub(crate) fn apply_trials(f: &mut OomFinding, base: Trial, trials: Vec<Trial>) {
    let idx = f.event_index;
    let reproduces = base.first_oom_index.is_some_and(|i| i <= idx);
    f.replay_reproduces_oom = Some(reproduces);
    if reproduces {
        f.fixes = trials
            .iter()
            .filter(|t| avoids(t, idx))
            .map(|t| Fix {
                setting: t.setting.clone(),
                paste: t.paste.clone(),
                extra_call: t.extra_call.clone(),
                peak_reserved_bytes: t.peak_reserved_bytes,
                cuda_mallocs: t.cuda_mallocs,
            })
            .collect();
    }
    f.baseline = Some(base);
    f.fixes_tried = trials;
}

/// Did this replay get past the recorded OOM at `idx` (serving its request)?
pub fn avoids(t: &Trial, idx: usize) -> bool {
    t.first_oom_index.is_none_or(|i| i > idx) && t.recorded_ooms_that_fit > 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use fragscope_snapshot::{Block, BlockState, Segment, SegmentType, TraceEvent};

    const MIB: u64 = 1 << 20;

    fn seg(address: u64, stream: u64, blocks: &[(u64, BlockState)]) -> Segment {
        let mut a = address;
        let blocks: Vec<Block> = blocks
            .iter()
            .map(|&(size, state)| {
                let b = Block { address: a, size, requested_size: Some(size), state, stack: None, history: None };
                a += size;
                b
            })
            .collect();
        Segment {
            device: 0,
            address,
            total_size: a - address,
            allocated_size: 0,
            active_size: 0,
            requested_size: None,
            stream,
            segment_type: SegmentType::Large,
            segment_pool_id: Some((0, 0)),
            is_expandable: Some(false),
            stack: None,
            blocks,
        }
    }

    /// A snapshot taken right after an OOM of `request` bytes on stream 0.
    fn snap(segments: Vec<Segment>, request: u64, device_free: u64) -> Snapshot {
        Snapshot {
            segments,
            device_traces: vec![vec![TraceEvent::new(Action::Oom, device_free, request)]],
            ..Snapshot::default()
        }
    }

    const NO_REPLAY: OomOptions = OomOptions { top: 5, replay: false, threads: 1 };

    #[test]
    fn free_bytes_in_pieces_on_the_same_stream_is_fragmentation() {
        use BlockState::*;
        // Two 20 MiB segments, each 12 MiB live + 8 MiB free: 16 MiB free, largest 8 MiB.
        let s = snap(
            vec![
                seg(1 << 30, 0, &[(12 * MIB, ActiveAllocated), (8 * MIB, Inactive)]),
                seg(2 << 30, 0, &[(12 * MIB, ActiveAllocated), (8 * MIB, Inactive)]),
            ],
            16 * MIB,
            0,
        );
        let f = oom_finding(&s, 0, &NO_REPLAY).unwrap();
        assert_eq!(f.verdict, Verdict::Fragmentation);
        assert_eq!(f.request_bytes, 16 * MIB);
        assert_eq!(f.alloc_size_bytes, 16 * MIB);
        assert_eq!(f.capacity_bytes, 40 * MIB);
        assert_eq!(f.capacity_source, CapacitySource::EstimateReservedPlusDeviceFree);
        assert_eq!(f.state.cached_free_bytes, 16 * MIB);
        assert_eq!(f.state.largest_free_block_bytes, 8 * MIB);
        assert_eq!(f.state.allocated_bytes, 24 * MIB);
        assert!(f.explanation.contains("fragmentation"), "{}", f.explanation);
    }

    #[test]
    fn free_bytes_on_another_stream_is_stranded() {
        use BlockState::*;
        let s = snap(
            vec![
                seg(1 << 30, 0, &[(12 * MIB, ActiveAllocated), (8 * MIB, Inactive)]),
                seg(2 << 30, 7, &[(12 * MIB, ActiveAllocated), (8 * MIB, Inactive)]),
            ],
            12 * MIB,
            2 * MIB,
        );
        let f = oom_finding(&s, 0, &NO_REPLAY).unwrap();
        assert_eq!(f.verdict, Verdict::Stranded);
        assert_eq!(f.usable_free_bytes, 8 * MIB);
        assert_eq!(f.stranded_free_bytes, 8 * MIB);
        assert_eq!(f.state.free_by_stream_pool.iter().filter(|g| g.is_request_pool).count(), 1);
    }

    #[test]
    fn live_set_plus_request_over_capacity_is_exhaustion() {
        use BlockState::*;
        let s = snap(vec![seg(1 << 30, 0, &[(12 * MIB, ActiveAllocated), (8 * MIB, Inactive)])], 32 * MIB, MIB);
        let f = oom_finding(&s, 0, &NO_REPLAY).unwrap();
        assert_eq!(f.verdict, Verdict::Exhaustion);
        assert_eq!(f.bytes_over_capacity, 12 * MIB + 32 * MIB - 21 * MIB);
    }

    #[test]
    fn device_with_room_means_a_cap_on_the_process() {
        use BlockState::*;
        const GIB: u64 = 1 << 30;
        // Every reserved byte live, 100 GiB free on the device, a 32 MiB request refused:
        // PyTorch's per-process cap, not the device, and not fragmentation.
        let s = snap(vec![seg(1 << 30, 0, &[(20 * MIB, ActiveAllocated)])], 32 * MIB, 100 * GIB);
        let f = oom_finding(&s, 0, &NO_REPLAY).unwrap();
        assert_eq!(f.verdict, Verdict::MemoryFractionCap, "{}", f.explanation);
        assert_eq!(f.capacity_source, CapacitySource::EstimateMemoryFractionCap);
        assert_eq!(f.capacity_bytes, 20 * MIB);
        assert!(f.explanation.contains("set_per_process_memory_fraction"), "{}", f.explanation);
        // The same with 16 MiB free in pieces: the cache could not serve 32 MiB either way.
        let s = snap(
            vec![
                seg(1 << 30, 0, &[(12 * MIB, ActiveAllocated), (8 * MIB, Inactive)]),
                seg(2 << 30, 0, &[(12 * MIB, ActiveAllocated), (8 * MIB, Inactive)]),
            ],
            32 * MIB,
            100 * GIB,
        );
        assert_eq!(oom_finding(&s, 0, &NO_REPLAY).unwrap().verdict, Verdict::MemoryFractionCap);
        // Enough free in the cache for the request, in pieces: fragmentation under the cap,
        // and the device's free memory is not offered as reachable.
        let s = snap(
            vec![
                seg(1 << 30, 0, &[(12 * MIB, ActiveAllocated), (8 * MIB, Inactive)]),
                seg(2 << 30, 0, &[(12 * MIB, ActiveAllocated), (8 * MIB, Inactive)]),
            ],
            16 * MIB,
            100 * GIB,
        );
        let f = oom_finding(&s, 0, &NO_REPLAY).unwrap();
        assert_eq!(f.verdict, Verdict::Fragmentation);
        assert!(f.explanation.contains("a cap on this process"), "{}", f.explanation);
        // Device free just short of the segment plus the margin: the device, as before.
        // With nothing free in the cache that is not fragmentation either (it was, before).
        let s = snap(vec![seg(1 << 30, 0, &[(20 * MIB, ActiveAllocated)])], 32 * MIB, 32 * MIB + CAP_MARGIN - 1);
        let f = oom_finding(&s, 0, &NO_REPLAY).unwrap();
        assert_eq!(f.verdict, Verdict::Exhaustion, "{}", f.explanation);
        assert!(f.explanation.contains("did not take the 32.00 MiB segment"), "{}", f.explanation);
    }

    #[test]
    fn no_oom_entry_no_finding() {
        let mut s = snap(vec![], MIB, 0);
        s.device_traces[0].clear();
        assert!(oom_finding(&s, 0, &NO_REPLAY).is_none());
    }
}
