"""``Snapshot.report()`` / ``fragscope.report()``: the same page ``fragscope report`` writes."""

from __future__ import annotations

import os
import stat

import pytest

import fragscope
from conftest import grid_file, params, real_pickles, run_cli

PICKLES = real_pickles()


@pytest.mark.parametrize("path", params(PICKLES[:6]))
def test_report_equals_cli(path, tmp_path):
    out = tmp_path / "cli.html"
    p = run_cli("report", str(path), "-o", str(out))
    assert p.returncode == 0, p.stderr
    r = fragscope.load(str(path)).report()
    assert r.html == out.read_text(encoding="utf-8")
    # Saved through the API: the same bytes, and no temporary file left beside it.
    r.save(tmp_path / "api.html")
    assert (tmp_path / "api.html").read_text(encoding="utf-8") == r.html
    assert sorted(x.name for x in tmp_path.iterdir()) == ["api.html", "cli.html"]


def test_two_runs_compared_as_cli(tmp_path):
    a, b = grid_file("niu-fwd-ctx200-fp32.pickle"), grid_file("niu-fwd-ctx200-mixed.pickle")
    out = tmp_path / "cli.html"
    p = run_cli("report", str(a), str(b), "-o", str(out))
    assert p.returncode == 0, p.stderr
    r = fragscope.report([str(a), fragscope.load(str(b))], tmp_path / "api.html")
    assert r.html == out.read_text(encoding="utf-8")
    assert (tmp_path / "api.html").read_text(encoding="utf-8") == r.html


def test_many_files_share_the_page_budget_as_cli(tmp_path):
    # Six files: their share of the page's budget binds (fewer buckets, allocations and
    # state values each; each file's note says so), and the page is the CLI's, byte for byte.
    paths = [str(p) for p in PICKLES[:6]]
    assert len(paths) == 6, f"six real snapshots needed, found {len(paths)}"
    out = tmp_path / "cli.html"
    p = run_cli("report", *paths, "-o", str(out))
    assert p.returncode == 0, p.stderr
    r = fragscope.report(paths)
    assert "size budget is shared by 6 files" in r.html
    assert r.html == out.read_text(encoding="utf-8")


def test_jupyter_shows_the_page_in_a_sandboxed_iframe(monkeypatch):
    r = fragscope.example().report()
    # Inline only within the notebook budget (test_repr.py checks the page over it).
    monkeypatch.setattr(fragscope.Report, "max_inline_bytes", len(r.html))
    shown = r._repr_html_()
    assert shown.startswith('<iframe sandbox="allow-scripts"')
    # The whole page is inside srcdoc, escaped: no raw tag of the page leaks out.
    assert "<script" not in shown and "&lt;script" in shown
    assert len(r.html) > 10_000 and r.html.lstrip().lower().startswith("<!doctype html")


def test_save_refuses_a_symlink_or_a_fifo(tmp_path):
    # Report.save and Snapshot.save write as the CLI does (issue 43): a regular file or
    # nothing at the path; a symlink or FIFO there is refused and left as it was.
    snap = fragscope.example()
    target = tmp_path / "precious.txt"
    target.write_text("keep me")
    link = tmp_path / "out.html"
    link.symlink_to(target)
    fifo = tmp_path / "pipe.html"
    os.mkfifo(fifo)
    for save in (snap.report().save, snap.save):
        for path in (link, fifo):
            with pytest.raises(fragscope.FragscopeError, match="symlink|FIFO"):
                save(path)
    assert link.is_symlink() and target.read_text() == "keep me"
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert sorted(x.name for x in tmp_path.iterdir()) == ["out.html", "pipe.html", "precious.txt"]
