//! Any byte string given to the reader must come back as Ok or Err: no panic, no abort,
//! no unbounded allocation (libFuzzer's -rss_limit_mb catches the latter).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(e) = fragscope_snapshot::read_from(data) {
        // Messages are one line by contract; formatting must not panic either.
        assert!(!e.to_string().contains('\n'));
    }
});
