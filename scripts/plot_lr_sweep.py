#!/usr/bin/env python3
"""Final validation loss against the peak learning rate, one line per architecture, from scripts/compare.py folders.

    python3 scripts/plot_lr_sweep.py --out lr.svg 5e-4=runs/compare-lr-5e-4 1e-3=runs/compare-lr-1e-3 ...

Each folder is one compare.py run at one learning rate; every architecture folder in it (dense8,
mom8-p_after_dense8_0.5, ...) contributes the last validation loss of each seed-N run: the mean with a bar of
one standard deviation over the seeds, printed as a table too.
"""
import argparse
import math
import os
import pathlib
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare import COLORS, mean_std, read_metrics, svg_frame  # noqa: E402  (the sweep's reader and plot frame)


def final_losses(arch_dir):
    """Each seed's last validation loss (a two-phase entry's seed-N-phase1 runs are its first phase: left out)."""
    out = []
    for seed in sorted(arch_dir.glob("seed-*")):
        if seed.name.endswith("phase1"):
            continue
        _, _, val = read_metrics(str(seed))
        if val:
            out.append(float(val[max(val)]["loss"]))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="the SVG to write")
    ap.add_argument("runs", nargs="+", help="LR=FOLDER, one compare.py output folder per learning rate")
    args = ap.parse_args()
    series = {}  # arch -> [(lr, mean, std, n)]
    for spec in args.runs:
        lr_text, _, folder = spec.partition("=")
        if not folder:
            raise SystemExit(f"plot_lr_sweep: '{spec}' is not LR=FOLDER")
        for arch in sorted(p for p in pathlib.Path(folder).iterdir() if p.is_dir() and (p / "seed-1").is_dir()):
            v = final_losses(arch)
            if v:
                series.setdefault(arch.name, []).append((float(lr_text), *mean_std(v), len(v), v))
    if not series:
        raise SystemExit("plot_lr_sweep: no finished runs in the folders given")
    print("| architecture | peak lr | val CE (mean ± std) | seeds |")
    print("|---|---:|---|---|")
    for arch, pts in series.items():
        for lr, m, s, n, v in sorted(pts):
            print(f"| {arch} | {lr:g} | {m:.4f} ± {s:.4f} (n={n}) | {', '.join(f'{x:.3f}' for x in v)} |")
    W, H, L, R, T, B = 640, 400, 70, 190, 40, 50
    lrs = [p[0] for pts in series.values() for p in pts]
    ys = [p[1] + sgn * p[2] for pts in series.values() for p in pts for sgn in (-1, 1)]
    x0, x1 = math.log10(min(lrs)) - 0.1, math.log10(max(lrs)) + 0.1
    y0, y1 = min(ys) - 0.005, max(ys) + 0.005
    px = lambda lr: L + (math.log10(lr) - x0) / (x1 - x0) * (W - L - R)
    py = lambda y: T + (y1 - y) / (y1 - y0) * (H - T - B)
    s = svg_frame((W, H, L, R, T, B), "final validation loss against the peak learning rate",
                  "peak learning rate (log scale)", "validation cross-entropy (nats/byte)")
    for lr in sorted(set(lrs)):
        s.append(f'<text x="{px(lr):.1f}" y="{H - B + 16}" text-anchor="middle">{lr:g}</text>')
    for i in range(5):
        y = y0 + (y1 - y0) * i / 4
        s.append(f'<text x="{L - 6}" y="{py(y) + 4:.1f}" text-anchor="end">{y:.3f}</text>')
        s.append(f'<line x1="{L}" y1="{py(y):.1f}" x2="{W - R}" y2="{py(y):.1f}" stroke="#ddd"/>')
    for k, (arch, pts) in enumerate(series.items()):
        c = COLORS[k % len(COLORS)]
        pts = sorted(pts)
        s.append('<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>' % (
            c, " ".join(f"{px(lr):.1f},{py(m):.1f}" for lr, m, *_ in pts)))
        for lr, m, sd, *_ in pts:
            s.append(f'<line x1="{px(lr):.1f}" y1="{py(m - sd):.1f}" x2="{px(lr):.1f}" y2="{py(m + sd):.1f}" stroke="{c}"/>')
            s.append(f'<circle cx="{px(lr):.1f}" cy="{py(m):.1f}" r="3" fill="{c}"/>')
        s.append(f'<line x1="{W - R + 15}" y1="{T + 10 + 20 * k}" x2="{W - R + 35}" y2="{T + 10 + 20 * k}" stroke="{c}" stroke-width="2"/>')
        s.append(f'<text x="{W - R + 40}" y="{T + 14 + 20 * k}">{arch}</text>')
    s.append("</svg>")
    pathlib.Path(args.out).write_text("\n".join(s) + "\n")


if __name__ == "__main__":
    main()
