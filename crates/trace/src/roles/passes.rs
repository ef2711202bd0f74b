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

use crate::hugepages::HugePages;
use crate::lives::BlockLives;
use crate::steps::Allocs;

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
        // Signatures `(size, stack)` as numbers: hashed once here, not in each part's
        // search, and 4 bytes a signature where 16 made this thread's peak memory meet
        // the lifetime walk's. Room for every entry: untouched capacity is address
        // space, and growing vectors of millions copied them.
        let mut sigs = Vec::<u32>::with_capacity(end - start);
        // Written once, front to back: in huge pages ([`crate::hugepages`]).
        sigs.huge_pages();
        let mut marks = Vec::new();
        let mut ids: FxHashMap<(u64, Option<StackId>), u32> = FxHashMap::default();
        for (k, e) in trace[start..end].iter().enumerate() {
            if e.action == Action::Alloc {
                if sigs.len().is_multiple_of(Sparse::EVERY) {
                    marks.push(start + k);
                }
                let next = ids.len() as u32;
                sigs.push(*ids.entry((e.size, e.stack)).or_insert(next));
            }
        }
        let allocs = Sparse { trace, end, marks, count: sigs.len() };
        // The run's signatures are numbered as first seen: its own layers need no second
        // numbering (a hash of every one of millions of signatures, and a copy of them).
        let outer = crate::steps::layer_spans_of(&allocs, 0, &sigs, end, Some(ids.len())).unwrap_or_default();
        let inner = outer.first().map_or(0, |&(a, b)| layers_in(&allocs, &sigs, a, b).len());
        for (ps, pe) in split(start, end, &allocs, &outer, inner) {
            let layers = if (ps, pe) == (start, end) { outer.clone() } else { layers_in(&allocs, &sigs, ps, pe) };
            out.push(Pass { start: ps, end: pe, layers });
        }
    }
    Layered { runs, passes: out }
}

/// A run's `alloc` entries without a list of them: the entry of every [`Sparse::EVERY`]th
/// kept, the others found by reading the trace on from it. On a 6.4 M-entry
/// forward-only trace the list was 2.2 M entries (9–18 MB) made beside the lifetime walk,
/// at `summary`'s peak memory; the layers ask for a few thousand positions.
struct Sparse<'t> {
    trace: &'t [TraceEvent],
    /// The run's end (no `alloc` entry of the run at or past it).
    end: usize,
    /// `marks[j]`: the entry of the `j * EVERY`th `alloc`.
    marks: Vec<usize>,
    count: usize,
}

impl Sparse<'_> {
    const EVERY: usize = 64;
}

impl Allocs for Sparse<'_> {
    fn count(&self) -> usize {
        self.count
    }

    fn entry(&self, p: usize) -> usize {
        let mut e = self.marks[p / Self::EVERY];
        for _ in 0..p % Self::EVERY {
            e += 1;
            while self.trace[e].action != Action::Alloc {
                e += 1;
            }
        }
        e
    }

    fn before(&self, e: usize) -> usize {
        let j = self.marks.partition_point(|&m| m < e);
        if j == 0 {
            return 0;
        }
        let from = self.marks[j - 1];
        let upto = e.min(self.end);
        (j - 1) * Self::EVERY + self.trace[from..upto].iter().filter(|x| x.action == Action::Alloc).count()
    }
}

/// The layers of the forward entries `start..end` ([`crate::steps::layer_spans`] of one
/// forward span), from a run's `alloc` entries `allocs` and their signatures `sigs` (as
/// numbers, by position), which cover `start..end`.
fn layers_in(allocs: &impl Allocs, sigs: &[u32], start: usize, end: usize) -> Vec<(usize, usize)> {
    let (lo, hi) = (allocs.before(start), allocs.before(end));
    crate::steps::layer_spans_of(allocs, lo, &sigs[lo..hi], end, None).unwrap_or_default()
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

/// A pass is judged ([`verdict`]) from this tally, with layers `layers` (entry spans, in
/// order), of the traced blocks made in it (`made`, indices into `lives.traced` in `alloc` order, with their requests
/// `req`): per layer but the last two, whether blocks it made are still live when the
/// last layer starts (`no_grad` frees a layer's output in the next layer, so only the
/// last two layers' memory can be live then; autograd keeps every layer's saved
/// tensors). Three quarters of those layers keeping memory is a grad-enabled pass, at
/// most a quarter a `no_grad` one (a stray kept block, a cache filled once, does not make
/// a graph); between, or with under three layers, undecided.
///
/// The tally: per judged layer (all but the last two), the request bytes of the blocks
/// in `made` it made that are still live when the last layer starts. Tallies of parts of
/// `made` add up to the tally of the whole (so a long pass is tallied in parts on
/// several threads).
pub fn kept_by_layer(
    lives: &BlockLives,
    req: &[u64],
    made: impl IntoIterator<Item = usize>,
    layers: &[(usize, usize)],
) -> Vec<u64> {
    let judged = layers.len().saturating_sub(2);
    let mut kept = vec![0u64; judged];
    if judged == 0 {
        return kept;
    }
    let mark = layers[layers.len() - 1].0;
    // The layer that made a block: the last whose start is at or before its `alloc`.
    // The blocks come in `alloc` order, so a cursor over the layers finds it (a search
    // per block was a third of rule 8 on a 2.2 M-life pass with thousands of layers).
    let mut j = 0;
    for i in made {
        let l = &lives.traced[i];
        while j < layers.len() && layers[j].0 <= l.alloc() {
            j += 1;
        }
        if l.end() < mark {
            continue;
        }
        if j >= 1 && j - 1 < judged && l.alloc() < layers[j - 1].1 {
            kept[j - 1] += req[i];
        }
    }
    kept
}

/// What a pass's tally ([`kept_by_layer`]) shows.
pub fn verdict(kept: &[u64]) -> PassKind {
    let judged = kept.len();
    if judged == 0 {
        return PassKind::Undecided;
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
pub(crate) fn split<A: Allocs + ?Sized>(
    start: usize,
    end: usize,
    allocs: &A,
    outer: &[(usize, usize)],
    inner_layers: usize,
) -> Vec<(usize, usize)> {
    // The position of entry `e` among the allocations, if it is one.
    let at = |e: usize| Some(allocs.before(e)).filter(|&p| p < allocs.count() && allocs.entry(p) == e);
    let period = match (outer.first().and_then(|s| at(s.0)), outer.get(1).and_then(|s| at(s.0))) {
        (Some(a), Some(b)) if b > a && inner_layers >= 2 => b - a,
        _ => return vec![(start, end)],
    };
    let mut cuts: Vec<usize> = vec![start];
    cuts.extend((1..outer.len()).map(|k| k * period).filter(|&p| p < allocs.count()).map(|p| allocs.entry(p)));
    cuts.push(end);
    cuts.windows(2).map(|w| (w[0], w[1])).collect()
}

/// The forward passes outside every step: maximal runs of forward entries `(start, end)`
/// that no step holds ([`unbounded_by_entry`], the definition). Read run by run over the
/// entries between steps, not entry by entry with a search of the steps for each (on a
/// 6.4 M-entry forward-only trace, 5 ms beside the lifetime walk).
pub fn unbounded(st: &crate::steps::Steps) -> Vec<(usize, usize)> {
    use crate::steps::Phase;
    // [`crate::steps::Steps::step_of`] finds an entry's step among the steps by their
    // starts: in start order, as the steps are found, entry `k` from one step's start to
    // the next one's is held when before the step's end.
    if !st.steps.windows(2).all(|w| w[0].start <= w[1].start) {
        return unbounded_by_entry(st);
    }
    let phase_of = &st.phase_of[..];
    let n = phase_of.len();
    let mut v: Vec<(usize, usize)> = Vec::new();
    // The forward runs of the entries `a..b`, which no step holds, joined to the run
    // before them where it ends at `a`.
    let mut free = |a: usize, b: usize| {
        let mut k = a;
        while k < b {
            let e = k + crate::steps::run_end(&phase_of[k..b], 0);
            if phase_of[k] == Phase::Forward {
                match v.last_mut() {
                    Some(last) if last.1 == k => last.1 = e,
                    _ => v.push((k, e)),
                }
            }
            k = e;
        }
    };
    free(0, st.steps.first().map_or(n, |s| s.start.min(n)));
    for (j, s) in st.steps.iter().enumerate() {
        let next = st.steps.get(j + 1).map_or(n, |t| t.start.min(n));
        free(s.start.max(s.end).min(next), next);
    }
    v
}

/// [`unbounded`] entry by entry: the definition, and the way for steps out of start
/// order.
fn unbounded_by_entry(st: &crate::steps::Steps) -> Vec<(usize, usize)> {
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
        assert_eq!(split(99, 170, &allocs[..], &outer, 4), [(99, 120), (120, 140), (140, 170)]);
        // The repeats have no layers of their own: they are the layers of one pass.
        assert_eq!(split(99, 170, &allocs[..], &outer, 0), [(99, 170)]);
        assert_eq!(split(99, 170, &allocs[..], &outer[..1], 4), [(99, 170)]);
    }

    #[test]
    fn forward_runs_outside_the_steps_are_the_definitions() {
        // Random phases and steps (some empty, some out of the trace, some overlapping the
        // next, some out of start order): the runs read between the steps are those of
        // the entry-by-entry definition.
        use crate::steps::{Phase, Step, StepSource, Steps};
        let mut rng = fragscope_testdata::Rng(17);
        let phases = [Phase::Outside, Phase::Forward, Phase::Forward, Phase::Backward, Phase::Optimizer];
        let (mut runs, mut held) = (0, 0);
        for round in 0..300 {
            let n = rng.below(200);
            let mut phase_of = Vec::with_capacity(n);
            while phase_of.len() < n {
                let p = phases[rng.below(phases.len())];
                let len = 1 + rng.below(20);
                phase_of.extend(std::iter::repeat_n(p, len.min(n - phase_of.len())));
            }
            let mut starts: Vec<usize> = (0..rng.below(6)).map(|_| rng.below(n + 10)).collect();
            if rng.below(4) != 0 {
                starts.sort_unstable();
            }
            let steps = starts
                .iter()
                .map(|&s| Step { start: s, end: s + rng.below(60), phases: Vec::new(), complete: true, layers: None })
                .collect();
            let st = Steps {
                device: 0,
                source: StepSource::None,
                evidence: Vec::new(),
                steps,
                after_last_step: None,
                reason: None,
                phase_of,
            };
            let want = unbounded_by_entry(&st);
            assert_eq!(unbounded(&st), want, "round {round}");
            runs += want.len();
            held += (0..n).filter(|&k| st.step_of(k).is_some()).count();
        }
        // The rounds had runs to find, and entries the steps hold.
        assert!(runs > 100 && held > 1000, "{runs} runs, {held} held entries");
    }

    #[test]
    fn the_sparse_index_finds_what_the_list_holds() {
        // Runs of random entries (a third allocs), some longer than several marks: every
        // position's entry, and the allocations before every entry, as the full list has.
        let mut rng = fragscope_testdata::Rng(5);
        for round in 0..50 {
            let n = rng.below(600);
            let actions = [Action::Alloc, Action::FreeRequested, Action::FreeCompleted];
            let trace: Vec<TraceEvent> = (0..n).map(|_| TraceEvent::new(actions[rng.below(3)], 0, 512)).collect();
            let start = rng.below(n + 1);
            let end = start + rng.below(n + 1 - start);
            let list: Vec<usize> = (start..end).filter(|&k| trace[k].action == Action::Alloc).collect();
            let marks = list.iter().copied().step_by(Sparse::EVERY).collect();
            let sparse = Sparse { trace: &trace, end, marks, count: list.len() };
            assert_eq!(sparse.count(), list.len());
            for (p, &e) in list.iter().enumerate() {
                assert_eq!(sparse.entry(p), e, "round {round}, position {p}");
            }
            for e in 0..=n + 1 {
                assert_eq!(sparse.before(e), list[..].before(e), "round {round}, entry {e}");
            }
        }
    }
}
