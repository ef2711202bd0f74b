//! `fragscope analyze FILE [--json] [--top N] [--what-if]`: explain a snapshot: the OOM
//! (verdict, state at the failure, fixes measured by replay), fragmentation over time,
//! leak suspects, who holds the memory at the peaks, and recommended settings.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use fragscope_diagnose::{
    analyze, Analysis, AnalyzeOptions, DeviceAnalysis, OomCapacitySource, OomFinding, WindowInfo,
};
use fragscope_trace::{PeakAttribution, ReservedSource, SeriesPoint};

use crate::output::{bytes, grouped, percent};
use crate::CliError;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Snapshot files (`torch.cuda.memory._dump_snapshot` pickles, optionally gzipped, or
    /// torch.profiler JSON traces).
    /// Without FILE: the built-in example snapshot.
    pub files: Vec<PathBuf>,
    /// Print JSON (schema `fragscope.analyze/2`, see docs/json-schema.md) instead of text.
    #[arg(long)]
    pub json: bool,
    /// Call sites, scopes and leak suspects listed per table.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub top: u64,
    /// Measure recommended settings by replay on every device, not only on devices with an OOM.
    #[arg(long)]
    pub what_if: bool,
    #[command(flatten)]
    pub window: crate::windowed::WindowArg,
}

pub fn run(args: &Args) -> Result<ExitCode, CliError> {
    let opts = AnalyzeOptions { top: args.top as usize, what_if: args.what_if, ..AnalyzeOptions::default() };
    let spec = args.window.spec()?;
    let mut windows: Vec<Option<WindowInfo>> = Vec::new();
    // How each file was recorded (skip_actions, history never on), said before its findings.
    let mut recording: Vec<Vec<String>> = Vec::new();
    let results =
        fragscope_commands::windowed::each_snapshot(&args.files, args.json, spec.as_ref(), |name, snap, w| {
            windows.push(w);
            recording.push(snap.notes.recording.clone());
            Ok::<_, CliError>((name, analyze(snap, &opts)))
        })?;
    let text = if args.json {
        fragscope_commands::summary::analyze_json(&results, &windows)?
    } else {
        let mut s = String::new();
        for (i, (file, a)) in results.iter().enumerate() {
            if i > 0 {
                s.push('\n');
            }
            if let Some(Some(w)) = windows.get(i) {
                s.push_str(&w.line());
                s.push('\n');
            }
            for l in recording.get(i).into_iter().flatten() {
                s.push_str(&format!("Recording: {l}\n"));
            }
            s.push_str(&render_text(file, a));
        }
        s
    };
    crate::print_stdout(&text)?;
    Ok(ExitCode::SUCCESS)
}

const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];

/// One sparkline over `values`, scaled to `max` (shared by the curves so they compare).
pub fn sparkline(values: &[u64], max: u64) -> String {
    values
        .iter()
        .map(|&v| {
            if max == 0 {
                BARS[0]
            } else {
                let k = ((v as f64 / max as f64) * (BARS.len() - 1) as f64).round() as usize;
                BARS[k.min(BARS.len() - 1)]
            }
        })
        .collect()
}

fn ev_at(i: Option<usize>) -> String {
    i.map_or("before the first trace entry".to_string(), |i| format!("after trace entry {i}"))
}

pub fn render_text(file: &str, a: &Analysis) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "fragscope analyze of {file} ({} file, PyTorch {}{})",
        a.format,
        a.era.label,
        match &a.recorded_config {
            Some(c) if !c.is_empty() => format!("; recorded PYTORCH_CUDA_ALLOC_CONF={c}"),
            Some(_) => "; default allocator settings".to_string(),
            None => String::new(),
        }
    );
    if a.devices.is_empty() {
        let _ = writeln!(o, "\nNo device has segments or trace events in this file.");
    }
    o.push_str(&lead_text(file, a));
    // The OOM's device first: it is what the reader came for.
    for d in a.devices_oom_first() {
        o.push('\n');
        o.push_str(&device_text(d));
    }
    o
}

/// `FILE` as a shell word for a command line to paste (single-quoted when it needs to be;
/// nothing for the built-in example, which is what a command without FILE reads), with a
/// space before it.
pub(crate) fn file_arg(file: &str) -> String {
    if file == fragscope_commands::input::EXAMPLE_NAME {
        return String::new();
    }
    let plain = file.chars().all(|c| c.is_ascii_alphanumeric() || "._/+-=:,@".contains(c));
    if plain && !file.is_empty() {
        format!(" {file}")
    } else {
        format!(" '{}'", file.replace('\'', r"'\''"))
    }
}

/// What comes before the devices: the OOM (device, entry, verdict, the next command) and
/// the findings about the file as a whole (device imbalance).
fn lead_text(file: &str, a: &Analysis) -> String {
    let mut o = String::new();
    if let Some(l) = &a.oom {
        let _ = writeln!(o, "\nOOM on device {} at trace entry {}: {}", l.device, l.event_index, l.headline);
        let _ = writeln!(
            o,
            "  Its findings come first (device {}); who held the memory then: fragscope state{} --at {}",
            l.device,
            file_arg(file),
            l.event_index
        );
    }
    if !a.findings.is_empty() {
        let _ = writeln!(o, "\nFindings about the file:");
        for f in &a.findings {
            let _ = writeln!(o, "  [{}] {}", f.severity, f.headline);
        }
    }
    o
}

fn device_text(d: &DeviceAnalysis) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "=== Device {} ===\n", d.device);
    let _ = writeln!(o, "Findings, most important first:");
    if d.findings.is_empty() {
        let _ = writeln!(o, "  (nothing notable)");
    }
    for (i, f) in d.findings.iter().enumerate() {
        let _ = writeln!(o, "  {}. [{}] {}", i + 1, f.severity, f.headline);
    }
    o.push('\n');
    let mut n = 1;
    if let Some(f) = &d.oom {
        let _ = writeln!(o, "{n}. The OOM");
        o.push_str(&oom_text(f));
        o.push('\n');
        n += 1;
    }
    let _ = writeln!(o, "{n}. Fragmentation over time");
    o.push_str(&fragmentation_text(d));
    o.push('\n');
    n += 1;
    let _ = writeln!(o, "{n}. Memory by role");
    o.push_str(&fragscope_trace::roles_text(&d.roles, bytes));
    o.push('\n');
    n += 1;
    let _ = writeln!(o, "{n}. Leak suspects");
    let ls = &d.leak_steps;
    if !ls.can_tell {
        let _ = writeln!(o, "  cannot tell: {}", ls.reason.as_deref().unwrap_or("no training steps"));
    } else if d.leak_suspects.is_empty() {
        let _ = writeln!(
            o,
            "  none: no call site's memory outlives its step and grows across the {} training steps",
            ls.steps
        );
    } else {
        let _ = writeln!(
            o,
            "  over {} training steps: call sites whose memory outlives its step and grows across steps:",
            ls.steps
        );
        for s in &d.leak_suspects {
            let _ = writeln!(
                o,
                "  {:>12}/step  {} → {}  confidence {:.2}  {}",
                bytes(s.growth_bytes_per_step),
                bytes(s.first_bytes),
                bytes(s.last_bytes),
                s.confidence,
                s.site.site
            );
            o.push_str(&leak_evidence(s));
            let _ = writeln!(o, "                 stack: {}", s.site.stack);
        }
    }
    o.push('\n');
    n += 1;
    let _ = writeln!(o, "{n}. The peaks");
    o.push_str(&peak_text("allocated peak", &d.peaks.allocated_peak));
    if d.peaks.reserved_peak.event_index != d.peaks.allocated_peak.event_index {
        o.push_str(&peak_text("reserved peak", &d.peaks.reserved_peak));
    } else {
        let _ = writeln!(o, "  The reserved peak is at the same moment.");
    }
    o.push('\n');
    n += 1;
    let _ = writeln!(o, "{n}. Recommendations");
    o.push_str(&recommend_text(d));
    if let Some(r) = &d.role_what_if {
        o.push_str(&role_rows_text(r));
    }
    o
}

/// The role-level what-ifs: one row per change replayed, or why it cannot be.
fn role_rows_text(r: &fragscope_diagnose::RoleRows) -> String {
    let mut o = String::new();
    let on = r.capacity_bytes.map_or("an unlimited device".to_string(), |c| format!("a {} device", bytes(c)));
    let _ = writeln!(
        o,
        "  If the program changed ({}), on {on}; the recording replayed: peak reserved {}, peak allocated {}{}:",
        r.label,
        bytes(r.recorded_peak_reserved_bytes),
        bytes(r.recorded_peak_allocated_bytes),
        r.recorded_first_oom_index.map_or(String::new(), |i| format!(", OOM at entry {i}"))
    );
    for x in &r.rows {
        match (x.peak_reserved_bytes, x.peak_allocated_bytes) {
            (Some(res), Some(al)) => {
                let oom = match (x.first_oom_index, x.oom_avoided) {
                    (_, Some(true)) => ", the recorded OOM avoided".to_string(),
                    (Some(i), _) => format!(", OOM at entry {i}"),
                    (None, _) => String::new(),
                };
                let _ =
                    writeln!(o, "    {}: peak reserved {}, peak allocated {}{oom}", x.change, bytes(res), bytes(al));
                if let Some(f) = &x.reserved_floor {
                    let _ = writeln!(o, "      ({f})");
                }
                if let Some(w) = &x.cannot_apply {
                    let _ = writeln!(o, "      (not applied: {w})");
                }
            }
            _ => {
                let _ = writeln!(o, "    {}: cannot be applied: {}", x.change, x.cannot_apply.as_deref().unwrap_or(""));
            }
        }
    }
    let _ = writeln!(o, "    Not modelled: {}.", r.not_modelled.join("; "));
    o
}

fn oom_text(f: &OomFinding) -> String {
    let mut o = String::new();
    oom_request_text(&mut o, f);
    oom_state_text(&mut o, f);
    oom_site_text(&mut o, f);
    if let (Some(b), Some(rep)) = (&f.baseline, f.replay_reproduces_oom) {
        oom_fixes_text(&mut o, f, b, rep);
    }
    o
}

/// The OOM's explanation and verdict, then the failing request (size, entry, stream and
/// pool) and the device it failed on (capacity, CUDA's free memory).
fn oom_request_text(o: &mut String, f: &OomFinding) {
    let _ = writeln!(o, "  {}", f.explanation);
    let _ = writeln!(o, "  Verdict                 {}", f.verdict.as_str());
    let _ = writeln!(
        o,
        "  Request                 {} ({} bytes, rounded, as recorded at trace entry {}{}); PyTorch tried to allocate {}",
        bytes(f.request_bytes),
        grouped(f.request_bytes),
        f.event_index,
        if f.oom_entries > 1 { format!(", the first of {} OOMs", f.oom_entries) } else { String::new() },
        bytes(f.alloc_size_bytes)
    );
    let _ = writeln!(
        o,
        "  Stream / pool           stream {}, {} pool{}",
        f.stream,
        f.pool,
        if f.pool_id == (0, 0) { String::new() } else { format!(", private pool ({}, {})", f.pool_id.0, f.pool_id.1) }
    );
    let _ = writeln!(
        o,
        "  Device capacity         {}{}",
        bytes(f.capacity_bytes),
        if f.capacity_source == OomCapacitySource::File {
            " (stated by the file)"
        } else {
            " (estimate: reserved + device free at the OOM; a lower bound)"
        }
    );
    let _ = writeln!(o, "  Device free (CUDA)      {}", bytes(f.device_free_bytes));
}

/// The allocator's state at the OOM: reserved, allocated and cached free bytes, how far
/// over capacity the live set is, and the free space of each stream and pool.
fn oom_state_text(o: &mut String, f: &OomFinding) {
    let s = &f.state;
    let _ = writeln!(o, "  Reserved at the OOM     {}", bytes(s.reserved_bytes));
    let _ = writeln!(
        o,
        "  Allocated at the OOM    {}{}",
        bytes(s.allocated_bytes),
        if s.active_bytes != s.allocated_bytes {
            format!(" (+{} waiting for cross-stream frees)", bytes(s.active_bytes - s.allocated_bytes))
        } else {
            String::new()
        }
    );
    let _ = writeln!(
        o,
        "  Free in the cache       {} (largest free block {})",
        bytes(s.cached_free_bytes),
        bytes(s.largest_free_block_bytes)
    );
    if f.bytes_over_capacity > 0 {
        let _ = writeln!(
            o,
            "  Over capacity by        {} (the live set would have to be this much smaller)",
            bytes(f.bytes_over_capacity)
        );
    }
    if let Some(n) = &f.state_note {
        let _ = writeln!(o, "  Note                    {n}");
    }
    if !s.free_by_stream_pool.is_empty() {
        let _ = writeln!(o, "  Free space by stream and pool at the OOM:");
        for g in &s.free_by_stream_pool {
            let _ = writeln!(
                o,
                "    stream {:<6} {} pool{:<12} {:>12} free in {} block{}, largest {}, of {} reserved{}",
                g.stream,
                g.pool,
                if g.pool_id == (0, 0) { String::new() } else { format!(" ({},{})", g.pool_id.0, g.pool_id.1) },
                bytes(g.free_bytes),
                g.free_blocks,
                if g.free_blocks == 1 { "" } else { "s" },
                bytes(g.largest_free_block_bytes),
                bytes(g.reserved_bytes),
                if g.is_request_pool { "  <- the request's" } else { "" }
            );
        }
    }
}

/// The failing allocation's call site and stack (12 frames at most), then the live bytes
/// by call site at the OOM.
fn oom_site_text(o: &mut String, f: &OomFinding) {
    let _ = writeln!(o, "  Failing allocation at   {}", f.site.site);
    for fr in f.stack.iter().take(12) {
        let _ = writeln!(o, "      {fr}");
    }
    if f.stack.len() > 12 {
        let _ = writeln!(o, "      … {} more", f.stack.len() - 12);
    }
    if !f.top_sites.is_empty() {
        let _ = writeln!(o, "  Live bytes by call site at the OOM:");
        for s in &f.top_sites {
            let _ = writeln!(o, "    {:>12} {:>6}  {}", bytes(s.bytes), percent(s.share), s.site.site);
        }
    }
}

/// The fixes measured by replaying the trace (`b`: the baseline replay; `rep`: whether it
/// reproduces the OOM): each setting tried and its outcome, the fixes found, and the usual
/// advice replayed the same way.
fn oom_fixes_text(o: &mut String, f: &OomFinding, b: &fragscope_diagnose::Trial, rep: bool) {
    let _ = writeln!(
        o,
        "  Fixes measured by replaying the trace on a {} device (recorded settings: {}):",
        bytes(f.capacity_bytes),
        if rep {
            format!("OOM at entry {}", b.first_oom_index.map_or("?".into(), |i| i.to_string()))
        } else {
            "no OOM in the model, so fixes cannot be measured".to_string()
        }
    );
    for t in &f.fixes_tried {
        let outcome = if rep && fragscope_diagnose::avoids_oom(t, f.event_index) {
            "avoids the OOM".to_string()
        } else {
            match t.first_oom_index {
                Some(i) => format!("OOM at entry {i}"),
                None if t.recorded_ooms_that_fit == 0 => "request still fails".to_string(),
                None => "no OOM".to_string(),
            }
        };
        // The label says everything that was replayed, so copying it reproduces the row:
        // a GC threshold is replayed under a memory fraction (GC is inert without one).
        let label = match &t.extra_call {
            // the call only; its "(GC runs only under ...)" gloss is in the finding
            Some(c) => format!("{} + {}", t.setting, c.split(" (").next().unwrap_or(c)),
            None => t.setting.clone(),
        };
        replay_row(o, &label, &outcome, t.peak_reserved_bytes, t.cuda_mallocs, t.cuda_frees, t.syncs);
        // what the replay had to assume, in the text as in the JSON
        for n in &t.notes {
            let _ = writeln!(o, "      note: {n}");
        }
    }
    if f.fixes.is_empty() {
        let _ = writeln!(o, "    No setting avoids it.");
    } else {
        for x in &f.fixes {
            let _ = writeln!(
                o,
                "    Fix: {}{}",
                x.paste,
                x.extra_call.as_ref().map_or(String::new(), |c| format!("  and  {c}"))
            );
        }
    }
    if !f.advice.is_empty() {
        let _ = writeln!(o, "  The usual advice, replayed the same way:");
        for a in &f.advice {
            let outcome = if a.avoids_oom {
                "avoids the OOM".to_string()
            } else {
                a.first_oom_index.map_or("request still fails".into(), |i| format!("OOM at entry {i}"))
            };
            replay_row(o, &a.advice, &outcome, a.peak_reserved_bytes, a.cuda_mallocs, a.cuda_frees, a.syncs);
        }
    }
    if !f.fixes_tried.is_empty() || !f.advice.is_empty() {
        let _ = writeln!(o, "    ({})", fragscope_replay::SYNCS_NOTE);
    }
}

/// One replayed alternative at the OOM: outcome, peak, driver calls and the
/// synchronisations they imply (counts; no time is estimated, `replay::cost`).
fn replay_row(o: &mut String, name: &str, outcome: &str, peak: u64, mallocs: u64, frees: u64, syncs: u64) {
    let _ = writeln!(
        o,
        "    {name:<36} {outcome:<22} peak reserved {:>11}  {mallocs} cudaMalloc  {frees} cudaFree  {syncs} syncs",
        bytes(peak),
    );
}

fn fragmentation_text(d: &DeviceAnalysis) -> String {
    let mut o = String::new();
    let tl = &d.fragmentation.timeline;
    let series: &[SeriesPoint] = &tl.series;
    let max = series.iter().map(|p| p.max.reserved.max(p.max.active)).max().unwrap_or(0);
    // Every curve's peak on the curves' own sizes (the block's final size, else the rounded
    // request), so that active ≥ allocated holds between the rows. The peak allocated of the
    // glossary counts blocks as memory_stats() does (the replay's block sizes); where the
    // two differ it is named beside the curve, not printed as the curve's peak.
    let alloc_curve: Vec<u64> = series.iter().map(|p| p.max.allocated).collect();
    let alloc_curve_peak = alloc_curve.iter().copied().max().unwrap_or(0);
    let curves: [(&str, Vec<u64>, u64); 4] = [
        ("reserved", series.iter().map(|p| p.max.reserved).collect(), tl.peak_reserved.bytes),
        ("active", series.iter().map(|p| p.max.active).collect(), tl.peak_active.bytes),
        ("allocated", alloc_curve, if series.is_empty() { tl.peak_allocated.bytes } else { alloc_curve_peak }),
        ("requested", series.iter().map(|p| p.max.requested).collect(), tl.peak_requested.bytes),
    ];
    let entries = crate::output::count_of(tl.events as u64, "trace entry", "trace entries");
    let _ = writeln!(o, "  {entries}; curves show the maximum per bucket, one scale:");
    for (name, v, peak) in &curves {
        // Compared as printed: a difference below the last digit shown would only read as noise.
        let label = if *name == "allocated" && bytes(*peak) != bytes(tl.peak_allocated.bytes) {
            format!(
                " (the trace's block sizes; peak allocated as memory_stats() counts it: {})",
                bytes(tl.peak_allocated.bytes)
            )
        } else {
            String::new()
        };
        let _ = writeln!(o, "  {name:<10} {}  peak {}{label}", sparkline(v, max), bytes(*peak));
    }
    if tl.reserved_source != ReservedSource::Segments {
        let _ = writeln!(o, "  (reserved from: {})", tl.reserved_source);
    }
    match tl.peak_fragmentation {
        Some(pf) => {
            let _ = writeln!(
                o,
                "  Peak fragmentation      {} (1 − peak allocated {} / peak reserved {})",
                percent(pf),
                bytes(tl.peak_allocated.bytes),
                bytes(tl.peak_reserved.bytes)
            );
        }
        None => {
            let _ = writeln!(o, "  Peak fragmentation      n/a (nothing reserved)");
        }
    }
    if let Some(f) = tl.fragmentation_at_reserved_peak {
        let _ = writeln!(
            o,
            "  At the reserved peak    {} of reserved memory unallocated ({})",
            percent(f),
            ev_at(tl.peak_reserved.event_index)
        );
    }
    if let Some(s) = &d.fragmentation.at_reserved_peak {
        let _ = writeln!(
            o,
            "  Free space there        {} free in the cache, largest free block {}, free-space fragmentation {}",
            bytes(s.cached_free_bytes),
            bytes(s.largest_free_block_bytes),
            s.free_space_fragmentation.map_or("n/a".to_string(), percent)
        );
    } else if let Some(n) = &d.fragmentation.at_reserved_peak_note {
        let _ = writeln!(o, "  Free space there        {n}");
    }
    if !tl.history_complete {
        let _ = writeln!(
            o,
            "  Note: recording began mid-run; {} ({}) live before the trace were seeded from the final state.",
            crate::output::count_of(tl.seeded.blocks, "block", "blocks"),
            bytes(tl.seeded.allocated_bytes)
        );
    }
    let p = &d.fragmentation.pinned_segments;
    if p.segments == 0 {
        let _ = writeln!(o, "  Pinned segments         none at the end");
    } else {
        let _ = writeln!(
            o,
            "  Pinned segments         {} ({} reserved, {} of it free) kept by a few small live blocks:",
            p.segments,
            bytes(p.reserved_bytes),
            bytes(p.free_bytes)
        );
        for g in &p.by_site {
            let _ = writeln!(o, "    {}", g.describe(bytes));
        }
    }
    o
}

/// Why a leak suspect is one: its evidence, the steps that it outlived, its curve.
fn leak_evidence(s: &fragscope_diagnose::LeakSuspect) -> String {
    let mut o = String::new();
    let pad = "                 ";
    for e in &s.evidence {
        let _ = writeln!(o, "{pad}why: {e}");
    }
    if !s.kept_roles.is_empty() {
        let r: Vec<String> = s.kept_roles.iter().map(|(k, v)| format!("{k} {}", bytes(*v))).collect();
        let _ = writeln!(o, "{pad}roles of the kept blocks: {}", r.join(", "));
    }
    if !s.grew_in.is_empty() {
        let spans: Vec<String> =
            s.grew_in.iter().take(8).map(|g| format!("step {} +{}", g.window + 1, bytes(g.bytes))).collect();
        let more = if s.grew_in.len() > 8 { format!(", … ({} in all)", s.grew_in.len()) } else { String::new() };
        let _ = writeln!(o, "{pad}outlived their step: {}{more}", spans.join(", "));
    }
    if s.curve.len() > 1 {
        let pts: Vec<String> = s.curve.iter().map(|p| bytes(p.bytes)).collect();
        let _ = writeln!(
            o,
            "{pad}live bytes at the first step's start, each step's end, then the trace's end: {}",
            pts.join(" ")
        );
    }
    o
}

fn peak_text(name: &str, p: &PeakAttribution) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "  At the {name} ({}): {} live in {}{}",
        ev_at(p.event_index),
        bytes(p.live_bytes),
        crate::output::count_of(p.live_blocks, "block", "blocks"),
        if p.before_trace_bytes > 0 {
            format!(", {} of it allocated before recording", bytes(p.before_trace_bytes))
        } else {
            String::new()
        }
    );
    for s in &p.sites {
        let _ = writeln!(
            o,
            "    {:>12} {:>6}  {:>5} block{} {}",
            bytes(s.bytes),
            percent(s.share),
            s.blocks,
            if s.blocks == 1 { " " } else { "s" },
            s.site.site
        );
        let _ = writeln!(o, "                                      {}", s.site.stack);
    }
    if p.other_sites > 0 {
        let _ = writeln!(o, "    {:>12}         {} more sites", bytes(p.other_sites_bytes), p.other_sites);
    }
    if !p.open_annotations.is_empty() {
        let _ = writeln!(o, "    Open record_function scopes: {}", p.open_annotations.join(" > "));
    }
    // The scopes, then the strings PyTorch attaches to each allocation, listed alike.
    for (rows, what) in [
        (&p.by_annotation, "By record_function scope (where the live blocks were allocated):"),
        (&p.by_compile_context, "By compile_context (the torch.compile region of the allocation):"),
        (&p.by_user_metadata, "By user_metadata (set with torch.cuda.memory._set_memory_metadata):"),
    ] {
        if !rows.is_empty() {
            let _ = writeln!(o, "    {what}");
            for a in rows {
                let _ = writeln!(
                    o,
                    "    {:>12}  {:>5} {:<6}  {}",
                    bytes(a.bytes),
                    a.blocks,
                    if a.blocks == 1 { "block" } else { "blocks" },
                    a.name
                );
            }
        }
    }
    o
}

fn recommend_text(d: &DeviceAnalysis) -> String {
    let mut o = String::new();
    let r = &d.recommendations;
    if r.recommended.is_empty() {
        let _ = writeln!(o, "  {}", r.note.as_deref().unwrap_or("nothing to recommend"));
    }
    for x in &r.recommended {
        let _ = writeln!(o, "  {}. {}", x.rank, x.paste);
        if let Some(c) = &x.extra_call {
            let _ = writeln!(o, "     and call {c}");
        }
        let _ = writeln!(o, "     {} (PyTorch ≥ {})", x.reason, x.min_version.unwrap_or("?"));
    }
    // The usual advice in the same ranking as the settings, when any of it saves.
    if r.ranked.iter().any(|x| x.kind == "advice") {
        let _ = writeln!(o, "  Settings and the usual advice in one ranking (each avoids the OOM or saves at least 5%; free before synchronising, debugging-only last):");
        for x in &r.ranked {
            let _ = writeln!(o, "  {}. {} [{}]: {}", x.rank, x.setting, x.cost.as_str(), x.reason);
        }
    }
    if r.measured && !r.tried.is_empty() {
        if let Some(b) = &r.baseline {
            let _ = writeln!(
                o,
                "  Replayed {} settings against the recorded ones (peak reserved {}, {} cudaMalloc{}) on {}.",
                r.tried.len(),
                bytes(b.peak_reserved_bytes),
                b.cuda_mallocs,
                b.first_oom_index.map_or(String::new(), |i| format!(", OOM at entry {i}")),
                r.capacity_bytes.map_or("an unlimited device".to_string(), |c| format!("a {} device", bytes(c)))
            );
        }
    }
    // Every note the replays made (as --json has them), each once.
    let mut seen: Vec<&str> = Vec::new();
    let trials = r.baseline.iter().chain(&r.tried).chain(&r.advice);
    for n in trials.flat_map(|t| &t.notes).chain(&r.advice_notes) {
        if !seen.contains(&n.as_str()) {
            seen.push(n);
            let _ = writeln!(o, "  Replay note: {n}");
        }
    }
    o
}
