//! The frozen evaluation of `predict` (issue 37 item 0): every grid family of
//! `../shared/traces/grids` and `crates/testdata/h200`, fitted on some sizes and predicted
//! at another recorded size, recorded cold as they are, cut after their first step (warm:
//! the template starts with a full cache) and replayed under `expandable_segments:True`.

mod capacity;
mod eval;
mod ranges;
mod same_program;
mod warm;
