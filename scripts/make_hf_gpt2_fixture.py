#!/usr/bin/env python3
"""Write a tiny GPT-2 checkpoint in the exact Hugging Face layout (python3 standard library only).

    python3 scripts/make_hf_gpt2_fixture.py OUT_DIR [--n-embd 32 --n-head 4 --n-layer 2 --vocab 64 --n-positions 16]
            [--prefix] [--lm-head] [--attn-bias] [--dtype F32|F16|BF16] [--seed 1] [--logits 3,1,4,1,5]

writes OUT_DIR/model.safetensors and OUT_DIR/config.json as transformers' GPT2LMHeadModel.save_pretrained would:
tensor names wte.weight, wpe.weight, h.{i}.ln_1.weight/bias, h.{i}.attn.c_attn.weight/bias, h.{i}.attn.c_proj.*,
h.{i}.ln_2.*, h.{i}.mlp.c_fc.*, h.{i}.mlp.c_proj.*, ln_f.weight/bias, Conv1D weights stored [in, out];
--prefix names them "transformer.<name>", --lm-head adds the tied "lm_head.weight" (a copy of wte.weight),
--attn-bias adds the h.{i}.attn.bias causal-mask buffers [1, 1, P, P] of older checkpoints.

Values are k/256 (LayerNorm gains k/64) for pseudo-random integers k in [-127, 127]: exactly representable in
F32, F16 and BF16, so the three dtypes hold the same numbers. --logits TOKENS prints, as JSON on stdout, the logits
of that sequence computed with Hugging Face GPT-2's semantics (Conv1D y = x W + b, q|k|v split, gelu_new,
LayerNorm eps 1e-5, tied head): a reference that shares no code with the C++ model.
"""
import argparse
import json
import math
import os
import struct


def lcg(seed):
    x = (seed * 0x9E3779B97F4A7C15 + 1) % (1 << 64)
    while True:
        x = (x * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        yield ((x >> 33) % 255) - 127


def make_tensors(a, rng):
    d, f, v, p, L = a.n_embd, 4 * a.n_embd, a.vocab, a.n_positions, a.n_layer

    def t(*shape, scale=256.0):
        n = 1
        for s in shape:
            n *= s
        return (list(shape), [next(rng) / scale for _ in range(n)])

    out = {"wte.weight": t(v, d), "wpe.weight": t(p, d)}
    for i in range(L):
        h = f"h.{i}."
        out[h + "ln_1.weight"] = t(d, scale=64.0)
        out[h + "ln_1.bias"] = t(d)
        if a.attn_bias:
            out[h + "attn.bias"] = ([1, 1, p, p], [1.0 if c <= r else 0.0 for r in range(p) for c in range(p)])
        out[h + "attn.c_attn.weight"] = t(d, 3 * d)
        out[h + "attn.c_attn.bias"] = t(3 * d)
        out[h + "attn.c_proj.weight"] = t(d, d)
        out[h + "attn.c_proj.bias"] = t(d)
        out[h + "ln_2.weight"] = t(d, scale=64.0)
        out[h + "ln_2.bias"] = t(d)
        out[h + "mlp.c_fc.weight"] = t(d, f)
        out[h + "mlp.c_fc.bias"] = t(f)
        out[h + "mlp.c_proj.weight"] = t(f, d)
        out[h + "mlp.c_proj.bias"] = t(d)
    out["ln_f.weight"] = t(d, scale=64.0)
    out["ln_f.bias"] = t(d)
    return out


def encode(values, dtype):
    if dtype == "F32":
        return struct.pack(f"<{len(values)}f", *values)
    if dtype == "F16":
        return struct.pack(f"<{len(values)}e", *values)
    # BF16: the upper half of the float's bits (the values are exact, no rounding needed)
    raw = struct.pack(f"<{len(values)}f", *values)
    return b"".join(raw[i + 2:i + 4] for i in range(0, len(raw), 4))


def write_safetensors(path, tensors, dtype):
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, (shape, values) in tensors.items():
        blob = encode(values, dtype)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


# ---- reference forward pass with Hugging Face GPT-2 semantics ----------------------------------------------

def layernorm(x, w, b):
    out = []
    for row in x:
        mean = sum(row) / len(row)
        var = sum((v - mean) ** 2 for v in row) / len(row)
        r = 1.0 / math.sqrt(var + 1e-5)
        out.append([(v - mean) * r * g + c for v, g, c in zip(row, w, b)])
    return out


def conv1d(x, weight, bias, n_in, n_out):  # y = x W + b, W stored [in, out] row-major
    return [[bias[o] + sum(row[i] * weight[i * n_out + o] for i in range(n_in)) for o in range(n_out)] for row in x]


def gelu_new(v):
    return 0.5 * v * (1.0 + math.tanh(math.sqrt(2.0 / math.pi) * (v + 0.044715 * v ** 3)))


def reference_logits(a, tensors, tokens):
    g = lambda name: tensors[name][1]
    d, heads, f, S = a.n_embd, a.n_head, 4 * a.n_embd, len(tokens)
    hd = d // heads
    wte, wpe = g("wte.weight"), g("wpe.weight")
    x = [[wte[tok * d + j] + wpe[s * d + j] for j in range(d)] for s, tok in enumerate(tokens)]
    for i in range(a.n_layer):
        h = f"h.{i}."
        qkv = conv1d(layernorm(x, g(h + "ln_1.weight"), g(h + "ln_1.bias")), g(h + "attn.c_attn.weight"),
                     g(h + "attn.c_attn.bias"), d, 3 * d)
        att = [[0.0] * d for _ in range(S)]
        for hh in range(heads):
            c = hh * hd
            for s in range(S):
                q = qkv[s][c:c + hd]
                scores = [sum(qv * kv for qv, kv in zip(q, qkv[t][d + c:d + c + hd])) / math.sqrt(hd)
                          for t in range(s + 1)]
                m = max(scores)
                e = [math.exp(v - m) for v in scores]
                z = sum(e)
                for j in range(hd):
                    att[s][c + j] = sum(e[t] / z * qkv[t][2 * d + c + j] for t in range(s + 1))
        proj = conv1d(att, g(h + "attn.c_proj.weight"), g(h + "attn.c_proj.bias"), d, d)
        x = [[u + v for u, v in zip(r1, r2)] for r1, r2 in zip(x, proj)]
        hidden = conv1d(layernorm(x, g(h + "ln_2.weight"), g(h + "ln_2.bias")), g(h + "mlp.c_fc.weight"),
                        g(h + "mlp.c_fc.bias"), d, f)
        hidden = [[gelu_new(v) for v in row] for row in hidden]
        proj = conv1d(hidden, g(h + "mlp.c_proj.weight"), g(h + "mlp.c_proj.bias"), f, d)
        x = [[u + v for u, v in zip(r1, r2)] for r1, r2 in zip(x, proj)]
    x = layernorm(x, g("ln_f.weight"), g("ln_f.bias"))
    return [[sum(row[j] * wte[t * d + j] for j in range(d)) for t in range(a.vocab)] for row in x]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--n-embd", type=int, default=32)
    ap.add_argument("--n-head", type=int, default=4)
    ap.add_argument("--n-layer", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=64)
    ap.add_argument("--n-positions", type=int, default=16)
    ap.add_argument("--prefix", action="store_true", help='name tensors "transformer.<name>"')
    ap.add_argument("--lm-head", action="store_true", help="add the tied lm_head.weight")
    ap.add_argument("--attn-bias", action="store_true", help="add the h.{i}.attn.bias mask buffers")
    ap.add_argument("--dtype", choices=["F32", "F16", "BF16"], default="F32")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--logits", help="comma-separated token ids: print their reference logits as JSON")
    a = ap.parse_args()
    if a.n_embd % a.n_head:
        ap.error("n_embd must be divisible by n_head")

    tensors = make_tensors(a, lcg(a.seed))
    named = dict(tensors)
    if a.lm_head:
        named["lm_head.weight"] = tensors["wte.weight"]
    if a.prefix:
        named = {(k if k == "lm_head.weight" else "transformer." + k): v for k, v in named.items()}
    os.makedirs(a.out_dir, exist_ok=True)
    write_safetensors(os.path.join(a.out_dir, "model.safetensors"), named, a.dtype)
    config = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "activation_function": "gelu_new",
              "layer_norm_epsilon": 1e-5, "n_embd": a.n_embd, "n_head": a.n_head, "n_layer": a.n_layer,
              "n_positions": a.n_positions, "n_ctx": a.n_positions, "n_inner": None, "vocab_size": a.vocab,
              "tie_word_embeddings": True}
    with open(os.path.join(a.out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    if a.logits:
        tokens = [int(t) for t in a.logits.split(",")]
        print(json.dumps({"tokens": tokens, "logits": reference_logits(a, tensors, tokens)}))


if __name__ == "__main__":
    main()
