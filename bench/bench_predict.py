#!/usr/bin/env python3
"""Cost of `fragscope predict` against a `replay` of the largest input, on the grids.

For each grid pair (two recordings of one program at two sizes), times on CPU time
(user + system of the child, from wait4: the machine is shared, wall time is noise):

* replay:  `fragscope replay LARGEST --config ''` — one replay of the largest input under
           its recorded settings (its verify pre-pass, which rebuilds the state before the
           trace, and the what-if run), file read included;
* predict: `fragscope predict SMALL LARGEST --sizes a,b --at X` — both files read,
           aligned, fitted, and the trace synthesised at X and replayed once.

Target: predict ≤ 3× replay. Best of REPEAT runs each (noise only slows down).

usage: bench_predict.py [--fragscope target/release/fragscope] [--grids ../shared/traces/grids]
                        [--repeat 7] [--at-factor 4]
"""
import argparse
import json
import os
import subprocess

PAIRS = [
    ("kk-2.7b-step-ctx{}-fp32", 128, 256),
    ("kk-2.7b-fwd-ctx{}-fp32", 128, 256),
    ("niu-train3-ctx{}-fp32", 100, 150),
    ("niu-fwd-ctx{}-fp32", 100, 150),
]


def cpu(cmd):
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, ru = os.wait4(p.pid, 0)
    if status != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}: {p.stderr.read().decode()}")
    return ru.ru_utime + ru.ru_stime


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fragscope", default="target/release/fragscope")
    ap.add_argument("--grids", default="../shared/traces/grids")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--at-factor", type=int, default=4)
    a = ap.parse_args()
    print("| grid | events (largest) | replay CPU s | predict CPU s | ratio (target ≤ 3) |")
    print("|---|---:|---:|---:|---:|")
    for name, s1, s2 in PAIRS:
        f1 = os.path.join(a.grids, name.format(s1) + ".pickle")
        f2 = os.path.join(a.grids, name.format(s2) + ".pickle")
        if not (os.path.exists(f1) and os.path.exists(f2)):
            print(f"| {name} | skipped: not in {a.grids} | | | |")
            continue
        rep = min(cpu([a.fragscope, "replay", f2, "--config", ""]) for _ in range(a.repeat))
        pre = min(
            cpu([a.fragscope, "predict", f1, f2, "--sizes", f"{s1},{s2}", "--at", str(s2 * a.at_factor)])
            for _ in range(a.repeat)
        )
        out = subprocess.run([a.fragscope, "summary", "--json", f2], capture_output=True, text=True).stdout


        ev = sum(d.get("trace", {}).get("events", 0) for d in json.loads(out)["files"][0]["devices"])
        print(f"| {name.format(f'{s1},{s2}')} | {ev:,} | {rep:.3f} | {pre:.3f} | {pre / rep:.2f} |")


if __name__ == "__main__":
    main()
