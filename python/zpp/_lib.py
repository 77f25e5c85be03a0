"""Loading libzpp, its declarations, errors and array plumbing.

The library is the one named by ``ZPP_LIBRARY`` (a path), else the
``libzpp.so`` installed beside this package (``pip install .`` puts it
there).  Declarations come from the first of these holding ``zpp/zpp.h``
(_include_candidates): ``ZPP_INCLUDE_DIR``; with ``ZPP_LIBRARY`` set, the
headers of the library's own source tree (the ``include/`` of the source
directory of ``ZPP_BUILD_DIR``'s CMakeCache.txt, then of up to three
directories above the library: build/libzpp.so of a checkout); the
headers installed with the package (``zpp/include``); the ``include/`` of
the source tree above the package (python/zpp of a checkout).  The
run-time version must equal the headers'.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import cffi

from . import _cdef

_HERE = Path(__file__).resolve().parent


class Error(RuntimeError):
    """A zpp call failed: ``code`` is the zpp_status_t (negative), ``status``
    its name ("ZPP_ERR_INVALID_ARGUMENT"), and the message is zpp's own
    (it names the function and the bad argument)."""

    def __init__(self, code: int, status: str, message: str):
        super().__init__("%s (%s)" % (message or status, status))
        self.code = code
        self.status = status
        self.message = message


class DtypeError(Error, TypeError):
    """An array's dtype that zpp cannot take for this call."""


class DeviceError(Error, ValueError):
    """An array on a device this zpp build or communicator cannot use."""


def _library_path() -> Path:
    env = os.environ.get("ZPP_LIBRARY")
    if env:
        p = Path(env)
        if not p.is_file():
            raise FileNotFoundError("ZPP_LIBRARY=%s: no such file" % env)
        return p
    beside = sorted(_HERE.glob("libzpp.so*"))
    if beside:
        return beside[0]
    raise FileNotFoundError(
        "libzpp not found beside the package in %s: install the package with "
        "`pip install .` from the zpp source tree (it builds libzpp into it), "
        "or set ZPP_LIBRARY to the path of a libzpp.so (e.g. build/libzpp.so)" % _HERE
    )


def _build_source_dir(build: Path) -> Path | None:
    """The source directory a CMake build directory was configured from."""
    try:
        text = (build / "CMakeCache.txt").read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("CMAKE_HOME_DIRECTORY:"):
            return Path(line.split("=", 1)[1])
    return None


def _include_candidates(libpath: Path) -> list[Path]:
    """The include directories looked in, in order (the module's docstring)."""
    c = []
    if os.environ.get("ZPP_INCLUDE_DIR"):
        c.append(Path(os.environ["ZPP_INCLUDE_DIR"]))
    if os.environ.get("ZPP_LIBRARY"):
        if os.environ.get("ZPP_BUILD_DIR"):
            src = _build_source_dir(Path(os.environ["ZPP_BUILD_DIR"]))
            if src is not None:
                c.append(src / "include")
        c += [up / "include" for up in list(libpath.resolve().parents)[:3]]
    c.append(_HERE / "include")
    c += [up / "include" for up in list(_HERE.parents)[:3]]
    return c


class _Lib:
    def __init__(self) -> None:
        self.path = _library_path()
        self.include_dir = _cdef.find_headers(_include_candidates(self.path))
        cdef, self.inits = _cdef.build_cdef(self.include_dir)
        self.ffi = cffi.FFI()
        self.ffi.cdef(cdef)
        # RTLD_GLOBAL: Open MPI, when linked in, loads plugins that need
        # libmpi's symbols global.
        self.lib = self.ffi.dlopen(str(self.path), self.ffi.RTLD_GLOBAL | self.ffi.RTLD_NOW)
        v = self.ffi.new("int *")
        self.check(self.lib.zpp_get_version(v))
        want = (
            self.lib.ZPP_VERSION_MAJOR * 10000
            + self.lib.ZPP_VERSION_MINOR * 100
            + self.lib.ZPP_VERSION_PATCH
        )
        if v[0] != want:
            raise ImportError(
                "%s is zpp version %d but the headers in %s are %d: install the "
                "package from the same source tree" % (self.path, v[0], self.include_dir, want)
            )

    def new(self, ctype: str) -> Any:
        """A struct initialised from its header's ``_INIT`` macro."""
        macro = "ZPP_" + ctype[len("zpp_"):-len("_t")].upper() + "_INIT"
        return self.ffi.new(ctype + " *", _cdef.init_values(macro, self.inits, self.ffi, self.lib))

    def string(self, p) -> str:
        return self.ffi.string(p).decode(errors="replace") if p != self.ffi.NULL else ""

    def check(self, status: int, comm=None, cls=Error) -> None:
        # The thread's message first: every failing call sets it (an error
        # of the engine thread is re-raised on the caller's by the wait),
        # while the communicator's is "kept until the next error on it",
        # and calls that fail before touching the communicator (an
        # overflowing zpp_qgz_residual_count) leave an older one there.
        if status == 0:
            return
        msg = self.string(self.lib.zpp_get_last_error())
        if not msg and comm is not None:
            msg = self.string(self.lib.zpp_comm_get_last_error(comm))
        name = self.string(self.lib.zpp_status_string(status)).split(":")[0]
        raise cls(status, name, msg)


_lock = threading.Lock()
_instance: _Lib | None = None


def get() -> _Lib:
    global _instance
    with _lock:
        if _instance is None:
            _instance = _Lib()
        return _instance


# ---- arrays: numpy and torch ---------------------------------------------

_NP_DTYPES = {"float32": "ZPP_FLOAT32", "float16": "ZPP_FLOAT16", "uint8": "ZPP_UINT8"}
_TORCH_DTYPES = {
    "torch.float32": "ZPP_FLOAT32",
    "torch.float16": "ZPP_FLOAT16",
    "torch.bfloat16": "ZPP_BFLOAT16",
    "torch.uint8": "ZPP_UINT8",
}


# __cuda_array_interface__ type strings zpp takes (bf16 has none: a torch
# bf16 CUDA tensor is read through torch itself)
_CAI_DTYPES = {"<f4": "ZPP_FLOAT32", "<f2": "ZPP_FLOAT16", "|u1": "ZPP_UINT8", "<u1": "ZPP_UINT8"}


def is_torch(a) -> bool:
    return type(a).__module__.startswith("torch") and hasattr(a, "data_ptr")


class Buf:
    """Pointer, element count, zpp dtype and memory space of a contiguous
    array: a numpy array or CPU torch tensor (host memory), a CUDA torch
    tensor, or any object with ``__cuda_array_interface__`` (version 2 or
    3: CuPy, Numba, ...; device memory).  ``device`` is None for host
    memory, else the CUDA device index (-1 when the interface does not
    say); ``stream`` is the stream the producer asks consumers to order
    after (``__cuda_array_interface__`` version 3), or None."""

    __slots__ = ("array", "ptr", "numel", "dtype", "dtype_name", "device", "stream", "what")

    def __init__(self, a, what: str, floats_only: bool = False, written: bool = False):
        L = get()
        self.what = what
        self.device = None
        self.stream = None
        if is_torch(a):
            if a.device.type == "cuda":
                self.device = a.device.index if a.device.index is not None else -1
            elif a.device.type != "cpu":
                raise DeviceError(
                    L.lib.ZPP_ERR_UNSUPPORTED,
                    "ZPP_ERR_UNSUPPORTED",
                    "%s is on device %s: zpp takes CPU tensors (host memory) and CUDA "
                    "tensors (device memory; zpp_cuda_available() = %d in %s)"
                    % (what, a.device, L.lib.zpp_cuda_available(), L.path),
                )
            if not a.is_contiguous():
                raise ValueError("%s: the tensor must be contiguous" % what)
            name = str(a.dtype)
            code = _TORCH_DTYPES.get(name)
            self.ptr = a.data_ptr()
            self.numel = a.numel()
        elif hasattr(a, "__cuda_array_interface__"):
            cai = a.__cuda_array_interface__
            shape = tuple(cai["shape"])
            typestr = cai["typestr"]
            ptr, readonly = cai["data"]
            numel = 1
            for d in shape:
                numel *= int(d)
            strides = cai.get("strides")
            if strides is not None and numel > 1:
                # C-contiguous: each axis steps over the ones after it; the
                # stride of an axis of length 1 is never used (producers
                # may put anything there)
                if len(tuple(strides)) != len(shape):
                    raise ValueError("%s: __cuda_array_interface__ strides %s for shape %s: one "
                                     "per axis" % (what, tuple(strides), shape))
                item = int(typestr[2:]) if typestr[2:].isdigit() else 0
                acc = item
                for d, st in zip(reversed(shape), reversed(tuple(strides))):
                    if int(d) != 1 and int(st) != acc:
                        raise ValueError("%s: the device array must be C-contiguous (shape %s, "
                                         "strides %s)" % (what, shape, tuple(strides)))
                    acc *= int(d)
            if cai.get("mask") is not None:
                raise ValueError("%s: masked device arrays are not supported" % what)
            if written and readonly:
                raise ValueError("%s: the device array is read-only; zpp writes into it" % what)
            name = "cuda." + typestr
            code = _CAI_DTYPES.get(typestr)
            if code is not None:
                name = "cuda." + {"ZPP_FLOAT32": "float32", "ZPP_FLOAT16": "float16",
                                  "ZPP_UINT8": "uint8"}[code]
            self.ptr = int(ptr or 0)
            self.numel = numel
            self.device = -1
            st = cai.get("stream")
            if st is not None and (isinstance(st, bool) or not isinstance(st, int) or st <= 0):
                # version 3: None (no ordering), 1 (legacy default stream), 2
                # (per-thread default stream) or a cudaStream_t; 0 is
                # disallowed by the interface (ambiguous)
                raise ValueError("%s: __cuda_array_interface__ stream %r: must be None, 1 "
                                 "(legacy default), 2 (per-thread default) or a stream "
                                 "handle (0 is disallowed by the interface)" % (what, st))
            self.stream = st
        else:
            import numpy as np

            if not isinstance(a, np.ndarray):
                raise TypeError("%s: a numpy array, a torch tensor or a CUDA array "
                                "(__cuda_array_interface__), not %s" % (what, type(a).__name__))
            if not a.flags.c_contiguous:
                raise ValueError("%s: the array must be C-contiguous" % what)
            if written and not a.flags.writeable:
                # zpp would write into memory numpy was told is read-only
                # (np.frombuffer of a bytes object, a broadcast view, ...)
                raise ValueError("%s: the array is read-only; zpp writes into it" % what)
            name = "numpy." + str(a.dtype)
            code = _NP_DTYPES.get(str(a.dtype))
            self.ptr = a.ctypes.data
            self.numel = a.size
        if code is None or (floats_only and code == "ZPP_UINT8"):
            allowed = "float32, float16, bfloat16 (torch)" + ("" if floats_only else ", uint8")
            raise DtypeError(L.lib.ZPP_ERR_INVALID_ARGUMENT, "ZPP_ERR_INVALID_ARGUMENT",
                             "%s has dtype %s: zpp takes %s here" % (what, name, allowed))
        self.array = a
        self.dtype = getattr(L.lib, code)
        self.dtype_name = name

    @property
    def cptr(self):
        return get().ffi.cast("void *", self.ptr)

    def where(self) -> str:
        """"host memory (numpy)", "device memory (cuda:0)", ... for messages."""
        if self.device is None:
            return "host memory (%s)" % ("torch CPU tensor" if is_torch(self.array) else "numpy")
        if is_torch(self.array):
            return "device memory (%s)" % self.array.device
        return "device memory (__cuda_array_interface__)"


def empty_like(a, numel: int, dtype=None, what: str = "out"):
    """A new array of numel elements where ``a`` lives (numpy, or torch on
    a's device); other device arrays cannot be made here."""
    if is_torch(a):
        import torch

        return torch.empty(numel, dtype=dtype or a.dtype, device=a.device)
    if hasattr(a, "__cuda_array_interface__"):
        raise TypeError("%s: pass it for device arrays other than torch tensors (zpp "
                        "allocates only numpy arrays and torch tensors)" % what)
    import numpy as np

    return np.empty(numel, dtype=dtype or a.dtype)
