//! Timeline, attribution, leaks, diff and check on the real snapshots in
//! `../shared/traces` (not in the repository: the tests fail when the folder is missing
//! and `CI` is set, and otherwise print a note and pass).

use std::path::{Path, PathBuf};

use fragscope_analysis::attribution::{self, AttributionOptions};
use fragscope_analysis::timeline::{self, TimelineOptions};
use fragscope_analysis::{check, diff, leaks, summary};
use fragscope_snapshot::Snapshot;

fn traces_dir() -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/traces");
    if dir.is_dir() {
        return Some(dir);
    }
    if std::env::var_os("CI").is_some() {
        panic!("{} is missing; CI must provide the shared traces", dir.display());
    }
    eprintln!("note: {} not found; skipping", dir.display());
    None
}

fn read(name: &str) -> Option<Snapshot> {
    let p = traces_dir()?.join(name);
    Some(fragscope_snapshot::read_path(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
}

#[test]
fn every_real_file_no_crash_and_consistent() {
    let Some(dir) = traces_dir() else { return };
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).filter(|p| p.is_file() && !p.ends_with("SOURCES.md")).collect();
    files.sort();
    for f in files {
        let Ok(snap) = fragscope_snapshot::read_path(&f) else { continue };
        let name = f.file_name().unwrap().to_string_lossy().to_string();
        let sum = summary::summarize(&snap);
        for tl in timeline::timelines(&snap, &TimelineOptions::default()) {
            let att = attribution::attribute(&snap, &tl, &AttributionOptions::default());
            let lk = leaks::leaks_device(&snap, tl.device, tl.peak_allocated.bytes);
            eprintln!(
                "{name} dev {}: ev {} complete {} seeded {:?} peakA {} @{:?} peakR {} @{:?} frag {:?} end {:?} iters {} {:?} {:?} suspects {} pinned {} retained {:?} {:?}",
                tl.device, tl.events, tl.history_complete, tl.seeded, tl.peak_allocated.bytes, tl.peak_allocated.event_index,
                tl.peak_reserved.bytes, tl.peak_reserved.event_index, tl.peak_fragmentation, tl.end,
                lk.iterations.boundaries.len(), lk.iterations.source, lk.iterations.period_allocs.or(None), lk.suspects.len(), att.pinned_segments.segments, lk.iterations.retained_share, lk.iterations.reason
            );
            for s in lk.suspects.iter().take(3) {
                eprintln!("   suspect {} {} x{} conf {:.2}", s.site.site, s.growth_bytes_per_iteration, s.iterations, s.confidence);
            }
            for s in att.allocated_peak.sites.iter().take(3) {
                eprintln!("   site {} {} {}", s.site.site, s.bytes, s.site.stack);
            }
            assert!(tl.series.len() <= 60);
            assert!(tl.peak_allocated.bytes <= tl.peak_active.bytes.max(tl.peak_allocated.bytes));
            assert_eq!(att.allocated_peak.live_bytes + att.allocated_peak.unattributed_bytes, tl.peak_allocated.bytes, "{name}: live set at the peak sums to the peak");
            let d = sum.devices.iter().find(|d| d.device == tl.device).unwrap();
            assert_eq!(att.pinned_segments.segments, d.fragmentation.pinned_segments, "{name}");
            if tl.reserved_source == "segments" {
                assert_eq!(tl.end.reserved, d.all.reserved_bytes, "{name}: reserved at the end = final state");
                assert!(tl.peak_reserved.bytes >= d.all.reserved_bytes);
            }
            if tl.seeded.inconsistencies == 0 && snap.format != fragscope_snapshot::SourceFormat::Kineto {
                assert_eq!(tl.end.allocated, d.all.allocated_bytes, "{name}: allocated at the end = final state");
            }
        }
    }
}
