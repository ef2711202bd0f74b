//! The live dict of `torch.cuda.memory._snapshot()` (or a `pickle.load`ed snapshot file)
//! into the snapshot model, without pickling: the Python objects are walked here and
//! handed to [`fragscope_snapshot::Feeder`], the pickle reader's own absorber and builder,
//! so the model is the one reading a pickle of the same objects gives.
//!
//! Lists met twice (a frame list shared by a block and its trace entries, as pickle's memo
//! shares them) are handed over once, found by identity; strings too, so each distinct key
//! object is converted and interned once. A dict is walked each time it is met (a frame
//! dict interns to the same frame again; a dict containing itself ends at the depth limit). Everything walked is kept alive by `obj` for the
//! whole walk, which makes identity (the object's address) a sound key.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use fragscope_snapshot::{FeedValue, Feeder, Snapshot};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};

/// Nesting deeper than this is refused, as the pickle reader refuses it.
const MAX_DEPTH: usize = 256;

struct Walk {
    feeder: Feeder,
    /// Lists and strings already converted, by address.
    seen: HashMap<usize, FeedValue, BuildHasherDefault<AddrHasher>>,
}

/// Hashes an object address with one multiply: SipHash's resistance to chosen keys buys
/// nothing for addresses, and this map is probed for every key and string of every entry.
#[derive(Default)]
struct AddrHasher(u64);

impl Hasher for AddrHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ b as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_usize(&mut self, n: usize) {
        // Addresses are 16-byte aligned: drop the zero bits, spread the rest to the top.
        self.0 = ((n as u64) >> 4).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// Walks `obj` into a [`Snapshot`]; the error is the reader's message.
pub fn snapshot_from_py(obj: &Bound<'_, PyAny>) -> Result<Snapshot, String> {
    let mut w = Walk { feeder: Feeder::new(), seen: HashMap::default() };
    let top = w.value(obj, 0)?;
    w.feeder.finish(top).map_err(|e| e.to_string())
}

impl Walk {
    fn value(&mut self, o: &Bound<'_, PyAny>, depth: usize) -> Result<FeedValue, String> {
        if depth > MAX_DEPTH {
            return Err("nesting deeper than 256 levels: not a memory snapshot".into());
        }
        let id = o.as_ptr() as usize;
        // Exact types first (the common case, one pointer compare each); subclasses after.
        // Ints are never shared in a way that matters: no lookup for them.
        if o.is_exact_instance_of::<PyInt>() {
            return self.int(o);
        }
        if let Some(&v) = self.seen.get(&id) {
            return Ok(v);
        }
        if let Ok(s) = o.downcast_exact::<PyString>() {
            let v = self.feeder.str(&s.to_cow().map_err(|e| e.to_string())?);
            self.seen.insert(id, v);
            return Ok(v);
        }
        if let Ok(d) = o.downcast::<PyDict>() {
            // Dicts are not remembered: millions of trace entries are never shared, and a
            // shared frame dict converted twice interns to the same frame.
            let v = self.feeder.dict();
            for (k, x) in d.iter() {
                let k = self.value(&k, depth + 1)?;
                let x = self.value(&x, depth + 1)?;
                self.feeder.set_item(v, k, x).map_err(|e| e.to_string())?;
            }
            return Ok(v);
        }
        if let Ok(l) = o.downcast::<PyList>() {
            let v = self.feeder.list();
            self.seen.insert(id, v);
            for x in l.iter() {
                let x = self.value(&x, depth + 1)?;
                self.feeder.append(v, x).map_err(|e| e.to_string())?;
            }
            return Ok(v);
        }
        if o.is_none() {
            return Ok(self.feeder.none());
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
            return Ok(self.feeder.str(&s.to_cow().map_err(|e| e.to_string())?));
        }
        if let Ok(t) = o.downcast::<PyTuple>() {
            let mut items = Vec::with_capacity(t.len());
            for x in t.iter() {
                items.push(self.value(&x, depth + 1)?);
            }
            return Ok(self.feeder.tuple(items));
        }
        if let Ok(b) = o.downcast::<PyBytes>() {
            return Ok(self.feeder.bytes(b.as_bytes().to_vec()));
        }
        let ty = o.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "?".into());
        Err(format!("a Python '{ty}' object, where a snapshot holds only dicts, lists, tuples, str, int, float, bool, None and bytes"))
    }

    /// An int: i64 when it fits, else its little-endian two's complement bytes
    /// (`max_split_size` is 2^64−1 in some builds), as pickle's LONG1 carries it.
    fn int(&mut self, o: &Bound<'_, PyAny>) -> Result<FeedValue, String> {
        if let Ok(i) = o.extract::<i64>() {
            return Ok(self.feeder.int(i));
        }
        match o.extract::<i128>() {
            Ok(i) => Ok(self.feeder.big_int(fragscope_snapshot::pyobj::encode_long(i))),
            Err(_) => Err("an int wider than 128 bits: not a memory snapshot".into()),
        }
    }
}
