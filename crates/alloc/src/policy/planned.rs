//! [`Planned`]: the offline plan. The whole workload is known in advance; every block
//! gets a fixed offset in one arena per stream, chosen by decreasing-size best fit over
//! lifetimes ([`plan_offsets`], the order and fit of XLA's heap simulator).

use std::collections::BTreeMap;

use super::best_fit::StreamArenas;
use super::workload::Life;
use super::{round512, round_page, DriverCalls, FastMap, Policy, PolicyOom, UnknownBlock, Workload};
use crate::device::{DeviceMemory, SimulatedDevice};
use crate::{Addr, InvariantError, StreamId};

/// More blocks than this live to the end of the workload are stacked below the plan
/// instead of planned with the others (see [`Planned::new`]).
pub const STACK_FOREVER: usize = 4096;

/// Trace ops per leaf of the time index.
const LEAF_OPS: u32 = 16;

/// Offsets for blocks with the given lifetimes (one stream), and the arena size they
/// need. Blocks are taken largest first (earlier start, then lower index on ties); each
/// goes into the smallest gap, among the blocks already placed that are live at the same
/// time, that holds it, else above all of them.
pub fn plan_offsets(lives: &[Life]) -> (Vec<u64>, u64) {
    plan_in_order(lives, Order::Size)
}

/// The order blocks are placed in. XLA's heap simulator tries several and keeps the
/// smallest heap; so does [`plan_best`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// Decreasing size (then earlier start).
    Size,
    /// Decreasing lifetime, then decreasing size: long-lived blocks at the bottom.
    Lifetime,
    /// Decreasing size × lifetime.
    Area,
}

/// [`plan_in_order`] in every [`Order`]; the smallest arena wins (earlier order on ties).
pub fn plan_best(lives: &[Life]) -> (Vec<u64>, u64) {
    let mut best = plan_in_order(lives, Order::Size);
    for o in [Order::Lifetime, Order::Area] {
        let p = plan_in_order(lives, o);
        if p.1 < best.1 {
            best = p;
        }
    }
    best
}

/// Best fit over lifetimes, blocks taken in `order`.
///
/// Placed blocks are kept in a segment tree over time whose leaves are [`LEAF_OPS`] ops
/// wide. A block is stored in the canonical nodes of the leaves it covers whole, as offset
/// ranges merged with those of the other blocks there (every block of a node is live over
/// all of the node's time, so their ranges never overlap and only touch), and, at its
/// first and last leaf when it covers them in part, with its exact times. A query collects
/// the merged ranges of every node its interval meets (all of them are live with it) and
/// the partial entries of its edge leaves that overlap it exactly; a count of blocks per
/// subtree prunes empty subtrees. Long-lived blocks thus cost a query a few merged runs,
/// not one entry each.
pub fn plan_in_order(lives: &[Life], order_by: Order) -> (Vec<u64>, u64) {
    let n = lives.len();
    let mut off = vec![0u64; n];
    let Some(t_end) = lives.iter().map(|l| l.end.max(l.start + 1)).max() else { return (off, 0) };
    let w = LEAF_OPS;
    let leaves = ((t_end / w) as usize + 1).next_power_of_two();
    let mut full: Vec<Vec<(u64, u64)>> = vec![Vec::new(); 2 * leaves];
    let mut part: Vec<Vec<(u32, u32, u64, u64)>> = vec![Vec::new(); leaves];
    let mut sub = vec![0u32; 2 * leaves];
    // Union of the offset ranges of every block stored in a node's subtree: what a query
    // covering the node's whole time must avoid, without visiting the subtree.
    let mut agg: Vec<BTreeMap<u64, u64>> = vec![BTreeMap::new(); 2 * leaves];
    let mut touched: Vec<usize> = Vec::new();
    let mut order: Vec<u32> = (0..n as u32).collect();
    let len = |l: &Life| (l.end.max(l.start + 1) - l.start) as u64;
    order.sort_unstable_by(|&a, &b| {
        let (x, y) = (&lives[a as usize], &lives[b as usize]);
        let first = match order_by {
            Order::Size => y.size.cmp(&x.size),
            Order::Lifetime => len(y).cmp(&len(x)).then(y.size.cmp(&x.size)),
            Order::Area => (y.size as u128 * len(y) as u128).cmp(&(x.size as u128 * len(x) as u128)),
        };
        first.then(y.size.cmp(&x.size)).then(x.start.cmp(&y.start)).then(a.cmp(&b))
    });
    let mut cand: Vec<(u64, u64)> = Vec::new();
    let mut stack: Vec<(usize, usize, usize)> = Vec::new();
    let mut top = 0u64;
    for &b in &order {
        let l = lives[b as usize];
        let (s, e) = (l.start, l.end.max(l.start + 1));
        let (qlo, qhi) = ((s / w) as usize, ((e - 1) / w) as usize);
        cand.clear();
        stack.clear();
        stack.push((1, 0, leaves - 1));
        while let Some((node, nlo, nhi)) = stack.pop() {
            if nhi < qlo || nlo > qhi || sub[node] == 0 {
                continue;
            }
            // Inside the query without its edge leaves: every block below is live with it.
            if nlo > qlo && nhi < qhi {
                cand.extend(agg[node].iter().map(|(&a, &z)| (a, z)));
                continue;
            }
            cand.extend_from_slice(&full[node]);
            if node >= leaves {
                cand.extend(part[node - leaves].iter().filter(|p| p.0 < e && s < p.1).map(|p| (p.2, p.3)));
            } else {
                let mid = (nlo + nhi) / 2;
                stack.push((2 * node, nlo, mid));
                stack.push((2 * node + 1, mid + 1, nhi));
            }
        }
        cand.sort_unstable();
        let (mut cur, mut best) = (0u64, None::<(u64, u64)>);
        for &(a, z) in &cand {
            if a > cur {
                let gap = a - cur;
                if gap >= l.size && best.is_none_or(|(_, g)| gap < g) {
                    best = Some((cur, gap));
                }
            }
            cur = cur.max(z);
        }
        let o = best.map_or(cur, |(s, _)| s);
        off[b as usize] = o;
        top = top.max(o + l.size);
        let range = (o, o + l.size);
        touched.clear();
        // Leaves covered whole: [ceil(s/w), floor(e/w)).
        let (f_lo, f_hi) = (s.div_ceil(w) as usize, (e / w) as usize);
        if f_lo < f_hi {
            let (mut x, mut y) = (f_lo + leaves, f_hi + leaves);
            while x < y {
                if x & 1 == 1 {
                    merge_into(&mut full[x], range);
                    count(&mut sub, x);
                    touched.push(x);
                    x += 1;
                }
                if y & 1 == 1 {
                    y -= 1;
                    merge_into(&mut full[y], range);
                    count(&mut sub, y);
                    touched.push(y);
                }
                x >>= 1;
                y >>= 1;
            }
        }
        // Leaves covered in part.
        let first = (s / w) as usize;
        if (first as u32) * w != s || f_lo >= f_hi {
            part[first].push((s, e, range.0, range.1));
            count(&mut sub, first + leaves);
            touched.push(first + leaves);
        }
        let last = ((e - 1) / w) as usize;
        if last != first && last >= f_hi {
            part[last].push((s, e, range.0, range.1));
            count(&mut sub, last + leaves);
            touched.push(last + leaves);
        }
        // The block's range joins the union of every node above where it was stored.
        let mut ups: Vec<usize> = Vec::new();
        for &t in &touched {
            let mut k = t;
            while k >= 1 {
                ups.push(k);
                k >>= 1;
            }
        }
        ups.sort_unstable();
        ups.dedup();
        for k in ups {
            merge_map(&mut agg[k], range);
        }
    }
    (off, top)
}

/// Add `r` to sorted, disjoint ranges, merging it with the ranges it touches.
fn merge_into(v: &mut Vec<(u64, u64)>, r: (u64, u64)) {
    let i = v.partition_point(|x| x.1 < r.0);
    let mut j = i;
    let (mut a, mut z) = r;
    while j < v.len() && v[j].0 <= z {
        a = a.min(v[j].0);
        z = z.max(v[j].1);
        j += 1;
    }
    v.splice(i..j, std::iter::once((a, z)));
}

/// [`merge_into`] for a map from range start to range end.
fn merge_map(m: &mut BTreeMap<u64, u64>, r: (u64, u64)) {
    let (mut a, mut z) = r;
    // A range starting at or before `a` that reaches it.
    if let Some((&pa, &pz)) = m.range(..=a).next_back() {
        if pz >= a {
            if pz >= z {
                return;
            }
            a = pa;
            z = z.max(pz);
            m.remove(&pa);
        }
    }
    // Ranges starting inside [a, z].
    while let Some((&na, &nz)) = m.range(a..=z).next() {
        z = z.max(nz);
        m.remove(&na);
    }
    m.insert(a, z);
}

fn count(sub: &mut [u32], node: usize) {
    let mut k = node;
    while k >= 1 {
        sub[k] += 1;
        k >>= 1;
    }
}

/// Serves the `k`-th request from the plan of the workload it was built from (one
/// `cudaMalloc` per stream for the whole arena, at the stream's first request); a request
/// that does not match the plan (other size or stream) goes to a best-fit arena instead.
pub struct Planned<D: DeviceMemory = SimulatedDevice> {
    dev: D,
    /// By request number: (stream, rounded size, offset in its stream's arena).
    plan: Vec<(StreamId, u64, u64)>,
    /// (stream, arena bytes, base once allocated).
    arenas: Vec<(StreamId, u64, Option<Addr>)>,
    next: usize,
    planned_live: FastMap<Addr, ()>,
    fallback: StreamArenas,
    /// Requests that did not match the plan.
    pub unplanned: u64,
    calls: DriverCalls,
}

impl<D: DeviceMemory> Planned<D> {
    /// Plan `w` (all of it, in advance), one arena per stream. When more than
    /// [`STACK_FOREVER`] blocks of a stream live to the end, those are stacked at the
    /// bottom of its arena in request order and the others planned above them.
    pub fn new(w: &Workload, dev: D) -> Self {
        let lives = w.lives();
        let mut plan: Vec<(StreamId, u64, u64)> = lives.iter().map(|l| (l.stream, l.size, 0)).collect();
        let mut arenas = Vec::new();
        let end = w.ops.len() as u32;
        for s in w.streams() {
            let mut ids: Vec<usize> = (0..lives.len()).filter(|&i| lives[i].stream == s).collect();
            // Blocks live to the end only accumulate: stacked in allocation order they
            // take no more than they need at any time. Many of them (a leak, a trace
            // repeated without its frees) would make every placement scan them all, so
            // past STACK_FOREVER they go to the bottom and the rest is planned above.
            let forever: Vec<usize> = ids.iter().copied().filter(|&i| lives[i].end >= end).collect();
            let mut base = 0u64;
            if forever.len() > STACK_FOREVER {
                for &i in &forever {
                    plan[i].2 = base;
                    base += lives[i].size;
                }
                ids.retain(|&i| lives[i].end < end);
            }
            let mine: Vec<Life> = ids.iter().map(|&i| lives[i]).collect();
            let (offs, size) = plan_best(&mine);
            for (&i, o) in ids.iter().zip(offs) {
                plan[i].2 = base + o;
            }
            arenas.push((s, round_page(base + size), None));
        }
        Planned {
            dev,
            plan,
            arenas,
            next: 0,
            planned_live: FastMap::default(),
            fallback: StreamArenas::default(),
            unplanned: 0,
            calls: DriverCalls::default(),
        }
    }

    /// Bytes of every stream's arena (what the plan reserves once all streams ran).
    pub fn planned_bytes(&self) -> u64 {
        self.arenas.iter().map(|a| a.1).sum()
    }
}

impl<D: DeviceMemory> Policy for Planned<D> {
    fn name(&self) -> String {
        "planned".into()
    }
    fn malloc(&mut self, size: u64, stream: StreamId) -> Result<Addr, PolicyOom> {
        let r = round512(size);
        let k = self.next;
        self.next += 1;
        let oom = |me: &Self| PolicyOom { requested: size, stream, reserved: me.reserved() };
        match self.plan.get(k) {
            Some(&(s, sz, off)) if s == stream && sz == r => {
                let j = self.arenas.iter().position(|a| a.0 == stream).expect("planned stream");
                let base = match self.arenas[j].2 {
                    Some(b) => b,
                    None => {
                        let bytes = self.arenas[j].1;
                        self.calls.cuda_malloc += 1;
                        let b = match self.dev.malloc(bytes) {
                            Some(b) => b,
                            None => {
                                self.fallback.trim(&mut self.dev, &mut self.calls);
                                self.calls.cuda_malloc += 1;
                                self.dev.malloc(bytes).ok_or_else(|| oom(self))?
                            }
                        };
                        self.arenas[j].2 = Some(b);
                        b
                    }
                };
                self.planned_live.insert(base + off, ());
                Ok(base + off)
            }
            _ => {
                self.unplanned += 1;
                self.fallback.malloc(r, stream, &mut self.dev, &mut self.calls).ok_or_else(|| oom(self))
            }
        }
    }
    fn free(&mut self, addr: Addr) -> Result<(), UnknownBlock> {
        if self.planned_live.remove(&addr).is_some() || self.fallback.free(addr) {
            Ok(())
        } else {
            Err(UnknownBlock(addr))
        }
    }
    fn reserved(&self) -> u64 {
        self.arenas.iter().filter(|a| a.2.is_some()).map(|a| a.1).sum::<u64>() + self.fallback.mapped()
    }
    fn calls(&self) -> DriverCalls {
        self.calls
    }
    fn check(&self) -> Result<(), InvariantError> {
        self.fallback.check()
    }
}
