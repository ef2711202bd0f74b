//! What a template that started warm carries from one step to the next: the blocks live
//! before its trace that the trace frees (the previous step's leftovers: gradients, the
//! loss, ...) matched with the blocks the trace allocates and leaves live at its end (this
//! step's leftovers, which the next step frees). With the match a predicted step can be
//! replayed again from its own end ([`Carry`]), which is how a prediction rebuilds the
//! cache the target size would build instead of keeping the template's. Also here: how the
//! first rebuilt step starts ([`FirstStep`]), the blocks live before the trace that scale
//! with the size ([`scaled_before`]), and what a warm prediction's range adds for the cache
//! it cannot know ([`cache_ratios`], [`fresh_pages`] under expandable segments,
//! [`unsplit_bytes`] without).

use std::collections::HashMap;

use fragscope_replay::Seeded;
use fragscope_snapshot::{Action, TraceEvent};

/// The step-to-step carry of a template's trace (module doc).
#[derive(Clone, Debug, Default)]
pub(crate) struct Carry {
    /// `(address before the trace, request)`: the block live before the trace at that
    /// address is freed by the trace and stands for what request `q` (an index into the
    /// template's requests) leaves live at the trace's end.
    pub(crate) pairs: Vec<(u64, usize)>,
}

/// The carry of `trace`, whose requests are `req_index` and whose state before it is
/// `seeded`: each block live before the trace and freed in it, in the order of the frees,
/// paired with the first unpaired request live at the end whose requested bytes are the
/// block's (the same tensor one step later).
pub(crate) fn carry(trace: &[TraceEvent], req_index: &[usize], seeded: &Seeded) -> Carry {
    let mut before: HashMap<u64, u64> = seeded.live_blocks().map(|b| (b.addr, b.requested)).collect();
    let mut q_of: HashMap<usize, usize> = HashMap::new();
    for (q, &i) in req_index.iter().enumerate() {
        q_of.insert(i, q);
    }
    let mut live: HashMap<u64, usize> = HashMap::new();
    let mut freed_before: Vec<(u64, u64)> = Vec::new();
    for (i, ev) in trace.iter().enumerate() {
        match ev.action {
            Action::Alloc => {
                if let Some(&q) = q_of.get(&i) {
                    live.insert(ev.addr, q);
                }
            }
            Action::FreeRequested | Action::FreeCompleted if live.remove(&ev.addr).is_none() => {
                if let Some(req) = before.remove(&ev.addr) {
                    freed_before.push((ev.addr, req));
                }
            }
            _ => {}
        }
    }
    let mut live_at_end: Vec<usize> = live.into_values().collect();
    live_at_end.sort_unstable();
    let mut taken = vec![false; live_at_end.len()];
    let mut pairs = Vec::new();
    for (addr, req) in freed_before {
        let hit = live_at_end.iter().enumerate().find(|&(k, &q)| !taken[k] && trace[req_index[q]].size == req);
        if let Some((k, &q)) = hit {
            taken[k] = true;
            pairs.push((addr, q));
        }
    }
    Carry { pairs }
}

/// The blocks live before `snap`'s trace on `device` that the trace never frees, as
/// `(address, requested bytes)` in order of size then address.
fn kept_before(snap: &fragscope_snapshot::Snapshot, device: i64, seeded: &Seeded) -> Vec<(u64, u64)> {
    let mut kept: HashMap<u64, u64> = seeded.live_blocks().map(|b| (b.addr, b.requested)).collect();
    let mut mine: std::collections::HashSet<u64> = std::collections::HashSet::new();
    for ev in snap.trace(device) {
        match ev.action {
            Action::Alloc => {
                mine.insert(ev.addr);
            }
            Action::FreeRequested | Action::FreeCompleted if !mine.remove(&ev.addr) => {
                kept.remove(&ev.addr);
            }
            _ => {}
        }
    }
    let mut v: Vec<(u64, u64)> = kept.into_iter().collect();
    v.sort_unstable_by_key(|&(a, n)| (n, a));
    v
}

/// The blocks live before a warm template's trace that its trace never frees and whose
/// size the recordings show scales with the size, each with the law of its requested
/// bytes: `(template address, law)`. Such a block was made by an earlier step and lives
/// on (a per-size buffer made once, inputs the program keeps), so the run at the target
/// size holds it at that size; kept at the template's size, three such blocks put 4 MiB
/// each where the real run at sequence 256 held 1 MiB (h200-seq from 512 and 1024, warm
/// expandable: allocated +0.22 %, 9 MiB, where every request of the trace was exact). How the recordings show it: sizes
/// every recording holds as often are the same blocks; what is left over is aligned in
/// order of size when every recording has as many, and fitted as the trace's requests
/// are ([`crate::fit::fit`]); none when the counts differ (the blocks cannot be told apart).
pub(crate) fn scaled_before(
    recs: &[crate::Recording<'_>],
    t: usize,
    device: i64,
    template_seeded: &Seeded,
) -> Vec<(u64, crate::SizeFit)> {
    let kept: Vec<Vec<(u64, u64)>> = recs
        .iter()
        .enumerate()
        .map(|(k, r)| {
            if k == t {
                kept_before(r.snap, device, template_seeded)
            } else {
                kept_before(r.snap, device, &Seeded::rebuild(r.snap, device))
            }
        })
        .collect();
    // How many of each size every recording holds: the blocks that do not scale.
    let count = |v: &[(u64, u64)]| {
        let mut m: HashMap<u64, usize> = HashMap::new();
        for &(_, n) in v {
            *m.entry(n).or_default() += 1;
        }
        m
    };
    let counts: Vec<HashMap<u64, usize>> = kept.iter().map(|v| count(v)).collect();
    let common = |n: u64| counts.iter().map(|m| m.get(&n).copied().unwrap_or(0)).min().unwrap_or(0);
    let left: Vec<Vec<(u64, u64)>> = kept
        .iter()
        .map(|v| {
            let mut seen: HashMap<u64, usize> = HashMap::new();
            v.iter()
                .copied()
                .filter(|&(_, n)| {
                    let k = seen.entry(n).or_default();
                    *k += 1;
                    *k > common(n)
                })
                .collect()
        })
        .collect();
    let n = left[t].len();
    if n == 0 || left.iter().any(|v| v.len() != n) {
        return Vec::new();
    }
    (0..n)
        .map(|j| {
            let mut points: Vec<(u64, u64)> = recs.iter().zip(&left).map(|(r, v)| (r.size, v[j].1)).collect();
            points.sort_unstable();
            (left[t][j].0, crate::fit::fit(&points))
        })
        .collect()
}

/// How a warm template's first rebuilt step starts: from what the program's real first
/// step found live, not from the steady state the recording began in. Before a training
/// program's first step only its parameters (and buffers) are live; the rest of what a
/// recording made after warm-up holds before its trace was created by earlier steps, each
/// at its own moment of the first one: the previous step's gradients and outputs (freed by
/// the trace: they do not exist yet), `torch.optim`'s state (AdamW's `exp_avg` and
/// `exp_avg_sq`, created lazily by the first `step()`, in `_init_group`), and blocks made
/// once by the first use of a library (a cuBLAS workspace at the first matmul of each
/// stream, never freed). The cache the first step builds depends on what was live while it
/// ran: kept where the template's own first step put them, those blocks hold segments of
/// the template's size (a 2,000 MiB activation segment at batch 32 held live by a 32 MiB
/// workspace and a 125 MiB gradient, predicting batch 8).
#[derive(Clone, Debug, Default)]
pub(crate) struct FirstStep {
    /// Template addresses of the blocks live before the trace that are not parameters:
    /// released before the first rebuilt step.
    pub(crate) dropped: Vec<u64>,
    /// `(template address, entry)` of those among them the trace never frees: the first
    /// step creates them, the optimizer's state at the trace's first optimizer entry (in
    /// `_init_group`'s order, [`init_group_order`]), others at its first request (where in
    /// the first step they were made, the recording does not say; the earliest moment is
    /// taken) or, under expandable segments, where their address says
    /// (`Program::place_lazies`).
    pub(crate) lazy: Vec<(u64, usize)>,
    /// Template addresses of those of `lazy` that are not the optimizer's state: made
    /// once by the first use of a library somewhere in the first step
    /// (`Program::place_lazies` finds where, under expandable segments).
    pub(crate) unknown: Vec<u64>,
    /// One past the first step's last entry.
    pub(crate) first_end: usize,
}

/// The [`FirstStep`] of a warm template whose steps have an optimizer phase (a training
/// step; None otherwise: its state is kept as recorded).
pub(crate) fn first_step(
    snap: &fragscope_snapshot::Snapshot,
    device: i64,
    first_request: usize,
    seeded: &Seeded,
) -> Option<FirstStep> {
    use fragscope_trace::{Phase, Role, LIVE_AT_END};
    let lives = fragscope_trace::BlockLives::replay(snap, device);
    let (_, steps, mut roles) = fragscope_trace::device_roles_with(snap, &lives);
    let opt = steps.steps.iter().find_map(|s| s.span(Phase::Optimizer))?.0;
    parameters_first(&lives, &mut roles.seeded, seeded);
    let mut plan = FirstStep { first_end: steps.steps.first().map_or(usize::MAX, |s| s.end), ..Default::default() };
    let mut params: Vec<(u64, u64)> = Vec::new();
    let mut state: Vec<(u64, u64)> = Vec::new();
    for (l, r) in lives.seeded.iter().zip(&roles.seeded) {
        let freed = l.end != LIVE_AT_END;
        if matches!(r.role, Role::Parameters | Role::OptimizerState) && freed {
            // Parameters or state a step replaces (updated out of place, not by
            // `torch.optim`'s in-place `step()`): the template holds the last step's
            // outputs, and where the program made the first ones (with the model, before
            // any step) the recording does not say. The template's layout is kept.
            return None;
        }
        if r.role == Role::Parameters {
            params.push((l.address, l.request));
            continue;
        }
        plan.dropped.push(l.address);
        if !freed {
            let at = if r.role == Role::OptimizerState { opt } else { first_request };
            plan.lazy.push((l.address, at));
            if r.role == Role::OptimizerState {
                state.push((l.address, l.request));
            } else {
                plan.unknown.push(l.address);
            }
        }
    }
    // Created in entry order; within the optimizer's entry in `_init_group`'s order.
    let rank = init_group_order(params, state);
    plan.lazy.sort_unstable_by_key(|&(a, at)| (at, rank.get(&a).copied().unwrap_or(usize::MAX), a));
    (!plan.dropped.is_empty()).then_some(plan)
}

/// The order in which `torch.optim`'s `_init_group` creates the optimizer's state, as a
/// rank per template address of a state block: parameter by parameter in the order the
/// model made them (`params`, `(address, requested bytes)`: made one after the other before
/// the first step, their addresses follow that order), each parameter's state tensors one
/// after the other (AdamW: `exp_avg`, then `exp_avg_sq`, each of the parameter's size);
/// each parameter takes the lowest-addressed state blocks of its size not yet taken. Why:
/// where the first step puts each state block decides the holes later steps find, and the
/// template's addresses of the state are where the recording's first step put them among
/// the activations it had freed (best fit, not creation order). The real first step of the
/// H200 bf16 batch 16 recording creates 125 MiB, 125 MiB, 2 MiB, 2 MiB, 4 KiB, ... (pairs,
/// parameter order), while address order began 2 MiB, 4 MiB, 4 MiB, 12 MiB; so ordered,
/// the warm (non-expandable) predictions of batch 4 from 8, 16, 32 went from −1.52 % to
/// +0.49 % and of sequence 256 from 512, 1024 from +1.58 % to +0.68 %. Empty (address
/// order kept) when the state is not a whole number of blocks per parameter of its size.
fn init_group_order(mut params: Vec<(u64, u64)>, state: Vec<(u64, u64)>) -> HashMap<u64, usize> {
    if params.is_empty() || state.is_empty() || !state.len().is_multiple_of(params.len()) {
        return HashMap::new();
    }
    let per = state.len() / params.len();
    params.sort_unstable();
    let mut by_size: HashMap<u64, std::collections::VecDeque<u64>> = HashMap::new();
    let mut sorted = state;
    sorted.sort_unstable();
    for (a, n) in sorted {
        by_size.entry(n).or_default().push_back(a);
    }
    let mut rank = HashMap::new();
    for (_, n) in params {
        for _ in 0..per {
            let Some(a) = by_size.get_mut(&n).and_then(|q| q.pop_front()) else { return HashMap::new() };
            rank.insert(a, rank.len());
        }
    }
    rank
}

/// Which of the blocks live before the trace are the parameters and which the optimizer's
/// state, where the roles were only counted (`ParamBeforeTraceCounted`: no frames tell
/// `torch.optim`'s `_init_group` from the model's construction, as in a snapshot written
/// by a replay, whose blocks carry no stacks) and the blocks lie in expandable
/// reservations: per size, the lowest addresses are the parameters. Why: the model's
/// parameters are made before its first step creates AdamW's `exp_avg` / `exp_avg_sq`, and
/// an expandable reservation maps its pages from its start on demand (spec §6.2: the first
/// unmapped block in address order), so what is made earlier sits lower until something
/// is freed below it; the state, made after backward freed the activations above the
/// parameters, lands above them. The counting kept the first of each size in seeding
/// order, which put AdamW state among the parameters and parameters 8 GB up the
/// reservation (h200 batch 32, expandable, cut after its first step): the first rebuilt
/// step then started with pages mapped all that way up. Totals are unchanged.
fn parameters_first(lives: &fragscope_trace::BlockLives, roles: &mut [fragscope_trace::BlockRole], seeded: &Seeded) {
    use fragscope_trace::{BlockRole, Reason, Role, LIVE_AT_END};
    let mut reservations: Vec<(u64, u64)> =
        seeded.segments().filter(|s| s.expandable).map(|s| (s.addr, s.end())).collect();
    reservations.sort_unstable();
    let expandable = |a: u64| {
        let k = reservations.partition_point(|r| r.0 <= a);
        k > 0 && a < reservations[k - 1].1
    };
    // Per requested size: the counted blocks (address, index) and how many are parameters.
    let mut by_size: HashMap<u64, (Vec<(u64, usize)>, usize)> = HashMap::new();
    for (i, (l, r)) in lives.seeded.iter().zip(roles.iter()).enumerate() {
        let counted = matches!(r.reason, Reason::ParamBeforeTraceCounted | Reason::OptBeforeTraceCounted);
        if !counted || l.end != LIVE_AT_END || !expandable(l.address) {
            continue;
        }
        let e = by_size.entry(l.request).or_default();
        e.0.push((l.address, i));
        e.1 += usize::from(r.reason == Reason::ParamBeforeTraceCounted);
    }
    for (mut blocks, params) in by_size.into_values() {
        blocks.sort_unstable();
        for (k, &(_, i)) in blocks.iter().enumerate() {
            roles[i] = if k < params {
                BlockRole { role: Role::Parameters, reason: Reason::ParamBeforeTraceCounted }
            } else {
                BlockRole { role: Role::OptimizerState, reason: Reason::OptBeforeTraceCounted }
            };
        }
    }
}

/// The pages one request maps where it finds no free run of its size in an expandable
/// reservation: `request` rounded up to whole pages of `page` bytes (spec §6.2 step 3:
/// an unmapped candidate maps `min(C.size, s)` rounded up to pages). Why a warm
/// expandable prediction's range adds it over its rebuilt peaks: pages stay mapped until
/// `empty_cache()` (§6.4), so reserved is the most any step of the run ever mapped, and
/// which step's layout leaves no hole for a large request depends on where the first step
/// put each block (the large blocks a step keeps across its end, the last logits, land on
/// the layout earlier steps left). Measured on the H200 recordings replayed under
/// expandable segments: the third step still mapped one request more than the first two —
/// a 260 MiB logits-sized request at batch 4 (4.24 -> 4.51 GB), 500 MiB at bf16 batch 16
/// (8.00 -> 8.52 GB), 240 MiB at sequence 256 (4.25 -> 4.50 GB) — each under the largest
/// request of its step. The rebuild from the parameters maps them too once the first
/// step's workspaces are made where the template's were (`Program::place_lazies`), and
/// misses them with those made at the first request (−6.0 %, −6.2 %, −5.6 %): a few entries
/// decide it.
pub(crate) fn fresh_pages(request: u64, page: u64) -> u64 {
    request.div_ceil(page.max(1)) * page.max(1)
}

/// The bytes a peak of `allocated` bytes counts beyond its live blocks' rounded sizes
/// (`rounded`): the remainders of cached blocks handed out whole (spec §3.8). A warm
/// template's allocated range spans them both ways (`Program::range_of`): measured on
/// the frozen evaluation's warm forms, the real peak was 2.9 MB over the rebuild's at
/// niu-train3 100 from 150, 200, whose rebuilt peak counted 10.0 MB of remainders, while
/// under expandable segments (split from 512 B on) the same prediction is exact.
pub(crate) fn unsplit_bytes(allocated: u64, rounded: u64) -> u64 {
    allocated.saturating_sub(rounded)
}

/// The peak reserved bytes of each recording of `recs` replayed as itself on `device`
/// under its recorded settings (`(size, peak)`; a recording that does not replay without
/// running out of memory is left out).
pub(crate) fn recorded_peaks(recs: &[crate::Recording<'_>], device: i64) -> Vec<(u64, u64)> {
    recs.iter()
        .filter_map(|r| {
            let cfg = fragscope_replay::recorded_config(r.snap);
            let w = fragscope_replay::simulate_with(r.snap, device, cfg, &fragscope_replay::SimOptions::default());
            (w.ooms == 0 && w.peak_reserved > 0).then_some((r.size, w.peak_reserved))
        })
        .collect()
}

/// The least share by which a warm template's rebuilt cache may be off either way. Measured
/// on the frozen evaluation's warm forms without expandable segments, once the first
/// rebuilt step started from the parameters ([`FirstStep`], the optimizer's state in
/// `_init_group`'s order): the templates' own sizes were within 0.4 % on the H200 GPT
/// families while the error at a size not among them reached 1.3 % (sequence 512 from 256,
/// 1024) and 2.9 % (niu-train3 100 from 150, 200); 3 %, the evaluation's tolerance, holds
/// them all.
pub(crate) const CACHE_FLOOR: f64 = 0.03;

/// How far a warm template's rebuilt cache may be off: `[1 − m, 1 + m]`, `m` the largest
/// share by which a recording's real peak reserved (`peaks`) differs from the prediction
/// of its size (`predicted`). Why a range and not a correction: the real cache was built
/// by the recording's first step, which the recording does not hold (the step that also
/// creates the optimizer's state among freed activations, and places the long-lived
/// blocks in segments sized by that step), and the rebuild replays the steady step in its
/// stead. Why both ways: on the frozen evaluation's warm forms the rebuild's error changes
/// sign from one size to the next (h200-batch from 16 and 32: +8.6 % at batch 4, −2.7 % at
/// 32), so a recording's own error bounds how far off the rebuild is, not which way.
/// Never less than [`CACHE_FLOOR`]: the recorded sizes' own errors understate the error at
/// the sizes between and past them.
pub(crate) fn cache_ratios(peaks: &[(u64, u64)], mut predicted: impl FnMut(u64) -> u64) -> [f64; 2] {
    let mut m = CACHE_FLOOR;
    for &(size, real) in peaks {
        let p = predicted(size);
        if p > 0 {
            m = m.max((real as f64 / p as f64 - 1.0).abs());
        }
    }
    [1.0 - m, 1.0 + m]
}

#[cfg(test)]
mod tests {
    use super::{cache_ratios, fresh_pages, init_group_order, CACHE_FLOOR};

    #[test]
    fn init_group_order_makes_each_parameters_state_one_after_the_other() {
        // Parameters of 8, 2 and 8 bytes at 100, 200, 300; AdamW's two state tensors each,
        // in the template at addresses whose order is not the creation order.
        let params = vec![(300, 8), (100, 8), (200, 2)];
        let state = vec![(1000, 8), (1100, 2), (1200, 8), (1300, 8), (1400, 2), (1500, 8)];
        let rank = init_group_order(params, state);
        let mut order: Vec<(u64, usize)> = rank.into_iter().collect();
        order.sort_unstable_by_key(|&(_, r)| r);
        let addrs: Vec<u64> = order.into_iter().map(|(a, _)| a).collect();
        // Parameter 100 (8 B): the two lowest 8-byte blocks; 200 (2 B): both 2-byte ones;
        // 300 (8 B): the rest.
        assert_eq!(addrs, vec![1000, 1200, 1100, 1400, 1300, 1500]);
        // Not a whole number of state blocks per parameter, or a size no parameter has:
        // no order (the template's address order is kept).
        assert!(init_group_order(vec![(100, 8), (200, 8)], vec![(1000, 8), (1100, 8), (1200, 8)]).is_empty());
        assert!(init_group_order(vec![(100, 8)], vec![(1000, 4)]).is_empty());
    }

    #[test]
    fn fresh_pages_round_a_request_up_to_whole_pages() {
        const MIB: u64 = 1 << 20;
        // A 260 MiB logits request in 20 MiB pages: 13 pages, exactly.
        assert_eq!(fresh_pages(260 * MIB, 20 * MIB), 260 * MIB);
        // One byte more: a page more (the near miss of rounding down or to the byte).
        assert_eq!(fresh_pages(260 * MIB + 1, 20 * MIB), 280 * MIB);
        assert_eq!(fresh_pages(0, 20 * MIB), 0);
    }

    #[test]
    fn cache_ratios_bound_the_largest_error_both_ways() {
        // Real peaks 104 and 97 where the rebuild predicts 100 each: 4 % the largest error.
        let r = cache_ratios(&[(4, 104), (8, 97)], |_| 100);
        assert!((r[0] - 0.96).abs() < 1e-12 && (r[1] - 1.04).abs() < 1e-12, "{r:?}");
        // Errors under the floor: the floor.
        let r = cache_ratios(&[(4, 101)], |_| 100);
        assert!((r[0] - (1.0 - CACHE_FLOOR)).abs() < 1e-12 && (r[1] - (1.0 + CACHE_FLOOR)).abs() < 1e-12, "{r:?}");
        assert_eq!(cache_ratios(&[], |_| 100), [1.0 - CACHE_FLOOR, 1.0 + CACHE_FLOOR]);
    }
}
