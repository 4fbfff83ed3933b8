#!/usr/bin/env python3
"""The PyTorch reference for bench_decode: the same models decoded with a hand-written KV cache.

Models (float32, GPT-2 pre-norm blocks, learned positions, tied head, tanh GELU): mom's `dense8` (d_model 256,
8 heads, d_ff 1024, 8 layers, vocab 256) and GPT-2 small's shape (768, 12 heads, 3072, 12 layers, vocab 50257).
What is timed is what bench_decode times: after a prompt of context/2 tokens, one decode step per new token
for a batch of 1 or 8 sequences: embed, per layer LayerNorm, fused QKV projection, the new key and value
appended to a preallocated cache (index_copy into [batch, heads, max_len, hd] tensors, no reallocation),
attention of the one query over the cached positions (matmul, softmax, matmul), output projection, MLP;
final LayerNorm and logits. Under torch.inference_mode(), torch.set_num_threads(threads) as mom's OpenMP threads.

  /usr/bin/python3 bench/pytorch_decode.py [--threads 2] [--tokens 32] [--only dense8,gpt2-small] [--device cuda]

--device cuda runs the same models on a GPU (float32, TF32 matmuls as cuda::Backend's default), the
reference for bench_gpu_decode; the clock stops after torch.cuda.synchronize().

Needs python3-torch (Debian 12: 1.13.1, `apt-get install python3-torch`); not part of scripts/setup.sh.
"""
import argparse
import math
import time

import torch
import torch.nn.functional as F


class Model:
    def __init__(self, d, heads, d_ff, layers, vocab, context, device="cpu"):
        g = torch.Generator().manual_seed(1)
        r = lambda *s: (torch.randn(*s, generator=g) * 0.02).to(device)
        z = lambda n: torch.zeros(n, device=device)
        o = lambda n: torch.ones(n, device=device)
        self.device = device
        self.d, self.heads, self.hd, self.vocab, self.context = d, heads, d // heads, vocab, context
        self.wte, self.wpe = r(vocab, d), r(context, d)
        self.layers = []
        for _ in range(layers):
            self.layers.append(dict(ln1=(o(d), z(d)), w_qkv=r(3 * d, d), b_qkv=z(3 * d), w_proj=r(d, d), b_proj=z(d),
                                    ln2=(o(d), z(d)), w_fc=r(d_ff, d), b_fc=z(d_ff), w_out=r(d, d_ff), b_out=z(d)))
        self.lnf = (o(d), z(d))
        self.params = vocab * d + context * d + layers * (4 * d * d + 2 * d * d_ff + 9 * d + d_ff) + 2 * d

    def new_cache(self, batch, max_len):
        shape = (batch, self.heads, max_len, self.hd)
        return [(torch.zeros(shape, device=self.device), torch.zeros(shape, device=self.device)) for _ in self.layers]

    def step(self, tokens, pos, cache):
        """tokens [B] at position pos (the same for every sequence here) -> logits [B, vocab]."""
        B = tokens.shape[0]
        x = self.wte[tokens] + self.wpe[pos]
        index = torch.tensor([pos], device=self.device)
        for layer, (kc, vc) in zip(self.layers, cache):
            h = F.layer_norm(x, (self.d,), *layer["ln1"])
            qkv = F.linear(h, layer["w_qkv"], layer["b_qkv"]).view(B, 3, self.heads, self.hd)
            q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]
            kc.index_copy_(2, index, k.unsqueeze(2))
            vc.index_copy_(2, index, v.unsqueeze(2))
            att = torch.matmul(q.unsqueeze(2), kc[:, :, : pos + 1].transpose(-1, -2)) / math.sqrt(self.hd)
            y = torch.matmul(att.softmax(-1), vc[:, :, : pos + 1]).reshape(B, self.d)
            x = x + F.linear(y, layer["w_proj"], layer["b_proj"])
            h = F.layer_norm(x, (self.d,), *layer["ln2"])
            x = x + F.linear(F.gelu(F.linear(h, layer["w_fc"], layer["b_fc"]), approximate="tanh"), layer["w_out"],
                             layer["b_out"])
        return F.linear(F.layer_norm(x, (self.d,), *self.lnf), self.wte)


def bench(name, model, context, batch, tokens):
    half = context // 2
    dev = model.device
    sync = torch.cuda.synchronize if dev != "cpu" else (lambda: None)
    cache = model.new_cache(batch, context)
    prompt = torch.arange(batch * half, device=dev).remainder(model.vocab).view(batch, half)
    model.step(prompt[:, 0], 0, cache)  # warm-up
    sync()
    t0 = time.perf_counter()
    for t in range(half):  # the prompt, position by position
        model.step(prompt[:, t], t, cache)
    sync()
    prefill = time.perf_counter() - t0
    nxt = torch.arange(batch, device=dev).remainder(model.vocab)
    steps = min(tokens, context - half)
    t0 = time.perf_counter()
    for s in range(steps):
        model.step(nxt, half + s, cache)
    sync()
    ms = (time.perf_counter() - t0) / steps * 1e3
    print(f"| {name} (PyTorch {torch.__version__}) | {context} | {batch} | {batch * half / prefill:.0f} | {ms:.2f} | "
          f"{batch * 1e3 / ms:.0f} |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--only", default="dense8,gpt2-small")
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    where = f"{torch.get_num_threads()} threads"
    if a.device != "cpu":
        torch.backends.cuda.matmul.allow_tf32 = True
        where = torch.cuda.get_device_name(a.device) + ", TF32 matmuls"
    print(f"pytorch_decode: torch {torch.__version__}, {where}, float32, inference_mode")
    print("| model | context | batch | prefill tok/s | ms per step | decode tok/s |")
    print("|---|---:|---:|---:|---:|---:|")
    with torch.inference_mode():
        if "dense8" in a.only:
            m = Model(256, 8, 1024, 8, 256, 256, a.device)
            for b in (1, 8):
                bench("dense 8 layers (d 256)", m, 256, b, a.tokens)
        if "gpt2-small" in a.only:
            m = Model(768, 12, 3072, 12, 50257, 1024, a.device)
            for ctx in (256, 1024):
                for b in (1, 8):
                    bench("GPT-2 small shape", m, ctx, b, a.tokens)


if __name__ == "__main__":
    main()
