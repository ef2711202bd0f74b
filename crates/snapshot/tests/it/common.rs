//! Shared helpers for the integration tests.
//!
//! The real snapshots live in `../shared/traces` next to the workspace and are never
//! copied into the repository (several have no licence). Tests read them in place. When
//! the folder is missing, a test prints a note and skips — except under CI (`CI` set),
//! where a missing folder is a failure: a green CI run must mean the real files were read.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

#[allow(unused_imports)] // each test binary uses a different subset
pub use fragscope_testdata::{real_file, real_pickles, traces_dir};

/// Real pickles no bigger than `max` bytes.
pub fn small_pickles(max: u64) -> Vec<PathBuf> {
    real_pickles().into_iter().filter(|p| std::fs::metadata(p).unwrap().len() <= max).collect()
}

/// A scratch directory, removed when dropped (by a failing test too: 462 leftover
/// `fragscope-changed-*` folders, 420 MB, were once found in /tmp). Keep it bound for as
/// long as its files are used.
pub struct Scratch(PathBuf);

impl std::ops::Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for Scratch {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A fresh scratch directory under the system temp dir ([`Scratch`]).
pub fn scratch_dir(tag: &str) -> Scratch {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let d = std::env::temp_dir().join(format!("fragscope-{tag}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    Scratch(d)
}

/// `python3`, if it runs. Like the traces, required under CI.
pub fn python3() -> Option<&'static str> {
    let ok =
        Command::new("python3").arg("-c").arg("import pickle").output().map(|o| o.status.success()).unwrap_or(false);
    if ok {
        return Some("python3");
    }
    if std::env::var_os("CI").is_some() {
        panic!("python3 is needed under CI for the CPython compatibility checks");
    }
    eprintln!("note: python3 not available; skipping CPython check");
    None
}

/// Runs a Python script with arguments; panics with its output on failure.
pub fn run_python(py: &str, script: &str, args: &[&Path]) -> String {
    let out = Command::new(py).arg("-c").arg(script).args(args).output().expect("python3 runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "python failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    stdout
}

/// `pickle.dumps(obj, protocol=p)` of a Python expression, built at test time.
pub fn python_pickle(py: &str, expr: &str, protocol: u8) -> Vec<u8> {
    let script = format!("import pickle, sys; sys.stdout.buffer.write(pickle.dumps({expr}, protocol={protocol}))");
    let out = Command::new(py).arg("-c").arg(&script).output().expect("python3 runs");
    assert!(out.status.success(), "python failed: {}", String::from_utf8_lossy(&out.stderr));
    out.stdout
}

/// The mapped read's helper threshold ([`fragscope_snapshot::set_ahead_min`]), held by one
/// test at a time: the setting is process-wide, and the tests that change it share one
/// binary. Dropped, it puts back the reader's default (64 MiB), then lets the next in.
pub struct AheadMin(std::sync::MutexGuard<'static, ()>);

impl AheadMin {
    /// Waits for the turn to change the threshold.
    pub fn take() -> AheadMin {
        static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());
        AheadMin(TURN.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Files of `bytes` or more get the helper that maps a file ahead of its reader.
    pub fn set(&self, bytes: usize) {
        fragscope_snapshot::set_ahead_min(bytes);
    }
}

impl Drop for AheadMin {
    fn drop(&mut self) {
        fragscope_snapshot::set_ahead_min(64 << 20);
    }
}

pub fn gzip(bytes: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}
