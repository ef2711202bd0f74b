//! Where fragscope's tests find real snapshots.
//!
//! The real recordings live in `../shared/traces` beside the checkout and are never
//! copied into the repository (several have no licence). Tests read them in place. When
//! the folder is missing a test prints a note and skips — except under CI (`CI` set),
//! where a missing folder is a failure: a green CI run must mean the real files were read.

use std::path::{Path, PathBuf};

/// `../shared/traces`, or `None` (with a note) when it is absent outside CI.
///
/// # Panics
/// When the folder is missing and `CI` is set.
pub fn traces_dir() -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/traces");
    if dir.is_dir() {
        return Some(dir);
    }
    if std::env::var_os("CI").is_some() {
        panic!("{} is missing: CI must run the real-file tests", dir.display());
    }
    eprintln!("note: {} not found; skipping real-file test", dir.display());
    None
}

/// A file of `../shared/traces` by name (see [`traces_dir`]).
pub fn real_file(name: &str) -> Option<PathBuf> {
    traces_dir().map(|d| d.join(name))
}

/// Every real pickle (`*.pickle`, `*.pkl`) in `dir`, sorted by name.
pub fn pickles_in(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| matches!(p.extension().and_then(|e| e.to_str()), Some("pickle" | "pkl")))
        .collect();
    v.sort();
    v
}

/// Every real pickle of `../shared/traces` (empty when skipped).
pub fn real_pickles() -> Vec<PathBuf> {
    let Some(dir) = traces_dir() else { return Vec::new() };
    let v = pickles_in(&dir);
    assert!(v.len() >= 20, "expected the real pickles in {}", dir.display());
    v
}
