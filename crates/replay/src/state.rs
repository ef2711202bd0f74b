//! A policy-free model of one device's allocator state, driven by recorded trace
//! events only: the backward walk of spec §10.12 (undo each event, from the final
//! `segments` back to the state at the first trace entry) and its inverse (apply a
//! recorded event forwards), which the replay uses to resynchronise after a divergence.
//!
//! Nothing here chooses a block: every address comes from the trace. The only policy
//! facts used are the rounding of the request and the split rule (§3.8), needed to
//! recover the size of a block the trace does not state (§10.11 "rounded sizes are
//! absent").

use fragscope_snapshot::{Action, BlockState, Snapshot, TraceEvent};

/// Small-pool segment size (kSmallBuffer, §1.1).
pub(crate) const SMALL_BUFFER: u64 = 2 << 20;
/// Large-pool split threshold (§3.8: split iff remainder > 1 MiB).
pub(crate) const SPLIT_LARGE_MIN: u64 = 1 << 20;
/// kMinBlockSize.
pub(crate) const MIN_BLOCK: u64 = 512;

/// State of a block in the recorded model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BState {
    Free,
    Allocated,
    /// `free_requested` seen, `free_completed` not yet.
    Pending,
}

#[derive(Clone, Copy, Debug)]
pub struct BlockRec {
    pub addr: u64,
    pub size: u64,
    /// Unrounded request of the (last) allocation; for free blocks, informative only.
    pub requested: u64,
    pub state: BState,
    /// Set by the backward walk on an oversize block it gave the whole free space
    /// after it (an unsplit cached block, the usual case), when the block could also
    /// have been exactly its rounded request next to a free block: a segment made
    /// under another `max_split_size` before the recording, or before the setting
    /// changed at run time. An earlier entry inside that tail proves the second
    /// reading, and the walk revises the block ([`SegRec::revise_whole_take`]).
    pub guessed: bool,
    /// Set by the backward walk on a large-pool block it gave its rounded request
    /// where the trace also allows a larger block (a cached block taken whole, its
    /// remainder ≤ 1 MiB or, oversize, under `max_non_split_rounding` kept unsplit,
    /// §3.8): how many bytes larger, in units of 512 (0 = the size is fixed). An
    /// earlier entry that leaves a free piece of ≤ 1 MiB right after the block
    /// proves the larger reading, since no large-pool block is that small, and the
    /// walk grows the block over the piece ([`SegRec::grow_over_remainder`]).
    pub may_grow: u32,
}

/// Equality of what the allocator holds: `guessed` is how the walk came to it, and a
/// free block's `requested` is only what its last allocation asked.
impl PartialEq for BlockRec {
    fn eq(&self, o: &BlockRec) -> bool {
        let requested = |b: &BlockRec| if b.state == BState::Free { 0 } else { b.requested };
        (self.addr, self.size, requested(self), self.state) == (o.addr, o.size, requested(o), o.state)
    }
}
impl Eq for BlockRec {}

/// A segment: one `cudaMalloc`, or one contiguous mapped range of an expandable
/// reservation (as the snapshot lists them, §6.5).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegRec {
    pub addr: u64,
    pub size: u64,
    pub stream: u64,
    pub pool: (u64, u64),
    pub small: bool,
    pub expandable: bool,
    /// In address order, covering the segment exactly.
    pub blocks: Vec<BlockRec>,
}

impl SegRec {
    pub fn end(&self) -> u64 {
        self.addr + self.size
    }
    fn whole_free(addr: u64, size: u64, stream: u64, pool: (u64, u64), small: bool, expandable: bool) -> SegRec {
        SegRec {
            addr,
            size,
            stream,
            pool,
            small,
            expandable,
            blocks: vec![BlockRec { addr, size, requested: 0, state: BState::Free, guessed: false, may_grow: 0 }],
        }
    }
    /// Index of the block containing `addr`.
    fn block_at(&self, addr: u64) -> Option<usize> {
        let i = self.blocks.partition_point(|b| b.addr <= addr);
        (i > 0 && addr < self.blocks[i - 1].addr + self.blocks[i - 1].size).then(|| i - 1)
    }
    /// Merge block `j` (free) with free neighbours; returns the index of the merged block.
    fn merge_free(&mut self, mut j: usize) -> usize {
        if j + 1 < self.blocks.len() && self.blocks[j + 1].state == BState::Free {
            let n = self.blocks.remove(j + 1);
            self.blocks[j].size += n.size;
        }
        if j > 0 && self.blocks[j - 1].state == BState::Free {
            let b = self.blocks.remove(j);
            j -= 1;
            self.blocks[j].size += b.size;
        }
        j
    }
    /// Block `j` is allocated (walking back) over `addr`, where an earlier entry needs
    /// free space. If the walk gave `j` the whole free space as a guess (see
    /// [`BlockRec::guessed`]) and `addr` lies past its rounded request, the entry
    /// proves that the block was exactly its request with a free block after it:
    /// shrink it, free the tail, and return the index of the block now at `addr`.
    fn revise_whole_take(&mut self, j: usize, addr: u64, rules: &SplitRules) -> Option<usize> {
        let b = self.blocks[j];
        let exact = (rules.round)(b.requested);
        let tail = b.size.checked_sub(exact)?;
        if !b.guessed || addr < b.addr + exact || tail <= SPLIT_LARGE_MIN {
            return None;
        }
        self.blocks[j] = BlockRec { size: exact, guessed: false, ..b };
        let free = BlockRec {
            addr: b.addr + exact,
            size: tail,
            requested: 0,
            state: BState::Free,
            guessed: false,
            may_grow: 0,
        };
        self.blocks.insert(j + 1, free);
        self.merge_free(j + 1);
        self.block_at(addr)
    }
    /// Blocks `j - 1` and `j` are a live block the walk gave its rounded request
    /// ([`BlockRec::may_grow`]) and a free block; an earlier entry needs the free
    /// block to start at `addr`. A large-pool segment holds no block of ≤ 1 MiB
    /// (requests there are > 1 MiB and a split leaves > 1 MiB), so when the piece
    /// `[blocks[j].addr, addr)` is that small it is the live block's unsplit
    /// remainder: grow the block over it. Returns the piece's size when it did.
    fn grow_over_remainder(&mut self, j: usize, addr: u64) -> Option<u64> {
        if self.small || j == 0 {
            return None;
        }
        let f = self.blocks[j];
        let piece = addr.checked_sub(f.addr).filter(|&p| p > 0 && p <= SPLIT_LARGE_MIN)?;
        let prev = &mut self.blocks[j - 1];
        if prev.state == BState::Free || piece > u64::from(prev.may_grow) * MIN_BLOCK {
            return None;
        }
        prev.size += piece;
        prev.may_grow = 0;
        self.blocks[j] = BlockRec { addr, size: f.size - piece, ..f };
        Some(piece)
    }
    /// An empty record for a vacant slab slot (no allocation).
    fn placeholder() -> SegRec {
        SegRec { addr: 0, size: 0, stream: 0, pool: (0, 0), small: false, expandable: false, blocks: Vec::new() }
    }
    pub fn is_whole_free(&self) -> bool {
        self.blocks.len() == 1 && self.blocks[0].state == BState::Free
    }
}

/// `blocks.remove(at)` for the undo of an `alloc`: `Vec::remove` calls `memmove` even
/// when no block follows, and the block removed is mostly a segment's last (the free
/// remainder after its newest block: 9 in 10 on `loopreq`).
#[inline(always)]
fn remove_block(blocks: &mut Vec<BlockRec>, at: usize) {
    if at + 1 == blocks.len() {
        blocks.pop();
    } else {
        blocks.remove(at);
    }
}

/// The rules the model needs from the allocator configuration.
pub struct SplitRules<'a> {
    /// `round_size` of the configuration in force.
    pub round: &'a dyn Fn(u64) -> u64,
    /// `max_split_size`; `None` = unlimited.
    pub max_split_size: Option<u64>,
    /// `max_non_split_rounding` (oversize slack, §3.3 step 4).
    pub max_non_split_rounding: u64,
}

impl SplitRules<'_> {
    /// §3.8 `should_split` for a block of size `b` serving rounded request `s`.
    pub fn should_split(&self, seg_small: bool, expandable: bool, b: u64, s: u64) -> bool {
        let r = b - s;
        if seg_small || expandable {
            r >= MIN_BLOCK
        } else {
            self.max_split_size.is_none_or(|m| s < m) && r > SPLIT_LARGE_MIN
        }
    }
}

/// The trace and the final state disagree: the event cannot be undone/applied.
#[derive(Clone, Debug, PartialEq)]
pub struct Inconsistency {
    pub index: usize,
    pub event: TraceEvent,
    pub reason: String,
}

/// A block size the backward walk had to choose (§10.11: a reused cached block may
/// have been taken whole, and the trace does not say how big it was).
#[derive(Clone, Debug, PartialEq)]
pub struct Ambiguity {
    pub index: usize,
    pub addr: u64,
    /// Size chosen (the rounded request).
    pub chosen: u64,
    /// Largest size that would also have been consistent.
    pub max_possible: u64,
}

/// The block an entry made or freed, as [`RecordedState::undo_touching`] finds it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Undone {
    /// The block (for an `alloc`, before the undo frees it; for a free, after the undo
    /// makes it allocated or pending again).
    pub block: BlockRec,
    /// Its segment is in the small pool / expandable.
    pub small: bool,
    pub expandable: bool,
    /// `alloc` only: the size of the free block undoing it leaves starting at its address
    /// (`None` when a free block before it absorbs it).
    pub left: Option<u64>,
    /// `free_completed` only: to find the free space there, the undo revised the size of
    /// a live block the walk had chosen revisably ([`SegRec::revise_whole_take`],
    /// [`SegRec::grow_over_remainder`]).
    pub revised: bool,
}

/// Where a trace entry's memory belongs: its stream and its pool (`pool_id`, the default
/// pools `(0, 0)`), as the snapshot's table of entry contexts gives them ([`home_of`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Home {
    pub stream: u64,
    pub pool: (u64, u64),
}

/// The [`Home`] of `ev`, a trace entry of `snap`.
#[inline]
pub fn home_of(snap: &Snapshot, ev: &TraceEvent) -> Home {
    let c = snap.context(ev);
    Home { stream: c.stream, pool: c.pool_id.unwrap_or(fragscope_alloc::DEFAULT_POOL) }
}

/// One memory pool's share of a device's state: the default pools `(0, 0)` or a private
/// pool (a CUDA graph's, `(graph, 0)`, or a `MemPool`'s, `(0, n)`), whose free blocks serve
/// only that pool's requests ([`RecordedState::pool_bands`]).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct PoolBand {
    /// `(0, 0)`: the default pools.
    pub pool: (u64, u64),
    pub segments: u64,
    pub reserved_bytes: u64,
    pub allocated_bytes: u64,
    /// Free (inactive) blocks: reusable by this pool's requests only.
    pub cached_free_bytes: u64,
    pub largest_free_block_bytes: u64,
}

/// One device's segments, keyed by address.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RecordedState {
    pub segs: SegMap,
}

/// Segments by start address. The walk looks up the segment containing an address
/// at every event (thousands of segments on a long run), so the sorted starts sit
/// in one flat vector for a binary search over 8-byte keys, and the records in a
/// slab that never moves them (a `BTreeMap` range lookup cost ~280 instructions
/// per event here). Adding or removing a segment shifts the starts once: segment
/// events are rare next to block events.
#[derive(Clone, Debug, Default)]
pub struct SegMap {
    /// Segment starts, ascending.
    starts: Vec<u64>,
    /// `slots[k]`: slab index of the segment starting at `starts[k]`.
    slots: Vec<u32>,
    recs: Vec<SegRec>,
    /// Vacant slab slots (their records are empty placeholders).
    vacant: Vec<u32>,
    /// Slab slot of the segment last found in each 2 MiB granule (by address bits,
    /// `HINTS` entries, `u32::MAX` = none): consecutive events mostly touch
    /// segments seen recently (99% hits on the large benchmark), so most lookups
    /// skip the binary search. Empty until the first lookup.
    hints: Vec<u32>,
    /// Index of the block last found for each 512-byte granule of addresses, in its
    /// segment (by address bits, `POS` entries, `u32::MAX` = none; [`Self::block_index`]).
    /// Empty until the first lookup, and for good once `unsorted`.
    pos: Vec<u32>,
    /// Some segment given to [`Self::insert`] had blocks out of address order (a corrupt
    /// snapshot): then `pos` stays empty. Every undo and apply keeps the order.
    unsorted: bool,
}

const HINTS: usize = 4096;
const POS: usize = 4096;
/// 2 MiB, the smallest segment.
const GRANULE_SHIFT: u32 = 21;

impl SegMap {
    pub fn len(&self) -> usize {
        self.starts.len()
    }
    pub fn is_empty(&self) -> bool {
        self.starts.is_empty()
    }
    /// Segments in address order.
    pub fn values(&self) -> impl DoubleEndedIterator<Item = &SegRec> + ExactSizeIterator + '_ {
        self.slots.iter().map(|&i| &self.recs[i as usize])
    }
    pub fn get(&self, addr: &u64) -> Option<&SegRec> {
        let k = self.starts.binary_search(addr).ok()?;
        Some(&self.recs[self.slots[k] as usize])
    }
    /// Insert (or replace) the segment starting at `addr`.
    pub fn insert(&mut self, addr: u64, rec: SegRec) -> Option<SegRec> {
        if !rec.blocks.windows(2).all(|w| w[0].addr <= w[1].addr) {
            // `pos` emptied for good, so that [`Self::block_index`] need not test this.
            self.unsorted = true;
            self.pos = Vec::new();
        }
        match self.starts.binary_search(&addr) {
            Ok(k) => Some(std::mem::replace(&mut self.recs[self.slots[k] as usize], rec)),
            Err(k) => {
                let slot = match self.vacant.pop() {
                    Some(v) => {
                        self.recs[v as usize] = rec;
                        v
                    }
                    None => {
                        self.recs.push(rec);
                        (self.recs.len() - 1) as u32
                    }
                };
                self.starts.insert(k, addr);
                self.slots.insert(k, slot);
                None
            }
        }
    }
    pub fn remove(&mut self, addr: &u64) -> Option<SegRec> {
        let k = self.starts.binary_search(addr).ok()?;
        self.starts.remove(k);
        let slot = self.slots.remove(k);
        self.vacant.push(slot);
        Some(std::mem::replace(&mut self.recs[slot as usize], SegRec::placeholder()))
    }
    /// Position in `starts` of the last segment starting at or before `addr`.
    #[inline]
    fn last_at_or_before(&self, addr: u64) -> Option<usize> {
        self.starts.partition_point(|&s| s <= addr).checked_sub(1)
    }
    /// The last segment starting strictly before `addr`.
    fn last_before(&self, addr: u64) -> Option<&SegRec> {
        let k = self.starts.partition_point(|&s| s < addr).checked_sub(1)?;
        Some(&self.recs[self.slots[k] as usize])
    }
    /// The segment containing `addr`.
    #[inline(always)]
    fn containing_mut(&mut self, addr: u64) -> Option<&mut SegRec> {
        let slot = self.slot_containing(addr)?;
        Some(&mut self.recs[slot])
    }
    /// Slab slot of the segment containing `addr`: the hint for its 2 MiB granule
    /// if that segment still contains it (the check is exact, so a stale or
    /// aliased hint only costs the binary search), else the binary search.
    #[inline(always)]
    fn slot_containing(&mut self, addr: u64) -> Option<usize> {
        let h = (addr >> GRANULE_SHIFT) as usize & (HINTS - 1);
        if let Some(&cached) = self.hints.get(h) {
            if let Some(s) = self.recs.get(cached as usize) {
                if s.addr <= addr && addr < s.end() {
                    return Some(cached as usize);
                }
            }
        }
        self.slot_searched(addr, h)
    }
    /// [`Self::slot_containing`] past its hint: the binary search, which sets the hint.
    #[inline(never)]
    fn slot_searched(&mut self, addr: u64, h: usize) -> Option<usize> {
        if self.hints.is_empty() {
            self.hints = vec![u32::MAX; HINTS];
        }
        let k = self.last_at_or_before(addr)?;
        let slot = self.slots[k] as usize;
        if addr < self.recs[slot].end() {
            self.hints[h] = slot as u32;
            Some(slot)
        } else {
            None
        }
    }
    /// Index of the block holding `addr` in the segment at slab slot `slot`: the one
    /// [`SegRec::block_at`] finds. Tried first: where the last lookup in `addr`'s
    /// 512-byte granule found its block (the walk meets one address again and again: a
    /// block's `free_completed`, then its `alloc`, then the `free_completed` of the block
    /// before it there). With the blocks in address order, "the last block starting at or
    /// before `addr`" is checked exactly, so a stale hint only costs the search.
    #[inline(always)]
    fn block_index(&mut self, slot: usize, addr: u64) -> Option<usize> {
        let h = (addr >> 9) as usize & (POS - 1);
        if let Some(&j) = self.pos.get(h) {
            let blocks = &self.recs[slot].blocks;
            if let Some(b) = blocks.get(j as usize) {
                if b.addr <= addr && blocks.get(j as usize + 1).is_none_or(|n| n.addr > addr) {
                    return (addr < b.addr + b.size).then_some(j as usize);
                }
            }
        }
        let j = self.recs[slot].block_at(addr)?;
        self.set_pos(addr, j);
        Some(j)
    }
    /// Notes that the block holding `addr` is now at index `j` of its segment.
    #[inline(always)]
    fn set_pos(&mut self, addr: u64, j: usize) {
        if self.pos.is_empty() {
            if self.unsorted {
                return;
            }
            self.pos = vec![u32::MAX; POS];
        }
        self.pos[(addr >> 9) as usize & (POS - 1)] = j as u32;
    }
    fn containing(&self, addr: u64) -> Option<&SegRec> {
        let k = self.last_at_or_before(addr)?;
        let s = &self.recs[self.slots[k] as usize];
        (addr < s.end()).then_some(s)
    }
}

/// Same segments, whatever the slab layout.
impl PartialEq for SegMap {
    fn eq(&self, other: &Self) -> bool {
        self.starts == other.starts && self.values().eq(other.values())
    }
}

impl std::ops::Index<&u64> for SegMap {
    type Output = SegRec;
    fn index(&self, addr: &u64) -> &SegRec {
        self.get(addr).expect("no segment starts at this address")
    }
}

/// A segment whose blocks leave a gap at the entry's address (a corrupt final state).
const UNCOVERED: &str = "address inside a segment that no block of the snapshot covers";

/// Why a `segment_map` / `segment_unmap` range cannot be cut from or added to the
/// expandable segments (the `reason` of the [`Inconsistency`] it makes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RangeError {
    NoSegment,
    /// In a segment, but no block covers the address ([`UNCOVERED`]).
    Uncovered,
    /// The block at the address is not free or ends before the range.
    NotFree {
        state: BState,
        addr: u64,
        size: u64,
    },
    OverlapsMapped,
}

impl std::fmt::Display for RangeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RangeError::NoSegment => f.write_str("range is in no segment"),
            RangeError::Uncovered => f.write_str(UNCOVERED),
            RangeError::NotFree { state, addr, size } => {
                write!(f, "range is not free ({state:?} block {addr:#x}+{size})")
            }
            RangeError::OverlapsMapped => f.write_str("range overlaps a mapped segment"),
        }
    }
}

#[cold]
fn err(index: usize, ev: &TraceEvent, reason: impl Into<String>) -> Inconsistency {
    Inconsistency { index, event: *ev, reason: reason.into() }
}

// The undo's messages that need formatting, out of the walk's loop.
#[cold]
#[inline(never)]
fn not_allocated(index: usize, ev: &TraceEvent, b: &BlockRec) -> Inconsistency {
    err(index, ev, format!("alloc, but no allocated block starts there later ({:?} block at {:#x})", b.state, b.addr))
}
#[cold]
#[inline(never)]
fn not_pending(index: usize, ev: &TraceEvent, b: &BlockRec) -> Inconsistency {
    err(index, ev, format!("free_requested, but the block is {:?} at {:#x} later", b.state, b.addr))
}
#[cold]
#[inline(never)]
fn still_live(index: usize, ev: &TraceEvent, state: BState) -> Inconsistency {
    err(index, ev, format!("free_completed, but the block is still {state:?} later"))
}
#[cold]
#[inline(never)]
fn too_little_free(index: usize, ev: &TraceEvent, avail: u64) -> Inconsistency {
    err(index, ev, format!("free_completed of {} B, but only {avail} B are free there later", ev.size))
}

/// The state of a recorded block (`active_allocated`, `active_pending_free`, `inactive`).
pub(crate) fn bstate_of(s: BlockState) -> BState {
    match s {
        BlockState::ActiveAllocated => BState::Allocated,
        BlockState::ActivePendingFree => BState::Pending,
        BlockState::Inactive => BState::Free,
    }
}

/// A snapshot segment as the model holds it; without its blocks (an empty list,
/// which no real record has) when `blocks` is false.
fn seg_rec_of(s: &fragscope_snapshot::Segment, blocks: bool) -> SegRec {
    let mut list: Vec<BlockRec> = Vec::new();
    if blocks {
        list = s
            .blocks
            .iter()
            .map(|b| BlockRec {
                addr: b.address,
                size: b.size,
                requested: b.requested_size.unwrap_or(b.size),
                state: bstate_of(b.state),
                guessed: false,
                may_grow: 0,
            })
            .collect();
        if list.is_empty() {
            list.push(BlockRec {
                addr: s.address,
                size: s.total_size,
                requested: 0,
                state: BState::Free,
                guessed: false,
                may_grow: 0,
            });
        }
    }
    SegRec {
        addr: s.address,
        size: s.total_size,
        stream: s.stream,
        pool: s.segment_pool_id.unwrap_or((0, 0)),
        small: s.segment_type == fragscope_snapshot::SegmentType::Small,
        expandable: s.is_expandable.unwrap_or(false),
        blocks: list,
    }
}

impl RecordedState {
    /// The final state of `device` as the snapshot's `segments` give it.
    pub fn from_snapshot(snap: &Snapshot, device: i64) -> RecordedState {
        let mut segs = SegMap::default();
        for s in snap.device_segments(device) {
            segs.insert(s.address, seg_rec_of(s, true));
        }
        RecordedState { segs }
    }

    /// Each pool's segments, reserved, allocated and cached free bytes, the default pools
    /// first, then the private pools by id; empty when every segment is in the default
    /// pools (the usual file: nothing to show apart).
    pub fn pool_bands(&self) -> Vec<PoolBand> {
        let mut bands: Vec<PoolBand> = Vec::new();
        for seg in self.segs.values() {
            let at = match bands.iter().position(|b| b.pool == seg.pool) {
                Some(k) => k,
                None => {
                    bands.push(PoolBand {
                        pool: seg.pool,
                        segments: 0,
                        reserved_bytes: 0,
                        allocated_bytes: 0,
                        cached_free_bytes: 0,
                        largest_free_block_bytes: 0,
                    });
                    bands.len() - 1
                }
            };
            let b = &mut bands[at];
            b.segments += 1;
            b.reserved_bytes += seg.size;
            for blk in &seg.blocks {
                match blk.state {
                    BState::Allocated => b.allocated_bytes += blk.size,
                    BState::Free => {
                        b.cached_free_bytes += blk.size;
                        b.largest_free_block_bytes = b.largest_free_block_bytes.max(blk.size);
                    }
                    BState::Pending => {}
                }
            }
        }
        if bands.iter().all(|b| b.pool == (0, 0)) {
            return Vec::new();
        }
        bands.sort_by_key(|b| (b.pool != (0, 0), b.pool));
        bands
    }

    /// The segment containing `addr`.
    #[inline]
    fn seg_mut(&mut self, addr: u64) -> Option<&mut SegRec> {
        self.segs.containing_mut(addr)
    }

    /// The block starting at `addr` (size, whether its segment is in the small pool, and
    /// whether the segment is expandable), for the statistics of `memstats`.
    pub fn block_starting(&self, addr: u64) -> Option<(BlockRec, bool, bool)> {
        let seg = self.segs.containing(addr)?;
        let j = seg.block_at(addr)?;
        let b = seg.blocks[j];
        (b.addr == addr).then_some((b, seg.small, seg.expandable))
    }

    /// Address of the segment containing `addr`.
    pub fn seg_key(&self, addr: u64) -> Option<u64> {
        self.segs.containing(addr).map(|s| s.addr)
    }

    fn overlaps(&self, addr: u64, size: u64) -> bool {
        self.segs.last_before(addr + size).is_some_and(|s| s.end() > addr)
    }

    /// Bytes in segments.
    pub fn reserved(&self) -> u64 {
        self.segs.values().map(|s| s.size).sum()
    }
    /// Bytes in allocated or pending blocks.
    pub fn active(&self) -> u64 {
        self.segs.values().flat_map(|s| &s.blocks).filter(|b| b.state != BState::Free).map(|b| b.size).sum()
    }

    /// Undo one event (backward walk). `ambiguous` collects size choices.
    #[inline]
    pub fn undo(
        &mut self,
        index: usize,
        ev: &TraceEvent,
        home: Home,
        rules: &SplitRules,
        ambiguous: &mut Vec<Ambiguity>,
    ) -> Result<(), Inconsistency> {
        self.undo_touching(index, ev, home, rules, ambiguous).map(|_| ())
    }

    /// [`Self::undo`], handing back, for an `alloc`, `free_requested` or
    /// `free_completed`, the block the entry made or freed as the walk finds it there
    /// ([`Undone`]). memory_summary's table adds its counters up from these in the same
    /// walk ([`crate::memstats`]) instead of looking each block up again.
    #[inline]
    pub(crate) fn undo_touching(
        &mut self,
        index: usize,
        ev: &TraceEvent,
        home: Home,
        rules: &SplitRules,
        ambiguous: &mut Vec<Ambiguity>,
    ) -> Result<Option<Undone>, Inconsistency> {
        match ev.action {
            Action::Alloc => self.undo_alloc(index, ev).map(Some),
            Action::FreeRequested => self.undo_free_requested(index, ev).map(Some),
            Action::FreeCompleted => self.undo_free_completed(index, ev, rules, ambiguous).map(Some),
            _ => self.undo_segment(index, ev, home).map(|_| None),
        }
    }

    /// Undo an `alloc` (the block there becomes free again, merged with free
    /// neighbours); the block it made ([`Undone::left`] included). Split from
    /// [`Self::undo_touching`] (as are the two frees) so that a walk that matches on
    /// the action itself gets one small inlined body per action; the error messages are
    /// built out of line.
    #[inline(always)]
    pub(crate) fn undo_alloc(&mut self, index: usize, ev: &TraceEvent) -> Result<Undone, Inconsistency> {
        let Some(slot) = self.segs.slot_containing(ev.addr) else {
            return Err(err(index, ev, "alloc of an address in no segment"));
        };
        let Some(j) = self.segs.block_index(slot, ev.addr) else { return Err(err(index, ev, UNCOVERED)) };
        let seg = &mut self.segs.recs[slot];
        let (small, expandable) = (seg.small, seg.expandable);
        let blocks = &mut seg.blocks;
        let b = blocks[j];
        if b.addr != ev.addr || b.state != BState::Allocated {
            return Err(not_allocated(index, ev, &b));
        }
        let prev_free = j > 0 && blocks[j - 1].state == BState::Free;
        let next = blocks.get(j + 1).filter(|n| n.state == BState::Free).map(|n| n.size);
        // The free block undoing the alloc leaves starting at its address: the block
        // merged with a free block after it; none when a free block before it absorbs it.
        let left = (!prev_free).then(|| b.size + next.unwrap_or(0));
        // The block freed and merged with its free neighbours (as `merge_free`, one shift
        // of the blocks after it at most).
        match (prev_free, next) {
            (false, None) => blocks[j].state = BState::Free,
            (false, Some(n)) => {
                blocks[j] = BlockRec { size: b.size + n, state: BState::Free, ..b };
                remove_block(blocks, j + 1);
            }
            (true, None) => {
                blocks[j - 1].size += b.size;
                remove_block(blocks, j);
            }
            (true, Some(n)) => {
                blocks[j - 1].size += b.size + n;
                // Both gone in one shift of the blocks after them.
                blocks.copy_within(j + 2.., j);
                blocks.truncate(blocks.len() - 2);
            }
        }
        // The free block holding the address now; noted last, as a store through the
        // hint table makes the compiler load the segment's blocks again.
        self.segs.set_pos(ev.addr, j - prev_free as usize);
        let touched = Undone { block: b, small, expandable, left, revised: false };
        Ok(touched)
    }

    /// Undo a `free_requested` (the pending block is allocated again); the block.
    #[inline(always)]
    pub(crate) fn undo_free_requested(&mut self, index: usize, ev: &TraceEvent) -> Result<Undone, Inconsistency> {
        let Some(seg) = self.segs.containing_mut(ev.addr) else {
            return Err(err(index, ev, "free_requested of an address in no segment"));
        };
        let Some(j) = seg.block_at(ev.addr) else { return Err(err(index, ev, UNCOVERED)) };
        let b = &mut seg.blocks[j];
        if b.addr != ev.addr || b.state != BState::Pending {
            return Err(not_pending(index, ev, b));
        }
        b.state = BState::Allocated;
        Ok(Undone { block: *b, small: seg.small, expandable: seg.expandable, left: None, revised: false })
    }

    /// Undo a `free_completed`: the block is cut out of the free block holding its
    /// address (pending free again), its size recovered from the request and the split
    /// rule (§10.11), choices noted in `ambiguous`; the block.
    #[inline]
    pub(crate) fn undo_free_completed(
        &mut self,
        index: usize,
        ev: &TraceEvent,
        rules: &SplitRules,
        ambiguous: &mut Vec<Ambiguity>,
    ) -> Result<Undone, Inconsistency> {
        self.undo_free_completed_as(index, ev, (rules.round)(ev.size), rules, ambiguous, BState::Pending)
    }

    /// [`Self::undo_free_completed`] of `fc` (entry `index`), then
    /// [`Self::undo_free_requested`] of `fr`, the entry before it, of the same address:
    /// PyTorch writes a block's `free_completed` right after its `free_requested` unless
    /// the block waits for events on other streams, so a backward walk meets the two one
    /// after the other. The pending block the first undo makes is the one the second
    /// finds (the same segment through the lookup's hint, and in a segment whose blocks
    /// tile it, the block starting at the address), so it is not looked up again. For
    /// states whose segments' blocks tile them ([`RecordedState::blocks_tile_segments`]);
    /// the walk keeps that. `rounded` is `(rules.round)(fc.size)`, from the caller: a walk
    /// that keeps the rounded sizes it met saves the call through the pointer (most
    /// entries ask for a size met before). Returns the two blocks.
    #[inline]
    pub(crate) fn undo_free_pair(
        &mut self,
        index: usize,
        fc: &TraceEvent,
        fr: &TraceEvent,
        rounded: u64,
        rules: &SplitRules,
        ambiguous: &mut Vec<Ambiguity>,
    ) -> Result<(Undone, Undone), Inconsistency> {
        debug_assert!(fc.addr == fr.addr && fr.action == Action::FreeRequested && index > 0);
        debug_assert_eq!(rounded, (rules.round)(fc.size));
        let completed = self.undo_free_completed_as(index, fc, rounded, rules, ambiguous, BState::Allocated)?;
        let block = BlockRec { state: BState::Allocated, ..completed.block };
        Ok((completed, Undone { block, revised: false, ..completed }))
    }

    /// Every segment's blocks are in address order, each starting where the one before
    /// it ends, from the segment's start to its end (as PyTorch's snapshots list them;
    /// every undo keeps it). Where they do, [`SegRec::block_at`] finds the one block
    /// holding an address.
    pub fn blocks_tile_segments(&self) -> bool {
        self.segs.values().all(|s| {
            let mut at = s.addr;
            s.blocks.iter().all(|b| {
                let ok = b.addr == at && b.size > 0;
                at = b.addr.wrapping_add(b.size);
                ok
            }) && at == s.end()
                && !s.blocks.is_empty()
        })
    }

    /// [`Self::undo_free_completed`], the block left in state `then`: `Pending` (the undo
    /// alone), or `Allocated` when its `free_requested` is undone with it
    /// ([`Self::undo_free_pair`], which then need not find the block again). The
    /// [`Undone`] holds the block pending, as the undo alone leaves it. `rounded` is
    /// `(rules.round)(ev.size)`.
    #[inline(always)]
    fn undo_free_completed_as(
        &mut self,
        index: usize,
        ev: &TraceEvent,
        rounded: u64,
        rules: &SplitRules,
        ambiguous: &mut Vec<Ambiguity>,
        then: BState,
    ) -> Result<Undone, Inconsistency> {
        let Some(slot) = self.segs.slot_containing(ev.addr) else {
            return Err(err(index, ev, "free_completed of an address in no segment"));
        };
        let Some(mut j) = self.segs.block_index(slot, ev.addr) else { return Err(err(index, ev, UNCOVERED)) };
        let seg = &mut self.segs.recs[slot];
        let mut revised = false;
        if seg.blocks[j].state != BState::Free {
            if let Some(k) = seg.revise_whole_take(j, ev.addr, rules) {
                j = k;
                revised = true;
            }
        }
        let mut f = seg.blocks[j];
        if f.state != BState::Free {
            return Err(still_live(index, ev, f.state));
        }
        if ev.addr > f.addr && !seg.expandable && seg.grow_over_remainder(j, ev.addr).is_some() {
            f = seg.blocks[j];
            revised = true;
        }
        let avail = f.addr + f.size - ev.addr;
        // A block alive before the recording may have been rounded under another
        // configuration (one changed at run time by `_set_allocator_settings`, or a
        // simulated run under other settings seeded with the recorded blocks): when
        // the configuration's rounding does not fit but a 512-byte rounding does, the
        // block is the free space there.
        let s = match rounded {
            s if s > avail && avail >= ev.size.max(1).div_ceil(MIN_BLOCK) * MIN_BLOCK => avail,
            s => s,
        };
        if avail < s {
            return Err(too_little_free(index, ev, avail));
        }
        let (mut guessed, mut may_grow) = (false, 0);
        let b = if seg.small || seg.expandable {
            // Remainders ≥ 512 are always split: the block was exactly `s`.
            s
        } else {
            let oversize = rules.max_split_size.is_some_and(|m| s >= m);
            let slack = if oversize { rules.max_non_split_rounding } else { SPLIT_LARGE_MIN + 1 };
            let tail = avail - s;
            if tail == 0 {
                s
            } else if tail < slack && (oversize || tail <= SPLIT_LARGE_MIN) {
                // Free large-pool blocks are always > 1 MiB, so a shorter tail
                // cannot exist: the block took the whole free block. An oversize
                // block never splits, so it took it whole too, unless its segment
                // was carved under another `max_split_size`: kept revisable.
                guessed = oversize && tail > SPLIT_LARGE_MIN;
                avail
            } else {
                // Either split (size s) or took a cached block up to s+slack
                // whole; the trace cannot tell. Prefer the split.
                let max_possible = (s + slack - 1).min(avail - SPLIT_LARGE_MIN - 1) / MIN_BLOCK * MIN_BLOCK;
                if max_possible > s {
                    ambiguous.push(Ambiguity { index, addr: ev.addr, chosen: s, max_possible });
                    may_grow = u32::try_from((max_possible - s) / MIN_BLOCK).unwrap_or(u32::MAX);
                }
                s
            }
        };
        // Replace the free block by [before] me [after], shifting the tail once.
        let me = BlockRec { addr: ev.addr, size: b, requested: ev.size, state: BState::Pending, guessed, may_grow };
        let stored = BlockRec { state: then, ..me };
        let after = BlockRec {
            addr: ev.addr + b,
            size: avail - b,
            requested: 0,
            state: BState::Free,
            guessed: false,
            may_grow: 0,
        };
        let (has_before, has_after) = (ev.addr > f.addr, avail > b);
        let before = BlockRec {
            addr: f.addr,
            size: ev.addr - f.addr,
            requested: 0,
            state: BState::Free,
            guessed: false,
            may_grow: 0,
        };
        // The free block becomes [before] me [after]: one shift of the blocks after it
        // (two when it splits in three, the rarer case).
        let blocks = &mut seg.blocks;
        let at = j + has_before as usize;
        match (has_before, has_after) {
            (false, false) => blocks[j] = stored,
            (false, true) => {
                blocks[j] = stored;
                blocks.insert(j + 1, after);
            }
            (true, false) => {
                blocks[j] = before;
                blocks.insert(j + 1, stored);
            }
            (true, true) => {
                blocks[j] = before;
                blocks.insert(j + 1, after);
                blocks.insert(j + 1, stored);
            }
        }
        let touched = Undone { block: me, small: seg.small, expandable: seg.expandable, left: None, revised };
        self.segs.set_pos(ev.addr, at);
        Ok(touched)
    }

    /// Undo a segment entry (`segment_alloc`, `segment_free`, `segment_map`,
    /// `segment_unmap`; other non-block entries change nothing).
    pub fn undo_segment(&mut self, index: usize, ev: &TraceEvent, home: Home) -> Result<(), Inconsistency> {
        match ev.action {
            Action::SegmentFree => {
                if self.overlaps(ev.addr, ev.size) {
                    return Err(err(index, ev, "segment_free of a range that overlaps a later segment"));
                }
                let small = ev.size == SMALL_BUFFER;
                self.segs.insert(ev.addr, SegRec::whole_free(ev.addr, ev.size, home.stream, home.pool, small, false));
            }
            Action::SegmentAlloc => match self.segs.get(&ev.addr) {
                Some(s) if s.size == ev.size && s.is_whole_free() => {
                    self.segs.remove(&ev.addr);
                }
                Some(s) => {
                    return Err(err(
                        index,
                        ev,
                        format!("segment_alloc, but the segment later is {} B with {} blocks", s.size, s.blocks.len()),
                    ))
                }
                None => return Err(err(index, ev, "segment_alloc of a segment absent later")),
            },
            Action::SegmentMap => self.cut_range(ev.addr, ev.size).map_err(|r| err(index, ev, r.to_string()))?,
            Action::SegmentUnmap => self
                .insert_range(ev.addr, ev.size, home.stream, home.pool)
                .map_err(|r| err(index, ev, r.to_string()))?,
            _ => {}
        }
        Ok(())
    }
    /// Apply one recorded event forwards (the inverse of [`Self::undo`]).
    pub fn apply(
        &mut self,
        index: usize,
        ev: &TraceEvent,
        home: Home,
        rules: &SplitRules,
    ) -> Result<(), Inconsistency> {
        match ev.action {
            Action::Alloc => {
                let seg = self.seg_mut(ev.addr).ok_or_else(|| err(index, ev, "alloc in no segment"))?;
                let j = seg.block_at(ev.addr).ok_or_else(|| err(index, ev, UNCOVERED))?;
                let f = seg.blocks[j];
                if f.addr != ev.addr || f.state != BState::Free {
                    return Err(err(
                        index,
                        ev,
                        format!("alloc, but no free block starts there ({:?} at {:#x})", f.state, f.addr),
                    ));
                }
                let s = (rules.round)(ev.size);
                if f.size < s {
                    return Err(err(index, ev, format!("alloc of {s} B into a free block of {} B", f.size)));
                }
                let (small, exp) = (seg.small, seg.expandable);
                if rules.should_split(small, exp, f.size, s) {
                    seg.blocks[j] = BlockRec {
                        addr: f.addr,
                        size: s,
                        requested: ev.size,
                        state: BState::Allocated,
                        guessed: false,
                        may_grow: 0,
                    };
                    seg.blocks.insert(
                        j + 1,
                        BlockRec {
                            addr: f.addr + s,
                            size: f.size - s,
                            requested: 0,
                            state: BState::Free,
                            guessed: false,
                            may_grow: 0,
                        },
                    );
                } else {
                    seg.blocks[j] = BlockRec { requested: ev.size, state: BState::Allocated, ..f };
                }
            }
            Action::FreeRequested => {
                let b = self.block_starting_mut(ev.addr).ok_or_else(|| err(index, ev, "free_requested of no block"))?;
                if b.state != BState::Allocated {
                    return Err(err(index, ev, format!("free_requested of a {:?} block", b.state)));
                }
                b.state = BState::Pending;
            }
            Action::FreeCompleted => {
                let seg = self.seg_mut(ev.addr).ok_or_else(|| err(index, ev, "free_completed in no segment"))?;
                let j = seg.block_at(ev.addr).ok_or_else(|| err(index, ev, UNCOVERED))?;
                if seg.blocks[j].addr != ev.addr || seg.blocks[j].state == BState::Free {
                    return Err(err(index, ev, "free_completed of no live block"));
                }
                seg.blocks[j].state = BState::Free;
                seg.merge_free(j);
            }
            Action::SegmentAlloc => {
                if self.overlaps(ev.addr, ev.size) {
                    return Err(err(index, ev, "segment_alloc overlapping a live segment"));
                }
                let small = ev.size == SMALL_BUFFER;
                self.segs.insert(ev.addr, SegRec::whole_free(ev.addr, ev.size, home.stream, home.pool, small, false));
            }
            Action::SegmentFree => match self.segs.get(&ev.addr) {
                Some(s) if s.size == ev.size && s.is_whole_free() => {
                    self.segs.remove(&ev.addr);
                }
                _ => return Err(err(index, ev, "segment_free of no whole free segment")),
            },
            Action::SegmentMap => self
                .insert_range(ev.addr, ev.size, home.stream, home.pool)
                .map_err(|r| err(index, ev, r.to_string()))?,
            Action::SegmentUnmap => self.cut_range(ev.addr, ev.size).map_err(|r| err(index, ev, r.to_string()))?,
            _ => {}
        }
        Ok(())
    }

    fn block_starting_mut(&mut self, addr: u64) -> Option<&mut BlockRec> {
        let seg = self.seg_mut(addr)?;
        let j = seg.block_at(addr)?;
        let b = &mut seg.blocks[j];
        (b.addr == addr).then_some(b)
    }

    /// Remove a free mapped range from an expandable segment (undo map / apply unmap).
    fn cut_range(&mut self, addr: u64, size: u64) -> Result<(), RangeError> {
        let k = self.seg_key(addr).ok_or(RangeError::NoSegment)?;
        let j = self.segs.get(&k).and_then(|s| s.block_at(addr)).ok_or(RangeError::Uncovered)?;
        let Some(mut seg) = self.segs.remove(&k) else { return Err(RangeError::NoSegment) };
        let end = addr + size;
        let f = &seg.blocks[j];
        if f.state != BState::Free || f.addr + f.size < end {
            let e = RangeError::NotFree { state: f.state, addr: f.addr, size: f.size };
            self.segs.insert(k, seg);
            return Err(e);
        }
        let (fa, fs) = (f.addr, f.size);
        let mut left: Vec<BlockRec> = seg.blocks.drain(..j).collect();
        let mut right: Vec<BlockRec> = seg.blocks.drain(1..).collect();
        if fa < addr {
            left.push(BlockRec {
                addr: fa,
                size: addr - fa,
                requested: 0,
                state: BState::Free,
                guessed: false,
                may_grow: 0,
            });
        }
        if fa + fs > end {
            right.insert(
                0,
                BlockRec {
                    addr: end,
                    size: fa + fs - end,
                    requested: 0,
                    state: BState::Free,
                    guessed: false,
                    may_grow: 0,
                },
            );
        }
        if !left.is_empty() {
            self.segs.insert(seg.addr, SegRec { size: addr - seg.addr, blocks: left, ..seg.clone() });
        }
        if !right.is_empty() {
            self.segs.insert(end, SegRec { addr: end, size: seg.end() - end, blocks: right, ..seg });
        }
        Ok(())
    }

    /// Add a free mapped range to expandable memory, merging with adjacent mapped
    /// ranges of the same stream and pool (undo unmap / apply map).
    fn insert_range(&mut self, addr: u64, size: u64, stream: u64, pool: (u64, u64)) -> Result<(), RangeError> {
        if self.overlaps(addr, size) {
            return Err(RangeError::OverlapsMapped);
        }
        let end = addr + size;
        let prev = self
            .segs
            .last_before(addr)
            .filter(|s| s.expandable && s.end() == addr && s.stream == stream && s.pool == pool)
            .map(|s| s.addr);
        let next = self.segs.get(&end).filter(|s| s.expandable && s.stream == stream && s.pool == pool).map(|s| s.addr);
        let small = match (prev, next) {
            (Some(p), _) => self.segs[&p].small,
            (_, Some(n)) => self.segs[&n].small,
            _ => !size.is_multiple_of(20 << 20),
        };
        let mut seg = match prev {
            Some(p) => self.segs.remove(&p).unwrap(),
            None => SegRec { addr, size: 0, stream, pool, small, expandable: true, blocks: Vec::new() },
        };
        seg.size += size;
        seg.blocks.push(BlockRec { addr, size, requested: 0, state: BState::Free, guessed: false, may_grow: 0 });
        let j = seg.blocks.len() - 1;
        seg.merge_free(j);
        if let Some(n) = next {
            let nseg = self.segs.remove(&n).unwrap();
            seg.size += nseg.size;
            let j = seg.blocks.len() - 1;
            seg.blocks.extend(nseg.blocks);
            seg.merge_free(j);
        }
        self.segs.insert(seg.addr, seg);
        Ok(())
    }
}

/// The state at the first trace event, by the backward walk (§10.12).
#[derive(Debug)]
pub struct Initial {
    pub state: RecordedState,
    /// Size choices for blocks alive at the first entry (latest entry first). A
    /// choice for a block whose alloc is in the trace does not matter (the forward
    /// replay makes that block itself) and is not listed.
    pub ambiguous: Vec<Ambiguity>,
    /// Choices for blocks alive at the first entry that an earlier entry decided
    /// ([`BlockRec::may_grow`]): the choice first made, and the size proven.
    pub decided: Vec<(Ambiguity, u64)>,
}

/// Entries of a trace by kind, counted by [`backward_walk_counted`] as it passes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct TraceCounts {
    pub allocs: u64,
    /// `segment_alloc`, `segment_free`, `segment_map` and `segment_unmap`.
    pub segment_events: u64,
    pub segment_maps: u64,
    pub ooms: u64,
}

impl TraceCounts {
    /// Count `trace` in a pass of its own (when no walk goes over all of it).
    pub fn of(trace: &[TraceEvent]) -> TraceCounts {
        let mut c = TraceCounts::default();
        for e in trace {
            c.add(e.action);
        }
        c
    }
    #[inline]
    fn add(&mut self, a: Action) {
        match a {
            Action::Alloc => self.allocs += 1,
            Action::SegmentMap => {
                self.segment_events += 1;
                self.segment_maps += 1;
            }
            Action::SegmentAlloc | Action::SegmentFree | Action::SegmentUnmap => self.segment_events += 1,
            Action::Oom => self.ooms += 1,
            _ => {}
        }
    }
}

/// Walk `trace` backwards from `final_state`. On an inconsistency, returns it (the
/// index is that of the event that could not be undone).
pub fn backward_walk(
    final_state: RecordedState,
    trace: &[TraceEvent],
    home: &dyn Fn(&TraceEvent) -> Home,
    rules: &SplitRules,
) -> Result<Initial, Inconsistency> {
    backward_walk_counted(final_state, trace, home, rules).map(|(i, _)| i)
}

/// [`backward_walk`], also counting the entries by kind on the way: the walk
/// reads every entry anyway, and a trace of millions of entries is hundreds of
/// MB, so a separate counting pass costs a read of all of it from memory.
pub(crate) fn backward_walk_counted(
    final_state: RecordedState,
    trace: &[TraceEvent],
    home: &dyn Fn(&TraceEvent) -> Home,
    rules: &SplitRules,
) -> Result<(Initial, TraceCounts), Inconsistency> {
    let mut counts = TraceCounts::default();
    let mut state = final_state;
    let mut scratch = Vec::new();
    let mut open = OpenChoices::default();
    for (i, ev) in trace.iter().enumerate().rev() {
        state.undo(i, ev, home(ev), rules, &mut scratch)?;
        counts.add(ev.action);
        open.step(ev, &mut scratch);
    }
    let (ambiguous, decided) = open.finish(&state);
    Ok((Initial { state, ambiguous, decided }, counts))
}

/// Choices whose block has no alloc earlier in the trace yet (walking back): at most the
/// live blocks, so memory does not grow with the trace.
#[derive(Default)]
struct OpenChoices(std::collections::HashMap<u64, Vec<Ambiguity>, super::AddrBuild>);

impl OpenChoices {
    /// After undoing `ev`: a free's new choices open, an alloc closes its block's.
    fn step(&mut self, ev: &TraceEvent, scratch: &mut Vec<Ambiguity>) {
        match ev.action {
            Action::FreeCompleted if !scratch.is_empty() => {
                for a in scratch.drain(..) {
                    self.0.entry(a.addr).or_default().push(a);
                }
            }
            Action::Alloc if !self.0.is_empty() => {
                self.0.remove(&ev.addr);
            }
            _ => {}
        }
    }
    /// The choices still open at the state of the first entry, and those an earlier
    /// entry decided (the block there is no longer the size chosen), latest entry first.
    fn finish(self, state: &RecordedState) -> (Vec<Ambiguity>, Vec<(Ambiguity, u64)>) {
        let mut ambiguous: Vec<Ambiguity> = self.0.into_values().flatten().collect();
        ambiguous.sort_by_key(|a| std::cmp::Reverse(a.index));
        let mut decided = Vec::new();
        ambiguous.retain(|a| match state.block_starting(a.addr) {
            Some((b, _, _)) if b.size != a.chosen && b.state != BState::Free => {
                decided.push((a.clone(), b.size));
                false
            }
            _ => true,
        });
        (ambiguous, decided)
    }
}

/// What one forward pass over a trace gives the segment-by-segment walk
/// ([`walk_live_at_start`]): the counts by kind and where the segment events are.
#[derive(Clone, Debug, Default)]
pub(crate) struct TraceScan {
    pub counts: TraceCounts,
    /// Indices of the `segment_alloc`, `segment_free`, `segment_map` and
    /// `segment_unmap` entries, ascending.
    pub seg_events: Vec<usize>,
    pub unmaps: u64,
}

impl TraceScan {
    pub fn of(trace: &[TraceEvent]) -> TraceScan {
        let mut sc = TraceScan::default();
        for (i, e) in trace.iter().enumerate() {
            match e.action {
                Action::Alloc => sc.counts.allocs += 1,
                Action::Oom => sc.counts.ooms += 1,
                Action::FreeRequested | Action::FreeCompleted => {}
                Action::SegmentAlloc | Action::SegmentFree | Action::SegmentMap | Action::SegmentUnmap => {
                    sc.counts.add(e.action);
                    sc.unmaps += (e.action == Action::SegmentUnmap) as u64;
                    sc.seg_events.push(i);
                }
                _ => {}
            }
        }
        sc
    }
}

/// The backward walk of [`backward_walk`], block by block only in the segments
/// that exist at the first entry (the only ones the state at entry 0 holds).
/// A segment that a `segment_alloc` of the trace creates (at its address,
/// before the point where the walk meets it) is kept as an address range with
/// no blocks: the walk checks its size when it undoes that `segment_alloc` and
/// the overlaps of other segments against it, and skips the entries inside it.
/// Before the latest point where a segment living at entry 0 exists, the walk
/// reads every entry; after it, only the segment entries.
///
/// `None` when the walk meets something it cannot undo, or a `segment_map` /
/// `segment_unmap` (expandable segments are left to the full walk).
///
/// When this walk succeeds and the forward replay seeded with its result then
/// reproduces every recorded entry of the trace in full (see
/// `driver::verify_fast`), the full walk would have succeeded with the same
/// state and the same size choices: in a segment the model created, the full
/// walk's blocks start where the model's do, in the same states, never larger
/// (a size choice only shortens a block, leaving a free gap inside the model's
/// block), so each check it makes holds.
pub(crate) fn walk_live_at_start(
    snap: &Snapshot,
    device: i64,
    trace: &[TraceEvent],
    scan: &TraceScan,
    home: &dyn Fn(&TraceEvent) -> Home,
    rules: &SplitRules,
) -> Option<Initial> {
    if scan.counts.segment_maps > 0 || scan.unmaps > 0 {
        return None;
    }
    let n = trace.len();
    // `(address, index)` of every segment_alloc, ascending.
    let mut created: Vec<(u64, usize)> = scan
        .seg_events
        .iter()
        .filter(|&&i| trace[i].action == Action::SegmentAlloc)
        .map(|&i| (trace[i].addr, i))
        .collect();
    created.sort_unstable();
    // Is the segment at `addr` that exists right before entry `at` one the trace
    // creates (a segment_alloc at its address earlier)?
    let created_before = |addr: u64, at: usize| {
        let k = created.partition_point(|&c| c < (addr, at));
        k > 0 && created[k - 1].0 == addr
    };
    let mut state = RecordedState::default();
    // Entries below `full_from` are walked one by one.
    let mut full_from = 0;
    for s in snap.device_segments(device) {
        let live_at_start = !created_before(s.address, n);
        if live_at_start {
            full_from = n;
        }
        state.segs.insert(s.address, seg_rec_of(s, live_at_start));
    }
    for &f in &scan.seg_events {
        let e = &trace[f];
        if e.action == Action::SegmentFree && !created_before(e.addr, f) {
            full_from = full_from.max(f);
        }
    }
    let mut scratch = Vec::new();
    let mut open = OpenChoices::default();
    let tail = scan.seg_events.partition_point(|&i| i < full_from);
    for &i in scan.seg_events[tail..].iter().rev() {
        state.undo_by_segment(i, &trace[i], home(&trace[i]), rules, &mut scratch, &created_before)?;
    }
    for (i, ev) in trace[..full_from].iter().enumerate().rev() {
        state.undo_by_segment(i, ev, home(ev), rules, &mut scratch, &created_before)?;
        open.step(ev, &mut scratch);
    }
    let (ambiguous, decided) = open.finish(&state);
    Some(Initial { state, ambiguous, decided })
}

impl RecordedState {
    /// [`Self::undo`] for [`walk_live_at_start`]: segments without blocks (made
    /// by the trace) are ranges whose inner entries are skipped.
    fn undo_by_segment(
        &mut self,
        index: usize,
        ev: &TraceEvent,
        home: Home,
        rules: &SplitRules,
        ambiguous: &mut Vec<Ambiguity>,
        created_before: &dyn Fn(u64, usize) -> bool,
    ) -> Option<()> {
        match ev.action {
            Action::Alloc | Action::FreeRequested | Action::FreeCompleted
                if self.seg_mut(ev.addr)?.blocks.is_empty() =>
            {
                return Some(());
            }
            Action::SegmentFree if created_before(ev.addr, index) => {
                if self.overlaps(ev.addr, ev.size) {
                    return None;
                }
                let small = ev.size == SMALL_BUFFER;
                let mut rec = SegRec::whole_free(ev.addr, ev.size, home.stream, home.pool, small, false);
                rec.blocks.clear();
                self.segs.insert(ev.addr, rec);
                return Some(());
            }
            Action::SegmentAlloc => {
                if let Some(s) = self.segs.get(&ev.addr).filter(|s| s.blocks.is_empty()) {
                    if s.size != ev.size {
                        return None;
                    }
                    self.segs.remove(&ev.addr);
                    return Some(());
                }
            }
            Action::SegmentMap | Action::SegmentUnmap => return None,
            _ => {}
        }
        self.undo(index, ev, home, rules, ambiguous).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round512(n: u64) -> u64 {
        n.max(1).div_ceil(512) * 512
    }
    fn rules() -> SplitRules<'static> {
        SplitRules { round: &round512, max_split_size: None, max_non_split_rounding: 20 << 20 }
    }
    const MIB: u64 = 1 << 20;

    fn ev(a: Action, addr: u64, size: u64) -> TraceEvent {
        TraceEvent::new(a, addr, size)
    }

    /// Forward-apply a trace to the initial state, then walk it back: we must get
    /// the initial state again, and forward again the same final state.
    fn roundtrip(trace: &[TraceEvent]) -> (RecordedState, RecordedState) {
        let r = rules();
        let mut s = RecordedState::default();
        for (i, e) in trace.iter().enumerate() {
            s.apply(i, e, Home::default(), &r).unwrap();
        }
        let fin = s.clone();
        let init = backward_walk(s, trace, &|_| Home::default(), &r).unwrap();
        assert_eq!(init.state, RecordedState::default());
        (fin, init.state)
    }

    #[test]
    fn split_and_merge_round_trip() {
        let a = 0x7000_0000;
        let t = vec![
            ev(Action::SegmentAlloc, a, 20 * MIB),
            ev(Action::Alloc, a, 5 * MIB),
            ev(Action::Alloc, a + 5 * MIB, 12 * MIB),
            ev(Action::FreeRequested, a, 5 * MIB),
            ev(Action::FreeCompleted, a, 5 * MIB),
            ev(Action::FreeRequested, a + 5 * MIB, 12 * MIB),
            ev(Action::FreeCompleted, a + 5 * MIB, 12 * MIB),
            ev(Action::SegmentFree, a, 20 * MIB),
        ];
        let (fin, _) = roundtrip(&t);
        assert!(fin.segs.is_empty());
    }

    #[test]
    fn unsplit_tail_is_recovered_from_the_neighbour() {
        // 19.5 MiB in a 20 MiB segment: not split (remainder 0.5 MiB ≤ 1 MiB).
        let a = 0x7000_0000;
        let t = [ev(Action::SegmentAlloc, a, 20 * MIB), ev(Action::Alloc, a, 19 * MIB + MIB / 2)];
        let r = rules();
        let mut s = RecordedState::default();
        for (i, e) in t.iter().enumerate() {
            s.apply(i, e, Home::default(), &r).unwrap();
        }
        assert_eq!(s.segs[&a].blocks.len(), 1);
        // A block alive before the trace whose free we see: the walk must give it the whole segment.
        let mut fin = s.clone();
        fin.apply(2, &ev(Action::FreeRequested, a, 19 * MIB + MIB / 2), Home::default(), &r).unwrap();
        fin.apply(3, &ev(Action::FreeCompleted, a, 19 * MIB + MIB / 2), Home::default(), &r).unwrap();
        let frees =
            [ev(Action::FreeRequested, a, 19 * MIB + MIB / 2), ev(Action::FreeCompleted, a, 19 * MIB + MIB / 2)];
        let init = backward_walk(fin, &frees, &|_| Home::default(), &r).unwrap();
        assert_eq!(init.state, s);
        assert!(init.ambiguous.is_empty());
    }

    /// An oversize block (never split under `max_split_size`) whose free leaves free
    /// space with a tail under `max_non_split_rounding`: the walk first gives it the
    /// whole space (an unsplit cached block). When an earlier entry frees a block in
    /// that tail while the oversize block was alive, the block was exactly its request
    /// next to a free block (a segment carved before `max_split_size` was set): the
    /// walk revises its guess instead of calling the trace undecidable.
    #[test]
    fn oversize_whole_take_is_revised_when_the_tail_was_used() {
        let round = |n: u64| n.max(1).div_ceil(2 * MIB) * (2 * MIB);
        let r = SplitRules { round: &round, max_split_size: Some(64 * MIB), max_non_split_rounding: 20 * MIB };
        let a = 0x7000_0000;
        let (big, small) = (100 * MIB, 10 * MIB);
        // Before the recording: one 110 MiB segment holding the 100 MiB block, carved
        // when no max_split_size applied, and a free 10 MiB tail.
        let mut start = RecordedState::default();
        let mut seg = SegRec::whole_free(a, big + small, 0, (0, 0), false, false);
        seg.blocks = vec![
            BlockRec { addr: a, size: big, requested: big, state: BState::Allocated, guessed: false, may_grow: 0 },
            BlockRec { addr: a + big, size: small, requested: 0, state: BState::Free, guessed: false, may_grow: 0 },
        ];
        start.segs.insert(a, seg);
        let t = [
            ev(Action::Alloc, a + big, small),
            ev(Action::FreeRequested, a + big, small),
            ev(Action::FreeCompleted, a + big, small),
            ev(Action::FreeRequested, a, big),
            ev(Action::FreeCompleted, a, big),
        ];
        let mut fin = start.clone();
        for (i, e) in t.iter().enumerate() {
            fin.apply(i, e, Home::default(), &r).unwrap();
        }
        assert!(fin.segs.get(&a).unwrap().is_whole_free());
        // The undo that revises the guess (the tail block's free_completed) says so, and
        // no other: memory_summary's counting walk stops vouching there.
        let mut st = fin.clone();
        let revised: Vec<usize> = (0..t.len())
            .rev()
            .filter(|&i| {
                st.undo_touching(i, &t[i], Home::default(), &r, &mut Vec::new()).unwrap().is_some_and(|u| u.revised)
            })
            .collect();
        assert_eq!(revised, [2]);
        assert_eq!(st, start);
        let init = backward_walk(fin.clone(), &t, &|_| Home::default(), &r).expect("a valid trace is decidable");
        assert_eq!(init.state, start, "the 100 MiB block and its free tail are recovered");
        // Without the entries in the tail the whole-take reading stands (the usual case).
        let init = backward_walk(fin, &t[3..], &|_| Home::default(), &r).unwrap();
        assert_eq!(init.state.segs.get(&a).unwrap().blocks[0].size, big + small);
        // A block the snapshot itself records (not a guess) is never shrunk: the same
        // entries against a final state holding a 110 MiB block are an inconsistency.
        let mut held = RecordedState::default();
        let mut seg = SegRec::whole_free(a, big + small, 0, (0, 0), false, false);
        seg.blocks[0] = BlockRec { requested: big, state: BState::Allocated, ..seg.blocks[0] };
        held.segs.insert(a, seg);
        assert!(backward_walk(held, &t[..3], &|_| Home::default(), &r).is_err());
    }

    #[test]
    fn expandable_map_unmap() {
        let a = 0x7f00_0000_0000;
        let p = 20 * MIB;
        let t = vec![
            ev(Action::SegmentMap, a, p),
            ev(Action::Alloc, a, 5 * MIB),
            ev(Action::SegmentMap, a + p, 2 * p),
            ev(Action::Alloc, a + 5 * MIB, 30 * MIB),
            ev(Action::FreeRequested, a + 5 * MIB, 30 * MIB),
            ev(Action::FreeCompleted, a + 5 * MIB, 30 * MIB),
            ev(Action::SegmentUnmap, a + p, 2 * p),
        ];
        let r = rules();
        let mut s = RecordedState::default();
        for (i, e) in t.iter().enumerate() {
            s.apply(i, e, Home::default(), &r).unwrap();
        }
        assert_eq!(s.segs.len(), 1);
        assert_eq!(s.segs[&a].size, p);
        let init = backward_walk(s, &t, &|_| Home::default(), &r).unwrap();
        assert!(init.state.segs.is_empty());
    }

    /// Lookups through the granule hints stay exact when segments go and their
    /// slab slots are reused by other segments in the same granules.
    #[test]
    fn segment_lookup_survives_removal_and_slot_reuse() {
        let seg = |addr: u64, size: u64| SegRec::whole_free(addr, size, 0, (0, 0), false, false);
        let mut m = SegMap::default();
        let a = 0x7000_0000;
        m.insert(a + 4 * MIB, seg(a + 4 * MIB, 2 * MIB));
        m.insert(a, seg(a, 3 * MIB));
        assert_eq!(m.containing_mut(a + MIB).map(|s| s.addr), Some(a));
        assert_eq!(m.containing_mut(a + 5 * MIB).map(|s| s.addr), Some(a + 4 * MIB));
        assert!(m.containing_mut(a + 3 * MIB).is_none());
        // Remove the first segment; a smaller one reuses its slot in the same granule.
        assert_eq!(m.remove(&a).map(|s| s.size), Some(3 * MIB));
        assert!(m.containing_mut(a + MIB).is_none());
        m.insert(a + MIB + MIB / 2, seg(a + MIB + MIB / 2, MIB));
        assert!(m.containing_mut(a + MIB).is_none());
        assert_eq!(m.containing_mut(a + 2 * MIB).map(|s| s.addr), Some(a + MIB + MIB / 2));
        // Addresses 4096 granules apart share a hint.
        let far = a + (4096 << 21);
        m.insert(far, seg(far, 2 * MIB));
        assert_eq!(m.containing_mut(far + 1).map(|s| s.addr), Some(far));
        assert_eq!(m.containing_mut(a + 2 * MIB).map(|s| s.addr), Some(a + MIB + MIB / 2));
        assert_eq!(m.values().map(|s| s.addr).collect::<Vec<_>>(), vec![a + MIB + MIB / 2, a + 4 * MIB, far]);
        let mut same = SegMap::default();
        for s in m.values() {
            same.insert(s.addr, s.clone());
        }
        assert_eq!(m, same);
    }

    /// A snapshot whose final segments are `st` and whose trace is `trace`.
    fn snapshot_of(st: &RecordedState, trace: &[TraceEvent]) -> Snapshot {
        use fragscope_snapshot::{Block, Segment, SegmentType};
        let mut snap = Snapshot::default();
        for s in st.segs.values() {
            snap.segments.push(Segment {
                device: 0,
                address: s.addr,
                total_size: s.size,
                allocated_size: 0,
                active_size: 0,
                requested_size: None,
                stream: s.stream,
                segment_type: if s.small { SegmentType::Small } else { SegmentType::Large },
                segment_pool_id: Some(s.pool),
                is_expandable: Some(false),
                stack: None,
                blocks: s
                    .blocks
                    .iter()
                    .map(|b| Block {
                        address: b.addr,
                        size: b.size,
                        requested_size: Some(b.requested),
                        state: match b.state {
                            BState::Free => BlockState::Inactive,
                            BState::Allocated => BlockState::ActiveAllocated,
                            BState::Pending => BlockState::ActivePendingFree,
                        },
                        stack: None,
                        history: None,
                    })
                    .collect(),
            });
        }
        snap.device_traces = vec![trace.to_vec()];
        snap
    }

    /// The walk of the segments alive at entry 0 gives the full walk's state and
    /// size choices: segments made by the trace (one made, one freed and made
    /// again) are skipped, segments alive at the start are walked block by block.
    #[test]
    fn walk_of_segments_alive_at_start_equals_the_full_walk() {
        let r = rules();
        let (a, b, c, d) = (0x7000_0000u64, 0x7200_0000u64, 0x7400_0000u64, 0x7600_0000u64);
        let mut start = RecordedState::default();
        let mut sa = SegRec::whole_free(a, 20 * MIB, 0, (0, 0), false, false);
        sa.blocks = vec![
            BlockRec {
                addr: a,
                size: 5 * MIB,
                requested: 5 * MIB,
                state: BState::Allocated,
                guessed: false,
                may_grow: 0,
            },
            BlockRec {
                addr: a + 5 * MIB,
                size: 15 * MIB,
                requested: 0,
                state: BState::Free,
                guessed: false,
                may_grow: 0,
            },
        ];
        start.segs.insert(a, sa);
        start.segs.insert(c, SegRec::whole_free(c, 2 * MIB, 0, (0, 0), true, false));
        let t = vec![
            ev(Action::SegmentAlloc, b, 20 * MIB),
            ev(Action::Alloc, b, 4 * MIB),
            ev(Action::FreeRequested, a, 5 * MIB),
            ev(Action::FreeCompleted, a, 5 * MIB),
            ev(Action::SegmentFree, c, 2 * MIB),
            ev(Action::SegmentAlloc, c, 2 * MIB),
            ev(Action::Alloc, c, 512),
            ev(Action::Alloc, a, 3 * MIB),
            ev(Action::SegmentAlloc, d, 2 * MIB),
            ev(Action::Alloc, d, 1024),
            ev(Action::FreeRequested, b, 4 * MIB),
            ev(Action::FreeCompleted, b, 4 * MIB),
            ev(Action::FreeRequested, d, 1024),
            ev(Action::FreeCompleted, d, 1024),
            ev(Action::SegmentFree, d, 2 * MIB),
        ];
        let mut fin = start.clone();
        for (i, e) in t.iter().enumerate() {
            fin.apply(i, e, Home::default(), &r).unwrap();
        }
        let snap = snapshot_of(&fin, &t);
        let full = backward_walk(RecordedState::from_snapshot(&snap, 0), &t, &|_| Home::default(), &r).unwrap();
        let scan = TraceScan::of(&t);
        assert_eq!(scan.seg_events, vec![0, 4, 5, 8, 14]);
        let lazy = walk_live_at_start(&snap, 0, &t, &scan, &|_| Home::default(), &r).unwrap();
        assert_eq!(lazy.state, full.state);
        assert_eq!(lazy.ambiguous, full.ambiguous);
        assert_eq!(full.ambiguous.len(), 1, "the freed 5 MiB block could have been larger");
        assert_eq!(lazy.state, start);
        // Only segments the trace makes: the walk reads the segment entries alone.
        let t2: Vec<TraceEvent> = t[8..10].iter().chain(&t[12..]).copied().collect();
        let mut fin2 = RecordedState::default();
        for (i, e) in t2.iter().enumerate() {
            fin2.apply(i, e, Home::default(), &r).unwrap();
        }
        let snap2 = snapshot_of(&fin2, &t2);
        let lazy2 = walk_live_at_start(&snap2, 0, &t2, &TraceScan::of(&t2), &|_| Home::default(), &r).unwrap();
        assert!(lazy2.state.segs.is_empty());
    }

    /// A trace the forward model replays without a difference in its decisions,
    /// but whose free sizes the full walk rejects, is still undecidable: the
    /// verify that skips the walk of segments made by the trace gives up on the
    /// size the model's event does not share, and the full walk decides.
    #[test]
    fn verify_without_the_full_walk_keeps_its_verdicts() {
        let r = rules();
        let b = 0x7200_0000u64;
        let mut t = vec![
            ev(Action::SegmentAlloc, b, 20 * MIB),
            ev(Action::Alloc, b, 4 * MIB),
            ev(Action::FreeRequested, b, 4 * MIB),
            ev(Action::FreeCompleted, b, 4 * MIB),
        ];
        let mut fin = RecordedState::default();
        for (i, e) in t.iter().enumerate() {
            fin.apply(i, e, Home::default(), &r).unwrap();
        }
        let ok = crate::verify(&snapshot_of(&fin, &t), 0, &Default::default());
        assert!(ok.fully_matched() && ok.final_state_matches == Some(true), "{ok:?}");
        t[3].size = 30 * MIB;
        let bad = crate::verify(&snapshot_of(&fin, &t), 0, &Default::default());
        assert_eq!(
            bad.undecidable.as_deref(),
            Some(
                "undecidable at event 3 because the trace and the final state disagree: free_completed of \
                 31457280 B, but only 20971520 B are free there later (free_completed at 0x72000000, 31457280 B)"
            )
        );
    }

    /// Undoing a `free_completed` together with the `free_requested` right before it
    /// ([`RecordedState::undo_free_pair`], the table's walk) gives the state and the blocks
    /// that undoing them one after the other gives, on a recorded run with cached blocks,
    /// two streams and `empty_cache`; the run's blocks tile their segments at every step.
    #[test]
    fn paired_free_undo_equals_the_two_undos() {
        let mut r = crate::recorder::Recorder::new("", 4 << 30, 1_000_000, 10).unwrap();
        let st = r.stack(&[("train.py", 1, "main")]);
        let (mut live, mut x) = (Vec::new(), 0x2545_F491_4F6C_DD1Du64);
        for k in 0..2000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if k == 200 {
                r.begin_trace_here();
            }
            if x % 50 == 0 {
                r.empty_cache();
            } else if x % 2 == 0 || live.is_empty() {
                let n = [1 + x % 4096, (1 << 20) + x % (30 << 20), 512 * (1 + x % 64)][(x % 3) as usize];
                if let Ok(a) = r.malloc(n, x % 2, st) {
                    live.push(a);
                }
            } else {
                r.free(live.swap_remove((x % live.len() as u64) as usize)).unwrap();
            }
        }
        let snap = r.finish();
        let trace = snap.trace(0);
        let mut state = RecordedState::from_snapshot(&snap, 0);
        assert!(state.blocks_tile_segments());
        let pairs = crate::with_rules(&crate::recorded_config(&snap), |rules| {
            let (mut scratch, mut pairs) = (Vec::new(), 0);
            let mut i = trace.len();
            while i > 0 {
                i -= 1;
                let (fc, fr) = (&trace[i], i.checked_sub(1).map(|k| &trace[k]));
                match fr.filter(|fr| fc.action == Action::FreeCompleted && fr.action == Action::FreeRequested) {
                    Some(fr) if fr.addr == fc.addr => {
                        let mut one_by_one = state.clone();
                        let c = one_by_one.undo_free_completed(i, fc, rules, &mut scratch).unwrap();
                        let q = one_by_one.undo_free_requested(i - 1, fr).unwrap();
                        let (pc, pq) =
                            state.undo_free_pair(i, fc, fr, (rules.round)(fc.size), rules, &mut scratch).unwrap();
                        assert_eq!(state, one_by_one, "entry {i}");
                        assert_eq!((pc.block, pc.small), (c.block, c.small));
                        assert_eq!((pq.block, pq.block.state), (q.block, BState::Allocated));
                        pairs += 1;
                        i -= 1;
                    }
                    _ => state.undo(i, fc, Home::default(), rules, &mut scratch).unwrap(),
                }
                scratch.clear();
                assert!(state.blocks_tile_segments(), "entry {i}");
            }
            pairs
        });
        assert!(pairs > 100, "only {pairs} pairs");
    }

    #[test]
    fn inconsistency_is_reported_with_its_index() {
        let a = 0x7000_0000;
        let t = vec![ev(Action::SegmentAlloc, a, 2 * MIB), ev(Action::Alloc, a, 1000)];
        let r = rules();
        // Final state lacks the segment: the alloc cannot be undone.
        let e = backward_walk(RecordedState::default(), &t, &|_| Home::default(), &r).unwrap_err();
        assert_eq!(e.index, 1);
    }
}
