//! `fragscope oom` on a log holding several OOM messages: each is explained (text and JSON).

use std::path::PathBuf;
use std::process::Command;

#[test]
fn oom_explains_every_message_of_a_log() {
    let f =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../oomtext/tests/data/oom/pasted-two-ranks-interleaved.txt");
    let run = |json: bool| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_fragscope"));
        c.arg("oom").arg(&f);
        if json {
            c.arg("--json");
        }
        let o = c.output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8(o.stdout).unwrap()
    };
    let text = run(false);
    assert!(text.starts_with("2 out-of-memory messages"), "{text}");
    assert!(text.contains("=== Message 1 of 2 (lines prefixed [rank1])"), "{text}");
    assert!(text.contains("=== Message 2 of 2 (lines prefixed [rank0])"), "{text}");
    assert!(text.contains("496.00 MiB") && text.contains("14.00 MiB"), "{text}");
    let v: serde_json::Value = serde_json::from_str(&run(true)).unwrap();
    let msgs = v["messages"].as_array().unwrap();
    assert_eq!(msgs.len(), 2);
    assert_eq!(msgs[0]["message"]["log_prefix"], "rank1");
    assert_eq!(msgs[1]["message"]["tried_to_allocate"], 14 * 1024 * 1024);
    // The first message is also the top level (the schema's single-message shape).
    assert_eq!(v["message"], msgs[0]["message"]);
}

/// A snapshot (or any compressed file) given to `oom` instead of the error's text: one
/// line naming what the file is and the command that reads it, exit code 2, at once (read
/// as text, a 460 MB pickle took 66 s and 6.9 GB of memory to find no message).
#[test]
fn oom_on_a_snapshot_says_what_to_run_instead() {
    let tmp = tempfile::Builder::new().prefix("fragscope-oom-not-text-").tempdir().unwrap();
    let dir = tmp.path().to_path_buf();
    let snap =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../testdata/real/flexgen-opt-oom-v2.0-history-format.pickle");
    let gz = dir.join("train.log.gz");
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut enc, b"torch.OutOfMemoryError: CUDA out of memory.\n").unwrap();
    std::fs::write(&gz, enc.finish().unwrap()).unwrap();
    for (file, says) in [(&snap, "is a pickle (a memory snapshot?)"), (&gz, "is gzip-compressed")] {
        let o = Command::new(env!("CARGO_BIN_EXE_fragscope")).arg("oom").arg(file).output().unwrap();
        let err = String::from_utf8(o.stderr).unwrap();
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains(says) && err.contains(&format!("fragscope analyze {}", file.display())), "{err}");
        assert!(o.stdout.is_empty());
    }
    let err =
        String::from_utf8(Command::new(env!("CARGO_BIN_EXE_fragscope")).arg("oom").arg(&gz).output().unwrap().stderr)
            .unwrap();
    assert!(err.contains(&format!("zcat {} | fragscope oom", gz.display())), "{err}");
    // One word is a path, never a message: a missing file and a directory say so.
    let missing = dir.join("train.log");
    for (arg, says) in [(&missing, "cannot read"), (&dir, "is a directory")] {
        let o = Command::new(env!("CARGO_BIN_EXE_fragscope")).arg("oom").arg(arg).output().unwrap();
        let err = String::from_utf8(o.stderr).unwrap();
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert!(err.contains(says) && err.contains(&arg.display().to_string()), "{err}");
    }
}
