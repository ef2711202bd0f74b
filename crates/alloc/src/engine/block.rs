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

/// Hasher for address keys: addresses are 512-aligned, so mix high bits down
/// before the table takes the low ones. Fixed seed keeps runs deterministic.
#[derive(Default, Clone, Copy)]
pub(crate) struct AddrHasher(u64);

impl std::hash::Hasher for AddrHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ b as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    #[inline]
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
    #[inline]
    fn finish(&self) -> u64 {
        let x = self.0.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        x ^ (x >> 29) ^ (x >> 47)
    }
}

pub(crate) type AddrMap<V> = std::collections::HashMap<Addr, V, std::hash::BuildHasherDefault<AddrHasher>>;
