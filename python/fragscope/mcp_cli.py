"""``fragscope mcp`` from the Python entry point: starts the MCP server
(:mod:`fragscope.mcp_server`), or says in one line how to install it."""

from __future__ import annotations

import sys
from typing import List

USAGE = """usage: fragscope mcp

Serve fragscope's tools to a coding agent over the Model Context Protocol (stdio).
Configure it in the agent, e.g. `claude mcp add fragscope -- fragscope mcp`.
Tools: summary, analyze, explain_oom_text, replay_what_if, allocator_state_at,
top_holders, roles, predict, diff (run in this process by fragscope's library).
Environment: FRAGSCOPE_MCP_TIMEOUT (seconds per tool call, default 900).
"""


def serve(args: List[str]) -> int:
    if args in (["-h"], ["--help"]):
        sys.stdout.write(USAGE)
        return 0
    if args:
        sys.stderr.write(f"error: fragscope mcp takes no arguments (got {' '.join(args)})\n")
        return 2
    try:
        from fragscope.mcp_server import main
    except ImportError as e:
        if getattr(e, "name", "") and str(getattr(e, "name", "")).startswith("mcp"):
            sys.stderr.write("error: fragscope mcp needs the MCP SDK: pip install 'fragscope[mcp]'\n")
            return 2
        raise
    main()
    return 0
