"""fragscope: explain CUDA out-of-memory errors and fragmentation from PyTorch memory snapshots.

The same Rust engine as the ``fragscope`` command, from Python::

    import fragscope
    snap = fragscope.load("snapshot.pickle")        # or loads(bytes), from_dict(torch.cuda.memory._snapshot())
    print(snap.analyze().devices[0].findings[0].headline)
    snap.check(max_reserved="20GiB").ok
    fragscope.analyze_many(["rank0.pickle", "rank1.pickle"]).peak_rank

Every result's ``to_json()`` is byte for byte what ``fragscope <command> --json`` prints
(the CLI and this package call the same Rust functions), ``to_dict()`` is its parsed form,
and attributes read its fields (``result.devices[0].peaks``; nested objects are dicts
with attribute access, typed by the TypedDicts of :mod:`fragscope.schema`). ``repr()``
prints each result's headline figures, and Jupyter shows a compact table. Errors raise
:class:`FragscopeError` (a ``ValueError``; :class:`SnapshotError`,
:class:`RefusedPickleError`, :class:`ArgumentError` by kind) with the CLI's one-line
message. Analyses release the GIL. Recording helpers live in :mod:`fragscope.torch` (imported on demand: torch is
optional). See docs/python.md.
"""

from __future__ import annotations

import html
import json
import os
import warnings
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

# The exceptions first: the Rust module raises these classes (it imports them from here).
from fragscope._errors import ArgumentError, FragscopeError, RefusedPickleError, SnapshotError
from fragscope import _native

if TYPE_CHECKING:
    from fragscope.schema import (
        AnalyzeDoc,
        CheckDoc,
        DeviceAnalysis,
        DeviceSummary,
        DiffDoc,
        LabDoc,
        LabReport,
        ReplayDoc,
        SummaryDoc,
    )

__version__: str = _native.__version__

__all__ = [
    "FragscopeError",
    "SnapshotError",
    "RefusedPickleError",
    "ArgumentError",
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
    "Fit",
    "RankSummary",
    "load",
    "loads",
    "from_dict",
    "example",
    "analyze_many",
    "report",
    "analyze_file",
    "predict",
    "fit",
    "run_cli",
]

PathLike = Union[str, "os.PathLike[str]"]


class Fields(dict):  # type: ignore[type-arg]
    """A JSON object of a result: a ``dict`` (typed by the TypedDicts of
    :mod:`fragscope.schema`) whose keys also read as attributes
    (``f.peaks.allocated_peak.sites``). Nested objects read as ``Fields`` too."""

    __slots__ = ()

    def __getattr__(self, name: str) -> Any:
        try:
            return _wrap(dict.__getitem__(self, name))
        except KeyError:
            raise AttributeError(f"no field {name!r}; fields: {', '.join(self)}") from None

    def __getitem__(self, key: str) -> Any:
        return _wrap(dict.__getitem__(self, key))

    def __dir__(self) -> List[str]:
        return list(self)

    def to_dict(self) -> Dict[str, Any]:
        """A plain, deep copy."""
        return json.loads(json.dumps(self))

    def __repr__(self) -> str:
        return f"Fields({_short_items(self)})"


def _short(v: Any) -> str:
    """A value as a repr shows it: scalars in full (long strings cut), containers by size."""
    if isinstance(v, dict):
        return f"{{{len(v)} key{'' if len(v) == 1 else 's'}}}"
    if isinstance(v, list):
        return f"[{len(v)} item{'' if len(v) == 1 else 's'}]"
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, str) and len(v) > 60:
        return repr(v[:57] + "...")
    return repr(v)


def _short_items(d: Dict[str, Any], limit: int = 8) -> str:
    items = [f"{k}={_short(v)}" for k, v in list(d.items())[:limit]]
    if len(d) > limit:
        items.append(f"... {len(d) - limit} more")
    return ", ".join(items)


def _wrap(v: Any) -> Any:
    if isinstance(v, dict) and not isinstance(v, Fields):
        return Fields(v)
    if isinstance(v, list):
        return [_wrap(x) for x in v]
    return v


def _pct(v: Optional[float]) -> str:
    return "—" if v is None else f"{v:.1%}"


def _cut(text: str, n: int = 90) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def _fmt_bytes(n: Optional[int]) -> str:
    """PyTorch's ``format_size``, the Rust one the CLI's text prints (a sign in front of a
    negative difference)."""
    if n is None:
        return "—"
    n = int(n)
    return "-" + _native.format_size(-n) if n < 0 else _native.format_size(n)


def _table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>" for r in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


class Result:
    """A command's result: the CLI's ``--json`` document, with attribute access.

    Attributes read the fields of the (single) file entry for summary / analyze / replay,
    and of the document itself for diff / check. ``repr()`` gives the headline figures;
    ``_repr_html_`` (Jupyter) a compact table.
    """

    def __init__(self, text: str) -> None:
        self._text = text
        self._data: Dict[str, Any] = json.loads(text)

    @property
    def schema(self) -> str:
        """The document's schema name and version (docs/json-schema.md)."""
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

    def _devices(self) -> List[Dict[str, Any]]:
        return list(self._body().get("devices") or [])

    def _headline(self) -> str:
        """The figures ``repr()`` shows after the file name."""
        return _short_items(self._body(), limit=6)

    def __repr__(self) -> str:
        return f"<fragscope.{type(self).__name__} of {self._body().get('file', '?')}: {self._headline()}>"

    def _html_rows(self) -> Tuple[Sequence[str], List[Sequence[Any]]]:
        rows = [(k, _short(v)) for k, v in self._body().items()]
        return ["field", "value"], rows

    def _repr_html_(self) -> str:
        heads, rows = self._html_rows()
        title = f"fragscope {type(self).__name__.lower()} of {self._body().get('file', '?')}"
        body = _table(heads, rows) if rows else "<p>No device has segments or trace events here.</p>"
        return f"<b>{html.escape(title)}</b>{body}"


class Summary(Result):
    """``fragscope summary --json``: memory_summary() figures and fragmentation per device.

    Fields (docs/json-schema.md, FileSummary): ``file``, ``example``, ``format``,
    ``devices`` (DeviceSummary: ``device``, ``reserved_bytes``, ``allocated_bytes``,
    ``fragmentation``, ``trace``, ...), ``memviz_stats``, ``settings``, ``notes``.
    """

    if TYPE_CHECKING:

        def to_dict(self) -> "SummaryDoc": ...

    @property
    def file(self) -> str:
        return self._body()["file"]

    @property
    def devices(self) -> List["DeviceSummary"]:
        """One per device with segments or trace events, ascending."""
        return _wrap(self._devices())

    def _headline(self) -> str:
        parts = [
            f"device {d['device']}: reserved {_fmt_bytes(d['reserved_bytes'])}, allocated {_fmt_bytes(d['allocated_bytes'])}, "
            f"free-space fragmentation {d['fragmentation']['free_space_fragmentation'] * 100:.1f}%, {d['trace']['events']:,} trace events"
            for d in self._devices()[:4]
        ]
        more = len(self._devices()) - 4
        return "; ".join(parts + ([f"{more} more devices"] if more > 0 else [])) or "no device"

    def _html_rows(self) -> Tuple[Sequence[str], List[Sequence[Any]]]:
        rows = []
        for d in self._devices():
            f = d["fragmentation"]
            rows.append(
                (
                    d["device"],
                    _fmt_bytes(d["allocated_bytes"]),
                    _fmt_bytes(d["reserved_bytes"]),
                    d["segments"],
                    _fmt_bytes(f["largest_free_block_bytes"]),
                    f"{f['free_space_fragmentation'] * 100:.1f}%",
                    f"{d['trace']['events']:,}",
                )
            )
        heads = ["device", "allocated", "reserved", "segments", "largest free block", "free-space fragmentation", "trace events"]
        return heads, rows


def _verdict(d: Dict[str, Any]) -> str:
    return f"OOM ({d['oom']['verdict']})" if d.get("oom") else "no OOM"


class Analysis(Result):
    """``fragscope analyze --json``: OOM verdict, fragmentation, leaks, peaks, recommendations.

    Fields (DeviceAnalysis, per device): ``device``, ``findings`` (``kind``, ``severity``,
    ``headline``), ``oom``, ``peak_fragmentation``, ``fragmentation``, ``leak_suspects``
    (memory that outlives its training step and grows across steps), ``leak_steps`` (the
    steps compared; ``can_tell`` false with one step or none), ``steps``, ``roles``,
    ``peaks``, ``recommendations``.
    """

    if TYPE_CHECKING:

        def to_dict(self) -> "AnalyzeDoc": ...

    @property
    def file(self) -> str:
        return self._body()["file"]

    @property
    def devices(self) -> List["DeviceAnalysis"]:
        """One per device with segments or trace events, ascending."""
        return _wrap(self._devices())

    def _headline(self) -> str:
        parts = []
        for d in self._devices()[:4]:
            tl = d["fragmentation"]["timeline"]
            first = d["findings"][0]["headline"] if d["findings"] else "no finding"
            parts.append(
                f"device {d['device']}: {_verdict(d)}, peak reserved {_fmt_bytes(tl['peak_reserved']['bytes'])}, "
                f"peak allocated {_fmt_bytes(tl['peak_allocated']['bytes'])}, peak fragmentation {_pct(d['peak_fragmentation'])}; "
                f"{len(d['findings'])} findings, first: {_cut(first, 80)!r}"
            )
        more = len(self._devices()) - 4
        return "; ".join(parts + ([f"{more} more devices"] if more > 0 else [])) or "no device"

    def _repr_html_(self) -> str:
        parts = [f"<b>fragscope analyze of {html.escape(self._body()['file'])}</b>"]
        if not self._devices():
            parts.append("<p>No device has segments or trace events in this file.</p>")
        for d in self._devices():
            tl = d["fragmentation"]["timeline"]
            parts.append(
                f"<h4>Device {d['device']}: {html.escape(_verdict(d))}, peak reserved "
                f"{_fmt_bytes(tl['peak_reserved']['bytes'])}, peak allocated {_fmt_bytes(tl['peak_allocated']['bytes'])}</h4>"
            )
            parts.append(_table(["severity", "finding"], [(f["severity"], f["headline"]) for f in d["findings"]]))
            sites = d["peaks"]["allocated_peak"]["sites"]
            parts.append(
                _table(
                    ["call site at the allocated peak", "bytes", "share"],
                    [(s["site"], _fmt_bytes(s["bytes"]), f"{s['share']:.1%}") for s in sites[:10]],
                )
            )
        return "".join(parts)


class Replay(Result):
    """``fragscope replay --json``: the allocator model checked against the recording
    (``verify``) and, unless verify only, the what-if runs (``whatif``) per device."""

    if TYPE_CHECKING:

        def to_dict(self) -> "ReplayDoc": ...

    @property
    def devices(self) -> List[Fields]:
        return _wrap(self._devices())

    def _headline(self) -> str:
        parts = []
        for d in self._devices()[:4]:
            runs = d.get("whatif") or []
            # The OOM first: under a capacity it is the answer, and the verify counts that
            # follow (divergences included) are about the model, not about fitting.
            ooms = [w for w in runs if w.get("first_oom")]
            lead = ""
            if ooms:
                o = ooms[0]["first_oom"]
                lead = (
                    f"OOM: {_run_name(ooms[0])} runs out of memory at trace entry {o['index']} "
                    f"(a {_fmt_bytes(o['requested'])} request with {_fmt_bytes(o['reserved'])} reserved)"
                )
                if len(ooms) > 1:
                    lead += f", and {len(ooms) - 1} more run{'s' if len(ooms) > 2 else ''} of {len(runs)}"
                lead += "; "
            p = f"device {d['device']}: {lead}model matches {d['allocs_matched']}/{d['allocs']} allocations, {d['divergences']} divergences"
            if runs:
                p += "; peak reserved " + ", ".join(f"{_run_name(w)} {_fmt_bytes(w['peak_reserved'])}" for w in runs[:4])
                if len(runs) > 4:
                    p += f", {len(runs) - 4} more"
            for r in d.get("role_whatif") or []:
                p += f"; changed program (a model, not a recording): {r['verdict']}"
            parts.append(p)
        return "; ".join(parts) or "no replayable device"

    def _html_rows(self) -> Tuple[Sequence[str], List[Sequence[Any]]]:
        rows: List[Sequence[Any]] = []
        for d in self._devices():
            rows.append((d["device"], "recorded (verify)", f"{d['allocs_matched']}/{d['allocs']} allocations matched, {d['divergences']} divergences", "", "", ""))
            for w in d.get("whatif") or []:
                rows.append((d["device"], _run_name(w), "", _fmt_bytes(w["peak_reserved"]), f"{w['cuda_mallocs']:,}", w["ooms"]))
        return ["device", "run", "model check", "peak reserved", "cudaMalloc calls", "OOMs"], rows


def _run_name(w: Dict[str, Any]) -> str:
    return w.get("advice") or w.get("config") or "recorded settings"


class Lab(Result):
    """``fragscope replay --allocator ... --json``: the allocator lab — each policy's peak
    reserved against the bounds no allocator beats, driver calls, and the recorded OOM.

    Fields (LabReport, per device): ``device``, ``bounds``, ``rows`` (LabRow: ``policy``,
    ``peak_reserved``, ``ratio``, ``calls``, ``verdict``, ...), ``notes``.
    """

    if TYPE_CHECKING:

        def to_dict(self) -> "LabDoc": ...

    @property
    def devices(self) -> List["LabReport"]:
        return _wrap(self._devices())

    def _headline(self) -> str:
        parts = []
        for d in self._devices()[:4]:
            rows = ", ".join(f"{r['policy']} {_fmt_bytes(r['peak_reserved'])} (x{r['ratio']:.3f})" for r in d["rows"][:6])
            parts.append(f"device {d['device']}: live bound {_fmt_bytes(d['bounds']['live'])}; {rows}")
        return "; ".join(parts) or "no device with a trace"

    def _html_rows(self) -> Tuple[Sequence[str], List[Sequence[Any]]]:
        rows = [
            (d["device"], r["policy"], _fmt_bytes(r["peak_reserved"]), f"{r['ratio']:.3f}", _fmt_bytes(d["bounds"]["live"]), r["verdict"])
            for d in self._devices()
            for r in d["rows"]
        ]
        return ["device", "policy", "peak reserved", "x live bound", "live bound", "verdict"], rows


class Diff(Result):
    """``fragscope diff --json``: peaks and call sites of snapshot A against B.

    Fields: ``a``, ``b`` (the names), ``devices`` (``a``, ``b``, ``delta`` figures and
    ``sites``), ``only_in_a``, ``only_in_b``.
    """

    if TYPE_CHECKING:

        def to_dict(self) -> "DiffDoc": ...

    def _headline(self) -> str:
        parts = []
        for d in self._devices()[:4]:
            a, b = d["a"] or {}, d["b"] or {}
            dev = a.get("device", b.get("device"))
            parts.append(
                f"device {dev}: peak reserved {_fmt_bytes(a.get('peak_reserved'))} -> {_fmt_bytes(b.get('peak_reserved'))}, "
                f"peak allocated {_fmt_bytes(a.get('peak_allocated'))} -> {_fmt_bytes(b.get('peak_allocated'))}"
            )
        return "; ".join(parts) or "no device in common"

    def __repr__(self) -> str:
        return f"<fragscope.Diff {self._data['a']} -> {self._data['b']}: {self._headline()}>"

    def _repr_html_(self) -> str:
        rows = []
        for d in self._devices():
            a, b = d["a"] or {}, d["b"] or {}
            for key in ("peak_reserved", "peak_allocated"):
                rows.append((a.get("device", b.get("device")), key.replace("_", " "), _fmt_bytes(a.get(key)), _fmt_bytes(b.get(key))))
        sites = [
            (s["site"], _fmt_bytes(s["bytes_a"]), _fmt_bytes(s["bytes_b"]), _signed_bytes(s["delta"]))
            for d in self._devices()
            for s in d.get("sites", [])[:10]
        ]
        title = f"fragscope diff: A = {self._data['a']}, B = {self._data['b']}"
        return (
            f"<b>{html.escape(title)}</b>"
            + _table(["device", "figure", "A", "B"], rows)
            + _table(["call site", "A", "B", "B − A"], sites)
        )


def _signed_bytes(n: int) -> str:
    return ("+" if n > 0 else "−" if n < 0 else "") + _fmt_bytes(abs(n))


class Check(Result):
    """``fragscope check --json``: a memory budget gate. ``bool(check)`` is ``check.ok``.

    ``message`` is the line the CLI prints, the limit named as this method's argument
    (``max_reserved``, not ``--max-reserved``): ``check failed: ...`` for the first broken
    limit, or ``None`` when every limit held. Fields: ``ok``, ``limits``, ``devices``
    (``device``, ``peak_reserved``, ``peak_allocated``, ``peak_fragmentation``, ...),
    ``failures``.
    """

    if TYPE_CHECKING:

        def to_dict(self) -> "CheckDoc": ...

    def __init__(self, text: str, ok: bool, message: Optional[str]) -> None:
        super().__init__(text)
        self.message = message

    def __bool__(self) -> bool:
        return bool(self._data["ok"])

    @property
    def ok(self) -> bool:
        """Every limit held."""
        return bool(self._data["ok"])

    def _headline(self) -> str:
        peaks = ", ".join(
            f"device {d['device']} peak reserved {_fmt_bytes(d['peak_reserved'])}" for d in self._data.get("devices", [])[:4]
        )
        return ("passed" if self.ok else self.message or "failed") + (f" ({peaks})" if peaks else "")

    def __repr__(self) -> str:
        return f"<fragscope.Check ok={self.ok}: {self._headline()}>"

    def _repr_html_(self) -> str:
        rows = [
            (d["device"], _fmt_bytes(d["peak_reserved"]), _fmt_bytes(d["peak_allocated"]), _pct(d.get("peak_fragmentation")))
            for d in self._data.get("devices", [])
        ]
        head = html.escape("check passed" if self.ok else (self.message or "check failed"))
        return f"<b>fragscope check: {head}</b>" + _table(["device", "peak reserved", "peak allocated", "peak fragmentation"], rows)


class Report:
    """A ``fragscope report`` page: ``html`` is the whole self-contained HTML file (data,
    script and styles inline; it makes no network request). ``save(path)`` writes it.

    In Jupyter a page up to :attr:`max_inline_bytes` is shown inline, in a sandboxed
    iframe; a larger one (real snapshots give 4–9 MB, which would go into the notebook
    file) is not: the cell says how to :meth:`save` it, and ``show(path)`` saves it and
    shows it in an iframe that loads the file.
    """

    #: The largest page embedded in a notebook cell (bytes).
    max_inline_bytes: int = 1 << 20

    def __init__(self, html: str) -> None:
        self.html = html

    def save(self, path: PathLike) -> None:
        """Writes the page to ``path`` (through an exclusive temporary file beside it,
        renamed over ``path``, so a failure never leaves a partial page). ``path`` must be a
        regular file or absent: a directory, FIFO, device or symlink there raises
        :class:`FragscopeError` and is left as it was."""
        _native.save_bytes(os.fspath(path), self.html.encode("utf-8"))

    def show(self, path: PathLike = "fragscope-report.html", height: int = 720) -> "_IFrame":
        """Saves the page to ``path`` (relative to the notebook's folder, so that Jupyter
        serves it) and returns an iframe of it: the notebook holds only the iframe tag."""
        self.save(path)
        return _IFrame(os.fspath(path), height)

    def _repr_html_(self) -> str:
        if len(self.html) > self.max_inline_bytes:
            return (
                f"<p><b>fragscope report</b>: {len(self.html) / (1 << 20):.1f} MiB of HTML, over "
                f"Report.max_inline_bytes ({self.max_inline_bytes:,} bytes), so not embedded in the notebook. "
                "Use <code>report.show(\"fragscope-report.html\")</code> (saves it and shows it in an iframe) "
                "or <code>report.save(path)</code> and open the file.</p>"
            )
        return (
            '<iframe sandbox="allow-scripts" style="width:100%;height:720px;border:1px solid #ccc" '
            f'srcdoc="{html.escape(self.html, quote=True)}"></iframe>'
        )

    def __repr__(self) -> str:
        return f"<fragscope.Report: {len(self.html):,} bytes of HTML>"


class _IFrame:
    """An iframe of a saved report page (what :meth:`Report.show` returns)."""

    def __init__(self, path: str, height: int) -> None:
        self.path, self.height = path, height

    def _repr_html_(self) -> str:
        return (
            f'<iframe sandbox="allow-scripts" src="{html.escape(self.path, quote=True)}" '
            f'style="width:100%;height:{int(self.height)}px;border:1px solid #ccc"></iframe>'
        )

    def __repr__(self) -> str:
        return f"<fragscope report page {self.path}>"


def _size(what: str, v: Union[int, str, None]) -> Optional[str]:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, str)):
        raise ArgumentError(f"{what} must be bytes (an int) or a size such as \"20GiB\", not {_kind(v)}")
    return str(v)


def _fraction(what: str, v: Union[float, str, None]) -> Optional[str]:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise ArgumentError(f"{what} must be a fraction such as 0.15 or \"15%\", not {_kind(v)}")
    return repr(float(v)) if isinstance(v, (int, float)) else v


def _kind(v: Any) -> str:
    """``None``, or the type and a short repr of a bad argument."""
    return "None" if v is None else f"{type(v).__name__} {_cut(repr(v), 40)}"


def _top(top: Any) -> int:
    if isinstance(top, bool) or not isinstance(top, int) or not 1 <= top <= 1000:
        raise ArgumentError(f"top must be an int in 1..1000, not {_kind(top)}")
    return top


def _device(device: Any) -> Optional[int]:
    if device is not None and (isinstance(device, bool) or not isinstance(device, int)):
        raise ArgumentError(f"device must be a CUDA device number (an int) or None, not {_kind(device)}")
    return device


def _strings(what: str, v: Union[str, Sequence[str]]) -> List[str]:
    items = [v] if isinstance(v, str) else v
    try:
        out = list(items)
    except TypeError:
        raise ArgumentError(f"{what} must be a string or a list of strings, not {_kind(v)}") from None
    for x in out:
        if not isinstance(x, str):
            raise ArgumentError(f"{what} must hold strings, not {_kind(x)}")
    return out


def _path(what: str, path: Any) -> str:
    """``os.fspath`` with a message in Python's words for ``None`` and other non-paths."""
    try:
        p = os.fspath(path)
    except TypeError:
        raise ArgumentError(f"{what} must be a path (str or os.PathLike), not {_kind(path)}") from None
    if isinstance(p, bytes):
        p = os.fsdecode(p)
    return p


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

    @property
    def segments(self) -> int:
        """Segments in the allocator state at the dump, all devices together."""
        return self._native.segments

    def __repr__(self) -> str:
        return repr(self._native)

    def summary(self) -> Summary:
        """``fragscope summary --json`` of this snapshot."""
        return Summary(self._native.summary_json())

    def analyze(self, top: int = 10, what_if: bool = False) -> Analysis:
        """``fragscope analyze --json [--top N] [--what-if]``."""
        return Analysis(self._native.analyze_json(_top(top), bool(what_if)))

    def replay(
        self,
        verify: bool = False,
        configs: Sequence[str] = (),
        capacity: Union[int, str, None] = None,
        device: Optional[int] = None,
        save_snapshot: Optional[PathLike] = None,
        empty_cache_at: Sequence[str] = (),
        no_caching: bool = False,
        shard_optimizer: Optional[int] = None,
        shard_gradients: Optional[int] = None,
        grads_set_to_none: bool = False,
        checkpoint: Union[str, Sequence[int], None] = None,
    ) -> Replay:
        """``fragscope replay --json``: ``verify`` checks the allocator model against the
        recording; otherwise simulates ``configs`` (``PYTORCH_CUDA_ALLOC_CONF`` strings) and/or
        a ``capacity`` (bytes, ``"80GiB"`` or a GPU name); ``save_snapshot`` writes the
        simulated run of the first config as a snapshot pickle. ``empty_cache_at`` adds
        ``torch.cuda.empty_cache()`` what-ifs (``"step"``: each training step's start; a ``record_function`` name,
        ``"NAME@end"`` or ``"entry:N"``, as ``--empty-cache-at``) and ``no_caching`` the
        ``PYTORCH_NO_CUDA_MEMORY_CACHING=1`` what-if.

        Role-level what-ifs (a model of the change, replayed beside the recording; each
        device then has ``role_whatif`` instead of ``whatif``): ``shard_optimizer=N``
        (ZeRO-1: optimizer state at 1/N), ``shard_gradients=N`` (ZeRO-2: gradients at 1/N),
        ``grads_set_to_none=True`` (``zero_grad(set_to_none=True)`` before forward),
        ``checkpoint="all"`` or layers (``"0,2,5-7"`` or ``[0, 2]``, 0-based, forward order:
        activation checkpointing). A change that cannot be applied says why in
        ``role_whatif[i]["changes"]``."""
        if checkpoint is not None and not isinstance(checkpoint, str):
            checkpoint = ",".join(str(int(x)) for x in checkpoint)
        return Replay(
            self._native.replay_json(
                bool(verify),
                _strings("configs", configs),
                _size("capacity", capacity),
                _device(device),
                _path("save_snapshot", save_snapshot) if save_snapshot is not None else None,
                _strings("empty_cache_at", empty_cache_at),
                bool(no_caching),
                None if shard_optimizer is None else int(shard_optimizer),
                None if shard_gradients is None else int(shard_gradients),
                bool(grads_set_to_none),
                checkpoint,
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
        return Lab(self._native.lab_json(_strings("allocators", allocators), _size("capacity", capacity), _device(device)))

    def report(self) -> Report:
        """``fragscope report``: the self-contained HTML page of this snapshot (memory
        timeline, allocator state at any moment, fragmentation, what-if, findings)."""
        return Report(self._native.report_html())

    def check(
        self,
        max_reserved: Union[int, str, None] = None,
        max_allocated: Union[int, str, None] = None,
        max_peak_fragmentation: Union[float, str, None] = None,
        no_leaks: bool = False,
        **renamed: Any,
    ) -> Check:
        """``fragscope check --json``: sizes as bytes or ``"20GiB"``/``"20GB"``, peak
        fragmentation (``1 − peak allocated / peak reserved``) as ``0.15`` or ``"15%"``.
        ``max_fragmentation``, its old name, is still accepted (DeprecationWarning)."""
        for k in list(renamed):
            if k != "max_fragmentation":
                raise TypeError(f"check() got an unexpected keyword argument {k!r}")
            warnings.warn("check(max_fragmentation=) is now max_peak_fragmentation=", DeprecationWarning, stacklevel=2)
            if max_peak_fragmentation is not None:
                raise ArgumentError("give max_peak_fragmentation or max_fragmentation (its old name), not both")
            max_peak_fragmentation = renamed.pop(k)
        text, ok, message = self._native.check_json(
            _size("max_reserved", max_reserved),
            _size("max_allocated", max_allocated),
            _fraction("max_peak_fragmentation", max_peak_fragmentation),
            bool(no_leaks),
        )
        return Check(text, ok, message)

    def diff(self, other: Union["Snapshot", PathLike], top: int = 10) -> Diff:
        """``fragscope diff --json A B`` with this snapshot as A and ``other`` (a Snapshot,
        or the path of one) as B."""
        if not isinstance(other, Snapshot):
            other = load(_path("diff: other (a Snapshot or a path)", other))
        return Diff(self._native.diff_json(other._native, _top(top)))

    def blocks(self, site: Optional[str] = None, allocated_only: bool = True) -> List[Dict[str, Any]]:
        """Blocks of the allocator state at the dump (``device``, ``address``, ``size``,
        ``state``, ``site``): with ``site`` (as analyses name it, ``"train.py:63:step"``)
        only that call site's, e.g. a leak suspect's or a large holder at the peak."""
        keys = ("device", "address", "size", "state", "site")
        return [dict(zip(keys, b)) for b in self._native.blocks(site, allocated_only)]

    def save(self, path: PathLike) -> None:
        """Writes the snapshot as a pickle (protocol 2) that PyTorch's viewers read."""
        self._native.save(_path("path", path))

    def _repr_html_(self) -> str:
        return self.summary()._repr_html_()


def load(path: PathLike, name: Optional[str] = None) -> Snapshot:
    """Loads a snapshot file: a ``torch.cuda.memory._dump_snapshot`` pickle (gzipped or
    not) or a torch.profiler JSON trace. Nothing in the file is ever executed."""
    return Snapshot(_native.load(_path("load: path", path), name))


def loads(data: Union[bytes, bytearray, memoryview], name: Optional[str] = None) -> Snapshot:
    """Loads a snapshot from the bytes of a file."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ArgumentError(f"loads: data must be bytes (a file's contents), not {_kind(data)}")
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
        paths = [str(p) for p in paths]
        outcomes = [(bool(ok), str(text)) for ok, text in outcomes]
        self.analyses: List[Optional[Analysis]] = [Analysis(text) if ok else None for ok, text in outcomes]
        # The comparison is fragscope's one definition (Rust's compare_ranks), the same the
        # report's page of several files draws.
        self._doc: Dict[str, Any] = json.loads(_native.ranks_json(paths, outcomes))
        self.ranks: List[Dict[str, Any]] = self._doc["ranks"]
        self.median_peak_reserved: Optional[float] = self._doc["median_peak_reserved"]
        self.peak_rank: Optional[int] = self._doc["peak_rank"]
        self.oom_ranks: List[int] = self._doc["oom_ranks"]
        self.excess_over_median: Optional[float] = self._doc["excess_over_median"]
        self.median_rank: Optional[int] = self._doc["median_rank"]
        self.sites: List[Dict[str, Any]] = self._doc["sites"]
        #: Ranks whose peak reserved exceeds 1.1 × the median (with 3 ranks or more), each
        #: with the call sites where it holds more than the median rank.
        self.outliers: List[Dict[str, Any]] = self._doc["outliers"]

    def to_dict(self) -> Dict[str, Any]:
        return dict(self._doc)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    def __repr__(self) -> str:
        ex = _fmt_bytes(int(self.excess_over_median)) if self.excess_over_median is not None else "—"
        unread = [r["rank"] for r in self.ranks if r["error"] is not None]
        failed = f", unreadable ranks {unread}" if unread else ""
        out = f", outliers {[o['rank'] for o in self.outliers]}" if self.outliers else ""
        return (
            f"<fragscope RankSummary of {len(self.ranks)} ranks: peak rank {self.peak_rank} "
            f"(+{ex} over the median), OOM ranks {self.oom_ranks}{out}{failed}>"
        )

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


class Prediction(Result):
    """``fragscope predict --json``: memory of one program at sizes nobody recorded
    (``predictions``: one per size and device), from recordings at other sizes."""

    def __repr__(self) -> str:
        d = self._body()
        sizes = ", ".join(str(f["size"]) for f in d.get("files", []))
        parts = []
        for p in d.get("predictions", []):
            fit = "" if p.get("capacity") is None else (", fits" if p.get("fits") else ", does not fit")
            r = p.get("range")
            span = "" if r is None else f" ({_fmt_bytes(r['reserved'][0])} to {_fmt_bytes(r['reserved'][1])})"
            parts.append(
                f"{p['at']} on cuda:{p['device']}: peak allocated {_fmt_bytes(p['peak_allocated'])}, "
                f"peak reserved {_fmt_bytes(p['peak_reserved'])}{span}{fit}"
            )
        for m in d.get("max_fit", []):
            cfg = f" with {m['config']}" if m.get("config") else ""
            r = m.get("range")
            span = "" if r is None else f" (for certain {r['certain']}, might {r['might']})"
            parts.append(f"largest that fits{cfg} on cuda:{m['device']}: {m['largest']}{span}")
        return f"<fragscope.Prediction from sizes {sizes}: {'; '.join(parts) or 'nothing predicted'}>"


def predict(
    snapshots: Sequence[Union["Snapshot", PathLike]],
    sizes: Sequence[int],
    at: Sequence[int] = (),
    config: Optional[str] = None,
    capacity: Union[int, str, None] = None,
    max_fit: bool = False,
    device: Optional[int] = None,
) -> Prediction:
    """``fragscope predict A B ... --sizes ... --at ...``: the recordings (snapshots or
    paths) of one program at ``sizes`` (batch size, sequence length, ...), predicted at
    each size in ``at`` by replaying the synthesised trace through the allocator model.
    ``capacity`` (bytes, ``"80GiB"`` or a GPU name) says whether each fits; ``max_fit``
    finds the largest size that fits on it (then ``at`` may be left out)."""
    snaps = [s if isinstance(s, Snapshot) else load(s) for s in snapshots]
    return Prediction(
        _native.predict_json(
            [s._native for s in snaps], list(sizes), list(at), config, _size("capacity", capacity), max_fit, device
        )
    )


class Fit(Result):
    """``fragscope fit --json``: per file, device and card (``capacity``), the changes that
    make the run fit, cheapest first, each replayed (``options``); when nothing fits, the
    smallest capacity that would (``smallest_capacity``). Role-level changes are a model of
    the change (``model``), not a recording."""

    def cards(self) -> List[Dict[str, Any]]:
        """Every card of every device of every file, with ``file`` and ``device`` added."""
        out = []
        for f in self._data.get("files", []):
            for d in f.get("devices", []):
                for c in d.get("cards", []):
                    out.append(dict(c, file=f["file"], device=d["device"], predicted=bool(f.get("predicted"))))
        return out

    def cheapest(self, capacity: Optional[str] = None) -> Optional[Dict[str, Any]]:
        """The cheapest option on the first card (or the card named ``capacity``), or
        ``None`` when nothing tried fits there."""
        for c in self.cards():
            if capacity is None or c["capacity"] == capacity:
                return c["options"][0] if c["options"] else None
        raise ArgumentError(f"capacity {capacity!r} was not asked for; cards: {', '.join(c['capacity'] for c in self.cards())}")

    def __repr__(self) -> str:
        parts = []
        for c in self.cards():
            where = f"{c['capacity']} (cuda:{c['device']})"
            run = "as predicted" if c.get("predicted") else "as recorded"
            if c["fits_as_recorded"]:
                parts.append(f"{where}: fits {run}, {_fmt_bytes(c['options'][0]['margin'])} to spare")
            elif c["options"]:
                o = c["options"][0]
                more = f" (+{len(c['options']) - 1} more)" if len(c["options"]) > 1 else ""
                model = ", model" if o["model"] else ""
                parts.append(f"{where}: {o['change']}, {_fmt_bytes(o['margin'])} to spare{model}{more}")
            else:
                need = c["smallest_capacity"][0] if c["smallest_capacity"] else None
                tail = f", needs {_fmt_bytes(need['bytes'])} {run}" if need else ""
                parts.append(f"{where}: nothing tried fits{tail}")
        return f"<fragscope.Fit {'; '.join(parts) or 'no device'}>"


def fit(
    snapshots: Union["Snapshot", PathLike, Sequence[Union["Snapshot", PathLike]]],
    capacity: Union[int, str, Sequence[Union[int, str]]],
    sizes: Optional[Sequence[int]] = None,
    device: Optional[int] = None,
    at: Optional[int] = None,
) -> Fit:
    """``fragscope fit FILE... --capacity ...``: the cheapest changes that make the recorded
    run fit on ``capacity`` (bytes, ``"40GB"``, a GPU name, or a list of them: one answer per
    card), each replayed: allocator settings, ``set_to_none``, ``empty_cache()``, activation
    checkpointing, ZeRO, and with ``sizes`` (one per recording of one program) the largest
    size that fits. With ``sizes`` and ``at``: the run predicted at size ``at`` is fitted
    (allocator settings and a smaller size, each predicted)."""
    one = isinstance(snapshots, (Snapshot, str, os.PathLike))
    items = [snapshots] if one else list(snapshots)  # type: ignore[arg-type]
    snaps = [s if isinstance(s, Snapshot) else load(s) for s in items]
    caps = [capacity] if isinstance(capacity, (int, str)) and not isinstance(capacity, bool) else capacity
    if isinstance(caps, (bool, bytes)) or not isinstance(caps, (list, tuple)):
        raise ArgumentError(f"capacity must be bytes, a size such as \"40GB\", a GPU name, or a list of them, not {_kind(capacity)}")
    text = ",".join(_size("capacity", c) or "" for c in caps)
    if sizes is not None and (isinstance(sizes, (str, bytes)) or not all(isinstance(x, int) and not isinstance(x, bool) for x in sizes)):
        raise ArgumentError(f"sizes must be a list of ints, not {_kind(sizes)}")
    if at is not None and (isinstance(at, bool) or not isinstance(at, int)):
        raise ArgumentError(f"at must be an int (a size), not {_kind(at)}")
    return Fit(_native.fit_json([s._native for s in snaps], text, list(sizes or []), device, at))


def analyze_file(path: PathLike, top: int = 10, what_if: bool = False) -> Tuple[bool, str]:
    """The per-file step of :func:`analyze_many`: ``(True, analyze --json text)`` or
    ``(False, the error line)``. Small, picklable in and out: run it as Dask or Ray tasks
    and build :class:`RankSummary` from the outcomes (docs/python.md)."""
    p = _path("path", path)
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
    ps = [_path("analyze_many: each path", p) for p in paths]
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 0:
        raise ArgumentError(f"threads must be an int >= 0 (0: every core), not {_kind(threads)}")
    return RankSummary(ps, _native.analyze_many(ps, _top(top), bool(what_if), threads))
