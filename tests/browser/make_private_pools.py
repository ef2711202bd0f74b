#!/usr/bin/env python3
"""Writes a small PyTorch memory snapshot with private pools, for the report's private-pool
band (tests/browser/report.test.mjs, "private pools"): a CUDA graph's pool (1, 0) and a
MemPool (0, 1) beside the default pools, every trace entry and segment with its pool id
(`pool_id`, `segment_pool_id`) as PyTorch 2.9+ writes them. The trace leads to the final
state (the replay verifies it exactly), and the graph pool's segment is released before
the end, so its band peaks above its final figure.

usage: make_private_pools.py OUT.pickle  -> prints one JSON object: each pool's reserved
bytes at the end and at its peak, and its segments at the end, {"(a, b)": {...}}.
"""
import json
import pickle
import sys

MiB = 1 << 20
A = 0x7F0000000000
FR = [{"filename": "train.py", "line": 10, "name": "step"}]


def entry(action, addr, size, pool, t):
    return {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": t, "frames": FR, "pool_id": pool}


def main():
    out = sys.argv[1]
    D, G, M = (0, 0), (1, 0), (0, 1)
    d0, g0, g1, m0, m1 = A, A + 20 * MiB, A + 40 * MiB, A + 64 * MiB, A + 66 * MiB
    t = []
    add = lambda *e: t.append(entry(*e, 100 + len(t)))
    # Default pools: 8 MiB of a 20 MiB segment, live at the end.
    add("segment_alloc", d0, 20 * MiB, D)
    add("alloc", d0, 8 * MiB, D)
    # A CUDA graph's capture: a 20 MiB and a 24 MiB segment in its pool; the graph is then reset
    # and empty_cache() releases one of them (the other keeps a live output).
    add("segment_alloc", g0, 20 * MiB, G)
    add("alloc", g0, 4 * MiB, G)
    add("segment_alloc", g1, 24 * MiB, G)
    add("alloc", g1, 24 * MiB, G)
    add("free_requested", g1, 24 * MiB, G)
    add("free_completed", g1, 24 * MiB, G)
    add("segment_free", g1, 24 * MiB, G)
    # A MemPool: a small segment (1000 bytes live) and a large one (6 MiB live).
    add("segment_alloc", m0, 2 * MiB, M)
    add("alloc", m0, 1000, M)
    add("segment_alloc", m1, 20 * MiB, M)
    add("alloc", m1, 6 * MiB, M)

    def seg(addr, total, pool, kind, blocks):
        alloc = sum(b[1] for b in blocks if b[2] == "active_allocated")
        return {
            "device": 0, "address": addr, "total_size": total, "allocated_size": alloc, "active_size": alloc,
            "requested_size": sum(b[3] for b in blocks if b[2] == "active_allocated"), "stream": 0,
            "segment_type": kind, "segment_pool_id": pool, "is_expandable": False, "frames": FR,
            "blocks": [{"address": b[0], "size": b[1], "state": b[2], "requested_size": b[3],
                        "frames": FR if b[2] == "active_allocated" else []} for b in blocks],
        }

    segments = [
        seg(d0, 20 * MiB, D, "large", [(d0, 8 * MiB, "active_allocated", 8 * MiB), (d0 + 8 * MiB, 12 * MiB, "inactive", 0)]),
        seg(g0, 20 * MiB, G, "large", [(g0, 4 * MiB, "active_allocated", 4 * MiB), (g0 + 4 * MiB, 16 * MiB, "inactive", 0)]),
        seg(m0, 2 * MiB, M, "small", [(m0, 1024, "active_allocated", 1000), (m0 + 1024, 2 * MiB - 1024, "inactive", 0)]),
        seg(m1, 20 * MiB, M, "large", [(m1, 6 * MiB, "active_allocated", 6 * MiB), (m1 + 6 * MiB, 14 * MiB, "inactive", 0)]),
    ]
    snap = {"segments": segments, "device_traces": [t],
            "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": ""}}
    with open(out, "wb") as f:
        pickle.dump(snap, f, protocol=4)
    expected = {
        "0,0": {"reserved": 20 * MiB, "peak": 20 * MiB, "segments": 1},
        "1,0": {"reserved": 20 * MiB, "peak": 44 * MiB, "segments": 1},
        "0,1": {"reserved": 22 * MiB, "peak": 22 * MiB, "segments": 2},
    }
    json.dump(expected, sys.stdout)


if __name__ == "__main__":
    main()
