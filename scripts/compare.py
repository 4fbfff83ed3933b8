#!/usr/bin/env python3
"""Every architecture side by side at equal compute: one corpus, the same data windows, seeds, a table and a picture.

    python3 scripts/compare.py --archs dense8,mod8,moe8,mom8-p@dense8:0.5 --flops 2e13 --seeds 1,2,3 \\
        --data data/kjv.txt --out runs/compare-flops
    python3 scripts/compare.py --archs dense8,share8-all --tokens 2e6 ...          (an equal-token budget)

Each architecture (a mom-train --arch name) trains once per seed with mom-train (--mom-train, default
build/examples/mom-train) on the same prepared token files, the same batch shape and learning-rate schedule: the
seed fixes the initialisation and the order of the training windows, so every architecture sees the same windows
in the same order for a given seed, and validation always reads the same held-out windows.

Budget:
  --flops F    training FLOPs per run (forward + backward), as mom-train counts them (metrics.jsonl "flops": on the
               CPU the products each step ran, a routed model by its realised routing). Each architecture's steps are
               F / (its FLOPs per step), measured by a short pilot run (--pilot steps) with the same seed and shape,
               set its validation interval; it trains until its FLOPs reach F (mom-train --flops-budget: a model
               whose cost changes while it trains, a layer-skip gate, spends F exactly; its cosine runs over F).
  --tokens N   training tokens per run (steps = N / (batch · seq)).
An architecture written A@B:f is a two-phase run (the MoM recipe): B trains for the fraction f of the budget, then
A starts from B's weights (--init-from; its routers fresh) for the rest; its FLOPs, time and curve include phase 1.
A suffix /lr=X gives an architecture a peak learning rate of its own (both phases), e.g. moeut8/lr=1e-3; the
table names it.

Writes into --out: one folder per run (<arch>/seed-<s>/, phase 1 in <arch>/seed-<s>-phase1/), plan.json (the
steps chosen), results.md (the table: validation cross-entropy mean ± sample std over seeds, at the end and the
lowest of the run's validations (of its last phase: a long run on a small corpus overfits), total parameters,
FLOP-equivalent active parameters = training FLOPs per token / 6, training FLOPs, wall time, tokens/s) and
val_vs_flops.svg (validation loss against training FLOPs, mean over seeds per architecture, log-scaled FLOPs).
Both are written again after every finished run (a sweep stopped by a time limit leaves the table of what it
finished, headed "Partial: k of N runs finished"). Resumable: run it again with the same arguments and finished
runs are kept, a run that was killed continues from its last checkpoint (mom-train --resume), and the plan is read
back instead of measured again.
"""
import argparse
import html
import json
import math
import os
import shutil
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from plot_runs import read_records  # noqa: E402  (the metrics.jsonl reader, shared)

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22",
          "#7f7f7f", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd"]


def fail(msg):
    print(f"compare: {msg}", file=sys.stderr)
    sys.exit(1)


def read_metrics(run_dir):
    """The run's records (plot_runs.read_records), or none when it has not started."""
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return [], {}, {}
    return read_records(path, warn=False)


def finished(run_dir, steps, budget=None):
    """The run is complete: its last step validated, at `steps` or (a FLOP-budget run) once its FLOPs reached the
    budget. A run trained without a budget (an older sweep's) is complete at `steps`."""
    runs, train, val = read_metrics(run_dir)
    if not train:
        return False
    last = max(train)
    run_budget = runs[-1].get("config", {}).get("flops_budget", 0) if runs else 0
    if not budget or not run_budget:
        return steps in val and steps in train
    spent = sum(train[s].get("flops", 0) for s in train)
    return last in val and spent >= budget


class Runner:
    def __init__(self, args):
        self.args = args
        self.binary = args.mom_train
        self.common = ["--batch", str(args.batch), "--seq", str(args.seq),
                       "--warmup", str(args.warmup), "--eval-batches", str(args.eval_batches), "--sample-tokens", "0",
                       "--device", args.device, "--log-interval", "100000"]
        if args.precision:
            self.common += ["--precision", args.precision]
        if args.threads:
            self.common += ["--threads", str(args.threads)]

    def mom_train(self, log_path, extra):
        cmd = [self.binary] + extra + self.common
        with open(log_path, "a") as log:
            log.write("$ " + " ".join(cmd) + "\n")
            log.flush()
            rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT)
        if rc != 0:
            tail = open(log_path).read().splitlines()[-5:]
            fail(f"mom-train exited with {rc} ({log_path}):\n  " + "\n  ".join(tail))

    def prepare(self, out):
        """Tokenizes the corpus once (by the first architecture's tokenizer) into <out>/data."""
        data = os.path.join(out, "data")
        if os.path.exists(os.path.join(data, "train.bin")):
            return data
        if os.path.isdir(self.args.data):
            return self.args.data
        tmp = os.path.join(out, "prepare")
        self.mom_train(os.path.join(out, "prepare.log"),
                       ["--data", self.args.data, "--arch", self.args.arch_list[0].arch, "--out", tmp, "--steps", "1",
                        "--eval-interval", "0", "--seed", "1", "--val-fraction", str(self.args.val_fraction)])
        shutil.move(os.path.join(tmp, "data"), data)
        shutil.rmtree(tmp)
        return data

    def train(self, arch, seed, steps, run_dir, data, init_from=None, evals=None, budget=None, lr=None):
        """Trains (or resumes, or keeps) one run of `steps` steps; with a FLOP budget, until its FLOPs reach the
        budget (mom-train --flops-budget; `steps`, planned from the pilot, then sets the validation and checkpoint
        intervals, and 3 × steps + 10 is the cap)."""
        if finished(run_dir, steps, budget):
            return
        evals = evals or self.args.evals
        cap = 3 * steps + 10 if budget else steps
        extra = ["--data", data, "--arch", arch, "--steps", str(cap), "--out", run_dir,
                 "--eval-interval", str(max(1, steps // evals)), "--checkpoint-interval",
                 str(max(1, steps // self.args.checkpoints)), "--lr", repr(float(lr or self.args.lr))]
        if budget:
            extra += ["--flops-budget", repr(float(budget))]
        resume = os.path.exists(os.path.join(run_dir, "latest"))
        if resume:
            # The checkpoint holds the run's seed and data order; mom-train refuses --seed beside --resume.
            extra.append("--resume")
        else:
            extra += ["--seed", str(seed)]
            if init_from:
                extra += ["--init-from", init_from]
        what = f"{budget:.3g} FLOPs (about {steps} steps)" if budget else f"{steps} steps"
        print(f"  {'resuming' if resume else 'training'} {arch} seed {seed}: {what}", flush=True)
        os.makedirs(run_dir, exist_ok=True)
        self.mom_train(os.path.join(run_dir, "compare.log"), extra)
        if not finished(run_dir, cap, budget):
            fail(f"{run_dir}: mom-train ended before {what} (interrupted?); run compare.py again to continue")

    def flops_per_step(self, arch, seed, data, pilot_dir):
        """Mean training FLOPs of a step of `arch`, from a pilot run of --pilot steps (kept as a cache)."""
        steps = self.args.pilot
        if not finished(pilot_dir, steps):
            shutil.rmtree(pilot_dir, ignore_errors=True)
            self.train(arch, seed, steps, pilot_dir, data, evals=1)
        _, train, _ = read_metrics(pilot_dir)
        values = [train[s].get("flops") for s in sorted(train)]
        if any(v is None for v in values):
            fail(f"{self.binary} writes no 'flops' in metrics.jsonl: rebuild it (issue 32's FLOP count)")
        return statistics.mean(values)


class Arch:
    def __init__(self, spec):
        self.spec = spec
        base, _, lr = spec.partition("/lr=")
        try:
            self.lr = float(lr) if lr else None
        except ValueError:
            self.lr = None
        if lr and not (self.lr and self.lr > 0 and math.isfinite(self.lr)):
            fail(f"'{spec}': a learning rate of its own is A/lr=X with X > 0, e.g. moeut8/lr=1e-3")
        if "@" in base:
            self.arch, rest = base.split("@", 1)
            try:
                self.phase1, fraction = rest.split(":")
                self.fraction = float(fraction)
            except ValueError:
                fail(f"'{spec}': a two-phase architecture is A@B:fraction, e.g. mom8-p@dense8:0.5")
            if not 0 < self.fraction < 1:
                fail(f"'{spec}': the phase-1 fraction must be in (0, 1)")
        else:
            self.arch, self.phase1, self.fraction = base, None, 0.0
        self.label = base if not self.phase1 else f"{self.arch} (after {self.phase1}, {self.fraction:g})"
        if self.lr:
            self.label += f" (lr {self.lr:g})"
        self.folder = spec.replace("@", "_after_").replace(":", "_").replace("/lr=", "_lr")


def plan_runs(runner, archs, seeds, data, out):
    """Steps per phase of every architecture: read from plan.json if it is there for the same budget."""
    args = runner.args
    budget = {"flops": args.flops, "tokens": args.tokens, "batch": args.batch, "seq": args.seq, "pilot": args.pilot}
    path = os.path.join(out, "plan.json")
    plan = {}
    if os.path.exists(path):
        saved = json.load(open(path))
        if saved.get("budget") == budget:
            plan = saved.get("steps", {})
        else:
            fail(f"{path} was planned for another budget ({saved.get('budget')}); use another --out")
    tokens_per_step = args.batch * args.seq

    def steps_for(arch, amount):
        if args.tokens:
            return max(1, round(amount / tokens_per_step))
        key = f"flops_per_step:{arch}"
        if key not in plan:
            plan[key] = runner.flops_per_step(arch, seeds[0], data, os.path.join(out, "pilot", arch))
            json.dump({"budget": budget, "steps": plan}, open(path, "w"), indent=1)
        return max(1, round(amount / plan[key]))

    total = args.flops if args.flops else args.tokens
    for a in archs:
        if a.spec in plan:
            continue
        if a.phase1:
            plan[a.spec] = {"phase1": steps_for(a.phase1, total * a.fraction),
                            "phase2": steps_for(a.arch, total * (1 - a.fraction))}
        else:
            plan[a.spec] = {"phase2": steps_for(a.arch, total)}
        json.dump({"budget": budget, "steps": plan}, open(path, "w"), indent=1)
    return plan


def summarise(run_dirs):
    """Curve (cumulative FLOPs and tokens at each validation) and totals of one seed's run (phases chained)."""
    curve, flops, tokens, seconds, params, tok_rates, cross_entropy, best = [], 0.0, 0.0, 0.0, None, [], None, None
    for run_dir in run_dirs:
        runs, train, val = read_metrics(run_dir)
        cumulative, running = {}, 0.0
        for s in sorted(train):
            running += float(train[s].get("flops", 0.0))
            cumulative[s] = running
        for s in sorted(val):
            curve.append((flops + cumulative.get(s, running), float(val[s]["loss"])))
        last = train[max(train)]
        flops += running
        tokens += float(last["tokens"])
        seconds += float(val[max(val)]["elapsed_s"])
        tok_rates.append(float(last["tok_per_s"]))
        params = runs[-1].get("params") if runs else None
        cross_entropy = float(val[max(val)]["loss"])
        best = min(float(v["loss"]) for v in val.values())  # the last phase's: a two-phase run's phase 1 is B's
    return {"curve": curve, "flops": flops, "tokens": tokens, "seconds": seconds, "params": params,
            "tok_per_s": tok_rates[-1], "val": cross_entropy, "best": best}


def mean_std(xs):
    if len(xs) == 1:
        return xs[0], 0.0
    return statistics.mean(xs), statistics.stdev(xs)


def si(x):
    for unit, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {unit}"
    return f"{x:.3g}"


def table(results, args):
    budget = f"{si(args.flops)}FLOP" if args.flops else f"{si(args.tokens)} tokens"
    lines = [f"Budget: {budget} per run; batch {args.batch} × {args.seq}; seeds {args.seeds}; device {args.device}"
             + (f", {args.precision}" if args.precision else "") + ".",
             "",
             "| architecture | val CE (nats/token, mean ± std) | best val CE on the way | params | active (FLOP-eq.) | "
             "training FLOPs | tokens | wall | tok/s |",
             "|---|---|---|---|---|---|---|---|---|"]
    for label, rs in sorted(results.items(), key=lambda kv: mean_std([r["val"] for r in kv[1]])[0]):
        ce, sd = mean_std([r["val"] for r in rs])
        best, best_sd = mean_std([r["best"] for r in rs])
        flops = statistics.mean(r["flops"] for r in rs)
        tokens = statistics.mean(r["tokens"] for r in rs)
        active = flops / tokens / 6.0 if tokens else 0.0
        params = rs[0]["params"]
        lines.append(f"| {label} | {ce:.4f} ± {sd:.4f} (n={len(rs)}) | {best:.4f} ± {best_sd:.4f} | "
                     f"{si(params) if params else '?'} | {si(active)} | "
                     f"{si(flops)} | {si(tokens)} | {statistics.mean(r['seconds'] for r in rs):.0f} s | "
                     f"{statistics.mean(r['tok_per_s'] for r in rs):.0f} |")
    return "\n".join(lines) + "\n"


def report(results, args, done, total):
    """Writes results.md and val_vs_flops.svg for the runs finished so far; returns the table."""
    text = table(results, args)
    if done < total:
        text = f"Partial: {done} of {total} runs finished (run the same command again to continue).\n\n" + text
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(text)
    title = args.title or (f"validation loss at equal {'FLOPs' if args.flops else 'tokens'} "
                           f"({len(args.seed_list)} seed{'s' if len(args.seed_list) > 1 else ''})")
    svg(results, os.path.join(args.out, "val_vs_flops.svg"), title)
    return text


def svg_frame(box, title, x_label, y_label):
    """The opening lines of a plot: an SVG of width W and height H, its title, the axes of the plot area inside the
    margins L, R, T, B (box = (W, H, L, R, T, B)) and their labels (scripts/plot_lr_sweep.py draws in it too)."""
    W, H, L, R, T, B = box
    return [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
            f'<rect width="{W}" height="{H}" fill="white"/>',
            f'<text x="{W / 2}" y="20" text-anchor="middle" font-size="14">{html.escape(title)}</text>',
            f'<line x1="{L}" y1="{H - B}" x2="{W - R}" y2="{H - B}" stroke="black"/>',
            f'<line x1="{L}" y1="{T}" x2="{L}" y2="{H - B}" stroke="black"/>',
            f'<text x="{(L + W - R) / 2}" y="{H - 12}" text-anchor="middle">{html.escape(x_label)}</text>',
            f'<text x="16" y="{(T + H - B) / 2}" text-anchor="middle" transform="rotate(-90 16 {(T + H - B) / 2})">'
            f'{html.escape(y_label)}</text>']


def svg(results, path, title):
    """Validation loss against training FLOPs (log x), the mean over seeds at each validation of each architecture."""
    W, H, L, R, T, B = 760, 460, 70, 230, 40, 50
    series = []
    for label, rs in results.items():
        n = min(len(r["curve"]) for r in rs)
        pts = [(statistics.mean(r["curve"][i][0] for r in rs), statistics.mean(r["curve"][i][1] for r in rs))
               for i in range(n)]
        series.append((label, [p for p in pts if p[0] > 0]))
    xs = [p[0] for _, s in series for p in s]
    ys = [p[1] for _, s in series for p in s]
    if not xs:
        return
    x0, x1 = math.log10(min(xs)), math.log10(max(xs))
    if x1 - x0 < 1e-9:
        x0, x1 = x0 - 0.5, x1 + 0.5
    y0, y1 = min(ys), max(ys)
    pad = (y1 - y0) * 0.05 or 0.05
    y0, y1 = y0 - pad, y1 + pad
    px = lambda x: L + (math.log10(x) - x0) / (x1 - x0) * (W - L - R)
    py = lambda y: T + (y1 - y) / (y1 - y0) * (H - T - B)
    out = svg_frame((W, H, L, R, T, B), title, "training FLOPs (log scale)", "validation cross-entropy (nats/token)")
    for e in range(math.floor(x0), math.ceil(x1) + 1):
        for m in (1, 2, 5):
            v = m * 10 ** e
            if x0 <= math.log10(v) <= x1:
                out.append(f'<line x1="{px(v):.1f}" y1="{H - B}" x2="{px(v):.1f}" y2="{H - B + 4}" stroke="black"/>')
                out.append(f'<text x="{px(v):.1f}" y="{H - B + 16}" text-anchor="middle">{si(v)}</text>')
    for i in range(6):
        v = y0 + (y1 - y0) * i / 5
        out.append(f'<line x1="{L - 4}" y1="{py(v):.1f}" x2="{W - R}" y2="{py(v):.1f}" stroke="#eee"/>')
        out.append(f'<text x="{L - 6}" y="{py(v) + 4:.1f}" text-anchor="end">{v:.3f}</text>')
    for k, (label, pts) in enumerate(sorted(series, key=lambda s: s[1][-1][1] if s[1] else 0)):
        c = COLORS[k % len(COLORS)]
        if len(pts) > 1:
            d = " ".join(f"{'M' if j == 0 else 'L'}{px(x):.1f},{py(y):.1f}" for j, (x, y) in enumerate(pts))
            out.append(f'<path d="{d}" fill="none" stroke="{c}" stroke-width="2"/>')
        for x, y in pts:
            out.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="{c}"/>')
        ly = T + 10 + 16 * k
        out.append(f'<rect x="{W - R + 12}" y="{ly - 9}" width="12" height="3" fill="{c}"/>')
        final = f" {pts[-1][1]:.3f}" if pts else ""
        out.append(f'<text x="{W - R + 30}" y="{ly - 4}">{html.escape(label)}{final}</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--archs", required=True, help="comma-separated mom-train --arch names; A@B:f for two phases, A/lr=X for a learning rate of its own")
    budget = p.add_mutually_exclusive_group(required=True)
    budget.add_argument("--flops", type=float, help="training FLOPs per run")
    budget.add_argument("--tokens", type=float, help="training tokens per run")
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--data", default="data/kjv.txt", help="text file, or a folder with train.bin / val.bin")
    p.add_argument("--out", required=True)
    p.add_argument("--mom-train", default=os.path.join("build", "examples", "mom-train"))
    p.add_argument("--device", default="cpu")
    p.add_argument("--precision", default="", help="mom-train --precision (fp32, tf32 or bf16; default: the device's)")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--eval-batches", type=int, default=16)
    p.add_argument("--evals", type=int, default=5, help="validations per run (the curve's points)")
    p.add_argument("--checkpoints", type=int, default=4, help="checkpoints per run (what a killed sweep resumes)")
    p.add_argument("--pilot", type=int, default=6, help="steps of the run that measures FLOPs per step")
    p.add_argument("--val-fraction", type=float, default=0.1)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--title", default="")
    args = p.parse_args()
    try:
        args.seed_list = [int(s) for s in args.seeds.split(",") if s]
    except ValueError:
        fail(f"--seeds '{args.seeds}': comma-separated integers, e.g. 1,2,3")
    args.arch_list = [Arch(s) for s in args.archs.split(",") if s]
    if not args.arch_list or not args.seed_list:
        fail("give at least one architecture and one seed")
    if (args.flops or args.tokens or 0) <= 0:
        fail("the budget must be > 0")
    if not (os.path.isfile(args.mom_train) and os.access(args.mom_train, os.X_OK)):
        fail(f"no mom-train at {args.mom_train} (build it: cmake --build build --target mom-train; or --mom-train)")
    os.makedirs(args.out, exist_ok=True)
    runner = Runner(args)
    data = runner.prepare(args.out)
    plan = plan_runs(runner, args.arch_list, args.seed_list, data, args.out)
    results = {}
    total = len(args.arch_list) * len(args.seed_list)
    done = 0
    for a in args.arch_list:
        for seed in args.seed_list:
            done += 1
            print(f"[{done}/{total}] {a.label}, seed {seed}", flush=True)
            run_dir = os.path.join(args.out, a.folder, f"seed-{seed}")
            dirs = []
            init = None
            if a.phase1:
                first = os.path.join(args.out, a.folder, f"seed-{seed}-phase1")
                runner.train(a.phase1, seed, plan[a.spec]["phase1"], first, data,
                             budget=args.flops * a.fraction if args.flops else None, lr=a.lr)
                dirs.append(first)
                init = first
            runner.train(a.arch, seed, plan[a.spec]["phase2"], run_dir, data, init_from=init,
                         budget=args.flops * (1 - a.fraction) if args.flops and a.phase1 else args.flops, lr=a.lr)
            dirs.append(run_dir)
            results.setdefault(a.label, []).append(summarise(dirs))
            # The table and the picture of the runs finished so far, after each run: a sweep stopped by a time
            # limit (a device call) leaves them for what it finished; the resumed sweep writes them again.
            text = report(results, args, done, total)
    print(text)
    print(f"wrote {os.path.join(args.out, 'results.md')} and {os.path.join(args.out, 'val_vs_flops.svg')}")


if __name__ == "__main__":
    main()
