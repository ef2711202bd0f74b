//! Memory for the export's large buffers, filled once front to back: each fresh 4 KiB
//! page costs a fault (the kernel zeroes and maps it), where a transparent huge page
//! takes one fault for 2 MiB. [`reserve_huge`] asks Linux for them (its default
//! `madvise` mode gives them on request); elsewhere, or where they are off, nothing
//! changes but the faults: the memory and its contents are the same either way. Used by
//! the allocation pairing here ([`crate::export`]) and by the CLI's column buffers.

/// Makes room for `more` elements in `v`, asking for transparent huge pages for a new
/// allocation before it is written (Linux; elsewhere a plain `reserve`): the buffers it
/// is for (the CLI's buffered columns of a row group, the pairing's rows) are tens of MB,
/// filled once front to back, and each fresh 4 KiB page costs a fault where a 2 MiB one takes one for 512 of them (with `madvise` mode,
/// Linux's default, as `summary`'s large arrays do).
///
/// A huge page needs a 2 MiB-aligned stretch of the mapping. The C library maps a large
/// allocation on its own, its length the bytes asked for plus a small header rounded up
/// to whole pages, and Linux places a mapping whose length is a multiple of 2 MiB on a
/// 2 MiB boundary: so the capacity is rounded up to fill such a length (a page under a
/// multiple of 2 MiB). Without it the buffers' mappings fell anywhere and half of each
/// 4 MiB one was 4 KiB pages (~17,000 page faults on the 6.4 M-entry benchmark file).
/// Either way the memory and its contents are the same: this only makes faults fewer.
pub fn reserve_huge<T>(v: &mut Vec<T>, more: usize) {
    const HUGE: usize = 2 << 20;
    const PAGE: usize = 4096;
    let need = v.len() + more;
    if need <= v.capacity() {
        return;
    }
    let size = std::mem::size_of::<T>().max(1);
    let cap = if cfg!(target_os = "linux") && need * size >= HUGE {
        ((need * size + PAGE).next_multiple_of(HUGE) - PAGE) / size
    } else {
        need
    };
    v.reserve_exact(cap - v.len());
    #[cfg(target_os = "linux")]
    if need * size >= HUGE {
        // From the page the allocation starts in (the mapping's first, where the header
        // is) to the last whole 2 MiB the `need` elements fill: past them (16 bytes, the
        // header's shift, for a buffer of a whole number of MiB) a huge page would be
        // resident for a few bytes (+66 MB of peak RSS on the benchmark file when the
        // advice went to the capacity's end).
        let start = v.as_mut_ptr() as usize;
        let (a, b) = (start / PAGE * PAGE, (start + need * size) / HUGE * HUGE);
        if b > a {
            // SAFETY: advice on pages that hold this vector's memory (the rest of the
            // first page is the allocator's own); it changes no contents. Where the
            // system's pages are not 4 KiB it fails (EINVAL) and nothing happens.
            unsafe { libc::madvise(a as *mut libc::c_void, b - a, libc::MADV_HUGEPAGE) };
        }
        if a.is_multiple_of(HUGE) && b >= a + HUGE {
            // The allocator wrote its header in the mapping's first page before the
            // advice: that 2 MiB would stay in 4 KiB pages (a fault per 4 KiB of the
            // first 2 MiB of every buffer) unless collapsed into a huge page now
            // (`MADV_COLLAPSE`, Linux 6.1; refused, as older ones do, it changes nothing).
            const MADV_COLLAPSE: libc::c_int = 25;
            // SAFETY: as above; collapsing keeps the contents.
            unsafe { libc::madvise(a as *mut libc::c_void, HUGE, MADV_COLLAPSE) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`reserve_huge`] makes room as `reserve` does and keeps the elements, for
    /// buffers under 2 MiB and over (rounded to fill whole 2 MiB of mapping), empty or
    /// not.
    #[test]
    fn reserve_huge_makes_room_and_keeps_the_elements() {
        for (before, more) in [(0usize, 10usize), (0, 1 << 20), (3, 1 << 19), (5, (1 << 18) + 7)] {
            let mut v: Vec<u64> = (0..before as u64).collect();
            reserve_huge(&mut v, more);
            assert!(v.capacity() >= before + more, "{before} + {more}");
            assert_eq!(v, (0..before as u64).collect::<Vec<_>>());
            let cap = v.capacity();
            v.extend(0..more as u64);
            assert_eq!(v.capacity(), cap, "{before} + {more}: no growth while filling");
            reserve_huge(&mut v, 0);
            assert_eq!(v.capacity(), cap);
        }
    }
}
