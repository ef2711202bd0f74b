"""What a result shows: headline figures in repr(), a compact table in Jupyter, and a report
page that does not put megabytes into the notebook."""

from __future__ import annotations

import re

import pytest

import fragscope
from conftest import grid_file, real_pickles

# The largest real pickle here (the corpus's or the repository's set): reprs stay short
# however large the result.
BIG = max(real_pickles(), key=lambda p: p.stat().st_size)


def fmt(n: int) -> str:
    return fragscope._fmt_bytes(n)


@pytest.fixture(scope="module")
def snap():
    return fragscope.load(BIG)


def test_summary_repr_has_the_figures(snap):
    s = snap.summary()
    r = repr(s)
    d = s.to_dict()["files"][0]["devices"][0]
    assert r.startswith(f"<fragscope.Summary of {BIG}: device {d['device']}: ")
    assert f"reserved {fmt(d['reserved_bytes'])}" in r and f"allocated {fmt(d['allocated_bytes'])}" in r
    # One format for the figure on every surface (docs/glossary.md): a percentage, as `state`.
    assert f"free-space fragmentation {d['fragmentation']['free_space_fragmentation'] * 100:.1f}%" in r
    assert len(r) < 1200


def test_analysis_repr_has_the_verdict_and_peaks(snap):
    a = snap.analyze()
    r = repr(a)
    d = a.to_dict()["files"][0]["devices"][0]
    tl = d["fragmentation"]["timeline"]
    assert f"peak reserved {fmt(tl['peak_reserved']['bytes'])}" in r
    assert f"peak allocated {fmt(tl['peak_allocated']['bytes'])}" in r
    assert ("OOM (" in r) == bool(d["oom"])
    assert d["findings"][0]["headline"][:40] in r
    assert len(r) < 1500


def test_replay_lab_diff_check_reprs():
    path = grid_file("niu-fwd-ctx200-fp32.pickle")
    s = fragscope.load(path)
    rep = s.replay()
    d = rep.to_dict()["files"][0]["devices"][0]
    assert f"model matches {d['allocs_matched']}/{d['allocs']} allocations" in repr(rep)
    assert fmt(d["whatif"][0]["peak_reserved"]) in repr(rep)
    lab = s.lab(["best-fit", "expandable"])
    row = lab.to_dict()["files"][0]["devices"][0]["rows"][0]
    assert f"{row['policy']} {fmt(row['peak_reserved'])} (x{row['ratio']:.3f})" in repr(lab)
    other = fragscope.load(grid_file("niu-fwd-ctx200-mixed.pickle"))
    diff = s.diff(other)
    dd = diff.to_dict()["devices"][0]
    assert f"peak reserved {fmt(dd['a']['peak_reserved'])} -> {fmt(dd['b']['peak_reserved'])}" in repr(diff)
    bad = s.check(max_reserved="1MiB")
    assert repr(bad).startswith("<fragscope.Check ok=False: check failed: ") and bad.message in repr(bad)
    assert repr(s.check()).startswith("<fragscope.Check ok=True: passed (device 0 peak reserved ")


def test_replay_repr_leads_with_the_oom_under_a_small_capacity():
    s = fragscope.load(grid_file("niu-fwd-ctx200-fp32.pickle"))
    peak = s.replay().to_dict()["files"][0]["devices"][0]["whatif"][0]["peak_reserved"]
    rep = s.replay(capacity=peak // 2)
    w = rep.to_dict()["files"][0]["devices"][0]["whatif"][0]
    assert w["first_oom"], w
    r = repr(rep)
    name = rep.to_dict()["files"][0]["file"]
    head = f"<fragscope.Replay of {name}: device 0: OOM: {fragscope._run_name(w)} runs out of memory at trace entry {w['first_oom']['index']} "
    assert r.startswith(head), r
    # Without a capacity nothing runs out: no OOM is claimed.
    assert "OOM" not in repr(s.replay())


def test_nested_fields_print_their_values(snap):
    d = snap.analyze().devices[0]
    r = repr(d)
    n = len(d["findings"])
    assert r.startswith(f"Fields(device={d['device']}, findings=[{n} item{'' if n == 1 else 's'}]")
    assert fragscope._short([1]) == "[1 item]" and fragscope._short([1, 2]) == "[2 items]"
    assert len(r) < 400
    site = snap.analyze().devices[0].peaks.allocated_peak.sites[0]
    assert repr(site).startswith(f"Fields(site={fragscope._short(site['site'])}, ")
    assert f"bytes={site['bytes']}" in repr(site)


def test_every_result_has_a_compact_html_table(snap):
    path = grid_file("niu-fwd-ctx200-fp32.pickle")
    s = fragscope.load(path)
    results = [snap.summary(), snap.analyze(), s.replay(), s.lab(["best-fit"]), s.diff(s), s.check(max_reserved="1MiB")]
    for r in results:
        h = r._repr_html_()
        assert "<table>" in h, type(r).__name__
        assert len(h) < 40_000, (type(r).__name__, len(h))
        # A table row per device (or per policy / run), not one row per JSON field.
        assert not re.search(r"<td>schema</td>", h), type(r).__name__


def test_report_in_a_notebook_stays_small(snap, tmp_path, monkeypatch):
    r = snap.report()
    assert fragscope.Report.max_inline_bytes < len(r.html), len(r.html)
    # Over the budget: a few hundred bytes that say how to see it, not megabytes in the notebook.
    shown = r._repr_html_()
    assert len(shown) < 1000 and "report.show(" in shown and "MiB of HTML" in shown
    monkeypatch.chdir(tmp_path)
    frame = r.show("page.html")
    assert (tmp_path / "page.html").read_text(encoding="utf-8") == r.html
    assert frame._repr_html_().startswith('<iframe sandbox="allow-scripts" src="page.html"')
    # Within the budget: the page itself, in a sandboxed iframe.
    monkeypatch.setattr(fragscope.Report, "max_inline_bytes", len(r.html))
    assert r._repr_html_().startswith('<iframe sandbox="allow-scripts" style=') and len(r._repr_html_()) > len(r.html)
