//! Time windows (`--window`): a snapshot cut to a window equals the snapshot that would
//! have been dumped at the window's end.
//!
//! The expected value is built independently of the backward walk: fragscope's
//! allocator model records a workload ([`Recorder`]) and is dumped after N steps; the
//! same workload run longer and cut to the first N steps' entries must give the same
//! segments, blocks, frames and figures (`summary`, `analyze`). On real traces that the
//! allocator model replays exactly, the forward replay of the window (from the state the
//! walk gives at its start) must end exactly in the cut's segments.

use fragscope_diagnose::{analyze, cut_window, AnalyzeOptions, WindowBy, WindowEndState, WindowError, WindowSpec};
use fragscope_replay::{verify, Recorder, ReplayOptions};
use fragscope_snapshot::{resolve_stack, Snapshot};
use fragscope_trace::summarize;

const MIB: u64 = 1 << 20;

/// A small training-like workload: weights, per-step activations of varying sizes on
/// two streams, a kept loss (a leak), and `empty_cache` every third step. Stops after
/// `steps` steps; deterministic.
fn workload(conf: &str, steps: usize) -> Snapshot {
    let mut r = Recorder::new(conf, 8 << 30, 1_700_000_000_000_000, 13).unwrap();
    let s_w = r.stack(&[("train.py", 10, "<module>"), ("model.py", 5, "__init__")]);
    let s_act = r.stack(&[("train.py", 20, "step"), ("model.py", 30, "forward")]);
    let s_tmp = r.stack(&[("train.py", 20, "step"), ("functional.py", 99, "gelu")]);
    let s_loss = r.stack(&[("train.py", 21, "step"), ("train.py", 40, "loss")]);
    let _w: Vec<u64> = (0..6).map(|i| r.malloc((i + 1) * 3 * MIB + 1000, 0, s_w).unwrap()).collect();
    let mut kept = Vec::new();
    for step in 0..steps {
        r.annotate(&format!("ProfilerStep#{step}"), "START");
        let scale = [3u64, 7, 2, 5, 4][step % 5];
        let mut acts = Vec::new();
        for k in 0..8u64 {
            acts.push(r.malloc(scale * (k + 1) * MIB / 2 + 512 * k, 0, s_act).unwrap());
            let t = r.malloc(scale * 300_000 + 4096 * k, (k % 2) * 7, s_tmp).unwrap();
            r.free(t).unwrap();
            acts.push(r.malloc(1000 + 200 * k, 0, s_tmp).unwrap());
        }
        kept.push(r.malloc(4 + step as u64, 0, s_loss).unwrap());
        for a in acts.into_iter().rev() {
            r.free(a).unwrap();
        }
        if step % 3 == 2 {
            r.empty_cache();
        }
        r.annotate(&format!("ProfilerStep#{step}"), "END");
    }
    r.finish()
}

/// Segments and blocks as the allocator holds them, stacks resolved: what a snapshot
/// says about memory (a free block's `requested_size` is stale by definition).
fn state_of(s: &Snapshot) -> Vec<String> {
    let t = &s.frames;
    let mut v = Vec::new();
    for seg in &s.segments {
        v.push(format!(
            "seg {} {:#x} {} alloc={} active={} req={:?} stream={} {:?} pool={:?} exp={:?} {:?}",
            seg.device,
            seg.address,
            seg.total_size,
            seg.allocated_size,
            seg.active_size,
            seg.requested_size,
            seg.stream,
            seg.segment_type,
            seg.segment_pool_id,
            seg.is_expandable,
            resolve_stack(t, seg.stack)
        ));
        for b in &seg.blocks {
            let req = if b.state.is_active() { b.requested_size } else { None };
            v.push(format!(
                "  block {:#x} {} {:?} req={:?} {:?}",
                b.address,
                b.size,
                b.state,
                req,
                resolve_stack(t, b.stack)
            ));
        }
    }
    v
}

fn spec(s: &str) -> WindowSpec {
    WindowSpec::parse(s).unwrap()
}

fn json<T: serde::Serialize>(v: &T) -> serde_json::Value {
    serde_json::to_value(v).unwrap()
}

#[test]
fn a_longer_recording_cut_at_n_steps_equals_the_recording_dumped_there() {
    for conf in ["", "max_split_size_mb:20", "expandable_segments:True"] {
        let mut short = workload(conf, 7);
        let long = workload(conf, 16);
        let n = short.device_traces[0].len();
        // The window ends where the next entry begins: the annotations written by then
        // (the next step's START too) are the dump's.
        let t_next = long.device_traces[0][n].time_us;
        short.external_annotations =
            Some(long.external_annotations.iter().flatten().filter(|a| a.time_us < t_next).cloned().collect());
        assert!(long.device_traces[0].len() > n + 100, "{conf}: the longer run goes on");
        assert_eq!(&long.device_traces[0][..n], &short.device_traces[0][..], "{conf}: same run");

        let (c, info) = cut_window(&long, &spec(&format!("0..{n}"))).unwrap_or_else(|e| panic!("{conf}: {e}"));
        assert_eq!(info.devices[0].end_state, WindowEndState::BackwardWalk);
        assert_eq!(info.devices[0].undone_entries, long.device_traces[0].len() - n);
        assert_eq!(c.device_traces[0], short.device_traces[0], "{conf}");
        let (want, got) = (state_of(&short), state_of(&c));
        assert!(want.len() > 3, "{conf}: the run holds segments at its end");
        assert_eq!(got, want, "{conf}: state at the window's end");
        assert_eq!(c.external_annotations, short.external_annotations, "{conf}");
        // Every figure the commands print.
        assert_eq!(json(&summarize(&c)), json(&summarize(&short)), "{conf}: summary");
        let o = AnalyzeOptions::default();
        assert_eq!(json(&analyze(&c, &o)), json(&analyze(&short, &o)), "{conf}: analyze");

        // A window that starts later: the same as that window of the short recording
        // (whose end is the recorded state itself).
        let s = n / 3;
        let w = spec(&format!("{s}..{n}"));
        let (c2, _) = cut_window(&long, &w).unwrap();
        let (s2, i2) = cut_window(&short, &w).unwrap();
        assert_eq!(i2.devices[0].end_state, WindowEndState::Recorded);
        assert_eq!(c2.device_traces, s2.device_traces);
        assert_eq!(state_of(&c2), state_of(&s2), "{conf}");
        assert_eq!(json(&summarize(&c2)), json(&summarize(&s2)), "{conf}: summary of {s}..{n}");

        // The same window by time: from the first entry to the first entry after it.
        let t0 = long.device_traces[0][0].time_us;
        let t_end = long.device_traces[0][n].time_us - t0;
        let (c3, i3) = cut_window(&long, &spec(&format!("..{t_end}us"))).unwrap();
        assert_eq!((i3.by, i3.devices[0].start_index, i3.devices[0].end_index), (WindowBy::Time, 0, n));
        assert_eq!(state_of(&c3), want, "{conf}: by time");
    }
}

#[test]
fn bad_windows_are_refused_in_one_line() {
    for bad in ["", "5", "10..5", "1s..200", "x..y", "1h..2h", "-1s..2s"] {
        let e = WindowSpec::parse(bad).unwrap_err().to_string();
        assert!(!e.contains('\n') && e.contains("window"), "{bad}: {e}");
    }
    let snap = workload("", 2);
    let n = snap.device_traces[0].len();
    let e = cut_window(&snap, &spec(&format!("{}..{}", n + 10, n + 20))).map(|_| ()).unwrap_err();
    assert!(matches!(&e, WindowError::Empty { traces, .. } if traces[0].entries == n), "{e:?}");
    assert!(e.to_string().contains("holds no trace entry"), "{e}");
    let mut untimed = snap.clone();
    untimed.device_traces[0][3].time_us = fragscope_snapshot::NO_TIME;
    let e = cut_window(&untimed, &spec("1s..2s")).map(|_| ()).unwrap_err();
    assert_eq!(e, WindowError::Untimed);
    assert!(e.to_string().contains("by entry index"));
}

#[test]
fn a_state_that_cannot_be_rebuilt_is_an_error_not_a_guess() {
    let mut snap = workload("", 6);
    let n = snap.device_traces[0].len();
    // The final state loses the live block allocated last (a kept loss): undoing its
    // alloc finds no allocated block there.
    let live: Vec<u64> =
        snap.segments.iter().flat_map(|s| &s.blocks).filter(|b| b.state.is_active()).map(|b| b.address).collect();
    let (k, last) = snap.device_traces[0]
        .iter()
        .enumerate()
        .rev()
        .find(|(_, e)| e.action == fragscope_snapshot::Action::Alloc && live.contains(&e.addr))
        .map(|(k, e)| (k, e.addr))
        .unwrap();
    assert!(k > n / 2, "allocated after the window");
    let b = snap.segments.iter_mut().flat_map(|s| &mut s.blocks).find(|b| b.address == last).unwrap();
    b.state = fragscope_snapshot::BlockState::Inactive;
    // A window ending before that block's allocation would need an undo of it.
    let e = cut_window(&snap, &spec(&format!("0..{}", n / 2))).map(|_| ()).unwrap_err();
    assert!(matches!(&e, WindowError::EndState { entry, error, .. } if *entry == n / 2 && error.entry == k), "{e:?}");
    assert!(e.to_string().contains("cannot rebuild the allocator state"), "{e}");
    // A window reaching the end keeps the recorded state and needs no walk.
    assert!(cut_window(&snap, &spec(&format!("{}..", n / 2))).is_ok());
}

/// Real traces that the allocator model replays exactly (tests/replay_real.rs): the
/// forward replay of a window, from the state the walk gives at the window's start,
/// reproduces every entry of the window and ends in the cut's segments.
#[test]
fn windows_of_real_traces_replay_exactly_into_their_cut_state() {
    let files = [
        "effdl-aphelack-customfsdp-4gpu.pickle",
        "decomfl-opt-zeroth-order-windows.pickle",
        "effdl-course-liger-ce.pickle",
        "sqattn-qwen2-compress-segment-churn.pickle",
        "octree-nca-inference-huge-allocs.pickle",
        "eor-cnn-counterfactuals.pickle",
    ];
    let mut ran = 0;
    for name in files {
        let Some(path) = fragscope_testdata::real_file(name) else { continue };
        let snap = fragscope_snapshot::read_path(&path).unwrap();
        let n = snap.device_traces[0].len();
        for (a, b) in [(n / 4, 3 * n / 4), (0, n / 2), (n / 2, n)] {
            let (c, info) =
                cut_window(&snap, &spec(&format!("{a}..{b}"))).unwrap_or_else(|e| panic!("{name} {a}..{b}: {e}"));
            assert_eq!(c.device_traces[0].len(), b - a);
            assert_eq!(
                info.devices[0].end_state,
                if b == n { WindowEndState::Recorded } else { WindowEndState::BackwardWalk }
            );
            let r = verify(&c, 0, &ReplayOptions::default());
            assert!(r.undecidable.is_none(), "{name} {a}..{b}: {:?}", r.undecidable);
            assert_eq!(r.allocs_matched, r.allocs, "{name} {a}..{b}: {:?}", r.first_divergence);
            assert_eq!(r.segment_events_matched, r.segment_events, "{name} {a}..{b}");
            assert_eq!(r.final_state_matches, Some(true), "{name} {a}..{b}");
            // Cutting twice is cutting once.
            let (cc, _) =
                cut_window(&cut_window(&snap, &spec(&format!("0..{b}"))).unwrap().0, &spec(&format!("{a}..{b}")))
                    .unwrap();
            assert_eq!(state_of(&cc), state_of(&c), "{name} {a}..{b}");
            // The summary counts the window's entries.
            let s = json(&summarize(&c));
            assert_eq!(s["devices"][0]["trace_events"], serde_json::json!(b - a), "{name}");
        }
        ran += 1;
    }
    assert!(ran >= 3, "at least the in-repository traces ({ran})");
}
