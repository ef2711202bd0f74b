//! The reader's memory budget (`fragscope_snapshot::budget`) and checksums, each on the
//! reproducer that once aborted or exhausted memory (issue 43), through a byte stream,
//! gzip and a torch.save zip: every case ends in one line naming the limit, quickly and
//! without allocating gigabytes. The generators are small pickles written byte by byte.

use std::io::{Read, Write};

use crate::common;
use fragscope_snapshot::*;

/// Reads `bytes` as a stream, gzip-compressed and in a torch.save zip (deflated); each
/// must be refused with one line containing `want`.
#[track_caller]
fn refused_every_way(pickle: &[u8], want: &str) {
    for (how, e) in [
        ("stream", read_from(pickle)),
        ("gzip", read_from(&common::gzip(pickle)[..])),
        ("zip", read_from(&torch_zip(pickle, zip::CompressionMethod::Deflated)[..])),
    ] {
        let e = match e {
            Ok(_) => panic!("{how}: accepted; expected an error containing {want:?}"),
            Err(e) => e.to_string(),
        };
        assert!(e.contains(want), "{how}: {e:?} lacks {want:?}");
        assert!(!e.contains('\n'), "{how}: one line: {e:?}");
    }
}

/// A torch.save archive holding `pickle` as `archive/data.pkl`.
fn torch_zip(pickle: &[u8], method: zip::CompressionMethod) -> Vec<u8> {
    let mut z = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let opts = zip::write::SimpleFileOptions::default().compression_method(method);
    z.start_file("archive/data.pkl", opts).unwrap();
    z.write_all(pickle).unwrap();
    z.finish().unwrap().into_inner()
}

/// SHORT_BINUNICODE.
fn s(x: &str) -> Vec<u8> {
    let mut v = vec![0x8c, x.len() as u8];
    v.extend_from_slice(x.as_bytes());
    v
}

/// BININT.
fn int(i: i32) -> Vec<u8> {
    let mut v = vec![b'J'];
    v.extend_from_slice(&i.to_le_bytes());
    v
}

/// `{'segments': [], <body's key>: <body's value>}`: `body` pushes key and value.
fn snapshot_with(body: &[u8]) -> Vec<u8> {
    let mut v = b"\x80\x04}(".to_vec();
    v.extend(s("segments"));
    v.push(b']');
    v.extend_from_slice(body);
    v.extend_from_slice(b"u.");
    v
}

/// Leaves `L_levels` on the stack, where `L_0 = []` and `L_k = [L_{k-1}, L_{k-1}]`,
/// memoized at 0..=levels: 9 bytes a level, 2^levels leaves.
fn doubling(levels: u8) -> Vec<u8> {
    let mut v = vec![b']', b'q', 0];
    for k in 1..=levels {
        v.extend([b'0', b'(', b'h', k - 1, b'h', k - 1, b'l', b'q', k]);
    }
    v
}

/// `( item × n l`: a list of `n` copies of `item` (a memo reference).
fn list_of(item: &[u8], n: usize) -> Vec<u8> {
    let mut v = vec![b'('];
    for _ in 0..n {
        v.extend_from_slice(item);
    }
    v.push(b'l');
    v
}

#[test]
fn a_memo_doubling_is_refused_wherever_the_model_keeps_values() {
    // Under an unknown top-level key, allocator_settings, an annotation's extra key: CPython
    // shares the lists; the model copies them, 2^64 leaves from 600 bytes.
    let mut unknown = s("evil");
    unknown.extend(doubling(64));
    refused_every_way(&snapshot_with(&unknown), "memo references copied");
    let mut settings = s("allocator_settings");
    settings.extend(doubling(64));
    refused_every_way(&snapshot_with(&settings), "memo references copied");
    let mut ann = s("external_annotations");
    ann.extend(b"(}(");
    ann.extend(s("name"));
    ann.extend(s("x"));
    ann.extend(s("extra"));
    ann.extend(doubling(64));
    ann.extend(b"ul");
    refused_every_way(&snapshot_with(&ann), "memo references copied");
}

#[test]
fn memo_shared_segments_and_annotation_names_are_counted_as_copies() {
    // One segment of 1,000 blocks, referenced 100,000 times: 10^8 blocks from 200 KB.
    let mut segs = s("segments");
    segs.extend(b"}(");
    segs.extend(s("size"));
    segs.extend(int(512));
    segs.extend(s("state"));
    segs.extend(s("active_allocated"));
    segs.extend(b"uq\x000");
    segs.extend(list_of(b"h\x00", 1000));
    segs.extend(b"q\x010}(");
    segs.extend(s("address"));
    segs.extend(int(0));
    segs.extend(s("total_size"));
    segs.extend(int(512_000));
    segs.extend(s("blocks"));
    segs.extend(b"h\x01uq\x020");
    segs.extend(list_of(b"h\x02", 100_000));
    // `snapshot_with` sets 'segments' first; this one replaces it, as a dict does.
    refused_every_way(&snapshot_with(&segs), "memo references copied");

    // A 1 MiB annotation name, referenced by 100,000 annotations: 100 GB of names.
    let mut names = s("external_annotations");
    names.push(b'X');
    names.extend((1u32 << 20).to_le_bytes());
    names.extend(std::iter::repeat_n(b'n', 1 << 20));
    names.extend(b"q\x000}(");
    names.extend(s("name"));
    names.extend(b"h\x00uq\x010");
    names.extend(list_of(b"h\x01", 100_000));
    refused_every_way(&snapshot_with(&names), "memo references copied");
}

#[test]
fn sparse_memo_indices_are_refused_before_the_memo_allocates() {
    // LONG_BINPUT 2^20 apart: each 5 bytes once cost 4 MiB of memo chunks.
    let mut v = b"\x80\x04N".to_vec();
    for k in 1..1200u32 {
        v.push(b'r');
        v.extend((k << 20).to_le_bytes());
    }
    v.push(b'.');
    refused_every_way(&v, "memo index 1048576 at byte 3: past any index a pickler writes");
}

#[test]
fn a_declared_huge_string_is_refused_before_its_bytes_are_buffered() {
    // BINUNICODE8, BINBYTES8 of 6 GiB and BINUNICODE of 4 GiB, followed by 8 MiB of zeros
    // (gzip'd, the zeros once inflated until the declared length).
    for (op, len_bytes) in [(0x8du8, 8usize), (0x8e, 8), (b'X', 4)] {
        let mut v = b"\x80\x04".to_vec();
        v.push(op);
        let n: u64 = if len_bytes == 8 { 6 << 30 } else { u32::MAX as u64 };
        v.extend(&n.to_le_bytes()[..len_bytes]);
        v.extend(std::iter::repeat_n(0u8, 8 << 20));
        refused_every_way(&v, "at byte 2, longer than any memory snapshot holds (limit 64 MiB)");
    }
}

#[test]
fn sixty_million_empty_lists_stop_at_the_values_budget() {
    // 60 M one-byte EMPTY_LISTs (58 KB gzip'd) once held 3.8 GB.
    let mut v = b"\x80\x04".to_vec();
    v.extend(std::iter::repeat_n(b']', 60_000_000));
    v.push(b'.');
    refused_every_way(&v, "the pickle's values grow past");
}

/// A gzip stream of `n` bytes of `None`/POP pairs after a pickle header, written in
/// pieces (the whole is never held).
fn gzip_of_pops(n: usize) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    e.write_all(b"\x80\x04").unwrap();
    let piece = b"N0".repeat(1 << 19);
    for _ in 0..n / piece.len() {
        e.write_all(&piece).unwrap();
    }
    e.finish().unwrap()
}

#[test]
fn a_compression_bomb_is_refused_at_the_inflation_limit() {
    // 512 MiB of harmless opcodes from about 0.5 MB: past 64 MiB + 250 × the compressed
    // bytes.
    let gz = gzip_of_pops(512 << 20);
    assert!(gz.len() < 1 << 20, "{}", gz.len());
    let e = read_from(&gz[..]).unwrap_err().to_string();
    assert!(e.contains("the gzip stream inflates to more than"), "{e}");
    assert!(e.contains("limit 64 MiB + 250 × the compressed size"), "{e}");
    // The same bytes in a deflated zip entry.
    let mut raw = flate2::read::GzDecoder::new(&gz[..]);
    let mut pickle = Vec::new();
    raw.by_ref().take(200 << 20).read_to_end(&mut pickle).unwrap();
    let z = torch_zip(&pickle, zip::CompressionMethod::Deflated);
    let e = read_from(&z[..]).unwrap_err().to_string();
    assert!(e.contains("the zip entry data.pkl inflates to more than"), "{e}");
}

#[test]
fn json_followed_by_zeros_stops_at_the_first() {
    // `(printf '{'; cat /dev/zero) | fragscope summary -`: an endless stream.
    let endless = std::io::Cursor::new(b"{".to_vec()).chain(std::io::repeat(0));
    let e = read_from(endless).unwrap_err().to_string();
    assert_eq!(e, "invalid JSON: control byte 0x00 at byte 1: not JSON text");
    let e = read_from(b"[{\"a\": 1}, \x07]".as_slice()).unwrap_err().to_string();
    assert!(e.contains("control byte 0x07 at byte 11"), "{e}");
    // A gzip'd JSON of spaces (6 MB once took 6 GB): stopped after 1 MiB of them.
    let mut spaces = b"{".to_vec();
    spaces.extend(std::iter::repeat_n(b' ', 8 << 20));
    spaces.push(b'}');
    let e = read_from(&common::gzip(&spaces)[..]).unwrap_err().to_string();
    assert_eq!(
        e,
        "refusing: more than 1 MiB of white space at byte 1048577: not a profiler trace (a gzip'd file of spaces \
         once took 6 GB)"
    );
}

/// `{'segments': [], 'note': 'abc'}`: a snapshot whose bytes can change without
/// breaking the pickle.
fn small_snapshot() -> Vec<u8> {
    let mut note = s("note");
    note.extend(s("abc"));
    snapshot_with(&note)
}

#[test]
fn a_gzip_file_with_a_wrong_crc_or_length_is_damaged() {
    let gz = common::gzip(&small_snapshot());
    assert!(read_from(&gz[..]).is_ok());
    let n = gz.len();
    for (at, what) in [(n - 8, "CRC-32"), (n - 1, "ISIZE")] {
        let mut bad = gz.clone();
        bad[at] ^= 0x01;
        let e = read_from(&bad[..]).map(|_| ()).unwrap_err().to_string();
        assert!(e.starts_with("damaged gzip data: "), "{what}: {e}");
        assert!(e.contains("corrupt or incomplete"), "{what}: {e}");
    }
}

#[test]
fn a_torch_save_zip_whose_entry_fails_its_crc_is_damaged() {
    let z = torch_zip(&small_snapshot(), zip::CompressionMethod::Stored);
    assert!(read_from(&z[..]).is_ok());
    let at = z.windows(3).position(|w| w == b"abc").unwrap();
    let mut bad = z.clone();
    bad[at + 2] = b'd';
    let e = read_from(&bad[..]).map(|_| ()).unwrap_err().to_string();
    assert_eq!(e, "damaged zip entry data: Invalid checksum; the file is corrupt or incomplete (download it again)");
    // Read in place from a file, too.
    let dir = common::scratch_dir("limits-zip-crc");
    let path = dir.join("bad.pt");
    std::fs::write(&path, &bad).unwrap();
    let e2 = read_path(&path).map(|_| ()).unwrap_err().to_string();
    assert_eq!(e, e2);
}

#[test]
fn a_pickle_written_by_python_with_memo_sharing_still_reads() {
    // The budget counts copies; a real snapshot's few shared values stay far below it.
    let mut shared = s("allocator_settings");
    shared.extend(doubling(10));
    let snap = read_from(&snapshot_with(&shared)[..]).unwrap();
    let settings = snap.allocator_settings.expect("kept");
    fn leaves(o: &PyObj) -> usize {
        match o {
            PyObj::List(items) if items.is_empty() => 1,
            PyObj::List(items) => items.iter().map(leaves).sum(),
            _ => 0,
        }
    }
    assert_eq!(leaves(&settings), 1024);
}
