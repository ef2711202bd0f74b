//! The caching allocator of one device: PyTorch's policy (spec §3–§8) over a
//! [`DeviceMemory`].
//!
//! Layout: blocks live in a slab and are linked by index into segments; each
//! block pool keeps its free blocks in an ordered set ordered like PyTorch's
//! free set (per stream: sorted size buckets, a B-tree past 256 sizes; see
//! `pool.rs`), so best fit is one lookup; the active set is a hash map from
//! address to block. Operations are O(log n) plus a bounded move, apart from
//! releases, which walk a pool.

mod block;
mod check;
mod expandable;
mod pool;
mod release;
mod seed;

use crate::config::{AllocatorConfig, TieBreak};
use crate::device::DeviceMemory;
use crate::rounding::{allocation_size, is_small, round_size, MIN_BLOCK_SIZE, SMALL_SIZE};
use crate::stats::Stats;
use crate::{Addr, PoolId, StreamId, DEFAULT_POOL};
use block::{AddrTable, Block, Segment, Slab, State, NIL};
use pool::{BlockPool, FreeKey, PendingQueue};
use std::collections::BTreeMap;
use std::fmt;

pub use check::InvariantError;
pub use seed::{SeedBlock, SeedError, SeedSegment};

/// One trace entry, as PyTorch records it (§10.5), in PyTorch's order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// `alloc`: size is the unrounded request `n`.
    Alloc {
        addr: Addr,
        size: u64,
        stream: StreamId,
    },
    /// `free_requested`: size is the block's requested size.
    FreeRequested {
        addr: Addr,
        size: u64,
        stream: StreamId,
    },
    /// `free_completed`: size is the block's requested size.
    FreeCompleted {
        addr: Addr,
        size: u64,
        stream: StreamId,
    },
    SegmentAlloc {
        addr: Addr,
        size: u64,
        stream: StreamId,
    },
    SegmentFree {
        addr: Addr,
        size: u64,
        stream: StreamId,
    },
    SegmentMap {
        addr: Addr,
        size: u64,
        stream: StreamId,
    },
    SegmentUnmap {
        addr: Addr,
        size: u64,
        stream: StreamId,
    },
    /// `oom`: size is the rounded size `s`; device_free from `cudaMemGetInfo`.
    Oom {
        size: u64,
        device_free: u64,
        stream: StreamId,
    },
}

/// A failed allocation: everything the CUDA OOM message (§13) is built from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Oom {
    /// Unrounded request.
    pub requested: u64,
    /// `round_size(requested)`.
    pub rounded: u64,
    /// Segment size that was asked of CUDA ("Tried to allocate").
    pub alloc_size: u64,
    pub stream: StreamId,
    pub pool: PoolId,
    pub device_total: u64,
    pub device_free: u64,
    pub allocated: u64,
    pub reserved: u64,
    /// `throw_on_cudamalloc_oom` rejected it before any fallback (§3.6 step 2):
    /// no `oom` event, `num_oom_rejections` counted instead of `num_ooms`.
    pub rejected: bool,
}

impl fmt::Display for Oom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
        if self.rejected {
            write!(f, "CUDA out of memory. Allocation was preemptively rejected. ")?;
        } else {
            write!(f, "CUDA out of memory. ")?;
        }
        write!(
            f,
            "Tried to allocate {:.2} MiB. GPU has a total capacity of {:.2} GiB of which {:.2} MiB is free. \
             Of the allocated memory {:.2} GiB is allocated by PyTorch, and {:.2} MiB is reserved by PyTorch but unallocated.",
            mib(self.alloc_size),
            gib(self.device_total),
            mib(self.device_free),
            gib(self.allocated),
            mib(self.reserved.saturating_sub(self.allocated)),
        )
    }
}

impl std::error::Error for Oom {}

/// A free/record_stream on an address the allocator cannot act on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FreeError {
    /// No allocated or pending block starts at this address.
    UnknownAddress(Addr),
    /// The block's free was already requested (double free).
    NotAllocated(Addr),
    /// `free_completed` on a block whose free was never requested.
    NotPending(Addr),
}

impl fmt::Display for FreeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FreeError::UnknownAddress(a) => write!(f, "no active block at address {a:#x}"),
            FreeError::NotAllocated(a) => write!(f, "block at {a:#x} is already pending free"),
            FreeError::NotPending(a) => write!(f, "block at {a:#x} has no pending free to complete"),
        }
    }
}

impl std::error::Error for FreeError {}

/// State of a block in a [`SegmentInfo`] (snapshot's `active_allocated`,
/// `active_pending_free`, `inactive`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BlockState {
    Allocated,
    PendingFree,
    Free,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockInfo {
    pub address: Addr,
    pub size: u64,
    pub requested_size: u64,
    pub state: BlockState,
}

/// One snapshot segment: a cudaMalloc segment, or one contiguous mapped range
/// of an expandable reservation (§6.5).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentInfo {
    pub address: Addr,
    pub total_size: u64,
    pub stream: StreamId,
    pub pool: PoolId,
    pub is_large: bool,
    pub is_expandable: bool,
    /// Registration counter (§2.2) of the cudaMalloc or of the reservation.
    pub registration: u64,
    pub blocks: Vec<BlockInfo>,
}

impl SegmentInfo {
    pub fn allocated_size(&self) -> u64 {
        self.blocks.iter().filter(|b| b.state == BlockState::Allocated).map(|b| b.size).sum()
    }
    pub fn active_size(&self) -> u64 {
        self.blocks.iter().filter(|b| b.state != BlockState::Free).map(|b| b.size).sum()
    }
    pub fn requested_size(&self) -> u64 {
        self.blocks.iter().filter(|b| b.state != BlockState::Free).map(|b| b.requested_size).sum()
    }
}

/// PyTorch's caching allocator for one device.
pub struct CachingAllocator<D: DeviceMemory> {
    cfg: AllocatorConfig,
    device: D,
    blocks: Slab<Block>,
    segs: Slab<Segment>,
    /// Segment (or reservation) base → segment index; for overlap checks and snapshot order.
    seg_by_addr: BTreeMap<Addr, u32>,
    /// `pools[0]` / `pools[1]` are the default large / small pools; private pools follow in pairs.
    pools: Vec<BlockPool>,
    /// Private pool id → index of its large pool (small is +1).
    private_pools: BTreeMap<PoolId, u32>,
    /// Private pools whose use count dropped to zero (§5.2 step 3).
    freeable: std::collections::BTreeSet<PoolId>,
    /// `MemPool(use_on_oom=True)` pools (PyTorch's `use_on_oom_pools`, §3.7 step 1):
    /// their cached free blocks serve a default-pool request whose `cudaMalloc` failed.
    use_on_oom: std::collections::BTreeSet<PoolId>,
    /// `MemPool(no_split=True)` pools (PyTorch's `no_split_pools`, §3.8): a block of
    /// theirs is never split.
    no_split: std::collections::BTreeSet<PoolId>,
    /// Allocated and pending-free blocks by address.
    active: AddrTable,
    /// Pending frees in request order (seq → block).
    pending: PendingQueue,
    pending_seq: u64,
    auto_pending: usize,
    /// Process-wide registration counter (§2.2), starting at 0.
    reg_counter: u64,
    stats: Stats,
    events: Vec<Event>,
    record_events: bool,
    /// Bytes of all segments and mapped pages, all pools (`total_allocated_memory`).
    total_reserved: u64,
    fraction: f64,
    allowed_max: u64,
    /// Cached `max_split_size` with `u64::MAX` for "unlimited".
    max_split: u64,
    /// Slab index of the block of the last `free_requested` (`NIL` before any),
    /// checked before use: `free_completed` usually follows it.
    last_requested: u32,
}

/// Marks (`on`) or unmarks a private pool in one of the pools' flag sets; the default pool
/// has none of those flags.
fn mark(set: &mut std::collections::BTreeSet<PoolId>, pool: PoolId, on: bool) {
    if pool == DEFAULT_POOL {
        return;
    }
    if on {
        set.insert(pool);
    } else {
        set.remove(&pool);
    }
}

impl<D: DeviceMemory> CachingAllocator<D> {
    pub fn new(cfg: AllocatorConfig, device: D) -> Self {
        let max_split = cfg.max_split_size.unwrap_or(u64::MAX);
        let stats = Stats { max_split_size: cfg.max_split_size.map_or(-1, |m| m as i64), ..Stats::default() };
        let fraction = cfg.per_process_memory_fraction;
        let mut a = CachingAllocator {
            cfg,
            device,
            blocks: Slab::default(),
            segs: Slab::default(),
            seg_by_addr: BTreeMap::new(),
            pools: vec![BlockPool::new(DEFAULT_POOL, false), BlockPool::new(DEFAULT_POOL, true)],
            private_pools: BTreeMap::new(),
            freeable: Default::default(),
            use_on_oom: Default::default(),
            no_split: Default::default(),
            active: AddrTable::default(),
            pending: PendingQueue::default(),
            pending_seq: 0,
            auto_pending: 0,
            reg_counter: 0,
            stats,
            events: Vec::new(),
            record_events: true,
            total_reserved: 0,
            fraction: 1.0,
            allowed_max: 0,
            max_split,
            last_requested: NIL,
        };
        a.set_memory_fraction(fraction);
        a
    }

    // ----- public API -------------------------------------------------------

    pub fn config(&self) -> &AllocatorConfig {
        &self.cfg
    }
    pub fn device(&self) -> &D {
        &self.device
    }
    pub fn device_mut(&mut self) -> &mut D {
        &mut self.device
    }
    pub fn stats(&self) -> &Stats {
        &self.stats
    }
    /// `reset_peak_memory_stats`.
    pub fn reset_peak_stats(&mut self) {
        self.stats.reset_peak();
    }
    /// `reset_accumulated_memory_stats`.
    pub fn reset_accumulated_stats(&mut self) {
        self.stats.reset_accumulated();
    }
    /// Total bytes held from the device (all pools): what the memory fraction limits.
    pub fn reserved_bytes(&self) -> u64 {
        self.total_reserved
    }
    /// Events since the last drain, in PyTorch's order.
    pub fn drain_events(&mut self) -> Vec<Event> {
        std::mem::take(&mut self.events)
    }
    /// Append the pending events to `out` without allocating a new buffer.
    pub fn drain_events_into(&mut self, out: &mut Vec<Event>) {
        out.append(&mut self.events);
    }
    /// Events since the last drain, without draining.
    pub fn events(&self) -> &[Event] {
        &self.events
    }
    pub fn clear_events(&mut self) {
        self.events.clear();
    }
    /// Turn event recording off (replays that only need addresses and stats).
    pub fn set_record_events(&mut self, on: bool) {
        self.record_events = on;
        if !on {
            self.events.clear();
        }
    }

    /// `torch.cuda.set_per_process_memory_fraction(f)` (§9.4). A fraction is
    /// "in force" only when < 1 (recent main), which also enables GC (§5.5).
    pub fn set_memory_fraction(&mut self, f: f64) {
        self.fraction = f;
        self.allowed_max = (f * self.device.total_memory() as f64).round() as u64;
    }
    pub fn memory_fraction(&self) -> f64 {
        self.fraction
    }
    /// Bytes a memory fraction allows, if one is in force.
    pub fn allowed_memory_maximum(&self) -> Option<u64> {
        self.fraction_in_force().then_some(self.allowed_max)
    }

    /// Mark a private pool freeable (its use count dropped to zero: `releasePool`
    /// after the last graph or `MemPool` using it went): its whole free segments go
    /// at the next `release_cached_blocks`, explicit or the OOM fallback (§7).
    pub fn set_pool_freeable(&mut self, pool: PoolId, freeable: bool) {
        mark(&mut self.freeable, pool, freeable);
    }

    /// Whether `pool` is marked freeable (see [`Self::set_pool_freeable`]).
    pub fn is_pool_freeable(&self, pool: PoolId) -> bool {
        self.freeable.contains(&pool)
    }

    /// `setUseOnOOM(pool, on)`: with `on`, a default-pool request whose `cudaMalloc`
    /// failed takes a cached free block of `pool` before any release
    /// (`try_mempool_fallback`, §3.7 step 1), the block staying in `pool`.
    /// PyTorch keeps these pools in a hash set and tries them in its (unspecified)
    /// iteration order; the model tries them in id order, which only matters when
    /// two such pools both hold a fitting block.
    pub fn set_use_on_oom(&mut self, pool: PoolId, on: bool) {
        mark(&mut self.use_on_oom, pool, on);
    }

    /// Whether `pool` is marked use-on-OOM (see [`Self::set_use_on_oom`]).
    pub fn is_use_on_oom(&self, pool: PoolId) -> bool {
        self.use_on_oom.contains(&pool)
    }

    /// `setNoSplit(pool)` (with `on`; PyTorch has no call that clears it): a block of
    /// `pool` is handed out whole, never split (`should_split`, §3.8), so each request
    /// there takes a whole free block or a whole new segment.
    pub fn set_no_split(&mut self, pool: PoolId, on: bool) {
        mark(&mut self.no_split, pool, on);
    }

    /// Whether `pool` is marked no-split (see [`Self::set_no_split`]).
    pub fn is_no_split(&self, pool: PoolId) -> bool {
        self.no_split.contains(&pool)
    }

    /// The pools marked no-split, by id.
    pub fn no_split_pools(&self) -> Vec<PoolId> {
        self.no_split.iter().copied().collect()
    }

    /// The private pools the allocator knows (those a request was routed to or a
    /// seeded segment belongs to, less those erased once freeable and empty), by id.
    pub fn private_pools(&self) -> Vec<PoolId> {
        self.private_pools.keys().copied().collect()
    }

    /// `malloc(n, stream)` in the default pools.
    pub fn malloc(&mut self, n: u64, stream: StreamId) -> Result<Addr, Oom> {
        self.malloc_in_pool(n, stream, DEFAULT_POOL)
    }

    /// `malloc(n, stream)` routed to `pool` (§3, §7).
    ///
    /// A request routed to a private pool is made while a capture or a
    /// `use_mem_pool` context is under way (PyTorch's `get_pool` routes to a private
    /// pool only through `captures_underway`), and PyTorch then neither processes
    /// outstanding events first (`cudaEventQuery` is illegal during capture) nor
    /// falls back to `release_cached_blocks` before the OOM: only the free-list
    /// search, `cudaMalloc`, and the `max_split_size` release in the request's own
    /// pool are tried (docs/fidelity.md, "Private pools").
    pub fn malloc_in_pool(&mut self, n: u64, stream: StreamId, pool: PoolId) -> Result<Addr, Oom> {
        let capturing = pool != DEFAULT_POOL;
        // Step 0 (§3.1): frees whose events have completed become usable first.
        if self.auto_pending > 0 && !capturing {
            self.process_events();
        }
        // Step 1 (§3.2).
        let s = round_size(n, &self.cfg);
        let p = self.pool_index(pool, is_small(s));
        let alloc_size = allocation_size(s, &self.cfg);
        // Step 2 (§3.3); step 3 (callbacks) is a no-op here.
        let mut found = self.get_free_block(p, stream, s);
        if found.is_none() {
            // Step 4 (§3.5): GC before a new segment; the free list is not searched again.
            if self.gc_enabled() {
                self.garbage_collect_cached_blocks();
            }
            // Step 5 then the fallbacks of step 6 (§3.7), short-circuiting.
            found = match self.alloc_block(p, stream, s, alloc_size, false) {
                Err(()) => return Err(self.oom_value(n, s, alloc_size, stream, pool, true)),
                Ok(b) => b,
            };
            // §3.7 step 1: a use-on-OOM pool's cached block, for a default-pool request.
            if found.is_none() && !capturing && !self.use_on_oom.is_empty() {
                if let Some(b) = self.try_mempool_fallback(stream, s) {
                    return Ok(self.alloc_found_block_es(b, n, s, false));
                }
            }
            if found.is_none()
                && self.cfg.max_split_size.is_some()
                && self.release_available_cached_blocks(p, stream, s)
            {
                found = self.alloc_block(p, stream, s, alloc_size, false).unwrap_or(None);
            }
            if found.is_none() && !capturing {
                self.release_cached_blocks();
                found = self.alloc_block(p, stream, s, alloc_size, true).unwrap_or(None);
            }
        }
        match found {
            Some(b) => Ok(self.alloc_found_block(b, n, s)),
            None => {
                let device_free = self.device.free_memory();
                self.stats.num_ooms += 1;
                self.emit(Event::Oom { size: s, device_free, stream });
                Err(self.oom_value(n, s, alloc_size, stream, pool, false))
            }
        }
    }

    /// `free(ptr)` (§4.1): `free_requested`, then `free_completed` at once unless
    /// the block was used on other streams (then at the next malloc or a sync).
    pub fn free(&mut self, addr: Addr) -> Result<(), FreeError> {
        let i = self.allocated_block(addr)?;
        if self.blocks[i].extra_streams {
            self.request_free(i, Some(true));
        } else {
            self.request_free(i, None);
            self.complete_free(i);
        }
        Ok(())
    }

    /// `tensor.record_stream(stream)`: a free of this block will wait on `stream`.
    pub fn record_stream(&mut self, addr: Addr, stream: StreamId) -> Result<(), FreeError> {
        let i = self.allocated_block(addr)?;
        if self.blocks[i].stream != stream {
            self.blocks[i].extra_streams = true;
        }
        Ok(())
    }

    /// Replay of a `free_requested` entry: the block becomes pending free and
    /// stays unusable until [`Self::free_completed`] (or a sync in `empty_cache`).
    pub fn free_requested(&mut self, addr: Addr) -> Result<(), FreeError> {
        let i = self.allocated_block(addr)?;
        self.request_free(i, Some(false));
        self.last_requested = i;
        Ok(())
    }

    /// Replay of a `free_completed` entry: merge and return the block to its pool.
    pub fn free_completed(&mut self, addr: Addr) -> Result<(), FreeError> {
        // Usually the block whose free was requested last: a pending block's
        // slot holds that block until its free completes, so a slot that is
        // pending at this address is the active block here.
        let c = self.last_requested;
        let i = if c != NIL && self.blocks[c].addr == addr && self.blocks[c].state == State::Pending {
            c
        } else {
            *self.active.get(&addr).ok_or(FreeError::UnknownAddress(addr))?
        };
        if self.blocks[i].state != State::Pending {
            return Err(FreeError::NotPending(addr));
        }
        self.complete_free(i);
        Ok(())
    }

    /// `torch.cuda.empty_cache()` (§5.2): the default pools, then every freeable
    /// private pool.
    pub fn empty_cache(&mut self) {
        self.release_cached_blocks();
    }

    /// `emptyCache(mempool_id)` for a private pool (what `MemPool`'s destructor calls
    /// after `releasePool`): when `pool` is freeable, its pending frees complete and
    /// its whole free segments go; otherwise nothing happens. The default pools are
    /// untouched. `DEFAULT_POOL` is [`Self::empty_cache`].
    pub fn empty_cache_pool(&mut self, pool: PoolId) {
        if pool == DEFAULT_POOL {
            self.release_cached_blocks();
        } else {
            self.release_freeable_pool(pool);
        }
    }

    /// Free blocks of the right pool and stream with size ≥ round(n), in set order.
    pub fn free_candidates(&self, n: u64, stream: StreamId, pool: PoolId) -> Vec<(Addr, u64)> {
        let s = round_size(n, &self.cfg);
        let Some(p) = self.find_pool_index(pool, is_small(s)) else { return Vec::new() };
        self.pools[p as usize].free.at_least(stream, s).map(|(size, i)| (self.blocks[i].addr, size)).collect()
    }

    /// Would step 2 (the free-list search) succeed now? No side effects.
    pub fn would_hit_cache(&self, n: u64, stream: StreamId, pool: PoolId) -> bool {
        let s = round_size(n, &self.cfg);
        match self.find_pool_index(pool, is_small(s)) {
            Some(p) => self.find_free_block(p, stream, s).is_some(),
            None => false,
        }
    }

    /// Would `try_mempool_fallback` find a block for `n` on `stream` in `pool`, were
    /// `pool` use-on-OOM (§3.7 step 1: a non-expandable cached free block that fits)?
    /// No side effects; for a caller that must say an outcome rests on `use_on_oom`.
    pub fn fits_on_oom_fallback(&self, n: u64, stream: StreamId, pool: PoolId) -> bool {
        let s = round_size(n, &self.cfg);
        pool != DEFAULT_POOL
            && self
                .find_pool_index(pool, is_small(s))
                .is_some_and(|p| self.find_free_block_es(p, stream, s, false).is_some())
    }

    /// The pool of the segment (or expandable reservation) containing `addr`, if any.
    pub fn pool_at(&self, addr: Addr) -> Option<PoolId> {
        let (_, &si) = self.seg_by_addr.range(..=addr).next_back()?;
        let seg = &self.segs[si];
        (addr < seg.base + seg.size).then(|| self.pools[seg.pool as usize].id)
    }

    /// Number of allocated plus pending-free blocks.
    pub fn active_blocks(&self) -> usize {
        self.active.len()
    }

    /// State of the active block at `addr`, if any.
    pub fn block_at(&self, addr: Addr) -> Option<BlockInfo> {
        let &i = self.active.get(&addr)?;
        Some(self.block_info(i))
    }

    /// Snapshot-like view, in address order (§6.5 for expandable reservations).
    pub fn segments(&self) -> Vec<SegmentInfo> {
        let mut out = Vec::with_capacity(self.seg_by_addr.len());
        for &si in self.seg_by_addr.values() {
            let seg = &self.segs[si];
            let pool = &self.pools[seg.pool as usize];
            let mut cur: Option<SegmentInfo> = None;
            let mut i = seg.head;
            while i != NIL {
                let b = &self.blocks[i];
                if b.state == State::Unmapped {
                    out.extend(cur.take());
                } else {
                    let info = cur.get_or_insert_with(|| SegmentInfo {
                        address: b.addr,
                        total_size: 0,
                        stream: seg.stream,
                        pool: pool.id,
                        is_large: !pool.small,
                        is_expandable: seg.expandable,
                        registration: seg.reg,
                        blocks: Vec::new(),
                    });
                    info.total_size += b.size;
                    info.blocks.push(self.block_info(i));
                }
                i = b.next;
            }
            out.extend(cur);
        }
        out
    }

    // ----- internals: bookkeeping ----------------------------------------------

    #[inline]
    fn emit(&mut self, e: Event) {
        if self.record_events {
            self.events.push(e);
        }
    }

    #[inline]
    fn fraction_in_force(&self) -> bool {
        self.fraction < 1.0
    }

    #[inline]
    fn gc_enabled(&self) -> bool {
        self.fraction_in_force() && self.cfg.garbage_collection_threshold > 0.0
    }

    fn block_info(&self, i: u32) -> BlockInfo {
        let b = &self.blocks[i];
        BlockInfo {
            address: b.addr,
            size: b.size,
            requested_size: b.requested,
            state: match b.state {
                State::Allocated => BlockState::Allocated,
                State::Pending => BlockState::PendingFree,
                State::Free | State::Unmapped => BlockState::Free,
            },
        }
    }

    fn oom_value(&self, n: u64, s: u64, alloc_size: u64, stream: StreamId, pool: PoolId, rejected: bool) -> Oom {
        Oom {
            requested: n,
            rounded: s,
            alloc_size,
            stream,
            pool,
            device_total: self.device.total_memory(),
            device_free: self.device.free_memory(),
            allocated: self.stats.allocated_bytes.all().current.max(0) as u64,
            reserved: self.total_reserved,
            rejected,
        }
    }

    fn find_pool_index(&self, pool: PoolId, small: bool) -> Option<u32> {
        let large = if pool == DEFAULT_POOL { 0 } else { *self.private_pools.get(&pool)? };
        Some(large + small as u32)
    }

    fn pool_index(&mut self, pool: PoolId, small: bool) -> u32 {
        if let Some(p) = self.find_pool_index(pool, small) {
            return p;
        }
        let large = self.pools.len() as u32;
        self.pools.push(BlockPool::new(pool, false));
        self.pools.push(BlockPool::new(pool, true));
        self.private_pools.insert(pool, large);
        large + small as u32
    }

    #[inline]
    fn is_split(&self, i: u32) -> bool {
        let b = &self.blocks[i];
        b.prev != NIL || b.next != NIL
    }

    #[inline]
    fn free_key(&self, i: u32) -> FreeKey {
        let b = &self.blocks[i];
        let reg = match self.cfg.tie_break {
            TieBreak::Address => 0,
            TieBreak::RegistrationOrder => self.segs[b.seg].reg,
        };
        pool::free_key(b.size, reg, b.addr)
    }

    #[inline]
    fn pool_small(&self, i: u32) -> bool {
        self.pools[self.blocks[i].pool as usize].small
    }

    /// Put a mapped, unallocated block into its free set. inactive_split
    /// counts exactly the free-set members of split non-expandable segments,
    /// so the stat moves here and in `remove_free` (§4.2 step 4).
    fn insert_free(&mut self, i: u32) {
        let key = self.free_key(i);
        let p = self.blocks[i].pool as usize;
        let count = self.pools[p].search_count;
        let b = &mut self.blocks[i];
        b.state = State::Free;
        b.stamp = count;
        let stream = b.stream;
        self.pools[p].free.insert(stream, key, i);
        if !self.blocks[i].expandable && self.is_split(i) {
            let small = self.pool_small(i);
            let size = self.blocks[i].size;
            self.stats.inactive_split.increase(small, 1);
            self.stats.inactive_split_bytes.increase(small, size);
        }
    }

    /// Take a block out of its free set (its state is the caller's business).
    fn remove_free(&mut self, i: u32) {
        let key = self.free_key(i);
        let (p, stream) = (self.blocks[i].pool as usize, self.blocks[i].stream);
        let removed = self.pools[p].free.remove(stream, &key);
        debug_assert!(removed, "block not in free set");
        if !self.blocks[i].expandable && self.is_split(i) {
            let small = self.pool_small(i);
            let size = self.blocks[i].size;
            self.stats.inactive_split.decrease(small, 1);
            self.stats.inactive_split_bytes.decrease(small, size);
        }
        self.blocks[i].state = State::Allocated;
    }

    fn insert_unmapped(&mut self, i: u32) {
        let b = &mut self.blocks[i];
        b.state = State::Unmapped;
        let key = (b.stream, b.addr, i);
        self.pools[b.pool as usize].unmapped.insert(key);
    }

    fn remove_unmapped(&mut self, i: u32) {
        let b = &self.blocks[i];
        let key = (b.stream, b.addr, i);
        self.pools[b.pool as usize].unmapped.remove(&key);
    }

    /// New block linked right after `at`.
    fn link_after(&mut self, at: u32, mut b: Block) -> u32 {
        let next = self.blocks[at].next;
        b.prev = at;
        b.next = next;
        let n = self.blocks.insert(b);
        self.blocks[at].next = n;
        if next != NIL {
            self.blocks[next].prev = n;
        }
        n
    }

    /// New block linked right before `at`.
    fn link_before(&mut self, at: u32, mut b: Block) -> u32 {
        let prev = self.blocks[at].prev;
        b.prev = prev;
        b.next = at;
        let n = self.blocks.insert(b);
        self.blocks[at].prev = n;
        if prev != NIL {
            self.blocks[prev].next = n;
        } else {
            let seg = self.blocks[at].seg;
            self.segs[seg].head = n;
        }
        n
    }

    /// A block with the same segment identity as `like`.
    fn sibling(&self, like: u32, addr: Addr, size: u64, state: State) -> Block {
        let b = &self.blocks[like];
        Block {
            addr,
            size,
            requested: 0,
            stream: b.stream,
            pool: b.pool,
            seg: b.seg,
            prev: NIL,
            next: NIL,
            state,
            expandable: b.expandable,
            extra_streams: false,
            auto_complete: false,
            stamp: 0,
        }
    }

    /// Merge neighbour `src` into `dst` if it is free with the same mapped state
    /// (§4.2 step 2: allocated and pending neighbours never merge).
    fn try_merge(&mut self, dst: u32, src: u32) -> bool {
        if src == NIL {
            return false;
        }
        let dst_mapped = self.blocks[dst].state != State::Unmapped;
        match (self.blocks[src].state, dst_mapped) {
            (State::Free, true) => self.remove_free(src),
            (State::Unmapped, false) => self.remove_unmapped(src),
            _ => return false,
        }
        let s = self.blocks.remove(src);
        let d = &mut self.blocks[dst];
        d.size += s.size;
        if d.prev == src {
            d.addr = s.addr;
            d.prev = s.prev;
            if s.prev != NIL {
                self.blocks[s.prev].next = dst;
            } else {
                self.segs[s.seg].head = dst;
            }
        } else {
            d.next = s.next;
            if s.next != NIL {
                self.blocks[s.next].prev = dst;
            }
        }
        true
    }

    fn allocated_block(&self, addr: Addr) -> Result<u32, FreeError> {
        let &i = self.active.get(&addr).ok_or(FreeError::UnknownAddress(addr))?;
        if self.blocks[i].state != State::Allocated {
            return Err(FreeError::NotAllocated(addr));
        }
        Ok(i)
    }

    fn new_segment(&mut self, seg: Segment) -> u32 {
        let base = seg.base;
        let si = self.segs.insert(seg);
        self.seg_by_addr.insert(base, si);
        si
    }

    fn drop_segment(&mut self, si: u32) {
        let seg = self.segs.remove(si);
        self.seg_by_addr.remove(&seg.base);
    }

    fn next_registration(&mut self) -> u64 {
        let r = self.reg_counter;
        self.reg_counter += 1;
        r
    }

    // ----- internals: the malloc path ------------------------------------------

    /// `try_mempool_fallback` (§3.7 step 1): the first use-on-OOM pool with a cached
    /// free block for `s` on `stream` gives it. PyTorch searches with
    /// `is_expandable_segments_active = false` (its `AllocParams` for the fallback),
    /// so blocks of expandable segments are skipped and the split follows the
    /// non-expandable rule.
    fn try_mempool_fallback(&mut self, stream: StreamId, s: u64) -> Option<u32> {
        let pools: Vec<PoolId> = self.use_on_oom.iter().copied().collect();
        for id in pools {
            let Some(p) = self.find_pool_index(id, is_small(s)) else { continue };
            if self.gc_enabled() {
                self.pools[p as usize].search_count += 1;
            }
            if let Some(i) = self.find_free_block_es(p, stream, s, false) {
                self.remove_free(i);
                return Some(i);
            }
        }
        None
    }

    /// Step 2 lookup without side effects (§3.3 steps 2–4).
    #[inline]
    fn find_free_block(&self, p: u32, stream: StreamId, s: u64) -> Option<u32> {
        self.find_free_block_es(p, stream, s, self.cfg.expandable_segments)
    }

    /// [`Self::find_free_block`] with PyTorch's `is_expandable_segments_active` given.
    #[inline]
    fn find_free_block_es(&self, p: u32, stream: StreamId, s: u64, es: bool) -> Option<u32> {
        let pool = &self.pools[p as usize];
        let (mut size, mut cur) = pool.free.first_at_least(stream, s)?;
        if self.blocks[cur].expandable {
            // Rare enough for the general iterator (its first item is `cur` again).
            let mut it = pool.free.at_least(stream, s).skip(1);
            if es {
                // Prefer a block that cannot grow over a growable tail (§3.3 step 3).
                let mut it = it.peekable();
                while self.blocks[cur].expandable {
                    match it.peek() {
                        Some(&(nsize, nx)) if self.potential_size(nx) < self.potential_size(cur) => {
                            (size, cur) = (nsize, nx);
                            it.next();
                        }
                        _ => break,
                    }
                }
            } else {
                // Expandable turned off: skip expandable blocks on this stream.
                while self.blocks[cur].expandable {
                    (size, cur) = it.next()?;
                }
            }
        }
        // Oversize rules (§3.3 step 4); inert when max_split_size is unlimited.
        if s < self.max_split && size >= self.max_split {
            return None;
        }
        if s >= self.max_split && size >= s.saturating_add(self.cfg.max_non_split_rounding) {
            return None;
        }
        Some(cur)
    }

    /// Size plus an immediately following unmapped block (§3.3 step 3).
    fn potential_size(&self, i: u32) -> u64 {
        let b = &self.blocks[i];
        if b.next != NIL && self.blocks[b.next].state == State::Unmapped {
            b.size + self.blocks[b.next].size
        } else {
            b.size
        }
    }

    fn get_free_block(&mut self, p: u32, stream: StreamId, s: u64) -> Option<u32> {
        if self.gc_enabled() {
            self.pools[p as usize].search_count += 1;
        }
        let i = self.find_free_block(p, stream, s)?;
        self.remove_free(i);
        Some(i)
    }

    /// Step 5 (§3.6). `Ok(None)` = no memory; `Err(())` = preemptive rejection.
    fn alloc_block(
        &mut self,
        p: u32,
        stream: StreamId,
        s: u64,
        alloc_size: u64,
        retry: bool,
    ) -> Result<Option<u32>, ()> {
        if retry {
            self.stats.num_alloc_retries += 1;
        }
        let wanted = self.total_reserved.saturating_add(alloc_size);
        if self.fraction_in_force() && wanted > self.allowed_max {
            return Ok(None);
        }
        if self.cfg.throw_on_cudamalloc_oom && wanted as f64 > self.fraction * self.device.total_memory() as f64 {
            self.stats.num_oom_rejections += 1;
            return Err(());
        }
        if self.cfg.expandable_segments {
            return Ok(self.try_allocate_expandable_block(p, stream, s));
        }
        let Some(addr) = self.device.malloc(alloc_size) else { return Ok(None) };
        let reg = self.next_registration();
        let seg = self.new_segment(Segment {
            base: addr,
            size: alloc_size,
            stream,
            pool: p,
            expandable: false,
            page: 0,
            reg,
            head: NIL,
        });
        let b = self.blocks.insert(Block::spanning(seg, &self.segs[seg], State::Allocated));
        self.segs[seg].head = b;
        let small = self.pools[p as usize].small;
        self.stats.segment.increase(small, 1);
        self.stats.reserved_bytes.increase(small, alloc_size);
        if alloc_size >= self.max_split {
            self.stats.oversize_segments.increase(1);
        }
        self.stats.num_device_alloc += 1;
        self.total_reserved += alloc_size;
        self.emit(Event::SegmentAlloc { addr, size: alloc_size, stream });
        Ok(Some(b))
    }

    /// Step 7 (§3.8): split (low part allocated) and hand out.
    fn alloc_found_block(&mut self, i: u32, n: u64, s: u64) -> Addr {
        self.alloc_found_block_es(i, n, s, self.cfg.expandable_segments)
    }

    /// [`Self::alloc_found_block`] with PyTorch's `is_expandable_segments_active` given
    /// (`should_split`: never in a no-split pool).
    fn alloc_found_block_es(&mut self, i: u32, n: u64, s: u64, es: bool) -> Addr {
        let small = self.pool_small(i);
        let size = self.blocks[i].size;
        let rem = size - s;
        let no_split =
            !self.no_split.is_empty() && self.no_split.contains(&self.pools[self.blocks[i].pool as usize].id);
        let split = if no_split {
            false
        } else if small || es {
            rem >= MIN_BLOCK_SIZE
        } else {
            s < self.max_split && rem > SMALL_SIZE
        };
        if split {
            let addr = self.blocks[i].addr;
            let r = self.sibling(i, addr + s, rem, State::Free);
            self.blocks[i].size = s;
            let r = self.link_after(i, r);
            self.insert_free(r);
        }
        let b = &mut self.blocks[i];
        b.state = State::Allocated;
        b.requested = n;
        b.extra_streams = false;
        let (addr, size, stream) = (b.addr, b.size, b.stream);
        self.active.insert(addr, i);
        let st = &mut self.stats;
        st.allocation.increase(small, 1);
        st.allocated_bytes.increase(small, size);
        st.active.increase(small, 1);
        st.active_bytes.increase(small, size);
        st.requested_bytes.increase(small, n);
        if size >= self.max_split {
            st.oversize_allocations.increase(1);
        }
        self.emit(Event::Alloc { addr, size: n, stream });
        addr
    }

    // ----- internals: the free path ----------------------------------------------

    /// §4.1 steps 1–2. `defer`: `None` = the free completes right away (the
    /// caller calls `complete_free`); `Some(auto)` = the block stays pending,
    /// completing by itself at the next malloc when `auto`.
    fn request_free(&mut self, i: u32, defer: Option<bool>) {
        let small = self.pool_small(i);
        let b = &mut self.blocks[i];
        let (addr, size, req, stream) = (b.addr, b.size, b.requested, b.stream);
        if let Some(auto) = defer {
            b.state = State::Pending;
            b.auto_complete = auto;
            let seq = self.pending_seq;
            b.stamp = seq;
            self.pending_seq += 1;
            self.pending.push(seq, i);
            if auto {
                self.auto_pending += 1;
            }
        }
        self.stats.allocation.decrease(small, 1);
        self.stats.allocated_bytes.decrease(small, size);
        if size >= self.max_split {
            self.stats.oversize_allocations.decrease(1);
        }
        self.emit(Event::FreeRequested { addr, size: req, stream });
    }

    /// §4.2: `free_completed`, merge prev then next, back into the free set.
    fn complete_free(&mut self, i: u32) {
        let small = self.pool_small(i);
        let b = &self.blocks[i];
        let (addr, size, req, stream) = (b.addr, b.size, b.requested, b.stream);
        if b.state == State::Pending {
            let (seq, auto) = (b.stamp, b.auto_complete);
            self.pending.remove(seq);
            if auto {
                self.auto_pending -= 1;
            }
        }
        self.emit(Event::FreeCompleted { addr, size: req, stream });
        self.active.remove(&addr);
        let b = &mut self.blocks[i];
        b.extra_streams = false;
        b.auto_complete = false;
        b.state = State::Allocated; // neither Free nor Unmapped while merging
        let (prev, next) = (b.prev, b.next);
        self.try_merge(i, prev);
        self.try_merge(i, next);
        self.insert_free(i);
        self.stats.active.decrease(small, 1);
        self.stats.active_bytes.decrease(small, size);
        self.stats.requested_bytes.decrease(small, req);
    }

    /// Step 0 (§3.1): complete every free waiting on events. The simulator
    /// assumes the events of `free` + `record_stream` are done by the next malloc.
    fn process_events(&mut self) {
        let ready: Vec<u32> = self.pending.values().filter(|&i| self.blocks[i].auto_complete).collect();
        for i in ready {
            self.complete_free(i);
        }
    }

    /// §5.4: wait on every outstanding event, completing frees in request order.
    fn synchronize_and_free_events(&mut self) {
        self.stats.num_sync_all_streams += 1;
        while let Some(i) = self.pending.first() {
            self.complete_free(i);
        }
    }
}

impl<D: DeviceMemory> fmt::Debug for CachingAllocator<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CachingAllocator")
            .field("blocks", &self.blocks.len())
            .field("segments", &self.seg_by_addr.len())
            .field("active", &self.active.len())
            .field("reserved", &self.total_reserved)
            .finish()
    }
}
