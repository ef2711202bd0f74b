//! A command's JSON document as every front end hands it out: serde_json's pretty form and
//! a newline (the CLI prints it, the Python package returns it from `to_json()`, the MCP
//! server parses it).

use crate::Error;

/// `value` as the `--json` text.
pub fn to_json<T: serde::Serialize + ?Sized>(value: &T) -> Result<String, Error> {
    let mut s = serde_json::to_string_pretty(value)?;
    s.push('\n');
    Ok(s)
}
