"""Recording helpers for a live PyTorch process: record, dump on OOM, watch each step.

Imported on demand (``import fragscope.torch``), so ``import fragscope`` never needs torch.
Every helper raises :class:`CudaUnavailable` with one clear sentence when torch is not
installed or CUDA is not available, instead of failing somewhere inside PyTorch.

* :func:`record` — a context manager around ``torch.cuda.memory._record_memory_history``
  with sensible defaults: a bounded ring buffer (``max_entries=100_000``), Python stacks
  (``stacks="python"``: ``"all"`` adds C++ frames and can make dumps 100x slower), and a
  protocol-4 pickle dump that every viewer (memory_viz, fragscope) reads.
* :func:`dump_on_oom` — PyTorch's out-of-memory observer
  (``torch._C._cuda_attach_out_of_memory_observer``) writes the snapshot the moment the
  allocator fails, and prints fragscope's one-line verdict. :func:`oom_guard` is the
  exception path (a ``torch.cuda.OutOfMemoryError`` raised in a block).
* :class:`StepTracker` — samples ``torch.cuda.memory_stats()`` once per step (reserved,
  allocated, fragmentation, allocation retries, cudaMalloc count) and warns when
  fragmentation or retries climb.
* :func:`phase` — ``torch.profiler.record_function`` under a name, so that training steps
  (``phase("step")``) and phases are found from annotations in the snapshot.
* :func:`cache` — declares a cache that grows by design (a KV cache, a memo of results):
  memory allocated inside it is never a leak suspect.
* :func:`who_holds` — from a tensor, or a block's address in a snapshot (a leak suspect,
  a large holder at the peak), to the chains of Python objects that keep it alive
  (:mod:`fragscope.holders`).
"""

from __future__ import annotations

import contextlib
import gc
import os
import pickle
import sys
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Optional

if TYPE_CHECKING:
    from fragscope.holders import Chain

import fragscope

__all__ = [
    "CudaUnavailable",
    "record",
    "Recording",
    "snapshot",
    "dump_snapshot",
    "dump_on_oom",
    "oom_guard",
    "StepTracker",
    "StepSample",
    "phase",
    "cache",
    "tensors_in",
    "who_holds",
    "who_holds_site",
]


class CudaUnavailable(RuntimeError):
    """torch is not installed, or it sees no CUDA device: nothing to record."""


def _torch() -> Any:
    """torch with CUDA, or :class:`CudaUnavailable` saying which of the two is missing."""
    try:
        import torch
    except ImportError as e:
        raise CudaUnavailable(
            "fragscope.torch needs PyTorch: pip install 'fragscope[torch]' (or torch); "
            f"importing torch failed: {e}"
        ) from None
    if not torch.cuda.is_available():
        raise CudaUnavailable(
            "CUDA is not available (torch.cuda.is_available() is False): no CUDA memory to record"
        )
    return torch


def snapshot(name: str = "<live process>") -> "fragscope.Snapshot":
    """The allocator's state and history now (``torch.cuda.memory._snapshot()``) as a
    :class:`fragscope.Snapshot`, converted in memory without pickling."""
    torch = _torch()
    return fragscope.from_dict(torch.cuda.memory._snapshot(), name=name)


def dump_snapshot(path: "os.PathLike[str] | str") -> str:
    """Writes ``torch.cuda.memory._snapshot()`` to ``path`` as a protocol-4 pickle (what
    ``_dump_snapshot`` writes, with a protocol every viewer reads). Returns the path."""
    torch = _torch()
    path = os.fspath(path)
    data = torch.cuda.memory._snapshot()
    # Written as every fragscope output is (a regular file or nothing at ``path``, through
    # an exclusive temporary file renamed over it): a symlink or FIFO there is refused.
    fragscope._native.save_bytes(path, pickle.dumps(data, protocol=4))
    return path


class Recording:
    """What :func:`record` yields: take a snapshot or dump one while recording."""

    def __init__(self, torch: Any) -> None:
        self._torch = torch

    def snapshot(self, name: str = "<live process>") -> "fragscope.Snapshot":
        return fragscope.from_dict(self._torch.cuda.memory._snapshot(), name=name)

    def dump(self, path: "os.PathLike[str] | str") -> str:
        return dump_snapshot(path)


@contextlib.contextmanager
def record(
    max_entries: int = 100_000,
    stacks: str = "python",
    context: Optional[str] = "all",
    dump_to: "os.PathLike[str] | str | None" = None,
) -> Iterator[Recording]:
    """Records allocator history inside the block (``_record_memory_history``), then stops.

    ``max_entries`` bounds the ring buffer (each entry keeps its stack); ``stacks="python"``
    keeps Python frames only (``"all"`` adds C++ frames, far slower to dump); ``context``
    is PyTorch's (``"all"``: alloc and free stacks, ``"alloc"``, ``"state"``, ``None``).
    With ``dump_to``, the snapshot is written there when the block ends (also when it
    raises: that is when it is wanted most).
    """
    torch = _torch()
    torch.cuda.memory._record_memory_history(enabled="all", context=context, stacks=stacks, max_entries=max_entries)
    try:
        yield Recording(torch)
    finally:
        try:
            if dump_to is not None:
                dump_snapshot(dump_to)
        finally:
            torch.cuda.memory._record_memory_history(enabled=None)


def _verdict_line(path: str) -> str:
    """fragscope's one-line verdict of a dumped snapshot (the first finding of each device)."""
    try:
        a = fragscope.load(path).analyze()
    except fragscope.FragscopeError as e:
        return f"fragscope: cannot analyse {path}: {e}"
    lines = []
    for d in a.to_dict()["files"][0]["devices"]:
        if d["findings"]:
            lines.append(f"device {d['device']}: {d['findings'][0]['headline']}")
    return "fragscope: " + ("; ".join(lines) if lines else "nothing notable") + f" (snapshot: {path})"


def dump_on_oom(
    directory: "os.PathLike[str] | str" = ".",
    prefix: str = "oom",
    record_history: bool = True,
    max_entries: int = 100_000,
    stacks: str = "python",
    verdict: bool = True,
    out: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True),
) -> Callable[..., None]:
    """Writes a snapshot the moment the CUDA caching allocator runs out of memory.

    Registers PyTorch's out-of-memory observer (called by the allocator, before the
    ``OutOfMemoryError`` is raised, with ``device, alloc, device_alloc, device_free``),
    which dumps ``<directory>/<prefix>-rank<R>-<pid>-<n>.pickle`` and, with ``verdict``,
    prints fragscope's one-line verdict. With ``record_history`` it also starts recording
    (bounded, Python stacks) so that the dump holds the events that led to the OOM.
    Returns the observer (PyTorch offers no way to detach one).
    """
    torch = _torch()
    os.makedirs(directory, exist_ok=True)
    if record_history:
        torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks=stacks, max_entries=max_entries)
    count = [0]

    def observer(device: int, alloc: int, device_alloc: int, device_free: int) -> None:
        count[0] += 1
        rank = os.environ.get("RANK", "0")
        path = os.path.join(os.fspath(directory), f"{prefix}-rank{rank}-{os.getpid()}-{count[0]}.pickle")
        try:
            dump_snapshot(path)
        except Exception as e:  # never turn an OOM into a different error
            out(f"fragscope: could not dump the OOM snapshot to {path}: {e}")
            return
        out(
            f"fragscope: CUDA out of memory on device {device} (request {alloc} bytes, "
            f"{device_free} bytes free on the device); snapshot written to {path}"
        )
        if verdict:
            out(_verdict_line(path))

    torch._C._cuda_attach_out_of_memory_observer(observer)
    return observer


@contextlib.contextmanager
def oom_guard(
    path: "os.PathLike[str] | str" = "oom.pickle",
    verdict: bool = True,
    out: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True),
) -> Iterator[None]:
    """The exception path: when ``torch.cuda.OutOfMemoryError`` leaves the block, dump the
    snapshot to ``path`` (and print the verdict), then let the error propagate."""
    torch = _torch()
    oom_type = getattr(torch.cuda, "OutOfMemoryError", RuntimeError)
    try:
        yield
    except oom_type as e:
        if isinstance(e, oom_type) and "out of memory" in str(e).lower():
            written = dump_snapshot(path)
            out(f"fragscope: {type(e).__name__} caught; snapshot written to {written}")
            if verdict:
                out(_verdict_line(written))
        raise


@dataclass
class StepSample:
    """``memory_stats()`` figures of one step (bytes, counts)."""

    step: int
    reserved: int
    allocated: int
    peak_reserved: int
    peak_allocated: int
    fragmentation: float
    alloc_retries: int
    cuda_mallocs: Optional[int]
    ooms: int


def sample_from_stats(step: int, stats: Dict[str, Any]) -> StepSample:
    """A :class:`StepSample` from a ``torch.cuda.memory_stats()`` dict. Fragmentation is
    ``1 - allocated / reserved`` (cached memory no tensor holds). ``num_device_alloc``
    (cudaMalloc calls) exists from PyTorch 2.4 on; before that it is ``None``."""
    reserved = int(stats.get("reserved_bytes.all.current", 0))
    allocated = int(stats.get("allocated_bytes.all.current", 0))
    return StepSample(
        step=step,
        reserved=reserved,
        allocated=allocated,
        peak_reserved=int(stats.get("reserved_bytes.all.peak", 0)),
        peak_allocated=int(stats.get("allocated_bytes.all.peak", 0)),
        fragmentation=(1.0 - allocated / reserved) if reserved else 0.0,
        alloc_retries=int(stats.get("num_alloc_retries", 0)),
        cuda_mallocs=int(stats["num_device_alloc"]) if "num_device_alloc" in stats else None,
        ooms=int(stats.get("num_ooms", 0)),
    )


@dataclass
class StepTracker:
    """Per-step memory figures at almost no cost (``memory_stats()`` reads counters; no
    history is recorded). Call :meth:`step` once per training step; it warns
    (``ResourceWarning``) when fragmentation rises above ``max_fragmentation`` for
    ``patience`` steps in a row, or when allocation retries (cache flushes before a
    cudaMalloc is retried: the sign of fragmentation pressure) increase."""

    device: Optional[int] = None
    max_fragmentation: float = 0.3
    patience: int = 3
    samples: List[StepSample] = field(default_factory=list)
    warn: Callable[[str], None] = lambda msg: warnings.warn(msg, ResourceWarning, stacklevel=3)
    _high: int = 0
    _torch: Any = None

    def __post_init__(self) -> None:
        self._torch = _torch()

    def step(self) -> StepSample:
        stats = self._torch.cuda.memory_stats(self.device)
        return self.add(sample_from_stats(len(self.samples), stats))

    def add(self, s: StepSample) -> StepSample:
        """Records a sample and warns as :meth:`step` does (for samples made elsewhere)."""
        prev = self.samples[-1] if self.samples else None
        self.samples.append(s)
        self._high = self._high + 1 if s.fragmentation > self.max_fragmentation else 0
        if self._high == self.patience:
            self.warn(
                f"fragscope: fragmentation {s.fragmentation:.1%} (reserved {s.reserved} B, allocated "
                f"{s.allocated} B) above {self.max_fragmentation:.0%} for {self.patience} steps; "
                "try PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True and record a snapshot"
            )
        if prev is not None and s.alloc_retries > prev.alloc_retries:
            self.warn(
                f"fragscope: {s.alloc_retries - prev.alloc_retries} allocation retries in step {s.step} "
                f"({s.alloc_retries} in all): the cache was flushed to satisfy a cudaMalloc"
            )
        return s


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """Marks a phase (``"step"``, ``"forward"``, ...) with ``torch.profiler.record_function``
    so that snapshots recorded meanwhile carry it as an annotation. ``phase("step")`` around
    each training step bounds the steps where the frames do not (no optimizer or backward
    frame): leak detection needs two steps or more."""
    torch = _torch()
    with torch.profiler.record_function(name):
        yield


@contextlib.contextmanager
def cache(name: str = "") -> Iterator[None]:
    """Declares a cache that grows by design (a KV cache, memoised results): the memory
    allocated inside the block is recorded under the ``record_function`` scope
    ``fragscope.cache`` (``fragscope.cache:NAME``), and leak detection leaves it out."""
    torch = _torch()
    with torch.profiler.record_function(f"fragscope.cache:{name}" if name else "fragscope.cache"):
        yield


def tensors_in(address: int, size: int = 1) -> List[Any]:
    """The live CUDA tensors whose storage starts in ``[address, address + size)``: the
    tensors of a snapshot block (its ``address`` and ``size``)."""
    torch = _torch()
    out = []
    for o in gc.get_objects():
        try:
            if isinstance(o, torch.Tensor) and o.is_cuda:
                ptr = o.untyped_storage().data_ptr()
                if address <= ptr < address + max(size, 1):
                    out.append(o)
        except Exception:  # a half-built or exotic tensor subclass: not ours to judge
            continue
    return out


def who_holds(target: Any, size: int = 1, max_depth: int = 10, max_chains: int = 8) -> List["Chain"]:
    """Who keeps a tensor alive: the chains of referrers from roots (a module global, a
    running frame's variable, a reference cycle) to it. ``target`` is a tensor, or the
    address of a snapshot block (then ``size`` is the block's size and every tensor whose
    storage starts in it is followed)."""
    from fragscope.holders import referrer_chains

    if isinstance(target, int):
        chains = []
        found = tensors_in(target, size)
        for t in found:
            chains += referrer_chains(t, max_depth=max_depth, max_chains=max_chains)
        del found
        return chains
    return referrer_chains(target, max_depth=max_depth, max_chains=max_chains)


def who_holds_site(site: str, snap: "Optional[fragscope.Snapshot]" = None, max_chains: int = 8) -> Dict[str, List["Chain"]]:
    """Who keeps the memory of a call site alive (a leak suspect's site, a large holder at
    the peak, as ``analyze`` names it): for each of its allocated blocks in ``snap`` (default:
    the live allocator now), the referrer chains of the tensors stored there, keyed by
    ``"device D block 0xADDR (SIZE)"``."""
    if snap is None:
        snap = snapshot()
    out: Dict[str, List[Any]] = {}
    for b in snap.blocks(site=site):
        key = f"device {b['device']} block {b['address']:#x} ({fragscope._fmt_bytes(b['size'])})"
        out[key] = who_holds(b["address"], size=b["size"], max_chains=max_chains)
    return out
