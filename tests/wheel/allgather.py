"""A 2-rank all-gather through the installed zpp wheel (tests/wheel/run.sh).

Under mpirun (zpp.Comm.from_mpi) or torchrun (zpp.Comm.from_env).  Every
rank draws its shard from (seed, rank), so each rank rebuilds every other
rank's shard itself: the gathered array must equal their concatenation
bit for bit.  zpp and libzpp must be the installed ones (--site: the
venv's site-packages), never a source tree's.  Rank 0 prints one JSON line.
"""

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

p = argparse.ArgumentParser()
p.add_argument("--site", required=True, help="site-packages the zpp package must come from")
p.add_argument("--seed", type=int, default=int(os.environ.get("ZPP_TEST_SEED", "20261207")))
a = p.parse_args()

for k in ("ZPP_LIBRARY", "PYTHONPATH"):
    if k in os.environ:
        sys.exit("allgather.py: %s is set (%s): the wheel must work without it" % (k, os.environ[k]))

import zpp  # noqa: E402
from zpp import _lib  # noqa: E402

site = Path(a.site).resolve()
pkg = Path(zpp.__file__).resolve().parent
lib = Path(_lib.get().path).resolve()
if pkg != site / "zpp" or lib.parent != pkg:
    sys.exit("allgather.py: zpp from %s, libzpp from %s: want both in %s" % (pkg, lib, site / "zpp"))

comm = zpp.Comm.from_mpi() if "OMPI_COMM_WORLD_SIZE" in os.environ else zpp.Comm.from_env()
n = 1037  # not a multiple of anything the algorithms split by
if comm.rank == 0:
    print("seed %d, %d ranks, backend %s" % (a.seed, comm.size, comm.backend), file=sys.stderr)


def shard(r: int) -> np.ndarray:
    return np.random.default_rng([a.seed, r]).standard_normal(n).astype(np.float32)


out = comm.allgather(shard(comm.rank))
want = np.concatenate([shard(r) for r in range(comm.size)])
bad = np.flatnonzero(out.view(np.uint32) != want.view(np.uint32))
if bad.size:
    sys.exit("allgather.py: rank %d: %d of %d elements differ, first at %d: %r, want %r"
             % (comm.rank, bad.size, want.size, bad[0], out[bad[0]], want[bad[0]]))
rank, size, backend = comm.rank, comm.size, comm.backend
comm.close()
if rank == 0:
    print(json.dumps({"ok": True, "ranks": size, "elements": int(want.size),
                      "backend": backend, "library": str(lib)}))
