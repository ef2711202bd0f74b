#!/usr/bin/env python3
"""Speed and size of `fragscope report` (a benchmark, not a timed test).

For each FILE: wall and CPU time of `fragscope summary FILE`, of `fragscope analyze FILE`
(whose findings the report embeds) and of `fragscope report FILE -o OUT` in the same run (best of REPEAT, alternating, so both see the same machine
load), the ratio report/summary (target <= 2), the HTML size (target < 25 MB), then in
headless Chromium (Debian's, through tests/browser/bench_page.mjs with playwright-core):
the time from navigation start to the first complete drawing of the page (the page's
own `performance.now()` when its first drawing is done; target <= 2 s) and the redraw
time of zoom steps (measured in the page around the redraw; target <= 50 ms).

usage: bench_report.py [--bin target/release/fragscope] [--repeat 3] FILE...

Make the 6.4 M-event file with
  python3 bench/make_large_snapshot.py ../shared/traces/decomfl-opt-zeroth-order-windows.pickle /tmp/large.pickle
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def timed(cmd):
    """(wall s, CPU s of the child, peak RSS MiB of the children so far)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed: {r.stderr.decode().strip()}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, after.ru_maxrss / 1024


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="+")
    ap.add_argument("--bin", default=os.path.join(ROOT, "target/release/fragscope"))
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    out_dir = tempfile.mkdtemp(prefix="fragscope-bench-report-")
    for f in a.files:
        size_mb = os.path.getsize(f) / 1e6
        html = os.path.join(out_dir, os.path.basename(f) + ".html")
        best = {"summary": None, "analyze": None, "report": None}
        for _ in range(a.repeat):
            for name, cmd in (
                ("summary", [a.bin, "summary", f]),
                ("analyze", [a.bin, "analyze", f]),
                ("report", [a.bin, "report", f, "-o", html]),
            ):
                w, c, _ = timed(cmd)
                if best[name] is None or w < best[name][0]:
                    best[name] = (w, c)
        html_mb = os.path.getsize(html) / 1e6
        page = subprocess.run(
            ["node", os.path.join(ROOT, "tests/browser/bench_page.mjs"), html],
            capture_output=True,
            text=True,
        )
        if page.returncode != 0:
            sys.exit(f"bench_page.mjs failed: {page.stderr.strip()}")
        p = json.loads(page.stdout)
        ratio = best["report"][0] / best["summary"][0]
        print(f"{os.path.basename(f)} ({size_mb:.0f} MB)")
        print(f"  summary   wall {best['summary'][0]:7.2f} s  cpu {best['summary'][1]:7.2f} s")
        print(f"  analyze   wall {best['analyze'][0]:7.2f} s  cpu {best['analyze'][1]:7.2f} s  (the report includes its findings)")
        print(f"  report    wall {best['report'][0]:7.2f} s  cpu {best['report'][1]:7.2f} s  ratio {ratio:.2f} (target <= 2)")
        print(f"  html      {html_mb:.1f} MB (target < 25)")
        print(f"  browser   load -> first drawing {p['firstDrawnMs']:.0f} ms (target <= 2000), "
              f"script run {p['scriptMs']:.0f} ms, zoom redraw median {p['zoomMedianMs']:.1f} ms, "
              f"max {p['zoomMaxMs']:.1f} ms over {p['zoomSteps']} steps (target <= 50)")
        print(f"  errors    {p['errors']}, requests other than the page: {p['otherRequests']}")


if __name__ == "__main__":
    main()
