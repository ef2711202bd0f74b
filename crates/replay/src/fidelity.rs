//! The fidelity table: how well the allocator model reproduces each recorded trace.

use std::fmt::Write as _;

use fragscope_snapshot::{ReadError, Snapshot};

use super::driver::replayable_devices;
use super::{verify, ReplayOptions, VerifyReport};

fn pct(a: u64, b: u64) -> String {
    if b == 0 {
        "—".to_string()
    } else {
        format!("{a}/{b} ({:.1}%)", a as f64 * 100.0 / b as f64)
    }
}

/// One line of result for a device.
pub fn verdict(r: &VerifyReport) -> String {
    if let Some(u) = &r.undecidable {
        return u.clone();
    }
    match &r.first_divergence {
        None => "exact".to_string(),
        Some(d) => format!("{} divergence(s), first at event {}: {}", r.divergences, d.index, d.model),
    }
}

/// Markdown table over `files` (`(name, snapshot or read error)`).
pub fn fidelity_table(files: &[(String, Result<Snapshot, ReadError>)]) -> String {
    let mut s = String::new();
    s.push_str("| file | device | events | allocs at the recorded address | segment events matched | OOMs reproduced | final state | result |\n");
    s.push_str("|---|---:|---:|---:|---:|---:|---|---|\n");
    for (name, snap) in files {
        let snap = match snap {
            Ok(s) => s,
            Err(e) => {
                let _ = writeln!(s, "| {name} | — | — | — | — | — | — | not replayable: {e} |");
                continue;
            }
        };
        let devs = replayable_devices(snap);
        if devs.is_empty() {
            let n: usize = snap.device_traces.iter().map(Vec::len).sum();
            let _ = writeln!(s, "| {name} | — | {n} | — | — | — | — | no allocation trace (state only) |");
            continue;
        }
        for d in devs {
            let r = verify(snap, d, &ReplayOptions::default());
            let fin = match r.final_state_matches {
                Some(true) => "equal",
                Some(false) => "differs",
                None => "—",
            };
            let _ = writeln!(
                s,
                "| {name} | {d} | {} | {} | {} | {} | {fin} | {} |",
                r.events,
                pct(r.allocs_matched, r.allocs),
                pct(r.segment_events_matched, r.segment_events),
                pct(r.ooms_matched, r.ooms),
                verdict(&r).replace('|', "\\|"),
            );
        }
    }
    s
}
