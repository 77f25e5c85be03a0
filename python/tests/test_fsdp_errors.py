"""zpp.fsdp.enable() refuses bad input before it installs anything: every
option, the FSDP modules' mixed-precision policies, each parameter's dtype
and device, a model without FSDP modules, a second enable() while the
first handle is open.  Each case expects the message naming the argument
(or module, or parameter) and then asserts that no communicator was opened
and no hook set.  Also zpp.Comm's own checks of bits and block sizes, the
close-then-enable cycle, and the line enable() logs once on rank 0.

One process: a 1-rank gloo process group in this process (a free port on
127.0.0.1), small models sharded with fully_shard on the CPU mesh.  The
log test launches 2 ranks under torchrun (python/tests/enable_driver.py),
since only a launch shows that rank 1 stays quiet and that the line shows
with logging left unconfigured (pytest configures it here).
"""

import logging
import os
import re
import socket
import sys

import pytest

from conftest import TESTS, env, free_port, run_bounded

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard  # noqa: E402

import zpp  # noqa: E402
import zpp.comm  # noqa: E402
import zpp.fsdp  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def world1():
    port = free_port()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=0,
                            world_size=1)
    yield
    dist.destroy_process_group()


class Ints(nn.Module):
    """A module whose only parameter is integer (frozen)."""

    def __init__(self):
        super().__init__()
        self.table = nn.Parameter(torch.arange(8), requires_grad=False)


def _model(dtype=torch.float32, mp=None, raf=True, extra=None):
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))
    if extra is not None:
        m.append(extra)
    m.to(dtype)
    kw = {} if mp is None else {"mp_policy": mp}
    fully_shard(m[0], reshard_after_forward=raf, **kw)
    if extra is not None:
        fully_shard(m[2], reshard_after_forward=raf, **kw)
    fully_shard(m, reshard_after_forward=raf, **kw)
    return m


def _groups(m):
    return [g for x in m.modules() if isinstance(x, zpp.fsdp.FSDPModule)
            for g in x._get_fsdp_state()._fsdp_param_groups]


def _zpp_hooks(m):
    """The param groups that have one of zpp's hooks."""
    return [g for g in _groups(m) if isinstance(g._all_gather_comm, zpp.fsdp.AllGather)
            or isinstance(g._reduce_scatter_comm, zpp.fsdp.ReduceScatter)]


def _refused(m, pat, exc=ValueError, **kw):
    live = list(zpp.comm._live)
    before = [(g._all_gather_comm, g._reduce_scatter_comm) for g in _groups(m)]
    with pytest.raises(exc, match=pat):
        zpp.fsdp.enable(m, **kw)
    assert zpp.comm._live == live, "a communicator was opened before the error"
    assert _zpp_hooks(m) == [], "a hook was set before the error"
    assert [(g._all_gather_comm, g._reduce_scatter_comm) for g in _groups(m)] == before


OPTIONS = [
    (dict(qwz_bits=3), r"qwz_bits 3: must be 0 \(off\), 4 or 8"),
    (dict(qwz_bits="8"), r"qwz_bits '8': must be 0 \(off\), 4 or 8"),
    (dict(qwz_bits=True), r"qwz_bits True: must be 0 \(off\), 4 or 8"),
    (dict(qgz_bits=16), r"qgz_bits 16: must be 0 \(off\), 4 or 8"),
    (dict(qgz_bits=4, qgz_intra_bits=12), r"qgz_intra_bits 12: must be 0 \(qgz_bits\), 4, 8 or 16"),
    (dict(qwz_bits=8, qwz_block=-256), r"qwz_block -256: must be an integer from 1 to 2\*\*64 - 1"),
    (dict(qgz_bits=4, qgz_block=-256), r"qgz_block -256: must be an integer from 1"),
    (dict(qwz_bits=8, qwz_block=0), r"qwz_block 0: must be an integer from 1"),
    (dict(qgz_bits=4, qgz_block=0), r"qgz_block 0: must be an integer from 1"),
    (dict(qwz_bits=8, qwz_block=2**64), r"qwz_block 18446744073709551616: must be"),
    (dict(qwz_bits=8, qwz_block=256.0), r"qwz_block 256.0: must be an integer"),
    (dict(qwz_block=128), r"qwz_block 128 needs qwz_bits \(4 or 8\)"),
    (dict(qgz_block=128), r"qgz_block 128 needs qgz_bits \(4 or 8\)"),
    (dict(hadamard=32), r"hadamard 32 needs qgz_bits \(4 or 8\)"),
    (dict(qgz_bits=4, hadamard=24), r"hadamard 24: must be 0 \(off\) or a power of two >= 2 that "
                                    r"divides qgz_block 256"),
    (dict(qgz_bits=4, hadamard=512), r"hadamard 512: .*divides qgz_block 256"),
    (dict(qgz_bits=4, qgz_block=96, hadamard=64), r"hadamard 64: .*divides qgz_block 96"),
    (dict(qgz_bits=4, hadamard=-2), r"hadamard -2: must be 0 \(off\)"),
    (dict(error_feedback=True), r"error_feedback needs qgz_bits \(4 or 8\)"),
    (dict(qgz_bits=4, error_feedback=1), r"error_feedback 1: must be True or False"),
    (dict(memory="gpu"), r"memory 'gpu': must be 'host' \(CPU tensors\) or 'device'"),
]


@pytest.mark.parametrize("kw,pat", OPTIONS, ids=[repr(k) for k, _ in OPTIONS])
def test_bad_option_is_refused_by_name_before_anything_is_installed(kw, pat):
    _refused(_model(), pat, **kw)


def test_unknown_keyword_is_a_type_error_naming_it():
    _refused(_model(), r"unknown keyword membory \(the communicator's are topology, backend, "
                       r"timeout_s, memory, device\)", TypeError, membory="host")


def test_communicator_keywords_with_a_communicator_are_refused():
    with zpp.Comm.from_process_group() as c:
        _refused(_model(), r"backend=: only for the communicator enable\(\) makes, not with comm=",
                 comm=c, backend="ucx")


@pytest.mark.parametrize("field", ["param_dtype", "reduce_dtype"])
def test_policy_dtype_other_than_fp32_fp16_bf16_is_refused_naming_the_module(field):
    m = _model(mp=MixedPrecisionPolicy(**{field: torch.float64}))
    _refused(m, r"FSDP module \(the root\): MixedPrecisionPolicy.%s torch.float64: zpp's %s "
                r"takes torch.float32, torch.float16 or torch.bfloat16"
             % (field, "all-gather" if field == "param_dtype" else "reduce-scatter"))


def test_float64_model_is_refused_naming_the_first_parameter():
    # the all-gather would be float64 (FSDP2: "send has dtype torch.float64"
    # at the first gather of a 2-rank run)
    _refused(_model(torch.float64), r"parameter '0.weight' has dtype torch.float64: zpp's "
                                    r"all-gather takes torch.float32")


def test_float64_model_gathered_in_bf16_is_refused_for_its_float64_gradients():
    m = _model(torch.float64, mp=MixedPrecisionPolicy(param_dtype=torch.bfloat16))
    _refused(m, r"parameter '0.weight' has dtype torch.float64: its gradient would be "
                r"reduce-scattered in torch.float64")


def test_float64_model_with_bf16_gathers_and_fp32_reduce_is_accepted():
    m = _model(torch.float64, mp=MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                      reduce_dtype=torch.float32))
    z = zpp.fsdp.enable(m)
    try:
        assert len(_zpp_hooks(m)) == 2
    finally:
        z.close()


def test_integer_parameter_is_refused_by_its_qualified_name():
    _refused(_model(extra=Ints()), r"parameter '2.table' has dtype torch.int64: zpp's all-gather")


def test_model_without_fsdp_module_is_refused():
    live = list(zpp.comm._live)
    with pytest.raises(ValueError, match=r"no FSDPModule in the model \(call fully_shard first\)"):
        zpp.fsdp.enable(nn.Linear(4, 4))
    assert zpp.comm._live == live


def test_memory_device_for_cpu_parameters_is_refused():
    _refused(_model(), r"memory='device' but the parameters are on cpu \(host memory\)",
             zpp.DeviceError, memory="device")


def test_device_index_for_cpu_parameters_is_refused():
    _refused(_model(), r"device=0 but the parameters are on cpu", zpp.DeviceError, device=0)


def test_parameters_on_two_devices_are_refused(monkeypatch):
    # FSDP2 records the device of a module's collectives in its param group;
    # modules sharded on meshes of two devices (cuda:1 here, without a GPU,
    # by setting it) would hand zpp tensors of both
    m = _model()
    inner = m[0]._get_fsdp_state()._fsdp_param_groups[0]
    monkeypatch.setattr(inner, "device", torch.device("cuda", 1))
    _refused(m, r"parameter '1.weight' is on cpu but '0.weight' is on cuda:1: zpp's "
                r"communicators work on one device", zpp.DeviceError)


def test_parameters_on_another_device_type_are_refused(monkeypatch):
    m = _model()
    for g in _groups(m):
        monkeypatch.setattr(g, "device", torch.device("meta"))
    _refused(m, r"parameter '0.weight' is on device meta: zpp's communicators take CPU tensors",
             zpp.DeviceError)


def test_host_communicator_for_cuda_parameters_is_refused(monkeypatch):
    m = _model()
    for g in _groups(m):
        monkeypatch.setattr(g, "device", torch.device("cuda", 0))
    with zpp.Comm.from_process_group() as c:
        _refused(m, r"the communicator works on host memory but the parameters are on cuda:0 "
                    r"\(device memory\)", zpp.DeviceError, comm=c)


# ---- the communicator's keywords, before anything listens ----------------

def _listening() -> int:
    """TCP sockets of this process in the LISTEN state (/proc/self/net/tcp
    and tcp6 joined with this process's socket fds by inode)."""
    listen = set()
    for f in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        try:
            with open(f) as fh:
                rows = fh.read().splitlines()[1:]
        except OSError:
            continue
        for r in rows:
            cols = r.split()
            if len(cols) > 9 and cols[3] == "0A":
                listen.add(cols[9])
    mine = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            t = os.readlink("/proc/self/fd/" + fd)
        except OSError:
            continue
        if t.startswith("socket:["):
            mine.add(t[len("socket:["):-1])
    return len(listen & mine)


def test_listening_count_sees_a_listener():
    # the counter the tests below rely on
    n = _listening()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        assert _listening() == n + 1
    assert _listening() == n


COMM_KW = [
    (dict(backend="bogus"), r"backend 'bogus': must be 'auto', 'mpi', 'nccl' or 'ucx'"),
    (dict(backend=3), r"backend 3: must be 'auto'"),
    (dict(topology=5), r"topology 5: must be a string such as '2x4'"),
    (dict(topology="0," * 100), r"zpp_comm_config_check: cfg->topology: longer than 127"),
    (dict(timeout_s=0), r"timeout_s 0: must be a number of seconds > 0"),
    (dict(timeout_s=-1.5), r"timeout_s -1.5: must be a number of seconds > 0"),
    (dict(timeout_s="10"), r"timeout_s '10': must be a number of seconds > 0"),
]


@pytest.mark.parametrize("kw,pat", COMM_KW, ids=[repr(k) for k, _ in COMM_KW])
def test_bad_communicator_keyword_is_refused_before_anything_listens(kw, pat):
    n = _listening()
    _refused(_model(), r"zpp.fsdp.enable: " + pat, **kw)
    assert _listening() == n, "a listener was left open"


@pytest.mark.parametrize("kw,pat", COMM_KW, ids=[repr(k) for k, _ in COMM_KW])
def test_from_process_group_checks_its_keywords_before_it_listens(kw, pat):
    n, live = _listening(), list(zpp.comm._live)
    with pytest.raises(ValueError, match=pat):
        zpp.Comm.from_process_group(**kw)
    assert _listening() == n, "a listener was left open"
    assert zpp.comm._live == live


def test_from_process_group_stops_listening_when_the_id_cannot_be_shared(monkeypatch):
    class Broken:
        def set(self, key, value):
            raise RuntimeError("store gone")

    monkeypatch.setattr(dist.distributed_c10d, "_get_default_store", lambda: Broken())
    n = _listening()
    with pytest.raises(RuntimeError, match="store gone"):
        zpp.Comm.from_process_group()
    assert _listening() == n, "the unique id's listener was left open"


# ---- a failure half-way through enable() leaves nothing -------------------

def test_failed_install_puts_everything_back(monkeypatch):
    m = _model()
    calls = []

    def fail(self, hook):
        calls.append(self)
        if len(calls) == 2:  # the second module: the first has zpp's hooks by now
            raise RuntimeError("set_custom_reduce_scatter failed")
        return orig(self, hook)

    orig = zpp.fsdp.FSDPModule.set_custom_reduce_scatter
    monkeypatch.setattr(zpp.fsdp.FSDPModule, "set_custom_reduce_scatter", fail)
    n = _listening()
    _refused(m, r"set_custom_reduce_scatter failed", RuntimeError)
    assert len(calls) == 2
    assert _listening() == n, "a listener was left open"
    assert not any(x in zpp.fsdp._installed for x in m.modules()), "a module still has a handle"
    monkeypatch.undo()
    z = zpp.fsdp.enable(m)  # not refused as "already has zpp's hooks"
    try:
        assert len(_zpp_hooks(m)) == 2
    finally:
        z.close()


def test_failed_summary_on_rank_0_does_not_fail_enable(monkeypatch, caplog):
    """The log line is best-effort: only rank 0 writes it, so a failure
    there must not leave rank 0 out of what every rank does."""
    def fail(*a, **kw):
        raise KeyError("boom")

    monkeypatch.setattr(zpp.fsdp, "_summary", fail)
    m = _model()
    with caplog.at_level(logging.INFO, logger="zpp"):
        z = zpp.fsdp.enable(m)
    try:
        assert len(_zpp_hooks(m)) == 2 and not z.closed
        lines = [r.getMessage() for r in caplog.records if r.name == "zpp"]
        assert any("the summary of the choices failed: KeyError: 'boom'" in l
                   for l in lines), lines
    finally:
        z.close()
    assert _zpp_hooks(m) == []


def test_failed_log_handler_does_not_fail_enable(caplog):
    class Broken(logging.Handler):
        def emit(self, record):
            raise RuntimeError("handler broken")

        def handleError(self, record):
            raise RuntimeError("handler broken")

    log = logging.getLogger("zpp")
    h = Broken()
    log.addHandler(h)
    try:
        with caplog.at_level(logging.INFO, logger="zpp"):
            z = zpp.fsdp.enable(_model())
    finally:
        log.removeHandler(h)
    assert not z.closed
    z.close()


# ---- close() frees what enable() made, not the caller's ------------------

def test_close_leaves_a_communicator_passed_as_comm_open():
    with zpp.Comm.from_process_group() as c:
        m1, m2 = _model(), _model()
        z1 = zpp.fsdp.enable(m1, comm=c)
        z1.close()
        assert c in zpp.comm._live, "close() closed the caller's communicator"
        assert c.size == 1
        z2 = zpp.fsdp.enable(m2, comm=c)  # a second model on it
        assert len(_zpp_hooks(m2)) == 2
        assert z2.stats()["intra_bytes_sent"] == 0  # the communicator answers
        z2.close()
        assert c in zpp.comm._live


def test_close_leaves_comms_shared_by_two_models_open():
    comms = zpp.fsdp.Comms()
    try:
        m1, m2 = _model(), _model()
        z1 = zpp.fsdp.enable(m1, comms=comms)
        z2 = zpp.fsdp.enable(m2, comms=comms)
        z1.close()
        assert comms.world in zpp.comm._live, "close() closed the shared communicators"
        assert len(_zpp_hooks(m2)) == 2
        assert z2.stats()["intra_bytes_sent"] == 0  # the communicators answer
        z2.close()
        assert comms.world in zpp.comm._live
    finally:
        comms.close()
    assert comms.world not in zpp.comm._live


# ---- zpp.Comm's own checks ------------------------------------------------

COMM_CASES = [
    ("qwz_allgather", dict(bits=0), r"bits 0: must be 4 or 8"),
    ("qwz_allgather", dict(bits=-8), r"bits -8: must be 4 or 8"),
    ("qwz_allgather", dict(block=-256), r"block -256: must be an integer from 1 to 2\*\*64 - 1"),
    ("qwz_allgather", dict(block=0), r"block 0: must be an integer from 1"),
    ("qgz_reduce_scatter", dict(inter_bits=-4), r"inter_bits -4: must be 4 or 8"),
    ("qgz_reduce_scatter", dict(intra_bits=0), r"intra_bits 0: must be 4, 8 or 16"),
    ("qgz_reduce_scatter", dict(block=-256), r"block -256: must be an integer from 1"),
    ("qgz_reduce_scatter", dict(block=0), r"block 0: must be an integer from 1"),
    ("qgz_reduce_scatter", dict(hadamard=-32), r"hadamard -32: must be 0 \(off\) or a power of two"),
    ("qgz_residual_count", dict(intra_bits=-16), r"intra_bits -16: must be 4, 8 or 16"),
]


@pytest.mark.parametrize("fn,kw,pat", COMM_CASES, ids=["%s %r" % (f, k) for f, k, _ in COMM_CASES])
def test_comm_refuses_zero_and_negative_bits_and_blocks_by_argument(fn, kw, pat):
    # (before: an OverflowError from cffi for a negative value, and the C
    # check's "cfg->block_size 0" for a zero block); other values are left
    # to the C checks, which name the config field (comm_driver.py: bits 3)
    with zpp.Comm.from_unique_id(zpp.Comm.unique_id(), 1, 0) as c:
        x = torch.randn(64)
        args = (8,) if fn == "qgz_residual_count" else (x,)
        with pytest.raises(ValueError, match=pat):
            getattr(c, fn)(*args, **kw)


@pytest.mark.parametrize("fn,kw,pat", [
    ("quant_config", dict(block=-256), r"block -256: must be an integer from 1"),
    ("quant_config", dict(bits=2**40), r"bits 1099511627776: must be 4 or 8"),
    ("qgz_config", dict(block=-1), r"block -1: must be an integer from 1"),
    ("qgz_config", dict(hadamard=-32), r"hadamard -32: must be 0 \(off\)"),
])
def test_config_builders_name_values_their_c_field_cannot_hold(fn, kw, pat):
    # (0 and the other representable values are left to the C checks,
    # whose messages test_bindings.py expects)
    with pytest.raises(ValueError, match=pat):
        getattr(zpp, fn)(**kw)


# ---- a second enable, close ----------------------------------------------

def test_second_enable_names_the_open_handle_and_close_makes_it_legal():
    m = _model()
    z = zpp.fsdp.enable(m, qwz_bits=8, qgz_bits=4, error_feedback=True)
    assert len(_zpp_hooks(m)) == 2
    assert re.fullmatch(r"<zpp.fsdp.Zpp id=0x[0-9a-f]+, 2 FSDP modules, qwz_bits=8, qgz_bits=4, "
                        r"error_feedback=True, hpz=True, open>", repr(z)), repr(z)
    live = list(zpp.comm._live)
    hooks = [(g._all_gather_comm, g._reduce_scatter_comm) for g in _groups(m)]
    with pytest.raises(ValueError, match=r"FSDP module \(the root\) already has zpp's hooks from "
                                         + re.escape(repr(z)) + r": call its close\(\) first"):
        zpp.fsdp.enable(m, qwz_bits=4)
    # the same on a submodule, whose FSDP module the first call covered
    with pytest.raises(ValueError, match=r"FSDP module \(the root\) already has zpp's hooks from "
                                         + re.escape(repr(z))):
        zpp.fsdp.enable(m[0])
    assert zpp.comm._live == live
    assert [(g._all_gather_comm, g._reduce_scatter_comm) for g in _groups(m)] == hooks
    z.close()
    assert repr(z).endswith(", closed>")
    assert _zpp_hooks(m) == [], "close() left zpp's hooks on the model"
    assert all(not zpp.comm._live or c not in zpp.comm._live for c in z.comms.all())
    z.close()  # a second close does nothing
    z2 = zpp.fsdp.enable(m, qwz_bits=4)
    try:
        assert len(_zpp_hooks(m)) == 2 and z2.options.qwz_bits == 4
    finally:
        z2.close()


def test_close_puts_back_the_hooks_from_before_enable():
    m = _model()
    before = [(g._all_gather_comm, g._reduce_scatter_comm) for g in _groups(m)]
    z = zpp.fsdp.enable(m)
    assert [(g._all_gather_comm, g._reduce_scatter_comm) for g in _groups(m)] != before
    z.close()
    assert [(g._all_gather_comm, g._reduce_scatter_comm) for g in _groups(m)] == before
    # and the model trains again on them (FSDP2's own collectives, world 1)
    m(torch.randn(2, 8)).sum().backward()


# ---- the log line ----------------------------------------------------------

def test_enable_logs_one_info_line_with_its_choices(caplog):
    m = _model()
    with caplog.at_level(logging.INFO, logger="zpp"):
        z = zpp.fsdp.enable(m, qwz_bits=8)
        z.close()
    lines = [r.getMessage() for r in caplog.records if r.name == "zpp"]
    assert len(lines) == 1, lines
    assert all(r.levelno == logging.INFO for r in caplog.records if r.name == "zpp")
    line = lines[0]
    for want in ("2 FSDP modules", "1 rank on 1 discovered node;", "world communicator over torch's store "
                 "(TCP bootstrap)", "backend ucx (ZPP_BACKEND unset: UCX for host memory",
                 "memory host (parameters on cpu)", "qwZ 8 bits block 256 on inter-node gathers",
                 "qgZ: off", "hpZ: off (reshard_after_forward=True; one node)"):
        assert want in line, (want, line)


def test_logging_configured_above_info_hides_the_line(caplog):
    m = _model()
    with caplog.at_level(logging.WARNING, logger="zpp"):
        zpp.fsdp.enable(m).close()
    assert [r for r in caplog.records if r.name == "zpp"] == []


def _launch(extra_env):
    e = env(**extra_env)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--master-addr", "127.0.0.1", "--master-port", e["MASTER_PORT"],
           str(TESTS / "enable_driver.py")]
    p = run_bounded(cmd, 240, env=e, text=True)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    # from "zpp.fsdp:" on: both ranks and the C library (ZPP_DEBUG) write to
    # the same stderr, so a line may follow another's unfinished prefix
    return [l[l.index("zpp.fsdp:"):] for l in p.stderr.splitlines() if "zpp.fsdp:" in l]


def test_line_shows_once_on_rank_0_with_logging_unconfigured_and_debug_adds_detail():
    lines = _launch({"ZPP_TOPO": "2x1"})
    assert len(lines) == 1, lines
    line = lines[0]
    for want in ("3 FSDP modules", "2 ranks on 2 emulated nodes (ZPP_TOPO=2x1)",
                 "world communicator over torch's store (TCP bootstrap)",
                 "backend ucx (ZPP_BACKEND unset", "memory host (parameters on cpu)",
                 "algorithm auto across nodes (ZPP_ALGO unset)",
                 "qwZ 8 bits block 128 on inter-node gathers",
                 "qgZ 4 bits across nodes, 4 bits inside, block 256, error feedback",
                 "hpZ: zpp's, on for 2 of 3 modules (reshard_after_forward=True)",
                 "the root keeps its parameters gathered"):
        assert want in line, (want, line)
    # ZPP_DEBUG=INFO: the same line once, and each rank's world communicator
    lines = _launch({"ZPP_TOPO": "2x1", "ZPP_DEBUG": "INFO"})
    assert sum(1 for l in lines if "FSDP modules" in l) == 1, lines
    for r in (0, 1):
        assert sum(1 for l in lines if l.startswith("zpp.fsdp: rank %d: world communicator: "
                                                    "2 ranks on 2 nodes (emulated)" % r)) == 1, lines
