"""``fragscope mcp``: a Model Context Protocol server (stdio) for coding agents.

An agent asked "why did my run OOM?" calls these tools on the user's snapshot and gets
fragscope's measured answers: figures read from the recording (summary, the allocator
state at a moment and who holds it, memory by role), the explanation (analyze, findings
first), what-ifs measured by replaying the recorded trace through fragscope's model of
PyTorch's caching allocator (replay_what_if), and the memory at a size nobody recorded
(predict). Every result says what it measured and how (``method``), and which window of
the trace it covers when a window was given.

Built on the official MCP Python SDK (``pip install '.[mcp]'`` from a clone, the ``mcp``
package, 2.x). Each tool call runs fragscope's library commands (the Rust extension
``fragscope._native``: the same typed requests and JSON documents the CLI prints,
docs/json-schema.md) in a child process of its own (:mod:`fragscope._mcp_worker`), which
a cancellation or a timeout kills, and returns a compact digest of the document (``full``
asks analyze and replay_what_if for every field).
A file fragscope refuses (unreadable, not a snapshot, a pickle that asks to import code)
or a bad argument is a one-line tool error, its parameters named as this server's
arguments; the reader refuses hostile input without panicking, so no file can take the
server down.

An agent is talked into things, so the server is strict where the CLI trusts its user
(issues 42 and 43):

* **arguments** are exactly the tool's: an unknown name is an error naming the ones there
  are (:class:`_StrictTool`), never silently dropped;
* **paths** are regular files under ``FRAGSCOPE_MCP_ROOT`` (default: the working
  directory), links resolved (:func:`_file`); ``explain_oom_text`` reads no file at all;
* **no file content in an error**: the reader quotes what it found (the first bytes of an
  unrecognised file), which through MCP would read any file's first line to the agent
  (:func:`_content_free`);
* **at most JOBS commands run** (``FRAGSCOPE_MCP_JOBS``, default one per core); a call
  past it answers "busy" at once, and ping is always answered (:func:`_run`);
* **a cancelled call stops**: ``notifications/cancelled``, or a call past
  ``FRAGSCOPE_MCP_TIMEOUT``, kills the call's child process (Rust code cannot be
  interrupted mid-replay; a process can), freeing its memory and its slot at once;
* **malformed JSON-RPC gets a JSON-RPC error** (parse error, invalid request), not
  silence (:func:`_serve_stdio`).

Why Python and not the Rust SDK: ``rmcp`` went from 0.1 to 3.11 through three major
versions, and a minimal rmcp 3.11 stdio server (tokio, schemars, 97 crates) took 2145 s
wall to build in release on the project's shared 2-core machine and added 3.2 MB to the
binary; the official Python SDK adds no Rust build and is pinned in the ``mcp`` extra.

Run: ``fragscope mcp`` (or ``python -m fragscope.mcp_server``).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from typing import Any, Callable, Dict, List, Literal, Optional

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.tools import Tool
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage
from mcp.types.jsonrpc import INVALID_REQUEST, PARSE_ERROR, ErrorData, JSONRPCError
from pydantic import ConfigDict, ValidationError

from . import __version__
from ._mcp_worker import EXIT_ERROR, PathRefused, check_file

INSTRUCTIONS = (
    "fragscope reads PyTorch CUDA memory snapshots (torch.cuda.memory._dump_snapshot "
    "pickles). Start with `analyze` on the snapshot (findings first: the OOM verdict, "
    "fragmentation, leaks, who holds memory at the peaks); `replay_what_if` measures "
    "allocator settings, a GPU size, empty_cache or no caching by replaying the trace; "
    "`allocator_state_at` and `top_holders` look at one moment (by call site, annotation, "
    "role, compile context or user metadata); `roles` says what the memory is for (parameters, gradients, optimizer state, "
    "activations, ...); `predict` takes recordings at two or more sizes (batch size, sequence "
    "length) and predicts the memory at another; `window` (START..END by entry index, or "
    "12.5s..14s) restricts summary, analyze and roles to a stretch of the trace. Paths are "
    "files under the folder the server was started for (FRAGSCOPE_MCP_ROOT). Results are "
    "compact (stacks without C++ frames, lists cut); `full: true` on analyze and "
    "replay_what_if returns every frame and row."
)

#: Seconds a single command may run (a replay of a multi-GB trace takes a while); past
#: them the call answers with an error and its child process is killed.
TIMEOUT_S = float(os.environ.get("FRAGSCOPE_MCP_TIMEOUT", "900"))

#: Commands running at once, at most: one per core by default (each is one process of Rust
#: work). A call past it fails at once with a "busy" error instead of queueing behind
#: replays that may take minutes; the protocol itself (ping, tools/list) is never queued.
JOBS = max(1, int(os.environ.get("FRAGSCOPE_MCP_JOBS") or os.cpu_count() or 2))

#: The folder whose files the tools may read (the user's choice, FRAGSCOPE_MCP_ROOT; by
#: default the folder the server was started in). A path an agent names is resolved
#: (symbolic links included) and refused outside it, so that an agent talked into naming
#: ~/.ssh/id_rsa or /etc/shadow gets a refusal, not an answer about the file.
ROOT = os.path.realpath(os.path.expanduser(os.environ.get("FRAGSCOPE_MCP_ROOT") or os.getcwd()))

READ = "recording: figures read from the snapshot (final state and trace), no replay"
WALK = "recording: allocator state rebuilt by the backward walk from the recorded final state, no replay"
ROLES = (
    "recording: each block's role from its phase (forward, backward, optimizer step) and lifetime "
    "in the recorded trace, and from identities (a parameter has its gradient's size); frames only "
    "where those do not decide; no replay. Each role has a confidence (0-1) and its evidence"
)
REPLAY = (
    "replay: the recorded trace run through fragscope's model of PyTorch's caching allocator "
    "(every allocation and free in recorded order) under the setting shown"
)


#: The command line of a tool call's child process (:mod:`fragscope._mcp_worker`): this
#: interpreter, importing the same fragscope package as the server.
WORKER = [
    sys.executable,
    "-c",
    "import sys; sys.path.insert(0, %r); from fragscope._mcp_worker import main; main()"
    % os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
]
#: Commands running now (children alive). A child counts until it has exited: a call that
#: gave up (timeout, cancellation) kills its child first, so its slot comes back at once.
_running = 0


async def _run(what: str, request: Dict[str, Any]) -> Dict[str, Any]:
    """Runs one library command in a child process (:mod:`fragscope._mcp_worker`; ``request``
    names the command, its paths and arguments) and returns its JSON document, or raises a
    ToolError with fragscope's one-line message.

    With JOBS commands already running it fails at once ("busy"), so that the server's own
    loop (ping, tools/list, cancellations) never waits behind a replay. Past TIMEOUT_S, or
    when the client cancels the call (``notifications/cancelled``, which the SDK delivers
    as a cancellation of this coroutine), the child is killed: Rust code cannot be
    interrupted mid-replay, a process can."""
    global _running
    if _running >= JOBS:
        raise ToolError(
            f"fragscope is busy: {JOBS} command(s) already running (FRAGSCOPE_MCP_JOBS); "
            "call again when one has answered"
        )
    _running += 1
    proc = None
    try:
        proc = await asyncio.create_subprocess_exec(
            *WORKER, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
        )
        try:
            with anyio.fail_after(TIMEOUT_S):
                out, _ = await proc.communicate(json.dumps({**request, "root": ROOT}).encode())
        except TimeoutError:
            raise ToolError(
                f"fragscope {what} took longer than {TIMEOUT_S:g} s (FRAGSCOPE_MCP_TIMEOUT) and was stopped"
            ) from None
    finally:
        if proc is not None and proc.returncode is None:
            _kill(proc)
            # Reaped even while this call is being cancelled (anyio re-raises the
            # cancellation at every await of a cancelled scope; the shield lets this one wait).
            with anyio.CancelScope(shield=True), anyio.move_on_after(30):
                await proc.wait()
        _running -= 1
    if proc.returncode == 0:
        return json.loads(out)
    if proc.returncode == EXIT_ERROR:
        raise ToolError(out.decode("utf-8", "replace").strip() or f"fragscope {what} failed")
    how = f"signal {-proc.returncode}" if proc.returncode < 0 else f"exit code {proc.returncode}"
    raise ToolError(f"fragscope {what} failed: its process ended with {how} (the server's log has its message)")


def _kill(proc: "asyncio.subprocess.Process") -> None:
    """Kills a child that is still running (one that has just exited is left alone)."""
    try:
        proc.kill()
    except ProcessLookupError:
        pass


def _file(path: str) -> str:
    """The real path of the snapshot file an agent named, checked (under ROOT, a regular
    file: :func:`fragscope._mcp_worker.check_file`), before a child is started for it; a
    refusal is a one-line ToolError."""
    try:
        return check_file(path, ROOT)
    except PathRefused as e:
        raise ToolError(str(e)) from None


def _snapshot_call(paths: List[str], name: str, *args: Any, **kwargs: Any) -> Dict[str, Any]:
    """The request for the method ``name`` of the first path's snapshot (the other paths'
    snapshots first among its arguments)."""
    return {"paths": paths, "target": "snapshot", "name": name, "args": list(args), "kwargs": kwargs}


def _native_call(paths: List[str], name: str, *args: Any, **kwargs: Any) -> Dict[str, Any]:
    """The request for ``fragscope._native.<name>`` (the paths' snapshots, as a list, first
    among its arguments when there are paths)."""
    return {"paths": paths, "target": "native", "name": name, "args": list(args), "kwargs": kwargs}


#: How many frames of a stack a compact result keeps (innermost first).
STACK_FRAMES = 8
#: Frames the report leaves out of a stack by default (crates/report/assets/js/data.js:
#: the unwinder, CapturedTraceback, the dispatcher's boxing and registration, CPython's
#: call machinery), by function name and by file.
_OMIT_FUNCTIONS = ("unwind::unwind", "CapturedTraceback::gather", "gather_with_cpp", "_start", "__libc_start_main",
                   "PyEval_", "PyObject_", "PyFunction_")
_OMIT_FILES = ("core/boxing", "/Register", "/Redispatch", "pythonrun.c", "Modules/main.c", "Objects/call.c",
               "Objects/methodobject.c", "pycore_ceval.h", "ceval.c", "cpython/abstract.h")


def _frames(stack: List[str]) -> List[str]:
    """A stack (``file:line:function`` strings, innermost first) as an agent can afford it:
    the Python frames when there are any (the code a user can change), else the frames the
    report shows; at most STACK_FRAMES, then one string saying how many were left out."""
    def parts(f: str) -> tuple:
        m = re.match(r"^(.*?):(-?\d+):(.*)$", f, re.S)
        return (m.group(1), m.group(3)) if m else (f, "")

    shown = [
        f for f in stack
        if not any(x in parts(f)[1] for x in _OMIT_FUNCTIONS) and not any(x in parts(f)[0] for x in _OMIT_FILES)
    ]
    python = [f for f in shown if parts(f)[0].endswith(".py")]
    kept = (python or shown)[:STACK_FRAMES]
    if len(kept) < len(stack):
        kept.append(f"<{len(stack) - len(kept)} more frames: C++ or outer; full: true lists them>")
    return kept


def _compact_stacks(x: Any) -> Any:
    """``x`` with every ``stack`` list of frame strings cut by :func:`_frames`."""
    if isinstance(x, dict):
        return {
            k: _frames(v) if k == "stack" and isinstance(v, list) and all(isinstance(f, str) for f in v)
            else _compact_stacks(v)
            for k, v in x.items()
        }
    if isinstance(x, list):
        return [_compact_stacks(v) for v in x]
    return x


class _StrictTool(Tool):
    """A tool whose arguments are exactly its parameters. The SDK builds each tool's
    argument model from the function's signature and ignores names it does not know
    (``allocator_state_at {"entry": 421}`` would answer for the end of the trace, an
    ``isError: false`` answer to a question nobody asked). Here the model forbids extra
    fields (the published schema says ``additionalProperties: false``) and an unknown
    name is a one-line tool error naming the arguments there are; so are the SDK's
    validation errors, which pydantic writes on several lines with a link."""

    @classmethod
    def from_function(cls, fn: Callable[..., Any], **kwargs: Any) -> "_StrictTool":
        tool = super().from_function(fn, **kwargs)
        base = tool.fn_metadata.arg_model
        strict = type(base.__name__, (base,), {"model_config": ConfigDict(**{**base.model_config, "extra": "forbid"})})
        tool.fn_metadata.arg_model = strict
        tool.parameters = strict.model_json_schema(by_alias=True)
        return tool

    def _signature(self) -> str:
        required = set(self.parameters.get("required", []))
        names = [n + (" (required)" if n in required else "") for n in self.parameters.get("properties", {})]
        return f"{self.name} takes {', '.join(names)}"

    async def run(self, arguments: Dict[str, Any], context: Any, convert_result: bool = False) -> Any:
        unknown = [k for k in arguments if k not in self.parameters.get("properties", {})]
        if unknown:
            raise ToolError(
                f"Error executing tool {self.name}: unknown argument{'s' if len(unknown) > 1 else ''} "
                f"{', '.join(repr(k) for k in unknown)}; {self._signature()}"
            )
        try:
            return await super().run(arguments, context, convert_result)
        except ToolError as e:
            cause = e.__cause__
            if not isinstance(cause, ValidationError):
                raise
            errors = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or 'arguments'}: {err['msg']}" for err in cause.errors()
            )
            raise ToolError(f"Error executing tool {self.name}: {errors}; {self._signature()}") from cause


_TOOLS: List[Callable[..., Any]] = []


def _tool(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Registers ``fn`` as a tool (the server is built from them at the end of the module)."""
    _TOOLS.append(fn)
    return fn


def _pick(d: Dict[str, Any], keys: List[str]) -> Dict[str, Any]:
    return {k: d[k] for k in keys if k in d}


def _settings(settings: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """The recorded allocator settings with ``roundup_power2_divisions`` cut to the sizes
    that have divisions (PyTorch lists all 16 size classes, almost always with 0)."""
    if not settings or not isinstance(settings.get("roundup_power2_divisions"), list):
        return settings
    out = dict(settings)
    out["roundup_power2_divisions"] = [p for p in settings["roundup_power2_divisions"] if p and p[-1]]
    return out


#: What a compact analyze keeps of each replayed setting (recommendations' rows).
_SETTING_ROW = ["setting", "paste", "extra_call", "min_version", "peak_reserved_bytes", "peak_allocated_bytes",
                "cuda_mallocs", "syncs", "ooms", "first_oom_index", "notes", "cost"]


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def _fit_verdict(row: Dict[str, Any]) -> str:
    """One line that leads a replay on a GPU size the agent asked for: whether the run
    fits, and where it stops when it does not. A run that cannot even start (the tensors
    alive before the trace exceed the GPU) says so first, not in a note."""
    cap, ooms = row.get("capacity"), row.get("ooms") or 0
    if not ooms:
        return f"fits: no allocation fails on {_gib(cap)}"
    before = row.get("allocated_before_trace") or 0
    if before > cap:
        return (f"does not fit: the tensors alive before the trace alone hold {_gib(before)}, more than "
                f"the {_gib(cap)} GPU; the run cannot start on it")
    first = (row.get("first_oom") or {}).get("index")
    where = f", the first at trace entry {first}" if first is not None else ""
    return f"does not fit on {_gib(cap)}: {ooms} allocation(s) fail{where}"


def _compact_recommendations(rec: Optional[Dict[str, Any]], top: int) -> Optional[Dict[str, Any]]:
    if not rec:
        return rec
    out = dict(rec)
    if isinstance(rec.get("era"), dict):
        out["era"] = rec["era"].get("label")
    for key in ("baseline",):
        if isinstance(rec.get(key), dict):
            out[key] = _pick(rec[key], _SETTING_ROW)
    for key in ("recommended", "tried"):
        if isinstance(rec.get(key), list):
            out[key] = [_pick(r, _SETTING_ROW) if isinstance(r, dict) else r for r in rec[key][:top]]
            if len(rec[key]) > top:
                out[key + "_more"] = len(rec[key]) - top
    # The one ranking of settings and advice (what the findings' headline names), first `top`.
    if isinstance(rec.get("ranked"), list):
        out["ranked"] = rec["ranked"][:top]
        if len(rec["ranked"]) > top:
            out["ranked_more"] = len(rec["ranked"]) - top
    return out


@_tool
async def summary(path: str, window: Optional[str] = None) -> Dict[str, Any]:
    """Memory figures of a snapshot as torch.cuda.memory_summary() names them, per device:
    reserved/allocated/active bytes in the final state, fragmentation, largest free block,
    what the trace covers.

    Args:
        path: snapshot file (pickle from torch.cuda.memory._dump_snapshot, optionally gzipped).
        window: optional stretch of the trace, half-open START..END: entry indices
            ("1000..5000") or time since the first entry ("12.5s..14s", "..300ms").
    """
    _file(path)
    d = await _run("summary", _snapshot_call([path], "summary_json", window))
    f = d["files"][0]
    devices = []
    for dev in f.get("devices", []):
        out = _pick(
            dev,
            [
                "device",
                "segments",
                "blocks",
                "reserved_bytes",
                "allocated_bytes",
                "active_bytes",
                "requested_bytes",
                "inactive_split_bytes",
                "largest_free_block_bytes",
                "trace_events",
            ],
        )
        fr = dev.get("fragmentation") or {}
        out["fragmentation"] = _pick(
            fr, ["free_bytes", "external_free_bytes", "free_space_fragmentation", "pinned_segments"]
        )
        tr = dev.get("trace") or {}
        out["trace"] = _pick(tr, ["events", "span_us", "history", "live_blocks", "live_bytes"])
        devices.append(out)
    return {
        "schema": d.get("schema"),
        "file": f.get("file"),
        # The OOM first (device, entry, verdict), as the CLI's summary leads with it.
        "oom": f.get("oom"),
        "method": READ,
        "window": f.get("window"),
        "format": f.get("format"),
        "settings": _settings(f.get("settings")),
        "devices": devices,
    }


@_tool
async def analyze(path: str, window: Optional[str] = None, top: int = 5, full: bool = False) -> Dict[str, Any]:
    """Explain a snapshot, findings first (most important first): the OOM (exhaustion,
    fragmentation or stranded memory, and settings a replay shows would have avoided it),
    fragmentation over time, leak suspects, who holds memory at the peaks, recommended
    settings.

    Args:
        path: snapshot file.
        window: optional stretch of the trace (see `summary`).
        top: call sites / suspects / settings listed per table (1..50).
        full: every field of the CLI's `analyze --json` (recommendations' replay rows
            in full); by default cut to what an answer needs.
    """
    top = max(1, min(int(top), 50))
    _file(path)
    d = await _run("analyze", _snapshot_call([path], "analyze_json", top, False, window))
    f = d["files"][0]
    devices = []
    for dev in f.get("devices", []):
        out: Dict[str, Any] = {"device": dev.get("device"), "findings": dev.get("findings", [])}
        headlines = {x.get("headline") for x in out["findings"]}
        oom = dev.get("oom")
        if oom:
            out["oom"] = {
                k: v
                for k, v in oom.items()
                if (not isinstance(v, (list, dict)) or k in ("fixes", "verdict", "state", "holders"))
                # The findings already say it, word for word.
                and (full or not (isinstance(v, str) and v in headlines))
            }
        out["peak_fragmentation"] = dev.get("peak_fragmentation")
        out["leak_suspects"] = (dev.get("leak_suspects") or [])[:top]
        rec = dev.get("recommendations")
        out["recommendations"] = rec if full else _compact_recommendations(rec, top)
        peaks = dev.get("peaks") or {}
        out["peaks"] = peaks
        devices.append(out)
    # The OOM's device first, as the CLI's analyze prints it.
    lead = f.get("oom")
    if lead:
        devices.sort(key=lambda x: x.get("device") != lead.get("device"))
    return {
        "schema": d.get("schema"),
        "file": f.get("file"),
        "oom": lead,
        "findings": f.get("findings", []),
        "method": READ + "; OOM fixes and recommendations measured by " + REPLAY,
        "window": f.get("window"),
        "recorded_config": f.get("recorded_config"),
        # How the file was recorded (skip_actions, history off, a warm start), when said.
        **({"recording": f["recording"]} if f.get("recording") else {}),
        "devices": devices if full else _compact_stacks(devices),
    }


@_tool
async def explain_oom_text(text: str) -> Dict[str, Any]:
    """Explain a CUDA out-of-memory error message from its text (paste the whole
    "CUDA out of memory. Tried to allocate ..." message): the figures, whether
    fragmentation is the likely cause, and what to record next. No snapshot needed; the
    text is the message itself, never a file's path (no file is read).

    Args:
        text: the error message (one or several; from a log).
    """
    if not text or not text.strip():
        raise ToolError("give the text of the CUDA out-of-memory error")
    try:
        d = await _run("oom", _native_call([], "explain_oom_json", text))
    except ToolError as e:
        if "no CUDA out-of-memory message found" not in str(e):
            raise
        # An agent may pass a log's path: this tool reads no file (a path would make it a
        # reader of any file the server can open), so say what `text` is.
        raise ToolError(f"{e} (`text` is the message itself: this tool never reads a file)") from None
    d["method"] = "the error message's own figures (no snapshot, no replay)"
    return d


@_tool
async def replay_what_if(
    path: str,
    config: Optional[List[str]] = None,
    capacity: Optional[str] = None,
    empty_cache_at: Optional[List[str]] = None,
    no_caching: bool = False,
    device: Optional[int] = None,
    shard_optimizer: Optional[int] = None,
    shard_gradients: Optional[int] = None,
    grads_set_to_none: bool = False,
    checkpoint: Optional[str] = None,
    full: bool = False,
) -> Dict[str, Any]:
    """Measure what other allocator settings would have done, by replaying the recorded
    trace through fragscope's model of PyTorch's caching allocator: peak reserved, peak
    allocated, fragmentation, cudaMalloc counts and OOMs under each setting.

    Args:
        path: snapshot file.
        config: PYTORCH_CUDA_ALLOC_CONF strings to try (e.g. ["expandable_segments:True",
            "max_split_size_mb:512"]). Without config/empty_cache_at/no_caching: the
            recorded settings and common alternatives.
        capacity: GPU memory, bytes with a unit ("80GiB") or a GPU name ("A100-40GB").
        empty_cache_at: also replay with torch.cuda.empty_cache() at "step" (each training step's start), at a
            record_function name, or "NAME@end".
        no_caching: also replay with PYTORCH_NO_CUDA_MEMORY_CACHING=1.
        device: only this device.
        shard_optimizer, shard_gradients, grads_set_to_none, checkpoint: instead of
            settings, replay the program changed (a model of the change, not a recording):
            optimizer state / gradients sharded over N ranks (ZeRO-1/2),
            zero_grad(set_to_none=True), activation checkpointing of "all" layers or
            "0,2,5-7". Each device then has "role_whatif": peaks before/after, whether a
            recorded OOM would be avoided, and why a change cannot be applied.
        With capacity, each row leads with "verdict": fits, or does not fit and where.
        full: every field of the CLI's `replay --json` (each first OOM's whole stack,
            cudaMalloc/cudaFree counts by size, every note); by default: a first OOM's
            stack is its Python frames (at most 8), the size histograms and all but 3
            notes are left out.
    """
    _file(path)

    work = _snapshot_call(
        [path],
        "replay_json",
        configs=list(config or []),
        capacity=capacity or None,
        device=device,
        empty_cache_at=list(empty_cache_at or []),
        no_caching=bool(no_caching),
        shard_optimizer=None if shard_optimizer is None else int(shard_optimizer),
        shard_gradients=None if shard_gradients is None else int(shard_gradients),
        grads_set_to_none=bool(grads_set_to_none),
        checkpoint=str(checkpoint) if checkpoint else None,
    )
    d = await _run("replay", work)
    files = d.get("files") or [{}]
    devices = []
    for dev in files[0].get("devices", []):
        fidelity = _pick(
            dev,
            ["allocs", "allocs_matched", "segment_events", "segment_events_matched", "undecidable", "final_state_matches"],
        )
        rows = []
        for w in dev.get("whatif", []):
            if full:
                rows.append(w)
                continue
            row = {k: v for k, v in w.items() if k not in ("notes",)}
            if isinstance(w.get("driver"), dict):
                # cudaMalloc/cudaFree counts by size class: lists of zeros, mostly.
                row["driver"] = {k: v for k, v in w["driver"].items() if not isinstance(v, list)}
            if w.get("notes"):
                row["notes"] = w["notes"][:3]
            if capacity and isinstance(w.get("capacity"), int):
                row = {"verdict": _fit_verdict(w), **row}
            rows.append(_compact_stacks(row))
        entry = {"device": dev.get("device"), "model_fidelity": fidelity, "whatif": rows}
        if "role_whatif" in dev:
            entry["role_whatif"] = [
                _pick(r, ["label", "steps", "changes", "applied", "capacity", "recorded_oom", "oom_avoided", "fits",
                          "verdict", "not_modelled"])
                for r in dev["role_whatif"]
            ]
        devices.append(entry)
    return {
        "schema": d.get("schema"),
        "file": files[0].get("file"),
        "method": REPLAY + "; model_fidelity: how exactly the model reproduced the recorded trace "
        "under the recorded settings (allocs_matched of allocs at the recorded address)",
        "devices": devices,
    }


async def _state(
    path: str, event: Optional[int], time: Optional[str], device: Optional[int], by: str, top: int
) -> Dict[str, Any]:
    if event is not None and time is not None:
        raise ToolError("give an event index or a time, not both")
    if event is not None and event < 0:
        raise ToolError("event is a trace entry index (>= 0)")
    top = max(1, min(int(top), 100))
    _file(path)
    return await _run("state", _snapshot_call([path], "state_json", event, time, device, by, top))


@_tool
async def allocator_state_at(
    path: str, event: Optional[int] = None, time: Optional[str] = None, device: Optional[int] = None
) -> Dict[str, Any]:
    """The allocator state at one moment: reserved, allocated, cached free bytes, the
    largest free block, free-space fragmentation and free space per (stream, pool).

    Args:
        path: snapshot file.
        event: the state after this trace entry (0-based index). Default: on a file with
            an OOM (and no device given), the OOM entry; else the end.
        time: or a time since the first trace entry ("12.5s", "300ms").
        device: device (default: with event N, the device whose entry N is the OOM; else
            the OOM's device; else the first with a trace). "choice" says why, when the
            OOM chose.
    """
    d = await _state(path, event, time, device, "site", 5)
    d.pop("holders", None)
    d.pop("other_bytes", None)
    d.pop("holders_by", None)
    return d


@_tool
async def top_holders(
    path: str,
    event: Optional[int] = None,
    time: Optional[str] = None,
    by: Literal["site", "annotation", "role", "compile_context", "user_metadata"] = "site",
    top: int = 10,
    device: Optional[int] = None,
) -> Dict[str, Any]:
    """Who holds the allocated memory at one moment: live bytes grouped by call site
    (innermost user frame of the allocation stack), by annotation (innermost
    record_function scope open at the allocation), by role (parameters, gradients,
    optimizer_state, activations, temporaries, inputs, other), by compile_context (the
    torch.compile region the allocation was made in) or by user_metadata (the string set
    with torch.cuda.memory._set_memory_metadata, PyTorch 2.10+), most bytes first. Blocks
    whose alloc entry carries no such string are grouped under placeholders ("(not
    recorded)", "(none set)", "(allocated before the trace)").

    Args:
        path: snapshot file.
        event: after this trace entry (0-based). Default: on a file with an OOM (and no
            device given), the OOM entry; else the end of the trace.
        time: or a time since the first trace entry ("12.5s").
        by: "site", "annotation", "role", "compile_context" or "user_metadata".
        top: rows listed (the rest is summed in other_bytes).
        device: device (default: with event N, the device whose entry N is the OOM; else
            the OOM's device; else the first with a trace). "choice" says why, when the
            OOM chose.
    """
    d = await _state(path, event, time, device, by, top)
    return _pick(
        d,
        [
            "schema",
            "file",
            "device",
            "after_event",
            "time_s",
            "method",
            "holders_by",
            "holders_total_bytes",
            "holders",
            "other_bytes",
            "choice",
        ],
    )


@_tool
async def roles(path: str, window: Optional[str] = None, device: Optional[int] = None) -> Dict[str, Any]:
    """What the memory is for, per device: bytes held by parameters, gradients,
    optimizer_state, activations, temporaries, inputs and other, at the allocated peak
    (at_peak) and at most (max), with the training steps found and each role's
    confidence and main evidence. Needs a snapshot with a trace (recorded history).

    Args:
        path: snapshot file.
        window: optional stretch of the trace (see `summary`).
        device: only this device.
    """
    _file(path)
    d = await _run("summary", _snapshot_call([path], "summary_json", window))
    f = d["files"][0]
    devices = []
    for dev in f.get("devices", []):
        if device is not None and dev.get("device") != device:
            continue
        r = dev.get("roles")
        if r is None:
            devices.append({"device": dev.get("device"), "roles": None, "why": "no trace on this device"})
            continue
        by_role = {}
        for name, x in r.get("by_role", {}).items():
            if not x.get("blocks") and not x.get("cannot_tell"):
                continue
            by_role[name] = {
                "at_peak": x.get("at_peak"),
                "max": x.get("max"),
                # Set when the total is not known (max/at_peak null; found_max a lower bound).
                "cannot_tell": x.get("cannot_tell"),
                "found_max": x.get("found_max"),
                "blocks": x.get("blocks"),
                "confidence": x.get("confidence"),
                "evidence": [_pick(e, ["evidence", "bytes", "confidence"]) for e in (x.get("evidence") or [])[:2]],
            }
        devices.append(
            {
                "device": dev.get("device"),
                "steps": r.get("steps"),
                "step_count": r.get("step_count"),
                "peak_state": r.get("peak_state"),
                "peak_allocated": r.get("peak_allocated"),
                "by_role": by_role,
                # The model's layer structure and its copies, where the sizes show it
                # (recordings without a backward pass); absent otherwise.
                **({"model_state": r["model_state"]} if r.get("model_state") else {}),
            }
        )
    if device is not None and not devices:
        raise ToolError(f"{path} has no device {device}")
    return {
        "schema": d.get("schema"),
        "file": f.get("file"),
        "method": ROLES,
        "window": f.get("window"),
        "units": "bytes of tensors (requested sizes); at_peak: at the allocated peak (trace state peak_state)",
        "devices": devices,
    }


@_tool
async def predict(
    paths: List[str],
    sizes: List[int],
    at: Optional[List[int]] = None,
    capacity: Optional[str] = None,
    max_fit: bool = False,
    config: Optional[str] = None,
    device: Optional[int] = None,
) -> Dict[str, Any]:
    """Predict memory at a batch size or sequence length nobody recorded, from
    recordings of the same program at two or more sizes: allocations aligned by call
    site, each size fitted to the simplest exact law, the trace synthesised at the new
    size and replayed through fragscope's model of PyTorch's caching allocator.

    Args:
        paths: snapshots of one program at different sizes (two or more).
        sizes: the size parameter of each recording, in the order of paths (e.g. [128, 256]).
        at: sizes to predict (e.g. [512]).
        capacity: GPU memory ("80GiB" or a GPU name such as "H100-80GB"): says whether each
            predicted size fits and where the first OOM would be.
        max_fit: find the largest size that fits on capacity (needs capacity).
        config: PYTORCH_CUDA_ALLOC_CONF string replayed on top of the recorded settings.
        device: only this device.
    """
    if len(paths) < 2:
        raise ToolError("predict needs two or more recordings of one program at different sizes")
    if len(sizes) != len(paths):
        raise ToolError(f"sizes gives {len(sizes)} size(s) for {len(paths)} path(s): one per recording, in order")
    if not at and not max_fit:
        raise ToolError("give the sizes to predict (at), or max_fit with capacity")
    for p in paths:
        _file(p)

    work = _native_call(
        list(paths), "predict_json", [int(x) for x in sizes], [int(x) for x in at or []], config or None,
        capacity or None, bool(max_fit), device,
    )

    d = await _run("predict", work)
    preds = []
    for p in d.get("predictions", []):
        row = {
            k: v
            for k, v in p.items()
            if not isinstance(v, (list, dict)) or k in ("oom", "fit_quality", "breakdown")
        }
        if isinstance(row.get("oom"), dict):
            row["oom"] = _compact_stacks(row["oom"])
        row["notes"] = (p.get("notes") or [])[:3]
        preds.append(row)
    fits = []
    for x in d.get("fits", []):
        keep = ["device", "template_size", "requests", "aligned_in_all", "aligned_fraction", "by_law", "by_evidence"]
        fit = _pick(x, keep + ["unexplained_total"])
        fit["notes"] = (x.get("notes") or [])[:3]
        fits.append(fit)
    out = {
        "schema": d.get("schema"),
        "files": d.get("files"),
        "method": "prediction: a trace synthesised at the new size from the recordings' fitted laws, "
        "then " + REPLAY + "; fit_quality says how much of the recordings the laws explain",
        "fits": fits,
        "predictions": preds,
    }
    if d.get("max_fit"):
        out["max_fit"] = d["max_fit"]
    return out


@_tool
async def make_it_fit(
    path: str,
    capacity: str,
    sizes_paths: Optional[List[str]] = None,
    sizes: Optional[List[int]] = None,
    device: Optional[int] = None,
    top: int = 3,
    at: Optional[int] = None,
) -> Dict[str, Any]:
    """Make it fit on X: the cheapest changes that make a recorded run fit on a GPU
    (allocator settings, zero_grad(set_to_none=True), empty_cache(), activation
    checkpointing of the fewest layers or least recomputation, ZeRO over the fewest ranks,
    a smaller batch), each replayed through fragscope's model of PyTorch's caching
    allocator. Cards where it does not fit come first; when nothing fits, the smallest
    capacity that would and which GPUs have it.

    Args:
        path: the snapshot of the run.
        capacity: the card(s): a size ("40GB", "39.5GiB") or GPU names, comma-separated
            ("A100-40GB,L40S,H100-80GB").
        sizes_paths: with sizes, other recordings of the same program at other sizes (then
            the largest size that fits is an option too).
        sizes: the size (batch, sequence) of path and of each of sizes_paths, in order.
        device: only this device.
        top: options kept per card (1 to 20).
        at: with sizes: fit the run predicted at this size (nobody recorded it) instead of
            the largest recording: allocator settings and a smaller size, each predicted.
    """
    top = max(1, min(int(top), 20))
    paths = [path] + list(sizes_paths or [])
    if sizes_paths and (not sizes or len(sizes) != len(paths)):
        raise ToolError(f"sizes must give one size for path and each of sizes_paths ({len(paths)} in all)")
    if sizes and not sizes_paths:
        raise ToolError("sizes needs sizes_paths: recordings of the same program at other sizes")
    if at is not None and not sizes:
        raise ToolError("at needs sizes and sizes_paths: the run at another size is predicted from recordings")
    for p in paths:
        _file(p)

    work = _native_call(list(paths), "fit_json", str(capacity), [int(x) for x in sizes or []], device, at)

    d = await _run("fit", work)
    keep = ["rank", "change", "cost_class", "cost", "peak_reserved", "peak_allocated", "margin", "model"]
    cards = []
    for f in d.get("files", []):
        for dev in f.get("devices", []):
            for c in dev.get("cards", []):
                cards.append(
                    {
                        "file": f.get("file"),
                        "device": dev.get("device"),
                        "capacity": c.get("capacity"),
                        "capacity_bytes": c.get("capacity_bytes"),
                        "capacity_note": c.get("capacity_note"),
                        "fits_as_recorded": c.get("fits_as_recorded"),
                        "verdict": c.get("verdict"),
                        "options": [_pick(o, keep) for o in c.get("options", [])[:top]],
                        "options_total": len(c.get("options", [])),
                        "smallest_capacity": c.get("smallest_capacity"),
                    }
                )
    # Does-not-fit first: those are what the agent must act on.
    cards.sort(key=lambda c: (bool(c["fits_as_recorded"]), bool(c["options"])))
    return {
        "schema": d.get("schema"),
        "method": "each option " + REPLAY + "; model: true marks a role-level change (the recorded trace "
        "transformed, not a recording), which leaves out communication buffers and recomputation temporaries",
        "cards": cards,
    }


@_tool
async def diff(path_a: str, path_b: str, top: int = 10) -> Dict[str, Any]:
    """Compare two snapshots (before/after a change): peak allocated / reserved /
    fragmentation per device and the call sites whose live memory at the peak changed
    most.

    Args:
        path_a: the first (baseline) snapshot.
        path_b: the second snapshot.
        top: call sites listed.
    """
    top = max(1, min(int(top), 100))
    _file(path_a), _file(path_b)
    d = await _run("diff", _snapshot_call([path_a, path_b], "diff_json", top))
    d["method"] = READ + " (peaks from each trace's timeline)"
    return d


server = MCPServer(
    "fragscope",
    version=__version__,
    instructions=INSTRUCTIONS,
    tools=[_StrictTool.from_function(fn) for fn in _TOOLS],
)

#: The tools' names, in the order tools/list gives them (``fragscope mcp --help`` lists these).
TOOL_NAMES = [fn.__name__ for fn in _TOOLS]


def _malformed_reply(exc: Exception) -> JSONRPCError:
    """The JSON-RPC error for a line the transport could not read as a message: "Parse
    error" (-32700) for text that is not JSON, "Invalid Request" (-32600) for JSON that is
    not a JSON-RPC message, answering the message's id when it has a usable one (JSON-RPC
    2.0 §5: null when it cannot be told)."""
    errors = exc.errors() if isinstance(exc, ValidationError) else []
    if errors and all(e.get("type") == "json_invalid" for e in errors):
        return JSONRPCError(jsonrpc="2.0", id=None, error=ErrorData(code=PARSE_ERROR, message="Parse error: not JSON"))
    rid = None
    for e in errors:
        sent = e.get("input")
        if isinstance(sent, dict) and isinstance(sent.get("id"), (str, int)) and not isinstance(sent.get("id"), bool):
            rid = sent["id"]
            break
    return JSONRPCError(
        jsonrpc="2.0",
        id=rid,
        error=ErrorData(code=INVALID_REQUEST, message="Invalid Request: not a JSON-RPC 2.0 request or notification"),
    )


async def _serve_stdio() -> None:
    """Serves over stdio, answering malformed input.

    The SDK's stdio transport hands a line it cannot parse to the server as an exception,
    which the server only logs: the client is left waiting for an answer that never comes.
    Between the transport and the server, this relay answers each such line with a
    JSON-RPC error (:func:`_malformed_reply`) and passes every message on. It needs the
    SDK's low-level server (``MCPServer._lowlevel_server``, SDK 2.x); without it, the
    server runs as the SDK does."""
    lowlevel = getattr(server, "_lowlevel_server", None)
    if lowlevel is None:
        await server.run_stdio_async()
        return
    async with stdio_server() as (read_stream, write_stream):
        send, receive = anyio.create_memory_object_stream(0)

        async def relay() -> None:
            async with send:
                async for item in read_stream:
                    if isinstance(item, Exception):
                        await write_stream.send(SessionMessage(_malformed_reply(item)))
                    else:
                        await send.send(item)

        async with anyio.create_task_group() as tg:
            tg.start_soon(relay)
            await lowlevel.run(receive, write_stream, lowlevel.create_initialization_options())
            # The server is done (the client closed the connection): stop relaying.
            tg.cancel_scope.cancel()


def main() -> None:
    """Serves over stdio until the client closes the connection."""
    anyio.run(_serve_stdio)


if __name__ == "__main__":
    main()
