//! An INT64 column's chunk of a row group in Parquet's DELTA_BINARY_PACKED encoding,
//! written here for the columns of nearly distinct numbers (entry indices and times,
//! `UNIQUE_INTS`): plain, they were 8 bytes a cell, ~200 of the 228 MB of tables the
//! 6.4 M-entry consistent benchmark file exports to, and writing those bytes (page cache
//! filled, written back, dropped again when the tables are replaced) was a large part of
//! `export`'s system time. Their deltas are small (an index column's are all 1, a time's
//! a few bits): the tables become ~4× smaller (59 MB).
//!
//! Why not the `parquet` crate's writer with that encoding: its encoder packs through a
//! bit writer, a call per value; set on these columns it made `export` slower than plain
//! (`bench/RESULTS.md`, seventh session). [`write()`] writes
//! what that encoder writes (blocks of 256 values, four miniblocks of 64, empty
//! miniblocks' widths 0), in data pages of [`PAGE_ROWS`] rows like the dictionary
//! chunks' ([`super::dict_chunk`]), with the same statistics (chunk min, max and null
//! count; the page-level column index) and an offset index.

use parquet::basic::{Compression, Encoding, PageType};
use parquet::column::page::PageWriter;
use parquet::column::writer::ColumnCloseResult;
use parquet::errors::Result;
use parquet::file::metadata::{ColumnChunkMetaData, PageEncodingStats};
use parquet::file::page_index::offset_index::OffsetIndexMetaData;
use parquet::file::writer::{SerializedPageWriter, TrackedWrite};
use parquet::schema::types::ColumnDescPtr;

use super::dict_chunk::{data_page, def_levels, varint, IntStats, PAGE_ROWS};

/// Values per block, and miniblocks per block: the `parquet` crate's encoder's layout
/// for INT64 (`DeltaBitPackEncoder::new`).
const BLOCK: usize = 256;
const MINIBLOCKS: usize = 4;
const MINI: usize = BLOCK / MINIBLOCKS;

/// The column chunk of an INT64 column `descr`: `defs` its rows' definition levels
/// (`optional` columns; 1: a value, 0: null; empty for a required column), `values` the
/// non-null rows' values in order; written into `out` (cleared first), with what its
/// closing says for `append_column` ([`super::dict_chunk::Chunk`]).
pub fn write(
    descr: ColumnDescPtr,
    optional: bool,
    defs: &[i16],
    values: &[i64],
    out: &mut Vec<u8>,
) -> Result<ColumnCloseResult> {
    out.clear();
    let rows = if optional { defs.len() } else { values.len() };
    debug_assert!(!optional || defs.iter().filter(|&&d| d == 1).count() == values.len());
    let mut sink = TrackedWrite::new(out);
    let mut pages = SerializedPageWriter::new(&mut sink);
    let mut stats = IntStats::new();
    let mut locations = Vec::new();
    let mut levels = Vec::new();
    // The first value of the page being written, in `values`.
    let mut at = 0;
    for (p, start) in (0..rows).step_by(PAGE_ROWS).enumerate() {
        let end = (start + PAGE_ROWS).min(rows);
        let mut buf = Vec::new();
        let n = if optional {
            let page_defs = &defs[start..end];
            levels.clear();
            levels.extend(page_defs.iter().map(|&d| u32::from(d == 1)));
            def_levels(&mut buf, &levels);
            levels.iter().sum::<u32>() as usize
        } else {
            end - start
        };
        let page_values = &values[at..at + n];
        at += n;
        stats.page_values(page_values, (end - start - n) as u64);
        encode(&mut buf, page_values);
        data_page(&mut pages, buf, end - start, Encoding::DELTA_BINARY_PACKED, p, &mut locations)?;
    }
    pages.close()?;
    let out = sink.into_inner()?;
    let total = out.len() as i64;
    let metadata = ColumnChunkMetaData::builder(descr)
        .set_compression(Compression::UNCOMPRESSED)
        .set_encodings(vec![Encoding::RLE, Encoding::DELTA_BINARY_PACKED])
        .set_page_encoding_stats(vec![PageEncodingStats {
            page_type: PageType::DATA_PAGE,
            encoding: Encoding::DELTA_BINARY_PACKED,
            count: locations.len() as i32,
        }])
        .set_total_compressed_size(total)
        .set_total_uncompressed_size(total)
        .set_num_values(rows as i64)
        .set_data_page_offset(0);
    let (metadata, column_index) = stats.finish(metadata)?;
    Ok(ColumnCloseResult {
        bytes_written: total as u64,
        rows_written: rows as u64,
        metadata: metadata.build()?,
        bloom_filter: None,
        column_index: Some(column_index),
        offset_index: Some(OffsetIndexMetaData { page_locations: locations, unencoded_byte_array_data_bytes: None }),
    })
}

/// Appends `values` in DELTA_BINARY_PACKED: the header (block size, miniblocks per
/// block, the number of values, the first value), then each block of up to [`BLOCK`]
/// deltas (wrapping, as the reader adds them back): its least delta, each miniblock's
/// bit width, and the miniblocks' deltas less the least, bit-packed (a partial last
/// miniblock padded with zeros to [`MINI`] values; the widths of miniblocks past the
/// last value 0, with no bytes).
pub fn encode(out: &mut Vec<u8>, values: &[i64]) {
    varint(out, BLOCK as u64);
    varint(out, MINIBLOCKS as u64);
    varint(out, values.len() as u64);
    varint(out, zigzag(values.first().copied().unwrap_or(0)));
    let mut deltas = [0u64; BLOCK];
    // Each block's deltas are those of `values[from - 1..from + n]`.
    let mut from = 1;
    while from < values.len() {
        let n = (values.len() - from).min(BLOCK);
        // The deltas as two's-complement differences; the least compared as signed.
        let mut least = i64::MAX;
        for (d, w) in deltas.iter_mut().zip(values[from - 1..from + n].windows(2)) {
            let x = w[1].wrapping_sub(w[0]);
            least = least.min(x);
            *d = x as u64;
        }
        varint(out, zigzag(least));
        let widths_at = out.len();
        out.extend_from_slice(&[0; MINIBLOCKS]);
        for (m, mini) in deltas[..n].chunks_mut(MINI).enumerate() {
            let mut all = 0u64;
            for d in mini.iter_mut() {
                *d = d.wrapping_sub(least as u64);
                all |= *d;
            }
            let width = 64 - all.leading_zeros();
            out[widths_at + m] = width as u8;
            pack64(out, mini, width);
        }
        from += n;
    }
}

/// Zigzag: small magnitudes of either sign as small unsigned numbers.
fn zigzag(x: i64) -> u64 {
    ((x << 1) ^ (x >> 63)) as u64
}

/// Appends a miniblock's `values` (each below 2^`width`), LSB first, padded with zeros
/// to [`MINI`] values: `8 × width` bytes. Up to 56 bits (every delta of an index or a
/// time in a real trace) without a branch per value, by [`pack_by_width`]; wider, a
/// value at a time.
fn pack64(out: &mut Vec<u8>, values: &[u64], width: u32) {
    if width == 0 {
        return;
    }
    let start = out.len();
    let bytes = 8 * width as usize;
    if width <= 56 {
        let mut padded = [0u64; MINI];
        padded[..values.len()].copy_from_slice(values);
        // Room for the last 8-byte store past the miniblock's bytes, cut back after.
        out.resize(start + bytes + 8, 0);
        pack_by_width(&mut out[start..], &padded, width);
    } else {
        let (mut acc, mut held) = (0u128, 0u32);
        for &v in values {
            acc |= u128::from(v) << held;
            held += width;
            if held >= 64 {
                out.extend_from_slice(&(acc as u64).to_le_bytes());
                acc >>= 64;
                held -= 64;
            }
        }
        if held > 0 {
            out.extend_from_slice(&(acc as u64).to_le_bytes()[..held.div_ceil(8) as usize]);
        }
    }
    out.resize(start + bytes, 0);
}

/// Packs 64 values of `width` <= 56 bits into `buf[..8 × width]`: [`pack_const`] for
/// the width, whose shifts are then constants.
#[inline]
fn pack_by_width(buf: &mut [u8], values: &[u64; MINI], width: u32) {
    macro_rules! by_width {
        ($($w:literal)*) => {
            match width {
                $($w => pack_const::<$w>(buf, values),)*
                _ => unreachable!("widths 1 to 56"),
            }
        };
    }
    by_width!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28
        29 30 31 32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56)
}

/// [`pack_by_width`] for one width `W`: value `i`'s bits start at bit `i × W`, in the
/// 64-bit word of that bit and, past its end, the next; the words written out in turn.
/// The loop's bounds and `W` are constants: unrolled, every shift and index is one.
#[inline(always)]
fn pack_const<const W: usize>(buf: &mut [u8], values: &[u64; MINI]) {
    let mut words = [0u64; 57];
    for (i, &v) in values.iter().enumerate() {
        let bit = i * W;
        let (word, off) = (bit / 64, bit % 64);
        words[word] |= v << off;
        if off + W > 64 {
            words[word + 1] |= v >> (64 - off);
        }
    }
    for (k, w) in words[..W].iter().enumerate() {
        buf[8 * k..8 * k + 8].copy_from_slice(&w.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// DELTA_BINARY_PACKED as the Parquet format describes it, a bit at a time (the
    /// `parquet` crate's encoder's layout: blocks of 256, four miniblocks, empty
    /// miniblocks' widths 0).
    fn encode_reference(values: &[i64]) -> Vec<u8> {
        let mut out = Vec::new();
        varint(&mut out, 256);
        varint(&mut out, 4);
        varint(&mut out, values.len() as u64);
        varint(&mut out, zigzag(values.first().copied().unwrap_or(0)));
        let deltas: Vec<i64> = values.windows(2).map(|w| w[1].wrapping_sub(w[0])).collect();
        for block in deltas.chunks(256) {
            let least = *block.iter().min().unwrap();
            varint(&mut out, zigzag(least));
            let minis: Vec<&[i64]> = block.chunks(64).collect();
            let widths: Vec<u32> = (0..4)
                .map(|m| {
                    minis.get(m).map_or(0, |mini| {
                        let max = mini.iter().map(|&d| (d as u64).wrapping_sub(least as u64)).max().unwrap();
                        64 - max.leading_zeros()
                    })
                })
                .collect();
            out.extend(widths.iter().map(|&w| w as u8));
            for (mini, &w) in minis.iter().zip(&widths) {
                let (mut byte, mut held) = (0u8, 0u32);
                for k in 0..64 {
                    let v = mini.get(k).map_or(0, |&d| (d as u64).wrapping_sub(least as u64));
                    for bit in 0..w {
                        byte |= (((v >> bit) & 1) as u8) << held;
                        held += 1;
                        if held == 8 {
                            out.push(byte);
                            (byte, held) = (0, 0);
                        }
                    }
                }
                debug_assert_eq!(held, 0, "64 values of any width are whole bytes");
            }
        }
        out
    }

    /// [`encode`] writes the reference's bytes for every length up to past two blocks
    /// (every partial block and miniblock) and deltas of every width: constant steps
    /// (width 0), small and wide jumps, both signs, values that wrap.
    #[test]
    fn encoding_is_the_reference_bytes() {
        let mut rng = fragscope_testdata::Rng(11);
        for len in (0..600).chain([1000, 4097]) {
            for kind in 0..5 {
                let mut x: i64 = rng.below(1 << 40) as i64 - (1 << 39);
                let values: Vec<i64> = (0..len)
                    .map(|i| {
                        x = match kind {
                            0 => x + 1,
                            1 => x + rng.below(1000) as i64,
                            2 => x.wrapping_add(rng.below(1 << 20) as i64 - (1 << 19)),
                            3 => x.wrapping_add((rng.next_u64() as i64).wrapping_mul(0x9E37_79B9)),
                            _ => [i64::MIN, i64::MAX, 0, -1][i % 4],
                        };
                        x
                    })
                    .collect();
                let mut got = vec![9u8];
                encode(&mut got, &values);
                assert_eq!(got[1..], encode_reference(&values)[..], "{len} values of kind {kind}");
            }
        }
    }

    #[test]
    fn zigzag_small_numbers_of_either_sign() {
        assert_eq!([0, -1, 1, -2, 2].map(zigzag), [0, 1, 2, 3, 4]);
        assert_eq!(zigzag(i64::MIN), u64::MAX);
        assert_eq!(zigzag(i64::MAX), u64::MAX - 1);
    }
}
