//! Leftover of issue 12: `roundup_power2_divisions` read back from a saved snapshot must
//! round as the configuration that produced it. For each configuration, the settings the
//! recorder writes (`allocator_settings`, as PyTorch 2.3+ does) go through the pickle writer
//! and reader, and `recorded_config` of what was read must give the same `round_size` for
//! sizes across all 16 intervals.

use fragscope_alloc::parse_config;
use fragscope_alloc::rounding::round_size;
use fragscope_replay::{allocator_settings, recorded_config};
use fragscope_snapshot::Snapshot;

fn sizes() -> Vec<u64> {
    let mut v = vec![1, 511, 512, 513, 1000, 1200, 3000, 5000, 9000];
    for shift in 10..40 {
        let p = 1u64 << shift;
        v.extend([p - 1, p, p + 1, p + p / 3, p + p / 2 + 7, 2 * p - 513]);
    }
    v
}

#[test]
fn divisions_read_back_round_as_the_config() {
    let confs = [
        "",
        "roundup_power2_divisions:4",
        "roundup_power2_divisions:8",
        "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]",
        "roundup_power2_divisions:[64:8,>:0]",
        "roundup_power2_divisions:[1:16,2:8,>:2]",
        "expandable_segments:True,roundup_power2_divisions:2",
        "max_split_size_mb:200,roundup_power2_divisions:[128:4,>:1]",
    ];
    for conf in confs {
        let cfg = parse_config(conf).unwrap_or_else(|e| panic!("{conf}: {e}"));
        // As `replay --save-snapshot` writes it: the canonical string of the config.
        let canonical = cfg.to_conf_string();
        let reparsed = parse_config(&canonical).unwrap_or_else(|e| panic!("{canonical}: {e}"));
        assert_eq!(reparsed.roundup_power2_divisions, cfg.roundup_power2_divisions, "{conf} -> {canonical}");
        let snap = Snapshot { allocator_settings: Some(allocator_settings(&cfg, &canonical)), ..Default::default() };
        let mut bytes = Vec::new();
        fragscope_snapshot::pickle::write::write_snapshot(&snap, &mut bytes).unwrap();
        let back = fragscope_snapshot::read_from(&bytes[..]).unwrap();
        let got = recorded_config(&back);
        assert_eq!(got.roundup_power2_divisions, cfg.roundup_power2_divisions, "{conf}");
        for n in sizes() {
            assert_eq!(round_size(n, &got), round_size(n, &cfg), "{conf}: round_size({n})");
        }
    }
}
