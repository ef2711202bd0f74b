"""`fragscope mcp` end to end: the server started as a subprocess (`python -m fragscope
mcp`) and driven over stdio by the official MCP client library (initialize, tools/list,
every tool on real snapshots, bad input), each result checked against the CLI's JSON.
"""

from __future__ import annotations

import asyncio
import json
import os
import pickle
import sys
from pathlib import Path
from typing import Any, Dict

import pytest

from conftest import TRACES, grid_file, real_pickles, run_cli

mcp = pytest.importorskip("mcp", reason="the MCP client library (pip install 'fragscope[mcp]') is not installed")
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


async def session_run(body):
    env = dict(os.environ)
    # The server calls the library in its own process: no fragscope binary on PATH needed.
    env["PATH"] = os.defpath
    params = StdioServerParameters(command=sys.executable, args=["-m", "fragscope", "mcp"], env=env)
    with open(os.devnull, "w") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write):
            async with ClientSession(read, write) as s:
                init = await s.initialize()
                await body(s, init)


def run(body):
    asyncio.run(asyncio.wait_for(session_run(body), timeout=900))


def test_initialize_and_list_tools():
    async def body(s, init):
        assert init.server_info.name == "fragscope"
        tools = (await s.list_tools()).tools
        assert {t.name for t in tools} == TOOLS
        for t in tools:
            assert t.description and len(t.description) > 40, t.name
            props = t.input_schema["properties"]
            if t.name not in ("explain_oom_text", "diff", "predict"):
                assert "path" in props and t.input_schema["required"][0] == "path", t.name
        by = {t.name: t for t in tools}
        want = ["site", "annotation", "role"]
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
            assert [d["findings"] for d in got["devices"]] == [d["findings"] for d in want["devices"]]
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
            end = payload(await s.call_tool("allocator_state_at", {"path": p}))
            summ = cli_json("summary", "--json", p)["files"][0]["devices"]
            dev = [d for d in summ if d["device"] == end["device"]][0]
            # The state at the end is the recorded final state.
            assert end["state"]["reserved_bytes"] == dev["reserved_bytes"]
            assert end["state"]["allocated_bytes"] == dev["allocated_bytes"]
            for by in ("site", "annotation", "role"):
                got = payload(await s.call_tool("top_holders", {"path": p, "event": k, "by": by, "top": 3}))
                want = cli_json("state", "--json", p, "--at", str(k), "--by", by, "--top", "3")
                assert got["holders"] == want["holders"] and len(got["holders"]) <= 3
                assert got["holders_total_bytes"] == sum(h["bytes"] for h in got["holders"]) + got["other_bytes"]
            # By role, every role listed (7 at most): the roles' blocks are the live blocks.
            got = payload(await s.call_tool("top_holders", {"path": p, "event": k, "by": "role", "top": 7}))
            assert got["other_bytes"] == 0 and got["holders_total_bytes"] == sum(h["bytes"] for h in got["holders"])
            assert {h["key"] for h in got["holders"]} <= ROLE_NAMES and "roles" in got["method"]
            at_end = payload(await s.call_tool("top_holders", {"path": p, "by": "role", "top": 7}))
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
