//! [`Hybrid`]: the plan of one recorded iteration for the iterations that repeat it, a
//! best-fit arena per stream for everything else.

use std::collections::BTreeMap;

use super::best_fit::StreamArenas;
use super::workload::Life;
use super::{plan_best, round512, round_page, DriverCalls, FastMap, Op, Policy, PolicyOom, UnknownBlock, Workload};
use crate::device::{DeviceMemory, SimulatedDevice};
use crate::{Addr, InvariantError, StreamId};

/// Requests compared to accept a period (and the share of a whole iteration that must
/// match).
const PERIOD_PROBE: usize = 64;
const PERIOD_MATCH: f64 = 0.9;

/// The period of the request sequence, in requests: the smallest `p` whose next
/// [`PERIOD_PROBE`] requests repeat the first ones (size and stream) and whose second
/// iteration matches the first on at least [`PERIOD_MATCH`] of its requests. `None` when
/// the workload does not repeat twice. At most [`PERIOD_PROBE`] candidates get the whole
/// comparison, so a sequence of equal requests costs no more than a varied one.
pub fn request_period(reqs: &[(u64, StreamId)]) -> Option<usize> {
    let n = reqs.len();
    let mut full_checks = 0;
    for p in 1..=n / 2 {
        let k = PERIOD_PROBE.min(p);
        if reqs[..k] != reqs[p..p + k] {
            continue;
        }
        if (0..p).filter(|&i| reqs[i] == reqs[i + p]).count() as f64 >= PERIOD_MATCH * p as f64 {
            return Some(p);
        }
        full_checks += 1;
        if full_checks == PERIOD_PROBE {
            return None;
        }
    }
    None
}

/// A stream's planned arena: (stream, bytes, base once allocated, live planned ranges
/// offset → end).
type PlanArena = (StreamId, u64, Option<Addr>, BTreeMap<u64, u64>);

/// What a profile-guided allocator does in PyTorch: the first iteration is served online
/// and recorded; the blocks it both allocated and freed (its transients) are planned with
/// [`plan_best`] into one arena per stream; in later iterations the request at the same
/// position of its iteration, when size and stream match and its planned range is free,
/// gets its planned offset. Everything else — long-lived blocks, other iterations' odd
/// requests, a planned range still held — goes to the best-fit arenas.
pub struct Hybrid<D: DeviceMemory = SimulatedDevice> {
    dev: D,
    period: usize,
    /// By position in the iteration: (stream, rounded size, offset), when planned.
    plan: Vec<Option<(StreamId, u64, u64)>>,
    arenas: Vec<PlanArena>,
    next: usize,
    /// Live planned block → (arena index, offset).
    planned_live: FastMap<Addr, (usize, u64)>,
    online: StreamArenas,
    /// Requests served from the plan.
    pub planned: u64,
    calls: DriverCalls,
}

impl<D: DeviceMemory> Hybrid<D> {
    /// The profile is `w`'s first iteration (the request period of `w`); without one
    /// the hybrid is its online part alone.
    pub fn new(w: &Workload, dev: D) -> Self {
        let lives = w.lives();
        let reqs: Vec<(u64, StreamId)> = lives.iter().map(|l| (l.size, l.stream)).collect();
        let period = request_period(&reqs).unwrap_or(0);
        let mut plan = vec![None; period];
        let mut arenas = Vec::new();
        if period > 0 {
            // The iteration ends where request `period` is made.
            let end = w
                .ops
                .iter()
                .position(|o| matches!(*o, Op::Malloc { id, .. } | Op::Probe { id, .. } if id as usize == period))
                .unwrap_or(w.ops.len()) as u32;
            let transient: Vec<usize> = (0..period).filter(|&i| lives[i].end < end).collect();
            for s in w.streams() {
                let ids: Vec<usize> = transient.iter().copied().filter(|&i| lives[i].stream == s).collect();
                if ids.is_empty() {
                    continue;
                }
                let mine: Vec<Life> = ids.iter().map(|&i| lives[i]).collect();
                let (offs, size) = plan_best(&mine);
                for (&i, o) in ids.iter().zip(offs) {
                    plan[i] = Some((s, lives[i].size, o));
                }
                arenas.push((s, round_page(size), None, BTreeMap::new()));
            }
        }
        Hybrid {
            dev,
            period,
            plan,
            arenas,
            next: 0,
            planned_live: FastMap::default(),
            online: StreamArenas::default(),
            planned: 0,
            calls: DriverCalls::default(),
        }
    }

    /// Requests per iteration (0: no period found).
    pub fn period(&self) -> usize {
        self.period
    }

    fn serve_planned(&mut self, k: usize, r: u64, stream: StreamId) -> Option<Addr> {
        if self.period == 0 || k < self.period {
            return None;
        }
        let (s, size, off) = self.plan[k % self.period]?;
        if s != stream || size != r {
            return None;
        }
        let j = self.arenas.iter().position(|a| a.0 == stream)?;
        let live = &self.arenas[j].3;
        // The range must not meet a planned block still live (of an earlier iteration).
        if live.range(..off + size).next_back().is_some_and(|(_, &e)| e > off) {
            return None;
        }
        let base = match self.arenas[j].2 {
            Some(b) => b,
            None => {
                self.calls.cuda_malloc += 1;
                let b = self.dev.malloc(self.arenas[j].1)?;
                self.arenas[j].2 = Some(b);
                b
            }
        };
        self.arenas[j].3.insert(off, off + size);
        self.planned_live.insert(base + off, (j, off));
        self.planned += 1;
        Some(base + off)
    }
}

impl<D: DeviceMemory> Policy for Hybrid<D> {
    fn name(&self) -> String {
        "hybrid".into()
    }
    fn malloc(&mut self, size: u64, stream: StreamId) -> Result<Addr, PolicyOom> {
        let r = round512(size);
        let k = self.next;
        self.next += 1;
        if let Some(a) = self.serve_planned(k, r, stream) {
            return Ok(a);
        }
        match self.online.malloc(r, stream, &mut self.dev, &mut self.calls) {
            Some(a) => Ok(a),
            None => Err(PolicyOom { requested: size, stream, reserved: self.reserved() }),
        }
    }
    fn empty_cache(&mut self) {
        self.online.trim(&mut self.dev, &mut self.calls);
    }
    fn free(&mut self, addr: Addr) -> Result<(), UnknownBlock> {
        if let Some((j, off)) = self.planned_live.remove(&addr) {
            self.arenas[j].3.remove(&off);
            return Ok(());
        }
        self.online.free(addr).then_some(()).ok_or(UnknownBlock(addr))
    }
    fn reserved(&self) -> u64 {
        self.arenas.iter().filter(|a| a.2.is_some()).map(|a| a.1).sum::<u64>() + self.online.mapped()
    }
    fn calls(&self) -> DriverCalls {
        self.calls
    }
    fn check(&self) -> Result<(), InvariantError> {
        self.online.check()
    }
}
