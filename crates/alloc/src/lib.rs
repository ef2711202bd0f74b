//! # fragscope-alloc
//!
//! A faithful model of PyTorch's CUDA caching allocator, for explaining CUDA
//! out-of-memory errors: replay a recorded allocation trace through
//! [`CachingAllocator`] and it makes the same decisions PyTorch made (which
//! cached block serves a request, when a new `cudaMalloc` happens, which
//! segments `empty_cache` returns), writes the same trace events, and keeps
//! the same `memory_stats()` counters. Change the [`AllocatorConfig`] (parsed
//! from a `PYTORCH_CUDA_ALLOC_CONF` string) or the device size and replay
//! again to answer "what if".
//!
//! [`OPTIONS`] lists every allocator option with what the model does with it
//! ([`Fidelity`]: modelled, read, refused; docs/fidelity.md prints it), and
//! [`Accelerator`] selects another backend's rules where they differ from CUDA's (Ascend
//! NPU and Intel XPU rounding); the replay sets it from the recording.
//!
//! The rules are those of `shared/spec/pytorch-allocator.md`; comments cite
//! its sections (§). Device memory is behind the [`DeviceMemory`] trait: the
//! [`SimulatedDevice`] either invents addresses or replays the ones a trace
//! recorded (oracle mode), and a real CUDA backend can implement it later.
//!
//! ```
//! use fragscope_alloc::{AllocatorConfig, CachingAllocator, SimulatedDevice, Event};
//! let mut a = CachingAllocator::new(AllocatorConfig::default(), SimulatedDevice::synthetic(80 << 30));
//! let p = a.malloc(1000, 0).unwrap();
//! assert_eq!(a.drain_events(), vec![
//!     Event::SegmentAlloc { addr: p, size: 2 << 20, stream: 0 },
//!     Event::Alloc { addr: p, size: 1000, stream: 0 },
//! ]);
//! assert_eq!(a.stats().allocated_bytes.all().current, 1024);
//! ```
//!
//! Everything is deterministic and no input makes it panic: bad frees and bad
//! seeds are errors.

pub mod config;
mod constants;
pub mod device;
pub mod engine;
mod format;
pub mod policy;
pub mod rounding;
pub mod stats;
pub mod uncached;
pub mod vmm;

#[cfg(test)]
mod tests;

/// A device address.
pub type Addr = u64;
/// Raw `cudaStream_t` value (0 = legacy default stream).
pub type StreamId = u64;
/// `MempoolId`; `(0, 0)` = the default pools.
pub type PoolId = (u64, u64);
/// The default pools' id.
pub const DEFAULT_POOL: PoolId = (0, 0);

pub use config::{
    parse as parse_config, Accelerator, AllocatorConfig, ConfigError, Fidelity, OptionInfo, ReserveSpec, RoundingRule,
    TieBreak, OPTIONS,
};
pub use device::{AddressSource, DeviceMemory, OracleMismatch, SimulatedDevice};
pub use engine::{
    BlockInfo, BlockState, CachingAllocator, Event, FreeError, InvariantError, Oom, SeedBlock, SeedError, SeedSegment,
    SegmentInfo,
};
pub use format::{format_size, grouped, percent};
pub use stats::{Stat, StatArray, Stats};
pub use uncached::UncachedAllocator;
pub use vmm::StrictVmm;
