//! Hostile and broken inputs: each is refused with a one-line message that says what is
//! wrong (asserted by fragment), and nothing panics, overflows the stack, allocates
//! gigabytes, or executes anything.

use crate::common;

use fragscope_snapshot::*;

/// Reads bytes; must fail with a one-line message containing `want`.
#[track_caller]
fn refused(bytes: &[u8], want: &str) -> String {
    let e = match read_from(bytes) {
        Ok(_) => panic!("accepted; expected an error containing {want:?}"),
        Err(e) => e.to_string(),
    };
    assert!(e.contains(want), "message {e:?} lacks {want:?}");
    assert!(!e.contains('\n'), "message is one line: {e:?}");
    e
}

fn p4(body: &[u8]) -> Vec<u8> {
    let mut v = b"\x80\x04".to_vec();
    v.extend_from_slice(body);
    v
}

/// SHORT_BINUNICODE.
fn s(x: &str) -> Vec<u8> {
    let mut v = vec![0x8c, x.len() as u8];
    v.extend_from_slice(x.as_bytes());
    v
}

#[test]
fn empty_file() {
    refused(b"", "the file is empty");
    // An empty gzip member holds no data either.
    refused(&common::gzip(b""), "gzip file holds no data");
}

#[test]
fn random_bytes() {
    // A fixed xorshift stream: reproducible "random" files of several sizes.
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for len in [1usize, 2, 7, 100, 4096, 100_000] {
        let mut b: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        b[0] = 0x42; // not a pickle, gzip or JSON start
                     // A few random bytes can all be printable (then they are shown as text); longer
                     // runs are not text.
        let e = refused(
            &b,
            if len < 7 { "unrecognised format (starts with " } else { "unrecognised format (starts with bytes 42" },
        );
        assert!(e.contains("expected a pickle from torch.cuda.memory._dump_snapshot"));
        // The same garbage behind a pickle header: an error, never a panic.
        b[0] = 0x80;
        let _ = read_from(&b[..]).map(|_| ()).unwrap_err();
    }
    // A zip header is read as a torch.save archive now; a broken one is refused as such.
    refused(b"PK\x03\x04", "unreadable zip archive");
}

/// A text file is named by its first line, at once (a log starting with `[` is not read
/// whole as JSON), and one that mentions an OOM points to `fragscope oom`.
#[test]
fn text_files_are_named_as_text() {
    let log = "[2026-11-27 08:15:37] step 7 | loss 0.52\n".repeat(1000);
    let e =
        refused(log.as_bytes(), "unrecognised format (starts with text: '[2026-11-27 08:15:37] step 7 | loss 0.52')");
    assert!(!e.contains("fragscope oom"), "{e}");
    let tb = "Traceback (most recent call last):\n  File \"train.py\", line 3\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB";
    let e = refused(tb.as_bytes(), "starts with text: 'Traceback (most recent call last):'");
    assert!(e.ends_with("`fragscope oom FILE` explains an OOM message"), "{e}");
    let long = format!("{}\n", "x".repeat(200));
    let e = refused(long.as_bytes(), "starts with text: 'xxx");
    assert!(e.contains("x…')"), "a long first line is cut: {e}");
    // A JSON list is still read as JSON (HTA's memory timeline export is a list of lists).
    refused(b"[[-1, 1, 37888, 7], [-1, 1, 512, 7]]", "JSON without 'traceEvents'");
    refused(b"[1.5e3, 2]", "JSON without 'traceEvents'");
    refused(b"[rank0]: Traceback", "starts with text: '[rank0]: Traceback'");
    // A JSON object that is not a trace still reads as JSON.
    refused(b"{\"a\": 1}", "JSON without 'traceEvents'");
}

/// Every 997th cut of a small real pickle ends in a Truncated error at exactly the cut.
#[test]
fn truncated_real_pickles() {
    let Some(p) = common::real_file("ddpm-unet-tiny-stateonly-windows.pickle") else { return };
    let full = std::fs::read(&p).unwrap();
    let mut cuts = 0;
    for cut in (1..full.len()).step_by(997) {
        let e = refused(&full[..cut], "truncated: the data ends at byte");
        assert!(e.contains(&format!("at byte {cut} ")), "cut {cut}: {e}");
        cuts += 1;
    }
    assert!(cuts >= 12);
    // Also the last bytes (STOP missing) and every cut of a bigger file, coarsely.
    refused(&full[..full.len() - 1], "truncated");
    let Some(p) = common::real_file("sketchkv-llama-kvquant-stateonly.pickle") else { return };
    let full = std::fs::read(&p).unwrap();
    for cut in (1..full.len()).step_by(997) {
        refused(&full[..cut], &format!("truncated: the data ends at byte {cut} "));
    }
}

#[test]
fn gzip_of_truncated_file_and_truncated_gzip() {
    let Some(p) = common::real_file("selectn-gpt2-generate-stateonly.pickle") else { return };
    let full = std::fs::read(&p).unwrap();
    // A complete gzip of a truncated pickle: the pickle is truncated.
    refused(&common::gzip(&full[..5000]), "truncated: the data ends at byte 5000 ");
    // The whole pickle, gzip'd and then cut: the compressed stream ends early.
    let gz = common::gzip(&full);
    assert!(read_from(&gz[..]).is_ok());
    for cut in (11..gz.len()).step_by(331) {
        let e = read_from(&gz[..cut]).map(|_| ()).unwrap_err().to_string();
        assert!(e.contains("truncated") || e.contains("compressed stream") || e.contains("gzip"), "cut {cut}: {e}");
    }
    // Damaged deflate data.
    let mut bad = gz.clone();
    for b in &mut bad[20..40] {
        *b ^= 0x55;
    }
    let _ = read_from(&bad[..]).map(|_| ()).unwrap_err();
}

#[test]
fn json_that_is_not_a_trace() {
    refused(
        br#"{"actions": [0, 1, 0], "elements_size": [512]}"#,
        "JSON without 'traceEvents': not a torch.profiler trace",
    );
    refused(br#"  {"traceEvents": [{"name": "aten::add", "ph": "X", "ts": 3}]}"#, "profile_memory=True was not set");
    refused(b"{\"traceEvents\": [1, ", "invalid JSON");
}

#[test]
fn pickles_of_the_wrong_shape() {
    // [1, 2, 3]
    refused(&p4(b"]\x94(K\x01K\x02K\x03e."), "segments[0] is a int where a dict was expected");
    // {'a': 1}
    let mut b = b"}\x94".to_vec();
    b.extend(s("a"));
    b.extend(b"\x94K\x01s.");
    refused(&p4(&b), "a pickled dict without a 'segments' key (keys: a), not a memory snapshot");
    // {'segments': [{'address': 0, 'total_size': 0}]}
    let mut b = b"}\x94".to_vec();
    b.extend(s("segments"));
    b.extend(b"\x94]\x94}\x94(");
    b.extend(s("address"));
    b.extend(b"K\x00");
    b.extend(s("total_size"));
    b.extend(b"K\x00uas.");
    refused(&p4(&b), "segments[0] lacks 'blocks': not a memory snapshot segment");
    // 42, None, "x"
    refused(&p4(b"K*."), "a pickled int, not a memory snapshot");
    refused(&p4(b"N."), "a pickled None, not a memory snapshot");
    // STOP on an empty stack, unknown opcode.
    refused(&p4(b"."), "corrupt pickle at byte 2: stack underflow");
    refused(&p4(b"N\xff."), "corrupt pickle at byte 3: invalid pickle opcode 0xff");
    // TUPLE2 pops below an open MARK, then TUPLE closes that MARK: found by the fuzzer
    // (it used to panic in Vec::split_off).
    refused(&p4(b"NN(\x86t."), "corrupt pickle at byte 6: stack underflow below a MARK");
    refused(&p4(b"NN(\x86e."), "stack underflow below a MARK");
}

/// Every code-running opcode is refused by name and byte offset, before anything happens.
#[test]
fn code_opcodes_are_refused_with_offset() {
    // A real os.system payload, protocol 0 body behind a protocol 2 header, as an attacker
    // would write it: GLOBAL 'os system', MARK, a command, TUPLE, REDUCE.
    let marker = std::env::temp_dir().join(format!("fragscope-pwned-{}", std::process::id()));
    let _ = std::fs::remove_file(&marker);
    let cmd = format!("touch {}", marker.display());
    let mut bytes = b"\x80\x02cos\nsystem\n(X".to_vec();
    bytes.extend((cmd.len() as u32).to_le_bytes());
    bytes.extend(cmd.as_bytes());
    bytes.extend(b"tR.");
    assert_eq!(refused(&bytes, "GLOBAL"), "pickle opcode GLOBAL at byte 2 would import code; refusing");
    assert!(!marker.exists(), "nothing ran");

    let n = s("os").len() + 1; // + MEMOIZE
    let cases: Vec<(Vec<u8>, &str, u64, &str)> = vec![
        (p4(b"cos\nsystem\n"), "GLOBAL", 2, "import code"),
        (
            p4(&[s("os"), b"\x94".to_vec(), s("system"), b"\x94\x93".to_vec()].concat()),
            "STACK_GLOBAL",
            (2 + n + s("system").len() + 1) as u64,
            "import code",
        ),
        (p4(b"N)R"), "REDUCE", 4, "call code"),
        (p4(b"}\x94}b"), "BUILD", 5, "call code (__setstate__)"),
        (p4(b"(ios\nsystem\n"), "INST", 3, "import and call code"),
        (p4(b"(N)o"), "OBJ", 5, "call code"),
        (p4(b"N)\x81"), "NEWOBJ", 4, "call code"),
        (p4(b"N)}\x92"), "NEWOBJ_EX", 5, "call code"),
        (p4(b"\x82\x01"), "EXT1", 2, "import code from the extension registry"),
        (p4(b"N\x83\x01\x00"), "EXT2", 3, "import code from the extension registry"),
        (p4(b"NN\x84\x01\x00\x00\x00"), "EXT4", 4, "import code from the extension registry"),
        (p4(b"Pid\n"), "PERSID", 2, "call a persistent-id loader"),
        (p4(b"KAQ"), "BINPERSID", 4, "call a persistent-id loader"),
        (b"\x80\x05N\x97".to_vec(), "NEXT_BUFFER", 3, "read an out-of-band buffer"),
        (b"\x80\x05N\x98".to_vec(), "READONLY_BUFFER", 3, "read an out-of-band buffer"),
    ];
    for (bytes, op, off, what) in cases {
        let e = refused(&bytes, op);
        assert_eq!(e, format!("pickle opcode {op} at byte {off} would {what}; refusing"));
    }
}

/// A minimal 2.x snapshot as CPython writes it with each protocol.
#[test]
fn protocols_2_to_5_are_accepted() {
    let expr = "{'segments': [{'device': 0, 'address': 2**40, 'total_size': 2097152, 'allocated_size': 512, \
        'active_size': 512, 'stream': 0, 'segment_type': 'small', 'segment_pool_id': (0, 0), 'is_expandable': False, \
        'frames': [], 'blocks': [{'address': 2**40, 'size': 512, 'requested_size': 500, 'state': 'active_allocated', \
        'frames': [{'filename': 'a.py', 'line': 3, 'name': 'f'}]}, {'address': 2**40 + 512, 'size': 2096640, \
        'requested_size': 0, 'state': 'inactive', 'frames': []}]}], 'device_traces': [[{'action': 'alloc', \
        'addr': 2**40, 'size': 500, 'stream': 0, 'time_us': 1700000000000000, 'frames': [{'filename': 'a.py', \
        'line': 3, 'name': 'f'}]}]], 'allocator_settings': {'max_split_size': 2**64 - 1, \
        'garbage_collection_threshold': 0.5}}";
    let Some(py) = common::python3() else { return };
    let mut models = Vec::new();
    for proto in 2..=5u8 {
        let bytes = common::python_pickle(py, expr, proto);
        assert_eq!(bytes[..2], [0x80, proto]);
        let snap = read_from(&bytes[..]).unwrap_or_else(|e| panic!("protocol {proto}: {e}"));
        assert_eq!(snap.segments[0].blocks.len(), 2);
        assert_eq!(snap.trace(0)[0].addr, 1 << 40);
        let st = snap.recorded_settings().unwrap();
        assert_eq!(st.max_split_size, None, "2^64−1 is unlimited");
        assert_eq!(st.garbage_collection_threshold, Some(0.5));
        models.push(snap);
    }
    for m in &models[1..] {
        assert_eq!(semantic_diff(&models[0], m), None);
    }
    // Protocols 0 and 1 are not what PyTorch writes: refused by name.
    let p0 = common::python_pickle(py, "{'segments': []}", 0);
    refused(&p0, "unrecognised format");
    refused(b"\x80\x06}.", "pickle protocol 6 at byte 0 is not supported");
}

/// The C++ writer's form: protocol 2, BINPUT memo, no FRAME, and a 9-byte LONG1 for
/// `max_split_size` = 2^64−1 (#115234). Hand-made, so it runs without python3.
#[test]
fn protocol_2_binput_and_long1_max_split_size() {
    let mut b = b"\x80\x02}q\x00(".to_vec();
    b.extend(b"X\x08\x00\x00\x00segmentsq\x01]q\x02");
    b.extend(b"X\x0d\x00\x00\x00device_tracesq\x03]q\x04]q\x05a");
    b.extend(b"X\x12\x00\x00\x00allocator_settingsq\x06}q\x07(");
    b.extend(b"X\x0e\x00\x00\x00max_split_sizeq\x08\x8a\x09\xff\xff\xff\xff\xff\xff\xff\xff\x00");
    b.extend(b"X\x13\x00\x00\x00expandable_segmentsq\x09\x89");
    b.extend(b"uu.");
    let snap = read_from(&b[..]).unwrap();
    let st = snap.recorded_settings().unwrap();
    assert_eq!(st.max_split_size, None);
    assert_eq!(st.expandable_segments, Some(false));
    assert_eq!(snap.allocator_settings.unwrap().get("max_split_size").unwrap().as_u64(), Some(u64::MAX));
    assert_eq!(snap.device_traces.len(), 1);
}

/// A million nested lists: a clean error, no stack overflow (the VM is iterative and
/// the verbatim-value conversion is depth-limited).
#[test]
fn deeply_nested_lists() {
    const N: usize = 1_000_000;
    // As the top-level object: [[[[...]]]].
    let mut b = b"\x80\x04".to_vec();
    b.extend(std::iter::repeat_n(b"](".as_slice(), N).flatten());
    b.extend(std::iter::repeat_n(b'e', N - 1));
    b.extend(b"e.");
    refused(&b, "segments[0] is a list where a dict was expected");
    // As allocator_settings, which is kept verbatim (recursive conversion).
    let mut b = b"\x80\x04}(".to_vec();
    b.extend(s("segments"));
    b.extend(b"]");
    b.extend(s("allocator_settings"));
    b.extend(std::iter::repeat_n(b"](".as_slice(), N).flatten());
    b.extend(std::iter::repeat_n(b'e', N));
    b.extend(b"u.");
    refused(&b, "nesting deeper than 256 levels: not a memory snapshot");
    // A list that contains itself (memo reference to an unfinished list).
    let mut b = b"\x80\x04}(".to_vec();
    b.extend(s("segments"));
    b.extend(b"]");
    b.extend(s("allocator_settings"));
    b.extend(b"]\x94h\x00au.");
    refused(&b, "nesting deeper than 256 levels");
}

/// Length fields and memo indices from the stream never size an allocation by themselves.
#[test]
fn memo_and_length_bombs() {
    // LONG_BINPUT 0xFFFFFFF0: would be a 64 GB memo if trusted.
    refused(&p4(b"Nr\xf0\xff\xff\xff."), "memo index 4294967280 at byte 3: past any index a pickler writes");
    // LONG_BINGET of an index never defined.
    refused(&p4(b"j\xf0\xff\xff\xff."), "memo key 4294967280 is not defined");
    // A 2^62-byte string, bytes object and 4 GB string and bytes: refused by their length,
    // before any byte behind them is read (limits.rs has them with the bytes behind).
    let long = "longer than any memory snapshot holds (limit 64 MiB)";
    refused(&p4(b"\x8d\x00\x00\x00\x00\x00\x00\x00\x40abc"), "a string of 4 EiB at byte 2, ");
    refused(&p4(b"\x8e\x00\x00\x00\x00\x00\x00\x00\x40abc"), long);
    refused(&p4(b"X\xff\xff\xff\xffabc"), "a string of 4.0 GiB at byte 2, ");
    refused(&p4(b"B\xff\xff\xff\xffabc"), long);
    // Lengths within the limit with only a few bytes behind them.
    refused(&p4(b"X\x00\x00\x00\x01abc"), "truncated: the data ends at byte 10 ");
    refused(&p4(b"\x8e\x00\x00\x10\x00\x00\x00\x00\x00abc"), "truncated: the data ends at byte 14 ");
    // A 4 GB integer.
    refused(&p4(b"\x8b\xff\xff\xff\xff\x00"), "a 4294967295-byte integer at byte 2 is not supported");
    // A FRAME claiming 2^64−1 bytes is only a hint.
    refused(&p4(b"\x95\xff\xff\xff\xff\xff\xff\xff\xffN."), "a pickled None");
}

/// Trace entries in APPENDS batches, as `_dump_snapshot` writes them, with the first
/// entry's keys written out as fresh strings, one of them longer than the decoder's
/// look-ahead window, FRAME opcodes between keys and values, and every int width: the
/// fast entry decoder must give what the generic path gives, and never read past a window.
#[test]
fn trace_batches_with_long_keys_and_frames() {
    let long_key = "an_unknown_key_that_is_longer_than_any_window";
    let mut body = b"}\x94(".to_vec();
    body.extend(s("segments"));
    body.extend(b"\x94]\x94");
    body.extend(s("device_traces"));
    body.extend(b"\x94]\x94(]\x94(");
    let mut memo = 6u32; // top dict, 'segments', [], 'device_traces', outer and inner list
                         // The long key first, so that it is still a fresh string when the decoder meets it
                         // (it holds at most four fresh strings per entry).
    let keys = [long_key, "action", "addr", "size", "stream", "time_us"];
    let mut key_memo = [0u32; 6];
    let mut alloc_memo = 0u8;
    let n = 2500;
    for i in 0..n {
        body.extend(b"}\x94(");
        memo += 1;
        // The long key only in the first entries: the rest take the fast path.
        for (k, key) in keys.iter().enumerate().skip(if i < 3 { 0 } else { 1 }) {
            if i == 0 {
                body.extend(s(key));
                body.push(0x94);
                key_memo[k] = memo;
                memo += 1;
            } else {
                body.push(b'j');
                body.extend(key_memo[k].to_le_bytes());
            }
            if i % 7 == 3 {
                // FRAME between a key and its value (length is only a hint).
                body.push(0x95);
                body.extend(0u64.to_le_bytes());
            }
            match k {
                0 => body.extend(b"K\x01"),
                1 => {
                    if i == 0 {
                        body.extend(s("alloc"));
                        body.push(0x94);
                        alloc_memo = memo as u8;
                        memo += 1;
                    } else {
                        body.extend([b'h', alloc_memo]);
                    }
                }
                2 => {
                    body.extend(b"\x8a\x06");
                    body.extend(&(0x7f00_0000_0000u64 + 512 * i as u64).to_le_bytes()[..6]);
                }
                3 => match i % 4 {
                    0 => body.extend([b'K', (i % 256) as u8]),
                    1 => body.extend([b'M', 1, 2]),
                    2 => body.extend([b'J', 0, 0, 0x10, 0]),
                    _ => body.extend(b"\x8a\x05\x00\x00\x00\x00\x01"),
                },
                4 => body.extend(b"K\x00"),
                _ => {
                    // A negative LONG1 and a plain int, alternately.
                    if i % 2 == 0 {
                        body.extend(b"\x8a\x02\x00\xff");
                    } else {
                        body.extend(b"J\x10\x27\x00\x00");
                    }
                }
            }
        }
        body.push(b'u');
        if i % 1000 == 999 {
            body.extend(b"e(");
        }
    }
    body.extend(b"eeu.");
    let snap = read_from(&p4(&body)[..]).expect("a valid trace");
    let t = &snap.device_traces[0];
    assert_eq!(t.len(), n);
    assert_eq!(t[5].addr, 0x7f00_0000_0000 + 512 * 5);
    assert_eq!((t[0].size, t[1].size, t[2].size, t[3].size), (0, 0x0201, 0x10_0000, 1 << 32));
    assert_eq!((t[2].time_us, t[3].time_us), (-256, 10_000));
    assert_eq!(snap.notes.unknown_keys.get(&format!("trace.{long_key}")), Some(&3));
}
