//! [`drive`]: serve a [`Workload`] with a [`Policy`], measuring peaks and, when asked,
//! checking every step; [`drive_strict`]: the same over a [`StrictVmm`], which checks
//! every driver call against CUDA's rules.

use std::collections::BTreeMap;

use super::{round512, DriverCalls, Op, Policy, PolicyOom, Workload};
use crate::{Addr, InvariantError, StrictVmm};

/// What a policy did with a workload.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Run {
    pub peak_reserved: u64,
    pub final_reserved: u64,
    /// Peak of the live bytes the policy served (512 B each); probes (requests the
    /// recording refused) are not counted, as in `Workload::bounds().live_512`.
    pub peak_live: u64,
    /// Requests the recording served that the policy could not (recorded OOMs aside).
    pub ooms: u64,
    /// The first of them: (op index, what the policy said).
    pub first_oom: Option<(usize, PolicyOom)>,
    /// Recorded OOM requests this policy served.
    pub probes_served: u64,
    pub probes: u64,
    pub calls: DriverCalls,
}

/// The first violation a checked drive found ([`drive`], [`drive_strict`]); `op` is the
/// index of the op after which it was seen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DriveError {
    /// A block the policy placed at `[start, end)` overlaps the live block `live`.
    Overlap { op: usize, start: Addr, end: Addr, live: (Addr, Addr) },
    /// The policy holds fewer bytes from the device than it serves.
    ReservedBelowLive { op: usize, reserved: u64, live: u64 },
    /// The policy's own [`Policy::check`] failed, after op `op` (`None`: at the end).
    Invariant { op: Option<usize>, error: InvariantError },
    /// The device saw `count` violations of CUDA's rules (their words, `first`).
    CudaRules { op: usize, count: u64, first: String },
    /// The policy's reserved bytes differ from what the device has in use.
    DeviceDisagrees { op: usize, policy: u64, device: u64 },
    /// A refused request served as a probe could not be freed at the address it got.
    UnknownProbe { op: usize, addr: Addr },
    /// The policy does not know a live block it was asked to free.
    UnknownLive { op: usize, addr: Addr },
}

impl std::fmt::Display for DriveError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DriveError::Overlap { op, start, end, live: (s, e) } => {
                write!(f, "op {op}: block [{start:#x}, {end:#x}) overlaps live [{s:#x}, {e:#x})")
            }
            DriveError::ReservedBelowLive { op, reserved, live } => {
                write!(f, "op {op}: reserved {reserved} < live {live}")
            }
            DriveError::Invariant { op: Some(op), error } => write!(f, "op {op}: {error}"),
            DriveError::Invariant { op: None, error } => write!(f, "end: {error}"),
            DriveError::CudaRules { op, count, first } => {
                write!(f, "op {op}: {count} violation(s) of CUDA's rules, first: {first}")
            }
            DriveError::DeviceDisagrees { op, policy, device } => {
                write!(f, "op {op}: the policy holds {policy} bytes, the device has {device} in use")
            }
            DriveError::UnknownProbe { op, addr } => {
                write!(f, "op {op}: policy does not know the block it just gave, {addr:#x}")
            }
            DriveError::UnknownLive { op, addr } => write!(f, "op {op}: policy does not know live block {addr:#x}"),
        }
    }
}

impl std::error::Error for DriveError {}

/// Serve `w` with `p`. With `checked`, every step is verified and the first violation is
/// the error: two live blocks overlap, a request neither placed nor reported as OOM (a
/// free the policy does not know), reserved below live, or the policy's own
/// [`Policy::check`] (run every `check_every` ops and at the end).
pub fn drive(p: &mut dyn Policy, w: &Workload, checked: bool, check_every: usize) -> Result<Run, DriveError> {
    if checked {
        serve(p, w, &mut SpanChecks { spans: BTreeMap::new(), check_every })
    } else {
        serve(p, w, &mut NoChecks)
    }
}

/// Serve `w` with `p`, whose device is (a handle of) `vmm`, telling the device which
/// blocks the program holds ([`StrictVmm::use_block`]) so that it checks CUDA's rules at
/// every driver call; also checks after every op that the policy's
/// [`Policy::reserved`] is what the device has in use (no page kept or dropped
/// without the device knowing). The first violation is the error, with the op index.
pub fn drive_strict(p: &mut dyn Policy, w: &Workload, vmm: &StrictVmm) -> Result<Run, DriveError> {
    serve(p, w, &mut VmmChecks { vmm })
}

/// What a driver verifies besides serving the workload, called at each step of [`serve`]
/// (one loop for every way of driving a policy; the checks are what differ).
trait Checks {
    /// A request (`i`) was served at `a` and is live.
    fn served(&mut self, _i: usize, _a: Addr, _size: u64) -> Result<(), DriveError> {
        Ok(())
    }
    /// A refused request served as a probe at `a`, just before it is freed again.
    fn probe_served(&mut self, _i: usize, _a: Addr, _size: u64) -> Result<(), DriveError> {
        Ok(())
    }
    /// The live block at `a` is about to be freed.
    fn freeing(&mut self, _a: Addr) {}
    /// After op `i`, with the live bytes the policy serves.
    fn after_op(&mut self, _i: usize, _p: &mut dyn Policy, _live: u64) -> Result<(), DriveError> {
        Ok(())
    }
    /// After the last op (and the final `empty_cache`).
    fn at_end(&mut self, _p: &mut dyn Policy, _ops: usize) -> Result<(), DriveError> {
        Ok(())
    }
}

/// [`drive`] unchecked: measures only.
struct NoChecks;
impl Checks for NoChecks {}

/// [`drive`] checked: live blocks never overlap, reserved never below live, and the
/// policy's own [`Policy::check`].
struct SpanChecks {
    /// Live blocks: start -> end.
    spans: BTreeMap<Addr, Addr>,
    check_every: usize,
}

impl SpanChecks {
    fn place(&mut self, a: Addr, size: u64, i: usize) -> Result<(), DriveError> {
        let end = a + round512(size);
        if let Some((&s, &e)) = self.spans.range(..=a).next_back() {
            if e > a {
                return Err(DriveError::Overlap { op: i, start: a, end, live: (s, e) });
            }
        }
        if let Some((&s, &e)) = self.spans.range(a..).next() {
            if s < end {
                return Err(DriveError::Overlap { op: i, start: a, end, live: (s, e) });
            }
        }
        self.spans.insert(a, end);
        Ok(())
    }
}

impl Checks for SpanChecks {
    fn served(&mut self, i: usize, a: Addr, size: u64) -> Result<(), DriveError> {
        self.place(a, size, i)
    }
    fn probe_served(&mut self, i: usize, a: Addr, size: u64) -> Result<(), DriveError> {
        self.place(a, size, i)?;
        self.spans.remove(&a);
        Ok(())
    }
    fn freeing(&mut self, a: Addr) {
        self.spans.remove(&a);
    }
    fn after_op(&mut self, i: usize, p: &mut dyn Policy, live: u64) -> Result<(), DriveError> {
        let r = p.reserved();
        if r < live {
            return Err(DriveError::ReservedBelowLive { op: i, reserved: r, live });
        }
        if self.check_every > 0 && i.is_multiple_of(self.check_every) {
            p.check().map_err(|error| DriveError::Invariant { op: Some(i), error })?;
        }
        Ok(())
    }
    fn at_end(&mut self, p: &mut dyn Policy, _ops: usize) -> Result<(), DriveError> {
        p.check().map_err(|error| DriveError::Invariant { op: None, error })
    }
}

/// [`drive_strict`]: the device is told which blocks the program holds, and checks
/// CUDA's rules at every driver call.
struct VmmChecks<'a> {
    vmm: &'a StrictVmm,
}

impl VmmChecks<'_> {
    fn check(&self, i: usize, p: &dyn Policy) -> Result<(), DriveError> {
        let (v, n) = self.vmm.violations();
        if n > 0 {
            return Err(DriveError::CudaRules { op: i, count: n, first: v.join("; ") });
        }
        if p.reserved() != self.vmm.used() {
            return Err(DriveError::DeviceDisagrees { op: i, policy: p.reserved(), device: self.vmm.used() });
        }
        Ok(())
    }
}

impl Checks for VmmChecks<'_> {
    fn served(&mut self, _i: usize, a: Addr, size: u64) -> Result<(), DriveError> {
        self.vmm.use_block(a, round512(size));
        Ok(())
    }
    fn probe_served(&mut self, _i: usize, a: Addr, size: u64) -> Result<(), DriveError> {
        self.vmm.use_block(a, round512(size));
        self.vmm.end_block(a);
        Ok(())
    }
    // Before the policy frees it: the device must know the block ended before the policy
    // may unmap its pages.
    fn freeing(&mut self, a: Addr) {
        self.vmm.end_block(a);
    }
    fn after_op(&mut self, i: usize, p: &mut dyn Policy, _live: u64) -> Result<(), DriveError> {
        self.check(i, p)
    }
    fn at_end(&mut self, p: &mut dyn Policy, ops: usize) -> Result<(), DriveError> {
        self.vmm.check_blocks();
        self.check(ops, p)
    }
}

/// The one loop: serve `w` with `p`, measuring peaks, with `checks` at every step.
fn serve<C: Checks>(p: &mut dyn Policy, w: &Workload, checks: &mut C) -> Result<Run, DriveError> {
    let mut run = Run::default();
    let mut addr: Vec<Option<Addr>> = vec![None; w.requests as usize];
    let mut live = 0u64;
    let mut releases = w.empty_cache_at.iter().copied().peekable();
    for (i, op) in w.ops.iter().enumerate() {
        while releases.next_if(|&k| k <= i).is_some() {
            p.empty_cache();
        }
        match *op {
            Op::Malloc { id, size, stream, site } => {
                p.hint_site(site);
                match p.malloc(size, stream) {
                    Ok(a) => {
                        checks.served(i, a, size)?;
                        addr[id as usize] = Some(a);
                        live += round512(size);
                        run.peak_live = run.peak_live.max(live);
                    }
                    Err(o) => {
                        run.ooms += 1;
                        if run.first_oom.is_none() {
                            run.first_oom = Some((i, o));
                        }
                    }
                }
            }
            Op::Probe { size, stream, site, .. } => {
                run.probes += 1;
                p.hint_site(site);
                if let Ok(a) = p.malloc(size, stream) {
                    run.probes_served += 1;
                    checks.probe_served(i, a, size)?;
                    // a refused request served as a probe was never live: not in peak_live
                    // (as in `Workload::bounds`), but what it took stays in peak_reserved
                    run.peak_reserved = run.peak_reserved.max(p.reserved());
                    p.free(a).map_err(|e| DriveError::UnknownProbe { op: i, addr: e.0 })?;
                }
            }
            Op::Free { id } => {
                // A block whose request ran out of memory has nothing to free.
                if let Some(a) = addr[id as usize].take() {
                    checks.freeing(a);
                    p.free(a).map_err(|e| DriveError::UnknownLive { op: i, addr: e.0 })?;
                    live -= round512(w.size_of(id));
                }
            }
        }
        run.peak_reserved = run.peak_reserved.max(p.reserved());
        checks.after_op(i, p, live)?;
    }
    if releases.next().is_some() {
        p.empty_cache();
    }
    checks.at_end(p, w.ops.len())?;
    run.final_reserved = p.reserved();
    run.calls = p.calls();
    Ok(run)
}
