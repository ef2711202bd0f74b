//! What the reader refuses to spend memory on, and why (docs/limits.md says it for users).
//!
//! A pickle is a program: a few bytes can ask for a great deal of memory. A memo
//! reference repeats a container for 2 bytes; a declared length asks for a buffer before
//! its bytes arrive; a gzip stream of zeros inflates 1,000-fold. CPython's `pickle.load`
//! shares memo-referenced objects, but the model ([`crate::Snapshot`]) holds segments,
//! blocks and kept values by value, so a reference there is a copy. Every such cost is
//! bounded here, relative to the bytes actually read and to what a real snapshot holds,
//! and past a bound the read stops with [`ReadError::Limit`], whose one line names the
//! limit:
//!
//! * **values** ([`allowance`]): the reader's live values while it runs (containers on
//!   the VM's stack and in its arenas) and the model's copies of memo-shared values once
//!   it has run (the [`Spend`] the builder charges) each stay under 64 MiB plus 16 bytes
//!   per input byte. A real snapshot's segments and blocks cost 2–4 bytes per pickled byte
//!   (its trace entries, the bulk of a file, are absorbed as flat records and not counted);
//! * **strings** ([`MAX_STRING`]): one string or byte string holds at most 64 MiB (a
//!   snapshot's strings are frame names and file names);
//! * **memo indices** ([`MEMO_SLACK`]): a pickler numbers its memo from 0 by one per
//!   object, so an index never exceeds the bytes written before it; an index past the
//!   offset plus 65,536 would only make the memo allocate;
//! * **inflation** ([`Inflated`]): decompressed bytes stay under 64 MiB plus 250 times
//!   the compressed bytes read (real snapshots compress 5–30-fold, deflate at most about
//!   1,030-fold).

use std::cell::Cell;
use std::io::Read;
use std::rc::Rc;

use crate::ReadError;

/// Values any input may build, whatever its size.
pub const FLOOR: u64 = 64 << 20;
/// Value bytes per input byte past [`FLOOR`].
pub const PER_INPUT_BYTE: u64 = 16;
/// The longest string or byte string read.
pub const MAX_STRING: usize = 64 << 20;
/// How far past the input offset a memo index may point.
pub const MEMO_SLACK: u64 = 1 << 16;
/// Decompressed bytes per compressed byte past [`FLOOR`].
pub const MAX_INFLATE_RATIO: u64 = 250;

/// The value bytes an input of `input` bytes may build.
pub fn allowance(input: u64) -> u64 {
    FLOOR.saturating_add(input.saturating_mul(PER_INPUT_BYTE))
}

/// `n` bytes in words (`64 MiB`), for messages.
pub(crate) fn size(n: u64) -> String {
    const UNITS: [&str; 7] = ["bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} bytes")
    } else if v.fract() == 0.0 {
        format!("{v:.0} {}", UNITS[u])
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// The error for values past [`allowance`]: `what` builds them, `input` bytes were read.
pub(crate) fn over(what: &str, input: u64) -> ReadError {
    ReadError::Limit(format!(
        "{what} past {} in memory, the limit for {} of input (64 MiB + 16 bytes per input byte); \
         no memory snapshot needs that much",
        size(allowance(input)),
        size(input)
    ))
}

/// The error for a string or byte string of `n` bytes at byte `offset`.
pub(crate) fn long_string(n: u64, offset: u64) -> ReadError {
    ReadError::Limit(format!(
        "a string of {} at byte {offset}, longer than any memory snapshot holds (limit {})",
        size(n),
        size(MAX_STRING as u64)
    ))
}

/// What the builder may still spend on the model's copies of shared values.
pub(crate) struct Spend {
    left: u64,
    input: u64,
}

impl Spend {
    /// A budget for the model of an input of `input` bytes.
    pub fn new(input: u64) -> Self {
        Spend { left: allowance(input), input }
    }
    /// Spends `n` bytes, or says the model would grow past the budget.
    #[inline]
    pub fn charge(&mut self, n: usize) -> Result<(), ReadError> {
        match self.left.checked_sub(n as u64) {
            Some(l) => {
                self.left = l;
                Ok(())
            }
            None => Err(over(
                "the snapshot's values, memo references copied where the model holds copies, grow",
                self.input,
            )),
        }
    }
}

/// Counts the bytes read through it into a shared cell (the compressed side of
/// [`Inflated`]).
pub(crate) struct Counted<R> {
    pub inner: R,
    pub count: Rc<Cell<u64>>,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.count.set(self.count.get() + n as u64);
        Ok(n)
    }
}

/// A decompressor's output, refused once it passes [`FLOOR`] plus [`MAX_INFLATE_RATIO`]
/// times the compressed bytes read so far (`compressed`, counted by [`Counted`]).
pub(crate) struct Inflated<R> {
    pub inner: R,
    pub compressed: Rc<Cell<u64>>,
    pub out: u64,
    /// What is inflated, for the message (`gzip stream`, `zip entry data.pkl`).
    pub what: &'static str,
}

impl<R: Read> Read for Inflated<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.out += n as u64;
        let c = self.compressed.get();
        if self.out > FLOOR.saturating_add(c.saturating_mul(MAX_INFLATE_RATIO)) {
            return Err(std::io::Error::other(ReadError::Limit(format!(
                "the {} inflates to more than {} from {} (limit 64 MiB + {MAX_INFLATE_RATIO} × the compressed size; \
                 real snapshots compress 5–30-fold): a compression bomb, not a snapshot",
                self.what,
                size(self.out),
                size(c)
            ))));
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_words() {
        assert_eq!(size(12), "12 bytes");
        assert_eq!(size(64 << 20), "64 MiB");
        assert_eq!(size(1536), "1.5 KiB");
    }

    #[test]
    fn spending_past_the_allowance_is_refused_once() {
        let mut s = Spend::new(0);
        assert!(s.charge(FLOOR as usize).is_ok());
        let e = s.charge(1).unwrap_err().to_string();
        assert!(e.starts_with("refusing: the snapshot's values"), "{e}");
        assert!(e.contains("64 MiB in memory"), "{e}");
    }

    #[test]
    fn inflation_past_the_ratio_is_an_error_naming_the_limit() {
        let zeros = vec![0u8; (FLOOR + 4096) as usize];
        let compressed = Rc::new(Cell::new(1u64));
        let mut r = Inflated { inner: &zeros[..], compressed, out: 0, what: "gzip stream" };
        let e = std::io::copy(&mut r, &mut std::io::sink()).unwrap_err();
        let e = ReadError::from(e).to_string();
        assert!(e.contains("limit 64 MiB + 250 × the compressed size"), "{e}");
    }
}
