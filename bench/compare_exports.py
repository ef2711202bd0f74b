#!/usr/bin/env python3
"""Every table of two `fragscope export` folders holds the same rows in the same order,
whatever the files' bytes (encodings, statistics): each table read by DuckDB with each
row's position in its file, and the rows of each side that the other lacks counted
(`EXCEPT ALL`, both ways). Exit status 1 when any count is not zero.

usage: compare_exports.py OLD_DIR NEW_DIR   (needs `duckdb`: python/requirements-test.txt)
"""
import sys, duckdb
a, b = sys.argv[1], sys.argv[2]
con = duckdb.connect()
bad = 0
for t in ["trace_events", "allocations", "segments", "blocks", "stacks", "frames", "annotations"]:
    ra = f"read_parquet('{a}/{t}.parquet', file_row_number=true)"
    rb = f"read_parquet('{b}/{t}.parquet', file_row_number=true)"
    na = con.sql(f"select count(*) from {ra}").fetchall()[0][0]
    nb = con.sql(f"select count(*) from {rb}").fetchall()[0][0]
    d1 = con.sql(f"select count(*) from (select * from {ra} except all select * from {rb})").fetchall()[0][0]
    d2 = con.sql(f"select count(*) from (select * from {rb} except all select * from {ra})").fetchall()[0][0]
    print(f"{t}: rows {na} / {nb}, only in first {d1}, only in second {d2}")
    bad += (na != nb) + d1 + d2
sys.exit(1 if bad else 0)
