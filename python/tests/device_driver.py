"""Multi-rank driver of test_device_emu.py: zpp.Comm on DEVICE memory
(``memory="device"``, arrays with ``__cuda_array_interface__``) on the
emulated CUDA runtime, against references computed here and against a
host-memory communicator of the same ranks running the same collectives
on the same data (same plan, same codec: the same bits).  Prints one JSON
line (rank 0); exits non-zero on a failed check.

    ZPP_TOPO=2x2 mpirun -np 4 python device_driver.py mpi|nccl
"""
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

import zpp
from emu_cuda import Cuda, Iface, find

SEED = int(os.environ.get("ZPP_TEST_SEED", "20261202"))


def data(r, n, tag, dtype=np.float32):
    return np.random.default_rng(SEED * 1000 + tag * 100 + r).standard_normal(n).astype(dtype)


def expect(exc, pat, fn):
    try:
        fn()
    except exc as e:
        assert pat in str(e), (pat, str(e))
        return str(e)
    raise AssertionError("no %s (%s)" % (exc.__name__, pat))


def main():
    backend = sys.argv[1]
    lr = int(os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", "0"))
    cu = Cuda(find(Path(os.environ["ZPP_BUILD_DIR"])))
    cu.set_device(lr)
    dev = zpp.Comm.from_mpi(memory="device", device=lr, backend=backend)
    host = zpp.Comm.from_mpi(backend="mpi")
    r, W = dev.rank, dev.size
    assert dev.memory == "device" and host.memory == "host"
    done = {"seed": SEED, "world": W, "nnodes": dev.nnodes, "backend": dev.backend}
    n = 1001  # odd: no multiple of 8 or of the world size

    # all-gather fp32, blocking, legacy default stream: exact
    out = dev.allgather(cu.array(data(r, n, 1)), cu.empty(n * W, np.float32))
    assert np.array_equal(out.get(), np.concatenate([data(q, n, 1) for q in range(W)]))
    # fp16 on a stream of our own, asynchronous: exact
    s = cu.stream()
    o16 = cu.empty(n * W, np.float16)
    w = dev.allgather(cu.array(data(r, n, 2, np.float16)), o16, async_op=True, stream=s)
    w.wait()
    assert np.array_equal(o16.get(), np.concatenate([data(q, n, 2, np.float16) for q in range(W)]))
    # the collective goes to the stream it is given, explicitly or named by
    # the arrays' __cuda_array_interface__: while that stream is held it
    # cannot complete (on the legacy default stream it would)
    for how in ("explicit", "interface"):
        s2 = cu.stream()
        cu.hold(s2)
        named = s2 if how == "interface" else None
        dst = cu.empty(n * W, np.float32, stream=named)
        w = dev.allgather(cu.array(data(r, n, 5), stream=named), dst, async_op=True,
                          stream=s2 if how == "explicit" else None)
        time.sleep(0.3)
        held = w.is_completed()
        cu.release(s2)
        w.wait()
        assert not held, how
        assert np.array_equal(dst.get(), np.concatenate([data(q, n, 5) for q in range(W)])), how
    # uint8 in place (send is my slot of out), as FSDP2 calls it
    b = [np.random.default_rng(SEED + q).integers(0, 256, 37, dtype=np.uint8) for q in range(W)]
    mine = np.zeros(37 * W, np.uint8)
    mine[r * 37:(r + 1) * 37] = b[r]
    full = cu.array(mine)
    dev.allgather(full.view(r * 37, 37), full, async_op=True).wait()
    assert np.array_equal(full.get(), np.concatenate(b))

    # reduce-scatter sum and mean: within the fp32 summation bound of the
    # float64 sum, |err| <= (W - 1) u sum|x| (u = 2^-24) plus one rounding
    # of each node's partial and of the result (2 u sum|x|); on MPI staging
    # bitwise the host communicator's (the same fixed order,
    # docs/collectives.md); on NCCL the sum is NCCL's (ring order)
    x = [data(q, n * W, 3) for q in range(W)]
    sl = slice(r * n, (r + 1) * n)
    exact = np.sum(np.stack(x).astype(np.float64), axis=0)[sl]
    absum = np.sum(np.abs(np.stack(x).astype(np.float64)), axis=0)[sl]
    for op, div in (("sum", 1), ("mean", W)):
        got = dev.reduce_scatter(cu.array(x[r]), cu.empty(n, np.float32), op=op).get()
        err = np.abs(got.astype(np.float64) - exact / div)
        assert np.all(err <= (W + 1) * 2.0 ** -24 * absum / div + 1e-30), (op, float(np.max(err)))
        if backend == "mpi":
            assert np.array_equal(got, host.reduce_scatter(x[r], op=op)), op

    # qwZ INT8 and INT4: the host communicator's bits, every shard within
    # half a step of its block's scale (symmetric: absmax / (2^(b-1) - 1))
    for bits in (8, 4):
        dev.reset_stats()
        host.reset_stats()
        q = dev.qwz_allgather(cu.array(data(r, n, 4)), cu.empty(n * W, np.float32),
                              bits=bits, block=64).get()
        qh = host.qwz_allgather(data(r, n, 4), bits=bits, block=64)
        assert np.array_equal(q, qh), bits
        full = np.concatenate([data(p, n, 4) for p in range(W)])
        for p in range(W):
            v, g = full[p * n:(p + 1) * n], q[p * n:(p + 1) * n]
            for k in range(0, n, 64):
                step = float(np.max(np.abs(v[k:k + 64]))) / (2 ** (bits - 1) - 1)
                assert np.max(np.abs(g[k:k + 64] - v[k:k + 64])) <= step / 2 * (1 + 1e-5) + 1e-30
        # staging runs the host's plan: the same exact byte counters; NCCL
        # runs the byte gather as ncclAllGather, whose counts are derived
        # (a ring in ring order, docs/design.md "NCCL backend") and flagged
        inter = dev.stats()["inter_bytes_sent"]
        if backend == "mpi":
            assert inter == host.stats()["inter_bytes_sent"], (inter, host.stats())
            assert (inter > 0) == (dev.nnodes > 1), inter
        else:
            assert dev.stats()["bytes_derived"], dev.stats()
    done["qwz_inter_bytes_sent"] = dev.stats()["inter_bytes_sent"]

    # qgZ 8/4 mean with error feedback on a device residual, two steps, and
    # with the Hadamard rotation: output and residual bitwise the host's
    res_d = cu.zeros(dev.qgz_residual_count(n), np.float32)
    res_h = host.qgz_residual(n)
    for step in range(2):
        xs = data(r, n * W, 10 + step)
        g = dev.qgz_reduce_scatter(cu.array(xs), cu.empty(n, np.float32), intra_bits=8,
                                   inter_bits=4, residual=res_d).get()
        gh = host.qgz_reduce_scatter(xs, intra_bits=8, inter_bits=4, residual=res_h)
        assert np.array_equal(g, gh), step
        assert np.array_equal(res_d.get(), res_h), step
    # a rank's own share skips the quantizer (docs/collectives.md), so on
    # one rank nothing is compressed and the residual stays zero
    assert np.any(res_h != 0) == (W > 1), (W, np.count_nonzero(res_h))
    xs = data(r, n * W, 12)
    g = dev.qgz_reduce_scatter(cu.array(xs), cu.empty(n, np.float32), hadamard=32).get()
    assert np.array_equal(g, host.qgz_reduce_scatter(xs, hadamard=32))

    # wrong memory, dtype, layout: Python exceptions naming the argument;
    # both communicators still work after
    cu.set_device((lr + 1) % 8)  # the emulator's 8 devices (ZPP_EMU_DEVICES)
    other = cu.empty(4, np.float32)
    cu.set_device(lr)
    msgs = [
        expect(zpp.DeviceError, "send is host memory (numpy)",
               lambda: dev.allgather(np.ones(4, np.float32))),
        expect(zpp.DeviceError, "out is host memory",
               lambda: dev.allgather(cu.empty(4, np.float32), np.ones(4 * W, np.float32))),
        expect(zpp.DeviceError, "send is device memory (__cuda_array_interface__)",
               lambda: host.allgather(cu.empty(4, np.float32))),
        expect(zpp.DtypeError, "cuda.<f8", lambda: dev.allgather(cu.empty(4, np.float64))),
        expect(ValueError, "out: the device array is read-only",
               lambda: dev.allgather(cu.empty(4, np.float32),
                                     cu.empty(4 * W, np.float32, readonly=True))),
        expect(TypeError, "out: pass it for device arrays",
               lambda: dev.allgather(cu.empty(4, np.float32))),
        expect(ValueError, "stream: only for a communicator on device memory",
               lambda: host.allgather(np.ones(4, np.float32), stream=s)),
        expect(TypeError, "stream 'x'",
               lambda: dev.allgather(cu.empty(4, np.float32), cu.empty(4 * W, np.float32),
                                     stream="x")),
        expect(ValueError, "qgz_residual: on device memory", lambda: dev.qgz_residual(n)),
        # memory of another device than the communicator's: zpp's own check
        expect(zpp.Error, "memory of CUDA device %d, but the communicator works on device %d"
               % ((lr + 1) % 8, lr), lambda: dev.allgather(other, cu.empty(4 * W, np.float32))),
        expect(ValueError, "memory 'gpu'", lambda: zpp.Comm.from_mpi(memory="gpu")),
        expect(ValueError, "device 0: only with memory='device'",
               lambda: zpp.Comm.from_mpi(device=0)),
        # zpp.quant runs on the CPU: device arrays are refused, not read
        expect(zpp.DeviceError, "x is device memory (__cuda_array_interface__): zpp.quant",
               lambda: zpp.quant.encode(cu.empty(8, np.float32))),
        expect(zpp.DeviceError, "enc is device memory",
               lambda: zpp.quant.decode(cu.empty(8, np.uint8), 4)),
    ]
    # the interface read as the spec says (version 3): strides of a
    # C-contiguous array are taken whatever an axis of length 1 says, others
    # are refused; a null pointer is fine for zero elements; stream 0 is
    # disallowed; arrays on two streams need stream=; a host residual on a
    # device communicator is refused by name
    src = cu.array(data(r, 12, 21))
    for shape, strides in (((3, 4), (16, 4)), ((1, 12), (999, 4)), ((12, 1), (4, 0)),
                           ((3, 1, 4), (16, 7, 4))):
        o = dev.allgather(Iface(src, shape=shape, strides=strides),
                          cu.empty(12 * W, np.float32)).get()
        assert np.array_equal(o, np.concatenate([data(q, 12, 21) for q in range(W)])), shape
    nul = Iface(cu.empty(0, np.float32), shape=(0,), data=(0, False))
    assert dev.allgather(nul, Iface(cu.empty(0, np.float32), shape=(0,), data=(0, False))) is not None
    dev.reduce_scatter(nul, nul)
    sa, sb = cu.stream(), cu.stream()
    msgs += [
        expect(ValueError, "send: the device array must be C-contiguous",
               lambda: dev.allgather(Iface(src, shape=(3, 4), strides=(4, 12)),
                                     cu.empty(12 * W, np.float32))),
        expect(ValueError, "send: the device array must be C-contiguous",
               lambda: dev.allgather(Iface(src, shape=(6,), strides=(8,)),
                                     cu.empty(6 * W, np.float32))),
        expect(ValueError, "send: __cuda_array_interface__ strides (4,) for shape (3, 4)",
               lambda: dev.allgather(Iface(src, shape=(3, 4), strides=(4,)),
                                     cu.empty(12 * W, np.float32))),
        expect(ValueError, "send: masked device arrays",
               lambda: dev.allgather(Iface(src, mask=src), cu.empty(12 * W, np.float32))),
        expect(ValueError, "send: __cuda_array_interface__ stream 0",
               lambda: dev.allgather(Iface(src, stream=0), cu.empty(12 * W, np.float32))),
        expect(ValueError, "stream: the arrays are on different streams",
               lambda: dev.allgather(Iface(src, stream=sa),
                                     Iface(cu.empty(12 * W, np.float32), stream=sb))),
        expect(zpp.DeviceError, "residual is host memory",
               lambda: dev.qgz_reduce_scatter(cu.array(data(r, n * W, 13)), cu.empty(n, np.float32),
                                              residual=np.zeros(dev.qgz_residual_count(n),
                                                                np.float32))),
    ]
    # two arrays on the same stream, or one on it and one on none: it runs there
    cu.hold(sa)
    dst = cu.empty(12 * W, np.float32)
    w = dev.allgather(Iface(src, stream=sa), dst, async_op=True)
    time.sleep(0.2)
    held = w.is_completed()
    cu.release(sa)
    w.wait()
    assert not held
    assert np.array_equal(dst.get(), np.concatenate([data(q, 12, 21) for q in range(W)]))
    done["messages"] = msgs
    again = dev.allgather(cu.array(data(r, 5, 20)), cu.empty(5 * W, np.float32)).get()
    assert np.array_equal(again, np.concatenate([data(q, 5, 20) for q in range(W)]))

    # a communicator split from a device one is on device memory too
    node = dev.split(dev.node_of(r), r)
    assert node.memory == "device"
    o = node.allgather(cu.array(np.full(3, r, np.float32)), cu.empty(3 * node.size, np.float32)).get()
    assert sorted(set(o.tolist())) == [q for q in range(W) if dev.node_of(q) == dev.node_of(r)]
    node.close()
    host.close()
    dev.close()
    if r == 0:
        print(json.dumps(done), flush=True)


if __name__ == "__main__":
    main()
