"""zpp.Comm on device memory (CUDA arrays, streams) through the Python
bindings, on the emulated CUDA runtime (tests/cuda_emu) with both device
backends: MPI staging through pinned memory, and the NCCL transport over
the NCCL stand-in (tests/nccl_emu).  Needs the emulated build of libzpp:
``make test-python-emu`` (part of ``make test``) runs this file against
build-emu/; against any other build it is skipped, saying so.  A real GPU
and torch CUDA tensors are not exercised here (no GPU on this machine)."""

import re

import pytest

from conftest import BUILD, TESTS, mpirun


def _emulated() -> bool:
    cache = BUILD / "CMakeCache.txt"
    return cache.is_file() and re.search(r"^ZPP_CUDA_EMU:BOOL=ON$", cache.read_text(), re.M) is not None


pytestmark = pytest.mark.skipif(not _emulated(), reason="needs the emulated CUDA build "
                                "(ZPP_BUILD_DIR=build-emu: make test-python-emu)")


def _nccl_emu():
    p = BUILD / "tests" / "libzpp_nccl_emu.so"
    if not p.is_file():
        pytest.fail("no NCCL stand-in at %s (make emu builds it)" % p)
    return p


@pytest.mark.parametrize("topo,np_", [("2x2", 4), ("1x1", 1)])
def test_device_collectives_mpi_staging(have_mpirun, topo, np_):
    out = mpirun(np_, [TESTS / "device_driver.py", "mpi"], ZPP_TOPO=topo,
                 ZPP_BUILD_DIR=BUILD, ZPP_TIMEOUT_S=60)
    assert out and out[0]["world"] == np_ and out[0]["backend"] == "mpi"
    print(out[0])


def test_device_collectives_nccl_transport(have_mpirun):
    out = mpirun(4, [TESTS / "device_driver.py", "nccl"], ZPP_TOPO="2x2", ZPP_BUILD_DIR=BUILD,
                 ZPP_NCCL_LIBRARY=_nccl_emu(), ZPP_TIMEOUT_S=60)
    assert out and out[0]["world"] == 4 and out[0]["backend"] == "nccl" and out[0]["nnodes"] == 2
    print(out[0])


@pytest.mark.parametrize("backend", ["mpi", "nccl"])
def test_device_collectives_stream_ordered(have_mpirun, backend):
    """Calls and Work.wait() return while their stream is held; results
    exact after; the waiting stream is ordered; stream 2; lifetimes."""
    extra = {"ZPP_NCCL_LIBRARY": _nccl_emu()} if backend == "nccl" else {}
    out = mpirun(2, [TESTS / "stream_driver.py", backend], ZPP_TOPO="2x1", ZPP_BUILD_DIR=BUILD,
                 ZPP_TIMEOUT_S=60, **extra)
    assert out and out[0]["world"] == 2 and out[0]["backend"] == backend
    print(out[0])


@pytest.mark.parametrize("backend", ["mpi", "nccl"])
def test_device_requests_freed_once_run(have_mpirun, backend):
    """Blocking calls and stream-ordered waits hold their requests and
    arrays only while in flight; repeated stream-ordered waits; threads
    waiting for one Work; tensors never asked for the interface; refused
    calls abandon nothing; a stream past 2**64 - 1 keeps the request."""
    extra = {"ZPP_NCCL_LIBRARY": _nccl_emu()} if backend == "nccl" else {}
    out = mpirun(2, [TESTS / "lifetime_driver.py", backend], ZPP_TOPO="2x1", ZPP_BUILD_DIR=BUILD,
                 ZPP_TIMEOUT_S=60, **extra)
    assert out and out[0]["world"] == 2 and out[0]["backend"] == backend
    print(out[0])
