"""One process: the bindings against the headers, zpp.quant against an
independent float64 reference with the bound of docs/format.md, errors
with zpp's messages, and the installed package's layout (`python -m zpp`)."""

import json
import os
import shutil
import sys

import numpy as np
import pytest
import torch

import zpp
from zpp import _lib

from conftest import LIB, ROOT, run_bounded

SEED = int(os.environ.get("ZPP_TEST_SEED", "20261130"))


def setup_module(_):
    print("seed %d" % SEED)


def test_structs_come_from_the_headers_and_defaults_from_their_init_macros():
    L = _lib.get()
    # every struct_size is the header's sizeof, and the defaults are the
    # INIT macro's (ZPP_QUANT_CONFIG_INIT: INT8, block 256)
    q = L.new("zpp_quant_config_t")
    assert q.struct_size == L.ffi.sizeof("zpp_quant_config_t")
    assert (q.bits, q.block_size) == (8, 256)
    g = L.new("zpp_qgz_config_t")
    assert (g.intra_bits, g.inter_bits, g.residual_bits) == (4, 4, 32)
    # the library accepts them (it checks struct_size)
    assert L.lib.zpp_quant_config_check(q) == 0
    assert zpp.version() == (L.lib.ZPP_VERSION_MAJOR, L.lib.ZPP_VERSION_MINOR,
                             L.lib.ZPP_VERSION_PATCH)
    assert L.lib.ZPP_UINT8 == 3 and L.string(L.lib.zpp_dtype_name(L.lib.ZPP_UINT8)) == "u8"


def _bound(x: np.ndarray, bits: int, block: int) -> np.ndarray:
    """Per-element bound of docs/format.md (symmetric): half a step of the
    block's scale, plus the fp32 rounding of scale and product."""
    x = x.astype(np.float64)
    b = np.empty_like(x)
    levels = (1 << (bits - 1)) - 1
    for s in range(0, x.size, block):
        blk = x[s:s + block]
        rng = np.max(np.abs(blk))
        scale = rng / levels * (1 + 2.0 ** -23)
        b[s:s + block] = scale * (0.5 + 2.0 ** -12) + 2.0 ** -22 * (np.abs(blk) + rng) + 2.0 ** -149
    return b


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("block", [32, 256])
@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_quant_round_trip_within_the_format_bound(bits, block, kind):
    rng = np.random.default_rng(SEED + bits * 7 + block)
    x = (rng.standard_normal(4099) * rng.choice([0.01, 1.0, 50.0], 4099)).astype(np.float32)
    a = torch.from_numpy(x) if kind == "torch" else x
    enc = zpp.quant.encode(a, bits=bits, block=block)
    assert type(enc) is type(a) and str(enc.dtype).endswith("uint8")
    nbytes = enc.numel() if kind == "torch" else enc.size
    assert nbytes == zpp.quant.encoded_size(x.size, bits=bits, block=block)
    y = zpp.quant.decode(enc, x.size, bits=bits, block=block)
    y = y.numpy() if kind == "torch" else y
    err = np.abs(y.astype(np.float64) - x.astype(np.float64))
    bound = _bound(x, bits, block)
    worst = float(np.max(err / bound))
    print("int%d block %d %s: largest error / bound %.3f" % (bits, block, kind, worst))
    assert worst <= 1.0
    assert worst > 0.1  # the round trip is not the identity: the test can fail
    e = zpp.quant.error(a, bits=bits, block=block)
    assert e["max_abs_error"] == pytest.approx(float(err.max()), rel=1e-12)


def test_quant_bf16_torch_round_trip():
    torch.manual_seed(SEED)
    x = torch.randn(1000).to(torch.bfloat16)
    enc = zpp.quant.encode(x, bits=8, block=64)
    y = zpp.quant.decode(enc, 1000, dtype=torch.bfloat16, bits=8, block=64)
    xf = x.double().numpy()
    # the bf16 output rounding (2^-8 relative) on top of the format bound
    bound = _bound(xf.astype(np.float32), 8, 64) + np.abs(y.double().numpy()) * 2.0 ** -8
    assert np.all(np.abs(y.double().numpy() - xf) <= bound)


def test_errors_carry_zpp_message_and_code():
    with pytest.raises(zpp.Error) as ei:
        zpp.quant.encode(np.ones(8, np.float32), bits=3)
    assert ei.value.code == -1 and ei.value.status == "ZPP_ERR_INVALID_ARGUMENT"
    assert "bits 3" in str(ei.value) and "zpp_quant_config_check" in str(ei.value)
    with pytest.raises(zpp.Error) as ei:
        zpp.quant.encode(np.ones(8, np.float32), block=0)
    assert "block_size 0" in str(ei.value)


def test_error_of_a_call_is_its_own_not_the_communicators_last():
    # A call that fails before it touches the communicator (an overflowing
    # residual size) must not report the communicator's older error.
    with zpp.Comm.from_unique_id(zpp.Comm.unique_id(), 1, 0) as c:
        with pytest.raises(zpp.Error) as ei:
            c.node_of(99)
        assert "rank 99" in str(ei.value)
        with pytest.raises(zpp.Error) as ei:
            c.qgz_residual(2**62)
        assert ei.value.status == "ZPP_ERR_OVERFLOW"
        assert "zpp_qgz_residual_count" in str(ei.value) and "rank 99" not in str(ei.value), ei.value


def test_read_only_output_is_refused_naming_it():
    x = np.arange(8, dtype=np.float32)
    frozen = np.frombuffer(bytes(32), dtype=np.float32)  # memory of a bytes object
    with zpp.Comm.from_unique_id(zpp.Comm.unique_id(), 1, 0) as c:
        for call, what in ((lambda: c.allgather(x, frozen), "out"),
                           (lambda: c.reduce_scatter(x, frozen), "out"),
                           (lambda: c.qgz_reduce_scatter(x, residual=np.frombuffer(
                               bytes(4 * c.qgz_residual(8).size), np.float32)), "residual")):
            with pytest.raises(ValueError, match="%s: the array is read-only" % what):
                call()
        assert not frozen.any()  # nothing was written


_DROPPED_WORK = """
import gc, weakref, numpy as np, zpp
c = zpp.Comm.from_unique_id(zpp.Comm.unique_id(), 1, 0)
x = np.arange(4099, dtype=np.float32)
out = np.empty_like(x)
alive = weakref.ref(out)
c.allgather(x, out, async_op=True)  # the Work dropped at once
del out
gc.collect()
print("alive", alive() is not None)
for _ in range(50):  # outputs made inside, only the dropped Work held them
    c.allgather(x, async_op=True)
    c.reduce_scatter(x, async_op=True)
gc.collect()
w = c.allgather(x, async_op=True)
c.close()  # drops the C requests not waited for: the Work's wait must still work
print("after close", w.wait(), np.array_equal(w.result, x), alive() is None)
"""


def test_collectives_on_a_closed_communicator_say_so():
    c = zpp.Comm.from_unique_id(zpp.Comm.unique_id(), 1, 0)
    c.close()
    x = np.ones(4, np.float32)
    for call in (lambda: c.allgather(x), lambda: c.reduce_scatter(x),
                 lambda: c.qwz_allgather(x), lambda: c.qgz_reduce_scatter(x)):
        with pytest.raises(ValueError, match="the communicator is closed"):
            call()


def test_async_arrays_outlive_a_dropped_work_and_close_waits():
    # Before the communicator held its started Works, a dropped Work freed
    # the arrays the engine was writing ("free(): corrupted unsorted
    # chunks"), and a wait after close() used a freed request.
    e = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
    p = run_bounded([sys.executable, "-c", _DROPPED_WORK], 120, env=e, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.split("\n")[:2] == ["alive True", "after close True True True"], p.stdout


@pytest.mark.parametrize("dtype", [np.float64, np.int32, np.complex64])
def test_unsupported_numpy_dtype_names_it(dtype):
    with pytest.raises(zpp.DtypeError) as ei:
        zpp.quant.encode(np.ones(8, dtype))
    assert np.dtype(dtype).name in str(ei.value)


def test_unsupported_torch_dtype_and_device_name_them():
    with pytest.raises(zpp.DtypeError, match="torch.float64"):
        zpp.quant.encode(torch.ones(8, dtype=torch.float64))
    with pytest.raises(zpp.DtypeError, match="torch.uint8"):
        zpp.quant.encode(torch.ones(8, dtype=torch.uint8))  # bytes: all-gather only
    # a tensor off the CPU ("meta" exists on every machine; a CUDA tensor
    # takes the same path)
    with pytest.raises(zpp.DeviceError, match="meta"):
        zpp.quant.encode(torch.empty(8, device="meta"))


def test_library_not_found_is_a_clear_error(tmp_path):
    code = "import zpp; zpp.version()"
    e = dict(os.environ, ZPP_LIBRARY=str(tmp_path / "nope.so"),
             PYTHONPATH=str(ROOT / "python"))
    p = run_bounded([sys.executable, "-c", code], 60, env=e, text=True)
    assert p.returncode != 0 and "ZPP_LIBRARY=%s: no such file" % (tmp_path / "nope.so") in p.stderr


def test_installed_layout_finds_library_and_headers_beside_the_package(tmp_path):
    # the layout `pip install .` makes (pyproject.toml; CMakeLists.txt's
    # install component "python"): zpp/libzpp.so, zpp/include/zpp/*.h
    # (make test-wheel builds and installs the real wheel)
    site = (tmp_path / "site").resolve()
    pkg = site / "zpp"
    shutil.copytree(ROOT / "python" / "zpp", pkg, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(LIB, pkg / "libzpp.so")
    shutil.copytree(ROOT / "include" / "zpp", pkg / "include" / "zpp")
    # no ZPP_LIBRARY, no source tree on the path: the installed copy alone
    e = {k: v for k, v in os.environ.items()
         if k not in ("ZPP_LIBRARY", "PYTHONPATH", "ZPP_INCLUDE_DIR")}
    e["PYTHONPATH"] = str(site)

    def zpp_main(*args, **env):
        p = run_bounded([sys.executable, "-m", "zpp", *args], 60, env=dict(e, **env), text=True,
                        cwd=tmp_path)
        assert p.returncode == 0, p.stderr
        return p.stdout

    d = json.loads(zpp_main("--json"))
    assert (d["library"], d["library_from"]) == (str(pkg / "libzpp.so"), "package")
    assert d["headers"] == str(pkg / "include")
    assert d["version"] == "%d.%d.%d" % zpp.version()
    # the features are the library's own (zpp_get_build_features, read here
    # through the bindings of the test process)
    L = _lib.get()
    f = L.ffi.new("unsigned *")
    L.check(L.lib.zpp_get_build_features(f))
    assert d["built"]["mpi"] == bool(f[0] & L.lib.ZPP_FEATURE_MPI)
    assert d["built"]["cuda"] == bool(f[0] & L.lib.ZPP_FEATURE_CUDA)
    assert d["runtime"]["cuda_available"] == zpp.cuda_available()
    text = zpp_main()
    assert text.startswith("zpp %s\n" % d["version"])
    assert "library:  %s (installed with the package)" % (pkg / "libzpp.so") in text
    # ZPP_LIBRARY wins over the library beside the package
    d = json.loads(zpp_main("--json", ZPP_LIBRARY=str(LIB)))
    assert (d["library"], d["library_from"]) == (str(LIB), "ZPP_LIBRARY")
