//! Pickle support: a data-only reader ([`vm`], [`load`]; `shape` decodes trace entries by
//! learned layouts, `successors` guesses the next `frames` list, `mapped` maps plain files)
//! and a writer ([`write`](mod@write)).

pub(crate) mod load;
pub(crate) mod mapped;
mod memo;
mod prefault;
mod shape;
mod successors;
pub(crate) mod vm;
pub mod write;
