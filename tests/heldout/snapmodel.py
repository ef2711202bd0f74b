"""Held-out harness, part 1: read snapshots safely and re-run a trace through a model of
PyTorch's CUDA caching allocator, so that a trace with extra (planted) allocations becomes
a consistent snapshot again.

Written from /work/shared/spec/pytorch-allocator.md (sections 1-4, 10), Python 3 stdlib
only, with no fragscope code. Scope, on purpose narrow: default allocator settings
(no max_split_size, no roundup divisions, no expandable segments, no garbage collection),
the default pools, any number of streams, and traces without segment_free / segment_map /
segment_unmap / oom entries (no empty_cache, no OOM retries). `Host.check_reproduces()`
re-runs the untouched trace and demands that every recorded address, every recorded
segment_alloc and the recorded final segments come out exactly; a file it does not
reproduce is never used as a host.

Principal types:
* `load(path)` -> the snapshot dict (restricted Unpickler: every global is refused).
* `Host`: one device trace split into requests (real allocs and frees, paired by address).
* `resimulate(host, inserts)`: the allocator model applied to the real requests plus the
  planted ones; returns the new trace entries and the final `segments`.
"""
import bisect
import gzip
import io
import pickle

KIB = 1024
MIB = 1024 * 1024
SMALL_SIZE = 1 * MIB  # kSmallSize
SMALL_BUFFER = 2 * MIB  # kSmallBuffer
MIN_LARGE_ALLOC = 10 * MIB  # kMinLargeAlloc
LARGE_BUFFER = 20 * MIB  # kLargeBuffer
ROUND_LARGE = 2 * MIB  # kRoundLarge


class RefuseGlobals(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"global {module}.{name} refused")


def load(path):
    with open(path, "rb") as f:
        data = f.read()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    obj = RefuseGlobals(io.BytesIO(data)).load()
    if isinstance(obj, list):
        obj = {"segments": obj}
    return obj


def dump(obj, path):
    with open(path, "wb") as f:
        pickle.dump(obj, f, protocol=4)


def round_size(n):
    """spec 1.2 with the default (empty) divisions table."""
    if n < 512:
        return 512
    return (n + 511) // 512 * 512


def pool_of(rounded):
    return "small" if rounded <= SMALL_SIZE else "large"


def segment_size(rounded):
    """spec 1.5: what cudaMalloc is asked for when no cached block fits."""
    if rounded <= SMALL_SIZE:
        return SMALL_BUFFER
    if rounded < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return (rounded + ROUND_LARGE - 1) // ROUND_LARGE * ROUND_LARGE


def should_split(pool, block_size, rounded):
    """spec 3.8 (max_split_size unlimited)."""
    rest = block_size - rounded
    if pool == "small":
        return rest >= 512
    return rest > 1 * MIB


class Unsupported(Exception):
    pass


def allocator_is_default(snap):
    st = snap.get("allocator_settings")
    if st is None:
        return True  # older than 2.3: assume the defaults (documented limitation)
    if st.get("expandable_segments"):
        return False
    ms = st.get("max_split_size")
    if ms not in (None, -1, 2**64 - 1):
        return False
    if st.get("garbage_collection_threshold") not in (None, 0, 0.0):
        return False
    div = st.get("roundup_power2_divisions") or {}
    if isinstance(div, dict) and any(v not in (0, 1) for v in div.values()):
        return False
    return True


class Host:
    """One device's trace turned into requests. Request ids: ("r", i) for the real
    allocation at trace index i; planted requests use ("p", k)."""

    def __init__(self, snap, device=0):
        if not allocator_is_default(snap):
            raise Unsupported("non-default allocator settings")
        self.snap = snap
        self.device = device
        self.trace = snap["device_traces"][device]
        bad = {"segment_free", "segment_map", "segment_unmap", "oom"}
        live = {}
        self.ops = []  # (trace_index, kind, rid)
        self.rid_entry = {}
        self.seg_hints = {}  # trace index of an alloc -> [segment_alloc entries just before it]
        pending_hint = []
        for i, e in enumerate(self.trace):
            a = e.get("action")
            if a in bad:
                raise Unsupported(f"trace has {a}")
            if a == "segment_alloc":
                pending_hint.append(e)
            elif a == "alloc":
                rid = ("r", i)
                if e["addr"] in live:
                    raise Unsupported("alloc of a live address")
                live[e["addr"]] = rid
                self.rid_entry[rid] = e
                self.ops.append((i, "alloc", rid))
                self.seg_hints[i] = pending_hint
                pending_hint = []
            elif a == "free_requested":
                if e["addr"] not in live:
                    raise Unsupported("free of an address the trace did not allocate")
                self.ops.append((i, "free_requested", live[e["addr"]]))
            elif a == "free_completed":
                rid = live.pop(e["addr"], None)
                if rid is None:
                    raise Unsupported("free of an address the trace did not allocate")
                self.ops.append((i, "free_completed", rid))
            else:
                self.ops.append((i, "other", None))
        self.live_at_end = set(live.values())
        self.segs_final = [s for s in snap["segments"] if s.get("device", 0) == device]
        seg_allocs = {e["addr"] for e in self.trace if e.get("action") == "segment_alloc"}
        self.initial_segments = [s for s in self.segs_final if s["address"] not in seg_allocs]
        live_addrs = {self.rid_entry[r]["addr"] for r in self.live_at_end}
        for s in self.initial_segments:
            if s.get("is_expandable"):
                raise Unsupported("expandable segment")
        # Fresh segment addresses (for memory the recording never had) lie above everything.
        top = 0
        for s in self.segs_final:
            top = max(top, s["address"] + s["total_size"])
        for e in self.trace:
            if "addr" in e:
                top = max(top, e["addr"] + max(e.get("size", 0), 0))
        self.fresh_base = (top // (1 << 30) + 2) << 30
        self.live_addrs_at_end = live_addrs
        times = [e.get("time_us") for e in self.trace]
        self.has_time = all(t is not None for t in times) and bool(times)


class Block:
    __slots__ = ("addr", "size", "seg", "state", "req", "rid", "prev", "next")

    def __init__(self, addr, size, seg):
        self.addr, self.size, self.seg = addr, size, seg
        self.state, self.req, self.rid = "inactive", 0, None
        self.prev = self.next = None


class Segment:
    __slots__ = ("addr", "size", "stream", "pool", "frames", "first", "order")

    def __init__(self, addr, size, stream, pool, frames, order):
        self.addr, self.size, self.stream, self.pool = addr, size, stream, pool
        self.frames, self.order, self.first = frames, order, None


class Model:
    def __init__(self, host):
        self.host = host
        self.free = {}  # (stream, pool) -> sorted [(size, addr)]
        self.blocks = {}  # addr -> Block (all blocks)
        self.segments = {}
        self.by_rid = {}
        self.fresh = host.fresh_base
        self.used_seg_addrs = set()
        self.nseg = 0
        self.peak_reserved = 0
        self.reserved = 0
        for s in host.initial_segments:
            self._seed_segment(s)

    def _seed_segment(self, s):
        stream = s.get("stream", 0)
        pool = s.get("segment_type", "large")
        seg = Segment(s["address"], s["total_size"], stream, pool, s.get("frames", []), self.nseg)
        self.nseg += 1
        self.segments[seg.addr] = seg
        self.used_seg_addrs.add(seg.addr)
        self.reserved += seg.size
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        # Blocks live before the trace: active at the end and not allocated by the trace.
        pieces = []
        addr = s["address"]
        for b in s["blocks"]:
            baddr = b.get("address", addr)
            pre = b["state"] != "inactive" and baddr not in self.host.live_addrs_at_end
            pieces.append((baddr, b["size"], pre, b))
            addr = baddr + b["size"]
        prev = None
        merged = []
        for baddr, size, pre, b in pieces:
            if not pre and merged and not merged[-1][2]:
                merged[-1] = (merged[-1][0], merged[-1][1] + size, False, None)
            else:
                merged.append((baddr, size, pre, b))
        for baddr, size, pre, b in merged:
            blk = Block(baddr, size, seg)
            if pre:
                blk.state = "active_allocated"
                blk.req = b.get("requested_size", size)
                blk.rid = ("pre", baddr)
                self.by_rid[blk.rid] = blk
            blk.prev = prev
            if prev is not None:
                prev.next = blk
            else:
                seg.first = blk
            prev = blk
            self.blocks[baddr] = blk
            if not pre:
                self._add_free(blk)

    def _fl(self, stream, pool):
        return self.free.setdefault((stream, pool), [])

    def _add_free(self, blk):
        bisect.insort(self._fl(blk.seg.stream, blk.seg.pool), (blk.size, blk.addr))

    def _del_free(self, blk):
        fl = self._fl(blk.seg.stream, blk.seg.pool)
        i = bisect.bisect_left(fl, (blk.size, blk.addr))
        assert fl[i] == (blk.size, blk.addr)
        del fl[i]

    def malloc(self, rid, n, stream, hints, frames, emit_seg):
        s = round_size(n)
        pool = pool_of(s)
        fl = self._fl(stream, pool)
        i = bisect.bisect_left(fl, (s, -1))
        if i < len(fl):
            size, addr = fl.pop(i)
            blk = self.blocks[addr]
        else:
            ssize = segment_size(s)
            addr = None
            for h in hints:
                if h["size"] == ssize and h["addr"] not in self.used_seg_addrs:
                    addr = h["addr"]
                    break
            if addr is None:
                addr = self.fresh
                self.fresh += (ssize + ROUND_LARGE - 1) // ROUND_LARGE * ROUND_LARGE
            seg = Segment(addr, ssize, stream, pool, frames, self.nseg)
            self.nseg += 1
            self.segments[addr] = seg
            self.used_seg_addrs.add(addr)
            self.reserved += ssize
            self.peak_reserved = max(self.peak_reserved, self.reserved)
            blk = Block(addr, ssize, seg)
            seg.first = blk
            self.blocks[addr] = blk
            emit_seg(addr, ssize)
        if should_split(pool, blk.size, s):
            rest = Block(blk.addr + s, blk.size - s, blk.seg)
            rest.prev, rest.next = blk, blk.next
            if blk.next is not None:
                blk.next.prev = rest
            blk.next = rest
            blk.size = s
            self.blocks[rest.addr] = rest
            self._add_free(rest)
        blk.state = "active_allocated"
        blk.req = n
        blk.rid = rid
        self.by_rid[rid] = blk
        return blk.addr

    def free_requested(self, rid):
        blk = self.by_rid[rid]
        blk.state = "active_pending_free"
        return blk.addr

    def free_completed(self, rid):
        blk = self.by_rid.pop(rid)
        addr = blk.addr
        blk.state = "inactive"
        blk.rid = None
        p = blk.prev
        if p is not None and p.state == "inactive":
            self._del_free(p)
            del self.blocks[blk.addr]
            p.size += blk.size
            p.next = blk.next
            if blk.next is not None:
                blk.next.prev = p
            blk = p
        nx = blk.next
        if nx is not None and nx.state == "inactive":
            self._del_free(nx)
            del self.blocks[nx.addr]
            blk.size += nx.size
            blk.next = nx.next
            if nx.next is not None:
                nx.next.prev = blk
        self._add_free(blk)
        return addr

    def live_bytes(self):
        return sum(b.size for b in self.by_rid.values())


def resimulate(host, inserts, drop_annotations=False):
    """Re-run the host trace with planted requests.

    inserts: {trace_index: [op, ...]} — ops applied right AFTER the real entry at that
    index (index -1: before the first entry). An op is a dict:
      {"kind": "alloc", "rid": ("p", k), "size": n, "stream": s, "template": entry}
      {"kind": "free", "rid": ("p", k), "template": entry}   (free_requested + free_completed)
    Returns (snapshot dict, model, rid_addr).
    """
    # Entries that are not requests (segment_alloc) get no inserts of their own: an insert
    # after one moves to the next request, keeping the order of the inserts.
    op_idx = sorted(i for i, _, _ in host.ops)
    moved = {}
    for pos in sorted(inserts):
        if pos == -1:
            key = -1
        else:
            j = bisect.bisect_left(op_idx, pos)
            key = op_idx[j] if j < len(op_idx) else op_idx[-1]
        moved.setdefault(key, []).extend(inserts[pos])
    inserts = moved
    m = Model(host)
    out = []
    entry_of = {}  # rid -> the alloc entry written (for frames / requested size)
    rid_addr = {}
    prev_time = [None]

    def tkeys(src):
        return {k: v for k, v in src.items()
                if k not in ("action", "addr", "size", "stream", "frames", "time_us")}

    def make(action, addr, size, stream, template, frames=None, time_us=None):
        e = {"action": action, "addr": addr, "size": size, "stream": stream}
        if host.has_time:
            e["time_us"] = time_us if time_us is not None else prev_time[0]
        e.update(tkeys(template))
        fr = template.get("frames") if frames is None else frames
        if fr is not None:
            e["frames"] = fr
        return e

    def run_planted(ops, time_us):
        for op in ops:
            rid = op["rid"]
            t = op["template"]
            if op["kind"] == "alloc":
                cur = []

                def emit(addr, ssize, t=t, stream=op["stream"]):
                    cur.append(make("segment_alloc", addr, ssize, stream, t, time_us=time_us))

                addr = m.malloc(rid, op["size"], op["stream"], [], t.get("frames", []), emit)
                out.extend(cur)
                e = make("alloc", addr, op["size"], op["stream"], t, time_us=time_us)
                out.append(e)
                entry_of[rid] = e
                rid_addr[rid] = addr
            elif op["kind"] == "free":
                a = entry_of[rid]
                addr = m.free_requested(rid)
                out.append(make("free_requested", addr, a["size"], a["stream"], t, time_us=time_us))
                m.free_completed(rid)
                out.append(make("free_completed", addr, a["size"], a["stream"], t, time_us=time_us))
            else:
                raise ValueError(op["kind"])

    run_planted(inserts.get(-1, []), host.trace[0].get("time_us") if host.trace else None)
    for i, kind, rid in host.ops:
        e = host.trace[i]
        prev_time[0] = e.get("time_us")
        if kind == "alloc":
            cur = []

            def emit(addr, ssize, e=e):
                cur.append(make("segment_alloc", addr, ssize, e.get("stream", 0), e,
                                time_us=e.get("time_us")))

            addr = m.malloc(rid, e["size"], e.get("stream", 0), host.seg_hints[i],
                            e.get("frames", []), emit)
            out.extend(cur)
            ne = dict(e)
            ne["addr"] = addr
            out.append(ne)
            entry_of[rid] = ne
            rid_addr[rid] = addr
        elif kind == "free_requested":
            ne = dict(e)
            ne["addr"] = m.free_requested(rid)
            out.append(ne)
        elif kind == "free_completed":
            ne = dict(e)
            ne["addr"] = m.free_completed(rid)
            out.append(ne)
        else:
            out.append(e)
        if i in inserts:
            run_planted(inserts[i], e.get("time_us"))

    segs = final_segments(host, m, entry_of)
    snap = {}
    for k, v in host.snap.items():
        if k == "segments":
            others = [s for s in v if s.get("device", 0) != host.device]
            snap[k] = sorted(others + segs, key=lambda s: (s.get("device", 0), s["address"]))
        elif k == "device_traces":
            snap[k] = [out if d == host.device else t for d, t in enumerate(v)]
        elif k == "external_annotations" and drop_annotations:
            continue
        else:
            snap[k] = v
    return snap, m, rid_addr


def final_segments(host, m, entry_of):
    """The final `segments` list (spec 10.3/10.4) from the model's state."""
    # Keys of the host's own segment and block dicts, so the planted file looks like it.
    seg_keys = block_keys = None
    if host.segs_final:
        seg_keys = set(host.segs_final[0].keys())
        if host.segs_final[0]["blocks"]:
            block_keys = set(host.segs_final[0]["blocks"][0].keys())
    pre_frames = {}
    for s in host.initial_segments:
        for b in s["blocks"]:
            if "address" in b:
                pre_frames[b["address"]] = b.get("frames", [])
    segs = []
    for addr in sorted(m.segments):
        seg = m.segments[addr]
        blocks = []
        alloc_sz = act_sz = req_sz = 0
        b = seg.first
        while b is not None:
            d = {"address": b.addr, "size": b.size, "requested_size": b.req, "state": b.state}
            if b.state != "inactive":
                if b.rid in entry_of:
                    d["frames"] = entry_of[b.rid].get("frames", [])
                else:
                    d["frames"] = pre_frames.get(b.addr, [])
                act_sz += b.size
                req_sz += b.req
                if b.state == "active_allocated":
                    alloc_sz += b.size
            else:
                d["frames"] = []
            if block_keys is not None:
                d = {k: v for k, v in d.items() if k in block_keys}
            blocks.append(d)
            b = b.next
        s = {"device": host.device, "address": seg.addr, "total_size": seg.size,
             "allocated_size": alloc_sz, "active_size": act_sz, "requested_size": req_sz,
             "stream": seg.stream, "segment_type": seg.pool, "segment_pool_id": (0, 0),
             "is_expandable": False, "frames": seg.frames, "blocks": blocks}
        if seg_keys is not None:
            s = {k: v for k, v in s.items() if k in seg_keys}
        segs.append(s)
    return segs


def check_reproduces(host):
    """Re-run the untouched trace: every address, segment_alloc and the final segments must
    come out as recorded. Returns a list of differences (empty = reproduced)."""
    snap, m, _ = resimulate(host, {})
    diffs = []
    new = snap["device_traces"][host.device]
    if len(new) != len(host.trace):
        diffs.append(f"trace length {len(new)} != {len(host.trace)}")
    for i, (a, b) in enumerate(zip(new, host.trace)):
        if a.get("action") != b.get("action") or a.get("addr") != b.get("addr") or a.get("size") != b.get("size"):
            diffs.append(f"entry {i}: {a.get('action')} {a.get('addr')} {a.get('size')} != "
                         f"{b.get('action')} {b.get('addr')} {b.get('size')}")
            if len(diffs) > 5:
                break

    def norm(segs):
        r = []
        for s in segs:
            r.append((s["address"], s["total_size"], s.get("stream", 0), s.get("segment_type"),
                      tuple((b.get("address"), b["size"], b["state"]) for b in s["blocks"])))
        return sorted(r)

    mine = norm([s for s in snap["segments"] if s.get("device", 0) == host.device])
    theirs = norm(host.segs_final)
    if mine != theirs:
        diffs.append("final segments differ")
    return diffs
