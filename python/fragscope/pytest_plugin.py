"""fragscope's pytest plugin: CUDA memory limits per test (registered through ``pytest11``).

Mark a test::

    @pytest.mark.cuda_memory(max_reserved="2GiB", max_allocated="1.5GiB",
                             max_peak_fragmentation=0.2, max_growth="64MiB")
    def test_train_step(): ...

The test runs with allocator history recorded (bounded, Python stacks); afterwards the
snapshot is checked with the same gate as ``fragscope check`` (peak reserved / allocated,
peak fragmentation ``1 - allocated / reserved``) and ``max_growth`` against the largest
step-to-step growth of a call site (the leak suspects of ``fragscope analyze``). A test
over a limit fails with the limit, the measured value and the top call sites at the peak.
``--fragscope-keep-snapshots=DIR`` keeps the snapshot of each failing test. Growth across
steps needs two steps or more in the trace (optimizer steps, backward passes, or steps
marked with ``fragscope.torch.phase("step")``); where the trace cannot tell, ``max_growth``
is listed at the end as not checked, with the reason.

The marker's arguments are checked when the tests are collected, on every machine (a
CPU-only CI run too): an unknown limit name or a size that does not parse stops the run
with one line per bad marker, before any test runs.

Without torch or CUDA a marked test is skipped; the skip names the test and says why.
``--fragscope-without-cuda=run`` (or the ini option ``fragscope_without_cuda = run``) runs
the test body anyway, without the memory check, and lists those tests at the end. The limit
logic itself is :func:`evaluate` (on a :class:`fragscope.Snapshot`) and
:func:`evaluate_stats` (on a ``torch.cuda.memory_stats()`` dict), usable without pytest.
"""

from __future__ import annotations

import os
import re
import warnings
from dataclasses import dataclass, field
from typing import Any, Dict, Generator, List, Optional, Sequence, Tuple, Union

import pytest

import fragscope

MARKER = "cuda_memory"
LIMIT_NAMES = ("max_reserved", "max_allocated", "max_peak_fragmentation", "max_growth")
# Names a limit had before; still accepted, with a DeprecationWarning.
RENAMED = {"max_fragmentation": "max_peak_fragmentation"}


def _renamed(limits: Dict[str, Any]) -> Dict[str, Any]:
    """``limits`` with old limit names replaced by their current ones (and a warning)."""
    out = {}
    for k, v in limits.items():
        new = RENAMED.get(k)
        if new is not None:
            warnings.warn(f"cuda_memory: {k} is now called {new}", DeprecationWarning, stacklevel=3)
            if new in limits:
                raise fragscope.ArgumentError(f"cuda_memory: give {new} or {k} (its old name), not both")
            k = new
        out[k] = v
    return out


@dataclass
class Verdict:
    """Whether a test stayed within its limits; ``lines`` name each broken limit,
    ``sites`` the top call sites at the allocated peak (``"site: bytes"``), ``unchecked``
    each limit that the snapshot could not tell (``max_growth`` on a device whose trace
    has fewer than two steps: why, and how to record one that can)."""

    ok: bool
    lines: List[str] = field(default_factory=list)
    sites: List[str] = field(default_factory=list)
    unchecked: List[str] = field(default_factory=list)

    def message(self) -> str:
        out = ["fragscope: CUDA memory limit exceeded:"] + [f"  {line}" for line in self.lines]
        if self.sites:
            out.append("  top call sites at the allocated peak:")
            out += [f"    {s}" for s in self.sites]
        return "\n".join(out)


def _parsed(limits: Dict[str, Any]) -> Dict[str, Any]:
    """Sizes (``2GiB``, ``2GB``, bytes) and fractions (``0.2``, ``20%``) parsed by the Rust
    parser ``fragscope check`` uses: the limits a check on the built-in example reports."""
    sized = {k: limits.get(k) for k in ("max_reserved", "max_allocated")}
    got = fragscope.example().check(max_peak_fragmentation=limits.get("max_peak_fragmentation"), **sized).to_dict()["limits"]
    growth = limits.get("max_growth")
    if growth is not None:
        got["max_growth"] = fragscope.example().check(max_reserved=growth).to_dict()["limits"]["max_reserved"]
    return got


def _fmt(n: float) -> str:
    return fragscope._fmt_bytes(int(n))


def evaluate(snap: "fragscope.Snapshot", limits: Dict[str, Any], top: int = 5) -> Verdict:
    """Checks a snapshot against ``limits`` (any of :data:`LIMIT_NAMES`)."""
    limits = _renamed(limits)
    unknown = set(limits) - set(LIMIT_NAMES)
    if unknown:
        raise fragscope.ArgumentError(
            f"unknown cuda_memory limit(s): {', '.join(sorted(unknown))}; known: {', '.join(LIMIT_NAMES)}"
        )
    lines: List[str] = []
    gate = snap.check(
        max_reserved=limits.get("max_reserved"),
        max_allocated=limits.get("max_allocated"),
        max_peak_fragmentation=limits.get("max_peak_fragmentation"),
    )
    for f in gate.to_dict()["failures"]:
        lines.append(_failure_text(f))
    analysis = snap.analyze(top=top).to_dict()["files"][0]
    unchecked: List[str] = []
    if limits.get("max_growth") is not None:
        allowed = _parsed(limits)["max_growth"]
        for d in analysis["devices"]:
            for s in d["leak_suspects"]:
                if s["growth_bytes_per_step"] > allowed:
                    lines.append(
                        f"step-to-step growth {_fmt(s['growth_bytes_per_step'])}/step of "
                        f"{s['site']} on device {d['device']} exceeds max_growth {_fmt(allowed)}"
                    )
        # Devices whose growth across steps cannot be told (one step or none): the limit
        # was not checked there, and the test must not pass silently as if it had been.
        # A device the test allocated nothing on (no trace entry) did not grow.
        # (The analysis counts each device's trace entries itself: no summary needed.)
        for d in analysis["devices"]:
            steps = d.get("leak_steps") or {}
            events = ((d.get("fragmentation") or {}).get("timeline") or {}).get("events", 0)
            if not steps.get("can_tell", True) and events:
                why = steps.get("reason") or "leaks cannot be told from this trace"
                unchecked.append(f"max_growth not checked on device {d['device']}: {why}")
    sites: List[str] = []
    if lines:
        for d in analysis["devices"]:
            for s in d["peaks"]["allocated_peak"]["sites"][:top]:
                sites.append(f"device {d['device']}: {s['site']}: {_fmt(s['bytes'])} ({s['share']:.1%})")
    return Verdict(ok=not lines, lines=lines, sites=sites, unchecked=unchecked)


def _failure_text(f: Dict[str, Any]) -> str:
    """A ``fragscope check`` failure (its JSON) as one line."""
    what = {"max_reserved": "peak reserved", "max_allocated": "peak allocated", "max_peak_fragmentation": "peak fragmentation"}
    name = f["limit"]
    show = _fmt if name in ("max_reserved", "max_allocated") else (lambda v: f"{v:.4f}")
    return f"{what.get(name, name)} {show(f['measured'])} on device {f['device']} exceeds {name} {show(f['allowed'])}"


def evaluate_stats(stats: Dict[str, Any], limits: Dict[str, Any]) -> Verdict:
    """Checks a ``torch.cuda.memory_stats()`` dict (peaks since the last
    ``reset_peak_memory_stats``) against ``max_reserved`` / ``max_allocated`` /
    ``max_peak_fragmentation``: the cheap check when no history was recorded. ``max_growth``
    needs a snapshot's trace and is not checked here."""
    lim = _parsed(_renamed(limits))
    lines = []
    reserved = int(stats.get("reserved_bytes.all.peak", 0))
    allocated = int(stats.get("allocated_bytes.all.peak", 0))
    if lim["max_reserved"] is not None and reserved > lim["max_reserved"]:
        lines.append(f"peak reserved {_fmt(reserved)} exceeds max_reserved {_fmt(lim['max_reserved'])}")
    if lim["max_allocated"] is not None and allocated > lim["max_allocated"]:
        lines.append(f"peak allocated {_fmt(allocated)} exceeds max_allocated {_fmt(lim['max_allocated'])}")
    if lim["max_peak_fragmentation"] is not None and reserved:
        frag = 1.0 - allocated / reserved
        if frag > lim["max_peak_fragmentation"]:
            lines.append(f"peak fragmentation {frag:.4f} exceeds max_peak_fragmentation {lim['max_peak_fragmentation']:.4f}")
    return Verdict(ok=not lines, lines=lines)


def marker_errors(args: Sequence[Any], kwargs: Dict[str, Any]) -> List[str]:
    """What is wrong with a ``cuda_memory(*args, **kwargs)`` marker (empty: nothing):
    positional arguments, unknown limit names, values that do not parse."""
    errors = []
    if args:
        errors.append(f"takes keyword limits only ({', '.join(LIMIT_NAMES)}), got positional {args!r}")
    try:
        kwargs = _renamed(kwargs)
    except fragscope.FragscopeError as e:
        return errors + [str(e)]
    unknown = sorted(set(kwargs) - set(LIMIT_NAMES))
    if unknown:
        errors.append(f"unknown limit(s) {', '.join(unknown)}; known: {', '.join(LIMIT_NAMES)}")
    known = {k: v for k, v in kwargs.items() if k in LIMIT_NAMES}
    for name, value in known.items():
        try:
            _parsed({name: value})
        except (fragscope.FragscopeError, TypeError, ValueError) as e:
            errors.append(f"{name}={value!r}: {e}")
    return errors


def pytest_collection_modifyitems(session: Any, config: Any, items: List[Any]) -> None:
    """Checks every cuda_memory marker at collection, whether or not CUDA is here."""
    bad = []
    for item in items:
        for marker in item.iter_markers(MARKER):
            for e in marker_errors(marker.args, marker.kwargs):
                bad.append(f"{item.nodeid}: {MARKER}: {e}")
    if bad:
        raise pytest.UsageError("fragscope: bad cuda_memory marker(s):\n  " + "\n  ".join(bad))


def pytest_addoption(parser: Any) -> None:
    group = parser.getgroup("fragscope", "CUDA memory limits (fragscope)")
    group.addoption(
        "--fragscope-without-cuda",
        choices=("skip", "run"),
        default=None,
        help="what a cuda_memory test does without torch or CUDA: skip it (default), or run its "
        "body without the memory check (listed at the end). Ini: fragscope_without_cuda",
    )
    parser.addini(
        "fragscope_without_cuda",
        "skip (default) or run: cuda_memory tests without torch or CUDA",
        default="skip",
    )
    group.addoption(
        "--fragscope-keep-snapshots",
        metavar="DIR",
        default=None,
        help="write the CUDA memory snapshot of each test that breaks a cuda_memory limit to DIR",
    )
    group.addoption(
        "--fragscope-max-entries",
        type=int,
        default=100_000,
        help="allocator history entries recorded per marked test (default 100000)",
    )


def pytest_configure(config: Any) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(max_reserved=None, max_allocated=None, max_peak_fragmentation=None, max_growth=None): "
        "fail the test when its CUDA memory breaks a limit (fragscope); skipped without CUDA",
    )


def _cuda_torch() -> Any:
    from fragscope.torch import CudaUnavailable, _torch

    try:
        return _torch(), None
    except CudaUnavailable as e:
        return None, str(e)


# Limits not checked, per session config: (test id, what and why). The bodies run without
# CUDA (--fragscope-without-cuda=run), and max_growth where the trace cannot tell it.
_UNCHECKED: Dict[Any, List[Tuple[str, str]]] = {}


def pytest_terminal_summary(terminalreporter: Any, exitstatus: Any, config: Any) -> None:
    ran = _UNCHECKED.pop(config, [])
    if ran:
        terminalreporter.section("fragscope: cuda_memory limits NOT checked")
        for nodeid, what in ran:
            terminalreporter.write_line(f"{nodeid}: {what}")


def _memory_check(item: Any) -> Generator[None, Any, Any]:
    """The check around one test's call, a generator that yields once, where the test runs.

    Sent the test's result, it checks the snapshot and returns the result, or raises
    ``pytest.fail`` when a limit is broken. Thrown the test's own exception, it stops
    recording and lets that exception through untouched: a test that failed by itself
    shows its own error, not a memory verdict. Before the yield it raises ``pytest.skip``
    (no torch or CUDA, unless ``--fragscope-without-cuda=run``)."""
    marker = item.get_closest_marker(MARKER)
    if marker is None:
        return (yield)
    limits = dict(marker.kwargs)
    torch, why = _cuda_torch()
    if torch is None:
        mode = item.config.getoption("--fragscope-without-cuda") or item.config.getini("fragscope_without_cuda")
        if mode == "run":
            _UNCHECKED.setdefault(item.config, []).append((item.nodeid, f"body run without the memory check ({why})"))
            return (yield)
        pytest.skip(f"fragscope: {item.nodeid}: {why}; the {MARKER} limits of this test were not checked")
    max_entries = item.config.getoption("--fragscope-max-entries")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks="python", max_entries=max_entries)
    try:
        result = yield  # raises the test's own exception, which goes on up untouched
        torch.cuda.synchronize()
        data = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    snap = fragscope.from_dict(data, name=item.nodeid)
    verdict = evaluate(snap, limits)
    for what in verdict.unchecked:
        _UNCHECKED.setdefault(item.config, []).append((item.nodeid, what))
    if verdict.ok:
        return result
    msg = verdict.message()
    keep = item.config.getoption("--fragscope-keep-snapshots")
    if keep:
        os.makedirs(keep, exist_ok=True)
        path = os.path.join(keep, re.sub(r"[^A-Za-z0-9_.-]+", "_", item.nodeid) + ".pickle")
        snap.save(path)
        msg += f"\n  snapshot kept: {path} (fragscope analyze {path})"
    pytest.fail(msg, pytrace=False)


def _new_style_wrappers() -> bool:
    """Whether this pytest's pluggy has new-style hook wrappers (``wrapper=True``: pluggy
    1.2, which pytest 8 requires; a pytest 7 may have it)."""
    try:
        pytest.hookimpl(wrapper=True)
    except TypeError:
        return False
    return True


if _new_style_wrappers():

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(item: Any) -> Generator[None, Any, Any]:
        # A limit broken raises pytest.fail from the wrapper: the test fails cleanly (an
        # old-style hookwrapper raising in its teardown gets PluggyTeardownRaisedWarning).
        return (yield from _memory_check(item))

else:  # pragma: no cover - pluggy < 1.2 (pytest 7 and older): the old-style hookwrapper

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(item: Any) -> Generator[None, Any, None]:
        check = _memory_check(item)
        next(check)  # pytest.skip, before the test runs
        outcome = yield
        try:
            if outcome.excinfo is None:
                check.send(outcome.get_result())
            else:
                check.throw(outcome.excinfo[1])
        except StopIteration:
            pass
        except BaseException as e:
            if outcome.excinfo is not None and e is outcome.excinfo[1]:
                return  # the test failed by itself; the outcome keeps its error
            if hasattr(outcome, "force_exception"):  # pluggy 1.1
                outcome.force_exception(e)
            else:
                raise
