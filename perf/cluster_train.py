#!/usr/bin/env python3
"""Rows and tables of the training step study on real links
(perf/cluster_train.sh).

    cluster_train.py --row RATE BATCH REP MODE STEPS STATUS WALL_S OUT
        one CSV row (no header) for one zpp-train run: OUT is its stdout;
        STATUS is "ok" or why the run failed ("exit N", "timeout after N s"); a run
        whose STATUS is ok but whose OUT has no JSON object with a
        step_time_s, or whose JSON says another number of nodes than the
        cluster has, gets a STATUS saying so (and exit status 3).
    cluster_train.py --markdown CSV META
        the tables on stdout.
    cluster_train.py --header
        the CSV's header line.

CSV columns (HEADER below): rate (the tc rate of each node link and
direction, "none" = unshaped), batch (global), rep (1..R), mode (zero3 or
zeropp), steps, status, step_time_s (zpp-train's: barrier to the end of
the optimizer step, the slowest rank, mean over steps 2..), first_step_s,
wall_s (the whole launch, mpirun's start-up included), inter_bytes_rank
(zpp-train's inter_bytes_per_step / world_size: bytes each rank sends to
the other node per step, mean over ranks), inter_bytes_rank_max (the
busiest rank's), nodes and world_size as zpp-train saw them, then
zpp-train's phase_s (seconds, the slowest rank's mean over steps 2..;
empty when its JSON has none): fwd_s, fwd_wait_s (blocked on parameters
in the forward), bwd_s, bwd_wait_s (blocked in the backward), drain_s.
A CSV of the columns before the phases is still read (no phase table).

META: one line per (rate, batch) block, whitespace-separated:
    block RATE BATCH LOAD1 LOAD5 LOAD15 LOAD1_AFTER LOAD5_AFTER LOAD15_AFTER
          WAITED_S SECONDS START_ISO
and "key value..." lines: start, cores, cpu, reps, steps, max_load,
load_wait_s, timeout_s (others are ignored).

Per (rate, batch) the table gives each mode's median step time over its
successful runs and the fastest..slowest, speedup = zero3's median /
zeropp's median, and the paired speedup: zero3's time / zeropp's time of
each repetition (the two runs next to each other, so a slow minute of the
shared machine weighs on both), its median and min..max over the
repetitions where both runs succeeded.

Exit status: 0 ok, 2 bad input, 3 (--row) the run's output is unusable.
"""
import json
import statistics
import sys

PROG = "cluster_train.py"
NODES = 2
MODES = ("zero3", "zeropp")
OLD_HEADER = ("rate,batch,rep,mode,steps,status,step_time_s,first_step_s,wall_s,"
              "inter_bytes_rank,inter_bytes_rank_max,nodes,world_size")
# zpp-train's phase_s (seconds, the slowest rank's mean over steps 2..)
PHASES = (("fwd_s", "forward"), ("fwd_wait_s", "wait_params_forward"),
          ("bwd_s", "backward"), ("bwd_wait_s", "wait_backward"),
          ("drain_s", "drain"))
HEADER = OLD_HEADER + "," + ",".join(c for c, _ in PHASES)
LINK = {
    "1600mbit": "1.6 Gbit/s (NDR scaled)",
    "400mbit": "0.4 Gbit/s (100 GbE scaled)",
    "none": "unshaped",
}
TARGET = ("400mbit", "64", 2.0)  # the training target: zeropp >= 2x zero3 there


def fail(code, msg):
    print(f"{PROG}: {msg}", file=sys.stderr)
    sys.exit(code)


def row(rate, batch, rep, mode, steps, status, wall, out_path):
    obj = None
    try:
        with open(out_path) as f:
            for line in f:
                line = line.strip()
                if line.startswith("{"):
                    try:
                        obj = json.loads(line)
                    except ValueError:
                        pass
    except OSError as e:
        if status == "ok":
            status = f"no output ({e.strerror})"
    code = 0
    cols = [""] * (7 + len(PHASES))
    if status == "ok":
        if obj is None or not isinstance(obj.get("step_time_s"), (int, float)):
            status, code = "no JSON with step_time_s", 3
        elif obj.get("nodes") != NODES:
            status, code = f"zpp-train saw {obj.get('nodes')} nodes (want {NODES})", 3
    if obj is not None:
        world = obj.get("world_size") or 0
        inter = obj.get("inter_bytes_per_step")
        per = obj.get("inter_bytes_per_step_per_rank")
        num = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
        cols = [
            f"{obj['step_time_s']:.6f}" if num(obj.get("step_time_s")) else "",
            f"{obj['first_step_time_s']:.6f}" if num(obj.get("first_step_time_s")) else "",
            "",
            f"{inter / world:.0f}" if num(inter) and world > 0 else "",
            f"{max(per):.0f}" if isinstance(per, list) and per and all(map(num, per)) else "",
            str(obj.get("nodes", "")),
            str(world or ""),
        ]
        ph = obj.get("phase_s") if isinstance(obj.get("phase_s"), dict) else {}
        cols += [f"{ph[k]:.6f}" if num(ph.get(k)) else "" for _, k in PHASES]
    cols[2] = f"{float(wall):.3f}"
    status = status.replace(",", ";")
    print(",".join([rate, batch, rep, mode, steps, status] + cols))
    return code


def read_csv(path):
    with open(path) as f:
        lines = [l.rstrip("\n") for l in f if l.strip()]
    if not lines or lines[0] not in (HEADER, OLD_HEADER):
        fail(2, f"{path}: not a cluster_train CSV (header {HEADER})")
    keys = lines[0].split(",")
    rows = []
    for n, l in enumerate(lines[1:], 2):
        v = l.split(",")
        if len(v) != len(keys):
            fail(2, f"{path}:{n}: {len(v)} fields, want {len(keys)}")
        r = dict(zip(keys, v))
        for c, _ in PHASES:  # a CSV from before the phases: none
            r.setdefault(c, "")
        rows.append(r)
    return rows


def read_meta(path):
    blocks, kv = [], {}
    with open(path) as f:
        for line in f:
            w = line.split()
            if not w:
                continue
            if w[0] == "block":
                if len(w) != 12:
                    fail(2, f"{path}: block line with {len(w)} fields, want 12: {line.strip()}")
                blocks.append(w[1:])
            else:
                kv[w[0]] = " ".join(w[1:])
    return blocks, kv


def ms(v):
    return f"{v * 1e3:.1f}"


def spread_ms(vals):
    return f"{ms(min(vals))}..{ms(max(vals))}"


def summary(rows, rate, batch):
    """Per mode the successful step times, in repetition order, and the
    paired ratios of the repetitions where both runs succeeded."""
    t = {m: {} for m in MODES}
    inter = {m: [] for m in MODES}
    failed = []
    for r in rows:
        if r["rate"] != rate or r["batch"] != batch:
            continue
        if r["status"] != "ok":
            failed.append(r)
            continue
        t[r["mode"]][int(r["rep"])] = float(r["step_time_s"])
        if r["inter_bytes_rank"]:
            inter[r["mode"]].append(float(r["inter_bytes_rank"]))
    pairs = [t["zero3"][k] / t["zeropp"][k]
             for k in sorted(t["zero3"]) if k in t["zeropp"] and t["zeropp"][k] > 0]
    return t, inter, pairs, failed


def markdown(csv_path, meta_path):
    rows = read_csv(csv_path)
    blocks, kv = read_meta(meta_path)
    p = print
    reps, steps = kv.get("reps", ""), kv.get("steps", "?")
    if not reps.isdigit():
        fail(2, f"{meta_path}: no 'reps N' line")
    nreps = int(reps)
    p("### Training step on real links: 2 nodes x 4 ranks in network namespaces")
    p()
    p(f"Generated by `perf/cluster_train.sh` on {kv.get('start', '?')[:10]}, "
      f"{kv.get('cores', '?')} cores ({kv.get('cpu', 'unknown CPU')}), shared "
      f"with other jobs (the load averages are below). Each (rate, batch) "
      f"block: a fresh cluster at that rate, then {reps} repetitions of "
      f"zpp-train --mode zero3 followed by --mode zeropp ({steps} steps "
      f"each), alternated, so that both modes see the same minutes of the "
      f"shared machine. Before each block the script waited (at most "
      f"{kv.get('load_wait_s', '?')} s) for the 1-minute load average to "
      f"fall below {kv.get('max_load', '?')} (0: no wait).")
    p()
    # the invocation, with the settings that are not the defaults
    rates = list(dict.fromkeys(b[0] for b in blocks))
    batches = list(dict.fromkeys(b[1] for b in blocks))
    given = [("RATES", " ".join(rates), "400mbit 1600mbit none"),
             ("BATCHES", " ".join(batches), "64 8"), ("REPS", reps, "5"),
             ("STEPS", steps, "20"), ("TIMEOUT_S", kv.get("timeout_s"), "600"),
             ("MAX_LOAD", kv.get("max_load"), "3"),
             ("LOAD_WAIT_S", kv.get("load_wait_s"), "1200")]
    env = "".join(f"ZPP_CLUSTER_TRAIN_{k}={v!r} " if " " in v else f"ZPP_CLUSTER_TRAIN_{k}={v} "
                  for k, v, d in given if v is not None and v != d)
    p(f"Run: `{env}perf/cluster_train.sh OUT_DIR BUILD_DIR`.")
    p()
    p("Commands, per block (RATE and B from the table; `zpp-train` is "
      f"BUILD_DIR/tools/zpp-train, every launch under "
      f"`timeout {kv.get('timeout_s', '?')}`):")
    p()
    p("```")
    p("scripts/netns_cluster.sh up -n 2 -p 4 -r RATE")
    p(f"# {reps} times:")
    for m in MODES:
        p("scripts/netns_cluster.sh run -np 8 -x OMPI_MCA_mpi_yield_when_idle=1 "
          f"zpp-train --mode {m} --large --batch B --steps {steps} --json")
    p("scripts/netns_cluster.sh down")
    p("```")
    p()
    p("step = zpp-train's `step_time_s` (a barrier to the end of the optimizer "
      "step, the slowest rank, mean over steps 2..): median over the "
      "repetitions, fastest..slowest beside it (ms). speedup = zero3's "
      "median / zeropp's median; paired = zero3 / zeropp of each repetition "
      "(the two runs side by side), median and min..max. inter MB = bytes "
      "each rank sends to the other node per step (zpp-train's "
      "`inter_bytes_per_step` / 8 ranks, median over the runs) / 1e6.")
    p()
    p("| link | batch | runs ok | zero3 step (ms) | zero3 min..max | zeropp step (ms) "
      "| zeropp min..max | speedup | paired speedup | paired min..max "
      "| zero3 inter MB | zeropp inter MB |")
    p("|---|---:|---:|---:|---|---:|---|---:|---:|---|---:|---:|")
    all_failed = []
    for b in blocks:
        rate, batch = b[0], b[1]
        t, inter, pairs, failed = summary(rows, rate, batch)
        all_failed += failed
        z3, zp = list(t["zero3"].values()), list(t["zeropp"].values())
        n = sum(1 for r in rows if r["rate"] == rate and r["batch"] == batch)
        c = [LINK.get(rate, rate), batch, f"{len(z3) + len(zp)}/{n}"]
        c += [ms(statistics.median(z3)), spread_ms(z3)] if z3 else ["-", "-"]
        c += [ms(statistics.median(zp)), spread_ms(zp)] if zp else ["-", "-"]
        c.append(f"{statistics.median(z3) / statistics.median(zp):.2f}" if z3 and zp else "-")
        if pairs:
            c += [f"{statistics.median(pairs):.2f}", f"{min(pairs):.2f}..{max(pairs):.2f}"]
        else:
            c += ["-", "-"]
        for m in MODES:
            c.append(f"{statistics.median(inter[m]) / 1e6:.2f}" if inter[m] else "-")
        p("| " + " | ".join(c) + " |")
    trate, tbatch, tgoal = TARGET
    if any(b[0] == trate and b[1] == tbatch for b in blocks):
        t, _, pairs, _ = summary(rows, trate, tbatch)
        z3, zp = list(t["zero3"].values()), list(t["zeropp"].values())
        p()
        if z3 and zp and pairs:
            med = statistics.median(z3) / statistics.median(zp)
            pm = statistics.median(pairs)
            verdict = ("met" if med >= tgoal and pm >= tgoal else
                       "not met" if med < tgoal and pm < tgoal else
                       "not settled (the two figures disagree)")
            p(f"Target: zeropp at least {tgoal:g}x faster than zero3 at "
              f"{LINK[trate]} per node link and batch {tbatch}: speedup of the medians "
              f"{med:.3f}, median paired speedup {pm:.3f} ({min(pairs):.3f}..{max(pairs):.3f} "
              f"over {len(pairs)} repetitions): {verdict}.")
        else:
            p(f"Target ({LINK[trate]}, batch {tbatch}): no figure (runs failed).")
    p()
    # its own heading, so that a page can paste the result without these
    p("#### Load, phases and repetitions")
    p()
    p("Load average (1, 5, 15 min) of the machine before and after each block "
      "(the machine's cores are shared with other jobs; the 8 ranks of this "
      "study count in the load while they run, so \"after\" includes them):")
    p()
    p("| link | batch | load before | waited (s) | load after | block (s) | start (UTC) |")
    p("|---|---:|---|---:|---|---:|---|")
    for b in blocks:
        p(f"| {LINK.get(b[0], b[0])} | {b[1]} | {b[2]} {b[3]} {b[4]} | {b[8]} | {b[5]} {b[6]} {b[7]} "
          f"| {b[9]} | {b[10]} |")
    phase_rows = []
    for b in blocks:
        for m in MODES:
            ok = [r for r in rows if r["rate"] == b[0] and r["batch"] == b[1]
                  and r["mode"] == m and r["status"] == "ok"]
            vals = [[float(r[c]) for r in ok if r[c]] for c, _ in PHASES]
            if ok and all(vals):
                phase_rows.append([LINK.get(b[0], b[0]), b[1], m]
                                  + [ms(statistics.median(v)) for v in vals])
    if phase_rows:
        p()
        p("Where the step goes (zpp-train's `phase_s`, each the slowest rank's mean "
          "over steps 2.., median over the repetitions, ms): forward (data, forward, "
          "loss) and of it the time blocked waiting for parameters; backward and of "
          "it the time blocked in waits (parameters, and the gradient reductions "
          "the overlapped backward waits for); drain = waiting for the last "
          "reductions after the backward. A wait on shared cores also holds the "
          "time the other ranks take to get there.")
        p()
        p("| link | batch | mode | forward | of it waiting | backward | of it waiting | drain |")
        p("|---|---:|---|---:|---:|---:|---:|---:|")
        for r in phase_rows:
            p("| " + " | ".join(r) + " |")
    p()
    p("Per repetition (step ms, zero3 / zeropp, and their ratio):")
    p()
    p("| link | batch | " + " | ".join(f"rep {k}" for k in range(1, nreps + 1)) + " |")
    p("|---|---:|" + "---|" * nreps)
    for b in blocks:
        t, _, _, _ = summary(rows, b[0], b[1])
        cells = []
        for k in range(1, nreps + 1):
            a, z = t["zero3"].get(k), t["zeropp"].get(k)
            cells.append(f"{ms(a) if a is not None else '-'} / "
                         f"{ms(z) if z is not None else '-'}"
                         + (f" = {a / z:.2f}" if a is not None and z else ""))
        p(f"| {LINK.get(b[0], b[0])} | {b[1]} | " + " | ".join(cells) + " |")
    if all_failed:
        p()
        p("Failed runs (left out of the medians and pairs above):")
        p()
        for r in all_failed:
            p(f"- {r['rate']}, batch {r['batch']}, rep {r['rep']}, {r['mode']}: {r['status']}")


def main(argv):
    if len(argv) == 2 and argv[1] == "--header":
        print(HEADER)
        return 0
    if len(argv) == 10 and argv[1] == "--row":
        return row(*argv[2:])
    if len(argv) == 4 and argv[1] == "--markdown":
        markdown(argv[2], argv[3])
        return 0
    print(__doc__.split("\n\n")[1], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
