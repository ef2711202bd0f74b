//! `torch.save` files of a real snapshot, as PyTorch's guides tell users to write them:
//! the zip archive (`<name>/data.pkl`, protocol 2, stored) of `torch.cuda.memory._snapshot()`
//! and of `torch.cuda.memory_snapshot()` (the list of segments), a re-zipped (deflated)
//! archive, and the legacy non-zip stream. Fixtures in tests/data/torchsave/, written from
//! the in-repository real file `effdl-course-liger-ce.pickle` by `make.py` there (standard
//! library only: zipfile + pickle, as torch/serialization.py lays the files out).

use std::path::PathBuf;

use fragscope_snapshot::{read_from, read_path, semantic_diff, SourceFormat};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/torchsave").join(name)
}

fn original() -> fragscope_snapshot::Snapshot {
    let p = fragscope_testdata::in_repo_dir().join("effdl-course-liger-ce.pickle");
    read_path(&p).unwrap()
}

#[test]
fn zip_archive_of_the_snapshot_dict_reads_as_the_pickle() {
    let orig = original();
    for name in ["memory_snapshot.pt", "deflated.pt"] {
        let s = read_path(&fixture(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(semantic_diff(&orig, &s), None, "{name}");
        assert!(s.trace(0).len() > 40, "{name}: the trace was read");
        // From a stream too (`fragscope summary - < memory_snapshot.pt`).
        let bytes = std::fs::read(fixture(name)).unwrap();
        let s2 = read_from(&bytes[..]).unwrap();
        assert_eq!(semantic_diff(&orig, &s2), None, "{name} from a stream");
    }
}

#[test]
fn zip_archive_of_memory_snapshot_list_gives_the_segments() {
    let orig = original();
    let s = read_path(&fixture("segments_list.pth")).unwrap();
    assert_eq!(s.format, SourceFormat::SegmentList);
    // Interned stack ids differ between two reads; compare the stacks resolved.
    let resolved = |x: &fragscope_snapshot::Snapshot| -> Vec<String> {
        x.segments
            .iter()
            .flat_map(|g| {
                let seg = format!("{:#x} {} {:?}", g.address, g.total_size, g.segment_type);
                g.blocks.iter().map(move |b| (seg.clone(), b))
            })
            .map(|(seg, b)| {
                let st = fragscope_snapshot::resolve_stack(&x.frames, b.stack);
                format!("{seg} {:#x} {} {:?} {:?} {st:?}", b.address, b.size, b.requested_size, b.state)
            })
            .collect()
    };
    assert_eq!(resolved(&s), resolved(&orig));
    assert_eq!(s.segments.len(), orig.segments.len());
    assert!(s.device_traces.iter().all(|t| t.is_empty()));
}

#[test]
fn legacy_torch_save_stream_reads_as_the_pickle() {
    let orig = original();
    let s = read_path(&fixture("legacy.pt")).unwrap();
    assert_eq!(semantic_diff(&orig, &s), None);
}

#[test]
fn a_saved_tensor_is_refused_as_code() {
    let e = read_path(&fixture("tensor.pt")).unwrap_err().to_string();
    assert!(e.contains("GLOBAL") && e.contains("refusing"), "{e}");
    assert!(!e.contains('\n'), "{e}");
}

#[test]
fn a_zip_without_data_pkl_is_refused_clearly() {
    let e = read_path(&fixture("no_data_pkl.zip")).unwrap_err().to_string();
    assert!(e.contains("without data.pkl") && e.contains("model/weights.bin"), "{e}");
    let bytes = std::fs::read(fixture("no_data_pkl.zip")).unwrap();
    let e2 = read_from(&bytes[..]).unwrap_err().to_string();
    assert_eq!(e, e2);
}

#[test]
fn a_damaged_archive_or_legacy_stream_is_an_error() {
    for name in ["memory_snapshot.pt", "legacy.pt", "segments_list.pth"] {
        let full = std::fs::read(fixture(name)).unwrap();
        for cut in [5, 20, 40, full.len() / 2, full.len() - 10] {
            let e = read_from(&full[..cut]).unwrap_err().to_string();
            assert!(!e.contains('\n'), "{name} cut at {cut}: {e}");
        }
    }
}

/// Bytes already in memory (`fragscope.loads`) are read in place: with the temporary
/// folder made unusable, a torch.save archive in memory still reads, while the same bytes
/// as a stream (which must be spilled to a file) cannot. Run in a child process of this
/// test binary, since `TMPDIR` is the whole process's.
#[test]
fn zip_bytes_in_memory_are_read_without_a_temporary_file() {
    const CHILD: &str = "FRAGSCOPE_TEST_NO_TMPDIR";
    let bytes = std::fs::read(fixture("memory_snapshot.pt")).unwrap();
    if std::env::var_os(CHILD).is_some() {
        let e = fragscope_snapshot::read_from_checked(&bytes[..]).unwrap_err().to_string();
        assert!(e.contains("No such file or directory") || e.contains("not found"), "the stream is spilled: {e}");
        let s = fragscope_snapshot::read_bytes_checked(&bytes).unwrap();
        assert_eq!(semantic_diff(&original(), &s), None);
        println!("child: read in place");
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "torch_save::zip_bytes_in_memory_are_read_without_a_temporary_file", "--nocapture"])
        .env(CHILD, "1")
        .env("TMPDIR", "/nonexistent/fragscope-no-tmpdir")
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && text.contains("child: read in place"), "{text}");
    // Everything else reads from bytes as from a stream.
    let pickle = std::fs::read(fragscope_testdata::in_repo_dir().join("effdl-course-liger-ce.pickle")).unwrap();
    assert_eq!(semantic_diff(&original(), &fragscope_snapshot::read_bytes_checked(&pickle).unwrap()), None);
    let e = fragscope_snapshot::read_bytes_checked(&bytes[..bytes.len() / 2]).unwrap_err().to_string();
    assert!(e.contains("zip"), "a damaged archive in memory: {e}");
}
