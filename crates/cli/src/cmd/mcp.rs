//! `fragscope mcp` in the Rust binary: the MCP server is served by the Python package
//! (the official MCP SDK, the package's `[mcp]` extra), whose `fragscope` command
//! starts it before reaching this code. Here it only says so, in one line (exit 2).

use std::ffi::OsString;
use std::process::ExitCode;

use crate::CliError;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Ignored.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
    pub rest: Vec<OsString>,
}

/// The line printed by this binary's `fragscope mcp`.
pub const MESSAGE: &str = "fragscope mcp is served by the Python package: pip install '.[mcp]' from a clone \
     (or a wheel, then pip install 'mcp>=2.3,<3'), then run its `fragscope mcp` (README: Coding agents)";

pub fn run(_: &Args) -> Result<ExitCode, CliError> {
    Err(CliError::usage(MESSAGE))
}
