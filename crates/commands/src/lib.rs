//! fragscope's commands as a library, under every front end: the `fragscope` CLI
//! (`crates/cli`: clap arguments → a request here → text or JSON), the Python module
//! (`crates/python`: keyword arguments → the same request) and through it the MCP server.
//! A front end parses its own arguments and renders; what a command computes and the JSON
//! document it answers with live here, once.
//!
//! Principal types: [`Error`] (one error type; its [`ErrorKind`] is what front ends map to
//! exit codes and exception classes, its [`Param`]s are written in each front end's
//! [`Words`]); the inputs ([`input::load`], [`input::each_snapshot`], the built-in
//! [`example`], [`windowed`] cuts); the one way files are written ([`outfile`]: regular files
//! only, through an exclusive temporary file); and one module per command with its request
//! and its document.

pub mod capacity;
pub mod check;
pub mod diff;
mod document;
mod error;
pub mod example;
pub mod export;
pub mod fit;
pub mod hugepages;
pub mod input;
pub mod oom;
pub mod outfile;
pub mod predict;
pub mod ranks;
pub mod replay;
pub mod state;
pub mod summary;
pub mod windowed;

pub use document::to_json;
pub use error::{Error, ErrorKind, Param, Piece, Words};
