#!/usr/bin/env python3
"""Plot the loss curves of perf/convergence_study.sh.

Left panel: the loss of every configuration against the step (mean over
seeds, smoothed with a moving average of --window steps, log scale).
Right panel: the loss relative to bf16 of the same seed, smoothed the same
way, over the last half of the run (where the final-loss column of the
table is read).  The LM part: --linear (a loss in nats above a floor),
--floor (the entropy floor, a dashed line), --title.

    perf/plot_convergence_study.py OUT/convergence_losses.csv -o OUT/x.png
    perf/plot_convergence_study.py OUT/convergence_lm_losses.csv -o OUT/y.png \
        --linear --floor 2.58 --title "FSDP2 transformer LM"

Exit status: 0 ok, 1 matplotlib missing, 2 bad input.
"""
import argparse
import collections
import csv
import sys

PROG = "plot_convergence_study.py"


def fail(code, msg):
    print(f"{PROG}: {msg}", file=sys.stderr)
    sys.exit(code)


def smooth(v, w):
    out, acc = [], 0.0
    for i, x in enumerate(v):
        acc += x
        if i >= w:
            acc -= v[i - w]
        out.append(acc / min(i + 1, w))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--steps", type=int, default=0)
    ap.add_argument("--window", type=int, default=10)
    ap.add_argument("--title", default="zpp-train --large, emulated 2x4")
    ap.add_argument("--linear", action="store_true", help="linear loss axis (default: log)")
    ap.add_argument("--floor", type=float, default=None, help="a dashed line at this loss")
    ap.add_argument("--floor-label", default="entropy floor (mean over seeds)",
                    help="the legend of the --floor line")
    a = ap.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        fail(1, "matplotlib is missing (pip install matplotlib)")
    loss = collections.defaultdict(dict)  # (config, seed) -> step -> loss
    order = []
    with open(a.csv, newline="") as f:
        r = csv.reader(f)
        if next(r, None) != ["config", "seed", "step", "loss"]:
            fail(2, f"{a.csv}: not a convergence_losses.csv")
        for cfg, seed, step, value in r:
            if cfg not in order:
                order.append(cfg)
            loss[(cfg, int(seed))][int(step)] = float(value)
    if "bf16" not in order:
        fail(2, f"{a.csv}: no bf16 runs to compare with")
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(13, 5))
    top = float("-inf")  # the highest smoothed loss after the first 5% of steps
    for ci, cfg in enumerate(order):
        color = f"C{ci % 10}"  # the same colour in both panels
        seeds = sorted(s for (c, s) in loss if c == cfg)
        steps = sorted(set.intersection(*(set(loss[(cfg, s)]) for s in seeds)))
        mean = [sum(loss[(cfg, s)][t] for s in seeds) / len(seeds) for t in steps]
        sm_mean = smooth(mean, a.window)
        ax0.plot(steps, sm_mean, label=cfg, color=color, lw=2.0 if cfg == "bf16" else 1.2)
        top = max(top, max(sm_mean[len(sm_mean) // 20:], default=top))
        rel_seeds = [s for s in seeds if ("bf16", s) in loss]
        if cfg == "bf16" or not rel_seeds:
            continue
        rel = []
        for t in steps:
            v = [loss[(cfg, s)][t] / loss[("bf16", s)][t] - 1 for s in rel_seeds
                 if t in loss[("bf16", s)]]
            rel.append(100 * sum(v) / len(v))
        sm = smooth(rel, a.window)
        half = len(steps) // 2
        ax1.plot(steps[half:], sm[half:], label=cfg, color=color)
    if a.floor is not None:
        ax0.axhline(a.floor, color="k", ls="--", lw=0.8, label=a.floor_label)
        if a.linear and top > a.floor:  # the curves' approach to the floor, not step 0
            ax0.set_ylim(a.floor - 0.05 * (top - a.floor), top)
    if not a.linear:
        ax0.set_yscale("log")
    ax0.set_xlabel("step")
    ax0.set_ylabel(f"loss (mean over seeds, moving average of {a.window})")
    ax0.legend(fontsize=8)
    ax0.grid(alpha=0.3)
    ax1.axhline(0, color="k", lw=0.8)
    ax1.set_xlabel("step")
    ax1.set_ylabel("loss vs bf16, same seed (%)")
    ax1.legend(fontsize=8)
    ax1.grid(alpha=0.3)
    fig.suptitle(a.title + (f", {a.steps} steps" if a.steps else ""))
    fig.tight_layout()
    fig.savefig(a.output, dpi=110)


if __name__ == "__main__":
    main()
