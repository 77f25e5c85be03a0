"""zpp.init_process_group (python/zpp/launch.py): torch's process group
under mpirun and srun with no MASTER_ADDR / MASTER_PORT, an explicit
rendezvous winning, errors naming the variable, and the Slurm hostlist
parser (the twin of the C one in src/comm/tcp_id.c, same cases as
tests/test_bootstrap.cc)."""
import os
import random
import shutil
import socket
import subprocess
import sys
import time

import pytest

from conftest import BUILD, LIB, ROOT, TESTS, free_port, kill_group, run_bounded

from zpp import launch

DRIVER = TESTS / "launch_driver.py"
SEED = int(os.environ.get("ZPP_TEST_SEED", "20261130"))
RENDEZVOUS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK",
              "TORCHELASTIC_RUN_ID", "ZPP_BOOTSTRAP_ADDR", "ZPP_BOOTSTRAP_PORT",
              "PMI_RANK", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALRANKID")


def clean_env(**extra) -> dict:
    e = {k: v for k, v in os.environ.items()
         if k not in RENDEZVOUS and not k.startswith(("SLURM_", "OMPI_COMM_WORLD"))}
    e["PYTHONPATH"] = str(ROOT / "python")
    e["ZPP_LIBRARY"] = str(LIB)
    e["OMPI_MCA_mpi_yield_when_idle"] = "1"
    e.update({k: str(v) for k, v in extra.items()})
    return e


def parse(p) -> dict:
    import json

    assert p.returncode == 0, "exit %d\n--- stdout\n%s\n--- stderr\n%s" % (
        p.returncode, p.stdout[-4000:], p.stderr[-4000:])
    lines = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]
    assert len(lines) == 1, p.stdout
    return lines[0]


def mpirun(n: int, e: dict, xs=()):
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--mca", "btl", "self,vader",
           "--bind-to", "none", "-np", str(n)]
    for k in ("PYTHONPATH", "ZPP_LIBRARY", "OMPI_MCA_mpi_yield_when_idle", *xs):
        cmd += ["-x", k]
    return run_bounded(cmd + [sys.executable, str(DRIVER)], 180, env=e, text=True)


@pytest.fixture(scope="module")
def have_mpirun():
    if shutil.which("mpirun") is None:
        pytest.skip("mpirun not installed (scripts/install-deps.sh installs it)")


def test_mpirun_needs_no_master_variables(have_mpirun):
    out = parse(mpirun(3, clean_env()))
    assert out["sum"] == [6.0, 12.0, 18.0]
    assert out["world"] == 3 and out["local_rank"] == "0"
    # one host: rank 0's store on the loopback, on the port it picked,
    # which it still holds (the process group's store)
    assert out["master_addr"] == "127.0.0.1"
    assert out["port_listening"], out


def test_explicit_master_variables_win(have_mpirun):
    port = free_port()
    e = clean_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    out = parse(mpirun(2, e, xs=("MASTER_ADDR", "MASTER_PORT")))
    assert out["sum"] == [3.0, 6.0, 9.0]
    assert (out["master_addr"], out["master_port"]) == ("127.0.0.1", port)
    assert out["port_listening"], out


def test_master_port_alone_is_the_mpirun_stores_port(have_mpirun):
    port = free_port()
    out = parse(mpirun(2, clean_env(MASTER_PORT=port), xs=("MASTER_PORT",)))
    assert out["master_port"] == port and out["port_listening"], out


def test_rank_0s_failure_reaches_every_rank(have_mpirun):
    """MASTER_PORT alone names a port in use: rank 0 cannot open the
    store, and every rank fails saying so (none waits for a store that
    will not come)."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        port = held.getsockname()[1]
        p = mpirun(2, clean_env(MASTER_PORT=port, ZPP_TEST_EXPECT_FAIL=1),
                   xs=("MASTER_PORT", "ZPP_TEST_EXPECT_FAIL"))
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    for r in (0, 1):
        assert ("rank %d failed: zpp.init_process_group: rank 0 could not open the rendezvous "
                "store" % r) in p.stdout, p.stdout[-4000:]
    assert "RANK was written" not in p.stdout, p.stdout[-4000:]


def slurm_job_with_free_port() -> int:
    """A SLURM_JOB_ID whose port (step 0) and the next one are free now."""
    rng = random.Random(SEED)
    for _ in range(200):
        job = rng.randrange(1, 1 << 31)
        port = launch.slurm_port({"SLURM_JOB_ID": str(job), "SLURM_STEP_ID": "0"})
        try:
            for p in (port, port + 1):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
        except OSError:
            continue
        return job
    raise RuntimeError("no SLURM_JOB_ID with a free port in 200 tries")


def test_srun_variables_without_slurm():
    """The tasks as srun starts them (environment only): no RANK, no
    MASTER_*; the rendezvous at the first host of SLURM_STEP_NODELIST, on
    the documented port of the job and step."""
    job, n = slurm_job_with_free_port(), 3
    procs = []
    for r in range(n):
        e = clean_env(SLURM_PROCID=r, SLURM_NTASKS=n, SLURM_LOCALID=r, SLURM_JOB_ID=job,
                      SLURM_STEP_ID=0, SLURM_STEP_NODELIST="localhost,node[2-3]",
                      SLURM_JOB_NODELIST="unused[1-9]")
        procs.append(subprocess.Popen([sys.executable, str(DRIVER)], env=e, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      start_new_session=True))
    results = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            for q in procs:
                kill_group(q)
            raise
        results.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    for p in results[1:]:
        assert p.returncode == 0, p.stderr[-4000:]
    out = parse(results[0])
    assert out["sum"] == [6.0, 12.0, 18.0]
    want = 10000 + 2 * ((job * 61 + 0) % 11000)
    assert (out["master_addr"], out["master_port"]) == ("localhost", want)


@pytest.mark.parametrize("env, want", [
    ({}, "RANK is not set, and neither is OMPI_COMM_WORLD_RANK nor SLURM_PROCID"),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2"}, "SLURM_STEP_ID is not"),
    ({"SLURM_PROCID": "0", "SLURM_STEP_ID": "0"}, "SLURM_NTASKS is not set"),
    ({"SLURM_PROCID": "0", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "2", "SLURM_LOCALID": "x"},
     "SLURM_LOCALID 'x'"),
    ({"SLURM_PROCID": "2", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0"},
     "rank 2: must be below the world size 2"),
    ({"SLURM_PROCID": "0", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "1", "SLURM_LOCALID": "0"},
     "neither MASTER_ADDR nor SLURM_STEP_NODELIST nor SLURM_JOB_NODELIST"),
    ({"SLURM_PROCID": "0", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "1", "SLURM_LOCALID": "0",
      "SLURM_STEP_NODELIST": "n[2-1]"}, "SLURM_STEP_NODELIST 'n[2-1]'"),
    ({"SLURM_PROCID": "0", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "1", "SLURM_LOCALID": "0",
      "SLURM_STEP_NODELIST": "n1"}, "SLURM_JOB_ID is not set"),
    ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2"},
     "OMPI_COMM_WORLD_LOCAL_RANK is not set"),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "5"}, "MASTER_ADDR not set"),
])
def test_errors_name_the_variable(env, want, saved_environ):
    for k in list(os.environ):
        if k in RENDEZVOUS or k.startswith(("SLURM_", "OMPI_COMM_WORLD")):
            del os.environ[k]
    os.environ.update(env)
    with pytest.raises((RuntimeError, ValueError)) as e:
        launch.init_process_group("gloo")
    assert want in str(e.value)


@pytest.fixture
def saved_environ():
    # init_process_group writes RANK, WORLD_SIZE, ... into os.environ
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


def test_ranks_on_several_hosts_need_an_address():
    env = {"OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}
    with pytest.raises(RuntimeError, match="ZPP_BOOTSTRAP_ADDR nor MASTER_ADDR"):
        launch._root_address(env)
    assert launch._root_address({**env, "ZPP_BOOTSTRAP_ADDR": "10.1.2.3",
                                 "MASTER_ADDR": "h"}) == "10.1.2.3"
    assert launch._root_address({**env, "MASTER_ADDR": "h0"}) == "h0"
    assert launch._root_address({"OMPI_COMM_WORLD_SIZE": "4",
                                 "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}) == "127.0.0.1"


def test_launcher_precedence():
    assert launch.launcher({"RANK": "0", "OMPI_COMM_WORLD_RANK": "1"}) == "torchrun"
    # mpirun inside an allocation: the allocation's SLURM_* are inherited
    assert launch.launcher({"OMPI_COMM_WORLD_RANK": "1", "SLURM_PROCID": "0"}) == "mpirun"
    assert launch.launcher({"SLURM_PROCID": "0"}) == "srun"
    assert launch.launcher({}) is None


FIRST_HOST = [("node[01-04,07],gpu3", "node01"), ("a-[1-2]-b", "a-1-b"), ("gpu3", "gpu3"),
              ("node[007]", "node007"), ("node[0010-0020]", "node0010"),
              ("rack[2-3]-node[08-12,1]", "rack2-node08"), ("[5-6]x", "5x"),
              ("c1.cluster.example,c2", "c1.cluster.example"), ("n[9-10],m[1-2]", "n9"),
              ("host_a[3]", "host_a3")]
MALFORMED = ["", ",node1", "node1,", "a,,b", "node[", "node[1-3", "node]1", "node[]",
             "node[a-b]", "node[3-1]", "node[1-]", "node[-1]", "node[1,]", "node[[1]]",
             "node 1", "node[1:2]", "nöde", "n[1]x[2-1]", "ok,bad[2-1]",
             "n[1234567890123456789]"]


@pytest.mark.parametrize("text, first", FIRST_HOST)
def test_slurm_first_host(text, first):
    assert launch.slurm_first_host(text) == first


def test_slurm_first_host_random():
    rng = random.Random(SEED)
    print("seed ZPP_TEST_SEED=%d" % SEED)
    chars = "abcdefghijklmnopqrstuvwxyz0123456789-._"
    for _ in range(2000):
        hosts, first = [], None
        for k in range(rng.randint(1, 3)):
            text, f = "", ""
            for p in range(rng.randint(1, 3)):
                pre = rng.choice(chars[:26]) if p == 0 else ""
                pre += "".join(rng.choice(chars) for _ in range(rng.randint(0, 5)))
                text, f = text + pre, f + pre
                if rng.random() < 0.25:
                    continue
                width, items = rng.randint(1, 3), []
                for i in range(rng.randint(1, 3)):
                    a = rng.randrange(90)
                    item = "%0*d" % (width, a)
                    if i == 0:
                        f += item
                    if rng.random() < 0.5:
                        item += "-%0*d" % (width, a + rng.randrange(20))
                    items.append(item)
                text += "[" + ",".join(items) + "]"
            hosts.append(text)
            first = f if first is None else first
        assert launch.slurm_first_host(",".join(hosts)) == first, hosts


@pytest.mark.parametrize("text", MALFORMED)
def test_slurm_first_host_malformed(text):
    with pytest.raises(ValueError) as e:
        launch.slurm_first_host(text, "SLURM_JOB_NODELIST")
    assert "SLURM_JOB_NODELIST %r" % text in str(e.value)


def test_slurm_port_formula():
    ports = {launch.slurm_port({"SLURM_JOB_ID": "123456", "SLURM_STEP_ID": str(s)})
             for s in range(40)}
    assert len(ports) == 40 and all(10000 <= p and p + 1 <= 32767 for p in ports)
    assert launch.slurm_port({"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "3"}) == 10000 + 2 * (7 * 61 + 3)


# ---- the rank and world size reach torch whatever the rendezvous -------------

def _python(code: str, e: dict, timeout: float = 60):
    return run_bounded([sys.executable, "-c", code], timeout, env=e, text=True)


_GIVEN = '''
import os, sys
import torch.distributed as dist
import zpp
kind = sys.argv[1]
kw = {"store": dist.HashStore()} if kind == "store" else {"init_method": kind}
zpp.init_process_group("gloo", **kw)
print(dist.get_rank(), dist.get_world_size(), os.environ["RANK"], os.environ["WORLD_SIZE"],
      os.environ["LOCAL_RANK"])
dist.destroy_process_group()
'''


@pytest.mark.parametrize("launcher_env", ["torchrun", "srun"])
@pytest.mark.parametrize("kind", ["store", "tcp"])
def test_store_or_init_method_given_gets_the_rank_and_world_size(launcher_env, kind):
    """store= and init_method= skip the rendezvous, not the rank and world
    size read from the launcher (torch needs both with them)."""
    if launcher_env == "torchrun":
        e = clean_env(RANK=0, WORLD_SIZE=1, LOCAL_RANK=0)
    else:
        e = clean_env(SLURM_PROCID=0, SLURM_NTASKS=1, SLURM_LOCALID=0, SLURM_JOB_ID=5,
                      SLURM_STEP_ID=0, SLURM_STEP_NODELIST="localhost")
    arg = "store" if kind == "store" else "tcp://127.0.0.1:%d" % free_port()
    p = run_bounded([sys.executable, "-c", _GIVEN, arg], 60, env=e, text=True)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.split() == ["0", "1", "0", "1", "0"], p.stdout


# ---- srun's rendezvous is bounded by ZPP_TIMEOUT_S ---------------------------

def test_srun_rendezvous_without_rank_0_ends_within_zpp_timeout():
    """Rank 1 of 2 under srun's variables, nobody at rank 0's port: it
    gives up after ZPP_TIMEOUT_S (2 s here), not torch's 30 minutes."""
    port = free_port()
    e = clean_env(SLURM_PROCID=1, SLURM_NTASKS=2, SLURM_LOCALID=1, SLURM_JOB_ID=5,
                  SLURM_STEP_ID=0, SLURM_STEP_NODELIST="localhost", MASTER_PORT=port,
                  ZPP_TIMEOUT_S=2)
    code = "import zpp; zpp.init_process_group('gloo')"
    t0 = time.monotonic()
    try:
        p = _python(code, e, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("init_process_group still waited for rank 0 after 60 s (ZPP_TIMEOUT_S=2)")
    took = time.monotonic() - t0
    assert p.returncode != 0, p.stdout
    assert took < 40, "gave up after %.0f s (ZPP_TIMEOUT_S=2)" % took


# ---- a failed call leaves the environment as it was ---------------------------

FAILING_AFTER_RANKS = [
    ({"SLURM_PROCID": "0", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "1", "SLURM_LOCALID": "0"},
     "neither MASTER_ADDR nor SLURM_STEP_NODELIST"),
    ({"SLURM_PROCID": "0", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "1", "SLURM_LOCALID": "0",
      "SLURM_STEP_NODELIST": "n[2-1]"}, "SLURM_STEP_NODELIST 'n[2-1]'"),
]  # (under mpirun: test_rank_0s_failure_reaches_every_rank)


@pytest.mark.parametrize("env, want", FAILING_AFTER_RANKS)
def test_failed_call_writes_no_rank_variables(env, want, saved_environ):
    """A failure after the launcher's variables were read leaves RANK,
    WORLD_SIZE and LOCAL_RANK unset: a second call reads the launcher
    again (with RANK written, it would be taken for torchrun's)."""
    _only(env)
    for attempt in (1, 2):
        with pytest.raises((RuntimeError, ValueError)) as e:
            launch.init_process_group("gloo")
        assert want in str(e.value), (attempt, str(e.value))
        for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
            assert k not in os.environ, (k, os.environ[k])


@pytest.mark.parametrize("env, want", [
    ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK 'x': must be a non-negative integer"),
    ({"RANK": "-1", "WORLD_SIZE": "2"}, "RANK '-1': must be a non-negative integer"),
    ({"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"},
     "RANK 2: must be below WORLD_SIZE 2"),
    ({"RANK": "0", "WORLD_SIZE": "0", "MASTER_ADDR": "h", "MASTER_PORT": "1"},
     "WORLD_SIZE 0: must be at least 1"),
])
def test_torchrun_variables_are_checked_by_name(env, want):
    # (a subprocess: a call that went on would wait for a rendezvous)
    p = _python(_EXPECT_FAIL, clean_env(**env), timeout=60)
    assert p.returncode == 0 and want in p.stdout, p.stdout + p.stderr[-3000:]


_EXPECT_FAIL = '''
import os
import zpp
try:
    zpp.init_process_group("gloo")
except RuntimeError as e:
    print("failed:", e)
    print("RANK after the call:", os.environ.get("RANK"))
else:
    raise SystemExit("init_process_group succeeded")
'''


def _only(env):
    for k in list(os.environ):
        if k in RENDEZVOUS or k.startswith(("SLURM_", "OMPI_COMM_WORLD")):
            del os.environ[k]
    os.environ.update(env)


# ---- MPICH's or Intel MPI's hydra inside an allocation -----------------------

HYDRA = {"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0", "SLURM_JOB_ID": "9",
         "SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": "localhost"}


@pytest.mark.parametrize("extra, want", [
    ({}, "srun"),
    ({"PMI_RANK": "1", "PMI_SIZE": "2"}, "srun"),           # srun --mpi=pmi2
    ({"PMIX_RANK": "1"}, "srun"),                           # srun --mpi=pmix
    ({"PMI_RANK": "5", "PMI_SIZE": "8", "MPI_LOCALRANKID": "1"}, None),  # hydra
    ({"PMI_RANK": "1", "PMI_SIZE": "8", "MPI_LOCALRANKID": "1"}, None),
    ({"PMI_RANK": "1", "PMI_SIZE": "8"}, None),
    ({"PMI_SIZE": "2"}, None),
    ({"MPI_LOCALRANKID": "0"}, None),
    ({"PMIX_RANK": "4"}, None),
])
def test_mpi_launchers_inside_an_allocation_are_not_srun(extra, want):
    """The rule of the C bootstrap (test_bootstrap.cc,
    OtherLaunchersInsideAnAllocationAreNotSrun)."""
    assert launch.launcher({**HYDRA, **extra}) == want


def test_hydra_rank_is_refused_naming_the_variables():
    # (a subprocess: taken for srun's task, it would wait for a rank 0)
    e = clean_env(**HYDRA, PMI_RANK=5, PMI_SIZE=8, MPI_LOCALRANKID=1, ZPP_TIMEOUT_S=5)
    p = _python(_EXPECT_FAIL, e, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]
    assert "SLURM_PROCID is the allocation's, not this rank's" in p.stdout, p.stdout
    assert "RANK after the call: None" in p.stdout, p.stdout


# ---- rank 0's message under mpirun fits its buffer ---------------------------

class _OneRankMpi:
    """Comm.from_mpi of a world of 1: the all-gather returns the buffer."""

    def allgather(self, buf):
        return buf.copy()

    def close(self):
        pass


def _mpirun_rank0(monkeypatch, store, **extra):
    import torch.distributed as dist

    import zpp.comm

    monkeypatch.setattr(zpp.comm.Comm, "from_mpi", classmethod(lambda cls, **kw: _OneRankMpi()))
    monkeypatch.setattr(dist, "TCPStore", store)
    _only({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1",
           "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "1", **extra})
    with pytest.raises(RuntimeError) as e:
        launch.init_process_group("gloo")
    return str(e.value)


def test_rank_0s_long_non_ascii_error_reaches_the_ranks_shortened(monkeypatch, saved_environ):
    """Characters outside the BMP take 12 bytes of JSON each: the error is
    shortened until the message fits 1024 bytes, not cut blindly."""
    def store(*a, **kw):
        raise RuntimeError("\U0001F600" * 500 + " and more")

    msg = _mpirun_rank0(monkeypatch, store)
    assert msg.startswith("zpp.init_process_group: rank 0 could not open the rendezvous store: "
                          "RuntimeError: \U0001F600"), msg[:200]
    assert "and more" not in msg  # shortened (to about 80 of them)


def test_rank_0s_address_longer_than_a_host_name_is_named(monkeypatch, saved_environ):
    class Store:
        def __init__(self, *a, **kw):
            self.port = 12345

    msg = _mpirun_rank0(monkeypatch, Store, ZPP_BOOTSTRAP_ADDR="h" * 2000)
    assert "ZPP_BOOTSTRAP_ADDR 'hhhh" in msg and "2000 bytes, longer than the 255" in msg, msg


# ---- zpp-bench reads the launcher's variables as the library does -------------

def test_bench_with_empty_rank_under_srun_is_srun_s_rank():
    """RANK="" is unset (as the library reads it): under srun's variables
    the task is SLURM_PROCID's rank, and what only rank 0 prints (the
    settings, a flag's error) stays off rank 1."""
    bench = BUILD / "perf" / "zpp-bench"
    if not bench.is_file():
        pytest.skip("%s not built" % bench)
    out = {}
    for r in (0, 1):
        e = clean_env(RANK="", SLURM_PROCID=r, SLURM_NTASKS=2, SLURM_LOCALID=r,
                      SLURM_JOB_ID=7, SLURM_STEP_ID=0, SLURM_STEP_NODELIST="localhost")
        p = run_bounded([str(bench), "--print-settings"], 60, env=e, text=True)
        q = run_bounded([str(bench), "--coll", "nope"], 60, env=e, text=True)
        out[r] = (p.returncode, p.stdout, q.returncode, q.stderr)
    assert out[0][0] == 0 and "ZPP_TIMEOUT_S" in out[0][1], out[0]
    assert out[0][2] == 2 and "--coll nope" in out[0][3], out[0]
    assert out[1][0] == 0 and out[1][1] == "", out[1]
    assert out[1][2] == 2 and out[1][3] == "", out[1]


def test_bench_usage_names_what_the_env_bootstrap_needs():
    bench = BUILD / "perf" / "zpp-bench"
    if not bench.is_file():
        pytest.skip("%s not built" % bench)
    p = run_bounded([str(bench), "--help"], 60, env=clean_env(), text=True)
    text = " ".join(p.stdout.split())
    assert "default: env when RANK and WORLD_SIZE, or SLURM_PROCID and SLURM_STEP_ID" in text, text
