//! [`PagedBestFit`]: best fit in virtual addresses, physical pages only where live
//! blocks are. Each stream has one best-fit arena of virtual addresses (never short of
//! room: virtual memory is plentiful); a 2 MiB page of it is mapped (one handle per page)
//! while a live block touches it. A page no live block touches stays mapped (reuse in
//! place costs nothing) until its stream needs a page elsewhere: then it is unmapped and
//! a page is mapped where it is missing (virtual memory stitching, as `page-remap`, but
//! without losing best fit's packing of mid-sized blocks).
//!
//! Moving a page means `cuMemUnmap`, which is not stream-ordered: a page freed since the
//! stream's last synchronisation may still be in use by queued kernels. [`Reclaim`] says
//! what the policy does about it: synchronise (counted) or wait for a synchronisation
//! made anyway (`empty_cache`, the release before an OOM).

use std::collections::VecDeque;

use super::best_fit::ARENA_VA;
use super::{map_pages, round512, Arena, DriverCalls, FastMap, Policy, PolicyOom, Reclaim, UnknownBlock, PAGE};
use crate::device::{DeviceMemory, SimulatedDevice};
use crate::{Addr, InvariantError, StreamId};

#[derive(Debug)]
struct StreamVm {
    stream: StreamId,
    base: Addr,
    arena: Arena,
    /// Per page of the arena: live blocks touching it.
    touch: Vec<u32>,
    /// Per page: mapped (backed by a physical page of its own handle).
    mapped: Vec<bool>,
    /// Per page: the stream's synchronisation count when a live block last left it.
    freed_at: Vec<u64>,
    /// Pages left by their last live block, oldest first, with `freed_at` then (an entry
    /// is stale when the page was touched again or unmapped since: checked on pop).
    idle: VecDeque<(u32, u64)>,
    /// Synchronisations of this stream so far: a page with `freed_at < syncs` may move.
    syncs: u64,
    /// Pages mapped.
    owned: u64,
}

impl StreamVm {
    fn page_addr(&self, p: usize) -> Addr {
        self.base + p as u64 * PAGE
    }

    /// The oldest idle page that may be unmapped now (freed before the stream's last
    /// synchronisation); `Err(true)` when idle pages exist but none may move yet,
    /// `Err(false)` when there is no idle page. Stale entries are dropped.
    fn movable(&mut self, keep: std::ops::RangeInclusive<usize>) -> Result<usize, bool> {
        let mut waiting = false;
        let mut i = 0;
        while i < self.idle.len() {
            let (p, at) = self.idle[i];
            let p = p as usize;
            if !self.mapped[p] || self.touch[p] > 0 || at != self.freed_at[p] {
                self.idle.remove(i);
                continue;
            }
            if keep.contains(&p) {
                i += 1;
                continue;
            }
            if at < self.syncs {
                self.idle.remove(i);
                return Ok(p);
            }
            // Entries are in free order: the rest were freed later still.
            waiting = true;
            break;
        }
        Err(waiting)
    }
}

/// One best-fit arena of virtual addresses per stream over physical pages.
pub struct PagedBestFit<D: DeviceMemory = SimulatedDevice> {
    dev: D,
    streams: Vec<StreamVm>,
    live: FastMap<Addr, (u32, u64)>,
    calls: DriverCalls,
    reclaim: Reclaim,
}

impl<D: DeviceMemory> PagedBestFit<D> {
    /// Freed pages move after a synchronisation the policy makes when it pays
    /// ([`Reclaim::Synchronize`]).
    pub fn new(dev: D) -> Self {
        Self::with_reclaim(dev, Reclaim::Synchronize)
    }

    pub fn with_reclaim(dev: D, reclaim: Reclaim) -> Self {
        PagedBestFit { dev, streams: Vec::new(), live: FastMap::default(), calls: DriverCalls::default(), reclaim }
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
            freed_at: Vec::new(),
            idle: VecDeque::new(),
            syncs: 0,
            owned: 0,
        });
        Some(self.streams.len() - 1)
    }

    /// Map the missing pages of `[first, last]` on stream `k` and count the block on its
    /// pages. For each missing page an idle page of the stream is unmapped first when
    /// one may move (synchronising the stream for it under [`Reclaim::Synchronize`]),
    /// so that moving never needs more memory than the device has; otherwise a new page
    /// is mapped. False (the block not counted) when the device is full.
    fn back(&mut self, k: usize, first: usize, last: usize) -> bool {
        let s = &mut self.streams[k];
        if s.touch.len() <= last {
            s.touch.resize(last + 1, 0);
            s.mapped.resize(last + 1, false);
            s.freed_at.resize(last + 1, 0);
        }
        let mut fresh: Vec<usize> = Vec::new();
        for p in first..=last {
            if self.streams[k].mapped[p] {
                continue;
            }
            let s = &mut self.streams[k];
            let moved = match s.movable(first..=last) {
                Ok(q) => Some(q),
                Err(true) if self.reclaim == Reclaim::Synchronize => {
                    // cudaStreamSynchronize: every page freed so far may move.
                    s.syncs += 1;
                    self.calls.synchronize += 1;
                    s.movable(first..=last).ok()
                }
                Err(_) => None,
            };
            if let Some(q) = moved {
                let a = s.page_addr(q);
                s.mapped[q] = false;
                s.owned -= 1;
                self.dev.unmap(a, PAGE);
                self.calls.unmap += 1;
            }
            let s = &mut self.streams[k];
            if !map_pages(&mut self.dev, s.page_addr(p), 1) {
                // Give back the pages mapped for this block: no kernel ever used them,
                // so no synchronisation is needed.
                for q in fresh {
                    s.mapped[q] = false;
                    s.owned -= 1;
                    self.dev.unmap(s.page_addr(q), PAGE);
                    self.calls.unmap += 1;
                }
                return false;
            }
            s.mapped[p] = true;
            s.owned += 1;
            self.calls.map += 1;
            fresh.push(p);
        }
        let s = &mut self.streams[k];
        for p in first..=last {
            s.touch[p] += 1;
        }
        true
    }

    /// Give every idle page back to the device (`empty_cache`, or before an OOM), after
    /// a device synchronisation (counted when a page freed since the last one goes).
    fn release_all(&mut self) {
        let pending = self.streams.iter().any(|s| {
            s.idle.iter().any(|&(p, at)| {
                let p = p as usize;
                s.mapped[p] && s.touch[p] == 0 && at == s.freed_at[p] && at >= s.syncs
            })
        });
        if pending {
            self.calls.synchronize += 1;
        }
        for s in &mut self.streams {
            if pending {
                s.syncs += 1;
            }
            for (p, at) in std::mem::take(&mut s.idle) {
                let p = p as usize;
                if s.mapped[p] && s.touch[p] == 0 && at == s.freed_at[p] {
                    s.mapped[p] = false;
                    s.owned -= 1;
                    self.dev.unmap(s.base + p as u64 * PAGE, PAGE);
                    self.calls.unmap += 1;
                }
            }
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
        format!("paged-best-fit{}", self.reclaim.suffix())
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
                s.freed_at[p] = s.syncs;
                s.idle.push_back((p as u32, s.syncs));
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
    fn check(&self) -> Result<(), InvariantError> {
        for s in &self.streams {
            let mapped = s.mapped.iter().filter(|&&m| m).count() as u64;
            if mapped != s.owned {
                return Err(format!("stream {}: mapped {mapped} != owned {}", s.stream, s.owned).into());
            }
            if let Some(p) = (0..s.touch.len()).find(|&p| s.touch[p] > 0 && !s.mapped[p]) {
                return Err(format!("stream {}: page {p} touched by a live block but not mapped", s.stream).into());
            }
        }
        Ok(())
    }
}
