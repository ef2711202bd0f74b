"""Independent peak reserved / peak requested per device, from the raw pickles.

Used by diagnosis_real.rs. Plain Python over the pickle (a restricted Unpickler that
refuses every global), no fragscope code: reserved at t=0 = final segment bytes minus
the trace's net segment growth (raised so it never goes below 0); requested = sum of
unrounded requests of active blocks, seeded with the final live blocks the trace never
allocated and with blocks it frees without having allocated them.
Prints one JSON object: {file: {device: [peak_reserved, peak_requested]}}.
"""
import json, pickle, sys

class Safe(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError("global refused")

out = {}
for path in sys.argv[1:]:
    with open(path, "rb") as f:
        d = Safe(f).load()
    if not isinstance(d, dict) or "device_traces" not in d:
        continue
    res = {}
    traces = d["device_traces"]
    devs = {s["device"] for s in d["segments"]} | {i for i, t in enumerate(traces) if t}
    for dev in sorted(devs):
        tr = traces[dev] if dev < len(traces) else []
        segs = [s for s in d["segments"] if s["device"] == dev]
        final = sum(s["total_size"] for s in segs)
        net, low = 0, 0
        for e in tr:
            a = e["action"]
            if a in ("segment_alloc", "segment_map"):
                net += e["size"]
            elif a in ("segment_free", "segment_unmap"):
                net -= e["size"]
                low = min(low, net)
        r = max(final - net, -low, 0)
        peak_r = r
        for e in tr:
            a = e["action"]
            if a in ("segment_alloc", "segment_map"):
                r += e["size"]
            elif a in ("segment_free", "segment_unmap"):
                r -= e["size"]
            peak_r = max(peak_r, r)
        # requested
        live, unknown, pend = {}, {}, set()
        for e in tr:
            a, x = e["action"], e.get("addr")
            if a == "alloc":
                live[x] = e["size"]
            elif a == "free_requested" and x not in live and x not in pend:
                unknown[x] = e["size"]; pend.add(x)
            elif a == "free_completed":
                if x in live: del live[x]
                elif x in pend: pend.discard(x)
                else: unknown[x] = e["size"]
        req = sum(unknown.values())
        for s in segs:
            addr = s["address"]
            for b in s["blocks"]:
                a = b.get("address", addr)  # old formats: segment address + preceding sizes
                addr = a + b["size"]
                if b["state"] != "inactive" and a not in live and a not in unknown:
                    if "requested_size" in b:
                        req += b["requested_size"]
                    elif b.get("history"):
                        req += b["history"][0]["real_size"]
                    else:
                        req += b["size"]
        live = dict(unknown)
        peak_q = req
        for e in tr:
            a, x = e["action"], e.get("addr")
            if a == "alloc":
                live[x] = e["size"]; req += e["size"]
            elif a == "free_completed" and x in live:
                req -= live.pop(x)
            peak_q = max(peak_q, req)
        res[str(dev)] = [peak_r, peak_q]
    out[path] = res
print(json.dumps(out))
