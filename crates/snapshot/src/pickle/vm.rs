//! A pickle virtual machine that accepts data opcodes only.
//!
//! Why not a generic pickle crate: a multi-GB snapshot holds tens of millions of small
//! dicts, and a value tree of them costs 10–30× the file size. This VM keeps values as
//! `Copy` handles into arenas and lets the snapshot layer *absorb* trace-entry dicts,
//! frame dicts and plain block dicts ([`FlatBlock`]) the moment they complete or are
//! appended to a list, so that what stays in memory is the compact model, not the
//! pickle's object graph.
//!
//! Safety: every opcode that would import, call or build an object (GLOBAL, REDUCE, ...)
//! is refused before anything else happens; nothing is ever executed. All sizes read from
//! the stream are checked against the data actually present before memory is reserved.

use std::io::Read;

use super::memo::Memo;
use crate::budget;
use crate::error::ReadError;
use crate::model::{BlockState, FrameId, FrameTable, StackId, StrId};

/// A value on the VM stack or in the memo. `Copy`: containers are arena handles.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Value {
    None,
    Bool(bool),
    Int(i64),
    /// Index into [`VmState::bigs`].
    Big(u32),
    Float(f64),
    Str(StrId),
    /// Index into [`VmState::bytes`].
    Bytes(u32),
    List(Handle),
    Dict(Handle),
    /// Index into [`VmState::tuples`].
    Tuple(u32),
    /// A 2-tuple of small non-negative ints (pool ids), kept inline: recent PyTorch writes
    /// a fresh `pool_id` tuple for every trace entry.
    Pair(u32, u32),
    /// A frame dict that the snapshot layer has interned.
    Frame(FrameId),
    /// A frame list that the snapshot layer has interned.
    Stack(StackId),
    /// A dict absorbed into the compact model; referencing it again is unsupported.
    Consumed,
    /// A memo slot never written.
    Undef,
    /// A trace entry the absorber built as its dict completed, waiting to be appended
    /// to its list (index into the absorber's pending entries).
    Event(u32),
    /// A segment's block dict the absorber decoded whole as it completed (index into
    /// [`VmState::blocks`]); a dict again wherever one is looked at ([`VmState::block_items`]).
    Block(u32),
}

/// A segment's block dict decoded whole as it completed ([`Value::Block`]), never built as
/// a dict: an allocator-consistent file holds 100,000s of them, and a dict each (its arena
/// slot, its item vector, then a copy of its items to read them) was most of the time the
/// reader spent before the first trace entry. Only a dict whose every key is one of
/// `address`, `size`, `requested_size`, `state` and `frames`, each once, with an int
/// where an int goes, a known state and a frame list (or `None`) for `frames`, is taken
/// so; any other stays a dict, for the builder to read (and name what is wrong) as before.
/// [`VmState::block_items`] gives back its items as the dict held them.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FlatBlock {
    /// `address`, `size` and `requested_size` as written, by key code ([`BK_ADDRESS`]..).
    pub ints: [i64; 3],
    pub state: BlockState,
    /// The `state` string as written (`active_awaiting_free` too parses); always there
    /// once the block is kept.
    pub state_str: Option<StrId>,
    /// The `frames` value (a list, a stack or `None`), interned by the builder as a dict's.
    pub frames: Value,
    /// A bit per key code present.
    pub seen: u8,
    /// The key codes in the dict's order, 3 bits each, the first lowest; `n` of them.
    pub order: u16,
    pub n: u8,
    /// The dict it became when a pickle added items to it after it completed (SETITEMS
    /// on a memo reference): references resolve to that dict from then on.
    pub dict: Option<Handle>,
}

/// Key codes of [`FlatBlock`], in [`VmState::block_keys`] and [`FlatBlock::order`].
pub(crate) const BK_ADDRESS: u8 = 0;
pub(crate) const BK_SIZE: u8 = 1;
pub(crate) const BK_REQUESTED: u8 = 2;
pub(crate) const BK_STATE: u8 = 3;
pub(crate) const BK_FRAMES: u8 = 4;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Handle {
    pub idx: u32,
    gen: u32,
}

const NO_MEMO: u32 = u32::MAX;

pub(crate) struct DictSlot {
    gen: u32,
    memo: u32,
    pub items: Vec<(Value, Value)>,
    /// Set when the dict was absorbed but its slot is kept (frames are shared, and may be
    /// referenced again in the same APPENDS batch): references resolve to this instead.
    pub replaced: Option<Value>,
    /// The absorber saw these items whole ([`Absorber::on_dict`]) and kept the dict as a
    /// dict: appended to a list, it is kept again without asking (its answer would be the
    /// same, from the same items). Cleared when items are added. Why: a segment's blocks
    /// the absorber does not decode whole ([`FlatBlock`] says which it does) are such
    /// dicts, and asking again copied and sorted each block's keys twice more.
    plain: bool,
}

pub(crate) struct ListSlot {
    gen: u32,
    memo: u32,
    pub items: Vec<Value>,
    /// Set when the list was interned as a stack: handles to it taken before that (a
    /// frame list shared by two entries of one APPENDS batch, or by two segments) must
    /// resolve to the stack, not to the emptied list.
    pub replaced: Option<Value>,
}

/// What the snapshot layer does with a value appended to a list.
pub(crate) enum Absorb {
    /// Keep it in the list.
    Keep(Value),
    /// The value was taken over (e.g. a trace entry); the list does not store it.
    Taken,
}

/// The snapshot layer's hooks into the VM.
pub(crate) trait Absorber {
    /// Called for every item appended to list `list` (APPEND, APPENDS, LIST).
    fn on_append(&mut self, vm: &mut VmState, list: u32, item: Value) -> Result<Absorb, ReadError>;
    /// Called when a flat dict (no nested containers built inline) completes on the fast
    /// path. Returning `Some((pushed, memo))` absorbs it: `pushed` goes on the stack in its
    /// place and `memo` into its memo slot. `None` keeps it as an ordinary dict.
    fn on_dict(&mut self, vm: &mut VmState, items: &[Value]) -> Result<Option<(Value, Value)>, ReadError>;
    /// A chance to decode the dict starting at `buf[0]` (its MEMOIZE) entirely by itself.
    /// On success it has done the dict's memo bookkeeping and returns the bytes consumed
    /// (through SETITEMS) and the value to push; on `None` it must have changed nothing.
    fn try_flat_entry(&mut self, vm: &mut VmState, buf: &[u8]) -> Option<(usize, Value)>;
    /// Whether list `list` is the one receiving trace events, so that an APPENDS batch
    /// into it may go through [`Absorber::absorb_batch`].
    fn takes_batches(&self, list: u32) -> bool;
    /// Right after the MARK of a batch into `list` (`buf[0]` is the first item): decodes
    /// trace entries straight into the list until the batch's APPENDS. Returns the bytes
    /// consumed, the entries absorbed, and whether the APPENDS was reached (and consumed).
    /// When it was not, the VM hands the absorbed entries back with
    /// [`Absorber::unabsorb`] and goes on generically from the first byte not consumed.
    fn absorb_batch(&mut self, vm: &mut VmState, list: u32, buf: &[u8]) -> (usize, usize, bool);
    /// Takes the last `n` absorbed entries of `list` back out and pushes them, in order,
    /// as stack items (what the generic path would have left between MARK and APPENDS).
    fn unabsorb(&mut self, list: u32, n: usize, stack: &mut Vec<Value>);
}

/// Arenas and tables, separate from the input so absorbers can borrow them.
pub(crate) struct VmState {
    pub dicts: Vec<DictSlot>,
    free_dicts: Vec<u32>,
    pub lists: Vec<ListSlot>,
    pub tuples: Vec<Vec<Value>>,
    pub bigs: Vec<Vec<u8>>,
    pub bytes: Vec<Vec<u8>>,
    pub memo: Memo,
    pub table: FrameTable,
    /// Offset of the opcode being executed, for messages.
    pub offset: u64,
    /// Bytes held by container items, tuples, byte strings and big ints (an estimate:
    /// the items of an absorbed dict or interned list are given back): with the arenas'
    /// and the stack's lengths, what [`Vm::check_budget`] weighs against the input read.
    pub held: u64,
    /// Block dicts decoded whole ([`Value::Block`]).
    pub blocks: Vec<FlatBlock>,
    /// The key strings of [`FlatBlock`]s by key code, as the pickle named them (their
    /// interned ids), to give a block's items back.
    pub block_keys: [Option<StrId>; 5],
}

impl VmState {
    pub fn new() -> Self {
        VmState {
            dicts: Vec::new(),
            free_dicts: Vec::new(),
            lists: Vec::new(),
            tuples: Vec::new(),
            bigs: Vec::new(),
            bytes: Vec::new(),
            memo: Memo::new(),
            table: FrameTable::default(),
            offset: 0,
            held: 0,
            blocks: Vec::new(),
            block_keys: [None; 5],
        }
    }
    pub fn dict(&self, h: Handle) -> Result<&DictSlot, ReadError> {
        match self.dicts.get(h.idx as usize) {
            Some(d) if d.gen == h.gen => Ok(d),
            _ => Err(self.corrupt("reference to a dict that was already consumed")),
        }
    }
    pub fn list(&self, h: Handle) -> Result<&ListSlot, ReadError> {
        match self.lists.get(h.idx as usize) {
            Some(l) if l.gen == h.gen => Ok(l),
            _ => Err(self.corrupt("bad list reference")),
        }
    }
    pub fn list_mut(&mut self, h: Handle) -> Result<&mut ListSlot, ReadError> {
        let off = self.offset;
        match self.lists.get_mut(h.idx as usize) {
            Some(l) if l.gen == h.gen => Ok(l),
            _ => Err(ReadError::Corrupt { what: "bad list reference".into(), offset: off }),
        }
    }
    pub fn corrupt(&self, what: &str) -> ReadError {
        ReadError::Corrupt { what: what.to_string(), offset: self.offset }
    }
    pub fn str(&self, id: StrId) -> &str {
        self.table.str(id)
    }
    /// Releases a dict that was absorbed, replacing its memo entry with `replacement`
    /// so later memo references see the compact form instead of the dict. A recycled slot
    /// is reused for the next dict (trace entries: millions, never shared); a kept slot
    /// forwards stale handles to `replacement` (frames: few, often shared).
    pub fn retire_dict(&mut self, h: Handle, replacement: Value, recycle: bool) {
        let slot = &mut self.dicts[h.idx as usize];
        let memo = slot.memo;
        self.held = self.held.saturating_sub((slot.items.len() * size_of::<(Value, Value)>()) as u64);
        if recycle {
            // Keep the Vec's capacity: the next trace entry reuses it without allocating.
            slot.items.clear();
            slot.gen = slot.gen.wrapping_add(1);
            slot.memo = NO_MEMO;
            slot.plain = false;
            self.free_dicts.push(h.idx);
        } else {
            slot.items = Vec::new();
            slot.replaced = Some(replacement);
        }
        if memo != NO_MEMO {
            self.memo.set(memo as usize, replacement);
        }
    }
    /// A dict handle whose dict was absorbed, or a list handle whose list was interned
    /// as a stack, resolves to its compact form.
    pub fn resolve(&self, v: Value) -> Value {
        match v {
            Value::Dict(h) => {
                if let Some(d) = self.dicts.get(h.idx as usize) {
                    if d.gen == h.gen {
                        if let Some(r) = d.replaced {
                            return r;
                        }
                    }
                }
            }
            Value::List(h) => {
                if let Some(l) = self.lists.get(h.idx as usize) {
                    if l.gen == h.gen {
                        if let Some(r) = l.replaced {
                            return r;
                        }
                    }
                }
            }
            Value::Block(i) => {
                if let Some(h) = self.blocks[i as usize].dict {
                    return Value::Dict(h);
                }
            }
            _ => {}
        }
        v
    }
    /// The items of the block dict decoded whole as [`Value::Block`]`(i)`, in the dict's
    /// order, as the dict would have held them.
    pub fn block_items(&self, i: u32) -> Vec<(Value, Value)> {
        let b = &self.blocks[i as usize];
        (0..b.n)
            .map(|j| {
                let code = (b.order >> (3 * j)) & 7;
                let key = self.block_keys[code as usize].expect("a block key is named before its block is kept");
                let v = match code as u8 {
                    BK_STATE => b.state_str.map_or(Value::None, Value::Str),
                    BK_FRAMES => b.frames,
                    c => Value::Int(b.ints[c as usize]),
                };
                (Value::Str(key), v)
            })
            .collect()
    }
    /// The dict of [`Value::Block`]`(i)`, built now (once) because a pickle adds items to
    /// it: from then on the block resolves to this dict.
    fn block_dict(&mut self, i: u32) -> Handle {
        if let Some(h) = self.blocks[i as usize].dict {
            return h;
        }
        let items = self.block_items(i);
        let Value::Dict(h) = self.new_dict() else { unreachable!("new_dict makes a dict") };
        self.held += (items.len() * size_of::<(Value, Value)>()) as u64;
        self.dicts[h.idx as usize].items = items;
        self.blocks[i as usize].dict = Some(h);
        h
    }
    /// Replaces a list's memo entry (after its content was interned as a stack).
    pub fn retire_list(&mut self, h: Handle, replacement: Value) {
        let slot = &mut self.lists[h.idx as usize];
        self.held = self.held.saturating_sub((slot.items.len() * size_of::<Value>()) as u64);
        slot.items = Vec::new();
        // Stale handles to this list (taken before interning) resolve to the stack.
        slot.replaced = Some(replacement);
        if slot.memo != NO_MEMO {
            self.memo.set(slot.memo as usize, replacement);
        }
    }
    pub(crate) fn new_dict(&mut self) -> Value {
        if let Some(idx) = self.free_dicts.pop() {
            let slot = &mut self.dicts[idx as usize];
            slot.replaced = None;
            slot.plain = false;
            return Value::Dict(Handle { idx, gen: slot.gen });
        }
        let idx = self.dicts.len() as u32;
        self.dicts.push(DictSlot { gen: 0, memo: NO_MEMO, items: Vec::new(), replaced: None, plain: false });
        Value::Dict(Handle { idx, gen: 0 })
    }
    pub(crate) fn new_list(&mut self) -> (Value, u32) {
        let idx = self.lists.len() as u32;
        self.lists.push(ListSlot { gen: 0, memo: NO_MEMO, items: Vec::new(), replaced: None });
        (Value::List(Handle { idx, gen: 0 }), idx)
    }
    pub(crate) fn new_tuple(&mut self, items: Vec<Value>) -> Value {
        if let [Value::Int(a), Value::Int(b)] = items[..] {
            if let (Ok(a), Ok(b)) = (u32::try_from(a), u32::try_from(b)) {
                return Value::Pair(a, b);
            }
        }
        self.held += (items.len() * size_of::<Value>()) as u64;
        self.tuples.push(items);
        Value::Tuple(self.tuples.len() as u32 - 1)
    }
}

/// Buffered input that tracks the byte offset and never reserves more memory than the
/// data that actually arrived (a length field cannot make it allocate gigabytes).
struct Input<R: Read> {
    r: R,
    buf: Buf,
    pos: usize,
    end: usize,
    base: u64,
}

/// Where the input's bytes are: a buffer filled by `read()`, or the whole file mapped
/// (then `pos..end` covers all of it and there is nothing more to read).
enum Buf {
    Read(Vec<u8>),
    Mapped(super::mapped::Mapping),
}

impl std::ops::Deref for Buf {
    type Target = [u8];
    #[inline(always)]
    fn deref(&self) -> &[u8] {
        match self {
            Buf::Read(v) => v,
            Buf::Mapped(m) => m.bytes(),
        }
    }
}

/// Read size. Large enough that keeping a whole APPENDS batch in view (`BATCH_WINDOW`)
/// rarely moves what is left to the front: with 1 MiB, that move copied a fifth of the
/// file again.
const CHUNK: usize = 4 << 20;
/// Bytes an APPENDS batch of trace entries gets in the buffer before it is decoded in
/// one go (a batch of 1,000 typical entries is 60–70 KB).
const BATCH_WINDOW: usize = 192 << 10;

impl<R: Read> Input<R> {
    fn offset(&self) -> u64 {
        self.base + self.pos as u64
    }
    #[inline]
    fn byte(&mut self) -> Result<u8, ReadError> {
        if self.pos < self.end {
            let b = self.buf[self.pos];
            self.pos += 1;
            return Ok(b);
        }
        self.fill(1)?;
        let b = self.buf[self.pos];
        self.pos += 1;
        Ok(b)
    }
    #[inline]
    fn take(&mut self, n: usize) -> Result<&[u8], ReadError> {
        if self.end - self.pos < n {
            self.fill(n)?;
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    #[cold]
    fn fill(&mut self, n: usize) -> Result<(), ReadError> {
        self.refill(n, true)
    }
    /// Like `fill`, but the end of the input is not an error: it reads what there is.
    #[cold]
    fn fill_upto(&mut self, n: usize) -> Result<(), ReadError> {
        self.refill(n, false)
    }
    fn refill(&mut self, n: usize, strict: bool) -> Result<(), ReadError> {
        let buf = match &mut self.buf {
            Buf::Read(v) => v,
            // A mapped file is all in view already.
            Buf::Mapped(_) if strict => return Err(ReadError::Truncated { offset: self.base + self.end as u64 }),
            Buf::Mapped(_) => return Ok(()),
        };
        let rem = self.end - self.pos;
        buf.copy_within(self.pos..self.end, 0);
        self.base += self.pos as u64;
        self.pos = 0;
        self.end = rem;
        while self.end < n {
            if self.end == buf.len() {
                // Grow only by doubling what we already hold, so memory follows real data.
                let grow = buf.len().max(CHUNK);
                buf.resize(buf.len() + grow, 0);
            }
            let k = loop {
                match self.r.read(&mut buf[self.end..]) {
                    Ok(k) => break k,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break 0,
                    Err(e) => {
                        // flate2 reports a damaged gzip stream as InvalidInput/InvalidData.
                        return Err(match e.kind() {
                            std::io::ErrorKind::InvalidData | std::io::ErrorKind::InvalidInput => ReadError::Corrupt {
                                what: format!("compressed stream: {e}"),
                                offset: self.base + self.end as u64,
                            },
                            // A limit of the reader under it (the inflation guard) or an I/O error.
                            _ => ReadError::from(e),
                        });
                    }
                }
            };
            if k == 0 {
                if !strict {
                    return Ok(());
                }
                return Err(ReadError::Truncated { offset: self.base + self.end as u64 });
            }
            self.end += k;
        }
        Ok(())
    }
}

fn le_u32(b: &[u8]) -> u32 {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

fn refuse(op: u8, offset: u64) -> Option<ReadError> {
    let (opcode, what) = match op {
        b'c' => ("GLOBAL", "import code"),
        0x93 => ("STACK_GLOBAL", "import code"),
        b'i' => ("INST", "import and call code"),
        b'o' => ("OBJ", "call code"),
        b'R' => ("REDUCE", "call code"),
        b'b' => ("BUILD", "call code (__setstate__)"),
        0x81 => ("NEWOBJ", "call code"),
        0x92 => ("NEWOBJ_EX", "call code"),
        0x82 => ("EXT1", "import code from the extension registry"),
        0x83 => ("EXT2", "import code from the extension registry"),
        0x84 => ("EXT4", "import code from the extension registry"),
        b'P' => ("PERSID", "call a persistent-id loader"),
        b'Q' => ("BINPERSID", "call a persistent-id loader"),
        0x97 => ("NEXT_BUFFER", "read an out-of-band buffer"),
        0x98 => ("READONLY_BUFFER", "read an out-of-band buffer"),
        _ => return None,
    };
    Some(ReadError::Refused { opcode, offset, what })
}

/// The error for an opcode [`Vm::run`] does not run: one that would run code ([`refuse`]),
/// a text-mode opcode of protocol 0/1 (PyTorch writes protocol 2 or later), or a byte
/// that is no opcode at all (a damaged file).
#[cold]
fn invalid_opcode(op: u8, off: u64) -> ReadError {
    if let Some(e) = refuse(op, off) {
        return e;
    }
    match op {
        b'I' | b'L' | b'S' | b'T' | b'U' | b'V' | b'F' | b'g' | b'p' => ReadError::Unsupported {
            what: format!("text-mode pickle opcode {:?} (protocol 0/1)", op as char),
            offset: off,
        },
        _ => ReadError::Corrupt { what: format!("invalid pickle opcode 0x{op:02x}"), offset: off },
    }
}

/// What [`flat_step`] made of one opcode in a flat dict's body.
enum FlatStep {
    /// A key or a value.
    Item(Value),
    /// MEMOIZE of a key string, or a FRAME: nothing to keep.
    Skip,
    /// The SETITEMS that closes the dict.
    Done,
    /// Anything else: the generic loop takes over at this opcode.
    Stop,
}

/// The key/value loop of [`Vm::dict_fast_path`]: decodes `(key value)* SETITEMS` from
/// `buf[p..end]` (just after the dict's `MEMOIZE MARK`) into `items`, as far as it can.
/// Returns the position reached, how many items it stored, and whether it read the
/// dict's SETITEMS (else the generic loop resumes at that position).
#[inline(always)]
fn scan_flat_items(
    buf: &[u8],
    mut p: usize,
    end: usize,
    st: &mut VmState,
    items: &mut [Value; FAST_ITEMS],
) -> (usize, usize, bool) {
    let mut n = 0usize;
    let complete = loop {
        if end - p < 16 || n == FAST_ITEMS {
            break false;
        }
        // A fixed window: every read in flat_step is at a constant offset, so none needs
        // a bounds check of its own.
        let w: &[u8; 16] = buf[p..p + 16].try_into().unwrap();
        let v = match flat_step(w, buf, &mut p, end, st, &items[..n]) {
            FlatStep::Item(v) => v,
            FlatStep::Skip => continue,
            FlatStep::Done => break true,
            FlatStep::Stop => break false,
        };
        if matches!(v, Value::Undef | Value::Consumed) {
            // Let the generic path report it, with the right offset.
            p -= if w[0] == b'h' { 2 } else { 5 };
            break false;
        }
        items[n] = v;
        n += 1;
    };
    (p, n, complete)
}

/// Decodes the opcode at the start of the window `w` (= `buf[*p..*p + 16]`) of a flat
/// dict's body, and moves `*p` past it unless it is a [`FlatStep::Stop`]. `items` are
/// the keys and values decoded so far. Only what PyTorch writes in a trace entry or a
/// frame is decoded here: memo references, small ints, 6–7 byte LONG1s (addresses and
/// times), short strings, bools, None and floats.
#[inline(always)]
fn flat_step(w: &[u8; 16], buf: &[u8], p: &mut usize, end: usize, st: &mut VmState, items: &[Value]) -> FlatStep {
    let n = items.len();
    let v = match w[0] {
        b'h' => {
            *p += 2;
            st.memo.get(w[1] as usize)
        }
        b'j' => {
            *p += 5;
            st.memo.get(u32::from_le_bytes([w[1], w[2], w[3], w[4]]) as usize)
        }
        b'K' => {
            *p += 2;
            Value::Int(w[1] as i64)
        }
        b'M' => {
            *p += 3;
            Value::Int(u16::from_le_bytes([w[1], w[2]]) as i64)
        }
        b'J' => {
            *p += 5;
            Value::Int(i32::from_le_bytes([w[1], w[2], w[3], w[4]]) as i64)
        }
        0x8a => {
            let k = w[1] as usize;
            if k > 8 {
                return FlatStep::Stop;
            }
            // Sign-extend k little-endian bytes (addresses and times are 6–7 bytes).
            let mut x = [0u8; 8];
            x[..k].copy_from_slice(&w[2..2 + k]);
            let v = i64::from_le_bytes(x);
            let shift = 64 - 8 * k as u32;
            *p += 2 + k;
            Value::Int(if k == 0 { 0 } else { (v << (shift % 64)) >> (shift % 64) })
        }
        0x8c => {
            let k = w[1] as usize;
            if end - *p < k + 2 {
                return FlatStep::Stop;
            }
            let id = match std::str::from_utf8(&buf[*p + 2..*p + 2 + k]) {
                Ok(s) => st.table.intern_str(s),
                Err(_) => return FlatStep::Stop,
            };
            *p += 2 + k;
            Value::Str(id)
        }
        0x88 => {
            *p += 1;
            Value::Bool(true)
        }
        0x89 => {
            *p += 1;
            Value::Bool(false)
        }
        b'N' => {
            *p += 1;
            Value::None
        }
        b'G' => {
            *p += 9;
            Value::Float(f64::from_be_bytes([w[1], w[2], w[3], w[4], w[5], w[6], w[7], w[8]]))
        }
        0x94 if n > 0 && matches!(items[n - 1], Value::Str(_)) => {
            let idx = st.memo.len();
            st.memo.set(idx, items[n - 1]);
            *p += 1;
            return FlatStep::Skip;
        }
        0x95 => {
            *p += 9;
            return FlatStep::Skip;
        }
        b'u' if n.is_multiple_of(2) => {
            *p += 1;
            return FlatStep::Done;
        }
        _ => return FlatStep::Stop,
    };
    FlatStep::Item(v)
}

/// Nesting deeper than this cannot come from PyTorch and would only serve to exhaust
/// the native stack of a recursive consumer.
pub(crate) const MAX_DEPTH: usize = 256;

/// Key/value slots the dict fast path decodes before handing over to the generic loop.
const FAST_ITEMS: usize = 64;

pub(crate) struct Vm<R: Read> {
    input: Input<R>,
    pub state: VmState,
    stack: Vec<Value>,
    marks: Vec<usize>,
    /// Scratch for the dict fast path, reused so no entry allocates.
    items: Box<[Value; FAST_ITEMS]>,
    /// The batch decoder was just offered the entry at the input's position and took
    /// nothing: that entry goes the generic way (see [`Vm::resume_batch`]).
    declined: bool,
    /// The offset at which progress is next reported ([`Vm::checkpoint`]).
    next_report: u64,
}

/// Input bytes between two checks of the values' budget.
const CHECK_EVERY: u64 = 1 << 20;

impl<R: Read> Vm<R> {
    /// The input's whole length when it is known before reading (a mapped file): `None`
    /// for a stream.
    pub fn input_len(&self) -> Option<u64> {
        match &self.input.buf {
            Buf::Mapped(m) => Some(m.bytes().len() as u64),
            Buf::Read(_) => None,
        }
    }

    pub fn new(r: R) -> Self {
        Vm {
            input: Input { r, buf: Buf::Read(vec![0; CHUNK]), pos: 0, end: 0, base: 0 },
            state: VmState::new(),
            stack: Vec::with_capacity(1024),
            marks: Vec::with_capacity(64),
            items: Box::new([Value::None; FAST_ITEMS]),
            declined: false,
            next_report: 0,
        }
    }

    fn pop(&mut self) -> Result<Value, ReadError> {
        self.stack.pop().ok_or_else(|| self.state.corrupt("stack underflow"))
    }
    fn top(&self) -> Result<Value, ReadError> {
        self.stack.last().copied().ok_or_else(|| self.state.corrupt("stack underflow"))
    }
    fn pop_mark(&mut self) -> Result<usize, ReadError> {
        let m = self.marks.pop().ok_or_else(|| self.state.corrupt("MARK expected"))?;
        // Opcodes such as TUPLE1 or SETITEM can pop below an open MARK; the mark then
        // points past the stack's end (CPython's "fence" check refuses the same).
        if m > self.stack.len() {
            return Err(self.state.corrupt("stack underflow below a MARK"));
        }
        Ok(m)
    }
    fn push_str(&mut self, n: usize) -> Result<(), ReadError> {
        self.check_len(n)?;
        let bytes = self.input.take(n)?;
        // Python writes lone surrogates with 'surrogatepass'; keep such strings readable.
        let id = match std::str::from_utf8(bytes) {
            Ok(s) => self.state.table.intern_str(s),
            Err(_) => {
                let s = String::from_utf8_lossy(bytes).into_owned();
                self.state.table.intern_str(&s)
            }
        };
        self.stack.push(Value::Str(id));
        Ok(())
    }
    fn push_long(&mut self, n: usize) -> Result<(), ReadError> {
        let b = self.input.take(n)?;
        let v = if n <= 8 {
            // Sign-extend n little-endian bytes: addresses and times are 6–7 byte LONG1s.
            let mut buf = [if n > 0 && b[n - 1] & 0x80 != 0 { 0xff } else { 0 }; 8];
            buf[..n].copy_from_slice(b);
            Value::Int(i64::from_le_bytes(buf))
        } else if let Some(i) = crate::pyobj::bigint_to_i64(b) {
            Value::Int(i)
        } else {
            self.state.held += n as u64;
            self.state.bigs.push(b.to_vec());
            Value::Big(self.state.bigs.len() as u32 - 1)
        };
        self.stack.push(v);
        Ok(())
    }
    fn memo_put(&mut self, idx: usize) -> Result<(), ReadError> {
        let v = self.top()?;
        // A pickler numbers its memo by one per object from 0, so an index is below the
        // offset it is written at; one far past it would only make the memo allocate.
        if idx as u64 > self.state.offset + budget::MEMO_SLACK {
            return Err(ReadError::Limit(format!(
                "memo index {idx} at byte {}: past any index a pickler writes by then (limit: the offset + {})",
                self.state.offset,
                budget::MEMO_SLACK
            )));
        }
        self.state.memo_put(idx, v);
        Ok(())
    }
}

impl Vm<std::io::Empty> {
    /// A VM over a whole mapped file: no copies, no refills.
    pub fn mapped(m: super::mapped::Mapping) -> Self {
        let mut vm = Vm::new(std::io::empty());
        vm.input.end = m.bytes().len();
        vm.input.buf = Buf::Mapped(m);
        vm
    }

    /// Whether the mapped file lost pages while this VM read it ([`super::mapped`]): what
    /// it read since is zeros, whatever came of it.
    pub fn input_lost(&self) -> bool {
        matches!(&self.input.buf, Buf::Mapped(m) if m.lost())
    }
}

impl VmState {
    fn memo_put(&mut self, idx: usize, v: Value) {
        self.memo.set(idx, v);
        // Remember where containers live in the memo, so absorbing them can retire the entry.
        match v {
            Value::Dict(h) => {
                let s = &mut self.dicts[h.idx as usize];
                if s.memo == NO_MEMO {
                    s.memo = idx as u32;
                }
            }
            Value::List(h) => {
                let s = &mut self.lists[h.idx as usize];
                if s.memo == NO_MEMO {
                    s.memo = idx as u32;
                }
            }
            _ => {}
        }
    }
}

impl<R: Read> Vm<R> {
    fn memo_get(&mut self, idx: usize) -> Result<(), ReadError> {
        match self.state.memo.get(idx) {
            Value::Consumed => Err(self.state.corrupt("memo reference to a trace entry that was already read")),
            Value::Undef => Err(self.state.corrupt(&format!("memo key {idx} is not defined"))),
            v => {
                self.stack.push(v);
                Ok(())
            }
        }
    }
    fn append_items<A: Absorber>(&mut self, list: Value, from: usize, abs: &mut A) -> Result<(), ReadError> {
        let h = match list {
            Value::List(h) => h,
            _ => return Err(self.state.corrupt("APPEND to something that is not a list")),
        };
        self.state.list(h)?;
        for i in from..self.stack.len() {
            let item = self.state.resolve(self.stack[i]);
            let plain = match item {
                Value::Dict(d) => self.state.dicts.get(d.idx as usize).is_some_and(|s| s.gen == d.gen && s.plain),
                _ => false,
            };
            if plain {
                self.state.list_mut(h)?.items.push(item);
                self.state.held += size_of::<Value>() as u64;
            } else if let Absorb::Keep(v) = abs.on_append(&mut self.state, h.idx, item)? {
                self.state.list_mut(h)?.items.push(v);
                self.state.held += size_of::<Value>() as u64;
            }
        }
        self.stack.truncate(from);
        Ok(())
    }
    fn set_items(&mut self, dict: Value, from: usize) -> Result<(), ReadError> {
        let h = match dict {
            Value::Dict(h) => h,
            Value::Block(i) => self.state.block_dict(i),
            _ => return Err(self.state.corrupt("SETITEM on something that is not a dict")),
        };
        if !(self.stack.len() - from).is_multiple_of(2) {
            return Err(self.state.corrupt("odd number of items for a dict"));
        }
        self.state.dict(h)?;
        self.state.held += ((self.stack.len() - from) * size_of::<Value>()) as u64;
        let slot = &mut self.state.dicts[h.idx as usize];
        slot.plain = false;
        slot.items.extend(self.stack[from..].chunks_exact(2).map(|kv| (kv[0], kv[1])));
        self.stack.truncate(from);
        Ok(())
    }

    /// Runs to STOP and returns the top-level value. `progress` gets the byte offset now
    /// and then.
    ///
    /// Each opcode family has its own helper below. This loop is `summary`'s hot path:
    /// the families a snapshot is made of are `#[inline(always)]`, so that no opcode pays
    /// for a call, and only the rare ones (control, unused data, errors) are out of line.
    /// Measured against the single `match` it replaced: no slowdown (see the commit).
    pub fn run<A: Absorber>(&mut self, abs: &mut A, progress: &mut dyn FnMut(u64)) -> Result<Value, ReadError> {
        let mut next_check = 0u64;
        loop {
            let off = self.input.offset();
            self.state.offset = off;
            if off >= next_check {
                next_check = self.checkpoint(off, progress)?;
            }
            let op = self.input.byte()?;
            match op {
                // --- containers and their items (hot) ---
                0x94 | b'h' | b'j' | b'q' | b'r' => self.memo_op(op)?,
                b'(' => self.mark(abs)?,
                b'}' => self.empty_dict(abs)?,
                b'u' | b's' | b'e' | b'a' => self.add_items_op(op, abs)?,
                b']' | b')' | 0x85..=0x87 | b't' | b'l' | b'd' => self.build_op(op, abs)?,
                0x8c | b'X' | 0x8d | b'K' | b'M' | b'J' | 0x8a | 0x8b | b'G' | 0x88 | 0x89 | b'N' => {
                    self.scalar_op(op, off)?
                }
                // --- framing and control ---
                b'.' => return self.pop(),
                0x80 | 0x95 | b'0' | b'1' | b'2' => self.control_op(op, off)?,
                // --- plain data that snapshots never use but that is harmless ---
                b'C' | b'B' | 0x8e | 0x96 | 0x8f | 0x90 | 0x91 => self.unused_data_op(op, abs)?,
                _ => return Err(invalid_opcode(op, off)),
            }
        }
    }

    /// Every 1 MiB of input: weighs the values built against the input read
    /// ([`Vm::check_budget`]); every 8 MiB, also hands `off` to the caller's progress
    /// callback and lets a mapped input drop the pages before the read position (never
    /// read again: this keeps the resident size flat on a multi-GB file). Returns the
    /// offset of the next checkpoint.
    #[inline(never)]
    fn checkpoint(&mut self, off: u64, progress: &mut dyn FnMut(u64)) -> Result<u64, ReadError> {
        self.check_budget(off)?;
        if off >= self.next_report {
            self.next_report = off + (8 << 20);
            progress(off);
            if let Buf::Mapped(m) = &mut self.input.buf {
                m.release_before(self.input.pos);
            }
        }
        Ok(off + CHECK_EVERY)
    }

    /// Refuses a pickle whose live values (containers and their items, the stack and its
    /// marks, byte strings) outgrow [`budget::allowance`] of the `off` bytes read: 60 M
    /// one-byte EMPTY_LISTs cost 4 GB otherwise. Trace entries absorbed into the model are
    /// not values here; a real snapshot's segments and blocks stay far below.
    fn check_budget(&self, off: u64) -> Result<(), ReadError> {
        let st = &self.state;
        let live = st.held
            + (st.dicts.len() * size_of::<DictSlot>()
                + st.lists.len() * size_of::<ListSlot>()
                + st.tuples.len() * size_of::<Vec<Value>>()
                + st.blocks.len() * size_of::<FlatBlock>()
                + self.stack.len() * size_of::<Value>()
                + self.marks.len() * size_of::<usize>()
                + st.memo.held_bytes()) as u64;
        if live > budget::allowance(off) {
            return Err(budget::over("the pickle's values grow", off));
        }
        Ok(())
    }

    /// Refuses a declared string or byte-string length past [`budget::MAX_STRING`] before
    /// its bytes are buffered (in a stream, they would be, up to the declared length).
    fn check_len(&self, n: usize) -> Result<(), ReadError> {
        if n > budget::MAX_STRING {
            return Err(budget::long_string(n as u64, self.state.offset));
        }
        Ok(())
    }

    /// MEMOIZE, BINGET, LONG_BINGET, BINPUT, LONG_BINPUT. The memo is how a pickle shares
    /// one object between places (a frame's filename, a traceback PyTorch reuses), so
    /// snapshots are full of these.
    #[inline(always)]
    fn memo_op(&mut self, op: u8) -> Result<(), ReadError> {
        match op {
            0x94 => {
                // MEMOIZE
                let n = self.state.memo.len();
                self.memo_put(n)
            }
            b'h' => {
                let i = self.input.byte()? as usize;
                self.memo_get(i)
            }
            b'j' => {
                let i = le_u32(self.input.take(4)?) as usize;
                self.memo_get(i)
            }
            b'q' => {
                let i = self.input.byte()? as usize;
                self.memo_put(i)
            }
            b'r' => {
                let i = le_u32(self.input.take(4)?) as usize;
                self.memo_put(i)
            }
            _ => unreachable!("not a memo opcode"),
        }
    }

    /// MARK. Right after the trace list it opens an APPENDS batch of trace entries, which
    /// [`Vm::entry_batch`] decodes whole; anywhere else it is a plain MARK.
    #[inline(always)]
    fn mark<A: Absorber>(&mut self, abs: &mut A) -> Result<(), ReadError> {
        let batch = match self.stack.last() {
            Some(&Value::List(h)) if abs.takes_batches(h.idx) => Some(h),
            _ => None,
        };
        match batch {
            Some(h) => self.entry_batch(abs, h)?,
            None => self.marks.push(self.stack.len()),
        }
        Ok(())
    }

    /// EMPTY_DICT: the next trace entry of a batch the batch decoder had to leave
    /// ([`Vm::resume_batch`]), else a dict for [`Vm::dict_fast_path`].
    #[inline(always)]
    fn empty_dict<A: Absorber>(&mut self, abs: &mut A) -> Result<(), ReadError> {
        if !self.resume_batch(abs)? {
            self.declined = false;
            self.dict_fast_path(abs)?
        }
        Ok(())
    }

    /// SETITEMS, SETITEM, APPENDS, APPEND: items into the dict or list below them (after
    /// the MARK for the batch forms). Appends go through the absorber, which keeps the
    /// trace entries and frames out of the generic list.
    #[inline(always)]
    fn add_items_op<A: Absorber>(&mut self, op: u8, abs: &mut A) -> Result<(), ReadError> {
        match op {
            b'u' => {
                let m = self.pop_mark()?;
                if m == 0 {
                    return Err(self.state.corrupt("SETITEMS without a dict"));
                }
                let d = self.stack[m - 1];
                self.set_items(d, m)
            }
            b's' => {
                let n = self.stack.len();
                if n < 3 {
                    return Err(self.state.corrupt("stack underflow"));
                }
                let d = self.stack[n - 3];
                self.set_items(d, n - 2)
            }
            b'e' => {
                let m = self.pop_mark()?;
                if m == 0 {
                    return Err(self.state.corrupt("APPENDS without a list"));
                }
                let l = self.stack[m - 1];
                self.append_items(l, m, abs)
            }
            b'a' => {
                let n = self.stack.len();
                if n < 2 {
                    return Err(self.state.corrupt("stack underflow"));
                }
                let l = self.stack[n - 2];
                self.append_items(l, n - 1, abs)
            }
            _ => unreachable!("not an opcode that adds items"),
        }
    }

    /// EMPTY_LIST, EMPTY_TUPLE, TUPLE1..3, TUPLE, LIST, DICT: a new container, empty or
    /// from the items on the stack (after the MARK for TUPLE, LIST and DICT).
    #[inline(always)]
    fn build_op<A: Absorber>(&mut self, op: u8, abs: &mut A) -> Result<(), ReadError> {
        match op {
            b']' => {
                let (l, _) = self.state.new_list();
                self.stack.push(l)
            }
            b')' => {
                let t = self.state.new_tuple(Vec::new());
                self.stack.push(t)
            }
            0x85..=0x87 => {
                let k = (op - 0x84) as usize;
                if self.stack.len() < k {
                    return Err(self.state.corrupt("stack underflow"));
                }
                let items = self.stack.split_off(self.stack.len() - k);
                let t = self.state.new_tuple(items);
                self.stack.push(t)
            }
            b't' => {
                let m = self.pop_mark()?;
                let items = self.stack.split_off(m);
                let t = self.state.new_tuple(items);
                self.stack.push(t)
            }
            b'l' => {
                let m = self.pop_mark()?;
                let (l, _) = self.state.new_list();
                self.stack.insert(m, l);
                self.append_items(l, m + 1, abs)?;
            }
            b'd' => {
                let m = self.pop_mark()?;
                let d = self.state.new_dict();
                self.stack.insert(m, d);
                self.set_items(d, m + 1)?;
            }
            _ => unreachable!("not a container-building opcode"),
        }
        Ok(())
    }

    /// Strings (SHORT_BINUNICODE, BINUNICODE, BINUNICODE8), ints (BININT1, BININT2,
    /// BININT, LONG1, LONG4), BINFLOAT, NEWTRUE, NEWFALSE and NONE. `off` is the opcode's
    /// offset, for the error on a LONG4 too large to be anything PyTorch writes.
    #[inline(always)]
    fn scalar_op(&mut self, op: u8, off: u64) -> Result<(), ReadError> {
        match op {
            0x8c => {
                let n = self.input.byte()? as usize;
                self.push_str(n)?
            }
            b'X' => {
                let n = le_u32(self.input.take(4)?) as usize;
                self.push_str(n)?
            }
            0x8d => {
                let b = self.input.take(8)?;
                let n = u64::from_le_bytes(b.try_into().unwrap());
                let n = usize::try_from(n).map_err(|_| self.state.corrupt("string length too large"))?;
                self.push_str(n)?
            }
            b'K' => {
                let v = self.input.byte()? as i64;
                self.stack.push(Value::Int(v))
            }
            b'M' => {
                let b = self.input.take(2)?;
                let v = u16::from_le_bytes([b[0], b[1]]) as i64;
                self.stack.push(Value::Int(v))
            }
            b'J' => {
                let v = le_u32(self.input.take(4)?) as i32 as i64;
                self.stack.push(Value::Int(v))
            }
            0x8a => {
                let n = self.input.byte()? as usize;
                self.push_long(n)?
            }
            0x8b => {
                let n = le_u32(self.input.take(4)?) as usize;
                if n > (1 << 20) {
                    return Err(ReadError::Unsupported { what: format!("a {n}-byte integer"), offset: off });
                }
                self.push_long(n)?
            }
            b'G' => {
                let b = self.input.take(8)?;
                self.stack.push(Value::Float(f64::from_be_bytes(b.try_into().unwrap())))
            }
            0x88 => self.stack.push(Value::Bool(true)),
            0x89 => self.stack.push(Value::Bool(false)),
            b'N' => self.stack.push(Value::None),
            _ => unreachable!("not a scalar opcode"),
        }
        Ok(())
    }

    /// PROTO, FRAME, POP, POP_MARK, DUP: once per file or per 64 KiB frame, or never in a
    /// snapshot, so out of the hot loop. `off` is the opcode's offset, for the error on a
    /// protocol this VM does not read.
    #[inline(never)]
    fn control_op(&mut self, op: u8, off: u64) -> Result<(), ReadError> {
        match op {
            0x80 => {
                let p = self.input.byte()?;
                if !(2..=5).contains(&p) {
                    return Err(ReadError::Unsupported { what: format!("pickle protocol {p}"), offset: off });
                }
            }
            0x95 => {
                // FRAME: a length hint; the data follows inline.
                self.input.take(8)?;
            }
            b'0' => {
                if self.stack.len() == self.marks.last().copied().unwrap_or(0) && !self.marks.is_empty() {
                    // POP right after a MARK pops the mark, as CPython does.
                    self.marks.pop();
                } else {
                    self.pop()?;
                }
            }
            b'1' => {
                let m = self.pop_mark()?;
                self.stack.truncate(m);
            }
            b'2' => {
                let v = self.top()?;
                self.stack.push(v)
            }
            _ => unreachable!("not a control opcode"),
        }
        Ok(())
    }

    /// SHORT_BINBYTES, BINBYTES, BINBYTES8, BYTEARRAY8, EMPTY_SET, ADDITEMS, FROZENSET:
    /// data that snapshots never hold but that is harmless, read so that a pickle with a
    /// stray one still loads. Sets are modelled as lists.
    #[inline(never)]
    fn unused_data_op<A: Absorber>(&mut self, op: u8, abs: &mut A) -> Result<(), ReadError> {
        match op {
            b'C' => {
                let n = self.input.byte()? as usize;
                self.push_bytes(n)
            }
            b'B' => {
                let n = le_u32(self.input.take(4)?) as usize;
                self.push_bytes(n)
            }
            0x8e | 0x96 => {
                let b = self.input.take(8)?;
                let n = usize::try_from(u64::from_le_bytes(b.try_into().unwrap()))
                    .map_err(|_| self.state.corrupt("bytes length too large"))?;
                self.push_bytes(n)
            }
            0x8f => {
                // EMPTY_SET
                let (l, _) = self.state.new_list();
                self.stack.push(l);
                Ok(())
            }
            0x90 => {
                let m = self.pop_mark()?;
                if m == 0 {
                    return Err(self.state.corrupt("ADDITEMS without a set"));
                }
                let l = self.stack[m - 1];
                self.append_items(l, m, abs)
            }
            0x91 => {
                let m = self.pop_mark()?;
                let (l, _) = self.state.new_list();
                self.stack.insert(m, l);
                self.append_items(l, m + 1, abs)
            }
            _ => unreachable!("not a plain-data opcode"),
        }
    }

    /// Right after EMPTY_DICT. Trace entries and frames are flat dicts of memo references,
    /// small ints and short strings, written as `MEMOIZE MARK (key value)* SETITEMS`. Decode
    /// such a dict straight from the buffer and hand it to the absorber whole; on anything
    /// else (a nested container, the buffer's end, a bad reference) put the partial state
    /// on the stack exactly as the generic loop would have, and let it continue.
    fn dict_fast_path<A: Absorber>(&mut self, abs: &mut A) -> Result<(), ReadError> {
        let inp = &self.input;
        let (buf, p, end) = (&inp.buf[..inp.end], inp.pos, inp.end);
        if end - p < 64 || buf[p] != 0x94 || buf[p + 1] != b'(' {
            let d = self.state.new_dict();
            self.stack.push(d);
            return Ok(());
        }
        if let Some((used, v)) = abs.try_flat_entry(&mut self.state, &buf[p..end]) {
            self.input.pos = p + used;
            self.stack.push(v);
            return Ok(());
        }
        let dict_memo = self.state.memo.reserve();
        let (p, n, complete) = scan_flat_items(buf, p + 2, end, &mut self.state, &mut self.items);
        self.input.pos = p;
        self.finish_flat_dict(abs, dict_memo, n, complete)
    }

    /// The end of [`Vm::dict_fast_path`], once `n` items sit in `self.items`. A complete
    /// dict (its SETITEMS read) is offered to the absorber, which may take it whole (a
    /// trace entry, a frame) and say what its memo slot `dict_memo` holds. Otherwise the
    /// dict is built and memoized: with its items when complete, else with the items on
    /// the stack after a MARK, the state the generic loop would have reached at this point
    /// of the input, so that it can carry on.
    fn finish_flat_dict<A: Absorber>(
        &mut self,
        abs: &mut A,
        dict_memo: usize,
        n: usize,
        complete: bool,
    ) -> Result<(), ReadError> {
        if complete {
            if let Some((pushed, memo)) = abs.on_dict(&mut self.state, &self.items[..n])? {
                if memo == Value::Consumed {
                    self.state.memo.consume(dict_memo);
                } else {
                    self.state.memo.set(dict_memo, memo);
                }
                self.stack.push(pushed);
                return Ok(());
            }
        }
        let d = self.state.new_dict();
        self.state.memo_put(dict_memo, d);
        self.stack.push(d);
        if complete {
            let Value::Dict(h) = d else { unreachable!() };
            self.state.held += (n * size_of::<Value>()) as u64;
            let slot = &mut self.state.dicts[h.idx as usize];
            slot.items.extend(self.items[..n].chunks_exact(2).map(|kv| (kv[0], kv[1])));
            // `on_dict` above saw these items and kept the dict.
            slot.plain = true;
        } else {
            self.marks.push(self.stack.len());
            self.stack.extend_from_slice(&self.items[..n]);
        }
        Ok(())
    }

    /// Right after the MARK of an APPENDS batch into the trace list `list`. A real trace
    /// is thousands of such batches of ~1,000 entries each; decoding a whole batch in one
    /// call, straight into the event array, skips the per-entry stack traffic, the VM
    /// dispatch and the append bookkeeping, which were a third of the reading time. The
    /// entries only count as appended once the batch's APPENDS is seen: if the batch stops
    /// early (an entry the decoder leaves to the generic path, the end of the buffer),
    /// the MARK is pushed and the decoded entries go back on the stack as pending items,
    /// exactly the state the generic loop would have reached.
    fn entry_batch<A: Absorber>(&mut self, abs: &mut A, list: Handle) -> Result<(), ReadError> {
        if self.input.end - self.input.pos < BATCH_WINDOW {
            self.input.fill_upto(BATCH_WINDOW)?;
        }
        let inp = &self.input;
        let (used, n, complete) = abs.absorb_batch(&mut self.state, list.idx, &inp.buf[inp.pos..inp.end]);
        self.input.pos += used;
        if !complete {
            self.marks.push(self.stack.len());
            abs.unabsorb(list.idx, n, &mut self.stack);
        }
        Ok(())
    }

    /// At an EMPTY_DICT (already read) that starts the next item of an APPENDS batch into
    /// the trace list, after the batch decoder stopped at an entry it leaves to the generic
    /// path (most often one whose `frames` brings a frame dict not seen before): the items
    /// on the stack since the MARK are appended now, as APPENDS would append them (nothing
    /// reads the list in between), and the batch decoder takes over again from this entry
    /// instead of leaving the rest of the batch (up to ~1,000 entries) to the generic path.
    /// Returns whether it did; if the decoder takes nothing here, the state is as before
    /// (the MARK pushed back, the EMPTY_DICT unread) and `declined` makes this entry go the
    /// generic way.
    fn resume_batch<A: Absorber>(&mut self, abs: &mut A) -> Result<bool, ReadError> {
        if self.declined {
            return Ok(false);
        }
        let h = match self.marks.last() {
            Some(&m) if m >= 1 && m <= self.stack.len() => match self.stack[m - 1] {
                Value::List(h) if abs.takes_batches(h.idx) => h,
                _ => return Ok(false),
            },
            _ => return Ok(false),
        };
        let m = self.pop_mark()?;
        self.append_items(Value::List(h), m, abs)?;
        self.input.pos -= 1;
        // In the file, not the buffer: a refill moves the buffer's bytes.
        let at = self.input.offset();
        self.entry_batch(abs, h)?;
        // Nothing taken (and the MARK back on the stack): the generic way for this entry.
        self.declined = self.input.offset() == at && self.marks.last() == Some(&self.stack.len());
        Ok(true)
    }

    fn push_bytes(&mut self, n: usize) -> Result<(), ReadError> {
        self.check_len(n)?;
        self.state.held += n as u64;
        let b = self.input.take(n)?.to_vec();
        self.state.bytes.push(b);
        self.stack.push(Value::Bytes(self.state.bytes.len() as u32 - 1));
        Ok(())
    }
}
