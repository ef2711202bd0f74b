//! The private-pool band, like memory_viz's private-pool view: the memory each private
//! pool (a CUDA graph's pool, a `MemPool`) holds, apart from the default pools, over the
//! trace and at the end. Only for a device whose file has private-pool segments: an
//! empty list otherwise, and the page shows nothing of it.
//!
//! [`PoolBand`] per pool, the default pools first: its reserved bytes in the curves'
//! buckets (the most of each, as [`crate::curves::Curves::reserved`] is kept), the
//! figures at the end ([`fragscope_replay::RecordedState::pool_bands`], what PyTorch
//! wrote on the segments), and the base addresses of its segments, which the state view
//! names the pool of. A pool's reserved bytes move only at its segment events
//! (`segment_alloc` / `segment_free`, `segment_map` / `segment_unmap`), each of which
//! names its pool (`pool_id`); the level before the trace is the end's less the trace's
//! changes.

use std::collections::BTreeMap;

use fragscope_replay::RecordedState;
use fragscope_snapshot::{Action, Snapshot};
use serde::Serialize;

use crate::encode;

/// The default pools' id.
const DEFAULT_POOL: (u64, u64) = (0, 0);

/// One pool of a device (see the module doc).
#[derive(Serialize)]
pub struct PoolBand {
    pub pool: (u64, u64),
    /// `"default pools"`, `"CUDA graph pool"` (`(n, 0)`: `graph_pool_handle()`) or
    /// `"MemPool"` (`(0, n)`).
    pub kind: &'static str,
    /// Reserved bytes, the most of each curve bucket (base64 Float64Array of
    /// [`crate::curves::Curves::n`] entries).
    pub reserved: String,
    /// The most reserved at any trace state.
    pub peak_reserved_bytes: u64,
    /// At the end (the snapshot's segments of this pool).
    pub segments: u64,
    pub reserved_bytes: u64,
    pub allocated_bytes: u64,
    pub cached_free_bytes: u64,
    pub largest_free_block_bytes: u64,
    /// Base addresses of the pool's segments, at the end and made during the trace
    /// (base64 Float64Array).
    pub segment_addresses: String,
}

fn kind(pool: (u64, u64)) -> &'static str {
    match pool {
        DEFAULT_POOL => "default pools",
        (0, _) => "MemPool",
        _ => "CUDA graph pool",
    }
}

/// The bands of `device`, with `n` buckets over the trace's `states` states (the
/// curves' own split: the bucket of state `s` is `s * n / states`). Empty when no
/// segment or segment event of the device is in a private pool.
pub fn bands(snap: &Snapshot, device: i64, n: usize, states: usize) -> Vec<PoolBand> {
    // Most files name no private pool: skip the scan of the trace then (the answer below
    // would be empty anyway, every event and segment falling in the default pools).
    let private = |p: &Option<(u64, u64)>| p.is_some_and(|p| p != DEFAULT_POOL);
    if !snap.contexts.iter().any(|c| private(&c.pool_id))
        && !snap.segments.iter().any(|s| s.device == device && private(&s.segment_pool_id))
    {
        return Vec::new();
    }
    let trace = snap.trace(device);
    let pool_of = |e| snap.pool_id(e).unwrap_or(DEFAULT_POOL);
    let seg_event =
        |a: Action| matches!(a, Action::SegmentAlloc | Action::SegmentFree | Action::SegmentMap | Action::SegmentUnmap);
    // Each pool's segments, by base address; its reserved bytes at the end.
    let mut addrs: BTreeMap<(u64, u64), Vec<u64>> = BTreeMap::new();
    let mut end: BTreeMap<(u64, u64), i128> = BTreeMap::new();
    for s in snap.segments.iter().filter(|s| s.device == device) {
        let p = s.segment_pool_id.unwrap_or(DEFAULT_POOL);
        addrs.entry(p).or_default().push(s.address);
        *end.entry(p).or_default() += s.total_size as i128;
    }
    let mut change: BTreeMap<(u64, u64), i128> = BTreeMap::new();
    for e in trace.iter().filter(|e| seg_event(e.action)) {
        let p = pool_of(e);
        let d = match e.action {
            Action::SegmentAlloc | Action::SegmentMap => e.size as i128,
            _ => -(e.size as i128),
        };
        *change.entry(p).or_default() += d;
        if e.action == Action::SegmentAlloc {
            addrs.entry(p).or_default().push(e.addr);
        }
    }
    if addrs.keys().chain(change.keys()).all(|&p| p == DEFAULT_POOL) {
        return Vec::new();
    }
    let pools: Vec<(u64, u64)> = {
        let mut v: Vec<_> = addrs.keys().chain(change.keys()).copied().collect();
        v.push(DEFAULT_POOL);
        v.sort_by_key(|&p| (p != DEFAULT_POOL, p));
        v.dedup();
        v
    };
    let index: BTreeMap<(u64, u64), usize> = pools.iter().enumerate().map(|(k, &p)| (p, k)).collect();
    // Before the trace: the end less the trace's changes (0 at least: a trace that does
    // not lead to its final segments cannot say more).
    let mut cur: Vec<i128> =
        pools.iter().map(|p| (end.get(p).copied().unwrap_or(0) - change.get(p).copied().unwrap_or(0)).max(0)).collect();
    let n = n.max(1);
    let mut max = vec![vec![0i128; n]; pools.len()];
    let mut peak = cur.clone();
    let bucket = |s: usize| ((s as u128 * n as u128) / states.max(1) as u128).min(n as u128 - 1) as usize;
    let mut b = 0usize;
    for (k, m) in max.iter_mut().enumerate() {
        m[0] = cur[k];
    }
    for (i, e) in trace.iter().enumerate() {
        // Entry i leads to state i + 1, which is in bucket b or the next one (n ≤ states).
        if seg_event(e.action) {
            let k = index[&pool_of(e)];
            cur[k] = match e.action {
                Action::SegmentAlloc | Action::SegmentMap => cur[k] + e.size as i128,
                _ => (cur[k] - e.size as i128).max(0),
            };
            peak[k] = peak[k].max(cur[k]);
        }
        let nb = bucket(i + 1);
        for (k, m) in max.iter_mut().enumerate() {
            m[nb] = if nb == b { m[nb].max(cur[k]) } else { cur[k] };
        }
        b = nb;
    }
    let finals = RecordedState::from_snapshot(snap, device).pool_bands();
    pools
        .iter()
        .enumerate()
        .map(|(k, &p)| {
            let f = finals.iter().find(|f| f.pool == p);
            let mut a = addrs.remove(&p).unwrap_or_default();
            a.sort_unstable();
            a.dedup();
            PoolBand {
                pool: p,
                kind: kind(p),
                reserved: encode::f64s(&max[k].iter().map(|&v| v as f64).collect::<Vec<_>>()),
                peak_reserved_bytes: peak[k] as u64,
                segments: f.map_or(0, |f| f.segments),
                reserved_bytes: f.map_or(0, |f| f.reserved_bytes),
                allocated_bytes: f.map_or(0, |f| f.allocated_bytes),
                cached_free_bytes: f.map_or(0, |f| f.cached_free_bytes),
                largest_free_block_bytes: f.map_or(0, |f| f.largest_free_block_bytes),
                segment_addresses: encode::f64s(&a.iter().map(|&x| x as f64).collect::<Vec<_>>()),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(name: &str) -> Snapshot {
        let path = fragscope_testdata::real_file(name).expect("in the repository");
        fragscope_snapshot::read_path(&path).unwrap()
    }

    fn decode(s: &str) -> Vec<f64> {
        let alphabet = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let mut bits = Vec::new();
        for c in s.bytes().filter(|&c| c != b'=') {
            let v = alphabet.iter().position(|&a| a == c).unwrap() as u32;
            bits.extend((0..6).rev().map(|k| (v >> k) & 1));
        }
        let bytes: Vec<u8> = bits.chunks_exact(8).map(|b| b.iter().fold(0u8, |a, &x| a << 1 | x as u8)).collect();
        bytes.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().unwrap())).collect()
    }

    /// The verl/vLLM state (two MemPools, no trace): one band per pool, the default pools
    /// first, each with the figures PyTorch wrote and a flat curve at its reserved bytes.
    #[test]
    fn a_state_with_mempools_has_a_band_per_pool() {
        let snap = read("verl-megatron-vllm-qwen2-private-pools-stateonly.pickle");
        let bands = bands(&snap, 0, 1, 1);
        let want = RecordedState::from_snapshot(&snap, 0).pool_bands();
        assert_eq!(bands.iter().map(|b| b.pool).collect::<Vec<_>>(), vec![(0, 0), (0, 1), (0, 2)]);
        assert_eq!(bands.iter().map(|b| b.kind).collect::<Vec<_>>(), vec!["default pools", "MemPool", "MemPool"]);
        for (b, w) in bands.iter().zip(&want) {
            assert_eq!(
                (b.reserved_bytes, b.allocated_bytes, b.segments),
                (w.reserved_bytes, w.allocated_bytes, w.segments)
            );
            assert_eq!(decode(&b.reserved), vec![w.reserved_bytes as f64]);
            assert_eq!(b.peak_reserved_bytes, w.reserved_bytes);
            let addrs = decode(&b.segment_addresses);
            let segs = snap.segments.iter().filter(|s| s.segment_pool_id == Some(b.pool)).count();
            assert_eq!(addrs.len(), segs);
        }
    }

    /// A graph pool's second segment made and released: each bucket keeps the most of its
    /// states (state s is after entry s − 1), the level before the trace comes from the end.
    #[test]
    fn each_bucket_keeps_the_most_of_its_states() {
        use fragscope_snapshot::{Block, BlockState, EntryContext, Segment, TraceEvent};
        const MIB: u64 = 1 << 20;
        let (d, g) = ((0, 0), (1, 0));
        let mut snap = Snapshot::default();
        let mut trace = Vec::new();
        for (action, addr, size, pool) in [
            (Action::SegmentAlloc, 0, 20 * MIB, d),
            (Action::SegmentAlloc, 100 * MIB, 20 * MIB, g),
            (Action::SegmentAlloc, 200 * MIB, 24 * MIB, g),
            (Action::SegmentFree, 200 * MIB, 24 * MIB, g),
        ] {
            let mut e = TraceEvent::new(action, addr, size);
            e.context =
                snap.intern_context(EntryContext { stream: 0, pool_id: Some(pool), ..Default::default() }).unwrap();
            trace.push(e);
        }
        snap.device_traces.push(trace);
        let seg = |address: u64, pool| Segment {
            requested_size: Some(0),
            segment_pool_id: Some(pool),
            is_expandable: Some(false),
            blocks: vec![Block {
                address,
                size: 20 * MIB,
                requested_size: Some(0),
                state: BlockState::Inactive,
                stack: None,
                history: None,
            }],
            ..Segment::new(0, address, 20 * MIB)
        };
        snap.segments = vec![seg(0, d), seg(100 * MIB, g)];
        let mib = |v: Vec<f64>| v.into_iter().map(|x| x / MIB as f64).collect::<Vec<_>>();
        let b = bands(&snap, 0, 5, 5);
        assert_eq!(b.iter().map(|b| b.pool).collect::<Vec<_>>(), vec![d, g]);
        assert_eq!(mib(decode(&b[0].reserved)), vec![0.0, 20.0, 20.0, 20.0, 20.0]);
        assert_eq!(mib(decode(&b[1].reserved)), vec![0.0, 0.0, 20.0, 44.0, 20.0]);
        assert_eq!(b[1].peak_reserved_bytes, 44 * MIB);
        assert_eq!(decode(&b[1].segment_addresses), vec![100.0 * MIB as f64, 200.0 * MIB as f64]);
        // Two buckets: states 0–2 and 3–4.
        let b = bands(&snap, 0, 2, 5);
        assert_eq!(mib(decode(&b[1].reserved)), vec![20.0, 44.0]);
        assert_eq!(mib(decode(&b[0].reserved)), vec![20.0, 20.0]);
    }

    #[test]
    fn default_pools_only_give_no_band() {
        let snap = read("effdl-course-liger-ce.pickle");
        let states = snap.trace(0).len() + 1;
        assert!(bands(&snap, 0, 64.min(states), states).is_empty());
    }
}
