#!/usr/bin/env python3
"""Validation loss and expert-load balance over training for MoE runs, side by side, as one SVG (stdlib only).

    python3 scripts/plot_balance.py runs/dsmoe8 runs/dsmoe8-switch --shared 1 -o docs/img/deepseek_balance.svg

Each argument is a mom-train run directory. Left: the validation cross-entropy per evaluation. Right: the
coefficient of variation (std / mean) of the routed experts' shares of the picks, averaged over the layers,
per evaluation, from the "routing" records of metrics.jsonl (docs/training.md). --shared N leaves out the
first N classes (DeepSeekMoE's shared experts, which every token picks), so the CV is the routed experts'.
"""
import argparse
import html
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from plot_runs import COLORS, nice_ticks  # noqa: E402


def read(path, shared):
    val, cv, label = {}, {}, os.path.basename(os.path.normpath(path))
    with open(os.path.join(path, "metrics.jsonl")) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            r = json.loads(line)
            kind = r.get("type")
            if kind == "run":
                label = r.get("arch") or label
            elif kind == "val":
                val[r["step"]] = r.get("val_loss", r.get("loss"))
            elif kind == "routing":
                per_layer = []
                for rnd in r["rounds"]:
                    s = rnd["share"][shared:]
                    total = sum(s)
                    if not s or total <= 0:
                        continue
                    s = [x / total for x in s]
                    mean = 1.0 / len(s)
                    per_layer.append(math.sqrt(sum((x - mean) ** 2 for x in s) / len(s)) / mean)
                if per_layer:
                    cv[r["step"]] = sum(per_layer) / len(per_layer)
    if not val:
        sys.exit(f"{path}: no validation records in metrics.jsonl")
    return label, sorted(val.items()), sorted(cv.items())


def panel(x0, width, height, series, title, ylabel):
    xs = [p[0] for _, pts in series for p in pts]
    ys = [p[1] for _, pts in series for p in pts]
    if not xs:
        return []
    xlo, xhi = min(xs), max(xs)
    ylo, yhi = min(ys), max(ys)
    if yhi == ylo:
        yhi = ylo + 1
    pad = 0.05 * (yhi - ylo)
    ylo, yhi = ylo - pad, yhi + pad
    left, top, w, h = x0 + 60, 40, width - 80, height - 110
    sx = lambda x: left + (x - xlo) / max(xhi - xlo, 1) * w  # noqa: E731
    sy = lambda y: top + (yhi - y) / (yhi - ylo) * h  # noqa: E731
    out = [f'<text x="{left + w / 2}" y="22" text-anchor="middle" font-size="14">{html.escape(title)}</text>',
           f'<rect x="{left}" y="{top}" width="{w}" height="{h}" fill="none" stroke="#888"/>']
    for t in nice_ticks(ylo, yhi):
        out.append(f'<line x1="{left}" x2="{left + w}" y1="{sy(t):.1f}" y2="{sy(t):.1f}" stroke="#eee"/>')
        out.append(f'<text x="{left - 6}" y="{sy(t) + 4:.1f}" text-anchor="end" font-size="11">{t:g}</text>')
    for t in nice_ticks(xlo, xhi):
        out.append(f'<text x="{sx(t):.1f}" y="{top + h + 16}" text-anchor="middle" font-size="11">{t:g}</text>')
    out.append(f'<text x="{left + w / 2}" y="{top + h + 34}" text-anchor="middle" font-size="12">step</text>')
    out.append(f'<text x="{x0 + 14}" y="{top + h / 2}" font-size="12" transform="rotate(-90 {x0 + 14} {top + h / 2})" '
               f'text-anchor="middle">{html.escape(ylabel)}</text>')
    for i, (label, pts) in enumerate(series):
        c = COLORS[i % len(COLORS)]
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in pts)
        out.append(f'<polyline points="{path}" fill="none" stroke="{c}" stroke-width="2"/>')
        out += [f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{c}"/>' for x, y in pts]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--shared", type=int, default=0, help="leading classes left out of the CV (shared experts)")
    ap.add_argument("-o", "--out", default="balance.svg")
    a = ap.parse_args()
    runs = [read(p, a.shared) for p in a.runs]
    W, H = 900, 380
    body = panel(0, W // 2, H, [(l, v) for l, v, _ in runs], "validation cross-entropy (nats/byte)", "loss")
    body += panel(W // 2, W // 2, H, [(l, c) for l, _, c in runs], "routed experts' load CV (mean over layers)", "CV")
    for i, (label, _, _) in enumerate(runs):
        c = COLORS[i % len(COLORS)]
        body.append(f'<rect x="{80 + 230 * i}" y="{H - 14}" width="14" height="4" fill="{c}"/>')
        body.append(f'<text x="{100 + 230 * i}" y="{H - 8}" font-size="12">{html.escape(label)}</text>')
    with open(a.out, "w") as f:
        f.write(f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif">\n'
                f'<rect width="{W}" height="{H}" fill="white"/>\n' + "\n".join(body) + "\n</svg>\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
