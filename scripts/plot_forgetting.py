#!/usr/bin/env python3
"""Draw ModuleFormer's forgetting comparison (scripts/moduleformer_demo.sh) as one SVG (stdlib only).

    python3 scripts/plot_forgetting.py runs/i15-demo.tsv -o docs/img/moduleformer_forgetting.svg

The input is a TSV with columns step, variant, kjv_val, licenses_val. Two panels share the x axis (fine-tuning
steps on the second text): the KJV validation loss (what is forgotten) and the second text's validation loss
(what is learned); one colour per variant.
"""
import argparse
import csv
import html
import sys

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e"]
# The demo's variant names, spelled out in the legend.
LABELS = {"full": "full fine-tuning", "insert-reg": "insertion, router A'", "insert": "insertion, router A,B,A'"}
W, H, PAD_L, PAD_R, PAD_T, PAD_B, GAP = 800, 330, 60, 190, 30, 45, 70


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tsv")
    ap.add_argument("-o", "--out", required=True)
    a = ap.parse_args()
    runs = {}
    with open(a.tsv) as f:
        for row in csv.DictReader(f, delimiter="\t"):
            try:
                runs.setdefault(row["variant"], []).append(
                    (int(row["step"]), float(row["kjv_val"]), float(row["licenses_val"])))
            except (KeyError, ValueError) as e:
                sys.exit(f"plot_forgetting.py: {a.tsv}: bad row {row}: {e}")
    if not runs:
        sys.exit(f"plot_forgetting.py: {a.tsv} has no rows")
    steps = [s for r in runs.values() for s, _, _ in r]
    x0, x1 = min(steps), max(steps) or 1
    pw = (W - PAD_L - PAD_R - GAP) / 2
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>']
    for panel, (col, title) in enumerate([(1, "KJV validation loss (forgetting)"),
                                          (2, "second text validation loss (learning)")]):
        ys = [p[col] for r in runs.values() for p in r]
        y0, y1 = min(ys), max(ys)
        pad = (y1 - y0) * 0.08 or 0.05
        y0, y1 = y0 - pad, y1 + pad
        left = PAD_L + panel * (pw + GAP)
        ph = H - PAD_T - PAD_B
        sx = lambda s: left + (s - x0) / (x1 - x0) * pw
        sy = lambda v: PAD_T + (y1 - v) / (y1 - y0) * ph
        out.append(f'<rect x="{left}" y="{PAD_T}" width="{pw}" height="{ph}" fill="none" stroke="#888"/>')
        out.append(f'<text x="{left + pw / 2}" y="{PAD_T - 10}" text-anchor="middle">{html.escape(title)}</text>')
        for i in range(5):
            v = y0 + (y1 - y0) * i / 4
            out.append(f'<text x="{left - 5}" y="{sy(v) + 4}" text-anchor="end">{v:.3f}</text>')
            s = x0 + (x1 - x0) * i / 4
            out.append(f'<text x="{sx(s)}" y="{H - PAD_B + 16}" text-anchor="middle">{s:.0f}</text>')
        out.append(f'<text x="{left + pw / 2}" y="{H - 8}" text-anchor="middle">fine-tuning steps</text>')
        for k, (name, pts) in enumerate(sorted(runs.items())):
            pts = sorted(pts)
            c = COLORS[k % len(COLORS)]
            path = " ".join(f"{sx(s):.1f},{sy(p):.1f}" for s, *vals in pts for p in [vals[col - 1]])
            out.append(f'<polyline points="{path}" fill="none" stroke="{c}" stroke-width="2"/>')
            for s, *vals in pts:
                out.append(f'<circle cx="{sx(s):.1f}" cy="{sy(vals[col - 1]):.1f}" r="3" fill="{c}"/>')
    for k, name in enumerate(sorted(runs)):
        c = COLORS[k % len(COLORS)]
        y = PAD_T + 20 + 18 * k
        out.append(f'<line x1="{W - PAD_R + 15}" y1="{y}" x2="{W - PAD_R + 35}" y2="{y}" stroke="{c}" stroke-width="2"/>')
        out.append(f'<text x="{W - PAD_R + 40}" y="{y + 4}">{html.escape(LABELS.get(name, name))}</text>')
    out.append("</svg>")
    with open(a.out, "w") as f:
        f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
