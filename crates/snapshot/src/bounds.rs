//! Magnitude limits a real snapshot always meets, checked once before analysing (the CLI
//! does it when it loads a file) so that the analyses can add byte counts and addresses
//! without overflow checks at every sum. The reader itself accepts any value (the writer
//! and reader round-trip edge values exactly).
//!
//! No device has 256 TiB ([`MAX_BYTES`]), and no CUDA virtual address reaches 2^57
//! ([`MAX_ADDRESS`]: 5-level paging's user space ends below it). A file beyond either
//! was corrupted or hand-edited; refusing it with the offending field is clearer than
//! the nonsense (or the overflow) the figures would give.
//!
//! Capping each entry does not cap their sums: 2^16 segments of 256 TiB already add up
//! past 2^64. So the totals an analysis adds (segment sizes, block sizes, requests, trace
//! sizes) are added here in `u128`, and a file whose total cannot be held in a `u64` is
//! refused too, naming the total.

use crate::{ReadError, Segment, Snapshot, TraceEvent};

/// Largest byte count accepted for a segment, block, request or trace entry (2^48).
pub const MAX_BYTES: u64 = 1 << 48;
/// Largest address accepted (2^57).
pub const MAX_ADDRESS: u64 = 1 << 57;
/// Most entries accepted in one trace: the analyses number entries in 32 bits (a block's
/// life is two of them). A trace that long would be 137 GB of entries in memory.
pub const MAX_TRACE_ENTRIES: usize = u32::MAX as usize - 1;

/// Refuses a snapshot with a trace of more than [`MAX_TRACE_ENTRIES`] entries.
fn trace_lens(snap: &Snapshot) -> Result<(), ReadError> {
    let device = snap.device_traces.iter().enumerate().map(|(d, t)| (format!("device_traces[{d}]"), t.len()));
    let host = snap.host_traces.iter().map(|t| ("host_traces".to_string(), t.len()));
    match device.chain(host).find(|(_, n)| *n > MAX_TRACE_ENTRIES) {
        Some((name, n)) => Err(bad(format!("{name} has {n} entries, more than {MAX_TRACE_ENTRIES}"))),
        None => Ok(()),
    }
}

/// A bound on the `addr` and `size` of every trace entry a read made (device and host
/// traces alike, and entries it later set aside): the bitwise OR of each, at least the
/// largest and less than twice it. When both are within this module's limits no trace
/// entry needs checking one by one; when not, the entries are checked one by one, so a
/// bound above the largest value only costs that walk. Why an OR: the reader adds every
/// entry to it, and an OR is one instruction per lane where a 64-bit unsigned `max` (no
/// such instruction in SSE2) was a compare-and-blend sequence, ~5 % of the reading
/// thread's samples.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct TraceMax {
    pub(crate) addr: u64,
    pub(crate) size: u64,
}

impl TraceMax {
    #[inline(always)]
    pub(crate) fn add(&mut self, ev: &TraceEvent) {
        self.addr |= ev.addr;
        self.size |= ev.size;
    }
}

fn bad(what: String) -> ReadError {
    ReadError::Shape(format!("not a plausible memory snapshot: {what}"))
}

fn size(v: u64, what: impl FnOnce() -> String) -> Result<(), ReadError> {
    if v > MAX_BYTES {
        return Err(bad(format!("{} is {v} bytes, over 256 TiB", what())));
    }
    Ok(())
}

fn addr(v: u64, what: impl FnOnce() -> String) -> Result<(), ReadError> {
    if v >= MAX_ADDRESS {
        return Err(bad(format!("{} is at {v:#x}, past any CUDA address", what())));
    }
    Ok(())
}

/// Refuses a total of byte counts that a `u64` cannot hold.
fn total(sum: u128, what: impl FnOnce() -> String) -> Result<(), ReadError> {
    if sum > u128::from(u64::MAX) {
        return Err(bad(format!("the {} add up to {sum} bytes, more than 2^64", what())));
    }
    Ok(())
}

fn segments(list: &[Segment], name: &str) -> Result<(), ReadError> {
    // Sums of the fields the analyses add up, over the whole list (every device's).
    let mut sums = [0u128; 6];
    for s in list {
        let fields = [s.total_size, s.allocated_size, s.active_size, s.requested_size.unwrap_or(0)];
        for (sum, v) in sums.iter_mut().zip(fields) {
            *sum += u128::from(v);
        }
        for b in &s.blocks {
            sums[4] += u128::from(b.size);
            sums[5] += u128::from(b.requested_size.unwrap_or(0));
        }
    }
    for (i, s) in list.iter().enumerate() {
        let at = || format!("{name}[{i}]");
        addr(s.address, || format!("{} address", at()))?;
        size(s.total_size, || format!("{} total_size", at()))?;
        size(s.allocated_size, || format!("{} allocated_size", at()))?;
        size(s.active_size, || format!("{} active_size", at()))?;
        size(s.requested_size.unwrap_or(0), || format!("{} requested_size", at()))?;
        for (j, b) in s.blocks.iter().enumerate() {
            addr(b.address, || format!("{} block {j} address", at()))?;
            size(b.size, || format!("{} block {j} size", at()))?;
            size(b.requested_size.unwrap_or(0), || format!("{} block {j} requested_size", at()))?;
            for h in b.history.iter().flatten() {
                addr(h.addr, || format!("{} block {j} history addr", at()))?;
                size(h.real_size, || format!("{} block {j} history real_size", at()))?;
            }
        }
    }
    // The totals after every entry: a single impossible entry is named as such.
    let fields =
        ["total_size", "allocated_size", "active_size", "requested_size", "block sizes", "block requested_size"];
    for (sum, field) in sums.into_iter().zip(fields) {
        total(sum, || format!("{name}' {field}"))?;
    }
    Ok(())
}

fn trace(t: &[TraceEvent], name: &str) -> Result<(), ReadError> {
    for (i, e) in t.iter().enumerate() {
        // An `oom` entry's `addr` holds the device's free bytes, a size like any other.
        addr(e.addr, || format!("{name} entry {i} ({}) addr", e.action.as_str()))?;
        size(e.size, || format!("{name} entry {i} ({}) size", e.action.as_str()))?;
    }
    total(t.iter().map(|e| u128::from(e.size)).sum(), || format!("{name} entries' sizes"))
}

/// [`check`] after a read, given the reader's bound on every trace entry it made (`None`:
/// none known): the traces are walked only when the bound is out of limits, and then
/// entry by entry as [`check`] does, so the error names the same first offender.
pub(crate) fn check_read(snap: &Snapshot, max: Option<TraceMax>) -> Result<(), ReadError> {
    match max {
        // Every entry's size is at most `m.size`: when that many of them fit in a `u64`,
        // so do the sums of any trace's.
        Some(m)
            if m.addr < MAX_ADDRESS
                && m.size <= MAX_BYTES
                && entries(snap).checked_mul(u128::from(m.size)).is_some_and(|t| t <= u128::from(u64::MAX)) =>
        {
            trace_lens(snap)?;
            segments(&snap.segments, "segments")?;
            segments(snap.host_segments.as_deref().unwrap_or(&[]), "host_segments")
        }
        _ => check(snap),
    }
}

/// Trace entries of `snap`, device and host traces alike.
fn entries(snap: &Snapshot) -> u128 {
    let n: usize =
        snap.device_traces.iter().map(Vec::len).sum::<usize>() + snap.host_traces.as_ref().map_or(0, Vec::len);
    n as u128
}

/// Checks every address and byte count of `snap` against [`MAX_ADDRESS`] and [`MAX_BYTES`],
/// that their totals fit in a `u64`, and every trace's length against
/// [`MAX_TRACE_ENTRIES`].
pub fn check(snap: &Snapshot) -> Result<(), ReadError> {
    trace_lens(snap)?;
    segments(&snap.segments, "segments")?;
    segments(snap.host_segments.as_deref().unwrap_or(&[]), "host_segments")?;
    for (d, t) in snap.device_traces.iter().enumerate() {
        trace(t, &format!("device_traces[{d}]"))?;
    }
    trace(snap.host_traces.as_deref().unwrap_or(&[]), "host_traces")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Action, Block, BlockState};

    fn seg(address: u64, size: u64) -> Segment {
        Segment {
            blocks: vec![Block {
                address,
                size,
                requested_size: None,
                state: BlockState::Inactive,
                stack: None,
                history: None,
            }],
            ..Segment::new(0, address, size)
        }
    }

    /// The read's bound is an OR of the entries' values, above their largest where their
    /// bits differ: past a limit that no entry is past, the entries are checked one by
    /// one, with `check`'s answer; past a limit that one is past, `check`'s error.
    #[test]
    fn the_reads_bound_above_the_largest_value_gives_checks_answer() {
        let mut max = TraceMax::default();
        let events = [TraceEvent::new(Action::Alloc, MAX_ADDRESS - 1, MAX_BYTES), TraceEvent::new(Action::Alloc, 1, 1)];
        events.iter().for_each(|e| max.add(e));
        assert!(max.size > MAX_BYTES, "the OR is past the limit, the largest size is not");
        let mut snap = Snapshot { device_traces: vec![events.to_vec()], ..Default::default() };
        assert!(check(&snap).is_ok());
        assert!(check_read(&snap, Some(max)).is_ok());
        snap.device_traces[0][1].size = MAX_BYTES + 1;
        max.add(&snap.device_traces[0][1]);
        let e = check(&snap).unwrap_err().to_string();
        assert_eq!(check_read(&snap, Some(max)).unwrap_err().to_string(), e);
    }

    /// Each segment and entry within its bound, the totals past 2^64: refused, naming the
    /// total; the same count of entries one byte smaller each fits.
    #[test]
    fn totals_past_u64_are_refused() {
        let mut snap =
            Snapshot { segments: (0..(1u64 << 16)).map(|k| seg(k << 41, MAX_BYTES)).collect(), ..Default::default() };
        let e = check(&snap).unwrap_err().to_string();
        assert!(e.contains("segments' total_size add up to 18446744073709551616 bytes"), "{e}");
        snap.segments.iter_mut().for_each(|s| {
            s.total_size -= 1;
            s.blocks[0].size -= 1;
        });
        assert!(check(&snap).is_ok());
        snap.device_traces = vec![vec![TraceEvent::new(Action::Alloc, 0, MAX_BYTES); 1 << 16]];
        let e = check(&snap).unwrap_err().to_string();
        assert!(e.contains("device_traces[0] entries' sizes add up to"), "{e}");
        let max = TraceMax { addr: 0, size: MAX_BYTES };
        assert_eq!(check_read(&snap, Some(max)).unwrap_err().to_string(), e, "the read's check agrees");
        snap.device_traces[0].pop();
        assert!(check_read(&snap, Some(max)).is_ok());
    }
}
