#!/usr/bin/env python3
"""Independent figures for `PYTORCH_NO_CUDA_MEMORY_CACHING=1` replayed on a trace.

Plain Python over the raw pickle (a restricted Unpickler that refuses every global), no
fragscope code and no backward walk. In uncached mode PyTorch calls cudaMalloc(size)
with the tensor's unrounded request for every allocation and cudaFree at once when the
tensor is released, so per device:

* bytes held at t=0 = tensors alive before the trace: every address the trace frees
  (free_requested) before allocating it, with the size of that free entry, plus every
  active block of the final segments whose address the trace never allocates, with its
  requested_size;
* alloc: +size, one cudaMalloc; free_requested of a held address: -size, one cudaFree
  (a free_completed without a free_requested before it frees there instead);
* oom entry: one cudaMalloc of its size; if it fits under the capacity it is counted as
  fitting and released again (one cudaFree), as the replay does with a recorded OOM.

Usage: no_caching.py CAPACITY_BYTES FILE [FILE ...]  (0 = unlimited)
Prints JSON: {file: {device: {"peak": n, "mallocs": n, "frees": n, "ooms": n,
"first_oom": index or null, "recorded_ooms_that_fit": n}}}.
"""
import json
import pickle
import sys


class Safe(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError("global refused")


def device_figures(d, dev, capacity):
    traces = d.get("device_traces") or []
    tr = traces[dev] if dev < len(traces) else []
    allocated_in_trace = set()
    held = {}  # recorded address -> bytes
    # Alive before the trace: freed before being allocated in it.
    seen_alloc = set()
    for e in tr:
        a = e["action"]
        if a == "alloc":
            seen_alloc.add(e["addr"])
            allocated_in_trace.add(e["addr"])
        elif a == "free_requested" and e["addr"] not in seen_alloc and e["addr"] not in held:
            held[e["addr"]] = e["size"]
    for s in d.get("segments") or []:
        if s.get("device") != dev:
            continue
        addr = s["address"]
        for b in s.get("blocks") or []:
            if b.get("state") == "active_allocated" and addr not in allocated_in_trace and addr not in held:
                held[addr] = b.get("requested_size", b["size"])
            addr += b["size"]
    cur = sum(held.values())
    peak = cur
    mallocs = frees = ooms = fit = 0
    first_oom = None
    failed = set()
    cap = capacity if capacity > 0 else 1 << 62
    for i, e in enumerate(tr):
        a = e["action"]
        if a in ("alloc", "oom"):
            mallocs += 1
            fits = cur + e["size"] <= cap
            if not fits:
                ooms += 1
                if first_oom is None:
                    first_oom = i
            if a == "oom":
                if fits:
                    fit += 1
                    frees += 1
                    peak = max(peak, cur + e["size"])
            elif fits:
                held[e["addr"]] = e["size"]
                failed.discard(e["addr"])
                cur += e["size"]
                peak = max(peak, cur)
            else:
                held.pop(e["addr"], None)
                failed.add(e["addr"])
        elif a in ("free_requested", "free_completed"):
            if e["addr"] in held:
                cur -= held.pop(e["addr"])
                frees += 1
    return {"peak": peak, "mallocs": mallocs, "frees": frees, "ooms": ooms,
            "first_oom": first_oom, "recorded_ooms_that_fit": fit}


def main():
    capacity = int(sys.argv[1])
    out = {}
    for path in sys.argv[2:]:
        with open(path, "rb") as f:
            d = Safe(f).load()
        if not isinstance(d, dict) or "device_traces" not in d:
            continue
        res = {}
        for dev, tr in enumerate(d["device_traces"]):
            if any(e["action"] in ("alloc", "oom") for e in tr):
                res[str(dev)] = device_figures(d, dev, capacity)
        out[path] = res
    json.dump(out, sys.stdout)


main()
