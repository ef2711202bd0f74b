#!/usr/bin/env python3
"""Held-out harness for issue 19: plant leaks (and non-leaks) into REAL training traces.

FROZEN: the seed, the hosts, the shapes, the draws below and the matching rule in
evaluate.py were fixed before the rewritten leak detector existed and must not be tuned
against it (README.md). Only robustness fixes are allowed after the freeze commit.

How a file is planted
---------------------
The host's trace is cut into requests (every real `alloc` and its `free_requested` /
`free_completed`, paired by address). Planted requests are inserted at trace positions, and
the whole request stream is re-run through a model of PyTorch's caching allocator
(snapmodel.py: best fit by (size, address) per stream and pool, splitting and merging as the
spec says, new segments of the spec's sizes). So every address, every `segment_alloc` and
the final `segments` of the planted file are what PyTorch's allocator would have produced for
that program plus the leak: the leaked blocks take real space, later allocations move around
them, new segments appear only when no cached block fits. The model reproduces every
untouched host exactly (addresses, segment_allocs, final segments) before it is used.
New segments that the recording did not have get fresh addresses above everything in the
file. Each planted file is then checked with `fragscope replay --verify --json`; a file whose
replay does not match 100 % (allocs, segment events, final state) is discarded and counted.

Steps come from steps.py (optimizer runs), decided by this harness, not by fragscope.

Shapes (n = the host's number of steps; u = a size drawn below; "site" = the full frame stack
of a real allocation of the host, drawn at random, used for every planted entry):
 a  realloc     growth by reallocation: in each step k, at the same point of the step, a new
                buffer of k*u bytes is allocated and the previous one ((k-1)*u) freed right
                after (torch.cat onto a history). The leaked bytes move every step. End: n*u.
 b  flat        one u-byte block per step, never freed, where it fits in cached free space:
                the planted file must have exactly the host's segments (reserved memory
                flat); up to 40 draws (site, u, point) are tried, the first that keeps the
                segment list unchanged is used. End: n*u.
 c  alsofrees   at a site whose real allocations the trace frees (>= 2 of them), each step
                allocates m (2..4) blocks of u at m points of the step and frees all but the
                last one before the optimizer step. End: n*u.
 d  noannot     one u-byte block per step never freed, and `external_annotations` removed
                from the file. End: n*u.
 e  slow        one block per step never freed, u log-uniform in [4 KiB, 1 MiB] (a loss
                history kept on the GPU). End: n*u.
 f  NEG activ   negative control: in ONE step (drawn), j (4..12) blocks of u allocated during
                forward and freed during backward of that step, last allocated first freed.
                End: 0.
 g  NEG warm    negative control: j (2..6) blocks of u allocated during step 1 and kept; no
                later step adds any (a cache that warms up, then stays flat). End: j*u.
u for a, b, c, d, f, g: the size of a randomly drawn real allocation of the host with size
>= 1 MiB (b: <= 4 MiB and >= 64 KiB; c: >= 256 KiB), so magnitudes follow the host's own
distribution. Points inside a step are drawn as a fraction of the step's work region
[step start, optimizer start) and reused in every step (a leak sits at one line of code).

Randomness: random.Random(f"{SEED}:{host}:{shape}:{rep}") (string seeds are hashed with
SHA-512 by Python, stable across versions and runs).

Usage: plant.py [--bin target/release/fragscope] [--out target/heldout] [--reps 3]
Writes OUT/<host>--<shape>-<rep>.pickle and OUT/manifest.json.
"""
import argparse
import json
import math
import os
import random
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import snapmodel as sm  # noqa: E402
import steps as stepsmod  # noqa: E402

SEED = "fragscope-issue19-heldout-2026-11-26"
REPS = 3
SHAPES = ["a_realloc", "b_flat", "c_alsofrees", "d_noannot", "e_slow", "f_neg_activations",
          "g_neg_warmcache"]
NEGATIVE = {"f_neg_activations", "g_neg_warmcache"}

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CORPUS = os.path.join(os.path.dirname(REPO), "shared", "traces")
INREPO = os.path.join(REPO, "crates", "testdata", "real")

# Hosts: real traces with complete enough history that the allocator model reproduces them
# exactly, and 2+ training steps found by steps.py. Why each:
#  niu-train3-*: three real training steps (zero_grad, forward, CE, backward, hand-written
#    Adam), complete history; MIT, also in the repository.
#  effdl-aphelack-customfsdp-4gpu: a hand-written FSDP training run with torch.optim.Adam
#    (_multi_tensor_adam), three steps, annotations; MIT, in the repository.
#  eor-cnn-counterfactuals: a CNN with Adam on its inputs, ten steps, C++ frames, no
#    annotations, blocks live before the trace (the model seeds them from the final state).
#    Corpus only.
# Not hosts: decomfl (zeroth-order updates of irregular shape: two local updates and a model
# pull, steps.py finds no optimizer run), kk/cs336 trainstep (one step), pytorchblog (frees
# of blocks allocated before the trace: not reproducible by the model), forward-only files.
HOSTS = [
    ("niu-train3-ctx100-fp32", "grids/niu-train3-ctx100-fp32.pickle"),
    ("niu-train3-ctx150-fp32", "grids/niu-train3-ctx150-fp32.pickle"),
    ("niu-train3-ctx200-fp32", "grids/niu-train3-ctx200-fp32.pickle"),
    ("effdl-aphelack-customfsdp-4gpu", "effdl-aphelack-customfsdp-4gpu.pickle"),
    ("eor-cnn-counterfactuals", "eor-cnn-counterfactuals.pickle"),
]


def find_host(rel):
    for base in (CORPUS, INREPO):
        p = os.path.join(base, rel)
        if os.path.exists(p):
            return p
    return None


def frames_key(frames):
    return tuple((f.get("filename", ""), f.get("line", 0), f.get("name", "")) for f in frames or [])


class Plan:
    """The planted requests of one file and what they should leave behind."""

    def __init__(self):
        self.inserts = {}
        self.k = 0
        self.planted_allocs = []  # rid, size, kept (bool)
        self.drop_annotations = False

    def alloc(self, pos, size, template, kept):
        rid = ("p", self.k)
        self.k += 1
        self.inserts.setdefault(pos, []).append(
            {"kind": "alloc", "rid": rid, "size": size, "stream": template.get("stream", 0),
             "template": template})
        self.planted_allocs.append({"rid": rid, "size": size, "kept": kept})
        return rid

    def free(self, pos, rid, template):
        self.inserts.setdefault(pos, []).append({"kind": "free", "rid": rid, "template": template})


def draw_size(rng, sizes, lo, hi=None):
    cand = [s for s in sizes if s >= lo and (hi is None or s <= hi)]
    if not cand:
        cand = sorted(sizes)[-max(1, len(sizes) // 10):]
    return rng.choice(cand)


def point(st, frac, lo_key="start", hi_key="opt_start"):
    lo, hi = st[lo_key], st[hi_key]
    return lo + min(hi - lo - 1, max(0, int(frac * (hi - lo))))


def build_plan(shape, rng, host, tr, stp):
    """Draw one planting. Returns (plan, description) — description fixes what to expect."""
    n = len(stp)
    work = [i for s in stp for i in range(s["start"], s["opt_start"])
            if tr[i].get("action") == "alloc" and tr[i].get("frames")]
    sizes = [tr[i]["size"] for i in work]
    plan = Plan()
    desc = {"shape": shape, "steps": n}

    def pick_site(pred=None):
        cand = work if pred is None else [i for i in work if pred(i)]
        i = rng.choice(cand)
        return i, tr[i]

    if shape == "a_realloc":
        ti, t = pick_site()
        u = draw_size(rng, sizes, sm.MIB)
        frac = rng.random()
        prev = None
        for k, st in enumerate(stp, 1):
            p = point(st, frac)
            rid = plan.alloc(p, k * u, t, kept=(k == n))
            if prev is not None:
                plan.free(p, prev, t)
            prev = rid
        desc.update(per_step_bytes=u, end_bytes=n * u)
    elif shape in ("b_flat", "d_noannot", "e_slow"):
        ti, t = pick_site()
        if shape == "b_flat":
            u = draw_size(rng, sizes, 64 * sm.KIB, 4 * sm.MIB)
        elif shape == "e_slow":
            u = int(math.exp(rng.uniform(math.log(4 * sm.KIB), math.log(sm.MIB)))) // 4 * 4
        else:
            u = draw_size(rng, sizes, sm.MIB)
        frac = rng.random()
        for st in stp:
            plan.alloc(point(st, frac), u, t, kept=True)
        plan.drop_annotations = shape == "d_noannot"
        desc.update(per_step_bytes=u, end_bytes=n * u)
    elif shape == "c_alsofrees":
        freed = {}
        for i, kind, rid in host.ops:
            if kind == "free_completed" and rid[1] in set(work):
                freed[frames_key(tr[rid[1]].get("frames"))] = freed.get(
                    frames_key(tr[rid[1]].get("frames")), 0) + 1
        ti, t = pick_site(lambda i: freed.get(frames_key(tr[i].get("frames")), 0) >= 2)
        u = draw_size(rng, sizes, 256 * sm.KIB)
        m = rng.randint(2, 4)
        fracs = sorted(rng.random() * 0.8 for _ in range(m))
        for st in stp:
            rids = []
            for j, fr in enumerate(fracs):
                rids.append(plan.alloc(point(st, fr), u, t, kept=(j == m - 1)))
            # the m-1 temporaries are freed before the optimizer step (at 90 % of the work)
            pf = point(st, 0.9)
            for rid in rids[:-1]:
                plan.free(pf, rid, t)
        desc.update(per_step_bytes=u, end_bytes=n * u, allocs_per_step=m)
    elif shape == "f_neg_activations":
        k = rng.randrange(n)
        st = stp[k]
        ti, t = pick_site(lambda i: st["start"] <= i < st["bwd_start"]) \
            if st["bwd_start"] > st["start"] else pick_site()
        u = draw_size(rng, sizes, sm.MIB)
        j = rng.randint(4, 12)
        fwd = sorted(rng.randrange(st["start"], max(st["start"] + 1, st["bwd_start"])) for _ in range(j))
        bwd = sorted(rng.randrange(st["bwd_start"], st["opt_start"]) for _ in range(j))
        rids = [plan.alloc(p, u, t, kept=False) for p in fwd]
        for p, rid in zip(bwd, reversed(rids)):
            plan.free(p, rid, t)
        desc.update(per_step_bytes=0, end_bytes=0, step=k + 1, blocks=j, block_bytes=u)
    elif shape == "g_neg_warmcache":
        st = stp[0]
        ti, t = pick_site()
        u = draw_size(rng, sizes, sm.MIB)
        j = rng.randint(2, 6)
        for p in sorted(rng.randrange(st["start"], st["opt_start"]) for _ in range(j)):
            plan.alloc(p, u, t, kept=True)
        desc.update(per_step_bytes=0, end_bytes=j * u, blocks=j, block_bytes=u)
    else:
        raise ValueError(shape)
    desc["site_trace_index"] = ti
    desc["site_frames"] = [[f.get("filename", ""), f.get("line", 0), f.get("name", "")]
                           for f in t.get("frames", [])]
    return plan, desc


_PEAK = {}


def host_peak_reserved(host):
    if id(host) not in _PEAK:
        _PEAK[id(host)] = sm.resimulate(host, {})[1].peak_reserved
    return _PEAK[id(host)]


def seg_signature(snap, dev):
    return sorted((s["address"], s["total_size"]) for s in snap["segments"] if s.get("device", 0) == dev)


def verify(binary, path):
    """fragscope replay --verify --json: (ok, summary)."""
    try:
        r = subprocess.run([binary, "replay", "--verify", "--json", path], capture_output=True,
                           text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"could not run: {e}"
    if r.returncode != 0:
        return False, f"exit {r.returncode}: {r.stderr.strip()[:200]}"
    try:
        d = json.loads(r.stdout)
        dev = d["files"][0]["devices"]
    except (ValueError, KeyError, IndexError) as e:
        return False, f"unreadable JSON: {e}"
    bad = []
    for x in dev:
        if x.get("allocs_matched") != x.get("allocs"):
            bad.append(f"dev {x.get('device')}: allocs {x.get('allocs_matched')}/{x.get('allocs')}")
        if x.get("segment_events_matched") != x.get("segment_events"):
            bad.append(f"dev {x.get('device')}: segment events "
                       f"{x.get('segment_events_matched')}/{x.get('segment_events')}")
        if x.get("final_state_matches") is False:
            bad.append(f"dev {x.get('device')}: final state differs")
        if x.get("divergences"):
            bad.append(f"dev {x.get('device')}: {x.get('divergences')} divergences")
    return (not bad), ("; ".join(bad) if bad else "100 % matched, final state matches")


def plant_one(host_name, host, snap, dev, stp, shape, rep):
    """Draw and re-simulate. Returns (snapshot, record) or (None, record) when discarded."""
    rng = random.Random(f"{SEED}:{host_name}:{shape}:{rep}")
    tr = host.trace
    base_sig = seg_signature(snap, dev)
    tries = 40 if shape == "b_flat" else 1
    for attempt in range(tries):
        plan, desc = build_plan(shape, rng, host, tr, stp)
        new, model, rid_addr = sm.resimulate(host, plan.inserts, plan.drop_annotations)
        if shape == "b_flat" and seg_signature(new, dev) != base_sig:
            continue
        desc["draws"] = attempt + 1
        break
    else:
        return None, {"host": host_name, "shape": shape, "rep": rep,
                      "discarded": f"no draw in {tries} kept the segments unchanged"}
    # Where the planted entries ended up in the new trace (for the harness's own checks).
    out = new["device_traces"][dev]
    planted_addr = {r["rid"]: rid_addr[r["rid"]] for r in plan.planted_allocs}
    kept = [r for r in plan.planted_allocs if r["kept"]]
    desc["planted_allocs"] = len(plan.planted_allocs)
    desc["kept_blocks"] = [{"addr": planted_addr[r["rid"]], "size": r["size"]} for r in kept]
    desc["freed_blocks"] = len(plan.planted_allocs) - len(kept)
    desc["end_bytes_check"] = sum(r["size"] for r in kept)
    desc["host_segments"] = len(base_sig)
    desc["planted_segments"] = len(seg_signature(new, dev))
    desc["host_peak_reserved"] = host_peak_reserved(host)
    desc["planted_peak_reserved"] = model.peak_reserved
    desc["annotations_removed"] = plan.drop_annotations
    desc["trace_entries"] = len(out)
    desc.update(host=host_name, rep=rep, device=dev,
                step_bounds=[[s["start"], s["opt_start"], s["end"]] for s in stp])
    return new, desc


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.path.join(REPO, "target", "release", "fragscope"))
    ap.add_argument("--out", default=os.path.join(REPO, "target", "heldout"))
    ap.add_argument("--reps", type=int, default=REPS)
    ap.add_argument("--no-verify", action="store_true", help="skip fragscope replay --verify")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    manifest = {"seed": SEED, "reps": args.reps, "shapes": SHAPES, "hosts": [], "files": [],
                "discarded": []}
    for name, rel in HOSTS:
        path = find_host(rel)
        if path is None:
            print(f"SKIPPED host {name}: {rel} not in the corpus nor in the repository")
            manifest["hosts"].append({"host": name, "skipped": "missing"})
            continue
        snap = sm.load(path)
        dev = 0
        try:
            host = sm.Host(snap, dev)
        except sm.Unsupported as e:
            print(f"SKIPPED host {name}: {e}")
            manifest["hosts"].append({"host": name, "skipped": str(e)})
            continue
        diffs = sm.check_reproduces(host)
        if diffs:
            print(f"SKIPPED host {name}: the allocator model does not reproduce it: {diffs[:2]}")
            manifest["hosts"].append({"host": name, "skipped": "not reproduced"})
            continue
        stp = stepsmod.steps(host.trace)
        if len(stp) < 2:
            print(f"SKIPPED host {name}: {len(stp)} training steps")
            manifest["hosts"].append({"host": name, "skipped": f"{len(stp)} steps"})
            continue
        manifest["hosts"].append({"host": name, "path": os.path.relpath(path, REPO),
                                  "steps": len(stp)})
        for shape in SHAPES:
            for rep in range(args.reps):
                new, rec = plant_one(name, host, snap, dev, stp, shape, rep)
                if new is None:
                    manifest["discarded"].append(rec)
                    print(f"discarded {name} {shape} {rep}: {rec['discarded']}")
                    continue
                fname = f"{name}--{shape}-{rep}.pickle"
                fpath = os.path.join(args.out, fname)
                sm.dump(new, fpath)
                if not args.no_verify:
                    ok, why = verify(args.bin, fpath)
                    rec["verify"] = why
                    if not ok:
                        os.remove(fpath)
                        rec["discarded"] = f"replay --verify: {why}"
                        manifest["discarded"].append(rec)
                        print(f"discarded {fname}: {why}")
                        continue
                rec["file"] = fname
                manifest["files"].append(rec)
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    print(f"planted {len(manifest['files'])} files, discarded {len(manifest['discarded'])}, "
          f"hosts used {sum(1 for h in manifest['hosts'] if 'steps' in h)} -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
