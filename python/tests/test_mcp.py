"""`fragscope mcp` end to end: the server started as a subprocess (`python -m fragscope
mcp`) and driven over stdio by the official MCP client library (initialize, tools/list,
every tool on real snapshots, bad input), each result checked against the CLI's JSON.
"""

from __future__ import annotations

import asyncio
import json
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict

import pytest

import fragscope
from conftest import TRACES, grid_file, real_file, real_pickles, run_cli

mcp = pytest.importorskip("mcp", reason="the MCP client library (pip install '.[mcp]') is not installed")
from mcp import ClientSession  # noqa: E402
from mcp.client.stdio import StdioServerParameters, stdio_client  # noqa: E402

TOOLS = {
    "summary",
    "analyze",
    "explain_oom_text",
    "replay_what_if",
    "allocator_state_at",
    "top_holders",
    "roles",
    "predict",
    "make_it_fit",
    "diff",
}

ROLE_NAMES = {"parameters", "gradients", "optimizer_state", "activations", "temporaries", "inputs", "other"}

OOM_TEXT = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity "
    "of 79.11 GiB of which 1.50 GiB is free. Including non-PyTorch memory, this process has 77.60 GiB "
    "memory in use. Of the allocated memory 70.00 GiB is allocated by PyTorch, and 6.00 GiB is reserved "
    "by PyTorch but unallocated."
)


def cli_json(*args: str) -> Dict[str, Any]:
    p = run_cli(*args)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def traced_files() -> list[Path]:
    """Real pickles with a trace of at least 40 entries, smallest first (at most 4)."""
    out = []
    for p in sorted(real_pickles(), key=lambda p: p.stat().st_size):
        d = cli_json("summary", "--json", str(p))
        devs = [x for x in d["files"][0]["devices"] if x["trace_events"] >= 40]
        if devs:
            out.append(p)
        if len(out) == 4:
            break
    return out


def payload(result) -> Dict[str, Any]:
    """The tool's JSON result (structured content, else the text block)."""
    assert not result.is_error, result.content
    sc = getattr(result, "structured_content", None)
    if sc:
        return sc.get("result", sc) if set(sc) == {"result"} else sc
    return json.loads(result.content[0].text)


def error_text(result) -> str:
    assert result.is_error, result
    return " ".join(getattr(c, "text", "") for c in result.content)


async def session_run(body, env_extra=None, args=("-m", "fragscope", "mcp")):
    env = dict(os.environ)
    # The server calls the library in its own process: no fragscope binary on PATH needed.
    env["PATH"] = os.defpath
    # The real files are outside the working directory (the default root): these tests
    # let the server read the whole file system; test_paths_* narrow it.
    env["FRAGSCOPE_MCP_ROOT"] = os.path.abspath(os.sep)
    env.update(env_extra or {})
    params = StdioServerParameters(command=sys.executable, args=list(args), env=env)
    with open(os.devnull, "w") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write):
            async with ClientSession(read, write) as s:
                init = await s.initialize()
                await body(s, init)


def run(body, env_extra=None, args=("-m", "fragscope", "mcp")):
    asyncio.run(asyncio.wait_for(session_run(body, env_extra, args), timeout=900))


def test_initialize_and_list_tools():
    async def body(s, init):
        assert init.server_info.name == "fragscope"
        assert init.server_info.version == fragscope.__version__ and fragscope.__version__
        tools = (await s.list_tools()).tools
        assert {t.name for t in tools} == TOOLS
        # Unknown argument names are refused (issue 42): every schema says so.
        assert all(t.input_schema.get("additionalProperties") is False for t in tools)
        # `fragscope mcp --help` lists exactly these tools.
        h = subprocess.run([sys.executable, "-m", "fragscope", "mcp", "--help"], capture_output=True, text=True)
        assert h.returncode == 0, h.stderr
        listed = h.stdout.split("Tools (each call runs fragscope's library in a process of its own):")[1].split("Environment:")[0]
        assert sorted(x.strip() for x in listed.split(",")) == sorted(t.name for t in tools)
        for t in tools:
            assert t.description and len(t.description) > 40, t.name
            props = t.input_schema["properties"]
            if t.name not in ("explain_oom_text", "diff", "predict"):
                assert "path" in props and t.input_schema["required"][0] == "path", t.name
        by = {t.name: t for t in tools}
        want = ["site", "annotation", "role", "compile_context", "user_metadata"]
        assert by["top_holders"].input_schema["properties"]["by"].get("enum") == want or any(
            o.get("enum") == want for o in by["top_holders"].input_schema["properties"]["by"].get("anyOf", [])
        )
        pp = by["predict"].input_schema
        assert pp["required"] == ["paths", "sizes"], pp
        assert pp["properties"]["sizes"]["type"] == "array" and pp["properties"]["sizes"]["items"]["type"] == "integer"

    run(body)


def test_every_tool_on_real_snapshots_equals_the_cli(tmp_path):
    files = traced_files()
    if not files:
        pytest.skip(f"no real traced snapshot under {TRACES}")

    checked = []

    async def body(s, init):
        for path in files:
            p = str(path)
            # summary, whole file and a window.
            got = payload(await s.call_tool("summary", {"path": p}))
            want = cli_json("summary", "--json", p)["files"][0]
            assert got["file"] == p and got["window"] is None and "recording" in got["method"]
            for g, w in zip(got["devices"], want["devices"], strict=True):
                for k in ("device", "reserved_bytes", "allocated_bytes", "active_bytes", "trace_events"):
                    assert g[k] == w[k], (p, k)
            n = want["devices"][0]["trace_events"]
            win = f"0..{n // 2}"
            res = await s.call_tool("summary", {"path": p, "window": win})
            cw = run_cli("summary", "--json", "--window", win, p)
            if cw.returncode != 0:
                # A trace inconsistent with its final state: the same refusal, not a guess.
                assert error_text(res).strip().endswith(cw.stderr.strip().removeprefix("error: "))
                continue
            got = payload(res)
            want_w = json.loads(cw.stdout)["files"][0]
            assert got["window"] == want_w["window"] and got["window"]["spec"] == win
            assert [d["reserved_bytes"] for d in got["devices"]] == [d["reserved_bytes"] for d in want_w["devices"]]
            assert got["devices"][0]["trace_events"] == n // 2
            checked.append(p)

            # analyze: findings first, equal to the CLI's.
            got = payload(await s.call_tool("analyze", {"path": p, "top": 5}))
            want = cli_json("analyze", "--json", "--top", "5", p)["files"][0]
            # (the tool puts the OOM's device first; the CLI's JSON keeps devices ascending)
            assert [d["findings"] for d in sorted(got["devices"], key=lambda d: d["device"])] == [
                d["findings"] for d in want["devices"]
            ]
            assert got["oom"] == want["oom"] and got["findings"] == want["findings"]
            assert list(got["devices"][0])[:2] == ["device", "findings"]

            # replay_what_if: the same replay as the CLI's.
            args = {"path": p, "config": ["expandable_segments:True"], "capacity": "80GiB"}
            got = payload(await s.call_tool("replay_what_if", args))
            want = cli_json("replay", "--json", p, "--config", "expandable_segments:True", "--capacity", "80GiB")
            wd = want["files"][0]["devices"]
            assert [[r["peak_reserved"] for r in d["whatif"]] for d in got["devices"]] == [
                [r["peak_reserved"] for r in d["whatif"]] for d in wd
            ]
            assert got["devices"][0]["whatif"][0]["config"] == "expandable_segments:True"
            assert got["method"].startswith("replay")

            # allocator_state_at / top_holders at the middle and at the end.
            k = n // 2
            got = payload(await s.call_tool("allocator_state_at", {"path": p, "event": k}))
            want = cli_json("state", "--json", p, "--at", str(k))
            assert got["state"] == want["state"] and got["after_event"] == k
            assert "backward walk" in got["method"]
            dflt = payload(await s.call_tool("allocator_state_at", {"path": p}))
            lead = cli_json("summary", "--json", p)["files"][0]["oom"]
            # Issue 42: on a file with an OOM the default is its device and moment, said so.
            on = {}
            if lead is not None:
                assert (dflt["device"], dflt["after_event"]) == (lead["device"], lead["event_index"])
                assert dflt["choice"].startswith("the moment of the OOM")
                on = {"device": dflt["device"]}
            else:
                assert "choice" not in dflt
            end = payload(await s.call_tool("allocator_state_at", {"path": p, **on}))
            summ = cli_json("summary", "--json", p)["files"][0]["devices"]
            dev = [d for d in summ if d["device"] == end["device"]][0]
            # The state at the end is the recorded final state.
            assert end["state"]["reserved_bytes"] == dev["reserved_bytes"]
            assert end["state"]["allocated_bytes"] == dev["allocated_bytes"]
            for by in ("site", "annotation", "role", "compile_context", "user_metadata"):
                got = payload(await s.call_tool("top_holders", {"path": p, "event": k, "by": by, "top": 3}))
                want = cli_json("state", "--json", p, "--at", str(k), "--by", by, "--top", "3")
                assert got["holders_by"] == by, got
                assert got["holders"] == want["holders"] and len(got["holders"]) <= 3
                assert got["holders_total_bytes"] == sum(h["bytes"] for h in got["holders"]) + got["other_bytes"]
            # By role, every role listed (7 at most): the roles' blocks are the live blocks.
            got = payload(await s.call_tool("top_holders", {"path": p, "event": k, "by": "role", "top": 7}))
            assert got["other_bytes"] == 0 and got["holders_total_bytes"] == sum(h["bytes"] for h in got["holders"])
            assert {h["key"] for h in got["holders"]} <= ROLE_NAMES and "roles" in got["method"]
            at_end = payload(await s.call_tool("top_holders", {"path": p, "by": "role", "top": 7, **on}))
            assert at_end["holders_total_bytes"] == end["state"]["allocated_bytes"]

            # roles: summary's roles, compact.
            got = payload(await s.call_tool("roles", {"path": p}))
            want = cli_json("summary", "--json", p)["files"][0]
            assert got["method"].startswith("recording") and "phase" in got["method"]
            for g, w in zip(got["devices"], want["devices"], strict=True):
                wr = w.get("roles")
                if wr is None:
                    assert g["roles"] is None
                    continue
                assert g["step_count"] == wr["step_count"] and g["peak_allocated"] == wr["peak_allocated"]
                assert set(g["by_role"]) == {
                    r for r, x in wr["by_role"].items() if x["blocks"] > 0 or x["cannot_tell"]
                }
                for r, x in g["by_role"].items():
                    wx = wr["by_role"][r]
                    assert (x["at_peak"], x["max"], x["blocks"], x["confidence"], x["cannot_tell"]) == (
                        wx["at_peak"],
                        wx["max"],
                        wx["blocks"],
                        wx["confidence"],
                        wx["cannot_tell"],
                    ), (p, r)
                    assert len(x["evidence"]) <= 2
                    if wx["evidence"]:
                        assert x["evidence"][0]["evidence"] == wx["evidence"][0]["evidence"]

        assert checked, "at least one file went through every tool"

        # diff of two real snapshots.
        a, b = str(files[0]), str(files[-1])
        got = payload(await s.call_tool("diff", {"path_a": a, "path_b": b, "top": 3}))
        want = cli_json("diff", "--json", "--top", "3", a, b)
        got.pop("method")
        assert got == want

        # explain_oom_text.
        got = payload(await s.call_tool("explain_oom_text", {"text": OOM_TEXT}))
        want = cli_json("oom", "--json", OOM_TEXT)
        assert got.pop("method").startswith("the error message")
        assert got == want

    run(body)


def test_predict_equals_the_cli():
    # The niu grid (MIT, in the repository): three training steps at sequence lengths
    # 100 and 150, predicted at 200 (recorded too, so the CLI's own figure is checkable).
    a, b = grid_file("niu-train3-ctx100-fp32.pickle"), grid_file("niu-train3-ctx150-fp32.pickle")
    want = cli_json("predict", "--json", str(a), str(b), "--sizes", "100,150", "--at", "200", "--capacity", "24GiB")

    async def body(s, init):
        args = {"paths": [str(a), str(b)], "sizes": [100, 150], "at": [200], "capacity": "24GiB"}
        got = payload(await s.call_tool("predict", args))
        assert got["method"].startswith("prediction") and "replay" in got["method"]
        assert got["files"] == want["files"]
        assert len(got["predictions"]) == len(want["predictions"]) > 0
        for g, w in zip(got["predictions"], want["predictions"], strict=True):
            for k in ("at", "device", "config", "capacity", "peak_reserved", "peak_allocated", "fits", "fit_quality"):
                assert g[k] == w[k], k
            assert g["breakdown"] == w["breakdown"]
        assert [f["aligned_fraction"] for f in got["fits"]] == [f["aligned_fraction"] for f in want["fits"]]
        # Bad input: tool errors, and the server goes on.
        e = error_text(await s.call_tool("predict", {"paths": [str(a)], "sizes": [100], "at": [200]}))
        assert "two or more" in e
        e = error_text(await s.call_tool("predict", {"paths": [str(a), str(b)], "sizes": [100], "at": [200]}))
        assert "one per recording" in e
        e = error_text(await s.call_tool("predict", {"paths": [str(a), str(b)], "sizes": [100, 150], "max_fit": True}))
        assert "capacity" in e
        again = payload(await s.call_tool("predict", args))
        assert again["predictions"] == got["predictions"]

    run(body)


def test_make_it_fit_equals_the_cli_does_not_fit_first():
    f = Path(__file__).resolve().parents[2] / "crates" / "testdata" / "h200" / "gpt-s512-b16.pickle.gz"
    want = cli_json("fit", "--json", str(f), "--capacity", "H100-80GB,10GB")
    cards = want["files"][0]["devices"][0]["cards"]

    async def body(s, init):
        got = payload(await s.call_tool("make_it_fit", {"path": str(f), "capacity": "H100-80GB,10GB", "top": 2}))
        assert got["schema"] == "fragscope.fit/1" and "replay" in got["method"]
        # The card where it does not fit comes first, though asked second.
        assert [c["capacity"] for c in got["cards"]] == ["10GB", "H100-80GB"]
        small = got["cards"][0]
        assert not small["fits_as_recorded"] and small["options_total"] == len(cards[1]["options"])
        assert len(small["options"]) == min(2, len(cards[1]["options"]))
        for g, w in zip(small["options"], cards[1]["options"]):
            for k in ("rank", "change", "cost_class", "peak_reserved", "peak_allocated", "margin", "model"):
                assert g[k] == w[k], k
        # Bad input: tool errors (unknown arguments refused), and the server goes on.
        e = error_text(await s.call_tool("make_it_fit", {"path": str(f), "capacity": "40 potatoes"}))
        assert "invalid capacity" in e
        e = error_text(await s.call_tool("make_it_fit", {"path": str(f), "capacity": "40GB", "gpu": "A100"}))
        assert "gpu" in e
        e = error_text(await s.call_tool("make_it_fit", {"path": str(f), "capacity": "40GB", "sizes": [1]}))
        assert "sizes_paths" in e
        again = payload(await s.call_tool("make_it_fit", {"path": str(f), "capacity": "H100-80GB,10GB", "top": 2}))
        assert again == got

    run(body)


def test_bad_input_is_a_tool_error_and_the_server_goes_on(tmp_path):
    evil = tmp_path / "evil.pickle"
    # A pickle whose GLOBAL opcode asks to import os.system: refused, never run.
    evil.write_bytes(pickle.dumps(os.system, protocol=2))
    assert evil.read_bytes()[2:3] == b"c", "protocol 2 writes GLOBAL ('c')"
    junk = tmp_path / "junk.pickle"
    junk.write_bytes(b"not a snapshot")
    cli_evil = run_cli("summary", "--json", str(evil))
    assert cli_evil.returncode == 2

    async def body(s, init):
        e = error_text(await s.call_tool("summary", {"path": str(tmp_path / "missing.pickle")}))
        assert "no such file" in e
        e = error_text(await s.call_tool("analyze", {"path": str(evil)}))
        # The CLI's own line (after the SDK's "Error executing tool analyze: ").
        assert e.strip().endswith(cli_evil.stderr.strip().removeprefix("error: "))
        assert "refus" in e or "GLOBAL" in e
        e = error_text(await s.call_tool("top_holders", {"path": str(junk)}))
        assert "not a memory snapshot" in e
        e = error_text(await s.call_tool("summary", {"path": str(junk), "window": "9..3"}))
        assert "window" in e or "snapshot" in e
        e = error_text(await s.call_tool("roles", {"path": str(junk)}))
        assert "not a memory snapshot" in e
        e = error_text(await s.call_tool("top_holders", {"path": str(junk), "by": "size"}))
        assert "by" in e or "site" in e
        e = error_text(await s.call_tool("explain_oom_text", {"text": "  "}))
        assert "error" in e
        # The server still answers.
        assert payload(await s.call_tool("explain_oom_text", {"text": OOM_TEXT}))["schema"] == "fragscope.oom/2"

    run(body)


def test_unknown_and_bad_arguments_are_one_line_errors():
    # Issue 42: `allocator_state_at {"entry": 421}` answered for the end of the trace and
    # `replay_what_if {"configs": [...]}` ran the defaults, both isError: false.
    p = str(traced_files()[0]) if traced_files() else None
    if p is None:
        pytest.skip(f"no real traced snapshot under {TRACES}")

    async def body(s, init):
        e = error_text(await s.call_tool("allocator_state_at", {"path": p, "entry": 421}))
        assert "unknown argument 'entry'" in e and "allocator_state_at takes path (required), event, time, device" in e
        e = error_text(await s.call_tool("replay_what_if", {"path": p, "configs": ["expandable_segments:True"]}))
        assert "unknown argument 'configs'" in e and "config," in e
        e = error_text(await s.call_tool("explain_oom_text", {"text": OOM_TEXT, "path": p, "verbose": True}))
        assert "unknown arguments 'path', 'verbose'" in e and "explain_oom_text takes text (required)" in e
        # A wrong type or a missing argument: one line naming the argument, no pydantic URL.
        e = error_text(await s.call_tool("allocator_state_at", {"path": p, "event": "middle"}))
        assert e.startswith("Error executing tool allocator_state_at: event: ") and "\n" not in e
        assert "errors.pydantic.dev" not in e and "takes path (required)" in e
        e = error_text(await s.call_tool("summary", {}))
        assert e.startswith("Error executing tool summary: path: Field required") and "\n" not in e
        # The right names still work.
        got = payload(await s.call_tool("allocator_state_at", {"path": p, "event": 3}))
        assert got["after_event"] == 3

    run(body)


def test_paths_are_regular_files_under_the_root(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    snap = min(real_pickles(), key=lambda p: p.stat().st_size)
    (root / "snap.pickle").write_bytes(snap.read_bytes())
    outside = tmp_path / "outside.pickle"
    outside.write_bytes(snap.read_bytes())
    (root / "escape.pickle").symlink_to(outside)
    (root / "inner.pickle").symlink_to(root / "snap.pickle")
    os.mkfifo(root / "fifo.pickle")
    (root / "dir.pickle").mkdir()

    async def body(s, init):
        # Relative paths are relative to the root; a link that stays inside it is followed.
        assert payload(await s.call_tool("summary", {"path": "snap.pickle"}))["file"] == "snap.pickle"
        assert payload(await s.call_tool("summary", {"path": str(root / "inner.pickle")}))["devices"]
        for p in (str(outside), str(root / "escape.pickle"), "../outside.pickle", "/etc/passwd",
                  str(tmp_path / "missing.pickle")):
            e = error_text(await s.call_tool("summary", {"path": p}))
            assert f"{p} is outside {os.path.realpath(root)}" in e and "FRAGSCOPE_MCP_ROOT" in e, e
        e = error_text(await s.call_tool("diff", {"path_a": "snap.pickle", "path_b": str(outside)}))
        assert "is outside" in e
        e = error_text(await s.call_tool("predict", {"paths": ["snap.pickle", str(outside)], "sizes": [1, 2], "at": [3]}))
        assert "is outside" in e
        # A FIFO would block a worker forever: refused before anything opens it.
        t = time.monotonic()
        e = error_text(await s.call_tool("analyze", {"path": "fifo.pickle"}))
        assert "fifo.pickle is a FIFO, not a regular file" in e and time.monotonic() - t < 30
        e = error_text(await s.call_tool("roles", {"path": "dir.pickle"}))
        assert "dir.pickle is a directory, not a regular file" in e
        e = error_text(await s.call_tool("summary", {"path": "missing.pickle"}))
        assert "no such file: missing.pickle" in e

    run(body, {"FRAGSCOPE_MCP_ROOT": str(root)})


def test_no_file_content_in_any_error(tmp_path):
    # Issue 43: "unrecognised format (starts with text: 'OPENAI_API_KEY=sk-live-…')" made
    # the server a reader of the first line of any file an agent could be talked into naming.
    secret = "sk-live-0123456789abcdef"
    files = {
        "env.txt": f"OPENAI_API_KEY={secret}\n".encode(),
        "bytes.bin": b"\x00\x01" + secret.encode(),
        "object.json": json.dumps({"traceEvents": secret}).encode(),
        "other.json": json.dumps({"password": secret}).encode(),
        "dict.pickle": pickle.dumps({secret: 1}, protocol=2),
        "list.pickle": pickle.dumps([secret], protocol=2),
        "state.pickle": pickle.dumps(
            {"segments": [{"device": 0, "address": 0, "total_size": 512, "allocated_size": 0, "active_size": 0,
                           "requested_size": 0, "stream": 0, "segment_type": "small",
                           "blocks": [{"size": 512, "state": secret, "requested_size": 0}]}], "device_traces": []},
            protocol=2),
        "empty.pickle": b"",
        "truncated.pickle": pickle.dumps({"segments": [1, 2, 3]}, protocol=2)[:-4],
    }
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    cli_lines = {name: run_cli("summary", str(tmp_path / name)).stderr for name in files}
    # The CLI (run by the user) keeps the reader's full reason.
    assert secret in cli_lines["env.txt"] and secret in cli_lines["state.pickle"]

    async def body(s, init):
        for name in files:
            for tool in ("summary", "analyze", "top_holders"):
                e = error_text(await s.call_tool(tool, {"path": name}))
                assert f"{name} is not a memory snapshot" in e and "\n" not in e, e
                for leak in (secret, "sk-live", "OPENAI", "00 01 73"):
                    assert leak not in e, (name, e)
        # Reasons made of lengths and offsets only are the CLI's own words.
        for name in ("empty.pickle", "truncated.pickle", "other.json"):
            e = error_text(await s.call_tool("summary", {"path": name}))
            assert e.strip().endswith(cli_lines[name].strip().removeprefix("error: ").replace(str(tmp_path / name), name))
        e = error_text(await s.call_tool("summary", {"path": "env.txt"}))
        assert "unrecognised format; expected a pickle from torch.cuda.memory._dump_snapshot" in e

    run(body, {"FRAGSCOPE_MCP_ROOT": str(tmp_path)})


def test_explain_oom_text_never_reads_a_file(tmp_path):
    log = tmp_path / "oom.log"
    log.write_text(OOM_TEXT)

    async def body(s, init):
        for text in (str(log), "oom.log", "hello"):
            e = error_text(await s.call_tool("explain_oom_text", {"text": text}))
            assert "no CUDA out-of-memory message found" in e and "never reads a file" in e
        assert payload(await s.call_tool("explain_oom_text", {"text": OOM_TEXT}))["schema"] == "fragscope.oom/2"

    run(body, {"FRAGSCOPE_MCP_ROOT": str(tmp_path)})


# The server whose commands' child process (fragscope._mcp_worker) holds explain_oom_json
# until a file appears: commands that stay running for as long as a test needs, without a
# multi-GB trace. Each started child leaves `started-<pid>` in the gate folder.
SLOW_WORKER = """
import os, sys, time, types
import fragscope._native as native
import fragscope._mcp_worker as w
gate = os.environ["SLOW_GATE"]
def slow(text):
    open(os.path.join(gate, "started-%d" % os.getpid()), "w").close()
    deadline = time.monotonic() + 120
    while not os.path.exists(os.path.join(gate, "release")) and time.monotonic() < deadline:
        time.sleep(0.02)
    return native.explain_oom_json(text)
w._native = types.SimpleNamespace(**{k: getattr(native, k) for k in dir(native) if not k.startswith("__")})
w._native.explain_oom_json = slow
w.main()
"""
SLOW_SERVER = f"""
import sys
import fragscope.mcp_server as m
m.WORKER = [sys.executable, "-c", {SLOW_WORKER!r}]
m.main()
"""


def started_pids(gate: Path, n: int) -> list[int]:
    """The pids of the first `n` slow children once they have started (60 s at most)."""
    t = time.monotonic()
    while len(list(gate.glob("started-*"))) < n:
        assert time.monotonic() - t < 60, f"{n} command(s) did not start"
        time.sleep(0.02)
    return [int(p.name.split("-")[1]) for p in gate.glob("started-*")]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def gone(pid: int, within: float = 10.0) -> bool:
    """Whether process `pid` has ended (and been reaped) within `within` seconds."""
    t = time.monotonic()
    while alive(pid):
        if time.monotonic() - t > within:
            return False
        await asyncio.sleep(0.05)
    return True


def test_a_busy_server_answers_busy_and_ping(tmp_path):
    # Issue 43: 40 blocked calls took every worker thread and the server stopped answering
    # even ping. Now at most FRAGSCOPE_MCP_JOBS commands run; the next call fails at once.
    gate = tmp_path / "gate"
    gate.mkdir()

    async def body(s, init):
        running = [asyncio.create_task(s.call_tool("explain_oom_text", {"text": OOM_TEXT})) for _ in range(2)]
        await asyncio.to_thread(started_pids, gate, 2)
        t = time.monotonic()
        e = error_text(await s.call_tool("explain_oom_text", {"text": OOM_TEXT}))
        assert "fragscope is busy: 2 command(s) already running (FRAGSCOPE_MCP_JOBS)" in e
        await s.send_ping()
        assert (await s.list_tools()).tools
        assert time.monotonic() - t < 10, "busy, ping and tools/list answered at once"
        (gate / "release").touch()
        for task in running:
            assert payload(await task)["schema"] == "fragscope.oom/2"
        # The slots are free again.
        assert payload(await s.call_tool("explain_oom_text", {"text": OOM_TEXT}))["schema"] == "fragscope.oom/2"

    run(body, {"FRAGSCOPE_MCP_JOBS": "2", "SLOW_GATE": str(gate)}, args=("-c", SLOW_SERVER))


def test_a_cancelled_call_kills_its_process_and_frees_its_slot(tmp_path):
    # Issue 43: `notifications/cancelled` left the command running (on a thread nothing can
    # interrupt). Now each call runs in a child process, which the cancellation kills.
    gate = tmp_path / "gate"
    gate.mkdir()

    async def body(s, init):
        task = asyncio.create_task(s.call_tool("explain_oom_text", {"text": OOM_TEXT}))
        (pid,) = await asyncio.to_thread(started_pids, gate, 1)
        assert alive(pid)
        # Cancelling the client's call sends notifications/cancelled (the SDK's courtesy cancel).
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await gone(pid), f"the cancelled call's process {pid} still runs"
        # Its slot is free (FRAGSCOPE_MCP_JOBS=1): the next call is not "busy". Released so
        # that it answers at once.
        (gate / "release").touch()
        assert payload(await s.call_tool("explain_oom_text", {"text": OOM_TEXT}))["schema"] == "fragscope.oom/2"
        await s.send_ping()

    run(body, {"FRAGSCOPE_MCP_JOBS": "1", "SLOW_GATE": str(gate)}, args=("-c", SLOW_SERVER))


def test_a_call_past_its_timeout_is_stopped(tmp_path):
    gate = tmp_path / "gate"
    gate.mkdir()

    async def body(s, init):
        # 5 s: time for the child to start (it imports the extension) and reach the slow part.
        task = asyncio.create_task(s.call_tool("explain_oom_text", {"text": OOM_TEXT}))
        (pid,) = await asyncio.to_thread(started_pids, gate, 1)
        e = error_text(await asyncio.wait_for(task, 60))
        assert "fragscope oom took longer than 5 s (FRAGSCOPE_MCP_TIMEOUT) and was stopped" in e, e
        assert await gone(pid), f"the timed-out call's process {pid} still runs"
        (gate / "release").touch()
        assert payload(await s.call_tool("explain_oom_text", {"text": OOM_TEXT}))["schema"] == "fragscope.oom/2"

    run(body, {"FRAGSCOPE_MCP_JOBS": "1", "FRAGSCOPE_MCP_TIMEOUT": "5", "SLOW_GATE": str(gate)}, args=("-c", SLOW_SERVER))


def test_malformed_json_rpc_gets_a_json_rpc_error():
    # Issue 43: a line that is not JSON-RPC got no reply at all (the client waits forever).
    # Raw stdio here: the SDK's client cannot send a malformed message.
    env = dict(os.environ, FRAGSCOPE_MCP_ROOT=os.path.abspath(os.sep))
    p = subprocess.Popen(
        [sys.executable, "-m", "fragscope", "mcp"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
        text=True,
    )
    try:

        def ask(line: str) -> Dict[str, Any]:
            p.stdin.write(line + "\n")
            p.stdin.flush()
            out: list = []
            reader = __import__("threading").Thread(target=lambda: out.append(p.stdout.readline()))
            reader.start()
            reader.join(60)
            assert out and out[0], f"no reply to {line!r}"
            return json.loads(out[0])

        r = ask("{this is not json")
        assert r["jsonrpc"] == "2.0" and r["id"] is None and r["error"]["code"] == -32700, r
        r = ask('{"jsonrpc": "2.0", "id": 7, "method": 5}')
        assert r["id"] == 7 and r["error"]["code"] == -32600, r
        r = ask("[1, 2, 3]")
        assert r["id"] is None and r["error"]["code"] == -32600, r
        # The server goes on: a well-formed request is answered.
        init = {
            "jsonrpc": "2.0",
            "id": 8,
            "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
        }
        r = ask(json.dumps(init))
        assert r["id"] == 8 and r["result"]["serverInfo"]["name"] == "fragscope", r
    finally:
        p.stdin.close()
        p.wait(timeout=60)


def test_results_are_compact_and_full_asks_for_more():
    # Issue 42: results of 50-80 KB with raw C++ unwinder frames. The 3-GPU OOM file
    # replayed on 8 GiB: every replay's first OOM carries a 56-frame stack.
    p = str(real_file("codeloc-qwen3-gnn-expandable-oom-3gpu.pickle"))
    want = cli_json("replay", "--json", p, "--capacity", "8GiB")

    async def body(s, init):
        res = await s.call_tool("replay_what_if", {"path": p, "capacity": "8GiB"})
        got = payload(res)
        assert len(res.content[0].text) < 40_000
        stacks = [w["first_oom"]["stack"] for d in got["devices"] for w in d["whatif"] if w.get("first_oom")]
        assert stacks
        for st in stacks:
            assert len(st) <= 9 and not any("unwind" in f or "c10::" in f for f in st), st
            # Innermost first, Python frames only: the user code that asked for the memory.
            assert all(".py:" in f for f in st[:-1]) and any("/models.py:" in f for f in st) and "more frames" in st[-1], st
        # A GPU size: each row leads with whether the run fits (issue 42: it was in a note).
        for d in got["devices"]:
            for w in d["whatif"]:
                assert list(w)[0] == "verdict" and w["verdict"].startswith("fits" if not w["ooms"] else "does not fit")
        assert any(w["verdict"].startswith("does not fit on 8.00 GiB: ") for d in got["devices"] for w in d["whatif"])
        full = payload(await s.call_tool("replay_what_if", {"path": p, "capacity": "8GiB", "full": True}))
        assert [w for d in full["devices"] for w in d["whatif"]] == [w for d in want["files"][0]["devices"] for w in d["whatif"]]
        got = payload(await s.call_tool("analyze", {"path": p}))
        want_a = cli_json("analyze", "--json", p)["files"][0]
        # Issue 42: the OOM's device (1) first, after the OOM itself and the file's findings.
        assert got["oom"]["device"] == 1 and got["oom"]["event_index"] == 421
        assert [d["device"] for d in got["devices"]] == [1, 0, 2]
        assert [f["kind"] for f in got["findings"]] == ["device_imbalance"]
        for tool in ("top_holders", "allocator_state_at"):
            st = payload(await s.call_tool(tool, {"path": p}))
            assert (st["device"], st["after_event"]) == (1, 421), tool
            assert st["choice"].startswith("the moment of the OOM: device 1, trace entry 421"), st["choice"]
        st = payload(await s.call_tool("top_holders", {"path": p, "event": 421}))
        assert st["device"] == 1 and st["choice"].startswith("device 1: its entry 421 is the OOM")
        by_dev = sorted(got["devices"], key=lambda d: d["device"])
        assert [d["findings"] for d in by_dev] == [d["findings"] for d in want_a["devices"]]
        rec = by_dev[1]["recommendations"]
        assert rec["era"] == want_a["devices"][1]["recommendations"]["era"]["label"] and len(rec["tried"]) <= 5
        summ = payload(await s.call_tool("summary", {"path": p}))
        assert all(div for _, div in summ["settings"]["roundup_power2_divisions"])

    run(body)


def test_a_gpu_the_run_cannot_start_on_leads_the_answer():
    # A 2.7B training step holds ~13 GiB of tensors before its trace: on 1 GiB it cannot start.
    p = str(real_file("cs336-2.7b-trainstep-ctx128-fp32.pickle"))

    async def body(s, init):
        got = payload(await s.call_tool("replay_what_if", {"path": p, "capacity": "1GiB", "config": ["expandable_segments:True"]}))
        row = got["devices"][0]["whatif"][0]
        want = cli_json("replay", "--json", p, "--capacity", "1GiB", "--config", "expandable_segments:True")
        before = want["files"][0]["devices"][0]["whatif"][0]["allocated_before_trace"]
        assert before > 2**30
        assert row["verdict"].startswith(f"does not fit: the tensors alive before the trace alone hold {before / 2**30:.2f} GiB")
        assert row["verdict"].endswith("the run cannot start on it")
        got = payload(await s.call_tool("replay_what_if", {"path": p, "capacity": "80GiB", "config": ["expandable_segments:True"]}))
        assert got["devices"][0]["whatif"][0]["verdict"] == "fits: no allocation fails on 80.00 GiB"

    run(body)
