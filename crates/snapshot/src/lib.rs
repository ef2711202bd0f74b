//! Read and write PyTorch CUDA memory snapshots, safely and fast.
//!
//! A snapshot is what `torch.cuda.memory._dump_snapshot()` writes: a pickle of the
//! caching allocator's segments and blocks plus a per-device ring buffer of allocator
//! events. This crate reads every form PyTorch has produced (1.13's segment list, 2.0's
//! per-block `history`, the 2.x dict with `device_traces`, `allocator_settings`,
//! `external_annotations`, ...), pickle protocols 2–5, gzip-compressed or not, and
//! torch.profiler (Kineto) JSON traces with `[memory]` events, into one [`Snapshot`] model.
//!
//! [`Feeder`] builds the same model from values walked elsewhere (the Python package's
//! `from_dict` walks the live dict of `torch.cuda.memory._snapshot()` into it).
//!
//! Reading never executes anything: the pickle reader accepts data opcodes only and
//! refuses, by opcode and byte offset, any pickle that asks to import or call code. Nor
//! can a small file make it allocate without bound: [`budget`] bounds the values it
//! builds, the model's copies of memo-shared values, string lengths, memo indices and
//! decompressed bytes, relative to the input (docs/limits.md), and gzip and zip
//! checksums are verified.
//! Memory stays below the file's size on multi-GB files, because stacks are interned
//! once and trace entries become flat records as they are read.
//! [`read_path`] reads a plain pickle file mapped into memory, handing the pages it has
//! passed back as it goes (on a large file a helper thread maps the pages ahead of the
//! reader in and hands those behind it back, and another faults in the event array's
//! pages ahead of the parser: the second core takes the page-table work); compressed
//! files, archives and streams ([`read_from`]) go through a buffer; a torch.save archive
//! on a stream is spilled to a temporary file first, as the zip reader seeks ([`spill`]),
//! and one already in memory is read from there ([`read_bytes_checked`]). Front ends read
//! with [`read_path_checked`] / [`read_from_checked`] / [`read_bytes_checked`], which also
//! refuse sizes and addresses no real snapshot has ([`bounds`]) before any
//! analysis sums them.
//!
//! [`recording`] tells how a file was recorded (history never switched on, one
//! `MemPool` only, actions `skip_actions` left out) and restores what the trace
//! determines; front ends call [`recording::prepare`] after reading (or
//! [`recording::prepare_with`], whose replay check tells a warm start from segment events
//! left out).
//!
//! ```no_run
//! let snap = fragscope_snapshot::read_path("snapshot.pickle".as_ref()).unwrap();
//! for dev in snap.devices() {
//!     println!("device {dev}: {} events", snap.trace(dev).len());
//! }
//! ```

pub mod bounds;
pub mod budget;
pub mod error;
pub mod kineto;
pub mod model;
pub mod pickle;
pub mod pyobj;
pub mod recording;
pub mod settings;
pub mod spill;
pub mod torchsave;

use std::io::{BufRead, BufReader, Read, Seek};
use std::path::Path;

pub use error::ReadError;
pub use model::*;
pub use pickle::load::{FeedValue, Feeder};
#[doc(hidden)]
pub use pickle::mapped::set_ahead_min;
pub use pyobj::PyObj;
pub use settings::RecordedSettings;

/// For a process that reads one large snapshot and then analyses it (the `fragscope`
/// command; not a library's caller, whose allocator settings are its own): every heap
/// allocation of 1 MiB or more gets a mapping of its own, returned to the system when
/// freed. glibc's default raises that threshold after each large free (up to 32 MiB), so
/// the per-entry arrays an analysis makes and drops (steps, rule 8's layers, the walks'
/// side tables) then stayed in the heap of the thread that made them, counted in the
/// process's memory while the next analysis ran: 10–15 MB of `summary`'s peak on a
/// 6.4 M-entry trace. A no-op where the C library is not glibc.
pub fn return_large_frees() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `mallopt` only sets a tuning parameter of the C allocator; called before
    // the program's threads start.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20);
    }
}

/// Reads a snapshot from a file: pickle or profiler JSON, optionally gzip-compressed.
/// Any value is accepted (the writer round-trips edge values); a snapshot to be analysed
/// is read with [`read_path_checked`].
pub fn read_path(path: &Path) -> Result<Snapshot, ReadError> {
    read_path_with_progress(path, &mut |_, _| {})
}

/// Like [`read_path`], calling `progress(bytes_read, file_size)` now and then.
pub fn read_path_with_progress(path: &Path, progress: &mut dyn FnMut(u64, u64)) -> Result<Snapshot, ReadError> {
    read_path_bounded(path, progress).map(|(s, _)| s)
}

/// Like [`read_path_with_progress`], then refusing a snapshot whose sizes or addresses no
/// real one has ([`bounds::check`]), so that the analyses' sums cannot overflow. The same
/// as reading then checking, cheaper: the pickle reader keeps the largest trace `addr`
/// and `size` as it reads, and the trace entries are looked at one by one again only
/// when those are out of bounds (to name the first offending entry).
pub fn read_path_checked(path: &Path, progress: &mut dyn FnMut(u64, u64)) -> Result<Snapshot, ReadError> {
    let (snap, max) = read_path_bounded(path, progress)?;
    bounds::check_read(&snap, max)?;
    Ok(snap)
}

/// [`read_from`], then [`bounds::check`] (as [`read_path_checked`] does).
pub fn read_from_checked<R: Read>(r: R) -> Result<Snapshot, ReadError> {
    let (snap, max) = read_from_bounded(r)?;
    bounds::check_read(&snap, max)?;
    Ok(snap)
}

/// [`read_from_checked`] for bytes already in memory (Python's `fragscope.loads`): a
/// torch.save zip archive is read in place from them, as from a file, rather than copied to
/// a temporary file as a stream's must be ([`spill`]); the zip entry and the pickle in it
/// are bounded by the same budgets ([`budget`]). Anything else, a gzip'd archive included
/// (its inflated bytes are not in memory), is read as [`read_from_checked`] reads it.
pub fn read_bytes_checked(data: &[u8]) -> Result<Snapshot, ReadError> {
    if data.starts_with(torchsave::ZIP_MAGIC) {
        let snap = torchsave::read_zip(std::io::Cursor::new(data))?;
        bounds::check_read(&snap, None)?;
        return Ok(snap);
    }
    read_from_checked(data)
}

/// A read, with the pickle reader's bound on the trace entries when it made them.
type Bounded = (Snapshot, Option<bounds::TraceMax>);

fn read_path_bounded(path: &Path, progress: &mut dyn FnMut(u64, u64)) -> Result<Bounded, ReadError> {
    let f = std::fs::File::open(path)?;
    let meta = f.metadata().ok();
    // A regular file that another process rewrites while it is read (a job dumping its
    // snapshot to the same path) yields a mix of two files, or fewer bytes: its length and
    // modification time, before and after, tell (the mapped read also catches truncation
    // as it happens, see `pickle::mapped`).
    let stamp = |m: &std::fs::Metadata| m.is_file().then(|| (m.len(), m.modified().ok()));
    let before = meta.as_ref().and_then(stamp);
    let after = f.try_clone().ok();
    let read = read_file_bounded(f, meta.as_ref(), progress);
    // Whatever came of the read (a file cut short often fails to parse).
    if before.is_some() && after.and_then(|f| f.metadata().ok()).as_ref().and_then(stamp) != before {
        return Err(ReadError::Changed);
    }
    read
}

/// Reads the open file `f` whose metadata is `meta` (`None`: unknown).
fn read_file_bounded(
    mut f: std::fs::File,
    meta: Option<&std::fs::Metadata>,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Bounded, ReadError> {
    let total = meta.map_or(0, |m| m.len());
    if meta.is_some_and(|m| m.is_dir()) {
        return Err(ReadError::Shape("is a directory".into()));
    }
    // A torch.save zip archive is read in place (the zip reader seeks), not buffered.
    let mut head = [0u8; 4];
    let n = f.read(&mut head)?;
    f.seek(std::io::SeekFrom::Start(0))?;
    if head[..n] == *torchsave::ZIP_MAGIC {
        return torchsave::read_zip(f).map(|s| (s, None));
    }
    // A plain pickle file (not a legacy torch.save, whose magic also starts with 0x80) is
    // read in place, mapped; anything else, or a file the system will not map, is streamed.
    if n > 0 && head[0] == 0x80 && meta.is_some_and(|m| m.is_file()) {
        let mut legacy = [0u8; torchsave::LEGACY_MAGIC.len()];
        let k = read_up_to(&mut f, &mut legacy)?;
        f.seek(std::io::SeekFrom::Start(0))?;
        if legacy[..k] != *torchsave::LEGACY_MAGIC {
            if let Some(m) = pickle::mapped::Mapping::of(&f, total) {
                let (snap, max) = pickle::load::read_pickle_mapped(m, &mut |off| progress(off, total))?;
                return Ok((snap, Some(max)));
            }
        }
    }
    let counter = Counting { inner: f, read: 0, report: progress, total };
    read_from_bounded(counter)
}

/// The first bytes of a gzip stream.
const GZIP_MAGIC: &[u8] = &[0x1f, 0x8b];

/// What a file is when its first bytes name one of the binary containers this crate reads
/// (a pickle, a `torch.save` archive, a gzip stream), in words; `None` for anything else
/// (text, JSON, unknown bytes). For front ends that take text and must not read a
/// snapshot as such (`fragscope oom`).
pub fn binary_kind(head: &[u8]) -> Option<&'static str> {
    if head.starts_with(GZIP_MAGIC) {
        Some("gzip-compressed")
    } else if head.starts_with(torchsave::ZIP_MAGIC) {
        Some("a torch.save archive")
    } else if head.len() >= 2 && head[0] == 0x80 && (2..=5).contains(&head[1]) {
        Some("a pickle (a memory snapshot?)")
    } else {
        None
    }
}

/// Fills `buf` as far as the reader has data; the bytes read.
pub fn read_up_to(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Counts bytes of the underlying file (compressed bytes for gzip), for progress.
struct Counting<'a, R> {
    inner: R,
    read: u64,
    total: u64,
    report: &'a mut dyn FnMut(u64, u64),
}

impl<R: Read> Read for Counting<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read += n as u64;
        (self.report)(self.read, self.total);
        Ok(n)
    }
}

/// Reads a snapshot from any byte stream, sniffing the format from its first bytes.
pub fn read_from<R: Read>(r: R) -> Result<Snapshot, ReadError> {
    read_from_bounded(r).map(|(s, _)| s)
}

fn read_from_bounded<R: Read>(r: R) -> Result<Bounded, ReadError> {
    // The compressed bytes read, against which the inflated ones are bounded.
    let compressed = std::rc::Rc::new(std::cell::Cell::new(0u64));
    let mut r = BufReader::with_capacity(1 << 16, budget::Counted { inner: r, count: compressed.clone() });
    let head = r.fill_buf()?;
    if head.is_empty() {
        return Err(ReadError::Empty);
    }
    if head.starts_with(GZIP_MAGIC) {
        let gz = flate2::read::MultiGzDecoder::new(r);
        let guarded = budget::Inflated { inner: gz, compressed, out: 0, what: "gzip stream" };
        let mut inner = BufReader::with_capacity(1 << 16, guarded);
        let head = inner.fill_buf().map_err(gzip_error)?;
        if head.is_empty() {
            return Err(ReadError::Shape("gzip file holds no data".into()));
        }
        if head.starts_with(GZIP_MAGIC) {
            return Err(ReadError::Shape("gzip inside gzip is not supported".into()));
        }
        let read = read_plain(&mut inner)?;
        // The gzip trailer's CRC-32 and length are checked when the decoder reaches the
        // end, which a pickle's STOP comes before: a damaged download must not be analysed
        // as intact.
        drain(&mut inner, "gzip")?;
        return Ok(read);
    }
    read_plain(r)
}

/// Reads `r` to its end, so that the decompressor under it verifies its checksums; what
/// follows the data read (nothing, in a snapshot) is bounded like the rest
/// ([`budget::Inflated`]).
pub(crate) fn drain(r: &mut impl Read, what: &str) -> Result<(), ReadError> {
    match std::io::copy(r, &mut std::io::sink()) {
        Ok(_) => Ok(()),
        Err(e) => match ReadError::from(e) {
            ReadError::Io(e) => Err(ReadError::Shape(format!(
                "damaged {what} data: {e}; the file is corrupt or incomplete (download it again)"
            ))),
            ReadError::Truncated { .. } => {
                Err(ReadError::Shape(format!("damaged {what} data: it ends early; the file is incomplete")))
            }
            other => Err(other),
        },
    }
}

/// How the first bytes of a file that is not a snapshot read in an error: a text file by
/// its first line, and by what to run when it holds an OOM message (users pass the log of
/// the failed run as often as its snapshot); anything else by its first bytes in hex.
fn starts_with(head: &[u8]) -> ReadError {
    let text = match std::str::from_utf8(head) {
        Ok(t) => t,
        // A buffer's end can cut a character: the valid part is still text.
        Err(e) if e.error_len().is_none() && e.valid_up_to() > 0 => {
            std::str::from_utf8(&head[..e.valid_up_to()]).unwrap_or("")
        }
        Err(_) => "",
    };
    let printable = !text.is_empty() && text.chars().all(|c| !c.is_control() || c.is_ascii_whitespace());
    if !printable {
        let shown: Vec<String> = head.iter().take(4).map(|b| format!("{b:02x}")).collect();
        return ReadError::UnknownFormat { first_bytes: format!("bytes {}", shown.join(" ")), hint: None };
    }
    let line = text.trim_start().lines().next().unwrap_or("");
    let mut shown: String = line.chars().take(60).collect();
    if shown.len() < line.len() {
        shown.push('…');
    }
    let oom = text.to_ascii_lowercase().contains("out of memory");
    ReadError::UnknownFormat {
        first_bytes: format!("text: '{}'", shown.escape_debug()),
        hint: oom.then_some("this text mentions 'out of memory': `fragscope oom FILE` explains an OOM message"),
    }
}

/// Whether `text` opens a JSON list (`[[`, `[{`, `["`, `[1,`, …; read as JSON) rather
/// than a log line that starts with `[` (`[2026-11-27 08:15:37] …`, `[rank0]: …`).
fn json_list(text: &str) -> bool {
    let Some(rest) = text.trim_start().strip_prefix('[') else { return false };
    let rest = rest.trim_start();
    match rest.bytes().next() {
        Some(b'[' | b'{' | b'"' | b']') => true,
        Some(b't' | b'f' | b'n') => ["true", "false", "null"].iter().any(|w| rest.starts_with(w)),
        Some(b'-' | b'0'..=b'9') => {
            let end = rest.find(|c: char| !matches!(c, '0'..='9' | '-' | '+' | '.' | 'e' | 'E')).unwrap_or(rest.len());
            rest[..end].parse::<f64>().is_ok() && matches!(rest[end..].trim_start().bytes().next(), Some(b',' | b']'))
        }
        _ => false,
    }
}

fn gzip_error(e: std::io::Error) -> ReadError {
    if e.get_ref().is_some_and(|inner| inner.is::<ReadError>()) {
        return ReadError::from(e);
    }
    ReadError::Corrupt { what: format!("gzip stream: {e}"), offset: 0 }
}

/// The rest of a JSON text, refused at its first control byte other than whitespace
/// (JSON has none outside strings, where they are escaped): a stream of zeros after a
/// `{` (`(printf '{'; cat /dev/zero)`) stops at once instead of filling memory, and so
/// does a run of more than 1 MiB of white space.
fn read_json_text<R: BufRead>(r: &mut R) -> Result<Vec<u8>, ReadError> {
    // A run of white space longer than any indentation is refused too: it would only fill
    // memory (inside a string, 1 MiB of spaces is no trace either).
    const MAX_BLANK: u64 = 1 << 20;
    let mut blank = 0u64;
    let mut bytes = Vec::new();
    loop {
        let chunk = r.fill_buf().map_err(gzip_error)?;
        if chunk.is_empty() {
            return Ok(bytes);
        }
        for (i, &b) in chunk.iter().enumerate() {
            if matches!(b, b' ' | b'\t' | b'\n' | b'\r') {
                blank += 1;
                if blank > MAX_BLANK {
                    return Err(ReadError::Limit(format!(
                        "more than {} of white space at byte {}: not a profiler trace (a gzip'd file of \
                         spaces once took 6 GB)",
                        budget::size(MAX_BLANK),
                        bytes.len() + i
                    )));
                }
                continue;
            }
            blank = 0;
            if b < 0x20 {
                return Err(ReadError::Json(format!(
                    "control byte {b:#04x} at byte {}: not JSON text",
                    bytes.len() + i
                )));
            }
        }
        bytes.extend_from_slice(chunk);
        let n = chunk.len();
        r.consume(n);
    }
}

fn read_plain<R: BufRead>(mut r: R) -> Result<Bounded, ReadError> {
    let head = r.fill_buf()?;
    let first = head.iter().copied().find(|b| !b.is_ascii_whitespace());
    if head.starts_with(torchsave::LEGACY_MAGIC) {
        return torchsave::read_legacy(r).map(|s| (s, None));
    }
    if head.starts_with(torchsave::ZIP_MAGIC) {
        // From a stream (stdin): the zip reader seeks, so the archive goes to a temporary
        // file (memory stays flat, the copy bounded by `spill::MAX_SPILL`).
        let file = spill::spill(r, spill::MAX_SPILL)?;
        return torchsave::read_zip(file).map(|s| (s, None));
    }
    match head.first() {
        Some(0x80) => pickle::load::read_pickle(r, &mut |_| {}).map(|(s, max)| (s, Some(max))),
        // A text starting with `[` is more often a log line (`[rank0]: ...`,
        // `[2026-11-27 ...]`) than a JSON list: said at once, from the first bytes,
        // rather than after reading the whole file as JSON.
        _ if first == Some(b'[') && !json_list(&String::from_utf8_lossy(&head[..head.len().min(256)])) => {
            Err(starts_with(head))
        }
        _ if matches!(first, Some(b'{') | Some(b'[')) => {
            let bytes = read_json_text(&mut r)?;
            kineto::read_json(&bytes).map(|s| (s, None))
        }
        Some(_) => Err(starts_with(head)),
        None => Err(ReadError::Empty),
    }
}
