//! The one error type of every command: a [`ErrorKind`] that front ends map to their own
//! error classes (the CLI to exit code 2, Python to `ArgumentError`, `SnapshotError`, ...)
//! and a message whose parameter names are typed ([`Param`]), so each front end writes them
//! in its own words (`--capacity` on the command line, `capacity=` in Python) without
//! rewriting strings.

use std::fmt;

/// What went wrong, as front ends tell it apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// A request's parameter is malformed, out of range or contradicts another one.
    InvalidArgument,
    /// A file is not a memory snapshot (or cannot be read).
    UnreadableSnapshot,
    /// A pickle asked to import or call something; it was refused before anything ran.
    RefusedPickle,
    /// The snapshots are readable but cannot answer the request (e.g. recordings of
    /// different programs for `predict`, a window outside the trace).
    Input,
    /// Writing a result (a file, standard output) failed.
    Output,
}

/// A command parameter an error message names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Param {
    At,
    Allocator,
    Capacity,
    Checkpoint,
    Config,
    Device,
    EmptyCacheAt,
    MaxAllocated,
    MaxFit,
    MaxPeakFragmentation,
    MaxReserved,
    NoCaching,
    NoLeaks,
    SaveSnapshot,
    ShardGradients,
    ShardOptimizer,
    Sizes,
    Time,
    Top,
    Window,
}

/// The parameters the analysis crates' errors name.
impl From<fragscope_replay::Param> for Param {
    fn from(p: fragscope_replay::Param) -> Param {
        match p {
            fragscope_replay::Param::Capacity => Param::Capacity,
            fragscope_replay::Param::EmptyCacheAt => Param::EmptyCacheAt,
        }
    }
}

/// Whose words a parameter is written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Words {
    /// Command-line flags: `--capacity`.
    Cli,
    /// Python keyword arguments: `capacity`.
    Python,
}

impl Param {
    /// The parameter as `words` name it.
    pub fn name(self, words: Words) -> &'static str {
        let (cli, python) = match self {
            Param::At => ("--at", "at"),
            Param::Allocator => ("--allocator", "allocators"),
            Param::Capacity => ("--capacity", "capacity"),
            Param::Checkpoint => ("--checkpoint", "checkpoint"),
            Param::Config => ("--config", "configs"),
            Param::Device => ("--device", "device"),
            Param::EmptyCacheAt => ("--empty-cache-at", "empty_cache_at"),
            Param::MaxAllocated => ("--max-allocated", "max_allocated"),
            Param::MaxFit => ("--max-fit", "max_fit"),
            Param::MaxPeakFragmentation => ("--max-peak-fragmentation", "max_peak_fragmentation"),
            Param::MaxReserved => ("--max-reserved", "max_reserved"),
            Param::NoCaching => ("--no-caching", "no_caching"),
            Param::NoLeaks => ("--no-leaks", "no_leaks"),
            Param::SaveSnapshot => ("--save-snapshot", "save_snapshot"),
            Param::ShardGradients => ("--shard-gradients", "shard_gradients"),
            Param::ShardOptimizer => ("--shard-optimizer", "shard_optimizer"),
            Param::Sizes => ("--sizes", "sizes"),
            Param::Time => ("--time", "time"),
            Param::Top => ("--top", "top"),
            Param::Window => ("--window", "window"),
        };
        match words {
            Words::Cli => cli,
            Words::Python => python,
        }
    }
}

/// One piece of a message: text, or a parameter written in the reader's words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    Text(String),
    Param(Param),
}

impl From<&str> for Piece {
    fn from(s: &str) -> Piece {
        Piece::Text(s.to_string())
    }
}

impl From<String> for Piece {
    fn from(s: String) -> Piece {
        Piece::Text(s)
    }
}

impl From<Param> for Piece {
    fn from(p: Param) -> Piece {
        Piece::Param(p)
    }
}

/// Builds a message from pieces: `msg![Param::At, " is required"]`.
#[macro_export]
macro_rules! msg {
    ($($piece:expr),* $(,)?) => { vec![$($crate::Piece::from($piece)),*] };
}

/// A command's error: what kind, and the one line that says it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    pub kind: ErrorKind,
    pieces: Vec<Piece>,
}

impl Error {
    /// An error of `kind` whose message is `pieces` (see [`msg!`]).
    pub fn new(kind: ErrorKind, pieces: Vec<Piece>) -> Error {
        Error { kind, pieces }
    }

    /// A malformed parameter: "`param`: `detail`".
    pub fn invalid(param: Param, detail: impl std::fmt::Display) -> Error {
        Error::new(ErrorKind::InvalidArgument, vec![Piece::Param(param), Piece::Text(format!(": {detail}"))])
    }

    /// An invalid request whose message names no parameter, or names them in `pieces`.
    pub fn argument(pieces: Vec<Piece>) -> Error {
        Error::new(ErrorKind::InvalidArgument, pieces)
    }

    /// Input that cannot answer the request.
    pub fn input(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Input, vec![Piece::Text(message.into())])
    }

    /// A result that could not be written.
    pub fn output(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Output, vec![Piece::Text(message.into())])
    }

    /// The one line, parameters in `words`.
    pub fn render(&self, words: Words) -> String {
        let mut s = String::new();
        for p in &self.pieces {
            match p {
                Piece::Text(t) => s.push_str(t),
                Piece::Param(p) => s.push_str(p.name(words)),
            }
        }
        s
    }
}

/// Command-line words: what the `fragscope` binary prints after `error: `.
impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.render(Words::Cli))
    }
}

impl std::error::Error for Error {}

/// A serialization failure of a document is a bug, but it still ends the command with one
/// line rather than a panic.
impl From<serde_json::Error> for Error {
    fn from(e: serde_json::Error) -> Error {
        Error::output(format!("cannot write JSON: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_in_each_front_end_words() {
        let e = Error::argument(msg![Param::MaxFit, " needs ", Param::Capacity, " (a GPU name)"]);
        assert_eq!(e.render(Words::Cli), "--max-fit needs --capacity (a GPU name)");
        assert_eq!(e.render(Words::Python), "max_fit needs capacity (a GPU name)");
        assert_eq!(e.to_string(), e.render(Words::Cli));
        let e = Error::invalid(Param::Config, "unknown key 'x'");
        assert_eq!(e.render(Words::Python), "configs: unknown key 'x'");
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
    }
}
