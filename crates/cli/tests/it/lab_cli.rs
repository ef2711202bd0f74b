//! `fragscope replay --allocator`: names, errors, the JSON schema, the text table.

use std::process::{Command, Output};

fn fragscope(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fragscope")).args(args).output().unwrap()
}

#[test]
fn unknown_allocator_is_one_line_error() {
    let out = fragscope(&["replay", "--allocator", "bogus"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("error: unknown allocator 'bogus'") && err.contains("page-remap"), "{err}");
    let out = fragscope(&["replay", "--allocator", "pytorch:nonsense_key:3"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn all_policies_on_the_example_as_json() {
    let out = fragscope(&["replay", "--allocator", "all", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["schema"], "fragscope.replay.lab/2");
    let dev = &j["files"][0]["devices"][0];
    let pages = dev["bounds"]["pages"].as_u64().unwrap();
    let live = dev["bounds"]["live"].as_u64().unwrap();
    assert!(live > 0 && pages >= live);
    let rows = dev["rows"].as_array().unwrap();
    let names: Vec<&str> = rows.iter().map(|r| r["policy"].as_str().unwrap()).collect();
    for want in ["best-fit", "page-remap", "lifetime", "planned"] {
        assert!(names.contains(&want), "{names:?}");
    }
    assert!(names.iter().any(|n| n.starts_with("pytorch")), "{names:?}");
    for r in rows {
        assert!(r["peak_reserved"].as_u64().unwrap() >= pages, "{r}");
        assert!(r["verdict"].as_str().unwrap().contains("OOM"), "{r}");
    }
}

#[test]
fn text_table_has_bounds_and_rows() {
    let out = fragscope(&["replay", "--allocator", "planned", "--allocator", "best-fit"]);
    assert_eq!(out.status.code(), Some(0));
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(s.contains("bound: 2 MiB pages") && s.contains("| planned") && s.contains("| best-fit"), "{s}");
    assert!(!s.contains("| page-remap"), "{s}");
}
