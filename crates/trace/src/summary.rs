//! What a snapshot says about memory at the moment it was taken: the figures of
//! `torch.cuda.memory_summary()` that a snapshot can give, a fragmentation section
//! PyTorch never printed, and what the recorded trace covers.
//!
//! Every figure is computed from the segments and blocks of the final state (and the
//! trace for the trace section); nothing is replayed. Definitions follow PyTorch's names:
//!
//! * `reserved_bytes`: sum of segment `total_size`.
//! * `allocated_bytes`: sum of `size` of blocks in state `active_allocated`.
//! * `active_bytes`: `active_allocated` + `active_pending_free` block sizes.
//! * `requested_bytes`: sum of the unrounded request of active blocks. The request is
//!   the block's `requested_size`; legacy blocks without it use their `history[0]`
//!   `real_size`, and 1.13 blocks (neither) their `size`, as `_memory_viz.py` does.
//! * `inactive_split_bytes` ("Non-releasable memory"): `inactive` blocks in
//!   non-expandable segments holding more than one block.
//! * `segments` counts every segment, expandable ones included (PyTorch's `segment`
//!   stat leaves expandable segments out).
//!
//! Fragmentation follows `_memory_viz.py stats` (spec §11.3): over `active_allocated`
//! blocks, internal free = `size` − request (rounding slack); external free = the sizes
//! of every other block (pending-free counts as free there). See [`Fragmentation`].

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};

use fragscope_snapshot::{Action, BlockState, FxHashMap, Segment, SegmentType, Snapshot, SourceFormat, TraceEvent};
use serde::Serialize;

use crate::blocks::{is_pinned, memviz_request, request_of};
use crate::lives::BlockLives;
use crate::walk::TraceFacts;

/// The schema name written at the top of `fragscope summary --json`.
pub const SCHEMA: &str = "fragscope.summary/1";

/// Summary of one snapshot (all devices).
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    /// One entry per device that has segments or trace events, ascending.
    pub devices: Vec<DeviceSummary>,
    /// What `python _memory_viz.py stats FILE` prints as totals (all devices together).
    pub memviz_stats: MemvizStats,
    /// `allocator_settings` (2.3+), `null` when the file predates it.
    pub settings: Option<Settings>,
    /// What the reader tolerated.
    pub notes: Notes,
    /// `"dict"` (2.x), `"segment_list"` (1.13) or `"kineto"` (profiler trace).
    pub format: SourceFormat,
    /// Device totals a profiler trace reported (`Total Allocated` / `Total Reserved`, or the
    /// running sum of `Bytes` when the old schema has nothing else); empty for snapshots.
    pub profiler_totals: Vec<ProfilerTotals>,
    /// Pinned host memory (`host_segments`, `host_traces`: recorded with
    /// `_record_memory_history(record_pinned_host_memory=True)`, 2.14+), never added to a
    /// device's figures; absent when the file has neither key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<HostSummary>,
    /// A `segment_list` file with 2.x keys (`torch.cuda.memory_snapshot()`, not 1.13), for
    /// the text's name of the format; the JSON says it in `notes.recording`.
    #[serde(skip)]
    pub segment_list_2x: bool,
}

/// Pinned host memory: the CUDA host allocator's blocks (`torch.empty(..., pin_memory=True)`,
/// `tensor.pin_memory()`), which live in CPU RAM, not on a GPU. PyTorch writes each as a
/// pseudo-segment of one block with `device` −1 (spec §10.8).
#[derive(Clone, Debug, Default, Serialize)]
pub struct HostSummary {
    /// Host segments in the final state (one per pinned block PyTorch holds).
    pub segments: u64,
    /// Their bytes: pinned host memory PyTorch holds, in use or cached.
    pub reserved_bytes: u64,
    /// Of which in blocks a tensor holds (state `active_allocated`).
    pub allocated_bytes: u64,
    /// Of which cached free (state `inactive`): kept pinned for reuse.
    pub cached_free_bytes: u64,
    /// `host_traces` entries by action (PyTorch's names), when the file has the key.
    pub trace_actions: Option<BTreeMap<String, u64>>,
    /// The most requested bytes live at once over `host_traces` (`alloc` adds its size,
    /// its `free_requested` takes it off; blocks from before the trace not counted).
    pub trace_peak_requested_bytes: Option<u64>,
}

/// The pinned host memory of `snap` ([`HostSummary`]); `None` when the file has neither
/// `host_segments` nor `host_traces`.
pub fn host_summary(snap: &Snapshot) -> Option<HostSummary> {
    if snap.host_segments.is_none() && snap.host_traces.is_none() {
        return None;
    }
    let mut h = HostSummary::default();
    for seg in snap.host_segments.iter().flatten() {
        h.segments += 1;
        h.reserved_bytes += seg.total_size;
        for b in &seg.blocks {
            match b.state {
                BlockState::ActiveAllocated => h.allocated_bytes += b.size,
                BlockState::Inactive => h.cached_free_bytes += b.size,
                BlockState::ActivePendingFree => {}
            }
        }
    }
    if let Some(trace) = &snap.host_traces {
        let mut actions: BTreeMap<String, u64> = BTreeMap::new();
        let mut live: HashMap<u64, u64> = HashMap::new();
        let (mut now, mut peak) = (0u64, 0u64);
        for e in trace {
            *actions.entry(e.action.as_str().to_string()).or_default() += 1;
            match e.action {
                Action::Alloc => {
                    if let Some(old) = live.insert(e.addr, e.size) {
                        now = now.saturating_sub(old);
                    }
                    now = now.saturating_add(e.size);
                    peak = peak.max(now);
                }
                Action::FreeRequested => {
                    now = now.saturating_sub(live.remove(&e.addr).unwrap_or(0));
                }
                _ => {}
            }
        }
        h.trace_actions = Some(actions);
        h.trace_peak_requested_bytes = Some(peak);
    }
    Some(h)
}

/// What a torch.profiler trace says about one device's totals: all a user with only a
/// profiler trace (even one without addresses) can learn about peaks.
#[derive(Clone, Debug, Serialize)]
pub struct ProfilerTotals {
    pub device: i64,
    pub samples: u64,
    pub peak_allocated_bytes: Option<u64>,
    pub peak_reserved_bytes: Option<u64>,
    pub last_allocated_bytes: Option<u64>,
    /// `totalGlobalMem` from the trace's `deviceProperties`.
    pub device_capacity_bytes: Option<u64>,
    pub first_time_us: Option<i64>,
    pub last_time_us: Option<i64>,
}

fn profiler_totals(snap: &Snapshot) -> Vec<ProfilerTotals> {
    snap.totals
        .iter()
        .enumerate()
        .filter(|(_, t)| !t.is_empty())
        .map(|(d, t)| ProfilerTotals {
            device: d as i64,
            samples: t.len() as u64,
            peak_allocated_bytes: t.iter().filter_map(|x| x.allocated).max(),
            peak_reserved_bytes: t.iter().filter_map(|x| x.reserved).max(),
            last_allocated_bytes: t.iter().rev().find_map(|x| x.allocated),
            device_capacity_bytes: snap.device_capacity.get(&(d as i64)).copied(),
            first_time_us: t.first().map(|x| x.time_us),
            last_time_us: t.last().map(|x| x.time_us),
        })
        .collect()
}

/// Figures of one pool (or of all pools) of one device, as `memory_stats()` names them
/// (the `current` value).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PoolFigures {
    pub segments: u64,
    pub blocks: u64,
    pub reserved_bytes: u64,
    pub allocated_bytes: u64,
    pub active_bytes: u64,
    pub requested_bytes: u64,
    /// "Non-releasable memory".
    pub inactive_split_bytes: u64,
    /// Blocks in state `active_allocated` ("Allocations").
    pub allocations: u64,
    /// `active_allocated` + `active_pending_free` blocks ("Active allocs").
    pub active_blocks: u64,
    /// "Non-releasable allocs".
    pub inactive_split_blocks: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Pools {
    pub large: PoolFigures,
    pub small: PoolFigures,
}

#[derive(Clone, Debug, Serialize)]
pub struct DeviceSummary {
    pub device: i64,
    /// The `all` pool figures, flattened into the device object.
    #[serde(flatten)]
    pub all: PoolFigures,
    pub pools: Pools,
    /// Segments with `is_expandable` true.
    pub expandable_segments: u64,
    /// Same as `fragmentation.largest_free_block_bytes`.
    pub largest_free_block_bytes: u64,
    /// Same as `trace.events`.
    pub trace_events: u64,
    pub fragmentation: Fragmentation,
    pub trace: TraceSummary,
    /// memory_summary()'s Cur/Peak/Tot Alloc/Tot Freed over the recorded window (see
    /// [`fragscope_replay::memory_table`]); `None` without a trace, when the trace and the state disagree,
    /// or when the trace lacks its segment events (`skip_actions`: reserved memory over it is unknown).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_table: Option<fragscope_replay::MemoryTable>,
    /// Memory by role over the trace ([`crate::roles`]); absent without a trace.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub roles: Option<crate::roles::DeviceRoles>,
}

/// Where the reserved-but-unallocated memory is.
#[derive(Clone, Debug, Serialize)]
pub struct Fragmentation {
    /// `reserved_bytes − allocated_bytes`: what nvidia-smi counts as used but tensors do not.
    pub reserved_minus_allocated_bytes: u64,
    /// `internal_free_bytes + external_free_bytes` (`_memory_viz.py stats` "total_free").
    pub free_bytes: u64,
    /// Rounding slack inside `active_allocated` blocks: `size − request`.
    pub internal_free_bytes: u64,
    /// Sizes of all blocks that are not `active_allocated` (pending-free included).
    pub external_free_bytes: u64,
    /// `internal_free_bytes / free_bytes`, 0 when nothing is free.
    pub internal_free_share: f64,
    /// Sizes of `inactive` blocks: cached memory a new request could reuse.
    pub inactive_bytes: u64,
    /// The largest `inactive` block: the largest request served without new memory.
    pub largest_free_block_bytes: u64,
    /// `1 − largest_free_block_bytes / inactive_bytes`; 0 when nothing is free. Near 1:
    /// the free memory is scattered in small pieces.
    pub free_space_fragmentation: f64,
    /// Non-expandable segments kept alive by a few small live blocks: a segment with
    /// at least one active block where active bytes ≤ 10% of the segment, or ≤ 2 active
    /// blocks holding ≤ 25% of it. `empty_cache()` releases only segments without active
    /// blocks, so their free part stays reserved.
    pub pinned_segments: u64,
    /// `total_size` of the pinned segments.
    pub pinned_reserved_bytes: u64,
    /// Free bytes (not active) inside the pinned segments.
    pub pinned_free_bytes: u64,
}

/// What the device's trace holds and how much of the final state it explains.
#[derive(Clone, Debug, Serialize)]
pub struct TraceSummary {
    pub events: u64,
    /// Events per action name (only actions present).
    pub by_action: BTreeMap<&'static str, u64>,
    /// `time_us` of the first / last event that has one (trace order).
    pub first_time_us: Option<i64>,
    pub last_time_us: Option<i64>,
    pub span_us: Option<i64>,
    /// How much of the run's history the trace holds.
    pub history: History,
    /// Blocks freed in the trace (free_requested/free_completed) with no earlier
    /// `alloc` in the trace; a block freed by both events counts once.
    pub frees_of_unknown_blocks: u64,
    /// `segment_free` of segments with no earlier `segment_alloc` in the trace.
    pub segment_frees_of_unknown_segments: u64,
    /// Active blocks in the final state.
    pub live_blocks: u64,
    pub live_bytes: u64,
    /// Active blocks of the final state whose alloc is not in the trace.
    pub live_blocks_untraced: u64,
    /// Active bytes of the final state allocated within the trace.
    pub live_bytes_traced: u64,
    /// `live_bytes_traced / live_bytes`, `null` when nothing is live.
    pub live_bytes_coverage: Option<f64>,
    /// Blocks the trace leaves live (alloc, no free_completed) that the final state lacks.
    pub trace_live_missing_from_state: u64,
}

/// How much of the run's history a device's trace holds (`history` in JSON).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum History {
    /// No trace entry.
    None,
    /// One entry: `enabled="state"`, or the legacy one-entry ring buffer.
    SingleEntry,
    /// Every free and every live block has its `alloc` in the trace.
    Complete,
    /// Recording started (or the ring buffer wrapped) after some blocks or segments
    /// already existed.
    BeganMidRun,
}

impl History {
    /// The name JSON gives it.
    pub fn as_str(self) -> &'static str {
        match self {
            History::None => "none",
            History::SingleEntry => "single_entry",
            History::Complete => "complete",
            History::BeganMidRun => "began_mid_run",
        }
    }
}

impl std::fmt::Display for History {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The totals `_memory_viz.py stats` prints, with its exact text.
#[derive(Clone, Debug, Serialize)]
pub struct MemvizStats {
    pub segments: u64,
    pub total_reserved_bytes: u64,
    /// Sum of the requests of `active_allocated` blocks ("total_allocated").
    pub total_allocated_bytes: u64,
    pub free_internal_bytes: u64,
    pub free_external_bytes: u64,
    /// `segments: N`, `total_reserved: ...`, `total_allocated: ...`, `total_free: ...`.
    pub lines: Vec<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Settings {
    #[serde(rename = "PYTORCH_CUDA_ALLOC_CONF")]
    pub conf: Option<String>,
    /// `null` = unlimited.
    pub max_split_size: Option<u64>,
    pub garbage_collection_threshold: Option<f64>,
    pub expandable_segments: Option<bool>,
    /// `[interval start in MiB, divisions]` pairs.
    pub roundup_power2_divisions: Vec<(u64, u64)>,
    /// Parts of the settings string fragscope cannot read, which replays run without
    /// (`fragscope_replay::read_recorded_conf`); left out of the JSON when none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unread: Vec<fragscope_replay::UnreadSetting>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Notes {
    pub unknown_keys: BTreeMap<String, u64>,
    pub unknown_actions: BTreeMap<String, u64>,
    pub missing_optional: BTreeMap<String, u64>,
    pub remarks: Vec<String>,
    /// How the file was recorded, one line each ([`fragscope_snapshot::recording`]):
    /// history never switched on, one pool only, actions `skip_actions` left out and
    /// what was restored. Absent when there is nothing to say.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub recording: Vec<String>,
}

fn pool_figures<'a>(segs: impl Iterator<Item = &'a Segment>) -> PoolFigures {
    let mut r = PoolFigures::default();
    for seg in segs {
        r.segments += 1;
        r.blocks += seg.blocks.len() as u64;
        r.reserved_bytes += seg.total_size;
        let split = seg.blocks.len() > 1 && seg.is_expandable != Some(true);
        for b in &seg.blocks {
            match b.state {
                BlockState::ActiveAllocated => {
                    r.allocated_bytes += b.size;
                    r.allocations += 1;
                }
                BlockState::ActivePendingFree => {}
                BlockState::Inactive => {
                    if split {
                        r.inactive_split_bytes += b.size;
                        r.inactive_split_blocks += 1;
                    }
                }
            }
            if b.state.is_active() {
                r.active_bytes += b.size;
                r.active_blocks += 1;
                r.requested_bytes += request_of(b);
            }
        }
    }
    r
}

fn fragmentation(segs: &[&Segment], all: &PoolFigures) -> Fragmentation {
    let (mut internal, mut external, mut inactive, mut largest) = (0u64, 0u64, 0u64, 0u64);
    let (mut pinned, mut pinned_reserved, mut pinned_free) = (0u64, 0u64, 0u64);
    for seg in segs {
        let (mut live_n, mut live_bytes) = (0u64, 0u64);
        for b in &seg.blocks {
            if b.state == BlockState::ActiveAllocated {
                internal += b.size.saturating_sub(memviz_request(b));
            } else {
                external += b.size;
            }
            if b.state == BlockState::Inactive {
                inactive += b.size;
                largest = largest.max(b.size);
            } else {
                live_n += 1;
                live_bytes += b.size;
            }
        }
        let total = seg.total_size;
        if is_pinned(seg, live_n as usize, live_bytes) {
            pinned += 1;
            pinned_reserved += total;
            pinned_free += total.saturating_sub(live_bytes);
        }
    }
    let free = internal + external;
    Fragmentation {
        reserved_minus_allocated_bytes: all.reserved_bytes.saturating_sub(all.allocated_bytes),
        free_bytes: free,
        internal_free_bytes: internal,
        external_free_bytes: external,
        internal_free_share: if free == 0 { 0.0 } else { internal as f64 / free as f64 },
        inactive_bytes: inactive,
        largest_free_block_bytes: largest,
        free_space_fragmentation: if inactive == 0 { 0.0 } else { 1.0 - largest as f64 / inactive as f64 },
        pinned_segments: pinned,
        pinned_reserved_bytes: pinned_reserved,
        pinned_free_bytes: pinned_free,
    }
}

/// The trace's figures from the facts the lifetime walk gathered in its first pass
/// ([`TraceFacts`]: the events by action, the blocks the trace leaves live, the frees it
/// has no alloc for), so that `summary` reads the trace once for them and for the roles.
fn trace_summary(segs: &[&Segment], trace: &[TraceEvent], facts: &TraceFacts) -> TraceSummary {
    let first_time_us = trace.iter().find_map(TraceEvent::time);
    let last_time_us = trace.iter().rev().find_map(TraceEvent::time);
    let counts = &facts.counts;
    let live = &facts.live_at_end;
    let (unknown_frees, unknown_seg_frees) = (facts.unknown_frees, facts.unknown_segment_frees);
    let by_action: BTreeMap<&'static str, u64> =
        Action::ALL.iter().filter(|a| counts[**a as usize] > 0).map(|a| (a.as_str(), counts[*a as usize])).collect();
    // FxHash: SipHash of the 114 k final blocks of a long run was a few ms of `summary`.
    // Sized at once (grown by doubling, its tables were 7 % of `summary`'s page faults);
    // only sums and lookups read it, never its order.
    let active = segs.iter().map(|s| s.blocks.iter().filter(|b| b.state.is_active()).count()).sum();
    let mut state_live: FxHashMap<u64, u64> = FxHashMap::with_capacity_and_hasher(active, Default::default());
    for seg in segs {
        for b in seg.blocks.iter().filter(|b| b.state.is_active()) {
            state_live.insert(b.address, b.size);
        }
    }
    let live_bytes: u64 = state_live.values().sum();
    let (mut traced_n, mut traced_bytes) = (0u64, 0u64);
    for (a, s) in &state_live {
        if live.contains_key(a) {
            traced_n += 1;
            traced_bytes += s;
        }
    }
    let untraced = state_live.len() as u64 - traced_n;
    let history = if trace.is_empty() {
        History::None
    } else if trace.len() == 1 {
        History::SingleEntry
    } else if unknown_frees == 0 && unknown_seg_frees == 0 && untraced == 0 {
        History::Complete
    } else {
        History::BeganMidRun
    };
    TraceSummary {
        events: trace.len() as u64,
        by_action,
        first_time_us,
        last_time_us,
        span_us: first_time_us.zip(last_time_us).map(|(a, b)| b - a),
        history,
        frees_of_unknown_blocks: unknown_frees,
        segment_frees_of_unknown_segments: unknown_seg_frees,
        live_blocks: state_live.len() as u64,
        live_bytes,
        live_blocks_untraced: untraced,
        live_bytes_traced: traced_bytes,
        live_bytes_coverage: (live_bytes > 0).then(|| traced_bytes as f64 / live_bytes as f64),
        trace_live_missing_from_state: live.keys().filter(|a| !state_live.contains_key(a)).count() as u64,
    }
}

/// Summary of one device.
pub fn summarize_device(snap: &Snapshot, device: i64) -> DeviceSummary {
    summarize_device_with(snap, device, true)
}

/// [`summarize_device`]; without its roles when `roles` is false, for a caller that has
/// them from a walk of its own (the report takes `analyze`'s, over the same block lives).
pub fn summarize_device_with(snap: &Snapshot, device: i64, roles: bool) -> DeviceSummary {
    summarize_device_threads(snap, device, roles, crate::par::threads() > 2)
}

/// [`summarize_device_with`], with the steps on a thread of their own or not (tests check
/// that both layouts give the same summary; a machine takes the one its cores suit).
#[doc(hidden)]
pub fn summarize_device_threads(snap: &Snapshot, device: i64, roles: bool, own_steps_thread: bool) -> DeviceSummary {
    summarize_device_parts(snap, device, roles, true, own_steps_thread, None)
}

/// [`summarize_device_threads`], without memory_summary's table when `table` is false
/// (`memory_table` is then `None`): for a caller whose own walk already runs
/// [`fragscope_replay::memory_table`] (the report's timeline, for its peak allocated).
fn summarize_device_parts(
    snap: &Snapshot,
    device: i64,
    roles: bool,
    table: bool,
    own_steps_thread: bool,
    facts: Option<&TraceFacts>,
) -> DeviceSummary {
    let segs: Vec<&Segment> = snap.device_segments(device).collect();
    let all = pool_figures(segs.iter().copied());
    let pools = Pools {
        large: pool_figures(segs.iter().copied().filter(|s| s.segment_type == SegmentType::Large)),
        small: pool_figures(segs.iter().copied().filter(|s| s.segment_type == SegmentType::Small)),
    };
    let fragmentation = fragmentation(&segs, &all);
    // Two walks of the trace answer different questions: the block lives (one forward
    // walk, [`BlockLives`]), which give the trace's figures (from its first pass) and the
    // roles; and memory_summary's table, whose block sizes need the allocator's block
    // layout (the backward walk of [`fragscope_replay::memory_table`]). On the two cores summary has,
    // side by side; the roles' steps, which read only the trace and its stacks, beside
    // the lifetime walk (the table's walk often ends at once, on a trace it cannot
    // vouch for).
    let want_roles = roles && !snap.trace(device).is_empty();
    let segs_ref = &segs;
    // With the steps, rule 8's passes and their layers ([`crate::roles::passes::layered`]),
    // which read only the trace and the steps: on the steps' thread they keep the two
    // threads even (the lives' thread, with the roles, was the longer by about the time
    // they take on a long forward-only trace).
    let steps_of = move || crate::roles::steps_and_passes(snap, device);
    // On two cores, two threads: the steps here before the table (together about as long
    // as the lifetime walk and the roles), handed to the lives' thread; a third thread
    // would only take turns with these two (loopreq-6.9m, 8 interleaved in-process runs of
    // 5: best 0.085-0.088 s against 0.087-0.102 s with three). With more cores
    // (`own_steps_thread`) the steps have their own.
    let (memory_table, (trace, roles)) = std::thread::scope(|sc| {
        let (to_lives, steps_rx) = std::sync::mpsc::sync_channel(1);
        let steps = (want_roles && own_steps_thread).then(|| sc.spawn(steps_of));
        let lived = sc.spawn(move || {
            // The lives only for the roles: without them, the walk's first pass alone (or
            // the caller's, `facts`).
            let (lives, facts, index) = match (want_roles, facts) {
                (true, _) => {
                    let (lives, f, index) = BlockLives::replay_with_facts(snap, device, true);
                    (lives, Cow::Owned(f), index)
                }
                (false, Some(f)) => (BlockLives::default(), Cow::Borrowed(f), None),
                (false, None) => (BlockLives::default(), Cow::Owned(crate::walk::Replayer::facts(snap, device)), None),
            };
            let trace = trace_summary(segs_ref, snap.trace(device), &facts);
            drop(facts);
            let steps = match steps {
                Some(h) => Some(h.join().expect("steps thread")),
                None => steps_rx.recv().ok(),
            };
            let roles = steps.map(|(st, mut ev, layered)| {
                crate::roles::device_roles_from_ev(snap, &lives, &st, &mut ev, index, Some(layered)).0
            });
            drop(lives);
            (trace, roles)
        });
        if want_roles && !own_steps_thread {
            let _ = to_lives.send(steps_of());
        }
        drop(to_lives);
        // Without its segment events (skip_actions) the table's reserved rows would be
        // the final state's, over a window in which memory was reserved and released:
        // no table rather than wrong figures (the recording notes say why).
        let table = if table {
            fragscope_replay::memory_table(snap, device)
                .ok()
                .filter(|_| !fragscope_snapshot::recording::segment_events_missing(snap, device))
        } else {
            None
        };
        (table, lived.join().expect("lives thread"))
    });
    DeviceSummary {
        device,
        all,
        pools,
        expandable_segments: segs.iter().filter(|s| s.is_expandable == Some(true)).count() as u64,
        largest_free_block_bytes: fragmentation.largest_free_block_bytes,
        trace_events: trace.events,
        fragmentation,
        trace,
        memory_table,
        roles,
    }
}

/// Summarizes every device that has segments or trace events.
pub fn summarize(snap: &Snapshot) -> Summary {
    summarize_with(snap, true)
}

/// [`summarize`], without the roles when `roles` is false ([`summarize_device_with`]).
pub fn summarize_with(snap: &Snapshot, roles: bool) -> Summary {
    summarize_parts(snap, roles, true)
}

/// [`summarize_with`], without memory_summary's table (`memory_table` is `None`) when
/// `table` is false: the report's timeline walk computes that table for its peak
/// allocated, and the page never draws the table, so the summary beside it skips the
/// second computation.
pub fn summarize_parts(snap: &Snapshot, roles: bool, table: bool) -> Summary {
    summarize_with_facts(snap, roles, table, &|_| None)
}

/// [`summarize_parts`] without the roles and memory_summary's table, the trace figures
/// read from the first pass of each device's timeline walk, `timeline_of(device)` (a
/// device without one: a walk of its own): for the report, whose timeline walks made
/// them, so that its summary does not walk each trace again.
pub fn summarize_from_timelines<'t>(
    snap: &Snapshot,
    timeline_of: &dyn Fn(i64) -> Option<&'t crate::DeviceTimeline>,
) -> Summary {
    summarize_with_facts(snap, false, false, &|d| timeline_of(d).map(|t| &*t.facts))
}

fn summarize_with_facts<'t>(
    snap: &Snapshot,
    roles: bool,
    table: bool,
    facts_of: &dyn Fn(i64) -> Option<&'t TraceFacts>,
) -> Summary {
    let threads = crate::par::threads() > 2;
    // Segments grouped by device once: every per-device step reads only its own.
    let devices = snap.with_device_index(|snap| {
        snap.devices()
            .into_iter()
            .map(|d| {
                // The caller's facts serve only a summary without roles (the roles need the
                // lives, whose walk gives the facts anyway).
                let facts = if roles { None } else { facts_of(d) };
                summarize_device_parts(snap, d, roles, table, threads, facts)
            })
            .collect()
    });
    let settings = snap.recorded_settings().map(|s| Settings {
        unread: s.conf.as_deref().map(|c| fragscope_replay::read_recorded_conf(c).1).unwrap_or_default(),
        conf: s.conf,
        max_split_size: s.max_split_size,
        garbage_collection_threshold: s.garbage_collection_threshold,
        expandable_segments: s.expandable_segments,
        roundup_power2_divisions: s.roundup_power2_divisions,
    });
    let n = &snap.notes;
    Summary {
        devices,
        memviz_stats: memviz_stats(&snap.segments),
        settings,
        notes: Notes {
            unknown_keys: n.unknown_keys.clone(),
            unknown_actions: n.unknown_actions.clone(),
            missing_optional: n.missing_optional.clone(),
            remarks: n.remarks.clone(),
            recording: n.recording.clone(),
        },
        format: snap.format,
        profiler_totals: profiler_totals(snap),
        host: host_summary(snap),
        segment_list_2x: fragscope_snapshot::recording::is_segment_list_2x(snap),
    }
}

/// `_memory_viz.py stats` totals over the given segments (spec §11.3).
pub(crate) fn memviz_stats(segments: &[Segment]) -> MemvizStats {
    let (mut reserved, mut allocated, mut f_int, mut f_ext) = (0u64, 0u64, 0u64, 0u64);
    for seg in segments {
        reserved += seg.total_size;
        for b in &seg.blocks {
            if b.state == BlockState::ActiveAllocated {
                let a = memviz_request(b);
                allocated += a;
                f_int += b.size.saturating_sub(a);
            } else {
                f_ext += b.size;
            }
        }
    }
    let total_free = f_int + f_ext;
    let suffix = if total_free != 0 {
        format!(" ({:.1}% internal)", f_int as f64 / total_free as f64 * 100.0)
    } else {
        String::new()
    };
    MemvizStats {
        segments: segments.len() as u64,
        total_reserved_bytes: reserved,
        total_allocated_bytes: allocated,
        free_internal_bytes: f_int,
        free_external_bytes: f_ext,
        lines: vec![
            format!("segments: {}", segments.len()),
            format!("total_reserved: {}", memviz_bytes(reserved)),
            format!("total_allocated: {}", memviz_bytes(allocated)),
            format!("total_free: {}{suffix}", memviz_bytes(total_free)),
        ],
    }
}

/// `_memory_viz.py`'s `Bytes` formatter: scale by 1024 until < 1024, one decimal, no space
/// (`20.0MiB`, `512.0B`).
pub(crate) fn memviz_bytes(n: u64) -> String {
    let mut v = n as f64;
    for unit in ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "Zi"] {
        if v.abs() < 1024.0 {
            return format!("{v:.1}{unit}B");
        }
        v /= 1024.0;
    }
    format!("{v:.1}YiB")
}

#[cfg(test)]
mod tests {
    use super::*;
    use fragscope_snapshot::{Block, Segment};

    fn blk(address: u64, size: u64, req: u64, state: BlockState) -> Block {
        Block { address, size, requested_size: Some(req), state, stack: None, history: None }
    }

    fn seg(address: u64, blocks: Vec<Block>, ty: SegmentType) -> Segment {
        let total: u64 = blocks.iter().map(|b| b.size).sum();
        Segment {
            device: 0,
            address,
            total_size: total,
            allocated_size: 0,
            active_size: 0,
            requested_size: None,
            stream: 0,
            segment_type: ty,
            segment_pool_id: Some((0, 0)),
            is_expandable: Some(false),
            stack: None,
            blocks,
        }
    }

    #[test]
    fn memviz_sample_from_spec() {
        // One 20 MiB segment, one 11 MiB request in a 12 MiB block (spec §11.3 sample).
        let mib = 1u64 << 20;
        let s = seg(
            0,
            vec![
                blk(0, 12 * mib, 11 * mib, BlockState::ActiveAllocated),
                blk(12 * mib, 8 * mib, 0, BlockState::Inactive),
            ],
            SegmentType::Large,
        );
        let m = memviz_stats(std::slice::from_ref(&s));
        assert_eq!(m.lines[3], "total_free: 9.0MiB (11.1% internal)");
        assert_eq!(m.lines[1], "total_reserved: 20.0MiB");
        assert_eq!(memviz_bytes(512), "512.0B");
        assert_eq!(memviz_bytes(1536), "1.5KiB");
    }

    #[test]
    fn figures_and_fragmentation() {
        let mib = 1u64 << 20;
        let mut snap = Snapshot::default();
        snap.segments.push(seg(
            0,
            vec![
                blk(0, mib, mib - 100, BlockState::ActiveAllocated),
                blk(mib, 3 * mib, 5, BlockState::Inactive),
                blk(4 * mib, 2 * mib, 2 * mib, BlockState::ActivePendingFree),
                blk(6 * mib, 14 * mib, 0, BlockState::Inactive),
            ],
            SegmentType::Large,
        ));
        snap.segments.push(seg(
            1 << 30,
            vec![
                blk(1 << 30, 512, 500, BlockState::ActiveAllocated),
                blk((1 << 30) + 512, 2 * mib - 512, 0, BlockState::Inactive),
            ],
            SegmentType::Small,
        ));
        let mut t = vec![TraceEvent::new(Action::FreeCompleted, 77, 5), TraceEvent::new(Action::Alloc, 0, mib - 100)];
        t[1].time_us = 10;
        snap.device_traces.push(t);
        let s = summarize(&snap);
        let d = &s.devices[0];
        assert_eq!(d.all.reserved_bytes, 22 * mib);
        assert_eq!(d.all.allocated_bytes, mib + 512);
        assert_eq!(d.all.active_bytes, 3 * mib + 512);
        assert_eq!(d.all.requested_bytes, mib - 100 + 2 * mib + 500);
        assert_eq!(d.all.inactive_split_bytes, 17 * mib + 2 * mib - 512);
        assert_eq!(d.pools.small.segments, 1);
        assert_eq!(d.largest_free_block_bytes, 14 * mib);
        assert_eq!(d.fragmentation.internal_free_bytes, 112);
        assert_eq!(d.fragmentation.external_free_bytes, 19 * mib + 2 * mib - 512);
        // The small segment holds 512 live bytes of 2 MiB (< 10%); the large one 2 live
        // blocks holding 15% (≤ 2 blocks, ≤ 25%): both pinned.
        assert_eq!(d.fragmentation.pinned_segments, 2);
        assert_eq!(d.trace.frees_of_unknown_blocks, 1);
        assert_eq!(d.trace.live_blocks, 3);
        assert_eq!(d.trace.live_blocks_untraced, 2);
        assert_eq!(d.trace.history, History::BeganMidRun);
        assert_eq!(d.trace.first_time_us, Some(10));
    }
}
