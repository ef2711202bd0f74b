#!/usr/bin/env python3
"""Independent check of `fragscope summary --json`.

Loads PyTorch memory-snapshot pickles with a restricted Unpickler (any GLOBAL/class
lookup raises, so nothing can be imported or executed) and computes, from the raw
dicts and without torch or any fragscope code, the per-device figures that
`fragscope summary --json` reports, plus what `torch/cuda/_memory_viz.py stats`
would print for the whole file (spec section 11.3).

Usage: snapshot_stats.py FILE [FILE ...]   -> JSON on stdout:
  {"files": [{"file": F, "devices": {"<dev>": {"<dotted.key>": value, ...}},
              "memviz_stats": {...}}]}
Keys use the dotted paths of the JSON schema in docs/json-schema.md.
"""
import gzip
import io
import json
import pickle
import sys

KNOWN_ACTIONS = [
    "alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
    "segment_map", "segment_unmap", "snapshot", "oom", "annotate", "user_defined",
]


class SafeUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"global {module}.{name} refused")


def load(path):
    with open(path, "rb") as f:
        data = f.read()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    obj = SafeUnpickler(io.BytesIO(data)).load()
    if isinstance(obj, list):  # 1.13: the top level is the segment list
        obj = {"segments": obj}
    return obj


def memviz_alloc_size(b):
    """`_memory_viz._block_extra`: the 'allocated' (requested) size of a block."""
    if "frames" not in b:
        if "history" in b and b["history"]:
            return b["history"][0]["real_size"]
        return b.get("requested_size", b["size"])
    return b["requested_size"]


def requested_of(b):
    """requested_size as memory_stats counts it; legacy blocks fall back like _memory_viz."""
    if "requested_size" in b:
        return b["requested_size"]
    return memviz_alloc_size(b)


def memviz_bytes(num):
    for unit in ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "Zi"]:
        if abs(num) < 1024.0:
            return f"{num:3.1f}{unit}B"
        num /= 1024.0
    return f"{num:.1f}YiB"


def memviz_stats(segments):
    """The totals `_memory_viz.py stats` prints (all devices together)."""
    reserved = allocated = free_ext = free_int = 0
    for seg in segments:
        reserved += seg["total_size"]
        for b in seg["blocks"]:
            if b["state"] == "active_allocated":
                a = memviz_alloc_size(b)
                allocated += a
                free_int += b["size"] - a
            else:
                free_ext += b["size"]
    total_free = free_ext + free_int
    suffix = ""
    if total_free != 0:
        suffix = f" ({free_int / total_free * 100:.1f}% internal)"
    return {
        "segments": len(segments),
        "total_reserved_bytes": reserved,
        "total_allocated_bytes": allocated,
        "free_internal_bytes": free_int,
        "free_external_bytes": free_ext,
        "lines": [
            f"segments: {len(segments)}",
            f"total_reserved: {memviz_bytes(reserved)}",
            f"total_allocated: {memviz_bytes(allocated)}",
            f"total_free: {memviz_bytes(total_free)}{suffix}",
        ],
    }


def pool_figures(segs):
    r = dict(segments=0, blocks=0, reserved_bytes=0, allocated_bytes=0, active_bytes=0,
             requested_bytes=0, inactive_split_bytes=0, allocations=0, active_blocks=0,
             inactive_split_blocks=0)
    for seg in segs:
        r["segments"] += 1
        r["blocks"] += len(seg["blocks"])
        r["reserved_bytes"] += seg["total_size"]
        split = len(seg["blocks"]) > 1 and not seg.get("is_expandable", False)
        for b in seg["blocks"]:
            st = b["state"]
            if st == "active_allocated":
                r["allocated_bytes"] += b["size"]
                r["allocations"] += 1
            if st in ("active_allocated", "active_pending_free", "active_awaiting_free"):
                r["active_bytes"] += b["size"]
                r["active_blocks"] += 1
                r["requested_bytes"] += requested_of(b)
            if st == "inactive" and split:
                r["inactive_split_bytes"] += b["size"]
                r["inactive_split_blocks"] += 1
    return r


def is_active(b):
    return b["state"] != "inactive"


def device_figures(dev, segs, trace):
    out = {"device": dev}
    allp = pool_figures(segs)
    out.update(allp)
    for pool in ("large", "small"):
        p = pool_figures([s for s in segs if s.get("segment_type", "large") == pool])
        for k, v in p.items():
            out[f"pools.{pool}.{k}"] = v
    out["expandable_segments"] = sum(1 for s in segs if s.get("is_expandable", False))

    # Fragmentation, _memory_viz stats definitions (pending-free counts as free).
    f_int = f_ext = 0
    inactive = largest = 0
    pinned = pinned_reserved = pinned_free = 0
    for seg in segs:
        for b in seg["blocks"]:
            if b["state"] == "active_allocated":
                f_int += b["size"] - memviz_alloc_size(b)
            else:
                f_ext += b["size"]
            if b["state"] == "inactive":
                inactive += b["size"]
                largest = max(largest, b["size"])
        live = [b for b in seg["blocks"] if is_active(b)]
        live_bytes = sum(b["size"] for b in live)
        total = seg["total_size"]
        if live and not seg.get("is_expandable", False) and (
            live_bytes * 10 <= total or (len(live) <= 2 and live_bytes * 4 <= total)
        ):
            pinned += 1
            pinned_reserved += total
            pinned_free += total - live_bytes
    out["largest_free_block_bytes"] = largest
    out["fragmentation.reserved_minus_allocated_bytes"] = allp["reserved_bytes"] - allp["allocated_bytes"]
    out["fragmentation.free_bytes"] = f_int + f_ext
    out["fragmentation.internal_free_bytes"] = f_int
    out["fragmentation.external_free_bytes"] = f_ext
    out["fragmentation.inactive_bytes"] = inactive
    out["fragmentation.largest_free_block_bytes"] = largest
    out["fragmentation.free_space_fragmentation"] = 0.0 if inactive == 0 else 1.0 - largest / inactive
    out["fragmentation.pinned_segments"] = pinned
    out["fragmentation.pinned_reserved_bytes"] = pinned_reserved
    out["fragmentation.pinned_free_bytes"] = pinned_free

    # Trace.
    events = [e for e in trace if e.get("action") in KNOWN_ACTIONS]
    out["trace_events"] = len(events)
    by_action = {}
    for e in events:
        by_action[e["action"]] = by_action.get(e["action"], 0) + 1
    for a, n in by_action.items():
        out[f"trace.by_action.{a}"] = n
    times = [e["time_us"] for e in events if "time_us" in e]
    out["trace.first_time_us"] = times[0] if times else None
    out["trace.last_time_us"] = times[-1] if times else None

    live = {}
    orphan_pending = set()
    seg_seen = set()
    unknown_frees = unknown_seg_frees = 0
    for e in events:
        a, addr = e["action"], e.get("addr")
        if a == "alloc":
            live[addr] = e["size"]
        elif a == "free_requested":
            if addr not in live:
                unknown_frees += 1
                orphan_pending.add(addr)
        elif a == "free_completed":
            if addr in live:
                del live[addr]
            elif addr in orphan_pending:
                orphan_pending.discard(addr)
            else:
                unknown_frees += 1
        elif a == "segment_alloc":
            seg_seen.add(addr)
        elif a == "segment_free":
            if addr in seg_seen:
                seg_seen.discard(addr)
            else:
                unknown_seg_frees += 1
    state_live = {}
    for seg in segs:
        addr = seg["address"]
        for b in seg["blocks"]:
            baddr = b.get("address", addr)
            if is_active(b):
                state_live[baddr] = b["size"]
            addr = baddr + b["size"]
    live_bytes = sum(state_live.values())
    traced = {a: s for a, s in state_live.items() if a in live}
    untraced_blocks = len(state_live) - len(traced)
    out["trace.frees_of_unknown_blocks"] = unknown_frees
    out["trace.segment_frees_of_unknown_segments"] = unknown_seg_frees
    out["trace.live_blocks"] = len(state_live)
    out["trace.live_bytes"] = live_bytes
    out["trace.live_blocks_untraced"] = untraced_blocks
    out["trace.live_bytes_traced"] = sum(traced.values())
    out["trace.trace_live_missing_from_state"] = sum(1 for a in live if a not in state_live)
    if not events:
        hist = "none"
    elif len(events) == 1:
        hist = "single_entry"
    elif unknown_frees == 0 and unknown_seg_frees == 0 and untraced_blocks == 0:
        hist = "complete"
    else:
        hist = "began_mid_run"
    out["trace.history"] = hist
    return out


def file_figures(path):
    d = load(path)
    segments = d.get("segments", [])
    traces = d.get("device_traces", []) or []
    devs = sorted({s.get("device", 0) for s in segments} | {i for i, t in enumerate(traces) if t})
    devices = {}
    for dev in devs:
        segs = [s for s in segments if s.get("device", 0) == dev]
        tr = traces[dev] if 0 <= dev < len(traces) else []
        devices[str(dev)] = device_figures(dev, segs, tr)
    return {"file": path, "devices": devices, "memviz_stats": memviz_stats(segments)}


def main(argv):
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    print(json.dumps({"files": [file_figures(p) for p in argv]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
