//! [`PagedBestFit`]: best fit in virtual addresses, physical pages only where live
//! blocks are. Each stream has one best-fit arena of virtual addresses (never short of
//! room: virtual memory is plentiful); a 2 MiB page is backed by a physical page while a
//! live block touches it. A page no live block touches stays mapped (reuse in place costs
//! nothing) until its stream needs a page elsewhere: it is unmapped and its physical page
//! mapped there (virtual memory stitching, as `page-remap`, but without losing best fit's
//! packing of mid-sized blocks).

use super::best_fit::ARENA_VA;
use super::{round512, Arena, DriverCalls, FastMap, Policy, PolicyOom, UnknownBlock, PAGE};
use crate::device::{DeviceMemory, SimulatedDevice};
use crate::{Addr, StreamId};

#[derive(Debug)]
struct StreamVm {
    stream: StreamId,
    base: Addr,
    arena: Arena,
    /// Per page of the arena: live blocks touching it.
    touch: Vec<u32>,
    /// Per page: backed by a physical page.
    mapped: Vec<bool>,
    /// Pages mapped but untouched (may hold pages touched again since: checked on pop).
    idle: Vec<u32>,
    /// Physical pages owned but mapped nowhere.
    spare: u64,
    /// Physical pages owned (mapped + spare).
    owned: u64,
}

/// One best-fit arena of virtual addresses per stream over a pool of physical pages.
pub struct PagedBestFit<D: DeviceMemory = SimulatedDevice> {
    dev: D,
    streams: Vec<StreamVm>,
    live: FastMap<Addr, (u32, u64)>,
    calls: DriverCalls,
}

impl<D: DeviceMemory> PagedBestFit<D> {
    pub fn new(dev: D) -> Self {
        PagedBestFit { dev, streams: Vec::new(), live: FastMap::default(), calls: DriverCalls::default() }
    }

    fn stream_index(&mut self, stream: StreamId) -> Option<usize> {
        if let Some(k) = self.streams.iter().position(|s| s.stream == stream) {
            return Some(k);
        }
        let base = self.dev.reserve(ARENA_VA)?;
        self.streams.push(StreamVm {
            stream,
            base,
            arena: Arena::new(),
            touch: Vec::new(),
            mapped: Vec::new(),
            idle: Vec::new(),
            spare: 0,
            owned: 0,
        });
        Some(self.streams.len() - 1)
    }

    /// Back the untouched pages of `[first, last]` on stream `k`: spare pages, then idle
    /// pages of the stream (unmapped from where they were), then new ones. False (nothing
    /// changed) when the device is full.
    fn back(&mut self, k: usize, first: usize, last: usize) -> bool {
        let s = &mut self.streams[k];
        if s.touch.len() <= last {
            s.touch.resize(last + 1, 0);
            s.mapped.resize(last + 1, false);
        }
        let need = (first..=last).filter(|&p| !s.mapped[p]).count() as u64;
        let mut got = s.spare.min(need);
        s.spare -= got;
        while got < need {
            let Some(p) = s.idle.pop() else { break };
            let p = p as usize;
            if s.mapped[p] && s.touch[p] == 0 && !(first..=last).contains(&p) {
                s.mapped[p] = false;
                self.calls.unmap += 1;
                got += 1;
            }
        }
        let create = need - got;
        if create > 0 {
            if !self.dev.map(s.base + first as u64 * PAGE, create * PAGE) {
                s.spare += got;
                return false;
            }
            s.owned += create;
        }
        for p in first..=last {
            if !s.mapped[p] {
                s.mapped[p] = true;
                self.calls.map += 1;
            }
            s.touch[p] += 1;
        }
        true
    }

    /// Give every idle and spare page back to the device (before an OOM).
    fn release_all(&mut self) {
        for s in &mut self.streams {
            let mut drop = s.spare;
            for p in s.idle.drain(..) {
                let p = p as usize;
                if s.mapped[p] && s.touch[p] == 0 {
                    s.mapped[p] = false;
                    self.calls.unmap += 1;
                    drop += 1;
                }
            }
            if drop > 0 {
                self.dev.unmap(s.base, drop * PAGE);
            }
            s.owned -= drop;
            s.spare = 0;
        }
    }

    fn place(&mut self, k: usize, size: u64) -> Option<Addr> {
        let off = self.streams[k].arena.alloc(size);
        let (first, last) = ((off / PAGE) as usize, ((off + size - 1) / PAGE) as usize);
        if off + size > ARENA_VA || !self.back(k, first, last) {
            self.streams[k].arena.free(off, size);
            return None;
        }
        Some(self.streams[k].base + off)
    }
}

impl<D: DeviceMemory> Policy for PagedBestFit<D> {
    fn name(&self) -> String {
        "paged-best-fit".into()
    }
    fn malloc(&mut self, size: u64, stream: StreamId) -> Result<Addr, PolicyOom> {
        let r = round512(size);
        let oom = |me: &Self| PolicyOom { requested: size, stream, reserved: me.reserved() };
        let Some(k) = self.stream_index(stream) else { return Err(oom(self)) };
        let a = match self.place(k, r) {
            Some(a) => a,
            None => {
                self.release_all();
                match self.place(k, r) {
                    Some(a) => a,
                    None => return Err(oom(self)),
                }
            }
        };
        self.live.insert(a, (k as u32, r));
        Ok(a)
    }
    fn empty_cache(&mut self) {
        self.release_all();
    }
    fn free(&mut self, addr: Addr) -> Result<(), UnknownBlock> {
        let (k, size) = self.live.remove(&addr).ok_or(UnknownBlock(addr))?;
        let s = &mut self.streams[k as usize];
        let off = addr - s.base;
        s.arena.free(off, size);
        for p in (off / PAGE) as usize..=((off + size - 1) / PAGE) as usize {
            s.touch[p] -= 1;
            if s.touch[p] == 0 {
                s.idle.push(p as u32);
            }
        }
        Ok(())
    }
    fn reserved(&self) -> u64 {
        self.streams.iter().map(|s| s.owned * PAGE).sum()
    }
    fn calls(&self) -> DriverCalls {
        self.calls
    }
    fn check(&self) -> Result<(), String> {
        for s in &self.streams {
            let mapped = s.mapped.iter().filter(|&&m| m).count() as u64;
            if mapped + s.spare != s.owned {
                return Err(format!("stream {}: mapped {mapped} + spare {} != owned {}", s.stream, s.spare, s.owned));
            }
            if let Some(p) = (0..s.touch.len()).find(|&p| s.touch[p] > 0 && !s.mapped[p]) {
                return Err(format!("stream {}: page {p} touched by a live block but not mapped", s.stream));
            }
        }
        Ok(())
    }
}
