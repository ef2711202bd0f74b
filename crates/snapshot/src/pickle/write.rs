//! Writer for snapshot pickles (protocol 4), byte-compatible in structure with what
//! CPython's C pickler emits for the equivalent Python object, so that `pickle.load`,
//! `torch.cuda.memory._memory_viz` and pytorch.org/memory_viz read our output like a
//! file from `torch.cuda.memory._dump_snapshot`.
//!
//! What "like CPython" means here, opcode by opcode (see `Modules/_pickle.c`):
//! * `PROTO 4`, then the body in `FRAME`s: a frame is committed when an object is about
//!   to be written and the frame already holds ≥ 64 KiB (so frames are 64 KiB plus a few
//!   bytes, as in real files); a str payload of ≥ 64 KiB is written outside any frame.
//!   The tests check this against CPython: re-pickling our output with
//!   `pickle.dumps(obj, protocol=4)` gives the very same bytes.
//! * `MEMOIZE` after every str, list, dict and non-empty tuple; a second reference to
//!   the same object is `BINGET`/`LONG_BINGET`.
//! * lists: `EMPTY_LIST MEMOIZE`, then one item + `APPEND`, or `MARK` items `APPENDS` in
//!   batches of 1000; dicts likewise with `SETITEM`/`SETITEMS`.
//! * ints by magnitude: `BININT1` (0..=255), `BININT2` (..=65535), `BININT` (i32),
//!   else `LONG1` with CPython's minimal little-endian two's-complement encoding.
//!
//! Object identity is chosen the way PyTorch's own files share objects, which is what
//! keeps multi-GB snapshots small: every interned stack (frame list) and every frame dict
//! is written once and referenced through the memo afterwards; equal strings are one
//! object (PyTorch interns dict keys; sharing values too only makes the file smaller and
//! loads to an equal object). `pool_id` tuples are shared by value as well. (PyTorch's
//! own dumps share a stack's list only between the entries that hold one captured
//! traceback; [`WriteOptions::fresh_stacks`] writes a list per entry, as most of theirs.)
//!
//! Keys that were absent when the model was read stay absent: `time_us` ([`NO_TIME`]),
//! `frames` (`stack: None`), `requested_size`, `segment_pool_id`, `is_expandable`,
//! `allocator_settings`, `external_annotations`, `host_*`. Things the model cannot tell
//! apart are documented where they are decided (see [`block_addresses_written`]).

use std::collections::HashMap;
use std::io::{self, Write};
use std::path::Path;

use crate::model::*;
use crate::pyobj::{encode_long, PyObj};

const FRAME_SIZE_TARGET: usize = 64 * 1024;
/// CPython does not frame fewer than 4 bytes (`FRAME_SIZE_MIN`).
const FRAME_SIZE_MIN: usize = 4;
const BATCHSIZE: usize = 1000;

// Opcodes.
const PROTO: u8 = 0x80;
const FRAME: u8 = 0x95;
const STOP: u8 = b'.';
const MARK: u8 = b'(';
const EMPTY_DICT: u8 = b'}';
const EMPTY_LIST: u8 = b']';
const EMPTY_TUPLE: u8 = b')';
const SETITEM: u8 = b's';
const SETITEMS: u8 = b'u';
const APPEND: u8 = b'a';
const APPENDS: u8 = b'e';
const TUPLE: u8 = b't';
const TUPLE1: u8 = 0x85;
const MEMOIZE: u8 = 0x94;
const BINGET: u8 = b'h';
const LONG_BINGET: u8 = b'j';
const SHORT_BINUNICODE: u8 = 0x8c;
const BINUNICODE: u8 = b'X';
const BINUNICODE8: u8 = 0x8d;
const SHORT_BINBYTES: u8 = b'C';
const BINBYTES: u8 = b'B';
const BINBYTES8: u8 = 0x8e;
const BININT: u8 = b'J';
const BININT1: u8 = b'K';
const BININT2: u8 = b'M';
const LONG1: u8 = 0x8a;
const LONG4: u8 = 0x8b;
const BINFLOAT: u8 = b'G';
const NEWTRUE: u8 = 0x88;
const NEWFALSE: u8 = 0x89;
const NONE: u8 = b'N';

/// Writes `snap` as a protocol-4 pickle in the form it was read from (see module docs).
///
/// * [`SourceFormat::Dict`] and [`SourceFormat::Kineto`]: the 2.x dict (`segments`,
///   `device_traces`, then the optional keys the snapshot has, then `extra` keys).
///   A Kineto-sourced snapshot has no segments; its `totals` and `device_capacity` have
///   no place in the pickle schema and are not written.
/// * [`SourceFormat::SegmentList`]: the 1.13 top-level list of segments (that form has
///   no trace, so `device_traces` is not written).
pub fn write_snapshot<W: Write>(snap: &Snapshot, w: W) -> io::Result<()> {
    write_snapshot_with(snap, w, &WriteOptions::default())
}

/// How [`write_snapshot_with`] writes what the model does not decide.
#[derive(Clone, Copy, Debug, Default)]
pub struct WriteOptions {
    /// Trace entries' `frames` as lists of their own (the frame dicts still shared through
    /// the memo), instead of one list per interned stack, as PyTorch writes them: a new
    /// list per captured traceback, which an `alloc` has alone and a free gives to both of
    /// its entries (a `free_completed` right after its block's `free_requested` shares
    /// that entry's list). What benchmark files shaped like real dumps need.
    pub fresh_stacks: bool,
}

/// [`write_snapshot`] with [`WriteOptions`].
pub fn write_snapshot_with<W: Write>(snap: &Snapshot, w: W, opts: &WriteOptions) -> io::Result<()> {
    let mut p = Pickler::new(w, &snap.frames);
    p.fresh_stacks = opts.fresh_stacks;
    p.out.write_all(&[PROTO, 4])?;
    let legacy_blocks = !block_addresses_written(snap);
    match snap.format {
        SourceFormat::SegmentList => p.segments(&snap.segments, legacy_blocks, snap)?,
        SourceFormat::Dict | SourceFormat::Kineto => p.top_dict(snap, legacy_blocks)?,
    }
    p.byte(STOP);
    p.commit_frame()?;
    p.out.flush()
}

/// Writes any verbatim value as a protocol-4 pickle (used to feed JSON exports of a
/// snapshot through the pickle reader).
pub(crate) fn write_pyobj<W: Write>(obj: &PyObj, w: W) -> io::Result<()> {
    let table = FrameTable::default();
    let mut p = Pickler::new(w, &table);
    p.out.write_all(&[PROTO, 4])?;
    p.obj(obj)?;
    p.byte(STOP);
    p.commit_frame()?;
    p.out.flush()
}

/// Writes to `path` without ever leaving a partial file there: the pickle goes to a
/// temporary file in the same directory (same filesystem, so the rename is atomic), is
/// synced, and is then renamed over `path`. On error the temporary file is removed and
/// any existing `path` is untouched.
pub fn write_path(snap: &Snapshot, path: &Path) -> io::Result<()> {
    write_path_with(snap, path, &WriteOptions::default())
}

/// [`write_path`] with [`WriteOptions`].
pub fn write_path_with(snap: &Snapshot, path: &Path, opts: &WriteOptions) -> io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => std::path::PathBuf::from("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "path has no file name"))?
        .to_string_lossy()
        .into_owned();
    // create_new + pid + counter: never clobber another writer's temp file.
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let (tmp, file) = loop {
        let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = dir.join(format!(".{name}.tmp-{}-{n}", std::process::id()));
        match std::fs::OpenOptions::new().write(true).create_new(true).open(&tmp) {
            Ok(f) => break (tmp, f),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    };
    let result = (|| {
        let mut bw = io::BufWriter::with_capacity(1 << 20, file);
        write_snapshot_with(snap, &mut bw, opts)?;
        let file = bw.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        drop(file);
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Whether blocks get an `address` key. The model always holds an address (computed for
/// old files), so it cannot say per block whether the key was there. PyTorch 2.1+ writes
/// it on every block; 1.13 and 2.0 never did, and those are exactly the files whose
/// blocks carry `history`. So: no `address` anywhere when any block has `history`.
pub fn block_addresses_written(snap: &Snapshot) -> bool {
    let all = snap.segments.iter().chain(snap.host_segments.iter().flatten());
    !all.flat_map(|s| &s.blocks).any(|b| b.history.is_some())
}

/// Segment keys the reader fills in when absent (`device`, `allocated_size`, ...):
/// written unless *every* segment lacked them (the notes count misses, not which
/// segment missed), so a file that never had the key round-trips without it.
struct SegmentKeys {
    device: bool,
    allocated_size: bool,
    active_size: bool,
    stream: bool,
    segment_type: bool,
}

impl SegmentKeys {
    fn of(snap: &Snapshot) -> Self {
        let n = (snap.segments.len() + snap.host_segments.as_ref().map_or(0, |s| s.len())) as u64;
        let has =
            |k: &str| n == 0 || snap.notes.missing_optional.get(&format!("segment.{k}")).copied().unwrap_or(0) < n;
        SegmentKeys {
            device: has("device"),
            allocated_size: has("allocated_size"),
            active_size: has("active_size"),
            stream: has("stream"),
            segment_type: has("segment_type"),
        }
    }
}

struct Pickler<'t, W: Write> {
    out: W,
    table: &'t FrameTable,
    /// The frame being filled; committed at object boundaries once ≥ 64 KiB.
    frame: Vec<u8>,
    memo_len: u32,
    strs: HashMap<Box<str>, u32>,
    /// StrId → memo index (u32::MAX = not yet written): avoids hashing interned strings.
    str_ids: Vec<u32>,
    stacks: Vec<u32>,
    frames: Vec<u32>,
    pairs: HashMap<(u64, u64), u32>,
    seg_keys: Option<SegmentKeys>,
    /// [`WriteOptions::fresh_stacks`].
    fresh_stacks: bool,
    /// With `fresh_stacks`: the entry being written refers to the list just written (a
    /// `free_completed` after its block's `free_requested`, one traceback in PyTorch).
    share_stack: bool,
    /// The previous trace entry when it was a `free_requested`: its block and stack.
    last_free_requested: Option<(u64, StackId)>,
}

const UNSET: u32 = u32::MAX;

impl<'t, W: Write> Pickler<'t, W> {
    fn new(out: W, table: &'t FrameTable) -> Self {
        Pickler {
            out,
            table,
            frame: Vec::with_capacity(FRAME_SIZE_TARGET + 4096),
            memo_len: 0,
            strs: HashMap::new(),
            str_ids: vec![UNSET; table.num_strings()],
            stacks: vec![UNSET; table.num_stacks()],
            frames: vec![UNSET; table.num_frames()],
            pairs: HashMap::new(),
            seg_keys: None,
            fresh_stacks: false,
            share_stack: false,
            last_free_requested: None,
        }
    }

    // --- framing --------------------------------------------------------------------

    #[inline]
    fn byte(&mut self, b: u8) {
        self.frame.push(b);
    }
    #[inline]
    fn bytes(&mut self, b: &[u8]) {
        self.frame.extend_from_slice(b);
    }
    fn commit_frame(&mut self) -> io::Result<()> {
        if self.frame.is_empty() {
            return Ok(());
        }
        if self.frame.len() >= FRAME_SIZE_MIN {
            let mut hdr = [0u8; 9];
            hdr[0] = FRAME;
            hdr[1..].copy_from_slice(&(self.frame.len() as u64).to_le_bytes());
            self.out.write_all(&hdr)?;
        }
        self.out.write_all(&self.frame)?;
        self.frame.clear();
        Ok(())
    }
    /// Called at the start of every object written (atoms included), which is where
    /// CPython's `save()` calls `_Pickler_OpcodeBoundary`: this decides frame lengths.
    #[inline]
    fn boundary(&mut self) -> io::Result<()> {
        if self.frame.len() >= FRAME_SIZE_TARGET {
            self.commit_frame()?;
        }
        Ok(())
    }
    /// A header plus a payload; payloads ≥ 64 KiB bypass framing, as CPython does.
    fn header_payload(&mut self, header: &[u8], payload: &[u8]) -> io::Result<()> {
        if payload.len() >= FRAME_SIZE_TARGET {
            self.commit_frame()?;
            self.out.write_all(header)?;
            self.out.write_all(payload)?;
        } else {
            self.bytes(header);
            self.bytes(payload);
        }
        Ok(())
    }

    // --- memo -----------------------------------------------------------------------

    fn memoize(&mut self) -> u32 {
        self.byte(MEMOIZE);
        self.memo_len += 1;
        self.memo_len - 1
    }
    fn get(&mut self, idx: u32) {
        if idx < 256 {
            self.bytes(&[BINGET, idx as u8]);
        } else {
            self.byte(LONG_BINGET);
            self.bytes(&idx.to_le_bytes());
        }
    }

    // --- scalars --------------------------------------------------------------------

    fn int(&mut self, v: i128) -> io::Result<()> {
        self.boundary()?;
        if (0..=0xff).contains(&v) {
            self.bytes(&[BININT1, v as u8]);
        } else if (0..=0xffff).contains(&v) {
            self.byte(BININT2);
            self.bytes(&(v as u16).to_le_bytes());
        } else if (i32::MIN as i128..=i32::MAX as i128).contains(&v) {
            self.byte(BININT);
            self.bytes(&(v as i32).to_le_bytes());
        } else {
            let enc = encode_long(v);
            self.bytes(&[LONG1, enc.len() as u8]);
            self.bytes(&enc);
        }
        Ok(())
    }
    fn uint(&mut self, v: u64) -> io::Result<()> {
        self.int(v as i128)
    }
    /// `cudaStream_t` values: PyTorch writes them as signed 64-bit; the model keeps the
    /// bit pattern in a u64 (see the reader), so a negative handle round-trips.
    fn stream(&mut self, v: u64) -> io::Result<()> {
        self.int(v as i64 as i128)
    }
    fn big(&mut self, b: &[u8]) -> io::Result<()> {
        self.boundary()?;
        if b.len() < 256 {
            self.bytes(&[LONG1, b.len() as u8]);
            self.bytes(b);
        } else {
            self.byte(LONG4);
            self.bytes(&(b.len() as u32).to_le_bytes());
            self.bytes(b);
        }
        Ok(())
    }
    fn float(&mut self, f: f64) -> io::Result<()> {
        self.boundary()?;
        self.byte(BINFLOAT);
        self.bytes(&f.to_be_bytes());
        Ok(())
    }
    fn bool(&mut self, b: bool) -> io::Result<()> {
        self.boundary()?;
        self.byte(if b { NEWTRUE } else { NEWFALSE });
        Ok(())
    }
    fn none(&mut self) -> io::Result<()> {
        self.boundary()?;
        self.byte(NONE);
        Ok(())
    }

    fn str(&mut self, s: &str) -> io::Result<()> {
        self.boundary()?;
        if let Some(&idx) = self.strs.get(s) {
            self.get(idx);
            return Ok(());
        }
        let b = s.as_bytes();
        if b.len() <= 0xff {
            self.header_payload(&[SHORT_BINUNICODE, b.len() as u8], b)?;
        } else if b.len() as u64 <= 0xffff_ffff {
            let mut h = [BINUNICODE, 0, 0, 0, 0];
            h[1..].copy_from_slice(&(b.len() as u32).to_le_bytes());
            self.header_payload(&h, b)?;
        } else {
            let mut h = [BINUNICODE8, 0, 0, 0, 0, 0, 0, 0, 0];
            h[1..].copy_from_slice(&(b.len() as u64).to_le_bytes());
            self.header_payload(&h, b)?;
        }
        let idx = self.memoize();
        self.strs.insert(s.into(), idx);
        Ok(())
    }
    fn str_id(&mut self, id: StrId) -> io::Result<()> {
        self.boundary()?;
        let idx = self.str_ids[id.index()];
        if idx != UNSET {
            self.get(idx);
            return Ok(());
        }
        let table = self.table;
        self.str(table.str(id))?;
        self.str_ids[id.index()] = self.strs[table.str(id)];
        Ok(())
    }
    fn bytes_obj(&mut self, b: &[u8]) -> io::Result<()> {
        self.boundary()?;
        // Bytes are never shared (the model does not keep identity for them).
        if b.len() < 256 {
            self.header_payload(&[SHORT_BINBYTES, b.len() as u8], b)?;
        } else if b.len() as u64 <= 0xffff_ffff {
            let mut h = [BINBYTES, 0, 0, 0, 0];
            h[1..].copy_from_slice(&(b.len() as u32).to_le_bytes());
            self.header_payload(&h, b)?;
        } else {
            let mut h = [BINBYTES8, 0, 0, 0, 0, 0, 0, 0, 0];
            h[1..].copy_from_slice(&(b.len() as u64).to_le_bytes());
            self.header_payload(&h, b)?;
        }
        self.memoize();
        Ok(())
    }

    // --- containers -----------------------------------------------------------------

    /// A list of `n` items, each written by `item(self, i)`, batched like CPython.
    fn list<F>(&mut self, n: usize, item: F) -> io::Result<u32>
    where
        F: FnMut(&mut Self, usize) -> io::Result<()>,
    {
        self.boundary()?;
        self.byte(EMPTY_LIST);
        let idx = self.memoize();
        self.batched(n, APPEND, APPENDS, item)?;
        Ok(idx)
    }

    /// CPython's batching of container items: one item is followed by `single`
    /// (APPEND / SETITEM); more go in groups of 1000 between MARK and `many`.
    fn batched<F>(&mut self, n: usize, single: u8, many: u8, mut item: F) -> io::Result<()>
    where
        F: FnMut(&mut Self, usize) -> io::Result<()>,
    {
        if n == 1 {
            item(self, 0)?;
            self.byte(single);
        } else if n > 1 {
            let mut i = 0;
            while i < n {
                self.byte(MARK);
                let end = (i + BATCHSIZE).min(n);
                for j in i..end {
                    item(self, j)?;
                }
                self.byte(many);
                i = end;
            }
        }
        Ok(())
    }

    /// A dict whose `n` key/value pairs are written by `kv(self, i)`, batched like CPython.
    fn dict<F>(&mut self, n: usize, kv: F) -> io::Result<()>
    where
        F: FnMut(&mut Self, usize) -> io::Result<()>,
    {
        self.boundary()?;
        self.byte(EMPTY_DICT);
        self.memoize();
        self.batched(n, SETITEM, SETITEMS, kv)?;
        Ok(())
    }

    /// A dict with string keys whose entries are produced as [`Field`]s.
    fn fields(&mut self, fields: &[(&str, Field<'_>)]) -> io::Result<()> {
        self.dict(fields.len(), |p, i| {
            let (k, ref v) = fields[i];
            p.str(k)?;
            p.field(v)
        })
    }

    fn field(&mut self, v: &Field<'_>) -> io::Result<()> {
        match *v {
            Field::Int(i) => self.int(i as i128),
            Field::UInt(u) => self.uint(u),
            Field::Stream(s) => self.stream(s),
            Field::Bool(b) => self.bool(b),
            Field::Str(s) => self.str(s),
            Field::StrId(s) => self.str_id(s),
            Field::Stack(s) => self.stack(s),
            Field::Pair(a, b) => self.pair(a, b),
            Field::Obj(o) => self.obj(o),
            Field::Blocks(b, legacy) => self.blocks(b, legacy),
            Field::History(h) => self.history(h),
        }
    }

    fn pair(&mut self, a: u64, b: u64) -> io::Result<()> {
        self.boundary()?;
        if let Some(&idx) = self.pairs.get(&(a, b)) {
            self.get(idx);
            return Ok(());
        }
        self.uint(a)?;
        self.uint(b)?;
        self.byte(TUPLE1 + 1); // TUPLE2
        let idx = self.memoize();
        self.pairs.insert((a, b), idx);
        Ok(())
    }

    fn frame_dict(&mut self, f: FrameId) -> io::Result<()> {
        self.boundary()?;
        let idx = self.frames[f.index()];
        if idx != UNSET {
            self.get(idx);
            return Ok(());
        }
        let fr = *self.table.frame(f);
        // `line` is unsigned in PyTorch (2^64−1 = unknown, on C++ frames); the model keeps
        // the bit pattern in an i64 (see the reader), so write it back unsigned.
        let memo_at = self.memo_len; // the dict's MEMOIZE comes first
        self.fields(&[
            ("name", Field::StrId(fr.name)),
            ("filename", Field::StrId(fr.filename)),
            ("line", Field::UInt(fr.line as u64)),
        ])?;
        self.frames[f.index()] = memo_at;
        Ok(())
    }

    fn stack(&mut self, s: StackId) -> io::Result<()> {
        self.boundary()?;
        let idx = self.stacks[s.index()];
        if idx != UNSET && (!self.fresh_stacks || self.share_stack) {
            self.get(idx);
            return Ok(());
        }
        let table = self.table;
        let ids = table.stack(s);
        let idx = self.list(ids.len(), |p, i| p.frame_dict(ids[i]))?;
        self.stacks[s.index()] = idx;
        Ok(())
    }

    /// Verbatim values. Recursive: depth is bounded by how they were built (the pickle
    /// reader stops at 256 levels, serde_json at 128).
    fn obj(&mut self, o: &PyObj) -> io::Result<()> {
        self.boundary()?;
        match o {
            PyObj::None => self.none(),
            PyObj::Bool(b) => self.bool(*b),
            PyObj::Int(i) => self.int(*i as i128),
            PyObj::BigInt(b) => self.big(b),
            PyObj::Float(f) => self.float(*f),
            PyObj::Str(s) => self.str(s),
            PyObj::Bytes(b) => self.bytes_obj(b),
            PyObj::List(items) => self.list(items.len(), |p, i| p.obj(&items[i])).map(|_| ()),
            PyObj::Tuple(items) => {
                if items.is_empty() {
                    self.byte(EMPTY_TUPLE);
                    return Ok(());
                }
                if items.len() <= 3 {
                    for it in items {
                        self.obj(it)?;
                    }
                    self.byte(TUPLE1 + items.len() as u8 - 1);
                } else {
                    self.byte(MARK);
                    for it in items {
                        self.obj(it)?;
                    }
                    self.byte(TUPLE);
                }
                self.memoize();
                Ok(())
            }
            PyObj::Dict(items) => self.dict(items.len(), |p, i| {
                p.obj(&items[i].0)?;
                p.obj(&items[i].1)
            }),
        }
    }

    // --- snapshot structure ---------------------------------------------------------

    fn top_dict(&mut self, snap: &Snapshot, legacy_blocks: bool) -> io::Result<()> {
        #[derive(Clone, Copy)]
        enum Top<'a> {
            Segments,
            Traces,
            Settings(&'a PyObj),
            Annotations(&'a [Annotation]),
            HostSegments(&'a [Segment]),
            HostTraces(&'a [TraceEvent]),
            Extra(&'a PyObj),
        }
        let mut keys: Vec<(&str, Top<'_>)> = vec![("segments", Top::Segments), ("device_traces", Top::Traces)];
        if let Some(s) = &snap.allocator_settings {
            keys.push(("allocator_settings", Top::Settings(s)));
        }
        if let Some(a) = &snap.external_annotations {
            keys.push(("external_annotations", Top::Annotations(a)));
        }
        if let Some(h) = &snap.host_segments {
            keys.push(("host_segments", Top::HostSegments(h)));
        }
        if let Some(h) = &snap.host_traces {
            keys.push(("host_traces", Top::HostTraces(h)));
        }
        for (k, v) in &snap.extra {
            keys.push((k.as_str(), Top::Extra(v)));
        }
        self.dict(keys.len(), |p, i| {
            let (k, v) = keys[i];
            p.str(k)?;
            match v {
                Top::Segments => p.segments(&snap.segments, legacy_blocks, snap),
                Top::Traces => {
                    p.list(snap.device_traces.len(), |p, d| p.trace(&snap.device_traces[d], snap)).map(|_| ())
                }
                Top::Settings(o) | Top::Extra(o) => p.obj(o),
                Top::Annotations(a) => p.list(a.len(), |p, j| p.annotation(&a[j])).map(|_| ()),
                Top::HostSegments(h) => p.segments(h, legacy_blocks, snap),
                Top::HostTraces(t) => p.trace(t, snap),
            }
        })
    }

    fn segments(&mut self, segs: &[Segment], legacy_blocks: bool, snap: &Snapshot) -> io::Result<()> {
        if self.seg_keys.is_none() {
            self.seg_keys = Some(SegmentKeys::of(snap));
        }
        self.list(segs.len(), |p, i| p.segment(&segs[i], legacy_blocks)).map(|_| ())
    }

    fn segment(&mut self, s: &Segment, legacy_blocks: bool) -> io::Result<()> {
        let k = self.seg_keys.as_ref().expect("set by segments()");
        let mut f: Vec<(&str, Field<'_>)> = Vec::with_capacity(12);
        if k.device {
            f.push(("device", Field::Int(s.device)));
        }
        f.push(("address", Field::UInt(s.address)));
        f.push(("total_size", Field::UInt(s.total_size)));
        if k.allocated_size {
            f.push(("allocated_size", Field::UInt(s.allocated_size)));
        }
        if k.active_size {
            f.push(("active_size", Field::UInt(s.active_size)));
        }
        if let Some(r) = s.requested_size {
            f.push(("requested_size", Field::UInt(r)));
        }
        if k.stream {
            f.push(("stream", Field::Stream(s.stream)));
        }
        if k.segment_type {
            f.push(("segment_type", Field::Str(s.segment_type.as_str())));
        }
        if let Some((a, b)) = s.segment_pool_id {
            f.push(("segment_pool_id", Field::Pair(a, b)));
        }
        if let Some(e) = s.is_expandable {
            f.push(("is_expandable", Field::Bool(e)));
        }
        if let Some(st) = s.stack {
            f.push(("frames", Field::Stack(st)));
        }
        f.push(("blocks", Field::Blocks(&s.blocks, legacy_blocks)));
        self.fields(&f)
    }

    fn blocks(&mut self, blocks: &[Block], legacy: bool) -> io::Result<()> {
        self.list(blocks.len(), |p, i| {
            let b = &blocks[i];
            let mut f: Vec<(&str, Field<'_>)> = Vec::with_capacity(6);
            if !legacy {
                f.push(("address", Field::UInt(b.address)));
            }
            f.push(("size", Field::UInt(b.size)));
            if let Some(r) = b.requested_size {
                f.push(("requested_size", Field::UInt(r)));
            }
            f.push(("state", Field::Str(b.state.as_str())));
            if let Some(st) = b.stack {
                f.push(("frames", Field::Stack(st)));
            }
            if let Some(h) = &b.history {
                f.push(("history", Field::History(h)));
            }
            p.fields(&f)
        })
        .map(|_| ())
    }

    fn history(&mut self, h: &[HistoryEntry]) -> io::Result<()> {
        self.list(h.len(), |p, i| {
            let e = &h[i];
            let mut f: Vec<(&str, Field<'_>)> =
                vec![("addr", Field::UInt(e.addr)), ("real_size", Field::UInt(e.real_size))];
            if let Some(st) = e.stack {
                f.push(("frames", Field::Stack(st)));
            }
            p.fields(&f)
        })
        .map(|_| ())
    }

    fn trace(&mut self, t: &[TraceEvent], snap: &Snapshot) -> io::Result<()> {
        self.list(t.len(), |p, i| p.event(&t[i], snap)).map(|_| ())
    }

    fn event(&mut self, e: &TraceEvent, snap: &Snapshot) -> io::Result<()> {
        let mut f: Vec<(&str, Field<'_>)> = Vec::with_capacity(9);
        f.push(("action", Field::Str(e.action.as_str())));
        // `oom` records free device memory under `device_free` instead of `addr`.
        f.push((if e.action == Action::Oom { "device_free" } else { "addr" }, Field::UInt(e.addr)));
        f.push(("size", Field::UInt(e.size)));
        f.push(("stream", Field::Stream(snap.stream(e))));
        if let Some(t) = e.time() {
            f.push(("time_us", Field::Int(t)));
        }
        if let Some(c) = snap.compile_context(e) {
            f.push(("compile_context", Field::StrId(c)));
        }
        if let Some(u) = snap.user_metadata(e) {
            f.push(("user_metadata", Field::StrId(u)));
        }
        if let Some((a, b)) = snap.pool_id(e) {
            f.push(("pool_id", Field::Pair(a, b)));
        }
        if let Some(st) = e.stack {
            f.push(("frames", Field::Stack(st)));
        }
        // PyTorch records a free's traceback once and gives it to both of the free's
        // entries: the same list object, written once.
        self.share_stack = e.action == Action::FreeCompleted
            && e.stack.is_some_and(|st| self.last_free_requested == Some((e.addr, st)));
        self.last_free_requested = match (e.action, e.stack) {
            (Action::FreeRequested, Some(st)) => Some((e.addr, st)),
            _ => None,
        };
        let r = self.fields(&f);
        self.share_stack = false;
        r
    }

    fn annotation(&mut self, a: &Annotation) -> io::Result<()> {
        let mut f: Vec<(&str, Field<'_>)> =
            vec![("stage", Field::Str(&a.stage)), ("name", Field::Str(&a.name)), ("device", Field::Int(a.device))];
        if a.time_us != NO_TIME {
            f.push(("time_us", Field::Int(a.time_us)));
        }
        for (k, v) in &a.extra {
            f.push((k.as_str(), Field::Obj(v)));
        }
        self.fields(&f)
    }
}

/// A value of a string-keyed dict entry, borrowed from the model.
enum Field<'a> {
    Int(i64),
    UInt(u64),
    Stream(u64),
    Bool(bool),
    Str(&'a str),
    StrId(StrId),
    Stack(StackId),
    Pair(u64, u64),
    Obj(&'a PyObj),
    Blocks(&'a [Block], bool),
    History(&'a [HistoryEntry]),
}
