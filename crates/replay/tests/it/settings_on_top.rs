//! What-ifs on top of the recorded settings (`config_on_top`) keep what they do not change,
//! the free-list tie-break included; and recorded settings the parser cannot read are
//! said, by name, in the replay's notes (issue 40's follow-ups).

use fragscope_alloc::{AllocatorConfig, TieBreak};
use fragscope_replay::{config_on_top, recorded_config, verify, Recorder, ReplayOptions};
use fragscope_snapshot::Snapshot;

const MIB: u64 = 1 << 20;

/// A recording only PR #183591's tie-break explains: two free 12 MiB blocks, the older
/// segment at the higher address, and the next 12 MiB request recorded in the older one.
/// Made by the model (whose synthetic device never hands out a lower address later), then
/// the third segment moved to the address the first one gave back, as a real driver does.
fn registration_order_recording() -> Snapshot {
    let mut r = Recorder::new("", 80 << 30, 1_000, 10).unwrap();
    let st = r.stack(&[("train.py", 10, "main")]);
    let a = r.malloc(12 * MIB, 0, st).unwrap();
    let b = r.malloc(12 * MIB, 0, st).unwrap();
    r.free(a).unwrap();
    r.empty_cache(); // a's segment goes back to the driver
    let c = r.malloc(12 * MIB, 0, st).unwrap();
    r.free(b).unwrap();
    r.free(c).unwrap();
    let d = r.malloc(12 * MIB, 0, st).unwrap();
    assert_eq!(d, b, "oldest and lowest agree on the synthetic device");
    let mut snap = r.finish();
    // The driver gives c's segment a's old address: now the older free block (b's) is the
    // higher one, and the recorded choice of b is the registration counter's.
    let moved = |x: u64| if (c..c + 12 * MIB).contains(&x) { x - c + a } else { x };
    for e in snap.device_traces.iter_mut().flatten() {
        e.addr = moved(e.addr);
    }
    for s in &mut snap.segments {
        s.address = moved(s.address);
        for blk in &mut s.blocks {
            blk.address = moved(blk.address);
        }
    }
    snap
}

/// A what-if that changes nothing reproduces the replay under the recorded settings
/// exactly when those use the registration-order tie-break; one that changes something
/// else keeps the tie-break too.
#[test]
fn a_what_if_that_changes_nothing_keeps_the_recorded_tie_break() {
    let snap = registration_order_recording();
    let reg = AllocatorConfig { tie_break: TieBreak::RegistrationOrder, ..recorded_config(&snap) };
    let with = |cfg: AllocatorConfig| verify(&snap, 0, &ReplayOptions { config: Some(cfg), ..Default::default() });
    let exact = with(reg.clone());
    assert!(exact.allocs == 4 && exact.fully_matched(), "{:?}", exact.first_divergence);
    // The recording tells the tie-breaks apart: the lowest address is not what it took.
    let by_address = with(AllocatorConfig { tie_break: TieBreak::Address, ..reg.clone() });
    assert_eq!(by_address.allocs_matched, 3, "{:?}", by_address.first_divergence);
    for extra in ["expandable_segments:False", "large_segment_size_mb:20", "garbage_collection_threshold:0.5"] {
        let cfg = config_on_top(&reg, extra).unwrap();
        assert_eq!(cfg.tie_break, TieBreak::RegistrationOrder, "{extra}");
        let r = with(cfg);
        if extra.starts_with("garbage") {
            // Changes the settings, not this trace's decisions (nothing is near the limit).
            assert!(r.fully_matched(), "{extra}: {:?}", r.first_divergence);
        } else {
            assert_eq!(r, exact, "{extra}");
        }
    }
}

/// Every field of the base that the string on top does not change stays as it was,
/// whether or not a settings string can express it.
#[test]
fn config_on_top_changes_only_what_it_names() {
    let base = AllocatorConfig {
        tie_break: TieBreak::RegistrationOrder,
        accelerator: fragscope_alloc::Accelerator::Npu,
        ..fragscope_alloc::parse_config("max_split_size_mb:256,roundup_power2_divisions:[256:1,>:4]").unwrap()
    };
    assert_eq!(config_on_top(&base, "expandable_segments:False").unwrap(), base);
    assert_eq!(config_on_top(&base, "max_split_size_mb:256").unwrap(), base);
    let c = config_on_top(&base, "large_segment_size_mb:12").unwrap();
    assert_eq!((c.large_segment_size, c.max_non_split_rounding), (12 * MIB, 12 * MIB));
    assert_eq!(
        AllocatorConfig { large_segment_size: 20 * MIB, max_non_split_rounding: 20 * MIB, ..c },
        base,
        "only the segment size and what follows it changed"
    );
    let c = config_on_top(&base, "expandable_segments:True,max_split_size_mb:512").unwrap();
    assert_eq!(AllocatorConfig { expandable_segments: false, max_split_size: Some(256 * MIB), ..c }, base);
}

/// A recording made with `large_segment_size_mb:12` whose settings string also holds an
/// option this parser does not know (another version's, say): the replay keeps the parts
/// it reads, so the 12 MiB segments replay exactly, and its notes name the part left out.
#[test]
fn an_unreadable_part_of_the_recorded_settings_is_left_out_by_name() {
    let mut r = Recorder::new("large_segment_size_mb:12", 80 << 30, 1_000, 10).unwrap();
    let st = r.stack(&[("train.py", 10, "main")]);
    let kept: Vec<u64> = (0..3).map(|_| r.malloc(3 * MIB, 0, st).unwrap()).collect();
    r.free(kept[1]).unwrap();
    r.malloc(5 * MIB, 0, st).unwrap();
    let mut snap = r.finish();
    let conf = "expandable_segments:False,some_future_option:7,large_segment_size_mb:12";
    let Some(fragscope_snapshot::PyObj::Dict(items)) = snap.allocator_settings.as_mut() else { panic!("settings") };
    for (k, v) in items.iter_mut() {
        if k.as_str() == Some("PYTORCH_CUDA_ALLOC_CONF") {
            *v = fragscope_snapshot::PyObj::Str(conf.into());
        }
    }
    assert!(fragscope_alloc::parse_config(conf).is_err(), "the whole string is refused");
    assert_eq!(recorded_config(&snap).large_segment_size, 12 * MIB, "the parts read still apply");
    let unread = fragscope_replay::unread_settings(&snap);
    assert_eq!(unread.len(), 1, "{unread:?}");
    assert_eq!(unread[0].item, "some_future_option:7");
    assert!(unread[0].error.contains("'some_future_option'"), "{unread:?}");
    let rep = verify(&snap, 0, &ReplayOptions::default());
    assert!(rep.allocs == 4 && rep.fully_matched(), "{:?}", rep.first_divergence);
    let note = rep.notes.iter().find(|n| n.contains("cannot read")).unwrap_or_else(|| panic!("{:?}", rep.notes));
    assert!(note.contains("\"some_future_option:7\""), "{note}");
}

/// Parts are split at the commas outside brackets, and a bound that depends on
/// `large_segment_size_mb` holds whatever the order of the parts.
#[test]
fn recorded_strings_are_read_part_by_part() {
    use fragscope_replay::read_recorded_conf;
    let (cfg, unread) = read_recorded_conf(
        "max_split_size_mb:12,roundup_power2_divisions:[256:1,>:4],bogus:[1:2],large_segment_size_mb:12",
    );
    assert_eq!(unread.iter().map(|u| u.item.as_str()).collect::<Vec<_>>(), ["bogus:[1:2]"]);
    assert_eq!((cfg.max_split_size, cfg.large_segment_size), (Some(12 * MIB), 12 * MIB));
    let divisions = fragscope_alloc::parse_config("roundup_power2_divisions:[256:1,>:4]").unwrap();
    assert_eq!(cfg.roundup_power2_divisions, divisions.roundup_power2_divisions);
    let (cfg, unread) = read_recorded_conf("expandable_segments:True");
    assert!(cfg.expandable_segments && unread.is_empty());
}
