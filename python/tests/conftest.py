"""Shared by the Python tests: where the library and the tools are, and a
launcher for multi-rank drivers (mpirun, torchrun) that returns the JSON
lines rank 0 printed."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
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


def _group_gone(p: subprocess.Popen, wait: float) -> bool:
    t0 = time.monotonic()
    while True:
        p.poll()  # reaps p itself (a zombie still counts as a member)
        try:
            os.killpg(p.pid, 0)
        except ProcessLookupError:
            return True
        if time.monotonic() - t0 > wait:
            return False
        time.sleep(0.05)


def kill_group(p: subprocess.Popen, grace: float = 10.0) -> None:
    """Ends the process group of ``p`` (started with start_new_session):
    SIGTERM, up to ``grace`` seconds, then SIGKILL (up to 5 s more)."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            return
        if _group_gone(p, wait):
            return


def run_bounded(cmd, timeout: float, **kw) -> subprocess.CompletedProcess:
    """subprocess.run(cmd, timeout=...) in a session of its own: past the
    timeout every process of it is ended (kill_group), not only ``cmd``,
    and subprocess.TimeoutExpired is raised with the output so far."""
    kw.setdefault("stdout", subprocess.PIPE)
    kw.setdefault("stderr", subprocess.PIPE)
    with subprocess.Popen(cmd, start_new_session=True, **kw) as p:
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(p)
            out, err = p.communicate()
            raise subprocess.TimeoutExpired(cmd, timeout, out, err) from None
        # what the command left behind in its session goes too
        kill_group(p, grace=1.0)
        return subprocess.CompletedProcess(cmd, p.returncode, out, err)


def _run(cmd, e, timeout):
    p = run_bounded(cmd, timeout, env=e, text=True)
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
