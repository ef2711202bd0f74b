//! [`StrictVmm`]: a [`DeviceMemory`] that enforces the rules CUDA's driver puts on
//! `cudaMalloc`/`cudaFree` and on virtual memory management (`cuMemAddressReserve`,
//! `cuMemCreate` + `cuMemMap`, `cuMemUnmap` + `cuMemRelease`, `cuMemAddressFree`), so that
//! a policy tested on it could drive a real device through the same calls.
//!
//! The rules (CUDA driver API, "Virtual Memory Management"; shared/research/allocators.md
//! §3):
//!
//! * a mapping is made inside a reservation, at a multiple of the granularity (2 MiB on
//!   current NVIDIA GPUs), over address space that is not mapped already (no double map);
//! * a mapped handle cannot be split: `cuMemUnmap` takes whole mappings — here an unmap
//!   must cover exactly a run of whole mappings, every byte of it mapped;
//! * `cuMemAddressFree` takes a whole reservation with nothing mapped in it; `cudaFree`
//!   takes a pointer `cudaMalloc` returned, with its size;
//! * memory the program uses must stay mapped while it uses it: the harness says which
//!   blocks the program holds ([`StrictVmm::use_block`], [`StrictVmm::end_block`]); a
//!   block must lie in mapped (or `cudaMalloc`ed) memory when handed out, and no unmap or
//!   free may take memory under a block still held.
//!
//! Each [`DeviceMemory::map`] call is one handle (`cuMemCreate` of that size, then
//! `cuMemMap`), each [`DeviceMemory::unmap`] `cuMemUnmap` of the handles in the range and
//! their `cuMemRelease` (the physical memory goes back to the device). Physical use is
//! the bytes of the mappings and `cudaMalloc` segments; a call that would pass the
//! capacity fails, as the driver's `CUDA_ERROR_OUT_OF_MEMORY`.
//!
//! A violation never panics: it is recorded ([`StrictVmm::violations`]) and the call goes
//! on as the driver would have refused it (nothing changes). The device is a shared
//! handle (`Clone` shares the state), so a test keeps one while a policy owns another.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;

use crate::device::{DeviceMemory, SYNTHETIC_ALIGN, SYNTHETIC_BASE};
use crate::Addr;

/// The VMM granularity (`cuMemGetAllocationGranularity` on current NVIDIA GPUs).
pub const GRANULARITY: u64 = 2 << 20;

/// Violations kept in full (the rest are counted).
const KEEP: usize = 20;

#[derive(Debug, Default)]
struct State {
    capacity: u64,
    used: u64,
    next_va: Addr,
    reservations: BTreeMap<Addr, u64>,
    mappings: BTreeMap<Addr, u64>,
    segments: BTreeMap<Addr, u64>,
    blocks: BTreeMap<Addr, u64>,
    violations: Vec<String>,
    violation_count: u64,
}

/// A device with a capacity that checks every call against CUDA's rules (module doc).
#[derive(Clone, Debug)]
pub struct StrictVmm {
    s: Rc<RefCell<State>>,
}

/// The entry of `m` that holds `a` (start ≤ a < end).
fn holding(m: &BTreeMap<Addr, u64>, a: Addr) -> Option<(Addr, u64)> {
    m.range(..=a).next_back().map(|(&s, &l)| (s, l)).filter(|&(s, l)| a < s.saturating_add(l))
}

/// An entry of `m` overlapping `[a, end)`.
fn overlapping(m: &BTreeMap<Addr, u64>, a: Addr, end: Addr) -> Option<(Addr, u64)> {
    m.range(..end).next_back().map(|(&s, &l)| (s, l)).filter(|&(s, l)| s.saturating_add(l) > a)
}

impl State {
    fn violate(&mut self, what: String) {
        self.violation_count += 1;
        if self.violations.len() < KEEP {
            self.violations.push(what);
        }
    }

    fn fresh_va(&mut self, size: u64) -> Option<Addr> {
        let a = self.next_va;
        self.next_va = a.checked_add(size.max(1).checked_next_multiple_of(SYNTHETIC_ALIGN)?)?;
        Some(a)
    }

    fn fits(&self, size: u64) -> bool {
        self.used.checked_add(size).is_some_and(|u| u <= self.capacity)
    }

    /// Is `[a, a+size)` all mapped or inside one `cudaMalloc` segment?
    fn accessible(&self, a: Addr, size: u64) -> bool {
        let end = a.saturating_add(size.max(1));
        if holding(&self.segments, a).is_some_and(|(s, l)| end <= s + l) {
            return true;
        }
        let mut cur = a;
        while cur < end {
            match holding(&self.mappings, cur) {
                Some((s, l)) => cur = s + l,
                None => return false,
            }
        }
        true
    }

    /// A held block overlapping `[a, end)`.
    fn block_in(&self, a: Addr, end: Addr) -> Option<(Addr, u64)> {
        overlapping(&self.blocks, a, end)
    }
}

impl StrictVmm {
    /// A device of `capacity` bytes, nothing reserved or mapped.
    pub fn new(capacity: u64) -> Self {
        let s = State { capacity, next_va: SYNTHETIC_BASE, ..Default::default() };
        StrictVmm { s: Rc::new(RefCell::new(s)) }
    }

    /// Physical bytes in use (mappings and `cudaMalloc` segments).
    pub fn used(&self) -> u64 {
        self.s.borrow().used
    }

    /// Mapped bytes (mappings only).
    pub fn mapped(&self) -> u64 {
        self.s.borrow().mappings.values().sum()
    }

    /// The first violations (at most 20) and how many there were in all.
    pub fn violations(&self) -> (Vec<String>, u64) {
        let s = self.s.borrow();
        (s.violations.clone(), s.violation_count)
    }

    /// The program holds `[addr, addr+size)` from now on: it must be accessible.
    pub fn use_block(&self, addr: Addr, size: u64) {
        let mut s = self.s.borrow_mut();
        if !s.accessible(addr, size) {
            s.violate(format!("block [{addr:#x}, +{size}) handed out over memory that is not mapped"));
        }
        if let Some((b, l)) = s.block_in(addr, addr.saturating_add(size)) {
            s.violate(format!("block [{addr:#x}, +{size}) overlaps held block [{b:#x}, +{l})"));
        }
        s.blocks.insert(addr, size);
    }

    /// The program no longer holds the block at `addr`.
    pub fn end_block(&self, addr: Addr) {
        let mut s = self.s.borrow_mut();
        if s.blocks.remove(&addr).is_none() {
            s.violate(format!("end of block {addr:#x}, which is not held"));
        }
    }

    /// Check that every held block is still accessible (slow: for the end of a test).
    pub fn check_blocks(&self) {
        let mut s = self.s.borrow_mut();
        let bad: Vec<(Addr, u64)> =
            s.blocks.iter().map(|(&a, &l)| (a, l)).filter(|&(a, l)| !s.accessible(a, l)).take(3).collect();
        for (a, l) in bad {
            s.violate(format!("held block [{a:#x}, +{l}) lies in memory that is not mapped"));
        }
    }
}

impl DeviceMemory for StrictVmm {
    fn malloc(&mut self, size: u64) -> Option<Addr> {
        let mut s = self.s.borrow_mut();
        if size == 0 || !s.fits(size) {
            return None;
        }
        let a = s.fresh_va(size)?;
        s.segments.insert(a, size);
        s.used += size;
        Some(a)
    }

    fn free(&mut self, addr: Addr, size: u64) {
        let mut s = self.s.borrow_mut();
        match s.segments.get(&addr) {
            Some(&l) if l == size => {}
            Some(&l) => return s.violate(format!("cudaFree({addr:#x}) of {size} bytes; cudaMalloc gave {l}")),
            None => return s.violate(format!("cudaFree({addr:#x}): not a pointer cudaMalloc returned")),
        }
        if let Some((b, l)) = s.block_in(addr, addr + size) {
            return s.violate(format!("cudaFree({addr:#x}) under held block [{b:#x}, +{l})"));
        }
        s.segments.remove(&addr);
        s.used -= size;
    }

    fn reserve(&mut self, size: u64) -> Option<Addr> {
        let mut s = self.s.borrow_mut();
        if size == 0 || !size.is_multiple_of(GRANULARITY) {
            s.violate(format!("cuMemAddressReserve of {size} bytes: not a multiple of the granularity"));
            return None;
        }
        let a = s.fresh_va(size)?;
        s.reservations.insert(a, size);
        Some(a)
    }

    fn map(&mut self, addr: Addr, size: u64) -> bool {
        let mut s = self.s.borrow_mut();
        let Some(end) = addr.checked_add(size) else { return false };
        if size == 0 || !addr.is_multiple_of(GRANULARITY) || !size.is_multiple_of(GRANULARITY) {
            s.violate(format!("cuMemMap([{addr:#x}, +{size})): not at multiples of the granularity"));
            return false;
        }
        if holding(&s.reservations, addr).is_none_or(|(r, l)| end > r + l) {
            s.violate(format!("cuMemMap([{addr:#x}, +{size})) outside any reservation"));
            return false;
        }
        if let Some((m, l)) = overlapping(&s.mappings, addr, end) {
            s.violate(format!("cuMemMap([{addr:#x}, +{size})) over mapping [{m:#x}, +{l}): double map"));
            return false;
        }
        if !s.fits(size) {
            return false;
        }
        s.mappings.insert(addr, size);
        s.used += size;
        true
    }

    fn unmap(&mut self, addr: Addr, size: u64) {
        let mut s = self.s.borrow_mut();
        let end = addr.saturating_add(size);
        // Whole mappings, tiling the range exactly.
        let mut cur = addr;
        let mut whole: Vec<Addr> = Vec::new();
        if let Some((m, l)) = holding(&s.mappings, addr) {
            if m != addr {
                return s.violate(format!(
                    "cuMemUnmap([{addr:#x}, +{size})) splits mapping [{m:#x}, +{l}) (starts inside it)"
                ));
            }
        }
        while cur < end {
            match s.mappings.get(&cur) {
                Some(&l) => {
                    whole.push(cur);
                    cur += l;
                }
                None => {
                    return s.violate(format!(
                        "cuMemUnmap([{addr:#x}, +{size})): {cur:#x} is not the start of a mapping (unmapped memory)"
                    ))
                }
            }
        }
        if cur != end {
            return s.violate(format!("cuMemUnmap([{addr:#x}, +{size})) splits the mapping that ends at {cur:#x}"));
        }
        if let Some((b, l)) = s.block_in(addr, end) {
            return s.violate(format!("cuMemUnmap([{addr:#x}, +{size})) under held block [{b:#x}, +{l})"));
        }
        for m in whole {
            s.mappings.remove(&m);
        }
        s.used -= size;
    }

    fn release_reservation(&mut self, addr: Addr, size: u64) {
        let mut s = self.s.borrow_mut();
        match s.reservations.get(&addr) {
            Some(&l) if l == size => {}
            _ => return s.violate(format!("cuMemAddressFree([{addr:#x}, +{size})): not a whole reservation")),
        }
        if let Some((m, l)) = overlapping(&s.mappings, addr, addr + size) {
            return s
                .violate(format!("cuMemAddressFree([{addr:#x}, +{size})) with mapping [{m:#x}, +{l}) still in it"));
        }
        s.reservations.remove(&addr);
    }

    fn total_memory(&self) -> u64 {
        self.s.borrow().capacity
    }

    fn free_memory(&self) -> u64 {
        let s = self.s.borrow();
        s.capacity.saturating_sub(s.used)
    }

    fn adopt_allocation(&mut self, addr: Addr, size: u64) {
        let mut s = self.s.borrow_mut();
        s.segments.insert(addr, size);
        s.used += size;
        if addr >= s.next_va {
            s.next_va = (addr + size).next_multiple_of(SYNTHETIC_ALIGN);
        }
    }

    fn adopt_reservation(&mut self, addr: Addr, size: u64) {
        let mut s = self.s.borrow_mut();
        s.reservations.insert(addr, size);
        if addr >= s.next_va {
            s.next_va = (addr + size).next_multiple_of(SYNTHETIC_ALIGN);
        }
    }

    fn adopt_mapping(&mut self, addr: Addr, size: u64) {
        let mut s = self.s.borrow_mut();
        s.mappings.insert(addr, size);
        s.used += size;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    const P: u64 = GRANULARITY;

    #[test]
    fn the_rules_are_enforced() {
        let mut d = StrictVmm::new(8 * P);
        let v = d.reserve(16 * P).unwrap();
        assert!(d.map(v, 2 * P) && d.map(v + 2 * P, P));
        assert_eq!(d.violations().1, 0);
        // Double map, and a map outside any reservation.
        assert!(!d.map(v + P, P));
        assert!(!d.map(v + 64 * P, P));
        assert_eq!(d.violations().1, 2);
        // Unmapping half of a mapping, or unmapped memory, is refused; whole ones go.
        d.unmap(v, P);
        d.unmap(v + 3 * P, P);
        assert_eq!(d.violations().1, 4);
        assert_eq!(d.used(), 3 * P);
        d.use_block(v + P, 100);
        d.unmap(v, 3 * P);
        assert_eq!(d.violations().1, 5, "{:?}", d.violations());
        d.end_block(v + P);
        d.unmap(v, 3 * P);
        assert_eq!((d.used(), d.violations().1), (0, 5));
        // A block over unmapped memory; capacity.
        d.use_block(v, 10);
        assert_eq!(d.violations().1, 6);
        assert!(!d.map(v, 9 * P), "over capacity: refused, not a violation");
        assert_eq!(d.violations().1, 6);
        // cudaFree of a pointer cudaMalloc did not return; release of a mapped reservation.
        let m = d.malloc(3 << 20).unwrap();
        d.free(m + 512, 3 << 20);
        assert!(d.map(v + 4 * P, P));
        d.release_reservation(v, 16 * P);
        assert_eq!(d.violations().1, 8, "{:?}", d.violations());
        d.free(m, 3 << 20);
        assert_eq!(d.used(), P);
    }
}
