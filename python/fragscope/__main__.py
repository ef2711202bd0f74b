"""``python -m fragscope`` and the ``fragscope`` console script: the Rust command line.

Runs exactly the code of the ``fragscope`` binary (``fragscope::run_cli``) on ``sys.argv``
and exits with its code: 0 ok, 1 a ``check`` gate failed, 2 bad usage or unreadable input.
"""

import sys

from fragscope._native import run_cli


def main() -> None:
    if sys.argv[1:2] == ["mcp"]:
        # The MCP server is Python (the official MCP SDK): the `[mcp]` extra.
        from fragscope.mcp_cli import serve

        raise SystemExit(serve(sys.argv[2:]))
    # Python may hold buffered output of its own; the Rust side writes to the fds directly.
    sys.stdout.flush()
    sys.stderr.flush()
    argv = ["fragscope"] + sys.argv[1:]
    raise SystemExit(run_cli(argv))


if __name__ == "__main__":
    main()
