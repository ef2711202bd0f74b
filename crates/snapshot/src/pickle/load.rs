//! From pickle values to the [`Snapshot`] model: every form PyTorch has written
//! (1.13 segment list, 2.0 `history` blocks, 2.x dict), tolerant of unknown and missing
//! optional keys, strict about shape.

use std::collections::HashMap;
use std::io::Read;

use super::shape::{self, EntryShape, Slot};
use super::successors::Successors;
use super::vm::{Absorb, Absorber, FlatBlock, Handle, Value, Vm, VmState, MAX_DEPTH};
use super::vm::{BK_ADDRESS, BK_FRAMES, BK_REQUESTED, BK_SIZE, BK_STATE};
use crate::bounds::TraceMax;
use crate::budget;
use crate::error::ReadError;
use crate::model::*;
use crate::pyobj::PyObj;

/// Well-known keys, interned once so that matching a key is an integer compare.
struct Keys {
    action: StrId,
    addr: StrId,
    device_free: StrId,
    size: StrId,
    stream: StrId,
    time_us: StrId,
    frames: StrId,
    compile_context: StrId,
    user_metadata: StrId,
    pool_id: StrId,
    filename: StrId,
    line: StrId,
    name: StrId,
}

/// Absorbs trace entries and frames as they are appended, so the pickle's object graph
/// for them never exists all at once.
struct SnapshotAbsorber {
    k: Keys,
    /// Events per list (by list arena index), in append order.
    events: HashMap<u32, Vec<TraceEvent>>,
    cur_list: u32,
    cur_events: Vec<TraceEvent>,
    unknown_trace_keys: HashMap<StrId, u64>,
    unknown_actions: HashMap<StrId, u64>,
    missing: HashMap<&'static str, u64>,
    /// The entries' distinct contexts ([`EntryContext`]), their ids, and the last one met
    /// (most entries have the context of the entry before them).
    contexts: Vec<EntryContext>,
    context_ids: HashMap<EntryContext, ContextId>,
    last_context: (EntryContext, ContextId),
    /// The `stream`, `compile_context` and `user_metadata` of the last entry the fast
    /// decoders read, and its context's id: PyTorch writes `stream` and `compile_context`
    /// ("N/A" mostly) in every entry, so this compare is made millions of times.
    /// (The two strings as one number: [`text_key`].)
    last_text_context: (u64, u64, ContextId),
    frame_buf: Vec<FrameId>,
    /// Fresh `frames` lists already decoded, by the bytes of their items (the memo
    /// references to their frame dicts), and the stack each made: PyTorch writes a new list
    /// for most entries, the same few hundred stacks over and over, so most lists are
    /// known by their bytes without resolving a reference or hashing a frame.
    stack_spans: HashMap<Box<[u8]>, StackId, std::hash::BuildHasherDefault<SpanHasher>>,
    /// The lists met lately, in sets by their first bytes: a list seen lately is known
    /// from one compare of its bytes, without walking its items or hashing them all.
    recent_spans: Box<[SpanSet]>,
    /// The lists that followed the last ones: tried before `recent_spans`.
    successors: Successors,
    /// `Memo::string_overwrites` when `stack_spans` was filled: a frame's memo slot written
    /// over (or consumed) since would make a known span mean other frames.
    spans_gen: u64,
    key_codes: Vec<u8>,
    /// Keys of the last decoded trace entry, in order, as the bytes of their memo references.
    tmpl: Vec<KeyTemplate>,
    /// Action references seen lately, direct-mapped: `(raw reference, action index)`.
    action_refs: [(u64, u8); 8],
    /// The last `compile_context` reference and its string.
    cc_ref: (u64, StrId),
    /// `Memo::string_overwrites` when `tmpl`, `action_refs` and `shapes` were built.
    tmpl_gen: u64,
    /// Layouts of recent trace entries (see [`shape`]); they stay where they are (each is
    /// a few hundred bytes): `shape_hint` is the one that matched last and is tried first,
    /// `shape_evict` the next slot a new layout takes.
    shapes: Vec<EntryShape>,
    shape_hint: usize,
    shape_evict: usize,

    /// Reusable `[k, v, ..]` buffer for dicts absorbed on the generic path.
    flat: Vec<Value>,
    /// Pre-faults the pages of the growing event array on the second core.
    prefault: Option<super::prefault::Prefaulter>,
    prefault_tried: bool,
    /// `cur_events`' capacity when the pre-fault helper was last told.
    pf_cap: usize,
    /// The length of the input when known before reading (a mapped file), for the
    /// capacity of a long trace list ([`Self::reserve_for_rest`]).
    input_len: Option<u64>,
    /// The list that was given that capacity (one reservation per list).
    reserved_list: u32,
    /// A bound on the `addr` and `size` of every trace entry absorbed (their ORs), kept as
    /// entries are made (while they are in cache), so that the bounds check after reading
    /// need not walk every entry again ([`TraceMax`]).
    max: TraceMax,
    /// Trace entries completed on the fast path, waiting for their APPENDS.
    pending: Vec<TraceEvent>,
    pending_live: usize,
}

/// Codes above K_POOL that are not actions: keys this reader does not model.
const K_OTHER: u8 = 31;
const K_ACTION: u8 = 1;
const K_ADDR: u8 = 2;
const K_SIZE: u8 = 3;
const K_STREAM: u8 = 4;
const K_TIME: u8 = 5;
const K_FRAMES: u8 = 6;
const K_CC: u8 = 7;
const K_UM: u8 = 8;
const K_POOL: u8 = 9;
/// Block keys and states (a trace entry's unknown keys, like [`K_OTHER`]): a block dict
/// is read by the same one-load-per-key table ([`SnapshotAbsorber::flat_block`]).
const K_B_ADDRESS: u8 = 10;
const K_B_REQUESTED: u8 = 11;
const K_B_STATE: u8 = 12;
const K_S_ALLOCATED: u8 = 13;
const K_S_PENDING: u8 = 14;
const K_S_INACTIVE: u8 = 15;
const K_FIRST_ACTION: u8 = 32;

#[derive(Clone, Copy, PartialEq, Eq)]
enum EntryKind {
    Entry,
    /// A trace entry whose action this reader does not model: counted, dropped.
    UnknownAction,
    NotAnEntry,
}

fn int_of(st: &VmState, v: Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(i),
        Value::Bool(b) => Some(b as i64),
        Value::Big(i) => crate::pyobj::bigint_to_i64(&st.bigs[i as usize]),
        _ => None,
    }
}

/// Unsigned view of an integer: addresses and stream handles are unsigned in C++;
/// a negative value (a stream handle written as signed) keeps its bit pattern.
fn u64_of(st: &VmState, v: Value) -> Option<u64> {
    match v {
        Value::Int(i) => Some(i as u64),
        Value::Bool(b) => Some(b as u64),
        Value::Big(i) => crate::pyobj::bigint_to_u64(&st.bigs[i as usize]),
        _ => None,
    }
}

fn pair_of(st: &VmState, v: Value) -> Option<(u64, u64)> {
    match v {
        Value::Pair(a, b) => Some((a as u64, b as u64)),
        Value::Tuple(t) => match st.tuples[t as usize][..] {
            [a, b] => Some((u64_of(st, a)?, u64_of(st, b)?)),
            _ => None,
        },
        Value::List(h) => match st.list(h).ok()?.items[..] {
            [a, b] => Some((u64_of(st, a)?, u64_of(st, b)?)),
            _ => None,
        },
        _ => None,
    }
}

/// What a trace entry's values have given so far.
struct EntryValues {
    /// addr, size, stream, time_us, by `code - K_ADDR`.
    ints: [i64; 4],
    /// A bit per key code seen.
    seen: u32,
    /// Strings memoized inside the entry, applied only on success; `None` stands for the
    /// entry's fresh `frames` list.
    new_memos: [Option<StrId>; 4],
    n_memos: usize,
    /// The stack of the entry's `frames` when it is a fresh list (memoized as that stack
    /// on success).
    fresh_stack: Option<StackId>,
    /// `compile_context` and `user_metadata`, made the entry's context on success.
    cc: Option<StrId>,
    um: Option<StrId>,
}

impl EntryValues {
    /// Nothing seen yet; `ints` where no key gives them.
    #[inline(always)]
    fn new(ints: [i64; 4]) -> Self {
        EntryValues { ints, seen: 0, new_memos: [None; 4], n_memos: 0, fresh_stack: None, cc: None, um: None }
    }
}

/// A `compile_context` and a `user_metadata` as one number (0: neither), compared in one
/// instruction per entry.
#[inline(always)]
fn text_key(cc: Option<StrId>, um: Option<StrId>) -> u64 {
    cc.map_or(0, StrId::raw) as u64 | (um.map_or(0, StrId::raw) as u64) << 32
}

/// A trace-entry key as the bytes that refer to it (`BINGET i` or `LONG_BINGET i`).
#[derive(Clone, Copy)]
struct KeyTemplate {
    /// The opcode and index bytes, little-endian, under `mask`.
    bytes: u64,
    mask: u64,
    len: usize,
    code: u8,
}

/// Entry layouts kept (a real trace has a few: sizes written as `K`, `M` or `J`, a
/// stack by `BINGET` or `LONG_BINGET`).
const SHAPES: usize = 4;

/// No memo reference (a raw reference is the index, with bit 32 set for LONG_BINGET).
const NO_REF: u64 = u64::MAX;

/// A BINGET/LONG_BINGET at `w[0]`: its raw reference and length, or `(NO_REF, 0)`.
#[inline(always)]
fn memo_ref(w: &[u8]) -> (u64, usize) {
    match w[0] {
        b'h' => (w[1] as u64, 2),
        b'j' => (1 << 32 | u32::from_le_bytes([w[1], w[2], w[3], w[4]]) as u64, 5),
        _ => (NO_REF, 0),
    }
}

/// Hashes the item bytes of a `frames` list ([`SnapshotAbsorber::stack_spans`]): ~100–200
/// bytes per entry, hashed on every entry, where one multiply chain over the words (the
/// snapshot's [`crate::model::FxHasher`]) was a tenth of the reading time. Four chains,
/// one per word of each 32 bytes, do not wait on each other.
#[derive(Default)]
struct SpanHasher([u64; 4]);

impl std::hash::Hasher for SpanHasher {
    fn write(&mut self, bytes: &[u8]) {
        const K: u64 = 0x51_7c_c1_b7_27_22_0a_95;
        let mix = |h: u64, w: u64| (h.rotate_left(5) ^ w).wrapping_mul(K);
        let mut c = bytes.chunks_exact(32);
        for b in &mut c {
            let w = |i: usize| u64::from_le_bytes(b[8 * i..8 * i + 8].try_into().unwrap());
            self.0 = [mix(self.0[0], w(0)), mix(self.0[1], w(1)), mix(self.0[2], w(2)), mix(self.0[3], w(3))];
        }
        let rest = c.remainder();
        let mut tail = [0u8; 32];
        tail[..rest.len()].copy_from_slice(rest);
        for i in 0..4 {
            let w = u64::from_le_bytes(tail[8 * i..8 * i + 8].try_into().unwrap());
            self.0[i] = mix(self.0[i], w ^ (rest.len() as u64) << 56);
        }
    }
    fn write_usize(&mut self, n: usize) {
        self.0[0] ^= n as u64;
    }
    fn finish(&self) -> u64 {
        let [a, b, c, d] = self.0;
        (a ^ b.rotate_left(17) ^ c.rotate_left(31) ^ d.rotate_left(47))
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            .rotate_left(26)
    }
}

/// Sets of [`SnapshotAbsorber::recent_spans`] (a power of two).
const SPAN_SETS: usize = 1024;

/// Recently met `frames` lists whose first bytes hash alike ([`span_set`]): their item
/// bytes and stacks, replaced in turn.
#[derive(Clone, Default)]
struct SpanSet {
    ways: [Option<(Box<[u8]>, StackId)>; SPAN_WAYS],
}

/// `a == b` for slices of one length, by words, the last word first: the lists of a
/// [`SpanSet`] share their first bytes, and their last ones tell them apart soonest
/// (and a call to `memcmp` per candidate was a sixth of the reading time).
#[inline]
pub(super) fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    let n = a.len();
    if n != b.len() {
        return false;
    }
    if n < 8 {
        return a == b;
    }
    let word = |x: &[u8], i: usize| u64::from_le_bytes(x[i..i + 8].try_into().unwrap());
    if word(a, n - 8) != word(b, n - 8) {
        return false;
    }
    // 32 bytes a round, their differences OR-ed: one branch a round (a list of stack items
    // is 50–400 bytes; a loop of 8-byte steps held ~40 % of the samples of `fresh_frames`).
    let (xs, ys) = (a.chunks_exact(32), b.chunks_exact(32));
    let rest = xs.remainder().len();
    for (x, y) in xs.zip(ys) {
        let w = |s: &[u8], i: usize| u64::from_le_bytes(s[i..i + 8].try_into().unwrap());
        let d = (w(x, 0) ^ w(y, 0)) | (w(x, 8) ^ w(y, 8)) | (w(x, 16) ^ w(y, 16)) | (w(x, 24) ^ w(y, 24));
        if d != 0 {
            return false;
        }
    }
    // Under 32 bytes left: whole words, then the last word (compared above) covers the rest.
    let mut i = n - rest;
    while i + 8 <= n {
        if word(a, i) != word(b, i) {
            return false;
        }
        i += 8;
    }
    true
}

impl SpanSet {
    /// The stack of the list whose items start at `buf[body]`, and where they end, when
    /// they are the bytes of one of this set's lists and the list ends there too, as
    /// [`stack_items`] would find: it decides where a list ends from its bytes up to that
    /// point and those right after it ([`list_goes_on`]), so equal bytes and the same stop
    /// make the same items.
    /// The one found moves first, swapping places with the first (so the ways are kept
    /// roughly latest-used first, without moving all of them).
    #[inline]
    fn find(&mut self, buf: &[u8], body: usize) -> Option<(StackId, usize)> {
        let k = self.ways.iter().position(|w| {
            w.as_ref().is_some_and(|(bytes, _)| {
                let end = body + bytes.len();
                buf.get(body..end).is_some_and(|b| same_bytes(b, bytes)) && !list_goes_on(buf, end)
            })
        })?;
        if k > 0 {
            self.ways.swap(0, k);
        }
        let (bytes, id) = self.ways[0].as_ref()?;
        Some((*id, body + bytes.len()))
    }
    /// Takes the last place (about the least lately used), then the first.
    fn put(&mut self, span: &[u8], id: StackId) {
        self.ways[SPAN_WAYS - 1] = Some((span.into(), id));
        self.ways.swap(0, SPAN_WAYS - 1);
    }
}

/// Bytes that pick a list's [`SpanSet`]: its first 32 (the innermost 6–15 frames; lists
/// that share fewer tell the stacks of one op called from different places apart).
const SPAN_KEY: usize = 32;
/// Lists per [`SpanSet`].
const SPAN_WAYS: usize = 8;

/// [`SpanSet`] of a list by its first [`SPAN_KEY`] bytes (with what follows a shorter
/// list: such a list is known again when it is followed alike).
#[inline]
fn span_set(w: &[u8]) -> usize {
    let x = |i: usize| u64::from_le_bytes(w[8 * i..8 * i + 8].try_into().unwrap());
    let (a, b) = (x(0).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ x(1), x(2).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ x(3));
    ((a ^ b.rotate_left(29)).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95) >> 54) as usize & (SPAN_SETS - 1)
}

/// Whether the list whose items [`stack_items`] has read up to `buf[q]` goes on there:
/// another `MARK` batch, one more item and its `APPEND`, or a FRAME before either.
#[inline]
fn list_goes_on(buf: &[u8], q: usize) -> bool {
    let appended = |q: usize| match buf.get(q) {
        Some(b'h') => buf.get(q + 2) == Some(&b'a'),
        Some(b'j') => buf.get(q + 5) == Some(&b'a'),
        _ => false,
    };
    match buf.get(q) {
        Some(b'(') => true,
        Some(0x95) => buf.get(q + 9) == Some(&b'(') || appended(q + 9),
        _ => appended(q),
    }
}

/// Fresh `frames` lists remembered by their bytes at most ([`SnapshotAbsorber::stack_spans`]).
const MAX_SPANS: usize = 1 << 16;
/// Longest item bytes remembered (a stack of ~800 frames by `LONG_BINGET`).
const MAX_SPAN: usize = 4096;

/// The items of a list written after its `EMPTY_LIST MEMOIZE` at `buf[q]`, each a memo
/// reference (`MARK` references `APPENDS`, or a reference then `APPEND`, as CPython's
/// pickler batches them), given in order to `item` (the raw reference of [`memo_ref`]).
/// Returns where the items end and whether a FRAME opcode lies among them (CPython's
/// framer may end a frame after any item); `None` when anything else is met or `item`
/// refuses.
#[inline]
fn stack_items(buf: &[u8], mut q: usize, mut item: impl FnMut(u64) -> Option<()>) -> Option<(usize, bool)> {
    let mut framed = false;
    // Where the list goes on is [`list_goes_on`]'s decision (the recent lists' check
    // relies on the two agreeing).
    while list_goes_on(buf, q) {
        match *buf.get(q)? {
            b'(' => {
                q += 1;
                loop {
                    // Runs of one kind of reference (LONG_BINGET once the memo passes 255)
                    // step by a known stride: the next read does not wait on this one.
                    while let Some(w) = buf.get(q..q + 5).filter(|w| w[0] == b'j') {
                        item(1 << 32 | u32::from_le_bytes([w[1], w[2], w[3], w[4]]) as u64)?;
                        q += 5;
                    }
                    while let Some(w) = buf.get(q..q + 2).filter(|w| w[0] == b'h') {
                        item(w[1] as u64)?;
                        q += 2;
                    }
                    match *buf.get(q)? {
                        b'e' => break,
                        0x95 => {
                            q += 9;
                            framed = true;
                        }
                        // After a run of the other kind (never past the buffer's end:
                        // the runs above stop short of it, and so does this).
                        b'j' if q + 5 <= buf.len() => continue,
                        b'h' if q + 2 <= buf.len() => continue,
                        _ => return None,
                    }
                }
                q += 1;
            }
            // A FRAME between items; one after the last is left to the entry's decoder.
            0x95 => {
                q += 9;
                framed = true;
            }
            // One item and its APPEND; a reference not followed by APPEND is the entry's
            // next key.
            _ => {
                let (raw, len) = memo_ref(buf.get(q..q + 5)?);
                item(raw)?;
                q += len + 1;
            }
        }
    }
    Some((q, framed))
}

/// An int opcode at `v[0]` that fits an i64 (every address, size, stream and time PyTorch
/// writes): its value and length.
#[inline(always)]
fn small_int(v: &[u8; 16]) -> Option<(i64, usize)> {
    /// The low `n` bytes.
    const LOW: [u64; 9] = {
        let mut t = [u64::MAX; 9];
        let mut n = 0;
        while n < 8 {
            t[n] = (1u64 << (8 * n)) - 1;
            n += 1;
        }
        t
    };
    Some(match v[0] {
        // LONG1 of n <= 8 little-endian two's-complement bytes: load 8, keep n, and fill
        // the rest with the sign (addresses and times are 6-7 bytes, never negative).
        0x8a => {
            let n = v[1] as usize;
            if n > 8 {
                return None;
            }
            let x = u64::from_le_bytes([v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9]]) & LOW[n];
            let negative = n > 0 && v[1 + n] & 0x80 != 0;
            ((x | (!LOW[n] & 0u64.wrapping_sub(negative as u64))) as i64, 2 + n)
        }
        b'K' => (v[1] as i64, 2),
        b'M' => (u16::from_le_bytes([v[1], v[2]]) as i64, 3),
        b'J' => (i32::from_le_bytes([v[1], v[2], v[3], v[4]]) as i64, 5),
        _ => return None,
    })
}

/// A memo reference or a fresh short string at `buf[*p]`, as a string id; a fresh string
/// memoized right after is recorded in `memos`, to be applied if the entry succeeds.
#[inline(always)]
fn string_at(
    st: &mut VmState,
    buf: &[u8],
    p: &mut usize,
    memos: &mut [Option<StrId>; 4],
    n: &mut usize,
) -> Option<StrId> {
    let v = match *buf.get(*p)? {
        b'h' => {
            let i = *buf.get(*p + 1)? as usize;
            *p += 2;
            st.memo.get(i)
        }
        b'j' => {
            let i = u32::from_le_bytes(buf.get(*p + 1..*p + 5)?.try_into().unwrap()) as usize;
            *p += 5;
            st.memo.get(i)
        }
        0x8c => {
            let k = *buf.get(*p + 1)? as usize;
            let s = std::str::from_utf8(buf.get(*p + 2..*p + 2 + k)?).ok()?;
            if *n == memos.len() {
                return None;
            }
            let id = st.table.intern_str(s);
            *p += 2 + k;
            if buf.get(*p) == Some(&0x94) {
                memos[*n] = Some(id);
                *n += 1;
                *p += 1;
            }
            Value::Str(id)
        }
        _ => return None,
    };
    match v {
        Value::Str(id) => Some(id),
        _ => None,
    }
}

/// The string a memo reference (raw, as [`memo_ref`] gives it) names.
#[inline]
fn memo_str(st: &VmState, raw: u64) -> Option<StrId> {
    match st.memo.get((raw & u32::MAX as u64) as usize) {
        Value::Str(id) => Some(id),
        _ => None,
    }
}

impl SnapshotAbsorber {
    fn new(st: &mut VmState) -> Self {
        let t = &mut st.table;
        let k = Keys {
            action: t.intern_str("action"),
            addr: t.intern_str("addr"),
            device_free: t.intern_str("device_free"),
            size: t.intern_str("size"),
            stream: t.intern_str("stream"),
            time_us: t.intern_str("time_us"),
            frames: t.intern_str("frames"),
            compile_context: t.intern_str("compile_context"),
            user_metadata: t.intern_str("user_metadata"),
            pool_id: t.intern_str("pool_id"),
            filename: t.intern_str("filename"),
            line: t.intern_str("line"),
            name: t.intern_str("name"),
        };
        let any = k.action;
        SnapshotAbsorber {
            cc_ref: (NO_REF, any),
            k,
            events: HashMap::new(),
            cur_list: u32::MAX,
            cur_events: Vec::new(),
            unknown_trace_keys: HashMap::new(),
            unknown_actions: HashMap::new(),
            missing: HashMap::new(),
            contexts: Vec::new(),
            context_ids: HashMap::new(),
            last_context: (EntryContext::default(), ContextId::NONE),
            last_text_context: (0, 0, ContextId::NONE),
            frame_buf: Vec::new(),
            stack_spans: Default::default(),
            recent_spans: vec![SpanSet::default(); SPAN_SETS].into_boxed_slice(),
            successors: Successors::new(),
            spans_gen: 0,
            key_codes: Vec::new(),
            tmpl: Vec::new(),
            action_refs: [(NO_REF, 0); 8],
            tmpl_gen: 0,
            shapes: Vec::with_capacity(SHAPES),
            shape_hint: 0,
            shape_evict: 0,

            flat: Vec::new(),
            max: TraceMax::default(),
            pending: Vec::new(),
            pending_live: 0,
            prefault: None,
            prefault_tried: false,
            pf_cap: 0,
            input_len: None,
            reserved_list: u32::MAX,
        }
    }

    /// A dict is a frame when it has `filename` and `name` and nothing but frame keys
    /// (`line`, and the `fx_*` keys of `augment_with_fx_traces`). `flat` is `[k, v, k, v, ..]`.
    fn frame_from(&self, st: &mut VmState, flat: &[Value]) -> Option<FrameId> {
        let (mut filename, mut line, mut name) = (None, None, None);
        for kv in flat.chunks_exact(2) {
            let Value::Str(k) = kv[0] else { return None };
            if k == self.k.filename {
                filename = Some(kv[1]);
            } else if k == self.k.line {
                line = Some(kv[1]);
            } else if k == self.k.name {
                name = Some(kv[1]);
            } else if !st.str(k).starts_with("fx_") {
                return None;
            }
        }
        let (Some(Value::Str(filename)), Some(Value::Str(name))) = (filename, name) else {
            return None;
        };
        // C++ frames without a line number carry 2^64−1 (an unsigned C++ field, a 9-byte
        // LONG1): keep the bit pattern (-1 as i64) so the writer can restore it.
        let line = line.and_then(|v| u64_of(st, v)).map_or(0, |l| l as i64);
        Some(st.table.intern_frame(Frame { filename, line, name }))
    }

    /// A segment's block dict, decoded whole from its items `flat` (`[k, v, k, v, ..]`)
    /// when it is one of the plain kind [`FlatBlock`] describes; `None` leaves the dict to
    /// the builder. Side effects: none but naming the block keys met.
    fn flat_block(&mut self, st: &mut VmState, flat: &[Value]) -> Option<FlatBlock> {
        let mut b = FlatBlock {
            ints: [0; 3],
            state: BlockState::Inactive,
            state_str: None,
            frames: Value::None,
            seen: 0,
            order: 0,
            n: 0,
            dict: None,
        };
        for kv in flat.chunks_exact(2) {
            let Value::Str(k) = kv[0] else { return None };
            let code = match self.key_code(st, k) {
                K_B_ADDRESS => BK_ADDRESS,
                K_SIZE => BK_SIZE,
                K_B_REQUESTED => BK_REQUESTED,
                K_B_STATE => BK_STATE,
                K_FRAMES => BK_FRAMES,
                _ => return None,
            };
            // A key given twice: the dict keeps both items, the builder reads the last.
            if b.seen & 1 << code != 0 {
                return None;
            }
            match (code, kv[1]) {
                (BK_STATE, Value::Str(s)) => {
                    b.state = match self.key_code(st, s) {
                        K_S_ALLOCATED => BlockState::ActiveAllocated,
                        K_S_PENDING => BlockState::ActivePendingFree,
                        K_S_INACTIVE => BlockState::Inactive,
                        _ => return None,
                    };
                    b.state_str = Some(s);
                }
                (BK_FRAMES, v @ (Value::List(_) | Value::Stack(_) | Value::None)) => b.frames = v,
                (BK_ADDRESS | BK_SIZE | BK_REQUESTED, Value::Int(x)) => b.ints[code as usize] = x,
                _ => return None,
            }
            st.block_keys[code as usize] = Some(k);
            b.seen |= 1 << code;
            b.order |= (code as u16) << (3 * b.n);
            b.n += 1;
        }
        const NEED: u8 = 1 << BK_SIZE | 1 << BK_STATE;
        (b.seen & NEED == NEED).then_some(b)
    }

    fn flatten(&mut self, st: &VmState, h: Handle) -> Result<Vec<Value>, ReadError> {
        let mut flat = std::mem::take(&mut self.flat);
        flat.clear();
        for &(k, v) in &st.dict(h)?.items {
            flat.push(k);
            flat.push(v);
        }
        Ok(flat)
    }

    fn as_frame(&mut self, st: &mut VmState, h: Handle) -> Result<Option<FrameId>, ReadError> {
        let flat = self.flatten(st, h)?;
        let f = self.frame_from(st, &flat);
        self.flat = flat;
        if let Some(id) = f {
            st.retire_dict(h, Value::Frame(id), false);
        }
        Ok(f)
    }

    /// Interns a `frames` value (a list of frame dicts, usually shared via the memo).
    fn stack_of(&mut self, st: &mut VmState, v: Value) -> Result<Option<StackId>, ReadError> {
        // A handle taken before the list was interned (shared frame list) → its stack.
        let h = match st.resolve(v) {
            Value::Stack(s) => return Ok(Some(s)),
            Value::List(h) => h,
            Value::None => return Ok(None),
            _ => return Err(st.corrupt("'frames' is not a list")),
        };
        self.frame_buf.clear();
        let n = st.list(h)?.items.len();
        for i in 0..n {
            let item = st.resolve(st.list(h)?.items[i]);
            match item {
                Value::Frame(f) => self.frame_buf.push(f),
                Value::Dict(dh) => match self.as_frame(st, dh)? {
                    Some(f) => self.frame_buf.push(f),
                    None => return Err(st.corrupt("a 'frames' entry is not a frame dict")),
                },
                // C++ frames in ≤2.0 `cpp_frames` are plain strings; a frames list never is.
                _ => return Err(st.corrupt("a 'frames' entry is not a frame dict")),
            }
        }
        let id = st.table.intern_stack(&self.frame_buf);
        st.retire_list(h, Value::Stack(id));
        Ok(Some(id))
    }

    /// What a string means as a trace-entry or frame key. A table indexed by string id,
    /// extended as new strings are interned: one array load per key instead of a chain
    /// of comparisons, on the hottest path of the reader.
    #[inline(always)]
    fn key_code(&mut self, st: &VmState, id: StrId) -> u8 {
        match self.key_codes.get(id.index()) {
            Some(&c) => c,
            None => self.key_code_slow(st, id),
        }
    }

    #[cold]
    fn key_code_slow(&mut self, st: &VmState, id: StrId) -> u8 {
        let i = id.index();
        {
            let k = &self.k;
            let known = [
                (k.action, K_ACTION),
                (k.addr, K_ADDR),
                (k.device_free, K_ADDR),
                (k.size, K_SIZE),
                (k.stream, K_STREAM),
                (k.time_us, K_TIME),
                (k.frames, K_FRAMES),
                (k.compile_context, K_CC),
                (k.user_metadata, K_UM),
                (k.pool_id, K_POOL),
            ];
            for j in self.key_codes.len()..st.table.num_strings() {
                let code = known.iter().find(|(s, _)| s.index() == j).map_or(K_OTHER, |&(_, c)| c);
                // Action names get their own codes, so parsing an action is one lookup too.
                let s = st.table.str_at(j);
                let code = match Action::ALL.iter().position(|a| a.as_str() == s) {
                    Some(a) if code == K_OTHER => K_FIRST_ACTION + a as u8,
                    _ => code,
                };
                // Block keys and states by their text, not interned here: a string the
                // file never wrote would be one more in the table.
                let code = match (code, BlockState::parse(s)) {
                    (K_OTHER, Some(BlockState::ActiveAllocated)) => K_S_ALLOCATED,
                    (K_OTHER, Some(BlockState::ActivePendingFree)) => K_S_PENDING,
                    (K_OTHER, Some(BlockState::Inactive)) => K_S_INACTIVE,
                    (K_OTHER, None) => match s {
                        "address" => K_B_ADDRESS,
                        "requested_size" => K_B_REQUESTED,
                        "state" => K_B_STATE,
                        _ => K_OTHER,
                    },
                    _ => code,
                };
                self.key_codes.push(code);
            }
        }
        self.key_codes[i]
    }

    /// Decodes a trace entry from `flat` into `ev`; says whether `flat` was one.
    fn event_from(&mut self, st: &mut VmState, flat: &[Value], ev: &mut TraceEvent) -> Result<EntryKind, ReadError> {
        // One pass sorts values by key code; nothing with side effects (interning a
        // stack) happens until 'action' proves this is a trace entry, since block dicts
        // share keys like 'size' and 'frames'.
        let mut vals = [Value::Undef; K_POOL as usize + 1];
        let mut unknown = false;
        for kv in flat.chunks_exact(2) {
            let Value::Str(k) = kv[0] else { continue };
            let code = self.key_code(st, k);
            if code <= K_POOL {
                vals[code as usize] = kv[1];
            } else {
                unknown = true;
            }
        }
        let Value::Str(action_id) = vals[K_ACTION as usize] else { return Ok(EntryKind::NotAnEntry) };
        let code = self.key_code(st, action_id);
        if code < K_FIRST_ACTION {
            *self.unknown_actions.entry(action_id).or_default() += 1;
            return Ok(EntryKind::UnknownAction);
        }
        *ev = TraceEvent::new(Action::ALL[(code - K_FIRST_ACTION) as usize], 0, 0);
        match vals[K_ADDR as usize] {
            Value::Undef => *self.missing.entry("trace.addr").or_default() += 1,
            v => ev.addr = u64_of(st, v).ok_or_else(|| st.corrupt("trace 'addr' is not an integer"))?,
        }
        match vals[K_SIZE as usize] {
            Value::Undef => *self.missing.entry("trace.size").or_default() += 1,
            v => ev.size = u64_of(st, v).ok_or_else(|| st.corrupt("trace 'size' is not an integer"))?,
        }
        let stream = u64_of(st, vals[K_STREAM as usize]).unwrap_or(0);
        ev.time_us = int_of(st, vals[K_TIME as usize]).unwrap_or(NO_TIME);
        if let v @ (Value::Stack(_) | Value::List(_) | Value::None) = vals[K_FRAMES as usize] {
            ev.stack = self.stack_of(st, v)?;
        }
        let str_of = |v: Value| if let Value::Str(s) = v { Some(s) } else { None };
        let context = EntryContext {
            stream,
            pool_id: pair_of(st, vals[K_POOL as usize]),
            compile_context: str_of(vals[K_CC as usize]),
            user_metadata: str_of(vals[K_UM as usize]),
        };
        ev.context = self.context_or_stream(st, context)?;
        if unknown {
            for kv in flat.chunks_exact(2) {
                if let Value::Str(k) = kv[0] {
                    if self.key_code(st, k) > K_POOL {
                        *self.unknown_trace_keys.entry(k).or_default() += 1;
                    }
                }
            }
        }
        Ok(EntryKind::Entry)
    }

    fn as_event(&mut self, st: &mut VmState, h: Handle, ev: &mut TraceEvent) -> Result<EntryKind, ReadError> {
        let flat = self.flatten(st, h)?;
        let kind = self.event_from(st, &flat, ev);
        self.flat = flat;
        let kind = kind?;
        if kind != EntryKind::NotAnEntry {
            st.retire_dict(h, Value::Consumed, true);
        }
        Ok(kind)
    }

    /// The value of a trace-entry key with code `code`, at `buf[*p]` (after a FRAME, if any).
    #[inline(always)]
    fn entry_value(
        &mut self,
        st: &mut VmState,
        buf: &[u8],
        p: &mut usize,
        code: u8,
        ev: &mut TraceEvent,
        vals: &mut EntryValues,
    ) -> Option<()> {
        // CPython's framer may also end a frame between a key and its value.
        if *buf.get(*p)? == 0x95 {
            *p += 9;
        }
        let v: &[u8; 16] = buf.get(*p..*p + 16)?.try_into().unwrap();
        match code {
            K_ADDR..=K_TIME => {
                let (x, len) = small_int(v)?;
                *p += len;
                vals.ints[(code - K_ADDR) as usize] = x;
            }
            K_ACTION => {
                let (raw, len) = memo_ref(v);
                let slot = &mut self.action_refs[(raw & 7) as usize];
                let a = if len > 0 && slot.0 == raw {
                    *p += len;
                    slot.1
                } else {
                    let s = string_at(st, buf, p, &mut vals.new_memos, &mut vals.n_memos)?;
                    let c = self.key_code(st, s).checked_sub(K_FIRST_ACTION)?;
                    if len > 0 {
                        self.action_refs[(raw & 7) as usize] = (raw, c);
                    }
                    c
                };
                ev.action = Action::ALL[a as usize];
            }
            K_FRAMES => {
                // A second `frames` key goes to the generic path.
                if vals.seen & 1 << K_FRAMES != 0 {
                    return None;
                }
                let (raw, len) = memo_ref(v);
                if len == 0 {
                    return self.fresh_frames(st, buf, p, vals, ev.action);
                }
                let Value::Stack(id) = st.memo.get((raw & u32::MAX as u64) as usize) else { return None };
                ev.stack = Some(id);
                *p += len;
            }
            K_CC => {
                // Usually the same memoized string entry after entry.
                let (raw, len) = memo_ref(v);
                if len > 0 && self.cc_ref.0 == raw {
                    *p += len;
                    vals.cc = Some(self.cc_ref.1);
                } else {
                    let s = string_at(st, buf, p, &mut vals.new_memos, &mut vals.n_memos)?;
                    if len > 0 {
                        self.cc_ref = (raw, s);
                    }
                    vals.cc = Some(s);
                }
            }
            K_UM => vals.um = Some(string_at(st, buf, p, &mut vals.new_memos, &mut vals.n_memos)?),
            _ => return None,
        }
        vals.seen |= 1 << code;
        Some(())
    }

    /// The trace-entry decoder for the common case, straight from the bytes: every key a
    /// memo reference to a known key, every value a small int, a memo reference or a short
    /// string. Nearly every entry of a real file has this shape, and decoding it without the
    /// generic machinery is what makes multi-GB files fast. Anything else (a new frames
    /// list, a pool id, an unknown key or action, a missing addr, the buffer's end) returns
    /// `None` before any state changes, and the generic path takes over. `buf[0]` is the
    /// dict's MEMOIZE; on success `ev` holds the entry and the bytes used are returned.
    #[inline(always)]
    fn decode_entry(&mut self, st: &mut VmState, buf: &[u8], ev: &mut TraceEvent) -> Option<usize> {
        // The caller saw these two bytes; a mapped file rewritten under the reader may
        // show others now (tests/it changed_while_read): the generic path then decides.
        if buf.len() < 2 || buf[0] != 0x94 || buf[1] != b'(' {
            return None;
        }
        let mut p = 2;
        *ev = TraceEvent::new(Action::Alloc, 0, 0);
        let mut vals = EntryValues::new([0, 0, 0, ev.time_us]);
        // Entries repeat the same keys in the same order, as the same memo references:
        // compare the raw reference with the previous entry's before resolving it. Actions
        // are a handful of memoized strings: the same shortcut, keyed by the reference.
        if self.tmpl_gen != st.memo.string_overwrites {
            self.tmpl.clear();
            self.action_refs = [(NO_REF, 0); 8];
            self.cc_ref.0 = NO_REF;
            self.shapes.clear();
            self.tmpl_gen = st.memo.string_overwrites;
        }
        let mut j = 0usize;
        // The common case first: the keys of the previous entry, in the same order, as the
        // same memo-reference bytes. One window and one compare per key.
        while j < self.tmpl.len() {
            let t = self.tmpl[j];
            let head = u64::from_le_bytes(buf.get(p..p + 8)?.try_into().unwrap());
            if head & t.mask != t.bytes {
                break;
            }
            p += t.len;
            self.entry_value(st, buf, &mut p, t.code, ev, &mut vals)?;
            j += 1;
        }
        // Anything else, key by key: the end of the entry, a FRAME, a key resolved anew.
        loop {
            let w: &[u8; 8] = buf.get(p..p + 8)?.try_into().unwrap();
            let code = match w[0] {
                b'u' => {
                    p += 1;
                    break;
                }
                // CPython's framer may end a protocol-4 frame after any key or value:
                // skip the FRAME opcode (its 8-byte length is only a hint).
                0x95 => {
                    p += 9;
                    continue;
                }
                _ => {
                    let head = u64::from_le_bytes(*w);
                    let (_, len) = memo_ref(w);
                    let key = string_at(st, buf, &mut p, &mut vals.new_memos, &mut vals.n_memos)?;
                    let c = self.key_code(st, key);
                    if len > 0 {
                        // Remember it for the next entry's key at this position.
                        let mask = if len == 2 { 0xffff } else { 0xff_ffff_ffff };
                        self.tmpl.truncate(j);
                        self.tmpl.push(KeyTemplate { bytes: head & mask, mask, len, code: c });
                    }
                    c
                }
            };
            j += 1;
            self.entry_value(st, buf, &mut p, code, ev, &mut vals)?;
        }
        const NEED: u32 = 1 << K_ACTION | 1 << K_ADDR | 1 << K_SIZE;
        if vals.seen & NEED != NEED {
            return None;
        }
        let [addr, size, stream, time_us] = vals.ints;
        (ev.addr, ev.size, ev.time_us) = (addr as u64, size as u64, time_us);
        ev.context = self.text_context(stream as u64, vals.cc, vals.um)?;
        // Commit, in stream order: the dict's MEMOIZE came first, then its strings' and its
        // fresh frames list's (memoized as the stack the generic path would make of it).
        let stack = vals.fresh_stack;
        if stack.is_some() {
            ev.stack = stack;
        }
        let dict_memo = st.memo.reserve();
        for m in &vals.new_memos[..vals.n_memos] {
            let i = st.memo.len();
            match (m, stack) {
                (Some(id), _) => st.memo.set(i, Value::Str(*id)),
                (None, Some(s)) => st.memo.set(i, Value::Stack(s)),
                // Only a fresh frames list leaves `None`, and it sets `fresh_stack`: not met.
                (None, None) => st.memo.set(i, Value::Undef),
            }
        }
        st.memo.consume(dict_memo);
        Some(p)
    }

    /// A `frames` value written as a fresh list (`EMPTY_LIST MEMOIZE`, then its items by
    /// `MARK … APPENDS` or `APPEND`), every item a memo reference to a frame already read:
    /// how PyTorch's own pickles write most entries' stacks (a new list per entry, its
    /// frame dicts shared), so on their files a hot path. Its stack is found by
    /// [`Self::fresh_stack`]; FRAME opcodes between items are skipped. Anything else (a
    /// frame dict written inside, a second `frames` key) is left to the generic path.
    fn fresh_frames(
        &mut self,
        st: &mut VmState,
        buf: &[u8],
        p: &mut usize,
        vals: &mut EntryValues,
        action: Action,
    ) -> Option<()> {
        if vals.n_memos == vals.new_memos.len() || buf.get(*p..*p + 2)? != [0x5d, 0x94] {
            return None;
        }
        let (id, end) = self.fresh_stack(st, buf, *p + 2, action)?;
        vals.new_memos[vals.n_memos] = None;
        vals.n_memos += 1;
        vals.fresh_stack = Some(id);
        vals.seen |= 1 << K_FRAMES;
        *p = end;
        Some(())
    }

    /// The stack of the fresh list whose items start at `buf[body]`, and where they end:
    /// one of the lists that followed the last ones lately ([`Successors`]), else
    /// [`Self::stack_by_bytes`].
    fn fresh_stack(&mut self, st: &mut VmState, buf: &[u8], body: usize, action: Action) -> Option<(StackId, usize)> {
        if self.spans_gen != st.memo.string_overwrites {
            self.stack_spans.clear();
            self.recent_spans.fill(SpanSet::default());
            self.successors.clear();
            self.spans_gen = st.memo.string_overwrites;
        }
        if let Some((id, len)) = self.successors.guess(action, buf, body, |q| !list_goes_on(buf, q)) {
            return Some((id, body + len));
        }
        let (id, end, framed) = self.stack_by_bytes(st, buf, body)?;
        let span = &buf[body..end];
        self.successors.learn(action, (!framed && span.len() <= MAX_SPAN).then_some(span), id);
        Some((id, end))
    }

    /// [`Self::fresh_stack`] without the guess, and whether a FRAME lies among the items:
    /// a list met lately by its bytes, else any list met by its bytes, else resolved frame
    /// by frame and interned (and remembered both ways).
    fn stack_by_bytes(&mut self, st: &mut VmState, buf: &[u8], body: usize) -> Option<(StackId, usize, bool)> {
        let set = buf.get(body..body + SPAN_KEY).map(span_set);
        if let Some((id, end)) = set.and_then(|k| self.recent_spans[k].find(buf, body)) {
            return Some((id, end, false));
        }
        let (end, framed) = stack_items(buf, body, |_| Some(()))?;
        let span = &buf[body..end];
        let known = if framed { None } else { self.stack_spans.get(span).copied() };
        let id = match known {
            Some(id) => id,
            None => {
                self.frame_buf.clear();
                let frames = &mut self.frame_buf;
                stack_items(buf, body, |raw| match st.memo.get((raw & u32::MAX as u64) as usize) {
                    Value::Frame(f) => {
                        frames.push(f);
                        Some(())
                    }
                    _ => None,
                })?;
                let id = st.table.intern_stack(&self.frame_buf);
                // A FRAME opcode among the items makes the bytes differ from the same
                // list elsewhere: such a span is decoded, not remembered. Bounded, for
                // files whose every list is another.
                if !framed && span.len() <= MAX_SPAN && self.stack_spans.len() < MAX_SPANS {
                    self.stack_spans.insert(span.into(), id);
                }
                id
            }
        };
        if let (Some(k), false, true) = (set, framed, span.len() <= MAX_SPAN) {
            // Not there already (it would have been found): take the oldest way.
            self.recent_spans[k].put(span, id);
        }
        Some((id, end, framed))
    }

    /// Decodes the entry at `buf[0]` (its MEMOIZE) by one of the recent entry layouts, as
    /// [`Self::decode_entry`] would, and appends it to the current trace; `None`, with
    /// nothing changed but reference caches, when no layout fits or a reference is not what
    /// it must be.
    #[inline(always)]
    fn decode_shaped(&mut self, st: &mut VmState, buf: &[u8]) -> Option<usize> {
        if self.shapes.is_empty() || self.tmpl_gen != st.memo.string_overwrites {
            return None;
        }
        let w: &[u8; shape::WINDOW] = buf.get(..shape::WINDOW)?.try_into().unwrap();
        let hint = self.shape_hint.min(self.shapes.len() - 1);
        let k = if self.shapes[hint].matches(w) {
            hint
        } else {
            let k = self.shapes.iter().position(|s| s.matches(w))?;
            self.shape_hint = k;
            k
        };
        // Straight-line, slot by slot: the shape from `shapes`, the caches beside it.
        // (A shape is learned only from an entry with an action, an addr and a size.)
        let sh = &self.shapes[k];
        let f = &sh.fields;
        let raw = f[Slot::Action as usize].memo_ref(w);
        let slot = &mut self.action_refs[(raw & 7) as usize];
        if slot.0 != raw {
            // An action string the key-by-key decoder has coded already (a new one goes
            // back to it).
            let id = memo_str(st, raw)?;
            let c = self.key_codes.get(id.index())?.checked_sub(K_FIRST_ACTION)?;
            *slot = (raw, c);
        }
        let action = *Action::ALL.get(slot.1 as usize)?;
        let cc = f[Slot::CompileContext as usize];
        let compile_context = if cc.present {
            let raw = cc.memo_ref(w);
            if self.cc_ref.0 != raw {
                self.cc_ref = (raw, memo_str(st, raw)?);
            }
            Some(self.cc_ref.1)
        } else {
            sh.compile_context
        };
        let um = f[Slot::UserMetadata as usize];
        let user_metadata = if um.present { Some(memo_str(st, um.memo_ref(w))?) } else { sh.user_metadata };
        let fr = f[Slot::Frames as usize];
        let stack = if fr.present {
            let Value::Stack(id) = st.memo.get((fr.memo_ref(w) & u32::MAX as u64) as usize) else { return None };
            Some(id)
        } else {
            None
        };
        let (stream, time) = (f[Slot::Stream as usize], f[Slot::Time as usize]);
        let stream = if stream.present { stream.int(w) as u64 } else { 0 };
        let mut ev = TraceEvent {
            addr: f[Slot::Addr as usize].int(w) as u64,
            size: f[Slot::Size as usize].int(w) as u64,
            time_us: if time.present { time.int(w) } else { NO_TIME },
            stack,
            context: ContextId::NONE,
            action,
        };
        let (mut len, memos, n_memos, fresh_frames) = (sh.len, sh.memos, sh.n_memos, sh.fresh_frames);
        ev.context = self.text_context(stream, compile_context, user_metadata)?;
        // A shape that stops before a fresh `frames` list, the entry's last key: the list,
        // then the entry's SETITEMS.
        let mut fresh = None;
        if fresh_frames {
            let mut vals = EntryValues::new([0; 4]);
            self.fresh_frames(st, buf, &mut len, &mut vals, action)?;
            if *buf.get(len)? != b'u' {
                return None;
            }
            len += 1;
            fresh = vals.fresh_stack;
            ev.stack = fresh;
        }
        // Commit as `decode_entry` does: the dict's MEMOIZE, then its fresh strings', then
        // its fresh frames list's.
        let dict_memo = st.memo.reserve();
        for id in memos[..n_memos].iter().flatten() {
            let i = st.memo.len();
            st.memo.set(i, Value::Str(*id));
        }
        if let Some(s) = fresh {
            let i = st.memo.len();
            st.memo.set(i, Value::Stack(s));
        }
        st.memo.consume(dict_memo);
        // Built in place: an event assembled on the stack and copied over was read back
        // in 16-byte loads from its 8-byte stores, which stalls (store forwarding fails).
        self.cur_events.push(ev);
        Some(len)
    }

    /// Learns the layout of the entry `e[..used]` that [`Self::decode_entry`] just decoded
    /// into `ev` (so `tmpl` holds its keys). Entries it cannot describe (a FRAME inside, a
    /// key written fresh, a repeated key, a fresh action) are left to the key-by-key path.
    #[cold]
    fn learn_shape(&mut self, e: &[u8], used: usize, ev: &TraceEvent) {
        if let Some(sh) = self.shape_of(e, used, ev) {
            // A layout already kept (one a reference cache miss sent back here) stays once.
            let k = if let Some(k) = self.shapes.iter().position(|s| s.same_layout(&sh)) {
                k
            } else if self.shapes.len() < SHAPES {
                self.shapes.push(sh);
                self.shapes.len() - 1
            } else {
                // Round robin, sparing the layout that matched last.
                let mut k = self.shape_evict % SHAPES;
                if k == self.shape_hint {
                    k = (k + 1) % SHAPES;
                }
                self.shape_evict = k + 1;
                self.shapes[k] = sh;
                k
            };
            self.shape_hint = k;
        }
    }

    fn shape_of(&self, e: &[u8], used: usize, ev: &TraceEvent) -> Option<EntryShape> {
        let mut sh = EntryShape::new(e, used.min(shape::SHAPE_BYTES))?;
        let (mut p, mut j, mut seen) = (2usize, 0usize, 0u32);
        loop {
            if *e.get(p)? == b'u' {
                p += 1;
                break;
            }
            let t = *self.tmpl.get(j)?;
            let head = u64::from_le_bytes(e.get(p..p + 8)?.try_into().unwrap());
            if head & t.mask != t.bytes || seen & 1 << t.code != 0 {
                return None;
            }
            seen |= 1 << t.code;
            p += t.len;
            let op = *e.get(p)?;
            if t.code == K_FRAMES && op == 0x5d {
                // A fresh list (PyTorch's usual `frames`) as the entry's last key: the shape
                // stops before it, and the list is read as `fresh_frames` reads it.
                let (end, framed) = stack_items(e, p + 2, |_| Some(()))?;
                let last = e.get(p + 1) == Some(&0x94) && e.get(end) == Some(&b'u') && end + 1 == used;
                return (last && !framed && sh.stop_before_fresh_frames(p) && sh.complete()).then_some(sh);
            }
            let ok = match t.code {
                K_ADDR..=K_TIME => {
                    let slot = [Slot::Addr, Slot::Size, Slot::Stream, Slot::Time][(t.code - K_ADDR) as usize];
                    let (at, n, signed) = match op {
                        b'K' => (p + 1, 1, false),
                        b'M' => (p + 1, 2, false),
                        b'J' => (p + 1, 4, true),
                        0x8a => (p + 2, *e.get(p + 1)? as usize, true),
                        _ => return None,
                    };
                    p = at + n;
                    sh.payload(at, n, slot, signed)
                }
                K_ACTION | K_CC | K_UM | K_FRAMES => {
                    let slot = match t.code {
                        K_ACTION => Slot::Action,
                        K_CC => Slot::CompileContext,
                        K_UM => Slot::UserMetadata,
                        _ => Slot::Frames,
                    };
                    match op {
                        b'h' => {
                            p += 2;
                            sh.payload(p - 1, 1, slot, false)
                        }
                        b'j' => {
                            p += 5;
                            sh.payload(p - 4, 4, slot, false)
                        }
                        // A fresh string: the same bytes in every entry of the shape.
                        0x8c if matches!(slot, Slot::CompileContext | Slot::UserMetadata) => {
                            p += 2 + *e.get(p + 1)? as usize;
                            let c = ev.context.index().map(|i| self.contexts[i]).unwrap_or_default();
                            let id = if slot == Slot::CompileContext { c.compile_context } else { c.user_metadata };
                            if slot == Slot::CompileContext {
                                sh.compile_context = id;
                            } else {
                                sh.user_metadata = id;
                            }
                            if *e.get(p)? == 0x94 {
                                p += 1;
                                if sh.n_memos == sh.memos.len() {
                                    return None;
                                }
                                sh.memos[sh.n_memos] = id;
                                sh.n_memos += 1;
                            }
                            id.is_some()
                        }
                        _ => false,
                    }
                }
                _ => false,
            };
            if !ok {
                return None;
            }
            j += 1;
        }
        (p == used && used <= shape::SHAPE_BYTES && sh.complete()).then_some(sh)
    }

    /// Appends a trace entry to `list`; `offset` is the input's position (for
    /// [`Self::follow_events`]).
    fn push_event(&mut self, list: u32, ev: TraceEvent, offset: u64) {
        if self.cur_list != list {
            let prev = std::mem::take(&mut self.cur_events);
            if self.cur_list != u32::MAX {
                self.events.insert(self.cur_list, prev);
            }
            self.cur_events = self.events.remove(&list).unwrap_or_default();
            self.cur_list = list;
        }
        self.max.add(&ev);
        self.cur_events.push(ev);
        // Tell the pre-fault helper where the array is, now and then (every 4096 entries,
        // and whenever it moved): cheap enough for the hottest path of the reader.
        let len = self.cur_events.len();
        if len & 4095 == 0 || self.cur_events.capacity() != self.pf_cap {
            self.follow_events(offset);
        }
    }

    /// Bytes of input per trace entry below which no entry PyTorch writes goes: the
    /// smallest are ~40 (an empty dict and its MEMOIZE, the memoized keys `action`,
    /// `addr`, `size`, `stream`, `time_us`, `frames` as 2-byte references, and their
    /// values). A file of smaller entries only makes the list grow past the reservation.
    const MIN_ENTRY_BYTES: u64 = 32;

    /// Gives the list being filled, once it is long (the pre-fault helper's size), the
    /// capacity for every entry the rest of the input could hold, at
    /// [`Self::MIN_ENTRY_BYTES`] each. Why: grown by doubling, a list of hundreds of MB
    /// was moved (`mremap`: its page tables rebuilt and every core's TLB flushed) a dozen
    /// times, and ended with up to twice its size reserved; `summary` on a 462 MB file
    /// was 5-7 % faster with the capacity set once (8 interleaved runs: best 0.266 ->
    /// 0.254 s, median 0.286 -> 0.267 s). Capacity never written is address space, not
    /// memory (the helper faults in at most 32 MB past the end), and the list hands it
    /// back when done ([`Self::take_events`]). A system that will not reserve it
    /// (overcommit off, a small address space) keeps the doubling.
    fn reserve_for_rest(&mut self, offset: u64) {
        let Some(total) = self.input_len else { return };
        if self.reserved_list == self.cur_list {
            return;
        }
        self.reserved_list = self.cur_list;
        let rest = usize::try_from(total.saturating_sub(offset) / Self::MIN_ENTRY_BYTES).unwrap_or(usize::MAX);
        let spare = self.cur_events.capacity() - self.cur_events.len();
        if rest > spare && self.cur_events.try_reserve_exact(rest).is_ok() {
            // Hundreds of MB written once, front to back: in huge pages where the system
            // gives them ([`super::prefault::huge_pages`]).
            let size = std::mem::size_of::<TraceEvent>();
            let (base, len) = (self.cur_events.as_ptr() as usize, self.cur_events.len() * size);
            super::prefault::huge_pages(base + len, (self.cur_events.capacity() - self.cur_events.len()) * size);
        }
    }

    #[cold]
    fn follow_events(&mut self, offset: u64) {
        let size = std::mem::size_of::<TraceEvent>();
        if self.cur_events.capacity() * size >= super::prefault::MIN_BYTES {
            self.reserve_for_rest(offset);
        }
        let cap = self.cur_events.capacity();
        self.pf_cap = cap;
        if cap * size < super::prefault::MIN_BYTES {
            return;
        }
        if self.prefault.is_none() && !self.prefault_tried {
            self.prefault_tried = true;
            self.prefault = super::prefault::Prefaulter::start();
        }
        if let Some(p) = &self.prefault {
            p.follow(self.cur_events.as_ptr() as usize, self.cur_events.len() * size, cap * size);
        }
    }

    /// [`Self::context_id`] of a context without a pool (the fast decoders leave entries
    /// with a `pool_id` to the generic path), checked first against the last one.
    #[inline(always)]
    fn text_context(&mut self, stream: u64, cc: Option<StrId>, um: Option<StrId>) -> Option<ContextId> {
        let key = text_key(cc, um);
        if stream == self.last_text_context.0 && key == self.last_text_context.1 {
            return Some(self.last_text_context.2);
        }
        // Past the last context the fast path gives up: the generic path keeps the stream.
        let id = self.context_id(EntryContext { stream, pool_id: None, compile_context: cc, user_metadata: um })?;
        self.last_text_context = (stream, key, id);
        Some(id)
    }

    /// [`Self::context_id`], or past [`ContextId::MAX`] distinct contexts the entry's
    /// stream and pool alone (noted: its `compile_context` and `user_metadata` are
    /// dropped). The stream is never dropped: the replay needs it.
    fn context_or_stream(&mut self, st: &VmState, c: EntryContext) -> Result<ContextId, ReadError> {
        if let Some(id) = self.context_id(c) {
            return Ok(id);
        }
        let what = "trace.compile_context and user_metadata (past 16,777,215 distinct contexts)";
        *self.missing.entry(what).or_default() += 1;
        let bare = EntryContext { stream: c.stream, pool_id: c.pool_id, ..EntryContext::default() };
        self.context_id(bare).ok_or_else(|| st.corrupt("more than 16,777,215 distinct trace-entry streams and pools"))
    }

    /// The id of an entry's context, interned on first sight; `None` past
    /// [`ContextId::MAX`] distinct contexts.
    #[inline(never)]
    fn context_id(&mut self, c: EntryContext) -> Option<ContextId> {
        if c == EntryContext::default() {
            return Some(ContextId::NONE);
        }
        if self.last_context.0 == c {
            return Some(self.last_context.1);
        }
        let id = match self.context_ids.get(&c) {
            Some(&id) => id,
            None => {
                let id = ContextId::of_index(self.contexts.len())?;
                self.contexts.push(c);
                self.context_ids.insert(c, id);
                id
            }
        };
        self.last_context = (c, id);
        Some(id)
    }

    fn take_events(&mut self, list: u32) -> Vec<TraceEvent> {
        let mut events = if self.cur_list == list {
            self.cur_list = u32::MAX;
            std::mem::take(&mut self.cur_events)
        } else {
            self.events.remove(&list).unwrap_or_default()
        };
        // The spare capacity holds pages the prefault helper faulted in ahead of the parser
        // (up to its window): handed back, not kept as the snapshot's memory.
        events.shrink_to_fit();
        events
    }
}

impl Absorber for SnapshotAbsorber {
    fn on_append(&mut self, st: &mut VmState, list: u32, item: Value) -> Result<Absorb, ReadError> {
        let h = match item {
            Value::Event(i) => {
                // A trace entry is appended once; one appended again (a `DUP` or a memo
                // `GET` of it) finds its slot already handed over.
                let Some(&ev) = self.pending.get(i as usize) else {
                    return Err(st.corrupt("a trace entry is appended to the trace twice"));
                };
                self.push_event(list, ev, st.offset);
                self.pending_live -= 1;
                if self.pending_live == 0 {
                    self.pending.clear();
                }
                return Ok(Absorb::Taken);
            }
            Value::Dict(h) => h,
            // A trace entry with an action this reader does not model (already counted).
            Value::Consumed => return Ok(Absorb::Taken),
            _ => return Ok(Absorb::Keep(item)),
        };
        let mut ev = TraceEvent::new(Action::Alloc, 0, 0);
        match self.as_event(st, h, &mut ev)? {
            EntryKind::Entry => {
                self.push_event(list, ev, st.offset);
                return Ok(Absorb::Taken);
            }
            EntryKind::UnknownAction => return Ok(Absorb::Taken),
            EntryKind::NotAnEntry => {}
        }
        if let Some(f) = self.as_frame(st, h)? {
            return Ok(Absorb::Keep(Value::Frame(f)));
        }
        Ok(Absorb::Keep(item))
    }

    fn takes_batches(&self, list: u32) -> bool {
        list == self.cur_list
    }

    fn absorb_batch(&mut self, st: &mut VmState, list: u32, buf: &[u8]) -> (usize, usize, bool) {
        debug_assert_eq!(list, self.cur_list);
        let start = self.cur_events.len();
        let mut ev = TraceEvent::new(Action::Alloc, 0, 0);
        let mut p = 0;
        let complete = loop {
            // Near the end of the buffer the generic path takes over (the decoder checks
            // its own windows too; this keeps whole short entries off its slow exits).
            if buf.len() - p < 64 {
                break false;
            }
            // EMPTY_DICT, MEMOIZE, MARK: a trace entry starts (one compare for the three).
            let head = u32::from_le_bytes([buf[p], buf[p + 1], buf[p + 2], buf[p + 3]]);
            match buf[p] {
                b'}' if head & 0xff_ffff == u32::from_le_bytes([b'}', 0x94, b'(', 0]) => {
                    let e = &buf[p + 1..];
                    let used = match self.decode_shaped(st, e) {
                        Some(used) => used,
                        None => match self.decode_entry(st, e, &mut ev) {
                            Some(used) => {
                                self.learn_shape(e, used, &ev);
                                self.cur_events.push(ev);
                                used
                            }
                            None => break false,
                        },
                    };
                    p += 1 + used;
                }
                // FRAME: a protocol-4 length hint between two entries.
                0x95 => p += 9,
                b'e' => {
                    p += 1;
                    break true;
                }
                _ => break false,
            }
        };
        let len = self.cur_events.len();
        // This batch's entries are still in cache.
        for ev in &self.cur_events[start..] {
            self.max.add(ev);
        }
        if self.cur_events.capacity() != self.pf_cap || len >> 12 != start >> 12 {
            self.follow_events(st.offset + p as u64);
        }
        (p, len - start, complete)
    }

    fn unabsorb(&mut self, list: u32, n: usize, stack: &mut Vec<Value>) {
        debug_assert_eq!(list, self.cur_list);
        let from = self.cur_events.len() - n;
        for ev in self.cur_events.drain(from..) {
            self.pending.push(ev);
            self.pending_live += 1;
            stack.push(Value::Event(self.pending.len() as u32 - 1));
        }
    }

    #[inline]
    fn try_flat_entry(&mut self, st: &mut VmState, buf: &[u8]) -> Option<(usize, Value)> {
        let mut ev = TraceEvent::new(Action::Alloc, 0, 0);
        let used = self.decode_entry(st, buf, &mut ev)?;
        self.pending.push(ev);
        self.pending_live += 1;
        Some((used, Value::Event(self.pending.len() as u32 - 1)))
    }

    fn on_dict(&mut self, st: &mut VmState, flat: &[Value]) -> Result<Option<(Value, Value)>, ReadError> {
        // A block first: a block dict is never a trace entry or a frame (it has neither an
        // `action` nor a `filename`), and a trace entry's first key rules it out at once.
        if let Some(b) = self.flat_block(st, flat) {
            let v = Value::Block(st.blocks.len() as u32);
            st.blocks.push(b);
            return Ok(Some((v, v)));
        }
        self.pending.push(TraceEvent::new(Action::Alloc, 0, 0));
        let slot = self.pending.len() - 1;
        let mut ev = self.pending[slot];
        let kind = self.event_from(st, flat, &mut ev)?;
        match kind {
            EntryKind::Entry => {
                self.pending[slot] = ev;
                self.pending_live += 1;
                return Ok(Some((Value::Event(slot as u32), Value::Consumed)));
            }
            // An unmodelled action: counted; keep a placeholder that appends as nothing.
            EntryKind::UnknownAction => {
                self.pending.pop();
                return Ok(Some((Value::Consumed, Value::Consumed)));
            }
            EntryKind::NotAnEntry => {
                self.pending.pop();
            }
        }
        Ok(self.frame_from(st, flat).map(|f| (Value::Frame(f), Value::Frame(f))))
    }
}

/// Reads a pickle stream (already decompressed) into a snapshot.
pub(crate) fn read_pickle<R: Read>(r: R, progress: &mut dyn FnMut(u64)) -> Result<(Snapshot, TraceMax), ReadError> {
    run(&mut Vm::new(r), progress)
}

/// Reads a whole pickle file mapped into memory (see [`super::mapped`]).
pub(crate) fn read_pickle_mapped(
    m: super::mapped::Mapping,
    progress: &mut dyn FnMut(u64),
) -> Result<(Snapshot, TraceMax), ReadError> {
    let mut vm = Vm::mapped(m);
    let read = run(&mut vm, progress);
    // Checked before the mapping goes (with it, its place in the guard's table).
    if vm.input_lost() {
        return Err(ReadError::Changed);
    }
    read
}

/// Runs the pickle through the absorber, then builds the model: the snapshot, and the
/// bound on its trace entries.
fn run<R: Read>(vm: &mut Vm<R>, progress: &mut dyn FnMut(u64)) -> Result<(Snapshot, TraceMax), ReadError> {
    let mut abs = SnapshotAbsorber::new(&mut vm.state);
    abs.input_len = vm.input_len();
    let top = vm.run(&mut abs, progress)?;
    abs.prefault = None; // parsing is done: stop and join the helper
    let max = abs.max;
    let input = vm.state.offset + 1;
    Ok((finish(&mut vm.state, abs, top, input)?, max))
}

/// The model of the top-level value `top`, once every list has been absorbed (shared by
/// the pickle reader and [`Feeder`]). `input`: the bytes read (or their equivalent), for
/// the budget of the model's copies of memo-shared values ([`budget::Spend`]).
fn finish(st: &mut VmState, mut abs: SnapshotAbsorber, top: Value, input: u64) -> Result<Snapshot, ReadError> {
    let mut b =
        Builder { st, abs: &mut abs, snap: Snapshot::default(), spend: budget::Spend::new(input), bufs: Vec::new() };
    b.build(top)?;
    let mut snap = b.snap;
    // Tolerated oddities, by name.
    for (k, n) in abs.unknown_trace_keys {
        *snap.notes.unknown_keys.entry(format!("trace.{}", st.str(k))).or_default() += n;
    }
    for (k, n) in abs.unknown_actions {
        *snap.notes.unknown_actions.entry(st.str(k).to_string()).or_default() += n;
    }
    for (k, n) in abs.missing {
        *snap.notes.missing_optional.entry(k.to_string()).or_default() += n;
    }
    snap.contexts = abs.contexts;
    snap.frames = std::mem::take(&mut st.table);
    Ok(snap)
}

/// A value handed to a [`Feeder`] (opaque: an arena handle, like a pickle memo entry).
#[derive(Clone, Copy, Debug)]
pub struct FeedValue(Value);

/// Builds a [`Snapshot`] from values walked elsewhere — the Python package walks the live
/// dict of `torch.cuda.memory._snapshot()` — through the pickle reader's own arenas,
/// absorber and builder: trace entries and frames are absorbed as they are appended to
/// their lists, exactly as when a pickle's APPEND runs, so the model is the one
/// [`crate::read_from`] builds from a pickle of the same objects.
///
/// Build children before their container (a dict's items, then append the dict), and
/// hand the same [`FeedValue`] again for an object met twice (a shared frame list), as a
/// pickle's memo would.
pub struct Feeder {
    st: VmState,
    abs: SnapshotAbsorber,
    /// What the values handed over would take in a pickle, roughly (the input size the
    /// model's budget is relative to, [`budget::Spend`]).
    fed: u64,
}

impl Default for Feeder {
    fn default() -> Self {
        Self::new()
    }
}

impl Feeder {
    pub fn new() -> Self {
        let mut st = VmState::new();
        let abs = SnapshotAbsorber::new(&mut st);
        Feeder { st, abs, fed: 0 }
    }
    pub fn none(&self) -> FeedValue {
        FeedValue(Value::None)
    }
    pub fn bool(&self, b: bool) -> FeedValue {
        FeedValue(Value::Bool(b))
    }
    pub fn int(&self, i: i64) -> FeedValue {
        FeedValue(Value::Int(i))
    }
    /// An integer outside `i64`, as little-endian two's complement bytes.
    pub fn big_int(&mut self, le_bytes: Vec<u8>) -> FeedValue {
        self.fed += le_bytes.len() as u64 + 2;
        self.st.bigs.push(le_bytes);
        FeedValue(Value::Big(self.st.bigs.len() as u32 - 1))
    }
    pub fn float(&self, f: f64) -> FeedValue {
        FeedValue(Value::Float(f))
    }
    pub fn str(&mut self, s: &str) -> FeedValue {
        self.fed += s.len() as u64 + 2;
        FeedValue(Value::Str(self.st.table.intern_str(s)))
    }
    pub fn bytes(&mut self, b: Vec<u8>) -> FeedValue {
        self.fed += b.len() as u64 + 2;
        self.st.bytes.push(b);
        FeedValue(Value::Bytes(self.st.bytes.len() as u32 - 1))
    }
    pub fn tuple(&mut self, items: Vec<FeedValue>) -> FeedValue {
        self.fed += items.len() as u64 * 2 + 1;
        FeedValue(self.st.new_tuple(items.into_iter().map(|v| v.0).collect()))
    }
    /// An empty list; fill it with [`Feeder::append`].
    pub fn list(&mut self) -> FeedValue {
        FeedValue(self.st.new_list().0)
    }
    /// Appends `item` to `list` (a trace entry or frame dict is absorbed here).
    pub fn append(&mut self, list: FeedValue, item: FeedValue) -> Result<(), ReadError> {
        let Value::List(h) = list.0 else { return Err(self.st.corrupt("append to something that is not a list")) };
        self.fed += 2;
        self.st.list(h)?;
        let item = self.st.resolve(item.0);
        if let Absorb::Keep(v) = self.abs.on_append(&mut self.st, h.idx, item)? {
            self.st.list_mut(h)?.items.push(v);
        }
        Ok(())
    }
    /// A complete, non-empty list whose items are all frame dicts, interned as the stack
    /// `frames` would become; `None` (the list unchanged) for any other list. Once
    /// interned, `list` itself resolves to the stack, as a pickle's memo entry does.
    ///
    /// A walker that meets the same frame dicts again in another list can hand over the
    /// returned value in place of building that list: a traceback's frames are immutable,
    /// and PyTorch makes a new list for each traceback out of shared frame dicts, so the
    /// same stack comes back in thousands of lists.
    pub fn as_stack(&mut self, list: FeedValue) -> Option<FeedValue> {
        let Value::List(h) = self.st.resolve(list.0) else { return None };
        let l = self.st.list(h).ok()?;
        if l.items.is_empty() {
            return None;
        }
        self.abs.frame_buf.clear();
        for &item in &l.items {
            match self.st.resolve(item) {
                Value::Frame(f) => self.abs.frame_buf.push(f),
                _ => return None,
            }
        }
        let id = self.st.table.intern_stack(&self.abs.frame_buf);
        self.st.retire_list(h, Value::Stack(id));
        Some(FeedValue(Value::Stack(id)))
    }
    /// An empty dict; fill it with [`Feeder::set_item`].
    pub fn dict(&mut self) -> FeedValue {
        FeedValue(self.st.new_dict())
    }
    pub fn set_item(&mut self, dict: FeedValue, key: FeedValue, value: FeedValue) -> Result<(), ReadError> {
        let Value::Dict(h) = dict.0 else { return Err(self.st.corrupt("set_item on something that is not a dict")) };
        self.fed += 4;
        self.st.dict(h)?;
        self.st.dicts[h.idx as usize].items.push((key.0, value.0));
        Ok(())
    }
    /// The snapshot whose top-level object is `top` (the 2.x dict, or 1.13's segment list).
    pub fn finish(mut self, top: FeedValue) -> Result<Snapshot, ReadError> {
        self.abs.prefault = None;
        finish(&mut self.st, self.abs, top.0, self.fed)
    }
    /// [`Feeder::finish`], then refusing sizes and addresses no real snapshot has, as
    /// [`crate::read_path_checked`] does, from the bound the absorber kept on the trace
    /// entries as they were appended (they are looked at again only to name an offender).
    pub fn finish_checked(self, top: FeedValue) -> Result<Snapshot, ReadError> {
        let max = self.abs.max;
        let snap = self.finish(top)?;
        crate::bounds::check_read(&snap, Some(max))?;
        Ok(snap)
    }
}

/// A dict's items as [`Builder::items_of`] finds them: a dict's own, or a block's given
/// back.
enum DictItems<'a> {
    Dict(&'a [(Value, Value)]),
    Block(Vec<(Value, Value)>),
}

impl std::ops::Deref for DictItems<'_> {
    type Target = [(Value, Value)];
    fn deref(&self) -> &[(Value, Value)] {
        match self {
            DictItems::Dict(items) => items,
            DictItems::Block(items) => items,
        }
    }
}

/// Builds the model from the VM's values. The model holds segments, blocks, history
/// entries, annotations and kept values by value, so a memo-shared one is copied per
/// reference: `spend` bounds those copies.
struct Builder<'a> {
    st: &'a mut VmState,
    abs: &'a mut SnapshotAbsorber,
    snap: Snapshot,
    spend: budget::Spend,
    /// Buffers for [`Builder::dict_ids`], reused: a segment's blocks are ~20 dicts each,
    /// and an allocator-consistent file has 100,000s of blocks.
    bufs: Vec<Vec<(StrId, Value)>>,
}

fn type_name(v: Value) -> &'static str {
    match v {
        Value::None => "None",
        Value::Bool(_) => "bool",
        Value::Int(_) | Value::Big(_) => "int",
        Value::Float(_) => "float",
        Value::Str(_) => "str",
        Value::Bytes(_) => "bytes",
        Value::List(_) | Value::Stack(_) => "list",
        Value::Dict(_) | Value::Frame(_) | Value::Consumed => "dict",
        Value::Undef => "undefined",
        Value::Event(_) | Value::Block(_) => "dict",
        Value::Tuple(_) | Value::Pair(..) => "tuple",
    }
}

impl Builder<'_> {
    fn shape(&self, what: impl Into<String>) -> ReadError {
        ReadError::Shape(what.into())
    }

    /// The items of dict `v` (a dict, or a block decoded whole: its items given back).
    fn items_of(&self, v: Value, what: &dyn std::fmt::Display) -> Result<DictItems<'_>, ReadError> {
        match self.st.resolve(v) {
            Value::Dict(h) => Ok(DictItems::Dict(&self.st.dict(h)?.items)),
            Value::Block(i) => Ok(DictItems::Block(self.st.block_items(i))),
            v => Err(self.shape(format!("{what} is a {} where a dict was expected", type_name(v)))),
        }
    }

    fn dict_items(&self, v: Value, what: &str) -> Result<Vec<(String, Value)>, ReadError> {
        let items = self.items_of(v, &what)?;
        let mut out = Vec::with_capacity(items.len());
        for &(k, val) in items.iter() {
            match k {
                Value::Str(s) => out.push((self.st.str(s).to_string(), val)),
                _ => return Err(self.shape(format!("{what} has a non-string key"))),
            }
        }
        Ok(out)
    }

    /// [`Builder::dict_items`] with the keys as string ids, in a buffer of [`Builder::bufs`]
    /// (hand it back there when done): the same checks, in the same order, without a
    /// `String` per key. Segments and the blocks not decoded whole ([`FlatBlock`]) are
    /// read this way (an allocator-consistent file of 114,000 blocks spent a tenth of its
    /// reading time copying their keys before its blocks were decoded whole).
    fn dict_ids(&mut self, v: Value, what: &dyn std::fmt::Display) -> Result<Vec<(StrId, Value)>, ReadError> {
        let mut out = self.bufs.pop().unwrap_or_default();
        let items = match self.items_of(v, what) {
            Ok(items) => items,
            Err(e) => {
                self.bufs.push(out);
                return Err(e);
            }
        };
        out.clear();
        for &(k, val) in items.iter() {
            match k {
                Value::Str(s) => out.push((s, val)),
                _ => {
                    self.bufs.push(out);
                    return Err(self.shape(format!("{what} has a non-string key")));
                }
            }
        }
        Ok(out)
    }

    fn list_items(&self, v: Value, what: &str) -> Result<Vec<Value>, ReadError> {
        match v {
            Value::List(h) => Ok(self.st.list(h)?.items.clone()),
            Value::Tuple(t) => Ok(self.st.tuples[t as usize].clone()),
            _ => Err(self.shape(format!("{what} is a {} where a list was expected", type_name(v)))),
        }
    }

    fn int(&self, v: Value, what: &str) -> Result<i64, ReadError> {
        int_of(self.st, v).ok_or_else(|| self.shape(format!("{what} is a {}, not an int", type_name(v))))
    }
    fn uint(&self, v: Value, what: &str) -> Result<u64, ReadError> {
        u64_of(self.st, v).ok_or_else(|| self.shape(format!("{what} is a {}, not an int", type_name(v))))
    }
    fn string(&self, v: Value, what: &str) -> Result<String, ReadError> {
        match v {
            Value::Str(s) => Ok(self.st.str(s).to_string()),
            _ => Err(self.shape(format!("{what} is a {}, not a str", type_name(v)))),
        }
    }

    /// [`Builder::string`] without the copy.
    fn str_of(&self, v: Value, what: &str) -> Result<&str, ReadError> {
        match v {
            Value::Str(s) => Ok(self.st.str(s)),
            _ => Err(self.shape(format!("{what} is a {}, not a str", type_name(v)))),
        }
    }

    /// [`Builder::string`] for a string the model keeps (a copy per reference).
    fn kept_string(&mut self, v: Value, what: &str) -> Result<String, ReadError> {
        if let Value::Str(s) = v {
            self.spend.charge(self.st.str(s).len())?;
        }
        self.string(v, what)
    }

    fn build(&mut self, top: Value) -> Result<(), ReadError> {
        match top {
            Value::List(_) => {
                self.snap.format = SourceFormat::SegmentList;
                let segs = self.list_items(top, "the top-level list")?;
                self.snap.segments = self.segments(&segs, "segments")?;
                Ok(())
            }
            Value::Dict(_) | Value::Block(_) => {
                self.snap.format = SourceFormat::Dict;
                let items = self.dict_items(top, "the top-level object")?;
                if !items.iter().any(|(k, _)| k == "segments") {
                    let keys: Vec<&str> = items.iter().map(|(k, _)| k.as_str()).take(8).collect();
                    return Err(self.shape(format!(
                        "a pickled dict without a 'segments' key (keys: {}), not a memory snapshot",
                        if keys.is_empty() { "none".to_string() } else { keys.join(", ") }
                    )));
                }
                for (k, v) in items {
                    match k.as_str() {
                        "segments" => {
                            let segs = self.list_items(v, "'segments'")?;
                            self.snap.segments = self.segments(&segs, "segments")?;
                        }
                        "device_traces" => {
                            for (i, t) in self.list_items(v, "'device_traces'")?.into_iter().enumerate() {
                                let trace = self.trace(t, &format!("device_traces[{i}]"))?;
                                self.snap.device_traces.push(trace);
                            }
                        }
                        "allocator_settings" => self.snap.allocator_settings = Some(self.pyobj(v, 0)?),
                        "external_annotations" => {
                            let mut out = Vec::new();
                            for a in self.list_items(v, "'external_annotations'")? {
                                out.push(self.annotation(a)?);
                            }
                            self.snap.external_annotations = Some(out);
                        }
                        "host_segments" => {
                            let segs = self.list_items(v, "'host_segments'")?;
                            self.snap.host_segments = Some(self.segments(&segs, "host_segments")?);
                        }
                        "host_traces" => self.snap.host_traces = Some(self.trace(v, "host_traces")?),
                        _ => {
                            self.snap.notes.unknown_key("snapshot", &k);
                            let obj = self.pyobj(v, 0)?;
                            self.snap.extra.push((k, obj));
                        }
                    }
                }
                Ok(())
            }
            other => Err(self.shape(format!("a pickled {}, not a memory snapshot", type_name(other)))),
        }
    }

    fn trace(&mut self, v: Value, what: &str) -> Result<Vec<TraceEvent>, ReadError> {
        let Value::List(h) = v else {
            return Err(self.shape(format!("{what} is a {}, not a list", type_name(v))));
        };
        let leftovers = self.st.list(h)?.items.len();
        if leftovers > 0 {
            return Err(self.shape(format!("{what} holds {leftovers} items that are not trace entries")));
        }
        Ok(self.abs.take_events(h.idx))
    }

    fn annotation(&mut self, v: Value) -> Result<Annotation, ReadError> {
        self.spend.charge(size_of::<Annotation>())?;
        let mut a =
            Annotation { device: 0, time_us: NO_TIME, name: String::new(), stage: String::new(), extra: Vec::new() };
        for (k, val) in self.dict_items(v, "an external annotation")? {
            match k.as_str() {
                "device" => a.device = self.int(val, "annotation 'device'")?,
                "time_us" => a.time_us = self.int(val, "annotation 'time_us'")?,
                "name" => a.name = self.kept_string(val, "annotation 'name'")?,
                "stage" => a.stage = self.kept_string(val, "annotation 'stage'")?,
                _ => {
                    let obj = self.pyobj(val, 0)?;
                    a.extra.push((k, obj));
                }
            }
        }
        Ok(a)
    }

    fn segments(&mut self, items: &[Value], what: &str) -> Result<Vec<Segment>, ReadError> {
        let mut out = Vec::with_capacity(items.len());
        for (i, &s) in items.iter().enumerate() {
            // Where it is, for messages: formatted only when one is made.
            out.push(self.segment(s, &format_args!("{what}[{i}]"))?);
        }
        Ok(out)
    }

    fn segment(&mut self, v: Value, what: &dyn std::fmt::Display) -> Result<Segment, ReadError> {
        self.spend.charge(size_of::<Segment>())?;
        let items = self.dict_ids(v, what)?;
        let seg = self.segment_from(&items, what);
        self.bufs.push(items);
        seg
    }

    /// [`Builder::segment`] from its dict's items.
    fn segment_from(&mut self, items: &[(StrId, Value)], what: &dyn std::fmt::Display) -> Result<Segment, ReadError> {
        let mut seg = Segment::new(0, 0, 0);
        let (mut have_addr, mut have_total, mut blocks_v, mut have) = (false, false, None, [false; 5]);
        for &(k, val) in items {
            match self.st.str(k) {
                "device" => (seg.device, have[0]) = (self.int(val, "segment 'device'")?, true),
                "address" => (seg.address, have_addr) = (self.uint(val, "segment 'address'")?, true),
                "total_size" => (seg.total_size, have_total) = (self.uint(val, "segment 'total_size'")?, true),
                "allocated_size" => (seg.allocated_size, have[1]) = (self.uint(val, "segment 'allocated_size'")?, true),
                "active_size" => (seg.active_size, have[2]) = (self.uint(val, "segment 'active_size'")?, true),
                "requested_size" => seg.requested_size = Some(self.uint(val, "segment 'requested_size'")?),
                "stream" => (seg.stream, have[3]) = (self.uint(val, "segment 'stream'")?, true),
                "segment_type" => {
                    have[4] = true;
                    seg.segment_type = match self.str_of(val, "segment 'segment_type'")? {
                        "small" => SegmentType::Small,
                        "large" => SegmentType::Large,
                        other => return Err(self.shape(format!("{what}: unknown segment_type '{other}'"))),
                    }
                }
                "segment_pool_id" => seg.segment_pool_id = pair_of(self.st, val),
                "is_expandable" => seg.is_expandable = Some(self.int(val, "segment 'is_expandable'")? != 0),
                "frames" => seg.stack = self.abs.stack_of(self.st, val)?,
                "blocks" => blocks_v = Some(val),
                key => self.snap.notes.unknown_key("segment", key),
            }
        }
        if !have_addr || !have_total {
            return Err(self.shape(format!(
                "{what} lacks '{}': not a memory snapshot segment",
                if have_addr { "total_size" } else { "address" }
            )));
        }
        let Some(blocks_v) = blocks_v else {
            return Err(self.shape(format!("{what} lacks 'blocks': not a memory snapshot segment")));
        };
        let mut addr = seg.address;
        let blocks = self.list_items(blocks_v, "segment 'blocks'")?;
        seg.blocks.reserve_exact(blocks.len());
        for (j, b) in blocks.into_iter().enumerate() {
            let blk = self.block(b, addr, &format_args!("{what}.blocks[{j}]"))?;
            addr = blk.address.wrapping_add(blk.size);
            seg.blocks.push(blk);
        }
        for (i, name) in ["device", "allocated_size", "active_size", "stream", "segment_type"].iter().enumerate() {
            if !have[i] {
                self.snap.notes.missing("segment", name);
            }
        }
        // Fill derivable sums the file omitted, the way PyTorch defines them.
        if !have[1] {
            seg.allocated_size =
                seg.blocks.iter().filter(|b| b.state == BlockState::ActiveAllocated).map(|b| b.size).sum();
        }
        if !have[2] {
            seg.active_size = seg.blocks.iter().filter(|b| b.state.is_active()).map(|b| b.size).sum();
        }
        if !have[4] && seg.total_size == 2 << 20 && seg.blocks.iter().all(|b| b.size <= 1 << 20) {
            seg.segment_type = SegmentType::Small;
        }
        Ok(seg)
    }

    fn block(&mut self, v: Value, next_addr: u64, what: &dyn std::fmt::Display) -> Result<Block, ReadError> {
        self.spend.charge(size_of::<Block>())?;
        if let Value::Block(i) = self.st.resolve(v) {
            return self.flat_block(self.st.blocks[i as usize], next_addr);
        }
        let items = self.dict_ids(v, what)?;
        let b = self.block_from(&items, next_addr, what);
        self.bufs.push(items);
        b
    }

    /// [`Builder::block`] from a block decoded whole: what [`Builder::block_from`] makes
    /// of its items (no key of such a block is unknown or badly typed, so only its
    /// `frames` can fail, as there).
    fn flat_block(&mut self, b: FlatBlock, next_addr: u64) -> Result<Block, ReadError> {
        let has = |code: u8| b.seen & 1 << code != 0;
        Ok(Block {
            address: if has(BK_ADDRESS) { b.ints[BK_ADDRESS as usize] as u64 } else { next_addr },
            size: b.ints[BK_SIZE as usize] as u64,
            requested_size: has(BK_REQUESTED).then_some(b.ints[BK_REQUESTED as usize] as u64),
            state: b.state,
            stack: if has(BK_FRAMES) { self.abs.stack_of(self.st, b.frames)? } else { None },
            history: None,
        })
    }

    /// [`Builder::block`] from its dict's items.
    fn block_from(
        &mut self,
        items: &[(StrId, Value)],
        next_addr: u64,
        what: &dyn std::fmt::Display,
    ) -> Result<Block, ReadError> {
        let mut b = Block {
            address: next_addr,
            size: 0,
            requested_size: None,
            state: BlockState::Inactive,
            stack: None,
            history: None,
        };
        let (mut have_size, mut have_state) = (false, false);
        for &(k, val) in items {
            match self.st.str(k) {
                "address" => b.address = self.uint(val, "block 'address'")?,
                "size" => (b.size, have_size) = (self.uint(val, "block 'size'")?, true),
                "requested_size" => b.requested_size = Some(self.uint(val, "block 'requested_size'")?),
                "state" => {
                    let s = self.str_of(val, "block 'state'")?;
                    b.state =
                        BlockState::parse(s).ok_or_else(|| self.shape(format!("{what}: unknown block state '{s}'")))?;
                    have_state = true;
                }
                "frames" => b.stack = self.abs.stack_of(self.st, val)?,
                "history" => {
                    let mut hist = Vec::new();
                    for h in self.list_items(val, "block 'history'")? {
                        self.spend.charge(size_of::<HistoryEntry>())?;
                        let mut e = HistoryEntry { addr: 0, real_size: 0, stack: None };
                        for (hk, hv) in self.dict_items(h, "a block history entry")? {
                            match hk.as_str() {
                                "addr" => e.addr = self.uint(hv, "history 'addr'")?,
                                "real_size" => e.real_size = self.uint(hv, "history 'real_size'")?,
                                "frames" => e.stack = self.abs.stack_of(self.st, hv)?,
                                _ => self.snap.notes.unknown_key("history", &hk),
                            }
                        }
                        hist.push(e);
                    }
                    b.history = Some(hist);
                }
                key => self.snap.notes.unknown_key("block", key),
            }
        }
        if !have_size || !have_state {
            return Err(self.shape(format!(
                "{what} lacks '{}': not a memory snapshot block",
                if have_size { "state" } else { "size" }
            )));
        }
        Ok(b)
    }

    /// Deep conversion for the parts kept verbatim. Depth-limited: a hostile pickle can
    /// nest a million lists in a few megabytes, or make a list contain itself.
    fn pyobj(&mut self, v: Value, depth: usize) -> Result<PyObj, ReadError> {
        if depth > MAX_DEPTH {
            return Err(self.shape("nesting deeper than 256 levels: not a memory snapshot"));
        }
        let v = self.st.resolve(v);
        // What this node adds to the model: itself and what it holds by value.
        let own = match v {
            Value::Str(s) => self.st.str(s).len(),
            Value::Big(i) => self.st.bigs[i as usize].len(),
            Value::Bytes(i) => self.st.bytes[i as usize].len(),
            Value::Frame(f) => {
                let fr = self.st.table.frame(f);
                6 * size_of::<PyObj>() + self.st.str(fr.filename).len() + self.st.str(fr.name).len()
            }
            _ => 0,
        };
        self.spend.charge(size_of::<PyObj>() + own)?;
        Ok(match v {
            Value::None => PyObj::None,
            Value::Bool(b) => PyObj::Bool(b),
            Value::Int(i) => PyObj::Int(i),
            Value::Big(i) => PyObj::BigInt(self.st.bigs[i as usize].clone()),
            Value::Float(f) => PyObj::Float(f),
            Value::Str(s) => PyObj::Str(self.st.str(s).to_string()),
            Value::Bytes(i) => PyObj::Bytes(self.st.bytes[i as usize].clone()),
            Value::Pair(a, b) => PyObj::Tuple(vec![PyObj::Int(a as i64), PyObj::Int(b as i64)]),
            Value::Tuple(t) => {
                let items = self.st.tuples[t as usize].clone();
                PyObj::Tuple(items.into_iter().map(|x| self.pyobj(x, depth + 1)).collect::<Result<_, _>>()?)
            }
            Value::List(h) => {
                let items = self.st.list(h)?.items.clone();
                PyObj::List(items.into_iter().map(|x| self.pyobj(x, depth + 1)).collect::<Result<_, _>>()?)
            }
            Value::Dict(_) | Value::Block(_) => {
                let items = self.items_of(v, &"a kept dict")?.iter().copied().collect::<Vec<_>>();
                let mut out = Vec::with_capacity(items.len());
                for (k, x) in items {
                    out.push((self.pyobj(k, depth + 1)?, self.pyobj(x, depth + 1)?));
                }
                PyObj::Dict(out)
            }
            Value::Frame(f) => {
                let fr = *self.st.table.frame(f);
                PyObj::Dict(vec![
                    (PyObj::Str("filename".into()), PyObj::Str(self.st.str(fr.filename).into())),
                    (PyObj::Str("line".into()), PyObj::Int(fr.line)),
                    (PyObj::Str("name".into()), PyObj::Str(self.st.str(fr.name).into())),
                ])
            }
            Value::Stack(s) => {
                let ids = self.st.table.stack(s).to_vec();
                PyObj::List(ids.into_iter().map(|f| self.pyobj(Value::Frame(f), depth + 1)).collect::<Result<_, _>>()?)
            }
            Value::Consumed | Value::Undef | Value::Event(_) => {
                return Err(self.shape("a trace entry appears outside 'device_traces'"))
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::same_bytes;

    /// `same_bytes` is `==`: every length up to past three rounds of 32 bytes, equal and
    /// with one byte changed at each place (first, last, in a round, in the words after).
    #[test]
    fn same_bytes_is_slice_equality() {
        let a: Vec<u8> = (0..140u32).map(|i| (i * 37 + 11) as u8).collect();
        for n in 0..a.len() {
            let x = &a[..n];
            assert!(same_bytes(x, x), "length {n}");
            for at in 0..n {
                let mut y = x.to_vec();
                y[at] ^= 0x40;
                assert!(!same_bytes(x, &y), "length {n}, byte {at} changed");
            }
            if n > 0 {
                assert!(!same_bytes(x, &a[..n - 1]), "lengths {n} and {}", n - 1);
            }
        }
    }
}
