//! The integration tests of this crate, one module per file, linked into one test binary
//! (each binary links the whole dependency tree: one per crate keeps `cargo test` mostly
//! testing, not linking). Run one file's tests with `cargo test -p CRATE --test it FILE::`.

mod advice_real;
mod analyze_real;
mod diagnosis_leaks;
mod diagnosis_real;
mod enum_names;
mod planted_leaks;
mod replay_start_state;
mod role_whatif;
mod roles_truth_cut;
mod scaling;
mod timelines_of;
mod window;
