//! The timeline's curves at the finest level of detail the page gets.
//!
//! The trace's states (before the first event, then after each) are split into at most
//! `buckets` equal runs; each bucket keeps the maximum of allocated, requested and
//! reserved over its states (so no peak is lost at any zoom), the live bytes of the top
//! call sites at the state where allocated is highest, the first state's time, and the
//! largest request made inside it. The levels are [`fragscope_analysis::timeline`]'s own
//! bookkeeping, so the peaks drawn are the peaks `summary` and `analyze` print.

use fragscope_analysis::lives::BlockLives;
use fragscope_analysis::timeline::{timeline_walk, DeviceTimeline, TimelineOptions};
use fragscope_snapshot::{Action, Snapshot, StackId, NO_TIME};
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

/// [`Curves`] as the walk leaves them: everything but [`Curves::sites`], which
/// [`CurvesWalk::finish`] computes from the block lives.
pub struct CurvesWalk {
    curves: Curves,
    /// The drawn call sites, most live bytes at their own peak first.
    sites: Vec<Option<StackId>>,
    /// The state of each bucket where allocated is highest (strictly increasing).
    amax: Vec<usize>,
}

impl CurvesWalk {
    /// The curves with the drawn sites' live bytes at each bucket's allocated maximum
    /// (from `lives`, the lives of the walk that made this), and those sites.
    pub fn finish(mut self, lives: &BlockLives) -> (Curves, Vec<Option<StackId>>) {
        let k = self.sites.len();
        let mut slot = vec![usize::MAX; self.sites.iter().map(|&s| site_slot(s) + 1).max().unwrap_or(0)];
        for (j, &s) in self.sites.iter().enumerate() {
            slot[site_slot(s)] = j;
        }
        let key = |s: Option<StackId>| slot.get(site_slot(s)).copied().filter(|&j| j != usize::MAX);
        let rows = fragscope_analysis::lives::live_bytes_at(
            &self.amax,
            k,
            lives
                .seeded
                .iter()
                .filter_map(|b| Some((key(b.stack)?, None, b.end, b.size)))
                .chain(lives.traced.iter().filter_map(|l| Some((key(l.stack)?, Some(l.alloc), l.end, l.size)))),
        );
        // One row per bucket (the last row is the end of the trace).
        let sites: Vec<f64> = rows.iter().take(self.amax.len()).flat_map(|r| r.iter().map(|&v| v as f64)).collect();
        self.curves.sites = encode::f64s(&sites);
        (self.curves, self.sites)
    }
}

/// The figures of the bucket being walked (see [`curves_and_timeline`]).
struct Bucket {
    first: usize,
    /// `time_us` of its first timed event.
    time: Option<i64>,
    /// The most allocated bytes and the first state with them.
    amax: Option<(u64, usize)>,
    req: u64,
    res: u64,
    max_request: u64,
    /// Its longest pause between timed events: (state before, state after, times).
    gap: Option<(usize, usize, i64, i64)>,
    gap_len: i64,
}

impl Bucket {
    fn starting_at(first: usize) -> Self {
        Bucket { first, time: None, amax: None, req: 0, res: 0, max_request: 0, gap: None, gap_len: 0 }
    }

    fn store(
        &self,
        b: usize,
        first: &mut [f64],
        time: &mut [f64],
        alloc: &mut [f64],
        amax: &mut [usize],
        max_request: &mut [f64],
    ) {
        first[b] = self.first as f64;
        time[b] = self.time.map_or(f64::NAN, |t| t as f64);
        if let Some((a, s)) = self.amax {
            (alloc[b], amax[b]) = (a as f64, s);
        }
        max_request[b] = self.max_request as f64;
    }

    fn store_gap(&self, b: usize, from: &mut [f64], to: &mut [f64], t0: &mut [f64], t1: &mut [f64]) {
        if let Some((s0, s1, a, z)) = self.gap {
            (from[b], to[b], t0[b], t1[b]) = (s0 as f64, s1 as f64, a as f64, z as f64);
        }
    }
}

/// See the module doc. One walk of the trace, which keeps each call site's most live
/// bytes; the top sites are chosen (most live bytes at their own peak) after the walk
/// and their values at each bucket's maximum counted from the block lives.
pub fn curves(snap: &Snapshot, device: i64, opts: &ReportOptions, table: &mut StackTable) -> Curves {
    let (walked, tl) = curves_and_timeline(snap, device, opts, 1);
    let (curves, sites) = walked.finish(tl.lives.as_deref().expect("the curves walk keeps the lives"));
    curves.with_stacks(snap, &sites, table)
}

impl Curves {
    /// Sets [`Curves::site_stacks`] from the call sites [`curves_and_timeline`] returned
    /// (kept apart so that the page's stack table is filled in a fixed order).
    pub fn with_stacks(mut self, snap: &Snapshot, sites: &[Option<StackId>], table: &mut StackTable) -> Curves {
        self.site_stacks = sites.iter().map(|s| table.index(snap, *s)).collect();
        self
    }
}

/// [`curves`] without `site_stacks` (the drawn call sites are returned instead, for
/// [`Curves::with_stacks`]), and `analyze`'s timeline with `points` points from the same
/// walk of the trace ([`timeline_walk`]), so the report walks it once for both.
pub fn curves_and_timeline(
    snap: &Snapshot,
    device: i64,
    opts: &ReportOptions,
    points: usize,
) -> (CurvesWalk, DeviceTimeline) {
    let trace = snap.trace(device);
    let states = trace.len() + 1;
    let n = opts.buckets.max(1).min(states);
    let mut first = vec![f64::NAN; n];
    let mut time = vec![f64::NAN; n];
    let mut alloc = vec![-1.0f64; n];
    let mut req = vec![0u64; n];
    let mut res = vec![0u64; n];
    let mut max_request = vec![0.0f64; n];
    let mut amax = vec![0usize; n];
    let (mut gap_from, mut gap_to) = (vec![-1.0f64; n], vec![-1.0f64; n]);
    let (mut gap_t0, mut gap_t1) = (vec![f64::NAN; n], vec![f64::NAN; n]);
    let mut last_timed: Option<(usize, i64)> = None;
    let mut peaks = SitePeaks::default();
    // The bucket of `state` is `state * n / states`; it is followed with the first state
    // of the next bucket instead of a division per event, and the current bucket's
    // figures are kept in `cur` and stored when it ends.
    let mut b = 0usize;
    let mut next = states.div_ceil(n);
    let mut cur = Bucket::starting_at(0);
    let tl = timeline_walk(
        snap,
        device,
        &TimelineOptions { points: points.max(1) },
        |_, c| peaks.change(c.stack, c.size as i64 * c.delta),
        |state, l| {
            if state >= next {
                cur.store(b, &mut first, &mut time, &mut alloc, &mut amax, &mut max_request);
                cur.store_gap(b, &mut gap_from, &mut gap_to, &mut gap_t0, &mut gap_t1);
                (req[b], res[b]) = (cur.req, cur.res);
                // At most one bucket per state: n <= states.
                b += 1;
                next = ((b + 1) * states).div_ceil(n);
                cur = Bucket::starting_at(state);
            }
            if state > 0 {
                let e = &trace[state - 1];
                if e.time_us != NO_TIME {
                    if cur.time.is_none() {
                        cur.time = Some(e.time_us);
                    }
                    if let Some((ps, pt)) = last_timed {
                        if e.time_us - pt > cur.gap_len {
                            cur.gap_len = e.time_us - pt;
                            cur.gap = Some((ps, state, pt, e.time_us));
                        }
                    }
                    last_timed = Some((state, e.time_us));
                }
                if e.action == Action::Alloc && e.size > cur.max_request {
                    cur.max_request = e.size;
                }
            }
            if cur.amax.is_none_or(|(a, _)| l.allocated > a) {
                cur.amax = Some((l.allocated, state));
            }
            cur.req = cur.req.max(l.requested);
            cur.res = cur.res.max(l.reserved);
        },
    );
    cur.store(b, &mut first, &mut time, &mut alloc, &mut amax, &mut max_request);
    cur.store_gap(b, &mut gap_from, &mut gap_to, &mut gap_t0, &mut gap_t1);
    (req[b], res[b]) = (cur.req, cur.res);
    // The call sites with the most live bytes at their own peak.
    let mut ranked: Vec<(Option<StackId>, i64)> =
        (0..peaks.keys.len()).filter(|&i| peaks.best[i] > 0).map(|i| (peaks.keys[i], peaks.best[i])).collect();
    ranked.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    ranked.truncate(opts.top_sites);
    let amax_f: Vec<f64> = amax.iter().map(|&a| a as f64).collect();
    let curves = Curves {
        n,
        states,
        first: encode::f64s(&first),
        time: encode::f64s(&time),
        allocated: encode::f64s(&alloc),
        requested: encode::f64s(&req.iter().map(|&v| v as f64).collect::<Vec<_>>()),
        reserved: encode::f64s(&res.iter().map(|&v| v as f64).collect::<Vec<_>>()),
        max_request: encode::f64s(&max_request),
        amax: encode::f64s(&amax_f),
        gap_from: encode::f64s(&gap_from),
        gap_to: encode::f64s(&gap_to),
        gap_t0: encode::f64s(&gap_t0),
        gap_t1: encode::f64s(&gap_t1),
        site_stacks: Vec::new(),
        sites: String::new(),
    };
    (CurvesWalk { curves, sites: ranked.iter().map(|(s, _)| *s).collect(), amax }, tl)
}
