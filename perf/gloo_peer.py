#!/usr/bin/env python3
"""The worker of perf/gloo_peer_study.sh: torch.distributed's gloo backend
and zpp's Python package on the same tensors, one launch, every size
interleaved.  Started by mpirun (one process per rank); rank 0 prints the
CSV rows on stdout.

    mpirun -np W python perf/gloo_peer.py --sizes 64K,256K --reps 5
        [--label LAYOUT,RATE] [--header] [--seed S] [--colls allgather,reducescatter]
    python perf/gloo_peer.py --print-header     the CSV header alone

Per size (bytes of the FULL gathered / reduced tensor in bf16, N = size / 2
elements, a positive multiple of W; the fp32 rows carry the same N values,
twice the bytes) and collective, two untimed calls of every variant (the
warm-up; their outputs checked), then REPS rounds of one timed call of
each variant, round k starting k variants later (a slow phase of the
shared machine falls on every variant alike).  REPS=2 is a smoke test
only: a median of two is their mean.

  all-gather (each rank's shard N / W elements, output N):
    gloo-bf16, gloo-fp32   dist.all_gather_into_tensor (FSDP2's unshard on
                           CPU: one flat buffer in the parameter dtype)
    zpp-bf16               zpp.Comm.allgather
    zpp-qwz8               zpp.Comm.qwz_allgather(bits=8, block=256)
  reduce-scatter (each rank's input N elements, output N / W):
    gloo-bf16, gloo-fp32   dist.reduce_scatter_tensor with the op and the
                           divisions FSDP2 itself picks for a gloo group and
                           that reduce dtype (its _get_gradient_divide_factors:
                           ReduceOp.AVG for bf16 and fp32 in torch 2.15; gloo
                           takes SUM and AVG and refuses PREMUL_SUM); where
                           that private function fails, SUM then / W, the
                           reason on rank 0's stderr and in the rows' call
    zpp-bf16               zpp.Comm.reduce_scatter(op="mean")
    zpp-qgz4               zpp.Comm.qgz_reduce_scatter(op="mean", intra 4,
                           inter 4 bits, block 256, no error feedback)

Data: rank r's values are normal(0, 1) rounded to bf16, from a generator
keyed by (seed, N, r, j) for the j-th of its W equal chunks, so every rank
computes any rank's chunk for the checks.

Checks (every call's output, written into a buffer filled with NaN: the
first untimed one in full, every later one bitwise against it, in full
again where it differs; the second untimed call's wrong elements count in
the first repetition's row):
  all-gather, exact rows     bitwise equal to every rank's input
  zpp-qwz8                   |out - in| within the per-element bound of
                             docs/format.md for the input's block (the
                             check of zpp-bench's qwz rows)
  gloo reduce-scatter        |out - float64 mean| <= gamma_{W-1} sum |x| / W
                             (any summation order, u per addition: bf16
                             2^-8 + 2^-24, fp32 2^-24) + the divisions'
                             roundings
  zpp-bf16 reduce-scatter    bitwise equal to the documented order
                             (docs/collectives.md: each node's fp32 sum in
                             rank order rounded to bf16, then in node order
                             in fp32, / W, rounded once; one node or flat:
                             the fp32 sum in rank order)
  zpp-qgz4                   within the two-stage bound of docs/collectives.md
                             ("qgZ", "Error bound")

Timing: dist.barrier() (gloo), then one call timed on each rank; a call's
time is the slowest rank's.  link_bytes (zpp rows): the bytes a node's
ranks sent to other nodes in the untimed call (zpp's counters), the
largest over nodes; gloo's are not counted.

CSV columns: the HEADER below (label's two fields first).  Exit status: 0
every output right; 3 some output wrong (every row printed, their wrong
column says which); 2 a bad argument (a size that is not a positive
multiple of W elements: before any call); 1 another failure.
"""

import argparse
import datetime
import os
import sys
import time

import numpy as np

# dtype: of the data (the compressed rows' input and output are bf16)
HEADER = ("layout,rate,coll,variant,impl,call,dtype,size,elems,world,nodes,rep,"
          "time_us,wrong,checked,max_err,link_bytes")
BLOCK = 256
UNTIMED = 2  # untimed calls of each variant before the repetitions (warm-up)
AG_VARIANTS = ("gloo-bf16", "zpp-bf16", "gloo-fp32", "zpp-qwz8")
RS_VARIANTS = ("gloo-bf16", "zpp-bf16", "gloo-fp32", "zpp-qgz4")


def size_bytes(text: str) -> int:
    t = text.strip()
    mul = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:].upper(), 1)
    digits = t[:-1] if mul > 1 else t
    if not digits.isdigit():
        raise argparse.ArgumentTypeError("size %r: an integer with an optional K, M or G" % text)
    return int(digits) * mul


def parse_args(argv=None):
    ap = argparse.ArgumentParser(prog="gloo_peer.py", description=__doc__.split("\n\n")[0])
    if argv is None:
        argv = sys.argv[1:]
    if argv == ["--print-header"]:  # (no MPI, no torch: for the study's CSV)
        print(HEADER)
        sys.exit(0)
    ap.add_argument("--sizes", required=True,
                    help="comma list of full-tensor sizes in bytes of bf16 (K, M, G)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--label", default="-,-", help="LAYOUT,RATE: the first two columns")
    ap.add_argument("--header", action="store_true", help="print the CSV header first")
    ap.add_argument("--colls", default="allgather,reducescatter")
    o = ap.parse_args(argv)
    o.sizes = [size_bytes(s) for s in o.sizes.split(",") if s]
    if not o.sizes:
        ap.error("--sizes: none given")
    for s in o.sizes:
        if s < 2 or s % 2:
            ap.error("--sizes: %d bytes: must be a positive even number (bytes of bf16)" % s)
    if len(set(o.sizes)) != len(o.sizes):
        ap.error("--sizes: %s: a size given twice" % ",".join(map(str, o.sizes)))
    if not 1 <= o.reps <= 1000:
        ap.error("--reps %d: must be 1..1000" % o.reps)
    if len(o.label.split(",")) != 2:
        ap.error("--label %r: must be LAYOUT,RATE" % o.label)
    o.colls = o.colls.split(",")
    for c in o.colls:
        if c not in ("allgather", "reducescatter"):
            ap.error("--colls: %r is not allgather or reducescatter" % c)
    if len(set(o.colls)) != len(o.colls):
        ap.error("--colls: %s: a collective given twice" % ",".join(o.colls))
    return o


# ---- data -------------------------------------------------------------------


def chunk(seed: int, n: int, r: int, j: int, m: int):
    """Rank r's j-th chunk (m elements) of the size-n tensor: a bf16 tensor."""
    import torch

    g = np.random.default_rng([seed, n, r, j])
    return torch.from_numpy(g.standard_normal(m, dtype=np.float32)).to(torch.bfloat16)


def f64(t) -> np.ndarray:
    import torch

    return t.to(torch.float64).numpy()


def bf16_round(a: np.ndarray) -> np.ndarray:
    """float32 array -> the bf16 values (nearest even), as float32."""
    import torch

    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)).to(
        torch.bfloat16).to(torch.float32).numpy()


def same_bits(a, b) -> bool:
    import torch

    return a.dtype == b.dtype and a.shape == b.shape and bool(torch.equal(
        a.view(torch.int16) if a.dtype == torch.bfloat16 else a.view(torch.int32),
        b.view(torch.int16) if b.dtype == torch.bfloat16 else b.view(torch.int32)))


class Check:
    def __init__(self):
        self.wrong = 0
        self.checked = 0
        self.max_err = 0.0

    def add(self, got: np.ndarray, ref: np.ndarray, ok: np.ndarray) -> None:
        self.checked += ok.size
        self.wrong += int(ok.size - np.count_nonzero(ok))
        if got.size:
            e = np.abs(got - ref)
            self.max_err = max(self.max_err, float(np.inf if np.isnan(e).any() else e.max()))


# ---- the checks ------------------------------------------------------------------


def quant_bound(scale, rng, x, out, bf16_out: bool):
    """zpp_bench_quant_bound (docs/format.md, "Error bound")."""
    b = scale * (0.5 + 2.0 ** -12) + 2.0 ** -22 * (np.abs(x) + rng) + 2.0 ** -149
    if bf16_out:
        b = b + np.abs(out) * 2.0 ** -8 + 1e-38
    return b


def block_params(x: np.ndarray, bits: int):
    """Per-block range and scale of a flat array cut into BLOCK-element
    blocks from its start (the last one shorter): arrays of x's shape."""
    n = x.size
    nb = -(-n // BLOCK)
    pad = np.zeros(nb * BLOCK)
    pad[:n] = np.abs(x)
    rng = np.repeat(pad.reshape(nb, BLOCK).max(axis=1), BLOCK)[:n]
    return rng / ((1 << (bits - 1)) - 1) * (1 + 2.0 ** -23), rng


def check_allgather(variant, out, shards, chk: Check) -> None:
    import torch

    m = shards[0].numel()
    for r, x in enumerate(shards):
        got_t = out[r * m:(r + 1) * m]
        if variant == "zpp-qwz8":
            xs, got = f64(x), f64(got_t)
            scale, rng = block_params(xs, 8)
            chk.add(got, xs, np.abs(got - xs) <= quant_bound(scale, rng, xs, got, True))
        else:
            want = x if got_t.dtype == torch.bfloat16 else x.to(got_t.dtype)
            got, xs = f64(got_t), f64(want)
            eq = (got_t.view(torch.int16) == want.view(torch.int16)) if got_t.dtype == \
                torch.bfloat16 else (got_t.view(torch.int32) == want.view(torch.int32))
            chk.add(got, xs, eq.numpy())


def rs_gloo_bound(got, xs: list, divisions: int, pre: bool, fp32: bool):
    """(float64 mean, per-element bound) of gloo's mean of xs (float64
    arrays of bf16 values) as got (float64 array of the output): the sum
    in any order (gamma_{W-1}), each input divided first when pre, and
    ``divisions`` roundings of divisions of the result.  The divisions
    are FSDP2's: its factors multiply to W (pre * post = W, or AVG alone),
    so the exact result of every plan is the mean; a plan whose factors
    did not would be checked against the wrong value."""
    w = len(xs)
    u = 2.0 ** -24 if fp32 else 2.0 ** -8 + 2.0 ** -24
    tiny = 2.0 ** -150 if fp32 else 2.0 ** -134
    gamma = (w - 1) * u / (1 - (w - 1) * u)
    ref = np.zeros(xs[0].size)
    abssum = np.zeros(xs[0].size)
    for x in xs:
        ref += x
        abssum += np.abs(x)
    ref /= w
    bound = (gamma * abssum + (w - 1) * tiny) / w
    if pre:  # each input divided before the sum: one more rounding each
        bound += u * abssum / w + tiny
    bound += divisions * ((u + 2.0 ** -24) * np.abs(got) + tiny)
    return ref, bound


def check_rs_gloo(out, xs: list, divisions: int, pre: bool, fp32: bool, chk: Check) -> None:
    # against the mean: assumes FSDP2's pre * post = W (rs_gloo_bound)
    got = f64(out)
    ref, bound = rs_gloo_bound(got, xs, divisions, pre, fp32)
    chk.add(got, ref, np.abs(got - ref) <= bound)


def check_rs_zpp_bf16(out, xs32: list, node_of: list, hier: bool, chk: Check) -> None:
    """Bitwise against the documented order (rs_check_base of zpp-bench)."""
    w = len(xs32)
    nodes = sorted(set(node_of)) if hier else [None]
    acc = None
    for k in nodes:
        part = None
        for r in range(w):
            if hier and node_of[r] != k:
                continue
            part = xs32[r].copy() if part is None else (part + xs32[r]).astype(np.float32)
        if hier:
            part = bf16_round(part)
        acc = part if acc is None else (acc + part).astype(np.float32)
    want = bf16_round((acc / np.float32(w)).astype(np.float32))
    got = f64(out)
    ref = sum(x.astype(np.float64) for x in xs32) / w
    import torch

    want_t = torch.from_numpy(want).to(torch.bfloat16)
    chk.add(got, ref, (out.view(torch.int16) == want_t.view(torch.int16)).numpy())


def rs_qgz_bound(got, xs: list, node_of: list, me: int, bits1: int, bits2: int):
    """(float64 mean, per-element bound): the two-stage bound of
    docs/collectives.md (rs_check_qgz of zpp-bench), MEAN, bf16 output
    (got: float64 array of it); blocks of BLOCK elements from the slice's
    start."""
    w = len(xs)
    nodes = sorted(set(node_of))
    m = len(nodes)
    counts = [node_of.count(k) for k in nodes]
    local_of = [node_of[:r].count(node_of[r]) for r in range(w)]
    two = len(set(counts)) == 1 and m > 1
    n = xs[0].size
    s = np.zeros(n)
    h1sum = np.zeros(n)
    abssum = np.zeros(n)
    u = {k: np.zeros(n) for k in nodes}
    for r in range(w):
        x = xs[r]
        q1 = bits1 and (local_of[r] != local_of[me] if two else r != me)
        h1 = 0.0
        if q1:
            scale, rng = block_params(x, bits1)
            h1 = quant_bound(scale, rng, x, 0.0, False)
        s += x
        h1sum += h1
        abssum += np.abs(x)
        u[node_of[r]] += np.abs(x) + h1
    h2 = np.zeros(n)
    levels2 = (1 << (bits2 - 1)) - 1
    for k in nodes if two else []:
        if k == node_of[me]:
            continue
        nb = -(-n // BLOCK)
        pad = np.zeros(nb * BLOCK)
        pad[:n] = u[k]
        rng2 = np.repeat(pad.reshape(nb, BLOCK).max(axis=1), BLOCK)[:n]
        scale2 = rng2 / levels2 * (1 + 2.0 ** -22)
        h2 += quant_bound(scale2, rng2, u[k], 0.0, False)
    acc = (w + m) * 2.0 ** -23 * (abssum + h1sum + h2)
    bound = (h1sum + h2 + acc) / w + 2.0 ** -24 * np.abs(got)
    bound += 2.0 ** -8 * np.abs(got) + 1e-30
    return s / w, bound


def check_rs_qgz(out, xs: list, node_of: list, me: int, bits1: int, bits2: int,
                 chk: Check) -> None:
    got = f64(out)
    ref, bound = rs_qgz_bound(got, xs, node_of, me, bits1, bits2)
    chk.add(got, ref, np.abs(got - ref) <= bound)


# ---- the run -----------------------------------------------------------------------


def fsdp2_rs_plan(pg, dtype):
    """(pre_factor, post_factor, op, words): what FSDP2 does around its
    reduce-scatter for this group and reduce dtype."""
    import torch.distributed as dist

    try:
        from torch.distributed.fsdp._fully_shard._fsdp_collectives import (
            _get_gradient_divide_factors)

        pre, post, op, _ = _get_gradient_divide_factors(pg, None, dtype, "cpu")
        how = "FSDP2's _get_gradient_divide_factors"
    except Exception as e:  # (private: another torch may lack it)
        pre, post, op = None, float(pg.size()), dist.ReduceOp.SUM
        # (a row's call field: no commas, one line)
        why = " ".join(("%s: %s" % (type(e).__name__, e)).replace(",", ";").split())
        how = "SUM then / W: FSDP2's _get_gradient_divide_factors failed: %s" % why
        if pg.rank() == 0:
            print("gloo_peer.py: %s" % how, file=sys.stderr, flush=True)
    name = str(op).split(".")[-1].replace("RedOpType", "")
    words = "reduce_scatter_tensor op=%s" % name
    if pre:
        words += " pre/%g" % pre
    if post:
        words += " then /%g" % post
    return pre, post, op, words + " (%s)" % how


def main(argv=None) -> int:
    o = parse_args(argv)
    import torch
    import torch.distributed as dist

    import zpp

    torch.set_num_threads(1)  # W ranks share the machine's cores
    tmo = float(os.environ.get("ZPP_TIMEOUT_S", "300") or 300)
    zpp.init_process_group("gloo", timeout=datetime.timedelta(seconds=tmo if tmo > 0 else 1800))
    rank, w = dist.get_rank(), dist.get_world_size()
    for size in o.sizes:  # every size before any call (every rank alike)
        if size // 2 % w or size < 2 * w:
            if rank == 0:
                print("gloo_peer.py: --sizes: %d bytes: %d bf16 elements, not a positive "
                      "multiple of the %d ranks" % (size, size // 2, w), file=sys.stderr)
            dist.destroy_process_group()
            return 2
    comm = zpp.Comm.from_mpi()
    node_of = [comm.node_of(r) for r in range(w)]
    nnodes = comm.nnodes
    hier = comm.algorithm == "hier" and 1 < nnodes < w
    zmode = "zpp %s %s %s %s" % (".".join(map(str, zpp.version())), comm.backend,
                                 comm.algorithm,
                                 "emulated" if comm.topology_emulated else "discovered")
    gmode = "torch %s gloo" % torch.__version__
    pg = dist.group.WORLD
    plans = {dt: fsdp2_rs_plan(pg, dt) for dt in (torch.bfloat16, torch.float32)}
    layout, rate = o.label.split(",")
    if rank == 0 and o.header:
        print(HEADER, flush=True)
    wrong = 0
    for size in o.sizes:
        n = size // 2
        m = n // w
        for coll in o.colls:
            rows = run_coll(o, coll, n, m, rank, w, comm, pg, plans, node_of, hier)
            gathered = [None] * w
            dist.all_gather_object(gathered, rows, group=pg)
            wrong += sum(rec["wrong"] for g in gathered for rec in g.values())
            if rank != 0:
                continue
            for key in rows:
                variant, rep = key
                recs = [g[key] for g in gathered]
                node_bytes = {}
                for r, rec in enumerate(recs):
                    node_bytes[node_of[r]] = node_bytes.get(node_of[r], 0) + rec["inter"]
                impl = gmode if variant.startswith("gloo") else zmode
                call = rows[key]["call"]
                link = max(node_bytes.values()) if variant.startswith("zpp") else ""
                print(",".join(str(v) for v in (
                    layout, rate, coll, variant, impl, call,
                    "fp32" if variant.endswith("fp32") else "bf16",
                    size, n, w, nnodes, rep,
                    "%.1f" % (max(r_["time"] for r_ in recs) * 1e6),
                    sum(r_["wrong"] for r_ in recs), sum(r_["checked"] for r_ in recs),
                    "%.3g" % max(r_["max_err"] for r_ in recs), link)), flush=True)
    comm.close()
    dist.destroy_process_group()
    if wrong:  # (every rank: mpirun's status is the first non-zero one)
        if rank == 0:
            print("gloo_peer.py: %d wrong elements (the rows' wrong column)" % wrong,
                  file=sys.stderr)
        return 3
    return 0


def run_coll(o, coll, n, m, rank, w, comm, pg, plans, node_of, hier):
    """{(variant, rep): record} of this rank for one size and collective."""
    import torch
    import torch.distributed as dist

    variants = AG_VARIANTS if coll == "allgather" else RS_VARIANTS
    if coll == "allgather":
        shards = [chunk(o.seed, n, r, r, m) for r in range(w)]
        send = {"bf16": shards[rank], "fp32": shards[rank].to(torch.float32)}
        outs = {v: torch.empty(n, dtype=torch.float32 if v.endswith("fp32") else torch.bfloat16)
                for v in variants}
        calls = {
            "gloo-bf16": (lambda: dist.all_gather_into_tensor(outs["gloo-bf16"], send["bf16"]),
                          "all_gather_into_tensor"),
            "gloo-fp32": (lambda: dist.all_gather_into_tensor(outs["gloo-fp32"], send["fp32"]),
                          "all_gather_into_tensor"),
            "zpp-bf16": (lambda: comm.allgather(send["bf16"], outs["zpp-bf16"]),
                         "Comm.allgather"),
            "zpp-qwz8": (lambda: comm.qwz_allgather(send["bf16"], outs["zpp-qwz8"], bits=8,
                                                    block=BLOCK),
                         "Comm.qwz_allgather bits=8 block=%d" % BLOCK),
        }

        def check(v, chk):
            check_allgather(v, outs[v], shards, chk)
    else:
        mine = torch.cat([chunk(o.seed, n, rank, j, m) for j in range(w)])
        # every rank's chunk of my slice, for the checks
        parts = [chunk(o.seed, n, r, rank, m) for r in range(w)]
        xs = [f64(p) for p in parts]
        xs32 = [p.to(torch.float32).numpy() for p in parts]
        send = {"bf16": mine, "fp32": mine.to(torch.float32)}
        outs = {v: torch.empty(m, dtype=torch.float32 if v.endswith("fp32") else torch.bfloat16)
                for v in variants}
        # the summation order is the family's this call runs: under auto
        # (the default) the one zpp chooses for m bf16 elements per rank
        rs_hier = hier
        if comm.algorithm == "auto" and 1 < len(set(node_of)) < w:
            rs_hier = comm.choose_algorithm("reduce_scatter", m, "bfloat16")[0] == "hier"

        def gloo_rs(dt):
            pre, post, op, _ = plans[torch.float32 if dt == "fp32" else torch.bfloat16]
            x = send[dt]
            if pre:
                x = x / pre  # (FSDP2 divides its own buffer; a copy keeps the input)
            dist.reduce_scatter_tensor(outs["gloo-" + dt], x, op=op)
            if post:
                outs["gloo-" + dt].div_(post)

        calls = {
            "gloo-bf16": (lambda: gloo_rs("bf16"), plans[torch.bfloat16][3]),
            "gloo-fp32": (lambda: gloo_rs("fp32"), plans[torch.float32][3]),
            "zpp-bf16": (lambda: comm.reduce_scatter(send["bf16"], outs["zpp-bf16"], op="mean"),
                         "Comm.reduce_scatter op=mean"),
            "zpp-qgz4": (lambda: comm.qgz_reduce_scatter(send["bf16"], outs["zpp-qgz4"],
                                                         op="mean", intra_bits=4,
                                                         inter_bits=4, block=BLOCK),
                         "Comm.qgz_reduce_scatter op=mean intra=4 inter=4 block=%d" % BLOCK),
        }

        def check(v, chk):
            if v.startswith("gloo"):
                pre, post, op, _ = plans[torch.float32 if v.endswith("fp32") else torch.bfloat16]
                divisions = (1 if str(op).endswith("AVG") else 0) + (1 if post else 0)
                check_rs_gloo(outs[v], xs, divisions, bool(pre), v.endswith("fp32"), chk)
            elif v == "zpp-bf16":
                check_rs_zpp_bf16(outs[v], xs32, node_of, rs_hier, chk)
            else:
                check_rs_qgz(outs[v], xs, node_of, rank, 4, 4, chk)
    rec = {}
    first = {}
    base = {}
    warm = {v: Check() for v in variants}  # later untimed calls unlike the first
    for v in variants:  # the untimed calls of each: the first checked in full
        for k in range(UNTIMED):
            outs[v].fill_(float("nan"))
            comm.reset_stats()
            dist.barrier()
            calls[v][0]()
            if k == 0:
                inter = comm.stats()["inter_bytes_sent"] if v.startswith("zpp") else 0
                chk = Check()
                check(v, chk)
                first[v] = outs[v].clone()
                base[v] = (chk, inter)
            elif not same_bits(outs[v], first[v]):
                check(v, warm[v])
    for rep in range(1, o.reps + 1):
        k = (rep - 1) % len(variants)
        for v in variants[k:] + variants[:k]:
            outs[v].fill_(float("nan"))
            dist.barrier()
            t0 = time.perf_counter()
            calls[v][0]()
            t = time.perf_counter() - t0
            chk, inter = base[v]
            if not same_bits(outs[v], first[v]):
                chk = Check()
                check(v, chk)
            if rep == 1:  # a warm-up call unlike the first counts in the first row
                both = Check()
                both.wrong, both.checked = chk.wrong + warm[v].wrong, chk.checked + warm[v].checked
                both.max_err = max(chk.max_err, warm[v].max_err)
                chk = both
            rec[(v, rep)] = {"time": t, "wrong": chk.wrong, "checked": chk.checked,
                             "max_err": chk.max_err, "inter": inter, "call": calls[v][1]}
    return rec


if __name__ == "__main__":
    sys.exit(main())
