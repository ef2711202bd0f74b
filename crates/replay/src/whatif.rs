//! "What if": the recorded workload under another allocator configuration and/or
//! another device size, with synthetic addresses.
//!
//! The workload is the sequence of requests and frees of the trace; the state at the
//! first entry (blocks alive before recording began) comes from the backward walk
//! under the *recorded* configuration, since it is what really existed. Explicit
//! `empty_cache()` calls inferred by the verify replay are made at the same places;
//! every other segment decision is the simulated allocator's own.

use super::AddrBuild;
use std::collections::{BTreeMap, HashMap, HashSet};

use fragscope_alloc::{AllocatorConfig, CachingAllocator, Event, PoolId, SimulatedDevice, DEFAULT_POOL};
use fragscope_snapshot::{Action, Snapshot, TraceEvent};
use serde::Serialize;

use super::driver::verify_inner;
use super::seeded::{release_cache_over, seed_at_recorded_size, seed_capacity};
use super::state::{BState, RecordedState};
use super::ReplayOptions;

/// Capacity used when none is given: large enough that nothing runs out.
pub const UNLIMITED: u64 = 1 << 50;

#[derive(Clone, Debug, Default)]
pub struct SimOptions {
    /// Device memory; `None` = unlimited.
    pub capacity: Option<u64>,
    /// Keep the simulated events and final state as a [`Snapshot`].
    pub collect_snapshot: bool,
    /// Call `torch.cuda.empty_cache()` right before these trace entries (ascending), on
    /// top of the calls the recording itself made (`fragscope_diagnose::simulate_empty_cache`).
    pub empty_cache_at: Vec<usize>,
    /// Trace entries (ascending) before which to read the allocator's live bytes into
    /// [`WhatIf::probes`]: after every operation a transformation inserted at that entry,
    /// before the entry itself (`fragscope_diagnose::simulate_changes`' checks read them).
    pub probes: Vec<usize>,
}

/// One request or free of the workload a simulation serves: a trace entry as recorded,
/// or one that a transformation of the trace changed or inserted (`fragscope_diagnose::simulate_changes`).
#[derive(Clone, Copy, Debug)]
pub struct Op {
    /// The trace entry it stands at: `empty_cache()` points, OOM indices and probes are
    /// in trace entries. Inserted operations come before the recorded entry `at`.
    pub at: usize,
    /// Inserted by a transformation (not the recorded entry `at` itself).
    pub inserted: bool,
    /// The entry; `addr` is a key naming the block (the recorded address, or a synthetic
    /// one for a block a transformation re-allocates), `size` the request.
    pub ev: TraceEvent,
    /// Its stream (a recorded entry's, resolved once; an inserted one's, chosen).
    pub stream: u64,
}

/// The allocator's live bytes before a trace entry ([`SimOptions::probes`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Probe {
    pub at: usize,
    /// Bytes the live tensors asked for (`requested_bytes`).
    pub requested: u64,
    /// Bytes of the live blocks (`allocated_bytes`: rounded, unsplit remainders included).
    pub allocated: u64,
}

/// The first request the simulated allocator could not serve.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SimOom {
    /// Index of the trace entry.
    pub index: usize,
    /// Unrounded request.
    pub requested: u64,
    pub rounded: u64,
    /// What was asked of the device ("Tried to allocate").
    pub alloc_size: u64,
    pub stream: u64,
    pub reserved: u64,
    pub allocated: u64,
    /// Allocation stack, innermost first, `file:line:name`.
    pub stack: Vec<String>,
    /// Under `expandable_segments:True` from a recording that began with segments made
    /// without it: what those segments held at the OOM ([`CarriedCache`]); `None` otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub carried_cache: Option<CarriedCache>,
}

/// The non-expandable segments a run under `expandable_segments:True` inherited from the
/// state before the trace (made by the recorded settings), as they stood at the first OOM.
///
/// PyTorch's fallback before an OOM, `release_cached_blocks` (spec §3.7, §5.2), returns
/// only whole free segments; a segment that still holds a live block keeps its free
/// pieces, which serve only requests that fit in them, so a large request maps new pages
/// (§6.2) however much of that free space there is. The replay does what PyTorch would do
/// in a process that switched the setting on with this cache; a process run with the
/// setting from its start would have built that cache as expandable pages instead, a
/// layout the recording cannot tell.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CarriedCache {
    /// Such segments still held at the OOM.
    pub segments: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Free bytes inside them (each holds a live block: none could be released).
    pub free: u64,
    /// Free bytes in segments of such kind that were whole: released by the retry, so 0
    /// when the replay ran PyTorch's fallback (kept to show it).
    pub whole_free: u64,
    /// What the device had left at the OOM (`cudaMemGetInfo`'s free bytes).
    pub device_free: u64,
}

/// The allocator state a simulated run started from: the alternatives of one device
/// are comparable only when each started from the state the backward walk rebuilt at
/// the trace's first entry (the tensors already live, the cache). Otherwise one run may
/// hold memory another dropped, and their peaks differ by that, not by the setting.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StartState {
    /// The state at the first entry, rebuilt by the backward walk and seeded (empty
    /// when nothing was live or cached then).
    Rebuilt,
    /// The backward walk failed (the trace and the final state disagree): started
    /// empty, though memory may have been live before the trace.
    Unknown,
    /// The state was rebuilt but the simulated allocator could not hold it (see the
    /// run's notes): started empty.
    NotSeeded,
}

impl StartState {
    /// Why runs that started so cannot be compared, in words (`None` when they can).
    pub fn refusal(self) -> Option<&'static str> {
        match self {
            StartState::Rebuilt => None,
            StartState::Unknown => Some("the allocator state before the trace could not be rebuilt"),
            StartState::NotSeeded => Some("the allocator state before the trace could not be seeded"),
        }
    }
}

/// Result of [`simulate`] for one device.
#[derive(Clone, Debug, Serialize)]
pub struct WhatIf {
    pub device: i64,
    pub config: String,
    pub capacity: Option<u64>,
    pub peak_reserved: u64,
    pub peak_allocated: u64,
    /// 1 − peak allocated / peak reserved.
    pub peak_fragmentation: f64,
    /// Reserved and allocated when the trace begins: the state before it, seeded as
    /// recorded (0 when the run started empty). A change of the program inside the
    /// trace cannot lower it, so `peak_reserved` is never below it.
    pub reserved_before_trace: u64,
    pub allocated_before_trace: u64,
    /// The most reserved just after a `cudaMalloc` (or page map) the trace's requests
    /// made; 0 when they made none. Below `peak_reserved` when the peak is memory
    /// reserved before the recording began (then released, or never outgrown).
    pub peak_reserved_by_trace: u64,
    /// Reserved and allocated when the trace's first request came: the state before the
    /// trace less what the `empty_cache()` calls before that request released (the
    /// recording's own, e.g. the 430 segments `cs336-2.7b-trainstep` releases at its first
    /// entries, and those a what-if adds); the state before the trace when the trace makes
    /// no request. A cache the program released itself before asking for anything is
    /// history of its process, not something the run holds.
    #[serde(skip)]
    pub at_first_request: (u64, u64),
    pub final_reserved: u64,
    /// `cudaMalloc` calls (including expandable page maps).
    pub cuda_mallocs: u64,
    /// `cudaFree` calls (including expandable unmaps).
    pub cuda_frees: u64,
    pub alloc_retries: u64,
    pub ooms: u64,
    pub first_oom: Option<SimOom>,
    /// Recorded OOMs whose request the simulated allocator could serve.
    pub recorded_ooms_that_fit: u64,
    pub empty_cache_calls: u64,
    /// What the run started from ([`StartState`]); the reason is in `notes`.
    pub start_state: StartState,
    /// The advice replayed instead of (or besides) a configuration, in words
    /// (`empty_cache() at every step boundary`, `PYTORCH_NO_CUDA_MEMORY_CACHING=1`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub advice: Option<String>,
    /// How the advice's `empty_cache()` points were found (`32 iterations of 109
    /// allocations (periodicity)`, `3 starts of "eval"`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub advice_points: Option<String>,
    /// `empty_cache()` calls the advice added (on top of the recording's own).
    pub empty_cache_added: u64,
    /// Driver work counted from the replay's events ([`DriverWork`](super::DriverWork)):
    /// calls by segment size, pages mapped and unmapped, synchronisations. No time: see
    /// its module (`cost.rs`).
    pub driver: super::cost::DriverWork,
    pub notes: Vec<String>,
    /// Live bytes at [`SimOptions::probes`].
    #[serde(skip)]
    pub probes: Vec<Probe>,
    /// The simulated run as a snapshot (with `SimOptions::collect_snapshot`).
    #[serde(skip)]
    pub snapshot: Option<Snapshot>,
}

/// The note every what-if of `snap` carries when parts of its recorded settings string
/// could not be read ([`super::unread_settings`]): the what-if's settings are built on the
/// recorded ones ([`super::config_on_top`]), so those parts are missing from it as from the
/// replay of the recording. `None` when every part was read.
pub fn unread_settings_note(snap: &Snapshot) -> Option<String> {
    let unread = super::unread_settings(snap);
    if unread.is_empty() {
        return None;
    }
    let parts: Vec<String> = unread.iter().map(|u| format!("{:?} ({})", u.item, u.error)).collect();
    Some(format!(
        "the recorded PYTORCH_CUDA_ALLOC_CONF has {} part(s) fragscope cannot read; this what-if runs without \
         them too (those options at their defaults unless it sets them): {}",
        unread.len(),
        parts.join("; ")
    ))
}

/// Replay `device`'s workload under `cfg` on a device of `capacity` bytes (unlimited
/// when `None`), with synthetic addresses.
pub fn simulate(snap: &Snapshot, device: i64, cfg: AllocatorConfig, capacity: Option<u64>) -> WhatIf {
    simulate_with(snap, device, cfg, &SimOptions { capacity, ..SimOptions::default() })
}

pub fn simulate_with(snap: &Snapshot, device: i64, cfg: AllocatorConfig, opts: &SimOptions) -> WhatIf {
    let ops =
        snap.trace(device).iter().enumerate().map(|(at, &ev)| Op { at, inserted: false, ev, stream: snap.stream(&ev) });
    simulate_ops(snap, device, cfg, opts, ops)
}

/// [`simulate_with`] serving `ops` (the device's trace, possibly transformed, in order)
/// instead of the trace itself; the state before the trace and the recording's own
/// `empty_cache()` calls still come from the recorded trace.
pub fn simulate_ops(
    snap: &Snapshot,
    device: i64,
    cfg: AllocatorConfig,
    opts: &SimOptions,
    ops: impl Iterator<Item = Op>,
) -> WhatIf {
    let (vrep, inferred) = verify_inner(snap, device, &ReplayOptions::default());
    let mut notes = Vec::new();
    // 1. The simulated device and the state before the trace.
    let cap = simulated_capacity(snap, device, &cfg, opts, &mut notes);
    let private_pools = super::driver::private_pool_note(snap, device);
    let has_private_pools = private_pools.is_some();
    notes.extend(private_pools);
    notes.extend(unread_settings_note(snap));
    let mut eng = CachingAllocator::new(cfg.clone(), SimulatedDevice::synthetic(cap));
    // Events are always read: the driver work is counted from them.
    eng.set_record_events(true);
    // The recording's no-split MemPools stay no-split (a MemPool's flag, not a setting),
    // as the recorded run showed them.
    for &p in &inferred.no_split_pools {
        eng.set_no_split(p, true);
    }
    let mut blocks = BlockMap::default();
    let start_state = match &inferred.initial {
        Some(st) => seed_start_state(snap, device, &cfg, cap, st, &mut eng, &mut blocks, &mut notes),
        None => {
            notes.push(format!(
                "the state before the trace is unknown ({}); started empty",
                vrep.undecidable.as_deref().unwrap_or("no trace")
            ));
            StartState::Unknown
        }
    };
    // 2. Serve the workload, with the recording's own empty_cache() calls and the ones
    // asked for, in trace order.
    let mut points: Vec<(usize, Release)> = inferred.empty_cache_before.iter().map(|&k| (k, Release::All)).collect();
    points.extend(opts.empty_cache_at.iter().map(|&k| (k, Release::All)));
    // Private pools: when each became freeable, and the recording's emptyCache(pool) calls.
    points.extend(inferred.pool_freeable_before.iter().map(|&(k, p)| (k, Release::Freeable(p))));
    points.extend(inferred.pool_empty_cache_before.iter().map(|&(k, p)| (k, Release::Pool(p))));
    points.sort_by_key(|&(k, r)| (k, r.order()));
    let mut run = SimRun::new(eng, blocks, points, opts, has_private_pools);
    for op in ops {
        run.serve(snap, opts, &op);
    }
    // 3. What the run did.
    run.finish(snap, device, &cfg, opts, start_state, notes)
}

/// The device size a what-if runs on: the one asked for, else unlimited; but a memory
/// fraction (and so GC) means nothing on an unlimited device, so with one the replay's
/// device size is used instead (and said in `notes`).
#[inline(always)]
fn simulated_capacity(
    snap: &Snapshot,
    device: i64,
    cfg: &AllocatorConfig,
    opts: &SimOptions,
    notes: &mut Vec<String>,
) -> u64 {
    match opts.capacity {
        Some(c) => c,
        None if cfg.per_process_memory_fraction < 1.0 => {
            let c = super::driver::capacity_for(snap, device, None, cfg);
            notes.push(format!(
                "memory fraction taken of a {} device (no capacity given)",
                fragscope_alloc::format_size(c)
            ));
            c
        }
        None => UNLIMITED,
    }
}

/// Seeds `eng` with `st`, the state at the trace's first entry that the backward walk
/// rebuilt (the segments and blocks that existed before recording began), and marks its
/// live blocks in `blocks` so the trace may free them. If the simulated allocator cannot
/// hold that state, `eng` is replaced by an empty one and the run says it is not
/// comparable with runs that hold it.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn seed_start_state(
    snap: &Snapshot,
    device: i64,
    cfg: &AllocatorConfig,
    cap: u64,
    st: &RecordedState,
    eng: &mut CachingAllocator<SimulatedDevice>,
    blocks: &mut BlockMap,
    notes: &mut Vec<String>,
) -> StartState {
    match seed_at_recorded_size(eng, st, seed_capacity(snap, device)) {
        Err(e) => {
            notes.push(format!(
                "the state before the trace could not be seeded ({e}); started empty: this run is \
                 not comparable with runs that hold that state"
            ));
            let no_split = eng.no_split_pools();
            *eng = CachingAllocator::new(cfg.clone(), SimulatedDevice::synthetic(cap));
            // Events are always read (the driver work is counted from them), as for a run
            // that was seeded.
            eng.set_record_events(true);
            for p in no_split {
                eng.set_no_split(p, true);
            }
            StartState::NotSeeded
        }
        Ok(()) => {
            for b in st.segs.values().flat_map(|s| &s.blocks).filter(|b| b.state != BState::Free) {
                blocks.seeded(b.addr);
            }
            hold_to_device(eng, cap, notes);
            StartState::Rebuilt
        }
    }
}

/// Holds a seeded `eng` to the simulated device's `cap` bytes ([`release_cache_over`]):
/// the seeding adopts the recorded segments at the recorded device's size, so a what-if on
/// a smaller device can start above it, with a cache no process on this device could have
/// held; it is released before the trace, with a note. Counted from the seeded state
/// instead, a recording that began warm (a 28.8 GiB cache above 12.8 GiB of live
/// parameters and state, `cs336-2.7b-trainstep`) fitted no device below 41.6 GiB under any
/// change `fit` tried, though the recording's own first entries release that cache
/// (`empty_cache()`). What is still over `cap` (live blocks and the segments they hold) is
/// the run's start and counts: such a run does not fit.
fn hold_to_device(eng: &mut CachingAllocator<SimulatedDevice>, cap: u64, notes: &mut Vec<String>) {
    let Some((held, kept)) = release_cache_over(eng, cap) else { return };
    // The run's peaks count from here: the state released was never on this device.
    eng.reset_peak_stats();
    if kept < held {
        notes.push(format!(
            "the state before the trace reserved {held} B, more than the device's {cap} B: its cached free \
             segments ({} B) were released before the trace, as the allocator does when cudaMalloc fails",
            held - kept
        ));
    }
    if kept > cap {
        notes.push(format!(
            "the memory reserved before the trace ({kept} B, segments that hold live blocks) is more than the \
             device's {cap} B"
        ));
    }
}

/// The allocator's live bytes now, as a [`Probe`] at trace entry `at`.
#[inline(always)]
fn probe(eng: &CachingAllocator<SimulatedDevice>, at: usize) -> Probe {
    let s = eng.stats();
    Probe {
        at,
        requested: s.requested_bytes.all().current.max(0) as u64,
        allocated: s.allocated_bytes.all().current.max(0) as u64,
    }
}

/// A release the recording made (or a what-if asks for) before a trace entry.
#[derive(Clone, Copy, Debug)]
enum Release {
    /// A private pool's use count dropped to zero (found by the verify replay).
    Freeable(PoolId),
    /// `torch.cuda.empty_cache()`.
    All,
    /// `emptyCache(pool)` of one private pool.
    Pool(PoolId),
}

impl Release {
    /// At one entry: a pool becomes freeable before any call releases it.
    fn order(self) -> u8 {
        match self {
            Release::Freeable(_) => 0,
            Release::All => 1,
            Release::Pool(_) => 2,
        }
    }
}

/// A what-if in progress: the simulated allocator and what [`simulate_ops`] counts while
/// it serves the workload one [`Op`] at a time ([`SimRun::serve`]).
///
/// Its methods each have one caller and are `#[inline(always)]`: the per-op loop is hot
/// (six alternatives of millions of ops per `replay`), and inlined they compile to the
/// code of the single function they were split from, engine inlining included.
struct SimRun<'o> {
    eng: CachingAllocator<SimulatedDevice>,
    /// Recorded blocks → simulated blocks.
    blocks: BlockMap,
    /// The `empty_cache()` points still to come (trace entries, ascending), with the
    /// private pools' releases.
    ec: std::iter::Peekable<std::vec::IntoIter<(usize, Release)>>,
    /// The probes still to read (trace entries, ascending), and those read.
    probe_at: std::iter::Peekable<std::iter::Copied<std::slice::Iter<'o, usize>>>,
    probes: Vec<Probe>,
    /// The simulated events as trace entries (with `SimOptions::collect_snapshot`), and
    /// the saved snapshot's table of entry contexts (their streams).
    out_events: Vec<TraceEvent>,
    out_contexts: Vec<fragscope_snapshot::EntryContext>,
    /// Scratch for each op's events, reused.
    evbuf: Vec<Event>,
    /// With a saved run of a trace with private pools: the pool of each segment (and
    /// mapped range) by address, so the saved entries carry their `pool_id`
    /// ([`event_pool`]); `None` otherwise.
    seg_pools: Option<BTreeMap<u64, PoolId>>,
    first_oom: Option<SimOom>,
    /// Default-pool requests that failed while a MemPool could have served them, had it
    /// been use-on-OOM (not in the snapshot).
    use_on_oom: crate::pools::UseOnOom,
    recorded_fit: u64,
    skipped_frees: u64,
    /// `empty_cache()` synchronises and completes every pending free (spec §5.2), as does
    /// the release an allocation retries after: the trace's later `free_completed` of such
    /// a block then has nothing left to do. Simulated addresses whose free was requested
    /// and not yet completed, with the number of empty_cache() calls made when it was
    /// requested.
    pending: HashMap<u64, u64, AddrBuild>,
    completed_by_empty_cache: u64,
    completed_by_retry: u64,
    empty_cache_calls: u64,
    /// The seeding's own segments are the state before the trace, not work of this run:
    /// they go to the saved snapshot (as before) but are not counted.
    seed_events: Vec<Event>,
    reserved_before_trace: u64,
    allocated_before_trace: u64,
    peak_reserved_by_trace: u64,
    /// [`WhatIf::at_first_request`], once that request came.
    at_first_request: Option<(u64, u64)>,
    driver: super::cost::DriverWork,
}

impl<'o> SimRun<'o> {
    /// Starts counting on `eng`, seeded (or not) with the state before the trace;
    /// `points` are the `empty_cache()` points, ascending.
    #[inline(always)]
    fn new(
        mut eng: CachingAllocator<SimulatedDevice>,
        blocks: BlockMap,
        points: Vec<(usize, Release)>,
        opts: &'o SimOptions,
        private_pools: bool,
    ) -> Self {
        let mut seed_events: Vec<Event> = Vec::new();
        eng.drain_events_into(&mut seed_events);
        let reserved_before_trace = eng.reserved_bytes();
        let allocated_before_trace = eng.stats().allocated_bytes.all().current.max(0) as u64;
        let seg_pools = (private_pools && opts.collect_snapshot)
            .then(|| eng.segments().iter().map(|s| (s.address, s.pool)).collect());
        SimRun {
            eng,
            blocks,
            ec: points.into_iter().peekable(),
            probe_at: opts.probes.iter().copied().peekable(),
            probes: Vec::with_capacity(opts.probes.len()),
            out_events: Vec::new(),
            out_contexts: Vec::new(),
            evbuf: Vec::new(),
            seg_pools,
            first_oom: None,
            use_on_oom: Default::default(),
            recorded_fit: 0,
            skipped_frees: 0,
            pending: HashMap::default(),
            completed_by_empty_cache: 0,
            completed_by_retry: 0,
            empty_cache_calls: 0,
            seed_events,
            reserved_before_trace,
            allocated_before_trace,
            peak_reserved_by_trace: 0,
            at_first_request: None,
            driver: super::cost::DriverWork::default(),
        }
    }

    /// Serves one op: first the probes and `empty_cache()` calls due before it, then the
    /// request or free itself, then its events (counted as driver work, and kept for the
    /// saved snapshot).
    #[inline(always)]
    fn serve(&mut self, snap: &Snapshot, opts: &SimOptions, op: &Op) {
        let (i, ev) = (op.at, &op.ev);
        while let Some(p) = self.probe_at.next_if(|&p| p < i || (p == i && !op.inserted)) {
            self.probes.push(probe(&self.eng, p));
        }
        while let Some((_, r)) = self.ec.next_if(|&(k, _)| k <= i) {
            self.release(r);
        }
        let pool = snap.pool_id(ev).unwrap_or(DEFAULT_POOL);
        let reserved_before_op = self.eng.reserved_bytes();
        if self.at_first_request.is_none() && matches!(ev.action, Action::Alloc | Action::Oom) {
            let allocated = self.eng.stats().allocated_bytes.all().current.max(0) as u64;
            self.at_first_request = Some((reserved_before_op, allocated));
        }
        match ev.action {
            Action::Alloc | Action::Oom => self.serve_alloc(snap, i, ev, op.stream, pool),
            Action::FreeRequested | Action::FreeCompleted => self.serve_free(ev),
            _ => {}
        }
        if self.eng.reserved_bytes() > reserved_before_op {
            self.peak_reserved_by_trace = self.peak_reserved_by_trace.max(self.eng.reserved_bytes());
        }
        self.take_events(opts, ev, pool);
    }

    /// An allocation, or a request the recording refused (a recorded OOM): served if the
    /// simulated allocator can; a recorded OOM that fits is counted and freed at once. The
    /// first request that fails is kept as the run's [`SimOom`] (`i` is its trace entry).
    #[inline(always)]
    fn serve_alloc(&mut self, snap: &Snapshot, i: usize, ev: &TraceEvent, stream: u64, pool: PoolId) {
        match self.eng.malloc_in_pool(ev.size, stream, pool) {
            Ok(a) => {
                if ev.action == Action::Oom {
                    self.recorded_fit += 1;
                    let _ = self.eng.free(a);
                } else {
                    self.blocks.allocated(ev.addr, Some(a));
                }
            }
            Err(o) => {
                if ev.action == Action::Alloc {
                    self.blocks.allocated(ev.addr, None);
                }
                self.use_on_oom.failed(&self.eng, i, ev.size, stream, pool);
                if self.first_oom.is_none() {
                    self.first_oom = Some(SimOom {
                        index: i,
                        requested: o.requested,
                        rounded: o.rounded,
                        alloc_size: o.alloc_size,
                        stream: o.stream,
                        reserved: o.reserved,
                        allocated: o.allocated,
                        stack: stack_strings(snap, ev.stack),
                        carried_cache: self.carried_cache(),
                    });
                }
            }
        }
    }

    /// Under `expandable_segments:True`, the non-expandable segments held now: every one
    /// was seeded from the state before the trace (the engine maps pages for every new
    /// request under the setting), so they are the cache the recorded settings built.
    fn carried_cache(&self) -> Option<CarriedCache> {
        if !self.eng.config().expandable_segments {
            return None;
        }
        let device_free = fragscope_alloc::DeviceMemory::free_memory(self.eng.device());
        let mut c = CarriedCache { segments: 0, bytes: 0, free: 0, whole_free: 0, device_free };
        for seg in self.eng.segments().iter().filter(|s| !s.is_expandable) {
            let free = seg.total_size - seg.active_size();
            c.segments += 1;
            c.bytes += seg.total_size;
            if free == seg.total_size {
                c.whole_free += free;
            } else {
                c.free += free;
            }
        }
        (c.segments > 0).then_some(c)
    }

    /// A `free_requested` or `free_completed` of the block the recorded address maps to.
    /// A free with no simulated block (its allocation failed or was left out) is skipped
    /// and counted; a completion that `empty_cache()` or an allocation's retry already did
    /// is not a skip, and is counted by which of the two did it.
    #[inline(always)]
    fn serve_free(&mut self, ev: &TraceEvent) {
        let ok = match self.blocks.target(ev.addr) {
            Some(a) if ev.action == Action::FreeRequested => {
                let ok = self.eng.free_requested(a).is_ok();
                if ok {
                    self.pending.insert(a, self.empty_cache_calls);
                }
                ok
            }
            Some(a) => {
                let requested_at = self.pending.remove(&a);
                match self.eng.free_completed(a) {
                    Ok(()) => true,
                    // Completed already, by an empty_cache() since its request or
                    // by the release of an allocation's retry: not a skipped free.
                    Err(_) if requested_at.is_some() => {
                        if requested_at != Some(self.empty_cache_calls) {
                            self.completed_by_empty_cache += 1;
                        } else {
                            self.completed_by_retry += 1;
                        }
                        true
                    }
                    Err(_) => false,
                }
            }
            None => false,
        };
        if ev.action == Action::FreeCompleted {
            self.blocks.completed(ev.addr);
        }
        if !ok {
            self.skipped_frees += 1;
        }
    }

    /// One release the recording made before an op (or a what-if asks for).
    #[inline(always)]
    fn release(&mut self, r: Release) {
        match r {
            Release::Freeable(p) => self.eng.set_pool_freeable(p, true),
            Release::All => {
                self.eng.empty_cache();
                self.empty_cache_calls += 1;
            }
            Release::Pool(p) => {
                self.eng.empty_cache_pool(p);
                self.empty_cache_calls += 1;
            }
        }
    }

    /// The events of the op that produced `ev` (after any seeding events still
    /// unread, which are not counted): counted as driver work and, with
    /// `SimOptions::collect_snapshot`, kept as trace entries carrying `ev`'s stack and time.
    #[inline(always)]
    fn take_events(&mut self, opts: &SimOptions, ev: &TraceEvent, pool: PoolId) {
        self.evbuf.clear();
        let seeded = self.seed_events.len();
        self.evbuf.append(&mut self.seed_events);
        self.eng.drain_events_into(&mut self.evbuf);
        self.evbuf[seeded..].iter().for_each(|e| self.driver.observe(e));
        if opts.collect_snapshot {
            for m in &self.evbuf {
                let p = self.seg_pools.as_mut().map(|segs| event_pool(&self.eng, segs, m, pool));
                let mut t = crate::recorder::trace_event_in_pool(m, p, &mut self.out_contexts);
                if matches!(m, Event::Alloc { .. } | Event::Oom { .. }) || t.action == ev.action {
                    t.stack = ev.stack;
                    t.time_us = ev.time_us;
                }
                self.out_events.push(t);
            }
        }
    }

    /// Ends the run (the `empty_cache()` calls and probes left after the last op, the
    /// events not yet read) and reports it, with `notes` and what the counters call for.
    #[inline(always)]
    fn finish(
        mut self,
        snap: &Snapshot,
        device: i64,
        cfg: &AllocatorConfig,
        opts: &SimOptions,
        start_state: StartState,
        mut notes: Vec<String>,
    ) -> WhatIf {
        while let Some((_, r)) = self.ec.next() {
            self.release(r);
        }
        let eng = &self.eng;
        self.probes.extend(self.probe_at.by_ref().map(|p| probe(eng, p)));
        let mut tail: Vec<Event> = std::mem::take(&mut self.seed_events);
        let seeded = tail.len();
        self.eng.drain_events_into(&mut tail);
        tail[seeded..].iter().for_each(|e| self.driver.observe(e));
        self.push_notes(&mut notes);
        notes.extend(self.first_oom.as_ref().and_then(carried_cache_note));
        let eng = self.eng;
        let st = eng.stats().clone();
        let peak_reserved = st.reserved_bytes.all().peak.max(0) as u64;
        let peak_allocated = st.allocated_bytes.all().peak.max(0) as u64;
        let (mut out_events, mut out_contexts, mut seg_pools) = (self.out_events, self.out_contexts, self.seg_pools);
        let snapshot = opts.collect_snapshot.then(|| {
            out_events.extend(tail.iter().map(|m| {
                let p = seg_pools.as_mut().map(|segs| event_pool(&eng, segs, m, DEFAULT_POOL));
                crate::recorder::trace_event_in_pool(m, p, &mut out_contexts)
            }));
            build_snapshot(snap, device, &eng, out_events, out_contexts)
        });
        WhatIf {
            device,
            config: cfg.to_conf_string(),
            capacity: opts.capacity,
            peak_reserved,
            peak_allocated,
            peak_fragmentation: if peak_reserved == 0 {
                0.0
            } else {
                1.0 - peak_allocated as f64 / peak_reserved as f64
            },
            reserved_before_trace: self.reserved_before_trace,
            allocated_before_trace: self.allocated_before_trace,
            peak_reserved_by_trace: self.peak_reserved_by_trace,
            at_first_request: self
                .at_first_request
                .unwrap_or((self.reserved_before_trace, self.allocated_before_trace)),
            final_reserved: eng.reserved_bytes(),
            cuda_mallocs: st.num_device_alloc,
            cuda_frees: st.num_device_free,
            alloc_retries: st.num_alloc_retries,
            ooms: st.num_ooms,
            first_oom: self.first_oom,
            recorded_ooms_that_fit: self.recorded_fit,
            empty_cache_calls: self.empty_cache_calls,
            start_state,
            advice: None,
            advice_points: None,
            empty_cache_added: opts.empty_cache_at.len() as u64,
            driver: self.driver,
            notes,
            probes: self.probes,
            snapshot,
        }
    }

    /// The notes the run's counters call for: frees skipped, and completions that
    /// `empty_cache()` or a retry had already done.
    #[inline(always)]
    fn push_notes(&self, notes: &mut Vec<String>) {
        let (skipped, by_ec, by_retry) = (self.skipped_frees, self.completed_by_empty_cache, self.completed_by_retry);
        if skipped > 0 {
            notes.push(format!("{skipped} free(s) skipped: their allocation failed in the simulation"));
        }
        if by_ec > 0 {
            notes.push(format!(
                "{by_ec} free_completed entr{} already completed by empty_cache() (it completes pending frees, as \
                 PyTorch's does)",
                if by_ec == 1 { "y" } else { "ies" }
            ));
        }
        if by_retry > 0 {
            notes.push(format!(
                "{by_retry} free_completed entr{} already completed by the cache release of an allocation retry",
                if by_retry == 1 { "y" } else { "ies" }
            ));
        }
        notes.extend(self.use_on_oom.note());
    }
}

/// Why a run under `expandable_segments:True` from a recording made without it ran out
/// of memory while its cache held free bytes, and what the replay cannot tell
/// ([`CarriedCache`]); `None` when the first OOM held no such segment.
fn carried_cache_note(oom: &SimOom) -> Option<String> {
    let c = oom.carried_cache.as_ref().filter(|c| c.free > 0 && c.whole_free == 0)?;
    let size = fragscope_alloc::format_size;
    Some(format!(
        "first OOM (entry {}): {} free in the cache lay in {} segment(s) ({}) made before the trace by the \
         recorded settings, not expandable, none wholly free: PyTorch's release before an OOM \
         (release_cached_blocks) returns only whole free segments, so the {} request needed new pages with {} left \
         on the device ({} with those pieces too). This replays a process that switched \
         expandable_segments:True on holding that cache; a run with the setting from its start would have built it \
         as expandable pages: whether that run fits, this recording cannot tell",
        oom.index,
        size(c.free),
        c.segments,
        size(c.bytes),
        size(oom.rounded),
        size(c.device_free),
        size(c.free.saturating_add(c.device_free)),
    ))
}

/// The pool of a simulated event, for a saved run's `pool_id`: the request's own pool
/// for its allocation or OOM, else the pool of the segment the address is in now, or, for
/// a segment already released, the one it was made in (`segs`, kept up to date here).
fn event_pool(
    eng: &CachingAllocator<SimulatedDevice>,
    segs: &mut BTreeMap<u64, PoolId>,
    m: &Event,
    op_pool: PoolId,
) -> PoolId {
    match *m {
        Event::Alloc { .. } | Event::Oom { .. } => op_pool,
        Event::SegmentFree { addr, .. } => segs.remove(&addr).or_else(|| eng.pool_at(addr)).unwrap_or(op_pool),
        Event::SegmentAlloc { addr, .. } | Event::SegmentMap { addr, .. } => {
            let p = eng.pool_at(addr).unwrap_or(op_pool);
            segs.insert(addr, p);
            p
        }
        Event::FreeRequested { addr, .. } | Event::FreeCompleted { addr, .. } | Event::SegmentUnmap { addr, .. } => {
            eng.pool_at(addr).or_else(|| segs.range(..=addr).next_back().map(|(_, &p)| p)).unwrap_or(op_pool)
        }
    }
}

/// Recorded blocks → simulated blocks, for the loops that serve a recorded workload
/// with synthetic addresses ([`simulate_ops`], `predict::Program::predict`): which
/// simulated block a recorded (or transformed) free frees.
#[derive(Default)]
pub struct BlockMap {
    /// Recorded address (a transformation's key) → simulated address; `None` when its
    /// allocation failed or was left out. A recorded address allocated again while still
    /// mapped (a trace that is not allocator-consistent, e.g. a plain repetition) maps to
    /// the newest block; the older simulated block stays allocated, as in the recording.
    map: HashMap<u64, Option<u64>, AddrBuild>,
    /// Blocks alive before the trace, seeded at their recorded address. Only these may be
    /// freed without an alloc in the trace, and only once: a free of an address that is
    /// neither mapped nor seeded-and-live is skipped, so it can never hit a simulated
    /// block that merely happens to sit at that address.
    pre_live: HashSet<u64, AddrBuild>,
}

impl BlockMap {
    /// A block alive before the trace, seeded at `addr`.
    pub fn seeded(&mut self, addr: u64) {
        self.pre_live.insert(addr);
    }
    /// The trace allocated `key`: at `sim` in the simulation (`None`: nowhere).
    pub fn allocated(&mut self, key: u64, sim: Option<u64>) {
        self.map.insert(key, sim);
        self.pre_live.remove(&key);
    }
    /// The simulated block a free of `key` frees, if any.
    pub fn target(&self, key: u64) -> Option<u64> {
        match self.map.get(&key) {
            Some(&sim) => sim,
            // Alive before the trace: seeded at its own address.
            None => self.pre_live.contains(&key).then_some(key),
        }
    }
    /// The free of `key` completed: it names no block any more.
    pub fn completed(&mut self, key: u64) {
        self.map.remove(&key);
        self.pre_live.remove(&key);
    }
}

/// An allocation stack as `file:line:name` strings, innermost first.
pub fn stack_strings(snap: &Snapshot, stack: Option<fragscope_snapshot::StackId>) -> Vec<String> {
    stack.map(|s| snap.frames.resolved(s).map(|(f, l, n)| format!("{f}:{l}:{n}")).collect()).unwrap_or_default()
}

/// The simulated run as a snapshot of one device: its trace and final segments.
fn build_snapshot(
    src: &Snapshot,
    device: i64,
    eng: &CachingAllocator<SimulatedDevice>,
    events: Vec<TraceEvent>,
    contexts: Vec<fragscope_snapshot::EntryContext>,
) -> Snapshot {
    let segments = crate::recorder::segments_of(eng, device, |_| None, |_| None);
    let mut traces = vec![Vec::new(); (device.max(0) as usize) + 1];
    traces[device.max(0) as usize] = events;
    // The settings travel with the run, so a replay of the saved file uses them.
    let cfg = eng.config();
    let settings = crate::recorder::allocator_settings(cfg, &cfg.to_conf_string());
    Snapshot {
        segments,
        device_traces: traces,
        allocator_settings: Some(settings),
        frames: src.frames.clone(),
        contexts,
        ..Default::default()
    }
}
