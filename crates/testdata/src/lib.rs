//! Where fragscope's tests find real snapshots.
//!
//! Two sets of others' recordings, and one of ours ([`h200_dir`]):
//! * the **in-repository set**, `crates/testdata/real/` (a few MB of licence-compatible real
//!   snapshots, attribution in its `NOTICE.md`), always present, so the real-data tests run
//!   from a fresh clone;
//! * the **full corpus**, `../shared/traces` beside the checkout (never copied into the
//!   repository: several files have no licence), used when it exists.
//!
//! [`traces_dir`] gives the full corpus when present, else the in-repository set. A test
//! that needs a file only the corpus has calls [`real_file`], which skips *visibly*: the
//! note is written straight to the terminal (past libtest's output capture) with a running
//! count of skips, so `cargo test` shows each one. Under CI (`CI` set) a missing corpus is
//! a failure instead: a green CI run must mean every real file was read.

pub mod scaling;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

/// `crates/testdata/real`: the real snapshots shipped with the repository.
pub fn in_repo_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("real")
}

/// `crates/testdata/h200`: snapshots this project recorded on a real GPU (an H200, PyTorch
/// 2.11), with what the recording process measured (`*.truth.json`); its `NOTICE.md` says
/// what each is. Always present.
pub fn h200_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("h200")
}

/// `../shared/traces` when it exists.
pub fn corpus_dir() -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/traces");
    if dir.is_dir() {
        return Some(dir);
    }
    if std::env::var_os("CI").is_some() {
        panic!("{} is missing: CI must run the real-file tests on the full corpus", dir.display());
    }
    None
}

/// Whether the full corpus is here (tests that check figures of corpus files use it).
pub fn has_corpus() -> bool {
    corpus_dir().is_some()
}

static SKIPS: AtomicU32 = AtomicU32::new(0);

/// Reports a skipped test (or part of one) on the terminal, whatever the capture, and
/// counts it. Returns the count so far in this test binary.
pub fn skip(what: &str) -> u32 {
    let n = SKIPS.fetch_add(1, Ordering::Relaxed) + 1;
    let _ = writeln!(
        std::io::stderr().lock(),
        "SKIPPED ({n} in this test binary): {what} — needs the full corpus ../shared/traces, absent"
    );
    n
}

/// Skips counted so far in this test binary.
pub fn skip_count() -> u32 {
    SKIPS.load(Ordering::Relaxed)
}

/// The folder of real snapshots to test on: the full corpus when present, else the
/// in-repository set (announced once per test binary). Never `None`; kept an `Option` so
/// that callers written for a skippable folder still read naturally.
pub fn traces_dir() -> Option<PathBuf> {
    if let Some(d) = corpus_dir() {
        return Some(d);
    }
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = writeln!(
            std::io::stderr().lock(),
            "note: ../shared/traces absent; real-data tests run on the in-repository set {}",
            in_repo_dir().display()
        );
    });
    Some(in_repo_dir())
}

/// A real file by name: from the corpus when present, else from the in-repository set;
/// `None` (a visible, counted skip) when neither has it.
pub fn real_file(name: &str) -> Option<PathBuf> {
    if let Some(d) = corpus_dir() {
        return Some(d.join(name));
    }
    let p = in_repo_dir().join(name);
    if p.is_file() {
        return Some(p);
    }
    skip(&format!("test on {name}"));
    None
}

/// A file of the grids (the same program recorded at several sizes and precisions, see
/// `../shared/traces/grids/GRIDS.md`) by name: from the corpus's `grids/` when present, else
/// from the in-repository `real/grids/` (the MIT-licensed `niu-*` grids); `None` (a visible,
/// counted skip) when neither has it.
pub fn grid_file(name: &str) -> Option<PathBuf> {
    if let Some(d) = corpus_dir() {
        return Some(d.join("grids").join(name));
    }
    let p = in_repo_dir().join("grids").join(name);
    if p.is_file() {
        return Some(p);
    }
    skip(&format!("test on grids/{name}"));
    None
}

/// How many real files (or devices) a test over "every real file" should at least have
/// read: `with_corpus` on the full corpus, 5 on the in-repository set.
pub fn min_files(with_corpus: usize) -> usize {
    if has_corpus() {
        with_corpus
    } else {
        5
    }
}

/// The least a test over "every real file" must count (devices, traces): `with_corpus` on
/// the full corpus, `in_repo` on the in-repository set (what that set holds, so a test
/// that silently reads fewer still fails).
pub fn min_count(with_corpus: usize, in_repo: usize) -> usize {
    if has_corpus() {
        with_corpus
    } else {
        in_repo
    }
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

/// Every real pickle to test on: the corpus's (at least 20) when present, else the
/// in-repository set's.
pub fn real_pickles() -> Vec<PathBuf> {
    let dir = traces_dir().expect("always a folder");
    let v = pickles_in(&dir);
    if has_corpus() {
        assert!(v.len() >= 20, "expected the real pickles in {}", dir.display());
    } else {
        assert!(v.len() >= 5, "expected the in-repository pickles in {}", dir.display());
    }
    v
}

/// A seeded random source for the tests' sampled choices (which mutation, which call
/// site): splitmix64, deterministic for a seed, so a failing case can be run again.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n`; 0 when `n` is 0.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The in-repository set is complete and every file is attributed in NOTICE.md.
    #[test]
    fn in_repo_set_present_and_attributed() {
        let notice = std::fs::read_to_string(in_repo_dir().join("NOTICE.md")).unwrap();
        let files = pickles_in(&in_repo_dir());
        assert!(files.len() >= 5, "{files:?}");
        let total: u64 = files.iter().map(|p| std::fs::metadata(p).unwrap().len()).sum();
        assert!(total < 8_000_000, "the in-repository set should stay a few MB: {total} B");
        for p in files {
            let name = p.file_name().unwrap().to_str().unwrap();
            assert!(notice.contains(&format!("`{name}`")), "{name} lacks attribution in NOTICE.md");
        }
    }
}
