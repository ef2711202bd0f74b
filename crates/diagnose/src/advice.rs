//! The advice users are given, replayed on their own run.
//!
//! * `torch.cuda.empty_cache()` at every training step's start ([`EmptyCacheAt::Steps`],
//!   steps as [`fragscope_trace::steps`] finds them from optimizer steps, backward passes or step
//!   annotations; never the repeats of a pass, which are its layers) or when a `record_function`
//!   scope starts or ends ([`EmptyCacheAt::Annotation`]): the recorded workload is
//!   replayed under the recorded settings with `empty_cache()` called there. The model's
//!   `empty_cache` is PyTorch's `release_cached_blocks` (spec §5.2): it releases only
//!   free blocks that are whole segments (a segment split between a live tensor and free
//!   space stays), and unmaps the free pages of expandable segments. PyTorch also does
//!   this itself before raising an OOM (spec §3.7: release, then retry), so calling it
//!   earlier rarely changes whether a request fits; what it changes is the layout the
//!   next step starts from, and the number of driver calls.
//! * `PYTORCH_NO_CUDA_MEMORY_CACHING=1` ([`simulate_uncached`]): every allocation is a
//!   `cudaMalloc` of the requested size and every free a `cudaFree`
//!   ([`fragscope_alloc::UncachedAllocator`]).
//!
//! Each returns a [`WhatIf`] with the driver calls and their estimated time
//! ([`fragscope_replay::cost`]), comparable with the configuration alternatives.

use std::collections::HashMap;

use fragscope_alloc::{AllocatorConfig, UncachedAllocator};
use fragscope_snapshot::{Action, Snapshot, NO_TIME};

use fragscope_replay::driver::verify_inner;
use fragscope_replay::state::{BState, RecordedState};
use fragscope_replay::whatif::{simulate_with, SimOom, SimOptions, StartState, WhatIf, UNLIMITED};
use fragscope_replay::ReplayOptions;

/// Where `empty_cache()` is inserted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EmptyCacheAt {
    /// Before the first entry of every training step ([`fragscope_trace::steps`]).
    Steps,
    /// When a `record_function` scope of this name starts (or ends, `at_end`). A name
    /// ending in `#N` matches every numbered instance (`ProfilerStep#N`).
    Annotation { name: String, at_end: bool },
    /// Right before these trace entries (`entry:421`): e.g. just before a failing request,
    /// to show that the release PyTorch makes itself before raising an OOM changes nothing.
    Entries(Vec<usize>),
}

impl EmptyCacheAt {
    /// `step` (or `steps`; `iteration`, `iterations` are the same), `NAME` (at each start of
    /// the scope), `NAME@end`.
    pub fn parse(s: &str) -> Result<Self, String> {
        let s = s.trim();
        if s.is_empty() {
            return Err("--empty-cache-at needs `step` or a record_function name".into());
        }
        if matches!(s, "step" | "steps" | "iteration" | "iterations") {
            return Ok(EmptyCacheAt::Steps);
        }
        if let Some(list) = s.strip_prefix("entry:") {
            let v: Result<Vec<usize>, _> = list.split(',').map(|x| x.trim().parse::<usize>()).collect();
            return v
                .map(EmptyCacheAt::Entries)
                .map_err(|_| format!("invalid --empty-cache-at '{s}': entry:N[,N...] takes trace entry indexes"));
        }
        match s.strip_suffix("@end") {
            Some(n) if !n.is_empty() => Ok(EmptyCacheAt::Annotation { name: n.to_string(), at_end: true }),
            _ => Ok(EmptyCacheAt::Annotation { name: s.trim_end_matches("@start").to_string(), at_end: false }),
        }
    }

    /// `empty_cache() at every step boundary`, `empty_cache() before each "eval"`.
    pub fn describe(&self) -> String {
        match self {
            EmptyCacheAt::Steps => "empty_cache() at every step boundary".into(),
            EmptyCacheAt::Annotation { name, at_end: false } => format!("empty_cache() before each \"{name}\""),
            EmptyCacheAt::Annotation { name, at_end: true } => format!("empty_cache() after each \"{name}\""),
            EmptyCacheAt::Entries(v) if v.len() == 1 => format!("empty_cache() before entry {}", v[0]),
            EmptyCacheAt::Entries(v) => format!("empty_cache() before {} chosen entries", v.len()),
        }
    }
}

fn scope_matches(pattern: &str, name: &str) -> bool {
    if pattern == name {
        return true;
    }
    // `ProfilerStep#N` matches `ProfilerStep#12`.
    match (pattern.strip_suffix("#N"), name.rfind('#')) {
        (Some(base), Some(p)) => {
            &name[..p] == base && name.len() > p + 1 && name[p + 1..].bytes().all(|b| b.is_ascii_digit())
        }
        _ => false,
    }
}

/// Trace indexes of `device` before which `empty_cache()` is called for `at`, with a
/// phrase saying how they were found; `Err` says why there are none.
pub fn empty_cache_points(snap: &Snapshot, device: i64, at: &EmptyCacheAt) -> Result<(Vec<usize>, String), String> {
    let trace = snap.trace(device);
    match at {
        EmptyCacheAt::Entries(v) => {
            let mut pts: Vec<usize> = v.iter().copied().filter(|&i| i <= trace.len()).collect();
            pts.sort_unstable();
            pts.dedup();
            if pts.is_empty() {
                return Err(format!("the trace has {} entries", trace.len()));
            }
            let n = pts.len();
            Ok((pts, format!("{n} chosen trace entr{}", if n == 1 { "y" } else { "ies" })))
        }
        EmptyCacheAt::Steps => {
            let st = fragscope_trace::steps::steps(snap, device);
            match st.steps.len() {
                0 => Err(format!(
                    "{}; mark the steps with fragscope.torch.phase(\"step\") or name a record_function scope",
                    st.describe()
                )),
                1 => Err(format!(
                    "only 1 training step in the trace ({}): there is no boundary between steps to call it at",
                    st.describe()
                )),
                _ => {
                    Ok((st.steps.iter().map(|s| s.start).collect(), format!("the start of each of {}", st.describe())))
                }
            }
        }
        EmptyCacheAt::Annotation { name, at_end } => {
            if trace.is_empty() {
                return Err("no trace".into());
            }
            if trace.iter().any(|e| e.time_us == NO_TIME) {
                return Err("the trace has no times, so annotations cannot be placed in it".into());
            }
            let stage = if *at_end { "END" } else { "START" };
            let times: Vec<i64> = snap
                .external_annotations
                .iter()
                .flatten()
                .filter(|a| (a.device == device || a.device < 0) && a.stage == stage && scope_matches(name, &a.name))
                .map(|a| a.time_us)
                .collect();
            if times.is_empty() {
                let mut known: Vec<&str> = snap
                    .external_annotations
                    .iter()
                    .flatten()
                    .filter(|a| a.device == device || a.device < 0)
                    .map(|a| a.name.as_str())
                    .collect();
                known.sort_unstable();
                known.dedup();
                known.truncate(12);
                return Err(if known.is_empty() {
                    "the snapshot has no record_function annotations (external_annotations, 2.5+)".into()
                } else {
                    format!("no annotation \"{name}\" on this device; names recorded: {}", known.join(", "))
                });
            }
            let mut pts: Vec<usize> = times.iter().map(|&t| trace.partition_point(|e| e.time_us < t)).collect();
            pts.sort_unstable();
            pts.dedup();
            let n = pts.len();
            Ok((pts, format!("{n} {} of \"{name}\"", if *at_end { "ends" } else { "starts" })))
        }
    }
}

/// The recorded workload of `device` under `cfg` with `empty_cache()` added at `at`.
pub fn simulate_empty_cache(
    snap: &Snapshot,
    device: i64,
    cfg: AllocatorConfig,
    capacity: Option<u64>,
    at: &EmptyCacheAt,
) -> Result<WhatIf, String> {
    let (points, how) = empty_cache_points(snap, device, at)?;
    let added = points.len();
    let mut w =
        simulate_with(snap, device, cfg, &SimOptions { capacity, empty_cache_at: points, ..Default::default() });
    w.advice = Some(at.describe());
    w.notes.insert(0, format!("{added} empty_cache() calls added: {how}"));
    w.advice_points = Some(how);
    Ok(w)
}

/// The recorded workload of `device` with `PYTORCH_NO_CUDA_MEMORY_CACHING=1` on a device
/// of `capacity` bytes (unlimited when `None`). Tensors alive before the trace (from the
/// backward walk) are held from the start without a counted `cudaMalloc`. A tensor's
/// memory goes back at `free_requested` (the deleter runs `cudaFree` at once; no stream
/// event defers it). A recorded `oom` request is tried (and released) like the caching
/// replays do. Peak "reserved" is the peak of the requested bytes held.
pub fn simulate_uncached(snap: &Snapshot, device: i64, capacity: Option<u64>) -> WhatIf {
    let trace = snap.trace(device);
    let (vrep, inferred) = verify_inner(snap, device, &ReplayOptions::default());
    let mut notes =
        vec!["driver page granularity not modelled: bytes held are the requests' sum (a lower bound)".into()];
    let mut a = UncachedAllocator::new(capacity.unwrap_or(UNLIMITED));
    // Recorded address → simulated address (None: its cudaMalloc failed).
    let mut map: HashMap<u64, Option<u64>> = HashMap::new();
    let start_state =
        adopt_start_state(inferred.initial.as_ref(), vrep.undecidable.as_deref(), &mut a, &mut map, &mut notes);
    let mut first_oom = None;
    let mut recorded_fit = 0;
    let before = a.in_use;
    let mut by_trace = 0u64;
    for (i, ev) in trace.iter().enumerate() {
        if ev.action == Action::Alloc {
            // Every allocation is a cudaMalloc here.
            by_trace = by_trace.max(a.in_use + ev.size);
        }
        match ev.action {
            Action::Alloc | Action::Oom => {
                let got = a.malloc(ev.size);
                if got.is_none() && first_oom.is_none() {
                    first_oom = Some(SimOom {
                        index: i,
                        requested: ev.size,
                        rounded: ev.size,
                        alloc_size: ev.size,
                        stream: snap.stream(ev),
                        reserved: a.in_use,
                        allocated: a.in_use,
                        stack: fragscope_replay::whatif::stack_strings(snap, ev.stack),
                    });
                }
                match (ev.action, got) {
                    (Action::Oom, Some(p)) => {
                        recorded_fit += 1;
                        a.free(p);
                    }
                    (Action::Alloc, g) => {
                        map.insert(ev.addr, g);
                    }
                    _ => {}
                }
            }
            Action::FreeRequested => {
                if let Some(Some(p)) = map.remove(&ev.addr) {
                    a.free(p);
                }
            }
            // Normally already freed at its `free_requested`; a completion with no request
            // in the trace frees here.
            Action::FreeCompleted => {
                if let Some(Some(p)) = map.remove(&ev.addr) {
                    a.free(p);
                }
            }
            _ => {}
        }
    }
    WhatIf {
        device,
        config: String::new(),
        capacity,
        peak_reserved: a.peak,
        peak_allocated: a.peak,
        peak_fragmentation: 0.0,
        reserved_before_trace: before,
        allocated_before_trace: before,
        peak_reserved_by_trace: by_trace,
        final_reserved: a.in_use,
        cuda_mallocs: a.cuda_mallocs,
        cuda_frees: a.cuda_frees,
        alloc_retries: 0,
        ooms: a.ooms,
        first_oom,
        recorded_ooms_that_fit: recorded_fit,
        empty_cache_calls: 0,
        start_state,
        advice: Some(NO_CACHING.into()),
        advice_points: None,
        empty_cache_added: 0,
        driver: fragscope_replay::cost::DriverWork::uncached(a.cuda_mallocs, a.cuda_frees),
        notes,
        probes: Vec::new(),
        snapshot: None,
    }
}

/// The start of the no-caching replay: the tensors alive at the first entry, held in `a`
/// from the start without a counted `cudaMalloc` (recorded address → simulated address in
/// `map`), when the backward walk rebuilt the state before the trace (`initial`); else a
/// note of why it is unknown (`undecidable`), and the replay starts empty.
fn adopt_start_state(
    initial: Option<&RecordedState>,
    undecidable: Option<&str>,
    a: &mut UncachedAllocator,
    map: &mut HashMap<u64, Option<u64>>,
    notes: &mut Vec<String>,
) -> StartState {
    match initial {
        Some(st) => {
            // Tensors alive at the first entry (a block pending its free_completed was
            // already handed back at its free_requested without caching).
            for b in st.segs.values().flat_map(|s| &s.blocks).filter(|b| b.state == BState::Allocated) {
                let sim = a.adopt(b.requested);
                map.insert(b.addr, Some(sim));
            }
            StartState::Rebuilt
        }
        None => {
            notes.push(format!(
                "the state before the trace is unknown ({}); started empty",
                undecidable.unwrap_or("no trace")
            ));
            StartState::Unknown
        }
    }
}

/// The label of the no-caching alternative.
pub const NO_CACHING: &str = "PYTORCH_NO_CUDA_MEMORY_CACHING=1";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn where_to_call_empty_cache() {
        assert_eq!(EmptyCacheAt::parse("iteration"), Ok(EmptyCacheAt::Steps));
        assert_eq!(EmptyCacheAt::parse("step"), Ok(EmptyCacheAt::Steps));
        assert_eq!(EmptyCacheAt::parse("eval@end"), Ok(EmptyCacheAt::Annotation { name: "eval".into(), at_end: true }));
        assert_eq!(
            EmptyCacheAt::parse("ProfilerStep#N"),
            Ok(EmptyCacheAt::Annotation { name: "ProfilerStep#N".into(), at_end: false })
        );
        assert_eq!(EmptyCacheAt::parse("entry:3,1"), Ok(EmptyCacheAt::Entries(vec![3, 1])));
        assert!(EmptyCacheAt::parse("entry:x").is_err());
        assert!(EmptyCacheAt::parse(" ").is_err());
        assert!(scope_matches("ProfilerStep#N", "ProfilerStep#12"));
        assert!(!scope_matches("ProfilerStep#N", "ProfilerStep#"));
        assert!(!scope_matches("ProfilerStep#N", "Other#3"));
        assert!(scope_matches("forward", "forward"));
    }
}
