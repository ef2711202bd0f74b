//! Compact encodings of the page's large arrays: little-endian typed arrays in base64,
//! which the page decodes with `atob` into a `Float64Array` without parsing numbers.

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard base64 (with padding) of `bytes`.
pub fn base64(bytes: &[u8]) -> String {
    // Into bytes, then one check of the whole: a `String::push` per character was most
    // of this function's time on the page's arrays (tens of MB on a long trace).
    let mut out = Vec::with_capacity(bytes.len().div_ceil(3) * 4);
    let sym = |n: u32, k: u32| ALPHABET[(n >> (18 - 6 * k) & 63) as usize];
    let mut whole = bytes.chunks_exact(3);
    for c in &mut whole {
        let n = (c[0] as u32) << 16 | (c[1] as u32) << 8 | c[2] as u32;
        out.extend_from_slice(&[sym(n, 0), sym(n, 1), sym(n, 2), sym(n, 3)]);
    }
    let rest = whole.remainder();
    if !rest.is_empty() {
        let n = (rest[0] as u32) << 16 | (*rest.get(1).unwrap_or(&0) as u32) << 8;
        out.extend_from_slice(&[sym(n, 0), sym(n, 1), if rest.len() == 2 { sym(n, 2) } else { b'=' }, b'=']);
    }
    String::from_utf8(out).expect("base64 is ASCII")
}

/// A `Float64Array` in base64. Byte counts up to 2^53 are exact in an f64.
pub fn f64s(v: &[f64]) -> String {
    let mut bytes = Vec::with_capacity(v.len() * 8);
    for x in v {
        bytes.extend_from_slice(&x.to_le_bytes());
    }
    base64(&bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_rfc4648_vectors() {
        for (i, o) in
            [("", ""), ("f", "Zg=="), ("fo", "Zm8="), ("foo", "Zm9v"), ("foob", "Zm9vYg=="), ("foobar", "Zm9vYmFy")]
        {
            assert_eq!(base64(i.as_bytes()), o);
        }
    }

    #[test]
    fn base64_of_every_length_and_byte() {
        // Against the per-character encoder this replaced (RFC 4648's definition).
        fn reference(bytes: &[u8]) -> String {
            let mut out = String::new();
            for c in bytes.chunks(3) {
                let n = (c[0] as u32) << 16 | (*c.get(1).unwrap_or(&0) as u32) << 8 | *c.get(2).unwrap_or(&0) as u32;
                for k in 0..4 {
                    out.push(if k <= c.len() { ALPHABET[(n >> (18 - 6 * k) & 63) as usize] as char } else { '=' });
                }
            }
            out
        }
        let data: Vec<u8> = (0..=255u8).chain((0..=255u8).rev()).collect();
        for len in 0..data.len() {
            assert_eq!(base64(&data[..len]), reference(&data[..len]), "{len} bytes");
        }
    }

    #[test]
    fn f64s_are_little_endian() {
        assert_eq!(f64s(&[1.0]), base64(&[0, 0, 0, 0, 0, 0, 0xf0, 0x3f]));
    }
}
