//! `fragscope state FILE [--at N | --time T] [--by site|annotation|role] [--json]`: the
//! allocator state at one moment of the recording and who holds the memory then.
//!
//! The state (segments, free blocks per stream and pool, the largest free block) is
//! rebuilt by the backward walk from the recorded final state over the entries after the
//! moment ([`fragscope_diagnose::oom::allocator_state_at`]): a reading of the recording,
//! not a replay. The holders are the blocks allocated at that moment
//! ([`fragscope_trace::timeline::live_at`]), grouped by the innermost user frame of
//! their allocation stack (`site`), by the innermost `record_function` scope open when
//! they were allocated (`annotation`), or by what they are for (`role`: parameters,
//! gradients, ... as [`fragscope_trace::roles`] classifies each block from its phase
//! and lifetime in the trace).

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use fragscope_diagnose::oom::{allocator_state_at, state_figures, StateFigures};
use fragscope_diagnose::window::{Bound, WindowSpec};
use fragscope_trace::attribution::bytes_by_site;
use fragscope_trace::timeline::live_at;
use serde::Serialize;

use crate::output::bytes;
use crate::{input, CliError};

pub const SCHEMA: &str = "fragscope.state/1";

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Snapshot file. Without FILE: the built-in example snapshot.
    pub file: Option<PathBuf>,
    /// The state after trace entry N (0-based). Default: the end of the trace.
    #[arg(long, value_name = "N", conflicts_with = "time")]
    pub at: Option<usize>,
    /// The state at a time since the first trace entry (`12.5s`, `300ms`, `50us`): after
    /// the last entry at or before it.
    #[arg(long, value_name = "T")]
    pub time: Option<String>,
    /// Device (default: the first with a trace).
    #[arg(long)]
    pub device: Option<i64>,
    /// Group the holders by `site` (innermost user frame), `annotation` (innermost
    /// record_function scope at the allocation) or `role` (parameters, gradients,
    /// optimizer_state, activations, temporaries, inputs, other; from the trace).
    #[arg(long, default_value = "site", value_parser = ["site", "annotation", "role"])]
    pub by: String,
    /// Holders listed (the rest is summed).
    #[arg(long, default_value_t = 10)]
    pub top: usize,
    /// Print JSON (schema `fragscope.state/1`, docs/json-schema.md).
    #[arg(long)]
    pub json: bool,
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
}

pub fn run(args: &Args) -> Result<ExitCode, CliError> {
    let (name, snap) = match &args.file {
        Some(p) => (p.display().to_string(), input::load(p, args.json)?),
        None => (input::EXAMPLE_NAME.to_string(), crate::example::snapshot()),
    };
    let out = state(&name, &snap, args)?;
    let text = if args.json { crate::output::json_text(&out)? } else { render_text(&out) };
    crate::print_stdout(&text)?;
    Ok(ExitCode::SUCCESS)
}

/// The state of `snap` at the moment `args` names.
pub fn state(name: &str, snap: &fragscope_snapshot::Snapshot, args: &Args) -> Result<StateOut, CliError> {
    let device = match args.device {
        Some(d) => d,
        None => snap
            .devices()
            .into_iter()
            .find(|&d| !snap.trace(d).is_empty())
            .ok_or_else(|| CliError::usage(format!("{name}: no device has a trace")))?,
    };
    let trace = snap.trace(device);
    if trace.is_empty() {
        return Err(CliError::usage(format!("{name}: device {device} has no trace")));
    }
    let t0 = snap.device_traces.iter().filter_map(|t| t.first().and_then(|e| e.time())).min();
    let after: Option<usize> = match (&args.at, &args.time) {
        (Some(n), _) => {
            if *n >= trace.len() {
                return Err(CliError::usage(format!(
                    "{name}: --at {n} is past the trace of device {device} ({} entries)",
                    trace.len()
                )));
            }
            Some(*n)
        }
        (None, Some(t)) => {
            let us = match WindowSpec::parse(&format!("..{t}")).map_err(CliError::usage)?.end {
                Some(Bound::TimeUs(us)) => us,
                _ => return Err(CliError::usage(format!("--time {t}: give a time with a unit (12.5s, 300ms, 50us)"))),
            };
            let t0 = t0.ok_or_else(|| CliError::usage(format!("{name}: the trace records no time_us")))?;
            let k = trace.partition_point(|e| e.time_us <= t0.saturating_add(us));
            k.checked_sub(1)
        }
        (None, None) => Some(trace.len() - 1),
    };
    let st = allocator_state_at(snap, device, after)
        .map_err(|e| CliError::usage(format!("{name}: the state at that moment cannot be rebuilt: {e}")))?;
    let figures = state_figures(&st, None);
    let live = live_at(snap, device, after);
    let total: u64 = live.iter().map(|b| b.size).sum();
    let mut rows: Vec<Holder> = if args.by == "site" {
        bytes_by_site(snap, &live)
            .into_iter()
            .map(|s| Holder { key: s.site.site, bytes: s.bytes, blocks: s.blocks, share: s.share })
            .collect()
    } else if args.by == "role" {
        holders_by_role(snap, device, after, total)
    } else {
        let mut m: std::collections::BTreeMap<String, (u64, u64)> = Default::default();
        for b in &live {
            let e = m.entry(b.annotation.clone().unwrap_or_else(|| "(no annotation)".into())).or_default();
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
    let other_bytes = rows.iter().skip(args.top).map(|h| h.bytes).sum();
    rows.truncate(args.top);
    let time_us = after.and_then(|i| trace[i].time());
    Ok(StateOut {
        schema: SCHEMA,
        file: name.to_string(),
        device,
        after_event: after,
        trace_entries: trace.len(),
        time_us,
        time_s: time_us.zip(t0).map(|(t, z)| (t - z) as f64 / 1e6),
        method: if args.by == "role" {
            "recording: backward walk from the recorded final state (no replay); roles from each block's \
             phase and lifetime in the trace (summary's roles)"
        } else {
            "recording: backward walk from the recorded final state (no replay)"
        },
        state: figures,
        holders_by: args.by.clone(),
        holders_total_bytes: total,
        holders: rows,
        other_bytes,
    })
}

/// Block bytes by role after entry `after` (`None`: before the first), from the block
/// lives the roles are given on (the same walk as [`live_at`]'s, so the rows sum to
/// `total`); an out-of-place update counts as a temporary until its role begins, as in
/// `summary`'s roles.
fn holders_by_role(snap: &fragscope_snapshot::Snapshot, device: i64, after: Option<usize>, total: u64) -> Vec<Holder> {
    use fragscope_trace::roles::Role;
    let lives = fragscope_trace::lives::BlockLives::replay(snap, device);
    let (_, _, roles) = fragscope_trace::roles::device_roles_with(snap, &lives);
    let s = after.map_or(0, |i| (i + 1).min(snap.trace(device).len()));
    let mut by = [(0u64, 0u64); 7];
    for (b, r) in lives.seeded.iter().zip(&roles.seeded) {
        if b.end >= s {
            by[r.role as usize].0 += b.size;
            by[r.role as usize].1 += 1;
        }
    }
    let k = lives.traced.partition_point(|l| l.alloc < s);
    for (i, (l, r)) in lives.traced[..k].iter().zip(&roles.traced).enumerate() {
        if l.end >= s {
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

fn render_text(o: &StateOut) -> String {
    let mut s = String::new();
    let at = o.after_event.map_or("before the first trace entry".to_string(), |i| format!("after trace entry {i}"));
    let when = o.time_s.map_or(String::new(), |t| format!(", {t:.3} s after the first entry"));
    let _ = writeln!(s, "Allocator state of {} device {}, {at}{when} ({}):", o.file, o.device, o.method);
    let f = &o.state;
    let _ = writeln!(s, "  Reserved           {}", bytes(f.reserved_bytes));
    let _ = writeln!(s, "  Allocated          {}", bytes(f.allocated_bytes));
    let _ = writeln!(s, "  Cached free        {}", bytes(f.cached_free_bytes));
    let _ = writeln!(s, "  Largest free block {}", bytes(f.largest_free_block_bytes));
    if let Some(fr) = f.free_space_fragmentation {
        let _ = writeln!(s, "  Free-space fragmentation {:.1}%", fr * 100.0);
    }
    let _ = writeln!(s, "\nWho holds the {} allocated (by {}):", bytes(o.holders_total_bytes), o.holders_by);
    for h in &o.holders {
        let _ = writeln!(s, "  {:>12}  {:>5.1}%  {:>6} blocks  {}", bytes(h.bytes), h.share * 100.0, h.blocks, h.key);
    }
    if o.other_bytes > 0 {
        let _ = writeln!(s, "  {:>12}  (the rest)", bytes(o.other_bytes));
    }
    s
}
