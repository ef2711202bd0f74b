//! Trace entries whose `frames` is a list of its own, as most entries of PyTorch's dumps
//! are (the frame dicts shared through the memo): the reader knows a list it has met by its
//! bytes, and must give every entry the very stack CPython reads there, whatever the list's
//! shape: empty, one item (`APPEND`), 1000 items and over (two `MARK … APPENDS` batches, or
//! a batch and an `APPEND`), `BINGET` and `LONG_BINGET` items mixed, many stacks that
//! share their innermost frames (more than the reader remembers per group) or all but a
//! middle one, and FRAME opcodes that CPython's framer puts between items.

mod common;

/// The pickle and, per entry, its frames as CPython reads them.
const SCRIPT: &str = r#"
import json, pickle, pickletools, random, sys
random.seed(11)
# Frame dicts are shared objects (PyTorch builds each once), so the pickle writes each once
# and refers to it through the memo afterwards.
frames = [{'filename': '/src/mod%d.py' % (i % 13), 'line': i, 'name': 'fn%d' % i} for i in range(600)]
stacks = []
# 40 stacks with the same 30 innermost frames, differing further out (and in depth).
for k in range(40):
    stacks.append(frames[:30] + frames[100 + k:100 + k + 1 + (k % 9) * 4])
# 10 of one depth that differ only in a middle frame (one op called from ten places).
for k in range(10):
    stacks.append(frames[:30] + [frames[400 + k]] + frames[30:40])
# 12 that share only the first 3 frames.
for k in range(12):
    stacks.append(frames[:3] + frames[300 + 7 * k:300 + 7 * k + 20])
stacks.append([])                                            # empty list
stacks.append([frames[5]])                                   # one item: APPEND
stacks.append([frames[250]])                                 # one LONG_BINGET item (later)
stacks.append([frames[i % 600] for i in range(1000)])        # one full batch
stacks.append([frames[i % 600] for i in range(1001)])        # the same batch, then one APPEND
stacks.append([frames[(7 * i) % 600] for i in range(2100)])  # three batches
entries, which = [], []
for i in range(30000):
    k = random.randrange(len(stacks))
    which.append(k)
    entries.append({'action': random.choice(['alloc', 'free_requested', 'free_completed']),
                    'addr': 0x7f0000000000 + 512 * i, 'size': 512 + i, 'stream': 0,
                    'time_us': 1700000000000000 + i, 'frames': list(stacks[k])})
data = pickle.dumps({'segments': [], 'device_traces': [entries]}, protocol=4)
# The framer must have cut some list between two of its items.
ops = [op.name for op, _, _ in pickletools.genops(data)]
refs = ('BINGET', 'LONG_BINGET')
inside = sum(1 for a, b, c in zip(ops, ops[1:], ops[2:]) if b == 'FRAME' and a in refs and c in refs)
assert inside > 0, 'no FRAME between list items'
assert 'BINGET' in ops and 'LONG_BINGET' in ops
open(sys.argv[1], 'wb').write(data)
json.dump({'stacks': [[[f['filename'], f['line'], f['name']] for f in s] for s in stacks], 'which': which},
          open(sys.argv[2], 'w'))
print(inside)
"#;

#[test]
fn every_fresh_frames_list_reads_as_cpython_reads_it() {
    let py = common::python3().expect("python3 (this test builds its pickle with CPython)");
    let dir = common::scratch_dir("fresh_stacks_lists");
    let (pkl, want) = (dir.join("s.pickle"), dir.join("want.json"));
    let framed = common::run_python(py, SCRIPT, &[&pkl, &want]);
    let want: serde_json::Value = serde_json::from_slice(&std::fs::read(&want).unwrap()).unwrap();
    let stacks = want["stacks"].as_array().unwrap();
    let which = want["which"].as_array().unwrap();
    let bytes = std::fs::read(&pkl).unwrap();
    // The file as a whole (mapped, one buffer) and through a reader (the stream's own
    // buffer refills land anywhere, inside lists too).
    for (how, snap) in [
        ("file", fragscope_snapshot::read_path(&pkl).unwrap()),
        ("stream", fragscope_snapshot::read_from(std::io::BufReader::with_capacity(4096, &bytes[..])).unwrap()),
    ] {
        let trace = snap.trace(0);
        assert_eq!(trace.len(), which.len(), "{how}: entries");
        for (i, (ev, k)) in trace.iter().zip(which).enumerate() {
            let want = stacks[k.as_u64().unwrap() as usize].as_array().unwrap();
            let got: Vec<(&str, i64, &str)> = snap.frames.resolved(ev.stack.expect("frames key")).collect();
            assert_eq!(got.len(), want.len(), "{how}: entry {i}: depth");
            for (g, w) in got.iter().zip(want) {
                assert_eq!(
                    (g.0, g.1, g.2),
                    (w[0].as_str().unwrap(), w[1].as_i64().unwrap(), w[2].as_str().unwrap()),
                    "{how}: entry {i}"
                );
            }
        }
    }
    eprintln!("30000 entries, {} FRAME opcodes between list items: every stack as CPython reads it", framed.trim());
    let _ = std::fs::remove_dir_all(&dir);
}
