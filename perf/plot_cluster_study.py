#!/usr/bin/env python3
"""Tables and plots of the bandwidth study on real links (perf/cluster_study.sh,
run as perf/bandwidth_study.sh --cluster).

    plot_cluster_study.py --markdown STUDY.csv CMDS META   markdown on stdout
    plot_cluster_study.py --plot STUDY.csv OUT_DIR
        OUT_DIR/cluster_study_time.png: median time (min..max bars) against
        the size, per collective and link rate, with each zpp variant's link
        limit (its bytes over the busiest node link / the rate, dashed) and
        the lower bound of any algorithm (dotted);
        OUT_DIR/cluster_study_emu.png: emulated time / real time per row.

STUDY.csv: mode (real: the namespace cluster; emu: zpp's link emulation
under ZPP_TOPO=2x4), link (real: the tc rate of each node link and
direction, "none" = unshaped; emu: ZPP_EMU_INTER_GBIT per rank), then
zpp-bench's CSV columns (variant ucx-V: V on zpp's UCX backend; the
targets and the emulation tables read only the MPI backend's rows; the
rows mpi-best[<algorithm>] are one series, mpi-best, whose algorithm, the
fastest of tuned's at that size, is named in the tables and at each point
of the plot).  CMDS: "mode|link|command" lines.  META: "key
value" lines (start, load_start, load_end, cores, cpu, seconds_real,
seconds_emu).

The cluster is 2 nodes of 4 ranks (NODES, PPN below).  Link limit of a
row: inter_bytes_node_max (the bytes a node's ranks send to the other node
in one call, zpp's own counters) * 8 / rate.  Lower bound: what any
algorithm must carry over one node link one way: all-gather, the other
node's shards, PPN * size; reduce-scatter, this node's partial sums of the
other node's output slices, size * (NODES - 1) / NODES bytes of the input
dtype.  Both count payload; TCP/IPv4/Ethernet framing adds 1514 / 1448 - 1
= 4.6% on the wire at MTU 1500 (tbf counts frames).

Exit status: 0 ok, 1 matplotlib missing, 2 bad input.
"""
import csv
import datetime
import math
import os
import sys

PROG = "plot_cluster_study.py"
NODES, PPN = 2, 4
RATE_ORDER = ["1600mbit", "400mbit", "none"]
COLLS = ["allgather", "reducescatter"]
TITLE = {"allgather": "all-gather", "reducescatter": "reduce-scatter"}
RATE_NOTE = {
    "1600mbit": "4 ranks x 0.4 Gbit/s, NDR scaled",
    "400mbit": "4 ranks x 0.1 Gbit/s, 100 GbE scaled",
    "none": "the 2 shared cores are the limit",
}
FRAMING = 1514.0 / 1448.0
BEST = "mpi-best"
# zpp's full-precision baseline and Open MPI's peers of it
PEERS = ["mpi", "mpi-han", BEST]
# zpp's own algorithms, each forced (the bf16 row is ZPP_ALGO=auto's choice)
OWN = ["bf16-flat", "bf16-hier"]
# the targets: bf16 within BOUND_GOAL x the bound from 4 MiB on the shaped
# links; bf16 at most PEER_GOAL x the fastest Open MPI peer at every size;
# auto at most AUTO_GOAL x the fastest of OWN at every size
BOUND_GOAL, PEER_GOAL, AUTO_GOAL = 1.2, 1.0, 1.1


def fail(code, msg):
    print(f"{PROG}: {msg}", file=sys.stderr)
    sys.exit(code)


def rate_bits(link):
    """tc rate -> bit/s (None for "none")."""
    for suf, mul in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3)):
        if link.endswith(suf):
            return float(link[: -len(suf)]) * mul
    return None


def rate_label(link):
    b = rate_bits(link)
    return "unshaped" if b is None else f"{b / 1e9:g} Gbit/s"


def size_label(b):
    b = int(b)
    if b >= 1 << 20 and b % (1 << 20) == 0:
        return f"{b >> 20} MiB"
    if b >= 1 << 10 and b % (1 << 10) == 0:
        return f"{b >> 10} KiB"
    return f"{b} B"


def num(v):
    return float(v) if v not in ("", None) else None


def read_study(path):
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError as e:
        fail(2, f"{path}: {e}")
    need = {"mode", "link", "coll", "variant", "size", "time_med_us", "time_min_us",
            "time_max_us", "inter_bytes_node_max", "wrong", "ratio"}
    if not rows or not need.issubset(rows[0].keys()):
        fail(2, f"{path}: not a cluster study CSV (needs {sorted(need)})")
    for r in rows:
        r["alg"] = ""
        if r["variant"].startswith(f"{BEST}[") and r["variant"].endswith("]"):
            r["alg"] = r["variant"][len(BEST) + 1:-1]
            r["variant"] = BEST
        r["size"] = int(r["size"])
        r["wrong"] = int(r["wrong"]) if r["wrong"] else 0
        for k in ("time_us", "time_med_us", "time_min_us", "time_max_us",
                  "inter_bytes_node_max", "ratio"):
            r[k] = num(r[k])
    return rows


def limit_s(r, bits):
    """The row's own link limit in seconds (None: unknown bytes or no rate)."""
    if bits is None or r["inter_bytes_node_max"] is None:
        return None
    return r["inter_bytes_node_max"] * 8 / bits


def bound_s(coll, size, bits):
    """What any algorithm must carry over one node link one way, in s."""
    if bits is None:
        return None
    b = PPN * size if coll == "allgather" else size * (NODES - 1) / NODES
    return b * 8 / bits


def ordered(values, order):
    return sorted(set(values), key=lambda v: order.index(v) if v in order else len(order))


def variants_of(rows, coll):
    seen = []
    for r in rows:
        if r["coll"] == coll and r["variant"] not in seen:
            seen.append(r["variant"])
    return seen


def shown(r):
    """The variant as zpp-bench named the row (mpi-best with its algorithm)."""
    return f"{r['variant']}[{r['alg']}]" if r["alg"] else r["variant"]


def ms(x):
    return "-" if x is None else (f"{x * 1e3:.1f}" if x * 1e3 >= 10 else f"{x * 1e3:.2f}")


# ---- markdown ---------------------------------------------------------------

def markdown(rows, cmds_path, meta_path):
    meta = {}
    for line in open(meta_path):
        k, _, v = line.rstrip("\n").partition(" ")
        meta[k] = v
    cmds = {}
    for line in open(cmds_path):
        mode, link, text = line.rstrip("\n").split("|", 2)
        coll = "allgather" if "--coll allgather" in text else "reducescatter"
        cmds.setdefault((mode, link, coll), []).append(text)
    real = [r for r in rows if r["mode"] == "real"]
    emu = [r for r in rows if r["mode"] == "emu"]
    by = {(r["mode"], r["link"], r["coll"], r["variant"], r["size"]): r for r in rows}
    rates = ordered([r["link"] for r in real], RATE_ORDER)
    out = []
    p = out.append
    date = meta.get("start", "")[:10] or f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d}"
    p("### Real links: 2 nodes x 4 ranks in network namespaces")
    p("")
    p(f"Generated by `perf/bandwidth_study.sh --cluster` (perf/cluster_study.sh) on {date}, "
      f"{meta.get('cores', '?')} cores ({meta.get('cpu', 'unknown CPU')}), shared with other "
      f"jobs: load average {meta.get('load_start', '?')} (1, 5, 15 min) at the start and "
      f"{meta.get('load_end', '?')} at the end; {meta.get('seconds_real', '?')} s on the "
      f"cluster, {meta.get('seconds_emu', '?')} s of emulation. The topology is discovered "
      f"(zpp-bench's header: `topology discovered`), ranks of a node use shared memory, the "
      f"nodes TCP over their shaped links (Open MPI ob1: vader, tcp; the `ucx-*` rows: zpp on "
      f"its UCX backend, UCX's tcp, sm).")
    p("")
    its = f"{meta.get('iters', '?')} timed iterations"
    if "small_iters" in meta:
        its = (f"{meta['small_iters']} (below 1 MiB), {meta.get('mid_iters', meta.get('iters', '?'))} "
               f"(1-4 MiB) or {meta.get('iters', '?')} (from 16 MiB) timed iterations")
    order = ("; the variants of a launch run round-robin (zpp-bench --interleave: "
             "call k of each before call k+1 of any, each round starting one variant "
             "later), so a slow phase of the machine slows every row of a size in that "
             "launch alike (the `ucx-*` rows are a launch of their own)"
             if meta.get("interleave") == "1" else "")
    p(f"med = median over the {its} of each iteration's slowest rank (ms){order}; "
      "min..max = the fastest and slowest of those iterations; link MB = the bytes the "
      "busiest node link carries one way in one call (zpp's counters, "
      "`inter_bytes_node_max`; Open MPI's own collectives are not counted: -); "
      "limit = link MB / rate, x limit = med / limit; bound = what any algorithm must "
      "carry over a node link (all-gather: the other node's 4 shards; reduce-scatter: "
      "half the input) / rate; vs bf16 = med / the med of zpp's bf16 on the MPI backend "
      "(lower is better), from the same run but for the `ucx-*` rows (the run after it); "
      "wrong = elements outside their bound in the checked iteration. Limits count "
      "payload: TCP/IP/Ethernet framing adds 4.6% on the wire (tbf counts frames).")
    for link in rates:
        bits = rate_bits(link)
        p("")
        p(f"#### {rate_label(link)} per node link ({RATE_NOTE.get(link, link)})")
        for coll in COLLS:
            vs = variants_of([r for r in real if r["link"] == link], coll)
            if not vs:
                continue
            sizes = sorted({r["size"] for r in real if r["link"] == link and r["coll"] == coll})
            p("")
            p("  \n".join(f"`{c}`" for c in cmds.get(('real', link, coll), ['?'])))
            p("")
            hdr = ["size", "variant", "med ms", "min..max ms", "link MB", "limit ms",
                   "x limit", "bound ms", "x bound", "vs bf16", "wrong"]
            p("| " + " | ".join(hdr) + " |")
            p("|---|---|" + "---:|" * (len(hdr) - 2))
            for s in sizes:
                base = by.get(("real", link, coll, "bf16", s))
                for v in vs:
                    r = by.get(("real", link, coll, v, s))
                    if r is None:
                        continue
                    med = r["time_med_us"] / 1e6
                    lim, bnd = limit_s(r, bits), bound_s(coll, s, bits)
                    cells = [size_label(s), shown(r), ms(med),
                             f"{ms(r['time_min_us'] / 1e6)}..{ms(r['time_max_us'] / 1e6)}",
                             "-" if r["inter_bytes_node_max"] is None
                             else f"{r['inter_bytes_node_max'] / 1e6:.2f}",
                             ms(lim), f"{med / lim:.2f}" if lim else "-",
                             ms(bnd), f"{med / bnd:.2f}" if bnd else "-",
                             f"{med / (base['time_med_us'] / 1e6):.2f}" if base else "-",
                             str(r["wrong"])]
                    p("| " + " | ".join(cells) + " |")
    targets(p, real, by, rates)
    if emu:
        emulation(p, by, rates, cmds)
    print("\n".join(out))


def targets(p, real, by, rates):
    """The collective targets: on the shaped links from 4 MiB on (bound,
    qwZ, qgZ), on every link at every size (against Open MPI, auto)."""
    p("")
    p("#### The targets on these links")
    p("")
    p("From the tables above (medians), at the sizes the targets name. *best bf16* is the "
      "fastest of zpp's bf16 and Open MPI's peers (" + ", ".join(PEERS) + ") at that size, "
      "named in the cell; *Open MPI* is the fastest of its peers; *zpp's best algorithm* the "
      "fastest of " + ", ".join(OWN) + " (each of zpp's algorithms forced), against "
      "`bf16`, the algorithm `ZPP_ALGO=auto` chose.")
    p("")
    p("| target | link | size | measured | met |")
    p("|---|---|---|---:|---|")
    for link in rates:
        bits = rate_bits(link)
        sizes = sorted({r["size"] for r in real if r["link"] == link})

        def med(coll, v, s):
            r = by.get(("real", link, coll, v, s))
            return r["time_med_us"] / 1e6 if r else None

        def fastest(coll, vs, s):
            """(median, row name) of the fastest of vs at s, or None."""
            got = [(r["time_med_us"] / 1e6, shown(r)) for r in
                   (by.get(("real", link, coll, v, s)) for v in vs) if r]
            return min(got) if got else None
        for s in [s for s in sizes if s >= (4 << 20)]:
            if bits is not None:
                for coll, word in (("allgather", "all-gather"), ("reducescatter", "reduce-scatter")):
                    m, b = med(coll, "bf16", s), bound_s(coll, s, bits)
                    if m:
                        p(f"| bf16 {word} <= {BOUND_GOAL} x bound | {rate_label(link)} | {size_label(s)} "
                          f"| {m / b:.2f} | {'yes' if m / b <= BOUND_GOAL else 'no'} |")
            for coll, v, goal in (("allgather", "qwz8", 0.6), ("reducescatter", "qgz4", 0.4)):
                m = med(coll, v, s)
                # a run that failed or timed out has no rows: no target row
                b = fastest(coll, ["bf16"] + PEERS, s)
                if m and b:
                    best, name = b
                    p(f"| {v} <= {goal} x best bf16 | {rate_label(link)} | {size_label(s)} "
                      f"| {m / best:.2f} ({name}) | {'yes' if m / best <= goal else 'no'} |")
        def worst_row(coll, against, what, goal):
            """One row: bf16 over the fastest of `against` at each size,
            the worst of them against `goal`."""
            ratios = []
            for s in sizes:
                z, o = med(coll, "bf16", s), fastest(coll, against, s)
                if z and o:
                    ratios.append((z / o[0], s, o[1]))
            if ratios:
                worst, ws, wname = max(ratios)
                p(f"| {what} <= {goal} at every size | {rate_label(link)} | "
                  f"{size_label(min(s for _, s, _ in ratios))}..{size_label(max(s for _, s, _ in ratios))} "
                  f"| worst {worst:.2f} ({size_label(ws)}, {wname}) | "
                  f"{'yes' if worst <= goal else 'no'} |")
        for coll, word in (("allgather", "all-gather"), ("reducescatter", "reduce-scatter")):
            worst_row(coll, PEERS, f"zpp bf16 / Open MPI {word}", PEER_GOAL)
            # ZPP_ALGO=auto (the bf16 row) against the fastest of zpp's own
            # algorithms forced (bf16-flat, bf16-hier) at each size
            worst_row(coll, OWN, f"auto bf16 / zpp's best algorithm {word}", AUTO_GOAL)


def emulation(p, by, rates, cmds):
    p("")
    p("#### zpp's link emulation against the real shaped link")
    p("")
    p("The same zpp-bench rows on one machine under `ZPP_TOPO=2x4` with "
      "`ZPP_EMU_INTER_GBIT` = g per rank (docs/design.md, \"Link emulation\": each "
      "rank's own NIC clock), at g = rate / 4 (the per-rank share of the node link, the "
      "scaling of the emulated study) and g = rate (one NIC as fast as the whole link). "
      "emu / real = the emulation's median / the real link's median; within 0.8..1.2 the "
      "two agree to 20%.")
    for link in [r for r in rates if rate_bits(r)]:
        bits = rate_bits(link)
        gs = [f"{bits / 4e9:g}", f"{bits / 1e9:g}"]
        p("")
        for g in gs:
            for coll in COLLS:
                for c in cmds.get(("emu", g, coll), []):
                    p(f"`{c}`  ")
        p("")
        p(f"| link {rate_label(link)} | size | variant | real med ms | emu g = {gs[0]} ms "
          f"| emu / real | emu g = {gs[1]} ms | emu / real |")
        p("|---|---|---|---:|---:|---:|---:|---:|")
        keys = sorted({(k[2], k[3], k[4]) for k in by if k[0] == "emu" and k[1] in gs},
                      key=lambda k: (COLLS.index(k[0]), k[2], k[1] != "bf16", k[1]))
        for coll, v, s in keys:
            r = by.get(("real", link, coll, v, s))
            if r is None:
                continue
            real_s = r["time_med_us"] / 1e6
            cells = [TITLE[coll], size_label(s), v, ms(real_s)]
            for g in gs:
                e = by.get(("emu", g, coll, v, s))
                if e is None:
                    cells += ["-", "-"]
                else:
                    es = e["time_med_us"] / 1e6
                    cells += [ms(es), f"{es / real_s:.2f}"]
            p("| " + " | ".join(cells) + " |")


# ---- plots ------------------------------------------------------------------

def plot(rows, out_dir):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        fail(1, "python3 matplotlib is missing: pip install matplotlib")
    real = [r for r in rows if r["mode"] == "real"]
    rates = ordered([r["link"] for r in real], RATE_ORDER)
    markers = "osD^v<>"
    fig, axes = plt.subplots(len(COLLS), len(rates), figsize=(4.2 * len(rates), 3.6 * len(COLLS)),
                             squeeze=False, sharex=True)
    for i, coll in enumerate(COLLS):
        for j, link in enumerate(rates):
            ax = axes[i][j]
            bits = rate_bits(link)
            sub = [r for r in real if r["coll"] == coll and r["link"] == link]
            sizes = sorted({r["size"] for r in sub})
            for k, v in enumerate(variants_of(sub, coll)):
                pts = sorted((r["size"], r) for r in sub if r["variant"] == v)
                xs = [s for s, _ in pts]
                med = [r["time_med_us"] / 1e3 for _, r in pts]
                lo = [m - r["time_min_us"] / 1e3 for m, (_, r) in zip(med, pts)]
                hi = [r["time_max_us"] / 1e3 - m for m, (_, r) in zip(med, pts)]
                line = ax.errorbar(xs, med, yerr=[lo, hi], marker=markers[k % len(markers)],
                                   capsize=2,
                                   label=f"{v} (algorithm at each point)" if v == BEST else v)
                for x, y, (_, r) in zip(xs, med, pts):
                    if r["alg"]:
                        ax.annotate(r["alg"], (x, y), fontsize=5, xytext=(2, 2),
                                    textcoords="offset points")
                lim = [limit_s(r, bits) for _, r in pts]
                # a ucx-* row moves the bytes of its MPI-backend variant:
                # the same limit line, drawn once
                if all(x is not None for x in lim) and not v.startswith("ucx-"):
                    ax.plot(xs, [x * 1e3 for x in lim], linestyle="--", linewidth=1,
                            color=line[0].get_color(), label=f"{v} link limit")
            if bits is not None and sizes:
                ax.plot(sizes, [bound_s(coll, s, bits) * 1e3 for s in sizes], linestyle=":",
                        color="gray", linewidth=1.5, label="bound (any algorithm)")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.grid(True, which="both", alpha=0.3)
            ax.set_title(f"{TITLE[coll]}, {rate_label(link)} per node")
            if j == 0:
                ax.set_ylabel("time per call (ms)")
            if i == len(COLLS) - 1:
                ax.set_xlabel("size per rank")
                ax.set_xticks(sizes)
                ax.set_xticklabels([size_label(s) for s in sizes], fontsize=7)
            if j == 0:
                ax.legend(fontsize=6, loc="upper left")
    fig.suptitle("zpp-bench on 2 namespace nodes x 4 ranks: median (bars: min..max of the iterations); "
                 "dashed: link limit of the variant's bytes; dotted: bound", fontsize=9)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "cluster_study_time.png"), dpi=90)
    plt.close(fig)

    by = {(r["mode"], r["link"], r["coll"], r["variant"], r["size"]): r for r in rows}
    pts = []
    for link in [r for r in rates if rate_bits(r)]:
        bits = rate_bits(link)
        for scope, g in (("rate/4 per rank", f"{bits / 4e9:g}"), ("rate per rank", f"{bits / 1e9:g}")):
            for k in sorted(k for k in by if k[0] == "emu" and k[1] == g):
                r = by.get(("real", link, k[2], k[3], k[4]))
                if r:
                    pts.append((f"{rate_label(link)}\n{scope}",
                                f"{k[2][:6]} {k[3]} {size_label(k[4])}",
                                by[k]["time_med_us"] / r["time_med_us"]))
    if pts:
        groups = list(dict.fromkeys(g for g, _, _ in pts))
        labels = list(dict.fromkeys(l for _, l, _ in pts))
        fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(labels) * len(groups) / 2), 4))
        w = 0.8 / len(groups)
        for gi, g in enumerate(groups):
            ys = [next((y for gg, ll, y in pts if gg == g and ll == l), math.nan) for l in labels]
            ax.bar([x + gi * w for x in range(len(labels))], ys, width=w, label=g.replace("\n", ", "))
        ax.axhspan(0.8, 1.2, color="green", alpha=0.1, label="within 20%")
        ax.axhline(1.0, color="gray", linewidth=1)
        ax.set_xticks([x + 0.4 - w / 2 for x in range(len(labels))])
        ax.set_xticklabels(labels, rotation=45, ha="right", fontsize=7)
        ax.set_yscale("log")
        ax.set_ylabel("emulated time / real time (medians)")
        ax.set_title("zpp's per-rank link emulation against the shaped node link")
        ax.grid(True, axis="y", which="both", alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, "cluster_study_emu.png"), dpi=90)
        plt.close(fig)


def main(argv):
    if len(argv) == 5 and argv[1] == "--markdown":
        markdown(read_study(argv[2]), argv[3], argv[4])
    elif len(argv) == 4 and argv[1] == "--plot":
        plot(read_study(argv[2]), argv[3])
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
