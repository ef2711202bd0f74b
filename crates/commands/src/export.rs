//! `export`: the rows of the export's `allocations` table, derived here so that every
//! front end exports the same thing — each alloc entry paired with its frees
//! ([`pair_allocations`], into [`Allocations`]) and the role the trace analysis gives
//! each ([`allocation_roles`]: the block lives `summary`'s roles use; [`block_roles`] and
//! [`roles_of_rows`] its two halves, for a caller that finds the roles beside the pairing,
//! as the CLI does). Writing the tables
//! (Parquet) is the CLI's, a block of rows at a time ([`Allocations::rows_into`] gives
//! them as [`AllocRow`]s).

use std::ops::Range;

use fragscope_snapshot::{Action, Snapshot, StackId, TraceEvent};

use crate::hugepages::reserve_huge;

/// One row of `allocations` before its columns are derived: the alloc entry, the free
/// entries paired with it, and what the alloc (or, without one, the free) recorded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllocRow {
    /// The alloc entry (`None`: allocated before the trace).
    pub alloc: Option<usize>,
    /// The `free_requested` entry.
    pub fr: Option<usize>,
    /// The `free_completed` entry.
    pub fc: Option<usize>,
    pub addr: u64,
    /// The requested size (what the alloc entry, or without one the free, recorded).
    pub req: u64,
    pub stream: i64,
    pub stack: Option<StackId>,
    /// The alloc entry's `time_us` ([`fragscope_snapshot::NO_TIME`] without one).
    pub time: i64,
    /// The `time_us` of the free that ended it: its `free_completed`, else its
    /// `free_requested` ([`fragscope_snapshot::NO_TIME`] without either).
    pub end: i64,
}

/// A device's allocations, in the order of [`pair_allocations`]: the rows the trace's
/// entries make, then those [`allocation_roles`] adds for blocks live through the whole
/// trace.
///
/// A row of the trace is kept as the indices of its entries and the time of its free
/// (24 bytes on traces of under 2^32 entries, [`Pair`]), not as an [`AllocRow`] (96
/// bytes): what an `AllocRow` holds besides is its alloc (or first free) entry's, read
/// again from the trace when a block of rows is written ([`Allocations::rows_into`]). On
/// the 6.4 M-entry benchmark file the 2.2 M rows as `AllocRow`s were 194 MB written once
/// and read once, 47 k page faults.
pub struct Allocations {
    pairs: Pairs,
    /// Rows without any entry: blocks live through the whole trace ([`allocation_roles`]).
    whole: Vec<AllocRow>,
}

/// The rows of the trace, with indices as narrow as the trace's length allows.
enum Pairs {
    Narrow(Vec<Pair<u32>>),
    Wide(Vec<Pair<usize>>),
}

/// An entry index, or none.
trait Idx: Copy {
    const NONE: Self;
    /// `i`, which the caller has checked is below `NONE`.
    fn of(i: usize) -> Self;
    fn get(self) -> Option<usize>;
}

impl Idx for u32 {
    const NONE: u32 = u32::MAX;
    #[inline]
    fn of(i: usize) -> u32 {
        i as u32
    }
    #[inline]
    fn get(self) -> Option<usize> {
        (self != u32::MAX).then_some(self as usize)
    }
}

impl Idx for usize {
    const NONE: usize = usize::MAX;
    #[inline]
    fn of(i: usize) -> usize {
        i
    }
    #[inline]
    fn get(self) -> Option<usize> {
        (self != usize::MAX).then_some(self)
    }
}

/// One row of the trace: its alloc, `free_requested` and `free_completed` entries
/// ([`Idx::NONE`] where it has none), the entry whose address, size, stream and stack
/// the row holds (the alloc entry; without one, the free that made the row — a later
/// `free_requested` at the address replaces `fr`, not the row's origin) and
/// [`AllocRow::end`], noted as the pairing passes the free: read later from the trace it
/// was a cache miss per row (the frees are far from their allocations in a trace of
/// hundreds of MB).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Pair<I> {
    alloc: I,
    fr: I,
    fc: I,
    origin: I,
    end: i64,
}

// Millions of these on a long trace: 24 bytes, checked when compiling.
const _: () = assert!(std::mem::size_of::<Pair<u32>>() == 24);

impl<I: Idx> Pair<I> {
    /// What `row` holds, from the trace `tr` it was paired in.
    #[inline]
    fn row(&self, snap: &Snapshot, tr: &[TraceEvent]) -> AllocRow {
        let alloc = self.alloc.get();
        let e = &tr[self.origin.get().expect("every row of the trace has an origin entry")];
        AllocRow {
            alloc,
            fr: self.fr.get(),
            fc: self.fc.get(),
            addr: e.addr,
            req: e.size,
            stream: snap.stream(e) as i64,
            stack: e.stack,
            time: if alloc.is_some() { e.time_us } else { fragscope_snapshot::NO_TIME },
            end: self.end,
        }
    }
}

impl Allocations {
    /// How many rows there are.
    pub fn len(&self) -> usize {
        self.trace_rows() + self.whole.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The rows the trace's entries make (the first ones).
    fn trace_rows(&self) -> usize {
        match &self.pairs {
            Pairs::Narrow(p) => p.len(),
            Pairs::Wide(p) => p.len(),
        }
    }

    /// Rows `range` as [`AllocRow`]s, into `out` (emptied first): `snap` and `tr` the
    /// snapshot and device trace they were paired from. A block of rows at a time, so
    /// that `out` is reused and the rows' entries are read once per block.
    pub fn rows_into(&self, snap: &Snapshot, tr: &[TraceEvent], range: Range<usize>, out: &mut Vec<AllocRow>) {
        out.clear();
        let n = self.trace_rows();
        let traced = range.start.min(n)..range.end.min(n);
        match &self.pairs {
            Pairs::Narrow(p) => out.extend(p[traced].iter().map(|p| p.row(snap, tr))),
            Pairs::Wide(p) => out.extend(p[traced].iter().map(|p| p.row(snap, tr))),
        }
        out.extend_from_slice(&self.whole[range.start.max(n) - n..range.end.max(n) - n]);
    }

    /// Every row, in order (tests and small traces: the CLI writes blocks of them,
    /// [`Allocations::rows_into`]).
    pub fn rows(&self, snap: &Snapshot, tr: &[TraceEvent]) -> Vec<AllocRow> {
        let mut out = Vec::with_capacity(self.len());
        self.rows_into(snap, tr, 0..self.len(), &mut out);
        out
    }
}

/// A device's allocations: each alloc entry of `tr` paired with the frees that follow it
/// at its address. A free whose alloc is before the trace gets a row without alloc_idx.
pub fn pair_allocations(tr: &[TraceEvent]) -> Allocations {
    let pairs =
        if tr.len() < u32::MAX as usize { Pairs::Narrow(pair::<u32>(tr)) } else { Pairs::Wide(pair::<usize>(tr)) };
    Allocations { pairs, whole: Vec::new() }
}

/// [`pair_allocations`]' rows of the trace, with indices of type `I` (which holds every
/// index of `tr` and [`Idx::NONE`] besides).
fn pair<I: Idx>(tr: &[TraceEvent]) -> Vec<Pair<I>> {
    // A row per alloc entry and per free without one before it: never more than the
    // trace's entries. Reserved at once (the untouched rest costs address space only,
    // where growing by doubling faulted in each new buffer), in huge pages.
    let mut rows: Vec<Pair<I>> = Vec::new();
    reserve_huge(&mut rows, tr.len());
    // The row of each address allocated or freed and not yet `free_completed`.
    let mut open: fragscope_snapshot::FxHashMap<u64, usize> = Default::default();
    let none = Pair { alloc: I::NONE, fr: I::NONE, fc: I::NONE, origin: I::NONE, end: fragscope_snapshot::NO_TIME };
    for (i, e) in tr.iter().enumerate() {
        match e.action {
            Action::Alloc => {
                open.insert(e.addr, rows.len());
                rows.push(Pair { alloc: I::of(i), origin: I::of(i), ..none });
            }
            Action::FreeRequested => match open.entry(e.addr) {
                // An open row has no `free_completed` yet: this free ends it, until one.
                std::collections::hash_map::Entry::Occupied(o) => {
                    let row = &mut rows[*o.get()];
                    (row.fr, row.end) = (I::of(i), e.time_us);
                }
                std::collections::hash_map::Entry::Vacant(v) => {
                    v.insert(rows.len());
                    rows.push(Pair { fr: I::of(i), origin: I::of(i), end: e.time_us, ..none });
                }
            },
            Action::FreeCompleted => match open.remove(&e.addr) {
                Some(k) => (rows[k].fc, rows[k].end) = (I::of(i), e.time_us),
                None => rows.push(Pair { fc: I::of(i), origin: I::of(i), end: e.time_us, ..none }),
            },
            _ => {}
        }
    }
    rows
}

/// The role of each of `rows` (device `device`'s allocations, trace `tr`), in order.
///
/// Roles are the analysis' block lives (the walk `summary`'s roles use), matched to the
/// rows by alloc entry; a block live before the trace by its address and the entry that
/// ended it. Seeded lives no row names (live through the whole trace) get rows of their
/// own, appended to `rows`, so that the roles' sums are those of `summary`.
pub fn allocation_roles(
    snap: &Snapshot,
    device: i64,
    tr: &[TraceEvent],
    rows: &mut Allocations,
) -> Vec<Option<fragscope_trace::BlockRole>> {
    roles_of_rows(snap, device, tr, rows, block_roles(snap, device, tr))
}

/// Device `device`'s block lives and each one's role (trace `tr`): what
/// [`allocation_roles`] matches to the rows. It reads the trace alone, not the rows: the
/// CLI finds it beside [`pair_allocations`], on another thread.
pub fn block_roles(snap: &Snapshot, device: i64, tr: &[TraceEvent]) -> BlockRoles {
    if tr.is_empty() {
        BlockRoles::default()
    } else {
        // `summary`'s lives and roles from its one walk (which indexes the lives as it
        // goes), without the sums by role it makes from them (unread here).
        fragscope_trace::device_block_roles(snap, device)
    }
}

/// A device's block lives and their roles ([`block_roles`]).
pub type BlockRoles = (fragscope_trace::BlockLives, fragscope_trace::Roles);

/// [`allocation_roles`] with the lives and roles [`block_roles`] found for the device
/// (dropped once matched: tens of MB on a long trace).
pub fn roles_of_rows(
    snap: &Snapshot,
    device: i64,
    tr: &[TraceEvent],
    rows: &mut Allocations,
    (lives, role_of): BlockRoles,
) -> Vec<Option<fragscope_trace::BlockRole>> {
    // The rows with an alloc entry come in trace order, as the traced lives do (one per
    // `alloc` entry): a cursor finds each row's life, where a binary search over millions
    // of lives per row cost a few percent of the export.
    let mut at = 0;
    let mut traced_role = |alloc: usize| {
        debug_assert!(at == 0 || lives.traced[at - 1].alloc() < alloc, "rows out of alloc order");
        while lives.traced.get(at).is_some_and(|l| l.alloc() < alloc) {
            at += 1;
        }
        let found = lives.traced.get(at).is_some_and(|l| l.alloc() == alloc);
        found.then(|| {
            at += 1;
            role_of.traced[at - 1]
        })
    };
    let mut seeded: fragscope_snapshot::FxHashMap<(u64, usize), usize> = Default::default();
    for (k, l) in lives.seeded.iter().enumerate() {
        seeded.insert((l.address, l.end), k);
    }
    let mut seeded_used = vec![false; lives.seeded.len()];
    // A row with an alloc entry by its life; one without (its block live before the
    // trace) by its address — its origin entry's, read for these rows only — and the
    // entry that ended it.
    let mut role = |alloc: Option<usize>, end: Option<usize>, origin: Option<usize>| match alloc {
        Some(k) => traced_role(k),
        None => {
            let addr = origin.map(|k| tr[k].addr)?;
            end.and_then(|end| seeded.get(&(addr, end))).map(|&k| {
                seeded_used[k] = true;
                role_of.seeded[k]
            })
        }
    };
    let mut row_roles: Vec<Option<fragscope_trace::BlockRole>> = Vec::new();
    reserve_huge(&mut row_roles, rows.len());
    match &rows.pairs {
        Pairs::Narrow(p) => {
            row_roles.extend(p.iter().map(|p| role(p.alloc.get(), p.fr.get().or(p.fc.get()), p.origin.get())))
        }
        Pairs::Wide(p) => {
            row_roles.extend(p.iter().map(|p| role(p.alloc.get(), p.fr.get().or(p.fc.get()), p.origin.get())))
        }
    }
    let mut dev_segs: Vec<(u64, u64, i64)> = snap
        .segments
        .iter()
        .filter(|s| s.device == device)
        .map(|s| (s.address, s.total_size, s.stream as i64))
        .collect();
    dev_segs.sort_unstable();
    for (k, l) in lives.seeded.iter().enumerate() {
        if !seeded_used[k] && l.end == fragscope_trace::LIVE_AT_END {
            rows.whole.push(AllocRow {
                alloc: None,
                fr: None,
                fc: None,
                addr: l.address,
                req: l.request,
                stream: stream_at(&dev_segs, l.address),
                stack: l.stack,
                time: fragscope_snapshot::NO_TIME,
                end: fragscope_snapshot::NO_TIME,
            });
            row_roles.push(Some(role_of.seeded[k]));
        }
    }
    row_roles
}

/// The stream of the segment holding `addr` in `segs` (a device's segments of the final
/// state, by address; a block live through the whole trace is there); 0 when none does.
fn stream_at(segs: &[(u64, u64, i64)], addr: u64) -> i64 {
    let k = segs.partition_point(|s| s.0 <= addr);
    k.checked_sub(1).map(|k| segs[k]).filter(|s| addr < s.0.saturating_add(s.1)).map_or(0, |s| s.2)
}

#[cfg(test)]
mod tests {
    use super::*;
    use fragscope_snapshot::{EntryContext, NO_TIME};

    /// The pairing as it was written before rows became indices (a full [`AllocRow`]
    /// per row, pushed as the entries come): what [`pair_allocations`] must still give.
    fn reference(snap: &Snapshot, tr: &[TraceEvent]) -> Vec<AllocRow> {
        let mut rows: Vec<AllocRow> = Vec::new();
        let mut open: std::collections::HashMap<u64, usize> = Default::default();
        for (i, e) in tr.iter().enumerate() {
            let row = |alloc, time| AllocRow {
                alloc,
                fr: None,
                fc: None,
                addr: e.addr,
                req: e.size,
                stream: snap.stream(e) as i64,
                stack: e.stack,
                time,
                end: NO_TIME,
            };
            match e.action {
                Action::Alloc => {
                    open.insert(e.addr, rows.len());
                    rows.push(row(Some(i), e.time_us));
                }
                Action::FreeRequested | Action::FreeCompleted => {
                    let k = *open.entry(e.addr).or_insert_with(|| {
                        rows.push(row(None, NO_TIME));
                        rows.len() - 1
                    });
                    if e.action == Action::FreeRequested {
                        rows[k].fr = Some(i);
                    } else {
                        rows[k].fc = Some(i);
                        open.remove(&e.addr);
                    }
                    // As the CLI read it from the trace before the pairing noted it.
                    let r = &mut rows[k];
                    r.end = r.fc.or(r.fr).map_or(NO_TIME, |k| tr[k].time_us);
                }
                _ => {}
            }
        }
        rows
    }

    /// Both widths of index, each against the reference, and every block of `rows_into`.
    fn check(snap: &Snapshot, tr: &[TraceEvent], what: &str) {
        let want = reference(snap, tr);
        for (width, got) in [
            ("narrow", Allocations { pairs: Pairs::Narrow(pair::<u32>(tr)), whole: Vec::new() }),
            ("wide", Allocations { pairs: Pairs::Wide(pair::<usize>(tr)), whole: Vec::new() }),
            ("chosen", pair_allocations(tr)),
        ] {
            assert_eq!(got.len(), want.len(), "{what}, {width}");
            assert!(got.rows(snap, tr) == want, "{what}, {width}: rows differ from the reference");
            let mut block = Vec::new();
            for start in (0..want.len()).step_by(7) {
                let end = (start + 7).min(want.len());
                got.rows_into(snap, tr, start..end, &mut block);
                assert_eq!(block, want[start..end], "{what}, {width}: rows {start}..{end}");
            }
        }
    }

    /// A trace of `n` entries at a few addresses, so that every case of the pairing comes
    /// often: allocs with both frees, with one or none, frees whose alloc is before the
    /// trace (`free_requested` twice, or `free_completed` alone), an alloc at an address
    /// still open, and entries the pairing skips.
    fn random_trace(snap: &mut Snapshot, seed: u64, n: usize) -> Vec<TraceEvent> {
        let mut rng = fragscope_testdata::Rng(seed);
        let streams: Vec<_> = (0..3u64)
            .map(|s| snap.intern_context(EntryContext { stream: s * 0x1000, ..Default::default() }).unwrap())
            .collect();
        let (filename, name) = (snap.frames.intern_str("f.py"), snap.frames.intern_str("g"));
        let mut stacks: Vec<Option<StackId>> = vec![None];
        for line in 0..3 {
            let f = snap.frames.intern_frame(fragscope_snapshot::Frame { filename, line, name });
            stacks.push(Some(snap.frames.intern_stack(&[f])));
        }
        (0..n)
            .map(|i| {
                let action = match rng.below(10) {
                    0..=3 => Action::Alloc,
                    4..=5 => Action::FreeRequested,
                    6..=8 => Action::FreeCompleted,
                    _ => [Action::SegmentAlloc, Action::Snapshot, Action::Oom][rng.below(3)],
                };
                let mut e = TraceEvent::new(action, 512 * rng.below(12) as u64, 512 + rng.below(1 << 20) as u64);
                e.time_us = if rng.below(8) == 0 { NO_TIME } else { 1_000 + i as i64 };
                e.stack = stacks[rng.below(stacks.len())];
                e.context = streams[rng.below(streams.len())];
                e
            })
            .collect()
    }

    /// [`pair_allocations`] gives the reference's rows on random traces, with narrow and
    /// wide indices, whole or by blocks.
    #[test]
    fn pairing_gives_the_reference_rows() {
        for (seed, n) in [(1, 0), (2, 1), (3, 2), (4, 50), (5, 5_000), (6, 20_000)] {
            let mut snap = Snapshot::default();
            let tr = random_trace(&mut snap, seed, n);
            check(&snap, &tr, &format!("seed {seed}, {n} entries"));
        }
    }

    /// The cases by hand: an alloc with both frees; a block freed twice without a
    /// completion (its later `free_requested` is the row's, its first entry's size the
    /// row's); a `free_completed` alone; an alloc at an address still allocated (the
    /// earlier row keeps no frees).
    #[test]
    fn pairing_cases_by_hand() {
        let snap = Snapshot::default();
        let e = |a, addr, size| TraceEvent { time_us: 7, ..TraceEvent::new(a, addr, size) };
        use Action::{Alloc, FreeCompleted, FreeRequested, SegmentAlloc};
        let tr = [
            e(Alloc, 0x1000, 100),
            e(FreeRequested, 0x1000, 100),
            e(SegmentAlloc, 0x1000, 1 << 21),
            e(FreeRequested, 0x2000, 30),
            e(FreeRequested, 0x2000, 40),
            e(FreeCompleted, 0x1000, 100),
            e(FreeCompleted, 0x2000, 50),
            e(FreeCompleted, 0x3000, 60),
            e(Alloc, 0x4000, 70),
            e(Alloc, 0x4000, 80),
            e(FreeCompleted, 0x4000, 80),
        ];
        let row = |alloc, fr, fc, addr, req, time, end| AllocRow {
            alloc,
            fr,
            fc,
            addr,
            req,
            stream: 0,
            stack: None,
            time,
            end,
        };
        let want = [
            row(Some(0), Some(1), Some(5), 0x1000, 100, 7, 7),
            row(None, Some(4), Some(6), 0x2000, 30, NO_TIME, 7),
            row(None, None, Some(7), 0x3000, 60, NO_TIME, 7),
            row(Some(8), None, None, 0x4000, 70, 7, NO_TIME),
            row(Some(9), None, Some(10), 0x4000, 80, 7, 7),
        ];
        assert_eq!(pair_allocations(&tr).rows(&snap, &tr), want);
        check(&snap, &tr, "by hand");
    }

    /// Rows without entries (blocks live through the whole trace, appended by
    /// [`allocation_roles`]) come after the trace's, whole or in blocks that straddle them.
    #[test]
    fn rows_without_entries_follow_the_traces() {
        let mut snap = Snapshot::default();
        let tr = random_trace(&mut snap, 9, 300);
        let mut got = pair_allocations(&tr);
        let whole: Vec<AllocRow> = (0..5u64)
            .map(|k| AllocRow {
                alloc: None,
                fr: None,
                fc: None,
                addr: 1 << 30 | k << 9,
                req: k + 1,
                stream: 0,
                stack: None,
                time: NO_TIME,
                end: NO_TIME,
            })
            .collect();
        got.whole.extend_from_slice(&whole);
        let mut want = reference(&snap, &tr);
        let traced = want.len();
        want.extend_from_slice(&whole);
        assert_eq!(got.len(), want.len());
        assert!(got.rows(&snap, &tr) == want);
        let mut block = Vec::new();
        for range in [traced - 3..traced + 2, traced..traced + 5, traced + 1..traced + 4, 0..want.len(), 4..4] {
            got.rows_into(&snap, &tr, range.clone(), &mut block);
            assert_eq!(block, want[range.clone()], "rows {range:?}");
        }
    }

    /// On real recordings, every device's trace: [`pair_allocations`] gives the
    /// reference's rows, and [`allocation_roles`] a role for each row (those it adds
    /// included).
    #[test]
    fn pairing_real_recordings() {
        let files = fragscope_testdata::pickles_in(&fragscope_testdata::in_repo_dir());
        assert!(files.len() >= 3, "in-repo recordings: {files:?}");
        let mut checked = 0;
        for path in files {
            let snap = fragscope_snapshot::read_path(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            for (d, tr) in snap.device_traces.iter().enumerate() {
                let what = format!("{} device {d}", path.display());
                check(&snap, tr, &what);
                let mut rows = pair_allocations(tr);
                let traced = rows.len();
                let roles = allocation_roles(&snap, d as i64, tr, &mut rows);
                assert_eq!(roles.len(), rows.len(), "{what}");
                assert!(rows.rows(&snap, tr)[traced..].iter().all(|r| r.alloc.is_none() && r.fr.is_none()), "{what}");
                checked += traced;
            }
        }
        assert!(checked > 10_000, "{checked} rows of real traces");
    }
}
