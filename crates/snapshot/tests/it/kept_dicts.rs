//! The reader's shortcuts for dicts that are not trace entries (a segment's blocks, most
//! often): a flat dict the absorber has looked at and kept is kept again when appended,
//! without being looked at again, unless items were added to it since; segments and
//! blocks are read from their dicts' key ids, and name the item in their errors as before.

use crate::common;

use fragscope_snapshot::*;

/// SHORT_BINUNICODE then MEMOIZE.
fn s(x: &str) -> Vec<u8> {
    let mut v = vec![0x8c, x.len() as u8];
    v.extend_from_slice(x.as_bytes());
    v.push(0x94);
    v
}

/// `{'segments': [], 'device_traces': [[D]], 'pad': '…'}`, protocol 4, where `D` is the flat
/// dict `{'addr': 5}` (decoded whole by the VM's flat-dict path and kept, as it is no
/// trace entry) to which `after` (SETITEM opcodes, or nothing) adds items before it is
/// appended to the trace. The padding keeps 64 bytes in view at `D`, as the flat-dict
/// path needs.
fn with_dict_changed(after: &[u8]) -> Vec<u8> {
    let mut b = b"\x80\x04}\x94(".to_vec();
    b.extend(s("segments"));
    b.extend(b"]\x94");
    b.extend(s("device_traces"));
    b.extend(b"]\x94]\x94");
    // D: EMPTY_DICT MEMOIZE MARK 'addr' 5 SETITEMS.
    b.extend(b"}\x94(");
    b.extend(s("addr"));
    b.extend(b"K\x05u");
    b.extend(after);
    // D into the trace, the trace into device_traces.
    b.extend(b"aa");
    b.extend(s("pad"));
    b.extend(s(&"x".repeat(100)));
    b.extend(b"u.");
    b
}

#[test]
fn a_kept_dict_given_the_keys_of_an_entry_before_its_append_is_a_trace_entry() {
    let mut after = s("action");
    after.extend(s("alloc"));
    after.push(b's');
    after.extend(s("size"));
    after.extend(b"K\x07s");
    let bytes = with_dict_changed(&after);
    for snap in [read_from(&bytes[..]).unwrap(), read_bytes_checked(&bytes).unwrap()] {
        assert_eq!(snap.device_traces, vec![vec![TraceEvent::new(Action::Alloc, 5, 7)]]);
    }
    // Read from a mapped file too (the whole input in view at once).
    let dir = common::scratch_dir("kept-dicts");
    let path = dir.join("changed.pickle");
    std::fs::write(&path, &bytes).unwrap();
    let snap = read_path(&path).unwrap();
    assert_eq!(snap.device_traces, vec![vec![TraceEvent::new(Action::Alloc, 5, 7)]]);
}

#[test]
fn a_kept_dict_appended_unchanged_stays_a_dict() {
    let bytes = with_dict_changed(b"");
    let e = read_from(&bytes[..]).unwrap_err().to_string();
    assert!(e.contains("device_traces[0] holds 1 items that are not trace entries"), "{e}");
    // Given a key that is no trace entry's: still not an entry.
    let mut after = s("state");
    after.extend(s("inactive"));
    after.push(b's');
    let e = read_from(&with_dict_changed(&after)[..]).unwrap_err().to_string();
    assert!(e.contains("device_traces[0] holds 1 items that are not trace entries"), "{e}");
}

/// Segments of three blocks each, the third segment's second block changed by `edit`.
fn segments_expr(edit: &str) -> String {
    let block = |i: u64| {
        format!("{{'address': 2**40 + {i} * 512, 'size': 512, 'requested_size': 500, 'state': 'active_allocated'}}")
    };
    let seg = |k: u64| {
        let blocks: Vec<String> = (0..3).map(|i| block(k * 3 + i)).collect();
        format!(
            "{{'device': 0, 'address': 2**40 + {k} * 1536, 'total_size': 1536, 'allocated_size': 1536, \
             'active_size': 1536, 'stream': 0, 'segment_type': 'small', 'blocks': [{}]}}",
            blocks.join(", ")
        )
    };
    let segs: Vec<String> = (0..3).map(seg).collect();
    format!("(lambda d: ({edit}, d)[1])({{'segments': [{}], 'device_traces': [[]]}})", segs.join(", "))
}

#[test]
fn segment_and_block_errors_name_the_item() {
    let Some(py) = common::python3() else { return };
    let read = |edit: &str| {
        let bytes = common::python_pickle(py, &segments_expr(edit), 4);
        read_from(&bytes[..]).map(|s| s.segments.iter().map(|g| g.blocks.len()).sum::<usize>())
    };
    assert_eq!(read("None").unwrap(), 9, "unchanged: every block read");
    let cases = [
        ("d['segments'][2]['blocks'][1].update(state='bogus')", "segments[2].blocks[1]: unknown block state 'bogus'"),
        ("d['segments'][2]['blocks'][1].update({7: 1})", "segments[2].blocks[1] has a non-string key"),
        ("d['segments'][2]['blocks'].__setitem__(1, 7)", "segments[2].blocks[1] is a int where a dict was expected"),
        (
            "d['segments'][2]['blocks'][1].pop('state')",
            "segments[2].blocks[1] lacks 'state': not a memory snapshot block",
        ),
        ("d['segments'][2].update(segment_type='huge')", "segments[2]: unknown segment_type 'huge'"),
        ("d['segments'][2].update({(1, 2): 1})", "segments[2] has a non-string key"),
        ("d['segments'][2].pop('blocks')", "segments[2] lacks 'blocks': not a memory snapshot segment"),
        ("d['segments'][2]['blocks'][1].update(state=3)", "block 'state' is a int, not a str"),
    ];
    for (edit, want) in cases {
        let e = read(edit).unwrap_err().to_string();
        assert!(e.contains(want), "{edit}: {e:?} lacks {want:?}");
    }
}
