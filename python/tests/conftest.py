"""Shared fixtures: the real snapshots of ../shared/traces and the CLI to compare with.

The CLI is the release binary `target/release/fragscope` when it is built (CI builds it
before the tests), else the installed `fragscope` console script; `FRAGSCOPE_CLI` overrides.
A missing traces folder skips the real-file tests with a note, except under CI, where it
fails (a green CI run must mean the real files were read).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(os.environ.get("FRAGSCOPE_REPO") or Path(__file__).resolve().parents[2])
TRACES = Path(os.environ.get("FRAGSCOPE_TRACES") or REPO.parent / "shared" / "traces")


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


def real_files() -> list[Path]:
    """Every snapshot-like file of the traces folder (not its notes), sorted by name."""
    if not TRACES.is_dir():
        if os.environ.get("CI"):
            raise RuntimeError(f"{TRACES} is missing: CI must run the real-file tests")
        return []
    return sorted(p for p in TRACES.iterdir() if p.is_file() and p.suffix != ".md")


def real_pickles() -> list[Path]:
    return [p for p in real_files() if p.suffix in (".pickle", ".pkl")]


def params(files: list[Path]):
    if not files:
        return [pytest.param(None, marks=pytest.mark.skip(reason=f"{TRACES} not found: real-file tests skipped"))]
    return [pytest.param(p, id=p.name) for p in files]


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([cli_path(), *args], capture_output=True, text=True, timeout=600)


def pytest_report_header(config):
    return [f"fragscope CLI compared with: {cli_path()}", f"real snapshots: {TRACES} ({len(real_files())} files)"]


@pytest.fixture(scope="session")
def cli():
    return run_cli
