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

/// One stream's free blocks in key order. Free sets hold a few to a few dozen
/// distinct sizes per stream (8–30 on real traces, also on long runs with
/// thousands of free blocks), so blocks are grouped by exact size: a sorted
/// vector of [`Bucket`]s, one per size, each with its first block inline and the
/// others in a [`SizeList`], in (registration, address) order. A stream whose distinct sizes grow past `PROMOTE` moves to a
/// B-tree (and back below `DEMOTE` blocks) so no trace pays O(n) per operation.
/// Both hold the same keys in the same order.
#[derive(Clone, Debug)]
enum StreamFree {
    Buckets(Buckets),
    Tree(BTreeMap<FreeKey, u32>),
}

const PROMOTE: usize = 256;
const DEMOTE: usize = 64;

impl Default for StreamFree {
    fn default() -> Self {
        StreamFree::Buckets(Buckets::default())
    }
}

/// `(registration, address, slab index)` within one size.
type Entry = (u64, Addr, u32);

/// Most entries in one chunk of a [`SizeList`].
const CHUNK: usize = 64;

/// The blocks of one size in (registration, address) order, in chunks of at most
/// `CHUNK` entries: a long run of one size (thousands of 512-byte blocks on a
/// long run) costs a short move per insert or remove, not a move of the run.
/// Chunks in use are never empty; a list kept for reuse has one empty chunk.
/// The last key of each chunk is kept apart in `lasts`, so finding the chunk
/// is a binary search over one contiguous array rather than a cache miss into
/// every chunk it probes (the lists hold hundreds of blocks on long runs).
#[derive(Clone, Debug)]
struct SizeList {
    chunks: Vec<Vec<Entry>>,
    /// `(registration, address)` of the last entry of each chunk ((0, 0) for
    /// the empty chunk of an empty list, never read: one chunk needs no search).
    lasts: Vec<(u64, Addr)>,
}

impl Default for SizeList {
    fn default() -> Self {
        SizeList { chunks: vec![Vec::new()], lasts: vec![(0, 0)] }
    }
}

impl SizeList {
    /// The chunk where `(reg, addr)` is or would go: the first whose last entry
    /// is not below it, else the last chunk.
    #[inline]
    fn chunk_for(&self, reg: u64, addr: Addr) -> usize {
        if self.chunks.len() == 1 {
            return 0;
        }
        let k = self.lasts.partition_point(|&l| l < (reg, addr));
        k.min(self.chunks.len() - 1)
    }

    /// Refresh `lasts[k]` after chunk `k` changed.
    #[inline]
    fn sync_last(&mut self, k: usize) {
        self.lasts[k] = self.chunks[k].last().map_or((0, 0), |e| (e.0, e.1));
    }

    /// Insert; a duplicate key replaces the index (returns false).
    #[inline]
    fn insert(&mut self, reg: u64, addr: Addr, i: u32) -> bool {
        let k = self.chunk_for(reg, addr);
        let c = &mut self.chunks[k];
        let q = c.partition_point(|e| (e.0, e.1) < (reg, addr));
        if q < c.len() && (c[q].0, c[q].1) == (reg, addr) {
            c[q].2 = i;
            return false;
        }
        c.insert(q, (reg, addr, i));
        if c.len() > CHUNK {
            let tail = c.split_off(CHUNK / 2);
            self.chunks.insert(k + 1, tail);
            self.lasts.insert(k + 1, (0, 0));
            self.sync_last(k + 1);
        }
        self.sync_last(k);
        true
    }

    /// Remove; returns whether the key was there.
    #[inline]
    fn remove(&mut self, reg: u64, addr: Addr) -> bool {
        let k = self.chunk_for(reg, addr);
        let c = &mut self.chunks[k];
        let q = c.partition_point(|e| (e.0, e.1) < (reg, addr));
        if q == c.len() || (c[q].0, c[q].1) != (reg, addr) {
            return false;
        }
        c.remove(q);
        if c.is_empty() && self.chunks.len() > 1 {
            self.chunks.remove(k);
            self.lasts.remove(k);
        } else {
            self.sync_last(k);
        }
        true
    }

    fn get(&self, reg: u64, addr: Addr) -> Option<u32> {
        let c = &self.chunks[self.chunk_for(reg, addr)];
        let q = c.partition_point(|e| (e.0, e.1) < (reg, addr));
        (q < c.len() && (c[q].0, c[q].1) == (reg, addr)).then(|| c[q].2)
    }

    #[inline]
    fn is_empty(&self) -> bool {
        self.chunks[0].is_empty()
    }

    /// Take the first entry (the list must not be empty).
    #[inline]
    fn pop_front(&mut self) -> Entry {
        let e = self.chunks[0].remove(0);
        if self.chunks[0].is_empty() && self.chunks.len() > 1 {
            self.chunks.remove(0);
            self.lasts.remove(0);
        } else {
            self.sync_last(0);
        }
        e
    }

    fn iter(&self) -> impl DoubleEndedIterator<Item = &Entry> + '_ {
        self.chunks.iter().flatten()
    }

    fn push_back(&mut self, e: Entry) {
        let last = self.chunks.last_mut().expect("a list has a chunk");
        if last.len() < CHUNK {
            last.push(e);
        } else {
            self.chunks.push(vec![e]);
            self.lasts.push((0, 0));
        }
        self.sync_last(self.chunks.len() - 1);
    }
}

/// "No list" in [`Bucket::rest`].
const NO_LIST: u32 = u32::MAX;

/// One size present in a stream's free set. Most sizes hold one block (the
/// remainders of splits), so the first block in (registration, address) order is
/// kept inline: best fit reads it without another indirection, and a size that
/// comes and goes touches only the bucket vector. Further blocks of the size go
/// to a [`SizeList`] in `Buckets::lists` (all entries after `first`).
#[derive(Clone, Copy, Debug)]
struct Bucket {
    size: u64,
    reg: u64,
    addr: Addr,
    idx: u32,
    /// Index into `Buckets::lists`, or `NO_LIST`.
    rest: u32,
}

#[derive(Clone, Debug, Default)]
struct Buckets {
    /// One per distinct size present, ascending.
    buckets: Vec<Bucket>,
    /// `buckets[k].size`, in an array of their own: the search for a size reads
    /// one or two cache lines, and below `LINEAR` sizes it counts the smaller
    /// sizes without branches instead of a binary search (a chain of dependent
    /// loads that stalled every free-set operation).
    sizes: Vec<u64>,
    /// Position of the bucket found last (checked before use): the removal of
    /// the block a best-fit lookup found reuses its position.
    hint: std::cell::Cell<u32>,
    /// Lists of the sizes with more than one block (a slab; emptied lists are
    /// kept for reuse, listed in `spare`).
    lists: Vec<SizeList>,
    spare: Vec<u32>,
    len: usize,
}

/// Up to this many distinct sizes, a lookup counts the smaller ones.
const LINEAR: usize = 32;

impl Buckets {
    /// Position of the first size ≥ `size`.
    #[inline]
    fn lower_bound(&self, size: u64) -> usize {
        let h = self.hint.get() as usize;
        if let Some(&hs) = self.sizes.get(h) {
            if hs == size && (h == 0 || self.sizes[h - 1] < size) {
                return h;
            }
        }
        let p = if self.sizes.len() <= LINEAR {
            self.sizes.iter().map(|&x| (x < size) as usize).sum()
        } else {
            self.sizes.partition_point(|&x| x < size)
        };
        self.hint.set(p as u32);
        p
    }

    #[inline]
    fn find(&self, size: u64) -> (usize, bool) {
        let p = self.lower_bound(size);
        (p, p < self.sizes.len() && self.sizes[p] == size)
    }

    fn new_list(&mut self) -> u32 {
        match self.spare.pop() {
            Some(l) => l,
            None => {
                self.lists.push(SizeList::default());
                (self.lists.len() - 1) as u32
            }
        }
    }

    #[inline]
    fn insert(&mut self, key: FreeKey, i: u32) -> bool {
        let (size, reg, addr) = key;
        let (p, hit) = self.find(size);
        if !hit {
            self.buckets.insert(p, Bucket { size, reg, addr, idx: i, rest: NO_LIST });
            self.sizes.insert(p, size);
            self.len += 1;
            return true;
        }
        let b = self.buckets[p];
        if (reg, addr) == (b.reg, b.addr) {
            self.buckets[p].idx = i;
            return false;
        }
        let l = if b.rest == NO_LIST { self.new_list() } else { b.rest };
        self.buckets[p].rest = l;
        let fresh = if (reg, addr) < (b.reg, b.addr) {
            // The new block comes first; the old first leads the rest.
            self.buckets[p] = Bucket { size, reg, addr, idx: i, rest: l };
            self.lists[l as usize].insert(b.reg, b.addr, b.idx)
        } else {
            self.lists[l as usize].insert(reg, addr, i)
        };
        self.len += fresh as usize;
        fresh
    }

    #[inline]
    fn remove(&mut self, key: &FreeKey) -> bool {
        let (size, reg, addr) = *key;
        let (p, hit) = self.find(size);
        if !hit {
            return false;
        }
        let b = self.buckets[p];
        if (reg, addr) == (b.reg, b.addr) {
            if b.rest == NO_LIST {
                self.buckets.remove(p);
                self.sizes.remove(p);
            } else {
                let list = &mut self.lists[b.rest as usize];
                let (nreg, naddr, nidx) = list.pop_front();
                let rest = if list.is_empty() {
                    self.spare.push(b.rest);
                    NO_LIST
                } else {
                    b.rest
                };
                self.buckets[p] = Bucket { size, reg: nreg, addr: naddr, idx: nidx, rest };
            }
        } else {
            if b.rest == NO_LIST || !self.lists[b.rest as usize].remove(reg, addr) {
                return false;
            }
            if self.lists[b.rest as usize].is_empty() {
                self.spare.push(b.rest);
                self.buckets[p].rest = NO_LIST;
            }
        }
        self.len -= 1;
        true
    }

    fn get(&self, key: &FreeKey) -> Option<u32> {
        let (size, reg, addr) = *key;
        let (p, hit) = self.find(size);
        if !hit {
            return None;
        }
        let b = &self.buckets[p];
        if (reg, addr) == (b.reg, b.addr) {
            return Some(b.idx);
        }
        self.rest(b).and_then(|l| l.get(reg, addr))
    }

    #[inline]
    fn rest(&self, b: &Bucket) -> Option<&SizeList> {
        (b.rest != NO_LIST).then(|| &self.lists[b.rest as usize])
    }

    /// A bucket's blocks in order: `(registration, address, slab index)`.
    fn entries<'a>(&'a self, b: &'a Bucket) -> impl DoubleEndedIterator<Item = Entry> + 'a {
        std::iter::once((b.reg, b.addr, b.idx)).chain(self.rest(b).into_iter().flat_map(|l| l.iter().copied()))
    }

    /// From keys in ascending order.
    fn from_sorted(it: impl Iterator<Item = (FreeKey, u32)>) -> Self {
        let mut bs = Buckets::default();
        for ((size, reg, addr), i) in it {
            match bs.buckets.last().copied() {
                Some(b) if b.size == size => {
                    let l = if b.rest == NO_LIST { bs.new_list() } else { b.rest };
                    bs.buckets.last_mut().expect("checked").rest = l;
                    bs.lists[l as usize].push_back((reg, addr, i));
                }
                _ => {
                    bs.buckets.push(Bucket { size, reg, addr, idx: i, rest: NO_LIST });
                    bs.sizes.push(size);
                }
            }
            bs.len += 1;
        }
        bs
    }

    fn drain_sorted(&mut self) -> impl Iterator<Item = (FreeKey, u32)> + '_ {
        self.buckets.iter().flat_map(|b| self.entries(b).map(move |(reg, addr, i)| (free_key(b.size, reg, addr), i)))
    }
}

impl StreamFree {
    #[inline]
    fn insert(&mut self, key: FreeKey, i: u32) -> bool {
        match self {
            StreamFree::Buckets(b) => {
                let fresh = b.insert(key, i);
                if b.buckets.len() > PROMOTE {
                    let t: BTreeMap<FreeKey, u32> = b.drain_sorted().collect();
                    *self = StreamFree::Tree(t);
                }
                fresh
            }
            StreamFree::Tree(t) => t.insert(key, i).is_none(),
        }
    }

    #[inline]
    fn remove(&mut self, key: &FreeKey) -> bool {
        match self {
            StreamFree::Buckets(b) => b.remove(key),
            StreamFree::Tree(t) => {
                let removed = t.remove(key).is_some();
                if t.len() < DEMOTE {
                    let b = Buckets::from_sorted(t.iter().map(|(&k, &i)| (k, i)));
                    *self = StreamFree::Buckets(b);
                }
                removed
            }
        }
    }

    fn get(&self, key: &FreeKey) -> Option<u32> {
        match self {
            StreamFree::Buckets(b) => b.get(key),
            StreamFree::Tree(t) => t.get(key).copied(),
        }
    }
}

/// Iterator over either representation of a stream's free blocks.
enum Either<A, B> {
    A(A),
    B(B),
}

impl<T, A: Iterator<Item = T>, B: Iterator<Item = T>> Iterator for Either<A, B> {
    type Item = T;
    #[inline]
    fn next(&mut self) -> Option<T> {
        match self {
            Either::A(a) => a.next(),
            Either::B(b) => b.next(),
        }
    }
}

/// The per-stream free sets of one pool, streams ascending. Real traces use one
/// to a handful of streams, where a scan of a short vector beats any index; a
/// pool that sees more than `FEW_STREAMS` moves them into a B-tree, so a
/// recording with thousands of distinct streams costs O(log n) per lookup and
/// per new stream instead of O(n). Streams are never removed (PyTorch keeps the
/// pool's set as one ordered set; an empty stream's set is simply empty).
#[derive(Clone, Debug)]
enum Streams {
    Few(Vec<(StreamId, StreamFree)>),
    Many(BTreeMap<StreamId, StreamFree>),
}

const FEW_STREAMS: usize = 8;

impl Default for Streams {
    fn default() -> Self {
        Streams::Few(Vec::new())
    }
}

impl Streams {
    #[inline]
    fn get(&self, stream: StreamId) -> Option<&StreamFree> {
        match self {
            Streams::Few(v) => v.iter().find(|s| s.0 == stream).map(|s| &s.1),
            Streams::Many(m) => m.get(&stream),
        }
    }

    #[inline]
    fn get_mut(&mut self, stream: StreamId) -> Option<&mut StreamFree> {
        match self {
            Streams::Few(v) => v.iter_mut().find(|s| s.0 == stream).map(|s| &mut s.1),
            Streams::Many(m) => m.get_mut(&stream),
        }
    }

    #[inline]
    fn entry(&mut self, stream: StreamId) -> &mut StreamFree {
        if let Streams::Few(v) = self {
            if v.len() >= FEW_STREAMS && !v.iter().any(|s| s.0 == stream) {
                *self = Streams::Many(std::mem::take(v).into_iter().collect());
            }
        }
        match self {
            Streams::Few(v) => {
                let pos = match v.iter().position(|s| s.0 == stream) {
                    Some(p) => p,
                    None => {
                        let at = v.partition_point(|s| s.0 < stream);
                        v.insert(at, (stream, StreamFree::default()));
                        at
                    }
                };
                &mut v[pos].1
            }
            Streams::Many(m) => m.entry(stream).or_default(),
        }
    }

    /// Each stream's set, streams ascending.
    fn values(&self) -> impl Iterator<Item = &StreamFree> {
        match self {
            Streams::Few(v) => Either::A(v.iter().map(|s| &s.1)),
            Streams::Many(m) => Either::B(m.values()),
        }
    }
}

/// One pool's free blocks ordered like PyTorch's free set, (stream, size,
/// \[registration,\] address): one ordered set per stream, streams ascending, so
/// a lookup never compares stream ids and whole-pool walks keep the set order.
#[derive(Clone, Debug, Default)]
pub(crate) struct FreeSet {
    streams: Streams,
    len: usize,
}

impl FreeSet {
    #[inline]
    fn map(&self, stream: StreamId) -> Option<&StreamFree> {
        self.streams.get(stream)
    }

    #[inline]
    fn map_mut(&mut self, stream: StreamId) -> &mut StreamFree {
        self.streams.entry(stream)
    }

    #[inline]
    pub fn insert(&mut self, stream: StreamId, key: FreeKey, i: u32) -> bool {
        let fresh = self.map_mut(stream).insert(key, i);
        self.len += fresh as usize;
        fresh
    }

    #[inline]
    pub fn remove(&mut self, stream: StreamId, key: &FreeKey) -> bool {
        let Some(s) = self.streams.get_mut(stream) else { return false };
        let removed = s.remove(key);
        self.len -= removed as usize;
        removed
    }

    pub fn contains(&self, stream: StreamId, key: &FreeKey, i: u32) -> bool {
        self.map(stream).and_then(|m| m.get(key)) == Some(i)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// The first block of `stream` with size ≥ `size` (best fit): `(size, slab index)`.
    #[inline]
    pub fn first_at_least(&self, stream: StreamId, size: u64) -> Option<(u64, u32)> {
        match self.map(stream)? {
            StreamFree::Buckets(b) => {
                let p = b.lower_bound(size);
                b.buckets.get(p).map(|x| (x.size, x.idx))
            }
            StreamFree::Tree(t) => t.range(free_key(size, 0, 0)..).next().map(|(k, &i)| (key_size(k), i)),
        }
    }

    /// Blocks of `stream` with size ≥ `size`, in set order: `(size, slab index)`.
    #[inline]
    pub fn at_least(&self, stream: StreamId, size: u64) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.map(stream).into_iter().flat_map(move |m| match m {
            StreamFree::Buckets(b) => {
                let p = b.buckets.partition_point(|x| x.size < size);
                Either::A(b.buckets[p..].iter().flat_map(move |x| b.entries(x).map(move |e| (x.size, e.2))))
            }
            StreamFree::Tree(t) => Either::B(t.range(free_key(size, 0, 0)..).map(|(k, &i)| (key_size(k), i))),
        })
    }

    /// Blocks of `stream` with size < `size`, largest first: `(size, slab index)`.
    pub fn below_desc(&self, stream: StreamId, size: u64) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.map(stream).into_iter().flat_map(move |m| match m {
            StreamFree::Buckets(b) => {
                let p = b.buckets.partition_point(|x| x.size < size);
                Either::A(b.buckets[..p].iter().rev().flat_map(move |x| b.entries(x).rev().map(move |e| (x.size, e.2))))
            }
            StreamFree::Tree(t) => Either::B(t.range(..free_key(size, 0, 0)).rev().map(|(k, &i)| (key_size(k), i))),
        })
    }

    /// Every block in set order (stream, then key).
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.streams.values().flat_map(|s| match s {
            StreamFree::Buckets(b) => Either::A(b.buckets.iter().flat_map(move |x| b.entries(x).map(|e| e.2))),
            StreamFree::Tree(t) => Either::B(t.values().copied()),
        })
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
        // The newest entry (a free completed right after its request) first.
        if self.q.back().is_some_and(|b| b.0 == seq && b.1 != HOLE) {
            self.q.pop_back();
            self.live -= 1;
            while self.q.back().is_some_and(|e| e.1 == HOLE) {
                self.q.pop_back();
            }
            return true;
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The free set against a plain ordered map: through promotion to the B-tree
    /// (many distinct sizes) and demotion back, and through long runs of a few
    /// sizes (chunk splits and removals), with duplicate inserts.
    #[test]
    fn free_set_matches_ordered_map() {
        let mut rng = 0x2545_F491_4F6C_DD1Du64;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let mut fs = FreeSet::default();
        let mut reference: BTreeMap<(StreamId, FreeKey), u32> = BTreeMap::new();
        for step in 0..120_000u32 {
            // Phases of 15,000 steps: grow with many sizes (past PROMOTE distinct
            // sizes), shrink (below DEMOTE blocks), grow with 3 sizes (runs of
            // thousands of blocks, many chunks), shrink; twice.
            let phase = (step / 15_000) % 4;
            let grow = phase % 2 == 0;
            let sizes = if phase < 2 { 600 } else { 3 };
            let stream = (next() % 2) as StreamId;
            let r = next();
            let key = free_key((r % sizes + 1) * 512, (r >> 12) % 3, ((r >> 16) % 65536) * 512);
            if next() % 100 < if grow { 70 } else { 10 } {
                let fresh = fs.insert(stream, key, step);
                assert_eq!(fresh, reference.insert((stream, key), step).is_none());
            } else {
                // Remove an existing key when there is one on this stream, else a random one.
                let existing = reference
                    .range((stream, key)..)
                    .next()
                    .or_else(|| reference.range((stream, free_key(0, 0, 0))..).next())
                    .map(|(k, _)| *k)
                    .filter(|k| k.0 == stream);
                let k = if !grow || next() % 2 == 0 { existing.map_or(key, |k| k.1) } else { key };
                assert_eq!(fs.remove(stream, &k), reference.remove(&(stream, k)).is_some());
            }
            assert_eq!(fs.len(), reference.len());
            let trees = fs.streams.values().filter(|s| matches!(s, StreamFree::Tree(_))).count();
            if step % 60_000 == 14_999 {
                assert_eq!(trees, 2, "both streams promoted to the B-tree");
            }
            if step % 60_000 == 29_999 {
                assert_eq!(trees, 0, "both streams demoted to buckets");
            }
            if step % 60_000 == 44_999 {
                let chunks: usize = fs
                    .streams
                    .values()
                    .map(|s| match s {
                        StreamFree::Buckets(b) => b.lists.iter().map(|l| l.chunks.len()).sum(),
                        StreamFree::Tree(_) => 0,
                    })
                    .sum();
                assert!(chunks > 50, "long runs are chunked ({chunks} chunks)");
            }
            if step % 97 == 0 {
                let all: Vec<u32> = reference.values().copied().collect();
                assert_eq!(fs.iter().collect::<Vec<_>>(), all);
                for s in 0..2 as StreamId {
                    let size = (next() % (sizes + 2)) * 512;
                    let want: Vec<(u64, u32)> = reference
                        .range((s, free_key(size, 0, 0))..)
                        .take_while(|(k, _)| k.0 == s)
                        .map(|(k, &i)| (k.1 .0, i))
                        .collect();
                    assert_eq!(fs.at_least(s, size).collect::<Vec<_>>(), want);
                    let want: Vec<(u64, u32)> = reference
                        .range((s, free_key(0, 0, 0))..(s, free_key(size, 0, 0)))
                        .rev()
                        .map(|(k, &i)| (k.1 .0, i))
                        .collect();
                    assert_eq!(fs.below_desc(s, size).collect::<Vec<_>>(), want);
                    for (k, &i) in reference.range((s, free_key(0, 0, 0))..).take_while(|(k, _)| k.0 == s).take(5) {
                        assert!(fs.contains(s, &k.1, i));
                    }
                    let first = reference
                        .range((s, free_key(size, 0, 0))..)
                        .next()
                        .filter(|(k, _)| k.0 == s)
                        .map(|(k, &i)| (k.1 .0, i));
                    assert_eq!(fs.first_at_least(s, size), first);
                }
            }
        }
    }

    /// Past `FEW_STREAMS` streams the sets move into the stream-indexed map and
    /// keep the reference order: lookups per stream, the whole-pool walk
    /// (streams ascending, inserted in scrambled order), removals.
    #[test]
    fn free_set_with_many_streams_matches_ordered_map() {
        let mut fs = FreeSet::default();
        let mut reference: BTreeMap<(StreamId, FreeKey), u32> = BTreeMap::new();
        for i in 0..3_000u32 {
            // Scrambled stream ids, 500 distinct, several blocks each.
            let stream = (u64::from(i % 500) * 7919) % 1009;
            let key = free_key(u64::from(i % 7 + 1) * 512, 0, u64::from(i) * 512);
            assert_eq!(fs.insert(stream, key, i), reference.insert((stream, key), i).is_none());
            if i == FEW_STREAMS as u32 - 1 {
                assert!(matches!(fs.streams, Streams::Few(_)));
            }
        }
        assert!(matches!(fs.streams, Streams::Many(_)));
        assert_eq!(fs.iter().collect::<Vec<_>>(), reference.values().copied().collect::<Vec<_>>());
        for (&(stream, key), &i) in reference.iter().step_by(3) {
            assert!(fs.contains(stream, &key, i));
            assert_eq!(
                fs.first_at_least(stream, 0).map(|f| f.0),
                Some(reference.range((stream, free_key(0, 0, 0))..).next().unwrap().0 .1 .0)
            );
        }
        let gone: Vec<(StreamId, FreeKey)> = reference.keys().step_by(2).copied().collect();
        for (stream, key) in gone {
            assert!(fs.remove(stream, &key));
            reference.remove(&(stream, key));
        }
        assert!(!fs.remove(2_000, &free_key(512, 0, 0)), "a stream never seen");
        assert_eq!(fs.len(), reference.len());
        assert_eq!(fs.iter().collect::<Vec<_>>(), reference.values().copied().collect::<Vec<_>>());
    }
}
