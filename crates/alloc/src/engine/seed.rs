//! Seeding an initial state for traces that begin mid-run (spec §10.12):
//! segments and blocks appear as if they had always been there, with no
//! events and stats counted as `memory_stats()` would show them.

use super::block::{Block, Segment, State, NIL};
use super::{BlockState, CachingAllocator};
use crate::device::DeviceMemory;
use crate::{Addr, PoolId, StreamId};
use std::fmt;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeedBlock {
    pub address: Addr,
    pub size: u64,
    pub requested_size: u64,
    pub state: BlockState,
}

/// A snapshot segment. For expandable memory, one contiguous mapped range;
/// ranges of the same (stream, pool) that fall inside one reservation share it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeedSegment {
    pub address: Addr,
    pub size: u64,
    pub stream: StreamId,
    pub pool: PoolId,
    pub is_large: bool,
    pub is_expandable: bool,
    /// Registration counter if the snapshot has one (2.11+); else seeding order.
    pub registration: Option<u64>,
    /// Must tile `[address, address + size)` exactly, in address order.
    pub blocks: Vec<SeedBlock>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SeedError {
    EmptySegment {
        address: Addr,
    },
    /// Blocks leave a gap, overlap, or do not end at the segment end.
    BadTiling {
        address: Addr,
        at: Addr,
    },
    ZeroSizeBlock {
        address: Addr,
    },
    /// The range overlaps a segment already present (or mapped memory of a reservation).
    Overlap {
        address: Addr,
        existing: Addr,
    },
    /// Address range wraps around u64.
    AddressOverflow {
        address: Addr,
    },
}

impl fmt::Display for SeedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SeedError::EmptySegment { address } => write!(f, "segment {address:#x} has no blocks or zero size"),
            SeedError::BadTiling { address, at } => {
                write!(f, "blocks of segment {address:#x} do not tile it exactly (at {at:#x})")
            }
            SeedError::ZeroSizeBlock { address } => write!(f, "block {address:#x} has zero size"),
            SeedError::Overlap { address, existing } => {
                write!(f, "segment {address:#x} overlaps existing segment {existing:#x}")
            }
            SeedError::AddressOverflow { address } => write!(f, "segment {address:#x} wraps the address space"),
        }
    }
}

impl std::error::Error for SeedError {}

/// Checks that `seg` is non-empty and that its blocks tile it exactly, in address
/// order with no zero-size block: the engine's invariants assume it. Returns its end.
#[inline(always)]
fn check_tiling(seg: &SeedSegment) -> Result<Addr, SeedError> {
    let addr = seg.address;
    let end = addr.checked_add(seg.size).ok_or(SeedError::AddressOverflow { address: addr })?;
    if seg.size == 0 || seg.blocks.is_empty() {
        return Err(SeedError::EmptySegment { address: addr });
    }
    let mut at = addr;
    for b in &seg.blocks {
        if b.size == 0 {
            return Err(SeedError::ZeroSizeBlock { address: b.address });
        }
        if b.address != at {
            return Err(SeedError::BadTiling { address: addr, at: b.address });
        }
        at = at.checked_add(b.size).ok_or(SeedError::AddressOverflow { address: addr })?;
    }
    if at != end {
        return Err(SeedError::BadTiling { address: addr, at });
    }
    Ok(end)
}

impl<D: DeviceMemory> CachingAllocator<D> {
    /// Add a segment that existed before the trace. Emits no events.
    ///
    /// The steps are helpers of one caller each, `#[inline(always)]` so that the engine's
    /// own methods they call keep the inlining they had when this was one function: the
    /// engine is generic, and how it is inlined where it is instantiated (the replay's
    /// what-ifs) shows in their speed.
    pub fn seed_segment(&mut self, seg: SeedSegment) -> Result<(), SeedError> {
        let addr = seg.address;
        let end = check_tiling(&seg)?;
        // The pool is chosen by the segment's kind, as `is_large` says.
        let p = self.pool_index(seg.pool, !seg.is_large);
        // 1. Where do the blocks go: a fresh segment, or an unmapped hole of a reservation?
        let (hole, next_seg) = self.seed_place(&seg, p, end)?;
        let (seg_idx, anchor) = match hole {
            Some(u) => (self.blocks[u].seg, Some(u)),
            None => self.seed_new_segment(&seg, p, next_seg),
        };
        // 2. Map (expandable) or adopt the memory, and count it as reserved.
        let small = self.pools[p as usize].small;
        let anchor = if seg.is_expandable {
            Some(self.seed_map_range(&seg, anchor.expect("reservation hole"), end, small))
        } else {
            self.device.adopt_allocation(addr, seg.size);
            self.stats.segment.increase(small, 1);
            self.stats.reserved_bytes.increase(small, seg.size);
            if seg.size >= self.max_split {
                self.stats.oversize_segments.increase(1);
            }
            anchor
        };
        self.total_reserved += seg.size;
        // 3. Lay the blocks down, then 4. give each its state.
        let created = self.seed_lay_blocks(&seg, seg_idx, p, anchor);
        for (i, sb) in created.into_iter().zip(&seg.blocks) {
            self.seed_block_state(i, sb, small);
        }
        Ok(())
    }

    /// Where `seg` (in pool `p`, ending at `end`) goes. Inside an existing segment only
    /// if that is an expandable reservation of the same stream and pool with an unmapped
    /// block covering the whole range (the hole returned); else it must overlap no
    /// segment. Also returns the next segment above, which bounds a new reservation.
    #[inline(always)]
    fn seed_place(&self, seg: &SeedSegment, p: u32, end: Addr) -> Result<(Option<u32>, Option<u32>), SeedError> {
        let addr = seg.address;
        let prev_seg = self.seg_by_addr.range(..=addr).next_back().map(|(_, &s)| s);
        let next_seg = self.seg_by_addr.range(addr + 1..).next().map(|(_, &s)| s);
        let mut hole: Option<u32> = None;
        if let Some(si) = prev_seg {
            let s = &self.segs[si];
            if s.base + s.size > addr {
                let same = s.expandable && seg.is_expandable && s.stream == seg.stream && s.pool == p;
                if !(same && end <= s.base + s.size) {
                    return Err(SeedError::Overlap { address: addr, existing: s.base });
                }
                let u = self.find_unmapped_containing(si, addr, end);
                hole = Some(u.ok_or(SeedError::Overlap { address: addr, existing: s.base })?);
            }
        }
        if hole.is_none() {
            if let Some(si) = next_seg {
                if self.segs[si].base < end {
                    return Err(SeedError::Overlap { address: addr, existing: self.segs[si].base });
                }
            }
        }
        Ok((hole, next_seg))
    }

    /// A new segment for `seg`, keeping its recorded registration number (or taking the
    /// next one). An expandable one becomes a whole reservation of the size PyTorch would
    /// have reserved (not above the next segment, `next_seg`), unmapped for now, and its
    /// unmapped block is returned as the anchor that [`Self::seed_map_range`] carves.
    #[inline(always)]
    fn seed_new_segment(&mut self, seg: &SeedSegment, p: u32, next_seg: Option<u32>) -> (u32, Option<u32>) {
        let addr = seg.address;
        let reg = match seg.registration {
            Some(r) => {
                self.reg_counter = self.reg_counter.max(r + 1);
                r
            }
            None => self.next_registration(),
        };
        if !seg.is_expandable {
            let si = self.new_segment(Segment {
                base: addr,
                size: seg.size,
                stream: seg.stream,
                pool: p,
                expandable: false,
                page: 0,
                reg,
                head: NIL,
            });
            return (si, None);
        }
        let page = self.page_size(p);
        let limit = next_seg.map_or(u64::MAX, |si| self.segs[si].base) - addr;
        let want = self.reservation_size(page).max(seg.size.div_ceil(page) * page);
        let rsize = want.min(limit).max(seg.size);
        let si = self.new_segment(Segment {
            base: addr,
            size: rsize,
            stream: seg.stream,
            pool: p,
            expandable: true,
            page,
            reg,
            head: NIL,
        });
        self.device.adopt_reservation(addr, rsize);
        let u = self.blocks.insert(self.raw_block(si, p, seg.stream, addr, rsize, true));
        self.segs[si].head = u;
        self.insert_unmapped(u);
        (si, Some(u))
    }

    /// Maps `[seg.address, end)` of an expandable reservation: carves it out of the
    /// unmapped block `u` that holds it (the pieces before and after stay unmapped) and
    /// counts it as reserved. Returns the mapped block, which the first seeded block reuses.
    #[inline(always)]
    fn seed_map_range(&mut self, seg: &SeedSegment, u: u32, end: Addr, small: bool) -> u32 {
        let addr = seg.address;
        self.remove_unmapped(u);
        let (ua, us) = (self.blocks[u].addr, self.blocks[u].size);
        if end < ua + us {
            let rest = self.sibling(u, end, ua + us - end, State::Unmapped);
            let r = self.link_after(u, rest);
            self.insert_unmapped(r);
        }
        self.blocks[u].size = end - ua;
        if addr > ua {
            let front = self.sibling(u, ua, addr - ua, State::Unmapped);
            let f = self.link_before(u, front);
            self.insert_unmapped(f);
        }
        self.blocks[u].addr = addr;
        self.blocks[u].size = end - addr;
        self.blocks[u].state = State::Allocated;
        self.device.adopt_mapping(addr, seg.size);
        self.stats.reserved_bytes.increase(small, seg.size);
        u
    }

    /// Lays `seg`'s blocks down in segment `seg_idx`, all allocated for now: the first
    /// reuses the carved block `anchor` (expandable) or starts the segment; later ones
    /// are linked after their predecessor. Returns them in address order.
    #[inline(always)]
    fn seed_lay_blocks(&mut self, seg: &SeedSegment, seg_idx: u32, p: u32, anchor: Option<u32>) -> Vec<u32> {
        let mut last: u32 = NIL;
        let mut created = Vec::with_capacity(seg.blocks.len());
        for (k, sb) in seg.blocks.iter().enumerate() {
            let i = if k == 0 {
                match anchor {
                    Some(u) => {
                        self.blocks[u].size = sb.size;
                        u
                    }
                    None => {
                        let i = self.blocks.insert(self.raw_block(seg_idx, p, seg.stream, seg.address, sb.size, false));
                        self.segs[seg_idx].head = i;
                        i
                    }
                }
            } else {
                let b = self.sibling(last, sb.address, sb.size, State::Allocated);
                self.link_after(last, b)
            };
            self.blocks[i].requested = sb.requested_size;
            self.blocks[i].state = State::Allocated;
            created.push(i);
            last = i;
        }
        created
    }

    /// Gives the laid-down block `i` the state `sb` recorded, with the stats
    /// `memory_stats()` would show for it: active (allocated, or freed by the program but
    /// still in use by a stream: pending), or free in the cache.
    #[inline(always)]
    fn seed_block_state(&mut self, i: u32, sb: &SeedBlock, small: bool) {
        match sb.state {
            BlockState::Allocated | BlockState::PendingFree => {
                self.active.insert(sb.address, i);
                let st = &mut self.stats;
                st.active.increase(small, 1);
                st.active_bytes.increase(small, sb.size);
                st.requested_bytes.increase(small, sb.requested_size);
                if sb.state == BlockState::Allocated {
                    st.allocation.increase(small, 1);
                    st.allocated_bytes.increase(small, sb.size);
                    if sb.size >= self.max_split {
                        st.oversize_allocations.increase(1);
                    }
                } else {
                    let seq = self.pending_seq;
                    self.pending_seq += 1;
                    self.blocks[i].state = State::Pending;
                    self.blocks[i].stamp = seq;
                    self.blocks[i].auto_complete = false;
                    self.pending.push(seq, i);
                }
            }
            BlockState::Free => {
                // Adjacent free pieces cannot exist in PyTorch: merge them.
                let (prev, next) = (self.blocks[i].prev, self.blocks[i].next);
                self.try_merge(i, prev);
                self.try_merge(i, next);
                self.insert_free(i);
            }
        }
    }

    fn raw_block(&self, seg: u32, pool: u32, stream: StreamId, addr: Addr, size: u64, expandable: bool) -> Block {
        Block {
            addr,
            size,
            requested: 0,
            stream,
            pool,
            seg,
            prev: NIL,
            next: NIL,
            state: State::Unmapped,
            expandable,
            extra_streams: false,
            auto_complete: false,
            stamp: 0,
        }
    }

    /// The unmapped block of reservation `si` that contains `[a, e)`.
    fn find_unmapped_containing(&self, si: u32, a: Addr, e: Addr) -> Option<u32> {
        let mut i = self.segs[si].head;
        while i != NIL {
            let b = &self.blocks[i];
            if b.addr <= a && e <= b.addr + b.size {
                return (b.state == State::Unmapped).then_some(i);
            }
            i = b.next;
        }
        None
    }
}
