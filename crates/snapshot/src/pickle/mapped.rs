//! A plain snapshot file mapped into memory, read in place instead of copied by `read()`.
//!
//! Why: the pickle reader walks the file once, front to back. Reading it through `read()`
//! copies every byte from the page cache into a buffer: on a 427 MB file that copy was a
//! fifth of the reading thread's time. A read-only mapping of the same pages costs only the
//! page-table entries. Only regular files are mapped (compressed files, archives and
//! standard input keep the streaming path), and a failed `mmap` just falls back to it.
//!
//! What a mapping must guard against: another process truncating the file while it is
//! being read (a training job that dumps its snapshot to the same path every few steps
//! opens it with `O_TRUNC`) makes the pages past the new end unreadable, and touching one
//! raises SIGBUS, which would kill the process (and a Python interpreter that loaded the
//! file through the package) where `read()` would have reported a short file. So every
//! mapping makes sure a SIGBUS handler ([`guard`]) is installed: a fault inside a live
//! mapping puts zero pages over the rest of it and marks it lost, the reader goes on over
//! zeros (and soon stops at a bad opcode), and [`Mapping::lost`] turns the read into a
//! clean error. A fault anywhere else goes to the handler that was there before, as if
//! this one did not exist.
//!
//! The page tables of a mapping are work too: the reader's thread took a fault for every
//! 64 KiB of a large file (the kernel maps the page cache around each fault), and handed
//! back the pages it had passed (`MADV_DONTNEED`, so that the process does not count the
//! whole file as its own by the end). On a 462 MB file that was ~35 ms of the reading
//! thread's ~190 ms. For a file of [`AHEAD_MIN`] bytes or more, a helper thread
//! ([`imp::Ahead`]) does both, on the second core: it maps the next [`AHEAD`] bytes in
//! before the reader gets there (`MADV_POPULATE_READ`, Linux 5.14; where the kernel does
//! not know it the reader faults them in as before) and hands back what the reader has
//! passed. The bytes are the same either way: the helper only asks the kernel to set up
//! or drop page-table entries of a read-only private mapping.

#[cfg(target_os = "linux")]
pub(crate) use imp::Mapping;

use std::sync::atomic::{AtomicUsize, Ordering};

/// How far ahead of the reader the helper maps the file in.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
const AHEAD: usize = 32 << 20;
/// Files smaller than this are read without a helper (a thread is not worth it: the file's
/// page tables are a few ms of work).
const AHEAD_MIN: usize = 64 << 20;
/// The pages behind the reader are handed back in steps of this many bytes.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
const RELEASE_STEP: usize = 16 << 20;
/// [`AHEAD_MIN`], or what a test set ([`set_ahead_min`]).
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
static AHEAD_MIN_NOW: AtomicUsize = AtomicUsize::new(AHEAD_MIN);

/// Sets the file size from which a mapped read has the helper that maps pages ahead of the
/// reader (`0`: every mapped file), so that tests exercise it on small files.
#[doc(hidden)]
pub fn set_ahead_min(bytes: usize) {
    AHEAD_MIN_NOW.store(bytes, Ordering::Relaxed);
}

#[cfg(target_os = "linux")]
mod imp {
    use std::os::fd::AsRawFd;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A read-only, private mapping of a whole file.
    pub(crate) struct Mapping {
        ptr: *mut libc::c_void,
        len: usize,
        /// Bytes from the start whose pages were handed back (`release_before`).
        released: usize,
        /// Its place in [`super::guard`]'s table (`None`: the table was full, and a
        /// truncation would kill the process as it did before there was a guard).
        slot: Option<usize>,
        /// The helper that maps the file ahead of the reader and hands back the pages
        /// behind it (files of [`super::AHEAD_MIN`] bytes or more).
        ahead: Option<Ahead>,
    }

    /// A thread that keeps the page tables of a [`Mapping`] ahead of its reader: the next
    /// [`super::AHEAD`] bytes mapped in, the pages wholly before the reader's position
    /// handed back. It reads and writes no memory (only the kernel touches page tables),
    /// so it races with nothing: a page it maps in or drops reads the same to the reader,
    /// and on a truncated file the kernel refuses the request instead of raising SIGBUS.
    pub(super) struct Ahead {
        shared: std::sync::Arc<AheadShared>,
        thread: Option<std::thread::JoinHandle<()>>,
    }

    struct AheadShared {
        /// The reader's position (bytes from the start of the mapping).
        pos: AtomicUsize,
        stop: std::sync::atomic::AtomicBool,
    }

    /// `MADV_POPULATE_READ` (Linux 5.14), not in every libc crate's list.
    const MADV_POPULATE_READ: libc::c_int = 22;

    impl Ahead {
        fn start(base: usize, len: usize) -> Option<Ahead> {
            let shared = std::sync::Arc::new(AheadShared {
                pos: AtomicUsize::new(0),
                stop: std::sync::atomic::AtomicBool::new(false),
            });
            let s = std::sync::Arc::clone(&shared);
            let thread = std::thread::Builder::new()
                .name("fragscope-map-ahead".into())
                .spawn(move || ahead_run(&s, base, len))
                .ok()?;
            Some(Ahead { shared, thread: Some(thread) })
        }

        fn follow(&self, pos: usize) {
            self.shared.pos.store(pos, Ordering::Release);
        }
    }

    impl Drop for Ahead {
        fn drop(&mut self) {
            self.shared.stop.store(true, Ordering::Release);
            if let Some(t) = self.thread.take() {
                let _ = t.join();
            }
        }
    }

    fn ahead_run(s: &AheadShared, base: usize, len: usize) {
        const PAGE: usize = 4096;
        // Mapped in per call: small enough that the reader, which reports its position
        // every 8 MiB, is seldom waiting on a call in progress.
        const STEP: usize = 2 << 20;
        let (mut mapped, mut released, mut populate) = (0usize, 0usize, true);
        while !s.stop.load(Ordering::Acquire) {
            let pos = s.pos.load(Ordering::Acquire).min(len);
            let upto = pos & !(super::RELEASE_STEP - 1);
            if upto > released {
                // SAFETY: advice on a page-aligned range inside the live mapping (the
                // mapping outlives this thread: `Mapping`'s drop joins it first); on a
                // read-only private file mapping MADV_DONTNEED drops page-table entries,
                // not data.
                unsafe { libc::madvise((base + released) as *mut libc::c_void, upto - released, libc::MADV_DONTNEED) };
                released = upto;
                continue;
            }
            let from = mapped.max(pos) & !(PAGE - 1);
            let to = len.min(pos + super::AHEAD);
            if !populate || from + PAGE > to {
                std::thread::sleep(std::time::Duration::from_micros(200));
                continue;
            }
            let n = (to - from).min(STEP);
            // SAFETY: as above; the kernel maps in page-cache pages of the range (or
            // refuses: EINVAL on a kernel without the advice, EFAULT past a truncated
            // end), and no memory is read or written by this thread.
            let r = unsafe { libc::madvise((base + from) as *mut libc::c_void, n, MADV_POPULATE_READ) };
            if r != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINVAL) {
                // A kernel without the advice: the reader faults the pages in itself.
                populate = false;
            }
            mapped = from + n;
        }
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
            let slot = super::guard::watch(ptr as usize, len);
            let ahead = if len >= super::AHEAD_MIN_NOW.load(Ordering::Relaxed) {
                Ahead::start(ptr as usize, len)
            } else {
                None
            };
            Some(Mapping { ptr, len, released: 0, slot, ahead })
        }

        /// Whether a page of the file went away while mapped (the file was truncated, or
        /// could not be read): the bytes read since are zeros, not the file's.
        pub(crate) fn lost(&self) -> bool {
            self.slot.is_some_and(super::guard::lost)
        }

        pub(crate) fn bytes(&self) -> &[u8] {
            // SAFETY: `ptr` maps `len` readable bytes for the lifetime of `self`.
            unsafe { std::slice::from_raw_parts(self.ptr as *const u8, self.len) }
        }

        /// Unmaps the pages wholly before `offset`, which the reader has passed, so that
        /// the process does not count the whole file as its own memory by the end. The
        /// bytes stay readable: an unmodified private file page that is touched again is
        /// faulted back in from the page cache with the same contents.
        ///
        /// With a helper ([`Ahead`]), it does this (and maps the pages ahead in): it is
        /// told the reader's position.
        pub(crate) fn release_before(&mut self, offset: usize) {
            if let Some(a) = &self.ahead {
                a.follow(offset);
                return;
            }
            let upto = offset.min(self.len) & !(super::RELEASE_STEP - 1);
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
            // The helper stopped first: it must not advise on a range that is unmapped
            // (and perhaps mapped again by something else).
            drop(self.ahead.take());
            // Out of the guard's table first: a fault in the range from now on is not ours.
            if let Some(k) = self.slot {
                super::guard::unwatch(k);
            }
            // SAFETY: unmaps exactly the range `of` mapped (and any zero pages the guard put
            // over part of it); no slice of it outlives `self`.
            unsafe {
                libc::munmap(self.ptr, self.len);
            }
        }
    }
}

/// The SIGBUS guard of the mappings: a fixed table of the live mappings' ranges, read by
/// the signal handler with atomic loads only (no locks, no allocation), and the handler.
#[cfg(target_os = "linux")]
mod guard {
    use std::sync::atomic::AtomicPtr;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Mutex;

    /// Mappings watched at once (a process reads a handful of files at a time; past this
    /// a mapping goes unwatched).
    const SLOTS: usize = 64;

    struct Slot {
        /// `start..end` of the mapping; `start == 0`: a free slot.
        start: AtomicUsize,
        end: AtomicUsize,
        /// A page of it went away.
        lost: AtomicBool,
    }

    #[allow(clippy::declare_interior_mutable_const)]
    const FREE: Slot = Slot { start: AtomicUsize::new(0), end: AtomicUsize::new(0), lost: AtomicBool::new(false) };
    static TABLE: [Slot; SLOTS] = [FREE; SLOTS];
    /// The SIGBUS action ours replaced (null until installed), for the faults that are
    /// not ours. Replaced, never freed: the handler may be reading the one before.
    static PREVIOUS: AtomicPtr<libc::sigaction> = AtomicPtr::new(std::ptr::null_mut());
    /// Serializes [`install`]s.
    static INSTALLING: Mutex<()> = Mutex::new(());
    /// The page size, read when installing (`sysconf` is not async-signal-safe).
    static PAGE: AtomicUsize = AtomicUsize::new(4096);

    /// Watches `start..start + len`: its slot, or `None` when the table is full or the
    /// handler could not be installed.
    pub(super) fn watch(start: usize, len: usize) -> Option<usize> {
        install().then_some(())?;
        for (k, s) in TABLE.iter().enumerate() {
            if s.start.compare_exchange(0, usize::MAX, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                // Claimed (`usize::MAX` matches no address); filled in, then published.
                s.lost.store(false, Ordering::Relaxed);
                s.end.store(start + len, Ordering::Relaxed);
                s.start.store(start, Ordering::Release);
                return Some(k);
            }
        }
        None
    }

    pub(super) fn lost(k: usize) -> bool {
        TABLE[k].lost.load(Ordering::Acquire)
    }

    pub(super) fn unwatch(k: usize) {
        TABLE[k].end.store(0, Ordering::Relaxed);
        TABLE[k].start.store(0, Ordering::Release);
    }

    /// Makes ours the SIGBUS action, unless it is already: checked at every mapping, since
    /// a fault that was not ours hands the signal back to the action before, and a
    /// library may install its own after ours. `false` when the system refuses.
    fn install() -> bool {
        let _one = INSTALLING.lock().unwrap_or_else(|e| e.into_inner());
        let ours = handler as *const () as usize;
        // SAFETY: plain sigaction calls with valid pointers; the handler only does what a
        // signal handler may (atomic loads and stores, mmap, sigaction, raise).
        unsafe {
            let mut now: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut now) != 0 {
                return false;
            }
            if now.sa_sigaction == ours {
                return true;
            }
            let page = libc::sysconf(libc::_SC_PAGESIZE);
            if page > 0 {
                PAGE.store(page as usize, Ordering::Relaxed);
            }
            // The action to hand foreign faults to, published before ours can run.
            PREVIOUS.store(Box::into_raw(Box::new(now)), Ordering::Release);
            let mut new: libc::sigaction = std::mem::zeroed();
            new.sa_sigaction = ours;
            new.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&mut new.sa_mask);
            libc::sigaction(libc::SIGBUS, &new, std::ptr::null_mut()) == 0
        }
    }

    extern "C" fn handler(sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
        // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
        let (code, addr) = unsafe { ((*info).si_code, (*info).si_addr() as usize) };
        // A real fault (not a `kill`) on a page of a watched mapping.
        if code > 0 {
            for s in &TABLE {
                let start = s.start.load(Ordering::Acquire);
                let end = s.end.load(Ordering::Acquire);
                if start <= addr && addr < end {
                    // SAFETY: `start..end` is a live mapping of this process (a slot is
                    // emptied before its mapping is unmapped); zero pages replace it from
                    // the faulting page on, and the access that faulted then reads zeros.
                    let page = addr & !(PAGE.load(Ordering::Relaxed) - 1);
                    let p = unsafe {
                        libc::mmap(
                            page as *mut libc::c_void,
                            end - page,
                            libc::PROT_READ,
                            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                            -1,
                            0,
                        )
                    };
                    if p != libc::MAP_FAILED {
                        s.lost.store(true, Ordering::Release);
                        return;
                    }
                    break;
                }
            }
        }
        // Not ours: the previous action back, and the access faults again under it (a
        // `kill` is sent again).
        let prev = PREVIOUS.load(Ordering::Acquire);
        if !prev.is_null() {
            // SAFETY: `prev` is the action sigaction returned when ours was installed,
            // never freed.
            unsafe {
                libc::sigaction(libc::SIGBUS, prev, std::ptr::null_mut());
                if code <= 0 {
                    libc::raise(sig);
                }
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
    pub(crate) fn lost(&self) -> bool {
        match self.0 {}
    }
}
