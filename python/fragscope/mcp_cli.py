"""``fragscope mcp`` from the Python entry point: starts the MCP server
(:mod:`fragscope.mcp_server`), or says in one line how to install it."""

from __future__ import annotations

import sys
from typing import List

USAGE = """usage: fragscope mcp

Serve fragscope's tools to a coding agent over the Model Context Protocol (stdio).
Configure it in the agent, e.g. `claude mcp add fragscope -- fragscope mcp`.
{tools}
Environment:
  FRAGSCOPE_MCP_ROOT     the folder whose files the tools may read (default: the
                         folder the server starts in); paths outside it are refused
  FRAGSCOPE_MCP_JOBS     commands running at once (default: one per core); a call
                         past it answers "busy" at once
  FRAGSCOPE_MCP_TIMEOUT  seconds per tool call (default 900); past them, or when the
                         agent cancels the call, its process is killed
"""


def usage() -> str:
    """The help text. The tools are the server's own (its registry), so the list cannot
    drift from what tools/list answers; without the MCP SDK it says how to install it."""
    try:
        from fragscope.mcp_server import TOOL_NAMES
    except ImportError as e:
        if not str(getattr(e, "name", "") or "").startswith("mcp"):
            raise
        return USAGE.format(tools="Tools: need the MCP SDK, pip install 'mcp>=2.3,<3' (or '.[mcp]' from a clone).")
    lines, line = [], "Tools (each call runs fragscope's library in a process of its own):"
    for name in TOOL_NAMES:
        if len(line) + len(name) + 2 > 88:
            lines.append(line)
            line = " "
        line += f" {name},"
    lines.append(line.rstrip(","))
    return USAGE.format(tools="\n".join(lines))


def serve(args: List[str]) -> int:
    if args in (["-h"], ["--help"]):
        sys.stdout.write(usage())
        return 0
    if args:
        sys.stderr.write(f"error: fragscope mcp takes no arguments (got {' '.join(args)})\n")
        return 2
    try:
        from fragscope.mcp_server import main
    except ImportError as e:
        if getattr(e, "name", "") and str(getattr(e, "name", "")).startswith("mcp"):
            sys.stderr.write("error: fragscope mcp needs the MCP SDK: pip install 'mcp>=2.3,<3' (or '.[mcp]' from a clone)\n")
            return 2
        raise
    main()
    return 0
