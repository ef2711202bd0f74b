#!/usr/bin/env python3
"""Compare `fragscope summary --json` with CPython's `pickle.load` on the same file.

Both run as child processes, alternating, REPEAT times each; we report the median wall
time and the peak RSS of each (from wait4's rusage), the speed ratio, fragscope's
throughput, and whether the targets hold: >= 20x faster than pickle.load, and peak RSS
below the file's size. Ratios, not absolute times: these machines are noisy.

usage: bench_reader.py FILE [--fragscope PATH] [--repeat N] [--markdown OUT.md]
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

PEER = r"""
import pickle, sys
class DataOnly(pickle.Unpickler):
    def find_class(self, m, n):
        raise pickle.UnpicklingError("global refused")
with open(sys.argv[1], "rb") as f:
    DataOnly(f).load()
"""


def run(cmd):
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    err = p.stderr.read().decode(errors="replace")
    p.stderr.close()
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        sys.exit(f"{cmd[0]} failed ({code}): {err.strip()[:500]}")
    return wall, ru.ru_maxrss * 1024  # ru_maxrss is KiB on Linux


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--fragscope", default="target/release/fragscope")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--markdown")
    a = ap.parse_args()
    size = os.path.getsize(a.file)
    ours, peer = [], []
    for _ in range(a.repeat):
        peer.append(run([sys.executable, "-c", PEER, a.file]))
        ours.append(run([a.fragscope, "summary", "--json", a.file]))
    t_ours = statistics.median(w for w, _ in ours)
    t_peer = statistics.median(w for w, _ in peer)
    rss_ours = max(r for _, r in ours)
    rss_peer = max(r for _, r in peer)
    ratio = t_peer / t_ours
    mb = size / 1e6
    rows = [
        ("file", f"{os.path.basename(a.file)} ({mb:.0f} MB)"),
        ("pickle.load (CPython, data-only)", f"{t_peer:.2f} s, peak RSS {rss_peer / 1e6:.0f} MB"),
        ("fragscope summary --json", f"{t_ours:.2f} s, peak RSS {rss_ours / 1e6:.0f} MB, {mb / t_ours:.0f} MB/s"),
        ("speed ratio (target >= 20x)", f"{ratio:.1f}x {'PASS' if ratio >= 20 else 'FAIL'}"),
        ("peak RSS / file size (target < 1)", f"{rss_ours / size:.2f} {'PASS' if rss_ours < size else 'FAIL'}"),
        ("repetitions (medians)", str(a.repeat)),
    ]
    text = "\n".join(f"| {k} | {v} |" for k, v in rows)
    print("| measure | value |\n|---|---|\n" + text)
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write("| measure | value |\n|---|---|\n" + text + "\n")


if __name__ == "__main__":
    main()
