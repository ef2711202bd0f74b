//! `window` for the commands that read snapshots (`summary`, `analyze`, `report`,
//! `export`): each file is cut to the window ([`fragscope_diagnose::cut_window`]) before
//! the command runs on it unchanged, and the command says what the window covered
//! ([`WindowInfo`]).

use std::path::PathBuf;

use fragscope_diagnose::{cut_window, WindowInfo, WindowSpec};
use fragscope_snapshot::Snapshot;

use crate::{input, Error};

/// The parsed window (`START..END`), or the argument error.
pub fn parse(text: Option<&str>) -> Result<Option<WindowSpec>, Error> {
    text.map(WindowSpec::parse).transpose().map_err(|e| Error::argument(vec![e.to_string().into()]))
}

/// Cuts `snap` to `spec` (file `name` for the error line). A window the trace does not
/// reach is about the input, not the request's syntax.
pub fn cut_or_error(name: &str, snap: &Snapshot, spec: &WindowSpec) -> Result<(Snapshot, WindowInfo), Error> {
    cut_window(snap, spec).map_err(|e| Error::input(format!("{name}: {e}")))
}

/// [`input::each_snapshot`] with the window applied: `f` gets the cut snapshot and what
/// the window covered (`None` without a window).
pub fn each_snapshot<R, E: From<Error>>(
    files: &[PathBuf],
    quiet: bool,
    spec: Option<&WindowSpec>,
    mut f: impl FnMut(String, &Snapshot, Option<WindowInfo>) -> Result<R, E>,
) -> Result<Vec<R>, E> {
    input::each_snapshot(files, quiet, |name, snap| match spec {
        None => f(name, snap, None),
        Some(w) => {
            let (cut, info) = cut_or_error(&name, snap, w)?;
            f(name, &cut, Some(info))
        }
    })
}
