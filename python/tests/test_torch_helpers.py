"""fragscope.torch against a FAKE torch module (fake_torch.py): the plumbing only — the
calls made to PyTorch's API, the files written, the warnings. No GPU and no real torch
are involved; the real-GPU path of these helpers is NOT exercised here."""

from __future__ import annotations

import sys

import pytest

import fragscope
import fragscope.torch as ft
import fake_torch
from conftest import real_file

SNAP_NAME = "effdl-course-liger-ce.pickle"  # a small real snapshot, in the repository and the corpus


@pytest.fixture
def fake(monkeypatch):
    t = fake_torch.make(snapshot_file=str(real_file(SNAP_NAME)))
    monkeypatch.setitem(sys.modules, "torch", t)
    return t


def test_import_fragscope_needs_no_torch():
    import subprocess

    code = "import sys, fragscope; assert 'torch' not in sys.modules; print('ok')"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "ok"


def test_clear_errors_without_torch_or_cuda(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(ft.CudaUnavailable, match="needs PyTorch"):
        ft.snapshot()
    monkeypatch.setitem(sys.modules, "torch", fake_torch.make(cuda=False))
    for call in (ft.snapshot, lambda: ft.record().__enter__(), ft.dump_on_oom, ft.StepTracker):
        with pytest.raises(ft.CudaUnavailable, match="CUDA is not available"):
            call()


def test_record_fake_torch(fake, tmp_path):
    out = tmp_path / "rec.pickle"
    with ft.record(dump_to=out) as rec:
        live = rec.snapshot()
    assert fake.calls[0] == ("_record_memory_history", "all", {"context": "all", "stacks": "python", "max_entries": 100_000})
    assert fake.calls[-1][:2] == ("_record_memory_history", None)
    # The dump is a protocol-4 pickle and reads as the same snapshot as the live dict.
    data = out.read_bytes()
    assert data[:2] == b"\x80\x04"
    by_file = fragscope.load(out, name="x").summary().to_json()
    assert by_file == fragscope.from_dict(fake.cuda.memory._snapshot(), name="x").summary().to_json()
    assert live.summary().to_dict()["files"][0]["devices"] == fragscope.load(real_file(SNAP_NAME)).summary().to_dict()["files"][0]["devices"]


def test_record_stops_and_dumps_when_the_block_raises_fake_torch(fake, tmp_path):
    out = tmp_path / "boom.pickle"
    with pytest.raises(KeyError):
        with ft.record(dump_to=out, max_entries=10, stacks="all"):
            raise KeyError("x")
    assert out.is_file()
    assert fake.calls[0][2]["max_entries"] == 10 and fake.calls[0][2]["stacks"] == "all"
    assert fake.calls[-1][:2] == ("_record_memory_history", None)


def test_dump_on_oom_observer_fake_torch(fake, tmp_path):
    lines = []
    observer = ft.dump_on_oom(tmp_path / "ooms", out=lines.append)
    assert fake.observers == [observer]
    assert fake.calls[0][:2] == ("_record_memory_history", "all")
    # What the allocator does on an OOM: call the observer (device, alloc, device_alloc, device_free).
    fake.observers[0](0, 2 << 30, 10 << 30, 1 << 20)
    written = list((tmp_path / "ooms").glob("oom-rank*-1.pickle"))
    assert len(written) == 1
    assert any("CUDA out of memory on device 0" in l and str(written[0]) in l for l in lines)
    verdict = [l for l in lines if l.startswith("fragscope: device 0:")]
    expected = fragscope.load(written[0]).analyze().to_dict()["files"][0]["devices"][0]["findings"][0]["headline"]
    assert verdict and expected in verdict[0]


def test_oom_guard_exception_path_fake_torch(fake, tmp_path):
    lines = []
    path = tmp_path / "guard.pickle"
    with pytest.raises(fake.cuda.OutOfMemoryError):
        with ft.oom_guard(path, out=lines.append):
            raise fake.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    assert path.is_file() and "snapshot written" in lines[0]
    with ft.oom_guard(tmp_path / "never.pickle"):
        pass
    assert not (tmp_path / "never.pickle").exists()


def test_step_tracker_fake_torch(fake):
    warned = []
    tr = ft.StepTracker(max_fragmentation=0.25, patience=2, warn=warned.append)
    fake.stats.update({"reserved_bytes.all.current": 100, "allocated_bytes.all.current": 90, "num_alloc_retries": 0})
    s = tr.step()
    assert (s.reserved, s.allocated, s.cuda_mallocs) == (100, 90, None) and abs(s.fragmentation - 0.1) < 1e-9
    fake.stats.update({"allocated_bytes.all.current": 50, "num_device_alloc": 7})
    tr.step()
    assert warned == []
    fake.stats.update({"num_alloc_retries": 3})
    s = tr.step()
    assert s.cuda_mallocs == 7
    assert any("fragmentation 50.0%" in w for w in warned)
    assert any("3 allocation retries" in w for w in warned)
    assert [x.step for x in tr.samples] == [0, 1, 2]


def test_phase_fake_torch(fake):
    with ft.phase("step"):
        pass
    assert ("record_function", "step") in fake.calls
