#!/usr/bin/env python3
"""The PyTorch reference for bench_train_step: the same dense model, the same training step, the same threads.

The model is bench_train_step's `dense 8 layers` (and mom-train's dense8): GPT-2 pre-norm blocks, d_model 256,
8 heads, d_ff 1024, byte vocabulary 256, learned positions, LM head tied to the token embedding, tanh GELU,
float32. A step is what mom's bench times: zero_grad + forward + cross-entropy + backward + gradient clipping at
1.0 + AdamW (weight decay on matrices only), batch 16 x seq 256 = 4096 tokens.

Configured as a PyTorch user would on this CPU: torch.set_num_threads(threads) (= mom's OpenMP threads), fused QKV
projection, the attention as batched matmuls with a causal mask (PyTorch 1.13 has no fused CPU attention), AdamW
with foreach=True, set_to_none gradients. Runs in the environment users have (OPENBLAS_CORETYPE as set) unless
told otherwise by the caller.

  python3 bench/pytorch_train_step.py [--threads 2] [--batch 16] [--seq 256] [--reps 7]

Needs python3-torch (Debian 12: 1.13.1, `apt-get install python3-torch`); not part of scripts/setup.sh.
"""
import argparse
import math
import os
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d, heads, d_ff):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln_2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, d_ff)
        self.fc_proj = nn.Linear(d_ff, d)

    def forward(self, x, mask):
        b, s, d = x.shape
        h = self.heads
        q, k, v = self.qkv(self.ln_1(x)).split(d, dim=2)
        q = q.view(b, s, h, d // h).transpose(1, 2)
        k = k.view(b, s, h, d // h).transpose(1, 2)
        v = v.view(b, s, h, d // h).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d // h))
        att = att.masked_fill(mask[:s, :s], float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, s, d)
        x = x + self.proj(y)
        return x + self.fc_proj(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, layers=8, d=256, heads=8, d_ff=1024, vocab=256, context=256):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(context, d)
        self.blocks = nn.ModuleList([Block(d, heads, d_ff) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(d)
        self.register_buffer("mask", torch.triu(torch.ones(context, context, dtype=torch.bool), 1), persistent=False)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)
            elif "bias" in name:
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        b, s = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(s))
        for blk in self.blocks:
            x = blk(x, self.mask)
        logits = self.ln_f(x) @ self.wte.weight.t()  # tied head
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "2")))
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--reps", type=int, default=7)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    model = GPT()
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-4, foreach=True)
    g = torch.Generator().manual_seed(7)
    data = torch.randint(0, 256, (a.batch * a.seq + 1,), generator=g)
    x, y = data[:-1].view(a.batch, a.seq), data[1:].view(a.batch, a.seq)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss

    for _ in range(2):
        step()
    times = []
    for _ in range(a.reps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    params = sum(p.numel() for p in model.parameters())
    print(f"pytorch {torch.__version__}, {torch.get_num_threads()} threads, OPENBLAS_CORETYPE="
          f"{os.environ.get('OPENBLAS_CORETYPE', '(unset)')}, BLAS: {torch.__config__.show().count('BLAS_INFO')} "
          f"info line(s)")
    print(f"dense 8 layers: {params / 1e6:.2f}M params, step {med * 1e3:.1f} ms (median of {a.reps}; "
          f"min {min(times) * 1e3:.1f}, max {max(times) * 1e3:.1f}), {a.batch * a.seq / med:.0f} tokens/s")


if __name__ == "__main__":
    main()
