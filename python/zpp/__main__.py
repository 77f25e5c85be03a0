"""``python -m zpp``: what this zpp is and what it can use here.

Prints the version, the library loaded (and the headers read), the
optional parts the library was built with (zpp_get_build_features), and
what is available at run time: a usable CUDA device (zpp_cuda_available,
and the driver's device count), whether libnccl and libucp load (the NCCL
and UCX backends open them at run time), the launcher in the environment
(mpirun, torchrun) and the CPU code path.  ``--json``: the same as one
JSON object.  Exit status 0 once the library loads; 1, with one line
saying why, when it does not (no library, headers that do not match it,
a library that does not load); 2 on an unknown argument.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys

from . import _lib

_FEATURES = (("cuda", "ZPP_FEATURE_CUDA"), ("cuda_emu", "ZPP_FEATURE_CUDA_EMU"),
             ("nccl", "ZPP_FEATURE_NCCL"), ("mpi", "ZPP_FEATURE_MPI"),
             ("ucx", "ZPP_FEATURE_UCX"))


def _loads(name: str) -> tuple[bool, str]:
    """Whether the dynamic loader opens ``name`` (as the backends do)."""
    try:
        ctypes.CDLL(name, mode=ctypes.RTLD_LOCAL)
        return True, name
    except OSError as e:
        return False, str(e)


def _cuda_driver_devices() -> tuple[int | None, str]:
    """The CUDA driver's device count (cuDeviceGetCount), or None and why."""
    try:
        cu = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        return None, "no CUDA driver (%s)" % e
    n = ctypes.c_int(0)
    rc = cu.cuInit(0)
    if rc != 0:
        return None, "cuInit failed (CUresult %d)" % rc
    rc = cu.cuDeviceGetCount(ctypes.byref(n))
    if rc != 0:
        return None, "cuDeviceGetCount failed (CUresult %d)" % rc
    return n.value, "CUDA driver"


def _launcher() -> dict:
    """The launcher in the environment; rank and size are None where its
    variable is not an integer (``bad`` then names it)."""
    e = os.environ

    def read(name: str, rank_var: str, size_var: str) -> dict:
        d = {"name": name}
        bad = []
        for key, var, default in (("rank", rank_var, "0"), ("size", size_var, None)):
            raw = e.get(var, default)
            try:
                d[key] = int(raw)
            except (TypeError, ValueError):
                d[key] = None
                bad.append("%s=%r" % (var, raw))
        if bad:
            d["bad"] = ", ".join(bad) + " (not an integer)"
        return d

    if "OMPI_COMM_WORLD_SIZE" in e:
        return read("mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")
    if all(k in e for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")):
        return read("torchrun", "RANK", "WORLD_SIZE")
    return {"name": None}


def info() -> dict:
    L = _lib.get()
    lib = L.lib
    v = L.ffi.new("int *")
    L.check(lib.zpp_get_version(v))
    f = L.ffi.new("unsigned *")
    L.check(lib.zpp_get_build_features(f))
    built = {k: bool(f[0] & getattr(lib, c)) for k, c in _FEATURES}
    nccl_name = os.environ.get("ZPP_NCCL_LIBRARY") or "libnccl.so.2"
    nccl_ok, nccl_why = _loads(nccl_name) if built["nccl"] else (False, "not built in")
    ucx_ok, ucx_why = _loads("libucp.so.0") if built["ucx"] else (False, "not built in")
    ndev, dev_why = _cuda_driver_devices()
    return {
        "version": "%d.%d.%d" % (v[0] // 10000, v[0] // 100 % 100, v[0] % 100),
        "library": str(L.path),
        "library_from": "ZPP_LIBRARY" if os.environ.get("ZPP_LIBRARY") else "package",
        "headers": str(L.include_dir),
        "built": built,
        "runtime": {
            "cuda_available": bool(lib.zpp_cuda_available()),
            "cuda_devices": ndev,
            "cuda_devices_from": dev_why,
            "nccl_loads": nccl_ok,
            "nccl": nccl_why,
            "ucx_loads": ucx_ok,
            "ucx": ucx_why,
            "mpi": built["mpi"],
            "launcher": _launcher(),
            "cpu_isa": L.string(lib.zpp_quant_cpu_isa()),
        },
    }


def _yes(b: bool) -> str:
    return "yes" if b else "no"


def main(argv: list[str]) -> int:
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    as_json = argv[:1] == ["--json"]
    unknown = argv[1:] if as_json else argv
    if unknown:
        print("python -m zpp: unknown argument %r (--json, --help)" % unknown[0], file=sys.stderr)
        return 2
    try:
        d = info()
    except (OSError, ImportError, _lib.Error) as e:
        # FileNotFoundError (no library, no headers) is an OSError, as is a
        # library that does not load; ImportError: headers and library of
        # different versions
        print("python -m zpp: %s" % e, file=sys.stderr)
        return 1
    if as_json:
        print(json.dumps(d))
        return 0
    b, r = d["built"], d["runtime"]
    cuda = "yes" if b["cuda"] else ("emulated (CPU; tests)" if b["cuda_emu"] else "no")
    print("zpp %s" % d["version"])
    print("library:  %s (%s)" % (d["library"], "ZPP_LIBRARY" if d["library_from"] ==
                                 "ZPP_LIBRARY" else "installed with the package"))
    print("headers:  %s" % d["headers"])
    print("built with: CUDA %s, NCCL %s, MPI %s, UCX %s"
          % (cuda, _yes(b["nccl"]), _yes(b["mpi"]), _yes(b["ucx"])))
    print("run time:")
    ndev = r["cuda_devices"]
    print("  CUDA:     %s (zpp_cuda_available); %s"
          % ("a device is usable" if r["cuda_available"] else "no usable device",
             "%d device(s) (CUDA driver)" % ndev if ndev is not None
             else r["cuda_devices_from"]))
    print("  NCCL:     %s" % ("not built in" if not b["nccl"] else
                              "%s loads" % r["nccl"] if r["nccl_loads"] else
                              "does not load: %s" % r["nccl"]))
    print("  UCX:      %s" % ("not built in" if not b["ucx"] else
                              "libucp.so.0 loads" if r["ucx_loads"] else
                              "does not load: %s" % r["ucx"]))
    print("  MPI:      %s" % ("built in (zpp.Comm.from_mpi under mpirun)" if b["mpi"]
                              else "not built in"))
    la = r["launcher"]
    q = lambda v: "?" if v is None else v  # noqa: E731
    print("  launcher: %s" % ("%s, rank %s of %s%s" % (la["name"], q(la["rank"]), q(la["size"]),
                                                       "; " + la["bad"] if "bad" in la else "")
                              if la["name"] else "none (not under mpirun or torchrun)"))
    print("  CPU path: %s" % r["cpu_isa"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
