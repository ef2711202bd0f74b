"""`fragscope export --format parquet`: every table of every real snapshot loaded into
DuckDB (without fragscope), its counts and sums checked against `summary --json`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import params, real_files, run_cli

duckdb = pytest.importorskip("duckdb", reason="duckdb (python/requirements-test.txt) is not installed")

TABLES = [
    "trace_events",
    "allocations",
    "segments",
    "blocks",
    "stacks",
    "frames",
    "annotations",
    "host_blocks",
    "host_events",
]


def export(tmp_path: Path, *args: str) -> dict:
    out = tmp_path / "tables"
    p = run_cli("export", "--json", "-o", str(out), *args)
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["schema"] == "fragscope.export/2" and [t["name"] for t in d["tables"]] == TABLES
    return d


def q(con, sql: str):
    return con.execute(sql).fetchall()


@pytest.mark.parametrize("path", params(real_files()))
def test_tables_match_summary(path, tmp_path):
    s = run_cli("summary", "--json", str(path))
    if s.returncode != 0:
        # A file the reader refuses is refused by export too, with the same line.
        e = run_cli("export", "-o", str(tmp_path / "x"), str(path))
        assert e.returncode == 2 and e.stderr == s.stderr
        return
    summ = json.loads(s.stdout)["files"][0]
    d = export(tmp_path, str(path))
    con = duckdb.connect()
    t = {x["name"]: x["path"] for x in d["tables"]}
    for name in TABLES:
        n = q(con, f"SELECT count(*) FROM '{t[name]}'")[0][0]
        assert n == [x["rows"] for x in d["tables"] if x["name"] == name][0], name
        kv = dict(q(con, f"SELECT key::VARCHAR, value::VARCHAR FROM parquet_kv_metadata('{t[name]}')"))
        assert kv.get("fragscope.schema") == "fragscope.export/2", name
    f = str(path)
    # Pinned host memory: its own table, summing to summary's host figures (none without).
    host_reserved, host_allocated = q(
        con,
        f"SELECT coalesce(sum(size), 0), coalesce(sum(size) FILTER (WHERE state = 'active_allocated'), 0) "
        f"FROM '{t['host_blocks']}'",
    )[0]
    host = summ.get("host") or {}
    assert (host_reserved, host_allocated) == (host.get("reserved_bytes", 0), host.get("allocated_bytes", 0))
    for dev in summ["devices"]:
        dv = dev["device"]
        entries = q(con, f"SELECT count(*) FROM '{t['trace_events']}' WHERE device = {dv} AND file = '{f}'")[0][0]
        assert entries == dev["trace_events"], dv
        segs, reserved, nblocks = q(
            con,
            f"SELECT count(*), coalesce(sum(total_size), 0), coalesce(sum(blocks), 0) "
            f"FROM '{t['segments']}' WHERE device = {dv}",
        )[0]
        assert (segs, reserved, nblocks) == (dev["segments"], dev["reserved_bytes"], dev["blocks"]), dv
        allocated, active, blocks = q(
            con,
            f"SELECT coalesce(sum(size) FILTER (WHERE state = 'active_allocated'), 0), "
            f"coalesce(sum(size) FILTER (WHERE state <> 'inactive'), 0), count(*) "
            f"FROM '{t['blocks']}' WHERE device = {dv}",
        )[0]
        assert (allocated, active, blocks) == (dev["allocated_bytes"], dev["active_bytes"], dev["blocks"]), dv
        # Every block lies in its segment.
        outside = q(
            con,
            f"SELECT count(*) FROM '{t['blocks']}' b JOIN '{t['segments']}' s "
            f"ON b.file = s.file AND b.device = s.device AND b.segment_address = s.address "
            f"WHERE b.device = {dv} AND (b.address < s.address OR b.address + b.size > s.address + s.total_size)",
        )[0][0]
        assert outside == 0
        by_action = (dev.get("trace") or {}).get("by_action") or {}
        allocs = q(con, f"SELECT count(*) FROM '{t['trace_events']}' WHERE device = {dv} AND action = 'alloc'")[0][0]
        assert allocs == by_action.get("alloc", 0), (dv, by_action)
        paired = q(con, f"SELECT count(alloc_idx) FROM '{t['allocations']}' WHERE device = {dv}")[0][0]
        assert paired == allocs
        # An allocation's frees come after it, at its address.
        bad = q(
            con,
            f"SELECT count(*) FROM '{t['allocations']}' a JOIN '{t['trace_events']}' e "
            f"ON e.device = a.device AND e.idx = a.free_completed_idx "
            f"WHERE a.device = {dv} AND (e.action <> 'free_completed' OR e.addr <> a.addr "
            f"OR (a.alloc_idx IS NOT NULL AND e.idx <= a.alloc_idx))",
        )[0][0]
        assert bad == 0
        # Roles: the allocations' role column sums to summary's roles (blocks and bytes
        # each role's evidence counts, each block once).
        roles = dev.get("roles")
        got = {
            r: (n, b)
            for r, n, b in q(
                con,
                f"SELECT role, count(*), sum(requested_size) FROM '{t['allocations']}' "
                f"WHERE device = {dv} AND role IS NOT NULL GROUP BY role",
            )
        }
        if roles is None:
            assert got == {}, dv
        else:
            want = {
                r: (x["blocks"], sum(e["bytes"] for e in x["evidence"]))
                for r, x in roles["by_role"].items()
                if x["blocks"] > 0
            }
            assert got == want, dv
            unknown = q(con, f"SELECT count(*) FROM '{t['allocations']}' WHERE device = {dv} AND role IS NULL")[0][0]
            assert unknown <= allocs // 100 + 5, (dv, unknown)
    # Stacks and frames: every referenced id resolves.
    for name in ("trace_events", "allocations", "segments", "blocks"):
        missing = q(
            con,
            f"SELECT count(*) FROM '{t[name]}' x WHERE x.stack_id IS NOT NULL AND NOT EXISTS "
            f"(SELECT 1 FROM '{t['stacks']}' s WHERE s.file = x.file AND s.stack_id = x.stack_id)",
        )[0][0]
        assert missing == 0, name
    missing = q(
        con,
        f"SELECT count(*) FROM '{t['stacks']}' s WHERE s.frame_id IS NOT NULL AND NOT EXISTS "
        f"(SELECT 1 FROM '{t['frames']}' f WHERE f.file = s.file AND f.frame_id = s.frame_id)",
    )[0][0]
    assert missing == 0
    stages = {r[0] for r in q(con, f"SELECT DISTINCT stage FROM '{t['annotations']}'")}
    assert stages <= {"START", "END"} or stages == set()


def test_several_files_and_a_window(tmp_path):
    files = [p for p in real_files() if p.suffix in (".pickle", ".pkl")][:6]
    traced = []
    for p in files:
        s = run_cli("summary", "--json", str(p))
        if s.returncode == 0:
            devs = json.loads(s.stdout)["files"][0]["devices"]
            if devs and devs[0]["trace_events"] >= 10 and devs[0]["device"] == 0:
                traced.append((p, devs[0]["trace_events"]))
    if len(traced) < 2:
        pytest.skip("fewer than two real traced snapshots found")
    (a, na), (b, nb) = traced[:2]
    d = export(tmp_path, str(a), str(b))
    con = duckdb.connect()
    t = {x["name"]: x["path"] for x in d["tables"]}
    rows = dict(q(con, f"SELECT file, count(*) FROM '{t['trace_events']}' WHERE device = 0 GROUP BY file"))
    assert rows == {str(a): na, str(b): nb}
    # A window: only its entries, and the state at its end (summary of the same window).
    w = f"0..{na // 2}"
    d = export(tmp_path / "w", "--window", w, str(a))
    assert d["files"][0]["window"]["spec"] == w
    t = {x["name"]: x["path"] for x in d["tables"]}
    assert q(con, f"SELECT count(*) FROM '{t['trace_events']}' WHERE device = 0")[0][0] == na // 2
    sw = json.loads(run_cli("summary", "--json", "--window", w, str(a)).stdout)["files"][0]["devices"][0]
    got = q(con, f"SELECT coalesce(sum(total_size), 0) FROM '{t['segments']}' WHERE device = 0")[0][0]
    assert got == sw["reserved_bytes"]
