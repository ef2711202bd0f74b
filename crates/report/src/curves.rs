//! The timeline's curves at the finest level of detail the page gets.
//!
//! The trace's states (before the first event, then after each) are split into at most
//! `buckets` equal runs; each bucket keeps the maximum of allocated, requested and
//! reserved over its states (so no peak is lost at any zoom), the live bytes of the top
//! call sites at the state where allocated is highest, the first state's time, and the
//! largest request made inside it. The levels are [`fragscope_analysis::timeline`]'s own
//! bookkeeping, so the peaks drawn are the peaks `summary` and `analyze` print.

use fragscope_analysis::timeline::walk_states;
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
    /// Page stack index of each drawn call site (−1: no stack recorded).
    pub site_stacks: Vec<i64>,
    pub sites: String,
}

/// See the module doc.
pub fn curves(snap: &Snapshot, device: i64, opts: &ReportOptions, table: &mut StackTable) -> Curves {
    let trace = snap.trace(device);
    let states = trace.len() + 1;
    // Pass 1: the call sites with the most live bytes at their own peak.
    let mut live: FxHashMap<Option<StackId>, i128> = FxHashMap::default();
    let mut best: FxHashMap<Option<StackId>, i128> = FxHashMap::default();
    walk_states(
        snap,
        device,
        |_, c| {
            let v = live.entry(c.stack).or_default();
            *v += c.size as i128 * c.delta as i128;
            let b = best.entry(c.stack).or_default();
            *b = (*b).max(*v);
        },
        |_, _| {},
    );
    let mut ranked: Vec<(Option<StackId>, i128)> = best.into_iter().filter(|&(_, b)| b > 0).collect();
    ranked.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    ranked.truncate(opts.top_sites);
    let slot: FxHashMap<Option<StackId>, usize> = ranked.iter().enumerate().map(|(k, (s, _))| (*s, k)).collect();
    let k = ranked.len();

    // Pass 2: bucketed maxima.
    let n = opts.buckets.max(1).min(states);
    let mut first = vec![f64::NAN; n];
    let mut time = vec![f64::NAN; n];
    let mut alloc = vec![-1.0f64; n];
    let mut req = vec![0.0f64; n];
    let mut res = vec![0.0f64; n];
    let mut max_request = vec![0.0f64; n];
    let mut sites = vec![0.0f64; n * k];
    // Both callbacks of the walk see the per-site live bytes.
    let cur = std::cell::RefCell::new(vec![0i128; k]);
    walk_states(
        snap,
        device,
        |_, c| {
            if let Some(&j) = slot.get(&c.stack) {
                cur.borrow_mut()[j] += c.size as i128 * c.delta as i128;
            }
        },
        |state, l| {
            let b = state * n / states;
            if first[b].is_nan() {
                first[b] = state as f64;
            }
            if state > 0 {
                let e = &trace[state - 1];
                if time[b].is_nan() && e.time_us != NO_TIME {
                    time[b] = e.time_us as f64;
                }
                if e.action == Action::Alloc {
                    max_request[b] = max_request[b].max(e.size as f64);
                }
            }
            if l.allocated as f64 > alloc[b] {
                alloc[b] = l.allocated as f64;
                for (dst, &v) in sites[b * k..(b + 1) * k].iter_mut().zip(cur.borrow().iter()) {
                    *dst = v.max(0) as f64;
                }
            }
            req[b] = req[b].max(l.requested as f64);
            res[b] = res[b].max(l.reserved as f64);
        },
    );
    Curves {
        n,
        states,
        first: encode::f64s(&first),
        time: encode::f64s(&time),
        allocated: encode::f64s(&alloc),
        requested: encode::f64s(&req),
        reserved: encode::f64s(&res),
        max_request: encode::f64s(&max_request),
        site_stacks: ranked.iter().map(|(s, _)| table.index(snap, *s)).collect(),
        sites: encode::f64s(&sites),
    }
}
