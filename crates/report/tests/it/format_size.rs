//! The page formats byte counts in JavaScript (`bytes()` in `assets/js/util.js`: it
//! formats figures it computes as the user zooms, clicks or hovers), everything else in
//! fragscope with Rust's [`fragscope_alloc::format_size`]. To keep the two the same, this
//! test holds `tests/format_size.json`, a table of (bytes, `format_size`'s text) for a
//! spread of values (each unit's edges, the exact ties of the second decimal, their
//! neighbours, values up to 2^53), to what `format_size` gives now; the browser test
//! (`tests/browser/page.test.mjs`, "byte formatter") checks that `bytes()` gives the same
//! text for each.
//!
//! After a deliberate change of `format_size`, rewrite the table with
//! `FRAGSCOPE_BLESS=1 cargo test -p fragscope-report --test it format_size`.

use std::collections::BTreeSet;
use std::path::Path;

use fragscope_alloc::format_size;
use fragscope_testdata::Rng;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// The values of the table (see the module doc), in order.
fn values() -> BTreeSet<u64> {
    let mut v: BTreeSet<u64> = [0, 1, 2, 511, 512, 999, 1000, 1023, 1536, 10_240, 123_456_789].into();
    for u in [KIB, MIB, GIB] {
        // The edges where the unit changes (`<=` 1 KiB is bytes, `<=` 1 MiB is KiB, ...).
        for edge in [u, 1024 * u] {
            v.extend([edge - 1, edge, edge + 1]);
        }
        // The exact ties of the second decimal: q = bytes / unit with 8q odd (q·100 then
        // ends in .5 exactly), and a byte either side of each.
        for odd in (1..2000u64).step_by(2).filter(|j| j % 80 < 4 || *j < 64) {
            let b = u / 8 * odd;
            if b > u && b <= 1024 * u {
                v.extend([b - 1, b, b + 1]);
            }
        }
        // Round second decimals and a byte either side: q = k/100 as near as bytes go.
        for k in [101u64, 105, 150, 199, 999, 1001, 12_345, 102_399] {
            let b = u * k / 100;
            if b > u {
                v.extend([b - 1, b, b + 1]);
            }
        }
    }
    // Thousands of GiB and more, up to the largest byte count the page's arrays hold
    // exactly (2^53).
    v.extend([1024 * GIB + 1, 1536 * GIB, 10u64.pow(15), (1 << 53) - 1, 1 << 53]);
    // A random spread over every order of magnitude.
    let mut rng = Rng(2026);
    for _ in 0..400 {
        let bits = 1 + rng.below(53);
        v.insert(rng.next_u64() >> (64 - bits));
    }
    v
}

/// The table as JSON, one `[bytes, text]` pair a line.
fn table_json() -> String {
    let rows: Vec<String> =
        values().into_iter().map(|b| format!("  [{b}, {}]", serde_json::to_string(&format_size(b)).unwrap())).collect();
    format!("[\n{}\n]\n", rows.join(",\n"))
}

#[test]
fn format_size_table_for_the_browser_test_is_what_rust_gives() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/format_size.json");
    let want = table_json();
    if std::env::var_os("FRAGSCOPE_BLESS").is_some() {
        std::fs::write(&path, &want).unwrap();
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "{} differs from what format_size gives now: rewrite it with \
         FRAGSCOPE_BLESS=1 cargo test -p fragscope-report --test it format_size",
        path.display()
    );
    // The table holds what it is for: every unit, and ties that round to even.
    for text in ["1024 bytes", "1.00 KiB", "1024.00 KiB", "1.00 MiB", "1024.00 MiB", "1.00 GiB", "7.12 GiB"] {
        assert!(have.contains(&format!("\"{text}\"")), "{text}");
    }
}
