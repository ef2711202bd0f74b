//! Expandable segments (spec §6): one VA reservation per (stream, pool),
//! mapped page by page, shown to users as one segment per mapped range.

use super::block::{Block, Segment, State, NIL};
use super::{CachingAllocator, Event};
use crate::config::ReserveSpec;
use crate::device::DeviceMemory;
use crate::rounding::SMALL_BUFFER;
use crate::StreamId;

impl<D: DeviceMemory> CachingAllocator<D> {
    /// Page size of a pool's reservations (§6.1).
    pub(super) fn page_size(&self, p: u32) -> u64 {
        if self.pools[p as usize].small {
            SMALL_BUFFER
        } else {
            self.cfg.large_segment_size
        }
    }

    /// VA size of a new reservation (§6.1): pages covering 9/8 of device
    /// memory, or less if `expandable_segments_reserve` asks for less.
    pub(super) fn reservation_size(&self, page: u64) -> u64 {
        let total = self.device.total_memory();
        let default = (total + total / 8).div_ceil(page).max(1) * page;
        let wanted = match self.cfg.expandable_segments_reserve {
            None => return default,
            Some(ReserveSpec::Fraction(f)) => f * total as f64,
            Some(ReserveSpec::GiB(g)) => g * (1u64 << 30) as f64,
        };
        let wanted = (wanted.max(0.0) as u64).div_ceil(page).max(1) * page;
        wanted.min(default)
    }

    fn allocatable(&self, i: u32) -> bool {
        i != NIL && matches!(self.blocks[i].state, State::Free | State::Unmapped)
    }

    /// Does the run of free/unmapped blocks starting at `c` hold `s` bytes?
    fn has_room(&self, mut c: u32, s: u64) -> bool {
        let mut bytes = 0u64;
        while bytes < s && self.allocatable(c) {
            bytes += self.blocks[c].size;
            c = self.blocks[c].next;
        }
        bytes >= s
    }

    /// §6.2 step 1–2: lowest-address place for `s` bytes, using a free mapped
    /// block right before unmapped space; else a new reservation.
    fn find_expandable_block(&mut self, p: u32, stream: StreamId, s: u64) -> Option<u32> {
        let found = self.pools[p as usize]
            .unmapped
            .range((stream, 0, 0)..)
            .take_while(|k| k.0 == stream)
            .map(|k| {
                let u = k.2;
                let prev = self.blocks[u].prev;
                if prev != NIL && self.blocks[prev].state == State::Free {
                    prev
                } else {
                    u
                }
            })
            .find(|&c| self.has_room(c, s));
        if found.is_some() {
            return found;
        }
        let page = self.page_size(p);
        let size = self.reservation_size(page);
        if size < s {
            // One allocation never spans two reservations (§6.1).
            return None;
        }
        let base = self.device.reserve(size)?;
        let reg = self.next_registration();
        let seg = self.new_segment(Segment { base, size, stream, pool: p, expandable: true, page, reg, head: NIL });
        let b = self.blocks.insert(Block::spanning(seg, &self.segs[seg], State::Unmapped));
        self.segs[seg].head = b;
        self.insert_unmapped(b);
        Some(b)
    }

    /// §6.2 step 3: back `size` bytes (rounded up to pages) at the start of
    /// unmapped block `i`; merge with free mapped neighbours.
    fn map_block(&mut self, i: u32, size: u64) -> bool {
        let b = &self.blocks[i];
        debug_assert_eq!(b.state, State::Unmapped);
        let seg = &self.segs[b.seg];
        let (addr, stream, block_size) = (b.addr, b.stream, b.size);
        let off = addr - seg.base;
        let (page, mapped) = (seg.page, ((off + size).div_ceil(seg.page) * seg.page - off).min(block_size));
        // One handle per page, as PyTorch's ExpandableSegment::map (cuMemCreate per
        // segment_size chunk, rolled back on OOM): a page is unmapped alone later.
        let mut done = 0;
        while done < mapped {
            let n = page.min(mapped - done);
            if !self.device.map(addr + done, n) {
                if done > 0 {
                    self.device.unmap(addr, done);
                }
                return false;
            }
            done += n;
        }
        self.remove_unmapped(i);
        self.blocks[i].state = State::Allocated; // transient: mapped, not in a set
        if mapped < block_size {
            let rest = self.sibling(i, addr + mapped, block_size - mapped, State::Unmapped);
            self.blocks[i].size = mapped;
            let r = self.link_after(i, rest);
            self.insert_unmapped(r);
        }
        let (prev, next) = (self.blocks[i].prev, self.blocks[i].next);
        self.try_merge(i, prev);
        self.try_merge(i, next);
        self.insert_free(i);
        let small = self.pool_small(i);
        self.stats.reserved_bytes.increase(small, mapped);
        self.stats.num_device_alloc += 1;
        self.total_reserved += mapped;
        self.emit(Event::SegmentMap { addr, size: mapped, stream });
        true
    }

    /// §6.2: find room, map what is missing, take the block out of the free set.
    pub(super) fn try_allocate_expandable_block(&mut self, p: u32, stream: StreamId, s: u64) -> Option<u32> {
        let mut c = self.find_expandable_block(p, stream, s)?;
        if self.blocks[c].state == State::Unmapped {
            let size = self.blocks[c].size.min(s);
            if !self.map_block(c, size) {
                return None;
            }
        }
        while self.blocks[c].size < s {
            let next = self.blocks[c].next;
            if next == NIL || self.blocks[next].state != State::Unmapped {
                return None;
            }
            let missing = (s - self.blocks[c].size).min(self.blocks[next].size);
            if !self.map_block(next, missing) {
                return None;
            }
            // map_block merged `c` into `next`.
            c = next;
        }
        self.remove_free(c);
        Some(c)
    }

    /// §6.4: unmap the whole pages strictly inside free block `i`; partial
    /// pages stay as free mapped blocks. Returns the block that now holds
    /// the unmapped range (or `i` if nothing was unmapped).
    pub(super) fn unmap_block(&mut self, i: u32) -> u32 {
        let b = &self.blocks[i];
        let seg = &self.segs[b.seg];
        let (addr, size, stream) = (b.addr, b.size, b.stream);
        let off = addr - seg.base;
        let first = off.div_ceil(seg.page) * seg.page;
        let last = (off + size) / seg.page * seg.page;
        if last <= first {
            return i;
        }
        let (ustart, usize_) = (seg.base + first, last - first);
        self.remove_free(i);
        let before = ustart - addr;
        if before > 0 {
            let piece = self.sibling(i, addr, before, State::Free);
            let n = self.link_before(i, piece);
            self.insert_free(n);
        }
        let after = size - before - usize_;
        if after > 0 {
            let piece = self.sibling(i, ustart + usize_, after, State::Free);
            let n = self.link_after(i, piece);
            self.insert_free(n);
        }
        let b = &mut self.blocks[i];
        b.addr = ustart;
        b.size = usize_;
        b.state = State::Unmapped;
        let (prev, next) = (b.prev, b.next);
        self.try_merge(i, prev);
        self.try_merge(i, next);
        self.insert_unmapped(i);
        self.device.unmap(ustart, usize_);
        let small = self.pool_small(i);
        self.stats.reserved_bytes.decrease(small, usize_);
        self.stats.num_device_free += 1;
        self.total_reserved -= usize_;
        self.emit(Event::SegmentUnmap { addr: ustart, size: usize_, stream });
        i
    }

    /// Destroy a reservation that is one unmapped block (no trace entry, §5.2).
    pub(super) fn release_expandable_segment(&mut self, i: u32) {
        self.remove_unmapped(i);
        let b = self.blocks.remove(i);
        let seg = &self.segs[b.seg];
        let (base, size) = (seg.base, seg.size);
        self.device.release_reservation(base, size);
        self.drop_segment(b.seg);
    }
}
