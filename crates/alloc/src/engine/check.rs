//! Structural self-check, for tests and for debugging a replay.

use super::block::{State, NIL};
use super::CachingAllocator;
use crate::device::DeviceMemory;
use crate::stats::StatArray;

/// A broken invariant of an allocator's own bookkeeping, found by a consistency check
/// ([`CachingAllocator::check_invariants`], `Policy::check`): a bug in the model or a
/// policy, never a property of the input, so no caller acts on which one broke. The words
/// say which invariant and where (`block 0x… missing from the free set`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvariantError(pub String);

impl std::fmt::Display for InvariantError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for InvariantError {}

impl From<String> for InvariantError {
    fn from(what: String) -> Self {
        InvariantError(what)
    }
}

impl From<&str> for InvariantError {
    fn from(what: &str) -> Self {
        InvariantError(what.to_string())
    }
}

impl<D: DeviceMemory> CachingAllocator<D> {
    /// Verify every invariant the policy relies on: blocks tile each segment,
    /// segments are disjoint, set membership matches block state, and every
    /// stat equals the sum it stands for. Returns the first violation.
    ///
    /// Its steps are helpers of one caller each, `#[inline(always)]` for the reason given
    /// at [`Self::seed_segment`].
    pub fn check_invariants(&self) -> Result<(), InvariantError> {
        // 1. Walk every segment's blocks, summing what the stats and sets should hold.
        let mut want = Sums::default();
        let mut seen = Seen { free: vec![0; self.pools.len()], unmapped: vec![0; self.pools.len()], ..Seen::default() };
        let mut last_end = 0u64;
        for (&base, &si) in &self.seg_by_addr {
            let seg = &self.segs[si];
            if seg.base != base {
                return Err(format!("segment {si} base {:#x} indexed at {base:#x}", seg.base).into());
            }
            if base < last_end {
                return Err(format!("segment {base:#x} overlaps the previous one").into());
            }
            last_end = base + seg.size;
            self.check_segment(si, &mut want, &mut seen)?;
        }
        // 2. The sets and maps hold nothing the blocks do not account for.
        for (p, pool) in self.pools.iter().enumerate() {
            if pool.free.len() != seen.free[p] || pool.unmapped.len() != seen.unmapped[p] {
                return Err(format!("pool {p}: set sizes differ from block states").into());
            }
        }
        if self.active.len() != seen.active || self.pending.len() != seen.pending {
            return Err("active or pending map has stale entries".into());
        }
        let auto = self.pending.values().filter(|&i| self.blocks[i].auto_complete).count();
        if auto != self.auto_pending {
            return Err("auto-pending count is off".into());
        }
        // 3. Every stat equals its sum.
        self.check_stats(&want)
    }

    /// Segment `si`: its blocks tile it, are linked in address order, carry its identity,
    /// and no two neighbours are both free (or both unmapped) since they would have been
    /// merged. Adds what it holds to `want` and `seen` ([`Self::check_block`]).
    #[inline(always)]
    fn check_segment(&self, si: u32, want: &mut Sums, seen: &mut Seen) -> Result<(), InvariantError> {
        let seg = &self.segs[si];
        let base = seg.base;
        let small = self.pools[seg.pool as usize].small;
        if !seg.expandable {
            want.segment[small as usize] += 1;
            want.reserved[small as usize] += seg.size;
            if seg.size >= self.max_split {
                want.oversize_segments += 1;
            }
        }
        let split = {
            let h = &self.blocks[seg.head];
            h.prev != NIL || h.next != NIL
        };
        let mut at = base;
        let mut prev = NIL;
        let mut prev_state: Option<State> = None;
        let mut i = seg.head;
        while i != NIL {
            let b = &self.blocks[i];
            if b.prev != prev || b.seg != si || b.pool != seg.pool || b.stream != seg.stream {
                return Err(format!("block {:#x}: bad links or identity", b.addr).into());
            }
            if b.expandable != seg.expandable {
                return Err(format!("block {:#x}: segment identity differs", b.addr).into());
            }
            if b.addr != at || b.size == 0 {
                return Err(format!("segment {base:#x}: block at {:#x} expected at {at:#x}", b.addr).into());
            }
            if matches!(
                (prev_state, b.state),
                (Some(State::Free), State::Free) | (Some(State::Unmapped), State::Unmapped)
            ) {
                return Err(format!("block {:#x}: unmerged neighbour of the same state", b.addr).into());
            }
            self.check_block(i, split, want, seen)?;
            at += b.size;
            prev = i;
            prev_state = Some(b.state);
            i = b.next;
        }
        if at != base + seg.size {
            return Err(format!("segment {base:#x}: blocks end at {at:#x}, segment at {:#x}", base + seg.size).into());
        }
        Ok(())
    }

    /// Block `i`: it is in the set or map its state says (free set, unmapped set, active
    /// map, pending map), and what it holds is added to the sums its stats stand for. A
    /// free block of a split (non-expandable) segment is an `inactive_split` block; an
    /// expandable segment's reserved bytes are its mapped blocks. `split`: whether its
    /// segment holds more than one block.
    #[inline(always)]
    fn check_block(&self, i: u32, split: bool, want: &mut Sums, seen: &mut Seen) -> Result<(), InvariantError> {
        let b = &self.blocks[i];
        let seg = &self.segs[b.seg];
        let small = self.pools[seg.pool as usize].small as usize;
        let p = b.pool as usize;
        match b.state {
            State::Free => {
                if !self.pools[p].free.contains(b.stream, &self.free_key(i), i) {
                    return Err(format!("free block {:#x} missing from the free set", b.addr).into());
                }
                seen.free[p] += 1;
                if seg.expandable {
                    want.reserved[small] += b.size;
                } else if split {
                    want.inactive_split[small] += 1;
                    want.inactive_split_bytes[small] += b.size;
                }
            }
            State::Unmapped => {
                if !self.pools[p].unmapped.contains(&(b.stream, b.addr, i)) {
                    return Err(format!("unmapped block {:#x} missing from the unmapped set", b.addr).into());
                }
                if !(b.addr - seg.base).is_multiple_of(seg.page) || !b.size.is_multiple_of(seg.page) {
                    return Err(format!("unmapped block {:#x} not page aligned", b.addr).into());
                }
                seen.unmapped[p] += 1;
            }
            State::Allocated | State::Pending => {
                if self.active.get(&b.addr) != Some(&i) {
                    return Err(format!("active block {:#x} missing from the active map", b.addr).into());
                }
                seen.active += 1;
                if seg.expandable {
                    want.reserved[small] += b.size;
                }
                want.active[small] += 1;
                want.active_bytes[small] += b.size;
                want.requested[small] += b.requested;
                if b.state == State::Allocated {
                    want.allocation[small] += 1;
                    want.allocated[small] += b.size;
                    if b.size >= self.max_split {
                        want.oversize_allocations += 1;
                    }
                } else {
                    seen.pending += 1;
                    if self.pending.get(b.stamp) != Some(i) {
                        return Err(format!("pending block {:#x} missing from the pending map", b.addr).into());
                    }
                }
            }
        }
        Ok(())
    }

    /// Every stat against the sum the blocks gave (`want`), and reserved bytes against
    /// the device total.
    #[inline(always)]
    fn check_stats(&self, want: &Sums) -> Result<(), InvariantError> {
        let s = &self.stats;
        check(&s.allocation, want.allocation, "allocation")?;
        check(&s.allocated_bytes, want.allocated, "allocated_bytes")?;
        check(&s.segment, want.segment, "segment")?;
        check(&s.reserved_bytes, want.reserved, "reserved_bytes")?;
        check(&s.active, want.active, "active")?;
        check(&s.active_bytes, want.active_bytes, "active_bytes")?;
        check(&s.inactive_split, want.inactive_split, "inactive_split")?;
        check(&s.inactive_split_bytes, want.inactive_split_bytes, "inactive_split_bytes")?;
        check(&s.requested_bytes, want.requested, "requested_bytes")?;
        if s.oversize_allocations.current != want.oversize_allocations as i64
            || s.oversize_segments.current != want.oversize_segments as i64
        {
            return Err("oversize stats differ".into());
        }
        if s.reserved_bytes.all().current != self.total_reserved as i64 {
            return Err("reserved_bytes differs from the device total".into());
        }
        Ok(())
    }
}

/// How many blocks the segment walk found in each set or map, to compare with their
/// sizes: free and unmapped blocks per pool, active blocks, pending ones among them.
#[derive(Default)]
struct Seen {
    free: Vec<usize>,
    unmapped: Vec<usize>,
    active: usize,
    pending: usize,
}

/// What each stat should be, summed over the blocks (each array indexed [large, small]).
#[derive(Default)]
struct Sums {
    allocation: [u64; 2],
    allocated: [u64; 2],
    segment: [u64; 2],
    reserved: [u64; 2],
    active: [u64; 2],
    active_bytes: [u64; 2],
    inactive_split: [u64; 2],
    inactive_split_bytes: [u64; 2],
    requested: [u64; 2],
    oversize_allocations: u64,
    oversize_segments: u64,
}

/// `want` is indexed [large, small].
fn check(a: &StatArray, want: [u64; 2], name: &str) -> Result<(), InvariantError> {
    let (small, large) = (want[1] as i64, want[0] as i64);
    let got = (a.all().current, a.small_pool().current, a.large_pool().current);
    if got != (small + large, small, large) {
        return Err(format!("{name}: stats {got:?}, blocks say ({}, {small}, {large})", small + large).into());
    }
    for s in &a.0 {
        if s.peak < s.current {
            return Err(format!("{name}: peak below current: {s:?}").into());
        }
    }
    Ok(())
}
