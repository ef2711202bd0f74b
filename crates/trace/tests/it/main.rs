//! The integration tests of this crate, one module per file, linked into one test binary
//! (each binary links the whole dependency tree: one per crate keeps `cargo test` mostly
//! testing, not linking). Run one file's tests with `cargo test -p CRATE --test it FILE::`.

mod enum_names;
mod lives_real;
mod roles_ground_truth;
mod roles_late_start;
mod roles_model_state;
mod roles_model_state_cuts;
mod roles_optimizer_state;
mod roles_truth;
mod scaling;
mod summary_layouts;
