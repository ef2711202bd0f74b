//! The state view's deltas (`state::walk`) rebuild every keyframe from the one before it,
//! and the state at events between keyframes equals `state::state_at`'s own backward
//! walk, on every real pickle and the built-in-like example files. (The page applies the
//! same records in JavaScript: tests/browser checks it against `report --state-at`.)

use std::collections::BTreeMap;

use fragscope_diagnose::{analyze, AnalyzeOptions};
use fragscope_replay::{BState, SegRec};
use fragscope_report::state::{state_at, walk};
use fragscope_report::ReportOptions;

/// Segments (addr → size, stream, flags) and blocks (addr → size, requested, state).
#[derive(Debug, PartialEq, Default, Clone)]
struct Flat {
    segs: BTreeMap<u64, (u64, u64, u64)>,
    blocks: BTreeMap<u64, (u64, u64, u64)>,
}

fn code(s: BState) -> u64 {
    match s {
        BState::Free => 0,
        BState::Allocated => 1,
        BState::Pending => 2,
    }
}

fn flat(segs: &[SegRec]) -> Flat {
    let mut f = Flat::default();
    for s in segs {
        let flags = s.small as u64 | (s.expandable as u64) << 1 | ((s.pool != (0, 0)) as u64) << 2;
        f.segs.insert(s.addr, (s.size, s.stream, flags));
        for b in &s.blocks {
            f.blocks.insert(b.addr, (b.size, b.requested, code(b.state)));
        }
    }
    f
}

fn apply(f: &mut Flat, op: &(usize, u8, u64, u64, u64, u64)) {
    let &(_, kind, addr, size, a, b) = op;
    match kind {
        0 => assert!(f.blocks.remove(&addr).is_some(), "remove of a block absent at {addr:#x}"),
        1 => assert!(f.blocks.insert(addr, (size, a, b)).is_none(), "add over a block at {addr:#x}"),
        2 => {
            f.segs.remove(&addr).expect("remove of an absent segment");
            let inside: Vec<u64> = f.blocks.range(addr..addr + size).map(|(k, _)| *k).collect();
            for k in inside {
                f.blocks.remove(&k);
            }
        }
        3 => assert!(f.segs.insert(addr, (size, a, b)).is_none(), "add over a segment at {addr:#x}"),
        k => panic!("unknown kind {k}"),
    }
}

#[test]
fn deltas_rebuild_every_keyframe_and_match_state_at() {
    let files = fragscope_testdata::real_pickles();
    let (mut exact, mut snapped, mut checked_between) = (0, 0, 0);
    for path in &files {
        let snap = fragscope_snapshot::read_path(path).unwrap();
        let ana = analyze(&snap, &AnalyzeOptions::default());
        for d in snap.devices() {
            let w = walk(&snap, d, &ana, &ReportOptions::default());
            if w.captured.is_empty() {
                continue;
            }
            let name = format!("{} device {d}", path.display());
            assert_eq!(w.captured[0].0, w.first, "{name}: the first keyframe is the first position shown");
            if !w.exact {
                assert!(w.ops.is_empty(), "{name}: deltas only in exact mode");
                snapped += 1;
                continue;
            }
            exact += 1;
            let mut oi = 0;
            for k in 0..w.captured.len() {
                let (state, _, segs) = &w.captured[k];
                let mut cur = flat(segs);
                let next = w.captured.get(k + 1).map_or(snap.trace(d).len(), |c| c.0);
                // Apply events up to the next keyframe; half-way, compare with state_at.
                let mid = (state + next) / 2;
                for e in *state..next {
                    if e == mid && mid > *state {
                        let s = state_at(&snap, d, e).unwrap();
                        let blocks: BTreeMap<u64, (u64, u64, u64)> =
                            s.blocks.iter().map(|b| (b[0], (b[1], b[2], b[3]))).collect();
                        assert_eq!(cur.blocks, blocks, "{name}: blocks at state {e}");
                        assert_eq!(cur.segs.len(), s.segments, "{name}: segments at state {e}");
                        checked_between += 1;
                    }
                    while let Some(op) = w.ops.get(oi).filter(|o| o.0 == e) {
                        apply(&mut cur, op);
                        oi += 1;
                    }
                }
                if let Some((_, _, nsegs)) = w.captured.get(k + 1) {
                    assert_eq!(cur, flat(nsegs), "{name}: keyframe at state {next} from the one at {state}");
                }
            }
            assert_eq!(oi, w.ops.len(), "{name}: every delta applied");
        }
    }
    eprintln!("{exact} devices with per-event deltas, {snapped} with keyframes only, {checked_between} states between keyframes checked against state_at");
    if files.is_empty() {
        eprintln!("note: no real pickles; nothing checked");
    } else {
        assert!(exact > 0, "no real file was small enough for per-event deltas");
    }
}
