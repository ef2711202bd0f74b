#!/usr/bin/env python3
"""Build a large memory snapshot for benchmarks by replicating a real file's trace.

Every trace entry of the source file is copied into a *fresh* dict (as a long real run
would have: PyTorch writes one dict per entry) with `time_us` shifted forward on every
repetition; frame lists stay shared, as PyTorch's writer shares identical tracebacks.
The result is written with CPython's default pickler (protocol 4), like
`torch.cuda.memory._dump_snapshot` does. No torch needed; the source is loaded with an
Unpickler that refuses every global.

usage: make_large_snapshot.py SOURCE.pickle OUT.pickle [--events N] [--min-mb M]

This holds every entry as a Python dict (peak RSS 2.5 GB for 6.4 M entries, so about
12 GB for the 32 M entries of a 2 GB file). For multi-GB files use the Rust example, which writes the same kind of file:
  cargo run --release -p fragscope-bench --bin replicate_trace -- SOURCE OUT EVENTS
"""
import argparse
import io
import os
import pickle
import sys


class DataOnly(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refusing global {module}.{name}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("source")
    ap.add_argument("out")
    ap.add_argument("--events", type=int, default=6_400_000)
    ap.add_argument("--min-mb", type=int, default=400)
    a = ap.parse_args()
    with open(a.source, "rb") as f:
        snap = DataOnly(f).load()
    traces = snap["device_traces"]
    dev = max(range(len(traces)), key=lambda i: len(traces[i]))
    base = traces[dev]
    if not base:
        sys.exit("source has no trace events")
    times = [e.get("time_us", 0) for e in base]
    span = (max(times) - min(times) + 1) if times else 1
    out = []
    rep = 0
    while len(out) < a.events:
        shift = rep * span
        for e in base:
            d = dict(e)  # fresh dict, shared frame list
            if "time_us" in d:
                d["time_us"] = d["time_us"] + shift
            out.append(d)
            if len(out) >= a.events:
                break
        rep += 1
    traces[dev] = out
    tmp = a.out + ".tmp"
    with open(tmp, "wb") as f:
        pickle.dump(snap, f, protocol=4)
    os.replace(tmp, a.out)
    mb = os.path.getsize(a.out) / 1e6
    print(f"wrote {a.out}: {len(out)} events on device {dev}, {mb:.0f} MB ({rep} repetitions of {len(base)} events)")
    if mb < a.min_mb:
        print(f"warning: {mb:.0f} MB is below the {a.min_mb} MB target; raise --events", file=sys.stderr)


if __name__ == "__main__":
    main()
