#!/usr/bin/env python3
"""Held-out evaluation of steps and memory by role on recordings that START LATE.

The most common real recording does not begin at program start: the user calls
`torch.cuda.memory._record_memory_history()` after a warm-up step, or the trace ring buffer
(`max_entries`) keeps only the newest entries. The parameters, gradients and optimizer state
then exist before the trace's first entry. This script makes such recordings from real
multi-step training traces and from forward-only grids, runs fragscope as a black box
(`analyze --json`, falling back to `summary --json` for `roles`; docs/json-schema.md) and
scores what it says against truths the harness derives itself (ground_truth.json, steps.py).
It was written without reading fragscope's steps/roles/leaks/lives code or their tests.

How a late-start file is made (what PyTorch writes; /work/shared/spec/pytorch-allocator.md
§10.2, §10.8, §10.10, §10.11)
------------------------------------------------------------------------------------------
From a host snapshot and a cut index c on device 0:
* `device_traces[0]` = the original entries [c:] unchanged (a SUFFIX; oldest first);
* `segments` = the host's final segments unchanged (the state walk at dump time does not
  depend on when recording began), every other top-level key kept;
* two forms:
  - LATE (`_record_memory_history()` called late; kinds boundary, in_forward, in_backward,
    in_optimizer): nothing before c was recorded, so (a) `external_annotations` keeps only
    the annotations with `time_us` >= the first kept entry's `time_us` (annotations are
    recorded only while history is on), less the END of a scope entered before that time
    (a RecordFunction runs only the end callbacks it started with), and (b) a block allocated before c has no stack:
    its `frames` in `segments` become [] (PyTorch gathers a block's context at malloc only
    while recording is on), and so do the `frames` of a segment created before c;
  - RING (kind ring: recording was on from the start with `max_entries=N`, the buffer
    wrapped): the trace keeps the newest N entries (c = len - N); blocks and segments keep
    their frames (they were recorded); `external_annotations` keeps its own newest N
    annotations (its ring has the same capacity, §10.8).
Other devices' traces are left as they are (every host used here records on device 0 only).

Cut kinds (seeded: the steps by random.Random(f"{SEED}:{host}:{kind}:steps").sample, distinct
per replicate while the host has enough; the point by random.Random(f"{SEED}:{host}:{kind}:{rep}");
REPS replicates each)
--------------------------------------------------------------------------------------
Steps are the harness's own (steps.py: optimizer runs; step k = (end of run k-1, end of run
k]; its backward starts at the first autograd allocation). Only steps k >= 2 are drawn (the
premise is a recording begun after a warm-up step, so every role already exists).
A random cut may separate a `free_requested` from its `free_completed`: real late starts do.
* boundary      c = start of step k (k drawn from 2..n): the step's first allocation, after
                the previous optimizer run and its frees (zero_grad's frees included).
* in_forward    c drawn uniformly in (start, bwd_start) of step k (k drawn from 2..n).
* in_backward   c drawn uniformly in (bwd_start, opt_start) of step k (k from 2..n).
* in_optimizer  c drawn uniformly in (opt_start, end] of step k (k from 2..n).
* ring          c = len(trace) - N for N in RING_SIZES (no draw; skipped when N >= len).
Forward-only negatives (no backward, no optimizer): kind late_mid (c drawn uniformly in
[0.15, 0.85] of the trace, LATE form) and ring (as above).

Truth
-----
* Steps: the number of COMPLETE training steps in the suffix = steps of the original whose
  start >= c. A step the cut falls inside (start < c <= end) is partial: it must not be
  counted complete. Forward-only negatives: no step at all (complete or not).
* Roles (hosts with figures in ground_truth.json: the niu-train3 grids; effdl-aphelack and
  eor-cnn have no role truth and are scored on steps only): the most bytes each role holds
  at any moment of the kept suffix. In niu-train3 every role is live during every suffix:
  the parameters always; the Adam state from step 1's optimizer run on (NIUAdam replaces
  m, v and p.data by new tensors, each new one made before the old one is freed, so the role
  never disappears); the last step's gradients are live at the end of the trace (checked by
  test_late_start.py: the last backward's allocations live at the end sum to the gradients'
  figure, and the last optimizer run's live allocations sum to parameters + optimizer state).
  So the truth is ground_truth.json's figure (model sizes: an out-of-place replacement counts
  as temporaries until the old block is freed, docs/json-schema.md) for every cut.
  Knowable: a role figure is called KNOWABLE when the suffix holds a whole backward pass and
  the optimizer run after it (some step's backward starts at or after c): the gradients are
  then made inside the trace, the parameters can be matched to them one for one, and the
  optimizer's step is seen whole. Otherwise (the cut falls inside the last step's backward or
  optimizer run) the role's blocks were made before the trace, indistinguishable by their
  history, and "cannot tell" is an honest answer.
* Forward-only negatives: gradients 0 and optimizer state 0 (knowable: the brief requires
  that a forward-only recording reports none); parameters = ground_truth.json's figure where
  it has one, not knowable (no backward to match them against).

MATCHING RULE (frozen with the seed)
------------------------------------
Per role (`parameters`, `gradients`, `optimizer_state`), from device 0's
`roles.by_role.<role>.max` (`analyze --json`; `summary --json` when analyze has no `roles`):
* RIGHT: a number within 1 % of the truth (truth 0: exactly 0).
* CANNOT TELL: `roles` / `by_role` / the role / its `max` absent or null, or the RoleBytes
  object says so (`can_tell`, `known` or `knowable` false), or the role is listed in
  `roles.cannot_tell` or `roles.unknown`. Counted as MISSED where the truth is knowable,
  as an honest "cannot tell" where it is not.
* WRONG: any other number (0 included when the truth is not 0). A wrong figure is worse
  than "cannot tell" and is counted apart.
Steps, from device 0's `steps` object (`steps.steps`: array of Step with `complete`):
* reported complete = Steps with `complete` true (a Step without the key counts complete);
  reported total = all Steps.
* RIGHT: complete == truth, and for the negatives total == 0. For kind boundary, also
  complete == truth - 1 with total == truth (the first step flagged as begun before the
  recording: conservative, since a recording that starts exactly at a step's first
  allocation cannot show that nothing of the step came before).
* CANNOT TELL: no `steps` object, or `steps.steps` absent/not a list, or an empty list with
  a non-null `reason` while the truth is > 0. (Missed: every training cut's step count is
  knowable.)
* WRONG: anything else.
Missing keys never crash the evaluation.

Usage: late_start.py [--bin target/release/fragscope] [--out target/heldout-late] [--json]
       late_start.py --make-only [--out DIR]
"""
import argparse
import json
import os
import random
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import plant  # noqa: E402
import snapmodel as sm  # noqa: E402
import steps as stepsmod  # noqa: E402

SEED = "fragscope-latestart-heldout-2026-11-26"
REPS = 2
RING_SIZES = (2048, 4096, 6144)
ROLES = ("parameters", "gradients", "optimizer_state")
ROLE_TOL = 0.01
REPO = plant.REPO
TRAIN_KINDS = ("boundary", "in_forward", "in_backward", "in_optimizer", "ring")
NEG_KINDS = ("late_mid", "ring")

# Multi-step training hosts (name, path relative to the corpus or crates/testdata/real).
# pytorchblog-resnet50 is listed so that its absence of truth is visible: steps.py finds no
# optimizer run in it (C++-only optimizer frames), so it has no step truth and is skipped.
TRAIN_HOSTS = [
    ("niu-train3-ctx100-fp32", "grids/niu-train3-ctx100-fp32.pickle"),
    ("niu-train3-ctx150-fp32", "grids/niu-train3-ctx150-fp32.pickle"),
    ("niu-train3-ctx200-fp32", "grids/niu-train3-ctx200-fp32.pickle"),
    ("effdl-aphelack-customfsdp-4gpu", "effdl-aphelack-customfsdp-4gpu.pickle"),
    ("eor-cnn-counterfactuals", "eor-cnn-counterfactuals.pickle"),
    ("pytorchblog-resnet50-train-cppframes", "pytorchblog-resnet50-train-cppframes.pickle"),
]
# Forward-only negatives.
NEG_HOSTS = [
    ("niu-fwd-ctx100-fp32", "grids/niu-fwd-ctx100-fp32.pickle"),
    ("niu-fwd-ctx150-fp32", "grids/niu-fwd-ctx150-fp32.pickle"),
    ("niu-fwd-ctx200-fp32", "grids/niu-fwd-ctx200-fp32.pickle"),
    ("niu-fwd-ctx200-mixed", "grids/niu-fwd-ctx200-mixed.pickle"),
    ("kk-2.7b-fwd-ctx128-fp32", "grids/kk-2.7b-fwd-ctx128-fp32.pickle"),
    ("kk-2.7b-fwd-ctx256-mixed", "grids/kk-2.7b-fwd-ctx256-mixed.pickle"),
]


def load_gt():
    with open(os.path.join(HERE, "ground_truth.json")) as f:
        return json.load(f)["traces"]


def live_index_at_end(trace):
    """addr -> trace index of the alloc of every block the trace leaves live."""
    live = {}
    for i, e in enumerate(trace):
        a = e.get("action")
        if a == "alloc":
            live[e["addr"]] = i
        elif a == "free_completed":
            live.pop(e["addr"], None)
    return live


def late_annotations(ann, t0):
    """The annotations a late `_record_memory_history()` call records: those at or after t0,
    less the END of a scope entered before t0 (a RecordFunction runs the end callbacks of the
    callbacks it started with, so a scope entered before recording began records neither
    end)."""
    if t0 is None:
        return []
    open_before = {}  # (name, device) -> stack of "entered before t0" flags
    out = []
    for a in ann:
        key = (a.get("name"), a.get("device"))
        before = a.get("time_us", 0) < t0
        if a.get("stage") == "START":
            open_before.setdefault(key, []).append(before)
            if not before:
                out.append(a)
        elif a.get("stage") == "END":
            stack = open_before.get(key)
            started_before = stack.pop() if stack else before
            if not before and not started_before:
                out.append(a)
        elif not before:
            out.append(a)
    return out


def cut_snapshot(snap, c, form, ring_n=None, dev=0):
    """The late-start snapshot: trace suffix [c:], final segments kept (LATE: frames of blocks
    and segments made before c emptied), annotations as PyTorch would have kept them."""
    trace = snap["device_traces"][dev]
    out = dict(snap)
    out["device_traces"] = list(snap["device_traces"])
    out["device_traces"][dev] = trace[c:]
    ann = snap.get("external_annotations")
    if form == "late":
        t0 = trace[c].get("time_us") if c < len(trace) else None
        if ann is not None:
            out["external_annotations"] = late_annotations(ann, t0)
        live = live_index_at_end(trace)
        made_in_suffix = {a for a, i in live.items() if i >= c}
        seg_in_suffix = {e["addr"] for e in trace[c:] if e.get("action") == "segment_alloc"}
        segs = []
        for s in snap["segments"]:
            if s.get("device", 0) != dev:
                segs.append(s)
                continue
            s2 = dict(s)
            if "frames" in s2 and s2["address"] not in seg_in_suffix:
                s2["frames"] = []
            blocks = []
            for b in s["blocks"]:
                b2 = dict(b)
                if b2.get("state") != "inactive" and b2["address"] not in made_in_suffix \
                        and "frames" in b2:
                    b2["frames"] = []
                blocks.append(b2)
            s2["blocks"] = blocks
            segs.append(s2)
        out["segments"] = segs
    elif form == "ring":
        if ann is not None and len(ann) > ring_n:
            out["external_annotations"] = ann[len(ann) - ring_n:]
    else:
        raise ValueError(form)
    return out


def draw_cuts(name, trace, stp, negative):
    """[(kind, rep, c, form, ring_n)] for one host."""
    cuts = []
    n = len(trace)
    if negative:
        for rep in range(REPS):
            rng = random.Random(f"{SEED}:{name}:late_mid:{rep}")
            cuts.append(("late_mid", rep, int(rng.uniform(0.15, 0.85) * n), "late", None))
    else:
        for kind in ("boundary", "in_forward", "in_backward", "in_optimizer"):
            # distinct steps for the replicates while the host has enough of them
            ks = random.Random(f"{SEED}:{name}:{kind}:steps").sample(
                range(2, len(stp) + 1), min(REPS, len(stp) - 1))
            for rep in range(REPS):
                rng = random.Random(f"{SEED}:{name}:{kind}:{rep}")
                k = ks[rep % len(ks)]  # 1-based step number
                s = stp[k - 1]
                if kind == "boundary":
                    c = s["start"]
                elif kind == "in_forward":
                    c = rng.randint(s["start"] + 1, s["bwd_start"] - 1)
                elif kind == "in_backward":
                    c = rng.randint(s["bwd_start"] + 1, s["opt_start"] - 1)
                else:
                    c = rng.randint(s["opt_start"] + 1, s["end"])
                cuts.append((kind, rep, c, "late", k))
    for rep, N in enumerate(RING_SIZES):
        if N < n:
            cuts.append(("ring", rep, n - N, "ring", N))
    return cuts


def truth_for(name, trace, stp, c, negative, gt):
    g = gt.get(name, {})
    t = {"roles": {}, "roles_knowable": False}
    if negative:
        t["steps"] = 0
        t["steps_total_must_be_zero"] = True
        t["roles"] = {"gradients": 0, "optimizer_state": 0}
        t["roles_knowable_each"] = {"gradients": True, "optimizer_state": True}
        if g.get("parameters") is not None:
            t["roles"]["parameters"] = g["parameters"]
            t["roles_knowable_each"]["parameters"] = False
        t["why"] = ("forward-only program (GRIDS.md / SOURCES.md): no backward, no optimizer "
                    "step, so no gradient, no optimizer state and no training step; the "
                    "parameters are live throughout but there is no backward to match them")
        return t
    complete = sum(1 for s in stp if s["start"] >= c)
    partial = [i + 1 for i, s in enumerate(stp) if s["start"] < c <= s["end"]]
    t["steps"] = complete
    t["partial_step"] = partial[0] if partial else None
    knowable = any(s["bwd_start"] >= c for s in stp)
    for r in ROLES:
        if g.get(r) is not None:
            t["roles"][r] = g[r]
    t["roles_knowable_each"] = {r: knowable for r in t["roles"]}
    t["why"] = (f"{len(stp)} steps in the host (steps.py); the cut at entry {c} keeps "
                f"{complete} complete step(s)"
                + (f" and the tail of step {partial[0]} (partial)" if partial else "")
                + ("; role figures from ground_truth.json (every role live during every "
                   "suffix of this host), knowable (a whole backward and optimizer run in the suffix)"
                   if t["roles"] and knowable else
                   "; role figures from ground_truth.json, NOT knowable (no whole backward "
                   "in the suffix)" if t["roles"] else "; no role truth for this host"))
    return t


def make(out_dir):
    """Write the cut files and OUT/manifest.json. Returns the manifest."""
    os.makedirs(out_dir, exist_ok=True)
    gt = load_gt()
    man = {"seed": SEED, "files": [], "skipped": []}
    for negative, hosts in ((False, TRAIN_HOSTS), (True, NEG_HOSTS)):
        for name, rel in hosts:
            p = plant.find_host(rel)
            if p is None:
                msg = f"SKIPPED: host {name} ({rel}) not found (corpus ../shared/traces absent?)"
                print(msg, file=sys.stderr)  # keeps --json output clean
                man["skipped"].append({"host": name, "why": "not found"})
                continue
            snap = sm.load(p)
            trace = snap["device_traces"][0]
            stp = stepsmod.steps(trace)
            if negative:
                if stp or any(e.get("action") == "alloc" and stepsmod.is_backward_alloc(e)
                              for e in trace):
                    raise AssertionError(f"{name}: a forward-only negative has a backward or "
                                         "an optimizer run")
            elif len(stp) < 2:
                msg = f"SKIPPED: host {name}: steps.py finds {len(stp)} optimizer run(s): no step truth"
                print(msg, file=sys.stderr)  # keeps --json output clean
                man["skipped"].append({"host": name, "why": f"{len(stp)} optimizer runs"})
                continue
            for kind, rep, c, form, extra in draw_cuts(name, trace, stp, negative):
                new = cut_snapshot(snap, c, form, ring_n=extra if form == "ring" else None)
                fname = f"{name}--{kind}-{rep}.pickle"
                sm.dump(new, os.path.join(out_dir, fname))
                rec = {"file": fname, "host": name, "host_path": os.path.relpath(p, REPO),
                       "negative": negative, "kind": kind, "rep": rep, "cut": c, "form": form,
                       "host_entries": len(trace), "kept_entries": len(trace) - c,
                       "truth": truth_for(name, trace, stp, c, negative, gt)}
                if form == "ring":
                    rec["max_entries"] = extra
                elif not negative:
                    rec["cut_step"] = extra
                man["files"].append(rec)
    with open(os.path.join(out_dir, "manifest.json"), "w") as f:
        json.dump(man, f, indent=1)
    return man


def run_json(binary, args, timeout=900):
    try:
        r = subprocess.run([binary] + args, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"could not run: {e}"
    if r.returncode != 0:
        last = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ""
        return None, f"exit {r.returncode}: {last}"
    try:
        return json.loads(r.stdout), None
    except ValueError as e:
        return None, f"unreadable JSON: {e}"


def device0(doc):
    try:
        devs = doc["files"][0]["devices"] or []
    except (KeyError, IndexError, TypeError):
        return None
    for d in devs:
        if isinstance(d, dict) and d.get("device", 0) == 0:
            return d
    return None


def role_answer(roles_obj, role):
    """(kind, value): kind 'number' or 'cannot_tell'."""
    if not isinstance(roles_obj, dict):
        return "cannot_tell", None
    for key in ("cannot_tell", "unknown"):
        lst = roles_obj.get(key)
        if isinstance(lst, list) and role in lst:
            return "cannot_tell", None
    by = roles_obj.get("by_role")
    if not isinstance(by, dict):
        return "cannot_tell", None
    rb = by.get(role)
    if not isinstance(rb, dict):
        return "cannot_tell", None
    for key in ("can_tell", "known", "knowable"):
        if rb.get(key) is False:
            return "cannot_tell", None
    v = rb.get("max")
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return "cannot_tell", None
    return "number", v


def judge_role(truth, knowable, answer):
    kind, v = answer
    if kind == "cannot_tell":
        return "missed" if knowable else "cannot_tell_ok"
    ok = (v == 0) if truth == 0 else abs(v - truth) <= ROLE_TOL * truth
    return "right" if ok else "wrong"


def steps_answer(dev):
    """(verdict input) -> dict with complete, total, reason, or None when absent."""
    st = dev.get("steps") if isinstance(dev, dict) else None
    if not isinstance(st, dict):
        return None
    lst = st.get("steps")
    if not isinstance(lst, list):
        return None
    complete = sum(1 for s in lst if not (isinstance(s, dict) and s.get("complete") is False))
    return {"complete": complete, "total": len(lst), "reason": st.get("reason"),
            "source": st.get("source")}


def judge_steps(rec, ans):
    t = rec["truth"]
    truth = t["steps"]
    if ans is None:
        return "missed"
    if ans["total"] == 0 and ans["reason"] and truth > 0:
        return "missed"
    if t.get("steps_total_must_be_zero"):
        return "right" if ans["total"] == 0 else "wrong"
    if ans["complete"] == truth:
        return "right"
    if rec["kind"] == "boundary" and ans["complete"] == truth - 1 and ans["total"] == truth:
        return "right"
    return "wrong"


def evaluate(binary, out_dir):
    man = make(out_dir)  # always re-made (seconds): files, draws and truths never go stale
    rows = []
    for rec in man["files"]:
        path = os.path.join(out_dir, rec["file"])
        row = {k: rec[k] for k in ("file", "host", "kind", "rep", "cut", "kept_entries",
                                   "negative", "truth")}
        doc, err = run_json(binary, ["analyze", "--json", path])
        dev = device0(doc) if doc is not None else None
        if dev is None:
            row["error"] = err or "no device 0 in the output"
            row["steps_verdict"] = "missed"
            row["roles"] = {r: {"truth": v, "reported": None, "verdict": "error"}
                            for r, v in rec["truth"]["roles"].items()}
            rows.append(row)
            continue
        roles_obj = dev.get("roles")
        sdoc, serr = run_json(binary, ["summary", "--json", path])
        sdev = device0(sdoc) if sdoc is not None else None
        s_roles = sdev.get("roles") if isinstance(sdev, dict) else None
        if serr:
            row["summary_error"] = serr
        if not isinstance(roles_obj, dict):
            roles_obj = s_roles
        sa = steps_answer(dev)
        row["steps_reported"] = sa
        row["steps_verdict"] = judge_steps(rec, sa)
        row["roles"] = {}
        for r, truth in rec["truth"]["roles"].items():
            ans = role_answer(roles_obj, r)
            kn = rec["truth"]["roles_knowable_each"][r]
            row["roles"][r] = {"truth": truth, "knowable": kn, "reported": ans[1],
                               "verdict": judge_role(truth, kn, ans)}
            s_ans = role_answer(s_roles, r)
            if s_ans != ans:
                # informational: `summary --json` and `analyze --json` should agree
                row["roles"][r]["summary_reported"] = s_ans[1]
                row.setdefault("summary_disagrees", []).append(r)
        rows.append(row)
    return {"binary": binary, "seed": SEED, "skipped": man["skipped"], "rows": rows,
            "tables": tables(rows),
            "summary_disagreements": sum(len(r.get("summary_disagrees", [])) for r in rows),
            "summary_errors": sum(1 for r in rows if "summary_error" in r)}


VERDICTS = ("right", "missed", "cannot_tell_ok", "wrong", "error")


def tables(rows):
    out = {}
    for row in rows:
        group = ("neg:" if row["negative"] else "train:") + row["kind"]
        t = out.setdefault(group, {"cases": 0, "steps": {v: 0 for v in VERDICTS},
                                   "roles": {v: 0 for v in VERDICTS}, "by_role": {}})
        t["cases"] += 1
        t["steps"][row["steps_verdict"]] += 1
        for r, v in row["roles"].items():
            t["roles"][v["verdict"]] += 1
            br = t["by_role"].setdefault(r, {v2: 0 for v2 in VERDICTS})
            br[v["verdict"]] += 1
            side = "knowable" if v.get("knowable") else "not_knowable"
            t.setdefault("roles_" + side, {v2: 0 for v2 in VERDICTS})[v["verdict"]] += 1
    return out


def fmt_b(n):
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def print_text(rep):
    print(f"fragscope late-start held-out evaluation; binary {rep['binary']}; seed {rep['seed']}")
    for s in rep["skipped"]:
        print(f"SKIPPED host {s['host']}: {s['why']}")
    print("\nr = right, m = missed (cannot tell where the truth is knowable), "
          "ct = cannot tell where it is not knowable (honest), w = WRONG figure")
    print(f"{'kind':20} {'cases':>5} | {'steps r/m/w':>11} | {'roles, knowable r/m/w':>21} | "
          f"{'roles, not knowable r/ct/w':>26} | per role r/m/ct/w")
    for g in sorted(rep["tables"]):
        t = rep["tables"][g]
        s = t["steps"]
        k = t.get("roles_knowable", {v: 0 for v in VERDICTS})
        u = t.get("roles_not_knowable", {v: 0 for v in VERDICTS})
        per = "  ".join(f"{role[:5]} {b['right']}/{b['missed']}/{b['cannot_tell_ok']}/{b['wrong']}"
                        for role, b in sorted(t["by_role"].items()))
        errs = s["error"] + t["roles"]["error"]
        print(f"{g:20} {t['cases']:>5} | {s['right']:>3}/{s['missed']}/{s['wrong']:<5} | "
              f"{k['right']:>13}/{k['missed']}/{k['wrong']:<5} | "
              f"{u['right']:>18}/{u['cannot_tell_ok']}/{u['wrong']:<5} | {per}"
              + (f"  errors {errs}" if errs else ""))
    print(f"\nsummary --json vs analyze --json: {rep['summary_disagreements']} role figures "
          f"disagree, {rep['summary_errors']} summary runs failed")
    print("\nPer case")
    for row in rep["rows"]:
        t = row["truth"]
        sa = row.get("steps_reported")
        srep = "absent" if not sa else f"{sa['complete']} complete/{sa['total']}"
        roles = "  ".join(f"{r[:5]} {fmt_b(v['reported'])}/{fmt_b(v['truth'])} {v['verdict']}"
                          for r, v in row["roles"].items())
        err = f" ERROR {row['error']}" if "error" in row else ""
        if row.get("summary_disagrees"):
            err += f" [summary disagrees: {', '.join(row['summary_disagrees'])}]"
        print(f"  {row['file']:52} cut {row['cut']:>6} kept {row['kept_entries']:>6} "
              f"steps {srep} (truth {t['steps']}) {row['steps_verdict']}  {roles}{err}")


def main(argv=None):
    ap = argparse.ArgumentParser(description="fragscope late-start held-out evaluation")
    ap.add_argument("--bin", default=os.path.join(REPO, "target", "release", "fragscope"))
    ap.add_argument("--out", default=os.path.join(REPO, "target", "heldout-late"))
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--make-only", action="store_true", help="write the cut files, no fragscope")
    args = ap.parse_args(argv)
    if args.make_only:
        man = make(args.out)
        print(f"{len(man['files'])} files in {args.out}")
        return 0
    if not os.path.exists(args.bin):
        print(f"error: no fragscope binary at {args.bin} (cargo build --release -p fragscope)",
              file=sys.stderr)
        return 2
    rep = evaluate(args.bin, args.out)
    if args.json:
        json.dump(rep, sys.stdout, indent=1)
        print()
    else:
        print_text(rep)
    return 0


if __name__ == "__main__":
    sys.exit(main())
