//! `fragscope plant-leak FILE -o OUT (--site SITE | --stack-of ENTRY | --allocs I,J,...)
//! [--device D] [--shape SHAPE] [--cpp-only]` (hidden, for testing the leak detector on
//! your own files): drops the frees of a call site's allocations in the trace, keeping
//! the final state consistent (`fragscope_plant`), and writes the planted
//! snapshot with fragscope's pickle writer. Then `fragscope analyze OUT` should name the
//! site among its leak suspects.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use fragscope_plant::{self as plant, Shape};
use fragscope_trace::site_of;

use crate::output::bytes;
use crate::CliError;
use fragscope_commands::input;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The snapshot to plant into (it is not changed).
    pub file: PathBuf,
    /// Where to write the planted snapshot (pickle protocol 4).
    #[arg(short, long)]
    pub output: PathBuf,
    /// Device whose trace gets the leak.
    #[arg(long, default_value_t = 0)]
    pub device: i64,
    /// Call site to leak, as `analyze` names it (`model.py:42:forward`); else any
    /// alloc whose stack has a frame `file:line:function` containing this text.
    #[arg(long, conflicts_with_all = ["stack_of", "allocs"])]
    pub site: Option<String>,
    /// Leak the call site of this trace entry (an index of the device's trace).
    #[arg(long, conflicts_with = "allocs")]
    pub stack_of: Option<usize>,
    /// Leak exactly these allocs (trace indices, comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub allocs: Option<Vec<usize>>,
    /// Which of the site's freed allocs leak: `all`, `window:A-B[,C-D]` (shares of the
    /// trace), `burst:AT:COUNT`, `stride:N`.
    #[arg(long, default_value = "all")]
    pub shape: String,
    /// First give the site's allocations stacks of their C++ frames only.
    #[arg(long)]
    pub cpp_only: bool,
}

/// Trace indices of the allocs whose stack matches `text` (module doc of `--site`).
fn allocs_matching(snap: &fragscope_snapshot::Snapshot, device: i64, text: &str) -> Vec<usize> {
    snap.trace(device)
        .iter()
        .enumerate()
        .filter(|(_, e)| e.action == fragscope_snapshot::Action::Alloc)
        .filter(|(_, e)| {
            e.stack.is_some_and(|s| {
                snap.frames.resolved(s).any(|(f, l, n)| {
                    let base = f.rsplit(['/', '\\']).next().unwrap_or(f);
                    format!("{base}:{l}:{n}").contains(text) || format!("{f}:{l}:{n}").contains(text)
                })
            })
        })
        .map(|(i, _)| i)
        .collect()
}

pub fn run(args: &Args) -> Result<ExitCode, CliError> {
    let mut snap = input::load(&args.file, false)?;
    let device = args.device;
    let trace_len = snap.trace(device).len();
    if trace_len == 0 {
        return Err(CliError::usage(format!("{}: device {device} has no trace", args.file.display())));
    }
    let shape = Shape::parse(&args.shape).map_err(CliError::usage)?;
    let sites = plant::site_allocs(&snap, device);
    let mut chosen: Vec<usize> = if let Some(v) = &args.allocs {
        v.clone()
    } else {
        let site = match (&args.site, args.stack_of) {
            (_, Some(i)) => {
                let e = snap.trace(device).get(i).ok_or_else(|| {
                    CliError::usage(format!("--stack-of {i}: the trace of device {device} has {trace_len} entries"))
                })?;
                Some(site_of(&snap.frames, e.stack).site)
            }
            (Some(s), None) => sites.iter().any(|x| &x.site == s).then(|| s.clone()),
            (None, None) => return Err(CliError::usage("say what to leak: --site, --stack-of or --allocs")),
        };
        match site {
            Some(s) => {
                if args.cpp_only && plant::strip_python_frames(&mut snap, device, &s) == 0 {
                    return Err(CliError::usage(format!("{s}: its stacks have no C++ frames to keep")));
                }
                sites.iter().find(|x| x.site == s).map(|x| x.freed.clone()).unwrap_or_default()
            }
            None => {
                let text = args.site.as_deref().unwrap_or_default();
                let m = allocs_matching(&snap, device, text);
                if m.is_empty() {
                    return Err(CliError::usage(format!("no alloc of device {device} matches `{text}`")));
                }
                m
            }
        }
    };
    chosen.sort_unstable();
    let chosen = shape.pick(&chosen, trace_len);
    let (planted, what) = plant::plant(&snap, device, &chosen).map_err(CliError::usage)?;
    fragscope_commands::outfile::save_snapshot(&planted, &args.output)
        .map_err(|e| CliError::usage(format!("cannot write {}: {e}", args.output.display())))?;
    let mut o = String::new();
    let _ = writeln!(
        o,
        "planted {} never-freed blocks ({}) on device {device} at {}; written to {}",
        what.allocs.len(),
        bytes(what.bytes),
        what.sites.join(", "),
        args.output.display()
    );
    let _ = writeln!(
        o,
        "first leaked alloc at trace entry {}, last at {}",
        what.allocs.first().copied().unwrap_or(0),
        what.allocs.last().copied().unwrap_or(0)
    );
    crate::print_stdout(&o)?;
    Ok(ExitCode::SUCCESS)
}
