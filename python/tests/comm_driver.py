"""Multi-rank driver of test_comm.py: zpp.Comm collectives on numpy and
torch against references computed here (every rank generates every rank's
data from the seed).  Prints one JSON line (rank 0) with what it checked;
exits non-zero on a failed check."""
import json
import os
import sys

import numpy as np
import torch

import zpp

SEED = int(os.environ.get("ZPP_TEST_SEED", "20261130"))


def data(r, n, tag):
    return np.random.default_rng(SEED * 1000 + tag * 100 + r).standard_normal(n).astype(np.float32)


def main():
    how = sys.argv[1]
    comm = {"mpi": zpp.Comm.from_mpi, "env": zpp.Comm.from_env}[how]()
    r, W = comm.rank, comm.size
    done = {"world": W, "nnodes": comm.nnodes, "backend": comm.backend, "bootstrap": comm.bootstrap,
            "algorithm": comm.algorithm,
            "choice": list(comm.choose_algorithm("reduce_scatter", 1001, "bfloat16"))}
    n = 1001
    # all-gather, numpy fp32 and torch bf16: exact
    out = comm.allgather(data(r, n, 1))
    assert np.array_equal(out, np.concatenate([data(q, n, 1) for q in range(W)]))
    t = torch.from_numpy(data(r, n, 2)).to(torch.bfloat16)
    ref = torch.cat([torch.from_numpy(data(q, n, 2)).to(torch.bfloat16) for q in range(W)])
    assert torch.equal(comm.allgather(t), ref)
    # uint8, in place and asynchronous (as FSDP2 calls it)
    b = np.random.default_rng(SEED + r).integers(0, 256, 37, dtype=np.uint8)
    full = np.zeros(37 * W, np.uint8)
    full[r * 37:(r + 1) * 37] = b
    w = comm.allgather(full[r * 37:(r + 1) * 37], full, async_op=True)
    w.wait()
    for q in range(W):
        assert np.array_equal(full[q * 37:(q + 1) * 37],
                              np.random.default_rng(SEED + q).integers(0, 256, 37, dtype=np.uint8))
    # reduce-scatter sum: fp32 additions in the order docs/collectives.md
    # fixes, so equal to the same sum done here in fp32.  Several nodes
    # (the hierarchical default): each node's ranks in order, that partial
    # rounded to the dtype, then the nodes in order; one node: rank order.
    # (ZPP_ALGO=flat would be rank order everywhere.)
    x = [data(q, n * W, 3) for q in range(W)]
    acc = None
    for m in sorted({comm.node_of(q) for q in range(W)}):
        part = None
        for q in (q for q in range(W) if comm.node_of(q) == m):
            part = x[q].copy() if part is None else (part + x[q]).astype(np.float32)
        acc = part if acc is None else (acc + part).astype(np.float32)
    if comm.nnodes > 1:  # the order matters here: rank order must differ
        flat = x[0].copy()
        for q in range(1, W):
            flat = (flat + x[q]).astype(np.float32)
        done["rank_order_differs"] = bool(np.any(flat != acc))
    got = comm.reduce_scatter(x[r], op="sum")
    assert np.array_equal(got, acc[r * n:(r + 1) * n])
    mean = comm.reduce_scatter(torch.from_numpy(x[r]), op="mean")
    assert torch.equal(mean, torch.from_numpy((acc / np.float32(W)).astype(np.float32)[r * n:(r + 1) * n]))
    # qwZ INT8: every rank bitwise the same, each shard equal to the local
    # codec's round trip
    q8 = comm.qwz_allgather(data(r, n, 4), bits=8, block=64)
    for q in range(W):
        enc = zpp.quant.encode(data(q, n, 4), bits=8, block=64)
        assert np.array_equal(q8[q * n:(q + 1) * n], zpp.quant.decode(enc, n, bits=8, block=64))
    # in place, as FSDP2 calls it (send is my slot of out): the same bytes
    buf = np.zeros(n * W, np.float32)
    buf[r * n:(r + 1) * n] = data(r, n, 4)
    comm.qwz_allgather(buf[r * n:(r + 1) * n], buf, bits=8, block=64)
    assert np.array_equal(buf, q8)
    # qgZ INT4 mean against the float64 mean.  Bound (docs/collectives.md:
    # two encodes): stage 1 adds at most half a step of each rank's block
    # scale, stage 2 half a step of the partial sum's: with A = max |x|,
    # scale <= A/7 and <= W A/7, |sum error| <= W A/14 + nnodes W A/14.
    ref64 = np.mean(np.stack(x).astype(np.float64), axis=0)[r * n:(r + 1) * n]
    A = max(float(np.max(np.abs(v))) for v in x)
    bound = (W * A / 14 + comm.nnodes * W * A / 14) * 1.001 / W
    res = comm.qgz_residual(n)
    g4 = comm.qgz_reduce_scatter(x[r], op="mean", intra_bits=4, inter_bits=4, block=256,
                                 residual=res)
    err = float(np.max(np.abs(g4.astype(np.float64) - ref64)))
    assert err <= bound, (err, bound)
    assert np.any(res != 0)  # error feedback stored the compression error
    done["qgz_err_over_bound"] = err / bound
    # the raw intra-node stage (intra_bits 16): stage 1 exact, so only the
    # stage-2 half-step error of each node's partial sum (|p| <= S A) is
    # left, and the residual holds only the M stage-2 segments (these
    # layouts are uniform: 2x2, 2x1), none on one node; a sentinel past
    # them shows that nothing more is written
    for b in (4, 8):
        assert comm.qgz_residual_count(n, intra_bits=b) == (W + comm.nnodes) * n
    want16 = comm.nnodes * n if comm.nnodes > 1 else 0
    assert comm.qgz_residual_count(n, intra_bits=16) == want16, comm.qgz_residual_count(n, intra_bits=16)
    room = np.full(want16 + 64, 12345.5, np.float32)
    room[:want16] = 0
    res16 = room[:want16]
    g16 = comm.qgz_reduce_scatter(x[r], op="mean", intra_bits=16, inter_bits=4, block=256,
                                  residual=res16)
    err16 = float(np.max(np.abs(g16.astype(np.float64) - ref64)))
    bound16 = comm.nnodes * comm.local_size * A / 14 * 1.001 / W
    assert err16 <= bound16, (err16, bound16)
    assert want16 == 0 or np.any(res16 != 0)
    assert np.all(room[want16:] == 12345.5), "written past the residual"
    try:  # a residual sized for both stages is refused, naming the size
        comm.qgz_reduce_scatter(x[r], op="mean", intra_bits=16, residual=comm.qgz_residual(n))
        raise AssertionError("accepted a residual of the wrong size")
    except ValueError as e:
        assert "must be %d" % want16 in str(e) and "intra_bits 16" in str(e), e
    done["qgz16_err_over_bound"] = err16 / bound16
    # wrong inputs raise, naming the problem; the communicator still works
    for bad, pat in ((np.ones(W * 4, np.float64), "float64"), (torch.ones(W * 4, dtype=torch.int64), "int64")):
        try:
            comm.reduce_scatter(bad)
            raise AssertionError("accepted %s" % pat)
        except zpp.DtypeError as e:
            assert pat in str(e), e
    try:
        comm.allgather(torch.empty(4, device="meta"))
        raise AssertionError("accepted a meta tensor")
    except zpp.DeviceError as e:
        assert "meta" in str(e)
    try:
        comm.qwz_allgather(np.ones(4, np.uint8))
        raise AssertionError("qwZ accepted uint8")
    except zpp.DtypeError as e:
        assert "uint8" in str(e)
    # the C library's own argument check, through the error path
    try:
        comm.qwz_allgather(np.ones(4, np.float32), bits=3)
        raise AssertionError("accepted bits 3")
    except zpp.Error as e:
        assert e.status == "ZPP_ERR_INVALID_ARGUMENT" and "bits 3" in str(e)
    # subsets: the ranks of my node, by a split and by a list
    node = comm.split(comm.node_of(r), r)
    assert node.size == comm.local_size and node.nnodes == 1
    first = comm.from_ranks([0, W - 1])
    assert (first is None) == (r not in (0, W - 1))
    s = node.allgather(np.full(3, r, np.float32))
    assert sorted(set(s.tolist())) == sorted(q for q in range(W) if comm.node_of(q) == comm.node_of(r))
    # one node, intra 16: nothing quantized, a residual of 0 floats (and
    # only that) accepted, synchronously and asynchronously; the result is
    # the fp32 sum of the node's ranks (S - 1 additions of relative 2^-24)
    S, me = node.size, node.rank
    members = [q for q in range(W) if comm.node_of(q) == comm.node_of(r)]
    assert node.qgz_residual_count(n, intra_bits=16) == 0
    y = data(100 + r, n * S, 7)
    ys = [data(100 + q, n * S, 7)[me * n:(me + 1) * n].astype(np.float64) for q in members]
    ref = np.sum(ys, axis=0)
    tol = S * 2.0 ** -24 * np.sum(np.abs(ys), axis=0) + 1e-30
    for async_op in (False, True):
        got = np.zeros(n, np.float32)
        w = node.qgz_reduce_scatter(y, got, op="sum", intra_bits=16, async_op=async_op,
                                    residual=node.qgz_residual(n, intra_bits=16))
        if async_op:
            w.wait()
        assert np.all(np.abs(got.astype(np.float64) - ref) <= tol), (async_op, np.max(np.abs(got - ref)))
    try:
        node.qgz_reduce_scatter(y, op="sum", intra_bits=16, residual=np.zeros(1, np.float32))
        raise AssertionError("one node: accepted a residual of 1 float")
    except ValueError as e:
        assert "must be 0" in str(e), e
    if first is not None:
        first.close()
    node.close()
    st = comm.stats()
    done["inter_bytes_sent"] = st["inter_bytes_sent"]
    comm.close()
    if r == 0:
        print(json.dumps(done), flush=True)


if __name__ == "__main__":
    main()
