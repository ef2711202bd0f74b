"""fragscope: explain CUDA out-of-memory errors and fragmentation from PyTorch memory snapshots.

The same Rust engine as the ``fragscope`` command, from Python::

    import fragscope
    snap = fragscope.load("snapshot.pickle")        # or loads(bytes), from_dict(torch.cuda.memory._snapshot())
    print(snap.analyze().devices[0].findings[0].headline)
    snap.check(max_reserved="20GiB").ok
    fragscope.analyze_many(["rank0.pickle", "rank1.pickle"]).peak_rank

Every result's ``to_json()`` is byte for byte what ``fragscope <command> --json`` prints
(the CLI and this package call the same Rust functions), ``to_dict()`` is its parsed form,
and attributes read its fields (``result.devices[0].peaks``). Errors raise
:class:`FragscopeError` (a ``ValueError``) with the CLI's one-line message. Analyses release
the GIL. Recording helpers live in :mod:`fragscope.torch` (imported on demand: torch is
optional). See docs/python.md.
"""

from __future__ import annotations

import html
import json
import os
import statistics
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from fragscope import _native
from fragscope._native import FragscopeError

__version__: str = _native.__version__

__all__ = [
    "FragscopeError",
    "Snapshot",
    "Result",
    "Summary",
    "Analysis",
    "Replay",
    "Lab",
    "Report",
    "Diff",
    "Check",
    "Prediction",
    "RankSummary",
    "load",
    "loads",
    "from_dict",
    "example",
    "analyze_many",
    "report",
    "analyze_file",
    "predict",
    "run_cli",
]

PathLike = Union[str, "os.PathLike[str]"]


class Fields:
    """Read-only attribute view of a JSON object (``f.peaks.allocated_peak.sites``)."""

    __slots__ = ("_d",)

    def __init__(self, d: Dict[str, Any]) -> None:
        object.__setattr__(self, "_d", d)

    def __getattr__(self, name: str) -> Any:
        try:
            return _wrap(self._d[name])
        except KeyError:
            raise AttributeError(f"no field {name!r}; fields: {', '.join(self._d)}") from None

    def __getitem__(self, key: str) -> Any:
        return _wrap(self._d[key])

    def __contains__(self, key: object) -> bool:
        return key in self._d

    def __dir__(self) -> List[str]:
        return list(self._d)

    def keys(self) -> Iterable[str]:
        return self._d.keys()

    def to_dict(self) -> Dict[str, Any]:
        return json.loads(json.dumps(self._d))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Fields) and other._d == self._d

    def __repr__(self) -> str:
        return f"Fields({', '.join(self._d)})"


def _wrap(v: Any) -> Any:
    if isinstance(v, dict):
        return Fields(v)
    if isinstance(v, list):
        return [_wrap(x) for x in v]
    return v


def _fmt_bytes(n: Optional[int]) -> str:
    """PyTorch's ``format_size`` (as the CLI's text prints byte figures)."""
    if n is None:
        return "—"
    for unit, limit in (("bytes", 1 << 10), ("KiB", 1 << 20), ("MiB", 1 << 30)):
        if n <= limit:
            return f"{n} bytes" if unit == "bytes" else f"{n / (limit >> 10):.2f} {unit}"
    return f"{n / (1 << 30):.2f} GiB"


def _table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>" for r in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


class Result:
    """A command's result: the CLI's ``--json`` document, with attribute access.

    Attributes read the fields of the (single) file entry for summary / analyze / replay,
    and of the document itself for diff / check.
    """

    def __init__(self, text: str) -> None:
        self._text = text
        self._data: Dict[str, Any] = json.loads(text)

    @property
    def schema(self) -> str:
        return self._data["schema"]

    def to_json(self) -> str:
        """Exactly what ``fragscope <command> --json`` prints for the same input."""
        return self._text

    def to_dict(self) -> Dict[str, Any]:
        """The parsed ``--json`` document (a fresh copy)."""
        return json.loads(self._text)

    def _body(self) -> Dict[str, Any]:
        files = self._data.get("files")
        if isinstance(files, list) and len(files) == 1:
            return files[0]
        return self._data

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        body = self._body()
        if name in body:
            return _wrap(body[name])
        if name in self._data:
            return _wrap(self._data[name])
        raise AttributeError(f"{type(self).__name__} has no field {name!r}; fields: {', '.join(body)}")

    def __dir__(self) -> List[str]:
        return sorted(set(super().__dir__()) | set(self._body()))

    def __repr__(self) -> str:
        return f"<fragscope {type(self).__name__} {self.schema} of {self._body().get('file', '?')}>"

    def _repr_html_(self) -> str:
        rows = []
        for k, v in self._body().items():
            if isinstance(v, (dict, list)):
                v = f"{type(v).__name__} of {len(v)}"
            rows.append((k, v))
        return f"<b>{html.escape(repr(self))}</b>" + _table(["field", "value"], rows)


class Summary(Result):
    """``fragscope summary --json``: memory_summary() figures and fragmentation per device."""

    def _repr_html_(self) -> str:
        rows = []
        for d in self._body().get("devices", []):
            a, f = d, d["fragmentation"]
            rows.append(
                (
                    d["device"],
                    _fmt_bytes(a["allocated_bytes"]),
                    _fmt_bytes(a["reserved_bytes"]),
                    a["segments"],
                    _fmt_bytes(f["largest_free_block_bytes"]),
                    f"{f['free_space_fragmentation']:.3f}",
                    d["trace"]["events"],
                )
            )
        heads = ["device", "allocated", "reserved", "segments", "largest free block", "free-space frag.", "events"]
        return f"<b>fragscope summary of {html.escape(self._body()['file'])}</b>" + _table(heads, rows)


class Analysis(Result):
    """``fragscope analyze --json``: OOM verdict, fragmentation, leaks, peaks, recommendations."""

    def _repr_html_(self) -> str:
        parts = [f"<b>fragscope analyze of {html.escape(self._body()['file'])}</b>"]
        if not self._body().get("devices"):
            parts.append("<p>No device has segments or trace events in this file.</p>")
        for d in self._body().get("devices", []):
            parts.append(f"<h4>Device {d['device']}</h4>")
            parts.append(_table(["severity", "finding"], [(f["severity"], f["headline"]) for f in d["findings"]]))
            sites = d["peaks"]["allocated_peak"]["sites"]
            parts.append(
                _table(
                    ["call site at the allocated peak", "bytes", "share"],
                    [(s["site"], _fmt_bytes(s["bytes"]), f"{s['share']:.1%}") for s in sites],
                )
            )
        return "".join(parts)


class Replay(Result):
    """``fragscope replay --json``: the allocator model checked (verify) and what-if runs."""


class Lab(Result):
    """``fragscope replay --allocator ... --json``: the allocator lab — each policy's peak
    reserved against the bounds no allocator beats, driver calls, and the recorded OOM."""


class Diff(Result):
    """``fragscope diff --json``: peaks and call sites of snapshot A against B."""


class Check(Result):
    """``fragscope check --json``: a memory budget gate. ``bool(check)`` is ``check.ok``.

    ``message`` is the line the CLI prints: ``check failed: ...`` for the first broken
    limit, or ``None`` when every limit held.
    """

    def __init__(self, text: str, ok: bool, message: Optional[str]) -> None:
        super().__init__(text)
        self.message = message

    def __bool__(self) -> bool:
        return bool(self._data["ok"])

    def __repr__(self) -> str:
        return f"<fragscope Check ok={self._data['ok']}{': ' + self.message if self.message else ''}>"


class Report:
    """A ``fragscope report`` page: ``html`` is the whole self-contained HTML file (data,
    script and styles inline; it makes no network request). ``save(path)`` writes it; in
    Jupyter the page itself is shown, in a sandboxed iframe."""

    def __init__(self, html: str) -> None:
        self.html = html

    def save(self, path: PathLike) -> None:
        """Writes the page to ``path`` (through a temporary file beside it, renamed over
        ``path``, so a failure never leaves a partial page)."""
        path = os.fspath(path)
        tmp = f"{path}.{os.getpid()}.tmp"
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(self.html)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)

    def _repr_html_(self) -> str:
        return (
            '<iframe sandbox="allow-scripts" style="width:100%;height:720px;border:1px solid #ccc" '
            f'srcdoc="{html.escape(self.html, quote=True)}"></iframe>'
        )

    def __repr__(self) -> str:
        return f"<fragscope.Report: {len(self.html):,} bytes of HTML>"


def _size(v: Union[int, str, None]) -> Optional[str]:
    return None if v is None else str(v)


def _fraction(v: Union[float, str, None]) -> Optional[str]:
    return None if v is None else (repr(float(v)) if isinstance(v, (int, float)) else str(v))


class Snapshot:
    """A loaded memory snapshot. Make one with :func:`load`, :func:`loads` or :func:`from_dict`."""

    def __init__(self, native: _native.Snapshot) -> None:
        self._native = native

    @property
    def name(self) -> str:
        """The name results carry as ``file`` (the path as given, ``<bytes>``, ``<dict>``)."""
        return self._native.name

    @property
    def format(self) -> str:
        """``dict`` (PyTorch 2.x), ``segment_list`` (1.13) or ``kineto`` (profiler trace)."""
        return self._native.format

    @property
    def devices(self) -> List[int]:
        """CUDA devices with segments or trace events."""
        return self._native.devices

    @property
    def trace_events(self) -> int:
        """Trace entries recorded, all devices together."""
        return self._native.trace_events

    def __repr__(self) -> str:
        return repr(self._native)

    def summary(self) -> Summary:
        """``fragscope summary --json`` of this snapshot."""
        return Summary(self._native.summary_json())

    def analyze(self, top: int = 10, what_if: bool = False) -> Analysis:
        """``fragscope analyze --json [--top N] [--what-if]``."""
        return Analysis(self._native.analyze_json(top, what_if))

    def replay(
        self,
        verify: bool = False,
        configs: Sequence[str] = (),
        capacity: Union[int, str, None] = None,
        device: Optional[int] = None,
        save_snapshot: Optional[PathLike] = None,
        empty_cache_at: Sequence[str] = (),
        no_caching: bool = False,
    ) -> Replay:
        """``fragscope replay --json``: ``verify`` checks the allocator model against the
        recording; otherwise simulates ``configs`` (``PYTORCH_CUDA_ALLOC_CONF`` strings) and/or
        a ``capacity`` (bytes, ``"80GiB"`` or a GPU name); ``save_snapshot`` writes the
        simulated run of the first config as a snapshot pickle. ``empty_cache_at`` adds
        ``torch.cuda.empty_cache()`` what-ifs (``"iteration"``, a ``record_function`` name,
        ``"NAME@end"`` or ``"entry:N"``, as ``--empty-cache-at``) and ``no_caching`` the
        ``PYTORCH_NO_CUDA_MEMORY_CACHING=1`` what-if."""
        if isinstance(configs, str):
            configs = [configs]
        if isinstance(empty_cache_at, str):
            empty_cache_at = [empty_cache_at]
        return Replay(
            self._native.replay_json(
                verify,
                list(configs),
                _size(capacity),
                device,
                os.fspath(save_snapshot) if save_snapshot is not None else None,
                list(empty_cache_at),
                no_caching,
            )
        )

    def lab(
        self,
        allocators: Union[str, Sequence[str]] = "all",
        capacity: Union[int, str, None] = None,
        device: Optional[int] = None,
    ) -> Lab:
        """``fragscope replay --allocator NAME --json``: the trace served by allocation
        policies (``"all"``, ``"pytorch"``, ``"pytorch:expandable_segments:True"``,
        ``"best-fit"``, ``"paged-best-fit"``, ``"page-remap"``, ``"lifetime"``, ``"planned"``,
        ``"hybrid"``, ...) against the bounds, on a device of ``capacity`` (default: the
        recorded one)."""
        if isinstance(allocators, str):
            allocators = [allocators]
        return Lab(self._native.lab_json(list(allocators), _size(capacity), device))

    def report(self) -> Report:
        """``fragscope report``: the self-contained HTML page of this snapshot (memory
        timeline, allocator state at any moment, fragmentation, what-if, findings)."""
        return Report(self._native.report_html())

    def check(
        self,
        max_reserved: Union[int, str, None] = None,
        max_allocated: Union[int, str, None] = None,
        max_fragmentation: Union[float, str, None] = None,
        no_leaks: bool = False,
    ) -> Check:
        """``fragscope check --json``: sizes as bytes or ``"20GiB"``/``"20GB"``, fragmentation
        as ``0.15`` or ``"15%"``."""
        text, ok, message = self._native.check_json(
            _size(max_reserved), _size(max_allocated), _fraction(max_fragmentation), no_leaks
        )
        return Check(text, ok, message)

    def diff(self, other: "Snapshot", top: int = 10) -> Diff:
        """``fragscope diff --json A B`` with this snapshot as A and ``other`` as B."""
        return Diff(self._native.diff_json(other._native, top))

    def blocks(self, site: Optional[str] = None, allocated_only: bool = True) -> List[Dict[str, Any]]:
        """Blocks of the allocator state at the dump (``device``, ``address``, ``size``,
        ``state``, ``site``): with ``site`` (as analyses name it, ``"train.py:63:step"``)
        only that call site's, e.g. a leak suspect's or a large holder at the peak."""
        keys = ("device", "address", "size", "state", "site")
        return [dict(zip(keys, b)) for b in self._native.blocks(site, allocated_only)]

    def save(self, path: PathLike) -> None:
        """Writes the snapshot as a pickle (protocol 2) that PyTorch's viewers read."""
        self._native.save(os.fspath(path))

    def _repr_html_(self) -> str:
        return self.summary()._repr_html_()


def load(path: PathLike, name: Optional[str] = None) -> Snapshot:
    """Loads a snapshot file: a ``torch.cuda.memory._dump_snapshot`` pickle (gzipped or
    not) or a torch.profiler JSON trace. Nothing in the file is ever executed."""
    return Snapshot(_native.load(os.fspath(path), name))


def loads(data: Union[bytes, bytearray, memoryview], name: Optional[str] = None) -> Snapshot:
    """Loads a snapshot from the bytes of a file."""
    return Snapshot(_native.loads(bytes(data), name))


def from_dict(obj: Any, name: Optional[str] = None) -> Snapshot:
    """The snapshot of the dict ``torch.cuda.memory._snapshot()`` returns (or of a
    ``pickle.load``ed snapshot file), walked in Rust without pickling."""
    return Snapshot(_native.from_dict(obj, name))


def example() -> Snapshot:
    """The built-in example snapshot (a toy training loop made by fragscope's own code)."""
    return Snapshot(_native.example())


def run_cli(argv: Sequence[str]) -> int:
    """Runs the ``fragscope`` command line (``argv[0]`` is the program name); returns its exit code."""
    return _native.run_cli([str(a) for a in argv])


class RankSummary:
    """The cross-rank summary of :func:`analyze_many`: one snapshot per rank (in the order
    of the paths given), which rank peaked and which OOM'd, the peak rank's excess over the
    median rank, and the call sites that explain it.

    ``ranks`` holds one dict per path: ``rank``, ``file``, ``error`` (``None`` when read),
    ``peak_reserved``, ``peak_allocated`` (bytes, the largest over its devices), ``oom``
    (the first OOM verdict, or ``None``). ``analyses`` holds each rank's :class:`Analysis`
    (``None`` for a file that could not be read).
    """

    def __init__(self, paths: Sequence[str], outcomes: Sequence[Any]) -> None:
        self.analyses: List[Optional[Analysis]] = []
        self.ranks: List[Dict[str, Any]] = []
        for i, (path, (ok, text)) in enumerate(zip(paths, outcomes)):
            a = Analysis(text) if ok else None
            self.analyses.append(a)
            row: Dict[str, Any] = {"rank": i, "file": path, "error": None if ok else text}
            row.update(_rank_figures(a._body() if a else None))
            self.ranks.append(row)
        read = [r for r in self.ranks if r["error"] is None]
        self.median_peak_reserved: Optional[float] = (
            statistics.median(r["peak_reserved"] for r in read) if read else None
        )
        peak = max(read, key=lambda r: (r["peak_reserved"], -r["rank"]), default=None)
        self.peak_rank: Optional[int] = peak["rank"] if peak else None
        self.oom_ranks: List[int] = [r["rank"] for r in read if r["oom"] is not None]
        self.excess_over_median: Optional[float] = (
            peak["peak_reserved"] - self.median_peak_reserved if peak and self.median_peak_reserved is not None else None
        )
        # The rank nearest the median is the baseline the peak rank's call sites are compared with.
        base = (
            min(read, key=lambda r: (abs(r["peak_reserved"] - self.median_peak_reserved), r["rank"]))
            if read
            else None
        )
        self.median_rank: Optional[int] = base["rank"] if base else None
        self.sites: List[Dict[str, Any]] = []
        if peak and base and peak is not base:
            mine = peak.pop("_sites")
            theirs = base.get("_sites", {})
            deltas = [
                {"site": s, "bytes": b, "median_rank_bytes": theirs.get(s, 0), "excess": b - theirs.get(s, 0)}
                for s, b in mine.items()
            ]
            self.sites = sorted((d for d in deltas if d["excess"] > 0), key=lambda d: -d["excess"])[:10]
        for r in self.ranks:
            r.pop("_sites", None)

    def to_dict(self) -> Dict[str, Any]:
        return {
            "schema": "fragscope.ranks/1",
            "ranks": self.ranks,
            "peak_rank": self.peak_rank,
            "median_rank": self.median_rank,
            "median_peak_reserved": self.median_peak_reserved,
            "excess_over_median": self.excess_over_median,
            "oom_ranks": self.oom_ranks,
            "sites": self.sites,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    def __repr__(self) -> str:
        ex = _fmt_bytes(int(self.excess_over_median)) if self.excess_over_median is not None else "—"
        return f"<fragscope RankSummary of {len(self.ranks)} ranks: peak rank {self.peak_rank} (+{ex} over the median), OOM ranks {self.oom_ranks}>"

    def _repr_html_(self) -> str:
        rows = [
            (
                r["rank"],
                r["file"],
                r["error"] or "",
                _fmt_bytes(r.get("peak_reserved")),
                _fmt_bytes(r.get("peak_allocated")),
                r.get("oom") or "",
            )
            for r in self.ranks
        ]
        out = f"<b>{html.escape(repr(self))}</b>"
        out += _table(["rank", "file", "error", "peak reserved", "peak allocated", "OOM"], rows)
        out += _table(
            ["call site (peak rank vs median rank, at the allocated peak)", "peak rank", "median rank", "excess"],
            [(s["site"], _fmt_bytes(s["bytes"]), _fmt_bytes(s["median_rank_bytes"]), _fmt_bytes(s["excess"])) for s in self.sites],
        )
        return out


def _rank_figures(body: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """A rank's peak figures from its analysis: the device with the largest reserved peak."""
    out: Dict[str, Any] = {"peak_reserved": 0, "peak_allocated": 0, "device": None, "oom": None, "_sites": {}}
    if body is None:
        return out
    for d in body["devices"]:
        tl = d["fragmentation"]["timeline"]
        reserved, allocated = tl["peak_reserved"]["bytes"], tl["peak_allocated"]["bytes"]
        if out["oom"] is None and d.get("oom"):
            out["oom"] = d["oom"]["verdict"]
        if out["device"] is None or reserved > out["peak_reserved"]:
            sites: Dict[str, int] = {}
            for s in d["peaks"]["allocated_peak"]["sites"]:
                sites[s["site"]] = sites.get(s["site"], 0) + s["bytes"]
            out.update(peak_reserved=reserved, peak_allocated=allocated, device=d["device"], _sites=sites)
    return out


class Prediction(Result):
    """``fragscope predict --json``: memory of one program at sizes nobody recorded
    (``predictions``: one per size and device), from recordings at other sizes."""


def predict(
    snapshots: Sequence[Union["Snapshot", PathLike]],
    sizes: Sequence[int],
    at: Sequence[int],
    config: Optional[str] = None,
    capacity: Union[int, str, None] = None,
    max_fit: bool = False,
    device: Optional[int] = None,
) -> Prediction:
    """``fragscope predict A B ... --sizes ... --at ...``: the recordings (snapshots or
    paths) of one program at ``sizes`` (batch size, sequence length, ...), predicted at
    each size in ``at`` by replaying the synthesised trace through the allocator model.
    ``capacity`` (bytes, ``"80GiB"`` or a GPU name) says whether each fits; ``max_fit``
    finds the largest size that fits on it."""
    snaps = [s if isinstance(s, Snapshot) else load(s) for s in snapshots]
    return Prediction(
        _native.predict_json(
            [s._native for s in snaps], list(sizes), list(at), config, _size(capacity), max_fit, device
        )
    )


def analyze_file(path: PathLike, top: int = 10, what_if: bool = False) -> Tuple[bool, str]:
    """The per-file step of :func:`analyze_many`: ``(True, analyze --json text)`` or
    ``(False, the error line)``. Small, picklable in and out: run it as Dask or Ray tasks
    and build :class:`RankSummary` from the outcomes (docs/python.md)."""
    p = os.fspath(path)
    try:
        return True, load(p).analyze(top=top, what_if=what_if).to_json()
    except FragscopeError as e:
        return False, str(e)


def report(snapshots: Iterable[Union["Snapshot", PathLike]], path: Optional[PathLike] = None) -> Report:
    """``fragscope report A B ...``: one page for several snapshots (or paths): ranks side
    by side, and two runs compared as ``diff``. Written to ``path`` when given."""
    snaps = [s if isinstance(s, Snapshot) else load(s) for s in snapshots]
    r = Report(_native.report_html_many([s._native for s in snaps]))
    if path is not None:
        r.save(path)
    return r


def analyze_many(
    paths: Iterable[PathLike], top: int = 10, what_if: bool = False, threads: int = 0
) -> RankSummary:
    """``analyze`` of one snapshot per rank on every core (``threads=0``: all of them), the
    GIL released, and the cross-rank summary (:class:`RankSummary`). A file that cannot be
    read is reported in its rank's ``error``, not raised."""
    ps = [os.fspath(p) for p in paths]
    return RankSummary(ps, _native.analyze_many(ps, top, what_if, threads))
