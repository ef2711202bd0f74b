//! `fragscope check FILE [--max-reserved SIZE] [--max-allocated SIZE]
//! [--max-peak-fragmentation F] [--no-leaks] [--json]`: a memory budget gate for CI.
//!
//! Exit 0 with one `check passed: ...` line when every device is within the limits,
//! exit 1 with one `check failed: ...` line naming the first broken limit and the
//! measured value (`(and N more)` when several broke), exit 2 on unreadable input or a
//! bad limit. Both lines go to stdout. `--json` prints the result object
//! (`fragscope_diagnose::check::CheckResult`) instead, with the same exit codes.
//!
//! Sizes: plain bytes, binary units `KiB MiB GiB TiB` (and `K M G T`), decimal units
//! `KB MB GB TB` (`20GB` = 20,000,000,000 bytes). Fragmentation: `0.15` or `15%`,
//! compared with `1 − peak allocated / peak reserved`.

use std::path::PathBuf;
use std::process::ExitCode;

use fragscope_diagnose::check::{self, CheckResult, Failure, Limit, Limits, Value};

use crate::output::bytes;
use crate::{input, CliError, EXIT_GATE_FAILED};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Snapshot file (pickle from torch.cuda.memory._dump_snapshot, or a profiler trace).
    pub file: PathBuf,
    /// Fail when peak reserved memory exceeds SIZE (e.g. 20GiB, 20GB, 512MiB, bytes).
    #[arg(long, value_name = "SIZE")]
    pub max_reserved: Option<String>,
    /// Fail when peak allocated memory exceeds SIZE.
    #[arg(long, value_name = "SIZE")]
    pub max_allocated: Option<String>,
    /// Fail when peak fragmentation (1 − peak allocated / peak reserved) exceeds F (0.15 or
    /// 15%). `--max-fragmentation`, its name before 0.x, is still accepted.
    #[arg(long, value_name = "F", alias = "max-fragmentation")]
    pub max_peak_fragmentation: Option<String>,
    /// Fail when any call site's memory outlives its training step and grows across steps
    /// (a leak suspect; traces of one step or none have none).
    #[arg(long)]
    pub no_leaks: bool,
    /// Print the result object as JSON.
    #[arg(long)]
    pub json: bool,
}

fn flag(limit: Limit) -> &'static str {
    match limit {
        Limit::MaxReserved => "--max-reserved",
        Limit::MaxAllocated => "--max-allocated",
        Limit::MaxPeakFragmentation => "--max-peak-fragmentation",
        Limit::NoLeaks => "--no-leaks",
    }
}

fn value(v: &Value) -> String {
    match *v {
        Value::Bytes(b) => bytes(b),
        Value::Ratio(r) => format!("{r:.4}"),
        Value::Count(c) => c.to_string(),
    }
}

/// The `check failed: ...` text of one broken limit (without the prefix).
pub fn failure_line(f: &Failure) -> String {
    match f.limit {
        Limit::NoLeaks => format!("{} leak suspect(s) on device {} (--no-leaks)", value(&f.measured), f.device),
        l => {
            let what = match l {
                Limit::MaxReserved => "peak reserved",
                Limit::MaxAllocated => "peak allocated",
                Limit::MaxPeakFragmentation | Limit::NoLeaks => "peak fragmentation",
            };
            format!("{what} {} on device {} exceeds {} {}", value(&f.measured), f.device, flag(l), value(&f.allowed))
        }
    }
}

/// The limits of `args`, or the one-line error for a malformed size or fraction.
pub fn limits(args: &Args) -> Result<Limits, CliError> {
    let size = |s: &Option<String>, name: &str| -> Result<Option<u64>, CliError> {
        s.as_deref().map(|v| check::parse_size(v).map_err(|e| CliError::usage(format!("{name}: {e}")))).transpose()
    };
    Ok(Limits {
        max_reserved: size(&args.max_reserved, "--max-reserved")?,
        max_allocated: size(&args.max_allocated, "--max-allocated")?,
        max_peak_fragmentation: args
            .max_peak_fragmentation
            .as_deref()
            .map(|v| check::parse_fraction(v).map_err(|e| CliError::usage(format!("--max-peak-fragmentation: {e}"))))
            .transpose()?,
        no_leaks: args.no_leaks,
    })
}

/// The `--json` document of a check: what `fragscope check --json` prints.
pub fn json(result: &CheckResult) -> Result<String, CliError> {
    crate::output::json_text(result)
}

pub fn run(args: &Args) -> Result<ExitCode, CliError> {
    let limits = limits(args)?;
    let snap = input::load(&args.file, args.json)?;
    let result = check::check(&snap, &limits);
    let text = if args.json {
        json(&result)?
    } else if let Some(first) = result.failures.first() {
        let more = result.failures.len() - 1;
        let suffix = if more > 0 { format!(" (and {more} more)") } else { String::new() };
        format!("check failed: {}{suffix}\n", failure_line(first))
    } else {
        let devs: Vec<String> = result
            .devices
            .iter()
            .map(|d| {
                let frag = d.peak_fragmentation.map_or("n/a".to_string(), |f| format!("{f:.4}"));
                let leaks = match &d.leaks_not_told {
                    Some(why) => format!(" (--no-leaks not checked: {why})"),
                    None => String::new(),
                };
                format!(
                    "device {}: peak reserved {}, peak allocated {}, peak fragmentation {frag}{leaks}",
                    d.device,
                    bytes(d.peak_reserved),
                    bytes(d.peak_allocated)
                )
            })
            .collect();
        let body = if devs.is_empty() { "no device memory recorded".to_string() } else { devs.join("; ") };
        format!("check passed: {}: {body}\n", args.file.display())
    };
    crate::print_stdout(&text)?;
    Ok(if result.ok { ExitCode::SUCCESS } else { ExitCode::from(EXIT_GATE_FAILED) })
}
