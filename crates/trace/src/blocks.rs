//! What the recorded blocks and segments of a snapshot mean, in the figures every surface
//! shows: a block's request as `memory_stats()` and as `_memory_viz.py` count it, and the
//! rule for a segment that `empty_cache()` cannot release ("pinned").

use fragscope_snapshot::{Block, Segment};

/// The request `_memory_viz.py` attributes to a block (`_block_extra`): `requested_size`
/// when the block has `frames`, else `history[0].real_size`, else `requested_size`, else
/// `size`.
pub(crate) fn memviz_request(b: &Block) -> u64 {
    if b.stack.is_none() {
        if let Some(h) = b.history.as_ref().and_then(|h| h.first()) {
            return h.real_size;
        }
    }
    b.requested_size.unwrap_or(b.size)
}

/// The unrounded request of an active block as `memory_stats()` counts it.
pub(crate) fn request_of(b: &Block) -> u64 {
    b.requested_size.unwrap_or_else(|| memviz_request(b))
}

/// A segment that `empty_cache()` cannot release although it is mostly free: it holds
/// live (active) blocks whose bytes are at most 10% of the segment, or at most 2 live
/// blocks holding at most 25% of it. Expandable segments are excluded: their free pages
/// can be unmapped. `live_blocks` / `live_bytes` count active blocks of `seg`.
pub(crate) fn is_pinned(seg: &Segment, live_blocks: usize, live_bytes: u64) -> bool {
    let total = seg.total_size;
    live_blocks > 0
        && seg.is_expandable != Some(true)
        && (live_bytes.saturating_mul(10) <= total || (live_blocks <= 2 && live_bytes.saturating_mul(4) <= total))
}
