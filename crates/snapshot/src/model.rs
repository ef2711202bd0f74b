//! The in-memory model of a memory snapshot.
//!
//! Field names follow PyTorch's own (`segments`, `device_traces`, `requested_size`, ...).
//! The model is built to stay small on multi-GB files: strings, frames and whole stacks
//! are interned once in a [`FrameTable`], and a [`TraceEvent`] is a flat 56-byte record
//! whose optional fields use sentinels instead of `Option<i64>`.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::hash::{BuildHasherDefault, Hasher};
use std::num::NonZeroU32;

use crate::pyobj::PyObj;

/// An interned string (file names, function names, compile contexts, metadata).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StrId(NonZeroU32);

/// An interned `(filename, line, name)` frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FrameId(NonZeroU32);

/// An interned stack: a list of frames, innermost first, as PyTorch records them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StackId(NonZeroU32);

macro_rules! id_index {
    ($t:ty) => {
        impl $t {
            #[inline]
            pub(crate) fn from_index(i: usize) -> Self {
                Self(NonZeroU32::new(u32::try_from(i + 1).expect("more than 4G interned items")).unwrap())
            }
            /// Position in its table (0-based).
            #[inline]
            pub fn index(self) -> usize {
                self.0.get() as usize - 1
            }
        }
    };
}
id_index!(StrId);
id_index!(FrameId);
id_index!(StackId);

impl StrId {
    /// The id as a nonzero number (a key for the reader's caches).
    #[inline]
    pub(crate) fn raw(self) -> u32 {
        self.0.get()
    }
}

/// One Python/C++ frame of a recorded stack.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Frame {
    pub filename: StrId,
    pub line: i64,
    pub name: StrId,
}

/// A small, fast hasher for interning (the FxHash mix used by rustc). The keys are our
/// own strings and ids, so HashDoS resistance buys nothing here, and SipHash was a
/// measurable share of reading a multi-GB file.
#[derive(Default, Clone, Copy)]
pub struct FxHasher(u64);

impl Hasher for FxHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.add(u64::from_le_bytes(c.try_into().unwrap()));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut b = [0u8; 8];
            b[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(b) ^ ((rest.len() as u64) << 56));
        }
    }
    fn write_u8(&mut self, i: u8) {
        self.add(i as u64)
    }
    fn write_u32(&mut self, i: u32) {
        self.add(i as u64)
    }
    fn write_u64(&mut self, i: u64) {
        self.add(i)
    }
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64)
    }
    fn finish(&self) -> u64 {
        // hashbrown picks buckets from the low bits, and the product keeps the low zero
        // bits of its input: addresses are multiples of 512, so without this rotation
        // every address would land in the same few buckets.
        self.0.rotate_left(26)
    }
}

impl FxHasher {
    #[inline]
    fn add(&mut self, w: u64) {
        self.0 = (self.0.rotate_left(5) ^ w).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

/// `HashMap` with [`FxHasher`].
pub type FxHashMap<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;

/// Interning tables shared by the whole snapshot. Real files reference the same frame
/// lists thousands of times; interning keeps one copy.
#[derive(Clone, Debug, Default)]
pub struct FrameTable {
    strings: Vec<Box<str>>,
    string_index: FxHashMap<Box<str>, StrId>,
    frames: Vec<Frame>,
    frame_index: FxHashMap<Frame, FrameId>,
    stacks: Vec<Box<[FrameId]>>,
    stack_index: FxHashMap<Box<[FrameId]>, StackId>,
}

impl FrameTable {
    pub fn intern_str(&mut self, s: &str) -> StrId {
        if let Some(&id) = self.string_index.get(s) {
            return id;
        }
        let id = StrId::from_index(self.strings.len());
        self.strings.push(s.into());
        self.string_index.insert(s.into(), id);
        id
    }
    pub fn str(&self, id: StrId) -> &str {
        &self.strings[id.index()]
    }
    pub fn intern_frame(&mut self, f: Frame) -> FrameId {
        if let Some(&id) = self.frame_index.get(&f) {
            return id;
        }
        let id = FrameId::from_index(self.frames.len());
        self.frames.push(f);
        self.frame_index.insert(f, id);
        id
    }
    pub fn frame(&self, id: FrameId) -> &Frame {
        &self.frames[id.index()]
    }
    pub fn intern_stack(&mut self, frames: &[FrameId]) -> StackId {
        if let Some(&id) = self.stack_index.get(frames) {
            return id;
        }
        let id = StackId::from_index(self.stacks.len());
        self.stacks.push(frames.into());
        self.stack_index.insert(frames.into(), id);
        id
    }
    /// Interns the stack of `(filename, line, name)` frames, innermost first (as PyTorch
    /// records them): for tools and tests that build snapshots.
    pub fn intern_py_stack(&mut self, frames: &[(&str, i64, &str)]) -> StackId {
        let ids: Vec<FrameId> = frames
            .iter()
            .map(|&(file, line, name)| {
                let f = Frame { filename: self.intern_str(file), line, name: self.intern_str(name) };
                self.intern_frame(f)
            })
            .collect();
        self.intern_stack(&ids)
    }
    /// Frames of a stack, innermost first.
    pub fn stack(&self, id: StackId) -> &[FrameId] {
        &self.stacks[id.index()]
    }
    /// Frames of a stack resolved to `(filename, line, name)`, innermost first.
    pub fn resolved(&self, id: StackId) -> impl Iterator<Item = (&str, i64, &str)> + '_ {
        self.stack(id).iter().map(move |&f| {
            let fr = self.frame(f);
            (self.str(fr.filename), fr.line, self.str(fr.name))
        })
    }
    /// String by table position (0-based), for tables parallel to the string table.
    pub fn str_at(&self, i: usize) -> &str {
        &self.strings[i]
    }
    pub fn num_strings(&self) -> usize {
        self.strings.len()
    }
    pub fn num_frames(&self) -> usize {
        self.frames.len()
    }
    pub fn num_stacks(&self) -> usize {
        self.stacks.len()
    }
}

/// What a trace entry records (`action` in the pickle).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Action {
    Alloc,
    FreeRequested,
    FreeCompleted,
    SegmentAlloc,
    SegmentFree,
    SegmentMap,
    SegmentUnmap,
    Snapshot,
    Oom,
    Annotate,
    UserDefined,
}

impl Action {
    pub const ALL: [Action; 11] = [
        Action::Alloc,
        Action::FreeRequested,
        Action::FreeCompleted,
        Action::SegmentAlloc,
        Action::SegmentFree,
        Action::SegmentMap,
        Action::SegmentUnmap,
        Action::Snapshot,
        Action::Oom,
        Action::Annotate,
        Action::UserDefined,
    ];
    /// The name PyTorch writes.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Alloc => "alloc",
            Action::FreeRequested => "free_requested",
            Action::FreeCompleted => "free_completed",
            Action::SegmentAlloc => "segment_alloc",
            Action::SegmentFree => "segment_free",
            Action::SegmentMap => "segment_map",
            Action::SegmentUnmap => "segment_unmap",
            Action::Snapshot => "snapshot",
            Action::Oom => "oom",
            Action::Annotate => "annotate",
            Action::UserDefined => "user_defined",
        }
    }
    pub fn parse(s: &str) -> Option<Action> {
        Action::ALL.into_iter().find(|a| a.as_str() == s)
    }
}

/// What a trace entry records besides its block and time: its `stream`, and `pool_id`,
/// `compile_context` and `user_metadata`. Entries of one snapshot share a few of these (one
/// per stream and pool and compiled region, or per value the program gave
/// `_set_memory_metadata`), so the snapshot keeps each distinct one once
/// ([`Snapshot::contexts`]) and an entry holds its number ([`ContextId`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct EntryContext {
    /// Raw `cudaStream_t` value (0 = legacy default stream).
    pub stream: u64,
    pub pool_id: Option<(u64, u64)>,
    pub compile_context: Option<StrId>,
    pub user_metadata: Option<StrId>,
}

/// The number of an entry's [`EntryContext`] in [`Snapshot::contexts`] (0: none).
///
/// Three bytes, so that a [`TraceEvent`] is 32 bytes (it was 48 with these fields in it):
/// the event array is most of the memory a long trace takes, and every fresh page of it
/// costs a fault (on a 6.9 M-entry trace, `summary` was 4-9 % faster at 40 bytes than at
/// 48). A snapshot holds at most [`ContextId::MAX`] distinct contexts; past that an entry
/// keeps its stream and pool and loses the rest (the reader notes it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ContextId([u8; 3]);

impl ContextId {
    /// Stream 0, no `pool_id`, `compile_context` or `user_metadata`.
    pub const NONE: ContextId = ContextId([0; 3]);
    /// Distinct contexts a snapshot can hold.
    pub const MAX: usize = (1 << 24) - 1;
    /// The context's index in [`Snapshot::contexts`].
    pub fn index(self) -> Option<usize> {
        let [a, b, c] = self.0;
        let v = u32::from_le_bytes([a, b, c, 0]) as usize;
        v.checked_sub(1)
    }
    /// The id of index `i`; `None` past [`Self::MAX`] contexts.
    pub fn of_index(i: usize) -> Option<ContextId> {
        let [a, b, c, _] = u32::try_from(i + 1).ok().filter(|&v| v as usize <= Self::MAX)?.to_le_bytes();
        Some(ContextId([a, b, c]))
    }
    pub fn is_none(self) -> bool {
        self == Self::NONE
    }
}

/// Interns `c` in `table`: its id, [`ContextId::NONE`] for the empty context, `None`
/// past [`ContextId::MAX`] distinct contexts. A linear search: for the few contexts a
/// tool adds (the reader keeps a map of its own).
pub fn intern_context(table: &mut Vec<EntryContext>, c: EntryContext) -> Option<ContextId> {
    if c == EntryContext::default() {
        return Some(ContextId::NONE);
    }
    match table.iter().position(|&t| t == c) {
        Some(i) => ContextId::of_index(i),
        None => {
            let id = ContextId::of_index(table.len())?;
            table.push(c);
            Some(id)
        }
    }
}

/// Sentinel for "no `time_us` key".
pub const NO_TIME: i64 = i64::MIN;

/// One entry of a device's trace ring buffer. Flat and small: multi-GB files hold
/// tens of millions of these.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TraceEvent {
    /// Block or segment address; for `oom`, the `device_free` bytes instead.
    pub addr: u64,
    /// As recorded: the unrounded request for alloc/free, segment bytes for segment events,
    /// the rounded request for `oom`.
    pub size: u64,
    /// Microseconds since the epoch, or [`NO_TIME`].
    pub time_us: i64,
    /// `frames` of the entry; `None` when the key was absent (distinct from an empty stack).
    pub stack: Option<StackId>,
    /// Its `stream`, `pool_id`, `compile_context` and `user_metadata`, by their number in
    /// [`Snapshot::contexts`] ([`Snapshot::context`], [`Snapshot::stream`] resolve it).
    pub context: ContextId,
    pub action: Action,
}

// Tens of millions of these live at once on multi-GB files: 32 bytes, checked when
// compiling (see [`ContextId`]).
const _: () = assert!(std::mem::size_of::<TraceEvent>() == 32);

impl TraceEvent {
    /// An entry on stream 0 without context ([`Snapshot::set_stream`] gives it another).
    pub fn new(action: Action, addr: u64, size: u64) -> Self {
        TraceEvent { addr, size, time_us: NO_TIME, stack: None, context: ContextId::NONE, action }
    }
    pub fn time(&self) -> Option<i64> {
        (self.time_us != NO_TIME).then_some(self.time_us)
    }
    /// `device_free` of an `oom` entry.
    pub fn device_free(&self) -> Option<u64> {
        (self.action == Action::Oom).then_some(self.addr)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BlockState {
    /// Held by a tensor.
    ActiveAllocated,
    /// Freed, waiting for `record_stream` events.
    ActivePendingFree,
    /// Free and reusable.
    Inactive,
}

impl BlockState {
    pub fn as_str(self) -> &'static str {
        match self {
            BlockState::ActiveAllocated => "active_allocated",
            BlockState::ActivePendingFree => "active_pending_free",
            BlockState::Inactive => "inactive",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "active_allocated" => Some(BlockState::ActiveAllocated),
            // The docstring's name for the same state.
            "active_pending_free" | "active_awaiting_free" => Some(BlockState::ActivePendingFree),
            "inactive" => Some(BlockState::Inactive),
            _ => None,
        }
    }
    pub fn is_active(self) -> bool {
        !matches!(self, BlockState::Inactive)
    }
}

/// An entry of a 1.13/2.0 block `history` list.
#[derive(Clone, Debug, PartialEq)]
pub struct HistoryEntry {
    pub addr: u64,
    pub real_size: u64,
    pub stack: Option<StackId>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Block {
    /// Absolute address. Older formats do not record it; the reader computes it as
    /// segment address + sizes of the preceding blocks, as PyTorch does.
    pub address: u64,
    pub size: u64,
    /// Unrounded request; stale for inactive blocks. `None` in 1.13 files.
    pub requested_size: Option<u64>,
    pub state: BlockState,
    pub stack: Option<StackId>,
    /// 1.13/2.0 form only.
    pub history: Option<Vec<HistoryEntry>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SegmentType {
    Small,
    Large,
}

impl SegmentType {
    pub fn as_str(self) -> &'static str {
        match self {
            SegmentType::Small => "small",
            SegmentType::Large => "large",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Segment {
    /// CUDA ordinal; -1 for pinned host segments.
    pub device: i64,
    pub address: u64,
    pub total_size: u64,
    pub allocated_size: u64,
    pub active_size: u64,
    pub requested_size: Option<u64>,
    pub stream: u64,
    pub segment_type: SegmentType,
    /// `(0, 0)` for the default pools; `None` when the file predates the key.
    pub segment_pool_id: Option<(u64, u64)>,
    pub is_expandable: Option<bool>,
    /// `frames` of the segment; `None` when the key was absent.
    pub stack: Option<StackId>,
    pub blocks: Vec<Block>,
}

impl Segment {
    /// A segment of `total_size` bytes at `address` on `device` with every other field as
    /// a dict that gives only those keys reads: a large-pool segment of stream 0, no blocks,
    /// nothing allocated, the optional keys absent. What the reader starts each segment
    /// from, and what tests build theirs on (`Segment { blocks, ..Segment::new(…) }`).
    pub fn new(device: i64, address: u64, total_size: u64) -> Segment {
        Segment {
            device,
            address,
            total_size,
            allocated_size: 0,
            active_size: 0,
            requested_size: None,
            stream: 0,
            segment_type: SegmentType::Large,
            segment_pool_id: None,
            is_expandable: None,
            stack: None,
            blocks: Vec::new(),
        }
    }
}

/// One `record_function` enter/exit (`external_annotations`, 2.5+).
#[derive(Clone, Debug, PartialEq)]
pub struct Annotation {
    pub device: i64,
    pub time_us: i64,
    pub name: String,
    /// `"START"` / `"END"` normally.
    pub stage: String,
    /// Any other keys, kept for the writer.
    pub extra: Vec<(String, PyObj)>,
}

/// The shape the file had, so the writer can produce the same form. Serialized (and
/// [`SourceFormat::as_str`]) as the `format` of the JSON documents: `"dict"`,
/// `"segment_list"`, `"kineto"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SourceFormat {
    /// 2.x dict (`segments`, `device_traces`, ...).
    #[default]
    Dict,
    /// 1.13: the top level is the list of segments.
    SegmentList,
    /// torch.profiler / Kineto chrome trace with `[memory]` events.
    Kineto,
}

impl SourceFormat {
    /// The name the JSON documents give it.
    pub fn as_str(self) -> &'static str {
        match self {
            SourceFormat::Dict => "dict",
            SourceFormat::SegmentList => "segment_list",
            SourceFormat::Kineto => "kineto",
        }
    }
}

impl fmt::Display for SourceFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A sample of device totals reported by a profiler trace (Kineto `Total Allocated` /
/// `Total Reserved`), for files that carry totals but not every address.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TotalsSample {
    pub time_us: i64,
    pub allocated: Option<u64>,
    pub reserved: Option<u64>,
}

/// What the reader tolerated rather than refused. Unknown things are counted, never fatal.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReadNotes {
    /// `"<where>.<key>"` → occurrences, e.g. `"trace.forward_frames"`.
    pub unknown_keys: BTreeMap<String, u64>,
    /// Trace actions this reader does not model, dropped from the trace.
    pub unknown_actions: BTreeMap<String, u64>,
    /// `"<where>.<key>"` → how many objects lacked an optional key.
    pub missing_optional: BTreeMap<String, u64>,
    /// Free-form notes (e.g. a Kineto file without addresses).
    pub remarks: Vec<String>,
    /// How the file was recorded and what was restored for the analyses, one line each
    /// ([`crate::recording::prepare`]): history never switched on, one pool only, actions
    /// `skip_actions` left out.
    pub recording: Vec<String>,
}

impl ReadNotes {
    pub fn unknown_key(&mut self, at: &str, key: &str) {
        *self.unknown_keys.entry(format!("{at}.{key}")).or_default() += 1;
    }
    pub fn missing(&mut self, at: &str, key: &str) {
        *self.missing_optional.entry(format!("{at}.{key}")).or_default() += 1;
    }
}

/// A whole memory snapshot (every device).
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// All devices, in file order (sorted by address per device).
    pub segments: Vec<Segment>,
    /// Index = device ordinal; entries oldest → newest.
    pub device_traces: Vec<Vec<TraceEvent>>,
    /// `allocator_settings` as written (2.3+); see [`crate::settings`] for typed access.
    pub allocator_settings: Option<PyObj>,
    /// Whether the file had an `external_annotations` key (even empty).
    pub external_annotations: Option<Vec<Annotation>>,
    pub host_segments: Option<Vec<Segment>>,
    pub host_traces: Option<Vec<TraceEvent>>,
    /// Top-level keys this model does not interpret, kept verbatim for the writer.
    pub extra: Vec<(String, PyObj)>,
    /// The distinct contexts of the trace entries ([`TraceEvent::context`]), in the order
    /// they were first met.
    pub contexts: Vec<EntryContext>,
    /// Device totals from profiler traces (index = device), empty for pickles.
    pub totals: Vec<Vec<TotalsSample>>,
    /// Device memory capacity when the file states it (Kineto `deviceProperties`).
    pub device_capacity: BTreeMap<i64, u64>,
    pub frames: FrameTable,
    pub format: SourceFormat,
    pub notes: ReadNotes,
    /// The segments grouped by device while [`Snapshot::with_device_index`] runs (empty
    /// otherwise): `Default::default()` in a struct literal.
    #[doc(hidden)]
    pub device_index: DeviceIndexSlot,
}

/// The segments' positions grouped by device, built once for a walk over every device
/// (a file with 100 k devices filtered all segments per device: quadratic).
#[derive(Debug)]
struct DeviceIndex {
    /// Positions in [`Snapshot::segments`], by device, each device's in file order.
    order: Vec<u32>,
    /// A device's range in `order`.
    ranges: HashMap<i64, (u32, u32)>,
}

impl DeviceIndex {
    fn of(segments: &[Segment]) -> Option<DeviceIndex> {
        let n = u32::try_from(segments.len()).ok()?;
        let mut order: Vec<u32> = (0..n).collect();
        // Stable: each device's segments keep their file order.
        order.sort_by_key(|&i| segments[i as usize].device);
        let mut ranges = HashMap::new();
        let mut lo = 0usize;
        while lo < order.len() {
            let d = segments[order[lo] as usize].device;
            let hi = lo + order[lo..].partition_point(|&i| segments[i as usize].device == d);
            ranges.insert(d, (lo as u32, hi as u32));
            lo = hi;
        }
        Some(DeviceIndex { order, ranges })
    }
}

/// Where [`Snapshot::with_device_index`] keeps its index: set only while that call holds
/// the snapshot borrowed (so the segments cannot change under it), cleared when it
/// returns or unwinds. A clone starts empty.
#[derive(Debug, Default)]
pub struct DeviceIndexSlot(std::sync::RwLock<Option<std::sync::Arc<DeviceIndex>>>);

impl Clone for DeviceIndexSlot {
    fn clone(&self) -> Self {
        DeviceIndexSlot::default()
    }
}

impl DeviceIndexSlot {
    fn get(&self) -> Option<std::sync::Arc<DeviceIndex>> {
        self.0.read().map_or(None, |g| g.clone())
    }
    fn set(&self, index: Option<std::sync::Arc<DeviceIndex>>) {
        if let Ok(mut g) = self.0.write() {
            *g = index;
        }
    }
}

/// A device's segments: filtered from all of them, or read from the index.
enum DeviceSegments<'a> {
    Filter(std::slice::Iter<'a, Segment>, i64),
    Indexed(&'a [Segment], std::sync::Arc<DeviceIndex>, std::ops::Range<usize>),
}

impl<'a> Iterator for DeviceSegments<'a> {
    type Item = &'a Segment;
    #[inline]
    fn next(&mut self) -> Option<&'a Segment> {
        match self {
            DeviceSegments::Filter(it, device) => it.find(|s| s.device == *device),
            DeviceSegments::Indexed(segs, index, range) => range.next().map(|k| &segs[index.order[k] as usize]),
        }
    }
}

impl Snapshot {
    /// The `pool_id`, `compile_context` and `user_metadata` of an event (none of them for
    /// an id this snapshot does not hold).
    pub fn context(&self, ev: &TraceEvent) -> EntryContext {
        ev.context.index().and_then(|i| self.contexts.get(i)).copied().unwrap_or_default()
    }
    /// `stream` of an event, resolved: the raw `cudaStream_t` value (0 = legacy default).
    #[inline]
    pub fn stream(&self, ev: &TraceEvent) -> u64 {
        match ev.context.index() {
            Some(i) => self.contexts.get(i).map_or(0, |c| c.stream),
            None => 0,
        }
    }
    /// Puts `ev` on `stream`, keeping the rest of its context; `false` (and `ev` unchanged)
    /// past [`ContextId::MAX`] distinct contexts.
    pub fn set_stream(&mut self, ev: &mut TraceEvent, stream: u64) -> bool {
        let c = EntryContext { stream, ..self.context(ev) };
        match self.intern_context(c) {
            Some(id) => {
                ev.context = id;
                true
            }
            None => false,
        }
    }
    /// `pool_id` of an event, resolved.
    pub fn pool_id(&self, ev: &TraceEvent) -> Option<(u64, u64)> {
        self.context(ev).pool_id
    }
    /// `compile_context` of an event.
    pub fn compile_context(&self, ev: &TraceEvent) -> Option<StrId> {
        self.context(ev).compile_context
    }
    /// `user_metadata` of an event.
    pub fn user_metadata(&self, ev: &TraceEvent) -> Option<StrId> {
        self.context(ev).user_metadata
    }
    /// Interns a context for a trace event ([`intern_context`]); `None` past
    /// [`ContextId::MAX`] distinct contexts.
    pub fn intern_context(&mut self, c: EntryContext) -> Option<ContextId> {
        intern_context(&mut self.contexts, c)
    }
    /// Devices that have segments or trace events, ascending.
    pub fn devices(&self) -> Vec<i64> {
        let mut d: Vec<i64> = self.segments.iter().map(|s| s.device).collect();
        d.extend(self.device_traces.iter().enumerate().filter(|(_, t)| !t.is_empty()).map(|(i, _)| i as i64));
        d.sort_unstable();
        d.dedup();
        d
    }
    /// Segments of one device, in file order: O(segments) each call, or O(the device's)
    /// inside [`Snapshot::with_device_index`].
    pub fn device_segments(&self, device: i64) -> impl Iterator<Item = &Segment> {
        match self.device_index.get() {
            Some(index) => {
                let (lo, hi) = index.ranges.get(&device).copied().unwrap_or((0, 0));
                DeviceSegments::Indexed(&self.segments, index, lo as usize..hi as usize)
            }
            None => DeviceSegments::Filter(self.segments.iter(), device),
        }
    }
    /// Runs `f` with the segments grouped by device once, so that every
    /// [`Snapshot::device_segments`] inside it costs the device's segments only: for a
    /// walk over every device. The snapshot stays borrowed for the whole call, so the
    /// index cannot go stale; nested calls share the outer index.
    pub fn with_device_index<T>(&self, f: impl FnOnce(&Snapshot) -> T) -> T {
        if self.device_index.get().is_some() {
            return f(self);
        }
        /// Clears the index when `f` returns or unwinds.
        struct Clear<'a>(&'a DeviceIndexSlot);
        impl Drop for Clear<'_> {
            fn drop(&mut self) {
                self.0.set(None);
            }
        }
        let Some(index) = DeviceIndex::of(&self.segments) else { return f(self) };
        self.device_index.set(Some(std::sync::Arc::new(index)));
        let _clear = Clear(&self.device_index);
        f(self)
    }
    /// Trace of one device (empty when none was recorded).
    pub fn trace(&self, device: i64) -> &[TraceEvent] {
        usize::try_from(device).ok().and_then(|d| self.device_traces.get(d)).map_or(&[], |t| t.as_slice())
    }
}

// --- Comparison helpers (added for the writer's round-trip tests) --------------------

/// A stack resolved to `(filename, line, name)` strings, innermost first.
pub fn resolve_stack(t: &FrameTable, s: Option<StackId>) -> Option<Vec<(String, i64, String)>> {
    s.map(|s| t.resolved(s).map(|(f, l, n)| (f.to_string(), l, n.to_string())).collect())
}

/// First difference between two snapshots as one line, or `None` when they hold the same
/// data. Interning ids (stacks, strings, pools) differ between two reads of equivalent
/// files, so everything is compared resolved. `notes` are not compared: they describe
/// the file that was read (e.g. unknown keys that a writer does not reproduce).
pub fn semantic_diff(a: &Snapshot, b: &Snapshot) -> Option<String> {
    macro_rules! ne {
        ($what:expr, $x:expr, $y:expr) => {
            if $x != $y {
                return Some(format!("{}: {:?} != {:?}", $what, $x, $y));
            }
        };
    }
    let (ta, tb) = (&a.frames, &b.frames);
    let seg_diff = |what: &str, x: &[Segment], y: &[Segment]| -> Option<String> {
        if x.len() != y.len() {
            return Some(format!("{what}: {} segments != {}", x.len(), y.len()));
        }
        for (i, (s, t)) in x.iter().zip(y).enumerate() {
            let w = format!("{what}[{i}]");
            let key = |s: &Segment| {
                (
                    s.device,
                    s.address,
                    s.total_size,
                    s.allocated_size,
                    s.active_size,
                    s.requested_size,
                    s.stream,
                    s.segment_type,
                    s.segment_pool_id,
                    s.is_expandable,
                )
            };
            if key(s) != key(t) {
                return Some(format!("{w}: {:?} != {:?}", key(s), key(t)));
            }
            if resolve_stack(ta, s.stack) != resolve_stack(tb, t.stack) {
                return Some(format!("{w}.frames differ"));
            }
            if s.blocks.len() != t.blocks.len() {
                return Some(format!("{w}: {} blocks != {}", s.blocks.len(), t.blocks.len()));
            }
            for (j, (p, q)) in s.blocks.iter().zip(&t.blocks).enumerate() {
                let w = format!("{w}.blocks[{j}]");
                let key =
                    |b: &Block| (b.address, b.size, b.requested_size, b.state, b.history.as_ref().map(|h| h.len()));
                if key(p) != key(q) {
                    return Some(format!("{w}: {:?} != {:?}", key(p), key(q)));
                }
                if resolve_stack(ta, p.stack) != resolve_stack(tb, q.stack) {
                    return Some(format!("{w}.frames differ"));
                }
                for (k, (h, g)) in p.history.iter().flatten().zip(q.history.iter().flatten()).enumerate() {
                    if (h.addr, h.real_size) != (g.addr, g.real_size)
                        || resolve_stack(ta, h.stack) != resolve_stack(tb, g.stack)
                    {
                        return Some(format!("{w}.history[{k}] differs"));
                    }
                }
            }
        }
        None
    };
    let trace_diff = |what: &str, x: &[TraceEvent], y: &[TraceEvent]| -> Option<String> {
        if x.len() != y.len() {
            return Some(format!("{what}: {} events != {}", x.len(), y.len()));
        }
        for (i, (e, f)) in x.iter().zip(y).enumerate() {
            let key = |s: &Snapshot, e: &TraceEvent| {
                (
                    e.action,
                    e.addr,
                    e.size,
                    s.stream(e),
                    e.time_us,
                    s.compile_context(e).map(|c| s.frames.str(c).to_string()),
                    s.user_metadata(e).map(|c| s.frames.str(c).to_string()),
                    s.pool_id(e),
                )
            };
            if key(a, e) != key(b, f) {
                return Some(format!("{what}[{i}]: {:?} != {:?}", key(a, e), key(b, f)));
            }
            if resolve_stack(ta, e.stack) != resolve_stack(tb, f.stack) {
                return Some(format!("{what}[{i}].frames differ"));
            }
        }
        None
    };
    ne!("format", a.format, b.format);
    if let Some(d) = seg_diff("segments", &a.segments, &b.segments) {
        return Some(d);
    }
    // Trailing empty device lists carry no data but are part of the file's shape.
    ne!("device_traces.len", a.device_traces.len(), b.device_traces.len());
    for (d, (x, y)) in a.device_traces.iter().zip(&b.device_traces).enumerate() {
        if let Some(e) = trace_diff(&format!("device_traces[{d}]"), x, y) {
            return Some(e);
        }
    }
    ne!("allocator_settings", a.allocator_settings, b.allocator_settings);
    ne!("external_annotations", a.external_annotations, b.external_annotations);
    match (&a.host_segments, &b.host_segments) {
        (Some(x), Some(y)) => {
            if let Some(d) = seg_diff("host_segments", x, y) {
                return Some(d);
            }
        }
        (None, None) => {}
        _ => return Some("host_segments present in only one".into()),
    }
    match (&a.host_traces, &b.host_traces) {
        (Some(x), Some(y)) => {
            if let Some(d) = trace_diff("host_traces", x, y) {
                return Some(d);
            }
        }
        (None, None) => {}
        _ => return Some("host_traces present in only one".into()),
    }
    ne!("extra", a.extra, b.extra);
    ne!("totals", a.totals, b.totals);
    ne!("device_capacity", a.device_capacity, b.device_capacity);
    None
}

#[cfg(test)]
mod device_index_tests {
    use super::*;

    fn seg(device: i64, address: u64) -> Segment {
        Segment::new(device, address, 1 << 21)
    }

    /// Inside `with_device_index` every device's segments are the filtered ones, in file
    /// order (devices interleaved and out of order in the file), a device without
    /// segments has none, and the index is gone afterwards (also after a panic).
    #[test]
    fn indexed_segments_are_the_filtered_ones() {
        let mut snap = Snapshot::default();
        for k in 0..500u64 {
            snap.segments.push(seg(((k * 7) % 13) as i64 - 1, k << 21));
        }
        let filtered: Vec<Vec<u64>> = (-2..14).map(|d| snap.device_segments(d).map(|s| s.address).collect()).collect();
        let indexed: Vec<Vec<u64>> = snap.with_device_index(|snap| {
            assert!(snap.device_index.get().is_some());
            let nested = snap.with_device_index(|snap| snap.device_segments(3).count());
            assert_eq!(nested, filtered[5].len());
            (-2..14).map(|d| snap.device_segments(d).map(|s| s.address).collect()).collect()
        });
        assert_eq!(indexed, filtered);
        assert!(filtered[0].is_empty() && !filtered[1].is_empty());
        assert!(snap.device_index.get().is_none());
        let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            snap.with_device_index(|_| panic!("inside"));
        }));
        assert!(unwound.is_err());
        assert!(snap.device_index.get().is_none(), "cleared on unwind");
        let mut copy = snap.clone();
        copy.segments.push(seg(20, 0));
        assert_eq!(copy.with_device_index(|s| s.device_segments(20).count()), 1);
    }
}
