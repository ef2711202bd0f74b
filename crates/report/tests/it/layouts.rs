//! Every record the page gets as a flat array has the layout's number of values, and its
//! fields, read back by name (as the page reads them), hold what their names say: on
//! every real pickle, at the default budgets and at small ones (coarse keyframes, event
//! windows). And the page's script carries the same layouts.

use fragscope_report::layout::{self, Block, Event, Life, RequestCount, Segment, StateOp};
use fragscope_report::{file_data, render, DeviceData, FileData, ReportOptions};
use fragscope_snapshot::{Action, Snapshot};

use crate::decode::f64s;

/// The records of a `Float64Array` of records of `len` values each.
fn records(what: &str, b64: &str, len: usize) -> Vec<Vec<f64>> {
    let v = f64s(b64);
    assert_eq!(v.len() % len, 0, "{what}: {} values is not a whole number of {len}-value records", v.len());
    v.chunks(len).map(<[f64]>::to_vec).collect()
}

/// A page stack index: −1 or one of the file's stacks.
fn stack_ok(data: &FileData, s: f64) -> bool {
    s == -1.0 || (s >= 0.0 && (s as usize) < data.stacks.len())
}

/// The lives of `b64`; `before_trace`: whether all of them (`Some(true)`) or none
/// (`Some(false)`) begin before the trace.
fn check_lives(what: &str, data: &FileData, d: &DeviceData, b64: &str, before_trace: Option<bool>) -> usize {
    let lives = records(what, b64, Life::LEN);
    for r in &lives {
        let l = Life::from_values(r);
        assert!(l.size >= l.requested && l.size > 0.0, "{what}: size {} request {}", l.size, l.requested);
        assert!(before_trace.is_none_or(|b| b == (l.start == 0.0)), "{what}: start {}", l.start);
        assert!(l.end == -1.0 || (l.end > l.start && l.end <= d.events as f64), "{what}: {} to {}", l.start, l.end);
        assert!(stack_ok(data, l.stack), "{what}: stack {}", l.stack);
    }
    lives.len()
}

fn check_device(what: &str, snap: &Snapshot, data: &FileData, d: &DeviceData) {
    let trace = snap.trace(d.device);
    check_lives(&format!("{what} allocations"), data, d, &d.allocations, Some(false));
    check_lives(&format!("{what} initial allocations"), data, d, &d.initial_allocations, Some(true));
    let segs = check_lives(&format!("{what} segments"), data, d, &d.segments, None);
    assert!(segs <= d.segment_count, "{what}: {segs} segments drawn of {}", d.segment_count);

    let requests: Vec<RequestCount> =
        records(what, &d.requests, RequestCount::LEN).iter().map(|r| RequestCount::from_values(r)).collect();
    let allocs = trace.iter().filter(|e| e.action == Action::Alloc).count();
    assert_eq!(requests.iter().map(|r| r.count).sum::<f64>() as usize, allocs, "{what}: requests count the allocs");
    assert!(requests.windows(2).all(|w| w[0].size < w[1].size), "{what}: request sizes distinct, in order");

    for w in &d.event_list {
        for (k, r) in records(what, &w.entries, Event::LEN).iter().enumerate() {
            let (e, t) = (Event::from_values(r), &trace[w.first + k]);
            assert_eq!(Action::ALL[e.action as usize], t.action, "{what}: entry {}", w.first + k);
            assert_eq!((e.address, e.size), (t.addr as f64, t.size as f64), "{what}: entry {}", w.first + k);
            assert!(stack_ok(data, e.stack), "{what}: entry {}", w.first + k);
        }
    }

    for m in &d.moments {
        let segs: Vec<Segment> =
            records(what, &m.segments, Segment::LEN).iter().map(|r| Segment::from_values(r)).collect();
        for r in records(what, &m.blocks, Block::LEN) {
            let b = Block::from_values(&r);
            let s = segs[b.segment as usize];
            assert!(b.address >= s.address && b.address + b.size <= s.address + s.size, "{what} state {}", m.state);
            assert!(matches!(b.state as u64, 0..=2) || (b.state == 3.0 && m.figures.is_some()), "{what}: {}", b.state);
            assert!(b.state == 3.0 || stack_ok(data, b.stack), "{what} state {}: stack {}", m.state, b.stack);
        }
        assert!(segs.iter().all(|s| (0.0..8.0).contains(&s.flags)), "{what} state {}: segment flags", m.state);
    }

    let ops: Vec<StateOp> =
        records(what, &d.state_ops.ops, StateOp::LEN).iter().map(|r| StateOp::from_values(r)).collect();
    assert_eq!(ops.len(), d.state_ops.count, "{what}: state ops");
    assert!(ops.windows(2).all(|w| w[0].event <= w[1].event), "{what}: ops in event order");
    for o in &ops {
        assert!((o.event as usize) < d.events && matches!(o.kind as u64, 0..=3), "{what}: op {o:?}");
    }
}

#[test]
fn every_record_has_its_layout_and_the_page_reads_the_same() {
    let small =
        ReportOptions { state_values: 30_000, event_values: 5_000, top_allocations: 50, ..ReportOptions::default() };
    let files = fragscope_testdata::real_pickles();
    for path in &files {
        let snap = fragscope_snapshot::read_path(path).unwrap();
        for (budget, opts) in [("default", ReportOptions::default()), ("small", small)] {
            let data = file_data(&path.display().to_string(), false, &snap, &opts);
            for d in &data.devices {
                check_device(&format!("{} cuda:{} ({budget})", path.display(), d.device), &snap, &data, d);
            }
            if budget == "default" {
                let page = render(&[data]);
                assert!(
                    page.contains(&format!("const LAYOUT = {};", layout::json())),
                    "{}: the script's layouts",
                    path.display()
                );
            }
        }
    }
    assert!(files.len() >= fragscope_testdata::min_files(20), "{} files", files.len());
}
