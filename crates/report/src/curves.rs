//! The timeline's curves at the finest level of detail the page gets.
//!
//! The trace's states (before the first event, then after each) are split into at most
//! `buckets` equal runs; each bucket keeps the maximum of allocated, requested and
//! reserved over its states (so no peak is lost at any zoom), the live bytes of the top
//! call sites at the state where allocated is highest, the first state's time, and the
//! largest request made inside it. The levels are [`fragscope_trace::timeline`]'s own
//! bookkeeping, so the peaks drawn are the peaks `summary` and `analyze` print.

use fragscope_snapshot::{Action, Snapshot, StackId, TraceEvent, NO_TIME};
use fragscope_trace::{
    timeline_walk, timeline_walk_then, BlockLives, DeviceTimeline, LivesIndex, OnAllocated, OnLevels, TimelineOptions,
};
use serde::Serialize;

use crate::{encode, ReportOptions, StackTable};

/// Curves of one device; arrays are base64 `Float64Array`s of `n` entries (`sites`:
/// `n × site_stacks.len()`, bucket-major).
#[derive(Serialize)]
pub struct Curves {
    /// Buckets.
    pub n: usize,
    /// Trace states in all (events + 1).
    pub states: usize,
    /// First state of each bucket.
    pub first: String,
    /// `time_us` of the first timed event of each bucket (NaN when none).
    pub time: String,
    pub allocated: String,
    pub requested: String,
    pub reserved: String,
    /// Largest `alloc` request inside each bucket (0 when none).
    pub max_request: String,
    /// The state of each bucket where allocated is highest (the state `sites` and the
    /// page's summarised band of small allocations are taken at).
    pub amax: String,
    /// The longest pause of each bucket, for the wall-clock axis: the states of the two
    /// timed events around it (`gap_from` = −1 when the bucket has none) and their
    /// times, so that the page places the pause exactly even when a bucket holds many
    /// events.
    pub gap_from: String,
    pub gap_to: String,
    pub gap_t0: String,
    pub gap_t1: String,
    /// Page stack index of each drawn call site (−1: no stack recorded).
    pub site_stacks: Vec<i64>,
    pub sites: String,
}

/// Index of a call site in [`SitePeaks::ids`]: 0 for no stack, else the stack's index + 1.
fn site_slot(stack: Option<StackId>) -> usize {
    stack.map_or(0, |s| s.index() + 1)
}

/// The most live bytes of each call site at any state, kept during the walk (the drawn
/// sites are those with the most); their values at each bucket's maximum are filled in
/// afterwards from the block lives ([`CurvesWalk::finish`]), off the walk.
#[derive(Default)]
struct SitePeaks {
    /// Call site (allocation stack) of each site id.
    keys: Vec<Option<StackId>>,
    /// Site id + 1 of each stack by [`site_slot`] (0: not seen yet); stacks are dense
    /// indices, and a hash lookup per change was a visible share of the walk.
    ids: Vec<u32>,
    /// Live bytes now, and the most at any state.
    cur: Vec<i64>,
    best: Vec<i64>,
}

impl SitePeaks {
    // Once per alloc and free of the walk: inlined into it (see LivesRecorder::change).
    #[inline(always)]
    fn change(&mut self, stack: Option<StackId>, delta: i64) {
        let slot = site_slot(stack);
        if slot >= self.ids.len() {
            self.ids.resize(slot + 1, 0);
        }
        if self.ids[slot] == 0 {
            self.keys.push(stack);
            self.cur.push(0);
            self.best.push(0);
            self.ids[slot] = self.keys.len() as u32;
        }
        let i = self.ids[slot] as usize - 1;
        self.cur[i] += delta;
        self.best[i] = self.best[i].max(self.cur[i]);
    }
}

/// [`Curves`] as the walk leaves them: the levels of each bucket. What is read from the
/// trace alone ([`TraceBuckets`], found beside the walk) and [`Curves::sites`] (from
/// the block lives) are added by [`CurvesWalk::finish`].
pub struct CurvesWalk {
    n: usize,
    states: usize,
    /// The most allocated bytes of each bucket, and the first state with them
    /// (strictly increasing).
    alloc: Vec<f64>,
    amax: Vec<usize>,
    req: Vec<u64>,
    res: Vec<u64>,
    /// The drawn call sites, most live bytes at their own peak first.
    sites: Vec<Option<StackId>>,
}

impl CurvesWalk {
    /// The state of each bucket where allocated is highest ([`Curves::amax`]).
    pub fn amax(&self) -> &[usize] {
        &self.amax
    }

    /// Trace states in all (events + 1).
    pub fn states(&self) -> usize {
        self.states
    }

    /// The curves, with the figures read from the trace and the drawn sites' live bytes
    /// at each bucket's allocated maximum (from `lives`, the lives of the walk that made
    /// this, over `events`, the device's trace), and those sites.
    pub fn finish(
        self,
        events: &[TraceEvent],
        lives: &BlockLives,
        trace: TraceBuckets,
    ) -> (Curves, Vec<Option<StackId>>) {
        debug_assert_eq!(trace.n, self.n, "the trace's buckets are the walk's");
        let k = self.sites.len();
        let mut slot = vec![usize::MAX; self.sites.iter().map(|&s| site_slot(s) + 1).max().unwrap_or(0)];
        for (j, &s) in self.sites.iter().enumerate() {
            slot[site_slot(s)] = j;
        }
        let key = |s: Option<StackId>| slot.get(site_slot(s)).copied().filter(|&j| j != usize::MAX);
        let rows = fragscope_trace::live_bytes_at(
            &self.amax,
            k,
            lives.seeded.iter().filter_map(|b| Some((key(b.stack)?, None, b.end, b.size))).chain(
                lives.traced.iter().filter_map(|l| Some((key(l.stack(events))?, Some(l.alloc()), l.end(), l.size))),
            ),
        );
        // One row per bucket (the last row is the end of the trace).
        let sites: Vec<f64> = rows.iter().take(self.amax.len()).flat_map(|r| r.iter().map(|&v| v as f64)).collect();
        let as_f64 = |v: &[u64]| encode::f64s(&v.iter().map(|&x| x as f64).collect::<Vec<_>>());
        let amax: Vec<f64> = self.amax.iter().map(|&a| a as f64).collect();
        let curves = Curves {
            n: self.n,
            states: self.states,
            first: trace.first,
            time: trace.time,
            allocated: encode::f64s(&self.alloc),
            requested: as_f64(&self.req),
            reserved: as_f64(&self.res),
            max_request: trace.max_request,
            amax: encode::f64s(&amax),
            gap_from: trace.gap_from,
            gap_to: trace.gap_to,
            gap_t0: trace.gap_t0,
            gap_t1: trace.gap_t1,
            site_stacks: Vec::new(),
            sites: encode::f64s(&sites),
        };
        (curves, self.sites)
    }
}

/// The figures of each bucket that are read from the trace alone, encoded for the page:
/// its first state, the time of its first timed entry, its largest request and its
/// longest pause. One pass over the entries, no bookkeeping of blocks: the report finds
/// them beside the analysis' walk.
pub struct TraceBuckets {
    n: usize,
    first: String,
    time: String,
    max_request: String,
    gap_from: String,
    gap_to: String,
    gap_t0: String,
    gap_t1: String,
}

/// The figures of the bucket being read (see [`TraceBuckets`]).
struct TraceBucket {
    first: usize,
    /// `time_us` of its first timed entry.
    time: Option<i64>,
    max_request: u64,
    /// Its longest pause between timed entries: (state before, state after, times).
    gap: Option<(usize, usize, i64, i64)>,
    gap_len: i64,
}

impl TraceBucket {
    fn starting_at(first: usize) -> Self {
        TraceBucket { first, time: None, max_request: 0, gap: None, gap_len: 0 }
    }
}

/// [`TraceBuckets`] being read, entry by entry ([`TraceBuckets::scan`]), so that the
/// report reads them in the same pass over the trace as its other figures.
pub struct TraceBucketScan {
    states: usize,
    first: Vec<f64>,
    time: Vec<f64>,
    max_request: Vec<f64>,
    gap_from: Vec<f64>,
    gap_to: Vec<f64>,
    gap_t0: Vec<f64>,
    gap_t1: Vec<f64>,
    /// The bucket being read and the first state of the next one (followed as in the
    /// walk; state 0, the state before the first entry, is the first of bucket 0 and
    /// has no entry).
    b: usize,
    next: usize,
    cur: TraceBucket,
    last_timed: Option<(usize, i64)>,
}

impl TraceBucketScan {
    /// Entry `i` of the trace, in order from 0.
    #[inline]
    pub fn entry(&mut self, i: usize, e: &TraceEvent) {
        let state = i + 1;
        if state >= self.next {
            self.store();
            self.b += 1;
            self.next = ((self.b + 1) * self.states).div_ceil(self.first.len());
            self.cur = TraceBucket::starting_at(state);
        }
        let cur = &mut self.cur;
        if e.time_us != NO_TIME {
            if cur.time.is_none() {
                cur.time = Some(e.time_us);
            }
            if let Some((ps, pt)) = self.last_timed {
                if e.time_us - pt > cur.gap_len {
                    cur.gap_len = e.time_us - pt;
                    cur.gap = Some((ps, state, pt, e.time_us));
                }
            }
            self.last_timed = Some((state, e.time_us));
        }
        if e.action == Action::Alloc && e.size > cur.max_request {
            cur.max_request = e.size;
        }
    }

    fn store(&mut self) {
        let (b, c) = (self.b, &self.cur);
        self.first[b] = c.first as f64;
        self.time[b] = c.time.map_or(f64::NAN, |t| t as f64);
        self.max_request[b] = c.max_request as f64;
        if let Some((s0, s1, a, z)) = c.gap {
            (self.gap_from[b], self.gap_to[b], self.gap_t0[b], self.gap_t1[b]) =
                (s0 as f64, s1 as f64, a as f64, z as f64);
        }
    }

    /// The buckets, once every entry has been read.
    pub fn finish(mut self) -> TraceBuckets {
        self.store();
        let f = encode::f64s;
        TraceBuckets {
            n: self.first.len(),
            first: f(&self.first),
            time: f(&self.time),
            max_request: f(&self.max_request),
            gap_from: f(&self.gap_from),
            gap_to: f(&self.gap_to),
            gap_t0: f(&self.gap_t0),
            gap_t1: f(&self.gap_t1),
        }
    }
}

impl TraceBuckets {
    /// All of `trace` through [`TraceBuckets::scan`] (for the tests; the report feeds
    /// the scan from its one pass over the trace).
    #[cfg(test)]
    fn new(trace: &[TraceEvent], opts: &ReportOptions) -> Self {
        let mut scan = TraceBuckets::scan(trace.len(), opts);
        for (i, e) in trace.iter().enumerate() {
            scan.entry(i, e);
        }
        scan.finish()
    }

    /// The buckets of a trace of `entries` entries, as [`curves_and_timeline`] splits it
    /// with `opts`, read one entry at a time ([`TraceBucketScan::entry`]).
    pub fn scan(entries: usize, opts: &ReportOptions) -> TraceBucketScan {
        let states = entries + 1;
        let n = opts.buckets.max(1).min(states);
        TraceBucketScan {
            states,
            first: vec![f64::NAN; n],
            time: vec![f64::NAN; n],
            max_request: vec![0.0; n],
            gap_from: vec![-1.0; n],
            gap_to: vec![-1.0; n],
            gap_t0: vec![f64::NAN; n],
            gap_t1: vec![f64::NAN; n],
            b: 0,
            next: states.div_ceil(n),
            cur: TraceBucket::starting_at(0),
            last_timed: None,
        }
    }
}

impl Curves {
    /// Sets [`Curves::site_stacks`] from the call sites [`curves_and_timeline`] returned
    /// (kept apart so that the page's stack table is filled in a fixed order).
    pub fn with_stacks(mut self, snap: &Snapshot, sites: &[Option<StackId>], table: &mut StackTable) -> Curves {
        self.site_stacks = sites.iter().map(|s| table.index(snap, *s)).collect();
        self
    }
}

/// The walk's part of a device's [`Curves`] (see the module doc; the call sites with the
/// most live bytes at their own peak are chosen here, their values at each bucket's
/// maximum counted by [`CurvesWalk::finish`] from the block lives), and `analyze`'s
/// timeline with `points` points from the same walk of the trace ([`timeline_walk`]),
/// so the report walks it once for both.
pub fn curves_and_timeline(
    snap: &Snapshot,
    device: i64,
    opts: &ReportOptions,
    points: usize,
) -> (CurvesWalk, DeviceTimeline) {
    curves_and_timeline_marked(snap, device, opts, points, None, None)
}

/// Told the walk's block lives before the timeline's table ([`fragscope_trace::OnLives`]),
/// with the curves' [`CurvesWalk::amax`], whole by then: what the role buckets read
/// besides the roles.
pub type OnWalked<'a> = &'a mut dyn FnMut(&std::sync::Arc<BlockLives>, Option<LivesIndex>, &[usize]);

/// [`curves_and_timeline`], with `marks` following the state view's marks in the same
/// walk ([`crate::state::SharedWalk`]), and `on_lives` told the walk's block lives and the
/// curves' allocated maxima before the timeline's table ([`OnWalked`]).
pub fn curves_and_timeline_marked(
    snap: &Snapshot,
    device: i64,
    opts: &ReportOptions,
    points: usize,
    marks: Option<crate::state::MarksSink>,
    on_lives: Option<OnWalked>,
) -> (CurvesWalk, DeviceTimeline) {
    let mut marks = marks;
    let states = snap.trace(device).len() + 1;
    let n = opts.buckets.max(1).min(states);
    let mut alloc = vec![-1.0f64; n];
    let mut amax = vec![0usize; n];
    let mut req = vec![0u64; n];
    let mut res = vec![0u64; n];
    let mut peaks = SitePeaks::default();
    // The bucket of `state` is `state * n / states`; it is followed with the first state
    // of the next bucket instead of a division per event, and the current bucket's
    // levels are kept here and stored when it ends. (What is read from the trace alone,
    // [`TraceBuckets`], is not done here: this walk is the report's longest wait.)
    let mut b = 0usize;
    let mut next = states.div_ceil(n);
    // The most allocated bytes and the first state with them; the most requested and
    // reserved bytes.
    let mut cur: (Option<(u64, usize)>, u64, u64) = (None, 0, 0);
    // `amax` as it is at the walk's last state, for `on_lives` (which the walk calls
    // while the sink below still holds `amax`).
    let amax_at_end = std::cell::OnceCell::new();
    let mut store = |b: usize, cur: &(Option<(u64, usize)>, u64, u64), last: bool| {
        if let Some((a, s)) = cur.0 {
            (alloc[b], amax[b]) = (a as f64, s);
        }
        (req[b], res[b]) = (cur.1, cur.2);
        if last {
            let _ = amax_at_end.set(amax.clone());
        }
    };
    let mut sink = (
        (OnAllocated(|_, c| peaks.change(c.stack, c.size as i64 * c.delta)), &mut marks),
        OnLevels(|state, l| {
            if state >= next {
                store(b, &cur, false);
                // At most one bucket per state: n <= states.
                b += 1;
                next = ((b + 1) * states).div_ceil(n);
                cur = (None, 0, 0);
            }
            if cur.0.is_none_or(|(a, _)| l.allocated > a) {
                cur.0 = Some((l.allocated, state));
            }
            cur.1 = cur.1.max(l.requested);
            cur.2 = cur.2.max(l.reserved);
            if state + 1 == states {
                store(b, &cur, true);
            }
        }),
    );
    let topts = TimelineOptions { points: points.max(1) };
    let tl = match on_lives {
        Some(tell) => {
            let mut tell = |l: &std::sync::Arc<BlockLives>, ix: Option<LivesIndex>| {
                tell(l, ix, amax_at_end.get().map_or(&[][..], Vec::as_slice))
            };
            timeline_walk_then(snap, device, &topts, &mut sink, &mut tell)
        }
        None => timeline_walk(snap, device, &topts, &mut sink),
    };
    // The last bucket was stored at the walk's last state (the walk reports every state).
    debug_assert!(amax_at_end.get().is_some(), "the walk reached its last state");
    // The call sites with the most live bytes at their own peak; among equals, the one
    // met first in the walk (site ids are in that order). Not by stack id: ids follow the
    // order in which the reader interned the stacks, which depends on how it read them
    // (its batch decoder or its generic path, a file or `from_dict`), not on the trace.
    let mut ranked: Vec<(usize, i64)> =
        (0..peaks.keys.len()).filter(|&i| peaks.best[i] > 0).map(|i| (i, peaks.best[i])).collect();
    ranked.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    ranked.truncate(opts.top_sites);
    let sites = ranked.iter().map(|&(i, _)| peaks.keys[i]).collect();
    (CurvesWalk { n, states, alloc, amax, req, res, sites }, tl)
}

#[cfg(test)]
mod tests {
    use super::*;
    use fragscope_testdata::Rng;

    /// [`TraceBuckets`] against each bucket's figures taken from their definitions: the
    /// bucket of state `s` is `s * n / states`; its time is that of its first timed
    /// entry, its largest request that of its `alloc`s, its pause the longest between
    /// two consecutive timed entries that ends in it (the first of equals).
    #[test]
    fn trace_buckets_follow_their_definitions() {
        let mut rng = Rng(7);
        for round in 0..300 {
            let len = rng.below(60);
            let mut t = 1_000i64;
            let trace: Vec<TraceEvent> = (0..len)
                .map(|_| {
                    let action = [Action::Alloc, Action::FreeRequested, Action::FreeCompleted, Action::SegmentAlloc]
                        [rng.below(4)];
                    let mut e = TraceEvent::new(action, 512 * rng.below(8) as u64, 512 * rng.below(50) as u64);
                    // Untimed entries, repeated times and pauses of several lengths.
                    if rng.below(4) != 0 {
                        t += [0, 1, 5, 40][rng.below(4)];
                        e.time_us = t;
                    }
                    e
                })
                .collect();
            let states = len + 1;
            for buckets in [1, 2, 3, 7, 1000] {
                let n = buckets.min(states);
                let bucket = |s: usize| s * n / states;
                let mut first = vec![f64::NAN; n];
                let mut time = vec![f64::NAN; n];
                let mut max_request = vec![0.0; n];
                let mut gap = vec![(-1.0, -1.0, f64::NAN, f64::NAN); n];
                let mut gap_len = vec![0i64; n];
                for s in (0..states).rev() {
                    first[bucket(s)] = s as f64;
                }
                let timed: Vec<(usize, i64)> = (1..states)
                    .filter(|&s| trace[s - 1].time_us != NO_TIME)
                    .map(|s| (s, trace[s - 1].time_us))
                    .collect();
                for &(s, t) in timed.iter().rev() {
                    time[bucket(s)] = t as f64;
                }
                for s in 1..states {
                    let e = &trace[s - 1];
                    if e.action == Action::Alloc {
                        max_request[bucket(s)] = f64::max(max_request[bucket(s)], e.size as f64);
                    }
                }
                for w in timed.windows(2) {
                    let ((s0, t0), (s1, t1)) = (w[0], w[1]);
                    if t1 - t0 > gap_len[bucket(s1)] {
                        gap_len[bucket(s1)] = t1 - t0;
                        gap[bucket(s1)] = (s0 as f64, s1 as f64, t0 as f64, t1 as f64);
                    }
                }
                let got = TraceBuckets::new(&trace, &ReportOptions { buckets, ..ReportOptions::default() });
                let f = encode::f64s;
                let label = format!("round {round}, {len} entries, {buckets} buckets");
                assert_eq!(got.n, n, "{label}");
                assert_eq!(got.first, f(&first), "{label}: first");
                assert_eq!(got.time, f(&time), "{label}: time");
                assert_eq!(got.max_request, f(&max_request), "{label}: max_request");
                assert_eq!(got.gap_from, f(&gap.iter().map(|g| g.0).collect::<Vec<_>>()), "{label}: gap_from");
                assert_eq!(got.gap_to, f(&gap.iter().map(|g| g.1).collect::<Vec<_>>()), "{label}: gap_to");
                assert_eq!(got.gap_t0, f(&gap.iter().map(|g| g.2).collect::<Vec<_>>()), "{label}: gap_t0");
                assert_eq!(got.gap_t1, f(&gap.iter().map(|g| g.3).collect::<Vec<_>>()), "{label}: gap_t1");
            }
        }
    }
}
