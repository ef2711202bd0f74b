#!/usr/bin/env python3
"""`fragscope report` and `fragscope export` against `fragscope summary --json` on the same
files, alternated (issue 44: report ≤ 2× summary, export ≤ 2× summary, medians).

Every round runs, on each FILE and for each binary, `summary --json FILE`, `report FILE -o
TMP.html` and `export FILE -o TMPDIR` one after the other, in an order that rotates from
round to round, each a child process. Reported per file and binary: the median wall time
and its range, the median CPU time (user + system of the child) and its range, and the
ratios of the medians (report / summary, export / summary) for wall and CPU; then the wall
ratios against the median of every binary's `summary` runs together (for binaries whose
`summary` is the same code: `summary`'s time moves most with what ran before it). Wall
ratios on a loaded machine say little: the CPU ratios are the steadier figure, and the
1-minute load average is printed after each round.

usage: bench_vs_summary.py FILE... --bin NAME=PATH [--bin NAME=PATH] [--repeat 5]
                           [--markdown OUT.md]
"""
import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time


def timed(cmd):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd[:3])} failed ({p.returncode}): {p.stderr.decode(errors='replace').strip()[:500]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="+")
    ap.add_argument("--bin", action="append", required=True, help="NAME=PATH of a fragscope binary")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--markdown")
    a = ap.parse_args()
    bins = [b.split("=", 1) for b in a.bin]
    tmp = tempfile.mkdtemp(prefix="fragscope-bench-vs-summary-")
    cmds = []
    for name, path in bins:
        # Each binary its own page and tables: a build that writes smaller tables would
        # otherwise pay for dropping the other's larger ones it replaces (and the other
        # for its smaller ones).
        html, tables = os.path.join(tmp, f"page-{name}.html"), os.path.join(tmp, f"tables-{name}")
        cmds += [
            (name, "summary", lambda f, p=path: [p, "summary", "--json", f]),
            (name, "report", lambda f, p=path: [p, "report", f, "-o", html]),
            (name, "export", lambda f, p=path: [p, "export", f, "-o", tables]),
        ]
    times = {(f, b, c): [] for f in a.files for b, c, _ in cmds}
    load = [os.getloadavg()[0]]
    try:
        for r in range(a.repeat):
            for f in a.files:
                order = cmds[r % len(cmds):] + cmds[: r % len(cmds)]
                for b, c, make in order:
                    times[(f, b, c)].append(timed(make(f)))
            load.append(os.getloadavg()[0])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    lines = [
        f"{a.repeat} rounds; 1-minute load average at the start and after each round: "
        + ", ".join(f"{x:.1f}" for x in load),
        "",
        "| file | binary | command | wall median (range) s | CPU median (range) s | / summary, wall | / summary, CPU |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for f in a.files:
        for b, _ in bins:
            med = {}
            for c in ("summary", "report", "export"):
                t = times[(f, b, c)]
                w, u = [x[0] for x in t], [x[1] for x in t]
                med[c] = (statistics.median(w), statistics.median(u))
                ratio = "" if c == "summary" else f"{med[c][0] / med['summary'][0]:.2f} | {med[c][1] / med['summary'][1]:.2f}"
                lines.append(
                    f"| {os.path.basename(f)} | {b} | {c} | {med[c][0]:.2f} ({min(w):.2f}–{max(w):.2f}) | "
                    f"{med[c][1]:.2f} ({min(u):.2f}–{max(u):.2f}) | {ratio or ' | '} |"
                )
    # `summary` is the command whose time moves most with what ran before it (how much of
    # the memory it writes was just freed by the process before: RESULTS, "this machine's
    # fresh pages"), and each binary's summary median comes from a few runs. When the
    # binaries share `summary`'s code, its runs of every binary together are one sample
    # of one program: the ratios against their median say the same with less noise.
    lines += [
        "",
        "Against the median of every binary's `summary` runs together (meaningful when the binaries' `summary` is the same code):",
        "",
        "| file | summary, all binaries: wall median (range) s | binary | report / summary, wall | export / summary, wall |",
        "|---|---:|---|---:|---:|",
    ]
    for f in a.files:
        pooled = [x[0] for b, _ in bins for x in times[(f, b, "summary")]]
        m = statistics.median(pooled)
        for b, _ in bins:
            rep = statistics.median(x[0] for x in times[(f, b, "report")])
            exp = statistics.median(x[0] for x in times[(f, b, "export")])
            lines.append(
                f"| {os.path.basename(f)} | {m:.2f} ({min(pooled):.2f}–{max(pooled):.2f}) | {b} | {rep / m:.2f} | {exp / m:.2f} |"
            )
    text = "\n".join(lines)
    print(text)
    if a.markdown:
        with open(a.markdown, "w") as out:
            out.write(text + "\n")


if __name__ == "__main__":
    main()
