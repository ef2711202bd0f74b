//! A torch.save archive that arrives on a stream (`cat snapshot.pt | fragscope summary -`)
//! is spilled to a temporary file, because the zip reader seeks (the central directory, which
//! names the entries, is at the archive's end). Holding the archive in memory instead made
//! memory grow with the input: a 3 GB stream took 2.1 GB of RSS before it was refused
//! (issue 43). On disk, memory stays at the copy buffer's size whatever the stream holds.
//!
//! * **Budget**: at most [`MAX_SPILL`] bytes are spilled (more than any torch.save of a
//!   memory snapshot holds); past it the read stops with [`ReadError::Limit`]. A gzip'd
//!   archive is bounded sooner, by the inflation limit ([`crate::budget::Inflated`]).
//! * **The file** ([`SpillFile`]) is created exclusively (`O_CREAT|O_EXCL`, so a symlink
//!   planted at its name is never followed) under an unpredictable name in the system's
//!   temporary folder (`TMPDIR`), readable by its owner only; on Unix its name is removed
//!   at once, so that nothing is left behind even when the process is killed, and
//!   elsewhere it is removed on drop.

use std::fs::File;
use std::io::{self, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::PathBuf;

use crate::ReadError;

/// The most bytes of a torch.save archive spilled from a stream: a memory snapshot's
/// pickle is at most a few GB (its trace ring buffer has a fixed number of entries).
pub const MAX_SPILL: u64 = 64 << 30;

/// A temporary file holding a spilled stream; removed when dropped.
#[derive(Debug)]
pub struct SpillFile {
    file: File,
    /// The name still to remove on drop (`None` where it was removed at once).
    path: Option<PathBuf>,
}

impl SpillFile {
    /// Creates an empty temporary file in the system's temporary folder.
    fn create() -> io::Result<SpillFile> {
        let dir = std::env::temp_dir();
        // A name taken (a leftover, another user's file or symlink) is skipped, never
        // opened; a few tries are plenty with 64 random bits.
        for _ in 0..16 {
            let path = dir.join(format!("fragscope-stdin-{:016x}.zip", random_u64()));
            let mut opts = std::fs::OpenOptions::new();
            opts.read(true).write(true).create_new(true);
            #[cfg(unix)]
            std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
            match opts.open(&path) {
                Ok(file) => {
                    // On Unix the open file outlives its name: removing the name now leaves
                    // nothing behind whatever happens to this process.
                    if cfg!(unix) && std::fs::remove_file(&path).is_ok() {
                        return Ok(SpillFile { file, path: None });
                    }
                    return Ok(SpillFile { file, path: Some(path) });
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        }
        Err(io::Error::new(io::ErrorKind::AlreadyExists, "no free temporary file name"))
    }
}

impl Drop for SpillFile {
    fn drop(&mut self) {
        if let Some(p) = self.path.take() {
            let _ = std::fs::remove_file(p);
        }
    }
}

impl Read for SpillFile {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.file.read(buf)
    }
}

impl Seek for SpillFile {
    fn seek(&mut self, pos: SeekFrom) -> io::Result<u64> {
        self.file.seek(pos)
    }
}

/// 64 unpredictable bits: std's `RandomState` draws its SipHash keys from the OS's random
/// source (as `commands::outfile` does; no `tempfile` dependency in the reader).
fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(std::process::id() as u64);
    h.finish()
}

/// Copies the rest of `r` to a new [`SpillFile`], at most `limit` bytes, and returns it
/// rewound. Past `limit`: [`ReadError::Limit`]; a temporary file that cannot be created or
/// written (a full disk): a one-line I/O error saying where and what to do.
pub fn spill<R: Read>(r: R, limit: u64) -> Result<SpillFile, ReadError> {
    let dir = std::env::temp_dir();
    let where_ = |e: io::Error| {
        ReadError::Io(io::Error::new(
            e.kind(),
            format!(
                "a torch.save archive on a stream is copied to a temporary file in {} (the zip reader \
                 seeks), which failed: {e}; set TMPDIR to a folder with room, or pass the file's path",
                dir.display()
            ),
        ))
    };
    let mut out = SpillFile::create().map_err(where_)?;
    let mut w = BufWriter::with_capacity(1 << 16, &mut out.file);
    let mut src = r.take(limit.saturating_add(1));
    let mut buf = vec![0u8; 1 << 16];
    let mut n = 0u64;
    loop {
        let k = match src.read(&mut buf) {
            Ok(0) => break,
            Ok(k) => k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            // The reader's own errors (an inflation limit, a damaged gzip stream) as they are.
            Err(e) => return Err(ReadError::from(e)),
        };
        n += k as u64;
        if n > limit {
            return Err(ReadError::Limit(format!(
                "a torch.save archive on a stream longer than {}, more than any memory snapshot holds \
                 (pass the file's path to read it in place)",
                crate::budget::size(limit)
            )));
        }
        w.write_all(&buf[..k]).map_err(where_)?;
    }
    w.flush().map_err(where_)?;
    drop(w);
    out.file.seek(SeekFrom::Start(0)).map_err(where_)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_is_spilled_whole_and_rewound() {
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let mut f = spill(&data[..], 1 << 20).unwrap();
        let mut back = Vec::new();
        f.read_to_end(&mut back).unwrap();
        assert_eq!(back, data);
        // Seekable, as the zip reader needs.
        f.seek(SeekFrom::Start(7)).unwrap();
        let mut b = [0u8; 1];
        f.read_exact(&mut b).unwrap();
        assert_eq!(b[0], 7);
    }

    #[test]
    fn a_stream_past_the_limit_is_refused_after_limit_bytes() {
        // An endless stream: the copy stops one byte past the limit.
        let e = spill(io::repeat(b'P'), 100_000).unwrap_err().to_string();
        assert!(e.starts_with("refusing: a torch.save archive on a stream longer than 97.7 KiB"), "{e}");
        let e = spill(&[0u8; 100_001][..], 100_000).unwrap_err().to_string();
        assert!(e.contains("longer than 97.7 KiB"), "{e}");
        assert!(spill(&[0u8; 100_000][..], 100_000).is_ok());
    }

    #[cfg(unix)]
    #[test]
    fn the_spill_file_has_no_name_in_the_temporary_folder() {
        use std::os::unix::fs::MetadataExt;
        let f = spill(&b"PK\x03\x04 data"[..], 1 << 20).unwrap();
        // No directory entry links to it: nothing is left behind, even by a killed process.
        assert_eq!(f.file.metadata().unwrap().nlink(), 0);
        assert!(f.path.is_none());
    }
}
