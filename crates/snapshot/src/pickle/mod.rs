//! Pickle support: a data-only reader ([`vm`], [`load`]) and a writer ([`write`]).

pub(crate) mod load;
pub(crate) mod mapped;
mod memo;
mod prefault;
mod shape;
pub(crate) mod vm;
pub mod write;
