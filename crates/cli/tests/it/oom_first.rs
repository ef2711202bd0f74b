//! The OOM first (issue 42 item 1): on a file with an OOM, `summary` and `analyze` say where
//! it is (device, entry, verdict, the next command) before anything else, `analyze` prints
//! that device first, `state` picks the OOM's device and moment when none is given, and a
//! device holding far more than its peers is a finding — on the corpus's 3-GPU file whose
//! OOM is on device 1, the in-repository OOM recordings, and the multi-GPU files.

use std::process::Command;

fn run(args: &[&str]) -> String {
    let o = Command::new(env!("CARGO_BIN_EXE_fragscope")).args(args).output().expect("fragscope runs");
    assert_eq!(o.status.code(), Some(0), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).expect("UTF-8")
}

fn three_gpus() -> Option<String> {
    fragscope_testdata::real_file("codeloc-qwen3-gnn-expandable-oom-3gpu.pickle").map(|p| p.display().to_string())
}

#[test]
fn analyze_leads_with_the_oom_device() {
    let Some(f) = three_gpus() else { return };
    let out = run(&["analyze", &f]);
    let lines: Vec<&str> = out.lines().collect();
    // After the title line and a blank: the OOM, its device and entry, then the next command.
    assert!(
        lines[2].starts_with("OOM on device 1 at trace entry 421: exhaustion: tensors in use held 78.29 GiB"),
        "{}",
        lines[2]
    );
    assert!(lines[3].contains(&format!("fragscope state {f} --at 421")), "{}", lines[3]);
    // Device 1 is printed first, and its first finding is the OOM.
    let first_device = lines.iter().position(|l| l.starts_with("=== Device")).unwrap();
    assert_eq!(lines[first_device], "=== Device 1 ===");
    assert!(lines[first_device + 3].starts_with("  1. [high] This OOM was exhaustion"), "{}", lines[first_device + 3]);
    let order: Vec<&str> = lines.iter().filter(|l| l.starts_with("=== Device")).copied().collect();
    assert_eq!(order, ["=== Device 1 ===", "=== Device 0 ===", "=== Device 2 ==="]);
}

#[test]
fn summary_leads_with_the_oom() {
    let Some(f) = three_gpus() else { return };
    let out = run(&["summary", &f]);
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[2].starts_with("OOM on device 1 at trace entry 421: exhaustion:"), "{}", lines[2]);
    assert!(lines[3].starts_with(&format!("  Next: fragscope analyze {f}")), "{}", lines[3]);
    // The in-repository recordings too (one device each).
    let h = fragscope_testdata::h200_dir();
    for (name, verdict) in [("oom-fragmentation", "fragmentation"), ("oom-exhaustion", "exhaustion")] {
        let p = h.join(format!("{name}.pickle.gz")).display().to_string();
        let out = run(&["summary", &p]);
        let third = out.lines().nth(2).unwrap_or_default().to_string();
        assert!(third.starts_with("OOM on device 0 at trace entry "), "{name}: {third}");
        assert!(third.contains(&format!(": {verdict}")), "{name}: {third}");
    }
    // A file without an OOM says nothing of one.
    let p = h.join("gpt-s256-b8.pickle.gz").display().to_string();
    assert!(!run(&["summary", &p]).contains("OOM on device"));
}

#[test]
fn state_picks_the_oom_device_and_moment() {
    let Some(f) = three_gpus() else { return };
    // --at 421 is device 1's OOM entry (device 0 has an entry 421 too).
    let out = run(&["state", &f, "--at", "421"]);
    assert!(out.starts_with("Showing device 1: its entry 421 is the OOM"), "{out}");
    assert!(out.lines().nth(1).unwrap().contains("device 1, after trace entry 421"), "{out}");
    // No --at: the OOM's device and moment, said so.
    let out = run(&["state", &f]);
    assert!(out.starts_with("Showing the moment of the OOM: device 1, trace entry 421"), "{out}");
    assert!(out.lines().nth(1).unwrap().contains("device 1, after trace entry 421"), "{out}");
    // --device chooses, and nothing is said.
    let out = run(&["state", &f, "--device", "0"]);
    assert!(out.starts_with("Allocator state of"), "{out}");
    assert!(out.lines().next().unwrap().contains("device 0, after trace entry 6444"), "{out}");
    // JSON carries the reason.
    let out = run(&["state", &f, "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!((v["device"].as_i64(), v["after_event"].as_u64()), (Some(1), Some(421)));
    assert!(v["choice"].as_str().unwrap().starts_with("the moment of the OOM"), "{}", v["choice"]);
}

/// Device imbalance on the corpus's multi-device files: the 3-GPU file (78 GiB beside 8 and 20)
/// is named; the file naming a device the process never used is not.
#[test]
fn device_imbalance_on_the_multi_gpu_files() {
    let Some(f) = three_gpus() else { return };
    let v: serde_json::Value = serde_json::from_str(&run(&["analyze", "--json", &f])).unwrap();
    let i = &v["files"][0]["device_imbalance"];
    assert_eq!(i["device"], 1);
    assert_eq!(i["devices"], 3);
    assert_eq!(i["oom"], true);
    let findings = v["files"][0]["findings"].as_array().unwrap();
    assert_eq!(findings.len(), 1);
    assert_eq!(findings[0]["kind"], "device_imbalance");
    assert_eq!(findings[0]["severity"], "high");
    let Some(g) = fragscope_testdata::real_file("layoutedit-sd-lcm-stateonly-gpu1.pickle") else { return };
    let v: serde_json::Value = serde_json::from_str(&run(&["analyze", "--json", &g.display().to_string()])).unwrap();
    assert_eq!(v["files"][0]["devices"].as_array().unwrap().len(), 2, "the file names two devices");
    assert!(v["files"][0]["device_imbalance"].is_null(), "device 0 reserved nothing: not a peer");
}
