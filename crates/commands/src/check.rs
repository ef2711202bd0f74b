//! `check`: a memory budget gate (for CI, pytest): limits as a user writes them
//! ([`CheckRequest`]) parsed into [`CheckLimits`], the [`CheckResult`] document, and the line
//! that names the first broken limit in a front end's words.

use fragscope_diagnose::{parse_fraction, CheckFailure, CheckLimits, CheckResult, CheckValue, LimitKind};
use fragscope_replay::parse_size;

use crate::{Error, Param, Words};

/// The limits as a user writes them: sizes `20GiB`, `20GB`, bytes; fragmentation `0.15` or
/// `15%`.
#[derive(Debug, Default, Clone)]
pub struct CheckRequest {
    pub max_reserved: Option<String>,
    pub max_allocated: Option<String>,
    pub max_peak_fragmentation: Option<String>,
    pub no_leaks: bool,
}

impl CheckRequest {
    /// The limits, or the argument error for a malformed size or fraction.
    pub fn limits(&self) -> Result<CheckLimits, Error> {
        let size = |s: &Option<String>, p: Param| -> Result<Option<u64>, Error> {
            s.as_deref().map(|v| parse_size(v).map_err(|e| Error::invalid(p, e))).transpose()
        };
        Ok(CheckLimits {
            max_reserved: size(&self.max_reserved, Param::MaxReserved)?,
            max_allocated: size(&self.max_allocated, Param::MaxAllocated)?,
            max_peak_fragmentation: self
                .max_peak_fragmentation
                .as_deref()
                .map(|v| parse_fraction(v).map_err(|e| Error::invalid(Param::MaxPeakFragmentation, e)))
                .transpose()?,
            no_leaks: self.no_leaks,
        })
    }
}

/// The parameter a failed limit came from.
fn param(limit: LimitKind) -> Param {
    match limit {
        LimitKind::MaxReserved => Param::MaxReserved,
        LimitKind::MaxAllocated => Param::MaxAllocated,
        LimitKind::MaxPeakFragmentation => Param::MaxPeakFragmentation,
        LimitKind::NoLeaks => Param::NoLeaks,
    }
}

fn value(v: &CheckValue) -> String {
    match *v {
        CheckValue::Bytes(b) => fragscope_alloc::format_size(b),
        CheckValue::Ratio(r) => format!("{r:.4}"),
        CheckValue::Count(c) => c.to_string(),
    }
}

/// The text of one broken limit (without the `check failed: ` prefix), its parameter in
/// `words`.
pub fn failure_line(f: &CheckFailure, words: Words) -> String {
    let p = param(f.limit).name(words);
    match f.limit {
        LimitKind::NoLeaks => format!("{} leak suspect(s) on device {} ({p})", value(&f.measured), f.device),
        l => {
            let what = match l {
                LimitKind::MaxReserved => "peak reserved",
                LimitKind::MaxAllocated => "peak allocated",
                LimitKind::MaxPeakFragmentation | LimitKind::NoLeaks => "peak fragmentation",
            };
            format!("{what} {} on device {} exceeds {p} {}", value(&f.measured), f.device, value(&f.allowed))
        }
    }
}

/// `check failed: <first broken limit>[ (and N more: <limit> on device D, ...)]`, or `None`
/// when every limit held. The others are named (their figures are in `--json`), so that a
/// CI log says every budget that broke.
pub fn failed_line(result: &CheckResult, words: Words) -> Option<String> {
    let first = result.failures.first()?;
    let rest: Vec<String> =
        result.failures[1..].iter().map(|f| format!("{} on device {}", param(f.limit).name(words), f.device)).collect();
    let suffix =
        if rest.is_empty() { String::new() } else { format!(" (and {} more: {})", rest.len(), rest.join(", ")) };
    Some(format!("check failed: {}{suffix}", failure_line(first, words)))
}

/// The document of a check (`fragscope.check/1`).
pub fn json(result: &CheckResult) -> Result<String, Error> {
    crate::to_json(result)
}
