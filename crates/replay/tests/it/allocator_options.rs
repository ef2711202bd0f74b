//! Allocator options and other accelerators, end to end: a recording made under an option
//! (or another accelerator's rules) replays exactly under the settings the file carries,
//! and the default CUDA rules' error on it is named beside (issue 40).

use fragscope_alloc::{Accelerator, AllocatorConfig};
use fragscope_replay::{
    config_on_top, detect_accelerator, recorded_config, simulate_with, verify, Recorder, ReplayOptions, SimOptions,
};
use fragscope_snapshot::pickle::write::write_snapshot;
use fragscope_snapshot::Snapshot;

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

/// A small training-like loop: weights kept, activations of mixed sizes (512-byte
/// multiples, 1 MiB, 1–10 MiB, over 10 MiB) freed each step, an `empty_cache()` midway.
fn workload(conf: &str, file: &str) -> Snapshot {
    let mut r = Recorder::new(conf, 80 * GIB, 1_000, 10).unwrap();
    let st = r.stack(&[("train.py", 10, "main"), (file, 42, "forward")]);
    let mut keep = Vec::new();
    for n in [512, 4096, 3 * MIB, 5 * MIB + 7] {
        keep.push(r.malloc(n, 0, st).unwrap());
    }
    for step in 0..6u64 {
        let mut tmp = Vec::new();
        for n in [512, 1024 + step * 512, MIB, 2 * MIB + 100, 6 * MIB, 11 * MIB + step * MIB, 40 * MIB] {
            tmp.push(r.malloc(n, 0, st).unwrap());
        }
        for (i, a) in tmp.into_iter().enumerate() {
            if i % 3 != 2 || step == 5 {
                r.free(a).unwrap();
            } else {
                keep.push(a);
            }
        }
        if step == 3 {
            r.empty_cache();
        }
    }
    r.finish()
}

fn write_and_read(s: &Snapshot) -> Snapshot {
    let mut bytes = Vec::new();
    write_snapshot(s, &mut bytes).unwrap();
    fragscope_snapshot::read_from(&bytes[..]).unwrap()
}

/// `large_segment_size_mb:12`: the recording replays exactly under its own settings
/// (read from `allocator_settings`); under the default 20 MiB the segment events differ.
#[test]
fn large_segment_size_recording_replays_exactly() {
    let snap = write_and_read(&workload("expandable_segments:False,large_segment_size_mb:12", "model.py"));
    assert_eq!(recorded_config(&snap).large_segment_size, 12 * MIB);
    let r = verify(&snap, 0, &ReplayOptions::default());
    assert!(r.allocs > 0 && r.fully_matched(), "{:?} {:?}", r.first_divergence, r.undecidable);
    assert_eq!(r.segment_events_matched, r.segment_events);
    let wrong = ReplayOptions { config: Some(AllocatorConfig::default()), ..Default::default() };
    let w = verify(&snap, 0, &wrong);
    assert!(w.segment_events_matched < w.segment_events, "20 MiB segments cannot match 12 MiB ones");
    let d = w.first_divergence.expect("named");
    assert!(d.recorded_segment_events.iter().chain(&d.model_events).any(|e| e.size == 12 * MIB || e.size == 20 * MIB));
}

/// The same with expandable segments: the large pool's pages are 12 MiB.
#[test]
fn large_segment_size_expandable_recording_replays_exactly() {
    let snap = write_and_read(&workload("expandable_segments:True,large_segment_size_mb:12", "model.py"));
    let r = verify(&snap, 0, &ReplayOptions::default());
    assert!(r.allocs > 0 && r.fully_matched(), "{:?} {:?}", r.first_divergence, r.undecidable);
    let maps: Vec<u64> = snap.trace(0).iter().filter(|e| e.action.as_str() == "segment_map").map(|e| e.size).collect();
    assert!(maps.iter().any(|&s| s % (12 * MIB) == 0 && s % (20 * MIB) != 0), "{maps:?}");
}

/// An Ascend recording (frames from `torch_npu`), made by the model under torch_npu's
/// rounding, is detected as NPU, replays exactly under the NPU rules, and the CUDA rules'
/// first divergence on it is named.
#[test]
fn npu_recording_replays_under_npu_rules_and_cuda_rules_diverge() {
    let src = workload("", "/usr/lib/python3/site-packages/torch_npu/utils/_module.py");
    let det = detect_accelerator(&src).expect("torch_npu frames");
    assert_eq!(det.accelerator, Accelerator::Npu);
    assert!(det.evidence.contains("torch_npu"));
    let npu = AllocatorConfig { accelerator: Accelerator::Npu, ..AllocatorConfig::default() };
    let run =
        simulate_with(&src, 0, npu, &SimOptions { capacity: None, collect_snapshot: true, ..SimOptions::default() });
    let snap = write_and_read(&run.snapshot.expect("kept"));
    assert_eq!(recorded_config(&snap).accelerator, Accelerator::Npu, "detected after a write and read");
    let r = verify(&snap, 0, &ReplayOptions::default());
    assert!(r.allocs > 0 && r.fully_matched(), "{:?} {:?}", r.first_divergence, r.undecidable);
    assert!(r.notes.iter().any(|n| n.starts_with("recorded on NPU")), "{:?}", r.notes);
    // The CUDA rules' error, beside: the same numbers as the replay under CUDA's rules below.
    let beside = r.notes.iter().find(|n| n.starts_with("under CUDA's rules instead: ")).expect("named");
    assert!(beside.contains(" allocations and ") && beside.contains("first divergence at entry "), "{beside}");
    let cuda = ReplayOptions { config: Some(AllocatorConfig::default()), ..Default::default() };
    let c = verify(&snap, 0, &cuda);
    assert!(c.allocs_matched < c.allocs, "CUDA's rounding places NPU blocks elsewhere");
    let d = c.first_divergence.expect("the first divergence is named");
    assert!(!d.model.is_empty());
    let counts = format!(
        "{}/{} allocations and {}/{} segment events",
        c.allocs_matched, c.allocs, c.segment_events_matched, c.segment_events
    );
    assert!(
        beside.contains(&counts) && beside.contains(&format!("entry {}: {}", d.index, d.model)),
        "{beside} vs {counts}"
    );
    assert!(c.notes.iter().all(|n| !n.starts_with("under CUDA's rules")), "no note when the caller chose the rules");
}

/// No sign of another backend: CUDA's rules; a what-if keeps the recording's accelerator
/// and refuses what it cannot model.
#[test]
fn cuda_by_default_and_what_ifs_keep_the_accelerator() {
    let snap = workload("", "model.py");
    assert_eq!(detect_accelerator(&snap), None);
    assert_eq!(recorded_config(&snap).accelerator, Accelerator::Cuda);
    let npu = AllocatorConfig { accelerator: Accelerator::Npu, ..AllocatorConfig::default() };
    assert_eq!(config_on_top(&npu, "max_split_size_mb:128").unwrap().accelerator, Accelerator::Npu);
    let e = config_on_top(&AllocatorConfig::default(), "backend:cudaMallocAsync").unwrap_err();
    assert!(e.to_string().starts_with("backend:cudaMallocAsync is not modelled"), "{e}");
    let e = config_on_top(&AllocatorConfig::default(), "graph_capture_record_stream_reuse:True").unwrap_err();
    assert!(e.to_string().starts_with("graph_capture_record_stream_reuse is not modelled"), "{e}");
}

/// PyTorch 2.9.1 with `PYTORCH_ALLOC_CONF=expandable_segments:True`: the settings string
/// asks for expandable segments, the recorded flag says the allocator ran without; the
/// replay follows the flag and says why (pytorch/pytorch#183387).
#[test]
fn a_settings_string_the_allocator_ignored_is_named() {
    let mut snap = workload("", "model.py");
    let Some(fragscope_snapshot::PyObj::Dict(items)) = snap.allocator_settings.as_mut() else { panic!("settings") };
    for (k, v) in items.iter_mut() {
        if k.as_str() == Some("PYTORCH_CUDA_ALLOC_CONF") {
            *v = fragscope_snapshot::PyObj::Str("expandable_segments:True".into());
        }
    }
    let snap = write_and_read(&snap);
    assert!(!recorded_config(&snap).expandable_segments, "the recorded flag wins");
    let r = verify(&snap, 0, &ReplayOptions::default());
    assert!(r.fully_matched(), "{:?}", r.first_divergence);
    assert!(r.notes.iter().any(|n| n.contains("#183387")), "{:?}", r.notes);
}
