"""zpp: communication-compressed collectives for ZeRO-3 (qwZ, hpZ, qgZ)
from Python, on numpy arrays and CPU torch tensors.

    import zpp
    comm = zpp.Comm.from_mpi()                 # or from_env / from_process_group
    full = comm.qwz_allgather(shard, bits=8)   # quantized weight all-gather
    grad = comm.qgz_reduce_scatter(g, op="mean", residual=comm.qgz_residual(n))
    zpp.quant.error(x, bits=4, block=256)      # the quantizer alone

``zpp.fsdp`` plugs the collectives into PyTorch FSDP2;
``zpp.init_process_group("gloo")`` starts torch.distributed under torchrun,
mpirun or srun with no MASTER_ADDR / MASTER_PORT to set (``zpp.launch``).
The library is
``ZPP_LIBRARY`` or the libzpp.so installed beside the package; errors are
:class:`zpp.Error` with zpp's message and status code.
"""

from . import quant
from ._lib import DeviceError, DtypeError, Error
from .comm import Comm, Work, qgz_config, quant_config
from .launch import init_process_group

__all__ = ["Comm", "Work", "Error", "DtypeError", "DeviceError", "quant", "version",
           "cuda_available", "quant_config", "qgz_config", "init_process_group"]


def version() -> tuple[int, int, int]:
    """Run-time version of the loaded libzpp (major, minor, patch)."""
    from . import _lib

    L = _lib.get()
    v = L.ffi.new("int *")
    L.check(L.lib.zpp_get_version(v))
    return (v[0] // 10000, v[0] // 100 % 100, v[0] % 100)


def cuda_available() -> bool:
    from . import _lib

    return bool(_lib.get().lib.zpp_cuda_available())
