"""Records real snapshots of a small GPT-style training run on a CUDA device, for the
checks that need a GPU (see tests/gpu/README.md).

One process per recording, so that each starts from an empty caching allocator:

    python3 tests/gpu/record.py --batch 8 --seq 512 --out b8.pickle [--checkpoint] [--steps 3]

Writes the snapshot (protocol 4, as fragscope.torch.record dumps it) and, beside it,
``<out>.truth.json``: what the live process measured itself — torch.cuda.memory_stats()
peaks and counters, and the exact bytes of parameters, gradients and AdamW state, counted
from the tensors — the ground truth the replay-based predictions and the memory-by-role
figures are compared with.
"""

import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

import fragscope.torch as ft


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (t.view(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab, d, layers, heads, seq, use_checkpoint):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.use_checkpoint = use_checkpoint

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.blocks:
            x = checkpoint(blk, x, use_reentrant=False) if self.use_checkpoint else blk(x)
        return self.head(self.ln(x))


def alloc_conf_as_read():
    """The allocator settings of this process: both environment names (PyTorch 2.9+ reads
    PYTORCH_ALLOC_CONF beside PYTORCH_CUDA_ALLOC_CONF, and 2.9.1 ignored expandable_segments
    under the new name, pytorch/pytorch#183387), and what the allocator itself read, from a
    snapshot's `allocator_settings` (2.3+; None before, or if the call fails)."""
    env = {k: os.environ.get(k) for k in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")}
    try:
        read = torch.cuda.memory._snapshot().get("allocator_settings")
        # JSON-safe: the settings dict holds ints, floats, bools, strings and a dict of ints.
        read = json.loads(json.dumps(read, default=str)) if read is not None else None
    except Exception as e:  # an older torch, or no CUDA context yet
        read = {"error": f"{type(e).__name__}: {e}"[:200]}
    return {"env": env, "read_by_torch": read}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--d", type=int, default=1024)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--checkpoint", action="store_true")
    p.add_argument("--amp", action="store_true", help="forward and loss under torch.autocast(bfloat16)")
    p.add_argument("--out", required=True)
    a = p.parse_args()

    torch.manual_seed(0)
    dev = torch.device("cuda")
    t0 = time.time()
    with ft.record(max_entries=1_000_000, stacks="python", dump_to=a.out):
        model = GPT(a.vocab, a.d, a.layers, a.heads, a.seq, a.checkpoint).to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
        for step in range(a.steps):
            with ft.phase("step"):
                idx = torch.randint(0, a.vocab, (a.batch, a.seq), device=dev)
                tgt = torch.randint(0, a.vocab, (a.batch, a.seq), device=dev)
                with torch.autocast("cuda", dtype=torch.bfloat16, enabled=a.amp):
                    logits = model(idx)
                    loss = F.cross_entropy(logits.view(-1, a.vocab), tgt.view(-1))
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        params = sum(p.numel() * p.element_size() for p in model.parameters())
        grads_at_end = sum(p.grad.numel() * p.grad.element_size() for p in model.parameters() if p.grad is not None)
        opt_state = sum(
            v.numel() * v.element_size()
            for st in opt.state.values()
            for v in st.values()
            if torch.is_tensor(v) and v.is_cuda
        )
    stats = torch.cuda.memory_stats()
    truth = {
        "batch": a.batch,
        "seq": a.seq,
        "checkpoint": a.checkpoint,
        "amp": a.amp,
        "steps": a.steps,
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        "alloc_conf_as_read": alloc_conf_as_read(),
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(),
        "total_memory": torch.cuda.get_device_properties(0).total_memory,
        "parameters_bytes": params,
        "parameter_count": sum(p.numel() for p in model.parameters()),
        "gradients_bytes_if_kept": params,
        "grads_at_end_bytes": grads_at_end,
        "optimizer_state_bytes": opt_state,
        "max_memory_reserved": torch.cuda.max_memory_reserved(),
        "max_memory_allocated": torch.cuda.max_memory_allocated(),
        "memory_reserved_end": torch.cuda.memory_reserved(),
        "num_alloc_retries": stats.get("num_alloc_retries"),
        "num_device_alloc": stats.get("num_device_alloc"),
        "num_device_free": stats.get("num_device_free"),
        "seconds": round(time.time() - t0, 2),
    }
    with open(a.out + ".truth.json", "w") as f:
        json.dump(truth, f, indent=1)
    print(json.dumps(truth))


if __name__ == "__main__":
    sys.exit(main())
