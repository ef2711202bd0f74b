//! Writer for snapshot pickles (protocol 4). Being written.
