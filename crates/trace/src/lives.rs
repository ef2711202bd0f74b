//! Block lives: when each block of one device's trace was in the `allocated` set, kept
//! from the timeline's walk of the trace ([`crate::timeline::timeline_with_lives`]) so
//! that attribution (the live blocks at the peaks) and leak detection (live bytes per
//! call site at the iteration boundaries, the life of every block) read them instead of
//! replaying the trace again, each with its own address-keyed hash map.
//!
//! A life is the `allocated` life of [`mod@crate::timeline`]'s bookkeeping: from the `alloc`
//! entry to the entry that ended it (its `free_requested`; its `free_completed` when
//! none was recorded; an `alloc` at the same address when the free fell out of the
//! trace). Blocks live before the trace began are seeded at state 0, as the timeline
//! seeds them. State *s* is the state after the first *s* entries, so a traced block is
//! live at state *s* when `alloc < s <= end`.
//!
//! Principal type: [`BlockLives`].

use fragscope_snapshot::{Snapshot, NO_TIME};

use crate::hugepages::HugePages;
use crate::walk::{AllocatedChange, LifeIndexParts, LiveBlock, LivesDraft, Replayer, TraceFacts, WalkSink};
pub(crate) use crate::walk::{SeededLife, TracedLife, LIVE_AT_END};

/// The `allocated` lives of every block of one device's trace (module doc).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct BlockLives {
    pub device: i64,
    /// Blocks allocated at state 0, in the order the timeline seeds them.
    pub seeded: Vec<SeededLife>,
    /// Blocks the trace allocates, in `alloc` order.
    pub traced: Vec<TracedLife>,
}

impl std::fmt::Debug for BlockLives {
    // Millions of lives on a long trace: their count, not their list.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockLives")
            .field("device", &self.device)
            .field("seeded", &self.seeded.len())
            .field("traced", &self.traced.len())
            .finish()
    }
}

/// Records the lives during a [`Replayer`] walk: a [`WalkSink`] of the allocated
/// changes. The walk reports the blocks seeded as allocated first (state 0, numbered in
/// that order), then each block the trace allocates (numbered in `alloc` order) and the
/// entry that ends each life.
pub(crate) struct LivesRecorder {
    lives: BlockLives,
    /// The roles' index of the lives, made as they are ([`LifeIndexParts`]: each traced
    /// life's request, the traced lives in the order their entries ended them), when
    /// asked for; dropped (`None`) if two lives end at one entry, which the index's
    /// list cannot say (the roles then make it from the lives).
    index: Option<LifeIndexParts>,
}

impl LivesRecorder {
    /// Room for `allocs` traced lives (the trace's `alloc` entries: growing a vector of
    /// millions of lives would copy them); with the roles' index of the lives when
    /// `index` (for a trace of under 2^32 entries).
    pub fn new(device: i64, allocs: usize, index: bool) -> Self {
        LivesRecorder {
            lives: BlockLives { device, seeded: Vec::new(), traced: Vec::with_capacity(allocs) },
            index: index
                .then(|| LifeIndexParts { req: Vec::with_capacity(allocs), by_end: Vec::with_capacity(allocs) }),
        }
    }

    pub fn finish(self) -> (BlockLives, Option<LifeIndexParts>) {
        (self.lives, self.index)
    }

    /// Traced life `life` ended at entry `at` (entries come in order): the index's next
    /// life, or no index when the life before ended at the same entry.
    #[inline(always)]
    fn ended(&mut self, at: usize, life: usize) {
        let Some(ix) = &mut self.index else { return };
        if ix.by_end.last().is_some_and(|&l| self.lives.traced[l as usize].end() == at) {
            self.index = None;
        } else {
            // Lives are fewer than entries, and an index is kept only for a trace of
            // under 2^32 entries ([`LivesRecorder::new`]'s caller).
            ix.by_end.push(life as u32);
        }
    }
}

impl WalkSink for LivesRecorder {
    /// A block entered (`delta` > 0) or left the allocated set after entry `state − 1`.
    // Called for every alloc and free of the walk: inlined into it (measured: the
    // report's walk of a 6.4 M-entry trace 0.27 -> 0.22 s with this and SitePeaks').
    #[inline(always)]
    fn allocated(&mut self, state: usize, c: &AllocatedChange) {
        if c.delta > 0 {
            if c.before_trace {
                debug_assert_eq!(c.life, self.lives.seeded.len());
                let l = SeededLife {
                    address: c.address,
                    size: c.size,
                    request: c.request,
                    stack: c.stack,
                    end: LIVE_AT_END,
                };
                self.lives.seeded.push(l);
            } else {
                // Only `alloc` entries add blocks after state 0, numbered in trace order.
                debug_assert_eq!(c.life, self.lives.traced.len());
                let alloc = c.alloc_event.unwrap_or(LIVE_AT_END);
                self.lives.traced.push(TracedLife::new(alloc, LIVE_AT_END, c.size));
                if let Some(ix) = &mut self.index {
                    ix.req.push(c.request);
                }
            }
        } else if c.before_trace {
            self.lives.seeded[c.life].end = state - 1;
        } else {
            self.lives.traced[c.life].set_end(state - 1);
            self.ended(state - 1, c.life);
        }
    }
}

impl BlockLives {
    /// The lives of `device`'s blocks by a walk of its own (for callers without a
    /// timeline walk to take them from).
    pub fn replay(snap: &Snapshot, device: i64) -> BlockLives {
        Self::replay_with_facts(snap, device, false).0
    }

    /// [`BlockLives::replay`], and what `summary`'s trace figures read from the same
    /// walk ([`TraceFacts`]) and, when `index`, the parts of the roles' index of the lives.
    pub(crate) fn replay_with_facts(
        snap: &Snapshot,
        device: i64,
        index: bool,
    ) -> (BlockLives, TraceFacts, Option<LifeIndexParts>) {
        let n = snap.trace(device).len();
        // The per-entry index numbers lives in 32 bits.
        let index = index && n < u32::MAX as usize;
        let mut d = LivesDraft {
            // At most one life per entry: untouched capacity is address space, not
            // memory, and growing a vector of millions of lives would copy them.
            traced: Vec::with_capacity(n),
            pending: Vec::new(),
            first_of: Vec::new(),
            rounded: Box::new([(u64::MAX, 0); 256]),
            index,
            req: if index { Vec::with_capacity(n) } else { Vec::new() },
            by_end: if index { Vec::with_capacity(n) } else { Vec::new() },
        };
        // Tens of MB filled in one pass: in huge pages ([`crate::hugepages`]).
        d.traced.huge_pages();
        d.req.huge_pages();
        d.by_end.huge_pages();
        let mut r = Replayer::build::<true, false>(snap, device, Some(&mut d));
        let facts = std::mem::take(&mut r.facts);
        let mut traced = d.traced;
        traced.shrink_to_fit();
        // The real sizes of the blocks live at the end (both lists in `alloc` order). A
        // galloping search from the last one found: a trace that leaves 110 k blocks live
        // among 2.2 M lives spent 12 % of `summary`'s CPU in binary searches over the whole
        // rest of the lives, a cache miss per step.
        let mut at = 0;
        for &(idx, size) in &r.final_sizes {
            at += gallop(&traced[at..], |l| l.alloc() < idx);
            if let Some(l) = traced.get_mut(at).filter(|l| l.alloc() == idx) {
                l.size = size;
            }
        }
        // Seeded as `LivesRecorder::start` numbers them; each ends at the first entry
        // of its address (none for a block no entry names).
        let mut seeded = Vec::new();
        for &k in &r.seeded_order {
            let Some(b) = &r.live[k as usize] else { continue };
            if !b.allocated {
                continue;
            }
            let end = d.first_of.get(k as usize).copied().unwrap_or(LIVE_AT_END);
            seeded.push(SeededLife {
                address: r.addr_of[k as usize],
                size: b.size,
                request: b.request,
                stack: b.stack,
                end,
            });
        }
        let parts = index.then_some(LifeIndexParts { req: d.req, by_end: d.by_end });
        (BlockLives { device, seeded, traced }, facts, parts)
    }

    /// What [`crate::timeline::live_sets_at`] returns, from the lives: the allocated
    /// blocks after each of the given entries (`None` = before the first), blocks
    /// sorted by address.
    pub fn live_sets_at(&self, snap: &Snapshot, positions: &[Option<usize>]) -> Vec<Vec<LiveBlock>> {
        let trace = snap.trace(self.device);
        let n = trace.len();
        let scopes = crate::scopes::Scopes::new(snap, self.device);
        let opt_time = |t: i64| (t != NO_TIME).then_some(t);
        positions
            .iter()
            .map(|p| {
                let s = p.map_or(0, |i| (i + 1).min(n));
                // Traced lives are in `alloc` order: those allocated before `s` are a prefix.
                let k = self.traced.partition_point(|l| l.alloc() < s);
                // The live ones by address (distinct: the order is the replay's), sorted as
                // 16-byte keys before the blocks are made: sorting the blocks themselves
                // moved ~100 bytes per swap (15 ms of the report on a 6.4 M-entry trace).
                // With the `SEEDED` bit, a seeded life's number; else a traced life's.
                const SEEDED: u64 = 1 << 63;
                let mut order: Vec<(u64, u64)> = self
                    .seeded
                    .iter()
                    .enumerate()
                    .filter(|(_, b)| b.end >= s)
                    .map(|(i, b)| (b.address, SEEDED | i as u64))
                    .chain(
                        self.traced[..k]
                            .iter()
                            .enumerate()
                            .filter(|(_, l)| l.end() >= s)
                            .map(|(i, l)| (trace[l.alloc()].addr, i as u64)),
                    )
                    .collect();
                order.sort_unstable();
                order
                    .into_iter()
                    .map(|(_, i)| {
                        if i & SEEDED != 0 {
                            let b = &self.seeded[(i & !SEEDED) as usize];
                            LiveBlock {
                                address: b.address,
                                size: b.size,
                                requested: b.request,
                                stack: b.stack,
                                alloc_event: None,
                                alloc_time_us: None,
                                annotation: scopes.innermost_at(NO_TIME).map(str::to_string),
                            }
                        } else {
                            let l = &self.traced[i as usize];
                            let e = &trace[l.alloc()];
                            LiveBlock {
                                address: e.addr,
                                size: l.size,
                                requested: e.size,
                                stack: e.stack,
                                alloc_event: Some(l.alloc()),
                                alloc_time_us: opt_time(e.time_us),
                                annotation: scopes.innermost_at(e.time_us).map(str::to_string),
                            }
                        }
                    })
                    .collect()
            })
            .collect()
    }
}

/// `v.partition_point(below)` for a `below` that holds on a prefix of `v`, probing from
/// the start at steps 1, 2, 4, … before the binary search: O(log d) for a boundary `d`
/// from the start, touching only the memory near it when `d` is small.
fn gallop<T>(v: &[T], below: impl Fn(&T) -> bool) -> usize {
    let mut lo = 0;
    let mut step = 1;
    while lo + step <= v.len() && below(&v[lo + step - 1]) {
        lo += step;
        step *= 2;
    }
    let hi = (lo + step).min(v.len());
    lo + v[lo..hi].partition_point(below)
}

/// Live bytes per key at each of `positions` (ascending; position *p* = state *p*, the
/// state before entry *p*; past the end = the end), then one more row: the end of the
/// trace. `lives` gives (key < `keys`, alloc entry or `None` for a seeded block, end
/// entry or [`LIVE_AT_END`], size). O(lives · log positions + positions · keys).
pub fn live_bytes_at(
    positions: &[usize],
    keys: usize,
    lives: impl Iterator<Item = (usize, Option<usize>, usize, u64)>,
) -> Vec<Vec<u64>> {
    let rows = positions.len() + 1;
    let after = PositionIndex::new(positions);
    // Differences between consecutive rows (one spare row past the end). Wrapping
    // arithmetic: every prefix sum is a true byte count, whatever the order of terms.
    let mut diff = vec![vec![0u64; keys]; rows + 1];
    for (key, alloc, end, size) in lives {
        // Live at position p when alloc < p <= end (a seeded block from position 0).
        let from = alloc.map_or(0, |a| after.count_le(a));
        let to = if end == LIVE_AT_END { rows } else { after.count_le(end) };
        if from < to {
            diff[from][key] = diff[from][key].wrapping_add(size);
            diff[to][key] = diff[to][key].wrapping_sub(size);
        }
    }
    diff.pop();
    for r in 1..rows {
        let (done, rest) = diff.split_at_mut(r);
        for (v, p) in rest[0].iter_mut().zip(&done[r - 1]) {
            *v = v.wrapping_add(*p);
        }
    }
    diff
}

/// How many of a sorted list of positions are ≤ x, for millions of x: a binary search
/// inside the range a coarse table gives (positions spread over the trace leave a few
/// per cell), instead of over the whole list.
pub(crate) struct PositionIndex<'a> {
    positions: &'a [usize],
    /// `x >> shift` → how many positions are below `cell << shift`.
    below_cell: Vec<usize>,
    shift: u32,
}

impl<'a> PositionIndex<'a> {
    pub(crate) fn new(positions: &'a [usize]) -> Self {
        let top = positions.last().copied().unwrap_or(0);
        // About 4 cells per position, at most 2^16 cells.
        let cells_wanted = (positions.len() * 4).clamp(4, 1 << 16);
        let mut shift = 0u32;
        while (top >> shift) + 1 > cells_wanted {
            shift += 1;
        }
        let cells = (top >> shift) + 2;
        let mut below_cell = Vec::with_capacity(cells);
        let mut k = 0usize;
        for c in 0..cells {
            while k < positions.len() && positions[k] < c << shift {
                k += 1;
            }
            below_cell.push(k);
        }
        PositionIndex { positions, below_cell, shift }
    }

    pub(crate) fn count_le(&self, x: usize) -> usize {
        let c = x >> self.shift;
        if c >= self.below_cell.len() - 1 {
            // Past the last position's cell: every position is ≤ x.
            return self.positions.len();
        }
        let (lo, hi) = (self.below_cell[c], self.below_cell[c + 1]);
        lo + self.positions[lo..hi].partition_point(|&p| p <= x)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fragscope_testdata::Rng;

    #[test]
    fn live_bytes_at_agrees_with_counting_each_position() {
        let mut rng = Rng(7);
        for _ in 0..200 {
            let n = 1 + rng.below(60);
            let keys = 1 + rng.below(5);
            let mut positions: Vec<usize> = (0..rng.below(8)).map(|_| rng.below(n + 3)).collect();
            positions.sort_unstable();
            let lives: Vec<(usize, Option<usize>, usize, u64)> = (0..rng.below(30))
                .map(|_| {
                    let alloc = (rng.below(4) > 0).then(|| rng.below(n));
                    let end = if rng.below(3) == 0 { LIVE_AT_END } else { alloc.unwrap_or(0) + rng.below(n) };
                    (rng.below(keys), alloc, end, 1 + rng.below(1000) as u64)
                })
                .collect();
            let got = live_bytes_at(&positions, keys, lives.iter().copied());
            // Naively: a life counts at state p when it began before p and had not ended
            // by the entry before p; the last row is the end (what never ended).
            let mut want = Vec::new();
            for &p in &positions {
                let mut row = vec![0u64; keys];
                for &(k, a, e, size) in &lives {
                    if a.is_none_or(|a| a < p) && (e == LIVE_AT_END || e >= p) {
                        row[k] += size;
                    }
                }
                want.push(row);
            }
            let mut end = vec![0u64; keys];
            for &(k, _, e, size) in &lives {
                if e == LIVE_AT_END {
                    end[k] += size;
                }
            }
            want.push(end);
            assert_eq!(got, want, "positions {positions:?} lives {lives:?}");
        }
    }

    #[test]
    fn gallop_finds_what_partition_point_finds() {
        let mut rng = Rng(13);
        for _ in 0..500 {
            let mut v: Vec<usize> = (0..rng.below(200)).map(|_| rng.below(1000)).collect();
            v.sort_unstable();
            for _ in 0..20 {
                let x = rng.below(1100);
                assert_eq!(gallop(&v, |&y| y < x), v.partition_point(|&y| y < x), "x {x} v {v:?}");
            }
        }
    }

    #[test]
    fn position_index_counts_like_a_binary_search() {
        let mut rng = Rng(11);
        for _ in 0..300 {
            let bits = rng.below(40) + 1;
            let span = 1 + rng.below(1 << bits);
            let mut positions: Vec<usize> = (0..rng.below(300)).map(|_| rng.below(span)).collect();
            positions.sort_unstable();
            let idx = PositionIndex::new(&positions);
            for _ in 0..50 {
                let x = if rng.below(4) == 0 { usize::MAX - rng.below(3) } else { rng.below(span + 10) };
                assert_eq!(idx.count_le(x), positions.partition_point(|&p| p <= x), "x {x} positions {positions:?}");
            }
            for &p in &positions {
                assert_eq!(idx.count_le(p), positions.partition_point(|&q| q <= p));
            }
        }
    }
}
