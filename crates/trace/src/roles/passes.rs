//! Rule 8: activations and temporaries in forward passes that no training step bounds
//! (forward-only benchmarks, `no_grad` / `inference_mode` runs, evaluation after the
//! last step).
//!
//! A grad-enabled forward saves, in every layer, tensors for the backward pass that
//! autograd keeps until the graph is dropped: the memory made in a pass and still live
//! when it ends grows layer after layer. Under `no_grad` / `inference_mode` nothing is
//! saved: a layer's output is freed as the next layer runs, so what each layer makes is
//! gone by the next layer's end and nothing accumulates across layers. The pass's layers
//! come from the repeats of its allocations ([`crate::steps::layer_spans`]).
//!
//! Principal types: [`Pass`] (a pass with its layers, [`layered`]) and [`PassKind`] (what
//! one pass's layers show).

use fragscope_snapshot::{Action, FxHashMap, StackId, TraceEvent};

use crate::lives::BlockLives;
use crate::steps::Pos;

/// One forward pass no step holds, entries `start..end`, with its layers (entry spans,
/// in order; empty when its allocations repeat no pattern).
pub struct Pass {
    pub start: usize,
    pub end: usize,
    pub layers: Vec<(usize, usize)>,
}

/// The forward runs no step holds ([`unbounded`]) and their passes with their layers
/// ([`layered`]), as `summary` hands them to the roles.
pub struct Layered {
    pub runs: Vec<(usize, usize)>,
    pub passes: Vec<Pass>,
}

/// The passes of the forward runs `runs` (maximal runs of forward entries no step holds,
/// [`unbounded`]) with their layers: each run cut into passes by [`split`], each pass's
/// layers those of [`crate::steps::layer_spans`] over it. Each run is read from the trace
/// once (its `alloc` entries and their signatures); the layers of the run, of its first
/// layer and of each pass are found from slices of that read (on a 6.4 M-entry
/// forward-only trace, reading the trace for each of them was a third of the roles'
/// time). Reads only the trace and the steps: `summary` finds these on the steps' thread,
/// beside the lifetime walk.
pub fn layered(trace: &[TraceEvent], runs: Vec<(usize, usize)>) -> Layered {
    let mut out = Vec::new();
    for &(start, end) in &runs {
        // Entry indices in 4 bytes where they fit (every trace a snapshot can hold in
        // memory): the list is millions long on a long forward-only trace, and it is made
        // beside the lifetime walk, at `summary`'s peak memory.
        if end <= u32::MAX as usize {
            run_passes::<u32>(trace, start, end, &mut out);
        } else {
            run_passes::<usize>(trace, start, end, &mut out);
        }
    }
    Layered { runs, passes: out }
}

/// The passes of one run `start..end` with their layers ([`layered`]), `P` the type its
/// list of `alloc` entries holds them in.
fn run_passes<P: Pos + TryFrom<usize>>(trace: &[TraceEvent], start: usize, end: usize, out: &mut Vec<Pass>) {
    // Room for every entry: untouched capacity is address space, and growing vectors
    // of millions copied them (a fifth of this loop's time).
    // Signatures `(size, stack)` as numbers: hashed once here, not in each part's
    // search, and 4 bytes a signature where 16 made this thread's peak memory meet
    // the lifetime walk's.
    let (mut allocs, mut sigs) = (Vec::<P>::with_capacity(end - start), Vec::<u32>::with_capacity(end - start));
    let mut ids: FxHashMap<(u64, Option<StackId>), u32> = FxHashMap::default();
    for (k, e) in trace[start..end].iter().enumerate() {
        if e.action == Action::Alloc {
            // `P` holds every index below `end` (the caller's choice).
            allocs.extend(P::try_from(start + k).ok());
            let next = ids.len() as u32;
            sigs.push(*ids.entry((e.size, e.stack)).or_insert(next));
        }
    }
    // The run's signatures are numbered as first seen: its own layers need no second
    // numbering (a hash of every one of millions of signatures, and a copy of them).
    let outer = crate::steps::layer_spans_of(&allocs, &sigs, end, Some(ids.len())).unwrap_or_default();
    let inner = outer.first().map_or(0, |&(a, b)| layers_in(&allocs, &sigs, a, b).len());
    for (ps, pe) in split(start, end, &allocs, &outer, inner) {
        let layers = if (ps, pe) == (start, end) { outer.clone() } else { layers_in(&allocs, &sigs, ps, pe) };
        out.push(Pass { start: ps, end: pe, layers });
    }
}

/// The layers of the forward entries `start..end` ([`crate::steps::layer_spans`] of one
/// forward span), from a run's `alloc` entries `allocs` (ascending) and their signatures
/// `sigs` (as numbers), which cover `start..end`.
fn layers_in<P: Pos>(allocs: &[P], sigs: &[u32], start: usize, end: usize) -> Vec<(usize, usize)> {
    let (lo, hi) = (allocs.partition_point(|k| k.at() < start), allocs.partition_point(|k| k.at() < end));
    crate::steps::layer_spans_of(&allocs[lo..hi], &sigs[lo..hi], end, None).unwrap_or_default()
}

/// What a forward pass's layers show about autograd.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PassKind {
    /// Grad-enabled: the layers (all but the last) each keep memory until the pass ends.
    Grad,
    /// `no_grad` / `inference_mode`: no layer but the last keeps memory to the pass's end.
    NoGrad,
    /// Neither clearly (some layers keep memory, some do not), or no layers found.
    Undecided,
}

/// Judges one pass with layers `layers` (entry spans, in order), from the traced blocks
/// made in it (`made`, indices into `lives.traced`, with their requests `req`): per layer
/// but the last two, whether blocks it made are still live when the last layer starts
/// (`no_grad` frees a layer's output in the next layer, so only the last two layers'
/// memory can be live then; autograd keeps every layer's saved tensors). Three quarters
/// of those layers keeping memory is a grad-enabled pass, at most a quarter a `no_grad`
/// one (a stray kept block, a cache filled once, does not make a graph); between, or
/// with under three layers, undecided.
pub fn judge(lives: &BlockLives, req: &[u64], made: &[usize], layers: &[(usize, usize)]) -> PassKind {
    let judged = layers.len().saturating_sub(2);
    if judged == 0 {
        return PassKind::Undecided;
    }
    let mark = layers[layers.len() - 1].0;
    let mut kept = vec![0u64; judged];
    for &i in made {
        let l = &lives.traced[i];
        if l.end < mark {
            continue;
        }
        // The layer that made it: the last whose start is at or before its `alloc`.
        let j = layers.partition_point(|s| s.0 <= l.alloc);
        if j >= 1 && j - 1 < judged && l.alloc < layers[j - 1].1 {
            kept[j - 1] += req[i];
        }
    }
    let keeping = kept.iter().filter(|&&b| b > 0).count();
    if keeping * 4 >= judged * 3 {
        PassKind::Grad
    } else if keeping * 4 <= judged {
        PassKind::NoGrad
    } else {
        PassKind::Undecided
    }
}

/// Where a run of forward entries `start..end` holds several passes (a loop calling the
/// model: the entries between the calls carry no frame that ends the run), the passes.
/// The run's repeats (`outer`, from [`crate::steps::layer_spans`]) are passes when the
/// first of them itself repeats a pattern (`inner_layers`, its layers). The repeats are
/// found from one allocation that recurs once per pass, wherever in the pass it falls:
/// with the run beginning as the first pass does, the passes are `period` allocations
/// each from the run's first (`allocs`: the run's `alloc` entries). Else the run is one
/// pass.
pub(crate) fn split<P: Pos>(
    start: usize,
    end: usize,
    allocs: &[P],
    outer: &[(usize, usize)],
    inner_layers: usize,
) -> Vec<(usize, usize)> {
    let at = |e: usize| allocs.binary_search_by(|k| k.at().cmp(&e)).ok();
    let period = match (outer.first().and_then(|s| at(s.0)), outer.get(1).and_then(|s| at(s.0))) {
        (Some(a), Some(b)) if b > a && inner_layers >= 2 => b - a,
        _ => return vec![(start, end)],
    };
    let mut cuts: Vec<usize> = vec![start];
    cuts.extend((1..outer.len()).filter_map(|k| allocs.get(k * period).map(|p| p.at())));
    cuts.push(end);
    cuts.windows(2).map(|w| (w[0], w[1])).collect()
}

/// The forward passes outside every step: maximal runs of forward entries `(start, end)`
/// that no step holds.
pub fn unbounded(st: &crate::steps::Steps) -> Vec<(usize, usize)> {
    use crate::steps::Phase;
    let mut v: Vec<(usize, usize)> = Vec::new();
    for (k, &p) in st.phase_of.iter().enumerate() {
        if p != Phase::Forward || st.step_of(k).is_some() {
            continue;
        }
        match v.last_mut() {
            Some(last) if last.1 == k => last.1 = k + 1,
            _ => v.push((k, k + 1)),
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_of_repeated_passes_is_cut_every_period_from_its_start() {
        // 3 passes of 10 allocations at entries 100, 102, ...; the allocation that recurs
        // once per pass is the 6th of each: the cuts fall at the 10th and 20th.
        let allocs: Vec<usize> = (0..30).map(|k| 100 + 2 * k).collect();
        let outer = [(110, 130), (130, 150), (150, 170)];
        assert_eq!(split(99, 170, &allocs, &outer, 4), [(99, 120), (120, 140), (140, 170)]);
        // The repeats have no layers of their own: they are the layers of one pass.
        assert_eq!(split(99, 170, &allocs, &outer, 0), [(99, 170)]);
        assert_eq!(split(99, 170, &allocs, &outer[..1], 4), [(99, 170)]);
    }
}
