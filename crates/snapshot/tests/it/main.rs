//! The integration tests of this crate, one module per file, linked into one test binary
//! (each binary links the whole dependency tree: one per crate keeps `cargo test` mostly
//! testing, not linking). Run one file's tests with `cargo test -p CRATE --test it FILE::`.
//!
//! Two binaries stay apart: `fuzz_mutations` (`.ci/fuzz` runs it by name, in release, for
//! many more cases) and `changed_while_read_again` (it sets the process's SIGBUS action to
//! the default, which every mapped read in a test beside it would feel).

mod bad_input;
mod bounds;
mod changed_while_read;
mod common;
mod flat_blocks;
mod fresh_stacks;
mod kept_dicts;
mod kineto;
mod limits;
mod long_trace_mapped;
mod recording;
mod roundtrip;
mod torch_save;
