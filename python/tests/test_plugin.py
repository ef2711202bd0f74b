"""The pytest plugin: limit logic on real snapshots and stat dicts, and its pass / fail /
skip paths through pytester. The pass and fail runs use a FAKE torch module (see
fake_torch.py) whose `_snapshot()` returns a real snapshot: no GPU is involved, so the
plugin's real-GPU path is not exercised here."""

from __future__ import annotations

import pickle
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


MiB = 2**20
PYTEST_FRAMES = [  # pytest's and pluggy's frames under a test function (innermost first)
    ("/venv/lib/python3.12/site-packages/_pytest/python.py", 157, "pytest_pyfunc_call"),
    ("/venv/lib/python3.12/site-packages/pluggy/_callers.py", 121, "_multicall"),
    ("/venv/lib/python3.12/site-packages/pluggy/_manager.py", 120, "_hookexec"),
    ("/venv/lib/python3.12/site-packages/pluggy/_hooks.py", 512, "__call__"),
    ("/venv/lib/python3.12/site-packages/_pytest/python.py", 1671, "runtest"),
    ("/venv/lib/python3.12/site-packages/_pytest/runner.py", 178, "pytest_runtest_call"),
    ("/venv/lib/python3.12/site-packages/_pytest/main.py", 367, "pytest_runtestloop"),
    ("/venv/lib/python3.12/site-packages/pytest/__main__.py", 9, "<module>"),
]


def steps_snapshot(steps: int = 6, leak: bool = True, annotate: bool = True) -> dict:
    """The snapshot PyTorch 2.11 records (``_record_memory_history`` at the test's start,
    ``_snapshot()`` at its end) of tests/gpu/plugin_cases.py::test_leaks: each step, inside
    ``fragscope.torch.phase("step")`` (a ``record_function("step")`` annotation), keeps a
    32 MiB tensor (``leak``; else frees it) and frees a 16 MiB temporary. Each request
    gets a segment of its size (segment_alloc, then alloc) unless a cached one fits; a
    free is free_requested then free_completed; frames are Python's, innermost first."""
    clock = [1795794375657724]
    trace: list = []
    anns: list = []
    cached: dict = {}
    live: dict = {}
    made: list = []

    def now() -> int:
        clock[0] += 7
        return clock[0]

    def frames(line: int) -> list:
        fs = [("/work/tests/test_leaky.py", line, "test_leaks")] + PYTEST_FRAMES
        return [{"filename": f, "line": n, "name": fn} for f, n, fn in fs]

    def entry(action: str, addr: int, size: int, line: int) -> None:
        trace.append({"action": action, "addr": addr, "compile_context": "N/A", "frames": frames(line),
                      "size": size, "stream": 0, "time_us": now(), "user_metadata": ""})

    def alloc(size: int, line: int) -> int:
        if cached.get(size):
            addr = cached[size].pop()
        else:
            addr = 0x7F8A00000000 + sum(s for _, s in made) + len(made) * 64 * MiB
            made.append((addr, size))
            entry("segment_alloc", addr, size, line)
        entry("alloc", addr, size, line)
        live[addr] = (size, line)
        return addr

    def free(addr: int, line: int) -> None:
        size, _ = live.pop(addr)
        entry("free_requested", addr, size, line)
        entry("free_completed", addr, size, line)
        cached.setdefault(size, []).append(addr)

    for _ in range(steps):
        if annotate:
            anns.append({"stage": "START", "name": "step", "device": 0, "time_us": now()})
        kept = alloc(32 * MiB, 31)
        free(alloc(16 * MiB, 32), 33)
        if not leak:
            free(kept, 33)
        if annotate:
            anns.append({"stage": "END", "name": "step", "device": 0, "time_us": now()})
    segments = []
    for addr, size in made:
        used, line = live.get(addr, (0, 0))
        state = "active_allocated" if used else "inactive"
        block = {"address": addr, "size": size, "requested_size": size, "state": state,
                 "frames": frames(line) if used else []}
        segments.append({"device": 0, "address": addr, "total_size": size, "allocated_size": used,
                         "active_size": used, "requested_size": used, "stream": 0, "segment_type": "large",
                         "segment_pool_id": (0, 0), "is_expandable": False, "frames": [], "blocks": [block]})
    return {"segments": segments, "device_traces": [trace], "external_annotations": anns,
            "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1, "expandable_segments": False}}


@pytest.mark.parametrize("steps", [6, 3, 2])
def test_evaluate_growth_when_a_tensor_kept_per_step_is_most_of_what_the_step_allocates(steps):
    """Regression (plugin_cases.py::test_leaks on an H200 passed): a leak that is most of
    what each annotated step allocates was read as a build-up, not a leak, and max_growth
    passed. Without an optimizer; 6, 3 and 2 steps."""
    snap = fragscope.from_dict(steps_snapshot(steps), name="leaky")
    v = evaluate(snap, {"max_growth": "8MiB"})
    assert not v.ok and v.unchecked == []
    assert v.lines == ["step-to-step growth 32.00 MiB/step of test_leaky.py:31:test_leaks on device 0 exceeds max_growth 8.00 MiB"]
    assert evaluate(snap, {"max_growth": "32MiB"}).ok
    # The same steps freeing their tensor: nothing grows.
    v = evaluate(fragscope.from_dict(steps_snapshot(steps, leak=False), name="tidy"), {"max_growth": "8MiB"})
    assert v.ok and v.lines == [] and v.unchecked == []


def test_evaluate_says_when_max_growth_cannot_be_checked():
    """No step in the trace (no annotation, optimizer or backward): the growth across steps
    cannot be told, and the verdict says so instead of passing as if it had been checked."""
    v = evaluate(fragscope.from_dict(steps_snapshot(annotate=False), name="unmarked"), {"max_growth": "8MiB"})
    assert v.ok and v.lines == []
    assert len(v.unchecked) == 1 and v.unchecked[0].startswith("max_growth not checked on device 0: ")
    assert 'fragscope.torch.phase("step")' in v.unchecked[0]
    # Other limits alone: nothing to say about max_growth.
    assert evaluate(fragscope.from_dict(steps_snapshot(annotate=False), name="unmarked"), {"max_reserved": "1GiB"}).unchecked == []


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


LEAKY = """
import pytest
import torch


@pytest.mark.cuda_memory(max_growth="8MiB")
def test_leaks():
    torch.snapshot_file = {leak!r}


@pytest.mark.cuda_memory(max_growth="8MiB")
def test_does_not_leak():
    torch.snapshot_file = {tidy!r}


@pytest.mark.cuda_memory(max_growth="8MiB")
def test_leaks_and_fails_by_itself():
    torch.snapshot_file = {leak!r}
    assert 1 + 1 == 3, "the test's own failure"


@pytest.mark.cuda_memory(max_growth="8MiB")
def test_steps_not_marked():
    torch.snapshot_file = {unmarked!r}
"""


def test_plugin_fails_a_test_that_leaks_per_step_over_max_growth_fake_torch(pytester, tmp_path):
    """A test keeping a 32 MiB tensor per ``phase("step")`` fails its max_growth of 8 MiB as
    a clean test failure: the plugin's new-style hook wrapper raises no
    PluggyTeardownRaisedWarning (an old-style hookwrapper raising after its yield did). A
    test that frees its tensors passes; a test that fails by itself shows its own error; a
    test whose trace has no steps passes and is listed as not checked."""
    files = {}
    for name, kw in {"leak": {}, "tidy": {"leak": False}, "unmarked": {"annotate": False}}.items():
        files[name] = str(tmp_path / f"{name}.pickle")
        with open(files[name], "wb") as f:
            pickle.dump(steps_snapshot(**kw), f, protocol=4)
    fake_conftest(pytester)
    pytester.makepyfile(test_leaky=LEAKY.format(**files))
    r = pytester.runpytest_inprocess("-W", "error::pytest.PytestWarning", "-rA")
    r.assert_outcomes(passed=2, failed=2)
    out = r.stdout.str()
    assert "PluggyTeardownRaisedWarning" not in out + r.stderr.str()
    assert "warnings summary" not in out
    r.stdout.fnmatch_lines([
        "*_ test_leaks _*",
        "*fragscope: CUDA memory limit exceeded:*",
        "*step-to-step growth 32.00 MiB/step of test_leaky.py:31:test_leaks on device 0 exceeds max_growth 8.00 MiB*",
        "*top call sites at the allocated peak:*",
    ])
    r.stdout.fnmatch_lines(["*_ test_leaks_and_fails_by_itself _*", "*AssertionError: the test's own failure*"])
    own = out.split("_ test_leaks_and_fails_by_itself _")[1].split("\n=")[0]
    assert "AssertionError" in own and "fragscope" not in own  # its own failure, not a memory verdict
    r.stdout.fnmatch_lines([
        "*fragscope: cuda_memory limits NOT checked*",
        "*test_leaky.py::test_steps_not_marked: max_growth not checked on device 0: no training step found*",
    ])
    assert "test_does_not_leak: max_growth not checked" not in out
    r.stdout.fnmatch_lines(["PASSED test_leaky.py::test_does_not_leak*"])
    r.stdout.fnmatch_lines(["FAILED test_leaky.py::test_leaks - Failed: fragscope: CUDA memory limit*"])
    # Recording was stopped after every marked test, the failing ones included.
    calls = [c for c in fake_torch.LAST.calls if c[0] == "_record_memory_history"]
    assert [c[1] for c in calls] == ["all", None] * 4
