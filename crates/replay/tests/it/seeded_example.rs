//! The third-party example (`examples/seeded_replay.rs`: a snapshot read with
//! `fragscope_snapshot`, the allocator model driven by hand from the public `Seeded` start)
//! gives the figures `fragscope replay` gives for the recorded settings ([`simulate`]), on
//! every real recording: the corpus (or the in-repository set), its grids and our H200
//! recordings. Recordings with memory live before the trace are the point — an allocator
//! started empty reports gigabytes too few on them — so the test also requires that some
//! files have it, and that leaving the seeded start out changes their figures.

#[path = "../../examples/seeded_replay.rs"]
mod example;

use std::path::PathBuf;

use fragscope_alloc::{CachingAllocator, SimulatedDevice};
use fragscope_replay::{recorded_config, replayable_devices, simulate, StartError, StartState};

fn recordings() -> Vec<PathBuf> {
    let mut dirs = vec![fragscope_testdata::traces_dir().expect("always a folder"), fragscope_testdata::h200_dir()];
    dirs.push(dirs[0].join("grids"));
    let mut files: Vec<PathBuf> = dirs
        .iter()
        .filter_map(|d| std::fs::read_dir(d).ok())
        .flatten()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let n = p.to_string_lossy();
            n.ends_with(".pickle") || n.ends_with(".pkl") || n.ends_with(".pickle.gz")
        })
        .collect();
    files.sort();
    files
}

#[test]
fn the_example_replays_as_fragscope_replay_does() {
    let (mut compared, mut warm) = (0, 0);
    for path in recordings() {
        let snap = fragscope_snapshot::read_path_checked(&path, &mut |_, _| {}).unwrap();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        for device in replayable_devices(&snap) {
            let ours = simulate(&snap, device, recorded_config(&snap), None);
            match example::replay_device(&snap, device) {
                Ok(theirs) => {
                    assert_eq!(ours.start_state, StartState::Rebuilt, "{name} device {device}");
                    let want = example::Figures {
                        reserved_before_trace: ours.reserved_before_trace,
                        allocated_before_trace: ours.allocated_before_trace,
                        peak_reserved: ours.peak_reserved,
                        peak_allocated: ours.peak_allocated,
                        cuda_mallocs: ours.cuda_mallocs,
                    };
                    assert_eq!(theirs, want, "{name} device {device}");
                    compared += 1;
                    if theirs.reserved_before_trace > 0 {
                        warm += 1;
                    }
                }
                Err(StartError::Unknown(_)) => assert_eq!(ours.start_state, StartState::Unknown, "{name}"),
                Err(StartError::NotSeeded(_)) => assert_eq!(ours.start_state, StartState::NotSeeded, "{name}"),
            }
        }
    }
    eprintln!("seeded example: {compared} device traces compared, {warm} with memory reserved before the trace");
    // The in-repository set alone has 2 warm device traces (the live H200 recording and the
    // FSDP file); the corpus has many more.
    let need_warm = if fragscope_testdata::has_corpus() { 10 } else { 2 };
    assert!(compared >= 20 && warm >= need_warm, "{compared} compared, {warm} warm: too few to mean anything");
}

/// Without the seeded start, a warm recording replays from an empty allocator and misses
/// what the process held: the peak is short by it.
#[test]
fn an_empty_start_misses_the_memory_held_before_the_trace() {
    let path = fragscope_testdata::h200_dir().join("live-mlp-20-steps.pickle.gz");
    let snap = fragscope_snapshot::read_path_checked(&path, &mut |_, _| {}).unwrap();
    let seeded = fragscope_replay::Seeded::rebuild(&snap, 0);
    assert_eq!(seeded.unknown_reason(), None);
    let (held, live) = (seeded.reserved_bytes(), seeded.allocated_bytes());
    assert!(held > 0 && live > 0, "the live recording starts after the model was built");
    let eng = seeded.allocator(recorded_config(&snap), 1 << 50).unwrap();
    assert_eq!((eng.reserved_bytes(), eng.stats().allocated_bytes.all().current as u64), (held, live));
    let warm = example::replay_device(&snap, 0).unwrap();
    assert_eq!((warm.reserved_before_trace, warm.allocated_before_trace), (held, live));
    let empty = CachingAllocator::new(recorded_config(&snap), SimulatedDevice::synthetic(1 << 50));
    let cold = example::drive(&snap, 0, empty, &[], seeded.empty_cache_before());
    assert!(cold.peak_allocated < warm.peak_allocated, "{cold:?} vs {warm:?}");
    assert!(warm.peak_allocated - cold.peak_allocated >= live / 2, "{cold:?} vs {warm:?}");
}
