//! The allocator state at a device's first trace entry, rebuilt from the recording, and a
//! [`CachingAllocator`] seeded with it: the piece that makes a replay start where the
//! recorded process was.
//!
//! Most recordings start warm: `_record_memory_history` was called after the model, its
//! optimizer state and a cache of free blocks already held memory (gigabytes, often most
//! of the peak). The trace does not list that memory; the snapshot's final `segments`
//! and the trace together determine it. [`Seeded::rebuild`] walks the trace backwards
//! from the final state (spec §10.12), confirms the result by replaying the recording
//! forwards through the model (the same check as `fragscope replay --verify`), and keeps
//! the state at the first entry and the recording's own `empty_cache()` calls. A program
//! that drives [`fragscope_alloc`] from a snapshot starts from [`Seeded::allocator`]
//! instead of an empty allocator, and its peaks then equal `fragscope replay`'s.
//!
//! ```no_run
//! use fragscope_alloc::AllocatorConfig;
//! use fragscope_replay::{recorded_config, Seeded};
//! let snap = fragscope_snapshot::read_path_checked("snap.pickle".as_ref(), &mut |_, _| {}).unwrap();
//! let seeded = Seeded::rebuild(&snap, 0);
//! let mut eng = seeded.allocator(recorded_config(&snap), 80 << 30).unwrap();
//! assert_eq!(eng.reserved_bytes(), seeded.reserved_bytes());
//! ```
//!
//! `examples/seeded_replay.rs` drives a whole trace this way, and its test holds it equal
//! to [`crate::simulate`] on every recording with memory live before the trace.

use fragscope_alloc::{AllocatorConfig, CachingAllocator, DeviceMemory, SeedError, SimulatedDevice};
use fragscope_snapshot::Snapshot;

use crate::driver::{capacity_for, seed_segments, verify_inner};
use crate::state::{BState, BlockRec, RecordedState, SegRec};
use crate::{recorded_config, ReplayOptions};

/// Why a replay cannot start from the recorded state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StartError {
    /// The state before the trace could not be rebuilt: the trace and the final state
    /// disagree, or the file records no allocator state (the reason in words).
    Unknown(String),
    /// The state was rebuilt but the allocator refused to hold it (a segment that does
    /// not fit the device, overlapping reservations; the allocator's reason).
    NotSeeded(SeedError),
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StartError::Unknown(why) => write!(f, "the allocator state before the trace is unknown: {why}"),
            StartError::NotSeeded(why) => write!(f, "the allocator state before the trace could not be seeded: {why}"),
        }
    }
}

impl std::error::Error for StartError {}

/// The recorded allocator state at the first trace entry of one device (module doc).
#[derive(Clone, Debug)]
pub struct Seeded {
    device: i64,
    initial: Result<RecordedState, String>,
    empty_cache_before: Vec<usize>,
    /// Device size the recording's expandable reservations were made for (9/8 of the
    /// device, spec §6.1): they are seeded at that size whatever device a replay assumes.
    seed_capacity: u64,
}

impl Seeded {
    /// Rebuilds the state before `device`'s trace (module doc). Never fails: a state that
    /// cannot be rebuilt is kept as the reason ([`Seeded::unknown_reason`]), and
    /// [`Seeded::seed`] then refuses with it.
    pub fn rebuild(snap: &Snapshot, device: i64) -> Seeded {
        let (report, inferred) = verify_inner(snap, device, &ReplayOptions::default());
        let initial =
            inferred.initial.ok_or_else(|| report.undecidable.unwrap_or_else(|| "the device has no trace".to_string()));
        Seeded {
            device,
            initial,
            empty_cache_before: inferred.empty_cache_before,
            seed_capacity: seed_capacity(snap, device),
        }
    }

    pub fn device(&self) -> i64 {
        self.device
    }

    /// Why the state could not be rebuilt; `None` when it was.
    pub fn unknown_reason(&self) -> Option<&str> {
        self.initial.as_ref().err().map(String::as_str)
    }

    /// The segments at the first entry, each with its blocks in address order (none when
    /// the state is unknown or nothing was reserved).
    pub fn segments(&self) -> impl Iterator<Item = &SegRec> + '_ {
        self.initial.iter().flat_map(|s| s.segs.values())
    }

    /// The blocks that held a tensor at the first entry (allocated, or freed with the free
    /// not yet completed): the addresses the trace may free without having allocated them.
    pub fn live_blocks(&self) -> impl Iterator<Item = &BlockRec> + '_ {
        self.segments().flat_map(|s| &s.blocks).filter(|b| b.state != BState::Free)
    }

    /// Bytes reserved from the device at the first entry.
    pub fn reserved_bytes(&self) -> u64 {
        self.segments().map(|s| s.size).sum()
    }

    /// Bytes of blocks allocated at the first entry (pending frees excluded), as
    /// `memory_stats()["allocated_bytes.all.current"]` counts them.
    pub fn allocated_bytes(&self) -> u64 {
        self.live_blocks().filter(|b| b.state == BState::Allocated).map(|b| b.size).sum()
    }

    /// The trace entries right before which the recorded process called `empty_cache()`
    /// (inferred from the segment frees the trace holds; in trace order, possibly
    /// repeated). A replay that skips them keeps a cache the recording released.
    pub fn empty_cache_before(&self) -> &[usize] {
        &self.empty_cache_before
    }

    /// Seeds `eng`, which must hold nothing yet, with the state at the first entry.
    /// Expandable reservations are placed at the size `eng`'s device gives them: on a
    /// device of another size than the recording's (an unlimited one), two recorded
    /// reservations can overlap and this fails. A replay on a [`SimulatedDevice`] starts
    /// from [`Seeded::allocator`] instead, which keeps the recorded sizes (`predict` seeded
    /// with this and started empty on expandable recordings, issue 37).
    pub fn seed<D: DeviceMemory>(&self, eng: &mut CachingAllocator<D>) -> Result<(), StartError> {
        let state = self.initial.as_ref().map_err(|why| StartError::Unknown(why.clone()))?;
        seed_segments(eng, state).map_err(StartError::NotSeeded)
    }

    /// A caching allocator under `cfg` on a simulated device of `capacity` bytes with
    /// synthetic addresses, seeded with the state at the first entry. Blocks keep their
    /// recorded addresses; expandable reservations made before the trace keep the size the
    /// real device gave them.
    pub fn allocator(
        &self,
        cfg: AllocatorConfig,
        capacity: u64,
    ) -> Result<CachingAllocator<SimulatedDevice>, StartError> {
        let state = self.initial.as_ref().map_err(|why| StartError::Unknown(why.clone()))?;
        let mut eng = CachingAllocator::new(cfg, SimulatedDevice::synthetic(capacity));
        seed_at_recorded_size(&mut eng, state, self.seed_capacity).map_err(StartError::NotSeeded)?;
        Ok(eng)
    }
}

/// The device size the recording's expandable reservations were made for ([`Seeded`]'s
/// `seed_capacity`).
pub(crate) fn seed_capacity(snap: &Snapshot, device: i64) -> u64 {
    capacity_for(snap, device, None, &recorded_config(snap))
}

/// Seeds `eng` with `state` on a simulated device of any size: expandable reservations
/// made before the trace keep the size the real device gave them (9/8 of `seed_capacity`,
/// spec §6.1), not the simulated device's (2^50 bytes when unlimited, which would make two
/// recorded reservations overlap); the device gets its own size back afterwards.
pub(crate) fn seed_at_recorded_size(
    eng: &mut CachingAllocator<SimulatedDevice>,
    state: &RecordedState,
    seed_capacity: u64,
) -> Result<(), SeedError> {
    let capacity = eng.device().capacity();
    eng.device_mut().set_capacity(seed_capacity);
    let seeded = seed_segments(eng, state);
    eng.device_mut().set_capacity(capacity);
    seeded
}

/// Holds a seeded `eng` to `cap` bytes: when the state it was seeded with (at the recorded
/// device's size, [`seed_at_recorded_size`]) reserves more, its cached free segments are
/// released, as PyTorch does when a `cudaMalloc` fails (spec §3.7): a process on a device
/// of `cap` bytes could never have held that cache. Returns `(reserved before, reserved
/// after)` when it released, `None` when the state was within `cap`; what is still over
/// `cap` (segments holding live blocks) is the caller's to count. Reserved bytes are what
/// the engine holds against its device's size. The what-ifs
/// ([`crate::simulate_with`]) and `fragscope_predict`'s replays both start so.
pub fn release_cache_over(eng: &mut CachingAllocator<SimulatedDevice>, cap: u64) -> Option<(u64, u64)> {
    let held = eng.reserved_bytes();
    if held <= cap {
        return None;
    }
    eng.empty_cache();
    Some((held, eng.reserved_bytes()))
}
