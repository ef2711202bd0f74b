//! Pickle support: a data-only reader ([`vm`], [`load`]) and a writer ([`write`]).

pub(crate) mod load;
mod memo;
pub(crate) mod vm;
pub mod write;
