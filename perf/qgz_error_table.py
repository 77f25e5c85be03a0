#!/usr/bin/env python3
"""Relative error and wire bytes of qgZ's two reductions (a float64 model).

Prints a markdown table: for M nodes of S ranks (default 2x4), block 256,
INT4/INT4 and INT8/INT4, normal and Laplace data, the relative error
||y - sum||_2 / ||sum||_2 of one rank's slice of the reduce-scatter, for
  - float: today's two-stage qgZ (zpp_qgz_config_t.sum FLOAT): every
    contribution encoded with its own block scale, decoded and summed in
    fp32 inside the node, the node's sum re-encoded with its own scale;
  - int (b): ZPP_QGZ_SUM_INT as built: the node's ranks agree on each
    block's scale (the max), codes summed as integers (the rank's own slice
    in fixed point, 8 fractional bits), the integer sum re-quantized with an
    integer divisor d = ceil(max|I| / qmax2) for the network;
  - int (a): the alternative stage 2 (not built): the node's integer sum
    sent exactly, in the bits it needs, with the block scale;
  - one stage: a single quantization of each contribution with its own
    scale (the error of a flat qgZ, for reference);
and the bytes per element each crosses the network (stage 2) and moves
inside the node (stage 1).  Rounding to nearest; fp32 data.  The model
follows docs/format.md ("Integer sums") and docs/collectives.md; the
library's own results are checked against the same model's bound by
tests/test_qgz_int.cc.

usage: perf/qgz_error_table.py [--nodes M] [--ranks S] [--count N]
                               [--block B] [--seed X]
"""
import argparse
import math

import numpy as np


def q_own(x, bits, block):
    """Each block with its own symmetric scale; decoded values."""
    qmax = 2 ** (bits - 1) - 1
    xb = x.reshape(-1, block)
    s = np.abs(xb).max(axis=1, keepdims=True) / qmax
    s[s == 0] = 1.0
    return (np.clip(np.rint(xb / s), -qmax, qmax) * s).reshape(x.shape)


def float_mode(xs, S, M, b1, b2, block):
    """xs[n][r]: slice of rank r of node n. Two stages, decode-add-encode."""
    parts = [sum(q_own(x, b1, block) if r > 0 else x
                 for r, x in enumerate(node)) for node in xs]
    return parts[0] + sum(q_own(p, b2, block) for p in parts[1:])


def int_mode(xs, S, M, b1, b2, block, exact_stage2=False):
    q1 = 2 ** (b1 - 1) - 1
    q2 = 2 ** (b2 - 1) - 1
    out = 0.0
    for n, node in enumerate(xs):
        xb = [x.reshape(-1, block) for x in node]
        amax = np.max([np.abs(x).max(axis=1, keepdims=True) for x in xb], axis=0)
        s = amax / q1
        s[s == 0] = 1.0
        # own (r = 0) in fixed point, the others as codes
        i_sum = np.rint(np.clip(xb[0] / s, -q1, q1) * 256)
        for x in xb[1:]:
            i_sum = i_sum + 256 * np.clip(np.rint(x / s), -q1, q1)
        if n == 0 or exact_stage2:
            out = out + i_sum * s / 256
        else:
            m = np.abs(i_sum).max(axis=1, keepdims=True)
            d = np.maximum(np.ceil(m / q2), 1)
            code = np.rint(i_sum / d)
            out = out + code * d * s / 256
    return out.reshape(-1)


def one_stage(xs, b1, block):
    allx = [x for node in xs for x in node]
    return allx[0] + sum(q_own(x, b1, block) for x in allx[1:])


def gen(rng, dist, n):
    if dist == "normal":
        return rng.standard_normal(n)
    return rng.laplace(0.0, 1.0 / math.sqrt(2.0), n)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--count", type=int, default=1 << 16)
    ap.add_argument("--block", type=int, default=256)
    ap.add_argument("--seed", type=int, default=20261129)
    a = ap.parse_args()
    M, S, N, B = a.nodes, a.ranks, a.count, a.block
    rng = np.random.default_rng(a.seed)
    print(f"qgZ relative error, {M}x{S}, block {B}, {N} elements per slice, "
          f"seed {a.seed} (perf/qgz_error_table.py)\n")
    print("| data | bits | float | int (b) | int (a) | one stage | "
          "inter B/elem float, int (b) | int (a) | intra B/elem float | int |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for dist in ("normal", "laplace"):
        for b1, b2 in ((4, 4), (8, 4)):
            xs = [[gen(rng, dist, N) for _ in range(S)] for _ in range(M)]
            exact = sum(x for node in xs for x in node)
            nrm = np.linalg.norm(exact)
            err = lambda y: np.linalg.norm(y - exact) / nrm
            ef = err(float_mode(xs, S, M, b1, b2, B))
            eib = err(int_mode(xs, S, M, b1, b2, B))
            eia = err(int_mode(xs, S, M, b1, b2, B, exact_stage2=True))
            e1 = err(one_stage(xs, b1, B))
            q1 = 2 ** (b1 - 1) - 1
            # option (a): the integer sum of S codes (the own share rounded
            # to a code for the wire), signed, plus the block's scale
            abits = math.ceil(math.log2(2 * S * q1 + 1))
            inter_f = b2 / 8 + 4 / B
            inter_a = abits / 8 + 4 / B
            intra_f = b1 / 8 + 4 / B
            # codes, plus the all-gather of the absmax: one fp32 per block
            # of each of the M*S slices, to each of the S - 1 others,
            # per element of one rank's M slices sent: M*S/(M*B)
            intra_i = b1 / 8 + 4 * S / B
            print(f"| {dist} | INT{b1}/INT{b2} | {ef:.4f} | {eib:.4f} | "
                  f"{eia:.4f} | {e1:.4f} | {inter_f:.4f} | {inter_a:.4f} "
                  f"({abits} bits) | {intra_f:.4f} | {intra_i:.4f} |")
    print("\ninter B/elem: bytes crossing the network per element of the "
          "partial sum sent (stage 2); intra B/elem: bytes inside the node per "
          "element of a slice sent (stage 1).")


if __name__ == "__main__":
    main()
