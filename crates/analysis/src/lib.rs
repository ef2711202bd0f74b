//! Analyses of PyTorch memory snapshots (placeholder; being written).
pub mod oom_message;

pub mod replay;
pub mod summary;

pub mod attribution;
pub mod check;
pub mod diff;
pub mod leaks;
pub mod timeline;

pub mod analyze;
pub mod oom;
pub mod recommend;
