//! Structural self-check, for tests and for debugging a replay.

use super::block::{State, NIL};
use super::CachingAllocator;
use crate::device::DeviceMemory;
use crate::stats::StatArray;

impl<D: DeviceMemory> CachingAllocator<D> {
    /// Verify every invariant the policy relies on: blocks tile each segment,
    /// segments are disjoint, set membership matches block state, and every
    /// stat equals the sum it stands for. Returns the first violation.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut want = Sums::default();
        let mut free_count = vec![0usize; self.pools.len()];
        let mut unmapped_count = vec![0usize; self.pools.len()];
        let mut active_count = 0usize;
        let mut pending_count = 0usize;
        let mut last_end = 0u64;
        for (&base, &si) in &self.seg_by_addr {
            let seg = &self.segs[si];
            if seg.base != base {
                return Err(format!("segment {si} base {:#x} indexed at {base:#x}", seg.base));
            }
            if base < last_end {
                return Err(format!("segment {base:#x} overlaps the previous one"));
            }
            last_end = base + seg.size;
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
                    return Err(format!("block {:#x}: bad links or identity", b.addr));
                }
                if b.expandable != seg.expandable {
                    return Err(format!("block {:#x}: segment identity differs", b.addr));
                }
                if b.addr != at || b.size == 0 {
                    return Err(format!("segment {base:#x}: block at {:#x} expected at {at:#x}", b.addr));
                }
                if matches!(
                    (prev_state, b.state),
                    (Some(State::Free), State::Free) | (Some(State::Unmapped), State::Unmapped)
                ) {
                    return Err(format!("block {:#x}: unmerged neighbour of the same state", b.addr));
                }
                let p = b.pool as usize;
                match b.state {
                    State::Free => {
                        if !self.pools[p].free.contains(b.stream, &self.free_key(i), i) {
                            return Err(format!("free block {:#x} missing from the free set", b.addr));
                        }
                        free_count[p] += 1;
                        if seg.expandable {
                            want.reserved[small as usize] += b.size;
                        } else if split {
                            want.inactive_split[small as usize] += 1;
                            want.inactive_split_bytes[small as usize] += b.size;
                        }
                    }
                    State::Unmapped => {
                        if !self.pools[p].unmapped.contains(&(b.stream, b.addr, i)) {
                            return Err(format!("unmapped block {:#x} missing from the unmapped set", b.addr));
                        }
                        if !(b.addr - seg.base).is_multiple_of(seg.page) || !b.size.is_multiple_of(seg.page) {
                            return Err(format!("unmapped block {:#x} not page aligned", b.addr));
                        }
                        unmapped_count[p] += 1;
                    }
                    State::Allocated | State::Pending => {
                        if self.active.get(&b.addr) != Some(&i) {
                            return Err(format!("active block {:#x} missing from the active map", b.addr));
                        }
                        active_count += 1;
                        if seg.expandable {
                            want.reserved[small as usize] += b.size;
                        }
                        want.active[small as usize] += 1;
                        want.active_bytes[small as usize] += b.size;
                        want.requested[small as usize] += b.requested;
                        if b.state == State::Allocated {
                            want.allocation[small as usize] += 1;
                            want.allocated[small as usize] += b.size;
                            if b.size >= self.max_split {
                                want.oversize_allocations += 1;
                            }
                        } else {
                            pending_count += 1;
                            if self.pending.get(b.stamp) != Some(i) {
                                return Err(format!("pending block {:#x} missing from the pending map", b.addr));
                            }
                        }
                    }
                }
                at += b.size;
                prev = i;
                prev_state = Some(b.state);
                i = b.next;
            }
            if at != base + seg.size {
                return Err(format!("segment {base:#x}: blocks end at {at:#x}, segment at {:#x}", base + seg.size));
            }
        }
        for (p, pool) in self.pools.iter().enumerate() {
            if pool.free.len() != free_count[p] || pool.unmapped.len() != unmapped_count[p] {
                return Err(format!("pool {p}: set sizes differ from block states"));
            }
        }
        if self.active.len() != active_count || self.pending.len() != pending_count {
            return Err("active or pending map has stale entries".into());
        }
        let auto = self.pending.values().filter(|&i| self.blocks[i].auto_complete).count();
        if auto != self.auto_pending {
            return Err("auto-pending count is off".into());
        }
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
fn check(a: &StatArray, want: [u64; 2], name: &str) -> Result<(), String> {
    let (small, large) = (want[1] as i64, want[0] as i64);
    let got = (a.all().current, a.small_pool().current, a.large_pool().current);
    if got != (small + large, small, large) {
        return Err(format!("{name}: stats {got:?}, blocks say ({}, {small}, {large})", small + large));
    }
    for s in &a.0 {
        if s.peak < s.current {
            return Err(format!("{name}: peak below current: {s:?}"));
        }
    }
    Ok(())
}
