//! A string column's chunk of a row group, dictionary-encoded here rather than by the
//! `parquet` crate's column writer, which hashes and compares every cell's bytes to find
//! its dictionary entry (its interner: ~20 % of the export's CPU on the 6.4 M-entry
//! benchmark files, for columns whose cells the export already knows by index).
//!
//! The same for the INT64 columns that have a dictionary (sizes, addresses, streams,
//! stacks: the crate's interner hashed each cell, ~20 % of the export's CPU once the
//! strings were done here), whose dictionary indices are found here by a cheaper hash
//! and a check of the row before.
//!
//! [`write()`] takes the chunk's distinct values ([`Dict`]) and each row's index into
//! them, and writes what the crate's writer writes for such a column: one PLAIN
//! dictionary page, then data pages (format v1, uncompressed, 20,480 rows each) of
//! definition levels (optional columns) and indices, both in the RLE / bit-packed
//! hybrid; an offset index; for INT64 columns the statistics the crate writes by default
//! (the chunk's min, max and null count, and the page-level column index), none for
//! strings (the export keeps none). The caller splices the bytes into its row group
//! ([`parquet::file::writer::SerializedRowGroupWriter::append_column`]).

use bytes::Bytes;
use parquet::basic::{BoundaryOrder, Compression, Encoding, PageType, Type};
use parquet::column::page::{CompressedPage, Page, PageWriter};
use parquet::column::writer::ColumnCloseResult;
use parquet::errors::Result;
use parquet::file::metadata::{ColumnChunkMetaData, ColumnIndexBuilder, PageEncodingStats};
use parquet::file::page_index::offset_index::{OffsetIndexMetaData, PageLocation};
use parquet::file::statistics::{Statistics, ValueStatistics};
use parquet::file::writer::{SerializedPageWriter, TrackedWrite};
use parquet::schema::types::ColumnDescPtr;

/// A null row in the `keys` of [`write()`].
pub const NULL_KEY: u32 = u32::MAX;

/// Rows per data page: where the `parquet` crate's writer ends its pages with its
/// default limit of 20,000 rows, checked after each batch of 1,024 values.
pub(super) const PAGE_ROWS: usize = 20 * 1024;

/// The largest dictionary page [`write()`] is for: the `parquet` crate's default limit,
/// past which its writer falls back to plain encoding (the caller then lets it).
pub const DICT_MAX_BYTES: usize = 1 << 20;

/// The bytes of a dictionary page of `dict` (PLAIN: each value's length, 4 bytes
/// little-endian, then its bytes).
pub fn dict_page_len(dict: &[&[u8]]) -> usize {
    dict.iter().map(|v| 4 + v.len()).sum()
}

/// A column chunk's distinct values, in the order of their indices.
pub enum Dict<'a> {
    /// Of a string (BYTE_ARRAY) column.
    Strs(&'a [&'a [u8]]),
    /// Of an INT64 column.
    Ints(&'a [i64]),
}

impl Dict<'_> {
    fn len(&self) -> usize {
        match self {
            Dict::Strs(d) => d.len(),
            Dict::Ints(d) => d.len(),
        }
    }

    /// The dictionary page's bytes (PLAIN).
    fn page(&self) -> Vec<u8> {
        match self {
            Dict::Strs(d) => {
                let mut buf = Vec::with_capacity(dict_page_len(d));
                for v in *d {
                    buf.extend_from_slice(&(v.len() as u32).to_le_bytes());
                    buf.extend_from_slice(v);
                }
                buf
            }
            Dict::Ints(d) => d.iter().flat_map(|v| v.to_le_bytes()).collect(),
        }
    }
}

/// The INT64 statistics of a chunk and of its pages, as the crate's writer keeps them
/// (`EnabledStatistics::Page`, its default).
pub(super) struct IntStats {
    min_max: Option<(i64, i64)>,
    nulls: u64,
    index: ColumnIndexBuilder,
    /// The last page with a value: its min and max (for the boundary order).
    last: Option<(i64, i64)>,
    ascending: bool,
    descending: bool,
}

impl IntStats {
    pub(super) fn new() -> IntStats {
        IntStats {
            min_max: None,
            nulls: 0,
            index: ColumnIndexBuilder::new(Type::INT64),
            last: None,
            ascending: true,
            descending: true,
        }
    }

    /// A page of `rows` (indices into `dict`, or [`NULL_KEY`]).
    fn page(&mut self, dict: &[i64], rows: &[u32]) {
        // Plain minimum and maximum (no `Option` per row, which kept the loop from
        // being compiled to branch-free code): the page has a value unless every row is
        // null.
        let (mut lo, mut hi, mut nulls) = (i64::MAX, i64::MIN, 0u64);
        for &k in rows {
            match dict.get(k as usize) {
                None => nulls += 1,
                Some(&v) => {
                    lo = lo.min(v);
                    hi = hi.max(v);
                }
            }
        }
        self.add_page((nulls < rows.len() as u64).then_some((lo, hi)), nulls);
    }

    /// A page of `values` (its non-null rows') and `nulls` null rows.
    pub(super) fn page_values(&mut self, values: &[i64], nulls: u64) {
        let (mut lo, mut hi) = (i64::MAX, i64::MIN);
        for &v in values {
            lo = lo.min(v);
            hi = hi.max(v);
        }
        self.add_page((!values.is_empty()).then_some((lo, hi)), nulls);
    }

    /// A page with these least and greatest values (`None`: every row null).
    fn add_page(&mut self, page: Option<(i64, i64)>, nulls: u64) {
        self.nulls += nulls;
        match page {
            None => self.index.append(true, vec![], vec![], nulls as i64, None),
            Some((lo, hi)) => {
                if let Some((last_lo, last_hi)) = self.last {
                    self.ascending &= !(last_lo > lo || last_hi > hi);
                    self.descending &= !(lo > last_lo || hi > last_hi);
                }
                self.last = Some((lo, hi));
                self.min_max = Some(self.min_max.map_or((lo, hi), |(a, b)| (a.min(lo), b.max(hi))));
                self.index.append(false, lo.to_le_bytes().to_vec(), hi.to_le_bytes().to_vec(), nulls as i64, None);
            }
        }
    }

    /// The chunk's statistics set on `metadata`, and its column index.
    pub(super) fn finish(
        mut self,
        metadata: parquet::file::metadata::ColumnChunkMetaDataBuilder,
    ) -> Result<(
        parquet::file::metadata::ColumnChunkMetaDataBuilder,
        parquet::file::page_index::column_index::ColumnIndexMetaData,
    )> {
        let (min, max) = self.min_max.unzip();
        let values =
            ValueStatistics::new(min, max, None, Some(self.nulls), false).with_backwards_compatible_min_max(true);
        // As the crate orders them: equal pages, or only null ones, count as ascending.
        self.index.set_boundary_order(match (self.ascending, self.descending) {
            (true, _) => BoundaryOrder::ASCENDING,
            (false, true) => BoundaryOrder::DESCENDING,
            (false, false) => BoundaryOrder::UNORDERED,
        });
        Ok((metadata.set_statistics(Statistics::Int64(values)), self.index.build()?))
    }
}

/// A column chunk's bytes as [`write()`] left them in its caller's buffer, for
/// [`SerializedRowGroupWriter::append_column`](parquet::file::writer::SerializedRowGroupWriter::append_column),
/// which copies them into the file: the buffer is the caller's again afterwards (one per
/// table, kept from chunk to chunk: a fresh one per chunk cost a page fault per 4 KiB
/// written, ~15 % of the export's faults).
pub struct Chunk<'a>(pub &'a [u8]);

impl parquet::file::reader::Length for Chunk<'_> {
    fn len(&self) -> u64 {
        self.0.len() as u64
    }
}

impl<'a> parquet::file::reader::ChunkReader for Chunk<'a> {
    type T = &'a [u8];

    fn get_read(&self, start: u64) -> Result<&'a [u8]> {
        let slice: &'a [u8] = self.0;
        slice.get(start as usize..).ok_or_else(|| parquet::errors::ParquetError::EOF(format!("offset {start}")))
    }

    fn get_bytes(&self, start: u64, length: usize) -> Result<Bytes> {
        let range = start as usize..(start as usize).saturating_add(length);
        self.0
            .get(range)
            .map(Bytes::copy_from_slice)
            .ok_or_else(|| parquet::errors::ParquetError::EOF(format!("{length} bytes at {start}")))
    }
}

/// The column chunk of `keys` (per row an index into `dict`, or [`NULL_KEY`]; every
/// value of `dict` used) for the column `descr` (`optional`: it has definition levels),
/// written into `out` (cleared first), and what its closing says, for `append_column`
/// (with [`Chunk`]). Offsets are from the chunk's start.
pub fn write(
    descr: ColumnDescPtr,
    optional: bool,
    dict: Dict<'_>,
    keys: &[u32],
    out: &mut Vec<u8>,
) -> Result<ColumnCloseResult> {
    out.clear();
    let mut sink = TrackedWrite::new(out);
    let mut pages = SerializedPageWriter::new(&mut sink);
    let mut stats = matches!(dict, Dict::Ints(_)).then(IntStats::new);
    let buf = dict.page();
    let len = buf.len();
    let dict_page = Page::DictionaryPage {
        buf: Bytes::from(buf),
        num_values: dict.len() as u32,
        encoding: Encoding::PLAIN,
        is_sorted: false,
    };
    pages.write_page(CompressedPage::new(dict_page, len))?;
    // Index bit width: what the crate's dictionary encoder uses (0 for one value).
    let width = bits(dict.len().saturating_sub(1) as u32);
    let mut locations = Vec::new();
    let mut scratch = Vec::new();
    for (p, rows) in keys.chunks(PAGE_ROWS).enumerate() {
        if let (Some(stats), Dict::Ints(values)) = (&mut stats, &dict) {
            stats.page(values, rows);
        }
        let mut buf = Vec::new();
        if optional {
            scratch.clear();
            scratch.extend(rows.iter().map(|&k| u32::from(k != NULL_KEY)));
            def_levels(&mut buf, &scratch);
        }
        buf.push(width);
        if optional {
            // The non-null rows' indices, without a branch per row (nulls come mixed
            // with values in some columns: a branch mispredicted on each).
            scratch.clear();
            scratch.resize(rows.len(), 0);
            let mut n = 0;
            for &k in rows {
                scratch[n] = k;
                n += usize::from(k != NULL_KEY);
            }
            scratch.truncate(n);
            hybrid(&mut buf, &scratch, width);
        } else {
            hybrid(&mut buf, rows, width);
        }
        data_page(&mut pages, buf, rows.len(), Encoding::RLE_DICTIONARY, p, &mut locations)?;
    }
    pages.close()?;
    let out = sink.into_inner()?;
    let total = out.len() as i64;
    let data_pages = locations.len() as i32;
    let mut metadata = ColumnChunkMetaData::builder(descr)
        .set_compression(Compression::UNCOMPRESSED)
        .set_encodings(vec![Encoding::PLAIN, Encoding::RLE, Encoding::RLE_DICTIONARY])
        .set_page_encoding_stats(vec![
            PageEncodingStats { page_type: PageType::DICTIONARY_PAGE, encoding: Encoding::PLAIN, count: 1 },
            PageEncodingStats { page_type: PageType::DATA_PAGE, encoding: Encoding::RLE_DICTIONARY, count: data_pages },
        ])
        .set_total_compressed_size(total)
        .set_total_uncompressed_size(total)
        .set_num_values(keys.len() as i64)
        .set_dictionary_page_offset(Some(0))
        .set_data_page_offset(locations.first().map_or(total, |l| l.offset));
    let mut column_index = None;
    if let Some(stats) = stats {
        let (with_stats, index) = stats.finish(metadata)?;
        metadata = with_stats;
        column_index = Some(index);
    }
    let close = ColumnCloseResult {
        bytes_written: total as u64,
        rows_written: keys.len() as u64,
        metadata: metadata.build()?,
        bloom_filter: None,
        column_index,
        offset_index: Some(OffsetIndexMetaData { page_locations: locations, unencoded_byte_array_data_bytes: None }),
    };
    Ok(close)
}

/// Appends a data page's definition levels (`levels`, 1 for a value, 0 for a null),
/// their byte count first, as the format's v1 data pages have them.
pub(super) fn def_levels(buf: &mut Vec<u8>, levels: &[u32]) {
    let at = buf.len();
    buf.extend_from_slice(&[0; 4]);
    hybrid(buf, levels, 1);
    let n = (buf.len() - at - 4) as u32;
    buf[at..at + 4].copy_from_slice(&n.to_le_bytes());
}

/// Writes `buf` as the chunk's data page `p` (the `PAGE_ROWS` rows from `p × PAGE_ROWS`,
/// `rows` of them), uncompressed, and notes where it went in `locations` (the offset
/// index).
pub(super) fn data_page<W: std::io::Write + Send>(
    pages: &mut SerializedPageWriter<W>,
    buf: Vec<u8>,
    rows: usize,
    encoding: Encoding,
    p: usize,
    locations: &mut Vec<PageLocation>,
) -> Result<()> {
    let len = buf.len();
    let page = Page::DataPage {
        buf: Bytes::from(buf),
        num_values: rows as u32,
        encoding,
        def_level_encoding: Encoding::RLE,
        rep_level_encoding: Encoding::RLE,
        statistics: None,
    };
    let spec = pages.write_page(CompressedPage::new(page, len))?;
    locations.push(PageLocation {
        offset: spec.offset as i64,
        compressed_page_size: spec.compressed_size as i32,
        first_row_index: (p * PAGE_ROWS) as i64,
    });
    Ok(())
}

/// Bits that hold `max`.
fn bits(max: u32) -> u8 {
    (u32::BITS - max.leading_zeros()) as u8
}

/// Appends `values` (each below 2^`width`) in Parquet's RLE / bit-packed hybrid: runs of
/// eight or more equal values as RLE runs, the rest bit-packed in groups of eight. A
/// bit-packed run must hold a multiple of eight values but for the last one (padded
/// with zeros: the reader knows how many values there are), so the values before an RLE
/// run are topped up to a multiple of eight from the run itself.
fn hybrid(out: &mut Vec<u8>, values: &[u32], width: u8) {
    // The values not yet written start here (they are bit-packed, topped up from the
    // run that follows them: contiguous in `values`).
    let mut literal = 0;
    let mut i = 0;
    while i < values.len() {
        // Only runs of `pad + 8` or more equal values (`pad` < 8) are written as RLE
        // runs. A value unequal to the seventh after it begins no run of 8: it is skipped
        // alone. A run of 8 or more is then still met at its first value (equal to its
        // seventh), and the rest of a shorter one, met in its middle, is no such run
        // either. One comparison per value in the columns of nearly all distinct values
        // (addresses, sizes), where counting each run of one was the encoding's main cost.
        if values.get(i + 7).is_some_and(|&w| w != values[i]) {
            i += 1;
            continue;
        }
        let v = values[i];
        let run = values[i..].iter().take_while(|&&x| x == v).count();
        let pad = (8 - (i - literal) % 8) % 8;
        if run >= pad + 8 {
            packed(out, &values[literal..i + pad], width);
            varint(out, ((run - pad) as u64) << 1);
            out.extend_from_slice(&v.to_le_bytes()[..width.div_ceil(8) as usize]);
            literal = i + run;
        }
        i += run;
    }
    packed(out, &values[literal..], width);
}

/// Appends `values` as one bit-packed run (padded with zeros to a multiple of eight).
fn packed(out: &mut Vec<u8>, values: &[u32], width: u8) {
    if values.is_empty() {
        return;
    }
    let groups = values.len().div_ceil(8);
    varint(out, ((groups as u64) << 1) | 1);
    let w = u32::from(width);
    debug_assert!(w <= 32, "u32 values are at most 32 bits wide");
    // Eight values of `w` bits are `w` whole bytes: each half of the group is at most 128
    // bits, the two written as 32 bytes and cut back to `w` (room reserved once). Copies
    // of a length known only at run time were a `memcpy` call per eight values, twice
    // (into the group and out of it), and values past 16 bits were written a byte at a
    // time: `memcpy` was 4.8 % of `export`'s samples on the 6.9 M-entry consistent
    // benchmark file, 1.5 % after.
    out.reserve(groups * w as usize + 32);
    let half = 4 * w;
    let pack = |out: &mut Vec<u8>, group: &[u32; 8]| {
        let (mut lo, mut hi) = (0u128, 0u128);
        for k in 0..4 {
            lo |= u128::from(group[k]) << (k as u32 * w);
            hi |= u128::from(group[k + 4]) << (k as u32 * w);
        }
        // The group is `lo + hi * 2^half`.
        let (low, high) = match half {
            128 => (lo, hi),
            _ => (lo | (hi << half), hi.checked_shr(128 - half).unwrap_or(0)),
        };
        out.extend_from_slice(&low.to_le_bytes());
        out.extend_from_slice(&high.to_le_bytes());
        out.truncate(out.len() - (32 - w as usize));
    };
    let mut chunks = values.chunks_exact(8);
    for chunk in &mut chunks {
        pack(out, chunk.try_into().expect("chunks of eight"));
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let mut group = [0u32; 8];
        group[..rest.len()].copy_from_slice(rest);
        pack(out, &group);
    }
}

/// Appends `x` as a ULEB128 varint.
pub(super) fn varint(out: &mut Vec<u8>, mut x: u64) {
    while x >= 0x80 {
        out.push((x as u8) | 0x80);
        x >>= 7;
    }
    out.push(x as u8);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`packed`] as it was written first: each group's bits a byte at a time.
    fn packed_bytewise(out: &mut Vec<u8>, values: &[u32], width: u8) {
        if values.is_empty() {
            return;
        }
        varint(out, ((values.len().div_ceil(8) as u64) << 1) | 1);
        let w = u32::from(width);
        for chunk in values.chunks(8) {
            let mut group = [0u32; 8];
            group[..chunk.len()].copy_from_slice(chunk);
            let (mut acc, mut held) = (0u64, 0u32);
            for &x in &group {
                acc |= u64::from(x) << held;
                held += w;
                while held >= 8 {
                    out.push(acc as u8);
                    acc >>= 8;
                    held -= 8;
                }
            }
        }
    }

    /// Every width a u32 can need, every length of a last group, values at their width's
    /// limits: the bytes of the byte-at-a-time packing.
    #[test]
    fn packed_groups_are_the_bytes_of_a_byte_at_a_time_packing() {
        let mut rng = fragscope_testdata::Rng(5);
        for width in 0..=32u8 {
            let max = if width == 32 { u32::MAX } else { (1u32 << width) - 1 };
            for len in 0..40 {
                let values: Vec<u32> = (0..len)
                    .map(|i| match i % 3 {
                        0 => max,
                        1 => 0,
                        _ => (rng.below(1 << 20) as u32).wrapping_mul(2_654_435_761) & max,
                    })
                    .collect();
                let (mut got, mut want) = (vec![7u8], vec![7u8]);
                packed(&mut got, &values, width);
                packed_bytewise(&mut want, &values, width);
                assert_eq!(got, want, "width {width}, {len} values");
            }
        }
    }
    use parquet::data_type::{ByteArray, ByteArrayType};
    use parquet::file::properties::WriterProperties;
    use parquet::file::reader::{FileReader, SerializedFileReader};
    use parquet::file::serialized_reader::ReadOptionsBuilder;
    use parquet::file::writer::SerializedFileWriter;
    use parquet::schema::parser::parse_message_type;
    use std::sync::Arc;

    /// A one-column file of `cells` (`None`: null) written by the crate's column writer
    /// (`ours` false) or by [`write()`], read back by the crate's reader with its page
    /// index: the rows as text, and the number of data pages the offset index names.
    fn roundtrip(cells: &[Option<String>], optional: bool, ours: bool) -> (Vec<String>, usize) {
        let rep = if optional { "optional" } else { "required" };
        let schema = Arc::new(parse_message_type(&format!("message t {{ {rep} binary s (STRING); }}")).unwrap());
        let mut w =
            SerializedFileWriter::new(Vec::new(), schema, Arc::new(WriterProperties::builder().build())).unwrap();
        let descr = w.schema_descr().column(0);
        let mut rg = w.next_row_group().unwrap();
        if ours {
            let mut dict: Vec<&[u8]> = Vec::new();
            let keys: Vec<u32> = cells
                .iter()
                .map(|c| match c {
                    None => NULL_KEY,
                    Some(s) => match dict.iter().position(|d| *d == s.as_bytes()) {
                        Some(k) => k as u32,
                        None => {
                            dict.push(s.as_bytes());
                            dict.len() as u32 - 1
                        }
                    },
                })
                .collect();
            let mut out = vec![0xAA; 3];
            let close = write(descr, optional, Dict::Strs(&dict), &keys, &mut out).unwrap();
            rg.append_column(&Chunk(&out), close).unwrap();
        } else {
            let values: Vec<ByteArray> = cells.iter().flatten().map(|s| ByteArray::from(s.as_str())).collect();
            let defs: Vec<i16> = cells.iter().map(|c| i16::from(c.is_some())).collect();
            let mut c = rg.next_column().unwrap().unwrap();
            c.typed::<ByteArrayType>().write_batch(&values, optional.then_some(&defs[..]), None).unwrap();
            c.close().unwrap();
        }
        rg.close().unwrap();
        let file = Bytes::from(w.into_inner().unwrap());
        let options = ReadOptionsBuilder::new().with_page_index().build();
        let r = SerializedFileReader::new_with_options(file, options).unwrap();
        let pages = r.metadata().page_index_for_row_group(0).offset_index(0).map_or(0, |o| o.page_locations().len());
        let rows = r.get_row_iter(None).unwrap().map(|row| row.unwrap().to_string()).collect();
        (rows, pages)
    }

    /// Cells in runs of 1 to 40 (so runs shorter and longer than eight, at every
    /// alignment to the bit-packed groups), `distinct` values, every `null_every`th null.
    fn cells(n: usize, distinct: u64, null_every: usize) -> Vec<Option<String>> {
        let mut x: u64 = 0x2545_F491_4F6C_DD1D;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            let (run, v) = (1 + next() % 40, next() % distinct);
            for _ in 0..run {
                let null = null_every > 0 && out.len() % null_every == null_every / 2;
                out.push((!null).then(|| format!("value {v}")));
            }
        }
        out.truncate(n);
        out
    }

    /// The chunks [`write()`] makes read back as the crate's writer's do: one value (index
    /// width 0), a few, more than 256 (width 9); required and optional columns, with
    /// nulls in runs and alone; more rows than a page holds.
    #[test]
    fn chunks_read_back_as_the_crate_writes_them() {
        for (n, distinct, null_every, optional) in [
            (100, 1, 0, false),
            (45_000, 1, 7, true),
            (45_001, 5, 0, false),
            (45_003, 5, 3, true),
            (50_000, 300, 11, true),
            (7, 300, 0, false),
            // Every cell null (compile_context and user_metadata mostly are): an empty
            // dictionary.
            (30_000, 1, 1, true),
        ] {
            let cells = cells(n, distinct, null_every);
            let (ours, pages) = roundtrip(&cells, optional, true);
            let (theirs, _) = roundtrip(&cells, optional, false);
            assert_eq!(ours.len(), n);
            assert!(ours == theirs, "{n} rows of {distinct} values, null every {null_every}: rows differ");
            assert_eq!(pages, n.div_ceil(PAGE_ROWS), "{n} rows");
            // Nulls among the cells where asked for, and read back where they were.
            assert_eq!(cells.iter().any(Option::is_none), null_every > 0);
            let first_null = cells.iter().position(Option::is_none);
            if let Some(k) = first_null {
                assert!(!ours[k].contains("value"), "row {k}: {}", ours[k]);
            }
        }
    }

    /// A one-column INT64 file of `cells` written by the crate's writer (`ours` false) or
    /// by [`write()`]: its rows, its chunk statistics and its column index, as text.
    /// Who writes the chunk of [`ints_roundtrip`].
    #[derive(Clone, Copy, PartialEq)]
    enum By {
        Crate,
        Dictionary,
        /// [`super::super::delta_chunk::write`].
        Delta,
    }

    fn ints_roundtrip(cells: &[Option<i64>], optional: bool, by: By) -> (Vec<String>, String, String) {
        let rep = if optional { "optional" } else { "required" };
        let schema = Arc::new(parse_message_type(&format!("message t {{ {rep} int64 x; }}")).unwrap());
        let mut w =
            SerializedFileWriter::new(Vec::new(), schema, Arc::new(WriterProperties::builder().build())).unwrap();
        let descr = w.schema_descr().column(0);
        let mut rg = w.next_row_group().unwrap();
        if by == By::Delta {
            let defs: Vec<i16> = if optional { cells.iter().map(|c| i16::from(c.is_some())).collect() } else { vec![] };
            let values: Vec<i64> = cells.iter().flatten().copied().collect();
            let mut out = vec![0xAA; 3];
            let close = super::super::delta_chunk::write(descr, optional, &defs, &values, &mut out).unwrap();
            rg.append_column(&Chunk(&out), close).unwrap();
        } else if by == By::Dictionary {
            let mut dict: Vec<i64> = Vec::new();
            let mut at = std::collections::HashMap::new();
            let keys: Vec<u32> = cells
                .iter()
                .map(|c| match c {
                    None => NULL_KEY,
                    Some(x) => *at.entry(*x).or_insert_with(|| {
                        dict.push(*x);
                        dict.len() as u32 - 1
                    }),
                })
                .collect();
            let mut out = vec![0xAA; 3];
            let close = write(descr, optional, Dict::Ints(&dict), &keys, &mut out).unwrap();
            rg.append_column(&Chunk(&out), close).unwrap();
        } else {
            let values: Vec<i64> = cells.iter().flatten().copied().collect();
            let defs: Vec<i16> = cells.iter().map(|c| i16::from(c.is_some())).collect();
            let mut c = rg.next_column().unwrap().unwrap();
            c.typed::<parquet::data_type::Int64Type>()
                .write_batch(&values, optional.then_some(&defs[..]), None)
                .unwrap();
            c.close().unwrap();
        }
        rg.close().unwrap();
        let file = Bytes::from(w.into_inner().unwrap());
        let options = ReadOptionsBuilder::new().with_page_index().build();
        let r = SerializedFileReader::new_with_options(file, options).unwrap();
        let chunk = r.metadata().row_group(0).column(0);
        let stats = format!("{:?}", chunk.statistics());
        let index = r.metadata().page_index_for_row_group(0).column_index(0).map(|i| format!("{i:?}"));
        let rows = r.get_row_iter(None).unwrap().map(|row| row.unwrap().to_string()).collect();
        (rows, stats, index.expect("a column index"))
    }

    /// INT64 chunks read back as the crate's writer's, with the same statistics: values
    /// rising page by page (an ascending column index), falling, in no order, all null
    /// pages, negative numbers.
    #[test]
    fn int_chunks_read_back_with_the_crate_writers_statistics() {
        let n = 70_000;
        type Shape = Box<dyn Fn(usize) -> Option<i64>>;
        let shapes: [(&str, Shape, bool); 9] = [
            // Deltas that wrap and need all 64 bits, and 33-48 bits (a delta chunk's
            // widest miniblocks).
            ("extremes", Box::new(|i| Some(if i % 2 == 0 { i64::MIN } else { i64::MAX - i as i64 })), false),
            ("wide", Box::new(|i| (i % 9 != 4).then_some((i as i64).wrapping_mul(0x9E37_79B9_7F4A) >> 7)), true),
            ("all null", Box::new(|_| None), true),
            // 70,000 distinct values: 17-bit indices.
            ("all distinct", Box::new(|i| Some(i as i64 * 3 - 1000)), false),
            ("rising", Box::new(|i| Some((i / 500) as i64)), false),
            ("falling, nulls", Box::new(|i| (i % 5 != 2).then_some(-((i / 700) as i64))), true),
            ("unordered", Box::new(|i| Some(((i * 7919) % 613) as i64 - 300)), false),
            ("a null page", Box::new(|i| (!(20_480..45_000).contains(&i)).then_some((i % 3) as i64)), true),
            ("one value", Box::new(|_| Some(i64::MIN)), true),
        ];
        for (what, f, optional) in shapes {
            let cells: Vec<Option<i64>> = (0..n).map(&f).collect();
            let (their_rows, their_stats, their_index) = ints_roundtrip(&cells, optional, By::Crate);
            for by in [By::Dictionary, By::Delta] {
                let (rows, stats, index) = ints_roundtrip(&cells, optional, by);
                let what = format!("{what}, {}", if by == By::Delta { "delta" } else { "dictionary" });
                assert_eq!(rows.len(), n);
                assert!(rows == their_rows, "{what}: rows differ");
                assert_eq!(stats, their_stats, "{what}");
                assert_eq!(strip_histograms(&index), strip_histograms(&their_index), "{what}");
            }
        }
    }

    /// [`hybrid`] as it was before it skipped values unequal to their seventh: each run
    /// counted from its first value.
    fn hybrid_reference(out: &mut Vec<u8>, values: &[u32], width: u8) {
        let mut literal = 0;
        let mut i = 0;
        while i < values.len() {
            let v = values[i];
            let run = values[i..].iter().take_while(|&&x| x == v).count();
            let pad = (8 - (i - literal) % 8) % 8;
            if run >= pad + 8 {
                packed(out, &values[literal..i + pad], width);
                varint(out, ((run - pad) as u64) << 1);
                out.extend_from_slice(&v.to_le_bytes()[..width.div_ceil(8) as usize]);
                literal = i + run;
            }
            i += run;
        }
        packed(out, &values[literal..], width);
    }

    /// [`hybrid`] writes the bytes of [`hybrid_reference`] on runs of every length from 1
    /// to 40 at every offset, values that come back after a few others, and short inputs.
    #[test]
    fn hybrid_gives_the_reference_bytes() {
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = |m: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % m
        };
        for case in 0..600 {
            let (len, distinct, max_run) = (next(300) as usize, 1 + next(6) as u32, 1 + next(40) as usize);
            let mut values = Vec::with_capacity(len);
            while values.len() < len {
                let (v, run) = (next(u64::from(distinct)) as u32, 1 + next(max_run as u64) as usize);
                values.extend(std::iter::repeat_n(v, run));
            }
            values.truncate(len);
            let width = bits(distinct - 1);
            let (mut got, mut want) = (Vec::new(), Vec::new());
            hybrid(&mut got, &values, width);
            hybrid_reference(&mut want, &values, width);
            assert_eq!(got, want, "case {case}: {values:?}");
        }
    }

    /// A column index's text without its level histograms (the crate's writer keeps
    /// them; [`write()`] does not).
    fn strip_histograms(index: &str) -> String {
        let cut = index.find("definition_level_histograms").or_else(|| index.find("repetition_level_histograms"));
        index[..cut.unwrap_or(index.len())].to_string()
    }

    #[test]
    fn hybrid_runs_and_groups() {
        // 3 literals, then a run of 13: topped up to 8 literals from the run (5 of it),
        // the 8 left as a run: one bit-packed group, one RLE run.
        let mut out = Vec::new();
        let mut values = vec![1, 2, 3];
        values.extend([7; 13]);
        hybrid(&mut out, &values, 3);
        assert_eq!(out, [0b11, 0b1101_0001, 0b1111_1110, 0b1111_1111, 8 << 1, 7]);
        // A run of 9 after 3 literals is too short to top them up and stay a run: two
        // bit-packed groups (the last padded with zeros).
        out.clear();
        hybrid(&mut out, &values[..12], 3);
        assert_eq!(out, [0b101, 0b1101_0001, 0b1111_1110, 0b1111_1111, 0b1111_1111, 0b1111, 0]);
        // A run of nine from the start: one RLE run.
        out.clear();
        hybrid(&mut out, &[5; 9], 3);
        assert_eq!(out, [9 << 1, 5]);
        assert_eq!(bits(0), 0);
        assert_eq!(bits(1), 1);
        assert_eq!(bits(255), 8);
        assert_eq!(bits(256), 9);
    }
}
