//! `fragscope`: explain CUDA out-of-memory errors and fragmentation from PyTorch memory
//! snapshots (`torch.cuda.memory._dump_snapshot`).
//!
//! The command line lives in this library so that every front end runs the same code:
//! the `fragscope` binary (`src/main.rs`) and the Python package's `fragscope` command
//! both call [`run_cli`] with their arguments. What a command computes and the JSON it
//! answers with are [`fragscope_commands`]' (which the Python module and the MCP server
//! call too); this crate holds the clap arguments, turns them into the library's requests,
//! and renders text.
//!
//! Adding a command: its request, work and document in `crates/commands/src/<name>.rs`;
//! here `cmd/<name>.rs` with `Args` (clap), `Args::request()`, the text rendering and
//! `run(&Args) -> Result<ExitCode, CliError>`, then one variant in [`Command`] and one arm
//! in [`Command::run`].
//!
//! Exit codes: 0 ok, 1 a `check` gate failed, 2 bad usage or unreadable input.

pub mod cmd;
pub mod output;
pub mod windowed;

use std::io::Write;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(name = "fragscope", version, about, long_about = None, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Memory figures of a snapshot as memory_summary() names them, fragmentation, and
    /// what the recorded trace covers. Without FILE: the built-in example.
    Summary(cmd::summary::Args),
    /// Replay a snapshot's trace through the allocator model: --verify checks the model
    /// against the recording; otherwise simulate other settings (--config) or GPU sizes
    /// (--capacity).
    Replay(cmd::replay::Args),
    /// Explain a snapshot, most important first: the OOM (fragmentation, exhaustion or
    /// stranded memory, and the settings a replay shows would have avoided it),
    /// fragmentation over time, leak suspects, call sites at the peaks, recommendations.
    Analyze(cmd::analyze::Args),
    /// Explain a CUDA out-of-memory error from its text (argument, file or stdin): the
    /// figures, whether fragmentation is the likely cause, and what to record next.
    Oom(cmd::oom::Args),
    /// Compare two snapshots: peak allocated / reserved / fragmentation per device and
    /// the call sites whose live memory at the peak changed most.
    Diff(cmd::diff::Args),
    /// Gate for CI: exit 1 when a snapshot breaks a memory budget (--max-reserved,
    /// --max-allocated, --max-peak-fragmentation, --no-leaks), 0 otherwise; 2 when no
    /// limit is given.
    Check(cmd::check::Args),
    /// One self-contained HTML file (offline, opens from file://): memory timeline,
    /// allocator state at any moment, fragmentation, findings. Without FILE: the example.
    Report(cmd::report::Args),
    /// Predict memory at a size nobody recorded (batch size, sequence length, ...) from
    /// recordings of the same program at two or more sizes, replayed through the
    /// allocator model; --capacity says whether it fits, --max-fit finds the largest size.
    Predict(cmd::predict::Args),
    /// The cheapest changes that make a recorded run fit on a device size or GPUs
    /// (--capacity 40GB, A100-40GB,L40S): allocator settings, set_to_none, empty_cache(),
    /// activation checkpointing, ZeRO, a smaller size (--sizes), each replayed; or of a run
    /// predicted at another size (--sizes ... --at N).
    Fit(cmd::fit::Args),
    /// Write a snapshot as tables for SQL and dataframes (Parquet: trace events,
    /// allocations, segments, blocks, stacks, frames, annotations; docs/export.md).
    #[cfg(feature = "export")]
    Export(cmd::export::Args),
    /// The allocator state at one moment (a trace entry or a time): totals, free space
    /// and fragmentation, and who holds the memory (by call site or annotation).
    State(cmd::state::Args),
    /// Serve fragscope's tools to coding agents over the Model Context Protocol (stdio):
    /// provided by the Python package with its `[mcp]` extra (`pip install '.[mcp]'`).
    Mcp(cmd::mcp::Args),
    /// (For testing the leak detector.) Drop the frees of a call site's allocations in a
    /// snapshot's trace, keeping the final state consistent, and write the result.
    #[command(name = "plant-leak", hide = true)]
    PlantLeak(cmd::plant::Args),
}

impl Command {
    fn run(&self) -> Result<ExitCode, CliError> {
        match self {
            Command::Summary(a) => cmd::summary::run(a),
            Command::Replay(a) => cmd::replay::run(a),
            Command::Analyze(a) => cmd::analyze::run(a),
            Command::Oom(a) => cmd::oom::run(a),
            Command::Diff(a) => cmd::diff::run(a),
            Command::Check(a) => cmd::check::run(a),
            Command::Report(a) => cmd::report::run(a),
            Command::Predict(a) => cmd::predict::run(a),
            Command::Fit(a) => cmd::fit::run(a),
            Command::PlantLeak(a) => cmd::plant::run(a),
            #[cfg(feature = "export")]
            Command::Export(a) => cmd::export::run(a),
            Command::State(a) => cmd::state::run(a),
            Command::Mcp(a) => cmd::mcp::run(a),
        }
    }
}

/// An error that ends the command with one line on stderr.
#[derive(Debug)]
pub struct CliError {
    pub message: String,
    pub code: u8,
}

/// Every error of the library commands ends the command with exit code 2; its message
/// names parameters as flags.
impl From<fragscope_commands::Error> for CliError {
    fn from(e: fragscope_commands::Error) -> Self {
        CliError::usage(e.render(fragscope_commands::Words::Cli))
    }
}

impl CliError {
    /// Bad usage or unreadable input (exit code 2); `message` is a text or a library's
    /// error, in its words.
    pub fn usage(message: impl std::fmt::Display) -> Self {
        CliError { message: message.to_string(), code: 2 }
    }
}

/// Exit code for a `check` gate that failed.
pub const EXIT_GATE_FAILED: u8 = 1;

/// Runs the command line on `args` (the program name first, as in `std::env::args_os`) and
/// returns its exit code: 0 ok, 1 a `check` gate failed, 2 bad usage or unreadable input.
/// Errors are printed as one line on stderr; `--help` and usage errors are printed by clap.
pub fn run_cli<I, T>(args: I) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind;
            // --help, --version and the help shown for a missing subcommand: clap's own
            // rendering. An argument error: one line, as every other error.
            if !e.use_stderr() || e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
                let _ = e.print();
                return if e.use_stderr() { 2 } else { 0 };
            }
            let _ = writeln!(std::io::stderr(), "{}", one_line_usage_error(&e.render().to_string()));
            return 2;
        }
    };
    match cli.command.run() {
        Ok(code) => {
            if code == ExitCode::SUCCESS {
                0
            } else if code == ExitCode::from(EXIT_GATE_FAILED) {
                EXIT_GATE_FAILED
            } else {
                2
            }
        }
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "error: {}", output::escape_text(&e.message, false));
            e.code
        }
    }
}

/// A clap error as one line: its lines (the error, any tip and possible values, the usage)
/// joined with `; `, without the closing "For more information, try '--help'." (the usage
/// says what to run). clap writes them on up to 18 lines.
fn one_line_usage_error(rendered: &str) -> String {
    let mut line = String::new();
    for part in rendered.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with("For more information")) {
        if !line.is_empty() {
            // "the following required arguments were not provided: <B>"
            line.push_str(if line.ends_with(':') { " " } else { "; " });
        }
        line.push_str(part);
    }
    output::escape_text(&line, false).into_owned()
}

/// Writes to stdout, terminal escapes in it escaped ([`output::escape_text`]); a closed
/// pipe (`fragscope summary | head`) ends quietly.
pub fn print_stdout(text: &str) -> Result<(), CliError> {
    let text = output::escape_text(text, true);
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|_| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(CliError { message: format!("cannot write output: {e}"), code: 2 }),
    }
}
