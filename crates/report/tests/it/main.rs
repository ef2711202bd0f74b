//! The integration tests of this crate, one module per file, linked into one test binary
//! (each binary links the whole dependency tree: one per crate keeps `cargo test` mostly
//! testing, not linking). Run one file's tests with `cargo test -p CRATE --test it FILE::`.

mod decode;
mod format_size;
mod layouts;
mod real_files;
mod state_deltas;
