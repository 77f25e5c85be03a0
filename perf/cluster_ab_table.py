#!/usr/bin/env python3
"""The table of perf/cluster_ab.sh from its CSV (side, round, zpp-bench's CSV
columns): per size and variant, each side's median over the rounds of the
launches' median times (time_med_us), B / A, and each side's ratio to its
own bf16 (the baseline row of the same launches: the median over rounds of
the variant divided by the median over rounds of the baseline), with the
range of the per-round ratios.

usage: cluster_ab_table.py IN.csv OUT.md [--label-a A] [--label-b B]
                           [--command CMD] [--note TEXT]
"""
import argparse
import csv
import statistics
import sys


def load(path):
    """{(side, size, variant): {round: median ms}}, baseline variant name."""
    t = {}
    base = None
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            key = (row["side"], int(row["size"]), row["variant"])
            t.setdefault(key, {})[row["round"]] = float(row["time_med_us"]) / 1e3
            if row["variant"] == row["dtype"]:
                base = row["variant"]  # zpp-bench's baseline: named as the data
    return t, base


def size_name(b):
    for unit, s in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if b >= unit and b % unit == 0:
            return f"{b // unit} {s}"
    return f"{b} B"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("md")
    ap.add_argument("--label-a", default="A")
    ap.add_argument("--label-b", default="B")
    ap.add_argument("--command", default="")
    ap.add_argument("--note", default="")
    o = ap.parse_args()
    t, base = load(o.csv)
    if not t or base is None:
        sys.exit(f"cluster_ab_table.py: {o.csv} has no rows, or no baseline "
                 "row (variant named as the dtype)")
    sizes = sorted({k[1] for k in t})
    variants = []
    for k in t:
        if k[2] not in variants:
            variants.append(k[2])
    rounds = {r for v in t.values() for r in v}
    lines = []
    if o.command:
        lines += [f"`{o.command}`", ""]
    if o.note:
        lines += [o.note + ".", ""]
    lines += [f"A = {o.label_a}, B = {o.label_b}; {len(rounds)} rounds, A then B "
              "in each. ms: the median over the rounds of each launch's median "
              f"time; / {base}: that median over the {base} row's of the same side, "
              "with the range of the per-round ratios.", ""]
    lines.append(f"| size | variant | A ms | B ms | B / A | A / {base} | B / {base} |")
    lines.append("|---|---|---:|---:|---:|---|---|")
    for s in sizes:
        for v in variants:
            ka, kb = ("A", s, v), ("B", s, v)
            if ka not in t or kb not in t:
                continue
            ma = statistics.median(t[ka].values())
            mb = statistics.median(t[kb].values())
            cells = [size_name(s), v, f"{ma:.2f}", f"{mb:.2f}", f"{mb / ma:.3f}"]
            for side, m in (("A", ma), ("B", mb)):
                kbase = (side, s, base)
                if v == base or kbase not in t:
                    cells.append("-")
                    continue
                per = [t[(side, s, v)][r] / t[kbase][r]
                       for r in t[(side, s, v)] if r in t[kbase]]
                mbase = statistics.median(t[kbase].values())
                spread = f" ({min(per):.3f}..{max(per):.3f})" if per else ""
                cells.append(f"{m / mbase:.3f}{spread}")
            lines.append("| " + " | ".join(cells) + " |")
    with open(o.md, "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
