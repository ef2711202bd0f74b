"""The pytest plugin: limit logic on real snapshots and stat dicts, and its pass / fail /
skip paths through pytester. The pass and fail runs use a FAKE torch module (see
fake_torch.py) whose `_snapshot()` returns a real snapshot: no GPU is involved, so the
plugin's real-GPU path is not exercised here."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

import fragscope
from fragscope.pytest_plugin import evaluate, evaluate_stats, marker_errors
import fake_torch
from conftest import real_file

HERE = Path(__file__).resolve().parent
# A real snapshot over 1 GiB reserved (2.7 GiB), in the repository and the corpus.
SNAP_NAME = "effdl-aphelack-customfsdp-4gpu.pickle"


def need(name: str) -> Path:
    return real_file(name)


# --- the limit logic ------------------------------------------------------------------


def test_evaluate_real_snapshot_against_check():
    snap = fragscope.load(need(SNAP_NAME))
    figures = snap.check().to_dict()["devices"]
    top_reserved = max(d["peak_reserved"] for d in figures)
    assert evaluate(snap, {"max_reserved": top_reserved}).ok
    v = evaluate(snap, {"max_reserved": top_reserved - 1})
    assert not v.ok and len(v.lines) == 1 and "peak reserved" in v.lines[0]
    # The failure names the call sites holding the most at the peak, as analyze lists them.
    first_site = snap.analyze().to_dict()["files"][0]["devices"][0]["peaks"]["allocated_peak"]["sites"][0]["site"]
    assert v.sites and any(first_site in s for s in v.sites)
    assert first_site in v.message()
    # Sizes as strings go through the CLI's parser.
    assert not evaluate(snap, {"max_allocated": "1GiB"}).ok
    assert evaluate(snap, {"max_allocated": "1TiB", "max_peak_fragmentation": "50%"}).ok
    frag = max(d["peak_fragmentation"] for d in figures)
    assert not evaluate(snap, {"max_peak_fragmentation": frag / 2}).ok
    with pytest.raises(fragscope.ArgumentError, match="max_reserve"):
        evaluate(snap, {"max_reserve": 1})
    with pytest.raises(fragscope.FragscopeError):
        evaluate(snap, {"max_reserved": "lots"})


def test_evaluate_growth_on_the_leaking_example():
    """The built-in example leaks at one call site; max_growth catches it."""
    snap = fragscope.example()
    growth = max(s["growth_bytes_per_step"] for d in snap.analyze().to_dict()["files"][0]["devices"]
                 for s in d["leak_suspects"])
    assert evaluate(snap, {"max_growth": growth}).ok
    v = evaluate(snap, {"max_growth": growth - 1})
    assert not v.ok and "step-to-step growth" in v.lines[0] and "max_growth" in v.lines[0]


def test_evaluate_stats():
    stats = {"reserved_bytes.all.peak": 10 << 30, "allocated_bytes.all.peak": 6 << 30}
    assert evaluate_stats(stats, {"max_reserved": "10GiB", "max_allocated": "6GiB", "max_peak_fragmentation": 0.5}).ok
    v = evaluate_stats(stats, {"max_reserved": "8GiB", "max_peak_fragmentation": "30%"})
    assert not v.ok
    assert v.lines == ["peak reserved 10.00 GiB exceeds max_reserved 8.00 GiB",
                       "peak fragmentation 0.4000 exceeds max_peak_fragmentation 0.3000"]
    assert evaluate_stats({}, {"max_reserved": 1}).ok


def test_old_limit_name_still_accepted_with_a_warning():
    """``max_fragmentation`` was renamed ``max_peak_fragmentation`` (the metric it limits)."""
    stats = {"reserved_bytes.all.peak": 10 << 30, "allocated_bytes.all.peak": 6 << 30}
    with pytest.warns(DeprecationWarning, match="max_peak_fragmentation"):
        v = evaluate_stats(stats, {"max_fragmentation": "30%"})
    assert v.lines == ["peak fragmentation 0.4000 exceeds max_peak_fragmentation 0.3000"]
    with pytest.warns(DeprecationWarning):
        assert marker_errors((), {"max_fragmentation": 0.2}) == []
    with pytest.warns(DeprecationWarning):
        assert marker_errors((), {"max_fragmentation": 0.2, "max_peak_fragmentation": 0.2}) == [
            "cuda_memory: give max_peak_fragmentation or max_fragmentation (its old name), not both"]


# --- pytester: skip, pass, fail -------------------------------------------------------

MARKED = """
import pytest

@pytest.mark.cuda_memory(max_reserved={limit!r})
def test_marked():
    pass

def test_unmarked():
    pass
"""


def fake_conftest(pytester, cuda=True):
    pytester.makeconftest(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(HERE)!r})
        import fake_torch
        fake_torch.install(snapshot_file={str(need(SNAP_NAME))!r}, cuda={cuda!r})
    """))


@pytest.mark.parametrize(
    "torch_kind, says",
    [("absent", "*fragscope: *::test_marked: fragscope.torch needs PyTorch*cuda_memory limits of this test were not checked*"),
     ("fake-without-cuda", "*fragscope: *::test_marked: CUDA is not available*cuda_memory limits of this test were not checked*")],
)
def test_plugin_skips_without_cuda_and_says_so(pytester, monkeypatch, torch_kind, says):
    if torch_kind == "absent":
        monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` fails, as without PyTorch
    else:
        need(SNAP_NAME)
        fake_conftest(pytester, cuda=False)
    pytester.makepyfile(MARKED.format(limit="1GiB"))
    r = pytester.runpytest_inprocess("-rs")
    r.assert_outcomes(passed=1, skipped=1)
    r.stdout.fnmatch_lines([says])
    # The skip names the test (pytest would otherwise group every skip under the plugin's line).
    r.stdout.fnmatch_lines(["SKIPPED*fragscope: test_plugin_skips_without_cuda_and_says_so.py::test_marked: *"])


@pytest.mark.parametrize(
    "marker, says",
    [
        ("max_reserve='1GiB'", "*test_marked: cuda_memory: unknown limit(s) max_reserve; known: max_reserved*"),
        ("max_reserved='12 parsecs'", "*test_marked: cuda_memory: max_reserved='12 parsecs': *"),
        ("max_peak_fragmentation='lots'", "*test_marked: cuda_memory: max_peak_fragmentation='lots': *"),
        ("'1GiB'", "*test_marked: cuda_memory: takes keyword limits only*"),
    ],
    ids=["unknown-name", "bad-size", "bad-fraction", "positional"],
)
def test_plugin_checks_markers_at_collection_without_cuda(pytester, monkeypatch, marker, says):
    """A typo in a marker stops the run at collection on a CPU-only machine, before any test."""
    monkeypatch.setitem(sys.modules, "torch", None)
    pytester.makepyfile(f"""
import pytest

@pytest.mark.cuda_memory({marker})
def test_marked():
    pass

def test_unmarked():
    pass
""")
    r = pytester.runpytest_inprocess()
    assert r.ret == pytest.ExitCode.USAGE_ERROR, r.stdout.str()
    r.stderr.fnmatch_lines(["*fragscope: bad cuda_memory marker(s):*", says])
    r.assert_outcomes()  # nothing ran


def test_plugin_runs_the_body_without_cuda_when_asked(pytester, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    pytester.makepyfile("""
import pytest

@pytest.mark.cuda_memory(max_reserved="1GiB")
def test_marked_passes():
    pass

@pytest.mark.cuda_memory(max_reserved="1GiB")
def test_marked_fails():
    assert 1 + 1 == 3
""")
    r = pytester.runpytest_inprocess("--fragscope-without-cuda=run")
    # The bodies ran: one passed, one failed on its own assertion.
    r.assert_outcomes(passed=1, failed=1)
    r.stdout.fnmatch_lines([
        "*fragscope: cuda_memory limits NOT checked*",
        "*::test_marked_passes: body run without the memory check (fragscope.torch needs PyTorch*",
    ])
    # The same through the ini option.
    pytester.makeini("[pytest]\nfragscope_without_cuda = run\n")
    r = pytester.runpytest_inprocess()
    r.assert_outcomes(passed=1, failed=1)


def test_plugin_passes_within_limits_fake_torch(pytester):
    need(SNAP_NAME)
    fake_conftest(pytester)
    pytester.makepyfile(MARKED.format(limit="1TiB"))
    r = pytester.runpytest_inprocess()
    r.assert_outcomes(passed=2)
    calls = [c[0] for c in fake_torch.LAST.calls]
    # Recording was started, the snapshot taken, and recording stopped again.
    assert calls.count("_record_memory_history") == 2 and "_snapshot" in calls
    assert fake_torch.LAST.calls[-1][:2] == ("_record_memory_history", None)


def test_plugin_fails_over_limit_names_sites_and_keeps_snapshot_fake_torch(pytester, tmp_path):
    need(SNAP_NAME)
    fake_conftest(pytester)
    pytester.makepyfile(MARKED.format(limit="1GiB"))
    first_site = fragscope.load(need(SNAP_NAME)).analyze().to_dict()["files"][0]["devices"][0]["peaks"]["allocated_peak"]["sites"][0]["site"]
    keep = tmp_path / "kept"
    r = pytester.runpytest_inprocess(f"--fragscope-keep-snapshots={keep}")
    r.assert_outcomes(passed=1, failed=1)
    r.stdout.fnmatch_lines([
        "*fragscope: CUDA memory limit exceeded:*",
        "*peak reserved * on device 0 exceeds max_reserved 1024.00 MiB*",
        "*top call sites at the allocated peak:*",
        f"*{first_site}*",
        "*snapshot kept:*",
    ])
    kept = list(keep.glob("*.pickle"))
    assert len(kept) == 1
    # The kept snapshot is the one the test saw.
    assert fragscope.load(kept[0]).summary().to_dict()["files"][0]["devices"] == \
        fragscope.load(need(SNAP_NAME)).summary().to_dict()["files"][0]["devices"]


def test_plugin_marker_is_registered(pytester):
    r = pytester.runpytest_inprocess("--markers")
    r.stdout.fnmatch_lines(["*@pytest.mark.cuda_memory(max_reserved=None*"])
