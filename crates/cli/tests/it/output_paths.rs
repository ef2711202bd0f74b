//! Where the product writes (issue 43): `report -o`, `predict --report`, `replay
//! --save-snapshot` and `export -o DIR` write only regular files, through an exclusive
//! temporary file renamed over the target; a directory, FIFO, device or symlink there is
//! refused with one line and exit 2 and left as it was; a failed export leaves its folder
//! as it was.

use std::os::unix::fs::{symlink, FileTypeExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn fragscope(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fragscope")).args(args).output().unwrap()
}

/// A fresh, empty folder for one test, removed when dropped (a failing test too).
struct Folder(tempfile::TempDir);

impl std::ops::Deref for Folder {
    type Target = Path;
    fn deref(&self) -> &Path {
        self.0.path()
    }
}

fn folder(test: &str) -> Folder {
    Folder(tempfile::Builder::new().prefix(&format!("fragscope-outpaths-{test}-")).tempdir().unwrap())
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn mkfifo(p: &Path) {
    let st = Command::new("mkfifo").arg(p).status().expect("mkfifo");
    assert!(st.success());
}

/// The folder's entries, sorted, with each regular file's content (symlinks by target).
fn listing(dir: &Path) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let ft = e.file_type().unwrap();
            let what = if ft.is_symlink() {
                format!("-> {}", std::fs::read_link(e.path()).unwrap().display())
            } else if ft.is_fifo() {
                "fifo".to_string()
            } else if ft.is_dir() {
                "dir".to_string()
            } else {
                String::from_utf8_lossy(&std::fs::read(e.path()).unwrap()).into_owned()
            };
            (e.file_name().to_string_lossy().into_owned(), what)
        })
        .collect();
    v.sort();
    v
}

fn assert_refused(out: &Output, expect: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "exit code; stderr: {err}");
    assert_eq!(err.lines().count(), 1, "one line on stderr, got: {err}");
    assert!(err.contains(expect), "expected {expect:?} in {err}");
}

/// A small real recording, in the repository.
fn small_snapshot() -> PathBuf {
    fragscope_testdata::h200_dir().join("oom-fraction-exhaustion.pickle.gz")
}

#[test]
fn report_over_a_symlink_is_refused_and_its_target_untouched() {
    let dir = folder("report-symlink");
    let target = dir.join("precious.txt");
    std::fs::write(&target, "keep me").unwrap();
    let link = dir.join("out.html");
    symlink(&target, &link).unwrap();
    assert_refused(&fragscope(&["report", "-o", s(&link)]), "symlink");
    assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep me");
    assert_eq!(listing(&dir).len(), 2, "no temporary file left: {:?}", listing(&dir));
}

#[test]
fn report_over_a_dangling_symlink_writes_nothing_outside() {
    let dir = folder("report-dangling");
    let outside_dir = folder("report-dangling-outside");
    let outside = outside_dir.join("planted.html");
    let link = dir.join("out.html");
    symlink(&outside, &link).unwrap();
    assert_refused(&fragscope(&["report", "-o", s(&link)]), "symlink");
    assert!(!outside.exists());
    assert_eq!(listing(&dir), vec![("out.html".to_string(), format!("-> {}", outside.display()))]);
}

#[test]
fn report_to_a_fifo_a_device_or_a_directory_is_refused() {
    let dir = folder("report-special");
    let fifo = dir.join("pipe.html");
    mkfifo(&fifo);
    assert_refused(&fragscope(&["report", "-o", s(&fifo)]), "FIFO");
    assert!(std::fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo());
    assert_refused(&fragscope(&["report", "-o", "/dev/null"]), "device");
    assert!(std::fs::symlink_metadata("/dev/null").unwrap().file_type().is_char_device());
    let sub = dir.join("sub");
    std::fs::create_dir(&sub).unwrap();
    assert_refused(&fragscope(&["report", "-o", s(&sub)]), "directory");
    assert_eq!(listing(&dir), vec![("pipe.html".into(), "fifo".into()), ("sub".into(), "dir".into())]);
}

#[test]
fn report_replaces_a_regular_file_and_leaves_no_temporary_file() {
    let dir = folder("report-regular");
    let out = dir.join("out.html");
    std::fs::write(&out, "old").unwrap();
    let o = fragscope(&["report", "-o", s(&out), s(&small_snapshot())]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let page = std::fs::read_to_string(&out).unwrap();
    assert!(page.starts_with("<!DOCTYPE html>") || page.starts_with("<!doctype html>"), "{}", &page[..40]);
    assert_eq!(listing(&dir).len(), 1, "only the report: {:?}", listing(&dir).iter().map(|e| &e.0).collect::<Vec<_>>());
}

#[test]
fn save_snapshot_and_predict_report_refuse_a_symlink() {
    let dir = folder("save-symlink");
    let target = dir.join("precious.pickle");
    std::fs::write(&target, "keep me").unwrap();
    let link = dir.join("out.pickle");
    symlink(&target, &link).unwrap();
    let snap = small_snapshot();
    assert_refused(&fragscope(&["replay", s(&snap), "--save-snapshot", s(&link)]), "symlink");
    let h200 = fragscope_testdata::h200_dir();
    let (b4, b8) = (h200.join("gpt-s512-b4.pickle.gz"), h200.join("gpt-s512-b8.pickle.gz"));
    let predict = ["predict", "--sizes", "4,8", "--at", "16", s(&b4), s(&b8), "--report", s(&link)];
    assert_refused(&fragscope(&predict), "symlink");
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep me");
    assert_eq!(listing(&dir).len(), 2, "{:?}", listing(&dir));
}

#[test]
fn export_never_follows_a_symlink_or_opens_a_fifo_in_its_folder() {
    let snap = small_snapshot();
    for (case, expect) in [("symlink", "symlink"), ("dangling", "symlink"), ("fifo", "FIFO")] {
        let dir = folder(&format!("export-{case}"));
        let outside_dir = folder(&format!("export-{case}-outside"));
        let outside = outside_dir.join("target.parquet");
        let planted = dir.join("blocks.parquet");
        match case {
            "symlink" => {
                std::fs::write(&outside, "keep me").unwrap();
                symlink(&outside, &planted).unwrap();
            }
            "dangling" => symlink(&outside, &planted).unwrap(),
            _ => mkfifo(&planted),
        }
        let before = listing(&dir);
        assert_refused(&fragscope(&["export", s(&snap), "-o", s(&dir)]), expect);
        assert_eq!(listing(&dir), before, "{case}: the folder as it was");
        match case {
            "symlink" => assert_eq!(std::fs::read_to_string(&outside).unwrap(), "keep me"),
            _ => assert!(std::fs::symlink_metadata(&outside).is_err(), "{case}: nothing written outside"),
        }
    }
}

#[test]
fn failed_export_leaves_its_folder_as_it_was() {
    let dir = folder("export-failure");
    std::fs::write(dir.join("segments.parquet"), "an older export").unwrap();
    let bad = dir.join("not-a-snapshot.pickle");
    std::fs::write(&bad, b"").unwrap();
    let before = listing(&dir);
    // The first file's rows are written before the second is refused.
    let out = fragscope(&["export", s(&small_snapshot()), s(&bad), "-o", s(&dir)]);
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(listing(&dir), before);
    // A folder the failed run created is removed again.
    let fresh_dir = folder("export-failure-fresh");
    let fresh = fresh_dir.join("new");
    let out = fragscope(&["export", s(&small_snapshot()), s(&bad), "-o", s(&fresh)]);
    assert_eq!(out.status.code(), Some(2));
    assert!(!fresh.exists());
}

#[test]
fn export_replaces_its_tables_and_leaves_no_temporary_file() {
    let dir = folder("export-ok");
    std::fs::write(dir.join("segments.parquet"), "an older export").unwrap();
    let out = fragscope(&["export", s(&small_snapshot()), "-o", s(&dir)]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let names: Vec<String> = listing(&dir).into_iter().map(|e| e.0).collect();
    assert_eq!(names.len(), 9, "nine tables, nothing else: {names:?}");
    assert!(names.iter().all(|n| n.ends_with(".parquet") && !n.starts_with('.')), "{names:?}");
    assert!(std::fs::read(dir.join("segments.parquet")).unwrap().starts_with(b"PAR1"));
}
