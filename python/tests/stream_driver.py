"""Multi-rank driver of test_device_emu.py: zpp.Comm's device collectives
are stream-ordered (include/zpp/zpp_coll.h, "Asynchrony"), on the emulated
CUDA runtime.  With the caller's stream held (the emulator's
zpp_emu_stream_hold), the call and Work.wait() return without the host
waiting, and the results are exact once the stream is released; the
stream a wait names is ordered after the collective; arrays naming the
per-thread default stream (handle 2) work from one thread; arrays the
caller dropped stay alive while the device may use them (CUDA torch
tensors through a stand-in of torch: record_stream on the streams that
run and wait for the collective).  Prints one JSON line (rank 0); exits
non-zero on a failed check.

    mpirun -np 2 python stream_driver.py mpi|nccl
"""
import gc
import json
import os
import sys
import threading
import time
import types
import weakref
from pathlib import Path

import numpy as np

SEED = int(os.environ.get("ZPP_TEST_SEED", "20261207"))
# bound of a call that only queues work; the held stream keeps the
# collective itself from running for at least that long
QUEUE_LIMIT_S = 5.0


def data(r, n, tag, dtype=np.float32):
    return np.random.default_rng(SEED * 1000 + tag * 100 + r).standard_normal(n).astype(dtype)


def gathered(W, n, tag):
    return np.concatenate([data(q, n, tag) for q in range(W)])


def bounded(fn, limit=QUEUE_LIMIT_S):
    """Runs fn in a thread: (returned within limit, seconds, its value);
    a call blocked on the held stream fails the check instead of hanging
    the test (the caller releases the stream, then join()s)."""
    box = {}

    def body():
        try:
            box["v"] = fn()
        except BaseException as e:  # re-raised on the caller's thread
            box["e"] = e

    t0 = time.monotonic()
    t = threading.Thread(target=body, daemon=True)
    t.start()
    t.join(limit)
    return t, time.monotonic() - t0, box


def finish(t, box):
    t.join()
    if "e" in box:
        raise box["e"]
    return box.get("v")


class FakeTorch:
    """Just enough of torch for zpp's handling of CUDA tensors: tensors over
    emulated device memory whose record_stream calls are logged, and
    torch.cuda.current_stream returning the stream a test sets.  torch
    itself cannot make CUDA tensors without a GPU."""

    def __init__(self, device_index):
        self.log = []
        fake = self

        class Stream:
            def __init__(self, handle):
                self.cuda_stream = handle

        class Device:
            type = "cuda"
            index = device_index

        class Tensor:
            def __init__(self, arr):
                self.arr = arr  # the emulated device array underneath
                self.device = Device()
                self.dtype = "torch.float32"

            def data_ptr(self):
                return self.arr.ptr

            def numel(self):
                return self.arr.n

            def is_contiguous(self):
                return True

            def record_stream(self, s):
                fake.log.append((self.name, s.cuda_stream))

        Tensor.__module__ = "torch.fake"  # zpp._lib.is_torch
        self.Tensor = Tensor
        self.current = Stream(0)
        cuda = types.SimpleNamespace(
            Stream=Stream,
            current_stream=lambda device=None: fake.current,
            default_stream=lambda device=None: Stream(0),
            ExternalStream=lambda handle, device=None: Stream(handle))
        self.module = types.ModuleType("torch")
        self.module.cuda = cuda

    def tensor(self, arr, name):
        t = self.Tensor(arr)
        t.name = name
        return t


def setup(backend):
    """The stand-in of torch (installed before zpp imports torch), the
    emulated runtime on this rank's device and a device communicator:
    (fake, cu, dev, local rank)."""
    lr = int(os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", "0"))
    fake = FakeTorch(lr)
    sys.modules["torch"] = fake.module  # before zpp imports it
    import zpp
    from emu_cuda import Cuda, find

    cu = Cuda(find(Path(os.environ["ZPP_BUILD_DIR"])))
    cu.set_device(lr)
    dev = zpp.Comm.from_mpi(memory="device", device=lr, backend=backend)
    return fake, cu, dev, lr


def main():
    backend = sys.argv[1]
    fake, cu, dev, lr = setup(backend)
    import zpp
    r, W = dev.rank, dev.size
    done = {"seed": SEED, "world": W, "backend": dev.backend}
    n = 1001

    # 1. the stream held: the blocking form, a started call, wait() and a
    # second blocking call all return while the collective cannot run;
    # then the results are exact
    s = cu.stream()
    x1, x2, x3 = (cu.array(data(r, n, t)) for t in (1, 2, 3))
    o1, o2, o3 = (cu.empty(n * W, np.float32) for _ in range(3))
    cu.hold(s)

    def queue():
        dev.allgather(x1, o1, stream=s)
        w = dev.allgather(x2, o2, async_op=True, stream=s)
        pending = w.is_completed()
        w.wait()
        dev.allgather(x3, o3, stream=s)
        return pending

    t, took, box = bounded(queue)
    returned = not t.is_alive()
    cu.release(s)
    completed_while_held = finish(t, box)
    assert returned, "the calls and wait() blocked the host for %.1f s while their stream " \
                     "was held" % took
    assert completed_while_held is False, "the collective completed on a held stream"
    for o, tag in ((o1, 1), (o2, 2), (o3, 3)):
        assert np.array_equal(o.get(), gathered(W, n, tag)), tag
    done["queued_s"] = round(took, 3)

    # 2. the stream wait() names waits for the collective: a copy queued
    # there after the wait reads the gathered output (without the wait it
    # could run first: on staging the collective is not on that stream);
    # the default is the stream the call used
    for how in ("stream=", "call's stream"):
        s, s2 = cu.stream(), cu.stream()
        x = cu.array(data(r, n, 4))
        o = cu.empty(n * W, np.float32)
        host = cu.pinned(n * W, np.float32)
        host[:] = np.nan
        cu.hold(s)
        w = dev.allgather(x, o, async_op=True, stream=s)
        waiter = s2 if how == "stream=" else s
        t, took, box = bounded(lambda: w.wait(stream=s2) if how == "stream=" else w.wait())
        returned = not t.is_alive()
        if returned:
            cu.copy_out_async(host, o, waiter)
        cu.release(s)
        finish(t, box)
        assert returned, "%s: wait() blocked the host for %.1f s" % (how, took)
        cu.stream_sync(waiter)
        assert np.array_equal(host, gathered(W, n, 4)), how

    # 3. the host wait is still there: wait(host=True) returns only after
    # the stream was released and the collective ran; wait(timeout) (c10d's
    # host wait) gives up past its timeout and can be waited for again
    s = cu.stream()
    x, o = cu.array(data(r, n, 5)), cu.empty(n * W, np.float32)
    cu.hold(s)
    w = dev.allgather(x, o, async_op=True, stream=s)
    try:
        w.wait(timeout=0.2)
        raise AssertionError("wait(timeout=0.2) returned while the stream was held")
    except zpp.Error as e:
        assert e.status == "ZPP_ERR_TIMEOUT" and "within timeout 0.2 s" in str(e), e
    t, took, box = bounded(lambda: w.wait(host=True), 0.5)
    blocked = t.is_alive()
    cu.release(s)
    finish(t, box)
    assert blocked, "wait(host=True) returned while the stream was held"
    assert w.is_completed()
    assert np.array_equal(o.get(), gathered(W, n, 5))

    # 4. lifetimes: arrays the caller dropped right after the call stay
    # alive while the device may use them (until the device ran the
    # collective; here the stream is held until after the checks), then go
    sub = dev.split(0, r)
    freed = []
    s = cu.stream()
    cu.hold(s)
    a, b = cu.array(data(r, n, 7)), cu.empty(n * W, np.float32)
    c, d = cu.array(data(r, n, 8)), cu.empty(n * W, np.float32)
    for name, arr in (("send", a), ("out", b), ("send2", c), ("out2", d)):
        weakref.finalize(arr, freed.append, name)
    del arr
    out_ref = weakref.ref(b)
    w = sub.allgather(a, b, async_op=True, stream=s)
    sub.allgather(c, d, stream=s)
    del a, b, c, d
    gc.collect()
    alive_started = list(freed)
    w.wait()
    del w
    gc.collect()
    alive_waited = list(freed)
    o = out_ref()
    cu.release(s)
    assert alive_started == [] and alive_waited == [], (alive_started, alive_waited)
    assert np.array_equal(o.get(), gathered(W, n, 7))
    del o
    sub.close()
    gc.collect()
    assert sorted(freed) == ["out", "out2", "send", "send2"], freed
    # a host wait lets its arrays go at once
    e = cu.array(data(r, n, 9))
    weakref.finalize(e, freed.append, "host-waited")
    w = dev.allgather(e, cu.empty(n * W, np.float32), async_op=True, stream=s)
    del e
    w.wait(host=True)
    del w
    gc.collect()
    assert "host-waited" in freed, freed

    # 5. CUDA tensors (torch stand-in): record_stream on the stream running
    # the collective at the call, and on the stream wait() makes wait (torch's
    # current stream then); no reference kept past that
    s, s2 = cu.stream(), cu.stream()
    fake.current = fake.module.cuda.Stream(s)
    cu.hold(s)
    ts = fake.tensor(cu.array(data(r, n, 10)), "send")
    to = fake.tensor(cu.empty(n * W, np.float32), "out")
    arr = to.arr
    w = dev.allgather(ts, to, async_op=True)
    at_call = sorted(fake.log)
    fake.log.clear()
    fake.current = fake.module.cuda.Stream(s2)
    host = cu.pinned(n * W, np.float32)
    host[:] = np.nan
    t, took, box = bounded(w.wait)
    returned = not t.is_alive()
    if returned:
        cu.copy_out_async(host, arr, s2)
    cu.release(s)
    finish(t, box)
    assert returned, "wait() on tensors blocked the host for %.1f s" % took
    assert at_call == [("out", s), ("send", s)], at_call
    assert sorted(fake.log) == [("out", s2), ("send", s2)], fake.log
    cu.stream_sync(s2)
    assert np.array_equal(host, gathered(W, n, 10))
    tref = weakref.ref(ts)
    del ts, to, w
    gc.collect()
    assert tref() is None, "a tensor outlived its record_stream: the communicator kept it"
    # the blocking form records the call's stream
    fake.log.clear()
    fake.current = fake.module.cuda.Stream(s)
    ts = fake.tensor(cu.array(data(r, n, 11)), "send")
    to = fake.tensor(cu.empty(n * W, np.float32), "out")
    assert dev.allgather(ts, to) is to
    assert sorted(fake.log) == [("out", s), ("send", s)], fake.log
    assert np.array_equal(to.arr.get(), gathered(W, n, 11))

    # 6. arrays naming the per-thread default stream (2, interpreted on
    # the calling thread): the call and its wait on one thread, then a copy
    # queued on that thread's per-thread stream reads the exact result; on
    # the main thread, then on another one (its own per-thread stream)
    def per_thread(tag):
        cu.set_device(lr)
        for form in ("blocking", "async"):
            x = cu.array(data(r, n, tag), stream=2)
            o = cu.empty(n * W, np.float32, stream=2)
            host = cu.pinned(n * W, np.float32)
            host[:] = np.nan
            if form == "blocking":
                dev.allgather(x, o)
            else:
                dev.allgather(x, o, async_op=True).wait()
            cu.copy_out_async(host, o, 2)
            cu.stream_sync(2)
            assert np.array_equal(host, gathered(W, n, tag)), (tag, form)

    per_thread(6)
    t, took, box = bounded(lambda: per_thread(12), 120)
    finish(t, box)

    dev.close()
    if r == 0:
        print(json.dumps(done), flush=True)


if __name__ == "__main__":
    main()
