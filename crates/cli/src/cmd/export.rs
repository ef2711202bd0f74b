//! `fragscope export FILE ... --format parquet [-o DIR] [--window START..END]`: a
//! snapshot as tables for SQL and dataframes (DuckDB, polars, pandas), readable without
//! fragscope.
//!
//! One Parquet file per table in DIR; several FILEs go into the same tables, told apart
//! by the `file` column (stack and frame ids are per file). The tables and their columns
//! (schema `fragscope.export/2`, stored in each file's key-value metadata as
//! `fragscope.schema`) are documented in docs/export.md:
//!
//! * `trace_events`: every trace entry of every device, in order;
//! * `allocations`: one row per allocation of the trace, its alloc entry paired with its
//!   `free_requested` / `free_completed` (lifetime, sizes, stream, stack, call site,
//!   annotation scope, and the role [`fragscope_trace::device_block_roles`] gives it), plus the
//!   blocks live before the trace that it never frees;
//! * `segments` and `blocks`: the allocator state of the snapshot (`segments`);
//! * `stacks` and `frames`: the recorded stacks, normalised (a stack is rows of frame
//!   ids by depth, innermost first);
//! * `annotations`: `record_function` scopes (`external_annotations`).
//!
//! Columns are Parquet INT64 (sizes, addresses, `cudaStream_t` values and indices; all
//! below 2^63 in practice), UTF-8 strings and booleans; a missing value is null. The
//! writer is the `parquet` crate's low-level one (no Arrow), uncompressed, one row group
//! per file and table (more for tables over [`ROW_GROUP`] rows); dictionary encoding but for the
//! columns of distinct numbers ([`UNIQUE_INTS`]: entry indices and times, written as
//! deltas, DELTA_BINARY_PACKED), min/max statistics of numbers only.
//!
//! Rows are buffered by column ([`Table`], [`Col`]: a string cell is a 4-byte index into
//! its column's dictionary, an INT64 cell of a dictionary-encoded column its index into
//! the row group's distinct values, found as it comes by an [`IntIndex`]) and each row
//! group's dictionary-encoded columns are encoded here ([`dict_chunk`]) rather than by the
//! crate's column writer, whose per-cell hashing was most of the export's CPU, and so are
//! the delta-encoded ones ([`delta_chunk`]); the crate writes the booleans, a column whose
//! dictionary outgrew its page, and the file around them. The two long tables (`trace_events`,
//! `allocations`) are filled [`BLOCK`] rows at a time, column by column; the buffers are
//! kept from row group to row group, in huge pages where Linux gives them
//! ([`reserve_huge`]). The files are the same, byte for byte, as when each cell was
//! written in turn.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use fragscope_diagnose::WindowInfo;
use fragscope_snapshot::{Action, FrameId, Snapshot, StackId, StrId, TraceEvent};
use fragscope_trace::site_of;
use parquet::data_type::{BoolType, ByteArray, ByteArrayType, Int64Type};
use parquet::file::metadata::KeyValue;
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::parser::parse_message_type;
use parquet::schema::types::ColumnPath;
use serde::Serialize;

use crate::CliError;
use fragscope_commands::export::{self, AllocRow, Allocations};
use fragscope_commands::hugepages::reserve_huge;
use parquet::schema::types::ColumnDescPtr;

mod delta_chunk;
mod dict_chunk;
use fragscope_commands::outfile::Staged;

/// Version of the tables' layout (docs/export.md).
pub const SCHEMA: &str = "fragscope.export/2";

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Snapshot files (pickles, optionally gzipped, or torch.profiler JSON traces).
    /// Without FILE: the built-in example snapshot.
    pub files: Vec<PathBuf>,
    /// Table format. Only `parquet` for now.
    #[arg(long, default_value = "parquet", value_parser = ["parquet"])]
    pub format: String,
    /// Folder to write the tables to (created if missing; existing tables are replaced).
    #[arg(short = 'o', long = "output", default_value = "fragscope-export")]
    pub output: PathBuf,
    /// Print what was written as JSON (schema `fragscope.export/2`).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub window: crate::windowed::WindowArg,
}

/// A cell of a row.
enum V<'a> {
    I(i64),
    S(&'a str),
    /// A string that lives as long as the process (action, role and reason names, the
    /// file's name): its buffer is shared without a reference count or a lookup.
    T(&'static str),
    B(bool),
    /// Null (only in optional columns).
    N,
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    I64,
    Str,
    Bool,
}

struct Col {
    kind: Kind,
    optional: bool,
    /// An INT64 column with a dictionary (not one of [`UNIQUE_INTS`]): its cells are
    /// kept as indices into the row group's dictionary ([`Col::ids`], [`Col::values`]),
    /// found as each cell comes.
    dictionary: bool,
    /// An INT64 column's cells without a dictionary (one of [`UNIQUE_INTS`]).
    ints: Vec<i64>,
    bools: Vec<bool>,
    /// Definition levels of an optional INT64 or BOOLEAN column (string columns say null
    /// by [`NULL_ID`] in `ids`).
    defs: Vec<i16>,
    /// A string column's cells, one per row: an index into `dict`, [`SPILL`] plus an
    /// index into `spill`, or [`NULL_ID`]. Four bytes a cell where a `ByteArray` is 32
    /// with a reference count to touch: the buffered cells of a 1 M-row group and their
    /// counts were ~15 % of the export's CPU (page faults, `Bytes` clones and drops).
    ///
    /// An INT64 column's with a dictionary: the cell's index into `values`, or
    /// [`NULL_ID`]: the chunk's dictionary indices as [`dict_chunk`] writes them, found
    /// once per cell as it comes rather than by a second pass over 8-byte cells kept
    /// until the row group is written (half the memory to fill, one pass fewer).
    ids: Vec<u32>,
    /// An INT64 column with a dictionary: the row group's distinct values, in the order
    /// they first came (as the `parquet` crate's writer numbers them).
    values: Vec<i64>,
    /// `values`' indices by value.
    value_ids: IntIndex,
    /// The last value met and its index: runs of one value are common (the device, a
    /// stream, a size) and are answered without a hash.
    last_value: Option<(i64, u32)>,
    /// The column's distinct strings, kept for the process's life (leaked, at most
    /// [`INTERN_MAX`] of them), so that a cell's buffer is a `&'static` one: cloned and
    /// dropped without a reference count.
    dict: Vec<ByteArray>,
    /// `dict`'s indices by string.
    intern: fragscope_snapshot::FxHashMap<&'static str, u32>,
    /// Strings of this row group past [`INTERN_MAX`]: their own buffers.
    spill: Vec<ByteArray>,
    /// The last strings met, by the address and length of the cell's `&str`, with their
    /// index: most cells are `&'static` names (actions, roles) or the snapshot's own
    /// strings, passed again and again from the same place, and are found here without a
    /// hash of their bytes (hashing and comparing strings were ~20 % of the export's CPU
    /// on the 6.4 M-event benchmark file). An entry made from a borrowed string has its
    /// bytes compared too: its address alone could be a freed string's, reused; one made
    /// from a string never freed (the last field) does not.
    recent: [(usize, usize, u32, bool); RECENT],
}

/// Strings [`Col::recent`] keeps.
const RECENT: usize = 8;
/// A null string cell in [`Col::ids`].
const NULL_ID: u32 = u32::MAX;
/// A key whose cell [`Table::context_strs`] has not found yet (never a cell: below
/// [`NULL_ID`], past every [`SPILL`] index a row group can hold).
const UNSEEN: u32 = u32::MAX - 1;
/// [`Col::ids`] at or past it are indices into [`Col::spill`].
const SPILL: u32 = 1 << 31;

impl Col {
    fn new(kind: Kind, optional: bool, dictionary: bool) -> Col {
        Col {
            kind,
            optional,
            dictionary,
            ints: Vec::new(),
            values: Vec::new(),
            value_ids: Default::default(),
            last_value: None,
            bools: Vec::new(),
            defs: Vec::new(),
            ids: Vec::new(),
            dict: Vec::new(),
            intern: Default::default(),
            spill: Vec::new(),
            recent: [(0, 0, NULL_ID, false); RECENT],
        }
    }

    /// Whether the cells are kept in [`Col::ids`] (strings, INT64 with a dictionary).
    fn by_id(&self) -> bool {
        self.kind == Kind::Str || (self.kind == Kind::I64 && self.dictionary)
    }

    /// Rows buffered.
    fn len(&self) -> usize {
        match self.kind {
            _ if self.by_id() => self.ids.len(),
            _ if self.optional => self.defs.len(),
            Kind::I64 => self.ints.len(),
            Kind::Bool => self.bools.len(),
            Kind::Str => unreachable!("strings are kept by id"),
        }
    }

    /// The slot of [`Col::recent`] for a string at `at` of `len` bytes.
    #[inline]
    fn slot(at: usize, len: usize) -> usize {
        (at.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (usize::BITS - RECENT.trailing_zeros())) ^ (len & (RECENT - 1))
    }

    /// The index of the cell `s` (`fixed`: `s` is never freed, its address names it).
    #[inline]
    fn id(&mut self, s: &str, fixed: bool) -> u32 {
        let (at, len) = (s.as_ptr() as usize, s.len());
        let slot = Self::slot(at, len);
        let (a, l, id, kept) = self.recent[slot];
        if a == at && l == len && id != NULL_ID && (kept || self.dict[id as usize].data() == s.as_bytes()) {
            return id;
        }
        let id = match self.intern.get(s) {
            Some(&id) => id,
            None if self.dict.len() < INTERN_MAX => {
                let kept: &'static str = Box::leak(s.into());
                let id = self.dict.len() as u32;
                self.dict.push(ByteArray::from(bytes::Bytes::from_static(kept.as_bytes())));
                self.intern.insert(kept, id);
                id
            }
            None => {
                self.spill.push(ByteArray::from(s));
                return SPILL + (self.spill.len() - 1) as u32;
            }
        };
        self.recent[slot] = (at, len, id, fixed);
        id
    }

    /// Appends an INT64 cell to a column with a dictionary (`None`: null).
    #[inline(always)]
    fn push_value(&mut self, x: Option<i64>) {
        let k = match (x, self.last_value) {
            (None, _) => NULL_ID,
            (Some(x), Some((v, k))) if v == x => k,
            (Some(x), _) => self.value_id(x),
        };
        self.ids.push(k);
    }

    /// The index of `x` in `values`, added where new.
    #[inline]
    fn value_id(&mut self, x: i64) -> u32 {
        let k = self.value_ids.get_or_insert(x, &mut self.values);
        self.last_value = Some((x, k));
        k
    }

    /// The buffered cells of an INT64 column with a dictionary as a dictionary-encoded
    /// column chunk ([`dict_chunk`]) for `descr`, written into `out`; `None` where the
    /// dictionary page would be over the `parquet` crate's limit (its writer falls back
    /// to plain encoding there, and writes the chunk: [`Col::plain_ints`]).
    fn int_chunk(
        &self,
        descr: ColumnDescPtr,
        out: &mut Vec<u8>,
    ) -> parquet::errors::Result<Option<parquet::column::writer::ColumnCloseResult>> {
        if self.values.len() > dict_chunk::DICT_MAX_BYTES / 8 {
            return Ok(None);
        }
        dict_chunk::write(descr, self.optional, dict_chunk::Dict::Ints(&self.values), &self.ids, out).map(Some)
    }

    /// The buffered cells of an INT64 column with a dictionary as the values and
    /// definition levels the `parquet` crate's column writer takes.
    fn plain_ints(&self) -> (Vec<i64>, Vec<i16>) {
        let values = self.ids.iter().filter(|&&k| k != NULL_ID).map(|&k| self.values[k as usize]).collect();
        let defs = self.ids.iter().map(|&k| i16::from(k != NULL_ID)).collect();
        (values, defs)
    }

    /// Empties the buffered cells (keeping their memory) and the row group's dictionary
    /// of INT64 values, after a row group is written.
    fn clear(&mut self) {
        self.ints.clear();
        self.ids.clear();
        self.spill.clear();
        self.bools.clear();
        self.defs.clear();
        self.values.clear();
        self.value_ids.clear();
        self.last_value = None;
    }

    /// Writes the buffered string cells into `w`, [`STR_BATCH`] rows at a time.
    fn write_strs(
        &self,
        w: &mut parquet::column::writer::ColumnWriterImpl<'_, ByteArrayType>,
    ) -> parquet::errors::Result<()> {
        let mut values: Vec<ByteArray> = Vec::with_capacity(STR_BATCH);
        let mut defs: Vec<i16> = Vec::with_capacity(STR_BATCH);
        for ids in self.ids.chunks(STR_BATCH) {
            values.clear();
            defs.clear();
            for &id in ids {
                defs.push(i16::from(id != NULL_ID));
                match id {
                    NULL_ID => {}
                    i if i >= SPILL => values.push(self.spill[(i - SPILL) as usize].clone()),
                    i => values.push(self.dict[i as usize].clone()),
                }
            }
            w.write_batch(&values, self.optional.then_some(defs.as_slice()), None)?;
        }
        Ok(())
    }

    /// The buffered string cells as a dictionary-encoded column chunk ([`dict_chunk`]) for
    /// `descr`; `None` where the `parquet` crate's writer must write them: strings past
    /// [`INTERN_MAX`], or a dictionary page over its limit (it falls back to plain
    /// encoding there).
    fn dict_chunk(
        &self,
        descr: ColumnDescPtr,
        scratch: &mut Scratch,
    ) -> parquet::errors::Result<Option<parquet::column::writer::ColumnCloseResult>> {
        if !self.spill.is_empty() {
            return Ok(None);
        }
        // The row group's dictionary: the values it uses, in the order they first come
        // (as the crate's writer numbers them).
        let mut local = vec![dict_chunk::NULL_KEY; self.dict.len()];
        let mut values: Vec<&[u8]> = Vec::new();
        let keys = &mut scratch.keys;
        keys.clear();
        for &id in &self.ids {
            if id == NULL_ID {
                keys.push(dict_chunk::NULL_KEY);
                continue;
            }
            let k = &mut local[id as usize];
            if *k == dict_chunk::NULL_KEY {
                *k = values.len() as u32;
                values.push(self.dict[id as usize].data());
            }
            keys.push(*k);
        }
        if dict_chunk::dict_page_len(&values) > dict_chunk::DICT_MAX_BYTES {
            return Ok(None);
        }
        dict_chunk::write(descr, self.optional, dict_chunk::Dict::Strs(&values), keys, &mut scratch.out).map(Some)
    }
}

/// The indices of a row group's distinct INT64 values ([`Col::values`]) by value: open
/// addressing with linear probing, by Fibonacci hashing of the value (its high bits:
/// addresses and sizes, multiples of 512, differ in their middle bits). It does what an
/// `FxHashMap<i64, u32>` did, with one multiplication and, most of the time, one probe
/// of one 16-byte slot: the lookups were ~11 % of the export's CPU.
#[derive(Default)]
struct IntIndex {
    /// `(value, index)`, [`NULL_ID`] as the index of an empty slot; a power of two long
    /// (or empty).
    slots: Vec<(i64, u32)>,
    /// Slots in use.
    len: usize,
}

impl IntIndex {
    /// The slot `x` hashes to in a table of `2^bits` slots.
    #[inline]
    fn home(x: i64, bits: u32) -> usize {
        ((x as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - bits)) as usize
    }

    /// The index of `x`; where it is new, `values.len()`, and `x` is pushed on `values`.
    #[inline]
    fn get_or_insert(&mut self, x: i64, values: &mut Vec<i64>) -> u32 {
        if 2 * (self.len + 1) > self.slots.len() {
            self.grow();
        }
        let mask = self.slots.len() - 1;
        let mut i = Self::home(x, self.slots.len().trailing_zeros());
        loop {
            let (v, k) = self.slots[i];
            if k == NULL_ID {
                let k = values.len() as u32;
                values.push(x);
                self.slots[i] = (x, k);
                self.len += 1;
                return k;
            }
            if v == x {
                return k;
            }
            i = (i + 1) & mask;
        }
    }

    /// Twice the slots (at least 1,024), every value placed again.
    #[cold]
    fn grow(&mut self) {
        let n = (self.slots.len() * 2).max(1024);
        let old = std::mem::replace(&mut self.slots, vec![(0, NULL_ID); n]);
        let (mask, bits) = (n - 1, n.trailing_zeros());
        for (v, k) in old.into_iter().filter(|&(_, k)| k != NULL_ID) {
            let mut i = Self::home(v, bits);
            while self.slots[i].1 != NULL_ID {
                i = (i + 1) & mask;
            }
            self.slots[i] = (v, k);
        }
    }

    /// Empties the index, keeping its slots.
    fn clear(&mut self) {
        if self.len > 0 {
            self.slots.fill((0, NULL_ID));
            self.len = 0;
        }
    }
}

/// Buffers a table keeps from column chunk to column chunk (a fresh one per chunk is a
/// page fault per 4 KiB it fills: with `fragscope`'s 1 MiB mmap threshold each is
/// mapped anew, ~40 % of the export's page faults).
#[derive(Default)]
struct Scratch {
    /// A string chunk's dictionary indices.
    keys: Vec<u32>,
    /// A chunk's bytes ([`dict_chunk::write`]).
    out: Vec<u8>,
}

/// Distinct strings a column keeps (past it, new strings get their own buffer per cell).
const INTERN_MAX: usize = 1 << 16;

/// String cells handed to the `parquet` writer at a time (a multiple of its 1,024-value
/// write batch).
const STR_BATCH: usize = 1 << 16;

/// INT64 columns whose values are (nearly) all distinct: written without a dictionary,
/// as deltas ([`delta_chunk`]; plain, they were ~90 % of the tables' bytes).
const UNIQUE_INTS: [&str; 7] =
    ["idx", "time_us", "alloc_idx", "free_requested_idx", "free_completed_idx", "alloc_time_us", "free_time_us"];

/// Rows kept before a row group is written. The columns' buffers hold a row group (4 or
/// 8 bytes a cell, ~180 MB for both long tables at 1 M rows) and are reused from one
/// group to the next: fresh memory is faulted in once per buffer, which on the machines
/// the benchmarks run on costs more than the writing it saves. At 256 k rows `export` of
/// the benchmark files was 8-10 % faster (`bench/RESULTS.md`, 8 alternated runs: cons
/// 1.127 -> 1.032 s, rep 0.926 -> 0.830 s; system time -35 %) and the files 0.8 % smaller
/// (a dictionary per row group is smaller); readers read a row group at a time anyway.
const ROW_GROUP: usize = 1 << 18;

/// Rows of a long table written column by column at a time: few enough
/// that the block's trace entries (32 bytes each) or allocation rows (88) stay in the
/// CPU's cache from one column to the next; each column's pass over a whole row group
/// would read them from memory again.
const BLOCK: usize = 4096;

/// One table being written: its columns buffered up to [`ROW_GROUP`] rows, into a
/// temporary file in the output folder that [`run`] renames over `path` only once every
/// table was written ([`Staged::commit_all`]).
struct Table {
    name: &'static str,
    path: PathBuf,
    cols: Vec<Col>,
    /// The columns' descriptors (for the chunks [`Col::dict_chunk`] writes).
    descrs: Vec<ColumnDescPtr>,
    rows: usize,
    total: u64,
    scratch: Scratch,
    writer: SerializedFileWriter<File>,
    staged: Staged,
}

/// The writer's properties for a table of `columns` (`(name, kind, optional)`).
fn writer_properties(columns: &[(&str, Kind, bool)]) -> WriterProperties {
    let mut props = WriterProperties::builder()
        .set_created_by(format!("fragscope {}", env!("CARGO_PKG_VERSION")))
        .set_key_value_metadata(Some(vec![KeyValue::new("fragscope.schema".into(), SCHEMA.to_string())]));
    for &(n, k, _) in columns {
        let col = || ColumnPath::from(n);
        if k == Kind::Str {
            // No min/max of strings: comparing every cell's bytes was ~8 % of the
            // export's CPU, and a string's range prunes little (one row group per
            // table up to 256 k rows, and every group holds most actions and roles).
            props = props.set_column_statistics_enabled(col(), EnabledStatistics::None);
        } else if k == Kind::I64 && UNIQUE_INTS.contains(&n) {
            // A dictionary of values nearly all distinct falls back to plain
            // encoding once full: its hashing (~17 % of the export's CPU, with
            // the strings') bought nothing.
            props = props.set_column_dictionary_enabled(col(), false);
        }
    }
    props.build()
}

fn io_err(path: &Path, e: impl std::fmt::Display) -> CliError {
    CliError::usage(format!("cannot write {}: {e}", path.display()))
}

impl Table {
    /// `columns`: `(name, kind, optional)`.
    fn create(dir: &Path, name: &'static str, columns: &[(&str, Kind, bool)]) -> Result<Table, CliError> {
        let fields: Vec<String> = columns
            .iter()
            .map(|(n, k, opt)| {
                let rep = if *opt { "optional" } else { "required" };
                let ty = match k {
                    Kind::I64 => "int64",
                    Kind::Str => "binary",
                    Kind::Bool => "boolean",
                };
                let ann = if *k == Kind::Str { " (STRING)" } else { "" };
                format!("{rep} {ty} {n}{ann};")
            })
            .collect();
        let message = format!("message {name} {{ {} }}", fields.join(" "));
        let schema = Arc::new(parse_message_type(&message).map_err(|e| io_err(dir, e))?);
        let props = writer_properties(columns);
        let path = dir.join(format!("{name}.parquet"));
        // Never `File::create(path)`: it would follow a symlink at `path` (out of the
        // folder, when dangling) and hang on a FIFO.
        let (staged, f) = Staged::new(&path).map_err(|e| io_err(&path, e))?;
        let writer = SerializedFileWriter::new(f, schema, Arc::new(props)).map_err(|e| io_err(&path, e))?;
        let cols =
            columns.iter().map(|&(n, kind, optional)| Col::new(kind, optional, !UNIQUE_INTS.contains(&n))).collect();
        let descrs = writer.schema_descr().columns().to_vec();
        Ok(Table { name, path, cols, descrs, rows: 0, total: 0, scratch: Scratch::default(), writer, staged })
    }

    /// Makes room for `rows` more rows (up to a row group's) before they come: the
    /// columns then grow once, not by doubling and copying.
    fn reserve(&mut self, rows: usize) {
        let rows = rows.min(ROW_GROUP - self.rows);
        for c in &mut self.cols {
            match c.kind {
                _ if c.by_id() => reserve_huge(&mut c.ids, rows),
                Kind::I64 => reserve_huge(&mut c.ints, rows),
                Kind::Str => unreachable!("strings are kept by id"),
                Kind::Bool => reserve_huge(&mut c.bools, rows),
            }
            if c.optional && !c.by_id() {
                reserve_huge(&mut c.defs, rows);
            }
        }
        reserve_huge(&mut self.scratch.keys, rows);
    }

    // The long tables are written a block of rows at a time ([`BLOCK`], or as many as
    // the row group has room for, [`Table::room`]), column by column (`k`: the column's position),
    // then [`Table::add_rows`]: each column's cells in one loop, its kind and
    // dictionary looked at once per block rather than once per cell (the per-cell calls
    // were ~20 % of the export's CPU on the 6.4 M-entry benchmark files).

    /// Rows the row group being filled has room for.
    fn room(&self) -> usize {
        ROW_GROUP - self.rows
    }

    /// Cells of INT64 column `k`.
    #[inline]
    fn ints(&mut self, k: usize, xs: impl Iterator<Item = i64>) {
        let c = &mut self.cols[k];
        debug_assert!(c.kind == Kind::I64);
        if c.dictionary {
            for x in xs {
                c.push_value(Some(x));
            }
            return;
        }
        let before = c.ints.len();
        c.ints.extend(xs);
        if c.optional {
            c.defs.resize(c.defs.len() + c.ints.len() - before, 1);
        }
    }

    /// Cells of an optional INT64 column `k` (`None`: null).
    #[inline]
    fn opt_ints(&mut self, k: usize, xs: impl Iterator<Item = Option<i64>>) {
        let c = &mut self.cols[k];
        debug_assert!(c.kind == Kind::I64 && c.optional);
        if c.dictionary {
            for x in xs {
                c.push_value(x);
            }
            return;
        }
        for x in xs {
            match x {
                Some(x) => {
                    c.ints.push(x);
                    c.defs.push(1);
                }
                None => c.defs.push(0),
            }
        }
    }

    /// Cells of string column `k` (`None`: null), `fixed`: the strings are never freed
    /// ([`Col::id`]).
    #[inline]
    fn strs<'s>(&mut self, k: usize, xs: impl Iterator<Item = Option<&'s str>>, fixed: bool) {
        let c = &mut self.cols[k];
        debug_assert!(c.kind == Kind::Str);
        for s in xs {
            let id = s.map_or(NULL_ID, |s| c.id(s, fixed));
            c.ids.push(id);
        }
    }

    /// Cells of string column `k`, one per key of `keys` (a row's entry context,
    /// [`context_keys`]), each the string `of(key)` (`None`: null). Each key's index is
    /// found once, the first time it comes, and kept in `known` (by key, [`UNSEEN`] until
    /// then): a few contexts name the strings of millions of rows, whose bytes
    /// [`Col::id`] compared each time (~5 % of the export's CPU).
    fn context_strs<'s>(&mut self, k: usize, keys: &[u32], known: &mut Vec<u32>, of: impl Fn(u32) -> Option<&'s str>) {
        let c = &mut self.cols[k];
        debug_assert!(c.kind == Kind::Str);
        for &key in keys {
            let slot = key as usize;
            if slot >= known.len() {
                known.resize(slot + 1, UNSEEN);
            }
            let id = match known[slot] {
                UNSEEN => {
                    let id = of(key).map_or(NULL_ID, |s| c.id(s, false));
                    // A string past [`INTERN_MAX`] has a buffer per cell: found each time.
                    if id == NULL_ID || id < SPILL {
                        known[slot] = id;
                    }
                    id
                }
                id => id,
            };
            c.ids.push(id);
        }
    }

    /// `n` cells of string column `k`, all `s` (never freed), by the index
    /// [`Table::index_of`] gave (`None`: found for the block).
    fn same_str(&mut self, k: usize, id: Option<u32>, s: &'static str, n: usize) {
        let c = &mut self.cols[k];
        let id = id.unwrap_or_else(|| c.id(s, true));
        c.ids.resize(c.ids.len() + n, id);
    }

    /// Cells of string column `k`, each a string never freed with the index
    /// [`Table::index_of`] gave it (`None`: found each time).
    #[inline]
    fn static_strs(&mut self, k: usize, xs: impl Iterator<Item = (Option<u32>, &'static str)>) {
        let c = &mut self.cols[k];
        for (id, s) in xs {
            let id = id.unwrap_or_else(|| c.id(s, true));
            c.ids.push(id);
        }
    }

    /// The index of `s` (never freed) in column `k`'s dictionary, for
    /// [`Table::same_str`] and [`Table::static_strs`]; `None` past [`INTERN_MAX`]
    /// strings.
    fn index_of(&mut self, k: usize, s: &'static str) -> Option<u32> {
        Some(self.cols[k].id(s, true)).filter(|&id| id < SPILL)
    }

    /// Ends a block of `n` rows (every column given its `n` cells), writing the row
    /// group once full.
    fn add_rows(&mut self, n: usize) -> Result<(), CliError> {
        debug_assert!(self.cols.iter().all(|c| c.len() == self.rows + n), "a cell per column");
        debug_assert!(n <= self.room());
        self.rows += n;
        if self.rows >= ROW_GROUP {
            self.flush()?;
        }
        Ok(())
    }

    fn row(&mut self, cells: &[V]) -> Result<(), CliError> {
        debug_assert_eq!(cells.len(), self.cols.len());
        for (c, v) in self.cols.iter_mut().zip(cells) {
            match v {
                V::N if c.by_id() => {
                    debug_assert!(c.optional);
                    c.ids.push(NULL_ID);
                    continue;
                }
                V::I(x) if c.dictionary => {
                    c.push_value(Some(*x));
                    continue;
                }
                V::N => {
                    debug_assert!(c.optional);
                    c.defs.push(0);
                    continue;
                }
                V::I(x) => c.ints.push(*x),
                V::S(s) => {
                    let id = c.id(s, false);
                    c.ids.push(id);
                    continue;
                }
                V::T(s) => {
                    let id = c.id(s, true);
                    c.ids.push(id);
                    continue;
                }
                V::B(b) => c.bools.push(*b),
            }
            if c.optional {
                c.defs.push(1);
            }
        }
        self.rows += 1;
        if self.rows >= ROW_GROUP {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), CliError> {
        if self.rows == 0 {
            return Ok(());
        }
        let path = self.path.clone();
        let e = |x: parquet::errors::ParquetError| io_err(&path, x);
        let mut rg = self.writer.next_row_group().map_err(e)?;
        let scratch = &mut self.scratch;
        for (c, descr) in self.cols.iter_mut().zip(&self.descrs) {
            let chunk = match c.kind {
                Kind::Str => c.dict_chunk(descr.clone(), scratch).map_err(e)?,
                Kind::I64 if c.dictionary => c.int_chunk(descr.clone(), &mut scratch.out).map_err(e)?,
                Kind::I64 => {
                    let defs = if c.optional { c.defs.as_slice() } else { &[] };
                    Some(delta_chunk::write(descr.clone(), c.optional, defs, &c.ints, &mut scratch.out).map_err(e)?)
                }
                Kind::Bool => None,
            };
            if let Some(close) = chunk {
                rg.append_column(&dict_chunk::Chunk(&scratch.out), close).map_err(e)?;
                c.clear();
                continue;
            }
            let mut w = rg.next_column().map_err(e)?.ok_or_else(|| io_err(&path, "schema mismatch"))?;
            let defs = c.optional.then_some(c.defs.as_slice());
            match c.kind {
                // A dictionary past the page's limit (the columns without one are
                // written by [`delta_chunk`] above).
                Kind::I64 => {
                    let (ints, defs) = c.plain_ints();
                    w.typed::<Int64Type>().write_batch(&ints, c.optional.then_some(defs.as_slice()), None).map(|_| ())
                }
                Kind::Str => c.write_strs(w.typed::<ByteArrayType>()),
                Kind::Bool => w.typed::<BoolType>().write_batch(&c.bools, defs, None).map(|_| ()),
            }
            .map_err(e)?;
            w.close().map_err(e)?;
            c.clear();
        }
        rg.close().map_err(e)?;
        self.total += self.rows as u64;
        self.rows = 0;
        start_writeback(self.writer.inner());
        Ok(())
    }

    /// Writes the footer and syncs the temporary file; returns what to report and the
    /// file to rename.
    fn finish(mut self) -> Result<(TableOut, Staged), CliError> {
        self.flush()?;
        let path = self.path.clone();
        self.writer.finish().map_err(|e| io_err(&path, e))?;
        self.writer.inner().sync_all().map_err(|e| io_err(&path, e))?;
        Ok((TableOut { name: self.name, path: path.display().to_string(), rows: self.total }, self.staged))
    }
}

#[derive(Serialize)]
struct TableOut {
    name: &'static str,
    path: String,
    rows: u64,
}

#[derive(Serialize)]
struct JsonOut<'a> {
    schema: &'static str,
    format: &'a str,
    output: String,
    files: Vec<FileOut>,
    tables: Vec<TableOut>,
}

#[derive(Serialize)]
struct FileOut {
    file: String,
    window: Option<WindowInfo>,
}

use Kind::{Bool, Str, I64};

/// The tables and their columns (docs/export.md): name, then each column's name, kind and
/// whether it may be null.
type TableSpec = (&'static str, &'static [(&'static str, Kind, bool)]);

/// The tables, in the order [`export_snapshot`] fills them.
const TABLES: [TableSpec; 9] = [
    (
        "trace_events",
        &[
            ("file", Str, false),
            ("device", I64, false),
            ("idx", I64, false),
            ("action", Str, false),
            ("addr", I64, false),
            ("size", I64, false),
            ("stream", I64, false),
            ("time_us", I64, true),
            ("stack_id", I64, true),
            ("pool_id", Str, true),
            ("compile_context", Str, true),
            ("user_metadata", Str, true),
        ],
    ),
    (
        "allocations",
        &[
            ("file", Str, false),
            ("device", I64, false),
            ("alloc_idx", I64, true),
            ("free_requested_idx", I64, true),
            ("free_completed_idx", I64, true),
            ("alloc_time_us", I64, true),
            ("free_time_us", I64, true),
            ("lifetime_us", I64, true),
            ("addr", I64, false),
            ("requested_size", I64, false),
            ("rounded_size", I64, false),
            ("stream", I64, false),
            ("stack_id", I64, true),
            ("site", Str, false),
            ("annotation", Str, true),
            ("role", Str, true),
            ("role_evidence", Str, true),
            ("compile_context", Str, true),
            ("user_metadata", Str, true),
        ],
    ),
    (
        "segments",
        &[
            ("file", Str, false),
            ("device", I64, false),
            ("address", I64, false),
            ("total_size", I64, false),
            ("allocated_size", I64, false),
            ("active_size", I64, false),
            ("requested_size", I64, true),
            ("stream", I64, false),
            ("segment_type", Str, false),
            ("pool_id", Str, true),
            ("is_expandable", Bool, true),
            ("stack_id", I64, true),
            ("blocks", I64, false),
        ],
    ),
    (
        "blocks",
        &[
            ("file", Str, false),
            ("device", I64, false),
            ("segment_address", I64, false),
            ("address", I64, false),
            ("size", I64, false),
            ("requested_size", I64, true),
            ("state", Str, false),
            ("stack_id", I64, true),
            ("site", Str, true),
        ],
    ),
    ("stacks", &[("file", Str, false), ("stack_id", I64, false), ("depth", I64, false), ("frame_id", I64, true)]),
    (
        "frames",
        &[
            ("file", Str, false),
            ("frame_id", I64, false),
            ("filename", Str, false),
            ("line", I64, false),
            ("name", Str, false),
        ],
    ),
    (
        "annotations",
        &[
            ("file", Str, false),
            ("device", I64, false),
            ("time_us", I64, false),
            ("name", Str, false),
            ("stage", Str, false),
        ],
    ),
    // Pinned host memory (`host_segments`, `host_traces`): CPU RAM held by the pinned
    // (page-locked) allocator, in tables of their own so that no sum over the device
    // tables ever counts it.
    (
        "host_blocks",
        &[
            ("file", Str, false),
            ("segment_address", I64, false),
            ("segment_size", I64, false),
            ("address", I64, false),
            ("size", I64, false),
            ("requested_size", I64, true),
            ("state", Str, false),
            ("stack_id", I64, true),
        ],
    ),
    (
        "host_events",
        &[
            ("file", Str, false),
            ("idx", I64, false),
            ("action", Str, false),
            ("addr", I64, false),
            ("size", I64, false),
            ("time_us", I64, true),
            ("stack_id", I64, true),
        ],
    ),
];

/// The names of the columns of table `t` of [`TABLES`] (the long tables' writers name
/// columns by position).
fn column_names(t: usize) -> Vec<&'static str> {
    TABLES[t].1.iter().map(|c| c.0).collect()
}

/// Creates the tables ([`TABLES`]) in `dir`.
fn create_tables(dir: &Path) -> Result<Vec<Table>, CliError> {
    TABLES.iter().map(|&(name, columns)| Table::create(dir, name, columns)).collect()
}

fn sid(s: Option<StackId>) -> V<'static> {
    s.map_or(V::N, |s| V::I(s.index() as i64))
}

fn opt_time(t: i64) -> V<'static> {
    if t == fragscope_snapshot::NO_TIME {
        V::N
    } else {
        V::I(t)
    }
}

/// Writes one snapshot's rows into the tables; `last`: no snapshot comes after it.
fn export_snapshot(file: &str, snap: &Snapshot, t: &mut [Table], last: bool) -> Result<(), CliError> {
    let [trace, allocs, segs, blocks, stacks, frames, anns, host_blocks, host_events] = t else {
        unreachable!("nine tables")
    };
    // The file's name is a cell of every row of the two long tables: kept for the
    // process's life (a few bytes per file exported), its cells are shared buffers
    // without a count ([`V::T`]).
    let file_static: &'static str = Box::leak(file.into());
    // The stacks any row names: only those go into `stacks` and `frames`.
    let mut used = Used::new(snap);
    // Each context's pool as the text the column holds, once per context.
    let pools: Vec<Option<String>> = snap.contexts.iter().map(|c| c.pool_id.map(|(a, b)| format!("{a},{b}"))).collect();
    let devices = snap.device_traces.len();
    for (d, tr) in snap.device_traces.iter().enumerate() {
        let device = d as i64;
        // Two files that share nothing: `trace_events` on a thread of its own beside the
        // allocations (their pairing, the roles' walks and their rows), each table's rows
        // in the order one thread would write them. That thread pairs the allocations
        // first, beside the roles' walks (which read the trace alone; their steps on a
        // thread of their own): the allocations' rows wait for both. Three threads, not
        // four: the walks, which the allocations wait for, get more of the two cores.
        // No rows come after the last device's of the last snapshot: its thread writes
        // `trace_events`' last row group too, beside the allocations (the same rows, in
        // the same group, as when [`Table::finish`] writes it, after them).
        let ends_trace_events = last && d + 1 == devices;
        let (pools, trace, file) = (&pools, &mut *trace, file_static);
        let (segs, blocks, host_blocks, host_events) = (&mut *segs, &mut *blocks, &mut *host_blocks, &mut *host_events);
        let (events, allocations) = std::thread::scope(|sc| {
            let (pairs_tx, pairs) = std::sync::mpsc::sync_channel(1);
            let events = sc.spawn(move || {
                // Received below unless that thread has failed (the scope then says so).
                let _ = pairs_tx.send(export::pair_allocations(tr));
                let mut used = Used::new(snap);
                write_trace_events(file, snap, device, tr, pools, trace, &mut used)?;
                if ends_trace_events {
                    trace.flush()?;
                }
                Ok::<_, CliError>(used)
            });
            let lives = export::block_roles(snap, device, tr);
            let mut rows = pairs.recv().expect("the trace_events thread pairs the allocations first");
            let row_roles = export::roles_of_rows(snap, device, tr, &mut rows, lives);
            let mut allocations = write_allocations(file, snap, device, tr, &rows, &row_roles, allocs, &mut used);
            // The allocations' rows end before `trace_events`' (~50-70 ms before, of
            // 0.8 s, on the consistent benchmark file, the main thread idle): the
            // snapshot's segments, blocks and host tables, which no trace entry names,
            // are written then, after the last device's allocations (the same rows, in
            // the same order, as after the loop).
            if allocations.is_ok() && d + 1 == devices {
                allocations = write_segments(file, snap, segs, blocks, &mut used)
                    .and_then(|()| write_host(file, snap, host_blocks, host_events, &mut used));
            }
            (events.join().expect("trace_events thread"), allocations)
        });
        used.merge(events?);
        allocations?;
    }
    if devices == 0 {
        write_segments(file, snap, segs, blocks, &mut used)?;
        write_host(file, snap, host_blocks, host_events, &mut used)?;
    }
    write_stacks(file, snap, used, stacks, frames)?;
    for a in snap.external_annotations.iter().flatten() {
        anns.row(&[V::S(file), V::I(a.device), V::I(a.time_us), V::S(&a.name), V::S(&a.stage)])?;
    }
    Ok(())
}

/// The stacks the rows name, by their index in the snapshot's table: a slot per stack
/// where a `HashSet` hashed every row's stack (SipHash, ~4 % of the export's CPU).
struct Used(Vec<Option<StackId>>);

impl Used {
    fn new(snap: &Snapshot) -> Used {
        Used(vec![None; snap.frames.num_stacks()])
    }

    /// Adds `s` to the stacks the rows name (`None`: no stack, nothing to add).
    #[inline]
    fn note(&mut self, s: Option<StackId>) {
        if let Some(s) = s {
            if s.index() >= self.0.len() {
                self.0.resize(s.index() + 1, None);
            }
            self.0[s.index()] = Some(s);
        }
    }

    fn merge(&mut self, other: Used) {
        for s in other.0 {
            self.note(s);
        }
    }
}

/// Each of `entries`' keys for [`Table::context_strs`], into `keys` (emptied first): its
/// entry context's index + 1, or 0 for no entry or an entry without a context (whose
/// strings are all null).
fn context_keys<'e>(snap: &Snapshot, entries: impl Iterator<Item = Option<&'e TraceEvent>>, keys: &mut Vec<u32>) {
    let n = snap.contexts.len();
    keys.clear();
    keys.extend(entries.map(|e| e.and_then(|e| e.context.index()).filter(|&i| i < n).map_or(0, |i| i as u32 + 1)));
}

/// The string `pick` names in the entry context of key `key` ([`context_keys`]).
fn context_str(
    snap: &Snapshot,
    key: u32,
    pick: fn(&fragscope_snapshot::EntryContext) -> Option<StrId>,
) -> Option<&str> {
    pick(snap.contexts.get(key.checked_sub(1)? as usize)?).map(|c| snap.frames.str(c))
}

/// Writes device `device`'s trace entries `tr` into `trace_events`, one row per entry in
/// order; `pools` is each context's pool column text (by context index).
fn write_trace_events(
    file: &'static str,
    snap: &Snapshot,
    device: i64,
    tr: &[TraceEvent],
    pools: &[Option<String>],
    trace: &mut Table,
    used: &mut Used,
) -> Result<(), CliError> {
    trace.reserve(tr.len());
    debug_assert_eq!(column_names(0)[..4], ["file", "device", "idx", "action"]);
    let file_k = trace.index_of(0, file);
    let mut action_k = [None; 16];
    for a in Action::ALL {
        action_k[a as usize] = trace.index_of(3, a.as_str());
    }
    let (mut keys, mut known) = (Vec::with_capacity(BLOCK), [Vec::new(), Vec::new(), Vec::new()]);
    let mut start = 0;
    while start < tr.len() {
        let n = trace.room().min(tr.len() - start).min(BLOCK);
        let rows = &tr[start..start + n];
        for e in rows {
            used.note(e.stack);
        }
        context_keys(snap, rows.iter().map(Some), &mut keys);
        trace.same_str(0, file_k, file, n);
        trace.ints(1, std::iter::repeat_n(device, n));
        trace.ints(2, (start..start + n).map(|i| i as i64));
        trace.static_strs(3, rows.iter().map(|e| (action_k[e.action as usize], e.action.as_str())));
        trace.ints(4, rows.iter().map(|e| e.addr as i64));
        trace.ints(5, rows.iter().map(|e| e.size as i64));
        trace.ints(6, rows.iter().map(|e| snap.stream(e) as i64));
        trace.opt_ints(7, rows.iter().map(|e| (e.time_us != fragscope_snapshot::NO_TIME).then_some(e.time_us)));
        trace.opt_ints(8, rows.iter().map(|e| e.stack.map(|s| s.index() as i64)));
        trace.context_strs(9, &keys, &mut known[0], |key| pools.get(key.checked_sub(1)? as usize)?.as_deref());
        trace.context_strs(10, &keys, &mut known[1], |key| context_str(snap, key, |c| c.compile_context));
        trace.context_strs(11, &keys, &mut known[2], |key| context_str(snap, key, |c| c.user_metadata));
        trace.add_rows(n)?;
        start += n;
    }
    Ok(())
}

/// Writes device `device`'s `rows` (with their `roles`, [`allocation_roles`](fragscope_commands::export::allocation_roles)) into
/// `allocations`: times and lifetime from the trace `tr`, the rounded size under the
/// recorded allocator settings, the call site and the innermost annotation scope.
#[allow(clippy::too_many_arguments)]
fn write_allocations(
    file: &'static str,
    snap: &Snapshot,
    device: i64,
    tr: &[TraceEvent],
    rows: &Allocations,
    roles: &[Option<fragscope_trace::BlockRole>],
    allocs: &mut Table,
    used: &mut Used,
) -> Result<(), CliError> {
    let cfg = fragscope_replay::recorded_config(snap);
    let scopes = fragscope_trace::Scopes::new(snap, device);
    // Each call site once, by its stack's slot (0: no stack; the stack's index + 1).
    let mut sites: Vec<Option<String>> = Vec::new();
    let slot = |s: Option<StackId>| s.map_or(0, |s| s.index() + 1);
    // The alloc entry's compile_context / user_metadata as recorded (null before the
    // trace or when the entry has none), to group by as by annotation: by the alloc
    // entry's context ([`context_keys`]).
    let (mut keys, mut known) = (Vec::with_capacity(BLOCK), [Vec::new(), Vec::new()]);
    let start_time = |a: &AllocRow| (a.time != fragscope_snapshot::NO_TIME).then_some(a.time);
    // The time of the free, which the pairing notes as it passes it (read here from the
    // trace, a cache miss per row).
    let end_time = |a: &AllocRow| (a.end != fragscope_snapshot::NO_TIME).then_some(a.end);
    allocs.reserve(rows.len());
    debug_assert_eq!(column_names(1)[..2], ["file", "device"]);
    debug_assert_eq!(column_names(1)[12..17], ["stack_id", "site", "annotation", "role", "role_evidence"]);
    let file_k = allocs.index_of(0, file);
    let idx = |k: Option<usize>| k.map(|k| k as i64);
    let mut site_ids: Vec<Option<u32>> = Vec::new();
    // The block's rows, read from the pairs' entries once per block into one buffer.
    let mut block: Vec<AllocRow> = Vec::with_capacity(BLOCK);
    let mut start = 0;
    while start < rows.len() {
        let n = allocs.room().min(rows.len() - start).min(BLOCK);
        rows.rows_into(snap, tr, start..start + n, &mut block);
        let block_roles = &roles[start..start + n];
        for a in &block {
            used.note(a.stack);
            let k = slot(a.stack);
            if k >= sites.len() {
                sites.resize(k + 1, None);
                site_ids.resize(k + 1, None);
            }
            if sites[k].is_none() {
                sites[k] = Some(site_of(&snap.frames, a.stack).site);
            }
        }
        context_keys(snap, block.iter().map(|a| a.alloc.and_then(|k| tr.get(k))), &mut keys);
        allocs.same_str(0, file_k, file, n);
        allocs.ints(1, std::iter::repeat_n(device, n));
        allocs.opt_ints(2, block.iter().map(|a| idx(a.alloc)));
        allocs.opt_ints(3, block.iter().map(|a| idx(a.fr)));
        allocs.opt_ints(4, block.iter().map(|a| idx(a.fc)));
        allocs.opt_ints(5, block.iter().map(start_time));
        allocs.opt_ints(6, block.iter().map(end_time));
        allocs.opt_ints(7, block.iter().map(|a| start_time(a).zip(end_time(a)).map(|(s, e)| e - s)));
        allocs.ints(8, block.iter().map(|a| a.addr as i64));
        allocs.ints(9, block.iter().map(|a| a.req as i64));
        allocs.ints(10, block.iter().map(|a| fragscope_alloc::rounding::round_size(a.req, &cfg) as i64));
        allocs.ints(11, block.iter().map(|a| a.stream));
        allocs.opt_ints(12, block.iter().map(|a| a.stack.map(|s| s.index() as i64)));
        // Each call site's index in the column found once (the string's bytes compared
        // once, not per row), where it has one for the process's life.
        let c = &mut allocs.cols[13];
        for a in &block {
            let k = slot(a.stack);
            let id = match site_ids[k] {
                Some(id) => id,
                None => {
                    let id = c.id(sites[k].as_deref().expect("a site per stack of a row"), false);
                    site_ids[k] = (id < SPILL).then_some(id);
                    id
                }
            };
            c.ids.push(id);
        }
        allocs.strs(14, block.iter().map(|a| start_time(a).and_then(|t| scopes.innermost_at(t))), false);
        allocs.strs(15, block_roles.iter().map(|r| r.map(|r| r.role.as_str())), true);
        allocs.strs(16, block_roles.iter().map(|r| r.map(|r| r.reason.describe())), true);
        allocs.context_strs(17, &keys, &mut known[0], |key| context_str(snap, key, |c| c.compile_context));
        allocs.context_strs(18, &keys, &mut known[1], |key| context_str(snap, key, |c| c.user_metadata));
        allocs.add_rows(n)?;
        start += n;
    }
    Ok(())
}

/// Writes the snapshot's allocator state: each segment into `segments`, its blocks into
/// `blocks`.
fn write_segments(
    file: &str,
    snap: &Snapshot,
    segs: &mut Table,
    blocks: &mut Table,
    used: &mut Used,
) -> Result<(), CliError> {
    // Each stack's call site once (by the stack's index): the blocks of a segment often
    // share their stack, and finding a site walks its frames.
    let mut sites: Vec<Option<String>> = Vec::new();
    for s in &snap.segments {
        used.note(s.stack);
        let pool = s.segment_pool_id.map(|(a, b)| format!("{a},{b}"));
        segs.row(&[
            V::S(file),
            V::I(s.device),
            V::I(s.address as i64),
            V::I(s.total_size as i64),
            V::I(s.allocated_size as i64),
            V::I(s.active_size as i64),
            s.requested_size.map_or(V::N, |r| V::I(r as i64)),
            V::I(s.stream as i64),
            V::T(s.segment_type.as_str()),
            pool.as_deref().map_or(V::N, V::S),
            s.is_expandable.map_or(V::N, V::B),
            sid(s.stack),
            V::I(s.blocks.len() as i64),
        ])?;
        for b in &s.blocks {
            used.note(b.stack);
            let site = b.stack.map(|st| {
                if st.index() >= sites.len() {
                    sites.resize(st.index() + 1, None);
                }
                sites[st.index()].get_or_insert_with(|| site_of(&snap.frames, Some(st)).site).as_str()
            });
            blocks.row(&[
                V::S(file),
                V::I(s.device),
                V::I(s.address as i64),
                V::I(b.address as i64),
                V::I(b.size as i64),
                b.requested_size.map_or(V::N, |r| V::I(r as i64)),
                V::T(b.state.as_str()),
                sid(b.stack),
                site.map_or(V::N, V::S),
            ])?;
        }
    }
    Ok(())
}

/// Writes pinned host memory: every block of every `host_segments` entry into
/// `host_blocks`, every `host_traces` entry into `host_events` (none when not recorded).
fn write_host(
    file: &str,
    snap: &Snapshot,
    blocks: &mut Table,
    events: &mut Table,
    used: &mut Used,
) -> Result<(), CliError> {
    for s in snap.host_segments.iter().flatten() {
        for b in &s.blocks {
            used.note(b.stack);
            blocks.row(&[
                V::S(file),
                V::I(s.address as i64),
                V::I(s.total_size as i64),
                V::I(b.address as i64),
                V::I(b.size as i64),
                b.requested_size.map_or(V::N, |r| V::I(r as i64)),
                V::T(b.state.as_str()),
                sid(b.stack),
            ])?;
        }
    }
    for (i, e) in snap.host_traces.iter().flatten().enumerate() {
        used.note(e.stack);
        events.row(&[
            V::S(file),
            V::I(i as i64),
            V::T(e.action.as_str()),
            V::I(e.addr as i64),
            V::I(e.size as i64),
            opt_time(e.time_us),
            sid(e.stack),
        ])?;
    }
    Ok(())
}

/// Writes the stacks `used` names (and only those) into `stacks` and the frames they hold
/// into `frames`, both in id order.
fn write_stacks(
    file: &str,
    snap: &Snapshot,
    used: Used,
    stacks: &mut Table,
    frames: &mut Table,
) -> Result<(), CliError> {
    // In id order: the slots are.
    let used: Vec<StackId> = used.0.into_iter().flatten().collect();
    let mut used_frames: Vec<FrameId> = Vec::new();
    for &s in &used {
        if snap.frames.stack(s).is_empty() {
            // Frames recorded but empty: one row without a frame, so the id resolves.
            stacks.row(&[V::S(file), V::I(s.index() as i64), V::I(0), V::N])?;
        }
        for (depth, &f) in snap.frames.stack(s).iter().enumerate() {
            used_frames.push(f);
            stacks.row(&[V::S(file), V::I(s.index() as i64), V::I(depth as i64), V::I(f.index() as i64)])?;
        }
    }
    used_frames.sort_unstable();
    used_frames.dedup();
    for f in used_frames {
        let fr = snap.frames.frame(f);
        frames.row(&[
            V::S(file),
            V::I(f.index() as i64),
            V::S(snap.frames.str(fr.filename)),
            V::I(fr.line),
            V::S(snap.frames.str(fr.name)),
        ])?;
    }
    Ok(())
}

/// Writes every table of every file of `args` into `args.output`, all or nothing: the
/// tables go to temporary files in the folder, renamed over `DIR/<table>.parquet` only
/// once every one was written (an error drops them and leaves the folder as it was).
fn write_tables(
    args: &Args,
    spec: Option<&fragscope_diagnose::WindowSpec>,
) -> Result<(Vec<FileOut>, Vec<TableOut>), CliError> {
    let mut tables = create_tables(&args.output)?;
    // One snapshot per file (the built-in example without any).
    let (mut seen, snapshots) = (0, args.files.len().max(1));
    let files = fragscope_commands::windowed::each_snapshot(&args.files, args.json, spec, |name, snap, window| {
        seen += 1;
        export_snapshot(&name, snap, &mut tables, seen == snapshots)?;
        Ok::<_, CliError>(FileOut { file: name, window })
    })?;
    let (tables, staged): (Vec<TableOut>, Vec<Staged>) =
        tables.into_iter().map(Table::finish).collect::<Result<Vec<_>, _>>()?.into_iter().unzip();
    Staged::commit_all(staged).map_err(|e| CliError::usage(format!("cannot write {}: {e}", args.output.display())))?;
    Ok((files, tables))
}

/// Starts writing `f`'s dirty pages to disk without waiting for them, once a row group
/// is written: the sync before the tables are renamed into place ([`Table::finish`])
/// then waits only for the last ones. It waited for all of them (~0.12 s of a 0.9 s
/// export of 230 MB of tables, with both cores idle). Linux only; elsewhere the sync does
/// it all.
fn start_writeback(f: &File) {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        // SAFETY: `sync_file_range` reads no memory of ours; on a file descriptor that
        // stays open for the call. An error (a file system without it) only leaves the
        // work to the sync.
        unsafe {
            libc::sync_file_range(f.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE);
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = f;
}

/// Keeps up to 64 MiB of freed memory at the top of each glibc heap rather than handing
/// it back to the system at once (its default threshold, 128 KiB, stays fixed once
/// `fragscope` sets the mmap threshold, [`fragscope_snapshot::return_large_frees`]): the
/// `parquet` crate's column writer allocates and frees a buffer of ~160 KB per data page
/// of the columns without a dictionary, and each one trimmed was faulted in again by the
/// next (~40,000 page faults on the 6.4 M-entry benchmark file). Only the `export`
/// command's process is changed; a no-op where the C library is not glibc.
fn keep_freed_heap_top() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `mallopt` only sets a tuning parameter of the C allocator.
    unsafe {
        libc::mallopt(libc::M_TRIM_THRESHOLD, 64 << 20);
    }
}

pub fn run(args: &Args) -> Result<ExitCode, CliError> {
    keep_freed_heap_top();
    let spec = args.window.spec()?;
    let created = std::fs::symlink_metadata(&args.output).is_err();
    std::fs::create_dir_all(&args.output).map_err(|e| io_err(&args.output, e))?;
    let written = write_tables(args, spec.as_ref());
    if written.is_err() && created {
        // The folder this run made goes too (empty: the tables' temporary files are gone).
        let _ = std::fs::remove_dir(&args.output);
    }
    let (files, tables) = written?;
    let text = if args.json {
        let out =
            JsonOut { schema: SCHEMA, format: &args.format, output: args.output.display().to_string(), files, tables };
        crate::output::json_text(&out)?
    } else {
        let mut s = String::new();
        for f in &files {
            if let Some(w) = &f.window {
                s.push_str(&w.line());
                s.push('\n');
            }
        }
        s.push_str(&format!("wrote {} tables ({SCHEMA}) to {}:\n", tables.len(), args.output.display()));
        for t in &tables {
            s.push_str(&format!("  {:<14} {:>12} rows  {}\n", t.name, t.rows, t.path));
        }
        s
    };
    crate::print_stdout(&text)?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use parquet::file::reader::{FileReader, SerializedFileReader};

    /// A table of `idx`, `action` and `addr` written with `props`: the file's bytes.
    fn write(columns: &[(&str, Kind, bool)], props: WriterProperties, rows: usize) -> bytes::Bytes {
        let message = "message t { required int64 idx; required binary action (STRING); required int64 addr; }";
        let schema = Arc::new(parse_message_type(message).unwrap());
        assert_eq!(columns.len(), 3);
        let mut w = SerializedFileWriter::new(Vec::new(), schema, Arc::new(props)).unwrap();
        let idx: Vec<i64> = (0..rows as i64).collect();
        let names = ["alloc", "free_requested", "free_completed"];
        let action: Vec<ByteArray> = (0..rows).map(|i| ByteArray::from(names[i % 3])).collect();
        let addr: Vec<i64> = (0..rows as i64).map(|i| (i % 37) * 512).collect();
        let mut rg = w.next_row_group().unwrap();
        let mut c = rg.next_column().unwrap().unwrap();
        c.typed::<Int64Type>().write_batch(&idx, None, None).unwrap();
        c.close().unwrap();
        let mut c = rg.next_column().unwrap().unwrap();
        c.typed::<ByteArrayType>().write_batch(&action, None, None).unwrap();
        c.close().unwrap();
        let mut c = rg.next_column().unwrap().unwrap();
        c.typed::<Int64Type>().write_batch(&addr, None, None).unwrap();
        c.close().unwrap();
        rg.close().unwrap();
        bytes::Bytes::from(w.into_inner().unwrap())
    }

    /// Columns past what [`dict_chunk`] writes go to the crate's writer and read back
    /// the same: strings past [`INTERN_MAX`] distinct (their own buffers), a dictionary
    /// page past 1 MB (long strings; INT64 values past 131,072 distinct, required and
    /// with nulls), with nulls, and the cells' strings freed and their addresses reused
    /// from row to row; the columns within the limits go to [`dict_chunk`] and read back
    /// the same too (INT64 cells in runs and not, with nulls).
    #[test]
    fn columns_past_the_dictionarys_limits_read_back() {
        use parquet::record::Field;
        let dir = tempfile::tempdir().unwrap();
        let columns: &[(&'static str, Kind, bool)] = &[
            ("many", Str, true),
            ("long", Str, false),
            ("ints", I64, false),
            ("opt_ints", I64, true),
            ("few", Str, true),
            ("few_ints", I64, true),
        ];
        let mut t = Table::create(dir.path(), "t", columns).unwrap();
        let n = 140_000usize;
        let many = |i: usize| (i % 5 != 1).then(|| format!("s{}", i % 70_001));
        let long = |i: usize| format!("{:0>100}", i % 20_000);
        let opt_ints = |i: usize| (!i.is_multiple_of(50)).then_some(-(i as i64));
        let few_ints = |i: usize| (i % 7 != 3).then_some([5, 5, 5, -1, 1 << 40][(i / 3) % 5]);
        for i in 0..n {
            let (m, l) = (many(i), long(i));
            let few = ["a", "bb"][i % 2];
            let cells = [
                m.as_deref().map_or(V::N, V::S),
                V::S(&l),
                V::I(i as i64 * 7),
                opt_ints(i).map_or(V::N, V::I),
                V::S(few),
                few_ints(i).map_or(V::N, V::I),
            ];
            t.row(&cells).unwrap();
        }
        // Which writer each column goes to: the crate's for the first four (strings of
        // their own; dictionaries over 1 MB), `dict_chunk` for the last two.
        let mut scratch = Scratch::default();
        assert!(!t.cols[0].spill.is_empty());
        assert!(t.cols[1].dict_chunk(t.descrs[1].clone(), &mut scratch).unwrap().is_none());
        assert!(t.cols[2].int_chunk(t.descrs[2].clone(), &mut scratch.out).unwrap().is_none());
        assert!(t.cols[3].int_chunk(t.descrs[3].clone(), &mut scratch.out).unwrap().is_none());
        assert!(t.cols[4].dict_chunk(t.descrs[4].clone(), &mut scratch).unwrap().is_some());
        assert!(t.cols[5].int_chunk(t.descrs[5].clone(), &mut scratch.out).unwrap().is_some());
        let (out, staged) = t.finish().unwrap();
        Staged::commit_all(vec![staged]).unwrap();
        assert_eq!(out.rows, n as u64);
        let r = SerializedFileReader::new(File::open(dir.path().join("t.parquet")).unwrap()).unwrap();
        let mut rows = 0;
        for (i, row) in r.get_row_iter(None).unwrap().enumerate() {
            let row = row.unwrap();
            let cells: Vec<&Field> = row.get_column_iter().map(|(_, f)| f).collect();
            let want_many = many(i).map_or(Field::Null, Field::Str);
            assert_eq!(cells[0], &want_many, "row {i}");
            assert_eq!(cells[1], &Field::Str(long(i)), "row {i}");
            assert_eq!(cells[2], &Field::Long(i as i64 * 7), "row {i}");
            assert_eq!(cells[3], &opt_ints(i).map_or(Field::Null, Field::Long), "row {i}");
            assert_eq!(cells[4], &Field::Str(["a", "bb"][i % 2].to_string()), "row {i}");
            assert_eq!(cells[5], &few_ints(i).map_or(Field::Null, Field::Long), "row {i}");
            rows += 1;
        }
        assert_eq!(rows, n);
    }

    /// The columns written as deltas ([`UNIQUE_INTS`], [`delta_chunk`]) over more rows
    /// than a row group holds (the buffers cleared and refilled between groups): every
    /// cell reads back, nulls where they were, and each chunk says DELTA_BINARY_PACKED.
    #[test]
    fn delta_columns_read_back_across_row_groups() {
        use parquet::basic::Encoding;
        use parquet::file::reader::FileReader;
        use parquet::record::Field;
        let dir = tempfile::tempdir().unwrap();
        let columns: &[(&'static str, Kind, bool)] = &[("idx", I64, false), ("time_us", I64, true)];
        let mut t = Table::create(dir.path(), "t", columns).unwrap();
        let n = ROW_GROUP + ROW_GROUP / 3 + 5;
        // Rising times with a null now and then, jumps back, and a value past 2^62.
        let time = |i: usize| match i % 1000 {
            7 => None,
            500 => Some(1 << 62),
            k => Some(1_700_000_000_000_000 + (i as i64) * 37 - (k % 3) as i64 * 1_000_000),
        };
        for i in 0..n {
            t.row(&[V::I(i as i64), time(i).map_or(V::N, V::I)]).unwrap();
        }
        let (out, staged) = t.finish().unwrap();
        Staged::commit_all(vec![staged]).unwrap();
        assert_eq!(out.rows, n as u64);
        let r = SerializedFileReader::new(File::open(dir.path().join("t.parquet")).unwrap()).unwrap();
        assert_eq!(r.metadata().num_row_groups(), 2);
        for g in r.metadata().row_groups() {
            for c in g.columns() {
                assert!(c.encodings().any(|e| e == Encoding::DELTA_BINARY_PACKED), "{:?}", c.column_path());
            }
        }
        let mut rows = 0;
        for (i, row) in r.get_row_iter(None).unwrap().enumerate() {
            let row = row.unwrap();
            let cells: Vec<&Field> = row.get_column_iter().map(|(_, f)| f).collect();
            assert_eq!(cells[0], &Field::Long(i as i64), "row {i}");
            assert_eq!(cells[1], &time(i).map_or(Field::Null, Field::Long), "row {i}");
            rows += 1;
        }
        assert_eq!(rows, n);
    }

    /// [`IntIndex`] numbers values as a map does, in the order they first come: values
    /// that collide in their home slot (multiples of 2^40), negative ones, `i64::MIN`
    /// and `i64::MAX`, past several growths, and again after [`IntIndex::clear`].
    #[test]
    fn int_index_numbers_values_as_a_map_does() {
        let mut index = IntIndex::default();
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for round in 0..2 {
            let (mut values, mut want_values) = (Vec::new(), Vec::new());
            let mut map = std::collections::HashMap::new();
            for i in 0..50_000u64 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let v = match i % 4 {
                    0 => ((x % 3000) << 40) as i64,
                    1 => -((x % 5000) as i64),
                    2 => [i64::MIN, i64::MAX, 0][(x % 3) as usize],
                    _ => (x % 20_000) as i64 * 512,
                };
                let want = *map.entry(v).or_insert_with(|| {
                    want_values.push(v);
                    want_values.len() as u32 - 1
                });
                assert_eq!(index.get_or_insert(v, &mut values), want, "round {round}, value {v}");
            }
            assert_eq!(values, want_values, "round {round}");
            assert_eq!(index.len, map.len());
            index.clear();
        }
    }

    /// The writer's properties change the encodings and statistics, not the rows: the
    /// same table written with them and with the `parquet` crate's defaults (what the
    /// export used before) reads back the same, and the file says which columns have a
    /// dictionary and statistics.
    #[test]
    fn writer_properties_keep_the_rows_and_drop_what_they_say() {
        let columns = [("idx", I64, false), ("action", Str, false), ("addr", I64, false)];
        let ours = SerializedFileReader::new(write(&columns, writer_properties(&columns), 5000)).unwrap();
        let before = SerializedFileReader::new(write(&columns, WriterProperties::builder().build(), 5000)).unwrap();
        let rows = |r: &SerializedFileReader<bytes::Bytes>| -> Vec<String> {
            r.get_row_iter(None).unwrap().map(|row| row.unwrap().to_string()).collect()
        };
        let (a, b) = (rows(&ours), rows(&before));
        assert_eq!(a.len(), 5000);
        assert_eq!(a, b);
        let chunk = |r: &SerializedFileReader<bytes::Bytes>, k: usize| r.metadata().row_group(0).column(k).clone();
        // `idx`: every value distinct, no dictionary; `action`: a dictionary, no min/max;
        // `addr`: both.
        assert!(chunk(&ours, 0).dictionary_page_offset().is_none());
        assert!(chunk(&ours, 0).statistics().is_some());
        assert!(chunk(&ours, 1).dictionary_page_offset().is_some());
        assert!(chunk(&ours, 1).statistics().is_none());
        assert!(chunk(&ours, 2).dictionary_page_offset().is_some());
        assert!(chunk(&ours, 2).statistics().is_some());
        // The defaults had a dictionary and statistics everywhere.
        for k in 0..3 {
            assert!(chunk(&before, k).dictionary_page_offset().is_some(), "column {k}");
            assert!(chunk(&before, k).statistics().is_some(), "column {k}");
        }
    }
}
