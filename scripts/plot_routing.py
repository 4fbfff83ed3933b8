#!/usr/bin/env python3
"""Draw the routing statistics of a MoM model as SVG heatmaps (python3 standard library only).

    python3 scripts/plot_routing.py routing.json -o routing.svg [--normalize none|rows] [--router part2]

Reads the JSON written by mom::RoutingStats (include/mom/models/routing_stats.hpp):
    {"routers": [{"name": "part2.attn", "classes": N+1, "skip_is_last": true, "rounds": H, "k": K, "tokens": T,
                  "usage": [[count per class] per round], "transitions": [[count to class b] per class a]}, ...]}
and draws, for every router (each MoM chunk has one for attention and one for FFN, side by side), the paper's
Fig. 6: the (N+1)×(N+1) matrix of transitions between consecutive rounds as a heatmap (row: the module picked in
round h, column: the module picked in round h+1; modules 1..N, SKIP "S"), and under it the usage per round as
stacked bars (share of the picks of that round going to each module). --normalize rows colours each row as a
distribution (where tokens go next from a module) instead of by raw count. Every heatmap cell is a
<rect class="cell"> with a <title> giving its count; every bar segment a <rect class="bar">.
"""
import argparse
import html
import json
import sys

PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22"]
SKIP_COLOR = "#9e9e9e"


def class_name(r, c):
    return "S" if r["skip_is_last"] and c == r["classes"] - 1 else str(c + 1)


def heat(v):
    """White -> dark blue for v in [0, 1]."""
    v = max(0.0, min(1.0, v))
    lo, hi = (255, 255, 255), (8, 48, 107)
    return "#%02x%02x%02x" % tuple(round(a + (b - a) * v) for a, b in zip(lo, hi))


def validate(r):
    n = r["classes"]
    if len(r["transitions"]) != n or any(len(row) != n for row in r["transitions"]):
        raise ValueError(f"router {r['name']}: transitions is not {n}x{n}")
    if len(r["usage"]) != r["rounds"] or any(len(row) != n for row in r["usage"]):
        raise ValueError(f"router {r['name']}: usage is not {r['rounds']}x{n}")


def panel(r, x0, y0, cell, normalize):
    """SVG elements of one router's heatmap + usage bars with its top-left corner at (x0, y0); returns (elements,
    width, height)."""
    n, rounds = r["classes"], r["rounds"]
    out = []
    title = f'{r["name"]}  (K={r["k"]}, H={rounds}, {r["tokens"]} tokens)'
    out.append(f'<text x="{x0}" y="{y0 + 14}" font-size="14" font-weight="bold">{html.escape(title)}</text>')
    # heatmap
    hx, hy = x0 + 40, y0 + 44
    t = r["transitions"]
    peak = max((v for row in t for v in row), default=0) or 1
    out.append(f'<text x="{hx + n * cell / 2}" y="{hy - 20}" text-anchor="middle">module at round h+1</text>')
    out.append(f'<text x="{hx - 28}" y="{hy + n * cell / 2}" text-anchor="middle" '
               f'transform="rotate(-90 {hx - 28} {hy + n * cell / 2})">module at round h</text>')
    for b in range(n):
        out.append(f'<text x="{hx + (b + 0.5) * cell}" y="{hy - 5}" text-anchor="middle">{class_name(r, b)}</text>')
    for a in range(n):
        out.append(f'<text x="{hx - 6}" y="{hy + (a + 0.5) * cell + 4}" text-anchor="end">{class_name(r, a)}</text>')
        row_total = sum(t[a]) or 1
        for b in range(n):
            v = t[a][b]
            level = v / row_total if normalize == "rows" else v / peak
            x, y = hx + b * cell, hy + a * cell
            tip = f'{r["name"]}: {class_name(r, a)} → {class_name(r, b)}: {v}'
            if normalize == "rows":
                tip += f" ({100.0 * v / row_total:.1f}% of row)"
            out.append(f'<rect class="cell" x="{x}" y="{y}" width="{cell}" height="{cell}" fill="{heat(level)}" '
                       f'stroke="white"><title>{html.escape(tip)}</title></rect>')
            if n <= 12:
                label = f"{100.0 * v / row_total:.0f}%" if normalize == "rows" else compact_count(v)
                color = "white" if level > 0.55 else "#222"
                out.append(f'<text x="{x + cell / 2}" y="{y + cell / 2 + 4}" text-anchor="middle" font-size="10" '
                           f'fill="{color}">{label}</text>')
    if rounds < 2:
        out.append(f'<text x="{hx}" y="{hy + n * cell + 16}" fill="#a00">H = 1: no transitions between rounds</text>')
    # usage per round: one stacked bar per round, segments = share of picks per class
    bx, by = hx, hy + n * cell + 34
    bar_h, bar_w = 90, max(14, min(40, (n * cell) // max(rounds, 1) - 6))
    out.append(f'<text x="{bx}" y="{by}">usage per round (share of picks)</text>')
    top = by + 8
    for h in range(rounds):
        total = sum(r["usage"][h]) or 1
        x = bx + h * (bar_w + 6)
        y = top + bar_h
        for c in range(n):
            share = r["usage"][h][c] / total
            hgt = share * bar_h
            y -= hgt
            color = SKIP_COLOR if class_name(r, c) == "S" else PALETTE[c % len(PALETTE)]
            tip = f'{r["name"]}: round {h}, module {class_name(r, c)}: {r["usage"][h][c]} ({100 * share:.1f}%)'
            out.append(f'<rect class="bar" x="{x}" y="{y:.2f}" width="{bar_w}" height="{hgt:.2f}" fill="{color}">'
                       f'<title>{html.escape(tip)}</title></rect>')
        out.append(f'<text x="{x + bar_w / 2}" y="{top + bar_h + 14}" text-anchor="middle">{h}</text>')
    # legend of the bar colours
    lx, ly = bx, top + bar_h + 30
    for c in range(n):
        color = SKIP_COLOR if class_name(r, c) == "S" else PALETTE[c % len(PALETTE)]
        out.append(f'<rect x="{lx + c * 34}" y="{ly - 9}" width="10" height="10" fill="{color}"/>')
        out.append(f'<text x="{lx + c * 34 + 13}" y="{ly}">{class_name(r, c)}</text>')
    width = max(40 + n * cell + 20, 40 + rounds * (bar_w + 6) + 20, 40 + n * 34, 7 * len(title) + 10)
    height = (ly + 10) - y0
    return out, width, height


def compact_count(v):
    """A count that fits a heatmap cell: 7760, 13k, 34k, 1.2M."""
    if v < 10000:
        return f"{v}"
    if v < 1000000:
        return f"{v / 1000:.0f}k"
    return f"{v / 1e6:.1f}M"


def plot(routers, out_path, normalize, title):
    cell = 44
    # Group by part: "part2.attn" and "part2.ffn" side by side on one row.
    rows, order = {}, []
    for r in routers:
        part, _, kind = r["name"].rpartition(".")
        part = part or r["name"]
        if part not in rows:
            rows[part] = {}
            order.append(part)
        rows[part][kind] = r
    pieces, y, width = [], 40, 0
    for part in order:
        x, row_h = 20, 0
        kinds = sorted(rows[part], key=lambda k: {"attn": 0, "ffn": 1}.get(k, 2))
        for kind in kinds:
            els, w, h = panel(rows[part][kind], x, y, cell, normalize)
            pieces += els
            x += w + 40
            row_h = max(row_h, h)
        width = max(width, x)
        y += row_h + 30
    W, H = max(width, 400, 9 * len(title) + 40), y  # the title (16 px font) must fit
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="20" y="24" font-size="16">{html.escape(title)}</text>'] + pieces + ["</svg>"]
    with open(out_path, "w") as f:
        f.write("\n".join(svg) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("json", help="routing statistics written by RoutingStats::write_json")
    ap.add_argument("-o", "--out", default="routing.svg", help="output SVG (default routing.svg)")
    ap.add_argument("--normalize", choices=["none", "rows"], default="none",
                    help="colour cells by raw count (none) or as a share of their row (rows)")
    ap.add_argument("--router", help="only routers whose name starts with this (e.g. part2)")
    ap.add_argument("--title", default="MoM routing: transitions between consecutive rounds (Fig. 6)")
    a = ap.parse_args()
    try:
        with open(a.json) as f:
            data = json.load(f)
        routers = [r for r in data["routers"] if not a.router or r["name"].startswith(a.router)]
        for r in routers:
            validate(r)
    except (OSError, ValueError, KeyError, TypeError) as e:
        sys.exit(f"plot_routing.py: {a.json}: {e}")
    if not routers:
        sys.exit(f"plot_routing.py: {a.json}: no routers" + (f" named {a.router}*" if a.router else ""))
    plot(routers, a.out, a.normalize, a.title)
    print(f"wrote {a.out} ({len(routers)} router{'s' if len(routers) != 1 else ''})")


if __name__ == "__main__":
    main()
