//! PyTorch's caching allocator ([`fragscope_alloc`]) driven by a recorded trace.
//!
//! The principal types, and how they meet:
//!
//! * [`RecordedState`]: one device's segments and blocks as the recording knew them
//!   ([`BState`], [`SegRec`], [`BlockRec`]). [`backward_walk`] undoes the trace from the
//!   final `segments` (spec §10.12) to the state at any earlier entry
//!   ([`state_before_entry`]); [`home_of`] and [`SplitRules`] are what the walk needs to
//!   know of each entry and of the settings.
//! * [`Seeded`]: the state at the first trace entry, rebuilt by that walk and confirmed
//!   by the forward replay — the tensors and the cache the process already held when
//!   recording began — and a [`fragscope_alloc::CachingAllocator`] seeded with it. Every
//!   replay below starts from it; so can a program of its own ([`StartError`] says why
//!   it cannot).
//! * [`verify`] → [`VerifyReport`]: seed the model with that state, then drive it with the
//!   recorded `alloc` / `free_requested` / `free_completed` entries. New segments get the
//!   addresses CUDA gave (the recorded `segment_alloc`s are queued in an oracle device just
//!   before the malloc that needs them), so a recorded OOM or a recorded absence of
//!   `cudaMalloc` happens by construction. Every decision is compared: the address of each
//!   `alloc`, and each segment event (alloc/free/map/unmap). After a divergence
//!   ([`Divergence`]) the model is re-seeded from the recorded state right after the
//!   diverging event, so later figures still mean something. [`fidelity_table`] sums
//!   reports over files.
//! * [`simulate`] / [`simulate_with`] → [`WhatIf`] ("what if"): the same trace under
//!   another configuration and/or device size ([`SimOptions`]), with synthetic addresses:
//!   peaks, fragmentation, cudaMalloc counts, first OOM ([`SimOom`]; under
//!   `expandable_segments:True` from a cache made without it, what that cache held then:
//!   [`CarriedCache`]), the driver work it
//!   implies ([`DriverWork`]) and the start it had ([`StartState`]); [`simulate_ops`]
//!   serves a transformed trace ([`Op`]) the same way.
//! * [`lab()`] → [`LabReport`]: other allocation policies ([`PolicySpec`]) on the same
//!   workload; [`memory_table`] → [`MemoryTable`]: the `memory_stats()` counters of the
//!   recorded run; [`Recorder`]: a simulated run written back as a snapshot.
//! * The settings a replay runs under: [`recorded_config`], [`config_on_top`], the
//!   [`ALTERNATIVES`] replays compare, and the device size ([`capacity_for`],
//!   [`parse_capacity`]).
//!
//! Modules are private; everything above is re-exported here. Two helpers are public for
//! a caller that serves a recorded workload with its own loop from [`Seeded`] (as
//! `fragscope-predict` does with its synthesised requests): [`BlockMap`], which simulated
//! block a recorded free frees, and [`stack_strings`], a stack written as [`SimOom::stack`]
//! writes it.

mod cost;
mod driver;
mod fidelity;
mod lab;
mod memstats;
mod pools;
mod recorder;
mod seeded;
mod settings;
mod state;
mod whatif;

use fragscope_alloc::rounding::round_size;
use fragscope_alloc::AllocatorConfig;
use fragscope_snapshot::{Snapshot, TraceEvent};
use serde::Serialize;

/// Hash state for maps keyed by 512-aligned addresses (the snapshot crate's Fx hasher,
/// whose `finish` moves the well-mixed high bits down to where the table looks).
pub(crate) type AddrBuild = std::hash::BuildHasherDefault<fragscope_snapshot::FxHasher>;

pub use cost::{DriverWork, SizeClassCalls, SIZE_CLASSES, SYNCS_NOTE};
pub use driver::{capacity_for, infer_expandable_capacity, replayable_devices, verify};
pub use fidelity::{fidelity_table, verdict as fidelity_verdict};
pub use lab::{
    lab, lab_with, make_policy, make_policy_on, parse_policy, smallest_capacity, thread_cpu_seconds, workload_of,
    Calls, LabBounds, LabOom, LabReport, LabRow, LabRunError, LabWorkload, PolicyError, PolicySpec,
};
pub use memstats::{
    memory_table, memory_table_by_replay, memory_table_noted, watching, MemoryTable, Stat, StatRow, TableError,
    WalkWatch,
};
pub use recorder::{allocator_settings, Recorder};
pub use seeded::{release_cache_over, Seeded, StartError};
pub use settings::{
    config_on_top, detect_accelerator, known_gpus, parse_capacity, parse_size, read_recorded_conf, recording_remarks,
    unread_settings, CapacityError, DetectedAccelerator, Param, SizeError, SizeProblem, UnreadSetting, ALTERNATIVES,
};
pub use state::{
    backward_walk, home_of, Ambiguity, BState, BlockRec, Home, Inconsistency, Initial, PoolBand, RecordedState, SegMap,
    SegRec, SplitRules,
};
pub use whatif::{
    simulate, simulate_ops, simulate_with, stack_strings, BlockMap, CarriedCache, Op, Probe, SimOom, SimOptions,
    StartState, WhatIf, UNLIMITED,
};

/// Options of [`verify`].
#[derive(Clone, Debug, Default)]
pub struct ReplayOptions {
    /// Replace the configuration the snapshot recorded.
    pub config: Option<AllocatorConfig>,
    /// Device memory in bytes (reported by `cudaMemGetInfo`, sizes expandable
    /// reservations); default [`DEFAULT_CAPACITY`].
    pub capacity: Option<u64>,
    /// Do not re-seed after a divergence (stop comparing at the first one).
    pub no_resync: bool,
}

/// Device size assumed when neither the file nor the user gives one (80 GiB class).
pub const DEFAULT_CAPACITY: u64 = 80 << 30;

/// A trace entry in plain form, for reports.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct EventView {
    pub action: String,
    pub addr: u64,
    pub size: u64,
    pub stream: u64,
}

impl EventView {
    /// A recorded entry of `snap`.
    pub fn of_trace(snap: &Snapshot, e: &TraceEvent) -> Self {
        EventView { action: e.action.as_str().to_string(), addr: e.addr, size: e.size, stream: snap.stream(e) }
    }
    pub fn of_model(e: &fragscope_alloc::Event) -> Self {
        use fragscope_alloc::Event as E;
        let (action, addr, size, stream) = match *e {
            E::Alloc { addr, size, stream } => ("alloc", addr, size, stream),
            E::FreeRequested { addr, size, stream } => ("free_requested", addr, size, stream),
            E::FreeCompleted { addr, size, stream } => ("free_completed", addr, size, stream),
            E::SegmentAlloc { addr, size, stream } => ("segment_alloc", addr, size, stream),
            E::SegmentFree { addr, size, stream } => ("segment_free", addr, size, stream),
            E::SegmentMap { addr, size, stream } => ("segment_map", addr, size, stream),
            E::SegmentUnmap { addr, size, stream } => ("segment_unmap", addr, size, stream),
            E::Oom { size, device_free, stream } => ("oom", device_free, size, stream),
        };
        EventView { action: action.to_string(), addr, size, stream }
    }
}

/// The first place where the model and the recording disagree.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Divergence {
    /// Index of the trace entry (in the device's trace).
    pub index: usize,
    /// The recorded entry.
    pub recorded: EventView,
    /// The recorded segment events the model had to reproduce for this step.
    pub recorded_segment_events: Vec<EventView>,
    /// What the model did instead, in words.
    pub model: String,
    /// The events the model emitted for this step.
    pub model_events: Vec<EventView>,
    /// Free blocks `(address, size)` the model could choose from for this request
    /// (right pool and stream, size ≥ the rounded request), in best-fit order.
    pub candidates: Vec<(u64, u64)>,
    /// Whether the model was re-seeded from the recorded state after this event.
    pub resynchronised: bool,
}

/// Result of [`verify`] for one device.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct VerifyReport {
    pub device: i64,
    /// Configuration string in force (canonical form; empty = defaults).
    pub config: String,
    pub events: usize,
    pub allocs: u64,
    pub allocs_matched: u64,
    pub segment_events: u64,
    pub segment_events_matched: u64,
    pub ooms: u64,
    pub ooms_matched: u64,
    /// Steps where the model disagreed (each followed by a re-seed unless disabled).
    pub divergences: u64,
    pub first_divergence: Option<Divergence>,
    /// Set when the trace cannot be replayed at all, with the reason.
    pub undecidable: Option<String>,
    /// Explicit `empty_cache()` calls inferred from unexplained segment_free/unmap bursts.
    pub empty_cache_calls: u64,
    /// Blocks alive before the trace whose size the backward walk had to choose.
    pub ambiguous_block_sizes: u64,
    /// Segments and blocks at the end of the replay equal the snapshot's `segments`.
    pub final_state_matches: Option<bool>,
    /// Segments seeded at the first trace entry.
    pub initial_segments: usize,
    pub notes: Vec<String>,
}

impl VerifyReport {
    pub fn fully_matched(&self) -> bool {
        self.undecidable.is_none()
            && self.allocs_matched == self.allocs
            && self.segment_events_matched == self.segment_events
    }
}

/// The configuration a snapshot recorded (`allocator_settings`, 2.3+), else defaults. A
/// part of the recorded string the parser cannot read is left out ([`read_recorded_conf`],
/// named by [`unread_settings`] and in the replay's notes), never the whole string.
pub fn recorded_config(snap: &Snapshot) -> AllocatorConfig {
    // Another accelerator's rules where the file shows one (settings::detect_accelerator).
    let accelerator = settings::detect_accelerator(snap).map_or(fragscope_alloc::Accelerator::Cuda, |d| d.accelerator);
    let Some(rs) = snap.recorded_settings() else {
        return AllocatorConfig { accelerator, ..AllocatorConfig::default() };
    };
    // Keys without a typed field (large_segment_size_mb, max_non_split_rounding_mb, ...)
    // come from the string; the typed fields win because `_set_allocator_settings`
    // may have changed them after the environment variable was read.
    // A part the parser refuses is left out, by name (settings::read_recorded_conf; the
    // replay's notes say which), not the whole string.
    let mut cfg = rs.conf.as_deref().map(|c| settings::read_recorded_conf(c).0).unwrap_or_default();
    cfg.max_split_size = rs.max_split_size;
    if let Some(g) = rs.garbage_collection_threshold {
        cfg.garbage_collection_threshold = g;
    }
    if let Some(e) = rs.expandable_segments {
        cfg.expandable_segments = e;
    }
    if !rs.roundup_power2_divisions.is_empty() {
        let mut t = [0u64; 16];
        for &(mib, d) in &rs.roundup_power2_divisions {
            if mib.is_power_of_two() {
                let idx = (mib.trailing_zeros() as usize).min(15);
                t[idx] = d;
            }
        }
        cfg.roundup_power2_divisions = t;
    }
    cfg.accelerator = accelerator;
    cfg
}

/// The last rounding of each request, in a small direct-mapped table: the walks round
/// the request of every free (and the table's of every alloc), and a program asks for the
/// same few sizes over and over. Exact: a slot answers only for the request it holds
/// (`round_size` is never 0, so (0, 0) is an empty slot).
pub(crate) struct RoundMemo([std::cell::Cell<(u64, u64)>; 256]);

impl RoundMemo {
    pub(crate) fn new() -> Self {
        RoundMemo(std::array::from_fn(|_| std::cell::Cell::new((0, 0))))
    }
    /// `round(n)`, from the table when it holds `n`.
    #[inline(always)]
    pub(crate) fn of(&self, n: u64, round: impl Fn(u64) -> u64) -> u64 {
        let slot = &self.0[((n >> 9) ^ (n >> 17)) as usize & 255];
        match slot.get() {
            (k, v) if k == n && v != 0 => v,
            _ => {
                let v = round(n);
                slot.set((n, v));
                v
            }
        }
    }
}

/// The split rules of a configuration, for the policy-free state model.
pub(crate) fn with_rules<R>(cfg: &AllocatorConfig, f: impl FnOnce(&state::SplitRules) -> R) -> R {
    let memo = RoundMemo::new();
    let round = |n: u64| memo.of(n, |n| round_size(n, cfg));
    let rules = state::SplitRules {
        round: &round,
        max_split_size: cfg.max_split_size,
        max_non_split_rounding: cfg.max_non_split_rounding,
    };
    f(&rules)
}

/// The recorded allocator state right before trace entry `index` of `device` (the trace's
/// length or more: the final state), by the [`backward_walk`] from the final `segments`
/// under the recorded settings (spec §10.12). `Err`: the entry that could not be undone,
/// its index counted from `index` (as the walk counts it).
pub fn state_before_entry(snap: &Snapshot, device: i64, index: usize) -> Result<RecordedState, Inconsistency> {
    let trace = snap.trace(device);
    let from = index.min(trace.len());
    let cfg = recorded_config(snap);
    let fin = RecordedState::from_snapshot(snap, device);
    let home = |e: &TraceEvent| home_of(snap, e);
    with_rules(&cfg, |r| backward_walk(fin, &trace[from..], &home, r)).map(|i| i.state)
}

/// Does this device's trace hold anything a replay can check?
pub fn has_replayable_trace(snap: &Snapshot, device: i64) -> bool {
    use fragscope_snapshot::Action as A;
    snap.trace(device).iter().any(|e| matches!(e.action, A::Alloc | A::SegmentAlloc | A::SegmentMap | A::Oom))
}
