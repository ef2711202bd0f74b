//! Faults in the pages of a growing event array on the second core, just ahead of the
//! parser.
//!
//! Why: a multi-GB snapshot becomes hundreds of MB of trace events, and the first write to
//! every fresh 4 KiB page is a page fault; on a 427 MB file those faults were a third of
//! the reading time. `madvise(MADV_POPULATE_WRITE)` lets another thread take them: the
//! kernel maps zeroed pages into the array's spare capacity before the parser gets there.
//! The helper never reads or writes the memory itself (only the kernel touches page
//! tables), so there is no data race; a range that a reallocation has meanwhile moved or
//! freed just makes the call fail or fault in pages that are zero anyway. It stays at most
//! [`AHEAD`] bytes ahead, which bounds the memory it can add. Where the call is not
//! supported (old kernels, other systems) nothing happens. The array's reserved capacity
//! is asked to be backed by transparent huge pages ([`huge_pages`]), so that the helper
//! faults in 2 MiB at a time.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

/// How far ahead of the parser pages are faulted in.
const AHEAD: usize = 32 << 20;
/// Faulted in per call.
const STEP: usize = 4 << 20;
/// Arrays smaller than this are left alone (no thread for small files).
pub(crate) const MIN_BYTES: usize = 4 << 20;

#[derive(Default)]
struct Shared {
    base: AtomicUsize,
    len: AtomicUsize,
    cap: AtomicUsize,
    stop: AtomicBool,
}

/// A helper thread following one array (the trace list being filled).
pub(crate) struct Prefaulter {
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Prefaulter {
    pub(crate) fn start() -> Option<Self> {
        if !supported() {
            return None;
        }
        let shared = Arc::new(Shared::default());
        let s = Arc::clone(&shared);
        let thread = std::thread::Builder::new().name("fragscope-prefault".into()).spawn(move || run(&s)).ok()?;
        Some(Prefaulter { shared, thread: Some(thread) })
    }

    /// Where the array is now: its buffer, bytes in use and bytes of capacity.
    #[inline]
    pub(crate) fn follow(&self, base: usize, len: usize, cap: usize) {
        self.shared.base.store(base, Ordering::Relaxed);
        self.shared.cap.store(cap, Ordering::Relaxed);
        self.shared.len.store(len, Ordering::Release);
    }
}

impl Drop for Prefaulter {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn run(s: &Shared) {
    const PAGE: usize = 4096;
    let (mut cur_base, mut done) = (0usize, 0usize);
    while !s.stop.load(Ordering::Acquire) {
        let len = s.len.load(Ordering::Acquire);
        let (base, cap) = (s.base.load(Ordering::Relaxed), s.cap.load(Ordering::Relaxed));
        if base != cur_base {
            (cur_base, done) = (base, len);
        }
        let from = (base + done.max(len) + PAGE - 1) & !(PAGE - 1);
        let to = (base + cap.min(len + AHEAD)) & !(PAGE - 1);
        if base == 0 || from + PAGE > to {
            std::thread::sleep(std::time::Duration::from_micros(200));
            continue;
        }
        let n = (to - from).min(STEP);
        populate(from, n);
        done = from + n - base;
    }
}

#[cfg(target_os = "linux")]
const MADV_POPULATE_WRITE: libc::c_int = 23;

#[cfg(target_os = "linux")]
fn populate(addr: usize, len: usize) {
    // SAFETY: a paging request for a range of this process's address space; the kernel
    // validates it (EINVAL/ENOMEM for ranges not mapped) and reads or writes no data.
    unsafe {
        libc::madvise(addr as *mut libc::c_void, len, MADV_POPULATE_WRITE);
    }
}

/// Asks for transparent huge pages for the 2 MiB-aligned part of `[addr, addr + len)`,
/// memory not yet written (pages already touched stay small). Linux's default `madvise`
/// mode gives them on request; elsewhere, or with huge pages off, nothing happens and the
/// memory and its contents are the same.
///
/// Why, for the event array: in 4 KiB pages, its 205 MB on a 6.4 M-entry trace were 50 k
/// faults for the helper (the kernel's page-table and accounting work: ~20 ms of system
/// time), then 50 k pages for every walk of the analysis to look up, and 6-10 ms of the
/// main thread's time to hand back when the snapshot is dropped (1 ms in huge pages).
#[cfg(target_os = "linux")]
pub(crate) fn huge_pages(addr: usize, len: usize) {
    const HUGE: usize = 2 << 20;
    let (a, b) = (addr.next_multiple_of(HUGE), (addr + len) / HUGE * HUGE);
    if b > a {
        // SAFETY: advice on a range of this process's address space that the caller owns;
        // it changes no contents (the kernel validates the range).
        unsafe {
            libc::madvise(a as *mut libc::c_void, b - a, libc::MADV_HUGEPAGE);
        }
    }
}

#[cfg(not(target_os = "linux"))]
pub(crate) fn huge_pages(_: usize, _: usize) {}

#[cfg(target_os = "linux")]
fn supported() -> bool {
    // Probe once on a throwaway mapping-free range: EINVAL means the advice is unknown.
    static OK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OK.get_or_init(|| {
        let v = vec![0u8; 2 * 4096];
        let p = ((v.as_ptr() as usize) + 4095) & !4095;
        // SAFETY: as in `populate`; the page lies inside `v`.
        let r = unsafe { libc::madvise(p as *mut libc::c_void, 4096, MADV_POPULATE_WRITE) };
        r == 0
    })
}

#[cfg(not(target_os = "linux"))]
fn populate(_: usize, _: usize) {}

#[cfg(not(target_os = "linux"))]
fn supported() -> bool {
    false
}
