//! [`Arena`]: best fit with coalescing over one growable range of offsets.

use std::collections::{BTreeMap, BTreeSet};

/// Free ranges of `[0, top)` indexed by size (best fit: the smallest that fits, lowest
/// offset on ties) and by offset (coalescing). `top` is the end of the highest allocated
/// block: a free range that reaches it is given back to the top, so the arena shrinks
/// whenever its highest block is freed and grows there when no free range fits.
#[derive(Clone, Debug, Default)]
pub struct Arena {
    by_size: BTreeSet<(u64, u64)>,
    by_off: BTreeMap<u64, u64>,
    top: u64,
    free_bytes: u64,
}

impl Arena {
    pub fn new() -> Self {
        Self::default()
    }
    /// End of the highest allocated block.
    pub fn top(&self) -> u64 {
        self.top
    }
    /// Bytes in free ranges below `top`.
    pub fn free_bytes(&self) -> u64 {
        self.free_bytes
    }

    /// Offset of a new block of `size` bytes (best fit, else at the top).
    pub fn alloc(&mut self, size: u64) -> u64 {
        if let Some(&(sz, off)) = self.by_size.range((size, 0)..).next() {
            self.by_size.remove(&(sz, off));
            self.by_off.remove(&off);
            self.free_bytes -= sz;
            if sz > size {
                self.insert(off + size, sz - size);
            }
            return off;
        }
        let off = self.top;
        self.top += size;
        off
    }

    /// Free `[off, off+size)`, merging with free neighbours.
    pub fn free(&mut self, off: u64, size: u64) {
        let (mut start, mut len) = (off, size);
        if let Some((&p, &psz)) = self.by_off.range(..off).next_back() {
            if p + psz == off {
                self.remove(p, psz);
                start = p;
                len += psz;
            }
        }
        if let Some(&nsz) = self.by_off.get(&(off + size)) {
            self.remove(off + size, nsz);
            len += nsz;
        }
        if start + len == self.top {
            self.top = start;
        } else {
            self.insert(start, len);
        }
    }

    fn insert(&mut self, off: u64, size: u64) {
        self.by_size.insert((size, off));
        self.by_off.insert(off, size);
        self.free_bytes += size;
    }

    fn remove(&mut self, off: u64, size: u64) {
        self.by_size.remove(&(size, off));
        self.by_off.remove(&off);
        self.free_bytes -= size;
    }

    /// Free ranges, by offset (for checks).
    pub fn free_ranges(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.by_off.iter().map(|(&o, &s)| (o, s))
    }
}
