//! [`Workload`]: the requests and frees of a trace, in order, and the [`Bounds`] they
//! impose on any allocator.

use super::{round512, round_page};
use crate::StreamId;

/// One step of a workload. Block ids are given in request order (`Malloc` and `Probe`
/// alike), so id `k` is the `k`-th request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// A request the recording served.
    Malloc { id: u32, size: u64, stream: StreamId, site: u64 },
    /// The block's memory may be reused (PyTorch's `free_completed`).
    Free { id: u32 },
    /// A request the recording could not serve (a recorded OOM): a policy that serves it
    /// frees it at once, since the program never used it.
    Probe { id: u32, size: u64, stream: StreamId, site: u64 },
}

/// The lifetime of one block: live from op `start` until op `end` (its free, or the
/// end of the workload), `size` rounded to 512 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Life {
    pub start: u32,
    pub end: u32,
    pub size: u64,
    pub stream: StreamId,
}

/// Requests and frees in order.
#[derive(Clone, Debug, Default)]
pub struct Workload {
    pub ops: Vec<Op>,
    /// Requests so far (the next block id).
    pub requests: u32,
    /// Op indices (ascending) before which the program released its cache: an explicit
    /// `torch.cuda.empty_cache()`, or PyTorch's own release of every free cached segment
    /// after a failed `cudaMalloc` (§3.7), both seen in a trace as `segment_free` /
    /// `segment_unmap` bursts. [`super::drive`](fn@super::drive) calls [`super::Policy::empty_cache`] there.
    pub empty_cache_at: Vec<usize>,
    live: Vec<bool>,
    sizes: Vec<u64>,
}

/// Peaks of live bytes that no allocator keeping streams apart goes below.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bounds {
    /// Peak of live bytes as requested. Requests the recording could not serve (probes, a
    /// recorded OOM) never were live and are not counted: see `live_with_failed`.
    pub live: u64,
    /// Peak of live bytes rounded to 512 B each.
    pub live_512: u64,
    /// Sum over streams of each stream's peak (512 B each): the floor for an allocator
    /// that never gives memory back (PyTorch without `empty_cache`, a fixed plan).
    pub per_stream: u64,
    /// Peak over time of the sum over streams of live bytes rounded up to 2 MiB pages:
    /// the floor for any allocator that gets memory in pages and keeps streams apart.
    pub pages: u64,
    /// Peak of live bytes as requested with each failed request (probe) added at its own
    /// op: what the program asked to hold at once, as opposed to what it held (`live`).
    pub live_with_failed: u64,
}

impl Workload {
    pub fn new() -> Self {
        Self::default()
    }

    /// The same workload without its probes (the requests the recording refused): what
    /// was live. Block ids are kept; `empty_cache_at` follows the ops.
    pub fn without_probes(&self) -> Workload {
        let mut w = Workload {
            ops: Vec::with_capacity(self.ops.len()),
            requests: self.requests,
            empty_cache_at: Vec::new(),
            live: self.live.clone(),
            sizes: self.sizes.clone(),
        };
        let mut at = Vec::with_capacity(self.ops.len() + 1);
        for op in &self.ops {
            at.push(w.ops.len());
            if !matches!(op, Op::Probe { .. }) {
                w.ops.push(*op);
            }
        }
        at.push(w.ops.len());
        w.empty_cache_at = self.empty_cache_at.iter().map(|&k| at[k.min(self.ops.len())]).collect();
        w.empty_cache_at.dedup();
        w
    }

    /// The program releases the cache here (before the next op).
    pub fn empty_cache(&mut self) {
        if self.empty_cache_at.last() != Some(&self.ops.len()) {
            self.empty_cache_at.push(self.ops.len());
        }
    }

    /// Append a served request; returns its id.
    pub fn malloc(&mut self, size: u64, stream: StreamId, site: u64) -> u32 {
        let id = self.next_id();
        self.ops.push(Op::Malloc { id, size, stream, site });
        self.live.push(true);
        self.sizes.push(size);
        id
    }

    /// Append a request that the recording could not serve.
    pub fn probe(&mut self, size: u64, stream: StreamId, site: u64) -> u32 {
        let id = self.next_id();
        self.ops.push(Op::Probe { id, size, stream, site });
        self.live.push(false);
        self.sizes.push(size);
        id
    }

    /// Append the free of a live block; false (nothing appended) when `id` is not live.
    pub fn free(&mut self, id: u32) -> bool {
        match self.live.get_mut(id as usize) {
            Some(l) if *l => {
                *l = false;
                self.ops.push(Op::Free { id });
                true
            }
            _ => false,
        }
    }

    /// The requested size of block `id` (0 for an unknown id).
    pub fn size_of(&self, id: u32) -> u64 {
        self.sizes.get(id as usize).copied().unwrap_or(0)
    }

    fn next_id(&mut self) -> u32 {
        let id = self.requests;
        self.requests += 1;
        id
    }

    /// Lifetimes of all blocks, by id. A probe lives for its own op only.
    pub fn lives(&self) -> Vec<Life> {
        let end = self.ops.len() as u32;
        let mut v = vec![Life { start: 0, end, size: 0, stream: 0 }; self.requests as usize];
        for (i, op) in self.ops.iter().enumerate() {
            let i = i as u32;
            match *op {
                Op::Malloc { id, size, stream, .. } => {
                    v[id as usize] = Life { start: i, end, size: round512(size), stream };
                }
                Op::Probe { id, size, stream, .. } => {
                    v[id as usize] = Life { start: i, end: i + 1, size: round512(size), stream };
                }
                Op::Free { id } => v[id as usize].end = i,
            }
        }
        v
    }

    /// The streams of the workload, in order of first use.
    pub fn streams(&self) -> Vec<StreamId> {
        let mut s: Vec<StreamId> = Vec::new();
        for op in &self.ops {
            if let Op::Malloc { stream, .. } | Op::Probe { stream, .. } = *op {
                if !s.contains(&stream) {
                    s.push(stream);
                }
            }
        }
        s
    }

    /// The [`Bounds`] of this workload. A probe (a request the recording could not serve)
    /// counts only in `live_with_failed`, at its own op.
    pub fn bounds(&self) -> Bounds {
        let streams = self.streams();
        let idx = |s: StreamId| streams.iter().position(|&x| x == s).unwrap_or(0);
        let mut sizes: Vec<(u64, usize)> = vec![(0, 0); self.requests as usize];
        let (mut live, mut live512, mut pages) = (0u64, 0u64, 0u64);
        let mut cur = vec![0u64; streams.len()];
        let mut peak_s = vec![0u64; streams.len()];
        let mut b = Bounds::default();
        let mut add = |size: u64, s: usize, sign: bool, live: &mut u64, live512: &mut u64, pages: &mut u64| {
            let r = round512(size);
            let old = cur[s];
            if sign {
                *live += size;
                *live512 += r;
                cur[s] += r;
            } else {
                *live -= size;
                *live512 -= r;
                cur[s] -= r;
            }
            *pages = *pages - round_page(old) + round_page(cur[s]);
            peak_s[s] = peak_s[s].max(cur[s]);
        };
        for op in &self.ops {
            match *op {
                Op::Malloc { id, size, stream, .. } => {
                    let s = idx(stream);
                    sizes[id as usize] = (size, s);
                    add(size, s, true, &mut live, &mut live512, &mut pages);
                }
                Op::Probe { size, .. } => {
                    // never live: only what the program asked to hold at that moment
                    b.live_with_failed = b.live_with_failed.max(live + size);
                }
                Op::Free { id } => {
                    let (size, s) = sizes[id as usize];
                    add(size, s, false, &mut live, &mut live512, &mut pages);
                }
            }
            b.live = b.live.max(live);
            b.live_512 = b.live_512.max(live512);
            b.pages = b.pages.max(pages);
        }
        b.live_with_failed = b.live_with_failed.max(b.live);
        b.per_stream = peak_s.iter().sum();
        b
    }
}
