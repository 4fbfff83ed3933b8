#!/usr/bin/env python3
"""Summarise an Nsight Compute CSV of gpu__time_duration.sum (scripts/gpu_check.sh): kernel time per step by
kernel name, the top N, as a Markdown table.

    ncu_summary.py NCU_CSV TITLE STEPS [TOP]

STEPS: how many training steps the profiled program ran (the times and launch counts are divided by it)."""
import collections
import csv
import sys


def main() -> None:
    path, title, steps = sys.argv[1], sys.argv[2], float(sys.argv[3])
    top = int(sys.argv[4]) if len(sys.argv) > 4 else 15
    with open(path) as f:
        rows = [r for r in csv.DictReader(l for l in f if l.startswith('"'))
                if r.get("Metric Name") == "gpu__time_duration.sum"]
    t, n = collections.Counter(), collections.Counter()
    for r in rows:
        k = r["Kernel Name"].split("(")[0][:70]
        t[k] += float(r["Metric Value"].replace(",", "")) / 1e6 / steps
        n[k] += 1 / steps
    total = sum(t.values())
    print(f"ncu, {title}: {len(rows) / steps:.0f} kernels per step, {total:.1f} ms of kernel time per step")
    print("| kernel | ms per step | share | launches per step |")
    print("|---|---:|---:|---:|")
    for k, v in t.most_common(top):
        print(f"| `{k}` | {v:.2f} | {100 * v / max(total, 1e-12):.1f}% | {n[k]:.0f} |")


if __name__ == "__main__":
    main()
