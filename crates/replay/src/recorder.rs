//! Records a workload run through the allocator model as a memory snapshot.
//!
//! Why: fragscope ships examples and test inputs made by its own code, never copies of
//! other people's recordings. Driving the faithful allocator model with a scripted
//! workload and keeping what PyTorch would have kept (the trace, stacks, annotations,
//! the final segments) gives a snapshot that every command can read, and that PyTorch's
//! own tools can open once written with the snapshot writer.

use std::collections::HashMap;

use fragscope_alloc::{
    AllocatorConfig, BlockState as EBlockState, CachingAllocator, DeviceMemory, Event, FreeError, Oom, SimulatedDevice,
};
use fragscope_snapshot::{
    intern_context, Action, Annotation, Block, BlockState, EntryContext, PyObj, Segment, SegmentType, Snapshot,
    StackId, TraceEvent,
};

/// A simulated device whose allocator calls are recorded like
/// `torch.cuda.memory._record_memory_history(context="alloc")` records them.
pub struct Recorder {
    eng: CachingAllocator<SimulatedDevice>,
    snap: Snapshot,
    conf: String,
    time_us: i64,
    tick_us: i64,
    /// Stack of the allocation that owns each live block (by address).
    block_stacks: HashMap<u64, StackId>,
    /// Stack of the malloc that created each segment (by base address).
    segment_stacks: HashMap<u64, StackId>,
    events: Vec<Event>,
    /// The stack the next free entries carry ([`Recorder::free_at`]).
    free_stack: Option<StackId>,
}

impl Recorder {
    /// `conf` is a `PYTORCH_CUDA_ALLOC_CONF` string (validated like PyTorch does);
    /// `capacity` the device's memory in bytes. Time starts at `start_us` and advances
    /// by `tick_us` per recorded event.
    pub fn new(conf: &str, capacity: u64, start_us: i64, tick_us: i64) -> Result<Self, fragscope_alloc::ConfigError> {
        let cfg: AllocatorConfig = fragscope_alloc::parse_config(conf)?;
        let eng = CachingAllocator::new(cfg, SimulatedDevice::synthetic(capacity));
        let mut snap = Snapshot::default();
        snap.device_traces.push(Vec::new());
        snap.external_annotations = Some(Vec::new());
        Ok(Recorder {
            eng,
            snap,
            conf: conf.to_string(),
            time_us: start_us,
            tick_us,
            block_stacks: HashMap::new(),
            segment_stacks: HashMap::new(),
            events: Vec::new(),
            free_stack: None,
        })
    }

    /// Interns a stack given outermost frame first, as a traceback reads
    /// (PyTorch stores innermost first).
    pub fn stack(&mut self, frames: &[(&str, i64, &str)]) -> StackId {
        let innermost_first: Vec<_> = frames.iter().rev().copied().collect();
        self.snap.frames.intern_py_stack(&innermost_first)
    }

    fn record(&mut self, stack: Option<StackId>) {
        self.eng.drain_events_into(&mut self.events);
        for ev in self.events.drain(..) {
            let mut te = trace_event(&ev, &mut self.snap.contexts);
            let (action, addr) = (te.action, te.addr);
            te.time_us = self.time_us;
            self.time_us += self.tick_us;
            // context="alloc": frees carry the stack of the allocation they free.
            te.stack = match action {
                Action::FreeRequested | Action::FreeCompleted => {
                    self.free_stack.or_else(|| self.block_stacks.get(&addr).copied())
                }
                Action::SegmentFree | Action::SegmentUnmap => self.segment_stacks.get(&addr).copied(),
                _ => stack,
            };
            match action {
                Action::SegmentAlloc | Action::SegmentMap => {
                    if let Some(s) = stack {
                        self.segment_stacks.insert(addr, s);
                    }
                }
                Action::SegmentFree => {
                    self.segment_stacks.remove(&addr);
                }
                Action::FreeCompleted => {
                    self.block_stacks.remove(&addr);
                }
                _ => {}
            }
            self.snap.device_traces[0].push(te);
        }
    }

    /// `torch.empty(n)` on `stream`, allocated at `stack`.
    pub fn malloc(&mut self, n: u64, stream: u64, stack: StackId) -> Result<u64, Oom> {
        let r = self.eng.malloc(n, stream);
        self.record(Some(stack));
        if let Ok(addr) = r {
            self.block_stacks.insert(addr, stack);
        }
        r
    }

    /// The tensor at `addr` is freed.
    pub fn free(&mut self, addr: u64) -> Result<(), FreeError> {
        let r = self.eng.free(addr);
        self.record(None);
        r
    }

    /// The tensor at `addr` is freed at `stack`, as `_record_memory_history(context="all")`
    /// records it (the free entries carry the stack of the free, not of the allocation).
    pub fn free_at(&mut self, addr: u64, stack: StackId) -> Result<(), FreeError> {
        let r = self.eng.free(addr);
        self.free_stack = Some(stack);
        self.record(None);
        self.free_stack = None;
        r
    }

    /// `torch.cuda.empty_cache()`.
    pub fn empty_cache(&mut self) {
        self.eng.empty_cache();
        self.record(None);
    }

    /// A `record_function` scope boundary (`stage` is "START" or "END").
    pub fn annotate(&mut self, name: &str, stage: &str) {
        let a = Annotation { device: 0, time_us: self.time_us, name: name.into(), stage: stage.into(), extra: vec![] };
        self.time_us += self.tick_us;
        self.snap.external_annotations.as_mut().unwrap().push(a);
    }

    /// Forget the trace recorded so far, as when `_record_memory_history` is turned on
    /// mid-run (or its ring buffer of `max_entries` has dropped the oldest entries):
    /// the snapshot's trace begins here, with the allocator's state at this point
    /// (blocks alive, cached blocks) known only from the final `segments` and the
    /// entries that follow.
    pub fn begin_trace_here(&mut self) {
        self.snap.device_traces[0].clear();
    }

    /// [`Recorder::begin_trace_here`] for `_record_memory_history` turned on only now
    /// (after a warm-up step): the blocks and segments made before it were allocated
    /// without a stack, so the final `segments` show them, and the trace their frees,
    /// without frames.
    pub fn begin_recording_here(&mut self) {
        self.begin_trace_here();
        self.block_stacks.clear();
        self.segment_stacks.clear();
    }

    /// The engine, for stats.
    pub fn allocator(&self) -> &CachingAllocator<SimulatedDevice> {
        &self.eng
    }

    /// The snapshot PyTorch would dump now: final segments with the stacks of their
    /// live blocks, the trace, annotations and `allocator_settings`.
    pub fn finish(mut self) -> Snapshot {
        let cfg = self.eng.config().clone();
        let (blocks, segs) = (&self.block_stacks, &self.segment_stacks);
        self.snap.segments = segments_of(&self.eng, 0, |a| blocks.get(&a).copied(), |a| segs.get(&a).copied());
        self.snap.allocator_settings = Some(allocator_settings(&cfg, &self.conf));
        self.snap
    }
}

/// An allocator event as PyTorch writes it to the trace (`oom` puts `device_free` where
/// other entries have the address); its stream is interned in `contexts`, the table of the
/// snapshot the entry goes into ([`Snapshot::contexts`]).
pub(crate) fn trace_event(ev: &Event, contexts: &mut Vec<EntryContext>) -> TraceEvent {
    trace_event_in_pool(ev, None, contexts)
}

/// [`trace_event`] with the entry's `pool_id` (`None`: the key absent, as for a run
/// without private pools).
pub(crate) fn trace_event_in_pool(
    ev: &Event,
    pool: Option<fragscope_alloc::PoolId>,
    contexts: &mut Vec<EntryContext>,
) -> TraceEvent {
    let (action, addr, size, stream) = match *ev {
        Event::Alloc { addr, size, stream } => (Action::Alloc, addr, size, stream),
        Event::FreeRequested { addr, size, stream } => (Action::FreeRequested, addr, size, stream),
        Event::FreeCompleted { addr, size, stream } => (Action::FreeCompleted, addr, size, stream),
        Event::SegmentAlloc { addr, size, stream } => (Action::SegmentAlloc, addr, size, stream),
        Event::SegmentFree { addr, size, stream } => (Action::SegmentFree, addr, size, stream),
        Event::SegmentMap { addr, size, stream } => (Action::SegmentMap, addr, size, stream),
        Event::SegmentUnmap { addr, size, stream } => (Action::SegmentUnmap, addr, size, stream),
        Event::Oom { size, device_free, stream } => (Action::Oom, device_free, size, stream),
    };
    let mut te = TraceEvent::new(action, addr, size);
    // Past 16,777,215 distinct contexts (never, for a model's few streams) stream 0.
    te.context =
        intern_context(contexts, EntryContext { stream, pool_id: pool, ..EntryContext::default() }).unwrap_or_default();
    te
}

/// The allocator's state as a snapshot's `segments` for `device`. `block_stack` gives the
/// allocation stack of a live block and `segment_stack` the stack of the malloc that made
/// a segment, where known (inactive blocks never carry frames, as in real snapshots).
pub(crate) fn segments_of<D: DeviceMemory>(
    eng: &CachingAllocator<D>,
    device: i64,
    block_stack: impl Fn(u64) -> Option<StackId>,
    segment_stack: impl Fn(u64) -> Option<StackId>,
) -> Vec<Segment> {
    eng.segments()
        .into_iter()
        .map(|s| {
            let blocks: Vec<Block> = s
                .blocks
                .iter()
                .map(|b| {
                    let state = match b.state {
                        EBlockState::Allocated => BlockState::ActiveAllocated,
                        EBlockState::PendingFree => BlockState::ActivePendingFree,
                        EBlockState::Free => BlockState::Inactive,
                    };
                    Block {
                        address: b.address,
                        size: b.size,
                        requested_size: Some(b.requested_size),
                        state,
                        stack: if state.is_active() { block_stack(b.address) } else { None },
                        history: None,
                    }
                })
                .collect();
            Segment {
                device,
                address: s.address,
                total_size: s.total_size,
                allocated_size: s.allocated_size(),
                active_size: s.active_size(),
                requested_size: Some(s.requested_size()),
                stream: s.stream,
                segment_type: if s.is_large { SegmentType::Large } else { SegmentType::Small },
                segment_pool_id: Some(s.pool),
                is_expandable: Some(s.is_expandable),
                stack: segment_stack(s.address),
                blocks,
            }
        })
        .collect()
}

/// `allocator_settings` as PyTorch 2.3+ writes it, for a configuration and the
/// `PYTORCH_CUDA_ALLOC_CONF` string it came from.
pub fn allocator_settings(cfg: &AllocatorConfig, conf: &str) -> PyObj {
    let s = |x: &str| PyObj::Str(x.to_string());
    let divisions =
        (0..16).map(|i| (s(&(1u64 << i).to_string()), PyObj::Int(cfg.roundup_power2_divisions[i] as i64))).collect();
    PyObj::Dict(vec![
        (s("PYTORCH_CUDA_ALLOC_CONF"), s(conf)),
        (s("max_split_size"), PyObj::Int(cfg.max_split_size.map_or(-1, |v| v as i64))),
        (s("garbage_collection_threshold"), PyObj::Float(cfg.garbage_collection_threshold)),
        (s("expandable_segments"), PyObj::Bool(cfg.expandable_segments)),
        (s("pinned_num_register_threads"), PyObj::Int(cfg.pinned_num_register_threads as i64)),
        (s("release_lock_on_cudamalloc"), PyObj::Bool(cfg.release_lock_on_cudamalloc)),
        (s("pinned_use_cuda_host_register"), PyObj::Bool(cfg.pinned_use_cuda_host_register)),
        (s("roundup_power2_divisions"), PyObj::Dict(divisions)),
    ])
}
