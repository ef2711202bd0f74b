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
//! ([`fragscope_replay::DriverWork`]), comparable with the configuration alternatives.

use std::collections::HashMap;

use fragscope_alloc::{AllocatorConfig, UncachedAllocator};
use fragscope_snapshot::{Action, Snapshot, NO_TIME};

use fragscope_replay::{simulate_with, BState, Param, Seeded, SimOom, SimOptions, StartState, WhatIf, UNLIMITED};

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
    pub fn parse(s: &str) -> Result<Self, EmptyCacheAtError> {
        let s = s.trim();
        if s.is_empty() {
            return Err(EmptyCacheAtError::Empty { param: Param::EmptyCacheAt });
        }
        if matches!(s, "step" | "steps" | "iteration" | "iterations") {
            return Ok(EmptyCacheAt::Steps);
        }
        if let Some(list) = s.strip_prefix("entry:") {
            let v: Result<Vec<usize>, _> = list.split(',').map(|x| x.trim().parse::<usize>()).collect();
            return v
                .map(EmptyCacheAt::Entries)
                .map_err(|_| EmptyCacheAtError::BadEntries { param: Param::EmptyCacheAt, text: s.to_string() });
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

/// A `--empty-cache-at` that [`EmptyCacheAt::parse`] does not take. The messages name the
/// command-line flag ([`Param::cli_flag`]); `param` lets a front end say it its own way.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EmptyCacheAtError {
    /// Nothing given.
    Empty { param: Param },
    /// `entry:` followed by something other than entry indexes (the text as given).
    BadEntries { param: Param, text: String },
}

impl std::fmt::Display for EmptyCacheAtError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EmptyCacheAtError::Empty { param } => {
                write!(f, "{} needs `step` or a record_function name", param.cli_flag())
            }
            EmptyCacheAtError::BadEntries { param, text } => {
                write!(f, "invalid {} '{text}': entry:N[,N...] takes trace entry indexes", param.cli_flag())
            }
        }
    }
}

impl std::error::Error for EmptyCacheAtError {}

/// Why [`empty_cache_points`] finds no place in a device's trace to call `empty_cache()`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NoEmptyCachePoint {
    /// Every chosen entry is past the end of the trace (`entries` long).
    EntriesPastTheEnd { entries: usize },
    /// No training step found (`steps`: [`fragscope_trace::Steps::describe`]).
    NoStep { steps: String },
    /// One training step: no boundary between steps.
    OneStep { steps: String },
    /// The device has no trace.
    NoTrace,
    /// The trace records no times, and annotations are placed by time.
    NoTimes,
    /// The snapshot has no `record_function` annotations at all.
    NoAnnotations,
    /// No annotation of this name on the device; the names it has (at most 12, sorted).
    NoSuchAnnotation { name: String, recorded: Vec<String> },
}

impl std::fmt::Display for NoEmptyCachePoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NoEmptyCachePoint::EntriesPastTheEnd { entries } => write!(f, "the trace has {entries} entries"),
            NoEmptyCachePoint::NoStep { steps } => write!(
                f,
                "{steps}; mark the steps with fragscope.torch.phase(\"step\") or name a record_function scope"
            ),
            NoEmptyCachePoint::OneStep { steps } => write!(
                f,
                "only 1 training step in the trace ({steps}): there is no boundary between steps to call it at"
            ),
            NoEmptyCachePoint::NoTrace => f.write_str("no trace"),
            NoEmptyCachePoint::NoTimes => f.write_str("the trace has no times, so annotations cannot be placed in it"),
            NoEmptyCachePoint::NoAnnotations => {
                f.write_str("the snapshot has no record_function annotations (external_annotations, 2.5+)")
            }
            NoEmptyCachePoint::NoSuchAnnotation { name, recorded } => {
                write!(f, "no annotation \"{name}\" on this device; names recorded: {}", recorded.join(", "))
            }
        }
    }
}

impl std::error::Error for NoEmptyCachePoint {}

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
pub fn empty_cache_points(
    snap: &Snapshot,
    device: i64,
    at: &EmptyCacheAt,
) -> Result<(Vec<usize>, String), NoEmptyCachePoint> {
    let trace = snap.trace(device);
    match at {
        EmptyCacheAt::Entries(v) => {
            let mut pts: Vec<usize> = v.iter().copied().filter(|&i| i <= trace.len()).collect();
            pts.sort_unstable();
            pts.dedup();
            if pts.is_empty() {
                return Err(NoEmptyCachePoint::EntriesPastTheEnd { entries: trace.len() });
            }
            let n = pts.len();
            Ok((pts, format!("{n} chosen trace entr{}", if n == 1 { "y" } else { "ies" })))
        }
        EmptyCacheAt::Steps => {
            let st = fragscope_trace::steps(snap, device);
            match st.steps.len() {
                0 => Err(NoEmptyCachePoint::NoStep { steps: st.describe() }),
                1 => Err(NoEmptyCachePoint::OneStep { steps: st.describe() }),
                _ => {
                    Ok((st.steps.iter().map(|s| s.start).collect(), format!("the start of each of {}", st.describe())))
                }
            }
        }
        EmptyCacheAt::Annotation { name, at_end } => {
            if trace.is_empty() {
                return Err(NoEmptyCachePoint::NoTrace);
            }
            if trace.iter().any(|e| e.time_us == NO_TIME) {
                return Err(NoEmptyCachePoint::NoTimes);
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
                    NoEmptyCachePoint::NoAnnotations
                } else {
                    NoEmptyCachePoint::NoSuchAnnotation {
                        name: name.clone(),
                        recorded: known.into_iter().map(str::to_string).collect(),
                    }
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
) -> Result<WhatIf, NoEmptyCachePoint> {
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
    let seeded = Seeded::rebuild(snap, device);
    let mut notes =
        vec!["driver page granularity not modelled: bytes held are the requests' sum (a lower bound)".into()];
    let mut a = UncachedAllocator::new(capacity.unwrap_or(UNLIMITED));
    // Recorded address → simulated address (None: its cudaMalloc failed).
    let mut map: HashMap<u64, Option<u64>> = HashMap::new();
    let start_state = adopt_start_state(&seeded, &mut a, &mut map, &mut notes);
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
                        stack: fragscope_replay::stack_strings(snap, ev.stack),
                        carried_cache: None,
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
        // Without a cache nothing is held but the live tensors.
        at_first_request: (before, before),
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
        driver: fragscope_replay::DriverWork::uncached(a.cuda_mallocs, a.cuda_frees),
        notes,
        probes: Vec::new(),
        snapshot: None,
    }
}

/// The start of the no-caching replay: the tensors alive at the first entry, held in `a`
/// from the start without a counted `cudaMalloc` (recorded address → simulated address in
/// `map`), when the backward walk rebuilt the state before the trace (`seeded`); else a
/// note of why it is unknown, and the replay starts empty.
fn adopt_start_state(
    seeded: &Seeded,
    a: &mut UncachedAllocator,
    map: &mut HashMap<u64, Option<u64>>,
    notes: &mut Vec<String>,
) -> StartState {
    match seeded.unknown_reason() {
        None => {
            // Tensors alive at the first entry (a block pending its free_completed was
            // already handed back at its free_requested without caching).
            for b in seeded.live_blocks().filter(|b| b.state == BState::Allocated) {
                let sim = a.adopt(b.requested);
                map.insert(b.addr, Some(sim));
            }
            StartState::Rebuilt
        }
        Some(why) => {
            notes.push(format!("the state before the trace is unknown ({why}); started empty"));
            StartState::Unknown
        }
    }
}

/// The label of the no-caching alternative.
pub(crate) const NO_CACHING: &str = "PYTORCH_NO_CUDA_MEMORY_CACHING=1";

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
        let bad = EmptyCacheAt::parse("entry:x").unwrap_err();
        assert_eq!(bad, EmptyCacheAtError::BadEntries { param: Param::EmptyCacheAt, text: "entry:x".into() });
        assert_eq!(bad.to_string(), "invalid --empty-cache-at 'entry:x': entry:N[,N...] takes trace entry indexes");
        let empty = EmptyCacheAt::parse(" ").unwrap_err();
        assert_eq!(empty.to_string(), "--empty-cache-at needs `step` or a record_function name");
        assert!(scope_matches("ProfilerStep#N", "ProfilerStep#12"));
        assert!(!scope_matches("ProfilerStep#N", "ProfilerStep#"));
        assert!(!scope_matches("ProfilerStep#N", "Other#3"));
        assert!(scope_matches("forward", "forward"));
    }
}
