//! A string column's chunk of a row group, dictionary-encoded here rather than by the
//! `parquet` crate's column writer, which hashes and compares every cell's bytes to find
//! its dictionary entry (its interner: ~20 % of the export's CPU on the 6.4 M-entry
//! benchmark files, for columns whose cells the export already knows by index).
//!
//! [`write`] takes the chunk's distinct values and each row's index into them, and
//! writes what the crate's writer writes for such a column: one PLAIN dictionary page,
//! then data pages (format v1, uncompressed) of definition levels (optional columns) and
//! indices, both in the RLE / bit-packed hybrid; no statistics (the export keeps none
//! for strings), an offset index. The caller splices the bytes into its row group
//! ([`parquet::file::writer::SerializedRowGroupWriter::append_column`]).

use bytes::Bytes;
use parquet::basic::{Compression, Encoding, PageType};
use parquet::column::page::{CompressedPage, Page, PageWriter};
use parquet::column::writer::ColumnCloseResult;
use parquet::errors::Result;
use parquet::file::metadata::{ColumnChunkMetaData, PageEncodingStats};
use parquet::file::page_index::offset_index::{OffsetIndexMetaData, PageLocation};
use parquet::file::writer::{SerializedPageWriter, TrackedWrite};
use parquet::schema::types::ColumnDescPtr;

/// A null row in the `keys` of [`write`].
pub const NULL_KEY: u32 = u32::MAX;

/// Rows per data page: the `parquet` crate's default limit of rows per page.
const PAGE_ROWS: usize = 20_000;

/// The largest dictionary page [`write`] is for: the `parquet` crate's default limit,
/// past which its writer falls back to plain encoding (the caller then lets it).
pub const DICT_MAX_BYTES: usize = 1 << 20;

/// The bytes of a dictionary page of `dict` (PLAIN: each value's length, 4 bytes
/// little-endian, then its bytes).
pub fn dict_page_len(dict: &[&[u8]]) -> usize {
    dict.iter().map(|v| 4 + v.len()).sum()
}

/// The column chunk of `keys` (per row an index into `dict`, or [`NULL_KEY`]; every
/// value of `dict` used) for the column `descr` (`optional`: it has definition levels),
/// and what its closing says, for `append_column`. Offsets are from the chunk's start.
pub fn write(descr: ColumnDescPtr, optional: bool, dict: &[&[u8]], keys: &[u32]) -> Result<(Bytes, ColumnCloseResult)> {
    let mut sink = TrackedWrite::new(Vec::new());
    let mut pages = SerializedPageWriter::new(&mut sink);
    let mut buf = Vec::with_capacity(dict_page_len(dict));
    for v in dict {
        buf.extend_from_slice(&(v.len() as u32).to_le_bytes());
        buf.extend_from_slice(v);
    }
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
        let mut buf = Vec::new();
        if optional {
            scratch.clear();
            scratch.extend(rows.iter().map(|&k| u32::from(k != NULL_KEY)));
            buf.extend_from_slice(&[0; 4]);
            hybrid(&mut buf, &scratch, 1);
            let n = (buf.len() - 4) as u32;
            buf[..4].copy_from_slice(&n.to_le_bytes());
        }
        buf.push(width);
        scratch.clear();
        scratch.extend(rows.iter().copied().filter(|&k| k != NULL_KEY));
        hybrid(&mut buf, &scratch, width);
        let len = buf.len();
        let page = Page::DataPage {
            buf: Bytes::from(buf),
            num_values: rows.len() as u32,
            encoding: Encoding::RLE_DICTIONARY,
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
    }
    pages.close()?;
    drop(pages);
    let bytes = Bytes::from(sink.into_inner()?);
    let total = bytes.len() as i64;
    let data_pages = locations.len() as i32;
    let metadata = ColumnChunkMetaData::builder(descr)
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
        .set_data_page_offset(locations.first().map_or(total, |l| l.offset))
        .build()?;
    let close = ColumnCloseResult {
        bytes_written: total as u64,
        rows_written: keys.len() as u64,
        metadata,
        bloom_filter: None,
        column_index: None,
        offset_index: Some(OffsetIndexMetaData { page_locations: locations, unencoded_byte_array_data_bytes: None }),
    };
    Ok((bytes, close))
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
    let mut literal: Vec<u32> = Vec::new();
    let mut i = 0;
    while i < values.len() {
        let v = values[i];
        let run = values[i..].iter().take_while(|&&x| x == v).count();
        let pad = (8 - literal.len() % 8) % 8;
        if run >= pad + 8 {
            literal.extend(std::iter::repeat_n(v, pad));
            packed(out, &literal, width);
            literal.clear();
            varint(out, ((run - pad) as u64) << 1);
            out.extend_from_slice(&v.to_le_bytes()[..width.div_ceil(8) as usize]);
        } else {
            literal.extend_from_slice(&values[i..i + run]);
        }
        i += run;
    }
    packed(out, &literal, width);
}

/// Appends `values` as one bit-packed run (padded with zeros to a multiple of eight).
fn packed(out: &mut Vec<u8>, values: &[u32], width: u8) {
    if values.is_empty() {
        return;
    }
    let groups = values.len().div_ceil(8);
    varint(out, ((groups as u64) << 1) | 1);
    let (mut acc, mut held) = (0u64, 0u32);
    for k in 0..groups * 8 {
        acc |= u64::from(values.get(k).copied().unwrap_or(0)) << held;
        held += u32::from(width);
        while held >= 8 {
            out.push(acc as u8);
            acc >>= 8;
            held -= 8;
        }
    }
    // Eight values of `width` bits are `width` whole bytes: nothing is left over.
    debug_assert_eq!(held, 0);
}

/// Appends `x` as a ULEB128 varint.
fn varint(out: &mut Vec<u8>, mut x: u64) {
    while x >= 0x80 {
        out.push((x as u8) | 0x80);
        x >>= 7;
    }
    out.push(x as u8);
}

#[cfg(test)]
mod tests {
    use super::*;
    use parquet::data_type::{ByteArray, ByteArrayType};
    use parquet::file::properties::WriterProperties;
    use parquet::file::reader::{FileReader, SerializedFileReader};
    use parquet::file::serialized_reader::ReadOptionsBuilder;
    use parquet::file::writer::SerializedFileWriter;
    use parquet::schema::parser::parse_message_type;
    use std::sync::Arc;

    /// A one-column file of `cells` (`None`: null) written by the crate's column writer
    /// (`ours` false) or by [`write`], read back by the crate's reader with its page
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
            let (bytes, close) = write(descr, optional, &dict, &keys).unwrap();
            rg.append_column(&bytes, close).unwrap();
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

    /// The chunks [`write`] makes read back as the crate's writer's do: one value (index
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
