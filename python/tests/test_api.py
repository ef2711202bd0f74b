"""The Python API against the CLI's --json on every real snapshot, and on bad input."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import fragscope
from conftest import REPO, TRACES, cli_path, params, real_files, real_pickles, run_cli

FILES = real_files()
PICKLES = real_pickles()


def cli_json(*args: str):
    """(stdout, None) on success, (None, the error line without `error: `) on exit 2."""
    p = run_cli(*args)
    if p.returncode == 2:
        line = p.stderr.strip().splitlines()[-1]
        assert line.startswith("error: "), p.stderr
        return None, line[len("error: "):]
    assert p.returncode == 0, (p.returncode, p.stderr)
    return p.stdout, None


TIMING_KEYS = {"seconds", "ops_per_second", "cpu_seconds", "events_per_cpu_second"}


def without_timings(v):
    """A JSON value with the lab's per-run timing fields removed (they differ run to run)."""
    if isinstance(v, dict):
        return {k: without_timings(x) for k, x in v.items() if k not in TIMING_KEYS}
    if isinstance(v, list):
        return [without_timings(x) for x in v]
    return v


def same_as_cli(cli_args, api_call):
    """The API's to_json() is byte for byte the CLI's --json; an error is the same line."""
    out, err = cli_json(*cli_args)
    if err is not None:
        with pytest.raises(fragscope.FragscopeError) as e:
            api_call()
        assert str(e.value) == err
        return None
    result = api_call()
    assert result.to_json() == out
    assert result.to_dict() == json.loads(out)
    return result


@pytest.mark.parametrize("path", params(FILES))
def test_summary_equals_cli(path):
    r = same_as_cli(["summary", "--json", str(path)], lambda: fragscope.load(str(path)).summary())
    if r is not None:
        assert r.schema == "fragscope.summary/1"
        assert r.file == str(path)
        assert "<table>" in r._repr_html_()
        assert [d.device for d in r.devices] == fragscope.load(str(path)).devices


@pytest.mark.parametrize("path", params(FILES))
def test_analyze_equals_cli(path):
    r = same_as_cli(["analyze", "--json", str(path)], lambda: fragscope.load(str(path)).analyze())
    if r is not None:
        assert r.schema == "fragscope.analyze/1"
        for d, raw in zip(r.devices, r.to_dict()["files"][0]["devices"]):
            assert d.device == raw["device"]
            assert [f.headline for f in d.findings] == [f["headline"] for f in raw["findings"]]
        assert ("<table>" in r._repr_html_()) == bool(r.devices)


@pytest.mark.parametrize("path", params(FILES))
def test_bytes_equal_path(path):
    """loads(bytes) reads what load(path) reads."""
    data = path.read_bytes()
    try:
        by_path = fragscope.load(path).summary().to_json()
    except fragscope.FragscopeError as e:
        with pytest.raises(fragscope.FragscopeError) as e2:
            fragscope.loads(data, name=str(path))
        assert str(e2.value) == str(e)
        return
    assert fragscope.loads(data, name=str(path)).summary().to_json() == by_path


def _pickle_load(path: Path):
    import gzip

    with open(path, "rb") as f:
        head = f.read(2)
    opener = gzip.open if head == b"\x1f\x8b" else open
    with opener(path, "rb") as f:
        return pickle.load(f)


@pytest.mark.parametrize("path", params(PICKLES))
def test_dict_path_equals_file(path):
    """pickle.load of the file, handed over as the live dict: the same figures as the file."""
    try:
        by_path = fragscope.load(path)
    except fragscope.FragscopeError as e:
        pytest.skip(f"the reader refuses {path.name} ({e}); nothing to compare")
    obj = _pickle_load(path)
    snap = fragscope.from_dict(obj, name=str(path))
    assert snap.format == by_path.format
    assert snap.devices == by_path.devices
    assert snap.trace_events == by_path.trace_events
    assert snap.summary().to_json() == by_path.summary().to_json()
    assert snap.analyze().to_json() == by_path.analyze().to_json()


REPLAY_FILES = [p for p in PICKLES if p.stat().st_size < 20 << 20][:8]


@pytest.mark.parametrize("path", params(REPLAY_FILES))
def test_replay_and_check_equal_cli(path, tmp_path):
    snap_fn = lambda: fragscope.load(str(path))  # noqa: E731
    same_as_cli(["replay", "--verify", "--json", str(path)], lambda: snap_fn().replay(verify=True))
    same_as_cli(["replay", "--json", str(path)], lambda: snap_fn().replay())
    same_as_cli(
        ["replay", "--json", "--config", "expandable_segments:True", "--capacity", "T4", str(path)],
        lambda: snap_fn().replay(configs=["expandable_segments:True"], capacity="T4"),
    )
    same_as_cli(
        ["replay", "--json", "--empty-cache-at", "iteration", "--no-caching", str(path)],
        lambda: snap_fn().replay(empty_cache_at="iteration", no_caching=True),
    )
    # The allocator lab: equal to the CLI's but for its timing fields (measured per run).
    out, err = cli_json("replay", "--json", "--allocator", "best-fit", "--allocator", "expandable", str(path))
    assert err is None, err
    assert without_timings(snap_fn().lab(["best-fit", "expandable"]).to_dict()) == without_timings(json.loads(out))
    limits = ["--max-reserved", "1GiB", "--max-fragmentation", "10%", "--no-leaks"]
    p = run_cli("check", "--json", *limits, str(path))
    assert p.returncode in (0, 1), p.stderr
    c = snap_fn().check(max_reserved="1GiB", max_fragmentation="10%", no_leaks=True)
    assert c.to_json() == p.stdout
    assert bool(c) == (p.returncode == 0) == c.ok
    text = run_cli("check", *limits, str(path)).stdout.strip()
    if c.ok:
        assert c.message is None and text.startswith("check passed")
    else:
        assert c.message == text


def test_diff_equals_cli():
    a, b = TRACES / "cs336-2.7b-fwd-ctx128-bf16.pickle", TRACES / "cs336-2.7b-fwd-ctx128-fp32.pickle"
    if not a.is_file():
        pytest.skip(f"{a} not found")
    r = same_as_cli(["diff", "--json", "--top", "5", str(a), str(b)],
                    lambda: fragscope.load(str(a)).diff(fragscope.load(str(b)), top=5))
    assert r.schema == "fragscope.diff/1" and r.a == str(a)


def test_predict_equals_cli():
    # The niu grids ship in the repository (crates/testdata/real/grids).
    grids = REPO / "crates" / "testdata" / "real" / "grids"
    a, b = grids / "niu-fwd-ctx100-fp32.pickle", grids / "niu-fwd-ctx150-fp32.pickle"
    r = same_as_cli(["predict", "--json", str(a), str(b), "--sizes", "100,150", "--at", "200",
                     "--capacity", "4GiB"],
                    lambda: fragscope.predict([str(a), str(b)], sizes=[100, 150], at=[200], capacity="4GiB"))
    assert r.schema == "fragscope.predict/1" and r.predictions[0]["at"] == 200
    # One recording: the CLI's line, which says what to record.
    with pytest.raises(fragscope.FragscopeError, match="fragscope.torch.record"):
        fragscope.predict([str(a)], sizes=[100], at=[200])


def test_save_snapshot_roundtrip(tmp_path):
    snap = fragscope.example()
    out = tmp_path / "example.pickle"
    snap.save(out)
    again = fragscope.load(out, name=snap.name)
    assert again.summary().to_dict()["files"][0]["devices"] == snap.summary().to_dict()["files"][0]["devices"]
    sim = tmp_path / "sim.pickle"
    snap.replay(configs=["expandable_segments:True"], save_snapshot=sim)
    assert fragscope.load(sim).trace_events > 0


def test_example_equals_cli():
    out, _ = cli_json("summary", "--json")
    assert fragscope.example().summary().to_json() == out


# --- bad input: exceptions with the CLI's line, never a crash ---------------------------


def test_refused_pickle(tmp_path):
    evil = tmp_path / "evil.pickle"
    evil.write_bytes(pickle.dumps(os.system, protocol=4))
    same_as_cli(["summary", "--json", str(evil)], lambda: fragscope.load(str(evil)).summary())
    with pytest.raises(fragscope.FragscopeError, match="refus|GLOBAL|import"):
        fragscope.loads(evil.read_bytes())


def test_truncated_file(tmp_path):
    src = TRACES / "mlsysexp-linear-toy.pkl"
    if not src.is_file():
        pytest.skip(f"{src} not found")
    cut = tmp_path / "cut.pickle"
    data = src.read_bytes()
    cut.write_bytes(data[: len(data) // 2])
    same_as_cli(["summary", "--json", str(cut)], lambda: fragscope.load(str(cut)).summary())
    with pytest.raises(fragscope.FragscopeError):
        fragscope.loads(data[: len(data) // 2])


@pytest.mark.parametrize("data", [b"", b"garbage!", b"\x80\x04K\x01.", b"\x1f\x8b\x08\x00"], ids=["empty", "text", "int", "badgzip"])
def test_not_snapshots(data, tmp_path):
    f = tmp_path / "bad.bin"
    f.write_bytes(data)
    same_as_cli(["summary", "--json", str(f)], lambda: fragscope.load(str(f)).summary())


def test_missing_file_and_directory(tmp_path):
    same_as_cli(["summary", "--json", str(tmp_path / "nope.pickle")],
                lambda: fragscope.load(tmp_path / "nope.pickle").summary())
    same_as_cli(["summary", "--json", str(tmp_path)], lambda: fragscope.load(tmp_path).summary())


def test_bad_config_capacity_and_limits():
    snap = fragscope.example()
    p = run_cli("replay", "--config", "expandable_segments:Maybe")
    assert p.returncode == 2
    with pytest.raises(fragscope.FragscopeError) as e:
        snap.replay(configs=["expandable_segments:Maybe"])
    assert "error: " + str(e.value) == p.stderr.strip()
    with pytest.raises(fragscope.FragscopeError, match="invalid capacity"):
        snap.replay(capacity="a lot")
    p = run_cli("check", "--max-reserved", "12 parsecs", str(TRACES / "mlsysexp-linear-toy.pkl"))
    with pytest.raises(fragscope.FragscopeError) as e:
        snap.check(max_reserved="12 parsecs")
    assert p.returncode == 2 and "error: " + str(e.value) == p.stderr.strip()
    with pytest.raises(fragscope.FragscopeError, match="--max-fragmentation"):
        snap.check(max_fragmentation="lots")
    with pytest.raises(fragscope.FragscopeError):
        snap.analyze(top=0)
    assert isinstance(fragscope.FragscopeError("x"), ValueError)


@pytest.mark.parametrize(
    "obj, match",
    [
        ({"a": 1}, "without a 'segments' key"),
        (42, "a pickled int"),
        ({"segments": [{"address": 1}]}, "lacks 'total_size'"),
        ({"segments": [], "device_traces": [[{"action": "alloc", "addr": "x", "size": 1}]]}, "'addr' is not an integer"),
        ({"segments": [object()]}, "a Python 'object' object"),
        ({"segments": [], "x": 1 << 200}, "wider than 128 bits"),
    ],
    ids=["no-segments", "int", "segment-shape", "bad-addr", "foreign-object", "huge-int"],
)
def test_bad_dicts(obj, match):
    with pytest.raises(fragscope.FragscopeError, match=match):
        fragscope.from_dict(obj)


def test_deep_and_cyclic_dicts():
    deep: list = []
    cur = deep
    for _ in range(10_000):
        nxt: list = []
        cur.append(nxt)
        cur = nxt
    with pytest.raises(fragscope.FragscopeError, match="deeper than 256"):
        fragscope.from_dict({"segments": [], "x": deep})
    cyc: dict = {"segments": []}
    cyc["self"] = cyc
    with pytest.raises(fragscope.FragscopeError):
        fragscope.from_dict(cyc)


# --- the command line from Python ------------------------------------------------------


def test_console_script_and_module_run_the_cli(tmp_path):
    path = TRACES / "mlsysexp-linear-toy.pkl"
    if not path.is_file():
        pytest.skip(f"{path} not found")
    ref = run_cli("summary", "--json", str(path))
    script = Path(sys.executable).with_name("fragscope")
    commands = [[sys.executable, "-m", "fragscope"]]
    if script.is_file():
        commands.append([str(script)])
    for cmd in commands:
        p = subprocess.run(cmd + ["summary", "--json", str(path)], capture_output=True, text=True)
        assert (p.returncode, p.stdout) == (0, ref.stdout), cmd
        bad = subprocess.run(cmd + ["summary", str(tmp_path / "none")], capture_output=True, text=True)
        assert bad.returncode == 2 and bad.stderr.startswith("error: "), cmd
        gate = subprocess.run(cmd + ["check", "--max-reserved", "1", str(path)], capture_output=True, text=True)
        assert gate.returncode == 1 and gate.stdout.startswith("check failed"), cmd
        assert subprocess.run(cmd + ["--version"], capture_output=True, text=True).stdout.startswith("fragscope ")
    assert fragscope.run_cli(["fragscope", "oom", "--help"]) == 0


def test_analysis_releases_the_gil():
    """While one thread analyses, another Python thread keeps running."""
    path = max(PICKLES, key=lambda p: p.stat().st_size) if PICKLES else None
    if path is None:
        pytest.skip("no real snapshots")
    snap = fragscope.load(path)
    done = threading.Event()
    ticks = 0

    def work():
        snap.analyze()
        done.set()

    t = threading.Thread(target=work)
    start = time.perf_counter()
    t.start()
    while not done.is_set():
        ticks += 1
        time.sleep(0.001)
    t.join()
    elapsed = time.perf_counter() - start
    # Had the GIL been held, the loop could not tick during the analysis.
    assert elapsed < 0.05 or ticks >= 10, (elapsed, ticks)


def test_typed_and_documented():
    import importlib.resources as res

    assert (res.files("fragscope") / "py.typed").is_file()
    assert (res.files("fragscope") / "_native.pyi").is_file()
    for f in (fragscope.load, fragscope.loads, fragscope.from_dict, fragscope.analyze_many,
              fragscope.Snapshot.analyze, fragscope.Snapshot.replay, fragscope.Snapshot.check):
        assert f.__doc__, f
