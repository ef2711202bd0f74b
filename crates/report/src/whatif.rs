//! What-if curves: the reserved curve of the trace replayed under the recorded settings
//! and under each alternative `analyze` tried, for the devices where it ran replays (an
//! OOM, or `--what-if`).
//!
//! Each replay is run again here with its events kept ([`SimOptions::collect_snapshot`])
//! and its curve taken by [`fragscope_trace::timeline`] on the simulated trace. A
//! replay issues its own segment events, so its trace is not event-for-event the
//! recorded one: the page draws every curve against the fraction of its own trace, and
//! marks the first OOM at its recorded trace index.

use fragscope_alloc::AllocatorConfig;
use fragscope_diagnose::analyze::Analysis;
use fragscope_diagnose::recommend::candidates;
use fragscope_replay::{recorded_config, simulate_with, SimOptions};
use fragscope_snapshot::Snapshot;
use fragscope_trace::timeline::{timeline, TimelineOptions};
use serde::Serialize;

use crate::encode;

/// Points per what-if curve.
const POINTS: usize = 1024;

/// One replayed configuration.
#[derive(Serialize)]
pub struct WhatIfCurve {
    /// `"recorded"` or the option changed (as `analyze` names it).
    pub setting: String,
    pub peak_reserved_bytes: u64,
    /// Trace index (of the recorded trace) of the first request the replay could not serve.
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
    if !r.measured || r.baseline.is_none() {
        return Vec::new();
    }
    let recorded = recorded_config(snap);
    let mut configs: Vec<(String, AllocatorConfig)> = vec![("recorded".into(), recorded.clone())];
    for c in candidates(&recorded, &r.era) {
        if r.tried.iter().any(|t| t.setting == c.setting) {
            configs.push((c.setting, c.config));
        }
    }
    let opts = SimOptions { capacity: r.capacity_bytes, collect_snapshot: true, ..SimOptions::default() };
    configs
        .into_iter()
        .filter_map(|(setting, cfg)| {
            let w = simulate_with(snap, device, cfg, &opts);
            let sim = w.snapshot?;
            let t = timeline(&sim, device, &TimelineOptions { points: POINTS });
            let n = t.events.max(1) as f64;
            let x: Vec<f64> = t.series.iter().map(|p| p.first_event.map_or(0.0, |e| (e + 1) as f64 / n)).collect();
            let reserved: Vec<f64> = t.series.iter().map(|p| p.max.reserved as f64).collect();
            Some(WhatIfCurve {
                setting,
                peak_reserved_bytes: w.peak_reserved,
                first_oom_index: w.first_oom.map(|o| o.index),
                x: encode::f64s(&x),
                reserved: encode::f64s(&reserved),
            })
        })
        .collect()
}
