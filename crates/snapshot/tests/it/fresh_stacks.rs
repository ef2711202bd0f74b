//! Trace entries whose `frames` is a list of its own, as most entries of PyTorch's dumps
//! are (the frame dicts shared through the memo): the reader knows a list it has met by its
//! bytes, and must give every entry the very stack CPython reads there, whatever the list's
//! shape: empty, one item (`APPEND`), 1000 items and over (two `MARK … APPENDS` batches, or
//! a batch and an `APPEND`), `BINGET` and `LONG_BINGET` items mixed, many stacks that
//! share their innermost frames (more than the reader remembers per group) or all but a
//! middle one, FRAME opcodes that CPython's framer puts between items, and lists in a
//! repeating order (which the reader guesses) swapped now and then for one a frame longer
//! or shorter.

use crate::common;

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
full = len(stacks)
stacks.append([frames[i % 20] for i in range(1000)])         # a full batch, short references
stacks.append([frames[i % 600] for i in range(1001)])        # the same batch, then one APPEND
stacks.append([frames[(7 * i) % 600] for i in range(2100)])  # three batches
# The second half repeats a step of 25 stacks, as training does, now and then with one of
# them swapped for a list that extends it by a frame or stops a frame short: the reader
# guesses a list from the ones before it and the entry's action, and must tell such a
# list from its guess.
step = [random.randrange(len(stacks)) for _ in range(25)]
step_actions = [random.choice(['alloc', 'free_requested', 'free_completed']) for _ in step]
# With a full batch of BINGETs in it (short enough to be remembered): that list a frame
# longer has the same bytes and then more (an APPEND after the batch's APPENDS), so only
# where the list ends tells them apart.
step[3] = full
longer, shorter = {}, {}
for k in sorted(set(step)):
    longer[k] = len(stacks)
    stacks.append(stacks[k] + [frames[599]])
    shorter[k] = len(stacks)
    stacks.append(stacks[k][:-1])
entries, which = [], []
for i in range(30000):
    k = random.randrange(len(stacks))
    action = random.choice(['alloc', 'free_requested', 'free_completed'])
    if i >= 15000:
        k, r = step[i % len(step)], random.random()
        k = longer[k] if r < 0.1 else shorter[k] if r < 0.2 else k
        action = step_actions[i % len(step)]
    which.append(k)
    entries.append({'action': action,
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

/// A pickle written by hand (CPython's pickler never writes over a memo slot): a repeating
/// order of three stacks, and between rounds a list whose item is a new frame dict put
/// (LONG_BINPUT) into the memo slot of a frame the stacks share. The lists after it have
/// the very bytes of those before, and must read as the new frames: what the reader
/// remembers of lists by their bytes is forgotten when a frame's slot is written over.
const OVERWRITE_SCRIPT: &str = r#"
import json, pickle, struct, sys
out = bytearray(b'\x80\x04')
n = 0
def op(b):
    out.extend(b)
def memoize():
    global n
    op(b'\x94'); n += 1; return n - 1
keys = {}
def s(text):
    # a string: memo reference after its first time
    if text in keys:
        i = keys[text]
        op(b'j' + struct.pack('<I', i))
    else:
        b = text.encode(); op(b'\x8c' + bytes([len(b)]) + b); keys[text] = memoize()
def ref(i):
    op(b'j' + struct.pack('<I', i))
def frame(fn, line, name, put=None):
    op(b'}')
    if put is None:
        idx = memoize()
    else:
        op(b'r' + struct.pack('<I', put)); idx = put
    op(b'('); s('filename'); s(fn); s('line'); op(b'J' + struct.pack('<i', line)); s('name'); s(name); op(b'u')
    return idx
op(b'}'); memoize(); op(b'(')
s('segments'); op(b']'); memoize()
s('device_traces'); op(b']'); memoize(); op(b']'); memoize(); op(b'(')
stacks = {}
frames_at = {}
entries = 0
def entry(action, addr, stack_items):
    global entries
    op(b'}'); memoize(); op(b'(')
    s('action'); s(action); s('addr'); op(b'\x8a\x08' + struct.pack('<q', addr)); s('size'); op(b'J' + struct.pack('<i', 512))
    s('stream'); op(b'K\x00'); s('time_us'); op(b'\x8a\x08' + struct.pack('<q', 1700000000000000 + entries))
    s('frames'); op(b']'); memoize(); op(b'(')
    for it in stack_items:
        if callable(it): it()
        else: ref(it)
    op(b'e'); op(b'u')
    entries += 1
# First entry defines six frames inside its list.
f = []
op(b'}'); memoize(); op(b'(')
s('action'); s('alloc'); s('addr'); op(b'\x8a\x08' + struct.pack('<q', 0x7f00_0000_0000)); s('size'); op(b'J' + struct.pack('<i', 512))
s('stream'); op(b'K\x00'); s('time_us'); op(b'\x8a\x08' + struct.pack('<q', 1700000000000000))
s('frames'); op(b']'); memoize(); op(b'(')
for i in range(6):
    f.append(frame('/src/a.py', i, 'fn%d' % i))
op(b'e'); op(b'u'); entries += 1
S = [[f[0], f[1], f[2], f[3]], [f[0], f[1], f[2], f[4]], [f[0], f[1], f[5]]]
for rnd in range(3):
    for i in range(300):
        entry('alloc', 0x7f00_0000_0000 + 4096 * entries, S[i % 3])
    # Write over frame f[1]'s memo slot with another frame, inside a list of its own.
    entry('alloc', 0x7f00_0000_0000 + 4096 * entries, [lambda r=rnd: frame('/src/b.py', 100 + r, 'other%d' % r, put=f[1])])
op(b'e')      # APPENDS of the trace
op(b'a')      # APPEND the trace to device_traces
op(b'u.')     # SETITEMS, STOP
data = bytes(out)
d = pickle.loads(data)
open(sys.argv[1], 'wb').write(data)
json.dump([[[fr['filename'], fr['line'], fr['name']] for fr in e['frames']] for e in d['device_traces'][0]], open(sys.argv[2], 'w'))
print(len(d['device_traces'][0]))
"#;

#[test]
fn a_frame_written_over_in_the_memo_changes_the_stacks_after_it() {
    let py = common::python3().expect("python3 (this test checks its pickle with CPython)");
    let dir = common::scratch_dir("fresh_stacks_overwrite");
    let (pkl, want) = (dir.join("o.pickle"), dir.join("want.json"));
    let n = common::run_python(py, OVERWRITE_SCRIPT, &[&pkl, &want]);
    let want: serde_json::Value = serde_json::from_slice(&std::fs::read(&want).unwrap()).unwrap();
    let want = want.as_array().unwrap();
    let snap = fragscope_snapshot::read_path(&pkl).unwrap();
    let trace = snap.trace(0);
    assert_eq!(trace.len(), want.len());
    for (i, (ev, w)) in trace.iter().zip(want).enumerate() {
        let got: Vec<(String, i64, String)> = snap
            .frames
            .resolved(ev.stack.expect("frames key"))
            .map(|(f, l, n)| (f.to_string(), l, n.to_string()))
            .collect();
        let w: Vec<(String, i64, String)> = w
            .as_array()
            .unwrap()
            .iter()
            .map(|f| (f[0].as_str().unwrap().to_string(), f[1].as_i64().unwrap(), f[2].as_str().unwrap().to_string()))
            .collect();
        assert_eq!(got, w, "entry {i}");
    }
    eprintln!("{} entries, frames written over 3 times: every stack as CPython reads it", n.trim());
    let _ = std::fs::remove_dir_all(&dir);
}
