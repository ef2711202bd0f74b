//! `--window START..END` for the commands that read snapshots (`summary`, `analyze`,
//! `report`, `export`): the clap option; the cut itself is
//! [`fragscope_commands::windowed`].

use fragscope_diagnose::WindowSpec;

use crate::CliError;

/// The `--window` option, flattened into a command's arguments.
#[derive(clap::Args, Debug, Default, Clone)]
pub struct WindowArg {
    /// Only a stretch of the trace, half-open: by trace entry index (`1000..5000`) or by
    /// time since the file's first trace entry (`12.5s..14s`, `200ms..`, `..3s`). The
    /// allocator state at the window's end is rebuilt from the recorded one by the
    /// backward walk; figures then cover the window only.
    #[arg(long, value_name = "START..END")]
    pub window: Option<String>,
}

impl WindowArg {
    /// The parsed window, or the usage error.
    pub fn spec(&self) -> Result<Option<WindowSpec>, CliError> {
        Ok(fragscope_commands::windowed::parse(self.window.as_deref())?)
    }
}
