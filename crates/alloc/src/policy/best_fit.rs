//! [`BestFitArenas`]: one growable best-fit-with-coalescing arena per stream, grown and
//! trimmed in 2 MiB pages at its top (virtual memory, as expandable segments).

use super::{map_pages, round512, round_page, Arena, DriverCalls, FastMap, Policy, PolicyOom, UnknownBlock, PAGE};
use crate::device::{DeviceMemory, SimulatedDevice};
use crate::{Addr, InvariantError, StreamId};

/// Virtual address space reserved for one arena.
pub(crate) const ARENA_VA: u64 = 1 << 40;

/// An [`Arena`] at `base` whose pages are mapped up to `mapped` (≥ its top, rounded).
#[derive(Clone, Debug)]
pub(crate) struct PagedArena {
    pub base: Addr,
    pub arena: Arena,
    pub mapped: u64,
}

impl PagedArena {
    pub fn new<D: DeviceMemory>(dev: &mut D) -> Option<Self> {
        Some(PagedArena { base: dev.reserve(ARENA_VA)?, arena: Arena::new(), mapped: 0 })
    }

    /// Place `size` bytes, mapping pages when the top passes `mapped`; `None` (nothing
    /// changed) when the device has no pages left.
    pub fn alloc<D: DeviceMemory>(&mut self, size: u64, dev: &mut D, calls: &mut DriverCalls) -> Option<Addr> {
        let off = self.arena.alloc(size);
        let need = round_page(self.arena.top());
        if need > self.mapped {
            if need > ARENA_VA || !map_pages(dev, self.base + self.mapped, (need - self.mapped) / PAGE) {
                self.arena.free(off, size);
                return None;
            }
            calls.map += (need - self.mapped) / PAGE;
            self.mapped = need;
        }
        Some(self.base + off)
    }

    pub fn free(&mut self, addr: Addr, size: u64) {
        self.arena.free(addr - self.base, size);
    }

    /// Unmap the pages above the top (the caller has synchronised: [`StreamArenas::trim`]);
    /// true when it unmapped any.
    pub fn trim<D: DeviceMemory>(&mut self, dev: &mut D, calls: &mut DriverCalls) -> bool {
        let need = round_page(self.arena.top());
        if self.mapped > need {
            dev.unmap(self.base + need, self.mapped - need);
            calls.unmap += (self.mapped - need) / PAGE;
            self.mapped = need;
            return true;
        }
        false
    }

    pub fn check(&self) -> Result<(), InvariantError> {
        if self.mapped < round_page(self.arena.top()) || !self.mapped.is_multiple_of(PAGE) {
            return Err(
                format!("arena at {:#x}: top {} above mapped {}", self.base, self.arena.top(), self.mapped).into()
            );
        }
        Ok(())
    }
}

/// Per-stream [`PagedArena`]s without a device of their own (shared by the policies
/// that fall back on best fit).
#[derive(Clone, Debug, Default)]
pub(crate) struct StreamArenas {
    arenas: Vec<(StreamId, PagedArena)>,
    live: FastMap<Addr, (u32, u64)>,
}

impl StreamArenas {
    /// Serve `size` (already rounded) on `stream`; on a full device, trim every arena
    /// (unmap free pages at their tops, as expandable segments do before an OOM) and
    /// try once more.
    pub fn malloc<D: DeviceMemory>(
        &mut self,
        size: u64,
        stream: StreamId,
        dev: &mut D,
        calls: &mut DriverCalls,
    ) -> Option<Addr> {
        let k = match self.arenas.iter().position(|(s, _)| *s == stream) {
            Some(k) => k,
            None => {
                self.arenas.push((stream, PagedArena::new(dev)?));
                self.arenas.len() - 1
            }
        };
        let a = match self.arenas[k].1.alloc(size, dev, calls) {
            Some(a) => a,
            None => {
                self.trim(dev, calls);
                self.arenas[k].1.alloc(size, dev, calls)?
            }
        };
        self.live.insert(a, (k as u32, size));
        Some(a)
    }

    /// Free a block of these arenas; false when `addr` is not one.
    pub fn free(&mut self, addr: Addr) -> bool {
        match self.live.remove(&addr) {
            Some((k, size)) => {
                self.arenas[k as usize].1.free(addr, size);
                true
            }
            None => false,
        }
    }

    /// Unmap the free pages at every arena's top, after one device synchronisation
    /// (counted when any page is unmapped): the pages may have been freed by kernels
    /// still queued.
    pub fn trim<D: DeviceMemory>(&mut self, dev: &mut D, calls: &mut DriverCalls) {
        let mut any = false;
        for (_, a) in &mut self.arenas {
            any |= a.trim(dev, calls);
        }
        calls.synchronize += any as u64;
    }

    pub fn mapped(&self) -> u64 {
        self.arenas.iter().map(|(_, a)| a.mapped).sum()
    }

    pub fn check(&self) -> Result<(), InvariantError> {
        let mut used = vec![0u64; self.arenas.len()];
        for &(k, size) in self.live.values() {
            used[k as usize] += size;
        }
        for ((_, a), u) in self.arenas.iter().zip(used) {
            a.check()?;
            if u + a.arena.free_bytes() != a.arena.top() {
                return Err(format!(
                    "arena at {:#x}: live {u} + free {} != top {}",
                    a.base,
                    a.arena.free_bytes(),
                    a.arena.top()
                )
                .into());
            }
        }
        Ok(())
    }
}

/// One growable best-fit arena per stream.
#[derive(Clone, Debug)]
pub struct BestFitArenas<D: DeviceMemory = SimulatedDevice> {
    dev: D,
    arenas: StreamArenas,
    calls: DriverCalls,
}

impl<D: DeviceMemory> BestFitArenas<D> {
    pub fn new(dev: D) -> Self {
        BestFitArenas { dev, arenas: StreamArenas::default(), calls: DriverCalls::default() }
    }
}

impl<D: DeviceMemory> Policy for BestFitArenas<D> {
    fn name(&self) -> String {
        "best-fit".into()
    }
    fn malloc(&mut self, size: u64, stream: StreamId) -> Result<Addr, PolicyOom> {
        self.arenas.malloc(round512(size), stream, &mut self.dev, &mut self.calls).ok_or(PolicyOom {
            requested: size,
            stream,
            reserved: self.arenas.mapped(),
        })
    }
    fn empty_cache(&mut self) {
        self.arenas.trim(&mut self.dev, &mut self.calls);
    }
    fn free(&mut self, addr: Addr) -> Result<(), UnknownBlock> {
        self.arenas.free(addr).then_some(()).ok_or(UnknownBlock(addr))
    }
    fn reserved(&self) -> u64 {
        self.arenas.mapped()
    }
    fn calls(&self) -> DriverCalls {
        self.calls
    }
    fn check(&self) -> Result<(), InvariantError> {
        self.arenas.check()
    }
}
