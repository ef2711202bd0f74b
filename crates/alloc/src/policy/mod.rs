//! Allocation policies for the allocator lab: the same workload served by other
//! allocators than PyTorch's, over the same [`SimulatedDevice`](crate::SimulatedDevice), to measure what each
//! would have reserved.
//!
//! Principal types:
//!
//! * [`Policy`]: what an allocator serves — `malloc(size, stream)` (a device address or
//!   [`PolicyOom`]), `free(addr)`, the bytes it holds from the device
//!   ([`Policy::reserved`]) and the driver calls it made ([`DriverCalls`], the cost proxy).
//!   A policy is written once against this trait and [`DeviceMemory`], so it can serve a
//!   real allocator later (a `CUDAPluggableAllocator` or a `MemPool` segment provider).
//! * [`Workload`]: a trace reduced to requests and frees ([`Op`]), and [`Bounds`], the
//!   peaks of live bytes no allocator can go below.
//! * The policies: [`PyTorchCaching`] (the engine of this crate under any
//!   `PYTORCH_CUDA_ALLOC_CONF`), [`BestFitArenas`] (one growable best-fit arena per
//!   stream), [`PageRemap`] (stitching for every large request: any free 2 MiB physical
//!   page serves it; GMLake stitches only when no block fits), [`PagedBestFit`] (best fit in virtual addresses, physical pages only under
//!   live blocks, idle pages remapped where needed), [`LifetimeSegregated`] (short- and long-lived blocks in separate arenas,
//!   the class learned from call site and size), [`Planned`] (offline: every block at a
//!   fixed offset, decreasing-size best fit over lifetimes as XLA's heap simulator) and
//!   [`Hybrid`] (the plan of one recorded iteration, the rest online).
//!
//! Every policy but the PyTorch one keeps streams apart (as PyTorch does: a block freed on
//! one stream may still be in use by kernels queued on it, so only that stream may reuse
//! it without synchronising) and rounds requests to 512 bytes.

mod arena;
mod best_fit;
mod caching;
mod drive;
mod hybrid;
mod lifetime;
mod page_remap;
mod paged;
mod planned;
mod workload;

pub use arena::Arena;
pub use best_fit::BestFitArenas;
pub use caching::PyTorchCaching;
pub use drive::{drive, drive_strict, DriveError, Run};
pub use hybrid::{request_period, Hybrid};
pub use lifetime::LifetimeSegregated;
pub use page_remap::PageRemap;
pub use paged::PagedBestFit;
pub use planned::{plan_best, plan_in_order, plan_offsets, Order, Planned, STACK_FOREVER};
pub use workload::{Bounds, Op, Workload};

use crate::device::DeviceMemory;
use crate::{Addr, InvariantError, StreamId};

/// Granularity of physical pages (`cuMemCreate` on current GPUs) and of `cudaMalloc`.
pub const PAGE: u64 = 2 << 20;
/// Every block is a multiple of this (PyTorch's `kMinBlockSize`).
pub const ALIGN: u64 = 512;

/// `size` rounded up to 512 bytes (at least 512).
#[inline]
pub fn round512(size: u64) -> u64 {
    size.max(1).div_ceil(ALIGN).saturating_mul(ALIGN)
}

/// `size` rounded up to whole 2 MiB pages.
#[inline]
pub fn round_page(size: u64) -> u64 {
    size.div_ceil(PAGE).saturating_mul(PAGE)
}

/// Driver calls a policy made: the cost proxy. `map`/`unmap` count 2 MiB pages
/// (`cuMemCreate`+`cuMemMap` and `cuMemUnmap`+`cuMemRelease` are per handle);
/// `synchronize` counts the stream or device synchronisations the policy made so that
/// it could unmap memory freed on a stream (`cuMemUnmap` is not stream-ordered). A
/// `cudaFree` synchronises the device by itself: it is counted in `cuda_free` only.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DriverCalls {
    pub cuda_malloc: u64,
    pub cuda_free: u64,
    pub map: u64,
    pub unmap: u64,
    pub synchronize: u64,
}

/// When a page freed on a stream may be unmapped, to be mapped elsewhere or given back.
///
/// Kernels queued on the stream before the free may still use the page, and `cuMemUnmap`
/// is not stream-ordered, so the unmap must wait until that work is done: PyTorch runs
/// `cudaStreamSynchronize` before unmapping expandable segments. Reuse where the page is
/// mapped needs no wait (the stream's later kernels run after its earlier ones). When a
/// stream's work really completes is not in a recording, so the policies do not assume
/// it: a page freed since the stream's last synchronisation moves only after another.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Reclaim {
    /// Synchronise the stream whenever moving freed pages would spare a new page
    /// (counted in [`DriverCalls::synchronize`]): the fewest pages, at the cost of
    /// synchronisations in the training loop.
    #[default]
    Synchronize,
    /// Never synchronise to move a page: a freed page moves only after a synchronisation
    /// made anyway (`empty_cache`, or the release before an out-of-memory error, which
    /// synchronise); until then it is reused only where it is mapped, and a stream that
    /// needs more pages maps new ones.
    Lazy,
}

impl Reclaim {
    /// Suffix of the policy's name (`""` for the default).
    pub fn suffix(self) -> &'static str {
        match self {
            Reclaim::Synchronize => "",
            Reclaim::Lazy => ":lazy",
        }
    }
}

/// Map `n` pages from `addr`, one handle each (the relocation unit: a mapped handle
/// cannot be split, so a page that may move alone is mapped alone). All or nothing.
pub(crate) fn map_pages<D: DeviceMemory>(dev: &mut D, addr: Addr, n: u64) -> bool {
    for i in 0..n {
        if !dev.map(addr + i * PAGE, PAGE) {
            if i > 0 {
                dev.unmap(addr, i * PAGE);
            }
            return false;
        }
    }
    true
}

/// A request the policy could not serve on this device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PolicyOom {
    pub requested: u64,
    pub stream: StreamId,
    /// Bytes the policy held when it gave up.
    pub reserved: u64,
}

/// `free` of an address that is not a live block of the policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnknownBlock(pub Addr);

/// An allocation policy serving requests over simulated (or, later, real) device memory.
pub trait Policy {
    /// Short name, as `--allocator` takes it.
    fn name(&self) -> String;
    /// Serve `size` bytes on `stream`.
    fn malloc(&mut self, size: u64, stream: StreamId) -> Result<Addr, PolicyOom>;
    /// The block at `addr` is free and its stream's work on it is complete.
    fn free(&mut self, addr: Addr) -> Result<(), UnknownBlock>;
    /// Bytes held from the device (segments and mapped pages), as `memory_reserved()`.
    fn reserved(&self) -> u64;
    fn calls(&self) -> DriverCalls;
    /// The call site of the next request (an opaque key; 0 = unknown). Policies that
    /// predict lifetimes use it; the others ignore it.
    fn hint_site(&mut self, _site: u64) {}
    /// The program called `torch.cuda.empty_cache()` (or PyTorch released its cache
    /// after a failed `cudaMalloc`): give back the memory that holds no live block, as
    /// the policy would when asked. Default: nothing (a policy without a cache to give
    /// back, or one that gives memory back at each free).
    fn empty_cache(&mut self) {}
    /// Internal consistency (for tests): accounting agrees with the device.
    fn check(&self) -> Result<(), InvariantError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests;

/// Hash maps keyed by addresses and small keys: a multiplicative hash whose halves are
/// swapped, so the well-mixed high bits pick the bucket (addresses are 512-aligned).
pub(crate) type FastMap<K, V> = std::collections::HashMap<K, V, std::hash::BuildHasherDefault<MulHasher>>;

#[derive(Clone, Copy, Default)]
pub(crate) struct MulHasher(u64);

impl std::hash::Hasher for MulHasher {
    #[inline]
    fn finish(&self) -> u64 {
        self.0.rotate_left(32)
    }
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(b as u64);
        }
    }
    #[inline]
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
    #[inline]
    fn write_u32(&mut self, n: u32) {
        self.write_u64(n as u64)
    }
}
