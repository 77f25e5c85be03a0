#!/usr/bin/env python3
"""Where an FSDP2 + zpp training step spends its time, per mode: each run
given as one argument (examples/fsdp2_train.py's flags, as for
python/tests/fsdp_runs.py), all in one process group launched by mpirun,
the runs repeated --reps times, alternated.  Timed on every rank from
step --skip on; milliseconds per step, the mean over ranks:

  gather <kind>   inside zpp's all-gather hook, by kind ("qwz float32",
                  "hpz-node float32": zpp's hpZ inside the node, "exact
                  float32": exact, e.g. FSDP2's hpZ on the node's group)
  copy-in         FSDP2's all-gather minus the hook (the copy of the
                  shards into the gather's input)
  copy-out        FSDP2's copy of the gathered output into the parameters
  post-forward    FSDP2's reshard after the forward to the node's share
                  (reshard_after_forward=<int>: a clone of that share)
  reduce <kind>   inside zpp's reduce-scatter hook
  reduce other    FSDP2's reduce-scatter minus the hook (copies, the
                  gradient's division)
  rest            the step minus all of the above (compute, optimizer)
  step            the mean step (the example's timer)
  CPU             the CPU time of the processes (all threads) per step,
                  summed over the ranks: on C cores the step takes at
                  least CPU / C (with ZPP_NET_SPIN_US=0 zpp's waits sleep
                  and spend none)

Prints one JSON line per run and repetition (rank 0); --table FILE turns
a file of them into a table (medians over the repetitions, and each mode's
step over the first mode's in the same repetition).

  ZPP_TOPO=2x2 ZPP_EMU_INTER_GBIT=0.4 mpirun -np 4 ... python perf/fsdp2_hpz_profile.py \
      --reps 3 "--comm zppmpi --zeropp --zpp-hpz 0 --dim 256 --layers 4 --steps 10" \
      "--comm zppmpi --zeropp --dim 256 --layers 4 --steps 10" > prof.jsonl
  python perf/fsdp2_hpz_profile.py --table prof.jsonl
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
st = {"step": 0, "skip": 2, "t": {}, "hook": 0.0}


def _add(key, dt):
    if st["step"] >= st["skip"]:
        st["t"][key] = st["t"].get(key, 0.0) + dt


def _install():
    """Wraps zpp's hooks and FSDP2's collectives with timers; returns the
    example's run()."""
    sys.path.insert(0, str(ROOT / "examples"))
    import fsdp2_train
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp._fully_shard import _fsdp_param_group as pg
    from torch.optim.optimizer import register_optimizer_step_post_hook

    import zpp.fsdp

    def timed_hook(cls, what):
        orig = cls.__call__

        def call(self, *a, **k):
            before = dict(self.calls)
            t0 = time.perf_counter()
            r = orig(self, *a, **k)
            dt = time.perf_counter() - t0
            kind = next(x for x in self.calls if self.calls[x] != before.get(x, 0))
            _add("%s %s" % (what, kind), dt)
            st["hook"] += dt
            return r

        cls.__call__ = call

    def timed(owner, name, key, minus_hook):
        orig = getattr(owner, name)

        def f(*a, **k):
            h0 = st["hook"]
            t0 = time.perf_counter()
            r = orig(*a, **k)
            dt = time.perf_counter() - t0
            _add(key, dt - (st["hook"] - h0 if minus_hook else 0.0))
            return r

        setattr(owner, name, f)

    timed_hook(zpp.fsdp.AllGather, "gather")
    timed_hook(zpp.fsdp.ReduceScatter, "reduce")
    timed(pg, "foreach_all_gather", "copy-in", True)
    timed(pg, "foreach_all_gather_copy_out", "copy-out", False)
    timed(pg, "foreach_reduce", "reduce other", True)
    timed(pg.FSDPParamGroup, "_to_sharded_post_forward", "post-forward", False)

    def on_step(opt, args, kwargs):
        st["step"] += 1
        # CPU time of this process (all its threads) from the end of step
        # skip - 1 to the end of the last
        st["cpu"].append(time.process_time())

    register_optimizer_step_post_hook(on_step)
    inner = fsdp2_train.train

    def train(a):
        st.update(step=0, t={}, cpu=[])
        out = inner(a)
        steps = a.steps - st["skip"]
        every = [None] * dist.get_world_size()
        dist.all_gather_object(every, {k: v / steps * 1e3 for k, v in st["t"].items()})
        keys = sorted({k for e in every for k in e})
        ms = {k: sum(e.get(k, 0.0) for e in every) / len(every) for k in keys}
        # this rank's mean step over the timed steps, then the mean over ranks
        t = torch.tensor([sum(out["step_times_s"][st["skip"]:]) / steps * 1e3],
                         dtype=torch.float64)
        dist.all_reduce(t)
        step_ms = float(t[0]) / dist.get_world_size()
        ms["rest"] = step_ms - sum(ms.values())
        c = st["cpu"][st["skip"] - 1:]
        cpu = torch.tensor([(c[-1] - c[0]) / max(1, len(c) - 1) * 1e3], dtype=torch.float64)
        dist.all_reduce(cpu)
        rec = {"run": name_of(a), "step_ms": step_ms, "ms": ms, "cpu_ms": float(cpu[0]),
               "inter_mb": out.get("inter_bytes_per_step", 0) / 1e6,
               "intra_mb": out.get("intra_bytes_per_step", 0) / 1e6, "loss": out["losses"][-1]}
        if dist.get_rank() == 0:
            print(json.dumps(rec), flush=True)
        return out

    fsdp2_train.train = train
    return fsdp2_train.run


def name_of(a):
    if a.comm == "gloo":
        return "gloo"
    if not a.zeropp:
        return "exact" + (" zpp-hpz" if a.zpp_hpz else "")
    if a.hpz:
        return "zeropp fsdp2-hpz"
    return "zeropp no-hpz" if a.zpp_hpz == 0 else "zeropp zpp-hpz"


def table(lines):
    by = {}
    for d in lines:
        by.setdefault(d["run"], []).append(d)
    names = list(by)
    keys = sorted({k for d in lines for k in d["ms"]}, key=lambda k: (k == "rest", k))
    w = 44
    med = lambda xs: statistics.median(xs) if xs else 0.0
    print("%-*s" % (w, "ms per step (mean of ranks; median of %d reps)" % max(len(v) for v in by.values()))
          + "".join("%18s" % n for n in names))
    rows = [("step", lambda d: d["step_ms"], "%18.1f"),
            ("CPU, all ranks together", lambda d: d.get("cpu_ms", 0.0), "%18.1f")]
    rows += [(k, (lambda k: lambda d: d["ms"].get(k, 0.0))(k), "%18.1f") for k in keys]
    rows += [("inter-node MB/step", lambda d: d["inter_mb"], "%18.2f"),
             ("intra-node MB/step", lambda d: d["intra_mb"], "%18.2f")]
    for label, f, fmt in rows:
        print("%-*s" % (w, label) + "".join(fmt % med([f(d) for d in by[n]]) for n in names))
    # the i-th run of each mode against the i-th of the first: the same
    # repetition, minutes apart at most
    first = by[names[0]]
    cells = []
    for n in names:
        r = sorted(d["step_ms"] / b["step_ms"] for d, b in zip(by[n], first))
        cells.append("%18s" % ("%.3f" % med(r) if r else "-"))
    print("%-*s" % (w, "step / the first's, same repetition") + "".join(cells))
    print("%-*s" % (w, "  its range") + "".join(
        "%18s" % ("%.2f..%.2f" % (min(x), max(x)) if x else "-") for x in (
            [d["step_ms"] / b["step_ms"] for d, b in zip(by[n], first)] for n in names)))


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=1)
    p.add_argument("--skip", type=int, default=2, help="steps not timed (at least 1)")
    p.add_argument("--table", help="print the table of a file of the JSON lines, and exit")
    p.add_argument("runs", nargs="*")
    a = p.parse_args()
    if a.table:
        with open(a.table) as f:
            table([d for d in (json.loads(l) for l in f if l.startswith("{")) if "run" in d])
        sys.exit(0)
    st["skip"] = max(1, a.skip)
    # each run times its steps from --skip on: it needs one at least (a
    # bad flag fails here too, before any rank starts)
    sys.path.insert(0, str(ROOT / "examples"))
    import fsdp2_train

    for r in a.runs:
        steps = fsdp2_train.parse(r.split()).steps
        if steps <= st["skip"]:
            p.error("run %r: --steps %d leaves no step timed: it must exceed --skip %d"
                    % (r, steps, st["skip"]))
    run = _install()
    sys.exit(run([r.split() for _ in range(a.reps) for r in a.runs]))
