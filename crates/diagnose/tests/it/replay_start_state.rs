//! Issue 21 item 1: what-if replays of an expandable-segments trace that begins mid-run
//! start from the memory live before the trace, and alternatives that do not start from
//! the same state are never compared.
//!
//! The real expandable trace of the corpus (codeloc, 3 GPUs) was recorded from the start;
//! its second half (the first half of every device's entries dropped, as PyTorch's ring
//! buffer drops the oldest entries) begins with 2.9 / 52.8 / 9.6 GiB live. Before the fix
//! the caching replays could not seed that state on an unlimited device (each expandable
//! reservation is 9/8 of the device, 2^50 bytes there, so two recorded reservations
//! overlapped) and silently started empty, while the no-caching replay kept the tensors:
//! `analyze --what-if` said no caching "would raise the peak from 5.51 to 7.88 GiB" on
//! device 0, where on the whole trace it lowers it from 7.96.

use fragscope_diagnose::{advice_headline, advice_trials, from_trials, trials_refusal, Recommendations};
use fragscope_replay::{backward_walk, recorded_config, simulate, RecordedState, SplitRules, StartState};
use fragscope_snapshot::Snapshot;

const CODELOC: &str = "codeloc-qwen3-gnn-expandable-oom-3gpu.pickle";

fn second_half(snap: &Snapshot) -> Snapshot {
    let mut s = snap.clone();
    for t in &mut s.device_traces {
        let cut = t.len() / 2;
        t.drain(..cut);
    }
    s
}

/// Bytes reserved at the trace's first entry, by the backward walk.
fn reserved_at_start(snap: &Snapshot, device: i64) -> u64 {
    let cfg = recorded_config(snap);
    let round = |n: u64| fragscope_alloc::rounding::round_size(n, &cfg);
    let rules = SplitRules {
        round: &round,
        max_split_size: cfg.max_split_size,
        max_non_split_rounding: cfg.max_non_split_rounding,
    };
    let home = |e: &fragscope_snapshot::TraceEvent| fragscope_replay::home_of(snap, e);
    let fin = RecordedState::from_snapshot(snap, device);
    backward_walk(fin, snap.trace(device), &home, &rules).expect("the trace is consistent").state.reserved()
}

#[test]
fn expandable_state_before_the_trace_is_seeded_and_the_advice_compares_like_the_whole_trace() {
    let Some(path) = fragscope_testdata::real_file(CODELOC) else { return };
    let full = fragscope_snapshot::read_path(&path).unwrap();
    let half = second_half(&full);
    for device in [0, 2] {
        let held = reserved_at_start(&half, device);
        assert!(held > 1 << 30, "device {device}: the second half begins with memory reserved ({held} B)");
        let w = simulate(&half, device, recorded_config(&half), None);
        assert_eq!(w.start_state, StartState::Rebuilt, "device {device}: {:?}", w.notes);
        assert!(!w.notes.iter().any(|n| n.contains("could not be seeded")), "device {device}: {:?}", w.notes);
        assert!(
            w.peak_reserved >= held,
            "device {device}: peak {} below the {held} B held at the start",
            w.peak_reserved
        );
        // The usual advice on the second half compares as on the whole trace.
        let cfg = recorded_config(&half);
        let (adv_half, _) = advice_trials(&half, device, &cfg, None);
        let (adv_full, _) = advice_trials(&full, device, &cfg, None);
        let base_half = simulate(&half, device, cfg.clone(), None);
        let base_full = simulate(&full, device, cfg.clone(), None);
        let nc = |v: &[fragscope_diagnose::Trial]| {
            v.iter().find(|t| t.setting.contains("NO_CUDA_MEMORY_CACHING")).expect("no caching replayed").clone()
        };
        let (h, f) = (nc(&adv_half), nc(&adv_full));
        assert_eq!(h.start_state, StartState::Rebuilt);
        assert_eq!(
            h.peak_reserved_bytes < base_half.peak_reserved,
            f.peak_reserved_bytes < base_full.peak_reserved,
            "device {device}: no caching lowers the peak on the whole trace ({} < {}), so on its second half too \
             ({} vs {})",
            f.peak_reserved_bytes,
            base_full.peak_reserved,
            h.peak_reserved_bytes,
            base_half.peak_reserved
        );
    }
}

/// A run that did not start from the rebuilt state is not compared: the settings are not
/// ranked and the advice sentence says why, instead of a figure.
#[test]
fn runs_that_start_from_another_state_are_not_compared() {
    let Some(path) = fragscope_testdata::real_file(CODELOC) else { return };
    let half = second_half(&fragscope_snapshot::read_path(&path).unwrap());
    let cfg = recorded_config(&half);
    let (advice, _) = advice_trials(&half, 0, &cfg, None);
    let base = advice.iter().find(|t| t.setting.contains("NO_CUDA")).unwrap().clone();
    let mut base = fragscope_diagnose::Trial { setting: "recorded".into(), ..base };
    assert_eq!(trials_refusal(&base, &advice), None, "all runs rebuilt: comparable");
    let headline = advice_headline(&base, &advice).unwrap();
    assert!(headline.starts_with("Replayed on this run"), "{headline}");
    base.start_state = StartState::NotSeeded;
    base.notes.push("the state before the trace could not be seeded (test); started empty".into());
    let why = trials_refusal(&base, &advice).expect("a run started empty");
    assert!(why.contains("could not be seeded") && why.contains("recorded"), "{why}");
    let headline = advice_headline(&base, &advice).unwrap();
    assert!(headline.contains("not compared") && headline.contains("could not be seeded"), "{headline}");
    let mut r = Recommendations {
        device: 0,
        measured: false,
        note: None,
        era: fragscope_diagnose::infer_era(&half),
        capacity_bytes: None,
        baseline: None,
        recommended: Vec::new(),
        tried: Vec::new(),
        advice: Vec::new(),
        advice_notes: Vec::new(),
        ranked: Vec::new(),
    };
    from_trials(&mut r, base, advice, None);
    assert!(r.recommended.is_empty());
    assert!(r.note.as_deref().is_some_and(|n| n.starts_with("settings not compared")), "{:?}", r.note);
}
