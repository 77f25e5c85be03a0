"""Checks of tests/wheel/run.sh on what the installed wheel printed (stdin).

  check.py wheel WHEEL ROOT             the wheel holds zpp/*.py,
      zpp/libzpp.so, zpp/include/zpp/*.h (every header of ROOT/include/zpp)
      and its dist-info, and nothing else
  check.py runpath RUNPATH ROOT BUILD   every entry of libzpp.so's RUNPATH
      is $ORIGIN (which must be there) or an absolute directory outside
      both the source tree ROOT and the build directory BUILD
  check.py info SITE CUDA MPI VERSION NCCL UCX   `python -m zpp --json`:
      the library and headers are the package's in SITE, the build has
      CUDA exactly when CUDA is 1 (run.sh: nvcc found), MPI when MPI is 1
      (mpicc found), NCCL when NCCL is 1 and UCX when UCX is 1 (as the
      wheel's CMake found their headers), no emulated runtime; the version
      is VERSION (CMakeLists.txt), and so are zpp.version() and the
      installed metadata's (importlib.metadata); run with the venv's python
  check.py fsdp STEPS                   examples/fsdp2_train.py --json: STEPS
      finite losses, zpp's hooks called and bytes sent
  check.py port                         prints a free port P of 127.0.0.1
      whose P + 1 is free too (zpp's bootstrap listens on MASTER_PORT + 1)
"""

import json
import math
import os
import re
import socket
import sys
import zipfile
from pathlib import Path


def fail(msg: str) -> None:
    sys.exit("tests/wheel/check.py: " + msg)


def last_json(text: str) -> dict:
    lines = [l for l in text.splitlines() if l.startswith("{")]
    if not lines:
        fail("no JSON line in:\n" + text[-3000:])
    return json.loads(lines[-1])


def wheel(whl: str, root: str) -> None:
    with zipfile.ZipFile(whl) as z:
        names = [i.filename for i in z.infolist() if not i.is_dir()]
    m = re.match(r"zpp-([0-9.]+)-", Path(whl).name)
    if not m:
        fail("%s: not a zpp wheel's name" % whl)
    info_dir = "zpp-%s.dist-info/" % m.group(1)
    allowed = {"zpp/*.py": r"zpp/[^/]+\.py", "zpp/libzpp.so": r"zpp/libzpp\.so",
               "zpp/include/zpp/*.h": r"zpp/include/zpp/[^/]+\.h",
               info_dir: re.escape(info_dir) + r".+"}
    extra = [n for n in names if not any(re.fullmatch(r, n) for r in allowed.values())]
    if extra:
        fail("%s holds files outside %s: %s" % (whl, ", ".join(allowed), ", ".join(extra)))
    headers = sorted("zpp/include/zpp/" + h.name for h in (Path(root) / "include" / "zpp").glob("*.h"))
    want = ["zpp/libzpp.so", "zpp/__init__.py", info_dir + "METADATA", info_dir + "WHEEL"] + headers
    missing = [n for n in want if n not in names]
    if missing:
        fail("%s lacks %s" % (whl, ", ".join(missing)))
    print("wheel %s: %d files, %d headers, nothing else" % (Path(whl).name, len(names), len(headers)))


def runpath(rp: str, root: str, build: str) -> None:
    entries = rp.split(":") if rp else []
    if "$ORIGIN" not in entries:
        fail("RUNPATH %r lacks $ORIGIN" % rp)
    tree = [os.path.realpath(root), os.path.realpath(build)]
    for e in entries:
        if e == "$ORIGIN":
            continue
        if not e.startswith("/"):
            fail("RUNPATH %r: entry %r is neither $ORIGIN nor an absolute directory" % (rp, e))
        r = os.path.realpath(e)
        for t in tree:
            if r == t or r.startswith(t + os.sep):
                fail("RUNPATH %r: entry %r is inside %s" % (rp, e, t))
    print("RUNPATH %r: $ORIGIN and directories outside %s" % (rp, " and ".join(tree)))


def info(site: str, cuda: str, mpi: str, version: str, nccl: str, ucx: str) -> None:
    d = last_json(sys.stdin.read())
    pkg = Path(site).resolve() / "zpp"
    if Path(d["library"]).resolve() != pkg / "libzpp.so" or d["library_from"] != "package":
        fail("library %s (%s): want %s" % (d["library"], d["library_from"], pkg / "libzpp.so"))
    if Path(d["headers"]).resolve() != pkg / "include":
        fail("headers %s: want %s" % (d["headers"], pkg / "include"))
    b = d["built"]
    want = {"cuda": cuda == "1", "mpi": mpi == "1", "cuda_emu": False, "nccl": nccl == "1",
            "ucx": ucx == "1"}
    got = {k: b[k] for k in want}
    if got != want:
        fail("built with %s: want %s (nvcc found: %s, MPI found: %s, nccl.h found: %s, "
             "ucp.h found: %s)" % (got, want, cuda, mpi, nccl, ucx))
    if d["version"] != version:
        fail("version %s: want %s (CMakeLists.txt)" % (d["version"], version))
    from importlib.metadata import version as dist_version

    import zpp

    got_v = {"zpp.version()": "%d.%d.%d" % zpp.version(), "metadata": dist_version("zpp")}
    if set(got_v.values()) != {version}:
        fail("versions %s: want %s (CMakeLists.txt)" % (got_v, version))
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
    {"wheel": wheel, "runpath": runpath, "info": info, "fsdp": fsdp,
     "port": port}[sys.argv[1]](*sys.argv[2:])
