//! Block pools: the ordered free set and the unmapped set (spec §2.1–2.3).

use crate::{Addr, PoolId, StreamId};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// Free-set key within one stream (§2.2): (size, registration counter, address).
/// Under `TieBreak::Address` the counter is always 0, which gives the classic
/// (stream, size, address) order. Addresses are unique within a pool, so the key
/// is unique and the slab index is the map's value. (Packing size and counter in
/// one `u128` was measured: u128 compares cost more instructions than this tuple.)
pub(crate) type FreeKey = (u64, u64, Addr);

#[inline]
pub(crate) fn free_key(size: u64, reg: u64, addr: Addr) -> FreeKey {
    (size, reg, addr)
}

#[inline]
pub(crate) fn key_size(k: &FreeKey) -> u64 {
    k.0
}

/// Unmapped-set key (§2.3): (stream, address, slab index).
pub(crate) type UnmappedKey = (StreamId, Addr, u32);

/// One pool's free blocks ordered like PyTorch's free set, (stream, size,
/// [registration,] address): one ordered map per stream, streams ascending, so
/// a lookup never compares stream ids and whole-pool walks keep the set order.
#[derive(Clone, Debug, Default)]
pub(crate) struct FreeSet {
    streams: Vec<(StreamId, BTreeMap<FreeKey, u32>)>,
    len: usize,
}

impl FreeSet {
    #[inline]
    fn map(&self, stream: StreamId) -> Option<&BTreeMap<FreeKey, u32>> {
        // Few streams: a linear scan beats any index.
        self.streams.iter().find(|s| s.0 == stream).map(|s| &s.1)
    }

    #[inline]
    fn map_mut(&mut self, stream: StreamId) -> &mut BTreeMap<FreeKey, u32> {
        let pos = match self.streams.iter().position(|s| s.0 == stream) {
            Some(p) => p,
            None => {
                let at = self.streams.partition_point(|s| s.0 < stream);
                self.streams.insert(at, (stream, BTreeMap::new()));
                at
            }
        };
        &mut self.streams[pos].1
    }

    #[inline]
    pub fn insert(&mut self, stream: StreamId, key: FreeKey, i: u32) -> bool {
        let fresh = self.map_mut(stream).insert(key, i).is_none();
        self.len += fresh as usize;
        fresh
    }

    #[inline]
    pub fn remove(&mut self, stream: StreamId, key: &FreeKey) -> bool {
        let Some(s) = self.streams.iter_mut().find(|s| s.0 == stream) else { return false };
        let removed = s.1.remove(key).is_some();
        self.len -= removed as usize;
        removed
    }

    pub fn contains(&self, stream: StreamId, key: &FreeKey, i: u32) -> bool {
        self.map(stream).and_then(|m| m.get(key)) == Some(&i)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Blocks of `stream` with size ≥ `size`, in set order: `(size, slab index)`.
    #[inline]
    pub fn at_least(&self, stream: StreamId, size: u64) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.map(stream).into_iter().flat_map(move |m| m.range(free_key(size, 0, 0)..)).map(|(k, &i)| (key_size(k), i))
    }

    /// Blocks of `stream` with size < `size`, largest first: `(size, slab index)`.
    pub fn below_desc(&self, stream: StreamId, size: u64) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.map(stream)
            .into_iter()
            .flat_map(move |m| m.range(..free_key(size, 0, 0)).rev())
            .map(|(k, &i)| (key_size(k), i))
    }

    /// Every block in set order (stream, then key).
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.streams.iter().flat_map(|s| s.1.values().copied())
    }
}

/// Pending frees in request order (§4.1, §5.4). Sequence numbers only grow, so
/// a deque sorted by sequence does: removals leave a hole (`NIL`) found by
/// binary search; holes at the front are dropped at once and the rest compacted
/// when they outnumber live entries, so memory follows the pending count.
#[derive(Clone, Debug, Default)]
pub(crate) struct PendingQueue {
    q: VecDeque<(u64, u32)>,
    live: usize,
}

const HOLE: u32 = u32::MAX;

impl PendingQueue {
    #[inline]
    pub fn push(&mut self, seq: u64, i: u32) {
        debug_assert!(self.q.back().is_none_or(|b| b.0 < seq));
        self.q.push_back((seq, i));
        self.live += 1;
    }

    #[inline]
    fn position(&self, seq: u64) -> Option<usize> {
        let p = self.q.partition_point(|e| e.0 < seq);
        (p < self.q.len() && self.q[p].0 == seq && self.q[p].1 != HOLE).then_some(p)
    }

    #[inline]
    pub fn remove(&mut self, seq: u64) -> bool {
        let Some(p) = self.position(seq) else { return false };
        self.live -= 1;
        if p == 0 {
            self.q.pop_front();
            while self.q.front().is_some_and(|e| e.1 == HOLE) {
                self.q.pop_front();
            }
        } else if p + 1 == self.q.len() {
            self.q.pop_back();
            while self.q.back().is_some_and(|e| e.1 == HOLE) {
                self.q.pop_back();
            }
        } else {
            self.q[p].1 = HOLE;
            if self.q.len() > 2 * self.live + 64 {
                self.q.retain(|e| e.1 != HOLE);
            }
        }
        true
    }

    pub fn get(&self, seq: u64) -> Option<u32> {
        self.position(seq).map(|p| self.q[p].1)
    }

    pub fn len(&self) -> usize {
        self.live
    }

    /// Oldest pending block.
    #[inline]
    pub fn first(&self) -> Option<u32> {
        self.q.front().map(|e| e.1)
    }

    /// Pending blocks in request order.
    pub fn values(&self) -> impl Iterator<Item = u32> + '_ {
        self.q.iter().filter(|e| e.1 != HOLE).map(|e| e.1)
    }
}

#[derive(Clone, Debug)]
pub(crate) struct BlockPool {
    pub id: PoolId,
    pub small: bool,
    pub free: FreeSet,
    pub unmapped: BTreeSet<UnmappedKey>,
    /// Number of free-list searches while GC is enabled (§3.3 step 1, §5.5).
    pub search_count: u64,
}

impl BlockPool {
    pub fn new(id: PoolId, small: bool) -> Self {
        BlockPool { id, small, free: FreeSet::default(), unmapped: BTreeSet::new(), search_count: 0 }
    }
}
