//! `parse_all` on a text far longer than a message (a training job's whole log, GBs):
//! it reads only the lines near the phrases a message holds, so every message must come
//! out exactly as from the message alone, wherever it lies in the log, and however many
//! lines of other output surround it.

use fragscope_oomtext::{parse, parse_all, OomMessage};
use std::path::PathBuf;

fn fixtures() -> Vec<(String, String)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/oom");
    let mut out: Vec<(String, String)> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "txt"))
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            let body = text.split_once('\n').expect("source line").1.to_string();
            (p.file_name().unwrap().to_string_lossy().into_owned(), body)
        })
        .collect();
    out.sort();
    assert!(out.len() >= 20, "the OOM fixtures are missing: {}", dir.display());
    out
}

/// Lines of a training log (no phrase of a message in them), `bytes` of them.
fn filler(bytes: usize, seed: u64) -> String {
    let mut s = String::with_capacity(bytes + 100);
    let mut k = seed;
    while s.len() < bytes {
        k = k.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        s.push_str(&format!(
            "[2026-11-27 08:{:02}:{:02}] step {} | loss {:.4} | lr 3.0e-4 | tokens/s {} | mem {:.1} GB\n",
            (k >> 20) % 60,
            (k >> 30) % 60,
            k % 100_000,
            (k >> 8) as f64 / u64::MAX as f64 * 1e3,
            (k >> 40) % 90_000,
            (k >> 12) as f64 / u64::MAX as f64 * 8e3,
        ));
    }
    s
}

#[test]
fn every_message_is_read_alike_inside_a_long_log() {
    let big = filler(9 << 20, 1);
    assert!(big.len() > 8 << 20, "the log must be longer than what is read whole");
    let mut checked = 0;
    for (name, msg) in fixtures() {
        let alone = parse_all(&msg);
        if alone.is_empty() {
            continue; // a fixture of an error that is not a message (checked elsewhere)
        }
        let cut = big.len() / 2 + name.len() * 997;
        let cut = big[..cut].rfind('\n').unwrap() + 1;
        for (place, log) in [
            ("middle", format!("{}{msg}\n{}", &big[..cut], &big[cut..])),
            ("start", format!("{msg}\n{big}")),
            ("end", format!("{big}{msg}")),
        ] {
            let got: Vec<OomMessage> = parse_all(&log);
            assert_eq!(got, alone, "{name}, message at the {place} of a {} MB log", log.len() >> 20);
            checked += 1;
        }
    }
    assert!(checked >= 60, "only {checked} placements checked");
}

#[test]
fn several_messages_far_apart_are_all_read() {
    let fx = fixtures();
    let msgs: Vec<&String> = fx.iter().map(|(_, m)| m).filter(|m| parse(m).is_ok()).take(5).collect();
    let mut log = String::new();
    let mut want = Vec::new();
    for (k, m) in msgs.iter().enumerate() {
        log.push_str(&filler(3 << 20, k as u64));
        log.push_str(m);
        log.push('\n');
        want.extend(parse_all(m));
    }
    assert!(log.len() > 8 << 20);
    assert_eq!(parse_all(&log), want);
}

#[test]
fn a_long_text_without_a_message_has_none() {
    let big = filler(9 << 20, 7);
    assert!(parse_all(&big).is_empty());
    assert!(parse(&big).is_err());
}
