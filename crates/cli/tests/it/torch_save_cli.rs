//! `fragscope` on the files PyTorch's guides tell users to write with `torch.save`
//! (fixtures: crates/snapshot/tests/data/torchsave, made from an in-repository real file).

use std::path::PathBuf;
use std::process::Command;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../snapshot/tests/data/torchsave").join(name)
}

fn fragscope(args: &[&str]) -> (i32, String, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_fragscope")).args(args).output().unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into(),
        String::from_utf8_lossy(&o.stderr).into(),
    )
}

#[test]
fn summary_and_replay_read_memory_snapshot_pt() {
    let pt = fixture("memory_snapshot.pt");
    let orig = fragscope_testdata::in_repo_dir().join("effdl-course-liger-ce.pickle");
    let (_, want, _) = fragscope(&["summary", "--json", orig.to_str().unwrap()]);
    let (code, out, err) = fragscope(&["summary", "--json", pt.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    // The same figures as the pickle it was saved from (only the file name differs).
    let strip = |s: &str| -> serde_json::Value {
        let mut v: serde_json::Value = serde_json::from_str(s).unwrap();
        v["files"][0]["file"] = serde_json::Value::Null;
        v["files"][0]["format"] = serde_json::Value::Null;
        v
    };
    assert_eq!(strip(&out), strip(&want));
    let (code, out, err) = fragscope(&["replay", "--verify", "--json", pt.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let d = &v["files"][0]["devices"][0];
    assert_eq!(d["allocs_matched"], d["allocs"], "{out}");
    let (code, _, err) = fragscope(&["summary", fixture("legacy.pt").to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
}

#[test]
fn a_saved_tensor_or_a_zip_without_data_pkl_is_one_line_exit_2() {
    for name in ["tensor.pt", "no_data_pkl.zip"] {
        let (code, out, err) = fragscope(&["analyze", fixture(name).to_str().unwrap()]);
        assert_eq!(code, 2, "{name}: {out}{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.starts_with("error: ") && err.contains(name), "{err}");
    }
}
