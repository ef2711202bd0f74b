//! The text of a PyTorch CUDA out-of-memory error, read and explained (`fragscope oom`).
//!
//! A user who hit an OOM often has nothing but the error text. [`oom_message::parse`] reads
//! it into an [`oom_message::OomMessage`] (every form PyTorch has printed, ROCm's included;
//! spec §13), [`oom_message::explain`] turns it into an [`oom_message::OomExplanation`]
//! (fragmentation or exhaustion, what to record next), and [`advice::message_advice`]
//! judges the usual advice (`empty_cache()`, no caching) from the message's figures alone.
//! Sizes are printed with [`fragscope_alloc::format_size`], as PyTorch prints them.
//!
//! Nothing here needs a snapshot: when one exists, `fragscope-diagnose` measures instead.

pub mod advice;
mod explain;
mod model;
pub mod oom_message;
mod parse;
