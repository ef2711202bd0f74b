"""Held-out harness: training steps of a trace, decided by the harness from evidence in the
trace, independently of fragscope.

A training step ends with its optimizer step. An allocation belongs to an optimizer step when
one of its frames is optimizer code:
* a frame in `torch/optim/` other than the optimizer's constructor (`__init__`,
  `add_param_group`) and `zero_grad`;
* a frame named `_single_tensor_*`, `_multi_tensor_*` or `_fused_*` (PyTorch's Adam/AdamW/SGD
  implementations);
* a frame named `step` in a file whose base name contains `optim` (hand-written optimizers:
  `optimizers.py:step`, a user `optimizer.py:step`).
Consecutive optimizer allocations (at most GAP other allocations between them) form one
optimizer run; each run ends one step. `ProfilerStep#N` annotations are not present in any
host used here, so they are not consulted.

Step k (1-based) spans the trace entries (end of run k-1, end of run k]. The first step has no
earlier run: it starts `forward length of step 2` entries before its optimizer run (or at 0),
so that model construction before the first forward is not counted as part of step 1.
Inside a step, the "work" region is [step start, optimizer run start): forward, loss and
backward; the backward starts at the first allocation whose frames are autograd code
(the autograd engine `autograd::Engine`, `_engine_run_backward`, `Tensor.backward`,
`torch.autograd.backward`, a `*Backward0::apply` node or a C++ `*_backward(` formula; forward ops
also pass through `torch::autograd::VariableType`, so `autograd::` alone is not evidence), else
at the middle of the region.
"""
import re

GAP = 2
_OPT_NAME = re.compile(r"^_(single_tensor|multi_tensor|fused)_")
_BWD = re.compile(r"autograd::Engine|_engine_run_backward|_tensor\.py:backward|"
                  r"torch/autograd/__init__\.py:backward|Backward\d*::apply|::\w+_backward\(")


def _fname(fr):
    return fr.get("filename", "").replace("\\", "/")


def is_optimizer_frame(fr):
    f = _fname(fr)
    name = fr.get("name", "")
    if "torch/optim/" in f and name not in ("__init__", "add_param_group", "zero_grad"):
        return True
    if _OPT_NAME.search(name):
        return True
    base = f.rsplit("/", 1)[-1]
    return name == "step" and "optim" in base


def is_optimizer_alloc(e):
    return any(is_optimizer_frame(fr) for fr in e.get("frames", []) or [])


def is_backward_alloc(e):
    for fr in e.get("frames", []) or []:
        if _BWD.search(_fname(fr) + ":" + fr.get("name", "")):
            return True
    return False


def optimizer_runs(trace):
    """[(first trace index, last trace index)] of the optimizer runs."""
    allocs = [i for i, e in enumerate(trace) if e.get("action") == "alloc"]
    runs = []
    cur = None
    gap = 0
    for i in allocs:
        if is_optimizer_alloc(trace[i]):
            if cur is not None and gap <= GAP:
                cur[1] = i
            else:
                if cur is not None:
                    runs.append(tuple(cur))
                cur = [i, i]
            gap = 0
        else:
            gap += 1
    if cur is not None:
        runs.append(tuple(cur))
    return runs


def steps(trace):
    """List of dicts: start, opt_start, end (inclusive end index), bwd_start."""
    runs = optimizer_runs(trace)
    out = []
    prev_end = None
    for k, (a, b) in enumerate(runs):
        # the step's end: the last entry before the next alloc after the run (its frees)
        end = b
        j = b + 1
        while j < len(trace) and trace[j].get("action") != "alloc":
            end = j
            j += 1
        start = prev_end + 1 if prev_end is not None else None
        out.append({"start": start, "opt_start": a, "end": end})
        prev_end = end
    if not out:
        return out
    if out[0]["start"] is None:
        if len(out) > 1:
            fwd_len = out[1]["opt_start"] - out[1]["start"]
            out[0]["start"] = max(0, out[0]["opt_start"] - fwd_len)
        else:
            out[0]["start"] = 0
    for s in out:
        s["bwd_start"] = None
        for i in range(s["start"], s["opt_start"]):
            e = trace[i]
            if e.get("action") == "alloc" and is_backward_alloc(e):
                s["bwd_start"] = i
                break
        if s["bwd_start"] is None:
            s["bwd_start"] = (s["start"] + s["opt_start"]) // 2
    return out
