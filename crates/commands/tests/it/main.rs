//! The library commands as a front end calls them: requests refused with the parameter
//! named in each front end's words, and documents equal to what the CLI prints.

mod fit;
mod ranks;
mod requests;
mod summary;
