//! Allocator options of PyTorch 2.9–2.11 whose effect on decisions the model claims
//! (docs/fidelity.md, "Allocator options"): `large_segment_size_mb`, the expandable page
//! size it sets, and `max_split_size_mb` combined with `expandable_segments`.

use super::*;
use crate::Event;

/// `large_segment_size_mb:12` (seen in real configs beside `expandable_segments:True`):
/// a 1–10 MiB request gets a 12 MiB segment instead of 20 MiB (`get_allocation_size`,
/// §1.5); 10 MiB and over still round to 2 MiB; the oversize slack
/// (`max_non_split_rounding`) defaults to it.
#[test]
fn large_segment_size_sets_the_segment_of_mid_sized_requests() {
    let c = cfg("large_segment_size_mb:12");
    assert_eq!(c.large_segment_size, 12 * MIB);
    assert_eq!(c.max_non_split_rounding, 12 * MIB);
    let mut a = sim(c);
    let p = a.malloc(5 * MIB, 0).unwrap();
    assert_eq!(
        a.drain_events(),
        vec![
            Event::SegmentAlloc { addr: p, size: 12 * MIB, stream: 0 },
            Event::Alloc { addr: p, size: 5 * MIB, stream: 0 }
        ]
    );
    // The 7 MiB left of the 12 MiB segment serves the next 5 MiB request: no new segment.
    let q = a.malloc(5 * MIB, 0).unwrap();
    assert_eq!(q, p + 5 * MIB);
    assert_eq!(a.drain_events(), vec![Event::Alloc { addr: q, size: 5 * MIB, stream: 0 }]);
    // A third does not fit in the 2 MiB left: a second 12 MiB segment.
    let r = a.malloc(5 * MIB, 0).unwrap();
    assert_eq!(a.drain_events()[0], Event::SegmentAlloc { addr: r, size: 12 * MIB, stream: 0 });
    // 11 MiB ≥ kMinLargeAlloc: a segment of its own, rounded to 2 MiB, whatever the option.
    let s = a.malloc(11 * MIB, 0).unwrap();
    assert_eq!(a.drain_events()[0], Event::SegmentAlloc { addr: s, size: 12 * MIB, stream: 0 });
    assert_eq!(a.reserved_bytes(), 36 * MIB);
    ok(&a);
    // Under the default the same three 5 MiB requests take one 20 MiB segment.
    let mut d = sim(AllocatorConfig::default());
    for _ in 0..3 {
        d.malloc(5 * MIB, 0).unwrap();
    }
    assert_eq!(d.reserved_bytes(), 20 * MIB);
}

/// The large pool's expandable page is `large_segment_size` (2.11's
/// `find_expandable_block` takes it for the segment size); the small pool's stays 2 MiB.
#[test]
fn large_segment_size_is_the_large_expandable_page() {
    let mut a = sim(cfg("expandable_segments:True,large_segment_size_mb:12"));
    let p = a.malloc(5 * MIB, 0).unwrap();
    assert_eq!(a.drain_events()[0], Event::SegmentMap { addr: p, size: 12 * MIB, stream: 0 });
    // 20 MiB more: the 7 MiB free tail plus two more 12 MiB pages.
    let q = a.malloc(20 * MIB, 0).unwrap();
    assert_eq!(q, p + 5 * MIB);
    assert_eq!(a.drain_events()[0], Event::SegmentMap { addr: p + 12 * MIB, size: 24 * MIB, stream: 0 });
    let s = a.malloc(1000, 0).unwrap();
    assert_eq!(a.drain_events()[0], Event::SegmentMap { addr: s, size: 2 * MIB, stream: 0 });
    assert_eq!(a.reserved_bytes(), 38 * MIB);
    ok(&a);
}

/// pytorch/pytorch#123548 (reproducer in PR #193400): with `max_split_size_mb:128` and
/// `expandable_segments:True`, `get_free_block` applies the oversize rule to the merged
/// free range inside the expandable segment, so each cycle maps new pages instead of
/// reusing it: reserved grows by about the cycle's size while allocated grows by 2 MiB.
/// The model follows the source (the rule applies to expandable blocks), so it shows
/// the same growth; either option alone stays flat.
#[test]
fn max_split_size_with_expandable_segments_grows_reserved_without_bound() {
    let run = |conf: &str| {
        let mut a = sim(cfg(conf));
        let mut reserved = Vec::new();
        for _ in 0..20 {
            let x = a.malloc(91 * MIB, 0).unwrap();
            let y = a.malloc(91 * MIB / 2, 0).unwrap();
            a.malloc(2 * MIB, 0).unwrap(); // stays alive, fencing the freed range off the tail
            a.free(x).unwrap();
            a.free(y).unwrap();
            reserved.push(a.reserved_bytes());
        }
        ok(&a);
        reserved
    };
    let both = run("max_split_size_mb:128,expandable_segments:True");
    let growth = both[19] - both[9];
    // Ten cycles of 91 + 45.5 MiB mapped anew each time, in 20 MiB pages.
    assert!(growth >= 10 * 130 * MIB, "reserved grew by only {} MiB over ten cycles: {both:?}", growth / MIB);
    for alone in ["expandable_segments:True", "max_split_size_mb:128"] {
        let r = run(alone);
        assert!(r[19] < 500 * MIB, "{alone}: reserved {} MiB after 20 cycles", r[19] / MIB);
    }
}

/// `expandable_segments_reserve:1G` (2.15): a new reservation covers 1 GiB rounded up to
/// whole 20 MiB pages instead of 9/8 of the device, so a second 600 MiB request opens a
/// second reservation, and one larger than a reservation fails (§6.1).
#[test]
fn expandable_segments_reserve_shrinks_the_reservation() {
    let mut a = sim(cfg("expandable_segments:True,expandable_segments_reserve:1G"));
    let p = a.malloc(600 * MIB, 0).unwrap();
    let q = a.malloc(600 * MIB, 0).unwrap();
    assert_ne!(q, p + 600 * MIB, "the 440 MiB left of a 1,040 MiB reservation cannot hold it");
    assert_eq!(a.segments().len(), 2);
    assert!(a.malloc(2 * GIB, 0).is_err(), "larger than a fresh reservation");
    ok(&a);
    // The default reservation (9/8 of 80 GiB) holds both, one after the other.
    let mut d = sim(cfg("expandable_segments:True"));
    let p = d.malloc(600 * MIB, 0).unwrap();
    assert_eq!(d.malloc(600 * MIB, 0).unwrap(), p + 600 * MIB);
}

/// Ascend NPU rules (torch_npu): a 512-byte request takes a 1,024-byte block, so two
/// of them fill 2 KiB of the 2 MiB small segment where CUDA's fill 1 KiB.
#[test]
fn npu_blocks_are_32_bytes_larger_before_rounding() {
    let npu = AllocatorConfig { accelerator: crate::Accelerator::Npu, ..AllocatorConfig::default() };
    let mut a = sim(npu);
    let p = a.malloc(512, 0).unwrap();
    let q = a.malloc(512, 0).unwrap();
    assert_eq!(q, p + 1024);
    assert_eq!(a.stats().allocated_bytes.all().current, 2048);
    ok(&a);
    let mut c = sim(AllocatorConfig::default());
    let p = c.malloc(512, 0).unwrap();
    assert_eq!(c.malloc(512, 0).unwrap(), p + 512);
}
