//! A what-if on a device smaller than the state the recording began with. The replay
//! seeds the recorded segments whatever the device's size; a process on the smaller
//! device could never have held the cache in them: PyTorch answers a failed `cudaMalloc`
//! by releasing its cached free segments (spec §3.7). So the replay releases them before
//! the trace, says so, and counts its peaks from there; what still does not fit (segments
//! holding live tensors) is the run's start and counts. Counted from the seeded state, a
//! recording begun with a large cache fitted no device below that state under any change
//! `fit` tried.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

fn json(args: &[String]) -> Value {
    let o = Command::new(env!("CARGO_BIN_EXE_fragscope")).args(args).output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a number: {v}"))
}

/// The what-if rows of `replay FILE --json` (device 0) with `extra` arguments.
fn whatifs(file: &Path, extra: &[&str]) -> Vec<Value> {
    let mut a = vec!["replay".to_string(), file.display().to_string(), "--json".into()];
    a.extend(extra.iter().map(|s| s.to_string()));
    let v = json(&a);
    let dev = &v["files"][0]["devices"][0];
    dev["whatif"].as_array().cloned().unwrap_or_else(|| panic!("no whatif: {v}"))
}

/// H200 batch 16 cut after its first step (a recording begun warm, shipped): on a device
/// 1 MiB smaller than what it held before its trace, the defaults' replay releases the
/// cache, says how much, and its peak stays within the device (it was the seeded state,
/// over the device, before).
#[test]
fn a_what_if_below_the_recorded_start_releases_the_cache_first() {
    let dir = tempfile::tempdir().unwrap();
    let src = fragscope_testdata::h200_dir().join("gpt-s512-b16.pickle.gz");
    let snap = fragscope_snapshot::read_path(&src).unwrap();
    let steps = fragscope_trace::steps(&snap, 0);
    let start = steps.steps.get(1).unwrap_or_else(|| panic!("{}", steps.describe())).start;
    let spec = fragscope_diagnose::WindowSpec::parse(&format!("{start}..")).unwrap();
    let cut = fragscope_diagnose::cut_window(&snap, &spec).unwrap().0;
    let warm = dir.path().join("warm-b16.pickle");
    fragscope_snapshot::pickle::write::write_path(&cut, &warm).unwrap();

    let unlimited = whatifs(&warm, &[]);
    let d = &unlimited[0];
    assert_eq!(d["config"], "", "the defaults first: {d}");
    let (before, live) = (u(&d["reserved_before_trace"]), u(&d["allocated_before_trace"]));
    assert!(before > live + (1 << 30), "a warm cut holds a cache: {before} reserved, {live} allocated");
    let cap = before - (1 << 20);
    let runs = whatifs(&warm, &["--capacity", &format!("{cap}B")]);
    let d = &runs[0];
    let notes: Vec<&str> = d["notes"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    let released = notes
        .iter()
        .find(|n| n.contains("its cached free segments ("))
        .unwrap_or_else(|| panic!("no release said: {notes:?}"));
    assert!(released.contains(&format!("the state before the trace reserved {before} B")), "{released}");
    assert!(u(&d["reserved_before_trace"]) < before, "{d}");
    assert!(u(&d["reserved_before_trace"]) >= live, "{d}");
    assert!(u(&d["peak_reserved"]) <= cap || u(&d["ooms"]) > 0, "peak over the device without an OOM: {d}");
    // The same recording on a device that holds its start: nothing released, peaks as before.
    let roomy = whatifs(&warm, &["--capacity", &format!("{}B", u(&unlimited[0]["peak_reserved"]))]);
    assert_eq!(roomy[0]["peak_reserved"], unlimited[0]["peak_reserved"]);
    assert!(!roomy[0]["notes"].to_string().contains("its cached free segments ("), "{}", roomy[0]);

    // fit on that device says what the replays do with the cache.
    let f = json(&["fit".into(), warm.display().to_string(), "--capacity".into(), format!("{cap}B"), "--json".into()]);
    let dev = &f["files"][0]["devices"][0];
    let note = dev["cached_before_trace"]["note"].as_str().unwrap_or_else(|| panic!("{dev}"));
    assert!(note.contains("on a smaller card the replays release it before the trace"), "{note}");
    for o in dev["cards"][0]["options"].as_array().unwrap() {
        assert!(u(&o["peak_reserved"]) <= cap, "an option over the card: {o}");
    }
}

/// cs336's 2.7B training step (corpus) begins with 41.64 GiB reserved, 28.80 GiB of it
/// cached, which the program itself releases (`empty_cache()`, its first 430 entries)
/// before its first request: on an A100-40GB no cache is said to be held, and sharding
/// fits (before, "nothing tried fits": every replay started from the 41.64 GiB).
#[test]
fn fit_counts_a_recording_from_its_first_request() {
    let Some(f) = fragscope_testdata::real_file("cs336-2.7b-trainstep-ctx128-fp32.pickle") else { return };
    let v = json(&["fit".into(), f.display().to_string(), "--capacity".into(), "A100-40GB".into(), "--json".into()]);
    let dev = &v["files"][0]["devices"][0];
    assert!(dev.get("cached_before_trace").is_none(), "the program released its cache: {}", dev["cached_before_trace"]);
    let card = &dev["cards"][0];
    let cap = u(&card["capacity_bytes"]);
    let options = card["options"].as_array().unwrap();
    assert!(!options.is_empty(), "{}", card["verdict"]);
    for o in options {
        assert!(u(&o["peak_reserved"]) <= cap, "{o}");
    }
}
