//! Owned Python values, for the parts of a snapshot the model keeps verbatim
//! (`allocator_settings`, unknown top-level keys, extra annotation keys).

/// A Python value made only of builtin types, as a snapshot pickle may hold them.
#[derive(Clone, Debug, PartialEq)]
pub enum PyObj {
    None,
    Bool(bool),
    Int(i64),
    /// An integer outside `i64`, as little-endian two's complement bytes (pickle LONG1/LONG4).
    /// `max_split_size` is written as 2^64−1 by some builds.
    BigInt(Vec<u8>),
    Float(f64),
    Str(String),
    Bytes(Vec<u8>),
    List(Vec<PyObj>),
    Tuple(Vec<PyObj>),
    Dict(Vec<(PyObj, PyObj)>),
}

impl PyObj {
    /// Value of a string key in a dict.
    pub fn get(&self, key: &str) -> Option<&PyObj> {
        match self {
            PyObj::Dict(items) => items.iter().find(|(k, _)| matches!(k, PyObj::Str(s) if s == key)).map(|(_, v)| v),
            _ => None,
        }
    }
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            PyObj::Int(i) => Some(i),
            PyObj::Bool(b) => Some(b as i64),
            _ => None,
        }
    }
    /// Non-negative integers, including 9-byte LONG1 values up to 2^64−1.
    pub fn as_u64(&self) -> Option<u64> {
        match self {
            PyObj::Int(i) => u64::try_from(*i).ok(),
            PyObj::BigInt(b) => bigint_to_u64(b),
            _ => None,
        }
    }
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            PyObj::Float(f) => Some(f),
            PyObj::Int(i) => Some(i as f64),
            _ => None,
        }
    }
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            PyObj::Bool(b) => Some(b),
            _ => None,
        }
    }
    pub fn as_str(&self) -> Option<&str> {
        match self {
            PyObj::Str(s) => Some(s),
            _ => None,
        }
    }
    pub fn as_dict(&self) -> Option<&[(PyObj, PyObj)]> {
        match self {
            PyObj::Dict(d) => Some(d),
            _ => None,
        }
    }
}

/// Little-endian two's complement → u64 when the value is non-negative and fits.
pub fn bigint_to_u64(b: &[u8]) -> Option<u64> {
    if b.is_empty() {
        return Some(0);
    }
    if b[b.len() - 1] & 0x80 != 0 {
        return None; // negative
    }
    let significant = b.len() - b.iter().rev().take_while(|&&x| x == 0).count();
    if significant > 8 {
        return None;
    }
    let mut v = 0u64;
    for (i, &byte) in b[..significant].iter().enumerate() {
        v |= (byte as u64) << (8 * i);
    }
    Some(v)
}

/// Little-endian two's complement → i64 when it fits.
pub fn bigint_to_i64(b: &[u8]) -> Option<i64> {
    if b.len() > 8 {
        let sign = if b[b.len() - 1] & 0x80 != 0 { 0xff } else { 0 };
        if b[8..].iter().any(|&x| x != sign) || (b[7] & 0x80 != 0) != (sign == 0xff) {
            return None;
        }
    }
    let mut buf = [if b.last().is_some_and(|&x| x & 0x80 != 0) { 0xff } else { 0 }; 8];
    for (i, &byte) in b.iter().take(8).enumerate() {
        buf[i] = byte;
    }
    Some(i64::from_le_bytes(buf))
}

/// Minimal little-endian two's complement encoding of an i128 (pickle LONG1 payload).
pub fn encode_long(v: i128) -> Vec<u8> {
    if v == 0 {
        return Vec::new();
    }
    let bytes = v.to_le_bytes();
    let mut n = 16;
    // Drop redundant sign-extension bytes, keeping the sign bit correct.
    while n > 1 {
        let top = bytes[n - 1];
        let next_sign = bytes[n - 2] & 0x80 != 0;
        if (top == 0 && !next_sign) || (top == 0xff && next_sign) {
            n -= 1;
        } else {
            break;
        }
    }
    bytes[..n].to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn bigint_conversions() {
        let max = encode_long(u64::MAX as i128);
        assert_eq!(max.len(), 9);
        assert_eq!(bigint_to_u64(&max), Some(u64::MAX));
        assert_eq!(bigint_to_i64(&max), None);
        assert_eq!(bigint_to_i64(&encode_long(-1)), Some(-1));
        assert_eq!(bigint_to_i64(&encode_long(-129)), Some(-129));
        assert_eq!(bigint_to_u64(&encode_long(-1)), None);
        assert_eq!(encode_long(255), vec![0xff, 0x00]);
        assert_eq!(encode_long(-256), vec![0x00, 0xff]);
        assert_eq!(bigint_to_i64(&encode_long(i64::MIN as i128)), Some(i64::MIN));
    }
}
