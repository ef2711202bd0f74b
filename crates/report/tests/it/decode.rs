//! The page's base64 `Float64Array`s read back, by code of the tests' own (not the
//! encoder's), as the page reads them.

/// The values of a base64 little-endian `Float64Array`.
pub fn f64s(b64: &str) -> Vec<f64> {
    let val = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        _ => 63,
    };
    let mut bytes = Vec::new();
    for chunk in b64.as_bytes().chunks(4) {
        let pad = chunk.iter().filter(|&&c| c == b'=').count();
        let n = chunk.iter().fold(0u32, |n, &c| n << 6 | if c == b'=' { 0 } else { val(c) as u32 });
        bytes.extend_from_slice(&n.to_be_bytes()[1..4 - pad]);
    }
    bytes.chunks(8).map(|c| f64::from_le_bytes(c.try_into().unwrap())).collect()
}
