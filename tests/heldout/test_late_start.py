#!/usr/bin/env python3
"""Checks of the late-start harness itself (late_start.py), not of fragscope's detector.

* Every cut file's device trace equals the host's trace from the cut to the end, entry for
  entry; every other top-level key is kept; the final `segments` are the host's (RING: the
  same objects' values; LATE: the same but for the `frames` of blocks and segments made
  before the cut, which are emptied, and only those); `external_annotations` are what
  PyTorch keeps (LATE: those at or after the first kept entry's time; RING: the newest N).
* The cuts land where their kind says (a step's first entry, inside its forward / backward /
  optimizer run, len - N), the draws are deterministic, and the truths follow from steps.py.
* The role truths are confirmed by the hosts' traces (every role live at the end of the
  trace, so in every suffix), and the negatives have no backward and no optimizer run.
* With the fragscope binary present, fragscope reads every cut file (`summary --json`, exit
  0) and counts exactly the kept entries.
* The matching rule's verdicts on made-up answers (right, cannot tell, wrong) are the ones
  the rule states.

Runs with `python3 tests/heldout/test_late_start.py` or `python3 -m pytest tests/heldout`.
Hosts missing from the corpus and the repository are SKIPPED visibly; under CI (`CI` set)
a missing host fails.
"""
import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import late_start as ls  # noqa: E402
import plant  # noqa: E402
import snapmodel as sm  # noqa: E402
import steps as stepsmod  # noqa: E402

BIN = os.environ.get("FRAGSCOPE_BIN", os.path.join(plant.REPO, "target", "release", "fragscope"))
_MADE = {}


def skip(msg):
    if os.environ.get("CI"):
        raise AssertionError(f"required under CI: {msg}")
    print(f"SKIPPED: {msg}")


def made():
    if "dir" not in _MADE:
        d = tempfile.mkdtemp(prefix="heldout-late-")
        atexit.register(shutil.rmtree, d, True)
        _MADE["dir"], _MADE["man"] = d, ls.make(d)
        for s in _MADE["man"]["skipped"]:
            if s["why"] == "not found":
                skip(f"host {s['host']} not found")
    return _MADE["dir"], _MADE["man"]


_HOSTS = {}


def host(rec):
    if rec["host"] not in _HOSTS:
        _HOSTS[rec["host"]] = sm.load(os.path.join(plant.REPO, rec["host_path"]))
    return _HOSTS[rec["host"]]


def strip_frames(segs):
    out = []
    for s in segs:
        s2 = {k: v for k, v in s.items() if k not in ("frames", "blocks")}
        s2["blocks"] = [{k: v for k, v in b.items() if k != "frames"} for b in s["blocks"]]
        out.append(s2)
    return out


def test_cut_files_are_suffixes_with_the_final_state():
    d, man = made()
    assert man["files"], "no cut file made"
    for rec in man["files"]:
        h = host(rec)
        cut = sm.load(os.path.join(d, rec["file"]))
        tr = h["device_traces"][0]
        c = rec["cut"]
        assert cut["device_traces"][0] == tr[c:], rec["file"]
        assert len(cut["device_traces"][0]) == rec["kept_entries"] > 0
        assert cut["device_traces"][1:] == h["device_traces"][1:]
        assert set(cut) == set(h), rec["file"]
        for k in h:
            if k not in ("device_traces", "segments", "external_annotations"):
                assert cut[k] == h[k], (rec["file"], k)
        ann = h.get("external_annotations")
        if rec["form"] == "ring":
            assert cut["segments"] == h["segments"], rec["file"]
            n = rec["max_entries"]
            assert c == len(tr) - n
            if ann is not None:
                assert cut["external_annotations"] == ann[-n:]
        else:
            assert strip_frames(cut["segments"]) == strip_frames(h["segments"]), rec["file"]
            live = ls.live_index_at_end(tr)
            segs_in_suffix = {e["addr"] for e in tr[c:] if e["action"] == "segment_alloc"}
            emptied = kept = 0
            for s0, s1 in zip(h["segments"], cut["segments"]):
                if "frames" in s0:
                    if s0["address"] in segs_in_suffix:
                        assert s1["frames"] == s0["frames"]
                    else:
                        assert s1["frames"] == []
                for b0, b1 in zip(s0["blocks"], s1["blocks"]):
                    if "frames" not in b0:
                        continue
                    if b0["state"] != "inactive" and live.get(b0["address"], -1) < c:
                        assert b1["frames"] == [], (rec["file"], b0["address"])
                        emptied += 1
                    else:
                        assert b1["frames"] == b0["frames"]
                        kept += 1
            assert emptied > 0, f"{rec['file']}: no block made before the cut (not a late start)"
            if ann is not None:
                t0 = tr[c]["time_us"]
                kept_ann = cut["external_annotations"]
                assert all(a["time_us"] >= t0 for a in kept_ann)
                later = [a for a in ann if a["time_us"] >= t0]
                # only ENDs of scopes entered before t0 are dropped from the later ones
                dropped = [a for a in later if a not in kept_ann]
                assert all(a["stage"] == "END" for a in dropped), rec["file"]
                starts = sum(1 for a in kept_ann if a["stage"] == "START")
                ends = sum(1 for a in kept_ann if a["stage"] == "END")
                assert ends <= starts, rec["file"]


def test_cuts_land_where_their_kind_says_and_truths_follow():
    d, man = made()
    kinds = set()
    for rec in man["files"]:
        tr = host(rec)["device_traces"][0]
        c = rec["cut"]
        kinds.add(("neg:" if rec["negative"] else "") + rec["kind"])
        if rec["negative"]:
            assert rec["truth"]["steps"] == 0
            assert rec["truth"]["roles"]["gradients"] == 0 == rec["truth"]["roles"]["optimizer_state"]
            continue
        stp = stepsmod.steps(tr)
        if rec["kind"] != "ring":
            s = stp[rec["cut_step"] - 1]
            assert rec["cut_step"] >= 2
            lo_hi = {"boundary": (s["start"], s["start"]),
                     "in_forward": (s["start"] + 1, s["bwd_start"] - 1),
                     "in_backward": (s["bwd_start"] + 1, s["opt_start"] - 1),
                     "in_optimizer": (s["opt_start"] + 1, s["end"])}[rec["kind"]]
            assert lo_hi[0] <= c <= lo_hi[1], (rec["file"], c, lo_hi)
        truth = rec["truth"]
        assert truth["steps"] == sum(1 for s in stp if s["start"] >= c)
        if rec["kind"] == "boundary":
            assert truth["partial_step"] is None
        if rec["kind"] in ("in_forward", "in_backward", "in_optimizer"):
            assert truth["partial_step"] == rec["cut_step"]
    for k in ("boundary", "in_forward", "in_backward", "in_optimizer", "ring", "neg:late_mid",
              "neg:ring"):
        assert k in kinds, f"no case of kind {k}"


def test_draws_are_deterministic():
    d, man = made()
    seen = set()
    for rec in man["files"]:
        if rec["host"] in seen:
            continue
        seen.add(rec["host"])
        tr = host(rec)["device_traces"][0]
        stp = stepsmod.steps(tr)
        a = ls.draw_cuts(rec["host"], tr, stp, rec["negative"])
        b = ls.draw_cuts(rec["host"], tr, stp, rec["negative"])
        assert a == b
        assert [x[2] for x in a if x[0] == rec["kind"]], rec["host"]


def test_role_truths_confirmed_by_traces():
    gt = ls.load_gt()
    checked = 0
    for name, rel in ls.TRAIN_HOSTS:
        g = gt.get(name, {})
        if not any(g.get(r) for r in ls.ROLES):
            continue
        p = plant.find_host(rel)
        if p is None:
            skip(f"host {name} not found")
            continue
        tr = sm.load(p)["device_traces"][0]
        stp = stepsmod.steps(tr)
        live = ls.live_index_at_end(tr)
        size = {}
        for i, e in enumerate(tr):
            if e["action"] == "alloc":
                size[i] = e["size"]
        last = stp[-1]
        grads = sum(size[i] for i in live.values() if last["bwd_start"] <= i < last["opt_start"])
        assert grads == g["gradients"], (name, grads)
        opt_run = sum(size[i] for i in live.values() if last["opt_start"] <= i <= last["end"])
        assert opt_run == g["parameters"] + g["optimizer_state"], (name, opt_run)
        allocs = [e for e in tr if e["action"] == "alloc"]
        assert sum(e["size"] for e in allocs[:39]) == g["parameters"]
        checked += 1
    for name, rel in ls.NEG_HOSTS:
        p = plant.find_host(rel)
        if p is None:
            skip(f"negative {name} not found")
            continue
        tr = sm.load(p)["device_traces"][0]
        assert stepsmod.steps(tr) == []
        assert not any(e["action"] == "alloc" and stepsmod.is_backward_alloc(e) for e in tr)
        checked += 1
    assert checked > 0


def test_fragscope_reads_every_cut_file():
    if not os.path.exists(BIN):
        skip(f"no fragscope binary at {BIN}")
        return
    d, man = made()
    for rec in man["files"]:
        r = subprocess.run([BIN, "summary", "--json", os.path.join(d, rec["file"])],
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, (rec["file"], r.stderr[-300:])
        dev = ls.device0(json.loads(r.stdout))
        assert dev is not None and dev.get("trace_events") == rec["kept_entries"], \
            (rec["file"], dev.get("trace_events") if dev else None)


def test_matching_rule_verdicts():
    rb = lambda v, **kw: {"by_role": {"gradients": dict({"max": v}, **kw)}}  # noqa: E731
    T = 1000
    assert ls.judge_role(T, True, ls.role_answer(rb(1005), "gradients")) == "right"
    assert ls.judge_role(T, True, ls.role_answer(rb(1011), "gradients")) == "wrong"
    assert ls.judge_role(T, True, ls.role_answer(rb(0), "gradients")) == "wrong"
    assert ls.judge_role(T, False, ls.role_answer(rb(0), "gradients")) == "wrong"
    assert ls.judge_role(0, True, ls.role_answer(rb(0), "gradients")) == "right"
    assert ls.judge_role(0, True, ls.role_answer(rb(1), "gradients")) == "wrong"
    assert ls.judge_role(T, True, ls.role_answer(rb(None), "gradients")) == "missed"
    assert ls.judge_role(T, False, ls.role_answer(rb(None), "gradients")) == "cannot_tell_ok"
    assert ls.judge_role(T, True, ls.role_answer(rb(5, can_tell=False), "gradients")) == "missed"
    assert ls.judge_role(T, False, ls.role_answer(rb(5, known=False), "gradients")) == "cannot_tell_ok"
    assert ls.judge_role(T, True, ls.role_answer({"by_role": {}, "unknown": ["gradients"]},
                                                 "gradients")) == "missed"
    assert ls.judge_role(T, True, ls.role_answer(None, "gradients")) == "missed"
    rec = {"kind": "in_forward", "truth": {"steps": 1}}
    st = lambda *c, reason=None: {"steps": {"steps": [{"complete": x} for x in c],  # noqa: E731
                                            "reason": reason}}
    assert ls.judge_steps(rec, ls.steps_answer(st(False, True))) == "right"
    assert ls.judge_steps(rec, ls.steps_answer(st(True, True))) == "wrong"
    assert ls.judge_steps(rec, ls.steps_answer(st(reason="no optimizer"))) == "missed"
    assert ls.judge_steps(rec, ls.steps_answer({})) == "missed"
    rec_b = {"kind": "boundary", "truth": {"steps": 2}}
    assert ls.judge_steps(rec_b, ls.steps_answer(st(False, True))) == "right"
    assert ls.judge_steps(rec_b, ls.steps_answer(st(False, False))) == "wrong"
    neg = {"kind": "late_mid", "truth": {"steps": 0, "steps_total_must_be_zero": True}}
    assert ls.judge_steps(neg, ls.steps_answer(st())) == "right"
    assert ls.judge_steps(neg, ls.steps_answer(st(False))) == "wrong"


def main():
    failed = 0
    for name, fn in sorted(globals().items()):
        if name.startswith("test_") and callable(fn):
            try:
                fn()
                print(f"ok   {name}")
            except Exception as e:  # noqa: BLE001 - report every failure, keep going
                failed += 1
                print(f"FAIL {name}: {e!r}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
