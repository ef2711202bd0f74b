//! Trace-entry shapes: the byte layout of a trace entry, learned from one entry, so that
//! the next entries laid out the same way are decoded by one masked compare and a load
//! per value instead of key by key.
//!
//! Why: PyTorch writes every trace entry with the same keys in the same order, and the
//! pickler writes the keys as the same memo references and each value with one of a few
//! opcodes. Two entries of a trace then differ only in their values' payload bytes (the
//! address, the size, the time, which memoized action or stack they refer to). A shape
//! holds an entry's bytes with those payload bytes masked out, and where each payload
//! lies. An entry whose unmasked bytes all equal the shape's (every opcode, every length
//! byte, every key reference, every fresh string) parses exactly like the entry the shape
//! came from: pickle opcodes are read left to right and their lengths are fixed by the
//! opcode and its length bytes, all of which the compare covered. Whatever differs (a
//! size written as `M` instead of `K`, a longer address, a FRAME opcode inside the entry, a
//! new stack list) misses every shape and goes to the key-by-key decoder, which learns
//! the new layout. An entry whose `frames` is a fresh list (PyTorch writes one per captured
//! traceback), as its last key, has a shape too: its bytes up to the list, whose items
//! vary in number and are read by the absorber's list reader ([`EntryShape::fresh_frames`]).
//! Four shapes cover all but a few entries in a thousand of the traces this decoder reads.
//!
//! Principal type: [`EntryShape`]. Only the layout lives here; what a memo reference
//! means is resolved by the absorber in `load.rs`, with the same checks as its key-by-key
//! decoder.

use crate::model::StrId;

/// Bytes of an entry a shape covers, from the dict's MEMOIZE to its SETITEMS (a typical
/// entry is 60–80 bytes).
pub(crate) const SHAPE_BYTES: usize = 128;
/// Bytes the decoder needs in view at an entry's start: the compared bytes, plus room
/// for an 8-byte load at any payload offset.
pub(crate) const WINDOW: usize = SHAPE_BYTES + 16;
const LANES: usize = 16;
/// Where an entry's values go, one field each ([`EntryShape::fields`] is indexed by it).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Slot {
    Addr,
    Size,
    Stream,
    Time,
    /// A memo reference to an action string.
    Action,
    /// A memo reference to the `compile_context` string.
    CompileContext,
    /// A memo reference to the `user_metadata` string.
    UserMetadata,
    /// A memo reference to the `frames` list (already a stack).
    Frames,
}
const SLOTS: usize = 8;

/// One value's payload, at a fixed offset of the entries of a shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Field {
    /// Offset of the payload from the entry's start (below [`SHAPE_BYTES`]).
    pub off: u8,
    /// `64 - 8 × payload bytes`: the payload is the low bytes of an 8-byte load. Ints
    /// take 1–8 bytes; memo references 1 (`BINGET`) or 4 (`LONG_BINGET`).
    pub shift: u8,
    /// Ints: two's complement (`J`, `LONG1`) rather than unsigned (`K`, `M`).
    pub signed: bool,
    /// Whether the entries of this shape have the key at all.
    pub present: bool,
}

impl Field {
    const ABSENT: Field = Field { off: 0, shift: 0, signed: false, present: false };

    /// The int this field holds (both readings computed and one picked, without a branch).
    #[inline(always)]
    pub fn int(self, w: &[u8; WINDOW]) -> i64 {
        let up = load(w, self.off) << (self.shift & 63);
        let signed = (up as i64) >> (self.shift & 63);
        let unsigned = (up >> (self.shift & 63)) as i64;
        if self.signed {
            signed
        } else {
            unsigned
        }
    }
    /// The memo reference this field holds, in the raw form of `load.rs`'s `memo_ref`
    /// (the index, with bit 32 set for `LONG_BINGET`).
    #[inline(always)]
    pub fn memo_ref(self, w: &[u8; WINDOW]) -> u64 {
        ((load(w, self.off) << (self.shift & 63)) >> (self.shift & 63)) | ((self.shift == 32) as u64) << 32
    }
}

/// An entry's layout. See the module documentation.
#[derive(Clone)]
pub(crate) struct EntryShape {
    bytes: [u8; SHAPE_BYTES],
    /// All ones over the bytes every entry of this shape repeats; zero over payloads and
    /// past the entry's end.
    mask: [u8; SHAPE_BYTES],
    /// 16-byte blocks that hold the entry (the rest is not compared).
    blocks: usize,
    pub len: usize,
    /// By [`Slot`].
    pub fields: [Field; SLOTS],
    /// Strings the entry writes fresh (always the same bytes, so the same string).
    pub compile_context: Option<StrId>,
    pub user_metadata: Option<StrId>,
    /// The fresh strings it memoizes, in stream order (at most four, as the key-by-key
    /// decoder allows).
    pub memos: [Option<StrId>; 4],
    pub n_memos: usize,
    /// The entry goes on after `len` bytes with a fresh `frames` list, its last key, then
    /// SETITEMS: the list is read by the absorber's list reader (its bytes vary in length).
    pub fresh_frames: bool,
}

impl EntryShape {
    /// An empty layout for `e[..len]`, to be filled by [`Self::payload`]; `None` when the
    /// entry is too long for a shape.
    pub fn new(e: &[u8], len: usize) -> Option<Self> {
        if len > SHAPE_BYTES || e.len() < len {
            return None;
        }
        let mut bytes = [0u8; SHAPE_BYTES];
        bytes[..len].copy_from_slice(&e[..len]);
        let mut mask = [0u8; SHAPE_BYTES];
        mask[..len].fill(0xff);
        Some(EntryShape {
            bytes,
            mask,
            blocks: len.div_ceil(LANES),
            len,
            fields: [Field::ABSENT; SLOTS],
            compile_context: None,
            user_metadata: None,
            memos: [None; 4],
            n_memos: 0,
            fresh_frames: false,
        })
    }

    /// Ends the layout at `len`, where a fresh `frames` list starts, whose first two bytes
    /// (`EMPTY_LIST MEMOIZE`) it still compares: an entry laid out alike but with its
    /// `frames` by memo reference (a free's second entry) is another layout. `false` when
    /// the shape does not hold those bytes.
    pub fn stop_before_fresh_frames(&mut self, len: usize) -> bool {
        if len == 0 || len + 2 > self.len {
            return false;
        }
        self.mask[len + 2..].fill(0);
        self.len = len;
        self.blocks = (len + 2).div_ceil(LANES);
        self.fresh_frames = true;
        true
    }

    /// Marks `n` payload bytes at `off` as varying and records the field; `false` when
    /// the shape cannot hold it (a slot given twice, an empty or over-long payload).
    pub fn payload(&mut self, off: usize, n: usize, slot: Slot, signed: bool) -> bool {
        let f = &mut self.fields[slot as usize];
        if f.present || n == 0 || n > 8 || off + n > self.len {
            return false;
        }
        self.mask[off..off + n].fill(0);
        *f = Field { off: off as u8, shift: (64 - 8 * n) as u8, signed, present: true };
        true
    }

    /// Whether the entries of this shape have every key a trace entry needs.
    pub fn complete(&self) -> bool {
        [Slot::Action, Slot::Addr, Slot::Size].iter().all(|&s| self.fields[s as usize].present)
    }

    /// Whether two shapes describe the same layout.
    pub fn same_layout(&self, other: &EntryShape) -> bool {
        self.len == other.len
            && self.fresh_frames == other.fresh_frames
            && self.mask == other.mask
            && self.fields == other.fields
            && (0..SHAPE_BYTES).all(|i| self.bytes[i] & self.mask[i] == other.bytes[i] & other.mask[i])
    }

    /// Whether the entry at the start of `w` has this layout.
    #[inline(always)]
    pub fn matches(&self, w: &[u8; WINDOW]) -> bool {
        // Lane by lane over 16-byte blocks, which compiles to vector instructions.
        let mut diff = [0u8; LANES];
        for b in 0..self.blocks.min(SHAPE_BYTES / LANES) {
            let at = b * LANES;
            for k in 0..LANES {
                diff[k] |= (w[at + k] ^ self.bytes[at + k]) & self.mask[at + k];
            }
        }
        u128::from_ne_bytes(diff) == 0
    }
}

/// The 8 bytes at a field's offset (`off` < [`SHAPE_BYTES`], so inside the window).
#[inline(always)]
pub(crate) fn load(w: &[u8; WINDOW], off: u8) -> u64 {
    let o = off as usize % SHAPE_BYTES;
    u64::from_le_bytes(w[o..o + 8].try_into().unwrap())
}
