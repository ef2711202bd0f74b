//! The timeline stacked by role: the tensor bytes each role held
//! ([`fragscope_trace::Role`]: parameters, gradients, optimizer state, activations,
//! temporaries, inputs, other) in the curves' buckets.
//!
//! Each bucket gets two figures per role: the bytes at the bucket's allocated maximum
//! (the state [`crate::curves::Curves::amax`] names, so the stacked bands of one bucket
//! are one moment of the trace and never add up to more than was allocated then), and
//! the most the role held at any state of the bucket (so that no role's maximum is lost
//! at any zoom). Over the whole trace these are `summary`'s and `analyze`'s
//! `roles.by_role` figures: `at_peak` the bands of the bucket holding the allocated
//! peak, `max` the largest per-bucket maximum. The bytes are counted as
//! [`fragscope_trace::DeviceRoles`] counts them: tensor bytes (requests), an
//! out-of-place update counted as a temporary until the block it replaces is freed.

use fragscope_snapshot::Snapshot;
use fragscope_trace::{BlockLives, Role, Roles, LIVE_AT_END};
use serde::Serialize;

use crate::encode;

/// Role bytes of one device in the curves' buckets; arrays are base64 `Float64Array`s
/// of `n × roles.len()` values, bucket-major.
#[derive(Serialize)]
pub struct RoleCurves {
    /// The roles drawn (those that held bytes at some moment), in [`Role::ALL`]'s order,
    /// by their `--json` names.
    pub roles: Vec<&'static str>,
    /// Bytes of each role at the bucket's allocated maximum.
    pub at_amax: String,
    /// The most bytes each role held at any state of the bucket.
    pub max: String,
}

/// The values of [`RoleCurves`] before encoding: `at_amax[b][k]`, `max[b][k]` with `k`
/// indexing [`Role::ALL`].
pub struct RoleBuckets {
    pub at_amax: Vec<[u64; 7]>,
    pub max: Vec<[u64; 7]>,
}

/// Role bytes in buckets of the trace's states: `states` states (events + 1) in
/// `amax.len()` buckets split as the curves split them (state `s` in bucket
/// `s * n / states`), `amax[b]` the state read for bucket `b`'s stack.
///
/// One sweep over the states where a block is made, freed or changes role (as
/// the figures of [`fragscope_trace::DeviceRoles`] are counted); between two of them every
/// role's bytes are constant, so each run of states updates the buckets it covers.
///
/// On a long trace the states are swept in two halves, the first on a thread of its
/// own (it was ~6 % of the report's wall time on the 6.9 M-entry allocator-consistent
/// benchmark file, with the second core idle; the report now makes it as soon as the
/// roles are, beside the rest of the analysis).
pub fn role_buckets(snap: &Snapshot, lives: &BlockLives, roles: &Roles, states: usize, amax: &[usize]) -> RoleBuckets {
    let mid = (lives.traced.len() >= SPLIT_LIVES).then_some(states / 2);
    role_buckets_split(snap, lives, roles, states, amax, mid)
}

/// Traced lives from which [`role_buckets`] sweeps in two halves.
const SPLIT_LIVES: usize = 1 << 16;

/// [`role_buckets`], the states `0..mid` swept on a thread of their own beside `mid..`
/// (`None`: all in one sweep). Each sweep reads the changes of its own states
/// ([`Sweep::part`]); their buckets are merged: each state is in one run of one of them,
/// so a bucket's maximum is the larger of the two and its stack the one of the sweep that
/// holds its allocated maximum.
fn role_buckets_split(
    snap: &Snapshot,
    lives: &BlockLives,
    roles: &Roles,
    states: usize,
    amax: &[usize],
    mid: Option<usize>,
) -> RoleBuckets {
    let n = amax.len();
    let temp = Role::Temporaries as u8;
    // The role each traced life starts in, by life index: an out-of-place update
    // ([`Roles::from_state`]) starts as a temporary. One pass over the map instead of a
    // hash lookup per life, twice (a tenth of the report's CPU on the 6.9 M-entry
    // allocator-consistent benchmark file).
    let mut start_role: Vec<u8> = roles.traced.iter().map(|r| r.role as u8).collect();
    for &i in roles.from_state.keys() {
        start_role[i] = temp;
    }
    let sweep = Sweep { snap, lives, start_role: &start_role, states, amax };
    let Some(mid) = mid.filter(|_| n > 0) else {
        return sweep.run(sweep.part(roles, 0, states));
    };
    // Each sweep reads the changes for its own states (both pass over every life; each
    // keeps its half): on the 6.9 M-entry consistent benchmark file the one pass that
    // dealt them to the two was ~40 % of the role buckets' time, with the other core idle.
    let (first, second) = std::thread::scope(|s| {
        let first = s.spawn(|| sweep.run(sweep.part(roles, 0, mid)));
        let second = sweep.run(sweep.part(roles, mid, states));
        (first.join().expect("the role buckets' thread panicked"), second)
    });
    let mut out = second;
    for (b, &a) in amax.iter().enumerate() {
        for (m, x) in out.max[b].iter_mut().zip(first.max[b]) {
            *m = (*m).max(x);
        }
        if a < mid {
            out.at_amax[b] = first.at_amax[b];
        }
    }
    out
}

/// What the sweeps of [`role_buckets_split`] read.
struct Sweep<'a> {
    snap: &'a Snapshot,
    lives: &'a BlockLives,
    /// The role each traced life starts in.
    start_role: &'a [u8],
    states: usize,
    amax: &'a [usize],
}

/// The states one sweep covers, the role bytes at its first state before that state's
/// allocations and the changes after it ([`Sweep::part`]).
struct Part {
    states: std::ops::Range<usize>,
    /// The bytes of each role once every change up to `states.start` (its own included,
    /// but for the blocks the trace allocates at it, which the sweep adds) is made.
    cur: [i64; 7],
    /// The changes in the sweep's states past its first, as (state, role left, role
    /// entered or 7 for none, request), in no order.
    events: Vec<(usize, u8, u8, u64)>,
    /// The first traced life the sweep adds (made at or after `states.start`).
    first_life: usize,
}

impl Sweep<'_> {
    /// The states `lo..hi` as a sweep takes them, from one pass over the changes: those
    /// at `lo` or before it in its first bytes, those past it and before `hi` in its list.
    /// The bytes at state `x` are those of the blocks live before the trace plus every
    /// change at a state up to `x`: a block made at `alloc + 1`, freed at `end + 1`, or
    /// changing role at its `from_state`.
    fn part(&self, roles: &Roles, lo: usize, hi: usize) -> Part {
        let Sweep { snap, lives, start_role, .. } = *self;
        let trace = snap.trace(lives.device);
        let temp = Role::Temporaries as u8;
        let mut cur = [0i64; 7];
        for (b, r) in lives.seeded.iter().zip(&roles.seeded) {
            cur[r.role as usize] += b.request as i64;
        }
        // Room for every change at once (a change per life and per role change at
        // most): grown by doubling, the list was copied and faulted in again at each
        // step (a tenth of the report's page faults on the 6.4 M-entry consistent
        // benchmark file). Capacity never written is address space only.
        let most = lives.seeded.len() + lives.traced.len() + roles.from_state.len();
        let mut events = Vec::with_capacity(most);
        let mut change = |state: usize, left: u8, entered: u8, q: u64| {
            if state <= lo {
                cur[left as usize] -= q as i64;
                if entered < 7 {
                    cur[entered as usize] += q as i64;
                }
            } else if state < hi {
                events.push((state, left, entered, q));
            }
        };
        for (b, r) in lives.seeded.iter().zip(&roles.seeded) {
            if b.end != LIVE_AT_END {
                change(b.end + 1, r.role as u8, 7, b.request);
            }
        }
        for (&i, &f) in &roles.from_state {
            change(f, temp, roles.traced[i].role as u8, trace[lives.traced[i].alloc()].size);
        }
        for (l, r) in lives.traced.iter().zip(&roles.traced) {
            if l.end() != LIVE_AT_END {
                change(l.end() + 1, r.role as u8, 7, trace[l.alloc()].size);
            }
        }
        // The lives made by `lo` (in the order of their alloc entries) are in the sweep's
        // first bytes (none for the first sweep).
        let first_life = lives.traced.partition_point(|l| l.alloc() < lo);
        for (l, &r) in lives.traced[..first_life].iter().zip(start_role) {
            cur[r as usize] += trace[l.alloc()].size as i64;
        }
        Part { states: lo..hi, cur, events, first_life }
    }

    /// The buckets' figures at the states of `part` (the rest of each bucket left at 0).
    fn run(&self, part: Part) -> RoleBuckets {
        let Sweep { snap, lives, start_role, states, amax } = *self;
        let Part { states: part_states, mut cur, events, first_life } = part;
        let (lo, hi) = (part_states.start, part_states.end);
        let n = amax.len();
        let trace = snap.trace(lives.device);
        let events = by_state(events, lo, hi);
        let mut out = RoleBuckets { at_amax: vec![[0; 7]; n], max: vec![[0; 7]; n] };
        if n == 0 {
            return out;
        }
        // `s * n` fits 64 bits for any trace a snapshot can hold (states and buckets
        // below 2^32 each); u128 only past that, where a u128 division (a library call)
        // per run of states cost more than the sweep around it.
        let (states_d, n_d) = (states.max(1) as u64, n as u64);
        let bucket = |s: usize| {
            let b = match (s as u64).checked_mul(n_d) {
                Some(x) => x / states_d,
                None => ((s as u128 * n_d as u128) / states_d as u128) as u64,
            };
            b.min(n_d - 1) as usize
        };
        let clamp = |v: &[i64; 7]| -> [u64; 7] { std::array::from_fn(|k| v[k].max(0) as u64) };
        // The states [from, to) hold `v`: every bucket they cover takes its maximum, and
        // a bucket whose allocated maximum lies among them takes them as its stack.
        let mut run = |from: usize, to: usize, v: &[i64; 7]| {
            if from >= to || from >= states {
                return;
            }
            let v = clamp(v);
            let (b0, b1) = (bucket(from), bucket(to.min(states) - 1));
            for ((max, at), &a) in out.max[b0..=b1].iter_mut().zip(&mut out.at_amax[b0..=b1]).zip(&amax[b0..=b1]) {
                for (m, x) in max.iter_mut().zip(v) {
                    *m = (*m).max(x);
                }
                if (from..to).contains(&a) {
                    *at = v;
                }
            }
        };
        let (mut a, mut e, mut from) = (first_life, 0usize, lo);
        loop {
            let next_a = lives.traced.get(a).map(|l| l.alloc() + 1).filter(|&s| s < hi);
            let next_e = events.get(e).map(|x| x.0);
            let s = match (next_a, next_e) {
                (None, None) => break,
                (Some(x), Some(y)) => x.min(y),
                (Some(x), None) => x,
                (None, Some(y)) => y,
            };
            run(from, s, &cur);
            while a < lives.traced.len() && lives.traced[a].alloc() + 1 == s {
                let l = &lives.traced[a];
                cur[start_role[a] as usize] += trace[l.alloc()].size as i64;
                a += 1;
            }
            while e < events.len() && events[e].0 == s {
                let (_, from_role, to, q) = events[e];
                cur[from_role as usize] -= q as i64;
                if to < 7 {
                    cur[to as usize] += q as i64;
                }
                e += 1;
            }
            from = s;
        }
        run(from, hi, &cur);
        out
    }
}

/// `events` in order of their state (the first field, in `lo..=hi`), by a counting
/// sort: one count per state, then each event moved to its place. The events of one
/// state keep no particular order (the sweep applies them together, and its sums do not
/// depend on their order). On the 6.9 M-entry allocator-consistent benchmark file (2.2 M
/// events) the comparison sort it replaces took ~4 % of the report's CPU; a pass over
/// the counts and two over the events cost less than its ~21 comparisons per event.
fn by_state(events: Vec<(usize, u8, u8, u64)>, lo: usize, hi: usize) -> Vec<(usize, u8, u8, u64)> {
    let limit = hi.saturating_sub(lo).saturating_add(1);
    // The counts are u32: more events than that (or a state out of the range, which no
    // change has) falls back to the comparison sort.
    if events.len() >= u32::MAX as usize || events.iter().any(|e| e.0 < lo || e.0 - lo >= limit) {
        let mut events = events;
        events.sort_unstable_by_key(|e| e.0);
        return events;
    }
    // `start[s - lo]`: where the events of state `s` begin in the output.
    let mut start = vec![0u32; limit + 1];
    for e in &events {
        start[e.0 - lo + 1] += 1;
    }
    for s in 1..start.len() {
        start[s] += start[s - 1];
    }
    let mut out = vec![(0usize, 0u8, 0u8, 0u64); events.len()];
    for e in events {
        let at = &mut start[e.0 - lo];
        out[*at as usize] = e;
        *at += 1;
    }
    out
}

impl RoleBuckets {
    /// Encoded for the page: only the roles that held bytes at some moment.
    pub fn encode(&self) -> RoleCurves {
        let kept: Vec<usize> = (0..7).filter(|&k| self.max.iter().any(|m| m[k] > 0)).collect();
        let flat = |v: &[[u64; 7]]| -> Vec<f64> { v.iter().flat_map(|r| kept.iter().map(|&k| r[k] as f64)).collect() };
        RoleCurves {
            roles: kept.iter().map(|&k| Role::ALL[k].as_str()).collect(),
            at_amax: encode::f64s(&flat(&self.at_amax)),
            max: encode::f64s(&flat(&self.max)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fragscope_snapshot::{Action, TraceEvent};
    use fragscope_testdata::Rng;
    use fragscope_trace::{classify_roles, role_bytes_at};

    /// The counting sort puts the events in the order of their states, each event once.
    #[test]
    fn by_state_orders_by_state_and_keeps_every_event() {
        let mut rng = Rng(9);
        for round in 0..100 {
            let states = 1 + rng.below(50);
            let events: Vec<(usize, u8, u8, u64)> = (0..rng.below(300))
                .map(|k| (rng.below(states + 1), rng.below(7) as u8, rng.below(8) as u8, k as u64))
                .collect();
            let got = by_state(events.clone(), 0, states);
            assert!(got.windows(2).all(|w| w[0].0 <= w[1].0), "round {round}: out of order");
            let (mut a, mut b) = (got.clone(), events.clone());
            a.sort_unstable();
            b.sort_unstable();
            assert_eq!(a, b, "round {round}: not the same events");
        }
    }

    /// Each bucket against the roles' bytes at every one of its states, counted by
    /// [`role_bytes_at`] (the analysis' own count at one state), on random traces and
    /// bucket counts.
    #[test]
    fn role_buckets_hold_the_bytes_at_each_state() {
        let mut rng = Rng(5);
        for round in 0..200 {
            let mut trace = Vec::new();
            let mut live: Vec<(u64, u64)> = Vec::new();
            let mut next = 1u64 << 20;
            for _ in 0..rng.below(120) {
                if !live.is_empty() && rng.below(3) == 0 {
                    let (addr, size) = live.swap_remove(rng.below(live.len()));
                    trace.push(TraceEvent::new(Action::FreeRequested, addr, size));
                    trace.push(TraceEvent::new(Action::FreeCompleted, addr, size));
                } else {
                    let size = 512 * (1 + rng.below(64) as u64);
                    trace.push(TraceEvent::new(Action::Alloc, next, size));
                    live.push((next, size));
                    next += 1 << 16;
                }
            }
            let mut snap = Snapshot::default();
            snap.device_traces.push(trace);
            let lives = BlockLives::replay(&snap, 0);
            let st = fragscope_trace::steps(&snap, 0);
            let block_roles = classify_roles(&snap, &lives, &st);
            let states = snap.trace(0).len() + 1;
            for buckets in [1, 2, 5, 64] {
                let n = buckets.min(states);
                let amax: Vec<usize> = (0..n).map(|b| (b * states).div_ceil(n)).collect();
                let got = role_buckets(&snap, &lives, &block_roles, states, &amax);
                // Swept in two halves, split anywhere: the same buckets.
                for mid in [0, 1, states / 3, states / 2, states - 1, states] {
                    let split = role_buckets_split(&snap, &lives, &block_roles, states, &amax, Some(mid));
                    assert_eq!(split.max, got.max, "round {round}, {buckets} buckets, split at {mid}");
                    assert_eq!(split.at_amax, got.at_amax, "round {round}, {buckets} buckets, split at {mid}");
                }
                let mut want_max = vec![[0u64; 7]; n];
                for s in 0..states {
                    let v = role_bytes_at(&snap, &lives, &block_roles, s);
                    let b = s * n / states;
                    for k in 0..7 {
                        want_max[b][k] = want_max[b][k].max(v[k]);
                    }
                    if amax[b] == s {
                        assert_eq!(got.at_amax[b], v, "round {round}, {buckets} buckets, state {s}");
                    }
                }
                assert_eq!(got.max, want_max, "round {round}, {buckets} buckets");
            }
        }
    }
}
