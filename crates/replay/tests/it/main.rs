//! The integration tests of this crate, one module per file, linked into one test binary
//! (each binary links the whole dependency tree: one per crate keeps `cargo test` mostly
//! testing, not linking). Run one file's tests with `cargo test -p CRATE --test it FILE::`.

mod allocator_options;
mod driver_work_real;
mod empty_cache_pending_free;
mod lab_failed_request;
mod lab_real;
mod memstats_fast;
mod memstats_real;
mod not_seeded;
mod private_pools;
mod replay_mutated;
mod replay_real;
mod replay_selfcheck;
mod replay_unsplit_remainder;
mod scaling;
mod seeded_example;
mod settings_on_top;
mod settings_roundtrip;
