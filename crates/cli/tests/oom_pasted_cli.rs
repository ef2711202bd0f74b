//! `fragscope oom` on a log holding several OOM messages: each is explained (text and JSON).

use std::path::PathBuf;
use std::process::Command;

#[test]
fn oom_explains_every_message_of_a_log() {
    let f =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../analysis/tests/data/oom/pasted-two-ranks-interleaved.txt");
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
