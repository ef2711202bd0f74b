//! The integration tests of this crate, one module per file, linked into one test binary
//! (each binary links the whole dependency tree: one per crate keeps `cargo test` mostly
//! testing, not linking). Run one file's tests with `cargo test -p CRATE --test it FILE::`.

mod advice_cli;
mod analyze_cli;
mod cli;
mod diagnosis_cli;
mod fit_audit;
mod fit_cli;
mod guide;
mod h200_recordings;
mod hostile_input_cli;
mod lab_cli;
mod oom_first;
mod oom_pasted_cli;
mod output_paths;
mod peak_allocated;
mod predict_cli;
mod real_traces;
mod recording_options;
mod replay_warm_expandable;
mod role_whatif_cli;
mod seeded_over_capacity;
mod snapshots;
mod torch_save_cli;
