//! What PyTorch 2.9–2.14 recordings leave out or add (issue 40), on recordings built from
//! real corpus traces with our writer: `skip_actions` (actions deleted from the trace),
//! snapshots of one `MemPool`, a snapshot taken without `_record_memory_history`,
//! `compile_context` / `user_metadata` strings, and pinned host memory. Every command
//! either gives the full file's answer or names what cannot be told; never another figure.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use fragscope_snapshot::pickle::write::write_path;
use fragscope_snapshot::{Action, Block, BlockState, Segment, SegmentType, Snapshot, TraceEvent};
use fragscope_testdata::real_file;
use serde_json::Value;

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fragscope")).args(args).output().unwrap()
}

/// stdout of a command that must succeed.
fn ok(args: &[&str]) -> String {
    let o = run(args);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{args:?}: {err}");
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A folder of this test's recordings, removed when dropped (even by a failing test: a
/// folder per test and run, 3 MB the largest, was left in the temporary folder).
fn scratch(tag: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(&format!("fragscope-recopts-{tag}-")).tempdir().unwrap()
}

fn read(p: &Path) -> Snapshot {
    fragscope_snapshot::read_path(p).unwrap()
}

/// `src` with every trace entry whose action is in `drop` deleted, written to `dir/name`.
fn without(src: &Snapshot, drop: &[Action], dir: &Path, name: &str) -> PathBuf {
    let mut s = src.clone();
    for t in &mut s.device_traces {
        t.retain(|e| !drop.contains(&e.action));
    }
    let p = dir.join(name);
    write_path(&s, &p).unwrap();
    p
}

/// `text` without the lines that name the file (its header, the table banner and the
/// widths the name sets) and without the recording notes: what must equal the full
/// file's. The tables are compared by their cells (widths follow the file name).
fn figures(text: &str) -> Vec<String> {
    text.lines()
        .filter(|l| {
            !(l.starts_with("fragscope summary of")
                || l.contains(".pickle")
                || l.starts_with("Recording")
                || l.starts_with("  device ")
                || l.trim_start().starts_with("|--")
                || l.trim_start().starts_with("|=="))
        })
        .map(|l| l.split('|').map(str::trim).collect::<Vec<_>>().join("|"))
        .filter(|l| !l.is_empty())
        .collect()
}

/// The files this test builds its recordings from: a one-device training step with segment
/// events, and a multi-stream offloading run.
const SOURCES: [&str; 2] = ["cs336-2.7b-trainstep-ctx128-fp32.pickle", "selectn-llama7b-offload-multistream.pickle"];

/// `skip_actions=["free_requested"]` and `["free_completed"]`: the missing entries are
/// restored, and summary, replay --verify, state and analyze give the full file's figures
/// (the recording notes apart), with the note naming the evidence.
#[test]
fn skipped_frees_give_the_full_files_answers() {
    for name in SOURCES {
        let Some(full) = real_file(name) else { return };
        let tmp = scratch("frees");
        let dir = tmp.path();
        let snap = read(&full);
        let full_s = full.to_str().unwrap();
        let summary = ok(&["summary", full_s]);
        let verify = ok(&["replay", "--verify", "--json", full_s]);
        let state = ok(&["state", "--json", full_s]);
        for (drop, tag) in [(Action::FreeRequested, "free_requested"), (Action::FreeCompleted, "free_completed")] {
            let p = without(&snap, &[drop], dir, &format!("no-{tag}.pickle"));
            let ps = p.to_str().unwrap();
            let s = ok(&["summary", ps]);
            assert!(
                s.contains(&format!("{tag} entries were not recorded (skip_actions)")),
                "{name} without {tag}:\n{s}"
            );
            assert!(s.contains(&format!("{tag} entries restored")), "{name} without {tag}:\n{s}");
            assert_eq!(figures(&s), figures(&summary), "{name} without {tag}: summary differs");
            // The replay matches as on the full file (free_completed restored right after its
            // request: this multi-stream run has no free record_stream deferred).
            let v = ok(&["replay", "--verify", "--json", ps]);
            let (a, b): (Value, Value) = (serde_json::from_str(&v).unwrap(), serde_json::from_str(&verify).unwrap());
            assert_eq!(a["files"][0]["devices"], b["files"][0]["devices"], "{name} without {tag}: verify differs");
            let st: Value = serde_json::from_str(&ok(&["state", "--json", ps])).unwrap();
            let full_st: Value = serde_json::from_str(&state).unwrap();
            assert_eq!(st["state"], full_st["state"], "{name} without {tag}");
            assert_eq!(st["holders"], full_st["holders"], "{name} without {tag}");
            assert!(st["recording"].as_array().is_some_and(|r| r.len() == 2), "{name}: {st}");
            let text = ok(&["replay", "--verify", ps]);
            assert!(text.contains("Recording: device 0:"), "{text}");
        }
    }
}

/// `skip_actions=["alloc"]`: a trace without allocs cannot be replayed; every command
/// says so by name and analyses the state alone (no trace figure, no role from the trace).
#[test]
fn skipped_allocs_are_named_and_the_trace_set_aside() {
    let Some(full) = real_file(SOURCES[0]) else { return };
    let tmp = scratch("alloc");
    let dir = tmp.path();
    let p = without(&read(&full), &[Action::Alloc], dir, "no-alloc.pickle");
    let ps = p.to_str().unwrap();
    let s = ok(&["summary", ps]);
    assert!(s.contains("alloc entries were not recorded (skip_actions)"), "{s}");
    assert!(s.contains("analysed as a state-only snapshot"), "{s}");
    assert!(!s.contains("Memory by role") && !s.contains("over the recorded window"), "{s}");
    // The final state's figures are the full file's.
    let full_s = ok(&["summary", full.to_str().unwrap()]);
    let device_table = |t: &str| {
        figures(t)
            .into_iter()
            .take_while(|l| !l.starts_with("|memory_summary()") && !l.starts_with("Fragmentation"))
            .collect::<Vec<_>>()
    };
    assert_eq!(device_table(&s), device_table(&full_s));
    let v = ok(&["replay", "--verify", ps]);
    assert!(v.contains("no allocation trace to replay") && v.contains("alloc entries were not recorded"), "{v}");
    let st = run(&["state", ps]);
    assert_eq!(st.status.code(), Some(2));
    let err = String::from_utf8_lossy(&st.stderr);
    assert!(err.contains("no device has a trace") && err.contains("alloc entries were not recorded"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    let a = ok(&["analyze", ps]);
    assert!(a.starts_with("Recording: device 0: alloc entries were not recorded"), "{a}");
    // analyze --json carries the same lines as the text (`recording`, as summary's notes).
    let j: Value = serde_json::from_str(&ok(&["analyze", "--json", ps])).unwrap();
    let lines: Vec<&str> = j["files"][0]["recording"].as_array().unwrap().iter().map(|l| l.as_str().unwrap()).collect();
    let text: Vec<&str> = a.lines().filter_map(|l| l.strip_prefix("Recording: ")).collect();
    assert!(!lines.is_empty() && lines == text, "{lines:?} vs {text:?}");
    // A full recording has nothing to say: no key.
    let j: Value = serde_json::from_str(&ok(&["analyze", "--json", full.to_str().unwrap()])).unwrap();
    assert!(j["files"][0].get("recording").is_none());
}

/// Segment events skipped: with no proof in the file (every alloc inside a segment that
/// survives) the notes say both readings; the allocated figures stay the full file's.
/// With proof (an alloc in memory released before the dump) the recorded-window table,
/// whose reserved rows would be wrong, is left out.
#[test]
fn skipped_segment_events_are_said_and_reserved_figures_not_invented() {
    let Some(full) = real_file(SOURCES[0]) else { return };
    let tmp = scratch("seg");
    let dir = tmp.path();
    let segs = [Action::SegmentAlloc, Action::SegmentFree, Action::SegmentMap, Action::SegmentUnmap];
    let mut snap = read(&full);
    let p = without(&snap, &segs, dir, "no-seg.pickle");
    let s = ok(&["summary", p.to_str().unwrap()]);
    assert!(s.contains("the trace allocates but holds no segment event"), "{s}");
    let v = ok(&["replay", "--verify", p.to_str().unwrap()]);
    assert!(v.contains("either every segment predates the recording"), "{v}");
    // Drop the final segment of the first alloc: that memory was released (its
    // segment_free skipped with the rest).
    let first = snap.device_traces[0].iter().find(|e| e.action == Action::Alloc).unwrap().addr;
    snap.segments.retain(|g| !(g.address <= first && first < g.address + g.total_size));
    let p = without(&snap, &segs, dir, "no-seg-proven.pickle");
    let out: Value = serde_json::from_str(&ok(&["summary", "--json", p.to_str().unwrap()])).unwrap();
    let f = &out["files"][0];
    let notes = f["notes"]["recording"].as_array().unwrap();
    assert!(notes[0].as_str().unwrap().contains("segment_alloc/segment_free entries were not recorded"), "{notes:?}");
    assert!(f["devices"][0].get("memory_table").is_none(), "no recorded-window table without segment events");
}

/// A snapshot taken without `_record_memory_history` (blocks without frames, no trace): one
/// line says so and how to switch it on; a `MemPool` snapshot says it holds one pool.
#[test]
fn history_never_switched_on_and_one_pool() {
    let Some(src) = real_file("verl-megatron-vllm-qwen2-private-pools-stateonly.pickle") else { return };
    let tmp = scratch("state");
    let dir = tmp.path();
    let mut snap = read(&src);
    snap.device_traces.iter_mut().for_each(Vec::clear);
    for g in &mut snap.segments {
        g.stack = None;
        for b in &mut g.blocks {
            b.stack = None;
        }
    }
    let off = dir.join("history-off.pickle");
    write_path(&snap, &off).unwrap();
    let s = ok(&["summary", off.to_str().unwrap()]);
    let hint: Vec<&str> = s.lines().filter(|l| l.contains("_record_memory_history` was never switched on")).collect();
    assert_eq!(hint.len(), 1, "{s}");
    assert!(hint[0].contains("torch.cuda.memory._record_memory_history("), "{s}");
    let st = run(&["state", off.to_str().unwrap()]);
    assert_eq!(st.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&st.stderr).contains("never switched on"));
    // One pool: the segments of pool (0, 1) alone, as MemPool.snapshot() writes them.
    snap.segments.retain(|g| g.segment_pool_id == Some((0, 1)));
    assert!(!snap.segments.is_empty());
    let pool = dir.join("one-pool.pickle");
    write_path(&snap, &pool).unwrap();
    let s = ok(&["summary", pool.to_str().unwrap()]);
    assert!(s.contains("one memory pool only: every segment is pool (0, 1)"), "{s}");
    // Pickled as the list memory_snapshot(mempool_id=...) returns: said to be one, not 1.13.
    snap.format = fragscope_snapshot::SourceFormat::SegmentList;
    let list = dir.join("one-pool-list.pickle");
    write_path(&snap, &list).unwrap();
    let s = ok(&["summary", list.to_str().unwrap()]);
    assert!(s.contains("a list of segments with PyTorch 2.x keys: what torch.cuda.memory_snapshot()"), "{s}");
    assert!(s.contains("one memory pool only"), "{s}");
    // The real file holds three pools: no such note.
    assert!(!ok(&["summary", src.to_str().unwrap()]).contains("one memory pool only"));
}

/// `compile_context` and `user_metadata`: `state --by` groups the live bytes by them (the
/// groups sum to the holders' total, the same as by site), and `analyze` lists them at the
/// peaks as it lists record_function scopes.
#[test]
fn state_and_analyze_group_by_compile_context_and_user_metadata() {
    let Some(src) = real_file(SOURCES[0]) else { return };
    let tmp = scratch("ctx");
    let dir = tmp.path();
    let mut snap = read(&src);
    let region = snap.frames.intern_str("Torch-Compiled Region: 0/0");
    let tag = snap.frames.intern_str("{\"phase\": \"optimizer\"}");
    let mut trace = std::mem::take(&mut snap.device_traces[0]);
    let (mut n_region, mut n_tag) = (0, 0);
    for (i, e) in trace.iter_mut().enumerate().filter(|(_, e)| e.action == Action::Alloc) {
        let mut c = snap.context(e);
        if i % 2 == 0 {
            c.compile_context = Some(region);
            n_region += 1;
        } else {
            c.user_metadata = Some(tag);
            n_tag += 1;
        }
        e.context = snap.intern_context(c).unwrap();
    }
    assert!(n_region > 0 && n_tag > 0);
    snap.device_traces[0] = trace;
    let p = dir.join("ctx.pickle");
    write_path(&snap, &p).unwrap();
    let ps = p.to_str().unwrap();
    let site: Value = serde_json::from_str(&ok(&["state", "--json", "--top", "1000", ps])).unwrap();
    for by in ["compile_context", "user_metadata"] {
        let v: Value = serde_json::from_str(&ok(&["state", "--json", "--top", "1000", "--by", by, ps])).unwrap();
        assert_eq!(v["holders_by"], by);
        let rows = v["holders"].as_array().unwrap();
        let sum: u64 = rows.iter().map(|h| h["bytes"].as_u64().unwrap()).sum();
        assert_eq!(sum, site["holders_total_bytes"].as_u64().unwrap(), "{by}: groups sum to the live bytes");
        let keys: Vec<&str> = rows.iter().map(|h| h["key"].as_str().unwrap()).collect();
        let set = if by == "compile_context" { "Torch-Compiled Region: 0/0" } else { "{\"phase\": \"optimizer\"}" };
        assert!(keys.contains(&set) && keys.contains(&"(allocated before the trace)"), "{by}: {keys:?}");
    }
    let text = ok(&["state", "--by", "user_metadata", ps]);
    assert!(text.contains("(by user_metadata)"), "{text}");
    let a = ok(&["analyze", ps]);
    assert!(a.contains("By compile_context (the torch.compile region of the allocation):"), "{a}");
    assert!(a.contains("Torch-Compiled Region: 0/0"), "{a}");
    assert!(a.contains("By user_metadata"), "{a}");
    // The real file's placeholders ("N/A", "") list nothing.
    let plain = ok(&["analyze", src.to_str().unwrap()]);
    assert!(!plain.contains("By compile_context") && !plain.contains("By user_metadata"));
    let bad = run(&["state", "--by", "metadata", ps]);
    assert_eq!(bad.status.code(), Some(2));
    // export: the allocations table carries both strings, as recorded, per alloc entry.
    let out = dir.join("export");
    ok(&["export", "-o", out.to_str().unwrap(), ps]);
    let (mut with_region, mut with_tag, mut rows_in_trace) = (0, 0, 0);
    for row in parquet_rows(&out.join("allocations.parquet")) {
        let get = |k: &str| row.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()).unwrap();
        if get("alloc_idx") != "null" {
            rows_in_trace += 1;
        }
        with_region += (get("compile_context") == "\"Torch-Compiled Region: 0/0\"") as usize;
        with_tag += (get("user_metadata").contains("phase")) as usize;
    }
    assert_eq!((with_region, with_tag), (n_region, n_tag), "one row per alloc entry, its strings as recorded");
    assert_eq!(rows_in_trace, n_region + n_tag);
}

/// The rows of a Parquet file as `(column, value)` pairs, values as the reader prints them.
fn parquet_rows(p: &Path) -> Vec<Vec<(String, String)>> {
    use parquet::file::reader::{FileReader, SerializedFileReader};
    let r = SerializedFileReader::new(std::fs::File::open(p).unwrap()).unwrap();
    r.get_row_iter(None)
        .unwrap()
        .map(|row| row.unwrap().get_column_iter().map(|(n, f)| (n.clone(), f.to_string())).collect())
        .collect()
}

fn host_block_segment(address: u64, size: u64, state: BlockState) -> Segment {
    let block = Block { address, size, requested_size: Some(size), state, stack: None, history: None };
    Segment {
        device: -1,
        address,
        total_size: size,
        allocated_size: if state == BlockState::ActiveAllocated { size } else { 0 },
        active_size: if state.is_active() { size } else { 0 },
        requested_size: Some(size),
        stream: 0,
        segment_type: SegmentType::Small,
        segment_pool_id: Some((0, 0)),
        is_expandable: Some(false),
        stack: None,
        blocks: vec![block],
    }
}

/// Pinned host memory (`host_segments`, `host_traces`): read, summarised in a section of
/// its own, and never added to a device's figures.
#[test]
fn pinned_host_memory_is_shown_apart() {
    let Some(src) = real_file(SOURCES[0]) else { return };
    let tmp = scratch("host");
    let dir = tmp.path();
    let mut snap = read(&src);
    let mib = 1u64 << 20;
    snap.host_segments = Some(vec![
        host_block_segment(0x7f00_0000_0000, 64 * mib, BlockState::ActiveAllocated),
        host_block_segment(0x7f00_1000_0000, 16 * mib, BlockState::Inactive),
    ]);
    let host_ev = |a: Action, addr: u64, size: u64| TraceEvent::new(a, addr, size);
    snap.host_traces = Some(vec![
        host_ev(Action::SegmentAlloc, 0x7f00_0000_0000, 64 * mib),
        host_ev(Action::Alloc, 0x7f00_0000_0000, 64 * mib),
        host_ev(Action::SegmentAlloc, 0x7f00_1000_0000, 16 * mib),
        host_ev(Action::Alloc, 0x7f00_1000_0000, 16 * mib),
        host_ev(Action::FreeRequested, 0x7f00_1000_0000, 16 * mib),
        host_ev(Action::FreeCompleted, 0x7f00_1000_0000, 16 * mib),
    ]);
    let p = dir.join("host.pickle");
    write_path(&snap, &p).unwrap();
    // The reader reads both keys back.
    let back = read(&p);
    assert_eq!(back.host_segments.as_ref().map(Vec::len), Some(2));
    assert_eq!(back.host_traces.as_ref().map(Vec::len), Some(6));
    let s = ok(&["summary", p.to_str().unwrap()]);
    assert!(s.contains("Pinned host memory (host_segments; CPU RAM, not in any device figure above):"), "{s}");
    assert!(s.contains("Pinned             80.00 MiB in 2 host blocks"), "{s}");
    assert!(s.contains("In use             64.00 MiB"), "{s}");
    assert!(s.contains("Peak requested     80.00 MiB"), "{s}");
    let full = ok(&["summary", src.to_str().unwrap()]);
    let device_part =
        |t: &str| figures(t).into_iter().take_while(|l| !l.starts_with("Pinned host")).collect::<Vec<_>>();
    let without_host =
        |t: &str| device_part(t).into_iter().take_while(|l| !l.starts_with("Allocator settings")).collect::<Vec<_>>();
    assert_eq!(without_host(&s), without_host(&full), "device figures unchanged by host memory");
    let j: Value = serde_json::from_str(&ok(&["summary", "--json", p.to_str().unwrap()])).unwrap();
    let h = &j["files"][0]["host"];
    assert_eq!(h["reserved_bytes"], 80 * mib);
    assert_eq!(h["allocated_bytes"], 64 * mib);
    assert_eq!(h["cached_free_bytes"], 16 * mib);
    assert_eq!(j["files"][0]["devices"].as_array().unwrap().len(), 1, "no device -1");
    let st = ok(&["state", p.to_str().unwrap()]);
    assert!(st.contains("Pinned host memory at the end of the recording"), "{st}");
    assert!(st.contains("80.00 MiB pinned, 64.00 MiB in use, 16.00 MiB cached free"), "{st}");
    // export: host memory in tables of its own, never in the device tables.
    let out = dir.join("export");
    ok(&["export", "-o", out.to_str().unwrap(), p.to_str().unwrap()]);
    let host_blocks = parquet_rows(&out.join("host_blocks.parquet"));
    let cell = |row: &Vec<(String, String)>, k: &str| row.iter().find(|(n, _)| n == k).unwrap().1.clone();
    let sizes: Vec<u64> = host_blocks.iter().map(|r| cell(r, "size").parse().unwrap()).collect();
    assert_eq!(sizes, [64 * mib, 16 * mib]);
    assert_eq!(cell(&host_blocks[0], "state"), "\"active_allocated\"");
    let host_events = parquet_rows(&out.join("host_events.parquet"));
    let actions: Vec<String> = host_events.iter().map(|r| cell(r, "action")).collect();
    assert_eq!(actions.len(), 6);
    assert_eq!((actions[0].as_str(), actions[5].as_str()), ("\"segment_alloc\"", "\"free_completed\""));
    let full_out = dir.join("export-full");
    ok(&["export", "-o", full_out.to_str().unwrap(), src.to_str().unwrap()]);
    for table in ["segments", "blocks", "trace_events"] {
        let n = |d: &Path| parquet_rows(&d.join(format!("{table}.parquet"))).len();
        assert_eq!(n(&out), n(&full_out), "{table}: no host row among the device rows");
    }
    assert!(parquet_rows(&full_out.join("host_blocks.parquet")).is_empty());
    // A file without the keys: no section, no key.
    let j: Value = serde_json::from_str(&ok(&["summary", "--json", src.to_str().unwrap()])).unwrap();
    assert!(j["files"][0].get("host").is_none());
}

/// Warm recordings (the trace allocates with no segment event, and the replay from the
/// recorded state needs no cudaMalloc and matches every decision): said to have started
/// warm, not suspected of `skip_actions`; `analyze --json` carries the same line.
#[test]
fn warm_recordings_are_said_to_start_warm() {
    for name in ["cs336-magma27-mostly-cached.pickle", "pytorchblog-resnet50-train-cppframes.pickle"] {
        let Some(p) = real_file(name) else { return };
        let ps = p.to_str().unwrap();
        let v: Value = serde_json::from_str(&ok(&["replay", "--verify", "--json", ps])).unwrap();
        let d = &v["files"][0]["devices"][0];
        assert_eq!(d["segment_events"], 0, "{name}");
        assert_eq!(d["allocs_matched"], d["allocs"], "{name}: exact");
        let s = ok(&["summary", ps]);
        assert!(s.contains("device 0: started warm: no cudaMalloc was needed"), "{name}:\n{s}");
        assert!(!s.contains("skip_actions left segment_alloc"), "{name}:\n{s}");
        let a: Value = serde_json::from_str(&ok(&["analyze", "--json", ps])).unwrap();
        let lines = a["files"][0]["recording"].as_array().unwrap();
        assert!(lines.iter().any(|l| l.as_str().unwrap().contains("started warm")), "{name}: {lines:?}");
    }
}
