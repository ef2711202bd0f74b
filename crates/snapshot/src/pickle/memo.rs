//! The pickle memo, in chunks that are freed once every entry in them is consumed.
//!
//! Protocol 4 memoizes every dict, so a trace of N entries leaves N memo slots that the
//! stream never references again once the entries are absorbed. Holding them would cost
//! 16 bytes per event; dropping whole consumed chunks keeps memory proportional to what
//! can still be referenced (strings, frames, shared stacks).

use super::vm::Value;

const SHIFT: usize = 10;
const CHUNK: usize = 1 << SHIFT;

pub(crate) struct Memo {
    /// Bumped whenever a slot holding a string, stack or frame is overwritten or consumed,
    /// so caches of resolved memo references (the trace-entry key templates, the known
    /// `frames` lists) know to drop what they hold.
    pub string_overwrites: u64,
    chunks: Vec<Option<Box<[Value; CHUNK]>>>,
    /// Entries per chunk that hold `Consumed`; a chunk full of them is dropped.
    consumed: Vec<u16>,
    len: usize,
}

impl Memo {
    pub fn new() -> Self {
        Memo { string_overwrites: 0, chunks: Vec::new(), consumed: Vec::new(), len: 0 }
    }
    /// One past the highest index ever set (MEMOIZE's next index).
    pub fn len(&self) -> usize {
        self.len
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
                if matches!(slot, Value::Str(_) | Value::Stack(_) | Value::Frame(_)) {
                    // Not met in a well-formed file (those are never consumed); caches of
                    // resolved references must still drop what they hold.
                    self.string_overwrites += 1;
                }
                if !matches!(slot, Value::Consumed) {
                    *slot = Value::Consumed;
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
            Some(Some(c)) => c[idx & (CHUNK - 1)],
            Some(None) => Value::Consumed,
            None => Value::Undef,
        }
    }
    #[inline]
    pub fn set(&mut self, idx: usize, v: Value) {
        let ci = idx >> SHIFT;
        if ci >= self.chunks.len() {
            self.chunks.resize_with(ci + 1, || Some(chunk_of(Value::Undef)));
            self.consumed.resize(ci + 1, 0);
        }
        self.len = self.len.max(idx + 1);
        let Some(chunk) = &mut self.chunks[ci] else {
            // Writing into a dropped chunk (BINPUT reusing an old index): revive it.
            let mut c = chunk_of(Value::Consumed);
            c[idx & (CHUNK - 1)] = v;
            self.consumed[ci] = CHUNK as u16 - u16::from(!matches!(v, Value::Consumed));
            self.chunks[ci] = Some(c);
            return;
        };
        let slot = &mut chunk[idx & (CHUNK - 1)];
        if matches!(slot, Value::Str(_) | Value::Stack(_) | Value::Frame(_)) {
            self.string_overwrites += 1;
        }
        let was = matches!(slot, Value::Consumed);
        let now = matches!(v, Value::Consumed);
        *slot = v;
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

/// A chunk filled with `v`, written in place: `Box::new([v; CHUNK])` builds the 16 KiB on
/// the stack and copies it over, which was most of the cost of a new chunk (one per 1,024
/// trace entries where `frames` lists stay referable).
fn chunk_of(v: Value) -> Box<[Value; CHUNK]> {
    vec![v; CHUNK].into_boxed_slice().try_into().unwrap()
}
