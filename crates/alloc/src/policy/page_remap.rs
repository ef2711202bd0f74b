//! [`PageRemap`]: virtual memory stitching for every large request. A large request gets
//! a fresh virtual range backed by 2 MiB pages; the pages its stream freed elsewhere are
//! unmapped first (after a synchronisation, see [`Reclaim`]), so the physical memory is
//! reused wherever it was mapped before; requests under 2 MiB share a growable best-fit
//! arena per stream. Not GMLake itself: GMLake first looks for a best fit among its existing blocks
//! (stitched ones included) and stitches only when no single block fits.

use std::collections::BTreeMap;

use super::best_fit::ARENA_VA;
use super::{
    map_pages, round512, round_page, Arena, DriverCalls, FastMap, Policy, PolicyOom, Reclaim, UnknownBlock, PAGE,
};
use crate::device::{DeviceMemory, SimulatedDevice};
use crate::{Addr, InvariantError, StreamId};

/// One stream's physical pages: every page it holds backs a live large block (`used`),
/// a freed large block whose stitched range is kept mapped for a request of the same
/// page count (`cached`), or the small arena (`small_pages`). A page unmapped goes back
/// to the device; a large block's pages are mapped one handle each at its own range.
#[derive(Debug)]
struct StreamPages {
    stream: StreamId,
    /// Page count → cached blocks (address, the stream's synchronisation count when it
    /// was freed), most recent last.
    cached: BTreeMap<u64, Vec<(Addr, u64)>>,
    cached_pages: u64,
    used: u64,
    small: Arena,
    small_base: Addr,
    small_pages: u64,
    /// Synchronisation count at the small arena's latest free (its pages above the top
    /// may move once the stream has synchronised since).
    small_freed_at: u64,
    /// Synchronisations of this stream so far.
    syncs: u64,
}

impl StreamPages {
    fn pages(&self) -> u64 {
        self.cached_pages + self.used + self.small_pages
    }
    /// Small-arena pages above its top (mapped, holding nothing).
    fn small_spare(&self) -> u64 {
        self.small_pages - round_page(self.small.top()) / PAGE
    }
    /// Pages that may be unmapped now, and pages that could after a synchronisation.
    fn reclaimable(&self) -> (u64, u64) {
        let (mut now, mut later) = (0, 0);
        for (&n, v) in &self.cached {
            for &(_, at) in v {
                if at < self.syncs {
                    now += n
                } else {
                    later += n
                }
            }
        }
        if self.small_freed_at < self.syncs {
            now += self.small_spare();
        } else {
            later += self.small_spare();
        }
        (now, later)
    }
}

/// Page remapping: large blocks never fragment (a block needs free pages, not a free
/// range); the waste is the unused tail of each large block's last page and the holes
/// of the small arenas. A freed large block keeps its mapping and serves the next
/// request of the same page count with no driver call; otherwise pages of freed blocks
/// are unmapped (after a synchronisation, see [`Reclaim`]) and as many new ones mapped
/// at the new range (`map`/`unmap` count pages).
pub struct PageRemap<D: DeviceMemory = SimulatedDevice> {
    dev: D,
    streams: Vec<StreamPages>,
    /// Live block → (stream index, rounded size, pages if large, else 0).
    live: FastMap<Addr, (u32, u64, u64)>,
    calls: DriverCalls,
    large_min: u64,
    reclaim: Reclaim,
}

impl<D: DeviceMemory> PageRemap<D> {
    /// Every request of 2 MiB or more gets pages.
    pub fn new(dev: D) -> Self {
        Self::with_threshold(dev, PAGE)
    }

    /// Requests of `large_min` bytes or more (rounded to 512) get pages; smaller ones go
    /// to the stream's best-fit arena, whose pages come from the same pool. A high
    /// threshold bounds the waste of a large block's last page (at most 2 MiB of
    /// `large_min`) and keeps mid-sized blocks packed.
    pub fn with_threshold(dev: D, large_min: u64) -> Self {
        Self::with_options(dev, large_min, Reclaim::Synchronize)
    }

    pub fn with_options(dev: D, large_min: u64, reclaim: Reclaim) -> Self {
        PageRemap {
            dev,
            streams: Vec::new(),
            live: FastMap::default(),
            calls: DriverCalls::default(),
            large_min: large_min.max(PAGE),
            reclaim,
        }
    }

    fn stream_index(&mut self, stream: StreamId) -> Option<usize> {
        if let Some(k) = self.streams.iter().position(|s| s.stream == stream) {
            return Some(k);
        }
        let small_base = self.dev.reserve(ARENA_VA)?;
        self.streams.push(StreamPages {
            stream,
            cached: BTreeMap::new(),
            cached_pages: 0,
            used: 0,
            small: Arena::new(),
            small_base,
            small_pages: 0,
            small_freed_at: 0,
            syncs: 0,
        });
        Some(self.streams.len() - 1)
    }

    /// Unmap a cached block of `n` pages at `va` and free its range.
    fn drop_cached(dev: &mut D, calls: &mut DriverCalls, va: Addr, n: u64) {
        dev.unmap(va, n * PAGE);
        dev.release_reservation(va, n * PAGE);
        calls.unmap += n;
    }

    /// Give every page that backs no live block back to the device (`empty_cache`, or
    /// before an OOM), after a device synchronisation (counted when a page freed since
    /// the last one goes).
    fn release_all(&mut self) {
        if self.streams.iter().any(|s| s.reclaimable().1 > 0) {
            self.calls.synchronize += 1;
            for s in &mut self.streams {
                s.syncs += 1;
            }
        }
        for s in &mut self.streams {
            for (n, vas) in std::mem::take(&mut s.cached) {
                for (va, _) in vas {
                    Self::drop_cached(&mut self.dev, &mut self.calls, va, n);
                }
            }
            s.cached_pages = 0;
            let spare = s.small_spare();
            if spare > 0 {
                let keep = s.small_pages - spare;
                self.dev.unmap(s.small_base + keep * PAGE, spare * PAGE);
                self.calls.unmap += spare;
                s.small_pages = keep;
            }
        }
    }

    /// Unmap freed pages of stream `k` (the small arena's spare pages, then cached
    /// blocks: the smallest that covers what is missing, else the largest) until about
    /// `n` pages went back to the device, so that mapping `n` new ones needs no more
    /// memory. Only pages freed before the stream's last synchronisation go; under
    /// [`Reclaim::Synchronize`] the stream synchronises first when that would free more.
    fn reclaim_pages(&mut self, k: usize, n: u64) {
        let s = &mut self.streams[k];
        let (now, later) = s.reclaimable();
        if now < n && later > 0 && self.reclaim == Reclaim::Synchronize {
            s.syncs += 1;
            self.calls.synchronize += 1;
        }
        let mut got = 0;
        let spare = s.small_spare();
        if spare > 0 && s.small_freed_at < s.syncs {
            let keep = s.small_pages - spare;
            self.dev.unmap(s.small_base + keep * PAGE, spare * PAGE);
            self.calls.unmap += spare;
            s.small_pages = keep;
            got += spare;
        }
        while got < n {
            let want = n - got;
            let syncs = s.syncs;
            let ok = |v: &Vec<(Addr, u64)>| v.first().is_some_and(|&(_, at)| at < syncs);
            // Oldest first within a page count: the first entry was freed earliest.
            let key = match s.cached.range(want..).find(|(_, v)| ok(v)) {
                Some((&key, _)) => key,
                None => match s.cached.iter().rev().find(|(_, v)| ok(v)) {
                    Some((&key, _)) => key,
                    None => break,
                },
            };
            let v = s.cached.get_mut(&key).expect("found");
            let (old, _) = v.remove(0);
            if v.is_empty() {
                s.cached.remove(&key);
            }
            s.cached_pages -= key;
            Self::drop_cached(&mut self.dev, &mut self.calls, old, key);
            got += key;
        }
    }

    /// A large block of `n` pages on stream `k`: a cached block of `n` pages as it is
    /// mapped, else a new range whose pages are mapped after freed ones are unmapped.
    fn large(&mut self, k: usize, n: u64) -> Option<Addr> {
        let s = &mut self.streams[k];
        if let Some(v) = s.cached.get_mut(&n) {
            // Reuse in place needs no synchronisation: the most recently freed.
            let (va, _) = v.pop().expect("no empty lists are kept");
            if v.is_empty() {
                s.cached.remove(&n);
            }
            s.cached_pages -= n;
            s.used += n;
            return Some(va);
        }
        let va = self.dev.reserve(n * PAGE)?;
        self.reclaim_pages(k, n);
        if !map_pages(&mut self.dev, va, n) {
            self.release_all();
            if !map_pages(&mut self.dev, va, n) {
                self.dev.release_reservation(va, n * PAGE);
                return None;
            }
        }
        self.calls.map += n;
        self.streams[k].used += n;
        Some(va)
    }

    /// Grow stream `k`'s small arena to cover its top (new pages mapped above the old).
    fn small(&mut self, k: usize, size: u64) -> Option<Addr> {
        let s = &mut self.streams[k];
        let off = s.small.alloc(size);
        let need = round_page(s.small.top()) / PAGE;
        if need > s.small_pages {
            let add = need - s.small_pages;
            if !map_pages(&mut self.dev, s.small_base + s.small_pages * PAGE, add) {
                s.small.free(off, size);
                return None;
            }
            s.small_pages = need;
            self.calls.map += add;
        }
        Some(self.streams[k].small_base + off)
    }
}

impl<D: DeviceMemory> Policy for PageRemap<D> {
    fn name(&self) -> String {
        if self.large_min == PAGE {
            format!("page-remap{}", self.reclaim.suffix())
        } else {
            format!("page-remap:{}{}", self.large_min >> 20, self.reclaim.suffix())
        }
    }
    fn malloc(&mut self, size: u64, stream: StreamId) -> Result<Addr, PolicyOom> {
        let r = round512(size);
        let oom = |me: &Self| PolicyOom { requested: size, stream, reserved: me.reserved() };
        let Some(k) = self.stream_index(stream) else { return Err(oom(self)) };
        let (addr, pages) = if r >= self.large_min {
            let n = r.div_ceil(PAGE);
            (self.large(k, n), n)
        } else {
            let a = match self.small(k, r) {
                Some(a) => Some(a),
                None => {
                    self.release_all();
                    self.small(k, r)
                }
            };
            (a, 0)
        };
        let Some(addr) = addr else { return Err(oom(self)) };
        self.live.insert(addr, (k as u32, r, pages));
        Ok(addr)
    }
    fn empty_cache(&mut self) {
        self.release_all();
    }
    fn free(&mut self, addr: Addr) -> Result<(), UnknownBlock> {
        let (k, size, pages) = self.live.remove(&addr).ok_or(UnknownBlock(addr))?;
        let s = &mut self.streams[k as usize];
        if pages > 0 {
            s.used -= pages;
            s.cached_pages += pages;
            s.cached.entry(pages).or_default().push((addr, s.syncs));
        } else {
            s.small.free(addr - s.small_base, size);
            s.small_freed_at = s.syncs;
        }
        Ok(())
    }
    fn reserved(&self) -> u64 {
        self.streams.iter().map(|s| s.pages() * PAGE).sum()
    }
    fn calls(&self) -> DriverCalls {
        self.calls
    }
    fn check(&self) -> Result<(), InvariantError> {
        let mut used = vec![0u64; self.streams.len()];
        for &(k, _, pages) in self.live.values() {
            used[k as usize] += pages;
        }
        for (s, u) in self.streams.iter().zip(used) {
            let cached: u64 = s.cached.iter().map(|(n, v)| n * v.len() as u64).sum();
            if s.cached.values().any(|v| v.is_empty()) {
                return Err(format!("stream {}: an empty cached list", s.stream).into());
            }
            if u != s.used || cached != s.cached_pages || s.small_pages < round_page(s.small.top()) / PAGE {
                return Err(format!(
                    "stream {}: used {} (live {u}), cached {} (counted {cached}), small pages {} for top {}",
                    s.stream,
                    s.used,
                    s.cached_pages,
                    s.small_pages,
                    s.small.top()
                )
                .into());
            }
        }
        Ok(())
    }
}
