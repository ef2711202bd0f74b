"""Does the program of record.py fit at a batch size? The real answer, for `fragscope
predict --max-fit` to be compared with (tests/gpu/README.md). One process per size:

    python3 tests/gpu/fit.py BATCH [BATCH ...]      (PYTORCH_CUDA_ALLOC_CONF or PYTORCH_ALLOC_CONF as wanted)

Prints one JSON line per size: whether 3 AdamW steps ran without an OOM, the peaks, and
the device's free memory when the process began (what PyTorch could get), the torch
version, and the allocator settings under both environment names and as torch read them
(`record.alloc_conf_as_read`).
"""

import json
import os
import subprocess
import sys

CHILD = r"""
import json, sys, torch
import torch.nn.functional as F
sys.path.insert(0, "tests/gpu")
from record import GPT, alloc_conf_as_read
b = int(sys.argv[1])
free0, total = torch.cuda.mem_get_info()
torch.manual_seed(0)
dev = torch.device("cuda")
out = {"batch": b, "conf": __import__("os").environ.get("PYTORCH_CUDA_ALLOC_CONF", ""), "free_at_start": free0, "total": total}
out["torch"] = torch.__version__
out["alloc_conf_as_read"] = alloc_conf_as_read()
try:
    model = GPT(32000, 1024, 8, 16, 512, False).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    for _ in range(3):
        idx = torch.randint(0, 32000, (b, 512), device=dev)
        tgt = torch.randint(0, 32000, (b, 512), device=dev)
        loss = F.cross_entropy(model(idx).view(-1, 32000), tgt.view(-1))
        loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    out["fits"] = True
except torch.cuda.OutOfMemoryError as e:
    out["fits"] = False
    out["oom"] = str(e).splitlines()[0][:200]
out["max_memory_reserved"] = torch.cuda.max_memory_reserved()
out["max_memory_allocated"] = torch.cuda.max_memory_allocated()
print(json.dumps(out), flush=True)
"""

for b in sys.argv[1:]:
    r = subprocess.run([sys.executable, "-c", CHILD, b], capture_output=True, text=True, timeout=120)
    line = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else json.dumps({"batch": int(b), "error": r.stderr[-300:]})
    print(line, flush=True)
