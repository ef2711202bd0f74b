#!/usr/bin/env python3
"""Writes a state-only PyTorch memory snapshot whose final state holds many blocks (the
size budget test of the report, tests/browser/page.test.mjs): SEGMENTS small-pool
segments of 2 MiB, each split into 256 blocks of 8 KiB, allocated and free in turn, the
allocated ones from one of 16 call sites.

usage: make_large_state.py OUT [SEGMENTS=1200]   (1200 segments: 307,200 blocks)
"""
import pickle
import sys

out = sys.argv[1]
nseg = int(sys.argv[2]) if len(sys.argv) > 2 else 1200
SEG, BLK = 2 << 20, 8 << 10
stacks = [[{"filename": f"/src/model_{k}.py", "line": 10 + k, "name": f"layer_{k}"},
           {"filename": "train.py", "line": 3, "name": "main"}] for k in range(16)]
segments = []
for s in range(nseg):
    base = 0x7F0000000000 + s * 4 * SEG
    blocks = []
    for b in range(SEG // BLK):
        alloc = b % 2 == 0
        blocks.append({"address": base + b * BLK, "size": BLK, "requested_size": BLK - 512 * (b % 3) if alloc else 0,
                       "state": "active_allocated" if alloc else "inactive",
                       "frames": stacks[(s + b) % 16] if alloc else []})
    used = sum(x["size"] for x in blocks if x["state"] == "active_allocated")
    segments.append({"device": 0, "address": base, "total_size": SEG, "allocated_size": used, "active_size": used,
                     "requested_size": sum(x["requested_size"] for x in blocks), "stream": 0, "segment_type": "small",
                     "segment_pool_id": (0, 0), "is_expandable": False, "frames": [], "blocks": blocks})
with open(out, "wb") as f:
    pickle.dump({"segments": segments, "device_traces": [[]]}, f, protocol=4)
