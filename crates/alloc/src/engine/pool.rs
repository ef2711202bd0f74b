//! Block pools: the ordered free set and the unmapped set (spec §2.1–2.3).

use crate::{Addr, PoolId, StreamId};
use std::collections::BTreeSet;

/// Free-set key (§2.2): (stream, size, registration counter, address, slab index).
/// Under `TieBreak::Address` the counter field is always 0, which gives the
/// classic (stream, size, address) order. Addresses are unique within a pool,
/// so the slab index never decides the order.
pub(crate) type FreeKey = (StreamId, u64, u64, Addr, u32);

/// Unmapped-set key (§2.3): (stream, address, slab index).
pub(crate) type UnmappedKey = (StreamId, Addr, u32);

#[derive(Clone, Debug)]
pub(crate) struct BlockPool {
    pub id: PoolId,
    pub small: bool,
    pub free: BTreeSet<FreeKey>,
    pub unmapped: BTreeSet<UnmappedKey>,
    /// Number of free-list searches while GC is enabled (§3.3 step 1, §5.5).
    pub search_count: u64,
}

impl BlockPool {
    pub fn new(id: PoolId, small: bool) -> Self {
        BlockPool { id, small, free: BTreeSet::new(), unmapped: BTreeSet::new(), search_count: 0 }
    }
}
