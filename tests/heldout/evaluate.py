#!/usr/bin/env python3
"""Held-out evaluation of fragscope's leak suspects, steps and memory by role (issue 19).

Drives fragscope as a black box (`analyze --json`, documented in docs/json-schema.md) on
1. every file planted by plant.py (OUT/manifest.json; planted first if absent), and
2. every untouched real trace and grid (the corpus ../shared/traces and grids/, else the
   repository's crates/testdata/real and real/grids),
and prints per shape found/planted, false suspects per untouched file, steps against the
harness's own step counts, and role bytes against ground_truth.json.

MATCHING RULE (frozen with the seed; not to be changed after the detector changes)
----------------------------------------------------------------------------------
For a planted file P made from host H (its device 0), with planted frame stack S, per-step
planted growth u (shapes a-e), bytes planted and kept at the end E, and n steps:

* Suspects are `devices[*].leak_suspects` of the device the plant went into. Per suspect:
  site frame = (`file` base name, `line`, `function`), else parsed from `site`
  ("file:line:function"); growth = `growth_bytes_per_step`, else
  `growth_bytes_per_iteration`, else 0; kept = `never_freed_bytes`, else 0.
* Pre-existing: H's own run has a suspect h with the same `site` string, and the planted run
  did not change it by the plant: growth(s) - growth(h) < q/2 and kept(s) - kept(h) < q/2,
  where q = u for shapes a-e and q = the block size for the negative controls. Pre-existing
  suspects never count, found or false.
* Site match: the suspect's site frame equals a frame of S (file base name, line, name),
  ignoring S's frames that occur in >= 50 % of H's allocations' stacks (entry points such
  as `main`, `<module>`, the unwinder's own frames).
* Byte match (positives a-e): growth(s) within [u/1.5, 1.5 u], or kept(s) within
  [E/1.5, 1.5 E]. (Negatives f, g: growth(s) or kept(s) within [q/1.5, 1.5 q * blocks].)
* FOUND (a-e): some suspect that is not pre-existing has a site match or a byte match.
* FLAGGED (negatives f, g, a wrong call): some suspect that is not pre-existing has a site
  match or a byte match. Each planted file also reports its count of NEW suspects (not
  pre-existing) that match nothing: noise the plant provoked elsewhere.
* FALSE SUSPECTS on an untouched trace: every entry of `leak_suspects` (target 0).
* Steps: the device's `steps` object (count in `count`, else `steps` when an int, else the
  length of `boundaries`/`steps` when a list) against ground_truth.json (`steps` exact, or
  one of `steps_accept`). Missing: "not reported".
* Roles: `roles.by_role.{parameters,gradients,optimizer_state}.max` (falling back to
  `summary --json` when `analyze` has no `roles`) within 1 % of ground_truth.json.
Missing keys never crash the evaluation: they are reported as "not reported".

Usage: evaluate.py [--bin target/release/fragscope] [--planted target/heldout] [--json]
"""
import argparse
import glob
import json
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import plant  # noqa: E402
import snapmodel as sm  # noqa: E402

REPO = plant.REPO
ROLES = ("parameters", "gradients", "optimizer_state")
TOL_BYTES = 1.5
ROLE_TOL = 0.01
COMMON_FRAME_SHARE = 0.50


def run_json(binary, args, timeout=900):
    try:
        r = subprocess.run([binary] + args, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"could not run: {e}"
    if r.returncode != 0:
        return None, f"exit {r.returncode}: {r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ''}"
    try:
        return json.loads(r.stdout), None
    except ValueError as e:
        return None, f"unreadable JSON: {e}"


def devices_of(doc):
    try:
        return doc["files"][0]["devices"] or []
    except (KeyError, IndexError, TypeError):
        return []


def suspects_of(dev):
    s = dev.get("leak_suspects")
    return s if isinstance(s, list) else []


def _num(d, *keys):
    for k in keys:
        v = d.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return v
    return 0


def growth(s):
    return _num(s, "growth_bytes_per_step", "growth_bytes_per_iteration")


def kept(s):
    return _num(s, "never_freed_bytes")


def site_frame(s):
    f, line, fn = s.get("file"), s.get("line"), s.get("function")
    if f is not None and line is not None and fn is not None:
        return (os.path.basename(str(f).replace("\\", "/")), int(line), str(fn))
    site = s.get("site")
    m = re.match(r"^(.+?):(\d+):(.*)$", site) if isinstance(site, str) else None
    if m:
        return (os.path.basename(m.group(1).replace("\\", "/")), int(m.group(2)), m.group(3))
    return None


def frame_tuple(fr):
    return (os.path.basename(str(fr[0]).replace("\\", "/")), int(fr[1]), str(fr[2]))


def common_frames(trace):
    """Frames present in >= 50 % of the allocations' stacks."""
    allocs = [e for e in trace if e.get("action") == "alloc"]
    count = {}
    for e in allocs:
        for fr in {frame_tuple((f.get("filename", ""), f.get("line", 0), f.get("name", "")))
                   for f in e.get("frames", []) or []}:
            count[fr] = count.get(fr, 0) + 1
    n = max(1, len(allocs))
    return {fr for fr, c in count.items() if c >= COMMON_FRAME_SHARE * n}


def judge(rec, planted_dev, host_dev, common):
    """Apply the matching rule to one planted file. Returns a dict."""
    neg = rec["shape"] in plant.NEGATIVE
    q = rec.get("block_bytes") if neg else rec["per_step_bytes"]
    blocks = rec.get("blocks", 1)
    E = rec["end_bytes"]
    stack = {frame_tuple(f) for f in rec["site_frames"]} - common
    host_sus = suspects_of(host_dev) if host_dev else []
    res = {"matched": [], "new_unmatched": 0, "pre_existing": 0}
    for s in suspects_of(planted_dev):
        pre = False
        for h in host_sus:
            if h.get("site") == s.get("site") and growth(s) - growth(h) < q / 2 \
                    and kept(s) - kept(h) < q / 2:
                pre = True
                break
        if pre:
            res["pre_existing"] += 1
            continue
        sf = site_frame(s)
        by_site = sf is not None and sf in stack
        if neg:
            lo, hi = q / TOL_BYTES, TOL_BYTES * q * blocks
            by_bytes = lo <= growth(s) <= hi or lo <= kept(s) <= hi
        else:
            by_bytes = (u_lo(q) <= growth(s) <= TOL_BYTES * q) or \
                (E / TOL_BYTES <= kept(s) <= TOL_BYTES * E)
        if by_site or by_bytes:
            res["matched"].append({"site": s.get("site"), "by_site": by_site, "by_bytes": by_bytes,
                                   "growth": growth(s), "kept": kept(s),
                                   "confidence": s.get("confidence")})
        else:
            res["new_unmatched"] += 1
            res.setdefault("new_unmatched_sites", []).append(s.get("site"))
    res["hit"] = bool(res["matched"])
    return res


def u_lo(u):
    return u / TOL_BYTES


def steps_reported(dev):
    st = dev.get("steps")
    if st is None:
        return None
    if isinstance(st, bool):
        return None
    if isinstance(st, int):
        return st
    if isinstance(st, list):
        return len(st)
    if isinstance(st, dict):
        for k in ("count", "steps", "n"):
            v = st.get(k)
            if isinstance(v, int) and not isinstance(v, bool):
                return v
            if isinstance(v, list):
                return len(v)
        b = st.get("boundaries")
        if isinstance(b, list):
            return len(b)
    return None


def roles_reported(dev):
    r = dev.get("roles")
    if not isinstance(r, dict):
        return None
    by = r.get("by_role")
    if not isinstance(by, dict):
        return None
    out = {}
    for role in ROLES:
        v = by.get(role)
        out[role] = v.get("max") if isinstance(v, dict) else None
    return out


def untouched_files():
    corpus = plant.CORPUS
    if os.path.isdir(corpus):
        base = corpus
    else:
        base = plant.INREPO
        print(f"NOTE: corpus {corpus} missing; untouched files from {base}")
    files = []
    for pat in ("*.pickle", "*.pkl", "*.json", "*.json.gz", "*.raw.gz", "grids/*.pickle"):
        files += glob.glob(os.path.join(base, pat))
    return sorted(set(files)), base


def evaluate(binary, planted_dir, gt_path):
    manifest_path = os.path.join(planted_dir, "manifest.json")
    if not os.path.exists(manifest_path):
        print(f"no {manifest_path}: planting first")
        plant.main(["--bin", binary, "--out", planted_dir])
    with open(manifest_path) as f:
        manifest = json.load(f)
    if manifest.get("seed") != plant.SEED:
        print(f"{manifest_path} was planted with another seed: planting again")
        plant.main(["--bin", binary, "--out", planted_dir])
        with open(manifest_path) as f:
            manifest = json.load(f)
    with open(gt_path) as f:
        gt = json.load(f)["traces"]
    report = {"binary": binary, "seed": manifest["seed"], "planted": [], "untouched": [],
              "by_shape": {}, "discarded": len(manifest["discarded"])}

    # Untouched files (hosts included).
    files, base = untouched_files()
    host_runs = {}
    for path in files:
        name = os.path.basename(path)
        for suf in (".pickle", ".pkl", ".json.gz", ".raw.gz", ".json"):
            if name.endswith(suf):
                name = name[: -len(suf)]
                break
        doc, err = run_json(binary, ["analyze", "--json", path])
        row = {"file": os.path.relpath(path, base), "name": name}
        if doc is None:
            if err and "is not a memory snapshot" in err:
                row["rejected"] = err  # a file fragscope does not read (exit 2): not counted
            else:
                row["error"] = err
            report["untouched"].append(row)
            continue
        devs = devices_of(doc)
        if devs and "steps" not in devs[0] and isinstance(doc["files"][0], dict) \
                and "steps" in doc["files"][0]:
            devs = [dict(devs[0], steps=doc["files"][0]["steps"])] + devs[1:]
        it = devs[0].get("iterations") if devs else None
        if isinstance(it, dict) and isinstance(it.get("boundaries"), list):
            # the older `iterations` object (periodicity, not steps): shown, never scored
            row["iterations_note"] = f"{len(it['boundaries'])} boundaries ({it.get('source')})"
        row["false_suspects"] = sum(len(suspects_of(d)) for d in devs)
        row["suspect_sites"] = [s.get("site") for d in devs for s in suspects_of(d)]
        host_runs[name] = devs
        g = gt.get(name)
        if g is not None:
            rep_steps = [steps_reported(d) for d in devs]
            rep_steps = [x for x in rep_steps if x is not None]
            row["steps_truth"] = g.get("steps")
            row["steps_accept"] = g.get("steps_accept")
            row["steps_reported"] = rep_steps[0] if rep_steps else None
            if row["steps_reported"] is None:
                row["steps_ok"] = None
            else:
                acc = g.get("steps_accept") or [g.get("steps")]
                row["steps_ok"] = row["steps_reported"] in acc
            if any(g.get(r) is not None for r in ROLES):
                roles = None
                for d in devs:
                    roles = roles_reported(d)
                    if roles:
                        break
                if roles is None:
                    sdoc, _ = run_json(binary, ["summary", "--json", path])
                    if sdoc is not None:
                        for d in devices_of(sdoc):
                            roles = roles_reported(d)
                            if roles:
                                break
                rr = {}
                for r in ROLES:
                    truth = g.get(r)
                    if truth is None:
                        continue
                    got = roles.get(r) if roles else None
                    ok = None if not isinstance(got, (int, float)) else \
                        abs(got - truth) <= ROLE_TOL * truth
                    rr[r] = {"truth": truth, "reported": got, "ok": ok}
                row["roles"] = rr
        report["untouched"].append(row)

    # Planted files.
    for rec in manifest["files"]:
        path = os.path.join(planted_dir, rec["file"])
        row = {"file": rec["file"], "shape": rec["shape"], "host": rec["host"],
               "per_step_bytes": rec["per_step_bytes"], "end_bytes": rec["end_bytes"]}
        if not os.path.exists(path):
            row["error"] = "file missing (re-run plant.py)"
            report["planted"].append(row)
            continue
        doc, err = run_json(binary, ["analyze", "--json", path])
        if doc is None:
            row["error"] = err
            report["planted"].append(row)
            continue
        devs = devices_of(doc)
        pdev = next((d for d in devs if d.get("device") == rec["device"]), None)
        if pdev is not None and "steps" not in pdev and isinstance(doc["files"][0], dict) \
                and "steps" in doc["files"][0]:
            pdev = dict(pdev, steps=doc["files"][0]["steps"])
        hdevs = host_runs.get(rec["host"])
        hdev = next((d for d in hdevs if d.get("device") == rec["device"]), None) if hdevs else None
        if hdevs is None:
            row["note"] = "host's own run missing: nothing counted as pre-existing"
        host_path = plant.find_host(dict(plant.HOSTS)[rec["host"]])
        common = common_frames(sm.load(host_path)["device_traces"][rec["device"]]) if host_path else set()
        j = judge(rec, pdev or {}, hdev, common)
        row.update(j)
        row["steps_reported"] = steps_reported(pdev or {})
        report["planted"].append(row)

    report["by_host"] = {}
    for row in report["planted"]:
        h = report["by_host"].setdefault(row["host"], {"positives": 0, "found": 0,
                                                       "negatives": 0, "flagged": 0})
        neg = row["shape"] in plant.NEGATIVE
        h["negatives" if neg else "positives"] += 1
        if "error" not in row and row["hit"]:
            h["flagged" if neg else "found"] += 1
    for row in report["planted"]:
        b = report["by_shape"].setdefault(row["shape"], {"planted": 0, "hit": 0, "errors": 0,
                                                         "new_unmatched": 0})
        b["planted"] += 1
        if "error" in row:
            b["errors"] += 1
            continue
        b["hit"] += int(row["hit"])
        b["new_unmatched"] += row["new_unmatched"]
    return report


def fmt_bytes(n):
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024


def print_text(rep):
    print(f"fragscope held-out evaluation (issue 19); binary {rep['binary']}; seed {rep['seed']}")
    print(f"planted files discarded by the planting procedure: {rep['discarded']}\n")
    print("Planted leaks (a-e: found / planted) and negative controls (f, g: wrongly flagged / planted)")
    print(f"{'shape':22} {'result':>12} {'errors':>7} {'new unmatched suspects':>24}")
    for shape in plant.SHAPES:
        b = rep["by_shape"].get(shape)
        if not b:
            continue
        word = "flagged" if shape in plant.NEGATIVE else "found"
        print(f"{shape:22} {b['hit']:>4}/{b['planted']:<3}{word:>5} {b['errors']:>7} {b['new_unmatched']:>24}")
    pos = [b for s, b in rep["by_shape"].items() if s not in plant.NEGATIVE]
    neg = [b for s, b in rep["by_shape"].items() if s in plant.NEGATIVE]
    print(f"{'positives total':22} {sum(b['hit'] for b in pos):>4}/{sum(b['planted'] for b in pos):<3}found")
    print(f"{'negatives total':22} {sum(b['hit'] for b in neg):>4}/{sum(b['planted'] for b in neg):<3}flagged")
    print("\nPer host")
    for host, h in rep.get("by_host", {}).items():
        print(f"  {host:40} found {h['found']}/{h['positives']}  flagged {h['flagged']}/{h['negatives']}")
    print("\nPer planted file")
    for r in rep["planted"]:
        if "error" in r:
            print(f"  {r['file']}: ERROR {r['error']}")
            continue
        how = ", ".join(f"{m['site']} ({'site' if m['by_site'] else ''}{'+' if m['by_site'] and m['by_bytes'] else ''}{'bytes' if m['by_bytes'] else ''})"
                        for m in r["matched"]) or "-"
        print(f"  {r['file']:58} {'HIT ' if r['hit'] else 'miss'} u={fmt_bytes(r['per_step_bytes'])} "
              f"end={fmt_bytes(r['end_bytes'])} new-unmatched={r['new_unmatched']} pre={r['pre_existing']} "
              f"steps={r['steps_reported'] if r['steps_reported'] is not None else 'not reported'} matched: {how}"
              + (f"; unmatched: {', '.join(str(x) for x in r['new_unmatched_sites'])}"
                 if r.get("new_unmatched_sites") else ""))
    print("\nUntouched real traces and grids: false suspects (target 0), steps, roles")
    tot = 0
    for r in rep["untouched"]:
        if "rejected" in r:
            print(f"  {r['file']:58} not read by fragscope (exit 2), not counted")
            continue
        if "error" in r:
            print(f"  {r['file']:58} ERROR {r['error']}")
            continue
        tot += r["false_suspects"]
        extra = ""
        if "steps_truth" in r or "steps_accept" in r:
            truth = r.get("steps_accept") or r.get("steps_truth")
            rs = r["steps_reported"]
            extra += f" steps {('not reported' if rs is None else rs)} (truth {truth})"
            if rs is None and r.get("iterations_note"):
                extra += f" [iterations: {r['iterations_note']}]"
        for role, v in (r.get("roles") or {}).items():
            got = v["reported"]
            extra += f" {role} {'not reported' if got is None else fmt_bytes(got)}/{fmt_bytes(v['truth'])}" \
                     f"{'' if v['ok'] is None else (' ok' if v['ok'] else ' OFF')}"
        sites = ("; sites: " + ", ".join(str(s) for s in r["suspect_sites"][:4])) if r["false_suspects"] else ""
        print(f"  {r['file']:58} false suspects {r['false_suspects']}{extra}{sites}")
    n = sum(1 for r in rep["untouched"] if "error" not in r and "rejected" not in r)
    with_fs = sum(1 for r in rep["untouched"] if r.get("false_suspects"))
    print(f"  total false suspects {tot} on {with_fs} of {n} untouched files")


def main(argv=None):
    ap = argparse.ArgumentParser(description="fragscope held-out evaluation (issue 19)")
    ap.add_argument("--bin", default=os.path.join(REPO, "target", "release", "fragscope"))
    ap.add_argument("--planted", default=os.path.join(REPO, "target", "heldout"))
    ap.add_argument("--ground-truth", default=os.path.join(HERE, "ground_truth.json"))
    ap.add_argument("--json", action="store_true", help="print JSON instead of text")
    args = ap.parse_args(argv)
    if not os.path.exists(args.bin):
        print(f"error: no fragscope binary at {args.bin} (build it: cargo build --release -p fragscope)",
              file=sys.stderr)
        return 2
    rep = evaluate(args.bin, args.planted, args.ground_truth)
    if args.json:
        json.dump(rep, sys.stdout, indent=1)
        print()
    else:
        print_text(rep)
    return 0


if __name__ == "__main__":
    sys.exit(main())
