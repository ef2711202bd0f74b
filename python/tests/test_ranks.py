"""analyze_many: one snapshot per rank on every core, and the cross-rank summary."""

from __future__ import annotations

import json
import statistics

import pytest

import fragscope
from conftest import HAS_CORPUS, TRACES, real_pickles

RANKS = real_pickles()


@pytest.fixture(scope="module")
def summary():
    assert RANKS, f"no real snapshots in {TRACES}"
    return fragscope.analyze_many(RANKS)


def test_each_rank_is_the_files_analysis(summary):
    assert len(summary.analyses) == len(RANKS)
    for path, a in zip(RANKS, summary.analyses):
        assert a is not None
        assert a.to_json() == fragscope.load(str(path)).analyze().to_json(), path.name


def test_peak_rank_median_and_excess(summary):
    # Independently, from `fragscope check`'s per-device peaks.
    peaks = [max((d["peak_reserved"] for d in fragscope.load(p).check().to_dict()["devices"]), default=0) for p in RANKS]
    assert [r["peak_reserved"] for r in summary.ranks] == peaks
    assert summary.peak_rank == peaks.index(max(peaks))
    assert summary.median_peak_reserved == statistics.median(peaks)
    assert summary.excess_over_median == max(peaks) - statistics.median(peaks)
    # Known from the files (SOURCES.md): the largest reserved peak of each set.
    peak_file = "codeloc-qwen3-gnn-expandable-oom-3gpu.pickle" if HAS_CORPUS else "verl-megatron-vllm-qwen2-private-pools-stateonly.pickle"
    assert RANKS[summary.peak_rank].name == peak_file


def test_oom_ranks(summary, tmp_path):
    expected = [i for i, a in enumerate(summary.analyses)
                if any(d["oom"] for d in a.to_dict()["files"][0]["devices"])]
    assert summary.oom_ranks == expected
    for i in expected:
        devices = summary.analyses[i].to_dict()["files"][0]["devices"]
        assert summary.ranks[i]["oom"] == next(d["oom"]["verdict"] for d in devices if d["oom"])
    # A rank that ran out of memory (the built-in example ends in an OOM; the in-repository
    # real files have no OOM trace entry) among real ones.
    oom = tmp_path / "oom-rank.pickle"
    fragscope.example().save(oom)
    paths = [RANKS[0], oom, RANKS[-1]]
    s = fragscope.analyze_many(paths)
    verdict = next(d["oom"]["verdict"] for d in fragscope.load(oom).analyze().to_dict()["files"][0]["devices"] if d["oom"])
    assert 1 in s.oom_ranks and s.ranks[1]["oom"] == verdict
    assert s.oom_ranks == [i for i, p in enumerate(paths)
                           if any(d["oom"] for d in fragscope.load(p).analyze().to_dict()["files"][0]["devices"])]
    if HAS_CORPUS:
        assert expected, "the corpus includes an OOM"


def test_sites_explain_the_excess(summary):
    assert summary.sites, "the peak rank holds more than the median rank somewhere"
    excess = [s["excess"] for s in summary.sites]
    assert excess == sorted(excess, reverse=True) and all(e > 0 for e in excess)
    peak = summary.analyses[summary.peak_rank].to_dict()["files"][0]
    dev = next(d for d in peak["devices"] if d["device"] == summary.ranks[summary.peak_rank]["device"])
    held = {s["site"]: s["bytes"] for s in dev["peaks"]["allocated_peak"]["sites"]}
    for s in summary.sites:
        assert held[s["site"]] == s["bytes"]
        assert s["excess"] == s["bytes"] - s["median_rank_bytes"]
    d = json.loads(summary.to_json())
    assert d["schema"] == "fragscope.ranks/1" and d["peak_rank"] == summary.peak_rank
    assert "<table>" in summary._repr_html_()


def test_unreadable_rank_is_reported_not_raised(tmp_path):
    assert RANKS, f"no real snapshots in {TRACES}"
    bad = tmp_path / "rank1.pickle"
    bad.write_bytes(b"\x80\x04garbage")
    s = fragscope.analyze_many([RANKS[0], bad, RANKS[1]], threads=2)
    assert s.ranks[1]["error"] and s.ranks[1]["error"].startswith(str(bad))
    with pytest.raises(fragscope.FragscopeError) as e:
        fragscope.load(bad)
    assert s.ranks[1]["error"] == str(e.value)
    assert s.analyses[1] is None and s.analyses[0] is not None and s.analyses[2] is not None
    assert s.peak_rank in (0, 2)
    # The repr says which rank could not be read (a summary must not hide a failed rank).
    assert repr(s).endswith("unreadable ranks [1]>"), repr(s)


def test_thread_count_does_not_change_results():
    assert RANKS, f"no real snapshots in {TRACES}"
    few = RANKS[:6]
    one = fragscope.analyze_many(few, threads=1)
    every = fragscope.analyze_many(few, threads=0)
    assert [a.to_json() for a in one.analyses] == [a.to_json() for a in every.analyses]
    assert one.to_dict() == every.to_dict()


def test_analyze_file_is_analyze_many_per_file(tmp_path):
    assert RANKS, f"no real snapshots in {TRACES}"
    bad = tmp_path / "bad.pickle"
    bad.write_bytes(b"")
    paths = [str(RANKS[0]), str(bad), str(RANKS[-1])]
    outcomes = [fragscope.analyze_file(p) for p in paths]
    assert fragscope.RankSummary(paths, outcomes).to_dict() == fragscope.analyze_many(paths).to_dict()


def test_dask_local_cluster():
    """The documented way past one machine: analyze_file as Dask tasks."""
    distributed = pytest.importorskip("dask.distributed", reason="dask[distributed] not installed: Dask path not tested")
    assert RANKS, f"no real snapshots in {TRACES}"
    paths = [str(p) for p in RANKS[:6]]
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as cluster:
        with distributed.Client(cluster) as client:
            futures = client.map(fragscope.analyze_file, paths, pure=False)
            ranks = fragscope.RankSummary(paths, client.gather(futures))
    assert ranks.to_dict() == fragscope.analyze_many(paths).to_dict()
