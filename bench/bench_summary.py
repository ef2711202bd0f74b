#!/usr/bin/env python3
"""`fragscope summary --json` against PyTorch's `_memory_viz.py stats` and CPython's
`pickle.load`, on the same files, in one run.

Every round runs, on each FILE, the peers and each fragscope binary given once, in an
order that rotates from round to round (so a burst of load from other processes does not
always fall on the same command); each is a child process timed by wall clock. Reported
per file: the best (minimum) and the median wall time of each, the ratios of the peers'
best to each fragscope binary's best, and fragscope's throughput (file size / best wall).
Ratios of best-of-N, not absolute times: this machine is shared.

`--warmup N` (default 1): each timed run comes right after N untimed runs of the same
command on the same file, for every command alike (hyperfine's `--warmup`). Why: a run
that starts right after another program's exit can find the kernel still busy with that
program's memory. On this machine (a VM), `fragscope summary` on the 462 MB benchmark
file, which touches ~0.5 GB of fresh memory in 0.3 s, took 0.32-0.86 s (system time up
to 0.69 s) when it followed a Python process that had held several GB, and 0.29-0.35 s
(system ~0.2 s) when it followed itself (27 Nov); in the rotation, fragscope's run always follows
one of the Python peers. `--warmup 0` times the rotation alone, as before.

`_memory_viz.py` is PyTorch's own script, run as `python3 _memory_viz.py stats FILE` (it
needs no torch import for `stats`): take it from a torch wheel (`torch/cuda/_memory_viz.py`;
`bench/RESULTS.md` says which). It is not in this repository.

usage: bench_summary.py FILE... --memory-viz-py PATH --bin NAME=PATH [--bin NAME=PATH]
                        [--repeat N] [--warmup N] [--markdown OUT.md] [--no-pickle-load]
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

PICKLE_LOAD = r"""
import pickle, sys
class DataOnly(pickle.Unpickler):
    def find_class(self, m, n):
        raise pickle.UnpicklingError("global refused")
with open(sys.argv[1], "rb") as f:
    DataOnly(f).load()
"""


def run(cmd):
    t0 = time.perf_counter()
    p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd[:3])} failed ({p.returncode}): {p.stderr.decode(errors='replace').strip()[:500]}")
    return wall


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="+")
    ap.add_argument("--memory-viz-py", required=True)
    ap.add_argument("--bin", action="append", required=True, help="NAME=PATH of a fragscope binary")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1, help="untimed runs of each command before each timed run")
    ap.add_argument("--markdown")
    ap.add_argument("--no-pickle-load", action="store_true", help="leave CPython's pickle.load out (halves the run)")
    a = ap.parse_args()
    bins = [b.split("=", 1) for b in a.bin]
    cmds = [
        ("_memory_viz.py stats", lambda f: [sys.executable, a.memory_viz_py, "stats", f]),
    ] + ([] if a.no_pickle_load else [("pickle.load", lambda f: [sys.executable, "-c", PICKLE_LOAD, f])]) + [(f"fragscope {name}", lambda f, p=path: [p, "summary", "--json", f]) for name, path in bins]
    times = {(f, c): [] for f in a.files for c, _ in cmds}
    load = [os.getloadavg()[0]]
    for r in range(a.repeat):
        for f in a.files:
            order = cmds[r % len(cmds):] + cmds[: r % len(cmds)]
            for name, make in order:
                for _ in range(a.warmup):
                    run(make(f))
                times[(f, name)].append(run(make(f)))
        load.append(os.getloadavg()[0])
    lines = [
        f"{a.repeat} rounds, {a.warmup} untimed run(s) of the same command before each timed one; 1-minute load average at the start and after each round: "
        + ", ".join(f"{x:.1f}" for x in load),
        "",
        "| file | MB | command | best s | median s | _memory_viz.py stats / this | pickle.load / this | MB/s | stats / this, medians |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for f in a.files:
        mb = os.path.getsize(f) / 1e6
        best = {c: min(times[(f, c)]) for c, _ in cmds}
        med = {c: statistics.median(times[(f, c)]) for c, _ in cmds}

        def pl(t):
            return f"{best['pickle.load'] / t:.1f}x" if "pickle.load" in best else "—"

        for c, _ in cmds:
            t = times[(f, c)]
            fs = c.startswith("fragscope")
            lines.append(
                f"| {os.path.basename(f)} | {mb:.0f} | {c} | {min(t):.3f} | {statistics.median(t):.3f} | "
                + (f"{best['_memory_viz.py stats'] / min(t):.1f}x | {pl(min(t))} | {mb / min(t):.0f} | "
                   f"{med['_memory_viz.py stats'] / med[c]:.1f}x |"
                   if fs else "| | | |")
            )
    text = "\n".join(lines)
    print(text)
    if a.markdown:
        with open(a.markdown, "w") as out:
            out.write(text + "\n")


if __name__ == "__main__":
    main()
