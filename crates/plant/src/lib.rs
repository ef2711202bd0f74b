//! Planting leaks into real snapshots, to test leak detection on traces nobody tuned it
//! to (and to let a person check the detector on their own files:
//! `fragscope plant-leak`).
//!
//! A leak is planted by dropping the frees (`free_requested` / `free_completed`) of
//! chosen `alloc` entries of one device's trace, so that those blocks stay allocated to
//! the end. The rest of the file is kept consistent, as if the allocator had served
//! each leaked block from a segment of its own:
//! * each leaked `alloc` is moved to a fresh address above everything the file uses,
//!   preceded by a `segment_alloc` of the size PyTorch would ask CUDA for
//!   (`get_allocation_size`: 2 MiB for the small pool, 20 MiB below 10 MiB, else the
//!   block rounded up to 2 MiB), on the same stream and pool;
//! * the final state gets those segments, each with the leaked block
//!   (`active_allocated`, its allocation stack) and the rest of the segment free.
//!
//! Moving the block (rather than leaving it where it was) keeps every later `alloc` that
//! reused the old address valid, so the backward walk of `replay --verify` and the
//! timeline's consistency checks accept the planted file: the walk seeds nothing new,
//! and `summary`'s allocated bytes equal the trace's. The model will of course not
//! reproduce the recording's later addresses exactly: a real leak would have changed
//! the allocator's choices, which no planting can know.
//!
//! Which allocs to leak: [`site_allocs`] lists the freed allocs of each call site (the
//! site as [`fragscope_trace::site_of`] names it), [`Shape`] picks some of them (all,
//! those in windows of the run, a burst of consecutive ones, every n-th), and
//! [`strip_python_frames`] makes a site's stacks C++-only (a leak in an extension whose
//! stacks were recorded without Python frames).

use fragscope_alloc::rounding::{allocation_size, is_small, round_size};
use fragscope_snapshot::{Action, Block, BlockState, FxHashMap, Segment, SegmentType, Snapshot, TraceEvent};

use fragscope_replay::recorded_config;
use fragscope_trace::site_of;

/// What was planted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Planted {
    pub device: i64,
    /// Trace indices (in the original trace) of the allocs whose frees were dropped.
    pub allocs: Vec<usize>,
    /// Their block bytes (rounded requests).
    pub bytes: u64,
    /// Sites of the leaked blocks, sorted, deduplicated.
    pub sites: Vec<String>,
}

/// The freed allocs of one call site.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SiteAllocs {
    pub site: String,
    /// Trace indices of its allocs that the trace frees (ascending).
    pub freed: Vec<usize>,
    /// All its allocs in the trace.
    pub allocs: usize,
    /// Bytes of the freed allocs (rounded requests).
    pub freed_bytes: u64,
    /// Smallest and largest request.
    pub min_request: u64,
    pub max_request: u64,
}

/// For each alloc index of the trace, whether the trace frees it later.
fn freed_flags(trace: &[TraceEvent]) -> Vec<bool> {
    let mut open: FxHashMap<u64, usize> = FxHashMap::default();
    let mut freed = vec![false; trace.len()];
    for (i, e) in trace.iter().enumerate() {
        match e.action {
            Action::Alloc => {
                open.insert(e.addr, i);
            }
            Action::FreeRequested | Action::FreeCompleted => {
                if let Some(j) = open.remove(&e.addr) {
                    freed[j] = true;
                }
            }
            _ => {}
        }
    }
    freed
}

/// Every call site of `device`'s allocs, most freed allocs first.
pub fn site_allocs(snap: &Snapshot, device: i64) -> Vec<SiteAllocs> {
    let trace = snap.trace(device);
    let cfg = recorded_config(snap);
    let freed = freed_flags(trace);
    let mut by: FxHashMap<String, SiteAllocs> = FxHashMap::default();
    let mut names: FxHashMap<Option<fragscope_snapshot::StackId>, String> = FxHashMap::default();
    for (i, e) in trace.iter().enumerate().filter(|(_, e)| e.action == Action::Alloc) {
        let site = names.entry(e.stack).or_insert_with(|| site_of(&snap.frames, e.stack).site).clone();
        let s = by.entry(site.clone()).or_insert(SiteAllocs {
            site,
            freed: Vec::new(),
            allocs: 0,
            freed_bytes: 0,
            min_request: u64::MAX,
            max_request: 0,
        });
        s.allocs += 1;
        s.min_request = s.min_request.min(e.size);
        s.max_request = s.max_request.max(e.size);
        if freed[i] {
            s.freed.push(i);
            s.freed_bytes += round_size(e.size, &cfg);
        }
    }
    let mut v: Vec<SiteAllocs> = by.into_values().collect();
    v.sort_by(|a, b| b.freed.len().cmp(&a.freed.len()).then_with(|| a.site.cmp(&b.site)));
    v
}

/// Which of a site's freed allocs to leak. Positions are shares of the trace (0–1 of
/// its entries), so one shape applies to traces of any length.
#[derive(Clone, Debug, PartialEq)]
pub enum Shape {
    /// Every one.
    All,
    /// Those whose `alloc` lies in one of these `[from, to)` windows: one window is a
    /// leak confined to a phase of the run, several are growth in some iterations only.
    Windows(Vec<(f64, f64)>),
    /// `count` consecutive allocs starting at the first one at or after `at`: a burst
    /// of blocks never released.
    Burst { at: f64, count: usize },
    /// Every `n`-th (n ≥ 1): a slow leak of a share of what the site allocates.
    Stride(usize),
}

/// A shape [`Shape::parse`] does not take (the text as given).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShapeError(pub String);

impl std::fmt::Display for ShapeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "bad shape `{}` (all, window:0.2-0.5[,0.7-0.8], burst:0.4:16, stride:3)", self.0)
    }
}

impl std::error::Error for ShapeError {}

/// Why [`plant`] planted nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PlantError {
    /// A negative device index.
    NoDevice(i64),
    /// The device has no trace.
    NoTrace(i64),
    /// None of the chosen allocs is freed in the trace.
    NothingToPlant,
}

impl std::fmt::Display for PlantError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PlantError::NoDevice(d) => write!(f, "no device {d}"),
            PlantError::NoTrace(d) => write!(f, "device {d} has no trace to plant a leak into"),
            PlantError::NothingToPlant => {
                f.write_str("none of the chosen allocs is freed in the trace: nothing to plant")
            }
        }
    }
}

impl std::error::Error for PlantError {}

impl Shape {
    /// Parses `all`, `window:A-B[,C-D...]`, `burst:AT:COUNT`, `stride:N`.
    pub fn parse(s: &str) -> Result<Shape, ShapeError> {
        let bad = || ShapeError(s.to_string());
        let share = |x: &str| x.trim().parse::<f64>().ok().filter(|v| (0.0..=1.0).contains(v)).ok_or_else(bad);
        if s == "all" {
            return Ok(Shape::All);
        }
        if let Some(w) = s.strip_prefix("window:") {
            let mut v = Vec::new();
            for part in w.split(',') {
                let (a, b) = part.split_once('-').ok_or_else(bad)?;
                let (a, b) = (share(a)?, share(b)?);
                if a >= b {
                    return Err(bad());
                }
                v.push((a, b));
            }
            return Ok(Shape::Windows(v));
        }
        if let Some(b) = s.strip_prefix("burst:") {
            let (at, n) = b.split_once(':').ok_or_else(bad)?;
            let count = n.parse::<usize>().ok().filter(|&n| n > 0).ok_or_else(bad)?;
            return Ok(Shape::Burst { at: share(at)?, count });
        }
        if let Some(n) = s.strip_prefix("stride:") {
            return Ok(Shape::Stride(n.parse::<usize>().ok().filter(|&n| n > 0).ok_or_else(bad)?));
        }
        Err(bad())
    }

    /// The allocs (trace indices, ascending) of `freed` this shape picks in a trace of
    /// `len` entries.
    pub fn pick(&self, freed: &[usize], len: usize) -> Vec<usize> {
        let pos = |i: usize| i as f64 / len.max(1) as f64;
        match self {
            Shape::All => freed.to_vec(),
            Shape::Windows(w) => {
                freed.iter().copied().filter(|&i| w.iter().any(|&(a, b)| pos(i) >= a && pos(i) < b)).collect()
            }
            Shape::Burst { at, count } => {
                let start = freed.partition_point(|&i| pos(i) < *at);
                freed[start..(start + count).min(freed.len())].to_vec()
            }
            Shape::Stride(n) => freed.iter().copied().step_by(*n).collect(),
        }
    }
}

/// Gives every `alloc` of `site` on `device` (freed or not) a stack of its C++ frames
/// only (frames whose file is not a `.py`), as a recording made from an extension or
/// the autograd engine's thread has. Returns how many allocs changed; 0 when the
/// site's stacks have no C++ frame (the site would become `<no stack>`), and then
/// nothing is changed.
pub fn strip_python_frames(snap: &mut Snapshot, device: i64, site: &str) -> usize {
    let Ok(d) = usize::try_from(device) else { return 0 };
    if d >= snap.device_traces.len() {
        return 0;
    }
    let mut new_stack: FxHashMap<fragscope_snapshot::StackId, Option<fragscope_snapshot::StackId>> =
        FxHashMap::default();
    let mut changes: Vec<(usize, fragscope_snapshot::StackId)> = Vec::new();
    for (i, e) in snap.device_traces[d].iter().enumerate() {
        let Some(st) = e.stack.filter(|_| e.action == Action::Alloc) else { continue };
        let cpp = match new_stack.get(&st) {
            Some(c) => *c,
            None => {
                let c = if site_of(&snap.frames, Some(st)).site == site {
                    let frames: Vec<_> = snap
                        .frames
                        .stack(st)
                        .iter()
                        .copied()
                        .filter(|&f| {
                            !snap.frames.str(snap.frames.frame(f).filename).to_ascii_lowercase().ends_with(".py")
                        })
                        .collect();
                    (!frames.is_empty()).then(|| snap.frames.intern_stack(&frames))
                } else {
                    None
                };
                new_stack.insert(st, c);
                c
            }
        };
        if let Some(c) = cpp {
            changes.push((i, c));
        }
    }
    for &(i, c) in &changes {
        snap.device_traces[d][i].stack = Some(c);
    }
    changes.len()
}

/// Drops the frees of the chosen allocs (trace indices of `device`; allocs the trace
/// never frees are ignored) and keeps the file consistent (module doc). Errors when
/// the device has no trace or nothing was planted.
pub fn plant(snap: &Snapshot, device: i64, allocs: &[usize]) -> Result<(Snapshot, Planted), PlantError> {
    let d = usize::try_from(device).map_err(|_| PlantError::NoDevice(device))?;
    let trace = snap.trace(device);
    if trace.is_empty() {
        return Err(PlantError::NoTrace(device));
    }
    let cfg = recorded_config(snap);
    let freed = freed_flags(trace);
    let mut chosen = vec![false; trace.len()];
    for &i in allocs {
        if i < trace.len() && trace[i].action == Action::Alloc && freed[i] {
            chosen[i] = true;
        }
    }
    // Fresh addresses above everything the file (any device) uses, 1 GiB aligned.
    let top = snap
        .segments
        .iter()
        .map(|s| s.address + s.total_size)
        .chain(snap.device_traces.iter().flatten().map(|e| e.addr.saturating_add(e.size)))
        .max()
        .unwrap_or(0);
    const GIB: u64 = 1 << 30;
    let mut next = (top / GIB + 2) * GIB;
    let pooled = snap.segments.iter().any(|s| s.segment_pool_id.is_some());
    let expandable_known = snap.segments.iter().any(|s| s.is_expandable.is_some());
    // Original address → a free of a leaked block is still to be dropped there.
    let mut drop_free: FxHashMap<u64, ()> = FxHashMap::default();
    let mut out: Vec<TraceEvent> = Vec::with_capacity(trace.len() + 2 * allocs.len());
    let mut segments: Vec<Segment> = Vec::new();
    let mut planted = Planted { device, ..Planted::default() };
    for (i, e) in trace.iter().enumerate() {
        match e.action {
            Action::Alloc if chosen[i] => {
                let size = round_size(e.size, &cfg);
                let seg_size = allocation_size(size, &cfg);
                let addr = next;
                next += seg_size.div_ceil(GIB).max(1) * GIB;
                drop_free.insert(e.addr, ());
                let mut seg_ev = *e;
                seg_ev.action = Action::SegmentAlloc;
                seg_ev.addr = addr;
                seg_ev.size = seg_size;
                out.push(seg_ev);
                let mut a = *e;
                a.addr = addr;
                out.push(a);
                let mut blocks = vec![Block {
                    address: addr,
                    size,
                    requested_size: Some(e.size),
                    state: BlockState::ActiveAllocated,
                    stack: e.stack,
                    history: None,
                }];
                if seg_size > size {
                    blocks.push(Block {
                        address: addr + size,
                        size: seg_size - size,
                        requested_size: Some(0),
                        state: BlockState::Inactive,
                        stack: None,
                        history: None,
                    });
                }
                segments.push(Segment {
                    device,
                    address: addr,
                    total_size: seg_size,
                    allocated_size: size,
                    active_size: size,
                    requested_size: Some(e.size),
                    stream: snap.stream(e),
                    segment_type: if is_small(size) { SegmentType::Small } else { SegmentType::Large },
                    segment_pool_id: snap.pool_id(e).or(pooled.then_some((0, 0))),
                    is_expandable: expandable_known.then_some(false),
                    stack: e.stack,
                    blocks,
                });
                planted.allocs.push(i);
                planted.bytes += size;
                planted.sites.push(site_of(&snap.frames, e.stack).site);
                continue;
            }
            Action::FreeRequested if drop_free.contains_key(&e.addr) => continue,
            Action::FreeCompleted if drop_free.remove(&e.addr).is_some() => continue,
            _ => {}
        }
        out.push(*e);
    }
    if planted.allocs.is_empty() {
        return Err(PlantError::NothingToPlant);
    }
    planted.sites.sort();
    planted.sites.dedup();
    let mut s = snap.clone();
    s.device_traces[d] = out;
    // Keep the segments grouped by device, sorted by address within the device.
    let at = s.segments.iter().rposition(|x| x.device == device).map_or(s.segments.len(), |p| p + 1);
    s.segments.splice(at..at, segments);
    Ok((s, planted))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_parse_and_pick() {
        let freed: Vec<usize> = (0..100).step_by(10).collect();
        assert_eq!(Shape::parse("all").unwrap().pick(&freed, 100).len(), 10);
        assert_eq!(Shape::parse("window:0.2-0.4,0.8-1").unwrap().pick(&freed, 100), vec![20, 30, 80, 90]);
        assert_eq!(Shape::parse("burst:0.35:3").unwrap().pick(&freed, 100), vec![40, 50, 60]);
        assert_eq!(Shape::parse("stride:4").unwrap().pick(&freed, 100), vec![0, 40, 80]);
        for bad in ["", "window:0.5-0.2", "burst:2:1", "stride:0", "window:x-1"] {
            assert!(Shape::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn planting_moves_the_block_and_drops_its_frees() {
        let mut snap = Snapshot::default();
        let mib = 1u64 << 20;
        snap.device_traces.push(vec![
            TraceEvent::new(Action::SegmentAlloc, 0, 20 * mib),
            TraceEvent::new(Action::Alloc, 0, 4 * mib),
            TraceEvent::new(Action::FreeRequested, 0, 4 * mib),
            TraceEvent::new(Action::FreeCompleted, 0, 4 * mib),
            TraceEvent::new(Action::Alloc, 0, 4 * mib),
            TraceEvent::new(Action::FreeRequested, 0, 4 * mib),
            TraceEvent::new(Action::FreeCompleted, 0, 4 * mib),
        ]);
        let (p, what) = plant(&snap, 0, &[1]).unwrap();
        assert_eq!(what.allocs, vec![1]);
        assert_eq!(what.bytes, 4 * mib);
        let t = &p.device_traces[0];
        assert_eq!(t.len(), 6);
        assert_eq!(t[1].action, Action::SegmentAlloc);
        assert_eq!((t[2].action, t[2].addr), (Action::Alloc, t[1].addr));
        assert_eq!(t[1].size, 20 * mib);
        // The second alloc at 0 and its frees are untouched.
        assert_eq!(t[3..].iter().map(|e| e.addr).collect::<Vec<_>>(), vec![0, 0, 0]);
        assert_eq!(p.segments.len(), 1);
        assert_eq!(p.segments[0].blocks[0].state, BlockState::ActiveAllocated);
        assert_eq!(p.segments[0].blocks[1].size, 16 * mib);
        let tl = fragscope_trace::timeline(&p, 0, &Default::default());
        assert_eq!(tl.seeded.inconsistencies, 0);
        assert_eq!(tl.end.allocated, 4 * mib);
        assert!(plant(&snap, 0, &[0, 2]).is_err(), "not allocs: nothing planted");
    }
}
