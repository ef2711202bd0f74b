//! `fragscope report [FILE ...] [-o report.html]`: one self-contained HTML file (no
//! network request, opens from `file://`) with the memory timeline, the allocator state
//! at any moment, fragmentation over time and the findings. Several files are shown side
//! by side (ranks); two files are also compared (`diff`). The page is built by the
//! `fragscope-report` crate.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use fragscope_commands::fit::Request as FitRequest;
use fragscope_diagnose::{diff, DiffOptions};
use fragscope_report::{file_data_shared, write_report, ReportOptions};
use fragscope_snapshot::Snapshot;

use crate::CliError;
use fragscope_commands::input;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Snapshot files (pickles, optionally gzipped, or torch.profiler JSON traces).
    /// Without FILE: the built-in example snapshot.
    pub files: Vec<PathBuf>,
    /// Where to write the HTML file.
    #[arg(short = 'o', long = "output", default_value = "report.html")]
    pub output: PathBuf,
    /// Instead of writing the page: print, as JSON, the allocator state of each device
    /// at trace state N (0 = before the first event; N = after event N − 1), as the
    /// page's state view shows it there (its totals and every block), from its own
    /// backward walk.
    #[arg(long = "state-at", value_name = "N")]
    pub state_at: Option<usize>,
    /// Size budget of the state view, in 8-byte values (default 1.2 M, about 13 MB of
    /// page), shared by every device of every file: keyframes plus every event's changes
    /// when they fit, else as many keyframes as fit (the page then snaps to the nearest
    /// one), else coarse keyframes (small neighbouring blocks merged).
    #[arg(long = "state-budget", value_name = "VALUES")]
    pub state_budget: Option<usize>,
    /// Replay the candidate allocator settings on every device, as `analyze --what-if`
    /// does, and draw and table each replay in the "What if" view (without it, only
    /// devices with an OOM are replayed).
    #[arg(long = "what-if")]
    pub what_if: bool,
    /// Add view 4b, "make it fit": `fragscope fit`'s search on each file for these device
    /// sizes (bytes with a unit, or GPU names, comma-separated: 40GB, A100-40GB,L40S), its
    /// options drawn with their replayed peaks and margins.
    #[arg(long = "fit", value_name = "SIZE|GPU,...")]
    pub fit: Option<String>,
    #[command(flatten)]
    pub window: crate::windowed::WindowArg,
}

/// `fit`'s search on one file for `--fit`, as the page draws it (the document's file
/// entry); a file the search cannot answer (no trace to replay) gets `{"error": line}`,
/// said on its page, so that the other files' pages are still written.
fn fit_of(req: Option<&FitRequest>, name: &str, snap: &Snapshot) -> Result<Option<serde_json::Value>, CliError> {
    let Some(req) = req else { return Ok(None) };
    match fragscope_commands::fit::evaluate(&[name.to_string()], &[snap], req) {
        Ok(fit) => Ok(fit.files.first().map(|f| serde_json::to_value(f).unwrap_or(serde_json::Value::Null))),
        Err(e) if e.kind == fragscope_commands::ErrorKind::Input => {
            Ok(Some(serde_json::json!({ "error": e.render(fragscope_commands::Words::Cli) })))
        }
        Err(e) => Err(e.into()),
    }
}

/// Keeps the heap allocations under 32 MiB in glibc's heap, and its freed top, for reuse
/// rather than mapping each one afresh and returning it when freed (`fragscope` maps
/// every one of 1 MiB or more, [`fragscope_snapshot::return_large_frees`]): the report
/// makes and drops many arrays of a few MB (the role buckets' changes, the walks' side
/// tables, the page's text), and each new mapping was faulted in again, 4 KiB at a time.
/// On the 6.9 M-entry allocator-consistent benchmark file: 136 k page faults → 103 k,
/// ~5 % of the report's CPU (`perf stat -r 5`), for a peak RSS of 576 MB instead of
/// 474–507 (`/usr/bin/time`; 424 → 474 MB on the replicated one).
///
/// Two heaps ("arenas") for the whole process, not one per thread (glibc's default, up
/// to eight per core): the report's walks, roles, role buckets and keyframes run on five
/// threads, and what one thread freed in its own heap could not serve another's next
/// arrays, which were faulted in afresh. On the consistent benchmark file: page faults
/// 86 k → 77 k, peak RSS 521–532 → 463–469 MB (one heap: as few faults, but the threads
/// wait on its lock). Only the `report` command's process is changed; a no-op where the
/// C library is not glibc.
fn reuse_large_frees() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `mallopt` only sets tuning parameters of the C allocator; called before
    // the report's threads start.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 64 << 20);
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

pub fn run(args: &Args) -> Result<ExitCode, CliError> {
    reuse_large_frees();
    let example = args.files.is_empty();
    let spec = args.window.spec()?;
    // `--fit`'s capacities are checked before any file is read (one line, exit 2).
    let fit_req = match &args.fit {
        Some(c) if c.trim().is_empty() => {
            return Err(CliError::usage("--fit needs the device size to fit on (40GB, or GPU names: A100-40GB,L40S)"));
        }
        Some(c) => {
            let req = FitRequest { capacity: c.clone(), ..FitRequest::default() };
            req.check(1)?;
            Some(req)
        }
        None => None,
    };
    // A windowed page is titled with its window (`file [window 1000..5000]`).
    let titled = |name: String| match &spec {
        Some(w) => format!("{name} [window {}]", w.text),
        None => name,
    };
    if let Some(n) = args.state_at {
        let files = fragscope_commands::windowed::each_snapshot(&args.files, false, spec.as_ref(), |name, snap, _| {
            let devices = snap
                .devices()
                .into_iter()
                .map(|d| {
                    fragscope_report::state::state_at(snap, d, n).map_err(|e| CliError::usage(format!("{name}: {e}")))
                })
                .collect::<Result<Vec<_>, _>>()?;
            Ok::<_, CliError>(serde_json::json!({ "file": name, "devices": devices }))
        })?;
        println!("{}", serde_json::json!({ "state": n, "files": files }));
        return Ok(ExitCode::SUCCESS);
    }
    let mut opts = ReportOptions { what_if: args.what_if, ..ReportOptions::default() };
    if let Some(v) = args.state_budget {
        opts.state_values = v;
    }
    // The page's budgets are shared by its files (and each file's by its devices).
    let files = args.files.len().max(1);
    let each = opts.share(files);
    let page = Some((&opts, files));
    let (data, diff) = if let [a, b] = args.files.as_slice() {
        // Two runs: both in memory once, for the comparison of their peaks.
        let (mut sa, mut sb) = (input::load(a, false)?, input::load(b, false)?);
        if let Some(w) = &spec {
            sa = fragscope_commands::windowed::cut_or_error(&a.display().to_string(), &sa, w)?.0;
            sb = fragscope_commands::windowed::cut_or_error(&b.display().to_string(), &sb, w)?.0;
        }
        let d = diff(&sa, &sb, &DiffOptions::default());
        let mut data = [
            file_data_shared(&titled(a.display().to_string()), false, &sa, &each, page),
            file_data_shared(&titled(b.display().to_string()), false, &sb, &each, page),
        ];
        data[0].fit = fit_of(fit_req.as_ref(), &a.display().to_string(), &sa)?;
        data[1].fit = fit_of(fit_req.as_ref(), &b.display().to_string(), &sb)?;
        (data.into(), Some(d))
    } else {
        let data = fragscope_commands::windowed::each_snapshot(&args.files, false, spec.as_ref(), |name, snap, _| {
            let fit = fit_of(fit_req.as_ref(), &name, snap)?;
            Ok::<_, CliError>(fragscope_report::FileData {
                fit,
                ..file_data_shared(&titled(name), example, snap, &each, page)
            })
        })?;
        (data, None)
    };
    // Written as it is made (the page's JSON never a string of its own), through a
    // temporary file renamed over the target.
    let mut bytes = 0;
    fragscope_commands::outfile::write_file(&args.output, |w| {
        bytes = write_report(w, &data, diff.as_ref())?;
        Ok(())
    })
    .map_err(|e| CliError::usage(format!("cannot write {}: {e}", args.output.display())))?;
    eprintln!("wrote {} ({} bytes)", crate::output::escape_text(&args.output.display().to_string(), false), bytes);
    Ok(ExitCode::SUCCESS)
}

/// Writes `bytes` to `path` through an exclusive temporary file beside it, renamed over
/// `path` ([`fragscope_commands::outfile`]), so a failed run never leaves a partial report
/// behind and a FIFO, device or symlink at `path` is refused, never replaced.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), CliError> {
    fragscope_commands::outfile::write_bytes(path, bytes)
        .map_err(|e| CliError::usage(format!("cannot write {}: {e}", path.display())))
}
