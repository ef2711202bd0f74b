//! `fragscope fit` through the binary: the JSON document (`fragscope.fit/1`) and the text on
//! an H200 recording, and every bad input a one-line error with exit code 2.

use std::process::{Command, Output};

use serde_json::Value;

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fragscope")).args(args).output().unwrap()
}

fn h200(name: &str) -> String {
    fragscope_testdata::h200_dir().join(name).display().to_string()
}

#[test]
fn fit_json_per_card_with_replayed_options() {
    let f = h200("gpt-s512-b16.pickle.gz");
    let o = run(&["fit", &f, "--capacity", "10GB,H100-80GB", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["schema"], "fragscope.fit/1");
    let d = &v["files"][0]["devices"][0];
    assert_eq!(d["layers"], 8);
    let cards = d["cards"].as_array().unwrap();
    assert_eq!(cards.len(), 2);
    let (small, big) = (&cards[0], &cards[1]);
    assert_eq!(small["capacity_bytes"], 10_000_000_000u64);
    assert_eq!(small["fits_as_recorded"], false);
    let opts = small["options"].as_array().unwrap();
    assert!(!opts.is_empty(), "{small}");
    for (k, o) in opts.iter().enumerate() {
        assert_eq!(o["rank"], k + 1);
        let reserved = o["peak_reserved"].as_u64().unwrap();
        assert!(reserved <= 10_000_000_000, "{o}");
        assert_eq!(o["margin"].as_u64().unwrap(), 10_000_000_000 - reserved);
        for key in ["change", "cost_class", "cost", "config", "peak_allocated", "model", "basis", "not_modelled"] {
            assert!(o.get(key).is_some(), "{key} missing: {o}");
        }
    }
    assert_eq!(big["fits_as_recorded"], true);
    assert_eq!(big["options"][0]["cost_class"], "none");
    // The text says the same, card by card.
    let o = run(&["fit", &f, "--capacity", "10GB,H100-80GB"]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("10GB: does not fit on 10GB (9.31 GiB) as recorded; cheapest: "), "{text}");
    // A GPU name is read as `predict` reads it: its total less the CUDA context, said so.
    assert!(text.contains("H100-80GB: fits on H100-80GB (78.56 GiB) as recorded"), "{text}");
    assert!(text.contains("79.11 GiB total capacity less 560.00 MiB for the CUDA context"), "{text}");
    assert_eq!(big["capacity_bytes"].as_u64(), Some((7911 * (1u64 << 30) + 50) / 100 - (560 << 20)), "{big}");
    assert!(small.get("capacity_note").is_none(), "bytes as given: {small}");
    let first = opts[0]["change"].as_str().unwrap();
    assert!(text.contains(first), "{text}");
}

#[test]
fn fit_bad_input_is_one_line_and_exit_2() {
    let f = h200("gpt-s256-b8.pickle.gz");
    let g = h200("gpt-s512-b8.pickle.gz");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["fit", &f, "--capacity", "40 potatoes"], "invalid capacity '40 potatoes'"),
        (vec!["fit", &f, "--capacity", "H200"], "invalid capacity 'H200'"),
        (vec!["fit", &f, "--capacity", ""], "--capacity is required"),
        (vec!["fit", &f, "--capacity", "0B"], "a device of 0 bytes"),
        (vec!["fit", &f, "--capacity", "40GB", "--device", "5"], "--device=5"),
        (vec!["fit", &f, &g, "--capacity", "40GB", "--sizes", "256"], "--sizes gives 1 size(s) for 2 file(s)"),
        (vec!["fit", &f, &g, "--capacity", "40GB", "--sizes", "256,x"], "whole numbers"),
        (vec!["fit", "/nonexistent.pickle", "--capacity", "40GB"], "cannot read"),
    ];
    for (args, want) in cases {
        let o = run(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
    // clap's own usage errors: no capacity, no file.
    // --at without --sizes: nothing to predict from.
    for args in [
        vec!["fit", f.as_str()],
        vec!["fit", "--capacity", "40GB"],
        vec!["fit", &f, "--capacity", "40GB", "--at", "64"],
    ] {
        assert_eq!(run(&args).status.code(), Some(2), "{args:?}");
    }
}

/// One meaning for a GPU name in every command (issue 42): `replay --capacity H100-80GB`
/// replays on the bytes `fit` and `predict` give PyTorch's allocator there (the total less
/// the CUDA context) and says so, in the text and the JSON.
#[test]
fn a_gpu_name_means_the_same_bytes_in_replay_fit_and_predict() {
    let f = h200("gpt-s256-b8.pickle.gz");
    let o = run(&["fit", &f, "--capacity", "H100-80GB", "--json"]);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let fit_bytes = v["cards"][0]["bytes"].as_u64().unwrap();
    let o = run(&["replay", &f, "--capacity", "H100-80GB", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let runs = v["files"][0]["devices"][0]["whatif"].as_array().unwrap();
    assert!(!runs.is_empty());
    for r in runs {
        assert_eq!(r["capacity"].as_u64(), Some(fit_bytes), "{}", r["config"]);
    }
    assert!(v["capacity_note"].as_str().unwrap().contains("less 560.00 MiB for the CUDA context"), "{v}");
    let text = String::from_utf8_lossy(&run(&["replay", &f, "--capacity", "H100-80GB"]).stdout).into_owned();
    assert!(text.starts_with("capacity: H100-80GB: 79.11 GiB total capacity less 560.00 MiB"), "{text}");
    // Bytes as given stay bytes, without a note.
    let o = run(&["replay", &f, "--capacity", "40GB", "--json"]);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["files"][0]["devices"][0]["whatif"][0]["capacity"].as_u64(), Some(40_000_000_000));
    assert!(v.get("capacity_note").is_none(), "{v}");
}

/// `replay` and `fit` lead with the OOM device (issue 42, item 1): on the 3-GPU file whose OOM
/// is on device 1, its what-if table and its cards come before devices 0 and 2.
#[test]
fn replay_and_fit_show_the_oom_device_first() {
    let Some(p) = fragscope_testdata::real_file("codeloc-qwen3-gnn-expandable-oom-3gpu.pickle") else {
        fragscope_testdata::skip("replay's device order on the 3-GPU OOM file (corpus)");
        return;
    };
    let o = run(&["replay", &p.display().to_string()]);
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    let text = String::from_utf8_lossy(&o.stdout);
    let at = |d: &str| text.find(&format!("device {d}: what if")).unwrap_or_else(|| panic!("device {d}: {text}"));
    assert!(at("1") < at("0") && at("0") < at("2"), "{text}");
    // fit too: the OOM device's cards first, and a GPU name's reading said once at the top.
    let o = run(&["fit", &p.display().to_string(), "--capacity", "H100-80GB", "--json"]);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let devs: Vec<u64> =
        v["files"][0]["devices"].as_array().unwrap().iter().map(|d| d["device"].as_u64().unwrap()).collect();
    assert_eq!(devs, [1, 0, 2]);
    let o = run(&["fit", &p.display().to_string(), "--capacity", "H100-80GB"]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.starts_with("capacity: H100-80GB: 79.11 GiB total capacity"), "{text}");
    assert_eq!(text.matches("total capacity less").count(), 1, "{text}");
}

/// A recording begun warm (resnet50: 562 MiB reserved when its first request came, 347 MiB
/// of it cached, live tensors at most 497.62 MiB): the text says where the replays hold that
/// cache and what would not, and the JSON carries the figures; a cold recording (the H200
/// GPT step) has neither.
#[test]
fn fit_says_when_the_replays_hold_a_cache_from_before_the_recording() {
    let Some(f) = fragscope_testdata::real_file("pytorchblog-resnet50-train-cppframes.pickle") else { return };
    let f = f.display().to_string();
    let o = run(&["fit", &f, "--capacity", "530MiB"]);
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    let text = String::from_utf8_lossy(&o.stdout);
    let note =
        text.lines().find(|l| l.starts_with("  note: the recording began warm: ")).unwrap_or_else(|| panic!("{text}"));
    assert!(note.contains("562.00 MiB reserved when its first request came, 347.19 MiB of it cached"), "{note}");
    assert!(note.contains("torch.cuda.empty_cache() before the step, or a fresh process, would not hold it"), "{note}");
    assert!(note.contains("no change fit tries drops it"), "{note}");
    // 530 MiB is below the 562 MiB held: the replays there start without the cache.
    assert!(note.contains("on a smaller card the replays release it before the trace"), "{note}");
    let v: Value = serde_json::from_slice(&run(&["fit", &f, "--capacity", "530MiB", "--json"]).stdout).unwrap();
    let c = &v["files"][0]["devices"][0]["cached_before_trace"];
    assert_eq!(c["reserved_bytes"].as_u64(), Some(562 << 20), "{c}");
    assert_eq!(
        c["cached_bytes"].as_u64().unwrap(),
        c["reserved_bytes"].as_u64().unwrap() - c["allocated_bytes"].as_u64().unwrap()
    );
    let cold = run(&["fit", &h200("gpt-s512-b16.pickle.gz"), "--capacity", "10GB", "--json"]);
    let v: Value = serde_json::from_slice(&cold.stdout).unwrap();
    assert!(v["files"][0]["devices"][0].get("cached_before_trace").is_none(), "a cold recording has no cache note");
}

/// A forward-only recording: ZeRO is reported not applicable up front, with the reason, and
/// not replayed (the base replayed 24 (stage, base) pairs to find that out).
#[test]
fn fit_skips_zero_on_a_forward_only_recording_with_the_reason() {
    let f = fragscope_testdata::grid_file("niu-fwd-ctx100-fp32.pickle").expect("the grid ships in the repository");
    let f = f.display().to_string();
    let o = run(&["fit", &f, "--capacity", "300MB"]);
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("  pruned: ZeRO: not applicable: no training step found (forward passes only"), "{text}");
    assert!(!text.contains("(stage, base) pairs cannot be applied"), "{text}");
}
