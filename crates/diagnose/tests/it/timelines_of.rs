//! `analyze_with_timelines` against `analyze` on every real pickle: a caller's timelines
//! give the same analysis whether the caller tells the walk's lives as soon as they are
//! made (the roles then start beside the timeline's table), keeps them in the timeline
//! without telling, or gives timelines without lives (the analysis replays the trace for
//! them).

use fragscope_diagnose::{analyze, analyze_with_timelines, AnalyzeOptions};
use fragscope_trace::{timeline, timeline_with_lives, timeline_with_lives_then, OnLives, TimelineOptions};

#[test]
fn every_way_of_giving_the_timelines_gives_analyzes_analysis() {
    let opts = AnalyzeOptions::default();
    let topts = TimelineOptions { points: opts.points.max(1) };
    let mut devices = 0;
    for p in fragscope_testdata::real_pickles() {
        let snap = fragscope_snapshot::read_path(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        let want = serde_json::to_string(&analyze(&snap, &opts)).unwrap();
        let told = |d: i64, on: OnLives| timeline_with_lives_then(&snap, d, &topts, on);
        let kept = |d: i64, _: OnLives| timeline_with_lives(&snap, d, &topts);
        let without = |d: i64, _: OnLives| timeline(&snap, d, &topts);
        for (how, got) in [
            ("told", analyze_with_timelines(&snap, &opts, &told, None)),
            ("kept, not told", analyze_with_timelines(&snap, &opts, &kept, None)),
            ("without lives", analyze_with_timelines(&snap, &opts, &without, None)),
        ] {
            assert_eq!(serde_json::to_string(&got).unwrap(), want, "{}: timelines {how}", p.display());
        }
        devices += snap.devices().len();
    }
    assert!(devices >= fragscope_testdata::min_count(30, 7), "{devices} devices analysed");
}
