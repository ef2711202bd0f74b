//! Memory budgets for CI (`fragscope check`): peak reserved, peak allocated, peak
//! fragmentation and leak suspects against limits, per device.
//!
//! Peaks and fragmentation come from [`fragscope_trace::timeline`] (for a state-only snapshot,
//! the final state), leak suspects from [`crate::leaks`] (only computed when asked).
//! Sizes are parsed by [`fragscope_replay::parse_size`], fractions by [`parse_fraction`].

use fragscope_snapshot::Snapshot;
use serde::Serialize;

use crate::leaks;
use fragscope_trace::{timelines, TimelineOptions};

/// The limits; `None` = not checked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Limits {
    pub max_reserved: Option<u64>,
    pub max_allocated: Option<u64>,
    /// 0–1, compared with `peak_fragmentation`.
    pub max_peak_fragmentation: Option<f64>,
    /// Fail when any leak suspect is found.
    pub no_leaks: bool,
}

/// A measured value: bytes (exact integer), a 0–1 ratio, or a count.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Value {
    Bytes(u64),
    Ratio(f64),
    Count(u64),
}

/// Which limit a [`Failure`] broke (`limit` in JSON: the name of its field of [`Limits`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Limit {
    MaxReserved,
    MaxAllocated,
    MaxPeakFragmentation,
    NoLeaks,
}

impl Limit {
    /// The name JSON gives it.
    pub fn as_str(self) -> &'static str {
        match self {
            Limit::MaxReserved => "max_reserved",
            Limit::MaxAllocated => "max_allocated",
            Limit::MaxPeakFragmentation => "max_peak_fragmentation",
            Limit::NoLeaks => "no_leaks",
        }
    }
}

impl std::fmt::Display for Limit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One broken limit.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Failure {
    pub limit: Limit,
    pub device: i64,
    pub measured: Value,
    /// The limit (`0` suspects for `no_leaks`).
    pub allowed: Value,
}

/// What was measured on one device.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DeviceCheck {
    pub device: i64,
    pub peak_allocated: u64,
    pub peak_reserved: u64,
    pub peak_fragmentation: Option<f64>,
    pub history_complete: bool,
    /// `null` unless leaks were checked.
    pub leak_suspects: Option<u64>,
    /// Leaks were asked for but cannot be told from this trace (one training step or none,
    /// or steps that are not a steady loop): why, and how to record one that can. `null`
    /// otherwise. `leak_suspects` is then 0 because nothing could be compared, not because
    /// nothing leaked: the gate passes, and says so.
    pub leaks_not_told: Option<String>,
}

/// The `schema` key of `check --json`.
pub const SCHEMA: &str = "fragscope.check/1";

/// Result of [`check`].
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CheckResult {
    /// [`SCHEMA`].
    pub schema: &'static str,
    pub ok: bool,
    pub limits: Limits,
    pub devices: Vec<DeviceCheck>,
    /// In order: per device (ascending), reserved, allocated, fragmentation, leaks.
    pub failures: Vec<Failure>,
}

/// Checks every device of a snapshot against the limits.
pub fn check(snap: &Snapshot, limits: &Limits) -> CheckResult {
    let mut devices = Vec::new();
    let mut failures = Vec::new();
    for tl in timelines(snap, &TimelineOptions { points: 1 }) {
        let d = tl.device;
        let (pa, pr, pf) = (tl.peak_allocated.bytes, tl.peak_reserved.bytes, tl.peak_fragmentation);
        if let Some(m) = limits.max_reserved.filter(|&m| pr > m) {
            failures.push(Failure {
                limit: Limit::MaxReserved,
                device: d,
                measured: Value::Bytes(pr),
                allowed: Value::Bytes(m),
            });
        }
        if let Some(m) = limits.max_allocated.filter(|&m| pa > m) {
            failures.push(Failure {
                limit: Limit::MaxAllocated,
                device: d,
                measured: Value::Bytes(pa),
                allowed: Value::Bytes(m),
            });
        }
        if let (Some(m), Some(f)) = (limits.max_peak_fragmentation, pf) {
            if f > m {
                failures.push(Failure {
                    limit: Limit::MaxPeakFragmentation,
                    device: d,
                    measured: Value::Ratio(f),
                    allowed: Value::Ratio(m),
                });
            }
        }
        let leaks = limits.no_leaks.then(|| leaks::leaks_device(snap, d));
        let leak_suspects = leaks.as_ref().map(|l| l.suspects.len() as u64);
        let leaks_not_told = leaks
            .filter(|l| !l.steps.can_tell)
            .map(|l| l.steps.reason.unwrap_or_else(|| "leaks cannot be told from this trace".to_string()));
        if let Some(n) = leak_suspects.filter(|&n| n > 0) {
            failures.push(Failure {
                limit: Limit::NoLeaks,
                device: d,
                measured: Value::Count(n),
                allowed: Value::Count(0),
            });
        }
        devices.push(DeviceCheck {
            device: d,
            peak_allocated: pa,
            peak_reserved: pr,
            peak_fragmentation: pf,
            history_complete: tl.history_complete,
            leak_suspects,
            leaks_not_told,
        });
    }
    CheckResult { schema: SCHEMA, ok: failures.is_empty(), limits: *limits, devices, failures }
}

/// Parses a fraction in 0–1 (`0.15`) or a percentage (`15%`).
pub fn parse_fraction(s: &str) -> Result<f64, FractionError> {
    let t = s.trim();
    let (num, scale) = match t.strip_suffix('%') {
        Some(n) => (n.trim(), 0.01),
        None => (t, 1.0),
    };
    let v: f64 = num.parse().map_err(|_| FractionError::NotANumber(s.to_string()))?;
    let v = v * scale;
    if !(0.0..=1.0).contains(&v) {
        return Err(FractionError::OutOfRange(s.to_string()));
    }
    Ok(v)
}

/// A fraction [`parse_fraction`] cannot read (the text as given).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FractionError {
    NotANumber(String),
    /// Below 0 or above 1 (100%).
    OutOfRange(String),
}

impl std::fmt::Display for FractionError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FractionError::NotANumber(s) => write!(f, "invalid fraction {s:?}: expected e.g. 0.15 or 15%"),
            FractionError::OutOfRange(s) => {
                write!(f, "invalid fraction {s:?}: must be between 0 and 1 (or 0% and 100%)")
            }
        }
    }
}

impl std::error::Error for FractionError {}

#[cfg(test)]
mod tests {
    use super::*;
    use fragscope_replay::parse_size;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("20GiB"), Ok(20 << 30));
        assert_eq!(parse_size("20GB"), Ok(20_000_000_000));
        assert_eq!(parse_size("20G"), Ok(20 << 30));
        assert_eq!(parse_size("1.5 gib"), Ok(3 << 29));
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("123"), Ok(123));
        assert_eq!(parse_size("123B"), Ok(123));
        assert_eq!(parse_size("18446744073709551615"), Ok(u64::MAX));
        for bad in ["", "GiB", "20XB", "-1GiB", "1.2.3GiB", "20 Gigs", "1e400GiB"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn fractions() {
        assert_eq!(parse_fraction("0.15"), Ok(0.15));
        assert_eq!(parse_fraction("15%"), Ok(0.15));
        assert_eq!(parse_fraction("1.5"), Err(FractionError::OutOfRange("1.5".into())));
        assert_eq!(parse_fraction("x"), Err(FractionError::NotANumber("x".into())));
        assert_eq!(parse_fraction("-0.1"), Err(FractionError::OutOfRange("-0.1".into())));
        assert_eq!(parse_fraction("x").unwrap_err().to_string(), "invalid fraction \"x\": expected e.g. 0.15 or 15%");
        assert_eq!(
            parse_fraction("150%").unwrap_err().to_string(),
            "invalid fraction \"150%\": must be between 0 and 1 (or 0% and 100%)"
        );
    }
}
