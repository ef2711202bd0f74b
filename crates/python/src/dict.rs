//! The live dict of `torch.cuda.memory._snapshot()` (or a `pickle.load`ed snapshot file)
//! into the snapshot model, without pickling: the Python objects are walked here and
//! handed to [`fragscope_snapshot::Feeder`], the pickle reader's own absorber and builder,
//! so the model is the one reading a pickle of the same objects gives.
//!
//! Lists and dicts met twice (a frame list shared by a block and its trace entries, a frame
//! dict shared by many stacks, as pickle's memo shares them) are walked once and handed over
//! again, found by identity, as the pickle reader gets them from its memo. PyTorch makes a
//! new list per traceback out of shared frame dicts, so most frame lists are met once
//! each: a list whose items are the frame dicts of a stack already built (the same
//! objects, by address, in the same order) is handed over as that stack without walking
//! its items ([`Walk::stacks`]; on the largest real file 1.04 M frame visits in 17.7 k
//! lists, and the walk went from 78 ms to 31 ms). A dict is remembered once complete, so
//! one that contains itself ends at the depth limit. Everything walked is kept alive by
//! `obj` for the whole walk, which makes identity (the object's address) a sound key.
//!
//! Speed: a snapshot is millions of small dicts, ints and strings, so the objects of the
//! exact built-in types are read through the C API directly ([`Walk::value`]): the type by
//! one pointer compare, dict items by `PyDict_Next` and list items by `PyList_GetItem`
//! (borrowed references, no reference counting per item), strings by
//! `PyUnicode_AsUTF8AndSize` (the UTF-8 the string object caches, no copy), and a small
//! table by address in front of the string interner (the same key objects, `"addr"`,
//! `"size"`, `"filename"`, ..., come back in every entry). Anything else (subclasses,
//! tuples, bytes, big ints) takes the general path through pyo3 ([`Walk::value_general`]).
//! No Python code runs during the walk on the direct path, so the borrowed references stay
//! valid; the general path holds a strong reference to what it reads.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use fragscope_snapshot::{FeedValue, Feeder, ReadError, Snapshot};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};

/// Nesting deeper than this is refused, as the pickle reader refuses it.
const MAX_DEPTH: usize = 256;

struct Walk<'py> {
    py: Python<'py>,
    feeder: Feeder,
    /// Lists and dicts already converted, by address.
    seen: HashMap<usize, FeedValue, BuildHasherDefault<AddrHasher>>,
    /// Stacks by the addresses of their frame dicts, in order.
    stacks: HashMap<Box<[usize]>, FeedValue, BuildHasherDefault<AddrHasher>>,
    /// The items of the list being walked (scratch for [`Walk::stacks`]).
    key: Vec<usize>,
    /// Strings recently converted, by address (direct-mapped): a cache in front of the
    /// feeder's interner, which gives the same value for the same text anyway.
    strings: Vec<(usize, Option<FeedValue>)>,
    types: Types,
}

/// The exact built-in types the direct path reads.
struct Types {
    int: *mut ffi::PyTypeObject,
    str: *mut ffi::PyTypeObject,
    dict: *mut ffi::PyTypeObject,
    list: *mut ffi::PyTypeObject,
    float: *mut ffi::PyTypeObject,
    bool: *mut ffi::PyTypeObject,
}

impl Types {
    /// The addresses of the interpreter's static type objects (taking an address reads
    /// nothing).
    fn get() -> Self {
        Types {
            int: std::ptr::addr_of_mut!(ffi::PyLong_Type),
            str: std::ptr::addr_of_mut!(ffi::PyUnicode_Type),
            dict: std::ptr::addr_of_mut!(ffi::PyDict_Type),
            list: std::ptr::addr_of_mut!(ffi::PyList_Type),
            float: std::ptr::addr_of_mut!(ffi::PyFloat_Type),
            bool: std::ptr::addr_of_mut!(ffi::PyBool_Type),
        }
    }
}

/// Lists longer than this are not looked up as stacks (a trace list, a segment list).
const MAX_STACK_KEY: usize = 4096;
/// Distinct stacks remembered by [`Walk::stacks`]: bounds its memory on a file whose
/// every list differs.
const MAX_STACKS: usize = 1 << 18;

/// Slots of [`Walk::strings`] (a power of two).
const STRING_SLOTS: usize = 4096;

/// Hashes an object address with one multiply: SipHash's resistance to chosen keys buys
/// nothing for addresses, and this map is probed for every list of every entry.
#[derive(Default)]
struct AddrHasher(u64);

impl Hasher for AddrHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // A word at a time: a stack key is a slice of addresses.
        let mut words = bytes.chunks_exact(8);
        for w in &mut words {
            let w = u64::from_le_bytes(w.try_into().expect("8 bytes"));
            self.0 = (self.0.rotate_left(23) ^ (w >> 4)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
        for &b in words.remainder() {
            self.0 = (self.0.rotate_left(8) ^ b as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_usize(&mut self, n: usize) {
        // Addresses are 16-byte aligned: drop the zero bits, spread the rest to the top.
        self.0 = ((n as u64) >> 4).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// The addresses of the items of the exact list `o`, in order, into `out`.
///
/// # Safety
/// `o` is a live exact `list` and the GIL is held.
unsafe fn item_addresses(o: *mut ffi::PyObject, out: &mut Vec<usize>) {
    out.clear();
    for i in 0..ffi::PyList_Size(o) {
        out.push(ffi::PyList_GetItem(o, i) as usize);
    }
}

/// Why a Python object is not a memory snapshot.
#[derive(Debug)]
pub enum DictError {
    /// Nested deeper than 256 levels.
    TooDeep,
    /// An object of a type no snapshot holds (its type's name).
    Unsupported(String),
    /// An int wider than 128 bits.
    IntTooWide,
    /// Python refused to give a str's text (its message).
    Python(String),
    /// The reader refused what the walk fed it.
    Read(ReadError),
}

impl std::fmt::Display for DictError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DictError::TooDeep => f.write_str("nesting deeper than 256 levels: not a memory snapshot"),
            DictError::Unsupported(ty) => write!(
                f,
                "a Python '{ty}' object, where a snapshot holds only dicts, lists, tuples, str, int, float, bool, None and bytes"
            ),
            DictError::IntTooWide => f.write_str("an int wider than 128 bits: not a memory snapshot"),
            DictError::Python(e) => f.write_str(e),
            DictError::Read(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for DictError {}

/// Walks `obj` into a [`Snapshot`]; the error is the reader's message. The walk holds
/// the GIL (it reads Python objects); building the model from what was fed does not, and
/// runs with the GIL released.
pub fn snapshot_from_py(obj: &Bound<'_, PyAny>) -> Result<Snapshot, DictError> {
    let (feeder, top) = feed(obj)?;
    // Sizes and addresses no real snapshot has are refused, as in a file.
    obj.py().allow_threads(move || feeder.finish_checked(top).map_err(DictError::Read))
}

/// The walk alone: the feeder holding every object of `obj`, and the top value.
pub fn feed(obj: &Bound<'_, PyAny>) -> Result<(Feeder, FeedValue), DictError> {
    let mut w = Walk {
        py: obj.py(),
        feeder: Feeder::new(),
        seen: HashMap::default(),
        stacks: HashMap::default(),
        key: Vec::new(),
        strings: vec![(0, None); STRING_SLOTS],
        types: Types::get(),
    };
    // SAFETY: `obj` is a live object and the GIL is held (`obj.py()`).
    let top = unsafe { w.value(obj.as_ptr(), 0)? };
    Ok((w.feeder, top))
}

impl<'py> Walk<'py> {
    /// The direct path for the exact built-in types; the rest goes to [`Walk::value_general`].
    ///
    /// # Safety
    /// `o` is a live object and the GIL is held; `o` stays alive while this runs (it is
    /// reachable from the walked object, and no Python code runs on this path).
    unsafe fn value(&mut self, o: *mut ffi::PyObject, depth: usize) -> Result<FeedValue, DictError> {
        if depth > MAX_DEPTH {
            return Err(DictError::TooDeep);
        }
        let t = ffi::Py_TYPE(o);
        if t == self.types.int {
            let mut overflow = 0;
            let i = ffi::PyLong_AsLongLongAndOverflow(o, &mut overflow);
            if overflow == 0 && (i != -1 || ffi::PyErr_Occurred().is_null()) {
                return Ok(self.feeder.int(i));
            }
            ffi::PyErr_Clear();
            return self.int(&Bound::from_borrowed_ptr(self.py, o));
        }
        if t == self.types.str {
            return self.str(o);
        }
        if t == self.types.dict {
            // A dict met again is handed over again, as pickle's memo does: a `pickle.load`ed
            // snapshot shares its frame dicts (25 visits per distinct dict on the largest
            // real file), and walking each visit was most of the cost. Remembered once
            // complete, so a dict that contains itself still ends at the depth limit.
            let id = o as usize;
            if let Some(&v) = self.seen.get(&id) {
                return Ok(v);
            }
            let v = self.feeder.dict();
            let (mut pos, mut k, mut x) = (0, std::ptr::null_mut(), std::ptr::null_mut());
            while ffi::PyDict_Next(o, &mut pos, &mut k, &mut x) != 0 {
                let kv = self.value(k, depth + 1)?;
                let xv = self.value(x, depth + 1)?;
                self.feeder.set_item(v, kv, xv).map_err(DictError::Read)?;
            }
            self.seen.insert(id, v);
            return Ok(v);
        }
        if t == self.types.list {
            let id = o as usize;
            if let Some(&v) = self.seen.get(&id) {
                return Ok(v);
            }
            // A traceback's list of frame dicts met before under another list object (a
            // new list per traceback, the frame dicts shared): the stack, by the items'
            // addresses, without walking them again.
            let n = ffi::PyList_Size(o);
            let keyed = n > 0 && n as usize <= MAX_STACK_KEY;
            if keyed {
                item_addresses(o, &mut self.key);
                if let Some(&v) = self.stacks.get(&self.key[..]) {
                    return Ok(v);
                }
            }
            let v = self.feeder.list();
            self.seen.insert(id, v);
            let mut i = 0;
            while i < ffi::PyList_Size(o) {
                let x = ffi::PyList_GetItem(o, i);
                let xv = self.value(x, depth + 1)?;
                self.feeder.append(v, xv).map_err(DictError::Read)?;
                i += 1;
            }
            if keyed && self.stacks.len() < MAX_STACKS {
                if let Some(s) = self.feeder.as_stack(v) {
                    // Listed again: walking the items may have used `key` for a nested list.
                    item_addresses(o, &mut self.key);
                    self.stacks.insert(self.key.as_slice().into(), s);
                    return Ok(s);
                }
            }
            return Ok(v);
        }
        if o == ffi::Py_None() {
            return Ok(self.feeder.none());
        }
        if t == self.types.float {
            return Ok(self.feeder.float(ffi::PyFloat_AsDouble(o)));
        }
        if t == self.types.bool {
            return Ok(self.feeder.bool(o == ffi::Py_True()));
        }
        // A strong reference: the general path may run Python code (an int subclass's
        // `__index__`, a str subclass's encoding) that could drop the last other one.
        self.value_general(&Bound::from_borrowed_ptr(self.py, o), depth)
    }

    /// An exact `str`: from the address cache, else its UTF-8 interned.
    unsafe fn str(&mut self, o: *mut ffi::PyObject) -> Result<FeedValue, DictError> {
        let id = o as usize;
        let slot = ((id >> 4) ^ (id >> 16)) & (STRING_SLOTS - 1);
        if let (addr, Some(v)) = self.strings[slot] {
            if addr == id {
                return Ok(v);
            }
        }
        let mut len: ffi::Py_ssize_t = 0;
        let p = ffi::PyUnicode_AsUTF8AndSize(o, &mut len);
        if p.is_null() {
            // Lone surrogates cannot be UTF-8: the general path says so.
            ffi::PyErr_Clear();
            let b = Bound::from_borrowed_ptr(self.py, o);
            let s = b.downcast::<PyString>().map_err(|e| DictError::Python(e.to_string()))?;
            return Ok(self.feeder.str(&s.to_cow().map_err(|e| DictError::Python(e.to_string()))?));
        }
        // SAFETY: CPython's UTF-8 form of a str is valid UTF-8, `len` bytes long, and
        // lives as long as the string object.
        let s = std::str::from_utf8_unchecked(std::slice::from_raw_parts(p.cast::<u8>(), len as usize));
        let v = self.feeder.str(s);
        self.strings[slot] = (id, Some(v));
        Ok(v)
    }

    /// Subclasses of the built-in types, tuples, bytes, and what a snapshot never holds.
    fn value_general(&mut self, o: &Bound<'py, PyAny>, depth: usize) -> Result<FeedValue, DictError> {
        let id = o.as_ptr() as usize;
        if let Some(&v) = self.seen.get(&id) {
            return Ok(v);
        }
        if let Ok(d) = o.downcast::<PyDict>() {
            let v = self.feeder.dict();
            for (k, x) in d.iter() {
                // SAFETY: `k` and `x` are held by the iteration; the GIL is held.
                let k = unsafe { self.value(k.as_ptr(), depth + 1)? };
                let x = unsafe { self.value(x.as_ptr(), depth + 1)? };
                self.feeder.set_item(v, k, x).map_err(DictError::Read)?;
            }
            return Ok(v);
        }
        if let Ok(l) = o.downcast::<PyList>() {
            let v = self.feeder.list();
            self.seen.insert(id, v);
            for x in l.iter() {
                // SAFETY: as above.
                let x = unsafe { self.value(x.as_ptr(), depth + 1)? };
                self.feeder.append(v, x).map_err(DictError::Read)?;
            }
            return Ok(v);
        }
        if let Ok(b) = o.downcast::<PyBool>() {
            return Ok(self.feeder.bool(b.is_true()));
        }
        if o.is_instance_of::<PyInt>() {
            return self.int(o);
        }
        if let Ok(f) = o.downcast::<PyFloat>() {
            return Ok(self.feeder.float(f.value()));
        }
        if let Ok(s) = o.downcast::<PyString>() {
            return Ok(self.feeder.str(&s.to_cow().map_err(|e| DictError::Python(e.to_string()))?));
        }
        if let Ok(t) = o.downcast::<PyTuple>() {
            let mut items = Vec::with_capacity(t.len());
            for x in t.iter() {
                // SAFETY: as above.
                items.push(unsafe { self.value(x.as_ptr(), depth + 1)? });
            }
            return Ok(self.feeder.tuple(items));
        }
        if let Ok(b) = o.downcast::<PyBytes>() {
            return Ok(self.feeder.bytes(b.as_bytes().to_vec()));
        }
        let ty = o.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "?".into());
        Err(DictError::Unsupported(ty))
    }

    /// An int: i64 when it fits, else its little-endian two's complement bytes
    /// (`max_split_size` is 2^64−1 in some builds), as pickle's LONG1 carries it.
    fn int(&mut self, o: &Bound<'_, PyAny>) -> Result<FeedValue, DictError> {
        if let Ok(i) = o.extract::<i64>() {
            return Ok(self.feeder.int(i));
        }
        match o.extract::<i128>() {
            Ok(i) => Ok(self.feeder.big_int(fragscope_snapshot::pyobj::encode_long(i))),
            Err(_) => Err(DictError::IntTooWide),
        }
    }
}
