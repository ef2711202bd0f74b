//! Per-iteration curves of the leak suspects: the live bytes of each suspect's call site
//! at each iteration boundary `analyze` used (the trace state just before the boundary
//! entry, thinned to at most [`MAX_SAMPLES`] as `analyze` thins them), so the page can
//! draw the growth the suspect was reported for.
//!
//! Call sites are `analyze`'s ([`site_of`], by its `file:line:function` name); blocks
//! allocated before the trace began belong to no suspect, as in `analyze`.

use fragscope_analysis::analyze::Analysis;
use fragscope_analysis::attribution::site_of;
use fragscope_analysis::leaks::MAX_SAMPLES;
use fragscope_analysis::timeline::walk_states;
use fragscope_snapshot::{FxHashMap, Snapshot, StackId};
use serde::Serialize;

use crate::encode;

/// Samples of one suspect.
#[derive(Serialize)]
pub struct LeakCurve {
    /// The suspect's `site` (as in `analyze --json`).
    pub site: String,
    /// Live bytes at each boundary (base64 Float64Array).
    pub bytes: String,
}

/// Trace states sampled, and one curve per suspect (empty when `analyze` found none).
pub fn curves(snap: &Snapshot, device: i64, ana: &Analysis) -> (Vec<usize>, Vec<LeakCurve>) {
    let Some(d) = ana.devices.iter().find(|d| d.device == device) else { return (Vec::new(), Vec::new()) };
    if d.leak_suspects.is_empty() {
        return (Vec::new(), Vec::new());
    }
    let b = &d.iterations.boundaries;
    let used: Vec<usize> = if b.len() <= MAX_SAMPLES {
        b.clone()
    } else {
        (0..MAX_SAMPLES).map(|k| b[k * (b.len() - 1) / (MAX_SAMPLES - 1)]).collect()
    };
    let names: Vec<&str> = d.leak_suspects.iter().map(|s| s.site.site.as_str()).collect();
    let mut suspect_of: FxHashMap<Option<StackId>, Option<usize>> = FxHashMap::default();
    let live = std::cell::RefCell::new(vec![0i128; names.len()]);
    let mut samples: Vec<Vec<f64>> = vec![Vec::with_capacity(used.len()); names.len()];
    let mut next = 0usize;
    walk_states(
        snap,
        device,
        |_, c| {
            if c.before_trace {
                return;
            }
            let k = *suspect_of.entry(c.stack).or_insert_with(|| {
                let site = site_of(&snap.frames, c.stack).site;
                names.iter().position(|n| *n == site)
            });
            if let Some(k) = k {
                live.borrow_mut()[k] += c.size as i128 * c.delta as i128;
            }
        },
        |state, _| {
            while next < used.len() && used[next] == state {
                for (s, &v) in samples.iter_mut().zip(live.borrow().iter()) {
                    s.push(v.max(0) as f64);
                }
                next += 1;
            }
        },
    );
    let curves =
        names.iter().zip(samples).map(|(n, s)| LeakCurve { site: n.to_string(), bytes: encode::f64s(&s) }).collect();
    (used, curves)
}
