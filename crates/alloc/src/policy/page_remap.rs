//! [`PageRemap`]: virtual memory stitching for every large request. A large request gets
//! a fresh virtual range backed by any free 2 MiB physical pages of its stream, wherever
//! they were mapped before; requests under 2 MiB share a growable best-fit arena per
//! stream. Not GMLake itself: GMLake first looks for a best fit among its existing blocks
//! (stitched ones included) and stitches only when no single block fits.

use std::collections::BTreeMap;

use super::best_fit::ARENA_VA;
use super::{round512, round_page, Arena, DriverCalls, FastMap, Policy, PolicyOom, UnknownBlock, PAGE};
use crate::device::{DeviceMemory, SimulatedDevice};
use crate::{Addr, StreamId};

/// One stream's physical pages: every page is in exactly one of `loose` (unmapped),
/// `cached` (a freed large block whose stitched range is kept for a request of the same
/// page count), a live large block (`used`), or the small arena (`small_pages`).
#[derive(Debug)]
struct StreamPages {
    stream: StreamId,
    loose: u64,
    cached: BTreeMap<u64, Vec<Addr>>,
    cached_pages: u64,
    used: u64,
    small: Arena,
    small_base: Addr,
    small_pages: u64,
}

impl StreamPages {
    fn pages(&self) -> u64 {
        self.loose + self.cached_pages + self.used + self.small_pages
    }
}

/// Page remapping: large blocks never fragment (a block needs free pages, not a free
/// range); the waste is the unused tail of each large block's last page and the holes
/// of the small arenas. A freed large block keeps its mapping and serves the next
/// request of the same page count with no driver call; otherwise its pages are unmapped
/// and stitched into the new range (`map`/`unmap` count pages).
pub struct PageRemap<D: DeviceMemory = SimulatedDevice> {
    dev: D,
    streams: Vec<StreamPages>,
    /// Live block → (stream index, rounded size, pages if large, else 0).
    live: FastMap<Addr, (u32, u64, u64)>,
    calls: DriverCalls,
    large_min: u64,
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
        PageRemap {
            dev,
            streams: Vec::new(),
            live: FastMap::default(),
            calls: DriverCalls::default(),
            large_min: large_min.max(PAGE),
        }
    }

    fn stream_index(&mut self, stream: StreamId) -> Option<usize> {
        if let Some(k) = self.streams.iter().position(|s| s.stream == stream) {
            return Some(k);
        }
        let small_base = self.dev.reserve(ARENA_VA)?;
        self.streams.push(StreamPages {
            stream,
            loose: 0,
            cached: BTreeMap::new(),
            cached_pages: 0,
            used: 0,
            small: Arena::new(),
            small_base,
            small_pages: 0,
        });
        Some(self.streams.len() - 1)
    }

    /// Give every page that backs no live block back to the device (before an OOM).
    fn release_all(&mut self) {
        for s in &mut self.streams {
            for (&n, vas) in &s.cached {
                for &va in vas {
                    self.calls.unmap += n;
                    self.dev.release_reservation(va, n * PAGE);
                }
            }
            s.cached.clear();
            let small_keep = round_page(s.small.top()) / PAGE;
            self.calls.unmap += s.small_pages - small_keep;
            let drop = s.loose + s.cached_pages + s.small_pages - small_keep;
            if drop > 0 {
                self.dev.unmap(s.small_base, drop * PAGE);
            }
            s.loose = 0;
            s.cached_pages = 0;
            s.small_pages = small_keep;
        }
    }

    /// Pages for a large block of `n` pages on stream `k`: loose pages first, then the
    /// small arena's pages above its top, then cached blocks broken up, then new ones.
    fn large(&mut self, k: usize, n: u64) -> Option<Addr> {
        let s = &mut self.streams[k];
        if let Some(va) = s.cached.get_mut(&n).and_then(|v| v.pop()) {
            s.cached_pages -= n;
            s.used += n;
            return Some(va);
        }
        let va = self.dev.reserve(n * PAGE)?;
        let s = &mut self.streams[k];
        let spare = s.small_pages - round_page(s.small.top()) / PAGE;
        if s.loose < n && spare > 0 {
            self.calls.unmap += spare;
            s.small_pages -= spare;
            s.loose += spare;
        }
        while s.loose < n {
            // The smallest cached block that covers what is missing, else the largest.
            let want = n - s.loose;
            let key = match s.cached.range(want..).find(|(_, v)| !v.is_empty()) {
                Some((&key, _)) => key,
                None => match s.cached.iter().rev().find(|(_, v)| !v.is_empty()) {
                    Some((&key, _)) => key,
                    None => break,
                },
            };
            let old = s.cached.get_mut(&key).and_then(|v| v.pop()).expect("non-empty");
            self.dev.release_reservation(old, key * PAGE);
            self.calls.unmap += key;
            s.cached_pages -= key;
            s.loose += key;
        }
        let create = n.saturating_sub(s.loose);
        if create > 0 && !self.dev.map(va, create * PAGE) {
            self.release_all();
            if !self.dev.map(va, n * PAGE) {
                self.dev.release_reservation(va, n * PAGE);
                return None;
            }
            self.streams[k].loose = n;
        } else {
            s.loose += create;
        }
        let s = &mut self.streams[k];
        s.loose -= n;
        s.used += n;
        self.calls.map += n;
        Some(va)
    }

    /// Grow stream `k`'s small arena to cover its top, loose pages first.
    fn small(&mut self, k: usize, size: u64) -> Option<Addr> {
        let s = &mut self.streams[k];
        let off = s.small.alloc(size);
        let need = round_page(s.small.top()) / PAGE;
        if need > s.small_pages {
            let add = need - s.small_pages;
            let from_loose = add.min(s.loose);
            let create = add - from_loose;
            if create > 0 && !self.dev.map(s.small_base + s.small_pages * PAGE, create * PAGE) {
                s.small.free(off, size);
                return None;
            }
            s.loose -= from_loose;
            s.small_pages = need;
            self.calls.map += add;
        }
        Some(self.streams[k].small_base + off)
    }
}

impl<D: DeviceMemory> Policy for PageRemap<D> {
    fn name(&self) -> String {
        if self.large_min == PAGE {
            "page-remap".into()
        } else {
            format!("page-remap:{}", self.large_min >> 20)
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
            s.cached.entry(pages).or_default().push(addr);
        } else {
            s.small.free(addr - s.small_base, size);
        }
        Ok(())
    }
    fn reserved(&self) -> u64 {
        self.streams.iter().map(|s| s.pages() * PAGE).sum()
    }
    fn calls(&self) -> DriverCalls {
        self.calls
    }
    fn check(&self) -> Result<(), String> {
        let mut used = vec![0u64; self.streams.len()];
        for &(k, _, pages) in self.live.values() {
            used[k as usize] += pages;
        }
        for (s, u) in self.streams.iter().zip(used) {
            let cached: u64 = s.cached.iter().map(|(n, v)| n * v.len() as u64).sum();
            if u != s.used || cached != s.cached_pages || s.small_pages < round_page(s.small.top()) / PAGE {
                return Err(format!(
                    "stream {}: used {} (live {u}), cached {} (counted {cached}), small pages {} for top {}",
                    s.stream,
                    s.used,
                    s.cached_pages,
                    s.small_pages,
                    s.small.top()
                ));
            }
        }
        Ok(())
    }
}
