"""One MCP tool call's work, in a process of its own (:mod:`fragscope.mcp_server` starts it).

The server runs every command in a child process (this module) rather than on a thread of
its own, because Rust code cannot be interrupted mid-replay: a call the agent cancels
(``notifications/cancelled``) or that outlives its timeout is stopped by killing the child,
so its memory and its slot come back at once instead of after the replay has finished. A
crash of the child cannot take the server down either.

The protocol is one JSON request on stdin and one answer on stdout:

* request: ``{"root": ROOT, "paths": [...], "target": "snapshot" | "native", "name": ...,
  "args": [...], "kwargs": {...}}``. ``"snapshot"`` calls the method ``name`` of the first
  path's snapshot, with the other paths' snapshots first among its arguments (``diff``);
  ``"native"`` calls ``fragscope._native.<name>``, with the list of the paths' snapshots
  first when there are paths (``predict``, ``fit``);
* answer: the command's JSON document and exit code 0, or one line of error (the reader's
  refusal without anything read from the file, a bad argument) and exit code 3.

The checks of a path an agent names (:func:`check_file`: a regular file under ROOT) and of
what an error may say (:func:`content_free`: nothing read from the file) live here, with
the reads they guard; the server runs the same path check before it starts a child, for a
quick answer. This module imports no MCP SDK, so that a child starts quickly.
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
from typing import Any, Dict

from . import _native
from ._errors import FragscopeError, RefusedPickleError, SnapshotError

#: The child's exit code for an error whose one line is on stdout.
EXIT_ERROR = 3


class PathRefused(Exception):
    """A path an agent named that the tools do not read (outside ROOT, missing, not a
    regular file); the message is one line that says nothing of a file outside ROOT."""


def check_file(path: str, root: str) -> str:
    """The real path of the snapshot file an agent named, checked: under ``root``
    (relative paths are relative to it), existing, a regular file (a FIFO would block a
    worker forever, a device read endlessly). Refusals are one line and say nothing about a
    file outside ``root``, not even whether it exists."""
    if not path:
        raise PathRefused("give the path of a snapshot file")
    real = os.path.realpath(os.path.join(root, os.path.expanduser(path)))
    if os.path.commonpath([real, root]) != root:
        raise PathRefused(f"{path} is outside {root}, the folder this server reads (set FRAGSCOPE_MCP_ROOT to widen it)")
    try:
        mode = os.stat(real).st_mode
    except FileNotFoundError:
        raise PathRefused(f"no such file: {path}")
    except OSError as e:
        raise PathRefused(f"cannot read {path}: {e.strerror}")
    if not stat.S_ISREG(mode):
        kind = "a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "a device or socket"
        raise PathRefused(f"{path} is {kind}, not a regular file: give a snapshot file")
    return real


#: Reasons of the reader that quote nothing from the file (lengths and offsets only).
_SAFE_REASONS = [
    r"the file is empty",
    r"truncated: the data ends at byte \d+ in the middle of the pickle",
    r"pickle opcode [A-Z0-9_]+ at byte \d+ would [a-z ()_,]+; refusing",
    r"JSON without 'traceEvents': not a torch\.profiler trace",
    r"is a directory",
]
_UNRECOGNISED = "unrecognised format (starts with "
_UNRECOGNISED_END = "); expected a pickle from torch.cuda.memory._dump_snapshot"


def content_free(message: str, real: str, shown: str) -> str:
    """The reader's one line for a file it refused, without anything read from the file.

    The reader quotes what it found (the first bytes of an unrecognised file, a key, a
    string where a number belongs) so that a user at a terminal sees what is wrong. Through
    MCP that is a file-read oracle: an agent talked into naming a text file of secrets
    would be told its first line. Only reasons made of lengths and offsets pass; the others
    are named by kind, and the CLI (which the user runs) still prints the full reason."""
    # The reader names the file by the path it opened; the agent sees its own.
    if message.startswith(real + " "):
        message = shown + message[len(real):]
    elif message.startswith(f"cannot read {real}: "):
        message = f"cannot read {shown}: " + message[len(f"cannot read {real}: "):]
    prefix = f"{shown} is not a memory snapshot: "
    if not message.startswith(prefix):
        # "cannot read PATH: <OS error>" (or the file changed while read): nothing of the file.
        return message if message.startswith(f"cannot read {shown}: ") else f"{shown} is not a memory snapshot"
    reason = message[len(prefix):]
    if any(re.fullmatch(r, reason) for r in _SAFE_REASONS):
        return message
    if reason.startswith(_UNRECOGNISED) and _UNRECOGNISED_END in reason:
        rest = reason[reason.rindex(_UNRECOGNISED_END) + 3 :]
        return prefix + "unrecognised format; " + rest.split("; ")[0]
    corrupt = re.match(r"corrupt pickle at byte \d+", reason)
    if corrupt:
        return prefix + corrupt.group(0)
    return prefix + (
        "it does not have the shape of one (the reader's reason quotes the file, so it is not "
        "repeated here; `fragscope summary FILE` in a terminal prints it)"
    )


def load(path: str, root: str) -> Any:
    """The snapshot at ``path`` (an agent's path, checked by :func:`check_file`). Refused or
    unreadable: a FragscopeError whose message quotes nothing read from the file."""
    real = check_file(path, root)
    try:
        return _native.load(real, path)
    except RefusedPickleError:
        raise  # "pickle opcode GLOBAL at byte N would import code; refusing": nothing quoted.
    except SnapshotError as e:
        raise SnapshotError(content_free(str(e), real, path)) from None


def call(request: Dict[str, Any]) -> str:
    """Runs one request (see the module's docs); returns the command's JSON document."""
    root = request["root"]
    snaps = [load(p, root) for p in request.get("paths") or []]
    args = list(request.get("args") or [])
    kwargs = dict(request.get("kwargs") or {})
    if request["target"] == "snapshot":
        return getattr(snaps[0], request["name"])(*snaps[1:], *args, **kwargs)
    fn = getattr(_native, request["name"])
    return fn(snaps, *args, **kwargs) if snaps else fn(*args, **kwargs)


def main() -> None:
    """Reads the request from stdin, writes the answer to stdout, exits (0, or 3 with one
    line of error)."""
    request = json.load(sys.stdin)
    try:
        document = call(request)
    except (PathRefused, FragscopeError) as e:
        sys.stdout.write(str(e).replace("\n", " "))
        sys.stdout.flush()
        os._exit(EXIT_ERROR)
    except OSError as e:
        sys.stdout.write(f"cannot read: {e}".replace("\n", " "))
        sys.stdout.flush()
        os._exit(EXIT_ERROR)
    sys.stdout.write(document)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
