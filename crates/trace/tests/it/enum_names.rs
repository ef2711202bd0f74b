//! The enums of the JSON documents serialize as their `as_str` (and `Display`) says: the
//! text front ends print and the JSON they emit cannot drift apart.

use fragscope_snapshot::SourceFormat;
use fragscope_trace::{History, PeakKind, ReservedSource, StepSource};

fn same<T: serde::Serialize + std::fmt::Display>(values: &[T], names: &[&str]) {
    assert_eq!(values.len(), names.len());
    for (v, name) in values.iter().zip(names) {
        assert_eq!(serde_json::to_string(v).unwrap(), format!("\"{name}\""));
        assert_eq!(v.to_string(), *name);
    }
}

#[test]
fn json_names_are_the_display_names() {
    use History::*;
    same(&[None, SingleEntry, Complete, BeganMidRun], &["none", "single_entry", "complete", "began_mid_run"]);
    same(
        &[ReservedSource::Segments, ReservedSource::ProfilerTotals, ReservedSource::None],
        &["segments", "profiler_totals", "none"],
    );
    same(&[PeakKind::AllocatedPeak, PeakKind::ReservedPeak], &["allocated_peak", "reserved_peak"]);
    same(
        &[StepSource::Optimizer, StepSource::Backward, StepSource::Annotation, StepSource::None],
        &["optimizer", "backward", "annotation", "none"],
    );
    same(&[SourceFormat::Dict, SourceFormat::SegmentList, SourceFormat::Kineto], &["dict", "segment_list", "kineto"]);
}
