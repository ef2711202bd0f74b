//! `fragscope state FILE [--at N | --time T] [--by site|annotation|role|compile_context|user_metadata]
//! [--json]`: the
//! allocator state at one moment of the recording and who holds the memory then.
//!
//! The figures and the holders are [`fragscope_commands::state`]'s; this is the clap
//! arguments and the text.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use fragscope_commands::input;
use fragscope_commands::state::{state, HoldersBy, StateOut, StateRequest};

use crate::output::bytes;
use crate::CliError;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Snapshot file. Without FILE: the built-in example snapshot.
    pub file: Option<PathBuf>,
    /// The state after trace entry N (0-based). Default: on a file with an OOM (and no
    /// --device), the OOM entry on its device; else the end of the trace.
    #[arg(long, value_name = "N", conflicts_with = "time")]
    pub at: Option<usize>,
    /// The state at a time since the first trace entry (`12.5s`, `300ms`, `50us`): after
    /// the last entry at or before it.
    #[arg(long, value_name = "T")]
    pub time: Option<String>,
    /// Device (default: with --at N, the device whose entry N is the OOM; else the OOM's
    /// device; else the first with a trace).
    #[arg(long)]
    pub device: Option<i64>,
    /// Group the holders by `site` (innermost user frame), `annotation` (innermost
    /// record_function scope at the allocation), `role` (parameters, gradients,
    /// optimizer_state, activations, temporaries, inputs, other; from the trace),
    /// `compile_context` (the torch.compile region of the allocation) or `user_metadata`
    /// (the string set with torch.cuda.memory._set_memory_metadata).
    #[arg(long, default_value = "site", value_parser = HoldersBy::NAMES)]
    pub by: String,
    /// Holders listed (the rest is summed).
    #[arg(long, default_value_t = 10)]
    pub top: usize,
    /// Print JSON (schema `fragscope.state/1`, docs/json-schema.md).
    #[arg(long)]
    pub json: bool,
}

impl Args {
    /// The library's request (clap has checked `--by`).
    pub fn request(&self) -> Result<StateRequest, CliError> {
        Ok(StateRequest {
            at: self.at,
            time: self.time.clone(),
            device: self.device,
            by: HoldersBy::parse(&self.by)?,
            top: self.top,
        })
    }
}

pub fn run(args: &Args) -> Result<ExitCode, CliError> {
    let req = args.request()?;
    let (name, snap) = match &args.file {
        Some(p) => (p.display().to_string(), input::load(p, args.json)?),
        None => (input::EXAMPLE_NAME.to_string(), fragscope_commands::example::snapshot()),
    };
    let out = state(&name, &snap, &req)?;
    let text = if args.json { fragscope_commands::state::json(&out)? } else { render_text(&out) };
    crate::print_stdout(&text)?;
    Ok(ExitCode::SUCCESS)
}

fn render_text(o: &StateOut) -> String {
    let mut s = String::new();
    for l in &o.recording {
        let _ = writeln!(s, "Recording: {l}");
    }
    let at = o.after_event.map_or("before the first trace entry".to_string(), |i| format!("after trace entry {i}"));
    let when = o.time_s.map_or(String::new(), |t| format!(", {t:.3} s after the first entry"));
    if let Some(c) = &o.choice {
        let _ = writeln!(s, "Showing {c}.");
    }
    let _ = writeln!(s, "Allocator state of {} device {}, {at}{when} ({}):", o.file, o.device, o.method);
    let f = &o.state;
    let _ = writeln!(s, "  Reserved           {}", bytes(f.reserved_bytes));
    let _ = writeln!(s, "  Allocated          {}", bytes(f.allocated_bytes));
    let _ = writeln!(s, "  Cached free        {}", bytes(f.cached_free_bytes));
    let _ = writeln!(s, "  Largest free block {}", bytes(f.largest_free_block_bytes));
    if let Some(fr) = f.free_space_fragmentation {
        // Of the cached free bytes only (docs/glossary.md): beside an exhaustion with little
        // cached, a bare percentage reads as a diagnosis.
        let _ = writeln!(
            s,
            "  Free-space fragmentation {:.1}% (of the {} cached free: 1 − largest free block / cached free)",
            fr * 100.0,
            bytes(f.cached_free_bytes)
        );
    }
    s.push_str(&pool_bands_text(&o.pools));
    let _ = writeln!(s, "\nWho holds the {} allocated (by {}):", bytes(o.holders_total_bytes), o.holders_by);
    for h in &o.holders {
        let _ = writeln!(
            s,
            "  {:>12}  {:>5.1}%  {:>6} {:<6}  {}",
            bytes(h.bytes),
            h.share * 100.0,
            h.blocks,
            if h.blocks == 1 { "block" } else { "blocks" },
            h.key
        );
    }
    if o.other_bytes > 0 {
        let _ = writeln!(s, "  {:>12}  (the rest)", bytes(o.other_bytes));
    }
    if let Some(h) = &o.host {
        // CPU RAM: said apart, never added to the device's figures.
        let _ = writeln!(
            s,
            "\nPinned host memory at the end of the recording (host_segments, CPU RAM, not in the figures above):\n  \
             {} pinned, {} in use, {} cached free",
            bytes(h.reserved_bytes),
            bytes(h.allocated_bytes),
            bytes(h.cached_free_bytes)
        );
    }
    s
}

/// One line per memory pool when a private pool (CUDA graph, `MemPool`) holds segments
/// (empty otherwise): a private pool's free blocks serve only its own requests, so its
/// cached memory is apart from the rest (as `_memory_viz.py`'s private-pool view shows it).
pub(crate) fn pool_bands_text(bands: &[fragscope_replay::PoolBand]) -> String {
    let mut s = String::new();
    if bands.is_empty() {
        return s;
    }
    let _ = writeln!(s, "  By pool (a private pool's free blocks serve only its own requests):");
    for b in bands {
        let name = match b.pool {
            (0, 0) => "default pools".to_string(),
            (g, 0) => format!("pool ({g}, 0), CUDA graph"),
            (0, m) => format!("pool (0, {m}), MemPool"),
            (a, b) => format!("pool ({a}, {b})"),
        };
        let _ = writeln!(
            s,
            "    {name:<26} {:>3} {:<8}  reserved {:>11}  allocated {:>11}  cached free {:>11}  largest free {:>11}",
            b.segments,
            if b.segments == 1 { "segment" } else { "segments" },
            bytes(b.reserved_bytes),
            bytes(b.allocated_bytes),
            bytes(b.cached_free_bytes),
            bytes(b.largest_free_block_bytes)
        );
    }
    s
}
