#!/usr/bin/env python3
"""Replay throughput on the reader's large benchmark snapshot.

Builds the inputs when missing:

* LARGE (default /tmp/large.pickle): decomfl's trace repeated to 6.4 M events by
  bench/make_large_snapshot.py (the reader's benchmark file). A plain repetition is
  not allocator-consistent (repetition k re-allocates addresses that repetition k-1
  left live), so `--verify` on it is undecidable; it is the input of `simulate`.
* LARGE-SIM (default /tmp/large-sim.pickle): the what-if simulation of LARGE under
  its recorded settings, saved with `fragscope replay LARGE --config '' --save-snapshot`.
  Every decision in it is the model's own, so `fragscope replay LARGE-SIM --verify`
  must match 100%: that is the timing target.

Then times, with the replay_bench tool (crates/bench) (library calls, file read once and timed
apart), on CPU time (CLOCK_PROCESS_CPUTIME_ID, not wall time: the machine is shared):

* verify   on LARGE-SIM: walk of the segments alive at entry 0 + seeding + forward
                         replay comparing every decision + final-state comparison;
* walk     on LARGE-SIM: the full backward walk alone (verify's fallback when its
                         strict forward replay gives up; large-sim never needs it);
* simulate on LARGE:     what-if under the recorded settings (synthetic addresses;
                         includes its verify pre-pass, here cut short: undecidable);

events/s = trace events / CPU seconds of the replay loop (file reading excluded and
reported on its own line). Peak RSS is the process high-water mark (VmHWM), which
includes the parsed snapshot; "RSS after read" is the high-water mark once the file
is loaded, so the difference is what replay adds. Each measure is run REPEAT times
and the best (highest events/s) kept: on a shared machine, noise only slows down.
Finally a CLI check: `fragscope replay LARGE-SIM --verify` must say 100.0% twice.

usage: bench_replay.py [--large P] [--large-sim P] [--repeat N] [--min-events N]
                       [--results bench/RESULTS.md] [--no-write]
"""
import argparse
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
NOTES = "<!-- replay notes: kept by bench_replay.py -->"
SOURCE = os.path.join(ROOT, "..", "shared", "traces", "decomfl-opt-zeroth-order-windows.pickle")


def sh(cmd, **kw):
    print("+", " ".join(cmd), file=sys.stderr)
    return subprocess.run(cmd, check=True, text=True, stdout=subprocess.PIPE, **kw).stdout


def build():
    sh(["cargo", "build", "--release", "-q", "-p", "fragscope", "-p", "fragscope-bench", "--bin", "replay_bench", "--bin", "fragscope"], cwd=ROOT)
    return os.path.join(TARGET, "release", "fragscope"), os.path.join(TARGET, "release", "replay_bench")


def bench(tool, mode, path, min_events, repeat):
    best = None
    for _ in range(repeat):
        out = sh([tool, "--mode", mode, "--min-events", str(min_events), path])
        line = next(l for l in out.splitlines() if l.startswith("RESULT "))
        r = dict(kv.split("=", 1) for kv in line.split()[1:])
        if best is None or float(r["events_per_s"]) > float(best["events_per_s"]):
            best = r
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--large", default="/tmp/large.pickle")
    ap.add_argument("--large-sim", default="/tmp/large-sim.pickle")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--min-events", type=int, default=12_000_000)
    ap.add_argument("--results", default=os.path.join(ROOT, "bench", "RESULTS.md"))
    ap.add_argument("--no-write", action="store_true")
    a = ap.parse_args()
    cli, tool = build()
    if not os.path.exists(a.large):
        sh([sys.executable, os.path.join(ROOT, "bench", "make_large_snapshot.py"), SOURCE, a.large])
    if not os.path.exists(a.large_sim):
        sh([cli, "replay", a.large, "--config", "", "--save-snapshot", a.large_sim])
    check = sh([cli, "replay", a.large_sim, "--verify"])
    exact = check.count("(100.0%)") >= 2 and "none" in check
    rows = []
    for mode, path in (("verify", a.large_sim), ("walk", a.large_sim), ("simulate", a.large)):
        r = bench(tool, mode, path, a.min_events, a.repeat)
        rows.append((mode, path, r))
        print(f"{mode:<8} {os.path.basename(path)}: {float(r['events_per_s']) / 1e6:.2f} M events/CPU-s", file=sys.stderr)
    lines = [
        "## Replay",
        "",
        "Made by `python3 bench/bench_replay.py` (CPU time, not wall time; best of "
        f"{a.repeat} runs, each replaying until ≥ {a.min_events / 1e6:.0f} M events).",
        "`events/CPU-s` = trace events replayed / CPU seconds of the replay alone "
        "(`CLOCK_PROCESS_CPUTIME_ID` around the library calls; reading the file is the "
        "`read` column). `RSS after read` is the process high-water mark once the file "
        "is parsed; `peak RSS` is the high-water mark at the end (what replay adds is the "
        "difference). Inputs: `large.pickle` is the reader's benchmark file "
        "(`make_large_snapshot.py`, decomfl repeated to 6.4 M events); `large-sim.pickle` "
        "is the what-if simulation of it under its recorded settings, saved with "
        "`--save-snapshot`, i.e. an allocator-consistent 6.4 M-event trace.",
        "",
        "| measure | input | events | events/CPU-s | read (CPU-s) | RSS after read | peak RSS |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    what = {
        "verify": "`verify` (walk of the segments alive at entry 0 + forward replay comparing every decision + final state)",
        "walk": "full backward walk alone (what `verify` falls back on when its strict replay gives up; not in the row above)",
        "simulate": "`simulate` under the recorded settings (synthetic addresses)",
    }
    for mode, path, r in rows:
        lines.append(
            f"| {what[mode]} | {os.path.basename(path)} | {int(r['events']):,} | "
            f"{float(r['events_per_s']) / 1e6:.2f} M | {float(r['read_cpu_s']):.2f} | "
            f"{float(r['rss_after_read_mb']):.0f} MB | {float(r['peak_rss_mb']):.0f} MB |"
        )
    v = rows[0][2]
    lines += [
        "",
        f"`fragscope replay {os.path.basename(a.large_sim)} --verify`: "
        + ("100.0% of allocs at the recorded address and 100.0% of segment events matched."
           if exact else "NOT 100% — see the command's output."),
        f"Target ≥ 10 M events/CPU-s for verify: {float(v['events_per_s']) / 1e6:.2f} M "
        + ("PASS" if float(v["events_per_s"]) >= 10e6 else "FAIL") + ".",
        "",
    ]
    section = "\n".join(lines)
    print(section)
    if a.no_write:
        return
    old = open(a.results).read() if os.path.exists(a.results) else "# Benchmarks\n\n"
    # Replace our section (up to the next "## " heading), keep every other section.
    # Hand-written notes after the NOTES marker inside the section are kept.
    pat = re.compile(r"^## Replay\n.*?(?=^## |\Z)", re.S | re.M)
    m = pat.search(old)
    if m:
        body = m.group(0)
        notes = body[body.index(NOTES):].rstrip("\n") + "\n" if NOTES in body else ""
        new = old[: m.start()] + section + "\n" + notes + ("\n" if notes and m.end() < len(old) else "") + old[m.end():]
    else:
        new = old.rstrip("\n") + "\n\n" + section
    with open(a.results, "w") as f:
        f.write(new.rstrip("\n") + "\n")


if __name__ == "__main__":
    main()
