//! `fragscope summary [FILE ...] [--json]`: the memory_summary() figures a snapshot can
//! give, the fragmentation PyTorch never printed, the trace and the allocator settings.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use fragscope_commands::summary::FileSummary;
use fragscope_diagnose::WindowInfo;
use fragscope_snapshot::SourceFormat;
use fragscope_trace::{DeviceSummary, History, PoolFigures, Summary};

use crate::output::{self, Align, Table};
use crate::CliError;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Snapshot files (`torch.cuda.memory._dump_snapshot` pickles, optionally gzipped, or
    /// torch.profiler JSON traces). Without FILE: the built-in example snapshot.
    pub files: Vec<PathBuf>,
    /// Print JSON (schema `fragscope.summary/1`, see docs/json-schema.md) instead of text.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub window: crate::windowed::WindowArg,
}

pub fn run(args: &Args) -> Result<ExitCode, CliError> {
    let example = args.files.is_empty();
    let spec = args.window.spec()?;
    let mut windows: Vec<Option<WindowInfo>> = Vec::new();
    let results: Vec<(String, bool, FileSummary)> =
        fragscope_commands::windowed::each_snapshot(&args.files, args.json, spec.as_ref(), |name, snap, w| {
            windows.push(w);
            Ok::<_, CliError>((name, example, FileSummary::of(snap)))
        })?;
    let text = if args.json {
        fragscope_commands::summary::summary_json(&results, &windows)?
    } else {
        let mut s = String::new();
        for (i, (file, example, sum)) in results.iter().enumerate() {
            if i > 0 {
                s.push('\n');
            }
            if let Some(Some(w)) = windows.get(i) {
                s.push_str(&w.line());
                s.push('\n');
            }
            s.push_str(&render_text(file, *example, sum));
        }
        s
    };
    crate::print_stdout(&text)?;
    Ok(ExitCode::SUCCESS)
}

fn format_name(f: SourceFormat) -> &'static str {
    match f {
        SourceFormat::Dict => "PyTorch 2.x snapshot",
        SourceFormat::SegmentList => "PyTorch 1.13 snapshot (segment list)",
        SourceFormat::Kineto => "torch.profiler trace",
    }
}

/// The whole text report of one file: its OOM first, when it has one.
pub fn render_text(file: &str, example: bool, fs: &FileSummary) -> String {
    let s = &fs.summary;
    let mut o = String::new();
    if example {
        let _ = writeln!(
            o,
            "fragscope summary of the built-in example snapshot (a toy training loop made by \
             fragscope's own code).\nRun `fragscope summary FILE` on a snapshot from \
             torch.cuda.memory._dump_snapshot().\n"
        );
    } else {
        let name = if s.segment_list_2x {
            "PyTorch 2.x segment list, torch.cuda.memory_snapshot()"
        } else {
            format_name(s.format)
        };
        let _ = writeln!(o, "fragscope summary of {file} ({name})\n");
    }
    // How the file was recorded comes before any figure: it says which figures below
    // cannot be told (history never on, one pool only, actions skip_actions left out).
    if !s.notes.recording.is_empty() {
        let _ = writeln!(o, "Recording:");
        for l in &s.notes.recording {
            let _ = writeln!(o, "  {l}");
        }
        o.push('\n');
    }
    if let Some(l) = &fs.oom {
        let _ = writeln!(o, "OOM on device {} at trace entry {}: {}", l.device, l.event_index, l.headline);
        let _ = writeln!(
            o,
            "  Next: fragscope analyze{} (which settings or changes would have avoided it, replayed)\n",
            crate::cmd::analyze::file_arg(file)
        );
    }
    if s.devices.is_empty() {
        let _ = writeln!(o, "No device has segments or trace events in this file.");
    }
    for t in &s.profiler_totals {
        let opt = |v: Option<u64>| v.map_or("—".to_string(), output::bytes);
        let _ = writeln!(o, "Profiler totals, device {} ({} samples):", t.device, t.samples);
        let _ = writeln!(o, "  Peak allocated     {}", opt(t.peak_allocated_bytes));
        let _ = writeln!(o, "  Peak reserved      {}", opt(t.peak_reserved_bytes));
        let _ = writeln!(o, "  Allocated at end   {}", opt(t.last_allocated_bytes));
        if let Some(c) = t.device_capacity_bytes {
            let _ = writeln!(o, "  Device capacity    {} (deviceProperties.totalGlobalMem)", output::bytes(c));
        }
        if let (Some(a), Some(b)) = (t.first_time_us, t.last_time_us) {
            let _ = writeln!(o, "  Time span          {:.3} s", (b - a) as f64 / 1e6);
        }
        o.push('\n');
    }
    // The OOM's device first, as `analyze` prints it (issue 42 item 1); the others in order.
    let oom_device = fs.oom.as_ref().map(|l| l.device);
    let mut ordered: Vec<_> = s.devices.iter().collect();
    ordered.sort_by_key(|d| Some(d.device) != oom_device);
    for d in ordered {
        o.push_str(&device_table(file, example, d));
        o.push('\n');
        if let Some(t) = &d.memory_table {
            o.push_str(&window_table(t));
            o.push('\n');
        }
        o.push_str(&fragmentation_text(d));
        if let Some(p) = fs.private_pools.iter().find(|p| p.device == d.device) {
            o.push_str(&crate::cmd::state::pool_bands_text(&p.pools));
        }
        o.push('\n');
        o.push_str(&trace_text(d));
        o.push('\n');
        if let Some(r) = &d.roles {
            let _ = writeln!(o, "Memory by role (device {}):", d.device);
            o.push_str(&fragscope_trace::roles_text(r, output::bytes));
            o.push('\n');
        }
    }
    if let Some(h) = &s.host {
        o.push_str(&host_text(h));
        o.push('\n');
    }
    o.push_str(&settings_text(s));
    if s.devices.iter().any(|d| d.all.segments > 0) {
        let _ = writeln!(o, "\n_memory_viz.py stats would print (all devices):");
        for l in &s.memviz_stats.lines {
            let _ = writeln!(o, "  {l}");
        }
    }
    let notes = notes_text(s);
    if !notes.is_empty() {
        o.push('\n');
        o.push_str(&notes);
    }
    o
}

/// memory_summary()'s whole table (Cur / Peak / Tot Alloc / Tot Freed) over the recorded
/// window, with the large- and small-pool rows.
fn window_table(t: &fragscope_replay::MemoryTable) -> String {
    use fragscope_replay::StatRow;
    let mut tb = Table::new(&[
        ("Metric (over the recorded window)", Align::Left),
        ("Cur Usage", Align::Right),
        ("Peak Usage", Align::Right),
        ("Tot Alloc", Align::Right),
        ("Tot Freed", Align::Right),
    ]);
    tb.banner(format!(
        "memory_summary() over the recorded window ({}), not the whole process",
        output::count_of(t.entries, "trace entry", "trace entries")
    ));
    let rows: [(&str, &StatRow, bool); 7] = [
        ("Allocated memory", &t.allocated_bytes, true),
        ("Active memory", &t.active_bytes, true),
        ("Requested memory", &t.requested_bytes, true),
        ("GPU reserved memory", &t.reserved_bytes, true),
        ("Allocations", &t.allocations, false),
        ("Active allocs", &t.active_allocs, false),
        ("GPU reserved segments", &t.segments, false),
    ];
    for (name, r, is_bytes) in rows {
        let f = |v: u64| if is_bytes { output::bytes(v) } else { output::grouped(v) };
        for (label, st) in [
            (name.to_string(), &r.all),
            ("  from large pool".into(), &r.large_pool),
            ("  from small pool".into(), &r.small_pool),
        ] {
            tb.row([label, f(st.current), f(st.peak), f(st.allocated), f(st.freed)]);
        }
    }
    tb.render()
}

/// memory_summary()'s table, current values only, with an exact column.
fn device_table(file: &str, example: bool, d: &DeviceSummary) -> String {
    let mut t = Table::new(&[("Metric", Align::Left), ("Cur Usage", Align::Right), ("Exact", Align::Right)]);
    t.banner(format!("PyTorch CUDA memory summary, device ID {}", d.device));
    t.banner(if example { "(built-in example snapshot)".to_string() } else { format!("from {}", short_name(file)) });
    type Get = fn(&PoolFigures) -> u64;
    let byte_rows: [(&str, Get); 5] = [
        ("Allocated memory", |p| p.allocated_bytes),
        ("Active memory", |p| p.active_bytes),
        ("Requested memory", |p| p.requested_bytes),
        ("GPU reserved memory", |p| p.reserved_bytes),
        ("Non-releasable memory", |p| p.inactive_split_bytes),
    ];
    let count_rows: [(&str, Get); 5] = [
        ("Allocations", |p| p.allocations),
        ("Active allocs", |p| p.active_blocks),
        ("GPU reserved segments", |p| p.segments),
        ("Non-releasable allocs", |p| p.inactive_split_blocks),
        ("Blocks", |p| p.blocks),
    ];
    let pools = [("", &d.all), ("      from large pool", &d.pools.large), ("      from small pool", &d.pools.small)];
    for (name, get) in byte_rows {
        t.rule();
        let pref = get(&d.all);
        for (label, p) in pools {
            let label = if label.is_empty() { name } else { label };
            t.row([label.to_string(), output::summary_bytes(get(p), pref), output::grouped(get(p))]);
        }
    }
    for (name, get) in count_rows {
        t.rule();
        let pref = get(&d.all);
        for (label, p) in pools {
            let label = if label.is_empty() { name } else { label };
            t.row([label.to_string(), output::summary_count(get(p), pref), output::grouped(get(p))]);
        }
    }
    t.render()
}

fn short_name(file: &str) -> &str {
    std::path::Path::new(file).file_name().and_then(|n| n.to_str()).unwrap_or(file)
}

fn fragmentation_text(d: &DeviceSummary) -> String {
    let f = &d.fragmentation;
    let mut o = String::new();
    let _ = writeln!(o, "Fragmentation, device {} (not in memory_summary):", d.device);
    let rows: Vec<(String, String)> = vec![
        (
            "Reserved but unallocated".into(),
            format!(
                "{}  (reserved − allocated: free blocks PyTorch keeps cached; nvidia-smi counts them as used)",
                output::bytes(f.reserved_minus_allocated_bytes)
            ),
        ),
        (
            "Free inside segments".into(),
            format!(
                "{}  = {} external (blocks not allocated) + {} internal (rounding slack, {} of free)",
                output::bytes(f.free_bytes),
                output::bytes(f.external_free_bytes),
                output::bytes(f.internal_free_bytes),
                output::percent(f.internal_free_share)
            ),
        ),
        (
            "Cached free blocks".into(),
            format!("{}  (state inactive: reusable without cudaMalloc)", output::bytes(f.inactive_bytes)),
        ),
        (
            "Largest free block".into(),
            format!(
                "{}  (the largest request its pool and stream can serve without new memory)",
                output::bytes(f.largest_free_block_bytes)
            ),
        ),
        (
            "Free-space fragmentation".into(),
            format!(
                "{}  (1 − largest free block / cached free; 0% = one contiguous block)",
                output::percent(f.free_space_fragmentation)
            ),
        ),
        (
            "Pinned segments".into(),
            format!(
                "{} of {}, {} reserved, {} of it free  (≤ 10% live, or ≤ 2 live blocks holding ≤ 25%: \
                 empty_cache() cannot release them)",
                f.pinned_segments,
                d.all.segments,
                output::bytes(f.pinned_reserved_bytes),
                output::bytes(f.pinned_free_bytes)
            ),
        ),
    ];
    push_rows(&mut o, &rows);
    o
}

fn push_rows(o: &mut String, rows: &[(String, String)]) {
    let w = rows.iter().map(|(k, _)| k.chars().count()).max().unwrap_or(0);
    for (k, v) in rows {
        let _ = writeln!(o, "  {k:<w$}  {v}");
    }
}

fn trace_text(d: &DeviceSummary) -> String {
    let t = &d.trace;
    let mut o = String::new();
    let _ = writeln!(o, "Trace, device {} (device_traces[{}]):", d.device, d.device);
    let mut rows: Vec<(String, String)> = Vec::new();
    let actions: Vec<String> = t.by_action.iter().map(|(a, n)| format!("{a} {}", output::grouped(*n))).collect();
    rows.push((
        "Events".into(),
        if t.events == 0 { "0".into() } else { format!("{}  ({})", output::grouped(t.events), actions.join(", ")) },
    ));
    if let Some(span) = t.span_us {
        rows.push((
            "Time span".into(),
            format!(
                "{:.3} s  (time_us {} … {})",
                span as f64 / 1e6,
                t.first_time_us.unwrap_or(0),
                t.last_time_us.unwrap_or(0)
            ),
        ));
    } else if t.events > 0 {
        rows.push(("Time span".into(), "not recorded (no time_us: PyTorch before 2.2)".into()));
    }
    let history = match t.history {
        History::None => {
            "no trace recorded (history off, or enabled=\"state\" with nothing after the last event)".to_string()
        }
        History::SingleEntry => "only the last event (enabled=\"state\" or the legacy 1-entry ring buffer)".to_string(),
        History::Complete => "complete: every free and every live block has its alloc in the trace".to_string(),
        History::BeganMidRun => {
            "began mid-run: recording started (or the ring buffer wrapped) after memory was in use".to_string()
        }
    };
    rows.push(("History".into(), history));
    if t.events > 0 {
        rows.push((
            "Frees of unknown blocks".into(),
            format!(
                "{}  (+ {} segment_free of unknown segments)",
                output::grouped(t.frees_of_unknown_blocks),
                t.segment_frees_of_unknown_segments
            ),
        ));
    }
    let coverage = t.live_bytes_coverage.map_or("-".to_string(), output::percent);
    rows.push((
        "Live blocks".into(),
        if t.events == 0 {
            format!("{} ({})", output::grouped(t.live_blocks), output::bytes(t.live_bytes))
        } else {
            format!(
                "{} ({}), {} allocated before the trace; the trace covers {} of live bytes",
                output::grouped(t.live_blocks),
                output::bytes(t.live_bytes),
                output::grouped(t.live_blocks_untraced),
                coverage
            )
        },
    ));
    if t.trace_live_missing_from_state > 0 {
        rows.push((
            "Inconsistent".into(),
            format!(
                "{} left live by the trace {} missing from the final state",
                output::count_of(t.trace_live_missing_from_state, "block", "blocks"),
                if t.trace_live_missing_from_state == 1 { "is" } else { "are" }
            ),
        ));
    }
    push_rows(&mut o, &rows);
    o
}

fn settings_text(s: &Summary) -> String {
    let mut o = String::new();
    let Some(st) = &s.settings else {
        let _ = writeln!(o, "Allocator settings: not recorded (allocator_settings appeared in PyTorch 2.3).");
        return o;
    };
    let _ = writeln!(o, "Allocator settings (allocator_settings):");
    let divs: Vec<String> =
        st.roundup_power2_divisions.iter().filter(|(_, d)| *d != 0).map(|(k, d)| format!("{k}MiB:{d}")).collect();
    let mut rows = vec![(
        "PYTORCH_CUDA_ALLOC_CONF".to_string(),
        match st.conf.as_deref() {
            Some("") | None => "(not set)".to_string(),
            Some(c) => format!("\"{c}\""),
        },
    )];
    // Parts the parser refused: replays run without them, at PyTorch's defaults.
    for u in &st.unread {
        rows.push(("  not read".to_string(), format!("\"{}\": {} (replays run without it)", u.item, u.error)));
    }
    rows.extend([
        ("max_split_size".into(), st.max_split_size.map_or("unlimited".into(), output::bytes)),
        (
            "expandable_segments".into(),
            st.expandable_segments.map_or("-".into(), |b| if b { "True" } else { "False" }.into()),
        ),
        (
            "garbage_collection_threshold".into(),
            st.garbage_collection_threshold.map_or("-".into(), |g| {
                if g == 0.0 {
                    "0 (off)".into()
                } else {
                    format!("{g}")
                }
            }),
        ),
        ("roundup_power2_divisions".into(), if divs.is_empty() { "none".into() } else { divs.join(", ") }),
    ]);
    push_rows(&mut o, &rows);
    o
}

/// Pinned host memory, apart from every device's figures (it is CPU RAM).
fn host_text(h: &fragscope_trace::HostSummary) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "Pinned host memory (host_segments; CPU RAM, not in any device figure above):");
    let _ = writeln!(
        o,
        "  Pinned             {} in {}",
        output::bytes(h.reserved_bytes),
        output::count_of(h.segments, "host block", "host blocks")
    );
    let _ = writeln!(o, "  In use             {}  (held by tensors)", output::bytes(h.allocated_bytes));
    let _ = writeln!(o, "  Cached free        {}  (kept pinned for reuse)", output::bytes(h.cached_free_bytes));
    if let Some(a) = &h.trace_actions {
        let total: u64 = a.values().sum();
        let parts: Vec<String> = a.iter().map(|(k, v)| format!("{k} {}", output::grouped(*v))).collect();
        let list = if parts.is_empty() { String::new() } else { format!("  ({})", parts.join(", ")) };
        let _ = writeln!(o, "  host_traces        {}{list}", output::grouped(total));
    }
    if let Some(p) = h.trace_peak_requested_bytes.filter(|&p| p > 0) {
        let _ = writeln!(o, "  Peak requested     {}  (live at once over host_traces)", output::bytes(p));
    }
    o
}

fn notes_text(s: &Summary) -> String {
    let n = &s.notes;
    let mut o = String::new();
    let fmt = |m: &std::collections::BTreeMap<String, u64>| {
        m.iter().map(|(k, v)| format!("{k} ×{v}")).collect::<Vec<_>>().join(", ")
    };
    if !n.unknown_keys.is_empty() {
        let _ = writeln!(o, "  keys this reader does not interpret (kept): {}", fmt(&n.unknown_keys));
    }
    if !n.unknown_actions.is_empty() {
        let _ = writeln!(o, "  trace actions not modelled (skipped): {}", fmt(&n.unknown_actions));
    }
    if !n.missing_optional.is_empty() {
        let _ = writeln!(o, "  optional keys missing: {}", fmt(&n.missing_optional));
    }
    for r in &n.remarks {
        let _ = writeln!(o, "  {r}");
    }
    if o.is_empty() {
        return o;
    }
    format!("Reader notes:\n{o}")
}
