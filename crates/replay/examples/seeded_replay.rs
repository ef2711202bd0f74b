//! Replaying a recording with fragscope's crates as a library, the way a third party would:
//! read the snapshot with `fragscope_snapshot`, start PyTorch's caching allocator model
//! (`fragscope_alloc`) from the state the recorded process already held
//! (`fragscope_replay::Seeded`), and drive it with the trace's own requests and frees.
//!
//! `cargo run --release -p fragscope-replay --example seeded_replay -- FILE...`
//!
//! Prints, per device, the reserved and allocated bytes before the trace and at the peak,
//! and the `cudaMalloc` calls of the run. Without the seeded start a warm recording (one
//! taken after warm-up steps, the usual kind) would replay from an empty allocator and
//! report gigabytes too few. The figures equal `fragscope replay`'s row for the recorded
//! settings: `crates/replay/tests/it/seeded_example.rs` checks it on every recording.

use std::collections::HashMap;
use std::process::ExitCode;

use fragscope_alloc::{CachingAllocator, SimulatedDevice, DEFAULT_POOL};
use fragscope_replay::{recorded_config, replayable_devices, Seeded, StartError};
use fragscope_snapshot::{Action, Snapshot};

/// Device size of the simulation: large enough that no request fails (as `fragscope
/// replay` without `--capacity`).
const UNLIMITED: u64 = 1 << 50;

/// What one device's replay measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Figures {
    pub reserved_before_trace: u64,
    pub allocated_before_trace: u64,
    pub peak_reserved: u64,
    pub peak_allocated: u64,
    pub cuda_mallocs: u64,
}

/// Replays `device`'s trace under the recorded settings, from the recorded start.
pub fn replay_device(snap: &Snapshot, device: i64) -> Result<Figures, StartError> {
    let seeded = Seeded::rebuild(snap, device);
    let eng = seeded.allocator(recorded_config(snap), UNLIMITED)?;
    // Blocks live before the trace were seeded at their recorded addresses; the trace may
    // free them without having allocated them.
    let live: Vec<u64> = seeded.live_blocks().map(|b| b.addr).collect();
    Ok(drive(snap, device, eng, &live, seeded.empty_cache_before()))
}

/// Serves `device`'s trace with `eng`, which holds the blocks at `live` already; calls
/// `empty_cache()` right before the entries of `empty_cache_before`.
pub fn drive(
    snap: &Snapshot,
    device: i64,
    mut eng: CachingAllocator<SimulatedDevice>,
    live: &[u64],
    empty_cache_before: &[usize],
) -> Figures {
    let before = eng.stats().clone();
    // Recorded address -> the model's block.
    let mut block: HashMap<u64, u64> = live.iter().map(|&a| (a, a)).collect();
    // The recorded process's own empty_cache() calls: without them the model keeps a
    // cache the process had released, and later requests find memory it did not have.
    let mut empty_cache = empty_cache_before.iter().copied().peekable();
    for (i, e) in snap.trace(device).iter().enumerate() {
        while empty_cache.next_if(|&k| k <= i).is_some() {
            eng.empty_cache();
        }
        let pool = snap.pool_id(e).unwrap_or(DEFAULT_POOL);
        match e.action {
            Action::Alloc => match eng.malloc_in_pool(e.size, snap.stream(e), pool) {
                Ok(a) => {
                    block.insert(e.addr, a);
                }
                // Served nowhere: its frees free nothing.
                Err(_) => {
                    block.remove(&e.addr);
                }
            },
            // A request the recorded process could not serve: the model may.
            Action::Oom => {
                if let Ok(a) = eng.malloc_in_pool(e.size, snap.stream(e), pool) {
                    let _ = eng.free(a);
                }
            }
            // PyTorch frees in two steps when a block was used on other streams: the free
            // is requested, and completes once the streams' events have passed.
            Action::FreeRequested => {
                if let Some(&a) = block.get(&e.addr) {
                    let _ = eng.free_requested(a);
                }
            }
            Action::FreeCompleted => {
                if let Some(a) = block.remove(&e.addr) {
                    // Already completed by an empty_cache() in between: nothing left to do.
                    let _ = eng.free_completed(a);
                }
            }
            _ => {}
        }
    }
    for _ in empty_cache {
        eng.empty_cache();
    }
    figures(&eng, &before)
}

fn figures(eng: &CachingAllocator<SimulatedDevice>, before: &fragscope_alloc::Stats) -> Figures {
    let s = eng.stats();
    let bytes = |v: i64| v.max(0) as u64;
    Figures {
        reserved_before_trace: bytes(before.reserved_bytes.all().current),
        allocated_before_trace: bytes(before.allocated_bytes.all().current),
        peak_reserved: bytes(s.reserved_bytes.all().peak),
        peak_allocated: bytes(s.allocated_bytes.all().peak),
        // The seeding's own segments are the state before the trace, not calls of this run.
        cuda_mallocs: s.num_device_alloc - before.num_device_alloc,
    }
}

#[allow(dead_code)] // the test includes this file for `replay_device`, not for `main`
fn main() -> ExitCode {
    let files: Vec<String> = std::env::args().skip(1).collect();
    if files.is_empty() {
        eprintln!("usage: seeded_replay FILE...");
        return ExitCode::from(2);
    }
    for f in &files {
        let snap = match fragscope_snapshot::read_path_checked(f.as_ref(), &mut |_, _| {}) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("{f}: {e}");
                return ExitCode::from(2);
            }
        };
        for device in replayable_devices(&snap) {
            match replay_device(&snap, device) {
                Ok(r) => println!(
                    "{f} device {device}: before the trace {} B reserved, {} B allocated; \
                     peak {} B reserved, {} B allocated; {} cudaMalloc",
                    r.reserved_before_trace,
                    r.allocated_before_trace,
                    r.peak_reserved,
                    r.peak_allocated,
                    r.cuda_mallocs
                ),
                Err(e) => println!("{f} device {device}: {e}"),
            }
        }
    }
    ExitCode::SUCCESS
}
