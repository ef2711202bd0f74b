"""Types against the documented schemas: the TypedDicts of fragscope.schema against the tables
of docs/json-schema.md (keys and types), real results against both, and the extension's
stub (_native.pyi) against the module itself. What this catches: a key added to the output
but not to the document or the types, a type changed on one side only, a stub entry for
something that does not exist (the old ``Snapshot.segments``)."""

from __future__ import annotations

import ast
import inspect
import re
import typing
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

import pytest

import fragscope
from fragscope import _native, schema
from conftest import REPO, params, real_files

DOC = REPO / "docs" / "json-schema.md"

# Objects the document gives as a key/type table, and the class of fragscope.schema for each.
TABLES = ["FileSummary", "DeviceSummary", "Fragmentation", "Trace", "MemvizStats", "Settings",
          "DeviceAnalysis", "LeakSteps", "LeakSuspect", "Recommendations", "LabReport", "LabRow", "RoleWhatIf", "ChangeOutcome", "RoleRows"]


def doc_tables() -> Dict[str, Dict[str, str]]:
    """Section heading → {key: documented type} for every `| `key` | type | meaning |` row."""
    out: Dict[str, Dict[str, str]] = {}
    section = None
    for line in DOC.read_text(encoding="utf-8").splitlines():
        m = re.match(r"^#{2,3} (.+)$", line)
        if m:
            section = m.group(1).strip()
            continue
        if section and line.startswith("| `"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            for key in re.findall(r"`([^`]+)`", cells[0]):
                out.setdefault(section, {})[key] = cells[1]
    return out


def all_keys(td) -> Dict[str, Any]:
    return typing.get_type_hints(td)


def doc_type_matches(doc: str, hint) -> Optional[bool]:
    """Whether a documented type ("int", "number or null", "array of Finding", ...) is the
    annotation; None when the document's wording is not one this reads (then only the key
    is compared)."""
    doc = doc.strip()
    if doc.endswith(" or null"):
        args = typing.get_args(hint)
        if typing.get_origin(hint) is not Union or type(None) not in args:
            return False
        rest = [a for a in args if a is not type(None)]
        return doc_type_matches(doc[: -len(" or null")], rest[0]) if len(rest) == 1 else False
    if doc.startswith("array of "):
        if typing.get_origin(hint) is not list:
            return False
        item = doc[len("array of "):]
        if item.startswith("`"):
            return None
        return doc_type_matches(item.rstrip("s") if item in ("strings",) else item, typing.get_args(hint)[0])
    simple = {"int": int, "number": float, "float": float, "string": str, "bool": bool}
    if doc in simple:
        return hint is simple[doc]
    if doc == "object":
        return typing.get_origin(hint) is dict
    if re.fullmatch(r"[A-Z][A-Za-z]+", doc):
        named = getattr(schema, doc, None)
        if named is None:  # a documented object without a class here: a dict
            return typing.get_origin(hint) is dict
        return hint is named
    return None


@pytest.mark.parametrize("name", TABLES)
def test_typeddicts_match_the_document(name):
    doc = doc_tables()
    assert name in doc, f"docs/json-schema.md has no table for {name}"
    documented = dict(doc[name])
    if name == "FileSummary":  # documented in their own sections
        documented["profiler_totals"] = "array"
        documented["window"] = "object or null"
    hints = all_keys(getattr(schema, name))
    assert set(hints) == set(documented), (
        f"{name}: in the document only: {sorted(set(documented) - set(hints))}; "
        f"in fragscope.schema only: {sorted(set(hints) - set(documented))}"
    )
    checked = 0
    for key, t in documented.items():
        ok = doc_type_matches(t, hints[key])
        assert ok is not False, f"{name}.{key}: documented {t!r}, typed {hints[key]!r}"
        checked += ok is True
    assert checked >= len(documented) // 2, f"{name}: too few types compared ({checked})"


def test_finding_keys_match_the_document():
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index("### Finding"):text.index("### OomFinding")]
    assert set(all_keys(schema.Finding)) == {"kind", "severity", "headline"}
    for key in all_keys(schema.Finding):
        assert f"`{key}`" in section


def check_keys(td, obj: Dict[str, Any], where: str) -> None:
    """Every key of `obj` is typed, every required key is there, and nested typed objects too."""
    hints = all_keys(td)
    required = td.__required_keys__
    assert set(obj) <= set(hints), f"{where}: untyped keys {sorted(set(obj) - set(hints))}"
    assert required <= set(obj), f"{where}: missing keys {sorted(required - set(obj))}"
    for key, value in obj.items():
        hint = hints[key]
        target = hint
        if typing.get_origin(hint) is Union:  # Optional[X]: X
            target = next(a for a in typing.get_args(hint) if a is not type(None))
        if typing.get_origin(target) is list and value:
            item = typing.get_args(target)[0]
            if isinstance(item, type) and hasattr(item, "__required_keys__"):
                for i, x in enumerate(value):
                    check_keys(item, x, f"{where}.{key}[{i}]")
        elif isinstance(target, type) and hasattr(target, "__required_keys__") and value is not None:
            check_keys(target, value, f"{where}.{key}")


@pytest.mark.parametrize("path", params(real_files()))
def test_real_results_have_the_typed_keys(path):
    try:
        snap = fragscope.load(path)
    except fragscope.SnapshotError as e:
        pytest.skip(f"{path.name}: not a snapshot fragscope reads ({e})")
    s = snap.summary()
    check_keys(schema.SummaryDoc, s.to_dict(), f"{path.name} summary")
    check_keys(schema.AnalyzeDoc, snap.analyze().to_dict(), f"{path.name} analyze")
    if snap.trace_events and path.stat().st_size < 20 << 20:
        check_keys(schema.LabDoc, snap.lab(["best-fit"]).to_dict(), f"{path.name} lab")
    check_keys(schema.CheckDoc, snap.check().to_dict(), f"{path.name} check")
    # The typed accessors return what the document says, as dicts with attribute access.
    assert all(isinstance(d, dict) and d.device == d["device"] for d in s.devices)


def test_diff_and_replay_documents_have_the_typed_keys():
    a = fragscope.example()
    check_keys(schema.DiffDoc, a.diff(a).to_dict(), "diff")
    check_keys(schema.ReplayDoc, a.replay(verify=True).to_dict(), "replay")


def test_stub_matches_the_extension_module():
    """Every name of _native.pyi exists in the module (and the Snapshot's methods and
    properties in its class), and every public name of the module is in the stub."""
    stub = ast.parse((Path(fragscope.__file__).parent / "_native.pyi").read_text(encoding="utf-8"))
    top = {n.name for n in stub.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    top |= {n.target.id for n in stub.body if isinstance(n, ast.AnnAssign)}
    runtime = {n for n in dir(_native) if not n.startswith("_")} | {"__version__"}
    assert top == runtime, (sorted(top - runtime), sorted(runtime - top))
    cls = next(n for n in stub.body if isinstance(n, ast.ClassDef) and n.name == "Snapshot")
    members = {n.name for n in cls.body if isinstance(n, ast.FunctionDef)}
    real = {n for n in dir(_native.Snapshot) if not n.startswith("_")}
    assert members == real, (sorted(members - real), sorted(real - members))
    # Functions' parameters as the stub declares them (the Rust signatures carry them).
    for fn in (n for n in stub.body if isinstance(n, ast.FunctionDef)):
        got = list(inspect.signature(getattr(_native, fn.name)).parameters)
        assert got == [a.arg for a in fn.args.args], fn.name
    for fn in (n for n in cls.body if isinstance(n, ast.FunctionDef)):
        member = getattr(_native.Snapshot, fn.name)
        if isinstance(member, property) or not callable(member):
            continue
        got = list(inspect.signature(member).parameters)
        assert got == [a.arg for a in fn.args.args], fn.name


def test_public_snapshot_exposes_what_the_stub_declares():
    """fragscope.Snapshot has every property the extension's Snapshot has (segments
    included), returning the same values."""
    snap = fragscope.example()
    for name in ("name", "format", "devices", "trace_events", "segments"):
        assert getattr(snap, name) == getattr(snap._native, name), name
