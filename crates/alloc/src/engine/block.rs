//! Blocks and segments, stored in slabs and linked by index (spec §2.1).

use crate::{Addr, StreamId};

/// "No block" in prev/next links.
pub(crate) const NIL: u32 = u32::MAX;

/// Where a block is in its life. `Unmapped` exists only in expandable
/// reservations (VA not backed by memory, §6).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum State {
    /// Mapped, unallocated, in its pool's free set.
    Free,
    /// Handed out (also used transiently for a block taken out of the free set).
    Allocated,
    /// `free_requested` seen, waiting on stream events; unusable and unmergeable (§4.1).
    Pending,
    /// Expandable VA without physical pages; in the pool's unmapped set.
    Unmapped,
}

/// 64 bytes, aligned to a cache line: the replay touches blocks all over a slab
/// of a hundred thousand of them, and an 80-byte block straddled two lines at
/// most accesses. Fields that only some states need share a slot (`stamp`), and
/// the registration counter is read from the segment (it is the segment's).
#[derive(Clone, Copy, Debug)]
#[repr(align(64))]
pub(crate) struct Block {
    pub addr: Addr,
    pub size: u64,
    /// Unrounded size of the last allocation; kept after free like PyTorch (§4.2 step 5).
    pub requested: u64,
    pub stream: StreamId,
    /// Index into the allocator's block pools.
    pub pool: u32,
    /// Index into the allocator's segments (the reservation for expandable).
    pub seg: u32,
    pub prev: u32,
    pub next: u32,
    pub state: State,
    pub expandable: bool,
    /// `record_stream` on another stream: free must wait for events (§4.1 step 3).
    pub extra_streams: bool,
    /// Pending free completes by itself at the next malloc (set by `free`),
    /// rather than only by `free_completed` or a sync (set by `free_requested`).
    pub auto_complete: bool,
    /// While `Pending`: the block's key in the pending queue. While `Free`: the
    /// pool search counter when it entered the free set (GC age, §5.5). Read
    /// only in those states, and set on entering them.
    pub stamp: u64,
}

const _: () = assert!(std::mem::size_of::<Block>() == 64);

impl Block {
    /// The one block a new segment (or expandable reservation) starts as: all of it.
    pub fn spanning(seg: u32, s: &Segment, state: State) -> Block {
        Block {
            addr: s.base,
            size: s.size,
            requested: 0,
            stream: s.stream,
            pool: s.pool,
            seg,
            prev: NIL,
            next: NIL,
            state,
            expandable: s.expandable,
            extra_streams: false,
            auto_complete: false,
            stamp: 0,
        }
    }
}

/// One `cudaMalloc` segment, or one expandable VA reservation.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Segment {
    pub base: Addr,
    pub size: u64,
    pub stream: StreamId,
    pub pool: u32,
    pub expandable: bool,
    /// Page size of an expandable reservation (§6.1).
    pub page: u64,
    pub reg: u64,
    /// Lowest-address block.
    pub head: u32,
}

/// A slab with slot reuse: indices stay valid until removed. Removed slots
/// keep their stale value until reused (no per-access "is live" branch);
/// callers never hold an index past its removal.
#[derive(Clone, Debug)]
pub(crate) struct Slab<T: Copy> {
    items: Vec<T>,
    free: Vec<u32>,
    len: usize,
}

impl<T: Copy> Default for Slab<T> {
    fn default() -> Self {
        Slab { items: Vec::new(), free: Vec::new(), len: 0 }
    }
}

impl<T: Copy> Slab<T> {
    #[inline]
    pub fn insert(&mut self, v: T) -> u32 {
        self.len += 1;
        if let Some(i) = self.free.pop() {
            self.items[i as usize] = v;
            i
        } else {
            self.items.push(v);
            (self.items.len() - 1) as u32
        }
    }
    #[inline]
    pub fn remove(&mut self, i: u32) -> T {
        self.free.push(i);
        self.len -= 1;
        self.items[i as usize]
    }
    pub fn len(&self) -> usize {
        self.len
    }
}

impl<T: Copy> std::ops::Index<u32> for Slab<T> {
    type Output = T;
    #[inline]
    fn index(&self, i: u32) -> &T {
        &self.items[i as usize]
    }
}

impl<T: Copy> std::ops::IndexMut<u32> for Slab<T> {
    #[inline]
    fn index_mut(&mut self, i: u32) -> &mut T {
        &mut self.items[i as usize]
    }
}

/// Address → slab index for the active blocks: open addressing with linear
/// probing in one array of `(address, index)` slots (one cache line per lookup
/// as a rule, where a general hash map reads a control byte and then the slot),
/// Fibonacci hashing of the address without its 512-byte alignment, removal by
/// backward shift (no tombstones), at most half full. Holds one entry per
/// active block, like the map it replaces; never iterated.
#[derive(Clone, Debug)]
pub(crate) struct AddrTable {
    slots: Vec<(Addr, u32)>,
    /// 64 − log2(slots.len()).
    shift: u32,
    len: usize,
    /// The value at the address that marks empty slots, kept apart.
    at_max: Option<u32>,
}

/// An empty slot (no block starts at the last address).
const EMPTY: Addr = Addr::MAX;

impl Default for AddrTable {
    fn default() -> Self {
        AddrTable { slots: vec![(EMPTY, 0); 16], shift: 64 - 4, len: 0, at_max: None }
    }
}

impl AddrTable {
    #[inline]
    fn home(&self, a: Addr) -> usize {
        ((a >> 9).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> self.shift) as usize
    }
    #[inline]
    fn mask(&self) -> usize {
        self.slots.len() - 1
    }
    pub fn len(&self) -> usize {
        self.len
    }
    #[inline]
    pub fn get(&self, a: &Addr) -> Option<&u32> {
        let a = *a;
        if a == EMPTY {
            return self.at_max.as_ref();
        }
        let mask = self.mask();
        let mut i = self.home(a);
        loop {
            let s = &self.slots[i];
            if s.0 == a {
                return Some(&s.1);
            }
            if s.0 == EMPTY {
                return None;
            }
            i = (i + 1) & mask;
        }
    }
    /// Insert or replace; the previous value if any.
    #[inline]
    pub fn insert(&mut self, a: Addr, v: u32) -> Option<u32> {
        if a == EMPTY {
            let old = self.at_max.replace(v);
            self.len += old.is_none() as usize;
            return old;
        }
        if (self.len + 1) * 2 > self.slots.len() {
            self.grow();
        }
        let mask = self.mask();
        let mut i = self.home(a);
        loop {
            let s = &mut self.slots[i];
            if s.0 == a {
                return Some(std::mem::replace(&mut s.1, v));
            }
            if s.0 == EMPTY {
                *s = (a, v);
                self.len += 1;
                return None;
            }
            i = (i + 1) & mask;
        }
    }
    #[inline]
    pub fn remove(&mut self, a: &Addr) -> Option<u32> {
        let a = *a;
        if a == EMPTY {
            let old = self.at_max.take();
            self.len -= old.is_some() as usize;
            return old;
        }
        let mask = self.mask();
        let mut i = self.home(a);
        loop {
            let s = self.slots[i];
            if s.0 == a {
                break;
            }
            if s.0 == EMPTY {
                return None;
            }
            i = (i + 1) & mask;
        }
        let v = self.slots[i].1;
        // Backward shift: move later entries of the run into the hole when
        // their home is not after it.
        let mut hole = i;
        let mut j = i;
        loop {
            j = (j + 1) & mask;
            let k = self.slots[j].0;
            if k == EMPTY {
                break;
            }
            let home = self.home(k);
            if (j.wrapping_sub(home) & mask) >= (j.wrapping_sub(hole) & mask) {
                self.slots[hole] = self.slots[j];
                hole = j;
            }
        }
        self.slots[hole] = (EMPTY, 0);
        self.len -= 1;
        Some(v)
    }
    #[cold]
    fn grow(&mut self) {
        let cap = self.slots.len() * 2;
        let old = std::mem::replace(&mut self.slots, vec![(EMPTY, 0); cap]);
        self.shift -= 1;
        self.len = self.at_max.is_some() as usize;
        for (a, v) in old {
            if a != EMPTY {
                self.insert(a, v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table against a hash map: inserts, replacements, removals (runs
    /// that wrap around the end, backward shifts), growth.
    #[test]
    fn addr_table_matches_a_map() {
        let mut rng = 0x2545_F491_4F6C_DD1Du64;
        let mut t = AddrTable::default();
        let mut m = std::collections::HashMap::new();
        for step in 0..200_000u32 {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            // Few distinct addresses in some phases (dense runs), many in others.
            let span = if (step / 20_000) % 2 == 0 { 3_000 } else { 300_000 };
            let a = if step % 5000 == 7 { Addr::MAX } else { 0x7f00_0000_0000 + (rng % span) * 512 };
            if rng >> 60 < 9 {
                assert_eq!(t.insert(a, step), m.insert(a, step));
            } else {
                assert_eq!(t.remove(&a), m.remove(&a));
            }
            assert_eq!(t.len(), m.len());
            if step % 1000 == 0 {
                for (k, v) in &m {
                    assert_eq!(t.get(k), Some(v));
                }
            }
            assert_eq!(t.get(&a), m.get(&a));
        }
    }
}
