"""Multi-rank driver of test_device_emu.py: how long zpp.Comm keeps
device requests and arrays, and Work's waits, on the emulated CUDA
runtime.  Blocking calls and stream-ordered waits on
``__cuda_array_interface__`` arrays are freed once the device ran them
(the communicator holds only what is in flight, and the arrays go);
every stream-ordered wait orders its stream, also after a first one;
threads waiting for one Work free its request once; a CUDA tensor is
never asked for ``__cuda_array_interface__``; a call refused before it
queued anything abandons nothing; a stream handle past 2**64 - 1 is
refused without losing the request.  Prints one JSON line (rank 0);
exits non-zero on a failed check.

    mpirun -np 2 python lifetime_driver.py mpi|nccl
"""
import gc
import json
import os
import sys
import threading
import time
import weakref

import numpy as np

from stream_driver import bounded, data, finish, gathered, setup

SEED = int(os.environ.get("ZPP_TEST_SEED", "20261207"))
LOOPS = 200
# seconds for the engine to mark done a collective whose stream synced
DONE_LIMIT_S = 30.0


def settle(w):
    """Polls w (ordered onto a stream that synced) until the device ran it,
    then once more: that poll frees every request the device ran."""
    deadline = time.monotonic() + DONE_LIMIT_S
    while not w.is_completed():
        assert time.monotonic() < deadline, "a collective on a synced stream never completed"
        time.sleep(1e-3)
    w.is_completed()


def main():
    backend = sys.argv[1]
    fake, cu, dev, lr = setup(backend)
    import zpp
    import zpp.comm
    r, W = dev.rank, dev.size
    done = {"seed": SEED, "world": W, "backend": dev.backend}
    n = 37

    # 1. a loop of blocking calls and of started calls waited for on their
    # stream: after a sync of that stream the communicator holds nothing
    # and every array the caller dropped is freed
    s = cu.stream()
    freed = []
    most = 0
    for i in range(LOOPS):
        x, o = cu.array(data(r, n, i % 7)), cu.empty(n * W, np.float32)
        y, p = cu.array(data(r, n, 7 + i % 5)), cu.empty(n * W, np.float32)
        for name, a in (("x", x), ("o", o), ("y", y), ("p", p)):
            weakref.finalize(a, freed.append, (i, name))
        dev.allgather(x, o, stream=s)
        w = dev.allgather(y, p, async_op=True, stream=s)
        w.wait()
        most = max(most, len(dev._pending))
        if i % 50 == 49:
            host_o, host_p = cu.pinned(n * W, np.float32), cu.pinned(n * W, np.float32)
            cu.copy_out_async(host_o, o, s)
            cu.copy_out_async(host_p, p, s)
            del x, o, y, p, a
            cu.stream_sync(s)
            assert np.array_equal(host_o, gathered(W, n, i % 7)), i
            assert np.array_equal(host_p, gathered(W, n, 7 + i % 5)), i
            settle(w)
            del w
            gc.collect()
            assert len(dev._pending) == 0, (i, len(dev._pending))
            assert len(freed) == 4 * (i + 1), (i, len(freed))
        else:
            del x, o, y, p, a, w
    done["most_pending"] = most

    # 2. every stream-ordered wait orders its stream, also after a first
    # one: a copy queued on the second waiter reads the gathered output;
    # is_completed() answers from the request meanwhile
    s, s2, s3 = cu.stream(), cu.stream(), cu.stream()
    o = cu.empty(n * W, np.float32)
    host = cu.pinned(n * W, np.float32)
    host[:] = np.nan
    cu.hold(s)
    w = dev.allgather(cu.array(data(r, n, 20)), o, async_op=True, stream=s)
    w.wait(stream=s2)
    t, took, box = bounded(lambda: w.wait(stream=s3))
    returned = not t.is_alive()
    if returned:
        cu.copy_out_async(host, o, s3)
    time.sleep(0.2)
    held_done = w.is_completed()
    cu.release(s)
    finish(t, box)
    assert returned, "a second stream-ordered wait blocked the host for %.1f s" % took
    assert held_done is False, "is_completed() said done while the stream was held"
    cu.stream_sync(s3)
    assert np.array_equal(host, gathered(W, n, 20)), "the second wait did not order its stream"
    settle(w)
    assert w.wait(stream=s2) and w.is_completed()  # freed: nothing left to order

    # 3. threads waiting for one Work (a host poll with a timeout, a host
    # wait, a stream-ordered wait; close() and a host wait) free its
    # request once; all return
    for trial in range(5):
        s = cu.stream()
        o = cu.empty(n * W, np.float32)
        cu.hold(s)
        w = dev.allgather(cu.array(data(r, n, 21 + trial)), o, async_op=True, stream=s)
        errs = []

        def waiter(**kw):
            try:
                w.wait(**kw)
            except Exception as e:  # reported below
                errs.append("%s: %r" % (kw, e))

        ts = [threading.Thread(target=waiter, kwargs=kw)
              for kw in ({"timeout": 30}, {"host": True}, {"stream": cu.stream()})]
        for t in ts:
            t.start()
        time.sleep(0.2)
        cu.release(s)
        for t in ts:
            t.join()
        assert errs == [], (trial, errs)
        assert np.array_equal(o.get(), gathered(W, n, 21 + trial)), trial
        assert w.is_completed() and len(dev._pending) == 0, (trial, len(dev._pending))
    # close() while a thread waits on the host for a Work of it
    sub = dev.split(0, r)
    s = cu.stream()
    o = cu.empty(n * W, np.float32)
    cu.hold(s)
    w = sub.allgather(cu.array(data(r, n, 26)), o, async_op=True, stream=s)
    errs = []

    def host_wait():
        try:
            w.wait(host=True)
        except Exception as e:  # reported below
            errs.append(repr(e))

    waiting = threading.Thread(target=host_wait)
    waiting.start()
    releaser = threading.Timer(0.3, cu.release, (s,))
    releaser.start()
    sub.close()
    waiting.join()
    releaser.join()
    assert errs == [] and w.wait(), errs
    assert np.array_equal(o.get(), gathered(W, n, 26))

    # 4. CUDA tensors on the per-thread default stream (no torch stream to
    # record) that raise on __cuda_array_interface__ (torch does for one
    # that requires grad): kept by the Work, never asked for the interface
    class GradTensor(fake.Tensor):
        @property
        def __cuda_array_interface__(self):
            raise RuntimeError("Can't get __cuda_array_interface__ on a tensor that requires grad")

    GradTensor.__module__ = "torch.fake"
    for form in ("blocking", "async"):
        ts_, to = GradTensor(cu.array(data(r, n, 30))), GradTensor(cu.empty(n * W, np.float32))
        ts_.name, to.name = "send", "out"
        if form == "blocking":
            assert dev.allgather(ts_, to, stream=2) is to
        else:
            dev.allgather(ts_, to, async_op=True, stream=2).wait(stream=2)
        cu.stream_sync(2)
        assert np.array_equal(to.arr.get(), gathered(W, n, 30)), form

    # 5. a call refused before it queued anything (overlapping buffers,
    # every rank alike) abandons no array; a stream handle past 2**64 - 1
    # is refused and the request kept
    before = len(zpp.comm._abandoned)
    full = cu.empty(n * W, np.float32)
    try:
        dev.allgather(full.view(1, n), full)
        raise AssertionError("overlapping buffers were accepted")
    except zpp.Error as e:
        assert e.status == "ZPP_ERR_INVALID_ARGUMENT", e
    assert len(zpp.comm._abandoned) == before, "a refused call abandoned its arrays"
    s = cu.stream()
    o = cu.empty(n * W, np.float32)
    cu.hold(s)
    w = dev.allgather(cu.array(data(r, n, 31)), o, async_op=True, stream=s)
    try:
        w.wait(stream=1 << 64)
        raise AssertionError("stream 2**64 accepted")
    except TypeError as e:
        assert "stream 18446744073709551616" in str(e), e
    time.sleep(0.2)
    lost = w.is_completed()
    cu.release(s)
    assert lost is False, "the request was lost by the refused wait"
    w.wait(host=True)
    assert np.array_equal(o.get(), gathered(W, n, 31))

    dev.close()
    if r == 0:
        print(json.dumps(done), flush=True)


if __name__ == "__main__":
    main()
