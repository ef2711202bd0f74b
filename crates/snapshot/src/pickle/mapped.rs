//! A plain snapshot file mapped into memory, read in place instead of copied by `read()`.
//!
//! Why: the pickle reader walks the file once, front to back. Reading it through `read()`
//! copies every byte from the page cache into a buffer: on a 427 MB file that copy was a
//! fifth of the reading thread's time. A read-only mapping of the same pages costs only the
//! page-table entries. Only regular files are mapped (compressed files, archives and
//! standard input keep the streaming path), and a failed `mmap` just falls back to it.
//!
//! What a mapping cannot guard against: another process truncating the file while it is
//! being read makes the pages past the new end unreadable (SIGBUS), where `read()` would
//! have reported a short file. Snapshots are written once and then read, so the reader
//! accepts that, as `grep`-like tools that map their inputs do.

#[cfg(target_os = "linux")]
pub(crate) use imp::Mapping;

#[cfg(target_os = "linux")]
mod imp {
    use std::os::fd::AsRawFd;

    /// A read-only, private mapping of a whole file.
    pub(crate) struct Mapping {
        ptr: *mut libc::c_void,
        len: usize,
        /// Bytes from the start whose pages were handed back (`release_before`).
        released: usize,
    }

    // SAFETY: the mapping is read-only and owned; it is plain memory to any thread.
    unsafe impl Send for Mapping {}
    unsafe impl Sync for Mapping {}

    impl Mapping {
        /// Maps the first `len` bytes of `file`; `None` when the system refuses (the caller
        /// then streams the file).
        pub(crate) fn of(file: &std::fs::File, len: u64) -> Option<Mapping> {
            let len = usize::try_from(len).ok().filter(|&n| n > 0)?;
            // SAFETY: a fresh read-only private mapping of an open file; the kernel checks
            // the descriptor and the length.
            let ptr = unsafe {
                libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_PRIVATE, file.as_raw_fd(), 0)
            };
            if ptr == libc::MAP_FAILED {
                return None;
            }
            // Read-ahead for a front-to-back walk. Advice only: failure changes nothing.
            // SAFETY: advice on the range just mapped.
            unsafe {
                libc::madvise(ptr, len, libc::MADV_SEQUENTIAL);
            }
            Some(Mapping { ptr, len, released: 0 })
        }

        pub(crate) fn bytes(&self) -> &[u8] {
            // SAFETY: `ptr` maps `len` readable bytes for the lifetime of `self`.
            unsafe { std::slice::from_raw_parts(self.ptr as *const u8, self.len) }
        }

        /// Unmaps the pages wholly before `offset`, which the reader has passed, so that
        /// the process does not count the whole file as its own memory by the end. The
        /// bytes stay readable: an unmodified private file page that is touched again is
        /// faulted back in from the page cache with the same contents.
        pub(crate) fn release_before(&mut self, offset: usize) {
            const STEP: usize = 16 << 20;
            let upto = offset.min(self.len) & !(STEP - 1);
            if upto <= self.released {
                return;
            }
            // SAFETY: advice on a page-aligned range inside the mapping (`ptr` is page
            // aligned and `released`, `upto` are multiples of 16 MiB); MADV_DONTNEED on a
            // read-only private file mapping drops page-table entries, not data.
            unsafe {
                libc::madvise(
                    (self.ptr as *mut u8).add(self.released) as *mut libc::c_void,
                    upto - self.released,
                    libc::MADV_DONTNEED,
                );
            }
            self.released = upto;
        }
    }

    impl Drop for Mapping {
        fn drop(&mut self) {
            // SAFETY: unmaps exactly the range `of` mapped; no slice of it outlives `self`.
            unsafe {
                libc::munmap(self.ptr, self.len);
            }
        }
    }
}

/// Elsewhere the file is always streamed.
#[cfg(not(target_os = "linux"))]
pub(crate) struct Mapping(std::convert::Infallible);

#[cfg(not(target_os = "linux"))]
impl Mapping {
    pub(crate) fn of(_: &std::fs::File, _: u64) -> Option<Mapping> {
        None
    }
    pub(crate) fn bytes(&self) -> &[u8] {
        match self.0 {}
    }
    pub(crate) fn release_before(&mut self, _: usize) {
        match self.0 {}
    }
}
