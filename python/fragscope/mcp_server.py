"""``fragscope mcp``: a Model Context Protocol server (stdio) for coding agents.

An agent asked "why did my run OOM?" calls these tools on the user's snapshot and gets
fragscope's measured answers: figures read from the recording (summary, the allocator
state at a moment and who holds it, memory by role), the explanation (analyze, findings
first), what-ifs measured by replaying the recorded trace through fragscope's model of
PyTorch's caching allocator (replay_what_if), and the memory at a size nobody recorded
(predict). Every result says what it measured and how (``method``), and which window of
the trace it covers when a window was given.

Built on the official MCP Python SDK (``pip install 'fragscope[mcp]'``, the ``mcp``
package, 2.x). Each tool calls fragscope's library commands in this process (the Rust
extension ``fragscope._native``: the same typed requests and JSON documents the CLI
prints, docs/json-schema.md) on a worker thread with the GIL released, and returns a
compact digest of the document. A file fragscope refuses (unreadable, not a snapshot, a
pickle that asks to import code) or a bad argument is a tool error carrying the one-line
message, its parameters named as this server's arguments; the reader refuses hostile
input without panicking, so no file can take the server down.

Why Python and not the Rust SDK: ``rmcp`` went from 0.1 to 3.11 through three major
versions, and a minimal rmcp 3.11 stdio server (tokio, schemars, 97 crates) took 2145 s
wall to build in release on the project's shared 2-core machine and added 3.2 MB to the
binary; the official Python SDK adds no Rust build and is pinned in the ``mcp`` extra.

Run: ``fragscope mcp`` (or ``python -m fragscope.mcp_server``).
"""

from __future__ import annotations

import concurrent.futures
import json
import os
from typing import Any, Callable, Dict, List, Literal, Optional

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from . import _native
from ._errors import FragscopeError

INSTRUCTIONS = (
    "fragscope reads PyTorch CUDA memory snapshots (torch.cuda.memory._dump_snapshot "
    "pickles). Start with `analyze` on the snapshot (findings first: the OOM verdict, "
    "fragmentation, leaks, who holds memory at the peaks); `replay_what_if` measures "
    "allocator settings, a GPU size, empty_cache or no caching by replaying the trace; "
    "`allocator_state_at` and `top_holders` look at one moment (by call site, annotation or "
    "role); `roles` says what the memory is for (parameters, gradients, optimizer state, "
    "activations, ...); `predict` takes recordings at two or more sizes (batch size, sequence "
    "length) and predicts the memory at another; `window` (START..END by entry index, or "
    "12.5s..14s) restricts summary, analyze and roles to a stretch of the trace."
)

server = MCPServer("fragscope", instructions=INSTRUCTIONS)

#: Seconds a single command may run (a replay of a multi-GB trace takes a while).
TIMEOUT_S = float(os.environ.get("FRAGSCOPE_MCP_TIMEOUT", "900"))

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


#: Worker threads for the commands: a command's Rust code runs with the GIL released, so a
#: long replay never stalls the server's event loop or another tool call.
_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2), thread_name_prefix="fragscope")


def _run(what: str, work: Callable[[], str]) -> Dict[str, Any]:
    """Runs one library command (``work`` returns its JSON document) and returns the
    document, or raises a ToolError with fragscope's one-line message. Past TIMEOUT_S
    the tool answers with an error; the command finishes on its worker thread (Rust code
    cannot be interrupted mid-replay) and its result is dropped."""
    future = _POOL.submit(work)
    try:
        text = future.result(timeout=TIMEOUT_S)
    except concurrent.futures.TimeoutError:
        raise ToolError(f"fragscope {what} took longer than {TIMEOUT_S:.0f} s (FRAGSCOPE_MCP_TIMEOUT)")
    except FragscopeError as e:
        raise ToolError(str(e))
    except OSError as e:
        raise ToolError(f"cannot read: {e}")
    return json.loads(text)


def _load(path: str) -> Any:
    """The snapshot at ``path`` (refused or unreadable: FragscopeError, a tool error)."""
    return _native.load(_file(path))


def _file(path: str) -> str:
    if not path:
        raise ToolError("give the path of a snapshot file")
    p = os.path.expanduser(path)
    if not os.path.exists(p):
        raise ToolError(f"no such file: {path}")
    return p


def _pick(d: Dict[str, Any], keys: List[str]) -> Dict[str, Any]:
    return {k: d[k] for k in keys if k in d}


@server.tool()
def summary(path: str, window: Optional[str] = None) -> Dict[str, Any]:
    """Memory figures of a snapshot as torch.cuda.memory_summary() names them, per device:
    reserved/allocated/active bytes in the final state, fragmentation, largest free block,
    what the trace covers.

    Args:
        path: snapshot file (pickle from torch.cuda.memory._dump_snapshot, optionally gzipped).
        window: optional stretch of the trace, half-open START..END: entry indices
            ("1000..5000") or time since the first entry ("12.5s..14s", "..300ms").
    """
    _file(path)
    d = _run("summary", lambda: _load(path).summary_json(window))
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
        "method": READ,
        "window": f.get("window"),
        "format": f.get("format"),
        "settings": f.get("settings"),
        "devices": devices,
    }


@server.tool()
def analyze(path: str, window: Optional[str] = None, top: int = 5) -> Dict[str, Any]:
    """Explain a snapshot, findings first (most important first): the OOM (exhaustion,
    fragmentation or stranded memory, and settings a replay shows would have avoided it),
    fragmentation over time, leak suspects, who holds memory at the peaks, recommended
    settings.

    Args:
        path: snapshot file.
        window: optional stretch of the trace (see `summary`).
        top: call sites / suspects listed per table (1..50).
    """
    top = max(1, min(int(top), 50))
    _file(path)
    d = _run("analyze", lambda: _load(path).analyze_json(top, False, window))
    f = d["files"][0]
    devices = []
    for dev in f.get("devices", []):
        out: Dict[str, Any] = {"device": dev.get("device"), "findings": dev.get("findings", [])}
        oom = dev.get("oom")
        if oom:
            out["oom"] = {
                k: v
                for k, v in oom.items()
                if not isinstance(v, (list, dict)) or k in ("fixes", "verdict", "state", "holders")
            }
        out["peak_fragmentation"] = dev.get("peak_fragmentation")
        out["leak_suspects"] = (dev.get("leak_suspects") or [])[:top]
        out["recommendations"] = dev.get("recommendations")
        peaks = dev.get("peaks") or {}
        out["peaks"] = peaks
        devices.append(out)
    return {
        "schema": d.get("schema"),
        "file": f.get("file"),
        "method": READ + "; OOM fixes and recommendations measured by " + REPLAY,
        "window": f.get("window"),
        "recorded_config": f.get("recorded_config"),
        "devices": devices,
    }


@server.tool()
def explain_oom_text(text: str) -> Dict[str, Any]:
    """Explain a CUDA out-of-memory error message from its text (paste the whole
    "CUDA out of memory. Tried to allocate ..." message): the figures, whether
    fragmentation is the likely cause, and what to record next. No snapshot needed.

    Args:
        text: the error message (one or several; from a log).
    """
    if not text or not text.strip():
        raise ToolError("give the text of the CUDA out-of-memory error")
    d = _run("oom", lambda: _native.explain_oom_json(text))
    d["method"] = "the error message's own figures (no snapshot, no replay)"
    return d


@server.tool()
def replay_what_if(
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
    """
    _file(path)

    def work() -> str:
        return _load(path).replay_json(
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

    d = _run("replay", work)
    files = d.get("files") or [{}]
    devices = []
    for dev in files[0].get("devices", []):
        fidelity = _pick(
            dev,
            ["allocs", "allocs_matched", "segment_events", "segment_events_matched", "undecidable", "final_state_matches"],
        )
        rows = []
        for w in dev.get("whatif", []):
            row = {k: v for k, v in w.items() if k not in ("notes",)}
            if w.get("notes"):
                row["notes"] = w["notes"][:3]
            rows.append(row)
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


def _state(
    path: str, event: Optional[int], time: Optional[str], device: Optional[int], by: str, top: int
) -> Dict[str, Any]:
    if event is not None and time is not None:
        raise ToolError("give an event index or a time, not both")
    if event is not None and event < 0:
        raise ToolError("event is a trace entry index (>= 0)")
    top = max(1, min(int(top), 100))
    _file(path)
    return _run("state", lambda: _load(path).state_json(event, time, device, by, top))


@server.tool()
def allocator_state_at(
    path: str, event: Optional[int] = None, time: Optional[str] = None, device: Optional[int] = None
) -> Dict[str, Any]:
    """The allocator state at one moment: reserved, allocated, cached free bytes, the
    largest free block, free-space fragmentation and free space per (stream, pool).

    Args:
        path: snapshot file.
        event: the state after this trace entry (0-based index). Default: the end.
        time: or a time since the first trace entry ("12.5s", "300ms").
        device: device (default: the first with a trace).
    """
    d = _state(path, event, time, device, "site", 5)
    d.pop("holders", None)
    d.pop("other_bytes", None)
    d.pop("holders_by", None)
    return d


@server.tool()
def top_holders(
    path: str,
    event: Optional[int] = None,
    time: Optional[str] = None,
    by: Literal["site", "annotation", "role"] = "site",
    top: int = 10,
    device: Optional[int] = None,
) -> Dict[str, Any]:
    """Who holds the allocated memory at one moment: live bytes grouped by call site
    (innermost user frame of the allocation stack), by annotation (innermost
    record_function scope open at the allocation) or by role (parameters, gradients,
    optimizer_state, activations, temporaries, inputs, other), most bytes first.

    Args:
        path: snapshot file.
        event: after this trace entry (0-based). Default: the end of the trace.
        time: or a time since the first trace entry ("12.5s").
        by: "site", "annotation" or "role".
        top: rows listed (the rest is summed in other_bytes).
        device: device (default: the first with a trace).
    """
    d = _state(path, event, time, device, by, top)
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
        ],
    )


@server.tool()
def roles(path: str, window: Optional[str] = None, device: Optional[int] = None) -> Dict[str, Any]:
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
    d = _run("summary", lambda: _load(path).summary_json(window))
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


@server.tool()
def predict(
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
    files = [_file(p) for p in paths]

    def work() -> str:
        snaps = [_native.load(f, p) for f, p in zip(files, paths)]
        return _native.predict_json(
            snaps, [int(x) for x in sizes], [int(x) for x in at or []], config or None, capacity or None, bool(max_fit), device
        )

    d = _run("predict", work)
    preds = []
    for p in d.get("predictions", []):
        row = {
            k: v
            for k, v in p.items()
            if not isinstance(v, (list, dict)) or k in ("oom", "fit_quality", "breakdown")
        }
        if isinstance(row.get("oom"), dict):
            row["oom"] = {k: v for k, v in row["oom"].items() if k != "stack"}
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


@server.tool()
def diff(path_a: str, path_b: str, top: int = 10) -> Dict[str, Any]:
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
    d = _run("diff", lambda: _load(path_a).diff_json(_load(path_b), top))
    d["method"] = READ + " (peaks from each trace's timeline)"
    return d


def main() -> None:
    """Serves over stdio until the client closes the connection."""
    server.run("stdio")


if __name__ == "__main__":
    main()
