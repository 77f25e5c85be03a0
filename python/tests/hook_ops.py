"""The reduce-scatter hook of zpp.fsdp called directly with every op FSDP2
hands it (AVG, SUM, PREMUL_SUM), exact and through qgZ, against float64
references computed here (every rank generates every rank's input from
the seed): AVG is the true mean over the group, PREMUL_SUM scales by the
factor once, SUM does not divide.  Also: the error-feedback residual is
per hook instance (per FSDPModule).  Run by fsdp_runs.py ("hook-ops") in
a launch that has already initialised torch.distributed; returns a dict
of check name -> "ok" or what went wrong."""

import numpy as np
import torch
import torch.distributed as dist

import zpp.fsdp

SEED = 20261130


def _x(r: int, n: int, tag: int) -> np.ndarray:
    return np.random.default_rng(SEED * 1000 + tag * 100 + r).standard_normal(n).astype(np.float32)


def check() -> dict:
    rank, W = dist.get_rank(), dist.get_world_size()
    g = dist.group.WORLD
    comms = zpp.fsdp.Comms()
    M = comms.world.nnodes
    n = 4096  # output elements per rank
    R = dist.ReduceOp
    seen = {}
    f = 1.0 / 8  # a power of two: f * x is exact in fp32
    cases = [("avg", R.AVG, 1.0 / W), ("sum", R.SUM, 1.0), ("premul_sum", R.PREMUL_SUM(f), f)]
    for qgz in (0, 4):
        opts = zpp.fsdp.Options(qgz_bits=qgz)
        for tag, (name, op, scale) in enumerate(cases):
            hook = zpp.fsdp.ReduceScatter(comms, opts)
            xs = [_x(q, n * W, 10 * qgz + tag) for q in range(W)]
            inp = torch.from_numpy(xs[rank].copy())
            out = torch.empty(n)
            hook(out, inp, g, op)
            full = np.sum(np.stack(xs).astype(np.float64), axis=0) * scale
            ref = full[rank * n:(rank + 1) * n]
            got = out.double().numpy()
            err = float(np.max(np.abs(got - ref)))
            absum = np.sum(np.abs(np.stack(xs).astype(np.float64)), axis=0)[rank * n:(rank + 1) * n]
            if qgz == 0:
                # W - 1 fp32 additions (in the order of zpp_reduce_scatter),
                # each rounding by at most 2^-24 of a partial sum <= sum |x|,
                # then one rounding for the scale
                bound = float(np.max((W + 1) * 2.0 ** -24 * absum * scale))
            else:
                # INT4 symmetric, A = max |x| (times the premul factor):
                # stage 1 adds half a step (scale <= A/7) per rank, stage 2
                # half a step of each node's partial sum (comm_driver.py);
                # AVG divides the whole by W
                A = max(float(np.max(np.abs(v))) for v in xs) * (f if name == "premul_sum" else 1.0)
                bound = (W * A / 14 + M * W * A / 14) * 1.001 * (1.0 / W if name == "avg" else 1.0)
            # the fitted scale of out against the reference: 1 when the
            # factor is right (a wrong one, applied twice or not at all, or a
            # sum for a mean, puts it at 1/8, 8 or W)
            fit = float(np.dot(got, ref) / np.dot(ref, ref))
            key = "%s %s" % ("qgz" if qgz else "exact", name)
            ok = err <= bound and abs(fit - 1.0) < 0.05
            seen[key] = "ok" if ok else "err %.3g bound %.3g fitted scale %.4f" % (err, bound, fit)
            want = "%s %s" % ("qgz" if qgz else "exact", name)
            if hook.calls != {want: 1}:
                seen[key + " calls"] = repr(hook.calls)
    # error feedback: one residual per hook (per FSDPModule), each holding
    # its own module's error
    opts = zpp.fsdp.Options(qgz_bits=4, error_feedback=True)
    a, b = zpp.fsdp.ReduceScatter(comms, opts), zpp.fsdp.ReduceScatter(comms, opts)
    a(torch.empty(n), torch.from_numpy(_x(rank, n * W, 90)), g, R.AVG)
    ra = [v.clone() for v in a.residuals.values()]
    b(torch.empty(n), torch.from_numpy(_x(rank, n * W, 91)), g, R.AVG)
    rb = list(b.residuals.values())
    seen["residual per module"] = (
        "ok" if len(ra) == len(rb) == 1 and bool(ra[0].abs().sum() > 0) and bool(rb[0].abs().sum() > 0)
        and torch.equal(list(a.residuals.values())[0], ra[0]) and not torch.equal(ra[0], rb[0])
        else "residuals shared or empty")
    comms.close()
    return seen
