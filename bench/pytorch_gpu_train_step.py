#!/usr/bin/env python3
"""The PyTorch reference for bench_gpu_train_step on a GPU (issue 28): GPT-2 small trained as a PyTorch user would.

The model is bench_gpu_train_step's dense GPT-2 small (mom's `gpt2-small`): 12 pre-norm blocks, d_model 768, 12 heads,
d_ff 3072, learned positions, LM head tied to the token embedding, tanh GELU, context 1024. A step is what mom's bench
times: zero_grad + forward + cross-entropy + backward + gradient clipping at 1.0 + AdamW (weight decay 0.1 on matrices
only), on random tokens, batch 8 x seq 1024 by default.

Configured as the best public PyTorch code trains it (nanoGPT / modded-nanogpt): fp32 weights with bf16 autocast,
scaled_dot_product_attention (flash attention on an H100), fused AdamW, set_to_none gradients, TF32 allowed for the
fp32 matrix products, the vocabulary padded to 50304 (a multiple of 64: aligned rows; mom uses 50257). Two modes:
eager and torch.compile. The host waits for the device after each timed step (as mom's bench does); the median of
--reps steps after --warmup steps is reported.

  python3 bench/pytorch_gpu_train_step.py [--batch 8] [--seq 1024] [--reps 20] [--warmup 5] [--vocab 50304]
                                          [--modes eager,compile] [--flops-per-token F] [--peak 989.4]

--flops-per-token (default: mom's cost model for GPT-2 small at seq 1024 x 3, forward + backward, PaLM's count)
and --peak (dense bf16 TFLOP/s) give the MFU column with the same numerator as mom's bench.
"""
import argparse
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d, heads, d_ff):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, d_ff)
        self.out = nn.Linear(d_ff, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        shape = (b, t, self.heads, d // self.heads)
        q, k, v = (z.view(shape).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).contiguous().view(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, vocab, context, d, heads, d_ff, layers):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(context, d)
        self.blocks = nn.ModuleList(Block(d, heads, d_ff) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02 / (math.sqrt(2 * layers) if name.endswith(("proj.weight", "out.weight")) else 1))
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))


def run(mode, args, device):
    torch.manual_seed(7)
    model = GPT(args.vocab, 1024, 768, 12, 3072, 12).to(device)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-4, betas=(0.9, 0.95), fused=True)
    fwd = torch.compile(model) if mode == "compile" else model
    n = args.batch * args.seq
    sets = [torch.randint(0, 50257, (args.batch, args.seq + 1), device=device) for _ in range(4)]

    def step(i):
        data = sets[i % len(sets)]
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            loss = fwd(data[:, :-1], data[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss

    t0 = time.perf_counter()
    for i in range(args.warmup):
        loss = step(i)
    torch.cuda.synchronize()
    warm_s = time.perf_counter() - t0
    if not torch.isfinite(loss):
        raise SystemExit(f"pytorch {mode}: the loss is not finite ({loss.item()})")
    times = []
    for i in range(args.reps):
        t = time.perf_counter()
        step(i)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    med = statistics.median(times)
    tps = n / med
    mfu = args.flops_per_token * tps / (args.peak * 1e12)
    print(f"  pytorch {torch.__version__} {mode:7s} step {med * 1e3:8.1f} ms (median of {args.reps}; min {min(times) * 1e3:.1f},"
          f" max {max(times) * 1e3:.1f}; warm-up {warm_s:.0f} s)  {tps:9.0f} tokens/s  MFU {100 * mfu:5.1f}%", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--vocab", type=int, default=50304)
    ap.add_argument("--modes", default="eager,compile")
    ap.add_argument("--flops-per-token", type=float, default=3 * 266.0e6)
    ap.add_argument("--peak", type=float, default=989.4)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("pytorch_gpu_train_step: no CUDA device")
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    device = torch.device("cuda")
    print(f"pytorch_gpu_train_step: {torch.cuda.get_device_name()}, batch {args.batch} x seq {args.seq}, vocab {args.vocab},"
          f" bf16 autocast, fp32 weights, SDPA, fused AdamW", flush=True)
    for mode in args.modes.split(","):
        run(mode, args, device)


if __name__ == "__main__":
    main()
