//! Magnitude limits a real snapshot always meets, checked once before analysing (the CLI
//! does it when it loads a file) so that the analyses can add byte counts and addresses
//! without overflow checks at every sum. The reader itself accepts any value (the writer
//! and reader round-trip edge values exactly).
//!
//! No device has 256 TiB ([`MAX_BYTES`]), and no CUDA virtual address reaches 2^57
//! ([`MAX_ADDRESS`]: 5-level paging's user space ends below it). A file beyond either
//! was corrupted or hand-edited; refusing it with the offending field is clearer than
//! the nonsense (or the overflow) the figures would give.

use crate::{ReadError, Segment, Snapshot, TraceEvent};

/// Largest byte count accepted for a segment, block, request or trace entry (2^48).
pub const MAX_BYTES: u64 = 1 << 48;
/// Largest address accepted (2^57).
pub const MAX_ADDRESS: u64 = 1 << 57;

/// The largest `addr` and `size` over every trace entry a read made (device and host
/// traces alike, and entries it later set aside: an upper bound). When both are within
/// this module's limits no trace entry needs checking one by one.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct TraceMax {
    pub(crate) addr: u64,
    pub(crate) size: u64,
}

impl TraceMax {
    #[inline(always)]
    pub(crate) fn add(&mut self, ev: &TraceEvent) {
        self.addr = self.addr.max(ev.addr);
        self.size = self.size.max(ev.size);
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

fn segments(list: &[Segment], name: &str) -> Result<(), ReadError> {
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
    Ok(())
}

fn trace(t: &[TraceEvent], name: &str) -> Result<(), ReadError> {
    for (i, e) in t.iter().enumerate() {
        // An `oom` entry's `addr` holds the device's free bytes, a size like any other.
        addr(e.addr, || format!("{name} entry {i} ({}) addr", e.action.as_str()))?;
        size(e.size, || format!("{name} entry {i} ({}) size", e.action.as_str()))?;
    }
    Ok(())
}

/// [`check`] after a read, given the reader's bound on every trace entry it made (`None`:
/// none known): the traces are walked only when the bound is out of limits, and then
/// entry by entry as [`check`] does, so the error names the same first offender.
pub(crate) fn check_read(snap: &Snapshot, max: Option<TraceMax>) -> Result<(), ReadError> {
    match max {
        Some(m) if m.addr < MAX_ADDRESS && m.size <= MAX_BYTES => {
            segments(&snap.segments, "segments")?;
            segments(snap.host_segments.as_deref().unwrap_or(&[]), "host_segments")
        }
        _ => check(snap),
    }
}

/// Checks every address and byte count of `snap` against [`MAX_ADDRESS`] and [`MAX_BYTES`].
pub fn check(snap: &Snapshot) -> Result<(), ReadError> {
    segments(&snap.segments, "segments")?;
    segments(snap.host_segments.as_deref().unwrap_or(&[]), "host_segments")?;
    for (d, t) in snap.device_traces.iter().enumerate() {
        trace(t, &format!("device_traces[{d}]"))?;
    }
    trace(snap.host_traces.as_deref().unwrap_or(&[]), "host_traces")?;
    Ok(())
}
