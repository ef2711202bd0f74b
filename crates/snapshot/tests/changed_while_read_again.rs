//! The truncation guard of mapped reads (see `it/changed_while_read.rs`) holds after another
//! handler took SIGBUS back: every mapped read checks that the guard's handler is still
//! the one installed. A test binary of its own, since it changes the process's SIGBUS
//! action, which tests running beside it would feel.

use fragscope_snapshot::error::ReadError;
use std::io::Write;
use std::path::Path;

#[test]
fn the_guard_comes_back_after_sigbus_is_reset() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/real/decomfl-opt-zeroth-order-windows.pickle");
    let bytes = std::fs::read(&src).unwrap();
    // Removed when dropped, by a failing assertion too.
    struct Scratch(std::path::PathBuf);
    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let dir = Scratch(std::env::temp_dir().join(format!("fragscope-guard-again-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).unwrap();
    let p = dir.0.join("s.pickle");
    let write = || std::fs::File::create(&p).unwrap().write_all(&bytes).unwrap();
    // A first read installs the guard.
    write();
    fragscope_snapshot::read_path(&p).expect("an untouched file reads");
    // Another library takes SIGBUS back (here: the default action, death).
    // SAFETY: setting a signal's action to the default.
    unsafe {
        libc::signal(libc::SIGBUS, libc::SIG_DFL);
    }
    // Truncated while mapped: an error, not SIGBUS.
    write();
    let mut once = true;
    let r = fragscope_snapshot::read_path_with_progress(&p, &mut |_, _| {
        if std::mem::take(&mut once) {
            std::fs::OpenOptions::new().write(true).open(&p).unwrap().set_len(0).unwrap();
        }
    });
    assert!(matches!(r, Err(ReadError::Changed)), "{:?}", r.err().map(|e| e.to_string()));
}
