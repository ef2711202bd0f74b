//! How a file was recorded ([`fragscope_snapshot::recording`]) on the real snapshots and on
//! files CPython writes: no real recording is taken for one that skipped actions (the
//! findings rest on evidence, never on counts alone), the actions deleted from a real
//! trace are found and the frees restored exactly, the snapshots taken without history
//! are named, and `host_segments` / `host_traces` are read.

use fragscope_snapshot::recording::{prepare, recording};
use fragscope_snapshot::{read_path, Action, Snapshot};

use crate::common;

/// No real recording skipped an action: none is reported so (the corpus is recorded
/// with every action; a finding here would be a false one).
#[test]
fn no_real_recording_is_taken_for_a_skipping_one() {
    let mut n = 0;
    for p in common::real_pickles() {
        let Ok(snap) = read_path(&p) else { continue };
        let r = recording(&snap);
        assert!(r.skipped.is_empty(), "{}: {:?}", p.display(), r.skipped);
        n += 1;
    }
    assert!(n >= 5, "{n} real pickles read");
    // Profiler traces have allocs and no segment event by nature: no option applies.
    for name in
        ["kineto-hta-ddp-v100-rank1-profile-memory.json.gz", "kineto-tbplugin-resnet50-v100-no-addr.pt.trace.json.gz"]
    {
        let Some(p) = common::real_file(name) else { return };
        let snap = read_path(&p).unwrap();
        assert_eq!(recording(&snap).lines(), Vec::<String>::new(), "{name}");
    }
}

/// The corpus's snapshot without history (no trace, no stack anywhere) is named so; the
/// state-only ones with stacks are not (cs336's blocks have none, but 28 of its segments
/// carry the stack of their cudaMalloc: history was on, then switched off).
#[test]
fn state_only_snapshots_without_stacks_are_history_off() {
    for (name, off) in [
        ("cs336-2.7b-stateonly-fragmented.pickle", false),
        ("selectn-gpt2-generate-stateonly.pickle", true),
        ("verl-megatron-vllm-qwen2-private-pools-stateonly.pickle", false),
        ("cs336-2.7b-fwd-ctx128-fp32.pickle", false),
    ] {
        let Some(p) = common::real_file(name) else { return };
        let r = recording(&read_path(&p).unwrap());
        assert_eq!(r.history_off, off, "{name}");
    }
}

fn drop_actions(s: &Snapshot, drop: &[Action]) -> Snapshot {
    let mut s = s.clone();
    for t in &mut s.device_traces {
        t.retain(|e| !drop.contains(&e.action));
    }
    s
}

/// On a real multi-stream trace: each of free_requested, free_completed and alloc
/// deleted is found, and the frees restored give back the recorded trace's actions and
/// addresses, entry for entry.
#[test]
fn actions_deleted_from_a_real_trace_are_found_and_frees_restored() {
    let Some(p) = common::real_file("selectn-llama7b-offload-multistream.pickle") else { return };
    let full = read_path(&p).unwrap();
    let key = |s: &Snapshot| -> Vec<(Action, u64, u64)> {
        s.device_traces.iter().flatten().map(|e| (e.action, e.addr, s.stream(e))).collect()
    };
    for gone in [Action::FreeRequested, Action::FreeCompleted] {
        let mut s = drop_actions(&full, &[gone]);
        let r = prepare(&mut s);
        assert_eq!(r.skipped.iter().map(|k| k.action).collect::<Vec<_>>(), [gone], "{gone:?}");
        assert_eq!(key(&s), key(&full), "{gone:?} restored where it was recorded");
    }
    let mut s = drop_actions(&full, &[Action::Alloc]);
    let r = prepare(&mut s);
    assert!(r.skips(0, Action::Alloc));
    assert!(s.device_traces.iter().all(Vec::is_empty), "set aside");
    // Nothing deleted: nothing found, nothing changed.
    let mut s = full.clone();
    let r = prepare(&mut s);
    assert!(r.skipped.is_empty() && s.notes.recording.is_empty());
    assert_eq!(key(&s), key(&full));
}

/// `host_segments` and `host_traces` as PyTorch 2.14 writes them (`device` −1, one block
/// per segment), pickled by CPython: both read.
#[test]
fn host_segments_and_host_traces_are_read() {
    let Some(py) = common::python3() else { return };
    let expr = "{'segments': [], 'device_traces': [[]], \
        'host_segments': [{'device': -1, 'address': 4096, 'total_size': 1048576, 'allocated_size': 1048576, \
          'active_size': 1048576, 'requested_size': 1000000, 'stream': 0, 'segment_type': 'small', \
          'segment_pool_id': (0, 0), 'is_expandable': False, 'frames': [], \
          'blocks': [{'address': 4096, 'size': 1048576, 'requested_size': 1000000, 'state': 'active_allocated', \
            'frames': [{'filename': 'train.py', 'line': 3, 'name': 'load'}]}]}], \
        'host_traces': [{'action': 'segment_alloc', 'addr': 4096, 'size': 1048576, 'stream': 0, 'time_us': 5}, \
          {'action': 'alloc', 'addr': 4096, 'size': 1000000, 'stream': 0, 'time_us': 6, 'frames': []}]}";
    let bytes = common::python_pickle(py, expr, 4);
    let snap = fragscope_snapshot::read_from(&bytes[..]).unwrap();
    let h = snap.host_segments.as_ref().expect("host_segments read");
    assert_eq!((h.len(), h[0].device, h[0].total_size, h[0].blocks.len()), (1, -1, 1 << 20, 1));
    assert_eq!(h[0].blocks[0].requested_size, Some(1_000_000));
    let t = snap.host_traces.as_ref().expect("host_traces read");
    assert_eq!(t.iter().map(|e| e.action).collect::<Vec<_>>(), [Action::SegmentAlloc, Action::Alloc]);
    // Host memory is no device's: the devices are the CUDA ones only.
    assert!(snap.devices().is_empty() && snap.segments.is_empty());
}

/// The corpus's list of 2.x segments (`torch.cuda.memory_snapshot()`, pickled) is told from
/// a 1.13 snapshot, which is a list too.
#[test]
fn a_memory_snapshot_list_is_not_a_1_13_file() {
    let Some(p) = common::real_file("layoutedit-sd-lcm-segments-list.pkl") else { return };
    let snap = read_path(&p).unwrap();
    assert_eq!(snap.format, fragscope_snapshot::SourceFormat::SegmentList);
    let r = recording(&snap);
    assert!(r.segment_list_2x && r.state_only);
    assert!(r.lines().iter().any(|l| l.contains("torch.cuda.memory_snapshot()")));
}
