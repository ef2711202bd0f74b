//! `PYTORCH_NO_CUDA_MEMORY_CACHING=1`: PyTorch's bypass of the caching allocator.
//!
//! With the variable set (or after `torch.cuda.memory.caching_allocator_enable(False)`),
//! `CUDACachingAllocator`'s `allocate` calls `cudaMalloc(&ptr, size)` with the size the
//! tensor asked for — no 512-byte rounding, no 2 MiB / 20 MiB segment sizes, no pools —
//! and the deleter (`uncached_delete`) calls `cudaFree(ptr)` as soon as the tensor is
//! released. Nothing is cached, so memory held equals the bytes of live tensors; but
//! every allocation is a driver call and every `cudaFree` waits for all work queued on
//! the device (spec §9.4). PyTorch keeps no statistics and records no trace in this
//! mode, which is why it can only be *replayed*, never compared with a recording.
//!
//! [`UncachedAllocator`] counts what that mode would do: bytes held, peak, `cudaMalloc`
//! and `cudaFree` calls, and allocations that would not have fitted the device. The
//! driver's own page granularity (the memory `cudaMalloc` really takes for a request)
//! is not documented and not modelled: the bytes held are the requests' sum, a lower
//! bound of what the device would show.

use std::collections::HashMap;

use crate::Addr;

/// The uncached mode on one device (module doc).
#[derive(Clone, Debug, Default)]
pub struct UncachedAllocator {
    capacity: u64,
    /// Live allocations: synthetic address → bytes.
    live: HashMap<Addr, u64>,
    next_addr: Addr,
    /// Bytes held now (sum of live requests).
    pub in_use: u64,
    /// Highest `in_use`.
    pub peak: u64,
    pub cuda_mallocs: u64,
    pub cuda_frees: u64,
    /// Requests that did not fit (`in_use + size > capacity`): `cudaMalloc` failed.
    pub ooms: u64,
}

impl UncachedAllocator {
    /// A device of `capacity` bytes, nothing allocated.
    pub fn new(capacity: u64) -> Self {
        UncachedAllocator { capacity, next_addr: 1 << 40, ..Default::default() }
    }

    /// Memory allocated before the replay starts (tensors alive before the trace):
    /// held, but no `cudaMalloc` counted for it.
    pub fn adopt(&mut self, size: u64) -> Addr {
        self.place(size)
    }

    fn place(&mut self, size: u64) -> Addr {
        let a = self.next_addr;
        // Synthetic, never reused, 512-aligned like a real device pointer.
        self.next_addr += size.max(1).div_ceil(512) * 512;
        self.live.insert(a, size);
        self.in_use += size;
        self.peak = self.peak.max(self.in_use);
        a
    }

    /// `cudaMalloc(size)`: `None` when it does not fit (the call still counts: it was made).
    pub fn malloc(&mut self, size: u64) -> Option<Addr> {
        self.cuda_mallocs += 1;
        if self.in_use.saturating_add(size) > self.capacity {
            self.ooms += 1;
            return None;
        }
        Some(self.place(size))
    }

    /// Would `size` more bytes fit now?
    pub fn fits(&self, size: u64) -> bool {
        self.in_use.saturating_add(size) <= self.capacity
    }

    /// `cudaFree(addr)`; `false` for an address not allocated here.
    pub fn free(&mut self, addr: Addr) -> bool {
        match self.live.remove(&addr) {
            Some(size) => {
                self.in_use -= size;
                self.cuda_frees += 1;
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_sizes_one_call_each_and_failures_counted() {
        let mut a = UncachedAllocator::new(10_000);
        let x = a.malloc(1000).unwrap();
        let y = a.malloc(1).unwrap();
        assert_eq!(a.in_use, 1001, "no 512-byte rounding in uncached mode");
        assert!(a.malloc(9_000).is_none());
        assert_eq!((a.cuda_mallocs, a.ooms), (3, 1));
        assert!(a.free(x));
        assert!(!a.free(x), "double free is refused");
        assert!(a.free(y));
        assert_eq!((a.in_use, a.peak, a.cuda_frees), (0, 1001, 2));
        let z = a.adopt(500);
        assert_eq!(a.cuda_mallocs, 3, "adopted memory was allocated before the replay");
        assert!(a.free(z));
    }
}
