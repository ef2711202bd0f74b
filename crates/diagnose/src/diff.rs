//! Two snapshots side by side: peak allocated / reserved / fragmentation per device, and
//! the call sites whose live bytes at the allocated peak changed most, so "why does run
//! B need 3 GiB more" has an answer.
//!
//! Devices are matched by ordinal; when each file has exactly one device they are
//! matched whatever their ordinals (a run moved from `cuda:0` to `cuda:1`). Sites are
//! matched by their `file:line:function` text (the frame tables of two files are
//! unrelated). Figures come from [`fragscope_trace::timeline`] and [`fragscope_trace::attribute`]:
//! peak allocated as `memory_stats()` counts block bytes (docs/glossary.md); the sites' bytes
//! are the blocks live at the peak's moment at the trace's sizes, so their deltas add up to
//! the delta of the curves' maxima, which can be below the peaks by the unsplit remainders.

use std::collections::BTreeMap;

use fragscope_snapshot::Snapshot;
use serde::Serialize;

use fragscope_trace::{bytes_by_site, live_at, timelines, DeviceTimeline, Site, TimelineOptions};

/// Peak figures of one side.
#[derive(Clone, Debug, Serialize)]
pub struct Figures {
    pub device: i64,
    pub events: usize,
    pub history_complete: bool,
    pub peak_allocated: u64,
    pub peak_reserved: u64,
    pub peak_fragmentation: Option<f64>,
}

impl Figures {
    fn of(tl: &DeviceTimeline) -> Self {
        Figures {
            device: tl.device,
            events: tl.events,
            history_complete: tl.history_complete,
            peak_allocated: tl.peak_allocated.bytes,
            peak_reserved: tl.peak_reserved.bytes,
            peak_fragmentation: tl.peak_fragmentation,
        }
    }
}

/// B − A.
#[derive(Clone, Debug, Serialize)]
pub struct Delta {
    pub peak_allocated: i64,
    pub peak_reserved: i64,
    pub peak_fragmentation: Option<f64>,
}

/// Live bytes of one site at each side's allocated peak.
#[derive(Clone, Debug, Serialize)]
pub struct SiteDelta {
    #[serde(flatten)]
    pub site: Site,
    pub bytes_a: u64,
    pub bytes_b: u64,
    /// `bytes_b − bytes_a`.
    pub delta: i64,
    pub blocks_a: u64,
    pub blocks_b: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct DeviceDiff {
    pub a: Figures,
    pub b: Figures,
    pub delta: Delta,
    /// Top sites by |delta|, largest first.
    pub sites: Vec<SiteDelta>,
    /// Sum of the deltas not listed.
    pub other_sites_delta: i64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Diff {
    pub devices: Vec<DeviceDiff>,
    /// Devices of A / B with no counterpart.
    pub only_in_a: Vec<i64>,
    pub only_in_b: Vec<i64>,
}

/// Options of [`diff`].
#[derive(Clone, Copy, Debug)]
pub struct DiffOptions {
    pub top: usize,
}

impl Default for DiffOptions {
    fn default() -> Self {
        DiffOptions { top: 10 }
    }
}

fn i(x: u64) -> i64 {
    i64::try_from(x).unwrap_or(i64::MAX)
}

/// One device pair.
pub(crate) fn diff_device(
    a: &Snapshot,
    ta: &DeviceTimeline,
    b: &Snapshot,
    tb: &DeviceTimeline,
    opts: &DiffOptions,
) -> DeviceDiff {
    let la = live_at(a, ta.device, ta.peak_allocated.event_index);
    let lb = live_at(b, tb.device, tb.peak_allocated.event_index);
    let mut m: BTreeMap<String, SiteDelta> = BTreeMap::new();
    for (side, list) in [(0, bytes_by_site(a, &la)), (1, bytes_by_site(b, &lb))] {
        for s in list {
            let e = m.entry(s.site.site.clone()).or_insert_with(|| SiteDelta {
                site: s.site.clone(),
                bytes_a: 0,
                bytes_b: 0,
                delta: 0,
                blocks_a: 0,
                blocks_b: 0,
            });
            if side == 0 {
                e.bytes_a += s.bytes;
                e.blocks_a += s.blocks;
            } else {
                e.bytes_b += s.bytes;
                e.blocks_b += s.blocks;
                // B's stack is the one the user is looking at now.
                e.site = s.site;
            }
        }
    }
    let mut sites: Vec<SiteDelta> = m
        .into_values()
        .map(|mut s| {
            s.delta = i(s.bytes_b) - i(s.bytes_a);
            s
        })
        .filter(|s| s.delta != 0)
        .collect();
    sites.sort_by(|x, y| {
        y.delta.unsigned_abs().cmp(&x.delta.unsigned_abs()).then_with(|| x.site.site.cmp(&y.site.site))
    });
    let rest: i64 = sites.iter().skip(opts.top).map(|s| s.delta).sum();
    sites.truncate(opts.top);
    let (fa, fb) = (Figures::of(ta), Figures::of(tb));
    DeviceDiff {
        delta: Delta {
            peak_allocated: i(fb.peak_allocated) - i(fa.peak_allocated),
            peak_reserved: i(fb.peak_reserved) - i(fa.peak_reserved),
            peak_fragmentation: fa.peak_fragmentation.zip(fb.peak_fragmentation).map(|(x, y)| y - x),
        },
        a: fa,
        b: fb,
        sites,
        other_sites_delta: rest,
    }
}

/// Compares two snapshots (module doc).
pub fn diff(a: &Snapshot, b: &Snapshot, opts: &DiffOptions) -> Diff {
    let o = TimelineOptions { points: 1 };
    let ta = timelines(a, &o);
    let tb = timelines(b, &o);
    let mut devices = Vec::new();
    let (mut only_a, mut only_b) = (Vec::new(), Vec::new());
    if ta.len() == 1 && tb.len() == 1 {
        devices.push(diff_device(a, &ta[0], b, &tb[0], opts));
    } else {
        for x in &ta {
            match tb.iter().find(|y| y.device == x.device) {
                Some(y) => devices.push(diff_device(a, x, b, y, opts)),
                None => only_a.push(x.device),
            }
        }
        only_b = tb.iter().filter(|y| !ta.iter().any(|x| x.device == y.device)).map(|y| y.device).collect();
    }
    Diff { devices, only_in_a: only_a, only_in_b: only_b }
}
