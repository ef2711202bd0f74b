//! Device memory as the allocator policy sees it: `cudaMalloc`/`cudaFree`,
//! VA reservations and page mapping for expandable segments, `cudaMemGetInfo`.
//!
//! [`SimulatedDevice`] backs the replay: either it invents addresses
//! ([`AddressSource::Synthetic`]) or it hands back the addresses a recorded trace
//! says CUDA returned ([`AddressSource::Oracle`]), so that a recorded OOM or a
//! recorded absence of `cudaMalloc` is reproduced by construction.

use crate::Addr;
use std::collections::VecDeque;

/// What the caching policy needs from device memory. A real CUDA backend will
/// implement it later.
pub trait DeviceMemory {
    /// `cudaMalloc(size)`; `None` = `cudaErrorMemoryAllocation`.
    fn malloc(&mut self, size: u64) -> Option<Addr>;
    /// `cudaFree`.
    fn free(&mut self, addr: Addr, size: u64);
    /// Reserve `size` bytes of virtual address space (no physical memory).
    fn reserve(&mut self, size: u64) -> Option<Addr>;
    /// Back `[addr, addr+size)` with physical memory: one handle (`cuMemCreate` of
    /// `size`, then `cuMemMap`); all or nothing; false = OOM. A handle cannot be split
    /// later, so callers that unmap page by page map page by page.
    fn map(&mut self, addr: Addr, size: u64) -> bool;
    /// `cuMemUnmap` of the whole handles that tile `[addr, addr+size)`, and their
    /// `cuMemRelease`: the physical memory goes back to the device. Not stream-ordered:
    /// the caller must know no queued kernel still uses the range (PyTorch synchronises
    /// first). [`crate::StrictVmm`] checks the rules.
    fn unmap(&mut self, addr: Addr, size: u64);
    fn release_reservation(&mut self, addr: Addr, size: u64);
    /// `cudaMemGetInfo` total.
    fn total_memory(&self) -> u64;
    /// `cudaMemGetInfo` free.
    fn free_memory(&self) -> u64;
    /// A segment that existed before the allocator was seeded: account for it
    /// as if `malloc` had returned it. Default: nothing to do.
    fn adopt_allocation(&mut self, _addr: Addr, _size: u64) {}
    /// A VA reservation that existed before seeding. Default: nothing to do.
    fn adopt_reservation(&mut self, _addr: Addr, _size: u64) {}
    /// Pages that were mapped before seeding. Default: nothing to do.
    fn adopt_mapping(&mut self, _addr: Addr, _size: u64) {}
}

/// Where [`SimulatedDevice`] takes addresses from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AddressSource {
    /// A bump allocator over virtual addresses from [`SYNTHETIC_BASE`], 2 MiB
    /// aligned, never reusing a range, so ranges never overlap.
    Synthetic,
    /// Addresses queued by the replay driver from recorded `segment_alloc`s.
    Oracle,
}

/// First synthetic address.
pub const SYNTHETIC_BASE: Addr = 0x7f00_0000_0000;
/// Alignment of synthetic addresses.
pub const SYNTHETIC_ALIGN: u64 = 2 << 20;

/// An oracle segment whose recorded size differs from the size the policy asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OracleMismatch {
    pub addr: Addr,
    pub recorded_size: u64,
    pub requested_size: u64,
}

/// A device with a capacity and deterministic addresses.
#[derive(Clone, Debug)]
pub struct SimulatedDevice {
    capacity: u64,
    enforce_capacity: bool,
    source: AddressSource,
    used: u64,
    next_va: Addr,
    oracle_segments: VecDeque<(Addr, u64)>,
    oracle_reservations: VecDeque<Addr>,
    mismatches: Vec<OracleMismatch>,
    fail_mallocs: u32,
    fail_maps: u32,
    malloc_calls: u64,
}

impl SimulatedDevice {
    /// Synthetic addresses; `malloc`/`map` fail when `capacity` would be exceeded.
    pub fn synthetic(capacity: u64) -> Self {
        Self::new(capacity, AddressSource::Synthetic)
    }

    /// Oracle addresses; `capacity` is only reported (`total_memory`, and the
    /// size of expandable reservations) unless [`Self::set_enforce_capacity`].
    pub fn oracle(capacity: u64) -> Self {
        Self::new(capacity, AddressSource::Oracle)
    }

    pub fn new(capacity: u64, source: AddressSource) -> Self {
        SimulatedDevice {
            capacity,
            enforce_capacity: source == AddressSource::Synthetic,
            source,
            used: 0,
            next_va: SYNTHETIC_BASE,
            oracle_segments: VecDeque::new(),
            oracle_reservations: VecDeque::new(),
            mismatches: Vec::new(),
            fail_mallocs: 0,
            fail_maps: 0,
            malloc_calls: 0,
        }
    }

    pub fn source(&self) -> AddressSource {
        self.source
    }
    pub fn capacity(&self) -> u64 {
        self.capacity
    }
    pub fn set_capacity(&mut self, capacity: u64) {
        self.capacity = capacity;
    }
    /// Make an oracle device also fail when capacity would be exceeded.
    pub fn set_enforce_capacity(&mut self, on: bool) {
        self.enforce_capacity = on;
    }
    /// Physical bytes in use (segments plus mapped pages).
    pub fn used(&self) -> u64 {
        self.used
    }
    /// Number of `malloc` calls so far (successful or not).
    pub fn malloc_calls(&self) -> u64 {
        self.malloc_calls
    }

    /// Oracle: the next `malloc` returns this recorded segment.
    pub fn push_oracle_segment(&mut self, addr: Addr, size: u64) {
        self.oracle_segments.push_back((addr, size));
    }
    /// Oracle: the next `reserve` returns this base (else a synthetic one).
    pub fn push_oracle_reservation(&mut self, addr: Addr) {
        self.oracle_reservations.push_back(addr);
    }
    /// Recorded segments not consumed yet.
    pub fn pending_oracle_segments(&self) -> usize {
        self.oracle_segments.len()
    }
    #[inline]
    pub fn clear_oracle(&mut self) {
        if !self.oracle_segments.is_empty() {
            self.oracle_segments.clear();
        }
        if !self.oracle_reservations.is_empty() {
            self.oracle_reservations.clear();
        }
    }
    /// The next `malloc` fails (whatever the mode), e.g. a recorded OOM.
    pub fn fail_next_malloc(&mut self) {
        self.fail_mallocs += 1;
    }
    /// The next `map` fails.
    pub fn fail_next_map(&mut self) {
        self.fail_maps += 1;
    }
    /// Oracle segments handed out with a size other than requested.
    pub fn mismatches(&self) -> &[OracleMismatch] {
        &self.mismatches
    }
    pub fn take_mismatches(&mut self) -> Vec<OracleMismatch> {
        std::mem::take(&mut self.mismatches)
    }

    fn fits(&self, size: u64) -> bool {
        !self.enforce_capacity || self.used.checked_add(size).is_some_and(|u| u <= self.capacity)
    }

    fn bump(&mut self, size: u64) -> Option<Addr> {
        let addr = self.next_va;
        let span = size.max(1).checked_next_multiple_of(SYNTHETIC_ALIGN)?;
        self.next_va = addr.checked_add(span)?;
        Some(addr)
    }

    fn note_range(&mut self, addr: Addr, size: u64) {
        // Keep synthetic addresses clear of ranges that came from elsewhere.
        if let Some(end) = addr.checked_add(size) {
            if end > self.next_va && addr >= SYNTHETIC_BASE {
                self.next_va = end.next_multiple_of(SYNTHETIC_ALIGN);
            }
        }
    }
}

impl DeviceMemory for SimulatedDevice {
    fn malloc(&mut self, size: u64) -> Option<Addr> {
        self.malloc_calls += 1;
        if self.fail_mallocs > 0 {
            self.fail_mallocs -= 1;
            return None;
        }
        if !self.fits(size) {
            return None;
        }
        let addr = match self.source {
            AddressSource::Synthetic => self.bump(size)?,
            AddressSource::Oracle => {
                let (addr, recorded) = self.oracle_segments.pop_front()?;
                if recorded != size {
                    self.mismatches.push(OracleMismatch { addr, recorded_size: recorded, requested_size: size });
                }
                addr
            }
        };
        self.used += size;
        Some(addr)
    }

    fn free(&mut self, _addr: Addr, size: u64) {
        self.used = self.used.saturating_sub(size);
    }

    fn reserve(&mut self, size: u64) -> Option<Addr> {
        match self.oracle_reservations.pop_front() {
            Some(a) if self.source == AddressSource::Oracle => {
                self.note_range(a, size);
                Some(a)
            }
            _ => self.bump(size),
        }
    }

    fn map(&mut self, _addr: Addr, size: u64) -> bool {
        if self.fail_maps > 0 {
            self.fail_maps -= 1;
            return false;
        }
        if !self.fits(size) {
            return false;
        }
        self.used += size;
        true
    }

    fn unmap(&mut self, _addr: Addr, size: u64) {
        self.used = self.used.saturating_sub(size);
    }

    fn release_reservation(&mut self, _addr: Addr, _size: u64) {}

    fn total_memory(&self) -> u64 {
        self.capacity
    }

    fn free_memory(&self) -> u64 {
        self.capacity.saturating_sub(self.used)
    }

    fn adopt_allocation(&mut self, addr: Addr, size: u64) {
        self.note_range(addr, size);
        self.used += size;
    }

    fn adopt_reservation(&mut self, addr: Addr, size: u64) {
        self.note_range(addr, size);
    }

    fn adopt_mapping(&mut self, _addr: Addr, size: u64) {
        self.used += size;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synthetic_is_aligned_and_disjoint() {
        let mut d = SimulatedDevice::synthetic(1 << 40);
        let a = d.malloc(1000).unwrap();
        let b = d.malloc(3 << 20).unwrap();
        assert_eq!(a, SYNTHETIC_BASE);
        assert_eq!(b, SYNTHETIC_BASE + SYNTHETIC_ALIGN);
        assert_eq!(d.malloc(1).unwrap(), SYNTHETIC_BASE + 3 * SYNTHETIC_ALIGN);
    }

    #[test]
    fn synthetic_capacity() {
        let mut d = SimulatedDevice::synthetic(4 << 20);
        assert!(d.malloc(2 << 20).is_some());
        assert!(d.malloc(4 << 20).is_none());
        assert_eq!(d.free_memory(), 2 << 20);
    }

    #[test]
    fn oracle_pops_and_records_mismatch() {
        let mut d = SimulatedDevice::oracle(0);
        assert!(d.malloc(2 << 20).is_none(), "nothing queued = recorded failure");
        d.push_oracle_segment(0x1000_0000, 2 << 20);
        d.push_oracle_segment(0x2000_0000, 20 << 20);
        assert_eq!(d.malloc(2 << 20), Some(0x1000_0000));
        assert_eq!(d.malloc(4 << 20), Some(0x2000_0000));
        assert_eq!(
            d.mismatches(),
            &[OracleMismatch { addr: 0x2000_0000, recorded_size: 20 << 20, requested_size: 4 << 20 }]
        );
        d.push_oracle_segment(0x3000_0000, 2 << 20);
        d.fail_next_malloc();
        assert!(d.malloc(2 << 20).is_none());
        assert_eq!(d.malloc(2 << 20), Some(0x3000_0000));
    }
}
