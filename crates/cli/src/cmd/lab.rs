//! `fragscope replay FILE --allocator NAME ...`: the allocator lab. Each device's
//! workload served by the named allocation policies (PyTorch's caching allocator under
//! any settings, best-fit arenas, page remapping, lifetime segregation, the offline plan)
//! against the bounds no allocator beats: peak reserved, its ratio to peak live bytes,
//! driver calls, speed, and whether the recorded OOM (or none) happens on the recorded
//! capacity. Text table or `--json` (schema `fragscope.replay.lab/2`,
//! docs/json-schema.md).

use std::fmt::Write as _;
use std::process::ExitCode;

use fragscope_commands::replay;
use fragscope_replay::LabReport;

use super::replay::Args;
use crate::output::{self, Align, Table};
use crate::{print_stdout, CliError};
use fragscope_commands::input;

pub fn run(args: &Args, capacity: Option<u64>) -> Result<ExitCode, CliError> {
    let req = args.lab_request();
    let specs = req.specs()?;
    let out: Vec<(String, Vec<LabReport>)> = input::each_snapshot(&args.files, args.json, |name, snap| {
        Ok::<_, CliError>((name, replay::lab_snapshot(&req, capacity, snap, &specs)?))
    })?;
    let text = if args.json { replay::lab_json(&out)? } else { render(&out) };
    print_stdout(&text)?;
    Ok(ExitCode::SUCCESS)
}

fn ratio(a: u64, live: u64) -> String {
    if live == 0 {
        "—".into()
    } else {
        format!("{:.3}", a as f64 / live as f64)
    }
}

fn render(out: &[(String, Vec<LabReport>)]) -> String {
    let mut s = String::new();
    for (file, reps) in out {
        let _ = writeln!(s, "{file}");
        if reps.is_empty() {
            let _ = writeln!(s, "  no allocation trace (state-only snapshot)\n");
            continue;
        }
        for r in reps {
            device_text(&mut s, r);
        }
        s.push('\n');
    }
    s
}

/// One device's lab report: its trace, the table of bounds and policies
/// ([`policy_table`]), the smallest capacities without an OOM, and the notes.
fn device_text(s: &mut String, r: &LabReport) {
    let _ = writeln!(
        s,
        "  device {}: {} trace events, {} requests on {} stream(s), {} block(s) alive before the trace, \
         {} recorded OOM(s)",
        r.device,
        output::grouped(r.trace_events as u64),
        output::grouped(r.requests),
        r.streams,
        r.pre_existing_blocks,
        r.recorded_ooms
    );
    let _ = writeln!(s, "  recorded capacity {}: {}", output::bytes(r.capacity), r.capacity_source);
    s.push_str(&policy_table(r).render());
    let b = &r.bounds;
    if b.live_with_failed > b.live {
        let _ = writeln!(
            s,
            "  failed request: the recorded OOM asked for more than was ever live: {} live with it, {} \
             without; the bounds and ratios count what was live",
            output::bytes(b.live_with_failed),
            output::bytes(b.live)
        );
    }
    for row in &r.rows {
        if let Some(c) = row.min_capacity {
            let _ = writeln!(
                s,
                "  smallest device without an OOM (bisection, 2 MiB steps): {}: {} ({} peak live)",
                row.policy,
                output::bytes(c),
                ratio(c, b.live)
            );
        }
    }
    if r.rows.iter().any(|x| x.calls.synchronize > 0) {
        let _ = writeln!(
            s,
            "  syncs: synchronisations a policy made so that it could unmap memory freed on a stream \
             (cuMemUnmap is not stream-ordered); a cudaFree synchronises by itself. `:lazy` policies move a \
             freed page only after a synchronisation made anyway (empty_cache, the release before an OOM)"
        );
    }
    for n in &r.notes {
        let _ = writeln!(s, "  note: {n}");
    }
}

/// The lower bounds on the peak reserved bytes, then each policy replayed: its peak
/// (and its ratio to the live peak), driver calls, speed and outcome on the recorded
/// capacity.
fn policy_table(r: &LabReport) -> Table {
    let mut t = Table::new(&[
        ("allocator", Align::Left),
        ("peak reserved", Align::Right),
        ("÷ live", Align::Right),
        ("cudaMalloc", Align::Right),
        ("cudaFree", Align::Right),
        ("map", Align::Right),
        ("unmap", Align::Right),
        ("syncs", Align::Right),
        ("M ops/s", Align::Right),
        ("on the recorded capacity", Align::Left),
    ]);
    let b = &r.bounds;
    for (name, v) in [
        ("bound: live as requested", b.live),
        ("bound: live, 512 B each", b.live_512),
        ("bound: per-stream peaks", b.per_stream),
        ("bound: 2 MiB pages", b.pages),
    ] {
        t.row([
            name.to_string(),
            output::bytes(v),
            ratio(v, b.live),
            String::new(),
            String::new(),
            String::new(),
            String::new(),
            String::new(),
            String::new(),
            String::new(),
        ]);
    }
    t.rule();
    for row in &r.rows {
        t.row([
            row.policy.clone(),
            output::bytes(row.peak_reserved),
            ratio(row.peak_reserved, b.live),
            row.calls.cuda_malloc.to_string(),
            row.calls.cuda_free.to_string(),
            row.calls.map.to_string(),
            row.calls.unmap.to_string(),
            row.calls.synchronize.to_string(),
            format!("{:.1}", row.ops_per_second / 1e6),
            row.verdict.clone(),
        ]);
    }
    t
}
