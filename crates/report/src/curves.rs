//! The timeline's curves at the finest level of detail the page gets.
//!
//! The trace's states (before the first event, then after each) are split into at most
//! `buckets` equal runs; each bucket keeps the maximum of allocated, requested and
//! reserved over its states (so no peak is lost at any zoom), the live bytes of the top
//! call sites at the state where allocated is highest, the first state's time, and the
//! largest request made inside it. The levels are [`fragscope_analysis::timeline`]'s own
//! bookkeeping, so the peaks drawn are the peaks `summary` and `analyze` print.

use fragscope_analysis::timeline::{timeline_walk, DeviceTimeline, TimelineOptions};
use fragscope_snapshot::{Action, FxHashMap, Snapshot, StackId, NO_TIME};
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

/// Per call site bookkeeping of the single walk in [`curves`] (see there).
#[derive(Default)]
struct SiteLog {
    /// Call site (allocation stack) of each site id.
    keys: Vec<Option<StackId>>,
    ids: FxHashMap<Option<StackId>, u32>,
    /// Live bytes now, and the most at any state.
    cur: Vec<i128>,
    best: Vec<i128>,
    /// Sites changed between the previous bucket's maximum and this bucket's current one.
    dirty: Vec<u32>,
    /// `dirty_mark[site] == bucket + 1` when `site` is in `dirty`.
    dirty_mark: Vec<u32>,
    /// Changes after this bucket's current maximum: (site, delta).
    after: Vec<(u32, i128)>,
    /// (bucket, site, live bytes at the bucket's maximum) for the sites that changed.
    values: Vec<(u32, u32, f64)>,
}

impl SiteLog {
    fn change(&mut self, stack: Option<StackId>, delta: i128) {
        let n = self.keys.len() as u32;
        let id = *self.ids.entry(stack).or_insert(n);
        if id == n {
            self.keys.push(stack);
            self.cur.push(0);
            self.best.push(0);
            self.dirty_mark.push(0);
        }
        let i = id as usize;
        self.cur[i] += delta;
        self.best[i] = self.best[i].max(self.cur[i]);
        self.after.push((id, delta));
    }
    fn mark(&mut self, bucket: usize, site: u32) {
        if self.dirty_mark[site as usize] != bucket as u32 + 1 {
            self.dirty_mark[site as usize] = bucket as u32 + 1;
            self.dirty.push(site);
        }
    }
    /// A new maximum of `bucket` at the current state: what changed since the previous
    /// one now counts up to it.
    fn new_max(&mut self, bucket: usize) {
        let after = std::mem::take(&mut self.after);
        for &(site, _) in &after {
            self.mark(bucket, site);
        }
        self.after = after;
        self.after.clear();
    }
    /// `bucket` is over: record its sites' values at its maximum (now minus what changed
    /// after it); the sites changed after the maximum start the next bucket's list.
    fn close(&mut self, bucket: usize) {
        let mut undo: FxHashMap<u32, i128> = FxHashMap::default();
        for &(site, d) in &self.after {
            *undo.entry(site).or_default() += d;
        }
        for &site in &self.dirty {
            let v = self.cur[site as usize] - undo.get(&site).copied().unwrap_or(0);
            self.values.push((bucket as u32, site, v.max(0) as f64));
        }
        self.dirty.clear();
        let after = std::mem::take(&mut self.after);
        for &(site, _) in &after {
            self.mark(bucket + 1, site);
        }
        self.after = after;
        self.after.clear();
    }
}

/// See the module doc. One walk of the trace: the live bytes of every call site are
/// logged, at each bucket's maximum, only for the sites that changed since the previous
/// bucket's; the top sites are chosen (most live bytes at their own peak) after the walk
/// and their values filled in from that log.
pub fn curves(snap: &Snapshot, device: i64, opts: &ReportOptions, table: &mut StackTable) -> Curves {
    let (curves, sites, _) = curves_and_timeline(snap, device, opts, 1);
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
) -> (Curves, Vec<Option<StackId>>, DeviceTimeline) {
    let trace = snap.trace(device);
    let states = trace.len() + 1;
    let n = opts.buckets.max(1).min(states);
    let mut first = vec![f64::NAN; n];
    let mut time = vec![f64::NAN; n];
    let mut alloc = vec![-1.0f64; n];
    let mut req = vec![0.0f64; n];
    let mut res = vec![0.0f64; n];
    let mut max_request = vec![0.0f64; n];
    let mut amax = vec![0.0f64; n];
    let (mut gap_from, mut gap_to) = (vec![-1.0f64; n], vec![-1.0f64; n]);
    let (mut gap_t0, mut gap_t1) = (vec![f64::NAN; n], vec![f64::NAN; n]);
    let mut gap_len = vec![0i64; n];
    let mut last_timed: Option<(usize, i64)> = None;
    // Both callbacks of the walk use the log.
    let log = std::cell::RefCell::new(SiteLog::default());
    let mut bucket = 0usize;
    let tl = timeline_walk(
        snap,
        device,
        &TimelineOptions { points: points.max(1) },
        |_, c| log.borrow_mut().change(c.stack, c.size as i128 * c.delta as i128),
        |state, l| {
            let b = state * n / states;
            let mut log = log.borrow_mut();
            while bucket < b {
                log.close(bucket);
                bucket += 1;
            }
            if first[b].is_nan() {
                first[b] = state as f64;
            }
            if state > 0 {
                let e = &trace[state - 1];
                if time[b].is_nan() && e.time_us != NO_TIME {
                    time[b] = e.time_us as f64;
                }
                if e.time_us != NO_TIME {
                    if let Some((ps, pt)) = last_timed {
                        if e.time_us - pt > gap_len[b] {
                            gap_len[b] = e.time_us - pt;
                            (gap_from[b], gap_to[b]) = (ps as f64, state as f64);
                            (gap_t0[b], gap_t1[b]) = (pt as f64, e.time_us as f64);
                        }
                    }
                    last_timed = Some((state, e.time_us));
                }
                if e.action == Action::Alloc {
                    max_request[b] = max_request[b].max(e.size as f64);
                }
            }
            if l.allocated as f64 > alloc[b] {
                alloc[b] = l.allocated as f64;
                amax[b] = state as f64;
                log.new_max(b);
            }
            req[b] = req[b].max(l.requested as f64);
            res[b] = res[b].max(l.reserved as f64);
        },
    );
    let mut log = log.into_inner();
    log.close(bucket);
    // The call sites with the most live bytes at their own peak.
    let mut ranked: Vec<(Option<StackId>, i128, u32)> =
        (0..log.keys.len()).filter(|&i| log.best[i] > 0).map(|i| (log.keys[i], log.best[i], i as u32)).collect();
    ranked.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    ranked.truncate(opts.top_sites);
    let k = ranked.len();
    let mut slot = vec![usize::MAX; log.keys.len()];
    for (j, r) in ranked.iter().enumerate() {
        slot[r.2 as usize] = j;
    }
    let mut sites = vec![0.0f64; n * k];
    let mut vals = vec![0.0f64; k];
    let mut pos = 0usize;
    for b in 0..n {
        while let Some(&(vb, site, v)) = log.values.get(pos) {
            if vb as usize != b {
                break;
            }
            if slot[site as usize] != usize::MAX {
                vals[slot[site as usize]] = v;
            }
            pos += 1;
        }
        sites[b * k..(b + 1) * k].copy_from_slice(&vals);
    }
    let curves = Curves {
        n,
        states,
        first: encode::f64s(&first),
        time: encode::f64s(&time),
        allocated: encode::f64s(&alloc),
        requested: encode::f64s(&req),
        reserved: encode::f64s(&res),
        max_request: encode::f64s(&max_request),
        amax: encode::f64s(&amax),
        gap_from: encode::f64s(&gap_from),
        gap_to: encode::f64s(&gap_to),
        gap_t0: encode::f64s(&gap_t0),
        gap_t1: encode::f64s(&gap_t1),
        site_stacks: Vec::new(),
        sites: encode::f64s(&sites),
    };
    (curves, ranked.iter().map(|(s, _, _)| *s).collect(), tl)
}
