//! `export`: the rows of the export's `allocations` table, derived here so that every
//! front end exports the same thing — each alloc entry paired with its frees
//! ([`pair_allocations`]) and the role the trace analysis gives each
//! ([`allocation_roles`]: the block lives `summary`'s roles use). Writing the tables
//! (Parquet) is the CLI's.

use fragscope_snapshot::{Action, Snapshot, StackId, TraceEvent};

/// One row of `allocations` before its columns are derived: the alloc entry, the free
/// entries paired with it, and what the alloc (or, without one, the free) recorded.
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
}

/// A device's allocations: each alloc entry of `tr` paired with the frees that follow it
/// at its address. A free whose alloc is before the trace gets a row without alloc_idx.
pub fn pair_allocations(snap: &Snapshot, tr: &[TraceEvent]) -> Vec<AllocRow> {
    let mut rows: Vec<AllocRow> = Vec::new();
    let mut open: fragscope_snapshot::FxHashMap<u64, usize> = Default::default();
    for (i, e) in tr.iter().enumerate() {
        match e.action {
            Action::Alloc => {
                let a = AllocRow {
                    alloc: Some(i),
                    fr: None,
                    fc: None,
                    addr: e.addr,
                    req: e.size,
                    stream: snap.stream(e) as i64,
                    stack: e.stack,
                    time: e.time_us,
                };
                open.insert(e.addr, rows.len());
                rows.push(a);
            }
            Action::FreeRequested | Action::FreeCompleted => {
                let k = match open.get(&e.addr) {
                    Some(&k) => k,
                    None => {
                        open.insert(e.addr, rows.len());
                        rows.push(AllocRow {
                            alloc: None,
                            fr: None,
                            fc: None,
                            addr: e.addr,
                            req: e.size,
                            stream: snap.stream(e) as i64,
                            stack: e.stack,
                            time: fragscope_snapshot::NO_TIME,
                        });
                        rows.len() - 1
                    }
                };
                if e.action == Action::FreeRequested {
                    rows[k].fr = Some(i);
                } else {
                    rows[k].fc = Some(i);
                    open.remove(&e.addr);
                }
            }
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
    rows: &mut Vec<AllocRow>,
) -> Vec<Option<fragscope_trace::BlockRole>> {
    let (lives, role_of) = if tr.is_empty() {
        (fragscope_trace::BlockLives::default(), fragscope_trace::Roles::default())
    } else {
        let lives = fragscope_trace::BlockLives::replay(snap, device);
        let (_, _, roles) = fragscope_trace::device_roles_with(snap, &lives);
        (lives, roles)
    };
    // The rows with an alloc entry come in trace order, as the traced lives do (one per
    // `alloc` entry): a cursor finds each row's life, where a binary search over millions
    // of lives per row cost a few percent of the export.
    let mut at = 0;
    let mut traced_role = |alloc: usize| {
        debug_assert!(at == 0 || lives.traced[at - 1].alloc < alloc, "rows out of alloc order");
        while lives.traced.get(at).is_some_and(|l| l.alloc < alloc) {
            at += 1;
        }
        let found = lives.traced.get(at).is_some_and(|l| l.alloc == alloc);
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
    let mut dev_segs: Vec<(u64, u64, i64)> = snap
        .segments
        .iter()
        .filter(|s| s.device == device)
        .map(|s| (s.address, s.total_size, s.stream as i64))
        .collect();
    dev_segs.sort_unstable();
    let mut row_roles: Vec<Option<fragscope_trace::BlockRole>> = Vec::with_capacity(rows.len());
    for a in rows.iter() {
        let r = match a.alloc {
            Some(k) => traced_role(k),
            None => a.fr.or(a.fc).and_then(|end| seeded.get(&(a.addr, end))).map(|&k| {
                seeded_used[k] = true;
                role_of.seeded[k]
            }),
        };
        row_roles.push(r);
    }
    for (k, l) in lives.seeded.iter().enumerate() {
        if !seeded_used[k] && l.end == fragscope_trace::LIVE_AT_END {
            rows.push(AllocRow {
                alloc: None,
                fr: None,
                fc: None,
                addr: l.address,
                req: l.request,
                stream: stream_at(&dev_segs, l.address),
                stack: l.stack,
                time: fragscope_snapshot::NO_TIME,
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
