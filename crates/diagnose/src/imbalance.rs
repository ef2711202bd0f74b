//! Device imbalance: on a file with several devices, one device holding far more than its
//! peers — what `torch.nn.DataParallel` does (it gathers every replica's outputs and the
//! loss on its output device), as does a model split by hand with more layers on one GPU.
//! Work spread evenly (DDP, FSDP, tensor parallelism) gives peers within a few percent.
//!
//! # The rule
//!
//! The figure compared is each device's peak allocated ([`DeviceTimeline::peak_allocated`],
//! the block peak `torch.cuda.max_memory_allocated()` reports; docs/glossary.md). Only
//! devices that reserved memory at all count (a file can name a device the process never
//! used). With at least two such devices, a device is **imbalanced** when its peak is at
//! least [`FACTOR`] × the median of the other devices' peaks and exceeds that median by at
//! least [`MIN_EXCESS`] (so that two small devices of a few MiB are not called imbalanced).
//! At most one device is named: the one with the highest peak (the test is against the
//! others' median, so two heavy devices beside light ones are both above it; the finding
//! names the heaviest and counts the rest).
//!
//! Principal type: [`Imbalance`]; [`imbalance`] finds it, [`Imbalance::headline`] says it.

use fragscope_alloc::format_size as fs;
use fragscope_trace::DeviceTimeline;
use serde::Serialize;

/// A device is imbalanced from this multiple of the median of its peers' peaks.
pub const FACTOR: f64 = 1.5;

/// ... and this many bytes above that median.
pub const MIN_EXCESS: u64 = 1 << 30;

/// One device holding far more than its peers (module doc).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Imbalance {
    pub device: i64,
    /// The device's peak allocated.
    pub peak_allocated_bytes: u64,
    /// The median of the other devices' peaks allocated (the mean of the two middle ones for
    /// an even count).
    pub peers_median_bytes: u64,
    pub peers_min_bytes: u64,
    pub peers_max_bytes: u64,
    /// Devices compared (the device itself included).
    pub devices: usize,
    /// `peak_allocated_bytes / peers_median_bytes` (infinite peers at 0 are written as `null`).
    pub ratio: Option<f64>,
    /// Whether this device recorded an OOM (its peers had room).
    pub oom: bool,
}

impl Imbalance {
    /// The finding's sentence.
    pub fn headline(&self) -> String {
        let peers = if self.peers_min_bytes == self.peers_max_bytes {
            fs(self.peers_min_bytes)
        } else {
            format!("{}–{}", fs(self.peers_min_bytes), fs(self.peers_max_bytes))
        };
        let times = self.ratio.map_or(String::new(), |r| format!(", {r:.1}× their median"));
        format!(
            "Device {} held up to {} allocated while the other {} device{} peaked at {peers}{times}: the work is not \
             spread evenly ({}torch.nn.DataParallel gathers every replica's outputs on one device; a model split by \
             hand may put more layers on one GPU).",
            self.device,
            fs(self.peak_allocated_bytes),
            self.devices - 1,
            if self.devices == 2 { "" } else { "s" },
            if self.oom { "it ran out of memory while its peers had room; " } else { "" },
        )
    }
}

/// The imbalanced device among `timelines` (module doc's rule), if any; `ooms` = devices
/// that recorded an OOM.
pub fn imbalance(timelines: &[&DeviceTimeline], ooms: &[i64]) -> Option<Imbalance> {
    let used: Vec<(i64, u64)> =
        timelines.iter().filter(|t| t.peak_reserved.bytes > 0).map(|t| (t.device, t.peak_allocated.bytes)).collect();
    if used.len() < 2 {
        return None;
    }
    // The heaviest device (the lowest-numbered of equals).
    let &(device, peak) = used.iter().max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(&a.0)))?;
    let mut peers: Vec<u64> = used.iter().filter(|(d, _)| *d != device).map(|(_, p)| *p).collect();
    peers.sort_unstable();
    let n = peers.len();
    let median = (peers[(n - 1) / 2] + peers[n / 2]) / 2;
    if (peak as f64) < FACTOR * median as f64 || peak < median.saturating_add(MIN_EXCESS) {
        return None;
    }
    Some(Imbalance {
        device,
        peak_allocated_bytes: peak,
        peers_median_bytes: median,
        peers_min_bytes: peers[0],
        peers_max_bytes: *peers.last()?,
        devices: used.len(),
        ratio: (median > 0).then(|| peak as f64 / median as f64),
        oom: ooms.contains(&device),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use fragscope_trace::Peak;

    const GIB: u64 = 1 << 30;

    fn tl(device: i64, allocated: u64, reserved: u64) -> DeviceTimeline {
        let mut t = fragscope_trace::timeline(&fragscope_snapshot::Snapshot::default(), device, &Default::default());
        t.device = device;
        t.peak_allocated = Peak { bytes: allocated, event_index: None, time_us: None };
        t.peak_reserved = Peak { bytes: reserved, event_index: None, time_us: None };
        t
    }

    #[test]
    fn one_heavy_device_among_three_is_named() {
        // The shape of the corpus's 3-GPU file: 78 GiB beside 8 and 20.
        let t = [tl(0, 8 * GIB, 9 * GIB), tl(1, 78 * GIB, 79 * GIB), tl(2, 20 * GIB, 21 * GIB)];
        let i = imbalance(&t.iter().collect::<Vec<_>>(), &[1]).expect("imbalanced");
        assert_eq!(
            (i.device, i.peers_median_bytes, i.peers_min_bytes, i.peers_max_bytes),
            (1, 14 * GIB, 8 * GIB, 20 * GIB)
        );
        assert!(i.oom);
        let h = i.headline();
        assert!(
            h.starts_with(
                "Device 1 held up to 78.00 GiB allocated while the other 2 devices peaked at 8.00 GiB–20.00 GiB"
            ),
            "{h}"
        );
        assert!(h.contains("ran out of memory while its peers had room"), "{h}");
    }

    #[test]
    fn even_devices_and_small_differences_are_not_imbalance() {
        let even = [tl(0, 40 * GIB, 41 * GIB), tl(1, 41 * GIB, 42 * GIB), tl(2, 39 * GIB, 40 * GIB)];
        assert_eq!(imbalance(&even.iter().collect::<Vec<_>>(), &[]), None);
        // 3× but only 200 MiB apart: under MIN_EXCESS.
        let small = [tl(0, 100 << 20, 128 << 20), tl(1, 300 << 20, 320 << 20)];
        assert_eq!(imbalance(&small.iter().collect::<Vec<_>>(), &[]), None);
        // Just under the factor: 1.49× with 10 GiB of excess.
        let under = [tl(0, 20 * GIB, 21 * GIB), tl(1, 29 * GIB + (GIB / 2), 30 * GIB)];
        assert_eq!(imbalance(&under.iter().collect::<Vec<_>>(), &[]), None);
    }

    /// A synthetic two-device snapshot (state only, one segment per device, fully allocated):
    /// `analyze` names the heavy device in the file's findings, and not when they are even.
    #[test]
    fn analyze_names_the_heavy_device_of_a_synthetic_snapshot() {
        use fragscope_snapshot::{Block, BlockState, Segment, SegmentType, Snapshot};
        fn seg(device: i64, address: u64, size: u64) -> Segment {
            Segment {
                device,
                address,
                total_size: size,
                allocated_size: size,
                active_size: size,
                requested_size: Some(size),
                stream: 0,
                segment_type: SegmentType::Large,
                segment_pool_id: Some((0, 0)),
                is_expandable: Some(false),
                stack: None,
                blocks: vec![Block {
                    address,
                    size,
                    requested_size: Some(size),
                    state: BlockState::ActiveAllocated,
                    stack: None,
                    history: None,
                }],
            }
        }
        let two = |heavy: u64| {
            let mut s = Snapshot::default();
            s.segments.push(seg(0, 1 << 40, 2 * GIB));
            s.segments.push(seg(1, 2 << 40, heavy));
            crate::analyze(&s, &crate::AnalyzeOptions::default())
        };
        let a = two(6 * GIB);
        let i = a.device_imbalance.as_ref().expect("device 1 holds 3× device 0");
        assert_eq!((i.device, i.peak_allocated_bytes, i.peers_median_bytes), (1, 6 * GIB, 2 * GIB));
        assert_eq!(a.findings.len(), 1);
        assert_eq!(a.findings[0].kind, crate::FindingKind::DeviceImbalance);
        assert!(a.findings[0].headline.starts_with("Device 1 held up to 6.00 GiB"), "{}", a.findings[0].headline);
        let even = two(2 * GIB + (GIB / 2));
        assert!(even.device_imbalance.is_none() && even.findings.is_empty());
    }

    #[test]
    fn devices_that_reserved_nothing_are_not_peers() {
        // A file naming a device the process never used: one device, nothing to compare.
        let t = [tl(0, 0, 0), tl(1, 10 * GIB, 11 * GIB)];
        assert_eq!(imbalance(&t.iter().collect::<Vec<_>>(), &[]), None);
        // Two of them, one at twice the other: named, with the ratio.
        let t = [tl(0, 4 * GIB, 5 * GIB), tl(1, 10 * GIB, 11 * GIB), tl(2, 0, 0)];
        let i = imbalance(&t.iter().collect::<Vec<_>>(), &[]).expect("imbalanced");
        assert_eq!((i.device, i.devices, i.ratio), (1, 2, Some(2.5)));
        assert!(i.headline().contains("the other 1 device peaked at 4.00 GiB, 2.5× their median"), "{}", i.headline());
    }
}
