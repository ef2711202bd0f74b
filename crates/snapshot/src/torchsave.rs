//! Snapshots saved with `torch.save`, as PyTorch's guides tell users to write them
//! (`torch.save(torch.cuda.memory_snapshot(), "memory_snapshot.pt")`, or of
//! `torch.cuda.memory._snapshot()`), in both of torch.save's forms:
//!
//! * the **zip archive** (default since PyTorch 1.6): one top-level folder named after the
//!   file, holding `data.pkl` (the object, pickle protocol 2), `byteorder`, `version` and,
//!   for tensors, `data/<key>` storages. Entries are stored uncompressed by torch; a
//!   re-zipped (deflated) archive is read too. The archive is read with the `zip` crate
//!   (default features off: stored and deflate only, four small crates), rather than by
//!   hand, so that zip64 and data descriptors are handled by well-tested code.
//! * the **legacy stream** (`_use_new_zipfile_serialization=False`): consecutive pickles —
//!   the magic number, the protocol version 1001, a dict of system info, then the object,
//!   then the list of storage keys.
//!
//! Only the object's pickle is interpreted, by the same data-only reader as any snapshot:
//! a file holding tensors needs a class (`torch._utils._rebuild_tensor_v2`) and storages
//! (persistent ids), and is refused with the usual one-line error.

use std::io::{BufRead, BufReader, Read, Seek};

use crate::{ReadError, Snapshot};

/// First bytes of a zip archive (a local file header).
pub const ZIP_MAGIC: &[u8] = b"PK\x03\x04";

/// The first pickle of a legacy torch.save stream: protocol 2, LONG1 of 10 bytes holding
/// `MAGIC_NUMBER = 0x1950A86A20F9469CFC6C` (little-endian), STOP.
pub const LEGACY_MAGIC: &[u8] = b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19\x2e";

fn shape(what: impl Into<String>) -> ReadError {
    ReadError::Shape(what.into())
}

/// Reads the snapshot pickled in a torch.save zip archive's `data.pkl`.
pub fn read_zip<R: Read + Seek>(r: R) -> Result<Snapshot, ReadError> {
    let mut z = zip::ZipArchive::new(r).map_err(|e| shape(format!("unreadable zip archive: {e}")))?;
    // `<archive>/data.pkl` (torch.save), or a bare `data.pkl`; never one in a deeper folder.
    let names: Vec<String> = z.file_names().map(str::to_string).collect();
    let Some(name) = names.iter().find(|n| n.split('/').count() <= 2 && n.rsplit('/').next() == Some("data.pkl"))
    else {
        let mut shown: Vec<&str> = names.iter().map(String::as_str).take(4).collect();
        if names.len() > 4 {
            shown.push("...");
        }
        return Err(shape(format!(
            "a zip archive without data.pkl, so not a torch.save file (entries: {})",
            if shown.is_empty() { "none".to_string() } else { shown.join(", ") }
        )));
    };
    let entry = z.by_name(name).map_err(|e| shape(format!("zip entry {name}: {e}")))?;
    // A deflated entry is bounded like a gzip stream; a stored one inflates nothing.
    let compressed = std::rc::Rc::new(std::cell::Cell::new(entry.compressed_size()));
    let mut entry = crate::budget::Inflated { inner: entry, compressed, out: 0, what: "zip entry data.pkl" };
    let (snap, _) = crate::pickle::load::read_pickle(BufReader::with_capacity(1 << 16, &mut entry), &mut |_| {})?;
    // The entry's CRC-32 is checked at its end, which the pickle's STOP comes before.
    crate::drain(&mut entry, "zip entry")?;
    Ok(snap)
}

/// Reads a legacy torch.save stream: skips the magic number, protocol version and system
/// info pickles, then reads the object's pickle.
pub fn read_legacy<R: BufRead>(mut r: R) -> Result<Snapshot, ReadError> {
    let mut magic = [0u8; LEGACY_MAGIC.len()];
    r.read_exact(&mut magic)?;
    if magic != LEGACY_MAGIC {
        return Err(shape("not a legacy torch.save stream"));
    }
    let mut off = magic.len() as u64;
    for what in ["protocol version", "system info"] {
        off += skip_header_pickle(&mut r, off).map_err(|e| match e {
            ReadError::Corrupt { what: w, offset } => {
                ReadError::Corrupt { what: format!("legacy torch.save {what}: {w}"), offset }
            }
            other => other,
        })?;
    }
    // The storage keys after the object are never read: a snapshot holds no storage, and
    // a persistent id in the object would already have been refused.
    crate::pickle::load::read_pickle(r, &mut |_| {}).map(|(s, _)| s)
}

/// Skips one small header pickle (an int or a dict of ints and bools) without building
/// it; returns its length. Only the opcodes pickle protocol 2 uses for such values are
/// accepted.
fn skip_header_pickle<R: BufRead>(r: &mut R, start: u64) -> Result<u64, ReadError> {
    let mut n = 0u64;
    let byte = |r: &mut R, n: &mut u64| -> Result<u8, ReadError> {
        let mut b = [0u8; 1];
        r.read_exact(&mut b)?;
        *n += 1;
        Ok(b[0])
    };
    let skip = |r: &mut R, n: &mut u64, k: u64| -> Result<(), ReadError> {
        let got = std::io::copy(&mut r.by_ref().take(k), &mut std::io::sink())?;
        *n += got;
        if got < k {
            return Err(ReadError::Truncated { offset: start + *n });
        }
        Ok(())
    };
    let le = |r: &mut R, n: &mut u64, k: usize| -> Result<u64, ReadError> {
        let mut b = [0u8; 8];
        r.read_exact(&mut b[..k])?;
        *n += k as u64;
        Ok(u64::from_le_bytes(b))
    };
    for _ in 0..4096 {
        let op = byte(r, &mut n)?;
        match op {
            b'.' => return Ok(n),
            0x80 | b'K' | b'q' | b'h' => skip(r, &mut n, 1)?,
            b'M' => skip(r, &mut n, 2)?,
            b'J' | b'r' | b'j' => skip(r, &mut n, 4)?,
            b'X' => {
                let k = le(r, &mut n, 4)?;
                skip(r, &mut n, k)?
            }
            b'U' | 0x8a | 0x8c => {
                let k = le(r, &mut n, 1)?;
                skip(r, &mut n, k)?
            }
            b'}' | b']' | b')' | b'(' | b's' | b'u' | b'a' | b'e' | b'N' | 0x88 | 0x89 | 0x85 | 0x86 | 0x87 | 0x94 => {}
            _ => {
                return Err(ReadError::Corrupt {
                    what: format!("unexpected opcode {op:#04x} in a header pickle"),
                    offset: start + n - 1,
                })
            }
        }
    }
    Err(ReadError::Corrupt { what: "header pickle too long".into(), offset: start })
}
