"""`fragscope.load` of a file another thread keeps truncating and rewriting (a job that
dumps its snapshot to the same path every few steps): every call returns the snapshot as
written or raises `SnapshotError`, and the interpreter survives. Before the reader's guard
on its mapping (Rust side: `crates/snapshot/tests/it/changed_while_read.rs`), a read that
lost a page to a truncation killed the process with SIGBUS."""

from __future__ import annotations

import pickle
import random
import threading
import time

import fragscope


def _snapshot_dict(entries: int) -> dict:
    """A consistent snapshot of the shape PyTorch writes: one segment, a trace of allocs
    and frees with shared stacks (tens of MB pickled, so a read lasts long enough for a
    rewrite to land in the middle of it)."""
    frames = [[{"filename": f"model_{k}.py", "line": k, "name": f"forward_{k}"}] for k in range(64)]
    trace = []
    base = 0x7F00_0000_0000
    for i in range(entries):
        addr = base + (i % 512) * 0x10_0000
        st = frames[i % 64]
        trace.append({"action": "alloc", "addr": addr, "size": 0x10_0000, "stream": 0, "time_us": i, "frames": st})
        trace.append({"action": "free_requested", "addr": addr, "size": 0x10_0000, "stream": 0, "time_us": i, "frames": st})
        trace.append({"action": "free_completed", "addr": addr, "size": 0x10_0000, "stream": 0, "time_us": i, "frames": st})
    seg = {
        "device": 0, "address": base, "total_size": 512 * 0x10_0000, "allocated_size": 0, "active_size": 0,
        "requested_size": 0, "stream": 0, "segment_type": "large", "segment_pool_id": (0, 0), "is_expandable": False,
        "frames": [], "blocks": [{"address": base, "size": 512 * 0x10_0000, "requested_size": 0, "state": "inactive",
                                  "frames": []}],
    }
    return {"segments": [seg], "device_traces": [trace]}


def test_a_file_rewritten_while_read_gives_the_snapshot_or_an_error(tmp_path):
    data = pickle.dumps(_snapshot_dict(150_000), protocol=4)
    path = tmp_path / "snapshot.pickle"
    path.write_bytes(data)
    t0 = time.perf_counter()
    want = fragscope.load(path)
    read_s = time.perf_counter() - t0
    want_events = want.trace_events
    assert want_events == 450_000
    stop = threading.Event()

    def rewrite():
        rng = random.Random(5)
        while not stop.is_set():
            with open(path, "r+b") as f:
                f.truncate(rng.randrange(len(data)))
            with open(path, "wb") as f:
                f.write(data)
            # Whole for about as long as a read lasts: some reads start on the whole file
            # and see it cut under them, some run clean, some find it cut already.
            stop.wait(rng.uniform(0, 2 * read_s))

    t = threading.Thread(target=rewrite)
    t.start()
    outcomes = {"read": 0, "error": 0}
    try:
        pace = random.Random(9)
        for _ in range(40):
            # Reads spread over the rewrites (a failed read returns at once).
            time.sleep(pace.uniform(0, 2 * read_s))
            try:
                snap = fragscope.load(path)
            except fragscope.SnapshotError as e:
                assert "\n" not in str(e)
                kind = "changed" if "changed while it was being read" in str(e) else "error"
                outcomes[kind] = outcomes.get(kind, 0) + 1
                continue
            assert snap.trace_events == want_events
            assert snap.summary().to_json() == want.summary().to_json()
            outcomes["read"] += 1
    finally:
        stop.set()
        t.join()
    assert sum(outcomes.values()) == 40
    print(f"outcomes ({len(data) >> 20} MB file, a read {read_s * 1e3:.0f} ms):", outcomes)
