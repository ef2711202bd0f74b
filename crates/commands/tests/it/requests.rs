use fragscope_commands::check::CheckRequest;
use fragscope_commands::predict::{check_request, Request};
use fragscope_commands::replay::{replay_snapshot, ReplayRequest};
use fragscope_commands::state::{state, HoldersBy, StateRequest};
use fragscope_commands::{example, ErrorKind, Words};

#[test]
fn a_bad_capacity_is_an_argument_error_before_any_work() {
    let req = ReplayRequest { capacity: Some("80 potatoes".into()), ..Default::default() };
    let e = req.check().unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidArgument);
    assert!(e.render(Words::Cli).contains("potatoes"), "{e}");
}

#[test]
fn sharding_over_one_rank_names_the_parameter_in_each_front_ends_words() {
    let req = ReplayRequest { shard_optimizer: Some(1), ..Default::default() };
    let e = req.check().unwrap_err();
    assert_eq!(e.render(Words::Cli), "--shard-optimizer 1: sharding needs 2 ranks or more");
    assert_eq!(e.render(Words::Python), "shard_optimizer 1: sharding needs 2 ranks or more");
}

#[test]
fn role_whatifs_do_not_combine_with_advice() {
    let req = ReplayRequest { grads_set_to_none: true, no_caching: true, ..Default::default() };
    let e = req.check().unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidArgument);
    assert!(e.render(Words::Python).contains("no_caching"), "{}", e.render(Words::Python));
}

#[test]
fn a_device_without_a_trace_is_refused_not_answered_empty() {
    let snap = example::snapshot();
    let req = ReplayRequest { device: Some(7), verify: true, ..Default::default() };
    let checked = req.check().unwrap();
    let e = replay_snapshot(&req, &checked, &snap, &mut None).err().expect("device 7 refused");
    assert_eq!(e.kind, ErrorKind::InvalidArgument);
    assert!(e.render(Words::Python).starts_with("device=7: this snapshot has no device 7"), "{e}");
    // The device it has replays.
    let req = ReplayRequest { device: Some(0), verify: true, ..Default::default() };
    let out = replay_snapshot(&req, &req.check().unwrap(), &snap, &mut None).unwrap();
    assert_eq!(out.len(), 1);
    assert!(out[0].verify.allocs > 0);
}

#[test]
fn check_limits_parse_sizes_and_fractions() {
    let req = CheckRequest {
        max_reserved: Some("20GB".into()),
        max_peak_fragmentation: Some("15%".into()),
        ..Default::default()
    };
    let l = req.limits().unwrap();
    assert_eq!(l.max_reserved, Some(20_000_000_000));
    assert_eq!(l.max_peak_fragmentation, Some(0.15));
    let e = CheckRequest { max_allocated: Some("lots".into()), ..Default::default() }.limits().unwrap_err();
    assert!(e.render(Words::Cli).starts_with("--max-allocated: "), "{e}");
    assert!(e.render(Words::Python).starts_with("max_allocated: "), "{e}");
}

#[test]
fn predict_requests_are_checked_before_reading_files() {
    let req = Request { sizes: vec![1, 2], at: vec![], max_size: 1 << 20, ..Default::default() };
    let e = check_request(2, &req).unwrap_err();
    assert_eq!(e.render(Words::Cli), "--at is required (the sizes to predict), or --max-fit with --capacity");
    assert_eq!(e.render(Words::Python), "at is required (the sizes to predict), or max_fit with capacity");
    let e = check_request(2, &Request { sizes: vec![1], at: vec![4], ..Default::default() }).unwrap_err();
    assert!(e.render(Words::Python).starts_with("sizes gives 1 size(s) for 2 file(s)"), "{e}");
}

#[test]
fn state_groupings_and_the_moment() {
    assert_eq!(HoldersBy::parse("role").unwrap(), HoldersBy::Role);
    assert!(HoldersBy::parse("roles").is_err());
    for name in HoldersBy::NAMES {
        assert_eq!(HoldersBy::parse(name).unwrap().as_str(), name);
    }
    let snap = example::snapshot();
    let both = StateRequest { at: Some(3), time: Some("1ms".into()), ..Default::default() };
    assert_eq!(state("x", &snap, &both).err().map(|e| e.kind), Some(ErrorKind::InvalidArgument));
    let past = StateRequest { at: Some(usize::MAX), ..Default::default() };
    let e = state("x", &snap, &past).err().expect("past the trace");
    assert!(e.render(Words::Python).contains("x: at "), "{}", e.render(Words::Python));
    // The holders by role sum to the allocated bytes of that moment.
    let out = state("x", &snap, &StateRequest { at: Some(100), by: HoldersBy::Role, top: 100, ..Default::default() })
        .unwrap();
    let sum: u64 = out.holders.iter().map(|h| h.bytes).sum::<u64>() + out.other_bytes;
    assert_eq!(sum, out.holders_total_bytes);
    assert_eq!(out.holders_by, "role");
}

/// Issue 40: `state` shows each pool apart when a private pool holds segments. A real trace
/// moved whole into pool (1, 0) (as a CUDA graph's pool is named): one band, whose figures
/// are the state's own; the file as recorded (default pools only) has no band, and its JSON
/// no `pools` key.
#[test]
fn state_shows_a_private_pool_as_its_own_band() {
    let path = fragscope_testdata::real_file("effdl-course-liger-ce.pickle").expect("in the repository");
    let mut snap = fragscope_snapshot::read_path(&path).unwrap();
    let req = StateRequest { at: Some(snap.trace(0).len() / 2), ..StateRequest::default() };
    let plain = state("plain", &snap, &req).unwrap();
    assert!(plain.pools.is_empty());
    assert!(!fragscope_commands::state::json(&plain).unwrap().contains("\"pools\""));
    for s in &mut snap.segments {
        s.segment_pool_id = Some((1, 0));
    }
    let pool =
        snap.intern_context(fragscope_snapshot::EntryContext { pool_id: Some((1, 0)), ..Default::default() }).unwrap();
    for e in &mut snap.device_traces[0] {
        e.context = pool;
    }
    let out = state("graph", &snap, &req).unwrap();
    assert_eq!(out.pools.len(), 1, "{:?}", out.pools);
    let b = &out.pools[0];
    assert_eq!(b.pool, (1, 0));
    assert_eq!(
        (b.reserved_bytes, b.allocated_bytes, b.cached_free_bytes, b.largest_free_block_bytes),
        (
            out.state.reserved_bytes,
            out.state.allocated_bytes,
            out.state.cached_free_bytes,
            out.state.largest_free_block_bytes
        )
    );
    assert!(b.reserved_bytes > 0);
    assert!(fragscope_commands::state::json(&out).unwrap().contains("\"pools\""));
}
