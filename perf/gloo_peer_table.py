#!/usr/bin/env python3
"""The table of perf/gloo_peer_study.sh from its CSV (perf/gloo_peer.py's
rows, one per timed call).

usage: gloo_peer_table.py STUDY.csv OUT.md [--cmds CMDS] [--meta META]

CMDS: "layout|rate|command" lines (the command above each table); META:
"key value" lines (start, load_start, load_end, cores, cpu, reps, seconds).

Per layout and rate, one table; per size, collective and variant:
  med ms       median over the repetitions of the call's time (the slowest
               rank's), min..max their range
  / gloo-bf16, / gloo-fp32
               the median over the repetitions of the paired ratio: the
               row's time / that gloo row's time in the same repetition
               (the variants of a repetition run one after another)
  bound ms     bytes that must cross one node link one way for the exact
               collective in the row's data dtype (all-gather: the other
               nodes' shards; reduce-scatter: this node's partial sums of
               the other nodes' slices; both N (nodes - 1) / nodes elements
               of the FULL tensor), / the link rate; the compressed rows
               (qwz8, qgz4) are held to bf16's, so x bound < 1 is what
               compression buys, except where those bytes fit in tbf's
               burst (72 KiB, scripts/netns_cluster.sh): a bucket that
               filled while the link was idle passes them above the rate,
               and any row may beat the bound (x bound marked *); "-" on
               an unshaped link
  link MB      zpp's own count of the bytes the busiest node sent to other
               nodes in one call (gloo's are not counted: -)
  wrong        elements outside their check, summed over the repetitions
               (every call's output is checked: perf/gloo_peer.py)
Exit status: 0 ok, 2 bad input (other columns, a row twice, a value that
is not a number).
"""
import argparse
import csv
import re
import statistics
import sys

COLS = ("layout,rate,coll,variant,impl,call,dtype,size,elems,world,nodes,rep,"
        "time_us,wrong,checked,max_err,link_bytes").split(",")
REFS = ("gloo-bf16", "gloo-fp32")
ORDER = ("gloo-bf16", "gloo-fp32", "zpp-bf16", "zpp-qwz8", "zpp-qgz4")
DTYPE_BYTES = {"bf16": 2, "fp32": 4}
RATE_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
BURST = 73728  # tbf's burst of scripts/netns_cluster.sh (bytes)


def die(msg):
    print("gloo_peer_table.py: %s" % msg, file=sys.stderr)
    sys.exit(2)


def rate_bits(rate):
    """tc rate -> bit/s, None for an unshaped link."""
    if rate in ("none", "0", "-"):
        return None
    m = re.fullmatch(r"([0-9]+)(bit|kbit|mbit|gbit)", rate)
    if not m:
        die("rate %r: must be like 1600mbit, or none" % rate)
    return int(m.group(1)) * RATE_UNITS[m.group(2)]


def size_name(b):
    for unit, s in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if b >= unit and b % unit == 0:
            return "%d %s" % (b // unit, s)
    return "%d B" % b


def num(v):
    """3 significant digits, no exponent for the times of this table."""
    if v >= 100:
        return "%.0f" % v
    if v >= 10:
        return "%.1f" % v
    return "%.2f" % v if v >= 0.995 else "%.3f" % v


def load(path):
    """{(layout, rate): {(size, coll, variant): {rep: row}}}, in file order."""
    blocks = {}
    with open(path, newline="") as f:
        rd = csv.DictReader(f)
        if rd.fieldnames != COLS:
            die("%s: columns %s, expected %s" % (path, rd.fieldnames, ",".join(COLS)))
        for row in rd:
            try:
                key = (int(row["size"]), row["coll"], row["variant"])
                row["time_us"] = float(row["time_us"])
                row["wrong"] = int(row["wrong"])
                row["checked"] = int(row["checked"])
                row["elems"] = int(row["elems"])
                row["nodes"] = int(row["nodes"])
                rep = int(row["rep"])
                if row["link_bytes"] != "":
                    int(row["link_bytes"])
            except (ValueError, TypeError) as e:
                die("%s: bad row %s: %s" % (path, dict(row), e))
            reps = blocks.setdefault((row["layout"], row["rate"]), {}).setdefault(key, {})
            if rep in reps:
                die("%s: row %d: layout %s, rate %s, size %d, %s, %s, rep %d a second time"
                    % (path, rd.line_num, row["layout"], row["rate"], key[0], key[1], key[2],
                       rep))
            reps[rep] = row
    return blocks


def read_kv(path):
    out = {}
    if path:
        for line in open(path):
            k, _, v = line.rstrip("\n").partition(" ")
            if k:
                out[k] = v
    return out


def read_cmds(path):
    out = {}
    if path:
        for line in open(path):
            parts = line.rstrip("\n").split("|", 2)
            if len(parts) == 3:
                out.setdefault((parts[0], parts[1]), []).append(parts[2])
    return out


def bound_bytes(row):
    """Bytes of the exact collective over one node link one way (None: one
    node)."""
    n, nodes = row["elems"], row["nodes"]
    if nodes < 2:
        return None
    dt = "fp32" if row["dtype"] == "fp32" else "bf16"
    return n * (nodes - 1) / nodes * DTYPE_BYTES[dt]


def bound_ms(row, bits):
    nbytes = bound_bytes(row)
    if bits is None or nbytes is None:
        return None
    return nbytes * 8 / bits * 1e3


def table(layout, rate, t, cmds):
    bits = rate_bits(rate)
    link = "unshaped" if bits is None else "%s per node link and direction" % rate
    lines = ["#### %s (%s), %s" % (layout, "2 nodes of %s ranks" % layout.split("x")[-1]
                                   if "x" in layout else layout, link), ""]
    for c in cmds.get((layout, rate), []):
        lines.append("`%s`  " % c)
    if cmds.get((layout, rate)):
        lines[-1] = lines[-1].rstrip()
        lines.append("")
    lines += ["| size | coll | variant | med ms | min..max ms | / gloo-bf16 | / gloo-fp32 "
              "| bound ms | x bound | link MB | wrong |",
              "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    keys = sorted(t, key=lambda k: (k[0], k[1], ORDER.index(k[2]) if k[2] in ORDER else 99,
                                    k[2]))
    what = {}
    burst = False
    for size, coll, v in keys:
        reps = t[(size, coll, v)]
        times = [r["time_us"] / 1e3 for r in reps.values()]
        med = statistics.median(times)
        cells = [size_name(size), coll, v, num(med), "%s..%s" % (num(min(times)),
                                                                 num(max(times)))]
        for ref in REFS:
            base = t.get((size, coll, ref))
            if v == ref or base is None:
                cells.append("-")
                continue
            paired = [reps[k]["time_us"] / base[k]["time_us"] for k in reps
                      if k in base and base[k]["time_us"] > 0]
            cells.append("%.2f" % statistics.median(paired) if paired else "-")
        row0 = next(iter(reps.values()))
        b = bound_ms(row0, bits)
        if b is None:
            cells += ["-", "-"]
        else:
            star = "*" if bound_bytes(row0) <= BURST else ""
            burst = burst or bool(star)
            cells += [num(b), "%.2f%s" % (med / b, star)]
        lb = row0["link_bytes"]
        cells.append("%.2f" % (int(lb) / 1e6) if lb not in ("", None) else "-")
        cells.append(str(sum(r["wrong"] for r in reps.values())))
        lines.append("| " + " | ".join(cells) + " |")
        what.setdefault((v, coll), (row0["impl"], row0["call"]))
    if burst:
        lines += ["", "\\* the bound's bytes fit in tbf's burst (%d bytes): below the bound "
                  "without compression is possible." % BURST]
    lines += ["", "What ran:", ""]
    for (v, coll), (impl, call) in sorted(what.items(), key=lambda x: (x[0][1], x[0][0])):
        lines.append("- %s %s: %s, `%s`" % (coll, v, impl, call))
    lines.append("")
    return lines


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("md")
    ap.add_argument("--cmds")
    ap.add_argument("--meta")
    o = ap.parse_args()
    blocks = load(o.csv)
    if not blocks:
        die("%s has no rows" % o.csv)
    meta = read_kv(o.meta)
    cmds = read_cmds(o.cmds)
    reps = sorted({len(v) for t in blocks.values() for v in t.values()})
    lines = ["### gloo as a peer: torch.distributed's gloo and zpp on the namespace cluster", ""]
    head = "Generated by `perf/gloo_peer_study.sh`"
    if meta.get("start"):
        head += " on %s" % meta["start"][:10]
    if meta.get("cores"):
        head += ", %s cores" % meta["cores"]
        if meta.get("cpu"):
            head += " (%s)" % meta["cpu"]
    if meta.get("load_start"):
        head += ", load average %s (1, 5, 15 min) at the start and %s at the end" % (
            meta["load_start"], meta.get("load_end", "?"))
    if meta.get("seconds"):
        head += "; %s s of launches" % meta["seconds"]
    lines += [head + ".", ""]
    lines += ["One launch per layout, link rate and size (perf/gloo_peer.py under mpirun, "
              "every rank one process, torch with one thread); the variants of a "
              "collective take turns, two untimed calls of each, then %s repetitions, "
              "each starting one variant later%s. "
              "size = bytes of the full gathered / reduced tensor in bf16 (N = size / 2 "
              "elements; the fp32 rows carry the same N values, twice the bytes). "
              "med = median over the repetitions of the slowest rank's time of the "
              "call (after a barrier); / gloo-X = median over the repetitions of the "
              "row's time / gloo-X's in the same repetition; bound = the bytes the exact "
              "collective in the row's data dtype must carry over one node link one way "
              "(N (nodes - 1) / nodes elements; the qwz8 and qgz4 rows held to bf16's) / "
              "the rate, so x bound < 1 is what compression buys where those bytes "
              "exceed tbf's burst of %d bytes (below it, marked *, any row may beat the "
              "bound); link MB = zpp's count of what the busiest node sent to the "
              "other; wrong = elements outside their check, over every timed call "
              "(gloo: within gamma_{W-1} of the float64 result; zpp bf16: bitwise the "
              "documented result; qwz8, qgz4: within their bounds of docs/format.md and "
              "docs/collectives.md)."
              % ("/".join(map(str, reps)),
                 " (2 or fewer: a smoke test, no measurement)" if min(reps) <= 2 else "",
                 BURST), ""]
    for (layout, rate), t in blocks.items():
        lines += table(layout, rate, t, cmds)
    with open(o.md, "w") as f:
        f.write("\n".join(lines).rstrip("\n") + "\n")


if __name__ == "__main__":
    main()
