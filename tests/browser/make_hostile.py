#!/usr/bin/env python3
"""Writes small PyTorch memory snapshots whose every text field holds hostile strings,
for the report's browser fuzz (tests/browser/report.test.mjs, "hostile strings").

The strings are the ones that have broken or could break an HTML page that embeds data:
the HTML script-data state's `<!--<script>` and `</script>`, `&`, U+2028/2029, the
report template's own `{{DATA}}` placeholders, JavaScript replacement patterns, quotes,
NUL, bidirectional overrides, `__proto__`, a 5,000-character string. They go into the
file names, the frames' file names and function names (of blocks, segments and trace
entries), the external annotations (record_function scopes), the allocator settings and
the user metadata of trace entries; stream ids are integers in the format, so they get
extreme values instead (2^63 + 1, which an f64 cannot hold exactly).

Each snapshot is consistent (the trace leads to the final state) and has two devices,
the OOM on the second (cuda:1), so that the page's every view is drawn.

usage: make_hostile.py OUTDIR  -> prints one JSON object: {"strings": [...], "files": [...]}
"""
import json
import os
import pickle
import sys

HOSTILE = [
    "<!--<script>",
    "</script><script>document.title='pwned'</script>",
    "</SCRIPT ><img src=x onerror=alert(1)>",
    "]]>&amp;&lt;&#0;",
    "a\u2028b\u2029c",
    "{{DATA}}{{JS}}{{CSS}}{{TITLE}}",
    "$& $' $` $1 ${x}",
    "\"'\\\u0000\u202e\U0001F600",
    "__proto__",
    "constructor",
    ".*+?([{|^",
    "x" * 5000,
]
# Names usable as file names (no '/' nor NUL, not too long).
FILE_SAFE = [h for h in HOSTILE if "/" not in h and "\u0000" not in h and len(h) < 200]

MiB = 1 << 20


def frames(i):
    """A stack whose every frame carries hostile text (innermost first)."""
    h = HOSTILE
    return [
        {"filename": h[i % len(h)], "line": 7, "name": h[(i + 1) % len(h)]},
        {"filename": "/src/" + h[(i + 2) % len(h)] + ".py", "line": 42, "name": h[(i + 3) % len(h)]},
    ] + [{"filename": "train.py", "line": 1 + k, "name": h[(i + k) % len(h)]} for k in range(len(h))]


def snapshot(seed):
    A, B = 0x7F0000000000, 0x7F1000000000
    big_stream = 2**63 + 1
    # cuda:0: a segment, two allocations, one freed; annotations around them.
    t0 = [
        {"action": "segment_alloc", "addr": A, "size": 20 * MiB, "stream": 0, "time_us": 10, "frames": frames(seed)},
        {"action": "alloc", "addr": A, "size": 4 * MiB, "stream": 0, "time_us": 11, "frames": frames(seed + 1),
         "user_metadata": HOSTILE[seed % len(HOSTILE)]},
        {"action": "alloc", "addr": A + 4 * MiB, "size": 8 * MiB, "stream": 0, "time_us": 12, "frames": frames(seed + 2)},
        {"action": "free_requested", "addr": A + 4 * MiB, "size": 8 * MiB, "stream": 0, "time_us": 13, "frames": frames(seed + 2)},
        {"action": "free_completed", "addr": A + 4 * MiB, "size": 8 * MiB, "stream": 0, "time_us": 14, "frames": frames(seed + 2)},
    ]
    seg0 = {
        "device": 0, "address": A, "total_size": 20 * MiB, "allocated_size": 4 * MiB, "active_size": 4 * MiB,
        "requested_size": 4 * MiB, "stream": 0, "segment_type": "large", "segment_pool_id": (0, 0),
        "is_expandable": False, "frames": frames(seed),
        "blocks": [
            {"address": A, "size": 4 * MiB, "requested_size": 4 * MiB, "state": "active_allocated", "frames": frames(seed + 1)},
            {"address": A + 4 * MiB, "size": 16 * MiB, "requested_size": 0, "state": "inactive", "frames": []},
        ],
    }
    # cuda:1: a segment on an extreme stream id, filled, then an OOM.
    t1 = [
        {"action": "segment_alloc", "addr": B, "size": 20 * MiB, "stream": big_stream, "time_us": 20, "frames": frames(seed + 3)},
        {"action": "alloc", "addr": B, "size": 20 * MiB, "stream": big_stream, "time_us": 21, "frames": frames(seed + 4)},
        {"action": "oom", "addr": 0, "size": 64 * MiB, "stream": big_stream, "time_us": 22, "device_free": MiB,
         "frames": frames(seed + 5)},
    ]
    seg1 = {
        "device": 1, "address": B, "total_size": 20 * MiB, "allocated_size": 20 * MiB, "active_size": 20 * MiB,
        "requested_size": 20 * MiB, "stream": big_stream, "segment_type": "large", "segment_pool_id": (0, 0),
        "is_expandable": False, "frames": frames(seed + 3),
        "blocks": [{"address": B, "size": 20 * MiB, "requested_size": 20 * MiB, "state": "active_allocated",
                    "frames": frames(seed + 4)}],
    }
    anns = []
    for k, h in enumerate(HOSTILE):
        # Nested scopes on cuda:0 (every string a scope name), one on cuda:1.
        anns.append({"name": h, "stage": "START", "device": 0, "time_us": 10 + k * 0.1})
    for k, h in reversed(list(enumerate(HOSTILE))):
        anns.append({"name": h, "stage": "END", "device": 0, "time_us": 15 + (len(HOSTILE) - k) * 0.1})
    anns.append({"name": HOSTILE[seed % len(HOSTILE)], "stage": "START", "device": 1, "time_us": 20})
    for a in anns:
        a["time_us"] = int(a["time_us"] * 10)
    for t in (t0, t1):
        for e in t:
            e["time_us"] *= 10
    return {
        "segments": [seg0, seg1],
        "device_traces": [t0, t1],
        "external_annotations": anns,
        "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": HOSTILE[(seed + 6) % len(HOSTILE)]},
    }


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    files = []
    for k in range(2):
        name = f"{k}{FILE_SAFE[(3 * k) % len(FILE_SAFE)]}{FILE_SAFE[(3 * k + 1) % len(FILE_SAFE)]}.pickle"
        path = os.path.join(out, name)
        with open(path, "wb") as f:
            pickle.dump(snapshot(k), f, protocol=4)
        files.append(path)
    json.dump({"strings": HOSTILE, "files": files}, sys.stdout)


if __name__ == "__main__":
    main()
