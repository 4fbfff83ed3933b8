#!/usr/bin/env python3
"""Read a mom checkpoint's tensors with numpy + json only (no torch, no safetensors package).

    python3 docs/read_checkpoint.py runs/kjv            # a run dir (follows its 'latest') or a step folder
    python3 docs/read_checkpoint.py runs/kjv/step-000600/model.safetensors

Prints the metadata and one line per tensor: name, dtype, shape, sum, mean |x|. As a library:

    from read_checkpoint import load
    tensors, metadata = load("runs/kjv")     # {name: numpy array}, {key: str}
    wte = tensors["wte"]                     # [vocab, d_model]; the LM head is tied to it

The format: 8-byte little-endian header length N, N bytes of JSON
{"name": {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, "__metadata__": {...}},
then the raw little-endian data (offsets relative to the byte after the header).
"""
import json
import os
import struct
import sys

import numpy as np

DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1",
          "U64": "<u8", "U32": "<u4", "U16": "<u2", "U8": "u1", "BOOL": "?"}


def resolve(path):
    """A run dir (with 'latest'), a step folder, or a .safetensors file -> the model file's path."""
    if os.path.isdir(path):
        latest = os.path.join(path, "latest")
        if os.path.exists(latest):
            with open(latest) as f:
                path = os.path.join(path, f.read().strip())
        path = os.path.join(path, "model.safetensors")
    return path


def load(path):
    path = resolve(path)
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    if n > len(data) - 8:
        raise ValueError(f"{path}: truncated (header of {n} bytes, file of {len(data)})")
    header = json.loads(data[8:8 + n])
    metadata = header.pop("__metadata__", {})
    body = memoryview(data)[8 + n:]
    tensors = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        if end > len(body):
            raise ValueError(f"{path}: tensor {name} ends at {end}, beyond the {len(body)} data bytes")
        array = np.frombuffer(body[begin:end], dtype=DTYPES[info["dtype"]])
        tensors[name] = array.reshape(info["shape"])
    return tensors, metadata


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        sys.exit(2)
    tensors, metadata = load(sys.argv[1])
    for key in sorted(metadata):
        print(f"meta {key} = {metadata[key]}")
    total = 0
    for name, t in tensors.items():
        total += t.size
        print(f"tensor {name} {t.dtype} {list(t.shape)} sum={float(t.astype(np.float64).sum()):.9g} "
              f"mean_abs={float(np.abs(t.astype(np.float64)).mean()):.9g}")
    print(f"total {len(tensors)} tensors, {total} values")


if __name__ == "__main__":
    main()
