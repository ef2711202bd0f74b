//! torch.profiler (Kineto) traces: the two real files of SOURCES.md §B, and error cases.

use crate::common;

use std::collections::HashMap;

use fragscope_snapshot::*;

fn count(t: &[TraceEvent], a: Action) -> usize {
    t.iter().filter(|e| e.action == a).count()
}

/// Replays a trace: every free must hit a live allocation of the same size at the same
/// address, and nothing may stay live at the end (this trace frees everything).
fn assert_pairs_by_address(t: &[TraceEvent]) -> usize {
    let mut live: HashMap<u64, u64> = HashMap::new();
    let mut peak_live = 0;
    for (i, e) in t.iter().enumerate() {
        match e.action {
            Action::Alloc => {
                assert!(live.insert(e.addr, e.size).is_none(), "event {i}: alloc of live address {:#x}", e.addr);
                peak_live = peak_live.max(live.len());
            }
            Action::FreeRequested => {
                assert_eq!(
                    live.get(&e.addr),
                    Some(&e.size),
                    "event {i}: free of {:#x} does not match an alloc",
                    e.addr
                );
                let next = &t[i + 1];
                assert_eq!(
                    (next.action, next.addr, next.size),
                    (Action::FreeCompleted, e.addr, e.size),
                    "free_requested is followed by its free_completed"
                );
            }
            Action::FreeCompleted => {
                live.remove(&e.addr);
            }
            other => panic!("unexpected action {other:?}"),
        }
    }
    assert!(live.is_empty(), "{} allocations never freed", live.len());
    peak_live
}

#[test]
fn hta_ddp_trace_with_addresses() {
    let Some(p) = common::real_file("kineto-hta-ddp-v100-rank1-profile-memory.json.gz") else { return };
    let s = read_path(&p).unwrap();
    assert_eq!(s.format, SourceFormat::Kineto);
    assert!(s.segments.is_empty());
    // Rank 1 of a 2-GPU job: device 1 has the events, device 0 none.
    assert_eq!(s.devices(), vec![1]);
    let t = s.trace(1);
    assert_eq!(count(t, Action::Alloc), 13_385);
    assert_eq!(count(t, Action::FreeRequested), 13_385);
    assert_eq!(count(t, Action::FreeCompleted), 13_385);
    assert_eq!(t.len(), 3 * 13_385);
    assert!(t.windows(2).all(|w| w[0].time_us <= w[1].time_us), "ordered by ts");
    assert!(t.iter().all(|e| s.stream(e) == 0 && e.stack.is_none() && e.time().is_some()));
    assert_pairs_by_address(t);
    // Totals: one sample per CUDA event; reserved constant at 12.78 GB, peak 6.63 GB.
    let tot = &s.totals[1];
    assert_eq!(tot.len(), 26_770);
    assert!(tot.iter().all(|x| x.reserved == Some(12_782_141_440)));
    assert_eq!(tot.iter().filter_map(|x| x.allocated).max(), Some(6_629_508_096));
    // 1,240 CPU events counted and skipped.
    assert!(
        s.notes.remarks.iter().any(|r| r.contains("skipped 1240 [memory] events that are not CUDA")),
        "{:?}",
        s.notes.remarks
    );
    // Tesla V100-SXM2-32GB.
    assert_eq!(s.device_capacity.get(&1), Some(&34_089_730_048));
    assert_eq!(s.device_capacity.get(&0), Some(&34_089_730_048));
}

#[test]
fn tbplugin_trace_without_addresses() {
    let Some(p) = common::real_file("kineto-tbplugin-resnet50-v100-no-addr.pt.trace.json.gz") else { return };
    let s = read_path(&p).unwrap();
    assert_eq!(s.format, SourceFormat::Kineto);
    // No addresses: no trace is invented for the device.
    assert!(s.device_traces.iter().all(|t| t.is_empty()));
    let tot = &s.totals[0];
    assert_eq!(tot.len(), 8_220);
    let ups = tot.windows(2).filter(|w| w[1].allocated > w[0].allocated).count() + 1;
    let downs = tot.windows(2).filter(|w| w[1].allocated < w[0].allocated).count();
    assert_eq!((ups, downs), (4_110, 4_110), "4,110 allocs and 4,110 frees");
    assert_eq!(tot.iter().filter_map(|x| x.allocated).max(), Some(2_791_636_480));
    assert_eq!(tot.last().unwrap().allocated, Some(0), "everything freed by the end");
    assert!(tot.iter().all(|x| x.reserved.is_none()));
    assert!(
        s.notes.remarks.iter().any(|r| r.contains("profiler trace has no addresses: only totals are available")),
        "{:?}",
        s.notes.remarks
    );
    assert!(s.notes.remarks.iter().any(|r| r.contains("skipped 4618 [memory] events that are not CUDA")));
    // Tesla V100-DGXS-32GB ×4.
    assert_eq!(s.device_capacity.len(), 4);
    assert_eq!(s.device_capacity[&0], 34_084_028_416);
    assert_eq!(s.device_capacity[&1], 34_087_305_216);
}

/// A Kineto-sourced snapshot is written in the 2.x dict form and reads back the same trace.
#[test]
fn kineto_snapshot_writes_as_dict_pickle() {
    let Some(p) = common::real_file("kineto-hta-ddp-v100-rank1-profile-memory.json.gz") else { return };
    let s = read_path(&p).unwrap();
    let mut buf = Vec::new();
    pickle::write::write_snapshot(&s, &mut buf).unwrap();
    let b = read_from(&buf[..]).unwrap();
    assert_eq!(b.format, SourceFormat::Dict);
    assert_eq!(b.device_traces, s.device_traces);
}

#[test]
fn json_that_is_not_a_trace() {
    for (json, want) in [
        (
            &br#"{"actions": [1, 2], "elements_size": [3]}"#[..],
            "JSON without 'traceEvents': not a torch.profiler trace",
        ),
        (b"[1, 2, 3]", "JSON without 'traceEvents': not a torch.profiler trace"),
        (br#"{"traceEvents": [{"name": "aten::mm", "ph": "X", "ts": 1, "args": {"x": [1]}}]}"#, "profile_memory=True"),
        (br#"{"traceEvents": []}"#, "profile_memory=True"),
        (b"{\"traceEvents\": [", "invalid JSON"),
    ] {
        let e = kineto::read_json(json).unwrap_err().to_string();
        assert!(e.contains(want), "{e}");
        assert!(!e.contains('\n'));
        let e2 = read_from(json).unwrap_err().to_string();
        assert_eq!(e, e2);
    }
}

#[test]
fn real_non_trace_json_files_are_refused() {
    for name in [
        "zdevito-toy-trace-plot-alloc-data.json",
        "zdevito-cudagraph-trace-plot-alloc-data.json",
        "hta-export-memory-timeline.raw.gz",
    ] {
        let Some(p) = common::real_file(name) else { return };
        let e = read_path(&p).unwrap_err().to_string();
        assert_eq!(e, "JSON without 'traceEvents': not a torch.profiler trace", "{name}");
    }
}

/// Small hand-written traces: CUDA filter, sorting by ts, float ts, skipped CPU events.
#[test]
fn small_synthetic_traces() {
    let json = br#"{"deviceProperties": [{"id": 0, "totalGlobalMem": 1000}],
      "traceEvents": [
        {"name": "[memory]", "ph": "i", "ts": 20.5, "args": {"Device Type": 1, "Device Id": 0, "Addr": 4096, "Bytes": -512, "Total Allocated": 0, "Total Reserved": 2097152}},
        {"name": "[memory]", "ph": "i", "ts": 10, "args": {"Device Type": 1, "Device Id": 0, "Addr": 4096, "Bytes": 512, "Total Allocated": 512, "Total Reserved": 2097152}},
        {"name": "[memory]", "ph": "i", "ts": 11, "args": {"Device Type": 0, "Device Id": -1, "Addr": 1, "Bytes": 8}},
        {"name": "other", "ph": "X", "ts": 1, "dur": 3, "args": {"Bytes": "not a number"}}
      ]}"#;
    let s = kineto::read_json(json).unwrap();
    let t = s.trace(0);
    assert_eq!(
        t.iter().map(|e| (e.action, e.addr, e.size, e.time_us)).collect::<Vec<_>>(),
        vec![
            (Action::Alloc, 4096, 512, 10),
            (Action::FreeRequested, 4096, 512, 20),
            (Action::FreeCompleted, 4096, 512, 20),
        ]
    );
    assert_eq!(s.totals[0][0], TotalsSample { time_us: 10, allocated: Some(512), reserved: Some(2097152) });
    assert_eq!(s.device_capacity[&0], 1000);
    assert!(s.notes.remarks.iter().any(|r| r.contains("skipped 1 [memory] events that are not CUDA (Device Type 0)")));
}

/// A snapshot exported as JSON (the pickle's dict, json.dump'ed) reads like the pickle.
#[test]
fn snapshot_json_export_is_accepted() {
    let Some(p) = common::real_file("ddpm-unet-tiny-stateonly-windows.pickle") else { return };
    let Some(py) = common::python3() else { return };
    let dir = common::scratch_dir("jsonexport");
    let out = dir.join("s.json");
    common::run_python(
        py,
        r#"
import pickle, json, sys
class R(pickle.Unpickler):
    def find_class(self, m, n): raise pickle.UnpicklingError("refused")
o = R(open(sys.argv[1], 'rb')).load()
json.dump(o, open(sys.argv[2], 'w'))
"#,
        &[&p, &out],
    );
    let a = read_path(&p).unwrap();
    let b = read_path(&out).unwrap();
    assert_eq!(semantic_diff(&a, &b), None);
    assert!(b.notes.remarks.iter().any(|r| r.contains("JSON export")));
    let _ = std::fs::remove_dir_all(&dir);
}
