//! Output files written safely: every file the product writes (`report -o`, `predict
//! --report`, `export`'s tables, `replay --save-snapshot`, `plant-leak -o`, Python's
//! `Snapshot.save` and `Report.save`) goes through here.
//!
//! * The target must be a regular file or absent. A directory, FIFO, device node or socket
//!   is refused, and so is a symlink (even one to a regular file): renaming over it would
//!   turn `/dev/full` or a FIFO into a regular file, and writing through it writes where
//!   the user did not name.
//! * The bytes go to a temporary file beside the target (same folder, so same filesystem
//!   and the rename is atomic), created exclusively (`create_new`, `O_CREAT|O_EXCL`: a
//!   symlink planted at that name is never followed) under an unpredictable name, synced,
//!   then renamed over the target. `rename` replaces the directory entry itself, so a
//!   symlink swapped in after the check is replaced, its target never written. A failure
//!   removes the temporary file and leaves the old target intact.
//! * Several files that belong together ([`Staged`], export's tables) are renamed only
//!   once every one of them was written.
//!
//! No `tempfile` dependency: it would add `fastrand`, `rustix`, `linux-raw-sys` and
//! `bitflags` to the product for the few lines [`Staged::new`] holds. The name's
//! randomness comes from std's `RandomState`, whose SipHash keys are drawn from the OS's
//! random source; `create_new` is what makes the temporary file safe, the randomness only
//! keeps another user from squatting on its name.
//!
//! Principal types: [`Staged`] (a written temporary file waiting for its rename) and the
//! one-call [`write_file`].

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

/// Refuses a target that is not a regular file or absent (the `io::Error`'s message says
/// what it is, for a one-line "cannot write PATH: ..." error).
pub fn check_target(target: &Path) -> io::Result<()> {
    let meta = match std::fs::symlink_metadata(target) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    let ft = meta.file_type();
    if ft.is_file() {
        return Ok(());
    }
    let what = if ft.is_symlink() {
        "it is a symlink (fragscope does not write through or replace one; name the file it points to, or another path)"
    } else if ft.is_dir() {
        "it is a directory"
    } else {
        non_file_kind(&ft)
    };
    Err(io::Error::new(io::ErrorKind::InvalidInput, what))
}

#[cfg(unix)]
fn non_file_kind(ft: &std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if ft.is_fifo() {
        "it is a FIFO, not a regular file"
    } else if ft.is_block_device() || ft.is_char_device() {
        "it is a device, not a regular file"
    } else if ft.is_socket() {
        "it is a socket, not a regular file"
    } else {
        "it is not a regular file"
    }
}

#[cfg(not(unix))]
fn non_file_kind(_: &std::fs::FileType) -> &'static str {
    "it is not a regular file"
}

/// A temporary file beside its target, to be renamed over it by [`Staged::commit`];
/// dropped without a commit (an error, a panic), it is removed.
#[derive(Debug)]
pub struct Staged {
    target: PathBuf,
    tmp: PathBuf,
    committed: bool,
}

impl Staged {
    /// Checks `target` ([`check_target`]) and creates the temporary file beside it,
    /// exclusively; returns it open for writing.
    pub fn new(target: &Path) -> io::Result<(Staged, File)> {
        check_target(target)?;
        let dir = match target.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        let name = target
            .file_name()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "the path has no file name"))?
            .to_string_lossy();
        // A name taken (by a leftover or someone else's file or symlink) is skipped, never
        // opened; a few tries are plenty with 64 random bits.
        for _ in 0..16 {
            let tmp = dir.join(format!(".{name}.{:016x}.tmp", random_u64()));
            match std::fs::OpenOptions::new().write(true).create_new(true).open(&tmp) {
                Ok(f) => return Ok((Staged { target: target.to_path_buf(), tmp, committed: false }, f)),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        }
        Err(io::Error::new(io::ErrorKind::AlreadyExists, "no free temporary file name beside it"))
    }

    /// The target this file will replace.
    pub fn target(&self) -> &Path {
        &self.target
    }

    /// Renames the temporary file over the target (checked again just before, so that a
    /// target that became a FIFO or symlink meanwhile is refused, not replaced).
    pub fn commit(mut self) -> io::Result<()> {
        check_target(&self.target)?;
        std::fs::rename(&self.tmp, &self.target)?;
        self.committed = true;
        Ok(())
    }

    /// Commits every staged file, in order, once all of them were written: the caller
    /// builds the whole list first, so a failure while writing any of them drops them all
    /// and leaves every target as it was. Every target is checked before the first rename.
    pub fn commit_all(staged: Vec<Staged>) -> io::Result<()> {
        for s in &staged {
            check_target(&s.target).map_err(|e| with_path(&s.target, e))?;
        }
        for s in staged {
            let target = s.target.clone();
            s.commit().map_err(|e| with_path(&target, e))?;
        }
        Ok(())
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// `e` with the path it concerns in front (for [`Staged::commit_all`], whose caller does
/// not know which file failed).
fn with_path(path: &Path, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

/// Writes `target` through a [`Staged`] temporary file: `write` fills it, then it is
/// flushed, synced and renamed over `target`. On any error `target` is untouched.
pub fn write_file(target: &Path, write: impl FnOnce(&mut BufWriter<File>) -> io::Result<()>) -> io::Result<()> {
    let (staged, file) = Staged::new(target)?;
    let mut w = BufWriter::with_capacity(1 << 20, file);
    write(&mut w)?;
    let file = w.into_inner().map_err(|e| e.into_error())?;
    file.sync_all()?;
    drop(file);
    staged.commit()
}

/// [`write_file`] of bytes already in memory.
pub fn write_bytes(target: &Path, bytes: &[u8]) -> io::Result<()> {
    write_file(target, |w| w.write_all(bytes))
}

/// 64 unpredictable bits: a fresh `RandomState` (SipHash keyed from the OS's random
/// source) hashing the time and the process id.
fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    h.write_u128(now);
    h.write_u32(std::process::id());
    h.finish()
}

/// Writes `snap` as a pickle PyTorch's viewers read ([`write_file`] around
/// [`write_snapshot`](fragscope_snapshot::pickle::write::write_snapshot)).
pub fn save_snapshot(snap: &fragscope_snapshot::Snapshot, target: &Path) -> io::Result<()> {
    write_file(target, |w| fragscope_snapshot::pickle::write::write_snapshot(snap, w))
}
