"""Independent memory_summary() columns over a trace's window, from the raw pickles.

Used by memstats_real.rs. Plain Python over the pickle (a restricted Unpickler that refuses
every global), no fragscope code, and no allocator model: only the counters whose changes
the trace states outright (spec §8.1) — requested bytes (alloc +size, free_completed -size),
reserved bytes (segment_alloc/map +size, segment_free/unmap -size), allocations (alloc +1,
free_requested -1), active allocs (alloc +1, free_completed -1), segments (segment_alloc +1,
segment_free -1). The value at the snapshot comes from the final segments; the value at the
first entry is that minus the window's net change; the peak is the highest running value.
Prints one JSON object: {file: {device: {metric: [start, current, peak, tot_alloc, tot_freed]}}}.
"""
import json, pickle, sys

class Safe(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError("global refused")

DELTAS = {
    "requested": {"alloc": 1, "free_completed": -1},
    "reserved": {"segment_alloc": 1, "segment_map": 1, "segment_free": -1, "segment_unmap": -1},
    "allocations": {"alloc": 1, "free_requested": -1},
    "active_allocs": {"alloc": 1, "free_completed": -1},
    "segments": {"segment_alloc": 1, "segment_free": -1},
}
BYTES = {"requested", "reserved"}

out = {}
for path in sys.argv[1:]:
    with open(path, "rb") as f:
        d = Safe(f).load()
    if not isinstance(d, dict) or "device_traces" not in d:
        continue
    res = {}
    for dev, tr in enumerate(d["device_traces"]):
        if not tr:
            continue
        segs = [s for s in d["segments"] if s["device"] == dev]
        blocks = [b for s in segs for b in s["blocks"]]
        current = {
            "requested": sum(b.get("requested_size", b["size"]) for b in blocks if b["state"] != "inactive"),
            "reserved": sum(s["total_size"] for s in segs),
            "allocations": sum(1 for b in blocks if b["state"] == "active_allocated"),
            "active_allocs": sum(1 for b in blocks if b["state"] != "inactive"),
            "segments": sum(1 for s in segs if not s.get("is_expandable", False)),
        }
        row = {}
        for m, deltas in DELTAS.items():
            inc = dec = run = hi = 0
            for e in tr:
                sign = deltas.get(e["action"])
                if sign is None:
                    continue
                n = e["size"] if m in BYTES else 1
                if sign > 0:
                    inc += n
                    run += n
                    hi = max(hi, run)
                else:
                    dec += n
                    run -= n
            start = current[m] - (inc - dec)
            row[m] = [start, current[m], start + hi, inc, dec]
        res[str(dev)] = row
    out[path] = res
print(json.dumps(out))
