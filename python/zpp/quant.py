"""zpp.quant: the block quantizer of docs/format.md on numpy arrays and
CPU torch tensors (zpp_quant_encode / zpp_quant_decode in include/zpp/zpp.h)."""

from __future__ import annotations

from . import _lib
from ._lib import Buf
from .comm import quant_config

__all__ = ["encoded_size", "encode", "decode", "error"]


def _host(b: Buf) -> Buf:
    # zpp_quant_encode/decode run on the CPU: a device pointer (a CUDA
    # tensor, a __cuda_array_interface__ array, which Buf accepts for the
    # device communicators) would be read by host code
    if b.device is not None:
        L = _lib.get()
        raise _lib.DeviceError(L.lib.ZPP_ERR_UNSUPPORTED, "ZPP_ERR_UNSUPPORTED",
                               "%s is %s: zpp.quant works on host memory (numpy arrays, CPU "
                               "tensors)" % (b.what, b.where()))
    return b


def encoded_size(count: int, *, bits: int = 8, block: int = 256,
                 asymmetric: bool = False) -> int:
    """Bytes of the encoded buffer of ``count`` elements (scales + payload)."""
    L = _lib.get()
    q = quant_config(bits, block, asymmetric)
    n = L.ffi.new("size_t *")
    L.check(L.lib.zpp_quant_encoded_size(q, count, n))
    return n[0]


def encode(x, *, bits: int = 8, block: int = 256, asymmetric: bool = False,
           stochastic: bool = False, seed: int = 0):
    """The encoded bytes of the flat array ``x`` (fp32, fp16 or bf16): a
    uint8 array of the same kind (numpy or torch)."""
    L = _lib.get()
    q = quant_config(bits, block, asymmetric, stochastic, seed)
    b = _host(Buf(x, "x", floats_only=True))
    nbytes = encoded_size(b.numel, bits=bits, block=block, asymmetric=asymmetric)
    out = _lib.empty_like(x, max(nbytes, 0), dtype=_u8(x))
    o = Buf(out, "out")
    L.check(L.lib.zpp_quant_encode(q, b.dtype, b.cptr, b.numel, o.cptr, nbytes))
    return out


def decode(enc, count: int, *, dtype=None, bits: int = 8, block: int = 256,
           asymmetric: bool = False):
    """``count`` elements decoded from ``enc`` (uint8, from :func:`encode`)
    into ``dtype`` (default float32; a numpy or torch dtype as ``enc``)."""
    L = _lib.get()
    q = quant_config(bits, block, asymmetric)
    e = _host(Buf(enc, "enc"))
    if e.dtype != L.lib.ZPP_UINT8:
        raise _lib.DtypeError(-1, "ZPP_ERR_INVALID_ARGUMENT",
                              "enc has dtype %s: must be uint8 (from zpp.quant.encode)" % e.dtype_name)
    out = _lib.empty_like(enc, count, dtype=dtype if dtype is not None else _f32(enc))
    o = Buf(out, "out", floats_only=True)
    L.check(L.lib.zpp_quant_decode(q, e.cptr, e.numel, count, o.dtype, o.cptr))
    return out


def error(x, *, bits: int = 8, block: int = 256, asymmetric: bool = False) -> dict:
    """Round trip of ``x`` through encode/decode, compared in float64:
    max and RMS absolute error, RMS relative to RMS(x), and the encoded
    bytes per element."""
    import numpy as np

    enc = encode(x, bits=bits, block=block, asymmetric=asymmetric)
    n = Buf(x, "x", floats_only=True).numel
    y = decode(enc, n, bits=bits, block=block, asymmetric=asymmetric)
    xs = _to_f64(x)
    ys = _to_f64(y)
    d = ys - xs
    rms_x = float(np.sqrt(np.mean(xs * xs))) if n else 0.0
    rms = float(np.sqrt(np.mean(d * d))) if n else 0.0
    return {
        "count": n,
        "bits": bits,
        "block": block,
        "max_abs_error": float(np.max(np.abs(d))) if n else 0.0,
        "rms_error": rms,
        "rel_rms_error": rms / rms_x if rms_x > 0 else 0.0,
        "bytes_per_element": (_lib.Buf(enc, "enc").numel / n) if n else 0.0,
    }


def _u8(x):
    if _lib.is_torch(x):
        import torch

        return torch.uint8
    import numpy as np

    return np.uint8


def _f32(x):
    if _lib.is_torch(x):
        import torch

        return torch.float32
    import numpy as np

    return np.float32


def _to_f64(a):
    import numpy as np

    if _lib.is_torch(a):
        return a.detach().to(dtype=__import__("torch").float64).cpu().numpy().ravel()
    return np.asarray(a, dtype=np.float64).ravel()
