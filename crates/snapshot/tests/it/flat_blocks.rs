//! A segment's block dict that is plain (block keys only, each once, ints and a known
//! state) is decoded whole as it completes, never built as a dict. The model must be the
//! one the dict would have made: checked against the same objects pickled at protocol 2,
//! which the reader takes through its generic path (no dict there starts with MEMOIZE, so
//! none is decoded whole), and against the odd things a pickle can do with such a dict.

use crate::common;

use fragscope_snapshot::*;

/// A snapshot whose blocks cover the forms a plain block takes: with and without
/// `address` (then the end of the block before), `requested_size` and `frames`, keys in
/// another order, `frames` shared with an earlier block (a memo reference at protocol 4),
/// `None`, and the docstring's `active_awaiting_free`; plus a block-like dict kept
/// verbatim under an unknown key, and padding so the last block has bytes after it.
const EXPR: &str = "(lambda fr: {'segments': [
    {'device': 0, 'address': 4096, 'total_size': 2048, 'allocated_size': 1024, 'active_size': 1536,
     'stream': 0, 'segment_type': 'small', 'blocks': [
        {'address': 4096, 'size': 512, 'requested_size': 500, 'state': 'active_allocated', 'frames': fr},
        {'size': 512, 'state': 'active_allocated', 'frames': fr},
        {'state': 'active_awaiting_free', 'size': 512, 'address': 5120},
        {'size': 512, 'requested_size': 7, 'state': 'inactive', 'frames': None}]},
    {'device': 1, 'address': 2**40, 'total_size': 2**21, 'stream': 3, 'blocks': [
        {'address': 2**40, 'size': 2**20, 'state': 'inactive'},
        {'size': 2**20, 'state': 'active_allocated', 'requested_size': 2**20 - 1}]}],
  'device_traces': [[], []],
  'kept': [{'size': 1, 'state': 'inactive'}, {'address': 3, 'size': 1, 'state': 'inactive', 'x': 1}],
  'pad': 'x' * 200})([{'filename': 'a.py', 'line': 3, 'name': 'f'}])";

fn stacks(snap: &Snapshot) -> Vec<Option<Vec<(String, i64, String)>>> {
    snap.segments.iter().flat_map(|s| &s.blocks).map(|b| resolve_stack(&snap.frames, b.stack)).collect()
}

#[test]
fn plain_blocks_read_as_their_dicts_do() {
    let Some(py) = common::python3() else { return };
    let p4 = read_from(&common::python_pickle(py, EXPR, 4)[..]).unwrap();
    let p2 = read_from(&common::python_pickle(py, EXPR, 2)[..]).unwrap();
    assert_eq!(p4.segments, p2.segments);
    assert_eq!(stacks(&p4), stacks(&p2));
    assert_eq!(format!("{:?}", p4.extra), format!("{:?}", p2.extra));
    assert_eq!(format!("{:?}", p4.notes), format!("{:?}", p2.notes));
    // What the model holds, independently of either path.
    let b = &p4.segments[0].blocks;
    assert_eq!(b.iter().map(|b| b.address).collect::<Vec<_>>(), [4096, 4608, 5120, 5632]);
    assert_eq!(b.iter().map(|b| b.requested_size).collect::<Vec<_>>(), [Some(500), None, None, Some(7)]);
    let states = [BlockState::ActiveAllocated, BlockState::ActiveAllocated, BlockState::ActivePendingFree];
    assert_eq!(b[..3].iter().map(|b| b.state).collect::<Vec<_>>(), states);
    let f = Some(vec![("a.py".to_string(), 3, "f".to_string())]);
    assert_eq!(stacks(&p4)[..4], [f.clone(), f, None, None]);
    assert_eq!(p4.segments[1].blocks[1].address, (1 << 40) + (1 << 20));
    assert_eq!(p4.segments[1].allocated_size, 1 << 20, "derived from the blocks when absent");
}

/// SHORT_BINUNICODE then MEMOIZE.
fn s(x: &str) -> Vec<u8> {
    let mut v = vec![0x8c, x.len() as u8];
    v.extend_from_slice(x.as_bytes());
    v.push(0x94);
    v
}

/// `{'segments': [S], 'pad': '…'}` (protocol 4), `S` a segment of one plain block `B`
/// (`{'size': 512, 'state': 'inactive'}`, memo index 8), with `after` run once `S` is in
/// the list: opcodes that may reach `B` again by its memo index.
fn with_block_changed(after: &[u8]) -> Vec<u8> {
    let mut b = b"\x80\x04}\x94(".to_vec(); // top dict: memo 0
    b.extend(s("segments")); // 1
    b.extend(b"]\x94"); // segments list: 2
    b.extend(b"}\x94("); // S: 3
    b.extend(s("address")); // 4
    b.extend(b"K\x00");
    b.extend(s("total_size")); // 5
    b.extend(b"M\x00\x02");
    b.extend(s("blocks")); // 6
    b.extend(b"]\x94"); // blocks list: 7
    b.extend(b"}\x94("); // B: 8
    b.extend(s("size")); // 9
    b.extend(b"M\x00\x02");
    b.extend(s("state")); // 10
    b.extend(s("inactive")); // 11
    b.extend(b"ua"); // B's items; B into the blocks
    b.extend(b"ua"); // S's items; S into the segments
    b.extend(after);
    b.extend(s("pad"));
    b.extend(s(&"x".repeat(100)));
    b.extend(b"u.");
    b
}

#[test]
fn a_plain_block_given_items_after_it_completed_reads_with_them() {
    let read = |after: &[u8]| read_from(&with_block_changed(after)[..]).unwrap();
    let plain = read(b"");
    assert_eq!(plain.segments[0].blocks[0].requested_size, None);
    assert_eq!(plain.segments[0].blocks[0].size, 512);
    // BINGET 8, then SETITEM requested_size=7 and SETITEM xyz=1, then POP.
    let mut after = b"h\x08".to_vec();
    after.extend(s("requested_size"));
    after.extend(b"K\x07s");
    after.extend(s("xyz"));
    after.extend(b"K\x01s0");
    let changed = read(&after);
    let blk = &changed.segments[0].blocks[0];
    assert_eq!((blk.size, blk.requested_size, blk.state), (512, Some(7), BlockState::Inactive));
    assert_eq!(changed.notes.unknown_keys.get("block.xyz"), Some(&1));
    // A second reference to the block (BINGET 8, APPEND to the blocks list, BINGET 7).
    let twice = read(b"h\x07h\x08a0");
    assert_eq!(twice.segments[0].blocks.len(), 2);
    assert_eq!(twice.segments[0].blocks[1].address, 512, "after the first block, as a dict's copy");
}

#[test]
fn a_top_level_dict_like_a_block_is_refused_by_its_keys() {
    // {'size': 1, 'state': 'inactive'}, then NONE POP pairs so the dict has 64 bytes after it.
    let mut b = b"\x80\x04}\x94(".to_vec();
    b.extend(s("size"));
    b.extend(b"K\x01");
    b.extend(s("state"));
    b.extend(s("inactive"));
    b.push(b'u');
    b.extend(b"N0".repeat(40));
    b.push(b'.');
    let e = read_from(&b[..]).unwrap_err().to_string();
    assert!(e.contains("a pickled dict without a 'segments' key (keys: size, state)"), "{e}");
}
