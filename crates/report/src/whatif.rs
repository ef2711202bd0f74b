//! What-if curves: the reserved curve of each replay `analyze` ran for a device (an OOM,
//! or `--what-if`): the recorded settings first, then every setting it tried, in its
//! order.
//!
//! The results are the analysis' own (its [`Trial`]s: setting, peak reserved, first OOM,
//! capacity and the whole configuration replayed); what the analysis does not keep is the
//! curve, so each trial's replay is run again here, from the trial's own configuration,
//! with its events kept ([`SimOptions::collect_snapshot`]), and its curve taken by
//! [`fragscope_trace::timeline`] on the simulated trace. A replay issues its own segment
//! events, so its trace is not event-for-event the recorded one: the page draws every
//! curve against the fraction of its own trace, and marks the first OOM at its recorded
//! trace index.

use fragscope_diagnose::{Analysis, Trial};
use fragscope_replay::{simulate_with, SimOptions};
use fragscope_snapshot::Snapshot;
use fragscope_trace::{timeline, TimelineOptions};
use serde::Serialize;

use crate::encode;

/// Points per what-if curve.
const POINTS: usize = 1024;

/// One replayed configuration.
#[derive(Serialize)]
pub struct WhatIfCurve {
    /// `"recorded"` or the option changed (the trial's [`Trial::setting`]).
    pub setting: String,
    /// The trial's [`Trial::peak_reserved_bytes`].
    pub peak_reserved_bytes: u64,
    /// Trace index (of the recorded trace) of the first request the replay could not
    /// serve (the trial's [`Trial::first_oom_index`]).
    pub first_oom_index: Option<usize>,
    /// Position of each point in the replay's own trace, 0–1 (base64 Float64Array).
    pub x: String,
    /// Maximum reserved bytes of each point (base64 Float64Array).
    pub reserved: String,
}

/// See the module doc. Empty when `analyze` ran no replay on `device`.
pub fn curves(snap: &Snapshot, device: i64, ana: &Analysis) -> Vec<WhatIfCurve> {
    let Some(d) = ana.devices.iter().find(|d| d.device == device) else { return Vec::new() };
    let r = &d.recommendations;
    match &r.baseline {
        Some(base) if r.measured => {
            std::iter::once(base).chain(&r.tried).filter_map(|t| curve(snap, device, t)).collect()
        }
        _ => Vec::new(),
    }
}

/// The curve of trial `t`'s replay, with the trial's results; `None` when its
/// configuration does not parse back (a canonical string always does) or the replay
/// keeps no events.
fn curve(snap: &Snapshot, device: i64, t: &Trial) -> Option<WhatIfCurve> {
    // `Trial::config` is the canonical string of the configuration replayed, which parses
    // back to it (`AllocatorConfig::to_conf_string`).
    let cfg = fragscope_alloc::parse_config(&t.config).ok()?;
    let opts = SimOptions { capacity: t.capacity_bytes, collect_snapshot: true, ..SimOptions::default() };
    let w = simulate_with(snap, device, cfg, &opts);
    debug_assert_eq!(
        (w.peak_reserved, w.first_oom.as_ref().map(|o| o.index)),
        (t.peak_reserved_bytes, t.first_oom_index),
        "{}: the replay drawn is the analysis' replay",
        t.setting
    );
    let sim = w.snapshot?;
    let tl = timeline(&sim, device, &TimelineOptions { points: POINTS });
    let n = tl.events.max(1) as f64;
    let x: Vec<f64> = tl.series.iter().map(|p| p.first_event.map_or(0.0, |e| (e + 1) as f64 / n)).collect();
    let reserved: Vec<f64> = tl.series.iter().map(|p| p.max.reserved as f64).collect();
    Some(WhatIfCurve {
        setting: t.setting.clone(),
        peak_reserved_bytes: t.peak_reserved_bytes,
        first_oom_index: t.first_oom_index,
        x: encode::f64s(&x),
        reserved: encode::f64s(&reserved),
    })
}
