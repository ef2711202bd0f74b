//! `summary` and `analyze`: the documents of one or several files (`fragscope.summary/1`,
//! `fragscope.analyze/2`), each file with the window it was cut to.

use fragscope_diagnose::{Analysis, OomLead, WindowInfo, ANALYZE_SCHEMA};
use fragscope_snapshot::{Action, Snapshot};
use fragscope_trace::{summarize, Summary, SUMMARY_SCHEMA};
use serde::Serialize;

use crate::{msg, Error, Param};

/// What `summary` says of one file: the figures ([`Summary`]) and, first, the file's OOM.
#[derive(Clone, Debug, Serialize)]
pub struct FileSummary {
    /// The file's first OOM (device, entry, verdict; [`OomLead`]), which `summary` leads
    /// with; `null` without one.
    pub oom: Option<OomLead>,
    #[serde(flatten)]
    pub summary: Summary,
    /// Per device with private pools (CUDA graphs, `MemPool`s) in its final segments, each
    /// pool's band (the default pools first); absent when no segment is in a private pool.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub private_pools: Vec<DevicePools>,
}

/// One device's pools ([`fragscope_replay::RecordedState::pool_bands`]).
#[derive(Clone, Debug, Serialize)]
pub struct DevicePools {
    pub device: i64,
    pub pools: Vec<fragscope_replay::PoolBand>,
}

impl FileSummary {
    /// The summary of `snap`, with its OOM's verdict (the state at the OOM, no replay).
    pub fn of(snap: &Snapshot) -> FileSummary {
        let summary = summarize(snap);
        // The OOM lead (a scan of every device's trace for its first `oom` entry, then the
        // state there) only where the summary's counts of the entries by action, from its
        // lifetime walk, show an `oom` entry: the scan of a 6.9 M-entry trace that has none
        // was 15 ms of CPU for nothing. (On a file with one, the lead comes after the
        // summary rather than beside it.)
        let any_oom = summary.devices.iter().any(|d| d.trace.by_action.contains_key(Action::Oom.as_str()));
        let oom = if any_oom { OomLead::of_file(snap) } else { None };
        let any_private = snap.segments.iter().any(|s| s.segment_pool_id.is_some_and(|p| p != (0, 0)));
        let private_pools = summary
            .devices
            .iter()
            .filter(|_| any_private)
            .filter_map(|d| {
                let pools = fragscope_replay::RecordedState::from_snapshot(snap, d.device).pool_bands();
                (!pools.is_empty()).then_some(DevicePools { device: d.device, pools })
            })
            .collect();
        FileSummary { oom, summary, private_pools }
    }
}

#[derive(Serialize)]
struct SummaryOut<'a> {
    schema: &'static str,
    files: Vec<SummaryFile<'a>>,
}

#[derive(Serialize)]
struct SummaryFile<'a> {
    /// The path as given, or `"<built-in example>"`.
    file: String,
    /// True for the example snapshot shipped with fragscope.
    example: bool,
    /// What the figures cover when a window was given (`null`: the whole file).
    window: Option<&'a WindowInfo>,
    #[serde(flatten)]
    summary: &'a FileSummary,
}

/// The summary document of `(file name, is the built-in example, summary)` per file, with
/// the window each was cut to (`windows[i]` for `results[i]`; missing or `None`: the whole
/// file).
pub fn summary_json(results: &[(String, bool, FileSummary)], windows: &[Option<WindowInfo>]) -> Result<String, Error> {
    let out = SummaryOut {
        schema: SUMMARY_SCHEMA,
        files: results
            .iter()
            .enumerate()
            .map(|(i, (file, example, s))| SummaryFile {
                file: file.clone(),
                example: *example,
                window: windows.get(i).and_then(|w| w.as_ref()),
                summary: s,
            })
            .collect(),
    };
    crate::to_json(&out)
}

#[derive(Serialize)]
struct AnalyzeOut<'a> {
    schema: &'static str,
    files: Vec<AnalyzeFile<'a>>,
}

#[derive(Serialize)]
struct AnalyzeFile<'a> {
    file: String,
    /// What the figures cover when a window was given (`null`: the whole file).
    window: Option<&'a WindowInfo>,
    #[serde(flatten)]
    analysis: &'a Analysis,
}

/// The largest `top` an analysis lists per table.
pub const MAX_TOP: u64 = 1000;

/// `top` checked (1..=[`MAX_TOP`]): call sites, scopes and leak suspects listed per table.
pub fn check_top(top: i64) -> Result<usize, Error> {
    if (1..=MAX_TOP as i64).contains(&top) {
        Ok(top as usize)
    } else {
        Err(Error::argument(msg![Param::Top, format!("={top}: it must be in 1..={MAX_TOP}")]))
    }
}

/// The analysis document of `(file name, analysis)` per file, with the window each was cut
/// to (`windows[i]` for `results[i]`).
pub fn analyze_json(results: &[(String, Analysis)], windows: &[Option<WindowInfo>]) -> Result<String, Error> {
    let out = AnalyzeOut {
        schema: ANALYZE_SCHEMA,
        files: results
            .iter()
            .enumerate()
            .map(|(i, (file, a))| AnalyzeFile {
                file: file.clone(),
                window: windows.get(i).and_then(|w| w.as_ref()),
                analysis: a,
            })
            .collect(),
    };
    crate::to_json(&out)
}
