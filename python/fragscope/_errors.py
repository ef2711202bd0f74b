"""fragscope's exceptions, by kind. Defined in Python (not in the Rust module) so that they
live in ``fragscope``, pickle by reference (a ``ProcessPoolExecutor`` worker's error reaches
the caller with its message) and show as ``fragscope.FragscopeError`` in tracebacks. The
Rust half (crates/python) raises these same classes.

``FragscopeError`` is a ``ValueError``; catch it for any fragscope failure, or a subclass
for one kind:

* :class:`SnapshotError`: a file or object that is not a readable memory snapshot (missing,
  not a pickle, truncated, wrong shape);
* :class:`RefusedPickleError` (a :class:`SnapshotError`): a pickle that asks to import or
  call code; nothing in it was executed;
* :class:`ArgumentError`: a bad argument (a size, fraction, allocator config, device, ...).
"""

from __future__ import annotations

__all__ = ["FragscopeError", "SnapshotError", "RefusedPickleError", "ArgumentError"]


class FragscopeError(ValueError):
    """A fragscope failure. The message is one line: the one the ``fragscope`` command
    prints after ``error: `` (with Python argument names where an argument is at fault)."""

    __module__ = "fragscope"


class SnapshotError(FragscopeError):
    """A file, bytes or object that is not a readable memory snapshot."""

    __module__ = "fragscope"


class RefusedPickleError(SnapshotError):
    """A pickle that asks to import or call code (``GLOBAL``, ``REDUCE``, ...): refused,
    nothing in it was executed."""

    __module__ = "fragscope"


class ArgumentError(FragscopeError):
    """A bad argument: a size, fraction, allocator config, device, ``top``, ..."""

    __module__ = "fragscope"
