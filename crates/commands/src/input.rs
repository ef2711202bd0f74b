//! Loading a snapshot file for a command: a progress bar on a terminal for large files,
//! and the one-line [`Error`] when the file cannot be read (refused pickles apart).

use std::io::IsTerminal;
use std::path::Path;

use fragscope_snapshot::{ReadError, Snapshot};

use crate::{Error, ErrorKind};

/// Files larger than this get a progress bar (on a terminal, not with `--json`).
pub const PROGRESS_THRESHOLD: u64 = 64 * 1024 * 1024;

/// Reads a snapshot; `quiet` (e.g. `--json`) never shows a progress bar. `-` reads
/// standard input, as `_memory_viz.py` does (`ssh gpu cat snap.pickle | fragscope summary -`).
pub fn load(path: &Path, quiet: bool) -> Result<Snapshot, Error> {
    if path.as_os_str() == "-" {
        return fragscope_snapshot::read_from_checked(std::io::stdin().lock())
            .map(prepared)
            .map_err(|e| read_error(Path::new("<stdin>"), &e));
    }
    let size = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    let show = !quiet && size > PROGRESS_THRESHOLD && std::io::stderr().is_terminal();
    let result = if show {
        let bar = indicatif::ProgressBar::with_draw_target(Some(size), indicatif::ProgressDrawTarget::stderr());
        bar.set_style(
            indicatif::ProgressStyle::with_template("{msg} [{bar:40}] {bytes}/{total_bytes} ({eta})")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        bar.set_message(format!("reading {}", path.display()));
        let r = fragscope_snapshot::read_path_checked(path, &mut |done, _total| bar.set_position(done));
        bar.finish_and_clear();
        r
    } else {
        fragscope_snapshot::read_path_checked(path, &mut |_, _| {})
    };
    // Checked: a snapshot with impossible sizes or addresses (`fragscope_snapshot::bounds`)
    // is refused, so that no command's arithmetic meets them.
    result.map(prepared).map_err(|e| read_error(path, &e))
}

/// A snapshot as every command analyses it: what `skip_actions` left out restored where
/// the trace determines it, and how the file was recorded in `notes.recording`
/// ([`fragscope_snapshot::recording::prepare`]).
///
/// A trace without segment events whose replay from the recorded state is exact is said
/// to have started warm, not to have lost its segment events to `skip_actions`.
pub fn prepared(mut snap: Snapshot) -> Snapshot {
    fragscope_snapshot::recording::prepare_with(&mut snap, &|s, d| {
        let r = fragscope_replay::verify(s, d, &fragscope_replay::ReplayOptions::default());
        r.allocs > 0 && r.fully_matched() && r.divergences == 0 && r.final_state_matches != Some(false)
    });
    snap
}

/// The one line for a file that cannot be used (without the `error: ` prefix).
pub fn read_error(path: &Path, e: &ReadError) -> Error {
    let msg = match e {
        ReadError::Io(io) => format!("cannot read {}: {io}", path.display()),
        ReadError::Changed => format!("cannot read {}: {e}", path.display()),
        other => format!("{} is not a memory snapshot: {other}", path.display()),
    };
    let kind =
        if matches!(e, ReadError::Refused { .. }) { ErrorKind::RefusedPickle } else { ErrorKind::UnreadableSnapshot };
    Error::new(kind, vec![msg.into()])
}

/// Name shown for the built-in example snapshot.
pub const EXAMPLE_NAME: &str = "<built-in example>";

/// Runs `f` on the snapshots a command works on: each FILE in order, or, with none given,
/// the built-in example (so every command can be tried without a snapshot at hand). One
/// snapshot is in memory at a time. `f` may fail with a front end's own error type.
pub fn each_snapshot<R, E: From<Error>>(
    files: &[std::path::PathBuf],
    quiet: bool,
    mut f: impl FnMut(String, &Snapshot) -> Result<R, E>,
) -> Result<Vec<R>, E> {
    if files.is_empty() {
        return Ok(vec![f(EXAMPLE_NAME.to_string(), &crate::example::snapshot())?]);
    }
    let mut out = Vec::with_capacity(files.len());
    for file in files {
        let snap = load(file, quiet)?;
        out.push(f(file.display().to_string(), &snap)?);
    }
    Ok(out)
}
