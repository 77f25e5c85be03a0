#!/usr/bin/env python3
"""Tables and plots of the cross-node bandwidth study (perf/bandwidth_study.sh).

    plot_bandwidth_study.py --plot STUDY.csv TRAIN.csv OUT_DIR
        bus bandwidth against message size (one panel per collective and
        link speed) -> OUT_DIR/bandwidth_study_busbw.png; speedup over bf16
        against the link speed at the largest size -> *_speedup.png; and,
        when TRAIN.csv exists, step time against the link speed -> *_train.png
    plot_bandwidth_study.py --markdown STUDY.csv CMDS TRAIN.csv TRAIN_BIN S1 S2
        the markdown section on stdout
    plot_bandwidth_study.py --stamp < zpp-train output > STAMPED
        prefix each line with its arrival time
    plot_bandwidth_study.py --train-row BATCH GBIT MODE STEPS T_START T_END STAMPED REP
        one CSV row of the training table from zpp-train --json output (REP:
        the repetition, 1..; the study alternates zero3 and zeropp)

STUDY.csv is zpp-bench's CSV with the link speed (Gbit/s per rank, or
"unlimited") as first column.  speedup = baseline time / variant time, both
from the same zpp-bench run (the bench's own ratio column, inverted).

Exit status: 0 ok, 1 matplotlib missing, 2 bad input.
"""
import csv
import datetime
import json
import math
import os
import platform
import re
import sys

PROG = "plot_bandwidth_study.py"
SPEED_ORDER = ["0.1", "0.4", "1", "10", "unlimited"]
COLLS = ["allgather", "reducescatter", "hpz-gather"]
COLL_TITLE = {
    "allgather": "all-gather (qwZ)",
    "reducescatter": "reduce-scatter (qgZ)",
    "hpz-gather": "hpZ gathers",
}


def fail(code, msg):
    print(f"{PROG}: {msg}", file=sys.stderr)
    sys.exit(code)


def speed_label(g):
    return "unlimited" if g == "unlimited" else f"{g} Gbit/s"


def size_label(b):
    b = int(b)
    if b >= 1 << 20 and b % (1 << 20) == 0:
        return f"{b >> 20} MiB"
    if b >= 1 << 10 and b % (1 << 10) == 0:
        return f"{b >> 10} KiB"
    return f"{b} B"


def read_study(path):
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError as e:
        fail(2, f"{path}: {e}")
    need = {"link_gbit", "coll", "variant", "size", "time_us", "busbw",
            "inter_bytes", "ratio", "wrong"}
    if not rows or not need.issubset(rows[0].keys()):
        fail(2, f"{path}: not a bandwidth study CSV (needs {sorted(need)})")
    for r in rows:
        for k in ("size", "inter_bytes", "wrong"):
            r[k] = int(r[k])
        for k in ("time_us", "busbw", "ratio"):
            r[k] = float(r[k])
    return rows


def read_train(path):
    if not path or not os.path.exists(path):
        return None
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def ordered(values, order):
    return sorted(set(values), key=lambda v: order.index(v) if v in order else len(order))


def variants_of(rows, coll):
    seen = []
    for r in rows:
        if r["coll"] == coll and r["variant"] not in seen:
            seen.append(r["variant"])
    return seen  # zpp-bench prints the baseline first


# ---- training rows ----------------------------------------------------------

def find_numbers(obj, path=""):
    """(key path, value) of every number in a JSON value."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from find_numbers(v, f"{path}.{k}" if path else k)
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from find_numbers(v, f"{path}[{i}]")
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool):
        yield path, float(obj)


def stamp():
    """Copy stdin to stdout, each line prefixed by its arrival time."""
    import time
    for line in sys.stdin:
        sys.stdout.write(f"{time.monotonic():.6f}\t{line}")
        sys.stdout.flush()


def train_row(batch, gbit, mode, steps, t_start, t_end, stamped_path, rep):
    """zpp-train prints a line per step (rank 0, flushed) and then one JSON
    object; the step time is its own step_time_s (barrier to the end of the
    optimizer step, max over ranks, first step excluded) when it reports
    one, else the spacing of the step lines' arrival times, else wall time
    / steps."""
    obj, step_t = None, []
    for raw in open(stamped_path):
        t, _, line = raw.partition("\t")
        line = line.strip()
        if line.startswith("step "):
            step_t.append(float(t))
        elif line.startswith("{"):
            try:
                obj = json.loads(line)
            except ValueError:
                pass
    if obj is None:
        fail(2, f"{stamped_path}: no JSON object in zpp-train's output")
    steps = int(steps)
    wall = float(t_end) - float(t_start)
    if isinstance(obj.get("step_time_s"), (int, float)):
        step_s, source = float(obj["step_time_s"]), "zpp-train step_time_s"
    elif len(step_t) >= 2:
        step_s = (step_t[-1] - step_t[0]) / (len(step_t) - 1)
        source = f"step lines ({len(step_t) - 1} intervals)"
    else:
        step_s, source = wall / steps, "wall/steps"
    world = obj.get("world_size", 0) or 1
    inter = obj.get("inter_bytes_per_step")
    inter_all = f"{inter:.0f}" if isinstance(inter, (int, float)) else ""
    inter_rank = f"{inter / world:.0f}" if isinstance(inter, (int, float)) else ""
    print(f"{batch},{gbit},{mode},{steps},{wall:.3f},{step_s:.6f},{source},{inter_all},"
          f"{inter_rank},{int(rep)}")


def median(v):
    v = sorted(v)
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def train_medians(train):
    """(batch, link, mode) -> med, min, max of step_time_s over the
    repetitions, by_rep (rep -> step_time_s), inter (median bytes per step
    and rank, None if not counted), source (where the step time came from)."""
    groups = {}
    for r in train:
        groups.setdefault((r["batch"], r["link_gbit"], r["mode"]), []).append(r)
    out = {}
    for key, rs in groups.items():
        t = [float(r["step_time_s"]) for r in rs]
        inter = [float(r["inter_bytes_per_step_per_rank"]) for r in rs
                 if r["inter_bytes_per_step_per_rank"]]
        out[key] = {"med": median(t), "min": min(t), "max": max(t),
                    "by_rep": {int(r.get("rep") or 1): float(r["step_time_s"]) for r in rs},
                    "inter": median(inter) if inter else None,
                    "source": rs[0]["step_time_source"]}
    return out


# ---- markdown ---------------------------------------------------------------

def markdown(study, cmds_path, train_path, train_bin, s_coll, s_train):
    rows = study
    speeds = ordered([r["link_gbit"] for r in rows], SPEED_ORDER)
    sizes = sorted({r["size"] for r in rows})
    by = {(r["link_gbit"], r["coll"], r["variant"], r["size"]): r for r in rows}
    cpu = "unknown CPU"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    out = []
    p = out.append
    p("### Cross-node bandwidth study: 2x4 (emulated), bf16, link per rank "
      + ", ".join(speed_label(g) for g in speeds))
    p("")
    p(f"Generated by `perf/bandwidth_study.sh` on "
      f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d}, {os.cpu_count()} cores "
      f"({cpu}); 8 ranks share them; {s_coll} s of collectives.")
    p("time = the slowest rank's mean over the timed iterations (ms); "
      "speedup = bf16 time / variant time, both from the same zpp-bench run "
      "(higher is better); inter MB = bytes each rank sends across the "
      "emulated network per call (mean over ranks); wrong = elements outside "
      "their bound in the checked iteration (all variants of the row). "
      "size (zpp-bench -b/-e) = one rank's shard for the all-gather and the "
      "hpZ gathers (the output is 8 shards), one rank's whole input for the "
      "reduce-scatter (the output is 1/8 of it).")
    p("")
    big = sizes[-1]
    p(f"**Speedup over bf16 at {size_label(big)} per rank**, per link speed:")
    p("")
    hdr = ["collective", "variant"] + [speed_label(g) for g in speeds]
    p("| " + " | ".join(hdr) + " |")
    p("|---|---|" + "---:|" * len(speeds))
    for coll in COLLS:
        for v in variants_of(rows, coll)[1:]:
            cells = []
            for g in speeds:
                r = by.get((g, coll, v, big))
                cells.append(f"{1.0 / r['ratio']:.2f}" if r and r["ratio"] > 0 else "-")
            p(f"| {coll} | {v} | " + " | ".join(cells) + " |")
    for coll in COLLS:
        vs = variants_of(rows, coll)
        if not vs:
            continue
        base = vs[0]
        p("")
        p(f"**{COLL_TITLE[coll]}**: time (ms), speedup over {base}, inter MB per rank")
        p("")
        hdr = ["link per rank", "size", f"{base} ms", f"{base} inter MB"]
        for v in vs[1:]:
            hdr += [f"{v} ms", f"{v} speedup", f"{v} inter MB"]
        hdr.append("wrong")
        p("| " + " | ".join(hdr) + " |")
        p("|---|---|" + "---:|" * (len(hdr) - 2))
        for g in speeds:
            for s in sizes:
                b = by.get((g, coll, base, s))
                if b is None:
                    continue
                cells = [speed_label(g), size_label(s), f"{b['time_us'] / 1e3:.1f}",
                         f"{b['inter_bytes'] / 1e6:.2f}"]
                wrong = b["wrong"]
                for v in vs[1:]:
                    r = by.get((g, coll, v, s))
                    if r is None:
                        cells += ["-", "-", "-"]
                        continue
                    wrong += r["wrong"]
                    cells += [f"{r['time_us'] / 1e3:.1f}", f"{1.0 / r['ratio']:.2f}",
                              f"{r['inter_bytes'] / 1e6:.2f}"]
                cells.append(str(wrong))
                p("| " + " | ".join(cells) + " |")
    p("")
    p("#### Training step: zpp-train, ZeRO-3 against ZeRO++")
    p("")
    train = read_train(train_path)
    if train is None:
        p(f"`{os.path.basename(train_bin)}` was not built when this study ran "
          f"(no `{train_bin}`), so there is no training-step study in this "
          f"version of the document.")
    else:
        # default 0: every zpp-train run failed (the CSV is its header)
        reps = max((int(r.get("rep") or 1) for r in train), default=0)
        p(f"{s_train} s in all. step time = zpp-train's `step_time_s` (from a "
          f"barrier to the end of the optimizer step, max over ranks, mean over "
          f"steps 2..), the median over {reps} repetition(s) of each mode, run "
          f"alternated (zero3, zeropp, zero3, ...), fastest..slowest beside it; "
          f"speedup = zero3's median / zeropp's median; paired = the median and "
          f"min..max of each repetition's zero3 / zeropp (the two runs side by "
          f"side); inter MB/step = zpp-train's `inter_bytes_per_step` (the "
          f"sum over all 8 ranks) / 8 ranks / 1e6, i.e. per rank. The global "
          f"batch is 8 (one sample per rank) or 64 (the trainer's default). "
          f"Each command below ran once per repetition.")
        p("")
        p("| batch | link per rank | zero3 step (ms) | zero3 min..max | zeropp step (ms) | "
          "zeropp min..max | speedup | paired | paired min..max | "
          "zero3 inter MB/step/rank | zeropp inter MB/step/rank | step time from |")
        p("|---:|---|---:|---|---:|---|---:|---:|---|---:|---:|---|")
        tm = train_medians(train)
        for b, g in [(b, g) for b in sorted({r["batch"] for r in train}, key=int)
                     for g in ordered([r["link_gbit"] for r in train], SPEED_ORDER)]:
            z3, zp = tm.get((b, g, "zero3")), tm.get((b, g, "zeropp"))
            if not z3 and not zp:
                continue

            def ms(m):
                return f"{m['med'] * 1e3:.1f}" if m else "-"

            def mm(m):
                return f"{m['min'] * 1e3:.1f}..{m['max'] * 1e3:.1f}" if m else "-"

            def mb(m):
                return f"{m['inter'] / 1e6:.2f}" if m and m["inter"] is not None else "-"
            sp = pm = pr = "-"
            if z3 and zp and zp["med"] > 0:
                sp = f"{z3['med'] / zp['med']:.2f}"
                pairs = [z3["by_rep"][k] / zp["by_rep"][k] for k in z3["by_rep"]
                         if zp["by_rep"].get(k)]
                if pairs:
                    pm = f"{median(pairs):.2f}"
                    pr = f"{min(pairs):.2f}..{max(pairs):.2f}"
            src = (z3 or zp)["source"]
            p(f"| {b} | {speed_label(g)} | {ms(z3)} | {mm(z3)} | {ms(zp)} | {mm(zp)} | "
              f"{sp} | {pm} | {pr} | {mb(z3)} | {mb(zp)} | {src} |")
    p("")
    p("Commands (`mpirun` stands for `mpirun --allow-run-as-root --oversubscribe "
      "--mca btl self,vader --bind-to none`, with `OMPI_MCA_mpi_yield_when_idle=1`; "
      "`ZPP_EMU_INTER_GBIT=0` is the unlimited link):")
    p("")
    p("```")
    out.extend(line.rstrip("\n") for line in open(cmds_path))
    p("```")
    print("\n".join(out))


# ---- plots ------------------------------------------------------------------

def speed_x(g):
    return SPEED_ORDER.index(g) if g in SPEED_ORDER else len(SPEED_ORDER)


def plot(study, train_path, out_dir):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        fail(1, "python3 matplotlib is missing: pip install matplotlib")
    rows = study
    speeds = ordered([r["link_gbit"] for r in rows], SPEED_ORDER)
    colls = [c for c in COLLS if variants_of(rows, c)]
    markers = "osD^v<>"

    fig, axes = plt.subplots(len(colls), len(speeds), figsize=(3.4 * len(speeds), 3.0 * len(colls)),
                             squeeze=False, sharex=True, sharey="row")
    for i, coll in enumerate(colls):
        for j, g in enumerate(speeds):
            ax = axes[i][j]
            for k, v in enumerate(variants_of(rows, coll)):
                pts = sorted((r["size"], r["busbw"]) for r in rows
                             if r["coll"] == coll and r["variant"] == v and r["link_gbit"] == g)
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=markers[k % len(markers)],
                            label=v)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.grid(True, which="both", alpha=0.3)
            if i == 0:
                ax.set_title(f"link {speed_label(g)}")
            if j == 0:
                ax.set_ylabel(f"{COLL_TITLE[coll]}\nbusbw (GB/s)")
                ax.legend(fontsize=8)
            if i == len(colls) - 1:
                ax.set_xlabel("size per rank (bytes)")
                sizes = sorted({r["size"] for r in rows})
                ax.set_xticks(sizes)
                ax.set_xticklabels([size_label(s) for s in sizes], fontsize=7)
    fig.suptitle("zpp-bench busbw, emulated 2x4 (8 ranks, 2 cores)")
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "bandwidth_study_busbw.png"), dpi=90)
    plt.close(fig)

    big = max(r["size"] for r in rows)
    fig, axes = plt.subplots(1, len(colls), figsize=(4.6 * len(colls), 3.8), squeeze=False)
    for i, coll in enumerate(colls):
        ax = axes[0][i]
        for k, v in enumerate(variants_of(rows, coll)[1:]):
            pts = sorted((speed_x(r["link_gbit"]), 1.0 / r["ratio"]) for r in rows
                         if r["coll"] == coll and r["variant"] == v and r["size"] == big
                         and r["ratio"] > 0)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=markers[(k + 1) % len(markers)],
                    label=v)
        ax.axhline(1.0, color="gray", linestyle="--", linewidth=1, label="bf16 = 1")
        ax.set_xticks([speed_x(g) for g in speeds])
        ax.set_xticklabels([g if g != "unlimited" else "unl." for g in speeds])
        ax.set_xlabel("inter-node link per rank (Gbit/s)")
        ax.set_ylabel("speedup over bf16 (same run)")
        ax.set_title(f"{COLL_TITLE[coll]}, {size_label(big)} per rank")
        ys = [1.0 / r["ratio"] for r in rows if r["coll"] == coll and r["size"] == big
              and r["ratio"] > 0]
        if ys and max(ys) > 12:  # hpZ backward: a log axis keeps the others visible
            ax.set_yscale("log")
        else:
            ax.set_ylim(bottom=0)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "bandwidth_study_speedup.png"), dpi=90)
    plt.close(fig)

    train = read_train(train_path)
    if train:
        fig, ax = plt.subplots(figsize=(5.5, 3.8))
        k = 0
        for batch in sorted({r["batch"] for r in train}, key=int):
            for mode in ["zero3", "zeropp"]:
                pts = sorted((speed_x(g), m["med"] * 1e3)
                             for (b, g, md), m in train_medians(train).items()
                             if md == mode and b == batch)
                ax.plot([p[0] for p in pts], [p[1] for p in pts],
                        marker=markers[k % len(markers)],
                        linestyle="-" if batch == "8" else "--",
                        label=f"{mode}, batch {batch}")
                k += 1
        tsp = ordered([r["link_gbit"] for r in train], SPEED_ORDER)
        ax.set_xticks([speed_x(g) for g in tsp])
        ax.set_xticklabels([g if g != "unlimited" else "unl." for g in tsp])
        ax.set_yscale("log")
        ax.set_xlabel("inter-node link per rank (Gbit/s)")
        ax.set_ylabel("step time (ms)")
        ax.set_title("zpp-train on an emulated 2x4 cluster")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, "bandwidth_study_train.png"), dpi=90)
        plt.close(fig)


def main(argv):
    if len(argv) >= 2 and argv[1] == "--plot" and len(argv) == 5:
        plot(read_study(argv[2]), argv[3], argv[4])
    elif len(argv) >= 2 and argv[1] == "--markdown" and len(argv) == 8:
        markdown(read_study(argv[2]), *argv[3:8])
    elif len(argv) == 2 and argv[1] == "--stamp":
        stamp()
    elif len(argv) >= 2 and argv[1] == "--train-row" and len(argv) == 10:
        train_row(*argv[2:10])
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
