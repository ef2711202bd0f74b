//! `--window START..END` for the commands that read snapshots (`summary`, `analyze`,
//! `report`, `export`): each file is cut to the window
//! ([`fragscope_diagnose::window::cut`]) before the command runs on it unchanged, and
//! the command prints what the window covered ([`WindowInfo`]).

use std::path::PathBuf;

use fragscope_diagnose::window::{cut, WindowInfo, WindowSpec};
use fragscope_snapshot::Snapshot;

use crate::{input, CliError};

/// The `--window` option, flattened into a command's arguments.
#[derive(clap::Args, Debug, Default, Clone)]
pub struct WindowArg {
    /// Only a stretch of the trace, half-open: by trace entry index (`1000..5000`) or by
    /// time since the file's first trace entry (`12.5s..14s`, `200ms..`, `..3s`). The
    /// allocator state at the window's end is rebuilt from the recorded one by the
    /// backward walk; figures then cover the window only.
    #[arg(long, value_name = "START..END")]
    pub window: Option<String>,
}

impl WindowArg {
    /// The parsed window, or the usage error.
    pub fn spec(&self) -> Result<Option<WindowSpec>, CliError> {
        self.window.as_deref().map(WindowSpec::parse).transpose().map_err(CliError::usage)
    }
}

/// Cuts `snap` to `spec` (file `name` for the error line).
pub fn cut_or_error(name: &str, snap: &Snapshot, spec: &WindowSpec) -> Result<(Snapshot, WindowInfo), CliError> {
    cut(snap, spec).map_err(|e| CliError::usage(format!("{name}: {e}")))
}

/// [`input::each_snapshot`] with the window applied: `f` gets the cut snapshot and what
/// the window covered (`None` without `--window`).
pub fn each_snapshot<R>(
    files: &[PathBuf],
    quiet: bool,
    spec: Option<&WindowSpec>,
    mut f: impl FnMut(String, &Snapshot, Option<WindowInfo>) -> Result<R, CliError>,
) -> Result<Vec<R>, CliError> {
    input::each_snapshot(files, quiet, |name, snap| match spec {
        None => f(name, snap, None),
        Some(w) => {
            let (cut, info) = cut_or_error(&name, snap, w)?;
            f(name, &cut, Some(info))
        }
    })
}
