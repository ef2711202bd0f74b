//! What a snapshot says, and does not say, about how a `MemPool` was made
//! (docs/fidelity.md, "Private pools"): `MemPool(no_split=True)` and
//! `MemPool(use_on_oom=True)` change the allocator's decisions (§3.7 step 1, §3.8), and
//! neither flag is written in the file.
//!
//! * [`no_split_pools`]: a private pool is read as no-split when the final state holds
//!   one of its blocks taken whole from its segment although `should_split` would have
//!   split it: no other rule leaves such a remainder attached.
//! * [`UseOnOom`]: a what-if's default-pool request that fails while a user `MemPool`
//!   holds a cached block `try_mempool_fallback` would take; the run cannot tell whether
//!   that pool was use-on-OOM and says so.

use fragscope_alloc::rounding::round_size;
use fragscope_alloc::{AllocatorConfig, CachingAllocator, PoolId, SimulatedDevice, DEFAULT_POOL};
use fragscope_snapshot::{BlockState, SegmentType, Snapshot};

/// Small-pool split threshold and large-pool remainder limit (§3.8).
const MIN_BLOCK_SIZE: u64 = 512;
const SMALL_SIZE: u64 = 1 << 20;

/// The private pools of `device`'s final state that show `no_split`: a segment of the
/// pool (not expandable) made of one live block whose remainder over its rounded
/// request `should_split` would have cut off under `cfg`. In id order.
pub(crate) fn no_split_pools(snap: &Snapshot, device: i64, cfg: &AllocatorConfig) -> Vec<PoolId> {
    let max_split = cfg.max_split_size.unwrap_or(u64::MAX);
    let mut out: Vec<PoolId> = snap
        .segments
        .iter()
        .filter(|s| s.device == device && s.is_expandable != Some(true) && s.blocks.len() == 1)
        .filter_map(|s| {
            let pool = s.segment_pool_id.filter(|&p| p != DEFAULT_POOL)?;
            let b = &s.blocks[0];
            if b.state != BlockState::ActiveAllocated && b.state != BlockState::ActivePendingFree {
                return None;
            }
            let rounded = round_size(b.requested_size?, cfg);
            let rem = b.size.checked_sub(rounded)?;
            let split = if s.segment_type == SegmentType::Small || cfg.expandable_segments {
                rem >= MIN_BLOCK_SIZE
            } else {
                rounded < max_split && rem > SMALL_SIZE
            };
            split.then_some(pool)
        })
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// The note a replay adds for the pools [`no_split_pools`] found.
pub(crate) fn no_split_note(pools: &[PoolId]) -> Option<String> {
    (!pools.is_empty()).then(|| {
        format!(
            "{} private pool(s) replayed as MemPool(no_split=True), read off the final state (a live block \
             holds its whole segment where should_split would have split it; the flag is not in the file): {}",
            pools.len(),
            pools.iter().map(|(a, b)| format!("({a}, {b})")).collect::<Vec<_>>().join(", ")
        )
    })
}

/// When the first divergence of a replay is a request in a `MemPool` (`(0, n)`, not read
/// as no-split) that the recording served with a new segment where the model served it from
/// the pool's cached free blocks, what a no-split pool would explain: the note that says so.
pub(crate) fn no_split_divergence_note(
    snap: &Snapshot,
    device: i64,
    d: &crate::Divergence,
    known: &[PoolId],
) -> Option<String> {
    let e = snap.trace(device).get(d.index)?;
    let pool = snap.pool_id(e).filter(|&p| p.0 == 0 && p != DEFAULT_POOL && !known.contains(&p))?;
    let grows = |a: &str| a == "segment_alloc" || a == "segment_map";
    let recorded_new = d.recorded_segment_events.iter().any(|v| grows(&v.action));
    let model_new = d.model_events.iter().any(|v| grows(&v.action));
    (d.recorded.action == "alloc" && recorded_new && !model_new).then(|| {
        format!(
            "the first divergence (entry {}) is a request in MemPool ({}, {}) that the recording served with a \
             new segment where the model took a cached free block of the pool: a MemPool made with \
             no_split=True does that (the flag is not in the file, and the final state shows no block that \
             tells)",
            d.index, pool.0, pool.1
        )
    })
}

/// Default-pool requests of a what-if that failed while a user `MemPool` (id `(0, n)`:
/// graph pools from `graph_pool_handle()` cannot be use-on-OOM) held a cached block
/// `try_mempool_fallback` would have taken.
#[derive(Debug, Default)]
pub(crate) struct UseOnOom {
    count: u64,
    first: Option<(usize, PoolId)>,
}

impl UseOnOom {
    /// After the request of entry `at` (`n` bytes on `stream`, routed to `pool`) failed.
    pub(crate) fn failed(
        &mut self,
        eng: &CachingAllocator<SimulatedDevice>,
        at: usize,
        n: u64,
        stream: u64,
        pool: PoolId,
    ) {
        if pool != DEFAULT_POOL {
            return;
        }
        let fits = eng.private_pools().into_iter().find(|&p| p.0 == 0 && eng.fits_on_oom_fallback(n, stream, p));
        if let Some(p) = fits {
            self.count += 1;
            self.first.get_or_insert((at, p));
        }
    }

    pub(crate) fn note(&self) -> Option<String> {
        let (at, (a, b)) = self.first?;
        Some(format!(
            "{} default-pool request(s) failed while a MemPool held a cached free block that fits (first: entry \
             {at}, MemPool ({a}, {b})): whether a MemPool was made with use_on_oom=True is not in the snapshot; \
             this run assumes not, and with it PyTorch would have served them from that pool",
            self.count
        ))
    }
}
