#!/usr/bin/env python3
"""Plot rel_l2 against the block size from `zpp-quant-error --format csv`.

One panel per width (INT8, INT4); in each, one line per distribution (or
tensor) and mode over the block sizes (log2 axis), and the whole-tensor
result (block 0) as a separate marker at the right.  The top axis gives the
cost: bits per element, symmetric/asymmetric.

    zpp-quant-error --dist normal,normal-outliers --format csv > q.csv
    perf/plot_quant_error.py q.csv -o q.png
    perf/plot_quant_error.py -o q.png --run build/tools/zpp-quant-error \\
        --dist normal --bits 8,4

Exit status: 0 ok, 1 matplotlib missing or the tool failed, 2 bad input.
"""
import argparse
import csv
import io
import math
import subprocess
import sys

HEADER = ["dist", "bits", "block", "mode", "rel_l2", "max_abs", "snr_db",
          "bits_per_elem"]
PROG = "plot_quant_error.py"


def fail(code, msg):
    print(f"{PROG}: {msg}", file=sys.stderr)
    sys.exit(code)


def read_rows(text, source):
    reader = csv.reader(io.StringIO(text))
    header = next(reader, None)
    if header != HEADER:
        fail(2, f"{source}: header {header!r} is not the zpp-quant-error CSV "
                f"header {','.join(HEADER)!r}")
    rows = []
    for lineno, f in enumerate(reader, start=2):
        if not f:
            continue
        if len(f) != len(HEADER):
            fail(2, f"{source}:{lineno}: {len(f)} fields, expected "
                    f"{len(HEADER)}")
        try:
            rows.append({"dist": f[0], "bits": int(f[1]), "block": int(f[2]),
                         "mode": f[3], "rel_l2": float(f[4]),
                         "bits_per_elem": float(f[7])})
        except ValueError as e:
            fail(2, f"{source}:{lineno}: {e}")
    if not rows:
        fail(2, f"{source}: no data rows")
    return rows


def main():
    ap = argparse.ArgumentParser(
        prog=PROG, description=__doc__.split("\n\n")[0],
        epilog="With --run, the remaining arguments are the tool and its "
               "flags; --format csv is added.")
    ap.add_argument("csv", nargs="?", default="-",
                    help="CSV file from zpp-quant-error --format csv "
                         "('-' or nothing: stdin)")
    ap.add_argument("-o", "--output", required=True, help="PNG to write")
    ap.add_argument("--title", default=None, help="title above the panels")
    ap.add_argument("--run", nargs=argparse.REMAINDER, metavar="TOOL ...",
                    help="run the tool with these flags instead of reading "
                         "a CSV")
    args = ap.parse_args()

    if args.run:
        cmd = args.run + ["--format", "csv"]
        try:
            res = subprocess.run(cmd, capture_output=True, text=True)
        except OSError as e:
            fail(1, f"cannot run {cmd[0]}: {e}")
        if res.returncode != 0:
            sys.stderr.write(res.stderr)
            fail(1, f"{' '.join(cmd)} exited with {res.returncode}")
        text, source = res.stdout, cmd[0]
    elif args.csv == "-":
        text, source = sys.stdin.read(), "stdin"
    else:
        try:
            with open(args.csv, encoding="utf-8") as fh:
                text, source = fh.read(), args.csv
        except OSError as e:
            fail(2, f"{args.csv}: {e.strerror}")
    rows = read_rows(text, source)

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.lines import Line2D
        from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator
    except ImportError:
        fail(1, "matplotlib is not installed; install it with "
                "'pip install matplotlib' (or python3-matplotlib)")

    bits_list = sorted({r["bits"] for r in rows}, reverse=True)
    dists = list(dict.fromkeys(r["dist"] for r in rows))
    modes = [m for m in ("sym", "asym") if any(r["mode"] == m for r in rows)]
    blocks = sorted({r["block"] for r in rows if r["block"] > 0})
    has_whole = any(r["block"] == 0 for r in rows)
    if not blocks and not has_whole:
        fail(2, f"{source}: no block sizes")
    # The whole-tensor marker sits two octaves right of the largest block.
    x_max = blocks[-1] if blocks else 1
    x_whole = x_max * 4
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    style = {"sym": ("-", "o"), "asym": ("--", "s")}

    fig, axes = plt.subplots(1, len(bits_list), squeeze=False,
                             figsize=(6.4 * len(bits_list), 5.2))
    for ax, bits in zip(axes[0], bits_list):
        for di, dist in enumerate(dists):
            color = colors[di % len(colors)]
            for mode in modes:
                sel = [r for r in rows if r["dist"] == dist and
                       r["bits"] == bits and r["mode"] == mode]
                pts = sorted((r["block"], r["rel_l2"]) for r in sel
                             if r["block"] > 0)
                ls, mk = style[mode]
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts],
                            linestyle=ls, marker=mk, markersize=4,
                            color=color, label=f"{dist} {mode}")
                for r in sel:
                    if r["block"] == 0:
                        ax.plot([x_whole], [r["rel_l2"]], linestyle="none",
                                marker=mk, markersize=8, color=color,
                                markerfacecolor="none", markeredgewidth=1.6)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ticks = blocks + ([x_whole] if has_whole else [])
        labels = [str(b) for b in blocks] + (["whole\ntensor"] if has_whole
                                             else [])
        ax.set_xticks(ticks)
        ax.set_xticklabels(labels, fontsize=8)
        ax.xaxis.set_minor_locator(NullLocator())
        # Plain numbers at 1, 2 and 5 per decade read better than 10^-k.
        plain = FuncFormatter(lambda v, _: f"{v:g}")
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_locator(NullLocator())
        if has_whole and blocks:
            ax.axvline(math.sqrt(x_max * x_whole), color="0.6",
                       linestyle=":", linewidth=1)
        ax.set_xlim(ticks[0] / 1.4, ticks[-1] * 1.4)
        ax.set_xlabel("block size (elements sharing one scale)")
        ax.set_ylabel("rel_l2 = ||x_hat - x|| / ||x||")
        ax.set_title(f"INT{bits}")
        ax.grid(True, which="major", alpha=0.3)

        # Cost of each block size on a top axis (the same for every dist).
        cost = {}
        for r in rows:
            if r["bits"] == bits and r["dist"] == dists[0]:
                cost.setdefault(r["block"], {})[r["mode"]] = r["bits_per_elem"]
        top = ax.secondary_xaxis("top")
        top.set_xticks(ticks)
        top.set_xticklabels(
            ["\n".join(f"{cost.get(b, {}).get(m, float('nan')):.4g}"
                       for m in modes)
             for b in blocks + ([0] if has_whole else [])], fontsize=7)
        top.xaxis.set_minor_locator(NullLocator())
        top.set_xlabel("bits per element (" + ", ".join(
            f"{m} {'above' if i == 0 else 'below'}" if len(modes) > 1 else m
            for i, m in enumerate(modes)) + ")", fontsize=8)

    handles = [Line2D([], [], color=colors[i % len(colors)], linewidth=3,
                      label=d) for i, d in enumerate(dists)]
    handles += [Line2D([], [], color="0.3", linestyle=style[m][0],
                       marker=style[m][1], label=m) for m in modes]
    if has_whole:
        handles.append(Line2D([], [], color="0.3", linestyle="none",
                              marker="o", markerfacecolor="none",
                              markersize=8, label="whole tensor (block 0)"))
    fig.legend(handles=handles, loc="lower center",
               ncol=min(len(handles), 6), frameon=False, fontsize=9)
    if args.title:
        fig.suptitle(args.title, fontsize=11)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    try:
        fig.savefig(args.output, dpi=120)
    except OSError as e:
        fail(2, f"{args.output}: {e.strerror}")
    print(f"{PROG}: wrote {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
