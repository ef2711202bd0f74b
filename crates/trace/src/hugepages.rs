//! Memory for the large arrays of one pass over a long trace.
//!
//! A walk of a trace of millions of entries fills arrays of tens of MB (the block lives,
//! an index per entry) once, front to back. Each fresh 4 KiB page of them costs a fault
//! (the kernel zeroes and maps it): tens of thousands of faults per array, a visible
//! share of `summary`'s time. With transparent huge pages, which Linux gives on request
//! by default (`madvise` mode), a 2 MiB page takes one fault. [`HugePages`] asks for them
//! for the spare capacity of a vector, before it is written; where the request is not
//! supported (other systems, huge pages off) nothing happens, and the memory and its
//! contents are the same either way.

/// A vector whose reserved memory can be asked to be backed by huge pages.
pub(crate) trait HugePages {
    /// Asks for huge pages for the 2 MiB-aligned part of the vector's allocation (call
    /// before writing it: pages already touched stay small).
    fn huge_pages(&mut self);
}

impl<T> HugePages for Vec<T> {
    fn huge_pages(&mut self) {
        #[cfg(target_os = "linux")]
        {
            const HUGE: usize = 2 << 20;
            let start = self.as_mut_ptr() as usize;
            let end = start + self.capacity() * std::mem::size_of::<T>();
            let (a, b) = (start.next_multiple_of(HUGE), end / HUGE * HUGE);
            if b > a {
                // SAFETY: advice on memory this vector owns; it changes no contents.
                unsafe { libc::madvise(a as *mut libc::c_void, b - a, libc::MADV_HUGEPAGE) };
            }
        }
    }
}

/// `vec![value; n]`, in huge pages where they are given ([`HugePages`]).
pub(crate) fn filled<T: Clone>(n: usize, value: T) -> Vec<T> {
    let mut v = Vec::with_capacity(n);
    v.huge_pages();
    v.resize(n, value);
    v
}
