//! `replay --config expandable_segments:True` on a recording begun warm (cut after its first
//! step, made under the default settings): the run starts from the cache those settings
//! built, non-expandable segments split by live tensors. PyTorch's fallback before an OOM
//! (`release_cached_blocks`, spec §3.7, §5.2) returns only whole free segments, so their
//! free pieces cannot hold a large request and new pages are mapped: the replay's OOM below
//! the capacity is what PyTorch would do in a process that switched the setting on holding
//! that cache. A run with the setting from its start builds its own cache (the warm cut of
//! the same run replayed under the setting fits the same capacity): the output must say
//! what held the memory and that the recording cannot tell that run's fit.

use std::path::{Path, PathBuf};
use std::process::Command;

use fragscope_replay::{recorded_config, simulate_with, SimOptions};
use serde_json::Value;

/// H200 bf16 batch 8 on 5.24 GB: the warm cut's peak under its recorded settings is
/// 5,238,685,696 B (it fits), the same run under `expandable_segments:True` from its
/// start peaks at 5,207,228,416 B.
const CAPACITY: u64 = 5_240_000_000;

fn warm(snap: &fragscope_snapshot::Snapshot, out: &Path) {
    let steps = fragscope_trace::steps(snap, 0);
    let start = steps.steps.get(1).unwrap_or_else(|| panic!("{}", steps.describe())).start;
    let spec = fragscope_diagnose::WindowSpec::parse(&format!("{start}..")).unwrap();
    let cut = fragscope_diagnose::cut_window(snap, &spec).unwrap().0;
    fragscope_snapshot::pickle::write::write_path(&cut, out).unwrap();
}

fn replay(file: &Path, config: Option<&str>, json: bool) -> (Vec<u8>, Option<Value>) {
    let mut a: Vec<String> = vec!["replay".into(), file.display().to_string()];
    a.extend(["--capacity".into(), format!("{CAPACITY}B")]);
    if let Some(c) = config {
        a.extend(["--config".into(), c.into()]);
    }
    if json {
        a.push("--json".into());
    }
    let o = Command::new(env!("CARGO_BIN_EXE_fragscope")).args(&a).output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{a:?}: {}", String::from_utf8_lossy(&o.stderr));
    let v = json.then(|| serde_json::from_slice(&o.stdout).unwrap());
    (o.stdout, v)
}

fn first_run(v: &Value) -> &Value {
    &v["files"][0]["devices"][0]["whatif"][0]
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a number: {v}"))
}

#[test]
fn replay_warm_cut_under_expandable_ooms_on_the_carried_cache_and_says_so() {
    let src: PathBuf = fragscope_testdata::h200_dir().join("gpt-s512-b8-amp.pickle.gz");
    let snap = fragscope_snapshot::read_path(&src).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cut = dir.path().join("warm.pickle");
    warm(&snap, &cut);

    // The warm cut under expandable_segments:True: an OOM below the capacity.
    let (_, v) = replay(&cut, Some("expandable_segments:True"), true);
    let w = first_run(v.as_ref().unwrap());
    assert_eq!(w["config"], "expandable_segments:True");
    assert!(u(&w["ooms"]) > 0, "{w}");
    assert!(u(&w["peak_reserved"]) < CAPACITY);
    let oom = &w["first_oom"];
    let c = &oom["carried_cache"];
    // The reason, pinned: every segment the cut began with is still held; none is wholly
    // free (the retry's release_cached_blocks returned those), yet their free pieces and
    // the device's free bytes together would hold the request, the device alone not.
    assert_eq!(u(&c["segments"]), 101, "{c}");
    assert_eq!(u(&c["bytes"]), u(&w["reserved_before_trace"]));
    assert_eq!(u(&c["whole_free"]), 0);
    let (free, left, need) = (u(&c["free"]), u(&c["device_free"]), u(&oom["rounded"]));
    assert_eq!(left, CAPACITY - u(&oom["reserved"]), "the device's free bytes are the capacity less reserved");
    assert!(left < need && free + left >= need, "free {free} left {left} need {need}");
    // The text says what held the memory and what the recording cannot tell.
    let (text, _) = replay(&cut, Some("expandable_segments:True"), false);
    let text = String::from_utf8(text).unwrap();
    assert!(text.contains("made before the trace by the recorded settings, not expandable"), "{text}");
    let sz = fragscope_alloc::format_size;
    let both = format!("{} left on the device ({} with those pieces too)", sz(left), sz(free + left));
    assert!(text.contains(&both), "{both}: {text}");
    assert!(text.contains("this recording cannot tell"), "{text}");

    // Near miss: the same run made under expandable_segments:True from its start and cut
    // at the same step holds no such segment, and fits the same capacity.
    let mut cfg = recorded_config(&snap);
    cfg.expandable_segments = true;
    let exp = simulate_with(&snap, 0, cfg, &SimOptions { collect_snapshot: true, ..Default::default() });
    let exp_cut = dir.path().join("warm-expandable.pickle");
    warm(&exp.snapshot.unwrap(), &exp_cut);
    let (_, v) = replay(&exp_cut, None, true);
    let w = first_run(v.as_ref().unwrap());
    assert_eq!(w["config"], "expandable_segments:True");
    assert_eq!(u(&w["ooms"]), 0, "{w}");
    assert!(u(&w["peak_reserved"]) <= CAPACITY);
    // And the warm cut under its own settings fits too, with nothing carried to report.
    let (_, v) = replay(&cut, None, true);
    let w = first_run(v.as_ref().unwrap());
    assert_eq!((w["config"].as_str(), u(&w["ooms"])), (Some(""), 0), "{w}");
    assert!(w["first_oom"].is_null(), "{w}");
}
