"""Checks of tests/wheel/run.sh on what the installed wheel printed (stdin).

  check.py info SITE CUDA MPI VERSION   `python -m zpp --json`: the library
      and headers are the package's in SITE, the build has CUDA exactly
      when CUDA is 1 (run.sh: nvcc found), MPI when MPI is 1 (mpicc found),
      no emulated runtime, and the version is VERSION (CMakeLists.txt)
  check.py fsdp STEPS                   examples/fsdp2_train.py --json: STEPS
      finite losses, zpp's hooks called and bytes sent
  check.py port                         prints a free port P of 127.0.0.1
      whose P + 1 is free too (zpp's bootstrap listens on MASTER_PORT + 1)
"""

import json
import math
import socket
import sys
from pathlib import Path


def fail(msg: str) -> None:
    sys.exit("tests/wheel/check.py: " + msg)


def last_json(text: str) -> dict:
    lines = [l for l in text.splitlines() if l.startswith("{")]
    if not lines:
        fail("no JSON line in:\n" + text[-3000:])
    return json.loads(lines[-1])


def info(site: str, cuda: str, mpi: str, version: str) -> None:
    d = last_json(sys.stdin.read())
    pkg = Path(site).resolve() / "zpp"
    if Path(d["library"]).resolve() != pkg / "libzpp.so" or d["library_from"] != "package":
        fail("library %s (%s): want %s" % (d["library"], d["library_from"], pkg / "libzpp.so"))
    if Path(d["headers"]).resolve() != pkg / "include":
        fail("headers %s: want %s" % (d["headers"], pkg / "include"))
    b = d["built"]
    want = {"cuda": cuda == "1", "mpi": mpi == "1", "cuda_emu": False}
    got = {k: b[k] for k in want}
    if got != want:
        fail("built with %s: want %s (nvcc found: %s, MPI found: %s)" % (got, want, cuda, mpi))
    if d["version"] != version:
        fail("version %s: want %s (CMakeLists.txt)" % (d["version"], version))
    print("python -m zpp --json: %s, built %s, cuda_available %s"
          % (d["library"], {k: v for k, v in b.items() if v}, d["runtime"]["cuda_available"]))


def fsdp(steps: str) -> None:
    d = last_json(sys.stdin.read())
    losses = d.get("losses") or []
    if len(losses) != int(steps) or not all(math.isfinite(x) for x in losses):
        fail("losses %r: want %s finite values" % (losses, steps))
    calls = sum((d.get("hook_calls") or {}).values())
    sent = d.get("inter_bytes_per_step", 0) + d.get("intra_bytes_per_step", 0)
    if calls <= 0 or sent <= 0:
        fail("zpp's hooks called %d times, %.0f bytes a step: zpp did not run" % (calls, sent))
    print("fsdp2 %s: losses %s, %d hook calls, backend %s"
          % (d["comm"], ["%.4f" % x for x in losses], calls, d.get("backend")))


def port() -> None:
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            p = s.getsockname()[1]
        if p >= 65000:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", p + 1))
            except OSError:
                continue
        print(p)
        return
    fail("no free pair of ports on 127.0.0.1 in 50 tries")


if __name__ == "__main__":
    {"info": info, "fsdp": fsdp, "port": port}[sys.argv[1]](*sys.argv[2:])
