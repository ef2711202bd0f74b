//! `check`: a memory budget gate (for CI, pytest): limits as a user writes them
//! ([`CheckRequest`]) parsed into [`CheckLimits`], the [`CheckResult`] document, and the line
//! that names the first broken limit in a front end's words.

use fragscope_alloc::{grouped, percent};
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
    /// Whether any limit was given: a check without one tests nothing (the CLI refuses it;
    /// Python's `check()` without limits is a measurement of the peaks).
    pub fn has_limit(&self) -> bool {
        self.max_reserved.is_some()
            || self.max_allocated.is_some()
            || self.max_peak_fragmentation.is_some()
            || self.no_leaks
    }

    /// The limit of `limit` as the user wrote it, with what it was read as: `--max-reserved
    /// 40GB (40,000,000,000 bytes)`, `--max-peak-fragmentation 0.5 (50.0%)` (`5%` as is). A decimal
    /// `40GB` printed back as `37.25 GiB` reads as if fragscope had changed the budget.
    pub fn given(&self, limit: LimitKind, words: Words) -> String {
        let p = param(limit).name(words);
        let size = |s: &Option<String>| match s.as_deref() {
            Some(v) => match parse_size(v) {
                Ok(b) => format!("{p} {v} ({} bytes)", grouped(b)),
                Err(_) => format!("{p} {v}"),
            },
            None => p.to_string(),
        };
        match limit {
            LimitKind::MaxReserved => size(&self.max_reserved),
            LimitKind::MaxAllocated => size(&self.max_allocated),
            LimitKind::MaxPeakFragmentation => match self.max_peak_fragmentation.as_deref() {
                Some(v) => match parse_fraction(v) {
                    Ok(f) if !v.trim_end().ends_with('%') => format!("{p} {v} ({})", percent(f)),
                    Ok(_) => format!("{p} {v}"),
                    Err(_) => format!("{p} {v}"),
                },
                None => p.to_string(),
            },
            LimitKind::NoLeaks => p.to_string(),
        }
    }

    /// Every limit given, as [`CheckRequest::given`] writes it, joined by `, `.
    pub fn given_all(&self, words: Words) -> String {
        let mut kinds = Vec::new();
        if self.max_reserved.is_some() {
            kinds.push(LimitKind::MaxReserved);
        }
        if self.max_allocated.is_some() {
            kinds.push(LimitKind::MaxAllocated);
        }
        if self.max_peak_fragmentation.is_some() {
            kinds.push(LimitKind::MaxPeakFragmentation);
        }
        if self.no_leaks {
            kinds.push(LimitKind::NoLeaks);
        }
        kinds.into_iter().map(|k| self.given(k, words)).collect::<Vec<_>>().join(", ")
    }

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
        // A percentage, as every surface writes a fragmentation (docs/glossary.md).
        CheckValue::Ratio(r) => percent(r),
        CheckValue::Count(c) => c.to_string(),
    }
}

/// The text of one broken limit (without the `check failed: ` prefix), the limit as `req`
/// gave it and its parameter in `words`.
pub fn failure_line(f: &CheckFailure, req: &CheckRequest, words: Words) -> String {
    let p = param(f.limit).name(words);
    match f.limit {
        LimitKind::NoLeaks => {
            let n = value(&f.measured);
            let s = if n == "1" { "" } else { "s" };
            format!("{n} leak suspect{s} on device {} ({p})", f.device)
        }
        l => {
            let what = match l {
                LimitKind::MaxReserved => "peak reserved",
                LimitKind::MaxAllocated => "peak allocated",
                LimitKind::MaxPeakFragmentation | LimitKind::NoLeaks => "peak fragmentation",
            };
            format!("{what} {} on device {} exceeds {}", value(&f.measured), f.device, req.given(l, words))
        }
    }
}

/// `check failed: <first broken limit>[ (and N more: <limit> on device D, ...)]`, or `None`
/// when every limit held. The others are named (their figures are in `--json`), so that a
/// CI log says every budget that broke.
pub fn failed_line(result: &CheckResult, req: &CheckRequest, words: Words) -> Option<String> {
    let first = result.failures.first()?;
    let rest: Vec<String> =
        result.failures[1..].iter().map(|f| format!("{} on device {}", param(f.limit).name(words), f.device)).collect();
    let suffix =
        if rest.is_empty() { String::new() } else { format!(" (and {} more: {})", rest.len(), rest.join(", ")) };
    Some(format!("check failed: {}{suffix}", failure_line(first, req, words)))
}

/// The document of a check (`fragscope.check/1`).
pub fn json(result: &CheckResult) -> Result<String, Error> {
    crate::to_json(result)
}
