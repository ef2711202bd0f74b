//! `diff`: two snapshots compared per device (peaks, fragmentation) and the call sites
//! whose live bytes at the allocated peak changed most; the document
//! (`fragscope.diff/1`).

use fragscope_diagnose::Diff;
use serde::Serialize;

pub const SCHEMA: &str = "fragscope.diff/1";

#[derive(Serialize)]
struct DiffOut<'a> {
    schema: &'static str,
    a: String,
    b: String,
    #[serde(flatten)]
    diff: &'a Diff,
}

/// The document of a diff of snapshots named `a` and `b`.
pub fn json(a: &str, b: &str, diff: &Diff) -> Result<String, crate::Error> {
    crate::to_json(&DiffOut { schema: SCHEMA, a: a.to_string(), b: b.to_string(), diff })
}
