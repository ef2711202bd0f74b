//! `fragscope check FILE [--max-reserved SIZE] [--max-allocated SIZE]
//! [--max-peak-fragmentation F] [--no-leaks] [--json]`: a memory budget gate for CI.
//!
//! Exit 0 with one `check passed (LIMITS): ...` line when every device is within the
//! limits, exit 1 with one `check failed: ...` line naming the first broken limit and the
//! measured value (`(and N more: ...)` naming the others when several broke), exit 2 on
//! unreadable input, a bad limit or no limit at all (there is no default budget: a gate
//! without one would pass everything). Both lines go to stdout; each limit is echoed as
//! given, with the bytes it was read as (`--max-reserved 40GB (40,000,000,000 bytes)`). `--json` prints the result object
//! (`fragscope_diagnose::CheckResult`) instead, with the same exit codes.
//!
//! Sizes: plain bytes, binary units `KiB MiB GiB TiB` (and `K M G T`), decimal units
//! `KB MB GB TB` (`20GB` = 20,000,000,000 bytes). Fragmentation: `0.15` or `15%`,
//! compared with `1 − peak allocated / peak reserved`.

use std::path::PathBuf;
use std::process::ExitCode;

use fragscope_commands::check::{failed_line, json, CheckRequest};
use fragscope_commands::Words;
use fragscope_diagnose::check;

use crate::output::{bytes, percent};
use crate::{CliError, EXIT_GATE_FAILED};
use fragscope_commands::input;

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

impl Args {
    /// The library's request.
    pub fn request(&self) -> CheckRequest {
        CheckRequest {
            max_reserved: self.max_reserved.clone(),
            max_allocated: self.max_allocated.clone(),
            max_peak_fragmentation: self.max_peak_fragmentation.clone(),
            no_leaks: self.no_leaks,
        }
    }
}

pub fn run(args: &Args) -> Result<ExitCode, CliError> {
    let req = args.request();
    if !req.has_limit() {
        return Err(CliError::usage(
            "no limit given, so nothing would be checked; give --max-reserved SIZE, --max-allocated SIZE, \
             --max-peak-fragmentation F or --no-leaks (`fragscope summary` shows the peaks)",
        ));
    }
    let limits = req.limits()?;
    let snap = input::load(&args.file, args.json)?;
    let result = check(&snap, &limits);
    let text = if args.json {
        json(&result)?
    } else if let Some(line) = failed_line(&result, &req, Words::Cli) {
        line + "\n"
    } else {
        let devs: Vec<String> = result
            .devices
            .iter()
            .map(|d| {
                let frag = d.peak_fragmentation.map_or("n/a".to_string(), percent);
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
        format!("check passed ({}): {}: {body}\n", req.given_all(Words::Cli), args.file.display())
    };
    crate::print_stdout(&text)?;
    Ok(if result.ok { ExitCode::SUCCESS } else { ExitCode::from(EXIT_GATE_FAILED) })
}
