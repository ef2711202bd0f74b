//! The pickle memo, in chunks that are freed once every entry in them is consumed, each
//! entry a 4-byte code.
//!
//! Protocol 4 memoizes every dict, so a trace of N entries leaves N memo slots that the
//! stream never references again once the entries are absorbed. Holding them would cost
//! 16 bytes per event; dropping whole consumed chunks keeps memory proportional to what
//! can still be referenced (strings, frames, shared stacks). PyTorch's dumps also write a
//! fresh `frames` list per entry, whose stack stays referable (a free's entry names its
//! block's list again), so those chunks are never dropped: a slot is a code of 4 bytes,
//! not a [`Value`] of 16, and a trace of millions of entries fills a quarter of the pages.

use super::vm::Value;
use crate::model::{FrameId, StackId, StrId};

const SHIFT: usize = 10;
const CHUNK: usize = 1 << SHIFT;

/// Codes: the kind in the top three bits and an id below; or, with the top bit set, an
/// index into `Memo::others` in the 31 bits below.
const UNDEF: u32 = 0;
const CONSUMED: u32 = 1;
const KIND: u32 = 29;
const STACK: u32 = 1;
const FRAME: u32 = 2;
const STR: u32 = 3;
const ID_MASK: u32 = (1 << KIND) - 1;
const OTHER: u32 = 1 << 31;

pub(crate) struct Memo {
    /// Bumped whenever a slot holding a string, stack or frame is overwritten or consumed,
    /// so caches of resolved memo references (the trace-entry key templates, the known
    /// `frames` lists) know to drop what they hold.
    pub string_overwrites: u64,
    chunks: Vec<Option<Box<[u32; CHUNK]>>>,
    /// Entries per chunk that hold `Consumed`; a chunk full of them is dropped.
    consumed: Vec<u16>,
    /// Values without a code of their own (containers, numbers, ids past 2^29), by the
    /// index in their code ([`OTHER`]). An overwritten one stays: such slots are few (the segments'
    /// dicts and lists, later consumed), and a slot held 16 bytes before.
    others: Vec<Value>,
    len: usize,
}

/// A chunk filled with `code`, written in place (a chunk built on the stack and copied
/// over cost more than filling it).
fn chunk_of(code: u32) -> Box<[u32; CHUNK]> {
    vec![code; CHUNK].into_boxed_slice().try_into().unwrap()
}

/// Whether a code names a string, stack or frame (what caches of references resolve).
#[inline(always)]
fn names_a_string(code: u32) -> bool {
    matches!(code >> KIND, STACK | FRAME | STR)
}

impl Memo {
    pub fn new() -> Self {
        Memo { string_overwrites: 0, chunks: Vec::new(), consumed: Vec::new(), others: Vec::new(), len: 0 }
    }
    /// One past the highest index ever set (MEMOIZE's next index).
    pub fn len(&self) -> usize {
        self.len
    }
    /// The bytes the memo holds, but for its chunks' bodies (4 bytes per index, and
    /// indices are bounded by the input offset).
    pub fn held_bytes(&self) -> usize {
        self.chunks.len() * (size_of::<Option<Box<[u32; CHUNK]>>>() + size_of::<u16>())
            + self.others.len() * size_of::<Value>()
    }
    /// Takes the next index without writing it (MEMOIZE of a dict that may be absorbed).
    #[inline]
    pub fn reserve(&mut self) -> usize {
        self.len += 1;
        self.len - 1
    }
    /// Marks an entry consumed: cheaper than `set`, and the common case on large traces.
    #[inline(always)]
    pub fn consume(&mut self, idx: usize) {
        // Nearly every trace entry's slot lies in a chunk already dropped (consumed
        // throughout): one check, inlined into the trace decoders.
        if let Some(None) = self.chunks.get(idx >> SHIFT) {
            return;
        }
        self.consume_slow(idx)
    }

    #[inline(never)]
    fn consume_slow(&mut self, idx: usize) {
        let ci = idx >> SHIFT;
        match self.chunks.get_mut(ci) {
            Some(Some(chunk)) => {
                let slot = &mut chunk[idx & (CHUNK - 1)];
                if names_a_string(*slot) {
                    // Not met in a well-formed file (those are never consumed); caches of
                    // resolved references must still drop what they hold.
                    self.string_overwrites += 1;
                }
                if *slot != CONSUMED {
                    *slot = CONSUMED;
                    self.consumed[ci] += 1;
                    if self.consumed[ci] as usize == CHUNK {
                        self.chunks[ci] = None;
                    }
                }
                return;
            }
            // A dropped chunk holds nothing but consumed slots already.
            Some(None) => return,
            None => {}
        }
        if ci == self.chunks.len() {
            // The next chunk, not made yet: trace entries fill new chunks with nothing but
            // consumed slots, so start it dropped rather than allocating it just to drop it
            // 1,024 entries later. A string memoized into it later revives it (`set`).
            self.chunks.push(None);
            self.consumed.push(CHUNK as u16);
            return;
        }
        self.set(idx, Value::Consumed);
    }
    /// The value at `idx`: [`Value::Undef`] if never set, [`Value::Consumed`] if absorbed.
    #[inline(always)]
    pub fn get(&self, idx: usize) -> Value {
        match self.chunks.get(idx >> SHIFT) {
            Some(Some(c)) => self.value(c[idx & (CHUNK - 1)]),
            Some(None) => Value::Consumed,
            None => Value::Undef,
        }
    }

    #[inline(always)]
    fn value(&self, code: u32) -> Value {
        if code & OTHER != 0 {
            return self.others[(code & !OTHER) as usize];
        }
        let id = (code & ID_MASK) as usize;
        match code >> KIND {
            STACK => Value::Stack(StackId::from_index(id)),
            FRAME => Value::Frame(FrameId::from_index(id)),
            STR => Value::Str(StrId::from_index(id)),
            _ if code == CONSUMED => Value::Consumed,
            _ => Value::Undef,
        }
    }

    /// The code of `v`, keeping it in `others` when it has none of its own.
    #[inline(always)]
    fn code(&mut self, v: Value) -> u32 {
        let id = |kind: u32, i: usize| (i < ID_MASK as usize).then_some(kind << KIND | i as u32);
        let code = match v {
            Value::Undef => Some(UNDEF),
            Value::Consumed => Some(CONSUMED),
            Value::Stack(s) => id(STACK, s.index()),
            Value::Frame(f) => id(FRAME, f.index()),
            Value::Str(s) => id(STR, s.index()),
            _ => None,
        };
        code.unwrap_or_else(|| {
            // 2^31 of them would be 32 GiB of values: memory runs out long before.
            let i = u32::try_from(self.others.len()).ok().filter(|&i| i < OTHER).expect("2^31 memoized values");
            self.others.push(v);
            OTHER | i
        })
    }

    #[inline]
    pub fn set(&mut self, idx: usize, v: Value) {
        let code = self.code(v);
        let ci = idx >> SHIFT;
        if ci >= self.chunks.len() {
            self.chunks.resize_with(ci + 1, || Some(chunk_of(UNDEF)));
            self.consumed.resize(ci + 1, 0);
        }
        self.len = self.len.max(idx + 1);
        let Some(chunk) = &mut self.chunks[ci] else {
            // Writing into a dropped chunk (BINPUT reusing an old index): revive it.
            let mut c = chunk_of(CONSUMED);
            c[idx & (CHUNK - 1)] = code;
            self.consumed[ci] = CHUNK as u16 - u16::from(code != CONSUMED);
            self.chunks[ci] = Some(c);
            return;
        };
        let slot = &mut chunk[idx & (CHUNK - 1)];
        if names_a_string(*slot) {
            self.string_overwrites += 1;
        }
        let was = *slot == CONSUMED;
        let now = code == CONSUMED;
        *slot = code;
        if was != now {
            if now {
                self.consumed[ci] += 1;
                if self.consumed[ci] as usize == CHUNK {
                    self.chunks[ci] = None;
                }
            } else {
                self.consumed[ci] -= 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_value_reads_back_as_it_was_set() {
        let mut m = Memo::new();
        let values = [
            Value::Stack(StackId::from_index(7)),
            Value::Frame(FrameId::from_index(0)),
            Value::Str(StrId::from_index(123_456)),
            // Ids past what a code holds go to the side table.
            Value::Stack(StackId::from_index(ID_MASK as usize)),
            Value::Str(StrId::from_index(1 << 30)),
            Value::Int(-5),
            Value::Float(2.5),
            Value::Pair(1, 2),
            Value::None,
            Value::Bool(true),
        ];
        for (i, &v) in values.iter().enumerate() {
            m.set(3 * i, v);
        }
        for (i, &v) in values.iter().enumerate() {
            assert_eq!(m.get(3 * i), v, "slot {}", 3 * i);
            assert_eq!(m.get(3 * i + 1), Value::Undef);
        }
        assert_eq!(m.len(), 3 * (values.len() - 1) + 1);
        assert_eq!(m.get(1 << 20), Value::Undef);
        assert_eq!(m.string_overwrites, 0);
    }

    #[test]
    fn overwriting_or_consuming_a_string_stack_or_frame_is_counted() {
        let mut m = Memo::new();
        m.set(0, Value::Str(StrId::from_index(1)));
        m.set(1, Value::Int(3));
        m.set(1, Value::Int(4));
        assert_eq!(m.string_overwrites, 0, "an int written over is no string");
        m.set(0, Value::Stack(StackId::from_index(2)));
        assert_eq!(m.string_overwrites, 1);
        m.consume(0);
        assert_eq!(m.string_overwrites, 2);
        assert_eq!(m.get(0), Value::Consumed);
    }

    #[test]
    fn consumed_chunks_are_dropped_and_revived_by_a_write() {
        let mut m = Memo::new();
        // A chunk of trace entries: every slot consumed as it is made.
        for _ in 0..CHUNK {
            let i = m.reserve();
            m.consume(i);
        }
        assert!(m.chunks[0].is_none());
        assert_eq!(m.get(5), Value::Consumed);
        // The next chunk holds stacks between consumed entries: it stays.
        for k in 0..CHUNK / 2 {
            let i = m.reserve();
            m.consume(i);
            let s = m.len();
            m.set(s, Value::Stack(StackId::from_index(k)));
        }
        assert!(m.chunks[1].is_some());
        assert_eq!(m.get(CHUNK + 1), Value::Stack(StackId::from_index(0)));
        // A BINPUT into the dropped chunk brings it back, the rest still consumed.
        m.set(9, Value::Str(StrId::from_index(4)));
        assert_eq!(m.get(9), Value::Str(StrId::from_index(4)));
        assert_eq!(m.get(10), Value::Consumed);
        m.consume(9);
        assert!(m.chunks[0].is_none(), "consumed throughout again");
    }
}
