#!/usr/bin/env python3
"""fragscope's report beside PyTorch's own viewer on the same files (a benchmark, not a test).

PyTorch's viewer is MemoryViz.js (pytorch.org/memory_viz); `python -m torch.cuda._memory_viz
trace_plot FILE -o OUT.html` writes a page that embeds the snapshot as base64 and imports
MemoryViz.js from jsDelivr and d3 from Skypack. This machine is offline and neither file is
in any package registry, so this script needs them given:

  --memory-viz-py  torch/cuda/_memory_viz.py from a torch wheel (no torch import needed:
                   e.g. `pip download torch --no-deps --only-binary=:all:
                   --platform macosx_11_0_arm64`, the smallest wheel, then unzip that file)
  --memory-viz-js  torch/utils/viz/MemoryViz.js from PyTorch's repository (the wheel does
                   not ship it; its page loads it from the repository's main branch)
  --d3             one ES-module bundle of d3@5 from npm (`npm install d3@5 esbuild`, then
                   `echo 'export * from "d3";' > e.js && npx esbuild e.js --bundle
                   --format=esm --outfile=d3.mjs`)

None of them is part of fragscope. For each FILE, in one run: the time to write each page
(`fragscope report` against trace_plot, the snapshot loaded with a pickle reader that
refuses any import or call, as fragscope's own reader does), each page's size, and in
headless Chromium (tests/browser/bench_page.mjs and peer_page.mjs): load to first drawing,
zoom redraws, what each page draws, and whether it loads at all within --timeout.

usage: bench_peer_viewer.py --memory-viz-py P --memory-viz-js P --d3 P [--bin B] FILE...
"""
import argparse
import importlib.util
import json
import os
import pickle
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class DataOnly(pickle.Unpickler):
    """A snapshot is dicts, lists and scalars: anything that imports is refused."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refused: the pickle imports {module}.{name}")


def node(script, *args, timeout):
    try:
        r = subprocess.run(["node", os.path.join(ROOT, "tests/browser", script), *args],
                           capture_output=True, text=True, timeout=timeout + 60)
    except subprocess.TimeoutExpired:
        return {"failed": f"no answer within {timeout + 60} s"}
    if r.returncode != 0 or not r.stdout.strip():
        return {"failed": (r.stderr.strip().splitlines() or ["exit %d" % r.returncode])[-1]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def page_line(p):
    if "failed" in p:
        errs = "; ".join(p.get("errors", []))
        return f"did not draw: {p['failed']}" + (f" (page errors: {errs[:300]})" if errs else "")
    drawn = f", {p['polygons']} SVG polygons" if "polygons" in p else ""
    heap = f", JS heap {p['heapMB']:.0f} MB" if p.get("heapMB", -1) >= 0 else ""
    return (f"first drawing {p['firstDrawnMs']:.0f} ms, zoom redraw median {p['zoomMedianMs']:.1f} ms, "
            f"max {p['zoomMaxMs']:.1f} ms{drawn}{heap}, errors {p['errors']}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="+")
    ap.add_argument("--bin", default=os.path.join(ROOT, "target/release/fragscope"))
    ap.add_argument("--memory-viz-py", required=True)
    ap.add_argument("--memory-viz-js", required=True)
    ap.add_argument("--d3", required=True)
    ap.add_argument("--timeout", type=int, default=300, help="seconds a page may take to draw")
    a = ap.parse_args()
    spec = importlib.util.spec_from_file_location("_memory_viz", a.memory_viz_py)
    viz = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(viz)
    out = tempfile.mkdtemp(prefix="fragscope-bench-peer-")
    for f in a.files:
        base = os.path.basename(f)
        ours, theirs = os.path.join(out, base + ".report.html"), os.path.join(out, base + ".memory_viz.html")
        t = time.perf_counter()
        r = subprocess.run([a.bin, "report", f, "-o", ours], capture_output=True, text=True)
        t_ours = time.perf_counter() - t
        if r.returncode != 0:
            sys.exit(f"fragscope report {f}: {r.stderr.strip()}")
        t = time.perf_counter()
        try:
            with open(f, "rb") as fh:
                data = DataOnly(fh).load()
            page = viz.trace_plot(data)
            with open(theirs, "w") as fh:
                fh.write(page)
            t_theirs, peer_error = time.perf_counter() - t, None
        except Exception as e:  # the peer's own failure is a result, not a crash of the bench
            t_theirs, peer_error = time.perf_counter() - t, f"{type(e).__name__}: {e}"
        print(f"{base} ({os.path.getsize(f) / 1e6:.1f} MB)")
        print(f"  fragscope report    write {t_ours:6.2f} s, {os.path.getsize(ours) / 1e6:7.1f} MB; "
              + page_line(node("bench_page.mjs", ours, timeout=a.timeout)))
        if peer_error:
            print(f"  PyTorch trace_plot  write failed after {t_theirs:.2f} s: {peer_error}")
            continue
        print(f"  PyTorch trace_plot  write {t_theirs:6.2f} s, {os.path.getsize(theirs) / 1e6:7.1f} MB; "
              + page_line(node("peer_page.mjs", theirs, a.memory_viz_js, a.d3, str(a.timeout), timeout=a.timeout)))
        os.remove(theirs)


if __name__ == "__main__":
    main()
