#!/usr/bin/env python3
"""Relative error and wire bytes of qgZ's two reductions (a float64 model).

Prints two markdown tables: for M nodes of S ranks (default 2x4), block
256, INT4/INT4 and INT8/INT4, normal, Laplace and outlier data (1% of the
elements 100 times larger), the relative error ||y - sum||_2 / ||sum||_2
of one rank's slice of the reduce-scatter, for
  - float: today's two-stage qgZ (zpp_qgz_config_t.sum FLOAT): every
    contribution encoded with its own block scale, decoded and summed in
    fp32 inside the node, the node's sum re-encoded with its own scale;
  - int: ZPP_QGZ_SUM_INT: per block a power-of-two unit agreed by the
    node, a per-rank 8-bit multiplier of it (rounded up: the step is at
    least the rank's own scale), integer sums, the integer sum re-quantized
    with an integer divisor for the network;
  - int, 4-bit m: the same with multipliers in [1, 15];
  - int, exact stage 2: the node's integer sum sent as it is;
  - one agreed scale: one scale per block for the whole node (the node's
    max), integer sums (the design the unit replaced);
  - one stage: a single quantization of each contribution with its own
    scale (the error of a flat qgZ, for reference);
then INT with the multiplier rounded to nearest (a step may lie below the
rank's scale and clamp its largest codes) and with the own share in 8 more
fractional bits, and the bytes per element each crosses the network
(stage 2) and moves inside the node (stage 1).  Rounding to nearest; fp64 arithmetic.  The
model follows docs/format.md ("Integer sums"); the library's own results
are checked against that section's bound by tests/test_qgz_int.cc.

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


def one_scale_mode(xs, S, M, b1, b2, block):
    """The node's ranks agree on each block's scale (the max absmax), codes
    summed as integers (the own slice in fixed point, 8 fractional bits),
    the sum re-quantized with an integer divisor (not built: it loses to
    the unit below)."""
    q1 = 2 ** (b1 - 1) - 1
    q2 = 2 ** (b2 - 1) - 1
    out = 0.0
    for n, node in enumerate(xs):
        xb = [x.reshape(-1, block) for x in node]
        amax = np.max([np.abs(x).max(axis=1, keepdims=True) for x in xb], axis=0)
        s = amax / q1
        s[s == 0] = 1.0
        i_sum = np.rint(np.clip(xb[0] / s, -q1, q1) * 256)
        for x in xb[1:]:
            i_sum = i_sum + 256 * np.clip(np.rint(x / s), -q1, q1)
        if n == 0:
            out = out + i_sum * s / 256
        else:
            m = np.abs(i_sum).max(axis=1, keepdims=True)
            d = np.maximum(np.ceil(m / q2), 1)
            out = out + np.rint(i_sum / d) * d * s / 256
    return out.reshape(-1)


def unit_mode(xs, S, M, b1, b2, block, mmax=255, exact_stage2=False,
              mult=np.ceil, own_frac=0):
    """ZPP_QGZ_SUM_INT: per block a power-of-two unit u = 2^E, E the max
    over the node of the smallest e with s_r <= mmax 2^e (s_r = the rank's
    own absmax / qmax1); rank r's multiplier m_r = clamp(ceil(s_r / u), 1,
    mmax) (mult: ceil, or rint for the alternative whose step may lie
    below s_r) and codes clamp(rint(x / (m_r u)), +-qmax1); the node's sum
    I = own rint(x / u) + sum m_r q_r, an integer in units of u (own_frac
    > 0: the own share in units of u / 2^own_frac instead); stage 2
    re-quantizes I with the divisor d = ceil(max|I| / qmax2) (or, with
    exact_stage2, sends I as it is)."""
    q1 = 2 ** (b1 - 1) - 1
    q2 = 2 ** (b2 - 1) - 1
    out = 0.0
    for n, node in enumerate(xs):
        xb = [x.reshape(-1, block) for x in node]
        s = [np.abs(x).max(axis=1, keepdims=True) / q1 for x in xb]
        with np.errstate(divide="ignore"):
            e = [np.ceil(np.log2(si / mmax)) for si in s]
        E = np.max(e, axis=0)
        E[~np.isfinite(E)] = 0
        u = np.exp2(E)
        f = 2.0 ** own_frac
        i_sum = np.rint(xb[0] / u * f) / f
        for x, si in zip(xb[1:], s[1:]):
            m = np.clip(mult(si / u), 1, mmax)
            i_sum = i_sum + m * np.clip(np.rint(x / (m * u)), -q1, q1)
        if n == 0 or exact_stage2:
            out = out + i_sum * u
        else:
            d = np.maximum(np.ceil(np.abs(i_sum).max(axis=1, keepdims=True)
                                   / q2), 1)
            out = out + np.rint(i_sum / d) * d * u
    return out.reshape(-1)


def one_stage(xs, b1, block):
    allx = [x for node in xs for x in node]
    return allx[0] + sum(q_own(x, b1, block) for x in allx[1:])


def gen(rng, dist, n):
    if dist == "normal":
        return rng.standard_normal(n)
    if dist == "laplace":
        return rng.laplace(0.0, 1.0 / math.sqrt(2.0), n)
    # outliers: 1% of the elements 100 times larger
    return rng.standard_normal(n) * np.where(rng.random(n) < 0.01, 100.0, 1.0)


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
    print("| data | bits | float | int | int, 4-bit m | int, exact stage 2 | "
          "one agreed scale | one stage |")
    print("|---|---|---|---|---|---|---|---|")
    alt = []
    for dist in ("normal", "laplace", "outlier"):
        for b1, b2 in ((4, 4), (8, 4)):
            xs = [[gen(rng, dist, N) for _ in range(S)] for _ in range(M)]
            exact = sum(x for node in xs for x in node)
            nrm = np.linalg.norm(exact)
            err = lambda y: np.linalg.norm(y - exact) / nrm
            r = (err(float_mode(xs, S, M, b1, b2, B)),
                 err(unit_mode(xs, S, M, b1, b2, B)),
                 err(unit_mode(xs, S, M, b1, b2, B, mmax=15)),
                 err(unit_mode(xs, S, M, b1, b2, B, exact_stage2=True)),
                 err(one_scale_mode(xs, S, M, b1, b2, B)),
                 err(one_stage(xs, b1, B)))
            print(f"| {dist} | INT{b1}/INT{b2} | " +
                  " | ".join(f"{v:.4f}" for v in r) + " |")
            alt.append((dist, b1, b2, r[1],
                        err(unit_mode(xs, S, M, b1, b2, B, mult=np.rint)),
                        err(unit_mode(xs, S, M, b1, b2, B, own_frac=8))))
    print("\nINT's alternatives (the same data):\n")
    print("| data | bits | int (m = ceil) | m = rint | own share, 8 more "
          "fractional bits |")
    print("|---|---|---|---|---|")
    for dist, b1, b2, a, b, c in alt:
        print(f"| {dist} | INT{b1}/INT{b2} | {a:.4f} | {b:.4f} | {c:.4f} |")
    print("\nBytes per element (block B, S ranks per node):\n")
    print("| bits | inter float | inter int | inter int, exact stage 2 | "
          "intra float | intra int | intra int, 4-bit m |")
    print("|---|---|---|---|---|---|---|")
    for b1, b2 in ((4, 4), (8, 4)):
        q1 = 2 ** (b1 - 1) - 1
        # exact stage 2: the sum of S terms of |m q| <= 255 qmax1, signed,
        # plus the unit's exponent (1 byte per block)
        abits = math.ceil(math.log2(2 * S * 255 * q1 + 1))
        inter = b2 / 8 + 4 / B
        inter_a = abits / 8 + 1 / B
        intra_f = b1 / 8 + 4 / B
        # codes and one multiplier byte per block, plus the all-gather of
        # the exponents: one byte per block of each of the M*S slices, to
        # each of the S - 1 others, per element of one rank's M slices
        # sent: M*S/(M*B)
        intra_i = b1 / 8 + 1 / B + S / B
        intra_i4 = b1 / 8 + 0.5 / B + S / B
        print(f"| INT{b1}/INT{b2} | {inter:.4f} | {inter:.4f} | "
              f"{inter_a:.4f} ({abits} bits) | {intra_f:.4f} | "
              f"{intra_i:.4f} | {intra_i4:.4f} |")
    print("\ninter: bytes crossing the network per element of the partial "
          "sum sent (stage 2); intra: bytes inside the node per element of "
          "a slice sent (stage 1).")


if __name__ == "__main__":
    main()
