"""A FAKE `torch` module for testing fragscope's plumbing without PyTorch or a GPU.

It imitates only the calls fragscope.torch and the pytest plugin make
(torch.cuda.is_available, memory._record_memory_history, memory._snapshot, memory_stats,
_C._cuda_attach_out_of_memory_observer, profiler.record_function, OutOfMemoryError) and
records them in `calls`. `_snapshot()` returns `pickle.load` of a real snapshot file, so
what fragscope analyses is real data; nothing here touches a GPU. Tests that use it say
"fake" in their names: the real-GPU path is NOT exercised by them.
"""

from __future__ import annotations

import contextlib
import gzip
import pickle
import sys
import types
from typing import Any, Callable, Dict, List, Optional


def make(snapshot_file: Optional[str] = None, cuda: bool = True, stats: Optional[Dict[str, int]] = None) -> types.ModuleType:
    has_cuda = cuda
    torch = types.ModuleType("torch")
    torch.__dict__["FAKE"] = True
    calls: List[tuple] = []
    observers: List[Callable[..., None]] = []
    torch.calls = calls
    torch.observers = observers
    stats_now: Dict[str, int] = dict(stats or {})
    torch.stats = stats_now

    class OutOfMemoryError(RuntimeError):
        pass

    # A test body may point `torch.snapshot_file` at the snapshot its own run would make.
    torch.snapshot_file = snapshot_file

    def _snapshot() -> Any:
        calls.append(("_snapshot",))
        path = torch.snapshot_file
        with open(path, "rb") as f:
            head = f.read(2)
        opener = gzip.open if head == b"\x1f\x8b" else open
        with opener(path, "rb") as f:
            return pickle.load(f)

    memory = types.SimpleNamespace(
        _record_memory_history=lambda enabled="all", **kw: calls.append(("_record_memory_history", enabled, kw)),
        _snapshot=_snapshot,
    )
    cuda = types.SimpleNamespace(
        is_available=lambda: has_cuda,
        synchronize=lambda *a: calls.append(("synchronize",)),
        reset_peak_memory_stats=lambda *a: calls.append(("reset_peak_memory_stats",)),
        memory_stats=lambda device=None: dict(stats_now),
        memory=memory,
        OutOfMemoryError=OutOfMemoryError,
    )
    torch.cuda = cuda

    def attach(fn: Callable[..., None]) -> None:
        calls.append(("_cuda_attach_out_of_memory_observer",))
        observers.append(fn)

    torch._C = types.SimpleNamespace(_cuda_attach_out_of_memory_observer=attach)

    @contextlib.contextmanager
    def record_function(name: str):
        calls.append(("record_function", name))
        yield

    torch.profiler = types.SimpleNamespace(record_function=record_function)

    class Tensor:
        """A stand-in with the two things who_holds reads: is_cuda and the storage pointer."""

        def __init__(self, ptr: int) -> None:
            self.is_cuda = True
            self._ptr = ptr

        def untyped_storage(self) -> Any:
            return types.SimpleNamespace(data_ptr=lambda: self._ptr)

    torch.Tensor = Tensor
    return torch


LAST: Optional[types.ModuleType] = None


def install(**kw: Any) -> types.ModuleType:
    """Puts a fake torch in sys.modules; `LAST` keeps it for the test to inspect after a
    pytester run has restored sys.modules."""
    global LAST
    t = make(**kw)
    sys.modules["torch"] = t
    LAST = t
    return t
