//! The `fragscope` binary: the command line of the `fragscope` library ([`fragscope::run_cli`]).

use std::process::ExitCode;

fn main() -> ExitCode {
    fragscope_snapshot::return_large_frees();
    ExitCode::from(fragscope::run_cli(std::env::args_os()))
}
