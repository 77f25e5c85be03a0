"""Quantization error of zpp's block quantizer on tensors from files:
``.npy`` (numpy), ``.safetensors`` (safetensors) and torch checkpoints
(``.pt``, ``.pth``, ``.bin``: torch.load with weights_only=True; nested
state dicts are flattened to dotted names).  The flags and columns are
those of the C tool ``zpp-quant-error`` (tools/zpp_quant_error.c) for file
input, and so are the numbers (the same library calls; float64 sums):

    python -m zpp.quant_error --input model.pt --bits 8,4 --block 256,0 --format csv

Columns: dist,bits,block,mode,rel_l2,max_abs,snr_db,bits_per_elem, one
row per float tensor (fp32, fp16, bf16; others are skipped, as the C
tool does) and per (bits, mode, block), then the "overall" rows (sums
over every tensor: blocks never span tensors).  Block 0: one scale for
the whole tensor.  Decoding goes to the tensor's dtype (--decode-to same,
as a collective would) or to fp32 (the quantizer's error alone).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

from . import _lib
from .comm import quant_config

COLUMNS = ["dist", "bits", "block", "mode", "rel_l2", "max_abs", "snr_db", "bits_per_elem"]


def _tensors_from_file(path: Path):
    """(name, flat array or tensor) of every float tensor, in file order."""
    suffix = path.suffix.lower()
    if suffix == ".npy":
        a = np.load(path, allow_pickle=False)
        if a.dtype.kind == "V" and a.dtype.itemsize == 2:  # bf16 as the C tool reads it
            import torch

            return [(path.stem, torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16).reshape(-1))]
        return [(path.stem, np.ascontiguousarray(a).reshape(-1))]
    if suffix == ".safetensors":
        from safetensors.torch import load_file  # torch: bf16 tensors too

        return [(k, v.reshape(-1).contiguous()) for k, v in load_file(str(path)).items()]
    if suffix in (".pt", ".pth", ".bin", ".ckpt"):
        import torch

        obj = torch.load(str(path), map_location="cpu", weights_only=True)
        out = []

        def walk(prefix, o):
            if isinstance(o, torch.Tensor):
                out.append((prefix or path.stem, o.detach().reshape(-1).contiguous()))
            elif isinstance(o, dict):
                for k, v in o.items():
                    walk("%s.%s" % (prefix, k) if prefix else str(k), v)
            elif isinstance(o, (list, tuple)):
                for i, v in enumerate(o):
                    walk("%s.%d" % (prefix, i) if prefix else str(i), v)

        walk("", obj)
        return out
    raise ValueError("--input %s: not .npy, .safetensors or a torch checkpoint (.pt, .pth, .bin, .ckpt)" % path)


def _is_float(a) -> bool:
    return str(a.dtype) in ("float32", "float16", "torch.float32", "torch.float16", "torch.bfloat16")


def _f64(a) -> np.ndarray:
    if _lib.is_torch(a):
        import torch

        return a.to(torch.float64).numpy()
    return a.astype(np.float64)


def measure(x, bits: int, mode: str, block: int, decode_fp32: bool) -> dict:
    """Sums of one tensor and configuration (the C tool's qe_measure)."""
    L = _lib.get()
    from ._lib import Buf

    b = Buf(x, "tensor", floats_only=True)
    n = b.numel
    q = quant_config(bits, block if block else max(n, 1), mode == "asym")
    nbytes = L.ffi.new("size_t *")
    L.check(L.lib.zpp_quant_encoded_size(q, n, nbytes))
    enc = np.empty(max(nbytes[0], 1), np.uint8)
    L.check(L.lib.zpp_quant_encode(q, b.dtype, b.cptr, n, L.ffi.cast("void *", enc.ctypes.data), nbytes[0]))
    out = _lib.empty_like(x, n, dtype=(np.float32 if not _lib.is_torch(x) else __import__("torch").float32)
                          if decode_fp32 else None)
    o = Buf(out, "decoded", floats_only=True)
    L.check(L.lib.zpp_quant_decode(q, L.ffi.cast("void *", enc.ctypes.data), nbytes[0], n, o.dtype, o.cptr))
    xs, e = _f64(x), _f64(out) - _f64(x)
    return {"sum_x2": float(np.dot(xs, xs)), "sum_e2": float(np.dot(e, e)),
            "max_abs": float(np.max(np.abs(e))) if n else 0.0, "bytes": nbytes[0], "n": n}


def metrics(r: dict) -> dict:
    if r["sum_e2"] == 0.0:
        rel, snr = 0.0, math.inf
    elif r["sum_x2"] == 0.0:
        rel, snr = math.inf, -math.inf
    else:
        rel = math.sqrt(r["sum_e2"]) / math.sqrt(r["sum_x2"])
        snr = 20.0 * math.log10(math.sqrt(r["sum_x2"]) / math.sqrt(r["sum_e2"]))
    return {"rel_l2": rel, "max_abs": r["max_abs"], "snr_db": snr,
            "bits_per_elem": 8.0 * r["bytes"] / r["n"] if r["n"] else math.nan}


def run(path: Path, bits, modes, blocks, decode_fp32: bool) -> list:
    tensors = [(k, v) for k, v in _tensors_from_file(path) if _is_float(v)]
    if not tensors:
        raise ValueError("--input %s: no fp32, fp16 or bf16 tensor in the file" % path)
    rows, overall = [], {}
    for name, x in tensors:
        for b in bits:
            for m in modes:
                for k in blocks:
                    r = measure(x, b, m, k, decode_fp32)
                    rows.append(dict(dist=name, bits=b, block=k, mode=m, **r))
                    a = overall.setdefault((b, m, k), dict(dist="overall", bits=b, block=k, mode=m,
                                                           sum_x2=0.0, sum_e2=0.0, max_abs=0.0, bytes=0, n=0))
                    for f in ("sum_x2", "sum_e2", "bytes", "n"):
                        a[f] += r[f]
                    a["max_abs"] = max(a["max_abs"], r["max_abs"])
    if len(tensors) > 1:
        rows += list(overall.values())
    return [dict({c: r[c] for c in COLUMNS[:4]}, **metrics(r)) for r in rows]


def _num(v: float) -> str:
    """The C tool's number text: shortest %g that reads back the same."""
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    for p in (15, 16, 17):
        s = "%.*g" % (p, v)
        if float(s) == v:
            return s
    return s


def _ints(s: str):
    return [int(t) for t in s.split(",") if t]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m zpp.quant_error", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", required=True, type=Path, help=".npy, .safetensors or torch checkpoint")
    p.add_argument("--bits", type=_ints, default=[8, 4], help="8 and/or 4 (default 8,4)")
    p.add_argument("--block", type=_ints, default=[32, 64, 128, 256, 512, 1024, 2048, 4096, 0],
                   help="block sizes; 0: one scale for the whole tensor")
    p.add_argument("--mode", default=None, help="sym and/or asym (default sym,asym)")
    p.add_argument("--sym", action="append_const", const="sym", dest="modes")
    p.add_argument("--asym", action="append_const", const="asym", dest="modes")
    p.add_argument("--decode-to", choices=["same", "fp32"], default="same")
    p.add_argument("--format", choices=["table", "csv", "json"], default="table")
    a = p.parse_args(argv)
    modes = list(a.modes or [])
    if a.mode:
        modes += a.mode.split(",")
    modes = list(dict.fromkeys(modes or ["sym", "asym"]))
    for m in modes:
        if m not in ("sym", "asym"):
            p.error("--mode %s: must be sym or asym" % m)
    for b in a.bits:
        if b not in (4, 8):
            p.error("--bits %d: must be 8 or 4" % b)
    try:
        rows = run(a.input, a.bits, modes, a.block, a.decode_to == "fp32")
    except (ValueError, OSError) as e:
        print("zpp.quant_error: %s" % e, file=sys.stderr)
        return 2
    except _lib.Error as e:
        print("zpp.quant_error: %s" % e, file=sys.stderr)
        return 1
    if a.format == "csv":
        print(",".join(COLUMNS))
        for r in rows:
            name = r["dist"]
            if any(c in name for c in ',"\n'):
                name = '"%s"' % name.replace('"', '""')
            print(",".join([name, str(r["bits"]), str(r["block"]), r["mode"]]
                           + [_num(r[c]) for c in COLUMNS[4:]]))
    elif a.format == "json":
        conv = lambda v: v if isinstance(v, (int, str)) or math.isfinite(v) else _num(v)
        print(json.dumps([{c: conv(r[c]) for c in COLUMNS} for r in rows], indent=1))
    else:
        w = max([4] + [len(r["dist"]) for r in rows])
        print("%-*s %4s %8s %4s %11s %11s %8s %13s" % (w, *COLUMNS))
        for r in rows:
            print("%-*s %4d %8d %4s %11.4e %11.4e %8.2f %13.4f" % (
                w, r["dist"], r["bits"], r["block"], r["mode"], r["rel_l2"], r["max_abs"],
                r["snr_db"], r["bits_per_elem"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
