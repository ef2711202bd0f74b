//! One module per subcommand. Each has `Args` (clap derive) and
//! `run(&Args) -> Result<ExitCode, CliError>`; `lib.rs` registers it with one variant of `Command`.

pub mod summary;

pub mod analyze;
pub mod check;
pub mod diff;
#[cfg(feature = "export")]
pub mod export;
pub mod fit;
pub mod lab;
pub mod mcp;
pub mod oom;
pub mod plant;
pub mod predict;
pub mod replay;
pub mod report;
pub mod state;
