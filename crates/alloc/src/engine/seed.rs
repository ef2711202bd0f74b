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

impl<D: DeviceMemory> CachingAllocator<D> {
    /// Add a segment that existed before the trace. Emits no events.
    pub fn seed_segment(&mut self, seg: SeedSegment) -> Result<(), SeedError> {
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
        // The pool is chosen by the segment's kind, as `is_large` says.
        let p = self.pool_index(seg.pool, !seg.is_large);

        // Where do the blocks go: a fresh segment, or an unmapped hole of a reservation?
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

        let (seg_idx, mut anchor) = match hole {
            Some(u) => (self.blocks[u].seg, Some(u)),
            None => {
                let reg = match seg.registration {
                    Some(r) => {
                        self.reg_counter = self.reg_counter.max(r + 1);
                        r
                    }
                    None => self.next_registration(),
                };
                if seg.is_expandable {
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
                } else {
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
                    (si, None)
                }
            }
        };
        let _ = seg_idx;

        let small = self.pools[p as usize].small;
        if seg.is_expandable {
            // Carve [addr, end) out of the unmapped block.
            let u = anchor.take().expect("reservation hole");
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
            anchor = Some(u);
            self.device.adopt_mapping(addr, seg.size);
            self.stats.reserved_bytes.increase(small, seg.size);
        } else {
            self.device.adopt_allocation(addr, seg.size);
            self.stats.segment.increase(small, 1);
            self.stats.reserved_bytes.increase(small, seg.size);
            if seg.size >= self.max_split {
                self.stats.oversize_segments.increase(1);
            }
        }
        self.total_reserved += seg.size;

        // Lay the blocks down: the first reuses the carved block (expandable) or
        // starts the segment; later ones are linked after their predecessor.
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
                        let i = self.blocks.insert(self.raw_block(seg_idx, p, seg.stream, addr, sb.size, false));
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
        for (i, sb) in created.into_iter().zip(&seg.blocks) {
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
        Ok(())
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
