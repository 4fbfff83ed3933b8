#!/usr/bin/env python3
"""Compare two mom checkpoints tensor by tensor (parameters, and with --optimizer the AdamW moments too).

    python3 examples/compare_checkpoints.py RUN_A RUN_B                  # must be bit-identical
    python3 examples/compare_checkpoints.py RUN_A RUN_B --atol 1e-4      # max |a - b| <= atol, every value

RUN_A / RUN_B: a run dir (follows its 'latest') or a step folder. Prints one line: bit-identical, or the largest
difference relative to its tensor's largest magnitude and the tensor where it is; exits 1 when the check
fails (also the largest difference relative to its tensor's largest magnitude, for information). Used by examples/test_mpi.sh (data-parallel runs against one process); numpy only.
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs"))
from read_checkpoint import load, resolve  # noqa: E402


def tensors(path, optimizer):
    out, _ = load(path)
    if optimizer:
        opt, _ = load(os.path.join(os.path.dirname(resolve(path)), "optimizer.safetensors"))
        out.update(opt)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--atol", type=float, default=0.0, help="largest |a - b| allowed; 0: bit-identical")
    ap.add_argument("--optimizer", action="store_true", help="also adam.m and adam.v")
    args = ap.parse_args()
    a, b = tensors(args.a, args.optimizer), tensors(args.b, args.optimizer)
    if sorted(a) != sorted(b):
        print(f"FAIL: different tensors: {sorted(set(a) ^ set(b))}")
        return 1
    identical = True
    worst, worst_name, worst_rel = 0.0, "", 0.0
    for name in sorted(a):
        x, y = a[name].astype(np.float64), b[name].astype(np.float64)
        if x.shape != y.shape:
            print(f"FAIL: tensor {name}: shapes {x.shape} and {y.shape}")
            return 1
        if a[name].tobytes() == b[name].tobytes():
            continue
        identical = False
        diff = float(np.max(np.abs(x - y)))
        if diff > worst:
            worst, worst_name, worst_rel = diff, name, diff / max(float(np.max(np.abs(y))), 1e-30)
    what = "parameters and AdamW moments" if args.optimizer else "parameters"
    if identical:
        print(f"ok: {what} bit-identical ({len(a)} tensors)")
        return 0
    line = f"largest |difference| {worst:.3e} in '{worst_name}' ({worst_rel:.2e} of its max |x|)"
    if args.atol > 0 and worst <= args.atol:
        print(f"ok: {what} within {args.atol:g}: {line}")
        return 0
    print(f"FAIL: {what} not {'within %g' % args.atol if args.atol > 0 else 'bit-identical'}: {line}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
