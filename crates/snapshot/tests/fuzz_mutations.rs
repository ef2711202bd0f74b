//! Bounded mutation fuzzing (the fuzz pass CI runs): real pickles from ../shared/traces,
//! with random byte flips, insertions, deletions, duplicated spans and truncations, must
//! make `read_from` return Ok or Err — never panic, hang or abort.
//!
//! Sized to finish in well under 20 s in the default test profile. Set
//! `FRAGSCOPE_FUZZ_CASES` to run more (e.g. 100000 for a long local session). The
//! cargo-fuzz target in `fuzz/` is the unbounded, coverage-guided version of this.

#[path = "it/common.rs"]
mod common;

use std::sync::OnceLock;
use std::time::Instant;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

/// Small real files (fast to parse, so many mutations per second), plus the same files
/// as our writer writes them (a different opcode mix: shared stacks, long memo refs).
fn corpus() -> &'static Vec<(String, Vec<u8>)> {
    static C: OnceLock<Vec<(String, Vec<u8>)>> = OnceLock::new();
    C.get_or_init(|| {
        let mut v = Vec::new();
        for p in common::small_pickles(80_000) {
            let bytes = std::fs::read(&p).unwrap();
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            if let Ok(snap) = fragscope_snapshot::read_from(&bytes[..]) {
                let mut w = Vec::new();
                fragscope_snapshot::pickle::write::write_snapshot(&snap, &mut w).unwrap();
                v.push((format!("{name} (rewritten)"), w));
            }
            v.push((name, bytes));
        }
        // A trace of a few thousand entries, so that mutations also reach the reader's
        // batch decoder (whole APPENDS batches of 1,000 entries, after the first).
        let long = common::small_pickles(80_000).into_iter().find_map(|p| {
            let mut snap = fragscope_snapshot::read_path(&p).ok()?;
            let t = snap.device_traces.iter_mut().find(|t| t.len() >= 20)?;
            let base = t.clone();
            while t.len() < 2500 {
                t.extend_from_slice(&base);
            }
            let mut w = Vec::new();
            fragscope_snapshot::pickle::write::write_snapshot(&snap, &mut w).ok()?;
            Some((format!("{} (trace repeated)", p.display()), w))
        });
        v.extend(long);
        v
    })
}

#[derive(Clone, Debug)]
enum Mutation {
    Flip {
        pos: usize,
        xor: u8,
    },
    Set {
        pos: usize,
        byte: u8,
    },
    Insert {
        pos: usize,
        bytes: Vec<u8>,
    },
    Delete {
        pos: usize,
        len: usize,
    },
    /// Copies a span elsewhere (repeats real opcode sequences, e.g. MARKs and memo refs).
    Duplicate {
        from: usize,
        len: usize,
        to: usize,
    },
    Truncate {
        at: usize,
    },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    // Positions are fractions of the input length, resolved when applied.
    let pos = any::<usize>();
    prop_oneof![
        4 => (pos, 1u8..).prop_map(|(pos, xor)| Mutation::Flip { pos, xor }),
        // Interesting bytes: opcodes that change structure or lengths.
        3 => (pos, prop::sample::select(vec![0x00, 0xff, b'(', b'e', b'u', b'a', b's', b'h', b'j', 0x94, 0x95, 0x8c, 0x8a, b'.', b'0', b'1', b'2', b'}', b']', b')', 0x85, 0x86, 0x87, b't', b'l', b'd'])).prop_map(|(pos, byte)| Mutation::Set { pos, byte }),
        2 => (pos, prop::collection::vec(any::<u8>(), 1..8)).prop_map(|(pos, bytes)| Mutation::Insert { pos, bytes }),
        2 => (pos, 1usize..64).prop_map(|(pos, len)| Mutation::Delete { pos, len }),
        1 => (pos, 1usize..256, pos).prop_map(|(from, len, to)| Mutation::Duplicate { from, len, to }),
        1 => pos.prop_map(|at| Mutation::Truncate { at }),
    ]
}

fn apply(input: &[u8], muts: &[Mutation]) -> Vec<u8> {
    let mut b = input.to_vec();
    for m in muts {
        if b.is_empty() {
            break;
        }
        let at = |p: usize, b: &Vec<u8>| p % b.len();
        match m {
            Mutation::Flip { pos, xor } => {
                let i = at(*pos, &b);
                b[i] ^= xor;
            }
            Mutation::Set { pos, byte } => {
                let i = at(*pos, &b);
                b[i] = *byte;
            }
            Mutation::Insert { pos, bytes } => {
                let i = at(*pos, &b);
                b.splice(i..i, bytes.iter().copied());
            }
            Mutation::Delete { pos, len } => {
                let i = at(*pos, &b);
                let j = (i + len).min(b.len());
                b.drain(i..j);
            }
            Mutation::Duplicate { from, len, to } => {
                let i = at(*from, &b);
                let span: Vec<u8> = b[i..(i + len).min(b.len())].to_vec();
                let t = at(*to, &b);
                b.splice(t..t, span);
            }
            Mutation::Truncate { at: p } => {
                let i = at(*p, &b);
                b.truncate(i);
            }
        }
    }
    b
}

/// The runner's settings. Seeded so a run is the same on every machine (proptest's own
/// default seed is random: a CI run once failed on inputs no local run had made);
/// `PROPTEST_RNG_SEED=N` explores others, and the seed used is printed.
fn config(cases: u32) -> Config {
    let mut c = Config {
        cases,
        failure_persistence: None, // never write regression files into the repository
        rng_algorithm: proptest::test_runner::RngAlgorithm::ChaCha,
        ..Config::default()
    };
    if std::env::var_os("PROPTEST_RNG_SEED").is_none() {
        c.rng_seed = proptest::test_runner::RngSeed::Fixed(0x6672_6167);
    }
    eprintln!("proptest seed: {:?} (PROPTEST_RNG_SEED=N for another)", c.rng_seed);
    c
}

#[test]
fn mutated_real_pickles_never_panic() {
    let files = corpus();
    if files.is_empty() {
        return; // traces_dir() printed why (and fails under CI)
    }
    let cases: u32 = std::env::var("FRAGSCOPE_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(5000);
    let mut runner = TestRunner::new(config(cases));
    let strategy = (0..files.len(), prop::collection::vec(mutation(), 1..6), any::<bool>());
    let start = Instant::now();
    let mut stats = (0u64, 0u64, 0u64); // (ok, err, bytes)
    let stats_ref = std::cell::RefCell::new(&mut stats);
    let result = runner.run(&strategy, |(fi, muts, gz)| {
        let (_, input) = &files[fi];
        let mut data = apply(input, &muts);
        // Sometimes behind gzip, to exercise the decompressing path too.
        if gz {
            data = common::gzip(&data);
        }
        let r = fragscope_snapshot::read_from(&data[..]);
        let mut s = stats_ref.borrow_mut();
        match r {
            Ok(_) => s.0 += 1,
            Err(e) => {
                let m = e.to_string();
                prop_assert!(!m.contains('\n'), "multi-line message: {m}");
                s.1 += 1;
            }
        }
        s.2 += data.len() as u64;
        Ok(())
    });
    let elapsed = start.elapsed();
    eprintln!(
        "fuzz: {} mutated inputs ({} ok, {} refused, {:.1} MB) from {} seed files in {:.2?}",
        stats.0 + stats.1,
        stats.0,
        stats.1,
        stats.2 as f64 / 1e6,
        files.len(),
        elapsed
    );
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// Truncation at every byte of the smallest real file: the parser's resume points.
#[test]
fn every_truncation_of_a_small_file() {
    let Some(p) = common::real_file("selectn-gpt2-generate-stateonly.pickle") else { return };
    let full = std::fs::read(&p).unwrap();
    for cut in 0..full.len() {
        assert!(fragscope_snapshot::read_from(&full[..cut]).is_err(), "cut {cut} accepted");
    }
}

/// `read_path` reads a plain pickle file mapped into memory, `read_from` through a
/// buffer refilled by `read()`: the two must agree on every input — the same model, or
/// the same one-line error. Mutated real pickles written to disk, read both ways.
#[test]
fn mapped_file_reads_like_the_stream() {
    let files = corpus();
    if files.is_empty() {
        return; // traces_dir() printed why (and fails under CI)
    }
    let dir = common::scratch_dir("mapped");
    let path = dir.join("case.pickle");
    let mut runner = TestRunner::new(config(300));
    let strategy = (0..files.len(), prop::collection::vec(mutation(), 0..4));
    let mut seen = (0u32, 0u32);
    let seen_ref = std::cell::RefCell::new(&mut seen);
    let result = runner.run(&strategy, |(fi, muts)| {
        let data = apply(&files[fi].1, &muts);
        std::fs::write(&path, &data).unwrap();
        let mapped = fragscope_snapshot::read_path(&path);
        let streamed = fragscope_snapshot::read_from(&data[..]);
        match (mapped, streamed) {
            (Ok(a), Ok(b)) => {
                prop_assert!(fragscope_snapshot::semantic_diff(&a, &b).is_none(), "{}: models differ", files[fi].0);
                seen_ref.borrow_mut().0 += 1;
            }
            (Err(a), Err(b)) => {
                prop_assert_eq!(a.to_string(), b.to_string());
                seen_ref.borrow_mut().1 += 1;
            }
            (a, b) => prop_assert!(false, "{}: mapped {:?}, streamed {:?}", files[fi].0, a.err(), b.err()),
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    eprintln!("mapped vs streamed: {} same model, {} same error", seen.0, seen.1);
    assert!(seen.0 > 0 && seen.1 > 0, "both outcomes must be exercised: {seen:?}");
}

/// Truncations of a real file on disk (read mapped) are refused like truncated streams.
#[test]
fn truncated_files_on_disk_are_refused() {
    let Some(p) = common::real_file("selectn-gpt2-generate-stateonly.pickle") else { return };
    let full = std::fs::read(&p).unwrap();
    let dir = common::scratch_dir("mapped-cut");
    let path = dir.join("cut.pickle");
    for cut in (1..full.len()).step_by(97) {
        std::fs::write(&path, &full[..cut]).unwrap();
        let e = fragscope_snapshot::read_path(&path).err().unwrap_or_else(|| panic!("cut {cut} accepted"));
        let s = fragscope_snapshot::read_from(&full[..cut]).err().unwrap();
        assert_eq!(e.to_string(), s.to_string(), "cut {cut}");
    }
}

/// One stack opcode inserted before every `APPEND`/`APPENDS`/`SETITEMS` byte of every
/// seed file: the shapes that hand one value to a container twice (a `DUP` before
/// `APPENDS` appended one trace entry twice and indexed a handed-over slot — a panic the
/// random pass found only on CI's file order). Deterministic, so it fails the same way
/// everywhere.
#[test]
fn a_stack_opcode_before_every_container_op() {
    let files = corpus();
    if files.is_empty() {
        return; // traces_dir() printed why (and fails under CI)
    }
    // DUP, POP, MARK, POP_MARK, EMPTY_LIST, BINGET 0, MEMOIZE
    let inserts: [&[u8]; 7] = [b"2", b"0", b"(", b"1", b"]", b"h\x00", b"\x94"];
    let mut tried = 0u64;
    for (name, input) in files {
        // At most 250 sites per file, spread over it (so the batch decoder's batches are
        // reached too): the whole pass stays within a few seconds of the test profile.
        let sites: Vec<usize> =
            input.iter().enumerate().filter(|(_, b)| matches!(b, b'a' | b'e' | b'u')).map(|(i, _)| i).collect();
        for &i in sites.iter().step_by(sites.len().div_ceil(250).max(1)) {
            for ins in inserts {
                let mut b = Vec::with_capacity(input.len() + 2);
                b.extend_from_slice(&input[..i]);
                b.extend_from_slice(ins);
                b.extend_from_slice(&input[i..]);
                let r = std::panic::catch_unwind(|| fragscope_snapshot::read_from(&b[..]));
                match r {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => assert!(!e.to_string().contains('\n'), "{name} @{i}: multi-line message"),
                    Err(_) => panic!("{name}: {:?} inserted at {i} panics the reader", String::from_utf8_lossy(ins)),
                }
                tried += 1;
            }
        }
    }
    eprintln!("{tried} inserted stack opcodes");
}
