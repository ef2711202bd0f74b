//! `state`: the allocator state at one moment of the recording and who holds the memory
//! then ([`StateRequest`] → [`StateOut`], `fragscope.state/1`).
//!
//! The state (segments, free blocks per stream and pool, the largest free block) is
//! rebuilt by the backward walk from the recorded final state over the entries after the
//! moment ([`fragscope_diagnose::allocator_state_at`]): a reading of the recording,
//! not a replay. The holders are the blocks allocated at that moment
//! ([`fragscope_trace::live_at`]), grouped by the innermost user frame of
//! their allocation stack ([`HoldersBy::Site`]), by the innermost `record_function` scope
//! open when they were allocated ([`HoldersBy::Annotation`]), by what they are for
//! ([`HoldersBy::Role`]: parameters, gradients, ... as [`fragscope_trace::classify_roles`]
//! classifies each block from its phase and lifetime in the trace), or by the
//! `compile_context` or `user_metadata` string of their `alloc` entry
//! ([`HoldersBy::CompileContext`], [`HoldersBy::UserMetadata`]).

use fragscope_diagnose::{allocator_state_at, state_figures, StateFigures, WindowBound, WindowSpec};
use fragscope_snapshot::{Action, Snapshot};
use fragscope_trace::{bytes_by_site, context_key, live_at, ContextField};
use serde::Serialize;

use crate::{msg, Error, Param};

pub const SCHEMA: &str = "fragscope.state/1";

/// How the holders are grouped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HoldersBy {
    /// The innermost user frame of the allocation stack.
    #[default]
    Site,
    /// The innermost `record_function` scope open at the allocation.
    Annotation,
    /// What the block is for (parameters, gradients, ...).
    Role,
    /// The `compile_context` of the allocation (the `torch.compile` region it was made in).
    CompileContext,
    /// The `user_metadata` of the allocation (`torch.cuda.memory._set_memory_metadata`).
    UserMetadata,
}

impl HoldersBy {
    /// Every grouping, as users name them.
    pub const NAMES: [&'static str; 5] = ["site", "annotation", "role", "compile_context", "user_metadata"];

    /// The grouping's name (`site`, `annotation`, `role`).
    pub fn as_str(self) -> &'static str {
        match self {
            HoldersBy::Site => "site",
            HoldersBy::Annotation => "annotation",
            HoldersBy::Role => "role",
            HoldersBy::CompileContext => "compile_context",
            HoldersBy::UserMetadata => "user_metadata",
        }
    }

    /// The grouping named `s`.
    pub fn parse(s: &str) -> Result<HoldersBy, Error> {
        match s {
            "site" => Ok(HoldersBy::Site),
            "annotation" => Ok(HoldersBy::Annotation),
            "role" => Ok(HoldersBy::Role),
            "compile_context" => Ok(HoldersBy::CompileContext),
            "user_metadata" => Ok(HoldersBy::UserMetadata),
            _ => Err(Error::argument(msg![format!(
                "by={s:?}: one of site, annotation, role, compile_context, user_metadata"
            )])),
        }
    }
}

/// The moment and the grouping.
#[derive(Debug, Clone)]
pub struct StateRequest {
    /// The state after trace entry N (0-based). Default: the OOM entry on a file with an OOM
    /// (when no device is given), else the end of the trace.
    pub at: Option<usize>,
    /// A time since the first trace entry (`12.5s`, `300ms`, `50us`): after the last entry
    /// at or before it.
    pub time: Option<String>,
    /// Device (default: the OOM's device when the file has one, else the first with a trace;
    /// see [`default_device`]).
    pub device: Option<i64>,
    pub by: HoldersBy,
    /// Holders listed (the rest is summed).
    pub top: usize,
}

impl Default for StateRequest {
    fn default() -> Self {
        StateRequest { at: None, time: None, device: None, by: HoldersBy::Site, top: 10 }
    }
}

#[derive(Serialize)]
pub struct Holder {
    pub key: String,
    pub bytes: u64,
    pub blocks: u64,
    pub share: f64,
}

#[derive(Serialize)]
pub struct StateOut {
    pub schema: &'static str,
    pub file: String,
    pub device: i64,
    /// The state is after this entry; `null` = before the first entry.
    pub after_event: Option<usize>,
    pub trace_entries: usize,
    pub time_us: Option<i64>,
    /// Seconds since the first trace entry of the file.
    pub time_s: Option<f64>,
    /// How the figures were obtained.
    pub method: &'static str,
    pub state: StateFigures,
    pub holders_by: String,
    /// Bytes of the allocated blocks at that moment (the holders' total).
    pub holders_total_bytes: u64,
    pub holders: Vec<Holder>,
    /// Bytes of the holders past `--top`.
    pub other_bytes: u64,
    /// Each pool's band at that moment (the default pools first) when a private pool (CUDA
    /// graph, `MemPool`) holds segments; absent otherwise.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub pools: Vec<fragscope_replay::PoolBand>,
    /// Why this device and moment, when the request named no device and the file's OOM
    /// chose them ([`default_device`]); absent when the request chose them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub choice: Option<String>,
    /// How the file was recorded, one line each (`notes.recording` of the snapshot: actions
    /// `skip_actions` left out and what was restored, one pool only); absent when nothing.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub recording: Vec<String>,
    /// Pinned host memory in the final state (`host_segments`, CPU RAM), apart from the
    /// device's figures; absent when the file has none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<fragscope_trace::HostSummary>,
}

/// The state of `snap` at the moment `req` names.
pub fn state(name: &str, snap: &fragscope_snapshot::Snapshot, req: &StateRequest) -> Result<StateOut, Error> {
    let (device, oom_default, choice) = match req.device {
        Some(d) => (d, None, None),
        None => default_device(snap, req).ok_or_else(|| {
            // The recording notes say why (history never switched on, alloc entries skipped).
            let why = snap.notes.recording.first().map_or(String::new(), |l| format!(" ({l})"));
            Error::input(format!("{name}: no device has a trace{why}"))
        })?,
    };
    let trace = snap.trace(device);
    if trace.is_empty() {
        // The recording notes say why (history never switched on, alloc entries skipped).
        let why = snap.notes.recording.first().map_or(String::new(), |l| format!(" ({l})"));
        return Err(Error::input(format!("{name}: device {device} has no trace{why}")));
    }
    if req.at.is_some() && req.time.is_some() {
        return Err(Error::argument(msg!["give ", Param::At, " or ", Param::Time, ", not both"]));
    }
    let t0 = snap.device_traces.iter().filter_map(|t| t.first().and_then(|e| e.time())).min();
    let after: Option<usize> = match (&req.at, &req.time) {
        (Some(n), _) => {
            if *n >= trace.len() {
                return Err(Error::argument(msg![
                    format!("{name}: "),
                    Param::At,
                    format!(
                        " {n} is past the trace of device {device} ({} {})",
                        trace.len(),
                        if trace.len() == 1 { "entry" } else { "entries" }
                    )
                ]));
            }
            Some(*n)
        }
        (None, Some(t)) => {
            let us = match WindowSpec::parse(&format!("..{t}")).map_err(|e| Error::argument(msg![e.to_string()]))?.end {
                Some(WindowBound::TimeUs(us)) => us,
                _ => {
                    return Err(Error::argument(msg![
                        Param::Time,
                        format!(" {t}: give a time with a unit (12.5s, 300ms, 50us)")
                    ]))
                }
            };
            let t0 = t0.ok_or_else(|| Error::input(format!("{name}: the trace records no time_us")))?;
            let k = trace.partition_point(|e| e.time_us <= t0.saturating_add(us));
            k.checked_sub(1)
        }
        (None, None) => Some(oom_default.unwrap_or(trace.len() - 1)),
    };
    let st = allocator_state_at(snap, device, after)
        .map_err(|e| Error::input(format!("{name}: the state at that moment cannot be rebuilt: {e}")))?;
    let figures = state_figures(&st, None);
    let pools = st.pool_bands();
    let live = live_at(snap, device, after);
    let total: u64 = live.iter().map(|b| b.size).sum();
    let mut rows: Vec<Holder> = if req.by == HoldersBy::Site {
        bytes_by_site(snap, &live)
            .into_iter()
            .map(|s| Holder { key: s.site.site, bytes: s.bytes, blocks: s.blocks, share: s.share })
            .collect()
    } else if req.by == HoldersBy::Role {
        holders_by_role(snap, device, after, total)
    } else {
        // Grouped by a string of the allocation: its annotation scope, compile context or
        // user metadata.
        let key = |b: &fragscope_trace::LiveBlock| match req.by {
            HoldersBy::CompileContext => context_key(snap, device, b.alloc_event, ContextField::CompileContext),
            HoldersBy::UserMetadata => context_key(snap, device, b.alloc_event, ContextField::UserMetadata),
            _ => b.annotation.clone().unwrap_or_else(|| "(no annotation)".into()),
        };
        let mut m: std::collections::BTreeMap<String, (u64, u64)> = Default::default();
        for b in &live {
            let e = m.entry(key(b)).or_default();
            e.0 += b.size;
            e.1 += 1;
        }
        let mut v: Vec<Holder> = m
            .into_iter()
            .map(|(key, (bytes, blocks))| Holder {
                key,
                bytes,
                blocks,
                share: if total > 0 { bytes as f64 / total as f64 } else { 0.0 },
            })
            .collect();
        v.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.key.cmp(&b.key)));
        v
    };
    let other_bytes = rows.iter().skip(req.top).map(|h| h.bytes).sum();
    rows.truncate(req.top);
    let time_us = after.and_then(|i| trace[i].time());
    Ok(StateOut {
        schema: SCHEMA,
        file: name.to_string(),
        device,
        after_event: after,
        trace_entries: trace.len(),
        time_us,
        time_s: time_us.zip(t0).map(|(t, z)| (t - z) as f64 / 1e6),
        method: if req.by == HoldersBy::Role {
            "recording: backward walk from the recorded final state (no replay); roles from each block's \
             phase and lifetime in the trace (summary's roles)"
        } else {
            "recording: backward walk from the recorded final state (no replay)"
        },
        state: figures,
        holders_by: req.by.as_str().to_string(),
        holders_total_bytes: total,
        holders: rows,
        other_bytes,
        pools,
        choice,
        recording: snap.notes.recording.clone(),
        host: fragscope_trace::host_summary(snap),
    })
}

/// The device (and, with neither `at` nor `time`, the moment) a request without a device
/// means, and why, in words: the OOM first, as every surface leads with it.
///
/// * With `at` = N: the device whose entry N is an `oom` entry (the entry `analyze` names);
///   else the file's OOM device when its trace reaches N; else the first device whose trace
///   does (the first with a trace when none does: the range error names it).
/// * With `time`: the file's OOM device, else the first device with a trace.
/// * With neither: on a file with an OOM, its device and the OOM entry (the state the failed
///   request saw); else the first device with a trace, at its end.
fn default_device(snap: &Snapshot, req: &StateRequest) -> Option<(i64, Option<usize>, Option<String>)> {
    let with_trace: Vec<i64> = snap.devices().into_iter().filter(|&d| !snap.trace(d).is_empty()).collect();
    let first = *with_trace.first()?;
    let oom = fragscope_diagnose::first_oom(snap);
    let several = with_trace.len() > 1;
    Some(match (req.at, &req.time, oom) {
        (Some(n), _, _) => {
            let is_oom = |d: i64| snap.trace(d).get(n).is_some_and(|e| e.action == Action::Oom);
            if let Some(d) = with_trace.iter().copied().find(|&d| is_oom(d)) {
                let why = several.then(|| format!("device {d}: its entry {n} is the OOM (--device to choose another)"));
                (d, None, why)
            } else if let Some((d, _)) = oom.filter(|&(d, _)| n < snap.trace(d).len()) {
                (d, None, several.then(|| format!("device {d}, the device of the OOM (--device to choose another)")))
            } else {
                (with_trace.iter().copied().find(|&d| n < snap.trace(d).len()).unwrap_or(first), None, None)
            }
        }
        (None, Some(_), Some((d, _))) => {
            (d, None, several.then(|| format!("device {d}, the device of the OOM (--device to choose another)")))
        }
        (None, None, Some((d, i))) => (
            d,
            Some(i),
            Some(format!(
                "the moment of the OOM: device {d}, trace entry {i}, the state the failed request saw \
                 (--at N or --time T for another moment)"
            )),
        ),
        _ => (first, None, None),
    })
}

/// Block bytes by role after entry `after` (`None`: before the first), from the block
/// lives the roles are given on (the same walk as [`live_at`]'s, so the rows sum to
/// `total`); an out-of-place update counts as a temporary until its role begins, as in
/// `summary`'s roles.
fn holders_by_role(snap: &fragscope_snapshot::Snapshot, device: i64, after: Option<usize>, total: u64) -> Vec<Holder> {
    use fragscope_trace::Role;
    let lives = fragscope_trace::BlockLives::replay(snap, device);
    let (_, _, roles) = fragscope_trace::device_roles_with(snap, &lives);
    let s = after.map_or(0, |i| (i + 1).min(snap.trace(device).len()));
    let mut by = [(0u64, 0u64); 7];
    for (b, r) in lives.seeded.iter().zip(&roles.seeded) {
        if b.end >= s {
            by[r.role as usize].0 += b.size;
            by[r.role as usize].1 += 1;
        }
    }
    let k = lives.traced.partition_point(|l| l.alloc() < s);
    for (i, (l, r)) in lives.traced[..k].iter().zip(&roles.traced).enumerate() {
        if l.end() >= s {
            let role = match roles.from_state.get(&i) {
                Some(&f) if s < f => Role::Temporaries,
                _ => r.role,
            };
            by[role as usize].0 += l.size;
            by[role as usize].1 += 1;
        }
    }
    let mut v: Vec<Holder> = Role::ALL
        .iter()
        .map(|&r| (r, by[r as usize]))
        .filter(|(_, (_, n))| *n > 0)
        .map(|(r, (bytes, blocks))| Holder {
            key: r.as_str().to_string(),
            bytes,
            blocks,
            share: if total > 0 { bytes as f64 / total as f64 } else { 0.0 },
        })
        .collect();
    v.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.key.cmp(&b.key)));
    v
}

/// The document (`fragscope.state/1`).
pub fn json(out: &StateOut) -> Result<String, Error> {
    crate::to_json(out)
}
