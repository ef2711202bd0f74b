//! Writer round trips: read → write → read on every real pickle, plus CPython checks.

use crate::common;

use std::path::Path;

use fragscope_snapshot::pickle::write::{write_path, write_snapshot};
use fragscope_snapshot::*;

fn write_vec(s: &Snapshot) -> Vec<u8> {
    let mut v = Vec::new();
    write_snapshot(s, &mut v).unwrap();
    v
}

/// read → write → read gives the same model (compared resolved, since interning ids may
/// differ), and writing is a fixed point: writing the re-read model gives the same bytes.
#[test]
fn roundtrip_every_real_pickle() {
    let files = common::real_pickles();
    for p in &files {
        let name = p.file_name().unwrap().to_string_lossy();
        let a = read_path(p).unwrap_or_else(|e| panic!("{name}: {e}"));
        let bytes = write_vec(&a);
        assert_eq!(&bytes[..3], b"\x80\x04\x95", "{name}: PROTO 4 then FRAME");
        let b = read_from(&bytes[..]).unwrap_or_else(|e| panic!("{name}: re-read: {e}"));
        if let Some(d) = semantic_diff(&a, &b) {
            panic!("{name}: round trip differs: {d}");
        }
        assert_eq!(write_vec(&b), bytes, "{name}: writing the re-read model gives other bytes");
        eprintln!("{name}: {} -> {} bytes, same model", std::fs::metadata(p).unwrap().len(), bytes.len());
    }
}

/// The CPython side, for every real pickle, in one python3 process:
/// 1. `pickle.load(original) == pickle.load(written)`: the written file holds the very same
///    Python object (dict form compared exactly, every key and value, so keys absent on
///    read stay absent). Both loads use an Unpickler whose `find_class` raises, so no
///    global could be imported from either file.
/// 2. `pickle.dumps(pickle.load(written), protocol=4) == written`: CPython's own pickler,
///    given the object graph we wrote (same sharing), produces byte-identical output, so
///    framing, memo use, batching and int encodings are exactly CPython's.
#[test]
fn cpython_loads_written_files_equal_and_byte_identical() {
    let files = common::real_pickles();
    let Some(py) = common::python3() else { return };
    if files.is_empty() {
        return;
    }
    let dir = common::scratch_dir("cpython");
    let mut args: Vec<std::path::PathBuf> = Vec::new();
    for p in &files {
        let a = read_path(p).unwrap();
        let out = dir.join(p.file_name().unwrap());
        write_path(&a, &out).unwrap();
        args.push(p.clone());
        args.push(out);
    }
    const SCRIPT: &str = r#"
import pickle, sys
class Restricted(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"global {module}.{name} refused")
def load(p):
    with open(p, 'rb') as f:
        return Restricted(f).load()
bad = []
a = sys.argv[1:]
for orig, written in zip(a[0::2], a[1::2]):
    o, w = load(orig), load(written)
    raw = open(written, 'rb').read()
    same = o == w
    exact = pickle.dumps(w, protocol=4) == raw
    print(orig.rsplit('/', 1)[-1], 'equal' if same else 'DIFFERENT', 'byte-identical' if exact else 'NOT-IDENTICAL')
    if not (same and exact):
        bad.append(orig)
sys.exit(1 if bad else 0)
"#;
    let argv: Vec<&Path> = args.iter().map(|p| p.as_path()).collect();
    let out = common::run_python(py, SCRIPT, &argv);
    eprint!("{out}");
    assert_eq!(out.lines().count(), files.len());
    let _ = std::fs::remove_dir_all(&dir);
}

/// write_path replaces an existing file only once the new content is complete, and
/// leaves no temporary file behind, on success or on failure.
#[test]
fn write_path_is_atomic_and_cleans_up() {
    let dir = common::scratch_dir("writepath");
    let target = dir.join("snap.pickle");
    std::fs::write(&target, b"old content").unwrap();
    let mut s = Snapshot::default();
    s.device_traces.push(vec![TraceEvent::new(Action::Alloc, 0x7f00_0000_0000, 512)]);
    write_path(&s, &target).unwrap();
    let back = read_path(&target).unwrap();
    assert_eq!(semantic_diff(&s, &back), None);
    let names: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, vec![std::ffi::OsString::from("snap.pickle")], "no temp file left");

    // A target in a missing directory fails cleanly.
    assert!(write_path(&s, &dir.join("missing/x.pickle")).is_err());
    // A target that is a directory: the rename fails, the temp file is removed.
    let sub = dir.join("sub");
    std::fs::create_dir(&sub).unwrap();
    std::fs::write(sub.join("keep"), b"x").unwrap();
    assert!(write_path(&s, &sub).is_err());
    let mut names: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
    names.sort();
    assert_eq!(names, vec![std::ffi::OsString::from("snap.pickle"), "sub".into()]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A hand-built snapshot with edge values the real files do not have: huge and negative
/// ints, 2^64−1 settings, bytes, long strings (≥ 64 KiB, written outside frames), > 1000
/// items (batching), `oom`'s `device_free`, pool ids, compile context, absent keys.
fn synthetic() -> Snapshot {
    let mut s = Snapshot::default();
    let f = &mut s.frames;
    let file = f.intern_str("model.py");
    let fwd = f.intern_str("forward");
    let big = f.intern_str(&"x".repeat(70_000));
    let fr1 = f.intern_frame(Frame { filename: file, line: 12, name: fwd });
    let fr2 = f.intern_frame(Frame { filename: big, line: -1, name: fwd }); // 2^64−1 in the file
    let st = f.intern_stack(&[fr1, fr2]);
    let empty = f.intern_stack(&[]);
    let cc = f.intern_str("N/A");
    let meta = f.intern_str("step 7");
    // Three contexts: a pool with a compile context, user metadata alone, and all three.
    let ctx =
        |pool_id, compile_context, user_metadata| EntryContext { stream: 0, pool_id, compile_context, user_metadata };
    let cc_pool = s.intern_context(ctx(Some((0, 3)), Some(cc), None)).unwrap();
    let meta_only = s.intern_context(ctx(None, None, Some(meta))).unwrap();
    let all = s.intern_context(ctx(Some((1, 0)), Some(cc), Some(meta))).unwrap();
    assert_eq!(s.intern_context(ctx(None, None, Some(meta))), Some(meta_only), "interned once");
    assert_eq!(s.intern_context(EntryContext::default()), Some(ContextId::NONE));
    let mut trace = Vec::new();
    for i in 0..2500u64 {
        let mut e = TraceEvent::new(Action::ALL[(i % 7) as usize], 0x7f12_3456_0000 + i * 512, i * 3);
        if i % 2 == 0 {
            e.time_us = 1_700_000_000_000_000 + i as i64;
        }
        if i % 5 != 0 {
            e.stack = Some(if i % 4 == 0 { empty } else { st });
        }
        if i % 11 == 0 {
            e.context = cc_pool;
        } else if i % 13 == 0 {
            e.context = meta_only;
        } else if i % 17 == 0 {
            e.context = all;
        }
        // Streams live in the contexts too: a stream beside each of the contexts above.
        if i % 3 != 0 {
            assert!(s.set_stream(&mut e, u64::MAX - 5));
        }
        trace.push(e);
    }
    trace.push(TraceEvent::new(Action::Oom, 95_700_000, 5_310_000_000));
    s.device_traces = vec![Vec::new(), trace];
    s.segments.push(Segment {
        device: 1,
        address: u64::MAX - 4095,
        total_size: 2 << 20,
        allocated_size: 512,
        active_size: 512,
        requested_size: Some(500),
        stream: 7,
        segment_type: SegmentType::Small,
        segment_pool_id: Some((0, 0)),
        is_expandable: Some(false),
        stack: Some(st),
        blocks: vec![
            Block {
                address: u64::MAX - 4095,
                size: 512,
                requested_size: Some(500),
                state: BlockState::ActiveAllocated,
                stack: Some(st),
                history: None,
            },
            Block {
                address: u64::MAX - 3583,
                size: (2 << 20) - 512,
                requested_size: None,
                state: BlockState::Inactive,
                stack: None,
                history: None,
            },
        ],
    });
    let mut big_long = vec![0xff; 8];
    big_long.push(0);
    s.allocator_settings = Some(PyObj::Dict(vec![
        (PyObj::Str("max_split_size".into()), PyObj::BigInt(big_long)),
        (PyObj::Str("garbage_collection_threshold".into()), PyObj::Float(0.6)),
        (PyObj::Str("neg".into()), PyObj::Int(i64::MIN)),
        (
            PyObj::Str("t".into()),
            PyObj::Tuple(vec![PyObj::Int(1), PyObj::None, PyObj::Bool(true), PyObj::Str("four".into())]),
        ),
        (PyObj::Str("t0".into()), PyObj::Tuple(vec![])),
        (PyObj::Str("b".into()), PyObj::Bytes(vec![0, 1, 2])),
        (PyObj::Str("nested".into()), PyObj::List(vec![PyObj::List(vec![PyObj::Int(-129)]); 3])),
    ]));
    s.external_annotations = Some(vec![Annotation {
        device: 1,
        time_us: 5,
        name: "fwd".into(),
        stage: "START".into(),
        extra: vec![("k".into(), PyObj::Int(1))],
    }]);
    s.extra.push(("custom_key".into(), PyObj::Str("kept".into())));
    s
}

#[test]
fn synthetic_edge_values_roundtrip() {
    let s = synthetic();
    let bytes = write_vec(&s);
    let back = read_from(&bytes[..]).unwrap();
    assert_eq!(semantic_diff(&s, &back), None);
    assert_eq!(back.recorded_settings().unwrap().max_split_size, None, "2^64−1 reads as unlimited");
    // The oom entry carries device_free, not addr.
    let oom = back.trace(1).last().unwrap();
    assert_eq!(oom.device_free(), Some(95_700_000));
    // Kineto-sourced snapshots are written in the 2.x dict form.
    let mut k = s.clone();
    k.format = SourceFormat::Kineto;
    let kb = read_from(&write_vec(&k)[..]).unwrap();
    assert_eq!(kb.format, SourceFormat::Dict);
    k.format = SourceFormat::Dict;
    assert_eq!(semantic_diff(&k, &kb), None);

    if let Some(py) = common::python3() {
        // CPython reads it, sees the shared stack as one object, 2^64−1 exactly, and
        // re-pickles it to the same bytes.
        let dir = common::scratch_dir("synthetic");
        let p = dir.join("s.pickle");
        write_path(&s, &p).unwrap();
        let out = common::run_python(
            py,
            r#"
import pickle, sys
class R(pickle.Unpickler):
    def find_class(self, m, n): raise pickle.UnpicklingError("refused")
raw = open(sys.argv[1], 'rb').read()
o = R(open(sys.argv[1], 'rb')).load()
t = o['device_traces'][1]
assert o['allocator_settings']['max_split_size'] == 2**64 - 1
assert t[1]['frames'] is t[2]['frames'], "stacks are shared objects"
assert t[1]['frames'][1]['line'] == 2**64 - 1
assert t[-1]['action'] == 'oom' and 'addr' not in t[-1] and t[-1]['device_free'] == 95700000
assert 'time_us' not in t[1] and 'frames' not in t[0]
assert o['segments'][0]['blocks'][1].keys() == {'address', 'size', 'state'}
assert o['segments'][0]['segment_pool_id'] == (0, 0)
assert t[2]['stream'] == -6
print(pickle.dumps(o, protocol=4) == raw)
"#,
            &[&p],
        );
        assert_eq!(out.trim(), "True", "CPython re-pickles to the same bytes");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// `fresh_stacks`: `frames` lists per traceback, as PyTorch's dumps have them (an entry's
/// own, but one for a free's two entries; frame dicts shared); the model read back is the
/// same, and CPython sees those lists and re-pickles them to the same bytes.
#[test]
fn fresh_stacks_write_a_list_per_entry() {
    use fragscope_snapshot::pickle::write::{write_path_with, write_snapshot_with, WriteOptions};
    let mut s = synthetic();
    // A free's two entries, of one block and one stack, after an alloc of that stack.
    let st = s.trace(1)[1].stack.unwrap();
    let t = &mut s.device_traces[1];
    for action in [Action::Alloc, Action::FreeRequested, Action::FreeCompleted] {
        let mut e = TraceEvent::new(action, 0x7f00_0000_0000, 512);
        e.stack = Some(st);
        t.insert(t.len() - 1, e);
    }
    let opts = WriteOptions { fresh_stacks: true };
    let mut fresh = Vec::new();
    write_snapshot_with(&s, &mut fresh, &opts).unwrap();
    let shared = write_vec(&s);
    assert!(fresh.len() > shared.len(), "a list per entry is larger: {} vs {}", fresh.len(), shared.len());
    let back = read_from(&fresh[..]).unwrap();
    assert_eq!(semantic_diff(&s, &back), None);
    if let Some(py) = common::python3() {
        let dir = common::scratch_dir("fresh_stacks");
        let p = dir.join("s.pickle");
        write_path_with(&s, &p, &opts).unwrap();
        let out = common::run_python(
            py,
            r#"
import pickle, sys
class R(pickle.Unpickler):
    def find_class(self, m, n): raise pickle.UnpicklingError("refused")
raw = open(sys.argv[1], 'rb').read()
o = R(open(sys.argv[1], 'rb')).load()
t = o['device_traces'][1]
assert t[1]['frames'] is not t[2]['frames'] and t[1]['frames'] == t[2]['frames']
assert all(a is b for a, b in zip(t[1]['frames'], t[2]['frames'])), "frame dicts shared"
alloc, req, done = t[-4:-1]
assert [e['action'] for e in (alloc, req, done)] == ['alloc', 'free_requested', 'free_completed']
assert req['frames'] is done['frames'], "a free's two entries share its traceback's list"
assert alloc['frames'] is not req['frames'] and alloc['frames'] == req['frames']
print(pickle.dumps(o, protocol=4) == raw)
"#,
            &[&p],
        );
        assert_eq!(out.trim(), "True", "CPython re-pickles to the same bytes");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// The 1.13 top-level list and the 2.0 `history` blocks are written back in their form.
#[test]
fn legacy_forms_are_written_in_their_form() {
    for (name, want) in [
        ("layoutedit-sd-lcm-segments-list.pkl", SourceFormat::SegmentList),
        ("flexgen-opt-oom-v2.0-history-format.pickle", SourceFormat::Dict),
    ] {
        let Some(p) = common::real_file(name) else { return };
        let a = read_path(&p).unwrap();
        assert_eq!(a.format, want);
        let bytes = write_vec(&a);
        let b = read_from(&bytes[..]).unwrap();
        assert_eq!(b.format, want, "{name}");
        if name.starts_with("flexgen") {
            assert!(b.segments.iter().flat_map(|s| &s.blocks).filter(|b| b.history.is_some()).count() == 460);
            // 2.0 blocks have no 'address' key (the writer must not add one): checked
            // key-for-key by the CPython equality test above.
        }
    }
}

/// Traces of random values in every int encoding the pickler uses (`K`, `M`, `J`, `LONG1`
/// of 1–9 bytes, negative), actions, stacks and strings, read back exactly: the reader's
/// entry decoders (entry layouts learned and reused, key by key, the generic path) must
/// agree on every value, read from bytes and from a file.
#[test]
fn random_trace_values_roundtrip() {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};
    fn value() -> impl Strategy<Value = u64> {
        prop_oneof![
            0u64..256,
            256u64..65_536,
            65_536u64..(1 << 31),
            (1u64 << 31)..(1 << 32),
            (1u64 << 32)..(1 << 48),
            (1u64 << 48)..(1 << 63),
            (1u64 << 63)..=u64::MAX,
            Just(0u64),
            Just(u64::MAX),
        ]
    }
    let entry =
        (0..Action::ALL.len(), value(), value(), value(), any::<Option<i64>>(), 0..3usize, 0..3usize, 0..2usize);
    let dir = common::scratch_dir("random-trace");
    let path = dir.join("t.pickle");
    let mut runner = TestRunner::new(Config {
        cases: 24,
        failure_persistence: None,
        rng_algorithm: proptest::test_runner::RngAlgorithm::ChaCha,
        ..Config::default()
    });
    // Few distinct entries, repeated: layouts recur as in real traces, with values that
    // change where they may.
    let strategy = (prop::collection::vec(entry, 1..40), prop::collection::vec(0..40usize, 1200..2600));
    let result = runner.run(&strategy, |(kinds, order)| {
        let mut s = Snapshot::default();
        let f = &mut s.frames;
        let file = f.intern_str("model.py");
        let fwd = f.intern_str("forward");
        let fr = f.intern_frame(Frame { filename: file, line: 3, name: fwd });
        let stacks = [None, Some(f.intern_stack(&[fr])), Some(f.intern_stack(&[]))];
        let ccs = [None, Some(f.intern_str("N/A")), Some(f.intern_str("fwd_0"))];
        let um = [None, Some(f.intern_str("step 1"))];
        let mut trace = Vec::new();
        for (i, &k) in order.iter().enumerate() {
            let (a, addr, size, stream, time, st, cc, u) = kinds[k % kinds.len()];
            // Values move from entry to entry inside their encoding's range.
            let jitter = (i as u64 % 3) * (addr > 4 && addr < u64::MAX - 4) as u64;
            let mut e = TraceEvent::new(Action::ALL[a], addr.wrapping_add(jitter), size);
            e.time_us = time.unwrap_or(NO_TIME);
            e.stack = stacks[st];
            let c = EntryContext { stream, pool_id: None, compile_context: ccs[cc], user_metadata: um[u] };
            e.context = intern_context(&mut s.contexts, c).unwrap();
            trace.push(e);
        }
        s.device_traces = vec![trace];
        let bytes = write_vec(&s);
        let back = read_from(&bytes[..]).map_err(|e| TestCaseError::fail(format!("read: {e}")))?;
        prop_assert_eq!(semantic_diff(&s, &back), None);
        std::fs::write(&path, &bytes).unwrap();
        let mapped = read_path(&path).map_err(|e| TestCaseError::fail(format!("read_path: {e}")))?;
        prop_assert_eq!(semantic_diff(&s, &mapped), None);
        Ok(())
    });
    let _ = std::fs::remove_dir_all(&dir);
    if let Err(e) = result {
        panic!("{e}");
    }
}
