#!/usr/bin/env python3
"""fragscope from Python against the CLI on the same file, in the same run.

1. Load + summary: `fragscope.load(FILE).summary().to_json()` against
   `fragscope summary --json FILE` (the release binary). Measured three ways, alternating,
   REPEAT times each, medians reported:
   * `python-inproc`: the two calls inside this (already warm) interpreter;
   * `python-proc`: a fresh `python -c` doing import + load + summary, a child process
     like the CLI (interpreter start-up and `import fragscope` included);
   * `cli`: the binary as a child process.
   Target: Python at most 1.2x the CLI.
2. Live dict: `pickle.load` of FILE (CPython's unpickler, what `torch.cuda.memory._snapshot()`
   hands over is the same kind of object graph) against `fragscope.from_dict` of the
   result, both timed in one child process. Target: the conversion costs less than the
   `pickle.load` that built the dict.

Run with the package installed from a release build (`pip install .`, which builds
release): `python bench/bench_python.py /tmp/large.pickle --fragscope target/release/fragscope`.

usage: bench_python.py FILE [--fragscope PATH] [--repeat N] [--dict-repeat N] [--markdown OUT.md]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import fragscope

DICT_PEER = r"""
import json, pickle, sys, time
import fragscope
t0 = time.perf_counter()
with open(sys.argv[1], "rb") as f:
    obj = pickle.load(f)
t1 = time.perf_counter()
snap = fragscope.from_dict(obj, name=sys.argv[1])
t2 = time.perf_counter()
same = snap.summary().to_json() == fragscope.load(sys.argv[1]).summary().to_json()
print(json.dumps({"pickle_load": t1 - t0, "from_dict": t2 - t1, "events": snap.trace_events, "same": same}))
"""

PROC_PEER = "import sys, fragscope; fragscope.load(sys.argv[1]).summary().to_json()"


def child(cmd):
    t0 = time.perf_counter()
    p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        sys.exit(f"{cmd[0]} failed ({p.returncode}): {p.stderr.decode(errors='replace')[:500]}")
    return wall


def inproc(path):
    t0 = time.perf_counter()
    fragscope.load(path).summary().to_json()
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--fragscope", default="target/release/fragscope")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--dict-repeat", type=int, default=3)
    ap.add_argument("--markdown")
    a = ap.parse_args()

    cli_cmd = [a.fragscope, "summary", "--json", a.file]
    py_cmd = [sys.executable, "-c", PROC_PEER, a.file]
    # Same output first: the comparison is of the same work.
    out = subprocess.run(cli_cmd, capture_output=True, text=True, check=True).stdout
    assert fragscope.load(a.file, name=a.file).summary().to_json() == out, "Python and CLI disagree"

    cli, proc, inp = [], [], []
    for _ in range(a.repeat):
        cli.append(child(cli_cmd))
        inp.append(inproc(a.file))
        proc.append(child(py_cmd))
    m = {k: statistics.median(v) for k, v in (("cli", cli), ("python-inproc", inp), ("python-proc", proc))}

    dict_runs = []
    for _ in range(a.dict_repeat):
        p = subprocess.run([sys.executable, "-c", DICT_PEER, a.file], capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"dict run failed: {p.stderr[:500]}")
        dict_runs.append(json.loads(p.stdout))
    assert all(r["same"] for r in dict_runs), "from_dict and load disagree"
    pl = statistics.median(r["pickle_load"] for r in dict_runs)
    fd = statistics.median(r["from_dict"] for r in dict_runs)

    size = os.path.getsize(a.file)
    rows = [
        ("file", f"{os.path.basename(a.file)} ({size / 1e6:.0f} MB, {dict_runs[0]['events']:,} trace events)"),
        ("fragscope summary --json (CLI, child process)", f"{m['cli']:.2f} s"),
        ("load + summary from Python, in process", f"{m['python-inproc']:.2f} s ({m['python-inproc'] / m['cli']:.2f}x the CLI)"),
        ("python -c import + load + summary (child process)", f"{m['python-proc']:.2f} s ({m['python-proc'] / m['cli']:.2f}x the CLI)"),
        ("target: Python <= 1.2x the CLI", "PASS" if max(m["python-inproc"], m["python-proc"]) <= 1.2 * m["cli"] else "FAIL"),
        ("pickle.load (CPython) of the file", f"{pl:.2f} s"),
        ("fragscope.from_dict of that dict", f"{fd:.2f} s ({fd / pl:.2f}x pickle.load)"),
        ("target: from_dict < pickle.load", "PASS" if fd < pl else "FAIL"),
        ("repetitions (medians)", f"{a.repeat} (summary), {a.dict_repeat} (dict)"),
    ]
    table = "| measure | value |\n|---|---|\n" + "".join(f"| {k} | {v} |\n" for k, v in rows)
    print(table)
    print("raw:", json.dumps({"cli": cli, "python_inproc": inp, "python_proc": proc, "dict": dict_runs}))
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(table)


if __name__ == "__main__":
    main()
