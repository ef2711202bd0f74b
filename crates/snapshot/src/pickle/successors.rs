//! Guesses the next fresh `frames` list of a trace from the lists before it.
//!
//! Why: PyTorch writes a new `frames` list for most trace entries, a few hundred distinct
//! stacks over and over, and the reader knows a list again by its bytes (the memo
//! references to its frame dicts). Picking the candidates by the list's first bytes is
//! not enough: real stacks share their innermost frames, and on the corpus 69 % of the
//! lists fell in groups of more than eight distinct lists with the same first 32 bytes,
//! which evicted each other. A training step allocates and frees in the same order every
//! time, so the lists that followed the same lists before, in an entry with the same
//! action, are better candidates.
//!
//! [`Successors`] keeps, per context (hashed, direct-mapped), the last two lists that
//! followed it as item bytes and stack. Two contexts are tried in turn: the last three
//! lists with the entry's action, then the last list with the action (for the places
//! where a step's order varies). The action tells an allocation's stack from the free
//! that comes at the same point of the order. Measured with counters in the reader on
//! the real snapshots and grids with 1,000 fresh lists or more: the guess was right for
//! 89.1 % of the lists (86.6 % with the last two lists alone as the context); on
//! torchlike-3m-cut (a cut PyTorch-shaped file, 2.0 M fresh lists) 99.7 % (94.7 %), on
//! real-sidsoc-3m-cut 98.1 % (83.5 %).
//!
//! A guess counts only when the bytes at the reader's position are a candidate's bytes
//! and the list ends right there, as [`super::load`]'s own check of a remembered list
//! requires: equal bytes are equal memo references, hence the same frames, as long as no
//! frame's memo slot has been written over since (the reader clears this with its other
//! caches when one is). The action is only a hint: an entry whose action comes after its
//! `frames` guesses as an `alloc`.

use crate::model::{Action, StackId};

/// Contexts remembered (a power of two).
const SETS: usize = 4096;
/// Bytes of list items kept at most: beyond this, lists are not remembered (a bound on
/// the memory of files whose every list is another).
const MAX_BYTES: usize = 32 << 20;
/// Contexts tried in turn: the last three lists, then the last one (each with the action).
const CONTEXTS: [usize; 2] = [3, 1];

#[derive(Clone, Copy, Default)]
struct Way {
    stack: Option<StackId>,
    /// The list's item bytes: `bytes[at..at + len]`.
    at: u32,
    len: u32,
}

pub(crate) struct Successors {
    ways: Box<[[Way; 2]]>,
    /// Item bytes of the lists the ways name, each kept once per stack (`span_of`).
    bytes: Vec<u8>,
    /// Where in `bytes` each stack's list was kept, by stack index.
    span_of: Vec<(u32, u32)>,
    /// The stacks of the last three fresh lists.
    last: [Option<StackId>; 3],
}

impl Successors {
    pub(crate) fn new() -> Self {
        Successors {
            ways: vec![[Way::default(); 2]; SETS].into_boxed_slice(),
            bytes: Vec::new(),
            span_of: Vec::new(),
            last: [None; 3],
        }
    }

    /// Forgets every list (a frame's memo slot was written over).
    pub(crate) fn clear(&mut self) {
        self.ways.fill([Way::default(); 2]);
        self.bytes.clear();
        self.span_of.clear();
        self.last = [None; 3];
    }

    /// The set of a context: the stacks of the last `n` fresh lists and the entry's action.
    fn set(&self, action: Action, n: usize) -> usize {
        let id = |i: usize| if i < n { self.last[i].map_or(0, |s| s.index() as u64 + 1) } else { 0 };
        let h = (id(0) ^ id(1).rotate_left(21) ^ id(2).rotate_left(42) ^ (action as u64) << 58 ^ (n as u64) << 62)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15);
        (h >> 40) as usize & (SETS - 1)
    }

    /// The stack of the list whose items start at `buf[body]` and its item bytes' length,
    /// when it is one of the two that last followed the same three lists with the same
    /// action, else one of the two that last followed the last list alone; `ends` says
    /// whether a list whose items are `buf[body..q]` ends at `q`.
    #[inline]
    pub(crate) fn guess(
        &mut self,
        action: Action,
        buf: &[u8],
        body: usize,
        ends: impl Fn(usize) -> bool,
    ) -> Option<(StackId, usize)> {
        for n in CONTEXTS {
            let set = self.set(action, n);
            let ways = &mut self.ways[set];
            let found = ways.iter().position(|w| {
                w.stack.is_some() && {
                    let (at, len) = (w.at as usize, w.len as usize);
                    buf.get(body..body + len).is_some_and(|b| super::load::same_bytes(b, &self.bytes[at..at + len]))
                        && ends(body + len)
                }
            });
            if let Some(k) = found {
                ways.swap(0, k);
                let w = ways[0];
                let id = w.stack?;
                self.came(id);
                return Some((id, w.len as usize));
            }
        }
        None
    }

    /// Records that the list with item bytes `span` (`None`: one not to be remembered, as
    /// one with a FRAME among its items) and stack `id` came next.
    pub(crate) fn learn(&mut self, action: Action, span: Option<&[u8]>, id: StackId) {
        if let Some(span) = span.filter(|s| !s.is_empty()) {
            if let Some((at, len)) = self.keep(span, id) {
                for n in CONTEXTS {
                    let set = self.set(action, n);
                    let ways = &mut self.ways[set];
                    if ways[0].stack != Some(id) {
                        ways[1] = ways[0];
                        ways[0] = Way { stack: Some(id), at, len };
                    }
                }
            }
        }
        self.came(id);
    }

    /// `id` is the last fresh list's stack now.
    fn came(&mut self, id: StackId) {
        self.last = [Some(id), self.last[0], self.last[1]];
    }

    /// Where `span` is kept as stack `id`'s list: the place kept before when the bytes are
    /// the same, else a new one (`None` past [`MAX_BYTES`]).
    fn keep(&mut self, span: &[u8], id: StackId) -> Option<(u32, u32)> {
        let i = id.index();
        if let Some(&(at, len)) = self.span_of.get(i).filter(|s| s.1 != 0) {
            if self.bytes[at as usize..(at + len) as usize] == *span {
                return Some((at, len));
            }
        }
        if self.bytes.len() + span.len() > MAX_BYTES {
            return None;
        }
        let kept = (self.bytes.len() as u32, span.len() as u32);
        self.bytes.extend_from_slice(span);
        if self.span_of.len() <= i {
            self.span_of.resize(i + 1, (0, 0));
        }
        self.span_of[i] = kept;
        Some(kept)
    }
}
