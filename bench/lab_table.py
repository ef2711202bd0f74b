#!/usr/bin/env python3
"""Corpus table of the allocator lab (docs/allocator-lab.md).

Runs `fragscope replay FILE --allocator all --json` on every file of a traces folder and
writes, between the markers of docs/allocator-lab.md, the peak reserved / peak live
bytes of every policy on every device trace with a history, plus what happens on the
recorded capacity.

    python3 bench/lab_table.py --fragscope target/release/fragscope \
        --traces ../shared/traces --write docs/allocator-lab.md [--min-capacity]

The per-policy summary also sums the synchronisations each policy made so that it could
unmap freed memory (`calls.synchronize`); with --min-capacity, the smallest device on which
each policy runs without an OOM, as a ratio to peak live bytes.
"""
import argparse
import json
import math
import pathlib
import re
import subprocess
import sys

START, END = "<!-- lab-table:start -->", "<!-- lab-table:end -->"
COLS = [
    "pytorch",
    "expandable",
    "best-fit",
    "page-remap",
    "page-remap:lazy",
    "paged-best-fit",
    "paged-best-fit:lazy",
    "lifetime",
    "planned",
    "hybrid",
]
ONLINE = ["best-fit", "page-remap", "page-remap:lazy", "paged-best-fit", "paged-best-fit:lazy", "lifetime"]


def column(policy):
    if policy.startswith("pytorch") and "expandable_segments:True" in policy:
        return "expandable"
    if policy.startswith("pytorch"):
        return "pytorch"
    return policy


def gib(n):
    return f"{n / 2**30:.2f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fragscope", default="target/release/fragscope")
    ap.add_argument("--traces", default="../shared/traces")
    ap.add_argument("--write", help="Markdown file whose marked section is replaced (else print)")
    ap.add_argument("--min-capacity", action="store_true", help="also the smallest device without an OOM")
    a = ap.parse_args()
    files = sorted(p for p in pathlib.Path(a.traces).iterdir() if p.is_file() and not p.name.endswith(".md"))
    rows, ooms, sync_rows, min_rows = [], [], [], []
    for f in files:
        cmd = [a.fragscope, "replay", str(f), "--allocator", "all", "--json"] + (["--min-capacity"] if a.min_capacity else [])
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            print(f"skip {f.name}: {r.stderr.strip()}", file=sys.stderr)
            continue
        for dev in json.loads(r.stdout)["files"][0]["devices"]:
            b = dev["bounds"]
            if dev["requests"] == 0 or b["live"] == 0:
                continue
            live = b["live"]
            ratios = {}
            verdicts = {}
            syncs = {}
            mins = {}
            for k, row in enumerate(dev["rows"]):
                # The first row is PyTorch with the recorded settings; when they already
                # have expandable segments it is also the expandable column.
                cs = ["pytorch"] if k == 0 else []
                if column(row["policy"]) != "pytorch" or k != 0:
                    cs.append(column(row["policy"]))
                for c in cs:
                    ratios[c] = row["peak_reserved"] / live
                    verdicts[c] = row["verdict"]
                    syncs[c] = row["calls"].get("synchronize", 0)
                    if row.get("min_capacity") is not None:
                        mins[c] = row["min_capacity"] / live
            rows.append((f.name, dev, ratios))
            sync_rows.append((dev["requests"], syncs))
            min_rows.append(mins)
            if dev["recorded_ooms"] or any("none recorded" in v for v in verdicts.values()):
                ooms.append((f.name, dev, verdicts))
    out = []
    out.append("| trace | dev | requests | streams | peak live (GiB) | per-stream bound | 2 MiB-page bound | "
               + " | ".join(COLS) + " |")
    out.append("|---|---:|---:|---:|---:|---:|---:|" + "---:|" * len(COLS))
    for name, dev, ratios in rows:
        b = dev["bounds"]
        cells = [name, str(dev["device"]), f"{dev['requests']:,}", str(dev["streams"]), gib(b["live"]),
                 f"{b['per_stream'] / b['live']:.3f}", f"{b['pages'] / b['live']:.3f}"]
        best_online = min(ratios.get(c, math.inf) for c in ONLINE)
        for c in COLS:
            v = ratios.get(c)
            s = "—" if v is None else f"{v:.3f}"
            if v is not None and c in ONLINE and v == best_online:
                s = f"**{s}**"
            cells.append(s)
        out.append("| " + " | ".join(cells) + " |")
    # Summary per policy.
    out.append("")
    out.append("| policy | geometric mean | worst | traces ≤ 1.02 | traces ≤ 1.05 | synchronisations (all traces) "
               "| per 1,000 requests |")
    out.append("|---|---:|---:|---:|---:|---:|---:|")
    extra = {"best online": lambda r: min(r.get(c, math.inf) for c in ONLINE)}
    total_requests = sum(n for n, _ in sync_rows)
    for c in COLS + list(extra):
        vals = [extra[c](r) if c in extra else r.get(c) for _, _, r in rows]
        vals = [v for v in vals if v is not None and v != math.inf]
        if not vals:
            continue
        gm = math.exp(sum(math.log(v) for v in vals) / len(vals))
        if c in extra:
            sync_cells = "| |"
        else:
            n = sum(sy.get(c, 0) for _, sy in sync_rows)
            sync_cells = f"| {n:,} | {1000 * n / max(total_requests, 1):.1f} |"
        out.append(f"| {c} | {gm:.3f} | {max(vals):.3f} | {sum(v <= 1.02 for v in vals)}/{len(vals)} "
                   f"| {sum(v <= 1.05 for v in vals)}/{len(vals)} {sync_cells}")
    if any(min_rows):
        out.append("")
        out.append("Smallest device without an OOM (`--min-capacity`), ÷ peak live bytes:")
        out.append("")
        out.append("| policy | geometric mean | worst | traces ≤ 1.02 | traces ≤ 1.05 |")
        out.append("|---|---:|---:|---:|---:|")
        for c in COLS:
            vals = [m[c] for m in min_rows if c in m]
            if not vals:
                continue
            gm = math.exp(sum(math.log(v) for v in vals) / len(vals))
            out.append(f"| {c} | {gm:.3f} | {max(vals):.3f} | {sum(v <= 1.02 for v in vals)}/{len(vals)} "
                       f"| {sum(v <= 1.05 for v in vals)}/{len(vals)} |")
    if ooms:
        out.append("")
        out.append("On the recorded capacity (traces with a recorded OOM, or where a policy runs out):")
        out.append("")
        out.append("| trace | dev | capacity (GiB) | " + " | ".join(COLS) + " |")
        out.append("|---|---:|---:|" + "---|" * len(COLS))
        for name, dev, verdicts in ooms:
            cells = [name, str(dev["device"]), gib(dev["capacity"])]
            cells += [verdicts.get(c, "—") for c in COLS]
            out.append("| " + " | ".join(cells) + " |")
    text = "\n".join(out) + "\n"
    if a.write:
        p = pathlib.Path(a.write)
        doc = p.read_text()
        i, j = doc.index(START) + len(START), doc.index(END)
        p.write_text(doc[:i] + "\n" + text + doc[j:])
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
