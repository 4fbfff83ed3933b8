#!/usr/bin/env python3
"""Draw the train / validation loss curves of one or several mom-train runs as an SVG (stdlib only).

    python3 scripts/plot_runs.py runs/kjv runs/kjv-small -o loss.svg
    python3 scripts/plot_runs.py runs/*/metrics.jsonl --smooth 20 --x tokens

Each argument is a run directory (its metrics.jsonl is read) or a metrics.jsonl file. Train loss is a thin
line (optionally smoothed by a moving average), validation loss a thick line with dots, one colour per run.
When a run was resumed, later records for a step replace earlier ones.
"""
import argparse
import html
import json
import math
import os
import sys

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"]


def read_records(path, warn=True):
    """A metrics.jsonl's records: the run records in order, and the train / val records by step (when a run was
    resumed, later records for a step replace earlier ones). A line that is not JSON (cut by a kill) is skipped."""
    runs, train, val = [], {}, {}
    with open(path) as f:
        for line_no, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                if warn:
                    print(f"{path}:{line_no}: skipping a line that is not JSON", file=sys.stderr)
                continue
            kind = r.get("type")
            if kind == "run":
                runs.append(r)
            elif kind == "train":
                train[r["step"]] = r
            elif kind == "val":
                val[r["step"]] = r
    return runs, train, val


def read_run(path):
    if os.path.isdir(path):
        path = os.path.join(path, "metrics.jsonl")
    runs, train, val = read_records(path)
    label = None
    for r in runs:
        label = r.get("arch") or label
    name = os.path.basename(os.path.dirname(os.path.abspath(path))) or path
    return {"name": f"{name} ({label})" if label else name,
            "train": [train[s] for s in sorted(train)], "val": [val[s] for s in sorted(val)]}


def smooth(ys, window):
    if window <= 1:
        return ys
    out, acc = [], 0.0
    for i, y in enumerate(ys):
        acc += y
        if i >= window:
            acc -= ys[i - window]
        out.append(acc / min(i + 1, window))
    return out


def nice_ticks(lo, hi, count=6):
    if hi <= lo:
        hi = lo + 1
    raw = (hi - lo) / count
    mag = 10 ** math.floor(math.log10(raw))
    step = min((m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw), default=raw)
    first = math.ceil(lo / step) * step
    ticks, t = [], first
    while t <= hi + 1e-12:
        ticks.append(round(t, 10))
        t += step
    return ticks


def x_of(record, key, train_by_step):
    if key == "step":
        return record["step"]
    if "tokens" in record:
        return record["tokens"]
    ref = train_by_step.get(record["step"])
    return ref.get("tokens", record["step"]) if ref else record["step"]


def plot(runs, out, x_key, window, title, val_only=False):
    W, H, L, R, T, B = 900, 520, 70, 230, 40, 55
    pw, ph = W - L - R, H - T - B
    series = []
    for i, run in enumerate(runs):
        color = COLORS[i % len(COLORS)]
        by_step = {r["step"]: r for r in run["train"]}
        train = [] if val_only else run["train"]
        tx = [x_of(r, x_key, by_step) for r in train]
        ty = smooth([r["loss"] for r in train], window)
        vx = [x_of(r, x_key, by_step) for r in run["val"]]
        vy = [r["loss"] for r in run["val"]]
        series.append((run["name"], color, tx, ty, vx, vy))
    xs = [x for s in series for x in s[2] + s[4]]
    ys = [y for s in series for y in s[3] + s[5] if math.isfinite(y)]
    if not xs or not ys:
        sys.exit("plot_runs.py: no train or val records found")
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys), max(ys)
    pad = 0.05 * (y1 - y0 or 1)
    y0, y1 = y0 - pad, y1 + pad
    x1 = x1 if x1 > x0 else x0 + 1
    sx = lambda x: L + (x - x0) / (x1 - x0) * pw
    sy = lambda y: T + (1 - (y - y0) / (y1 - y0)) * ph
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{L + pw / 2}" y="22" text-anchor="middle" font-size="15">{html.escape(title)}</text>']
    for t in nice_ticks(y0, y1):
        svg.append(f'<line x1="{L}" x2="{L + pw}" y1="{sy(t):.1f}" y2="{sy(t):.1f}" stroke="#e5e5e5"/>')
        svg.append(f'<text x="{L - 6}" y="{sy(t) + 4:.1f}" text-anchor="end">{t:g}</text>')
    for t in nice_ticks(x0, x1):
        svg.append(f'<line x1="{sx(t):.1f}" x2="{sx(t):.1f}" y1="{T}" y2="{T + ph}" stroke="#f0f0f0"/>')
        svg.append(f'<text x="{sx(t):.1f}" y="{T + ph + 16}" text-anchor="middle">{t:g}</text>')
    svg.append(f'<rect x="{L}" y="{T}" width="{pw}" height="{ph}" fill="none" stroke="#333"/>')
    svg.append(f'<text x="{L + pw / 2}" y="{H - 12}" text-anchor="middle">{"optimizer step" if x_key == "step" else "tokens"}</text>')
    svg.append(f'<text x="18" y="{T + ph / 2}" text-anchor="middle" transform="rotate(-90 18 {T + ph / 2})">loss (nats/token)</text>')
    for k, (name, color, tx, ty, vx, vy) in enumerate(series):
        if tx:
            pts = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in zip(tx, ty) if math.isfinite(y))
            svg.append(f'<polyline points="{pts}" fill="none" stroke="{color}" stroke-width="1" opacity="0.55"/>')
        if vx:
            pts = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in zip(vx, vy))
            svg.append(f'<polyline points="{pts}" fill="none" stroke="{color}" stroke-width="2.5"/>')
            for x, y in zip(vx, vy):
                svg.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{color}"/>')
        last_val = f" {vy[-1]:.3f}" if vy else ""
        if val_only:  # legend: the run's name and its last validation loss beside a thick sample line
            ly = T + 10 + 40 * k
            svg.append(f'<text x="{L + pw + 15}" y="{ly + 4}" font-weight="bold">{html.escape(name[:30])}</text>')
            svg.append(f'<line x1="{L + pw + 15}" x2="{L + pw + 40}" y1="{ly + 18}" y2="{ly + 18}" stroke="{color}" stroke-width="2.5"/>')
            svg.append(f'<text x="{L + pw + 46}" y="{ly + 22}">val{last_val}</text>')
            continue
        ly = T + 10 + 62 * k  # legend: the run's name, then a thin "train" and a thick "val" sample line
        svg.append(f'<text x="{L + pw + 15}" y="{ly + 4}" font-weight="bold">{html.escape(name[:30])}</text>')
        svg.append(f'<line x1="{L + pw + 15}" x2="{L + pw + 40}" y1="{ly + 18}" y2="{ly + 18}" stroke="{color}" stroke-width="1" opacity="0.55"/>')
        svg.append(f'<text x="{L + pw + 46}" y="{ly + 22}">train</text>')
        svg.append(f'<line x1="{L + pw + 15}" x2="{L + pw + 40}" y1="{ly + 36}" y2="{ly + 36}" stroke="{color}" stroke-width="2.5"/>')
        svg.append(f'<text x="{L + pw + 46}" y="{ly + 40}">val{last_val}</text>')
    svg.append("</svg>")
    with open(out, "w") as f:
        f.write("\n".join(svg) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", help="run directories or metrics.jsonl files")
    ap.add_argument("-o", "--out", default="loss.svg", help="output SVG (default loss.svg)")
    ap.add_argument("--x", choices=["step", "tokens"], default="step", help="x axis")
    ap.add_argument("--smooth", type=int, default=1, help="moving-average window of the train loss")
    ap.add_argument("--title", default="mom-train: loss", help="plot title")
    ap.add_argument("--val-only", action="store_true",
                    help="validation curves only (the train loss of a model with auxiliary losses is the objective)")
    args = ap.parse_args()
    runs = []
    for p in args.runs:
        try:
            runs.append(read_run(p))
        except OSError as e:
            sys.exit(f"plot_runs.py: {e}")
    plot(runs, args.out, args.x, args.smooth, args.title, args.val_only)
    print(f"wrote {args.out} ({len(runs)} run{'s' if len(runs) != 1 else ''})")


if __name__ == "__main__":
    main()
