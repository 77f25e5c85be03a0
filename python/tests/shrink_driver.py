"""Driver of test_shrink.py: RANK/WORLD_SIZE/MASTER_* ranks (zpp's TCP
bootstrap, no MPI).  The rank named by argv[1] SIGKILLs itself once the
communicator works; the others see their all-gather fail, call
Comm.shrink(), and check an all-gather and a reduce-scatter on the new
communicator against references computed here.  Rank 0 prints one JSON
line; a failed check exits non-zero."""
import json
import os
import signal
import sys
import time

import numpy as np

import zpp

SEED = int(os.environ.get("ZPP_TEST_SEED", "20261130"))


def data(r, n, tag):
    return np.random.default_rng(SEED * 1000 + tag * 100 + r).standard_normal(n).astype(np.float32)


def ints(r, n, tag):
    return np.random.default_rng(SEED * 1000 + tag * 100 + r).integers(-1000, 1000, n).astype(np.float32)


def main():
    victim = int(sys.argv[1])
    comm = zpp.Comm.from_env(timeout_s=3.0, backend="ucx")
    r, W = comm.rank, comm.size
    n = 257
    assert np.array_equal(comm.allgather(data(r, n, 1)),
                          np.concatenate([data(q, n, 1) for q in range(W)]))
    comm.allgather(np.zeros(1, np.float32))  # everyone is past the check
    if r == victim:
        os.kill(os.getpid(), signal.SIGKILL)
    t0 = time.monotonic()
    # the failed call's buffers: the backend may write them until the
    # communicator is closed (zpp_comm.h, "faults"), so they live past it
    send, out = data(r, n, 2), np.empty(n * W, np.float32)
    try:
        comm.allgather(send, out)
        failed = None
    except zpp.Error as e:
        failed = e.status
    assert failed is not None, "the all-gather with the dead rank did not fail"
    new = comm.shrink()
    comm.close()
    del send, out
    assert new.old_ranks == [q for q in range(W) if q != victim], new.old_ranks
    assert new.size == W - 1 and new.rank == new.old_ranks.index(r)
    old = new.old_ranks
    out = new.allgather(data(r, n, 3))
    assert np.array_equal(out, np.concatenate([data(q, n, 3) for q in old]))
    x = [ints(q, n * len(old), 4) for q in old]
    got = new.reduce_scatter(x[new.rank], op="sum")
    ref = np.sum(np.stack(x).astype(np.float64), axis=0)[new.rank * n:(new.rank + 1) * n]
    assert np.array_equal(got.astype(np.float64), ref)
    if r == min(old):
        print(json.dumps({"failed_with": failed, "old_ranks": old, "size": new.size,
                          "seconds": time.monotonic() - t0}), flush=True)
    new.close()


if __name__ == "__main__":
    main()
