//! What an alternative costs in driver work: counts, not times.
//!
//! The replay knows exactly which driver calls PyTorch's allocator would make, so it counts
//! them: `cudaMalloc` / `cudaFree` of whole segments by size class, the pages an expandable
//! segment maps and unmaps, and the synchronisations those calls imply:
//!
//! * `cudaFree` synchronises the device (PyTorch's own source says so where it avoids it:
//!   "unlike cudaFree, MemUnmap and MemRelease do not appear to synchronize", the note over
//!   `ExpandableSegment::unmapHandles` in `c10/cuda/CUDACachingAllocator.cpp`);
//! * unmapping pages of an expandable segment is preceded by a `cudaStreamSynchronize` of
//!   the segment's stream (same place), then one `cuMemUnmap` + `cuMemRelease` per page;
//!   mapping creates one physical handle per page (`cuMemCreate`, `cuMemMap`) and sets
//!   access once per mapped range (spec §6.1).
//!
//! No time is given. The only published per-call latency that was at hand measured about
//! 1 µs under 256 B and about 50 µs at 4–512 KB on 2009 hardware, and "increasing
//! significantly" above; PyTorch's segments are 2 MiB to several GiB, so that figure says
//! nothing about them, and what a `cudaFree` really costs is the wait for the work queued
//! on the device, which depends on the program. A time would need a size-dependent model
//! from a cited measurement or a measurement on the user's GPU; none was made here.

use fragscope_alloc::Event;
use serde::Serialize;

/// Upper bounds (inclusive) of the size classes of [`DriverWork::cuda_malloc_by_size`]: the
/// small-pool segment, the 20 MiB large-pool segment, then wider ranges; the last class
/// has no bound.
pub const SIZE_CLASSES: [Option<u64>; 5] = [Some(2 << 20), Some(20 << 20), Some(256 << 20), Some(2 << 30), None];

/// Calls of one size class.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SizeClassCalls {
    /// Largest segment size in the class, bytes (null: no bound).
    pub max_bytes: Option<u64>,
    pub calls: u64,
}

/// Driver work of one replay, counted from the allocator's events (module doc).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DriverWork {
    /// `cudaMalloc` of whole segments, by segment size ([`SIZE_CLASSES`]).
    pub cuda_malloc_by_size: Vec<SizeClassCalls>,
    /// `cudaFree` of whole segments, by segment size.
    pub cuda_free_by_size: Vec<SizeClassCalls>,
    /// Pages mapped into expandable segments (one physical allocation each).
    pub pages_mapped: u64,
    /// Pages unmapped from expandable segments (one `cuMemUnmap` + `cuMemRelease` each).
    pub pages_unmapped: u64,
    /// Device synchronisations: one per `cudaFree`.
    pub device_syncs: u64,
    /// Stream synchronisations: one before each unmapped range of an expandable segment.
    pub stream_syncs: u64,
}

impl Default for DriverWork {
    fn default() -> Self {
        let classes = || SIZE_CLASSES.iter().map(|&max_bytes| SizeClassCalls { max_bytes, calls: 0 }).collect();
        DriverWork {
            cuda_malloc_by_size: classes(),
            cuda_free_by_size: classes(),
            pages_mapped: 0,
            pages_unmapped: 0,
            device_syncs: 0,
            stream_syncs: 0,
        }
    }
}

fn class_of(size: u64) -> usize {
    SIZE_CLASSES.iter().position(|c| c.is_none_or(|m| size <= m)).unwrap_or(SIZE_CLASSES.len() - 1)
}

/// Page size of an expandable mapping of `size` bytes: the small pool maps 2 MiB pages, the
/// large pool 20 MiB ones (spec §6.1); a size that is not a multiple of 20 MiB is small-pool.
fn page_of(size: u64) -> u64 {
    if size.is_multiple_of(20 << 20) {
        20 << 20
    } else {
        2 << 20
    }
}

impl DriverWork {
    /// Count one allocator event.
    pub fn observe(&mut self, e: &Event) {
        match *e {
            Event::SegmentAlloc { size, .. } => self.cuda_malloc_by_size[class_of(size)].calls += 1,
            Event::SegmentFree { size, .. } => {
                self.cuda_free_by_size[class_of(size)].calls += 1;
                self.device_syncs += 1;
            }
            Event::SegmentMap { size, .. } => self.pages_mapped += size.div_ceil(page_of(size)),
            Event::SegmentUnmap { size, .. } => {
                self.pages_unmapped += size.div_ceil(page_of(size));
                self.stream_syncs += 1;
            }
            _ => {}
        }
    }

    /// The work of `PYTORCH_NO_CUDA_MEMORY_CACHING=1`: one `cudaMalloc` per tensor and one
    /// `cudaFree` (a device synchronisation) per free, sizes not kept.
    pub fn uncached(mallocs: u64, frees: u64) -> Self {
        let mut w = DriverWork::default();
        // sizes are not tracked for the uncached replay: all in the unbounded class
        let last = SIZE_CLASSES.len() - 1;
        w.cuda_malloc_by_size[last].max_bytes = None;
        w.cuda_malloc_by_size[last].calls = mallocs;
        w.cuda_free_by_size[last].calls = frees;
        w.device_syncs = frees;
        w
    }

    /// All synchronisations the calls imply (device and stream).
    pub fn syncs(&self) -> u64 {
        self.device_syncs + self.stream_syncs
    }
}

/// The line printed under every table with a `syncs` column.
pub const SYNCS_NOTE: &str = "syncs: synchronisations the driver calls imply (each cudaFree waits for the device; \
     unmapping expandable pages first waits for the stream). No time is shown: no per-call cost measured for \
     segments of these sizes is published, and none was measured here (docs/GUIDE.md, \"What does each \
     alternative cost?\")";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_by_class_pages_and_syncs() {
        let mut w = DriverWork::default();
        for e in [
            Event::SegmentAlloc { addr: 0, size: 2 << 20, stream: 0 },
            Event::SegmentAlloc { addr: 0, size: 20 << 20, stream: 0 },
            Event::SegmentAlloc { addr: 0, size: 3 << 30, stream: 0 },
            Event::SegmentFree { addr: 0, size: 22 << 20, stream: 0 },
            Event::SegmentMap { addr: 0, size: 60 << 20, stream: 0 },
            Event::SegmentMap { addr: 0, size: 6 << 20, stream: 0 },
            Event::SegmentUnmap { addr: 0, size: 40 << 20, stream: 0 },
        ] {
            w.observe(&e);
        }
        let calls = |v: &[SizeClassCalls]| v.iter().map(|c| c.calls).collect::<Vec<_>>();
        assert_eq!(calls(&w.cuda_malloc_by_size), vec![1, 1, 0, 0, 1]);
        assert_eq!(calls(&w.cuda_free_by_size), vec![0, 0, 1, 0, 0]);
        assert_eq!(w.pages_mapped, 3 + 3);
        assert_eq!(w.pages_unmapped, 2);
        assert_eq!((w.device_syncs, w.stream_syncs, w.syncs()), (1, 1, 2));
    }
}
