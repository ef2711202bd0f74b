//! Returning memory to the device (spec §5): whole-segment release, the
//! `empty_cache` walk, the max_split fallback and garbage collection.

use super::block::{State, NIL};
use super::{CachingAllocator, Event};
use crate::device::DeviceMemory;
use crate::{PoolId, StreamId};

impl<D: DeviceMemory> CachingAllocator<D> {
    /// §5.1: release one whole free non-expandable segment.
    pub(super) fn release_block(&mut self, i: u32) {
        debug_assert!(!self.is_split(i) && !self.blocks[i].expandable);
        self.remove_free(i);
        let b = self.blocks.remove(i);
        let small = self.pools[b.pool as usize].small;
        self.emit(Event::SegmentFree { addr: b.addr, size: b.size, stream: b.stream });
        self.device.free(b.addr, b.size);
        self.stats.segment.decrease(small, 1);
        self.stats.reserved_bytes.decrease(small, b.size);
        if b.size >= self.max_split {
            self.stats.oversize_segments.decrease(1);
        }
        self.stats.num_device_free += 1;
        self.total_reserved -= b.size;
        self.drop_segment(b.seg);
    }

    /// §5.2 step 2 for one pool: whole segments go, expandable free blocks are
    /// unmapped afterwards (unmapping changes the set being walked).
    fn release_blocks(&mut self, p: u32) {
        let walk: Vec<u32> = self.pools[p as usize].free.iter().collect();
        let mut to_unmap = Vec::new();
        for i in walk {
            if self.blocks[i].expandable {
                to_unmap.push(i);
            } else if !self.is_split(i) {
                self.release_block(i);
            }
        }
        for i in to_unmap {
            let u = self.unmap_block(i);
            if self.blocks[u].prev == NIL && self.blocks[u].next == NIL && self.blocks[u].state == State::Unmapped {
                self.release_expandable_segment(u);
            }
        }
    }

    /// §5.2 / `empty_cache`: sync events, then large pool before small pool,
    /// then freeable private pools (small before large). A freeable pool left
    /// without segments is erased (PyTorch's `cudaMalloc_count == 0`): a later
    /// request with its id starts a new pool.
    pub(super) fn release_cached_blocks(&mut self) {
        self.synchronize_and_free_events();
        self.release_blocks(0);
        self.release_blocks(1);
        let freeable: Vec<PoolId> = self.freeable.iter().copied().collect();
        for id in freeable {
            if let Some(&large) = self.private_pools.get(&id) {
                self.release_blocks(large + 1);
                self.release_blocks(large);
                self.erase_pool_if_empty(id, large);
            }
        }
    }

    /// `release_cached_blocks(mempool_id)` for one private pool: nothing unless it is
    /// freeable; then its own pending frees complete (PyTorch syncs only that pool's
    /// events) and its whole free segments go, small pool first.
    pub(super) fn release_freeable_pool(&mut self, id: PoolId) {
        if !self.freeable.contains(&id) {
            return;
        }
        let Some(&large) = self.private_pools.get(&id) else { return };
        let mine: Vec<u32> = self
            .pending
            .values()
            .filter(|&i| self.blocks[i].pool == large || self.blocks[i].pool == large + 1)
            .collect();
        for i in mine {
            self.complete_free(i);
        }
        self.release_blocks(large + 1);
        self.release_blocks(large);
        self.erase_pool_if_empty(id, large);
    }

    /// Forget private pool `id` (large pool index `large`) when no segment is left in
    /// it: PyTorch erases a freeable pool whose `cudaMalloc_count` is back to zero.
    fn erase_pool_if_empty(&mut self, id: PoolId, large: u32) {
        let holds = self.seg_by_addr.values().any(|&si| self.segs[si].pool == large || self.segs[si].pool == large + 1);
        if !holds {
            self.private_pools.remove(&id);
            self.freeable.remove(&id);
        }
    }

    /// §5.3: free just enough oversize cached segments of this stream.
    /// Only called when max_split_size is set.
    pub(super) fn release_available_cached_blocks(&mut self, p: u32, stream: StreamId, s: u64) -> bool {
        let target = s.max(self.max_split);
        let pool = &self.pools[p as usize];
        let first = pool.free.at_least(stream, target).next();
        if let Some((_, i)) = first {
            if !self.blocks[i].expandable {
                // A split piece can never be ≥ max_split_size in a PyTorch run;
                // refuse rather than free half a segment if a seed made one.
                if self.is_split(i) {
                    return false;
                }
                self.release_block(i);
                return true;
            }
        }
        // Walk down from the largest block of this stream below the target.
        let victims: Vec<u32> = pool
            .free
            .below_desc(stream, target)
            .take_while(|&(size, _)| size >= self.max_split)
            .map(|(_, i)| i)
            .collect();
        let mut released = 0u64;
        for i in victims {
            if released >= target {
                break;
            }
            if self.blocks[i].expandable || self.is_split(i) {
                continue;
            }
            released += self.blocks[i].size;
            self.release_block(i);
        }
        released >= target
    }

    /// §5.5: release aged whole segments of the default large pool until
    /// reserved memory is back under the threshold (passes do not stop early).
    pub(super) fn garbage_collect_cached_blocks(&mut self) {
        let limit = (self.cfg.garbage_collection_threshold * self.allowed_max as f64) as u64;
        if self.total_reserved <= limit {
            return;
        }
        let target = self.total_reserved - limit;
        let count = self.pools[0].search_count;
        let age = |a: &Self, i: u32| count - a.blocks[i].stamp;
        let candidate = |a: &Self, i: u32| !a.is_split(i) && !a.blocks[i].expandable;
        let mut total_age = 0u64;
        let mut freeable = 0u64;
        for i in self.pools[0].free.iter() {
            if candidate(self, i) {
                total_age += age(self, i);
                freeable += 1;
            }
        }
        let mut reclaimed = 0u64;
        let mut freed = true;
        while reclaimed < target && freed && freeable > 0 {
            let threshold = total_age as f64 / freeable as f64;
            freed = false;
            let walk: Vec<u32> = self.pools[0].free.iter().collect();
            for i in walk {
                if candidate(self, i) && age(self, i) as f64 >= threshold {
                    freed = true;
                    reclaimed += self.blocks[i].size;
                    total_age -= age(self, i);
                    freeable -= 1;
                    self.release_block(i);
                }
            }
        }
    }
}
