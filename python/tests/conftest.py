"""Shared by the Python tests: where the library and the tools are, and a
launcher for multi-rank drivers (mpirun, torchrun) that returns the JSON
lines rank 0 printed."""

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("ZPP_BUILD_DIR", ROOT / "build"))
LIB = Path(os.environ.get("ZPP_LIBRARY", BUILD / "libzpp.so"))
os.environ.setdefault("ZPP_LIBRARY", str(LIB))
sys.path.insert(0, str(ROOT / "python"))
TESTS = Path(__file__).resolve().parent
EXAMPLE = ROOT / "examples" / "fsdp2_train.py"


def free_port() -> int:
    # a port and the one after it (zpp's bootstrap listens on MASTER_PORT + 1):
    # both must be free now
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
        return p
    raise RuntimeError("no free pair of ports on 127.0.0.1 in 50 tries")


def env(**extra) -> dict:
    e = dict(os.environ)
    e["PYTHONPATH"] = str(ROOT / "python") + os.pathsep + e.get("PYTHONPATH", "")
    e["ZPP_LIBRARY"] = str(LIB)
    e["MASTER_ADDR"] = "127.0.0.1"
    e["MASTER_PORT"] = str(free_port())
    e["OMPI_MCA_mpi_yield_when_idle"] = "1"
    e.update({k: str(v) for k, v in extra.items()})
    return e


def mpirun(np_: int, args, timeout=240, **extra):
    e = env(**extra)
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--mca", "btl", "self,vader",
           "--bind-to", "none", "-np", str(np_)]
    for k in ("PYTHONPATH", "ZPP_LIBRARY", "MASTER_ADDR", "MASTER_PORT",
              "OMPI_MCA_mpi_yield_when_idle", *extra.keys()):
        cmd += ["-x", k]
    return _run(cmd + [sys.executable] + [str(a) for a in args], e, timeout)


def torchrun(np_: int, args, timeout=240, **extra):
    e = env(**extra)
    # torchrun's own store on MASTER_PORT; zpp's bootstrap on MASTER_PORT + 1
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(np_),
           "--master-addr", "127.0.0.1", "--master-port", e["MASTER_PORT"]]
    return _run(cmd + [str(a) for a in args], e, timeout)


def _run(cmd, e, timeout):
    p = subprocess.run(cmd, env=e, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise AssertionError("%s\nexit %d\n--- stdout\n%s\n--- stderr\n%s"
                             % (" ".join(cmd), p.returncode, p.stdout[-6000:], p.stderr[-6000:]))
    return [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]


def pytest_configure(config):
    if not LIB.is_file():
        raise pytest.UsageError("libzpp not found at %s: build it first (make build), "
                                "or set ZPP_LIBRARY" % LIB)


@pytest.fixture(scope="session")
def have_mpirun():
    if shutil.which("mpirun") is None:
        pytest.skip("mpirun not installed (scripts/install-deps.sh installs it)")
