//! `analyze_with_timelines` against `analyze` on every real pickle: a caller's timelines
//! give the same analysis whether the caller tells the walk's lives as soon as they are
//! made (the roles then start beside the timeline's table), keeps them in the timeline
//! without telling, or gives timelines without lives (the analysis replays the trace for
//! them). The roles a caller is told as they are made ([`fragscope_diagnose::OnRoles`])
//! are the analysis' own.

use std::sync::{Arc, Mutex};

use fragscope_diagnose::{analyze, analyze_with_timelines, AnalyzeOptions, OnRoles};
use fragscope_trace::{
    timeline, timeline_with_lives, timeline_with_lives_then, BlockLives, OnLives, Roles, TimelineOptions,
};

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
        // What the caller is told of the roles, by device, in the order it was told.
        type Told = Vec<(i64, usize, Roles)>;
        let roles_told: Mutex<Told> = Mutex::new(Vec::new());
        let on_roles = |d: i64, lives: &Arc<BlockLives>, r: &Roles| {
            roles_told.lock().unwrap().push((d, lives.traced.len(), r.clone()));
        };
        let on_roles: OnRoles = &on_roles;
        let ways: [(&str, fragscope_diagnose::TimelineOf, Option<OnRoles>); 3] = [
            ("told", &told, Some(on_roles)),
            ("kept, not told", &kept, Some(on_roles)),
            ("without lives", &without, None),
        ];
        for (how, timelines, hook) in ways {
            let got = analyze_with_timelines(&snap, &opts, timelines, None, hook);
            assert_eq!(serde_json::to_string(&got).unwrap(), want, "{}: timelines {how}", p.display());
            // Each device's block roles were told once, as the analysis returns them,
            // with lives of as many traced blocks as they have roles.
            let told = std::mem::take(&mut *roles_told.lock().unwrap());
            if hook.is_none() {
                assert!(told.is_empty(), "{}: told without a caller's hook", p.display());
                continue;
            }
            let mut devs: Vec<i64> = told.iter().map(|t| t.0).collect();
            devs.dedup();
            assert_eq!(devs.len(), told.len(), "{}: a device told twice ({how})", p.display());
            assert_eq!(told.len(), got.devices.len(), "{}: devices told ({how})", p.display());
            for (d, traced, r) in &told {
                let a = got.devices.iter().find(|a| a.device == *d).expect("a told device is analysed");
                assert_eq!(*traced, r.traced.len(), "{}: cuda:{d} lives and roles ({how})", p.display());
                assert_eq!(r.traced, a.block_roles.traced, "{}: cuda:{d} traced roles ({how})", p.display());
                assert_eq!(r.seeded, a.block_roles.seeded, "{}: cuda:{d} seeded roles ({how})", p.display());
                assert_eq!(r.from_state, a.block_roles.from_state, "{}: cuda:{d} from_state ({how})", p.display());
            }
        }
        devices += snap.devices().len();
    }
    assert!(devices >= fragscope_testdata::min_count(30, 7), "{devices} devices analysed");
}
