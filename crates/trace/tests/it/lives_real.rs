//! The block lives kept by the timeline walk ([`fragscope_trace::BlockLives`]) on the real
//! snapshots: the same as a walk of their own, and the live sets read from them the same
//! as a replay of the trace to each position gives.

use fragscope_testdata::{min_count, real_pickles};
use fragscope_trace::{live_sets_at, timeline, timeline_with_lives, BlockLives, TimelineOptions};

#[test]
fn lives_from_the_timeline_walk_match_a_replay() {
    let mut devices_with_trace = 0;
    let mut lives_checked = 0usize;
    for p in real_pickles() {
        let name = p.file_name().unwrap().to_string_lossy().to_string();
        let snap = fragscope_snapshot::read_path(&p).unwrap_or_else(|e| panic!("{name}: {e}"));
        for d in snap.devices() {
            let opts = TimelineOptions::default();
            let mut with = timeline_with_lives(&snap, d, &opts);
            let lives = with.lives.take().expect("timeline_with_lives keeps the lives");
            // Keeping the lives changes nothing else.
            let plain = timeline(&snap, d, &opts);
            assert!(plain.lives.is_none());
            assert_eq!(
                serde_json::to_value(&with).unwrap(),
                serde_json::to_value(&plain).unwrap(),
                "{name} device {d}"
            );
            assert_eq!(*lives, BlockLives::replay(&snap, d), "{name} device {d}");
            let n = snap.trace(d).len();
            if n > 0 {
                devices_with_trace += 1;
            }
            lives_checked += lives.traced.len() + lives.seeded.len();
            let mut at: Vec<Option<usize>> =
                vec![None, plain.peak_allocated.event_index, plain.peak_reserved.event_index];
            at.extend((0..8).map(|k| Some(k * n / 8)));
            at.push(n.checked_sub(1));
            let from_lives = lives.live_sets_at(&snap, &at);
            let replayed = live_sets_at(&snap, d, &at);
            assert_eq!(from_lives, replayed, "{name} device {d}");
        }
    }
    assert!(devices_with_trace >= min_count(25, 6), "only {devices_with_trace} devices with a trace");
    assert!(lives_checked > 0);
}

/// `export`'s roles ([`fragscope_trace::device_block_roles`]: one walk that indexes the
/// lives as it goes, as `summary`'s) are those of the lives of a walk of their own
/// classified from scratch ([`fragscope_trace::classify_roles`]), block for block.
#[test]
fn roles_from_the_one_walk_match_a_classification_from_scratch() {
    let mut devices_with_trace = 0;
    let mut blocks_checked = 0usize;
    for p in real_pickles() {
        let name = p.file_name().unwrap().to_string_lossy().to_string();
        let snap = fragscope_snapshot::read_path(&p).unwrap_or_else(|e| panic!("{name}: {e}"));
        for d in snap.devices() {
            if snap.trace(d).is_empty() {
                continue;
            }
            devices_with_trace += 1;
            let (lives, roles) = fragscope_trace::device_block_roles(&snap, d);
            let own = BlockLives::replay(&snap, d);
            assert_eq!(lives, own, "{name} device {d}");
            let want = fragscope_trace::classify_roles(&snap, &own, &fragscope_trace::steps(&snap, d));
            assert_eq!(roles.traced, want.traced, "{name} device {d}");
            assert_eq!(roles.seeded, want.seeded, "{name} device {d}");
            assert_eq!(roles.from_state, want.from_state, "{name} device {d}");
            assert_eq!(roles.cannot_tell, want.cannot_tell, "{name} device {d}");
            assert_eq!(format!("{:?}", roles.model_state), format!("{:?}", want.model_state), "{name} device {d}");
            blocks_checked += roles.traced.len() + roles.seeded.len();
        }
    }
    assert!(devices_with_trace >= min_count(25, 6), "only {devices_with_trace} devices with a trace");
    assert!(blocks_checked > 0);
}

/// The roles from what [`fragscope_trace::roles_prep`] found beside the walk (the steps,
/// their stacks' evidence and rule 8's passes: `analyze`'s path) are the roles found from
/// the steps alone ([`fragscope_trace::device_roles_from`]), with the index of the lives
/// the walk made and without it, on every real snapshot.
#[test]
fn roles_from_the_prepared_steps_are_the_roles_from_the_steps() {
    use fragscope_trace::{device_roles_from, device_roles_prepared, roles_prep, timeline_with_lives_then};
    let mut devices = 0;
    for p in real_pickles() {
        let name = p.file_name().unwrap().to_string_lossy().to_string();
        let snap = fragscope_snapshot::read_path(&p).unwrap_or_else(|e| panic!("{name}: {e}"));
        for d in snap.devices().into_iter().filter(|&d| !snap.trace(d).is_empty()) {
            let mut told = None;
            let tl = timeline_with_lives_then(&snap, d, &TimelineOptions::default(), &mut |l, ix| {
                told = Some((std::sync::Arc::clone(l), ix));
            });
            let (lives, mut index) = told.expect("the walk tells its lives");
            assert!(tl.lives.is_some());
            let (want, want_roles) = device_roles_from(&snap, &lives, &fragscope_trace::steps(&snap, d));
            for with_index in [true, false] {
                let mut prep = roles_prep(&snap, d);
                let ix = if with_index { index.take() } else { None };
                let (got, got_roles) = device_roles_prepared(&snap, &lives, &mut prep, ix);
                assert_eq!(
                    serde_json::to_value(&got).unwrap(),
                    serde_json::to_value(&want).unwrap(),
                    "{name} cuda:{d}"
                );
                assert_eq!(got_roles.traced, want_roles.traced, "{name} cuda:{d}");
                assert_eq!(got_roles.seeded, want_roles.seeded, "{name} cuda:{d}");
            }
            devices += 1;
        }
    }
    assert!(devices >= min_count(25, 6), "{devices} devices with a trace");
}
