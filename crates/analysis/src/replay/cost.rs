//! What an alternative costs in driver calls, and a time estimate from published
//! per-call latencies.
//!
//! The replay counts driver calls exactly: `cudaMalloc` (a new segment, or a page
//! mapped into an expandable segment — `cuMemCreate` + `cuMemMap` + `cuMemSetAccess`),
//! `cudaFree` (a released segment, or an unmapped page). Their time is not in any
//! snapshot, so it is *estimated*: calls × a per-call latency from published
//! measurements (docs/GUIDE.md, "What does it cost?", cites them):
//!
//! * `cudaMalloc`: about 50 µs per call for 4 KB – 512 KB, more for larger sizes
//!   (University of Virginia CUDA support pages, "Memory Allocation Overhead",
//!   <https://www.cs.virginia.edu/~mwb7w/cuda_support/memory_management_overhead.html>).
//!   The caching allocator asks for 2 MiB or more, so 50 µs is a floor.
//! * `cudaFree`: the same figure is used for the call; on top of it, `cudaFree`
//!   synchronises the GPU across all streams (CUDA Programming Guide, "Stream-Ordered
//!   Memory Allocator", §4.3.1), which stalls the CPU until queued kernels finish. That
//!   wait depends on the workload and is *not* in the estimate.
//! * Page map / unmap (expandable segments): PyTorch's own source calls changing
//!   mappings "an expensive operation" with "some synchronous actions with the GPU"
//!   (pytorch/pytorch PR #96995, `CUDACachingAllocator.cpp`); no per-call figure is
//!   published there, so the `cudaMalloc` figure stands in.
//!
//! The estimate is a lower bound of the time the calls take, not a measurement.

/// Estimated latency of one `cudaMalloc` (or page map), microseconds.
pub const CUDA_MALLOC_US: f64 = 50.0;
/// Estimated latency of one `cudaFree` (or page unmap) call, microseconds, without the
/// device synchronisation it implies.
pub const CUDA_FREE_US: f64 = 50.0;

/// The line printed under every table with an estimate.
pub const ESTIMATE_NOTE: &str = "driver time (est.): an estimate, 50 µs per cudaMalloc/cudaFree/map/unmap from published measurements (docs/GUIDE.md), not counting the device synchronisation each cudaFree adds";

/// Estimated seconds spent in `mallocs` + `frees` driver calls (module doc).
pub fn driver_seconds(mallocs: u64, frees: u64) -> f64 {
    (mallocs as f64 * CUDA_MALLOC_US + frees as f64 * CUDA_FREE_US) / 1e6
}

/// `1.23 s`, `45 ms`, `0 s`: a duration for tables.
pub fn format_seconds(s: f64) -> String {
    if s == 0.0 {
        "0 s".into()
    } else if s >= 1.0 {
        format!("{s:.2} s")
    } else if s >= 1e-3 {
        format!("{:.1} ms", s * 1e3)
    } else {
        format!("{:.0} µs", s * 1e6)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_times_latency() {
        assert_eq!(driver_seconds(0, 0), 0.0);
        assert!((driver_seconds(1000, 1000) - 0.1).abs() < 1e-12);
        assert_eq!(format_seconds(0.1), "100.0 ms");
        assert_eq!(format_seconds(2.5), "2.50 s");
        assert_eq!(format_seconds(50e-6), "50 µs");
    }
}
