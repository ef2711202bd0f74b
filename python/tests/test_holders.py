"""Who holds it: chains of gc referrers, on plain Python objects (the walk needs no torch)
and through fragscope.torch.who_holds with a FAKE torch (stand-in tensors, no GPU)."""

from __future__ import annotations

import sys
import types

import pytest

import fake_torch
import fragscope.torch as ft
from fragscope.holders import referrer_chains


class Blob:
    """A stand-in for a tensor: any object gc tracks the referrers of."""


class Adam:
    def __init__(self, param):
        self.state = {param: {"exp_avg": Blob()}}


@pytest.fixture
def module(monkeypatch):
    m = types.ModuleType("train_script")
    monkeypatch.setitem(sys.modules, "train_script", m)
    return m


def paths(obj):
    return {c.path: c.kind for c in referrer_chains(obj)}


def test_module_global_list(module):
    module.cache = [1, 2, Blob()]
    got = paths(module.cache[2])
    assert got.get("train_script.cache[2]") == "module global", got


def test_optimizer_state(module):
    p = Blob()
    module.opt = Adam(p)
    target = module.opt.state[p]["exp_avg"]
    got = paths(target)
    assert got.get("train_script.opt.state[<test_holders.Blob>]['exp_avg']") == "module global", got


def test_closure(module):
    def make():
        kept = Blob()

        def f():
            return kept

        return f

    module.hook = make()
    target = module.hook.__closure__[0].cell_contents
    assert paths(target).get("train_script.hook.__closure__[0]") == "module global"


@pytest.fixture
def no_collection():
    """A cycle is garbage: the collector may free it at any allocation. What who_holds
    reports is the moment before that, so hold the collector off for these tests."""
    import gc

    was = gc.isenabled()
    gc.disable()
    yield
    if was:
        gc.enable()


def test_reference_cycle(no_collection):
    class Node:
        pass

    n = Node()
    n.self = n
    n.t = Blob()
    target = n.t
    del n
    chains = referrer_chains(target)
    cyc = [c for c in chains if c.kind == "reference cycle"]
    assert cyc and cyc[0].steps == [".self", ".t"], [str(c) for c in chains]


def test_local_variable_of_a_running_frame():
    def holder():
        mine = Blob()
        return {c.root: c for c in referrer_chains(mine) if c.kind == "local variable"}

    got = holder()
    assert "mine" in got and "holder()" in got["mine"].where


def test_who_holds_block_address_fake_torch(module, monkeypatch):
    t = fake_torch.make()
    monkeypatch.setitem(sys.modules, "torch", t)
    module.kv_cache = {"layer0": t.Tensor(0x7F00_0000_0400)}
    module.other = [t.Tensor(0x7F00_0100_0000)]
    # A block of 2 MiB at 0x7f0000000000 holds the first tensor's storage, not the second.
    found = ft.tensors_in(0x7F00_0000_0000, 2 << 20)
    assert found == [module.kv_cache["layer0"]]
    del found
    chains = ft.who_holds(0x7F00_0000_0000, size=2 << 20)
    assert any(c.path == "train_script.kv_cache['layer0']" for c in chains), [str(c) for c in chains]
    assert any(c.path == "train_script.other[0]" for c in ft.who_holds(module.other[0]))


def test_two_object_cycle(no_collection):
    class A:
        pass

    class B:
        pass

    a, b = A(), B()
    a.b, b.a, b.t = b, a, Blob()
    target = b.t
    del a, b
    cyc = [c for c in referrer_chains(target) if c.kind == "reference cycle"]
    assert any(c.steps in ([".b", ".a", ".b", ".t"], [".a", ".b", ".t"]) for c in cyc), [str(c) for c in cyc]


def test_blocks_by_site_on_real_snapshots():
    from conftest import real_pickles

    files = real_pickles()[:12]
    assert files, "no real snapshots"
    import fragscope

    for path in files:
        snap = fragscope.load(path)
        blocks = snap.blocks()
        per_device = {}
        for b in blocks:
            assert b["state"] == "active_allocated"
            per_device[b["device"]] = per_device.get(b["device"], 0) + b["size"]
        summary = {d["device"]: d["allocated_bytes"] for d in snap.summary().to_dict()["files"][0]["devices"]}
        assert {d: n for d, n in per_device.items()} == {d: n for d, n in summary.items() if n}, path.name
        sites = {b["site"] for b in blocks}
        assert sum(len(snap.blocks(site=s)) for s in sites) == len(blocks)
        assert len(snap.blocks(allocated_only=False)) >= len(blocks)


def test_who_holds_site_fake_torch(module, monkeypatch):
    from conftest import real_file

    path = real_file("effdl-course-liger-ce.pickle")
    t = fake_torch.make(snapshot_file=str(path))
    monkeypatch.setitem(sys.modules, "torch", t)
    live = ft.snapshot()
    site = max({b["site"] for b in live.blocks()}, key=lambda s: len(live.blocks(site=s)))
    want = live.blocks(site=site)
    # Stand-in tensors stored in those blocks, kept alive by a list in a module global.
    module.activations = [t.Tensor(b["address"]) for b in want]
    got = ft.who_holds_site(site)
    assert len(got) == len(want)
    for i, chains in enumerate(got.values()):
        assert any(c.path == f"train_script.activations[{i}]" for c in chains), [str(c) for c in chains]
