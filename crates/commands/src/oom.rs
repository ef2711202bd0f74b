//! `oom`: a CUDA out-of-memory error explained from its text alone — every message in the
//! text parsed ([`fragscope_oomtext`]), explained, with the advice its own figures support;
//! the document `fragscope.oom/2`.

use fragscope_alloc::format_size as bytes;
use fragscope_oomtext::{self as oom_message, format_size_pm, Likely, OomExplanation, OomMessage};
use serde::Serialize;

use crate::Error;

/// Schema name of the `oom` document.
pub const SCHEMA: &str = "fragscope.oom/2";

/// Every OOM message in `text`, each explained. No message: an input error (the parser's
/// more useful reason when it has one, e.g. only the runtime's own OOM line).
pub fn explain_text(text: &str) -> Result<Vec<(OomMessage, OomExplanation)>, Error> {
    let msgs = oom_message::parse_all(text);
    if msgs.is_empty() {
        let e = oom_message::parse(text).err().map_or_else(|| "no OOM message found".to_string(), |e| e.to_string());
        return Err(Error::input(e));
    }
    Ok(msgs
        .into_iter()
        .map(|m| {
            let mut ex = oom_message::explain(&m);
            // The usual advice (empty_cache, no caching), judged from the message's own figures.
            ex.findings.extend(fragscope_oomtext::message_advice(&m));
            (m, ex)
        })
        .collect())
}

/// The JSON of one message; the first message's fields are also the top level (the
/// schema's original single-message shape), and `messages` lists every message found.
#[derive(Serialize)]
struct JsonOut<'a> {
    schema: &'static str,
    #[serde(flatten)]
    first: JsonMessage<'a>,
    /// Every message in the text, in order (a log often holds several: retries, ranks).
    messages: Vec<JsonMessage<'a>>,
}

#[derive(Serialize)]
struct JsonMessage<'a> {
    message: &'a OomMessage,
    /// `live_allocated`: allocated by PyTorch minus private-pool free bytes.
    live_allocated: Option<u64>,
    /// `total − free − reserved`.
    outside_allocator: Option<u64>,
    explanation: &'a OomExplanation,
    /// The verdict is `fragmentation`.
    fragmentation_likely: bool,
    /// What "reserved but unallocated" means in this message, in words.
    reserved_unallocated_meaning: Option<String>,
}

/// The document of explained messages (at least one, as [`explain_text`] returns them).
pub fn json(explained: &[(OomMessage, OomExplanation)]) -> Result<String, Error> {
    fn one((msg, ex): &(OomMessage, OomExplanation)) -> JsonMessage<'_> {
        JsonMessage {
            message: msg,
            live_allocated: msg.live_allocated(),
            outside_allocator: msg.outside_allocator(),
            explanation: ex,
            fragmentation_likely: ex.verdict == Likely::Fragmentation,
            reserved_unallocated_meaning: meaning(msg),
        }
    }
    let Some(first) = explained.first() else { return Err(Error::input("no OOM message found")) };
    let j = JsonOut { schema: SCHEMA, first: one(first), messages: explained.iter().map(one).collect() };
    crate::to_json(&j)
}

/// What "reserved but unallocated" means in this message, in words.
pub fn meaning(m: &OomMessage) -> Option<String> {
    let u = m.reserved_unallocated?;
    let driver = &m.accelerator;
    let r = m.reserved_total.map(|r| format!(" of the {} PyTorch held", bytes(r))).unwrap_or_default();
    let req = m
        .tried_to_allocate
        .map(|s| format!(" The failed request needed {} in one piece.", bytes(s)))
        .unwrap_or_default();
    Some(format!(
        "{}{} was reserved but unallocated: memory PyTorch got from {driver} and keeps cached as free \
         blocks for reuse instead of returning it. Before raising this error PyTorch already \
         returned every completely free segment and retried, so these bytes sit in segments that \
         also hold live tensors; they help only a request that fits inside one free block.{}",
        format_size_pm(u, m.reserved_unallocated_uncertainty),
        r,
        req
    ))
}
