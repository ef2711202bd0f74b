//! [`drive`]: serve a [`Workload`] with a [`Policy`], measuring peaks and, when asked,
//! checking every step; [`drive_strict`]: the same over a [`StrictVmm`], which checks
//! every driver call against CUDA's rules.

use std::collections::BTreeMap;

use super::{round512, DriverCalls, Op, Policy, PolicyOom, Workload};
use crate::{Addr, StrictVmm};

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

/// Serve `w` with `p`. With `checked`, every step is verified and the first violation is
/// the error: two live blocks overlap, a request neither placed nor reported as OOM (a
/// free the policy does not know), reserved below live, or the policy's own
/// [`Policy::check`] (run every `check_every` ops and at the end).
pub fn drive(p: &mut dyn Policy, w: &Workload, checked: bool, check_every: usize) -> Result<Run, String> {
    let mut run = Run::default();
    let mut addr: Vec<Option<Addr>> = vec![None; w.requests as usize];
    let mut live = 0u64;
    let mut spans: BTreeMap<Addr, Addr> = BTreeMap::new();
    let place = |spans: &mut BTreeMap<Addr, Addr>, a: Addr, size: u64, i: usize| -> Result<(), String> {
        let end = a + round512(size);
        if let Some((&s, &e)) = spans.range(..=a).next_back() {
            if e > a {
                return Err(format!("op {i}: block [{a:#x}, {end:#x}) overlaps live [{s:#x}, {e:#x})"));
            }
        }
        if let Some((&s, &e)) = spans.range(a..).next() {
            if s < end {
                return Err(format!("op {i}: block [{a:#x}, {end:#x}) overlaps live [{s:#x}, {e:#x})"));
            }
        }
        spans.insert(a, end);
        Ok(())
    };
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
                        if checked {
                            place(&mut spans, a, size, i)?;
                        }
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
                    if checked {
                        place(&mut spans, a, size, i)?;
                        spans.remove(&a);
                    }
                    // a refused request served as a probe was never live: not in peak_live
                    // (as in `Workload::bounds`), but what it took stays in peak_reserved
                    run.peak_reserved = run.peak_reserved.max(p.reserved());
                    p.free(a)
                        .map_err(|e| format!("op {i}: policy does not know the block it just gave, {:#x}", e.0))?;
                }
            }
            Op::Free { id } => {
                // A block whose request ran out of memory has nothing to free.
                if let Some(a) = addr[id as usize].take() {
                    let size = w.size_of(id);
                    p.free(a).map_err(|e| format!("op {i}: policy does not know live block {:#x}", e.0))?;
                    live -= round512(size);
                    if checked {
                        spans.remove(&a);
                    }
                }
            }
        }
        let r = p.reserved();
        run.peak_reserved = run.peak_reserved.max(r);
        if checked {
            if r < live {
                return Err(format!("op {i}: reserved {r} < live {live}"));
            }
            if check_every > 0 && i % check_every == 0 {
                p.check().map_err(|e| format!("op {i}: {e}"))?;
            }
        }
    }
    if releases.next().is_some() {
        p.empty_cache();
    }
    if checked {
        p.check().map_err(|e| format!("end: {e}"))?;
    }
    run.final_reserved = p.reserved();
    run.calls = p.calls();
    Ok(run)
}

/// Serve `w` with `p`, whose device is (a handle of) `vmm`, telling the device which
/// blocks the program holds ([`StrictVmm::use_block`]) so that it checks CUDA's rules at
/// every driver call; also checks after every op that the policy's
/// [`Policy::reserved`] is what the device has in use (no page kept or dropped
/// without the device knowing). The first violation is the error, with the op index.
pub fn drive_strict(p: &mut dyn Policy, w: &Workload, vmm: &StrictVmm) -> Result<Run, String> {
    let mut run = Run::default();
    let mut addr: Vec<Option<Addr>> = vec![None; w.requests as usize];
    let mut releases = w.empty_cache_at.iter().copied().peekable();
    let check = |i: usize, p: &dyn Policy| -> Result<(), String> {
        let (v, n) = vmm.violations();
        if n > 0 {
            return Err(format!("op {i}: {n} violation(s) of CUDA's rules, first: {}", v.join("; ")));
        }
        if p.reserved() != vmm.used() {
            return Err(format!(
                "op {i}: the policy holds {} bytes, the device has {} in use",
                p.reserved(),
                vmm.used()
            ));
        }
        Ok(())
    };
    for (i, op) in w.ops.iter().enumerate() {
        while releases.next_if(|&k| k <= i).is_some() {
            p.empty_cache();
        }
        match *op {
            Op::Malloc { id, size, stream, site } => {
                p.hint_site(site);
                match p.malloc(size, stream) {
                    Ok(a) => {
                        vmm.use_block(a, round512(size));
                        addr[id as usize] = Some(a);
                    }
                    Err(_) => run.ooms += 1,
                }
            }
            Op::Probe { size, stream, site, .. } => {
                run.probes += 1;
                p.hint_site(site);
                if let Ok(a) = p.malloc(size, stream) {
                    run.probes_served += 1;
                    vmm.use_block(a, round512(size));
                    vmm.end_block(a);
                    p.free(a).map_err(|e| format!("op {i}: unknown block {:#x}", e.0))?;
                }
            }
            Op::Free { id } => {
                if let Some(a) = addr[id as usize].take() {
                    vmm.end_block(a);
                    p.free(a).map_err(|e| format!("op {i}: unknown block {:#x}", e.0))?;
                }
            }
        }
        run.peak_reserved = run.peak_reserved.max(p.reserved());
        check(i, p)?;
    }
    if releases.next().is_some() {
        p.empty_cache();
    }
    vmm.check_blocks();
    check(w.ops.len(), p)?;
    run.final_reserved = p.reserved();
    run.calls = p.calls();
    Ok(run)
}
