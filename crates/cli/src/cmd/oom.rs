//! `fragscope oom [TEXT] [--json]`: explain a CUDA out-of-memory error from its text alone.
//!
//! TEXT is the error message (any PyTorch form, a whole traceback or log is fine); without
//! it, or with `-`, the text is read from stdin; if TEXT names an existing file, that file
//! is read. Prints the figures, what "reserved but unallocated" means in this message,
//! whether fragmentation is the likely cause, and the exact calls that record a snapshot
//! at the next OOM. Text with no OOM message in it: one line on stderr, exit code 2.

use std::fmt::Write as _;
use std::io::Read;
use std::path::Path;
use std::process::ExitCode;

use fragscope_commands::oom::{self, meaning};
use fragscope_oomtext::{format_size_pm, printed_precision, Likely, OomExplanation, OomMessage};

use crate::output::{bytes, grouped};
use crate::CliError;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The error text (quote it), a file holding it, or `-` / nothing to read stdin.
    pub text: Option<String>,
    /// Print JSON (schema `fragscope.oom/2`, see docs/json-schema.md) instead of text.
    #[arg(long)]
    pub json: bool,
}

fn read_input(args: &Args) -> Result<String, CliError> {
    match args.text.as_deref() {
        None | Some("-") => read_text(std::io::stdin().lock()),
        Some(t) if !t.contains('\n') && t.len() < 4096 && Path::new(t).is_file() => {
            let cannot = |e: std::io::Error| CliError::usage(format!("cannot read {t}: {e}"));
            let mut f = std::fs::File::open(t).map_err(cannot)?;
            let mut head = [0u8; 16];
            let n = fragscope_snapshot::read_up_to(&mut f, &mut head).map_err(cannot)?;
            if let Some(what) = fragscope_snapshot::binary_kind(&head[..n]) {
                return Err(CliError::usage(format!("{t} is {what}, not the text of an error: {}", instead(t, what))));
            }
            let mut bytes = head[..n].to_vec();
            f.read_to_end(&mut bytes).map_err(cannot)?;
            Ok(match String::from_utf8(bytes) {
                Ok(s) => s,
                Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
            })
        }
        // One word cannot be a message (every form has spaces): a path that is missing,
        // a directory or a device, said as such rather than "no OOM message found".
        Some(t) if !t.trim().contains(char::is_whitespace) => match std::fs::metadata(t) {
            Ok(m) if m.is_dir() => {
                Err(CliError::usage(format!("{t} is a directory, not a file holding the error's text")))
            }
            Ok(_) => Err(CliError::usage(format!(
                "{t} is not a regular file: pass the error's text, a file, or - for stdin"
            ))),
            Err(e) => Err(CliError::usage(format!("cannot read {t}: {e}"))),
        },
        Some(t) => Ok(t.to_string()),
    }
}

/// The most text read from stdin: a log holding an OOM message is megabytes, and stdin
/// may be endless (`fragscope oom < /dev/zero`).
const MAX_TEXT: u64 = 1 << 30;

/// The text on `r`, refused at the first NUL byte (text has none: it is binary data, or a
/// device of zeros) and past [`MAX_TEXT`], each with one line.
fn read_text(r: impl Read) -> Result<String, CliError> {
    let mut bytes = Vec::new();
    let mut r = r.take(MAX_TEXT + 1);
    let mut chunk = vec![0u8; 1 << 16];
    loop {
        let n = match r.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(CliError::usage(format!("cannot read stdin: {e}"))),
        };
        if bytes.is_empty() {
            if let Some(what) = fragscope_snapshot::binary_kind(&chunk[..n]) {
                return Err(CliError::usage(format!("stdin is {what}, not the text of an error")));
            }
        }
        if let Some(i) = chunk[..n].iter().position(|&b| b == 0) {
            return Err(CliError::usage(format!(
                "stdin holds a NUL byte at byte {}: binary data, not the text of an error",
                bytes.len() + i
            )));
        }
        bytes.extend_from_slice(&chunk[..n]);
        if bytes.len() as u64 > MAX_TEXT {
            return Err(CliError::usage(
                "stdin holds more than 1 GiB of text: pass the part of the log with the error",
            ));
        }
    }
    Ok(match String::from_utf8(bytes) {
        Ok(s) => s,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    })
}

/// What reads the file instead (`what`: [`fragscope_snapshot::binary_kind`]'s words).
/// Users pass the snapshot of the run that hit the OOM here; read as text, a multi-GB
/// pickle cost minutes and GBs of memory to find no message.
fn instead(t: &str, what: &str) -> String {
    let snapshot = format!("for a snapshot, `fragscope analyze {t}` explains its peak and any OOM it recorded");
    if what.starts_with("gzip") {
        format!("`zcat {t} | fragscope oom` reads a compressed log; {snapshot}")
    } else {
        format!("`fragscope oom` reads the message PyTorch printed; {snapshot}")
    }
}

pub fn run(args: &Args) -> Result<ExitCode, CliError> {
    let text = read_input(args)?;
    let explained = oom::explain_text(&text)?;
    let out = if args.json {
        oom::json(&explained)?
    } else if explained.len() == 1 {
        render_text(&explained[0].0, &explained[0].1)
    } else {
        let mut o = format!("{} out-of-memory messages in the text; each is explained on its own.\n", explained.len());
        for (i, (m, ex)) in explained.iter().enumerate() {
            let from = m.log_prefix.as_deref().map(|p| format!(" (lines prefixed [{p}])")).unwrap_or_default();
            let _ = write!(o, "\n=== Message {} of {}{from}\n", i + 1, explained.len());
            o.push_str(&render_text(m, ex));
        }
        o
    };
    crate::print_stdout(&out)?;
    Ok(ExitCode::SUCCESS)
}

fn render_text(m: &OomMessage, ex: &OomExplanation) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "{} out-of-memory error ({})", m.accelerator, m.form_text());
    for x in &m.inconsistent {
        let _ = writeln!(o, "Inconsistent: {x}");
    }
    if m.headerless {
        let _ =
            writeln!(o, "(the 'CUDA out of memory.' sentence is not in the text; its figures were read on their own)");
    }
    if !m.missing.is_empty() {
        let _ = writeln!(o, "Missing from the text: {}", m.missing.join(", "));
    }
    o.push('\n');
    let _ = writeln!(o, "Figures in the message:");
    // A figure derived by subtraction is shown as the range it may lie in, without a byte
    // count the message never had (`pm`: its ± uncertainty; 0 for a printed figure).
    let mut row_pm = |name: &str, v: Option<u64>, pm: u64, note: &str| {
        if let Some(v) = v {
            let note = if note.is_empty() { String::new() } else { format!("  ({note})") };
            if pm > 2 * printed_precision(v) {
                let _ = writeln!(o, "  {name:<28} {:>12}  {:>26}{note}", format_size_pm(v, pm), "");
            } else {
                let _ = writeln!(o, "  {name:<28} {:>12}  {:>20} bytes{note}", bytes(v), grouped(v));
            }
        }
    };
    let seg = format!("segment size asked of {}", m.accelerator);
    let mut row = |name: &str, v: Option<u64>, note: &str| row_pm(name, v, 0, note);
    row("Tried to allocate", m.tried_to_allocate, &seg);
    row("Total capacity", m.total_capacity, "");
    row(&format!("Free ({})", m.accelerator), m.free, "");
    row("Allowed (memory fraction)", m.allowed, "");
    row("Allocated by PyTorch", m.allocated_by_pytorch, "");
    row("Private pools (free)", m.private_pools, "");
    row_pm(
        "Reserved but unallocated",
        m.reserved_unallocated,
        m.reserved_unallocated_uncertainty,
        if m.reserved_unallocated_uncertainty > 2 * printed_precision(m.reserved_unallocated.unwrap_or(0)) {
            "reserved − allocated, each printed to 0.01 of its unit"
        } else {
            ""
        },
    );
    row_pm("Reserved in total", m.reserved_total, 0, "");
    row_pm(
        "Outside this allocator",
        m.outside_allocator(),
        m.outside_allocator_uncertainty(),
        "total − free − reserved",
    );
    if let Some(d) = m.device {
        let _ = writeln!(o, "  {:<28} {d}", "Device");
    }
    for p in &m.processes {
        let who = p.pid.map_or("this process".to_string(), |pid| format!("process {pid}"));
        let _ = writeln!(o, "  {:<28} {:>12}", format!("In use by {who}"), bytes(p.bytes));
    }
    o.push('\n');
    if let Some(s) = meaning(m) {
        let _ = writeln!(o, "What \"reserved but unallocated\" means here:\n  {s}\n");
    }
    let _ = writeln!(
        o,
        "Fragmentation the likely cause: {} (verdict: {})\n",
        match ex.verdict {
            Likely::Fragmentation => "yes",
            // the text cannot decide: never a "no" it does not have
            Likely::Borderline | Likely::Unclear => "cannot tell",
            _ => "no",
        },
        ex.verdict
    );
    let _ = write!(o, "{ex}");
    o
}
