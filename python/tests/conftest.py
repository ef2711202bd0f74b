"""Shared fixtures: the real snapshots to test on and the CLI to compare with.

Real snapshots come from one of two sets, as the Rust tests find them
(``fragscope_testdata``, crates/testdata/src/lib.rs):

* the **full corpus** ``../shared/traces`` beside the checkout (``FRAGSCOPE_TRACES``
  overrides), used when it exists;
* else the **in-repository set** ``crates/testdata/real/`` (and its ``grids/``), which a
  fresh clone always has.

A test that needs a file only the corpus holds calls :func:`real_file`, which skips with a
reason naming the file (``pytest -rs`` lists each). Under CI (``CI`` set) a missing corpus
is an error instead: a green CI run must mean every real file was read.

The CLI is the release binary ``target/release/fragscope`` when it is built (CI builds it
before the tests), else the installed ``fragscope`` console script; ``FRAGSCOPE_CLI`` overrides.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import List, Optional

import pytest

# The pytester fixture (test_plugin.py runs pytest inside pytest): loaded here so that a
# plain `pytest python/tests` works without `-p pytester`.
pytest_plugins = ["pytester"]

REPO = Path(os.environ.get("FRAGSCOPE_REPO") or Path(__file__).resolve().parents[2])
CORPUS = Path(os.environ.get("FRAGSCOPE_TRACES") or REPO.parent / "shared" / "traces")
IN_REPO = REPO / "crates" / "testdata" / "real"


def _corpus_dir() -> Optional[Path]:
    if CORPUS.is_dir():
        return CORPUS
    if os.environ.get("CI"):
        raise RuntimeError(f"{CORPUS} is missing: CI must run the real-file tests on the full corpus")
    return None


HAS_CORPUS = _corpus_dir() is not None
# The folder the real-file tests read: the corpus when present, else the in-repository set.
TRACES = CORPUS if HAS_CORPUS else IN_REPO


def real_file(name: str) -> Path:
    """A real file by name, from the corpus when present, else from the in-repository set;
    skips the calling test (the reason names the file) when neither has it."""
    p = TRACES / name
    if not p.is_file():
        pytest.skip(f"needs {name}, only in the full corpus {CORPUS} (absent)")
    return p


def grid_file(name: str) -> Path:
    """A file of the grids (``grids/``, GRIDS.md), from the corpus or the in-repository set."""
    p = TRACES / "grids" / name
    if not p.is_file():
        pytest.skip(f"needs grids/{name}, only in the full corpus {CORPUS} (absent)")
    return p


def cli_path() -> str:
    env = os.environ.get("FRAGSCOPE_CLI")
    if env:
        return env
    release = REPO / "target" / "release" / "fragscope"
    if release.is_file():
        return str(release)
    script = Path(sys.executable).with_name("fragscope")
    if script.is_file():
        return str(script)
    found = shutil.which("fragscope")
    if found:
        return found
    raise RuntimeError("no fragscope command: build target/release/fragscope or pip install .")


def real_files() -> List[Path]:
    """Every snapshot-like file of the real-file folder (not its notes), sorted by name."""
    return sorted(p for p in TRACES.iterdir() if p.is_file() and p.suffix != ".md")


def real_pickles() -> List[Path]:
    return [p for p in real_files() if p.suffix in (".pickle", ".pkl")]


def params(files: List[Path]):
    # Never empty: the in-repository set is always there. An empty list would make pytest
    # skip the test silently ("got empty parameter set"), so it is an error here.
    assert files, f"no real snapshots in {TRACES}"
    return [pytest.param(p, id=p.name) for p in files]


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([cli_path(), *args], capture_output=True, text=True, timeout=600)


def _corpus_line() -> str:
    return (f"real snapshots: {TRACES} ({len(real_files())} files)"
            + ("" if HAS_CORPUS else f"; the full corpus {CORPUS} is absent: tests over every real snapshot ran on the "
               "in-repository set only, and tests that need one of its files are skipped (-rs lists them)"))


def pytest_report_header(config):
    return [f"fragscope CLI compared with: {cli_path()}", _corpus_line()]


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    # The header is hidden under -q (as .ci/test.d/python.sh runs): say again, at the end,
    # which snapshots the real-file tests covered, so a run without the corpus never looks
    # like a full one.
    terminalreporter.write_line(_corpus_line())


@pytest.fixture(scope="session")
def cli():
    return run_cli
