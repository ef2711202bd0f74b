"""Who holds it: the chains of gc referrers that keep an object (a tensor) alive.

Users otherwise walk these by hand with ``gc.get_referrers``. Breadth first from the
object towards roots — a module global, a local variable of a running frame — the chains
found are rendered root first (``train.cache[3]``, ``Trainer.optimizer.state[<Parameter>]['exp_avg']``),
and a chain that comes back to an object already on it is reported as a reference cycle.
Standard library only; :func:`fragscope.torch.who_holds` applies it to the tensors whose
storage lies in a block of a snapshot.
"""

from __future__ import annotations

import gc
import os
import sys
import types
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple


@dataclass
class Chain:
    """One way an object is kept alive. ``kind``: ``"module global"``, ``"local variable"``
    or ``"reference cycle"``; ``root``: the module, the frame's variable, or the object the
    cycle passes through; ``steps``: the accessors from the root to the object."""

    kind: str
    root: str
    steps: List[str]
    where: str = ""

    @property
    def path(self) -> str:
        out = self.root
        for s in self.steps:
            out += s
        return out

    def __str__(self) -> str:
        return f"{self.path}  ({self.kind}{', ' + self.where if self.where else ''})"


def _render(steps: List[str]) -> List[str]:
    """An instance's ``__dict__`` step ("") followed by ``['name']`` reads ``.name``."""
    out: List[str] = []
    attr = False
    for s in steps:
        if s == "":
            attr = True
            continue
        if attr and s.startswith("['") and s.endswith("']"):
            s = "." + s[2:-2]
        attr = False
        out.append(s)
    return out


def _short(o: Any) -> str:
    t = type(o)
    name = getattr(o, "__qualname__", None) or getattr(o, "__name__", None)
    if isinstance(o, (types.FunctionType, type)) and name:
        return f"<{t.__name__} {name}>"
    return f"<{t.__module__}.{t.__qualname__}>" if t.__module__ != "builtins" else f"<{t.__name__}>"


def _key(k: Any) -> str:
    if isinstance(k, (str, int, float, bool, type(None))):
        return repr(k)
    return _short(k)


def _edge(parent: Any, child: Any) -> Optional[str]:
    """How ``parent`` refers to ``child``, as an accessor (``['k']``, ``[3]``, ``.attr``)."""
    if isinstance(parent, dict):
        for k, v in parent.items():
            if v is child:
                return f"[{_key(k)}]"
        for k in parent:
            if k is child:
                return " (as a key)"
        return None
    if isinstance(parent, (list, tuple)):
        for i, v in enumerate(parent):
            if v is child:
                return f"[{i}]"
        return None
    if isinstance(parent, (set, frozenset)):
        return " (in a set)"
    if isinstance(parent, types.CellType):
        return ""  # the function's __closure__[i] step already names it
    if isinstance(parent, types.FunctionType):
        if parent.__closure__ is child:
            return ".__closure__"
        return f" (referenced by {parent.__qualname__})"
    if isinstance(parent, types.MethodType):
        return " (bound method self)"
    # Attributes: since CPython 3.11 an instance may refer to its attribute values directly
    # (no separate __dict__ object), so look through vars() first.
    try:
        attrs = vars(parent)
    except TypeError:
        attrs = {}
    if attrs is child:
        return ""  # an instance's __dict__: the next step names the attribute
    for k, v in attrs.items():
        if v is child:
            return f".{k}"
    for slot in getattr(type(parent), "__slots__", ()):
        if getattr(parent, slot, None) is child:
            return f".{slot}"
    return f" (referenced by {_short(parent)})"


def referrer_chains(target: Any, max_depth: int = 10, max_chains: int = 8) -> List[Chain]:
    """Up to ``max_chains`` shortest chains of referrers from roots to ``target``."""
    # Running frames are scanned directly: since CPython 3.11 a frame's locals are not
    # gc-visible referrers until something materialises the frame object. fragscope's own
    # frames (this walk, who_holds) are not holders.
    here = os.path.dirname(os.path.abspath(__file__))
    frames = [
        f
        for top in sys._current_frames().values()
        for f in _stack(top)
        if not os.path.abspath(f.f_code.co_filename).startswith(here + os.sep)
    ]
    modules = {id(m.__dict__): name for name, m in list(sys.modules.items()) if m is not None and hasattr(m, "__dict__")}
    own_frame = sys._getframe()
    objs: Dict[int, Any] = {id(target): target}
    # For each object reached: (the object it refers to, the accessor), towards the target.
    towards: Dict[int, Tuple[int, str]] = {}
    frontier = [id(target)]
    chains: List[Chain] = []
    ignore = {id(objs), id(frontier), id(towards), id(chains), id(frames)}

    for _ in range(max_depth):
        nxt_frontier: List[int] = []
        ignore.add(id(nxt_frontier))
        for oid in frontier:
            child = objs[oid]
            for f in frames:
                for k, v in f.f_locals.items():
                    if v is child:
                        where = f"{f.f_code.co_name}() at {f.f_code.co_filename}:{f.f_lineno}"
                        chains.append(Chain("local variable", k, _render(_path(towards, oid)), where))
            refs = gc.get_referrers(child)
            ignore.add(id(refs))
            for r in refs:
                if id(r) in ignore or r is own_frame:
                    continue
                if isinstance(r, types.FrameType):
                    continue  # frames were scanned above
                elif id(r) in modules:
                    how = _edge(r, child) or ""
                    steps = _render(["", how] + _path(towards, oid))
                    chains.append(Chain("module global", modules[id(r)], steps))
                elif id(r) in objs:
                    # Reached already: a cycle when r lies between this object and the target.
                    if id(r) in _ids_on(towards, oid):
                        cycle = Chain("reference cycle", _short(r), _render([_edge(r, child) or ""] + _path(towards, oid)))
                        if all(c.path != cycle.path for c in chains):
                            chains.append(cycle)
                else:
                    how = _edge(r, child)
                    if how is None:
                        continue
                    objs[id(r)] = r
                    towards[id(r)] = (oid, how)
                    nxt_frontier.append(id(r))
                    cycle = _cycle_through(r, towards)
                    if cycle is not None and all(c.path != cycle.path for c in chains):
                        chains.append(cycle)
                if len(chains) >= max_chains:
                    return chains
            del refs
        frontier = nxt_frontier
        if not frontier:
            break
    return chains


def _stack(frame: Optional[types.FrameType]) -> List[types.FrameType]:
    out = []
    while frame is not None:
        out.append(frame)
        frame = frame.f_back
    return out


def _path(towards: Dict[int, Tuple[int, str]], i: int) -> List[str]:
    """The accessors from object ``i`` down to the target."""
    steps = []
    while i in towards:
        i, how = towards[i][0], towards[i][1]
        steps.append(how)
    return steps


def _cycle_through(r: Any, towards: Dict[int, Tuple[int, str]]) -> Optional[Chain]:
    """A chain when ``r`` refers back to itself or to an object between it and the target
    (a reference cycle keeps the target alive until the cycle collector runs). Found from
    ``r``'s referents rather than its referrers: an instance's attribute dict made on demand
    is not always visible to ``gc.get_referrers``."""
    on_path = _ids_on(towards, id(r))
    # r refers to the next object on the path by construction: that is not a cycle.
    on_path.discard(towards[id(r)][0])
    on_path.add(id(r))
    try:
        attrs = list(vars(r).values())
    except TypeError:
        attrs = []
    for x in gc.get_referents(r) + attrs:
        if id(x) in on_path:
            how = _edge(r, x)
            if how is None:
                continue
            return Chain("reference cycle", _short(r), _render([how] + _path(towards, id(x))))
    return None


def _ids_on(towards: Dict[int, Tuple[int, str]], i: int) -> set:
    seen = {i}
    while i in towards:
        i = towards[i][0]
        seen.add(i)
    return seen
