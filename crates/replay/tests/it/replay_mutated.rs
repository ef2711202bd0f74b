//! A real snapshot whose final state and trace disagree must give an error naming the
//! trace entry, never a panic (issue 12: `replay --verify` panicked in the backward walk on
//! an alloc inside a segment whose blocks did not cover that address).

use fragscope_replay::{verify, ReplayOptions};
use fragscope_snapshot::{Action, Snapshot};

fn decomfl() -> Option<Snapshot> {
    let p = fragscope_testdata::real_file("decomfl-opt-zeroth-order-windows.pickle")?;
    Some(fragscope_snapshot::read_path(&p).unwrap())
}

/// The last trace entry that touches a block of a final segment, and that segment's index.
fn last_block_event(s: &Snapshot) -> (usize, usize) {
    let t = s.trace(0);
    for (i, e) in t.iter().enumerate().rev() {
        if !matches!(e.action, Action::Alloc | Action::FreeRequested | Action::FreeCompleted) {
            continue;
        }
        if let Some(k) =
            s.segments.iter().position(|g| g.device == 0 && g.address <= e.addr && e.addr < g.address + g.total_size)
        {
            return (i, k);
        }
    }
    panic!("no trace entry inside a final segment");
}

#[test]
fn a_gap_in_a_segments_blocks_is_an_error_at_the_entry() {
    let Some(mut s) = decomfl() else { return };
    let clean = verify(&s, 0, &ReplayOptions::default());
    assert!(clean.undecidable.is_none(), "{:?}", clean.undecidable);
    let (i, k) = last_block_event(&s);
    let addr = s.trace(0)[i].addr;
    let seg = &mut s.segments[k];
    let b = seg.blocks.iter().position(|b| b.address <= addr && addr < b.address + b.size).unwrap();
    seg.blocks.remove(b);
    let r = verify(&s, 0, &ReplayOptions::default());
    let why = r.undecidable.expect("a gap in the final blocks must make the replay undecidable");
    assert!(why.contains(&format!("event {i} ")), "{why}");
    assert!(why.contains("no block"), "{why}");
}

#[test]
fn a_changed_block_size_or_trace_address_is_reported_not_a_panic() {
    let Some(orig) = decomfl() else { return };
    let (i, k) = last_block_event(&orig);
    // A block a few bytes bigger (its neighbour overlapped), and an entry moved by one block.
    let mut a = orig.clone();
    let addr = orig.trace(0)[i].addr;
    let b = a.segments[k].blocks.iter().position(|b| b.address <= addr && addr < b.address + b.size).unwrap();
    a.segments[k].blocks[b].size += 512;
    let mut t = orig.clone();
    t.device_traces[0][i].addr += 512;
    for s in [a, t] {
        let r = verify(&s, 0, &ReplayOptions::default());
        // Either the walk names the entry, or the replay diverges from the recording.
        assert!(r.undecidable.is_some() || r.divergences > 0 || r.final_state_matches == Some(false), "{r:?}");
        if let Some(why) = &r.undecidable {
            assert!(why.starts_with("undecidable at event "), "{why}");
        }
    }
}
