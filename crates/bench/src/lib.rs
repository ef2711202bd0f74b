//! Benchmark and corpus tools for fragscope's developers, one binary each in `src/bin/`
//! (`cargo run --release -p fragscope-bench --bin NAME -- ARGS`; each file's doc says what
//! it measures or makes). They read snapshots through the library crates exactly as the
//! product does; the figures they print are quoted in `bench/RESULTS.md`.
//!
//! Kept out of the test build: the crate has no tests and its binaries are `test = false`.
