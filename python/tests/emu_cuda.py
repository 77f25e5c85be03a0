"""Device arrays for the Python tests on the emulated CUDA runtime
(tests/cuda_emu, the ``libzpp_cudart_emu.so`` that an emulated build of
libzpp links): a minimal ``__cuda_array_interface__`` array over
cudaMalloc'd memory, and the calls the tests need, through ctypes.  Host
code must never touch this memory (the emulator stops the process); data
moves with cudaMemcpy only."""

import ctypes
import os
from pathlib import Path

import numpy as np

H2D, D2H = 1, 2  # cudaMemcpyKind


def find(build: Path) -> Path:
    p = Path(os.environ.get("ZPP_EMU_CUDART", build / "tests" / "cuda_emu" / "libzpp_cudart_emu.so"))
    return p


class Cuda:
    def __init__(self, path: Path):
        # the same object libzpp loaded: one runtime, one set of devices
        self.lib = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
        for name in ("cudaMalloc", "cudaFree", "cudaMemcpy", "cudaSetDevice", "cudaDeviceSynchronize",
                     "cudaStreamCreate", "cudaStreamSynchronize", "cudaStreamDestroy", "cudaMemset",
                     "cudaMallocHost", "cudaMemcpyAsync"):
            getattr(self.lib, name).restype = ctypes.c_int
        self.lib.cudaMallocHost.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
        self.lib.cudaMemcpyAsync.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                             ctypes.c_int, ctypes.c_void_p]
        self.lib.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
        self.lib.cudaFree.argtypes = [ctypes.c_void_p]
        self.lib.cudaMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        self.lib.cudaMemset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
        self.lib.cudaStreamCreate.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
        self.lib.cudaStreamSynchronize.argtypes = [ctypes.c_void_p]
        self.lib.cudaStreamDestroy.argtypes = [ctypes.c_void_p]

    def ok(self, rc: int, what: str) -> None:
        if rc != 0:
            raise RuntimeError("%s: cudaError %d" % (what, rc))

    def set_device(self, d: int) -> None:
        self.ok(self.lib.cudaSetDevice(d), "cudaSetDevice(%d)" % d)

    def sync(self) -> None:
        self.ok(self.lib.cudaDeviceSynchronize(), "cudaDeviceSynchronize")

    def hold(self, s: int) -> None:
        """The emulator's test hook: work on stream s waits until release."""
        self.ok(self.lib.zpp_emu_stream_hold(ctypes.c_void_p(s)), "zpp_emu_stream_hold")

    def release(self, s: int) -> None:
        self.ok(self.lib.zpp_emu_stream_release(ctypes.c_void_p(s)), "zpp_emu_stream_release")

    def stream(self) -> int:
        s = ctypes.c_void_p()
        self.ok(self.lib.cudaStreamCreate(ctypes.byref(s)), "cudaStreamCreate")
        return s.value

    def stream_sync(self, s: int) -> None:
        self.ok(self.lib.cudaStreamSynchronize(ctypes.c_void_p(s)), "cudaStreamSynchronize")

    def pinned(self, n: int, dtype) -> np.ndarray:
        """n elements of pinned host memory (cudaMallocHost), as a numpy
        array (never freed: for tests)."""
        dtype = np.dtype(dtype)
        p = ctypes.c_void_p()
        self.ok(self.lib.cudaMallocHost(ctypes.byref(p), max(1, n * dtype.itemsize)),
                "cudaMallocHost")
        buf = (ctypes.c_char * (n * dtype.itemsize)).from_address(p.value)
        return np.frombuffer(buf, dtype=dtype, count=n)

    def copy_out_async(self, host: np.ndarray, a: "DevArray", s: int) -> None:
        """Queues a copy of a into host (pinned) on stream s."""
        self.ok(self.lib.cudaMemcpyAsync(host.ctypes.data, a.ptr, host.nbytes, D2H,
                                         ctypes.c_void_p(s)), "cudaMemcpyAsync D2H")

    def array(self, host: np.ndarray, readonly: bool = False, stream=None) -> "DevArray":
        a = self.empty(host.size, host.dtype, readonly=readonly, stream=stream)
        h = np.ascontiguousarray(host)
        self.ok(self.lib.cudaMemcpy(a.ptr, h.ctypes.data, h.nbytes, H2D), "cudaMemcpy H2D")
        return a

    def empty(self, n: int, dtype, readonly: bool = False, stream=None) -> "DevArray":
        dtype = np.dtype(dtype)
        p = ctypes.c_void_p()
        self.ok(self.lib.cudaMalloc(ctypes.byref(p), max(1, n * dtype.itemsize)), "cudaMalloc")
        return DevArray(self, p.value, n, dtype, readonly, stream)

    def zeros(self, n: int, dtype) -> "DevArray":
        a = self.empty(n, dtype)
        self.ok(self.lib.cudaMemset(a.ptr, 0, n * np.dtype(dtype).itemsize), "cudaMemset")
        return a


class DevArray:
    def __init__(self, cu: Cuda, ptr: int, n: int, dtype, readonly: bool, stream):
        self.cu, self.ptr, self.n, self.dtype = cu, ptr, n, np.dtype(dtype)
        self.readonly, self.stream_ = readonly, stream
        self.typestr = self.dtype.str  # "<f4", "<f2", "|u1", "<f8"

    @property
    def __cuda_array_interface__(self):
        return {"shape": (self.n,), "typestr": self.typestr, "data": (self.ptr, self.readonly),
                "version": 3, "strides": None, "stream": self.stream_}

    def view(self, start: int, n: int) -> "DevArray":
        return DevArray(self.cu, self.ptr + start * self.dtype.itemsize, n, self.dtype,
                        self.readonly, self.stream_)

    def get(self) -> np.ndarray:
        self.cu.sync()
        h = np.empty(self.n, self.dtype)
        self.cu.ok(self.cu.lib.cudaMemcpy(h.ctypes.data, self.ptr, h.nbytes, D2H), "cudaMemcpy D2H")
        return h


class Iface:
    """``base``'s memory under an edited ``__cuda_array_interface__`` (other
    shapes, strides, a mask, a stream, a null pointer): for the checks of
    the bindings' reading of the interface."""

    def __init__(self, base: DevArray, **edit):
        self.base, self.edit = base, edit

    @property
    def __cuda_array_interface__(self):
        d = dict(self.base.__cuda_array_interface__)
        d.update(self.edit)
        return d
