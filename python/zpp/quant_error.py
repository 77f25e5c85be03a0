"""Quantization error of zpp's block quantizer on tensors from files.

One tool, two front ends, one set of flags and columns (docs/api.md,
"Quantization error tool"):

- ``python -m zpp.quant_error`` (this module) reads files: ``.npy``
  through numpy, ``.safetensors`` through safetensors, torch checkpoints
  (``.pt``, ``.pth``, ``.ckpt``, ``.bin``) through ``torch.load`` with
  ``weights_only=True`` (nested dicts and lists flatten to dotted names),
  and raw little-endian files (``--input-dtype``);
- ``zpp-quant-error`` (tools/zpp_quant_error.c) parses nothing: it
  generates synthetic data (``--dist``, ``--n``, ``--outliers``,
  ``--outlier-scale``) and reads raw files.

Each front end refuses the other's data with a message that names the
other.  On the same raw file both print the same stdout byte for byte
(python/tests/test_quant_error.py checks it): the same library calls
(zpp_hadamard, zpp_quant_encode, zpp_quant_decode), float64 sums in
element order, the same number text.

    python -m zpp.quant_error --input model.safetensors --bits 8,4 --block 256,0 --format csv

Columns: dist,bits,block,mode,rel_l2,max_abs,snr_db,bits_per_elem, then
hadamard,rounding when --hadamard or --rounding is given.  One row per
fp32, fp16 or bf16 tensor (tensors of other floating dtypes are refused,
integer and bool ones skipped with a note) and per (bits, mode, block,
hadamard, rounding), in that nesting order; a file of several tensors
adds the "overall" rows (sums over every tensor: blocks never span
tensors).  Elements are taken in C (row-major) order of each array.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path

import numpy as np

from . import _lib
from .comm import quant_config

PROG = "zpp.quant_error"
COLUMNS = ["dist", "bits", "block", "mode", "rel_l2", "max_abs", "snr_db", "bits_per_elem"]
EXTRA_COLUMNS = ["hadamard", "rounding"]
DEFAULT_SEED = 20261129
DEFAULT_BLOCKS = [32, 64, 128, 256, 512, 1024, 2048, 4096, 0]
MAX_LIST = 64
# the C tool's generator flags: synthetic data is its part
SYNTHETIC_FLAGS = ("--dist", "--n", "--outliers", "--outlier-scale")
# file names whose header gives the dtype (--input-dtype is refused for
# them); ".bin" is raw with --input-dtype, a torch checkpoint without
HEADER_SUFFIXES = (".npy", ".safetensors", ".pt", ".pth", ".ckpt")
TORCH_SUFFIXES = (".pt", ".pth", ".ckpt", ".bin")

# zpp dtype name -> numpy storage (bf16 is kept as its uint16 bits)
_STORAGE = {"fp32": np.float32, "fp16": np.float16, "bf16": np.uint16}
_CODE = {"fp32": "ZPP_FLOAT32", "fp16": "ZPP_FLOAT16", "bf16": "ZPP_BFLOAT16"}


class UsageError(Exception):
    """A bad flag or an unusable input file: exit status 2."""


# ---- tensors: (name, dtype name, flat numpy storage) ------------------------

def _code(dt: str) -> int:
    return getattr(_lib.get().lib, _CODE[dt])


def _ptr(a: np.ndarray):
    return _lib.get().ffi.cast("void *", a.ctypes.data)


def _to_f32(a: np.ndarray, dt: str) -> np.ndarray:
    """Exact: every fp16 and bf16 value is an fp32 value."""
    if dt == "bf16":
        return (a.astype(np.uint32) << 16).view(np.float32)
    return a.astype(np.float32)


def _to_f64(a: np.ndarray, dt: str) -> np.ndarray:
    return _to_f32(a, dt).astype(np.float64)


def _from_f32(f: np.ndarray, dt: str) -> np.ndarray:
    """fp32 -> dt, round to nearest even (numpy for fp16, torch for bf16,
    which numpy has not)."""
    if dt == "fp32":
        return f
    if dt == "fp16":
        return f.astype(np.float16)
    import torch

    b = torch.from_numpy(np.ascontiguousarray(f)).to(torch.bfloat16)
    return b.view(torch.int16).numpy().view(np.uint16)


def convert(a: np.ndarray, dt: str, to: str) -> np.ndarray:
    """Rounds to ``to`` through fp32 (exact for every source dtype), so fp16
    -> bf16 is one rounding of the value, as the C tool's --dtype."""
    return a if dt == to else _from_f32(_to_f32(a, dt), to)


def _from_torch(name: str, t, path: str):
    """(dtype name, storage) of a torch tensor; None to skip it (not
    floating point); UsageError for a floating dtype zpp cannot encode."""
    import torch

    t = t.detach().to("cpu").reshape(-1).contiguous()
    if t.dtype == torch.float32:
        return "fp32", t.numpy()
    if t.dtype == torch.float16:
        return "fp16", t.numpy()
    if t.dtype == torch.bfloat16:
        return "bf16", t.view(torch.int16).numpy().view(np.uint16)
    if t.is_floating_point() or t.is_complex():
        raise UsageError("--input %s: tensor '%s' has dtype %s; supported are float32, float16 "
                         "and bfloat16" % (path, name, str(t.dtype).replace("torch.", "")))
    return None


def _from_numpy(a: np.ndarray, path: str):
    """(dtype name, storage) of a numpy array, as _from_torch."""
    if a.dtype.names is not None:
        raise UsageError("--input %s: .npy structured dtypes are not supported" % path)
    a = np.ascontiguousarray(a).reshape(-1)  # C order, whatever the storage order
    if a.dtype.kind == "f" and a.dtype.itemsize in (4, 2):
        return ("fp32" if a.dtype.itemsize == 4 else "fp16"), a.astype(a.dtype.newbyteorder("="))
    if (a.dtype.kind == "V" and a.dtype.itemsize == 2) or a.dtype.name == "bfloat16":
        return "bf16", a.view(np.uint16)  # how ml_dtypes' bfloat16 arrays are saved
    if a.dtype.kind in "fc":
        raise UsageError("--input %s: .npy dtype '%s' is not supported (float32, float16, bfloat16 "
                         "as '<V2')" % (path, a.dtype.str))
    return None


def read_tensors(path: str, input_dtype: str | None):
    """(kind, [(name, dtype name, storage) or (name, None, reason)]) of a
    file, in file order; the caller skips the None entries with a note."""
    p = Path(path)
    if input_dtype is not None:
        if path.endswith(HEADER_SUFFIXES):
            raise UsageError("--input-dtype: only for raw files; %s has a header that gives its "
                             "dtype" % path)
        es = np.dtype(_STORAGE[input_dtype]).itemsize
        size = p.stat().st_size
        if size == 0 or size % es:
            raise UsageError("--input %s: %d bytes is not a positive multiple of %d "
                             "(--input-dtype %s)" % (path, size, es, input_dtype))
        return "raw", [(p.name, input_dtype, np.fromfile(path, dtype=_STORAGE[input_dtype]))]
    if path.endswith(".npy"):
        a = np.load(path, allow_pickle=False)
        r = _from_numpy(a, path)
        return "npy", [(p.stem, *r) if r else (p.stem, None, str(a.dtype))]
    if path.endswith(".safetensors"):
        from safetensors import safe_open  # torch framework: bf16 tensors too

        out = []
        # every tensor of the file is in memory at once (as with torch.load)
        with safe_open(path, framework="pt") as f:
            for k in f.keys():
                t = f.get_tensor(k)
                r = _from_torch(k, t, path)
                out.append((k, *r) if r else (k, None, str(t.dtype).replace("torch.", "")))
        return "safetensors", out
    if path.endswith(TORCH_SUFFIXES):
        import torch

        obj = torch.load(path, map_location="cpu", weights_only=True)
        out = []

        def walk(prefix, o):
            if isinstance(o, torch.Tensor):
                name = prefix or p.stem
                r = _from_torch(name, o, path)
                out.append((name, *r) if r else (name, None, str(o.dtype).replace("torch.", "")))
            elif isinstance(o, dict):
                for k, v in o.items():
                    walk("%s.%s" % (prefix, k) if prefix else str(k), v)
            elif isinstance(o, (list, tuple)):
                for i, v in enumerate(o):
                    walk("%s.%d" % (prefix, i) if prefix else str(i), v)

        walk("", obj)
        return "torch", out
    raise UsageError("--input %s: not .npy, .safetensors or a torch checkpoint (.pt, .pth, .ckpt, "
                     ".bin); a raw file needs --input-dtype fp32|fp16|bf16" % path)


# ---- measurement -------------------------------------------------------------

def _nan_max(a, b):
    """max that keeps a NaN (as np.max does)."""
    return a if math.isnan(a) or b <= a else b


def measure(x: np.ndarray, dt: str, bits: int, mode: str, block: int, had: int,
            rounding: str, seed: int, decode_fp32: bool) -> dict:
    """Float64 sums of one tensor and configuration (the C tool's qe_measure)."""
    L = _lib.get()
    n = x.size
    q = quant_config(bits, block if block else n, mode == "asym", rounding == "stochastic", seed)
    nb = L.ffi.new("size_t *")
    L.check(L.lib.zpp_quant_encoded_size(q, n, nb))
    enc = np.empty(max(nb[0], 1), np.uint8)
    out_dt = "fp32" if decode_fp32 else dt
    if had == 0:
        L.check(L.lib.zpp_quant_encode(q, _code(dt), _ptr(x), n, _ptr(enc), nb[0]))
        dec = np.empty(n, _STORAGE[out_dt])
        L.check(L.lib.zpp_quant_decode(q, _ptr(enc), nb[0], n, _code(out_dt), _ptr(dec)))
    else:  # rotate, encode and decode in fp32, rotate back, store in out_dt
        rot = np.empty(n, np.float32)
        fptr = L.ffi.cast("float *", rot.ctypes.data)
        L.check(L.lib.zpp_hadamard(had, _code(dt), _ptr(x), n, fptr))
        L.check(L.lib.zpp_quant_encode(q, L.lib.ZPP_FLOAT32, _ptr(rot), n, _ptr(enc), nb[0]))
        L.check(L.lib.zpp_quant_decode(q, _ptr(enc), nb[0], n, L.lib.ZPP_FLOAT32, _ptr(rot)))
        L.check(L.lib.zpp_hadamard(had, L.lib.ZPP_FLOAT32, _ptr(rot), n, fptr))
        dec = _from_f32(rot, out_dt)
    xs = _to_f64(x, dt)
    e = _to_f64(dec, out_dt) - xs
    # cumsum adds in element order, as the C tool's loop (no pairwise sum)
    return {"sum_x2": float(np.cumsum(xs * xs)[-1]), "sum_e2": float(np.cumsum(e * e)[-1]),
            "max_abs": float(np.max(np.abs(e))), "bytes": nb[0], "n": n}


def metrics(r: dict) -> dict:
    if r["sum_e2"] == 0.0:
        rel, snr = 0.0, math.inf
    elif r["sum_x2"] == 0.0:
        rel, snr = math.inf, -math.inf
    else:
        rel = math.sqrt(r["sum_e2"]) / math.sqrt(r["sum_x2"])
        snr = 20.0 * math.log10(math.sqrt(r["sum_x2"]) / math.sqrt(r["sum_e2"]))
    return {"rel_l2": rel, "max_abs": r["max_abs"], "snr_db": snr,
            "bits_per_elem": 8.0 * r["bytes"] / r["n"]}


def configs(o):
    """(bits, mode, block, hadamard, rounding) in the C tool's nesting order;
    a Hadamard group must divide the block (as qgZ asks): other pairs are
    skipped with one note each."""
    noted = set()
    for b in o.bits:
        for m in o.modes:
            for k in o.block:
                for g in o.hadamard:
                    for r in o.rounding:
                        if g and k and k % g:
                            if (k, g) not in noted:
                                noted.add((k, g))
                                print("%s: note: block %d is not a multiple of --hadamard %d: "
                                      "skipped" % (PROG, k, g), file=sys.stderr)
                            continue
                        yield b, m, k, g, r


def run(o, info=None) -> list:
    """Rows (dicts with COLUMNS + EXTRA_COLUMNS) of the run ``o`` (parsed
    flags); the run's settings line goes to ``info``."""
    try:
        kind, tensors = read_tensors(o.input, o.input_dtype)
    except (UsageError, _lib.Error):
        raise
    except Exception as e:  # the readers' own: numpy, safetensors, torch, the OS
        why = (str(e).strip().splitlines() or [""])[0]  # torch's run to many lines
        hint = ""
        if o.input.endswith(".bin"):
            hint = "; a raw file needs --input-dtype fp32|fp16|bf16"
        raise UsageError("--input %s: cannot read it: %s: %s%s"
                         % (o.input, type(e).__name__, why, hint))
    used = []
    for name, dt, x in tensors:
        if dt is None:
            print("%s: note: %s: skipping tensor '%s' (%s is not floating point)"
                  % (PROG, o.input, name, x), file=sys.stderr)
        elif x.size == 0:
            print("%s: note: %s: skipping tensor '%s' (no elements)" % (PROG, o.input, name),
                  file=sys.stderr)
        else:
            used.append((name, dt, x))
    if not used:
        raise UsageError("--input %s: no fp32, fp16 or bf16 tensor with elements" % o.input)
    if len(used) == 1:
        source = "input=%s (%s, %d elements, %s)" % (o.input, kind, used[0][2].size, used[0][1])
    else:
        source = "input=%s (%s, %d tensors)" % (o.input, kind, len(used))
    if info is not None:
        print_run(o, source, info)
    cfgs = list(configs(o))
    rows, overall = [], [None] * len(cfgs)
    # NaN and overflow are data here (they print as nan, inf), as in the C tool
    with np.errstate(invalid="ignore", over="ignore"):
        _measure_tensors(o, used, cfgs, rows, overall)
    if len(used) > 1:
        rows += overall
    return [dict({c: r[c] for c in COLUMNS[:4] + EXTRA_COLUMNS}, **metrics(r)) for r in rows]


def _measure_tensors(o, used, cfgs, rows, overall) -> None:
    for name, dt, x in used:
        if o.dtype is not None:
            x, dt = convert(x, dt, o.dtype), o.dtype
        for c, (b, m, k, g, r) in enumerate(cfgs):
            s = measure(x, dt, b, m, k, g, r, o.seed, o.decode_to == "fp32")
            rows.append(dict(dist=name, bits=b, block=k, mode=m, hadamard=g, rounding=r, **s))
            a = overall[c]
            if a is None:
                overall[c] = dict(rows[-1], dist="overall")
            else:  # blocks never span tensors: overall sums the per-tensor sums
                for f in ("sum_x2", "sum_e2", "bytes", "n"):
                    a[f] += s[f]
                a["max_abs"] = _nan_max(a["max_abs"], s["max_abs"])


# ---- output: the C tool's text, byte for byte -----------------------------------

def _num(v: float) -> str:
    """Shortest %g text that reads back as the same double; inf/nan spelled."""
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    for p in (15, 16, 17):
        s = "%.*g" % (p, v)
        if float(s) == v:
            break
    return s


def _csv_field(s: str) -> str:
    if not any(c in s for c in ',"\r\n'):
        return s
    return '"%s"' % s.replace('"', '""')


def _json_str(s: str) -> str:
    out = []
    for c in s:
        if c in '"\\':
            out.append("\\" + c)
        elif ord(c) < 0x20:
            out.append("\\u%04x" % ord(c))
        else:
            out.append(c)
    return '"%s"' % "".join(out)


def _json_num(v: float) -> str:
    """JSON has no inf/nan: they are written as the strings "inf", "nan"."""
    s = _num(v)
    return s if math.isfinite(v) else '"%s"' % s


def format_rows(rows: list, fmt: str, extra: bool) -> str:
    out = []
    if fmt == "csv":
        out.append(",".join(COLUMNS + (EXTRA_COLUMNS if extra else [])) + "\n")
        for r in rows:
            line = ",".join([_csv_field(r["dist"]), str(r["bits"]), str(r["block"]), r["mode"]]
                            + [_num(r[c]) for c in COLUMNS[4:]])
            if extra:
                line += ",%d,%s" % (r["hadamard"], r["rounding"])
            out.append(line + "\n")
    elif fmt == "json":
        out.append("[")
        for i, r in enumerate(rows):
            obj = '%s\n  {"dist": %s, "bits": %d, "block": %d, "mode": "%s", ' % (
                "," if i else "", _json_str(r["dist"]), r["bits"], r["block"], r["mode"])
            obj += ", ".join('"%s": %s' % (c, _json_num(r[c])) for c in COLUMNS[4:])
            if extra:
                obj += ', "hadamard": %d, "rounding": "%s"' % (r["hadamard"], r["rounding"])
            out.append(obj + "}")
        out.append("\n]\n")
    else:
        w = max([4] + [len(r["dist"].encode()) for r in rows])

        def pad(s):
            return s + " " * (w - len(s.encode()))

        head = "%s %4s %8s %4s %11s %11s %8s %13s" % (pad("dist"), *COLUMNS[1:])
        out.append(head + (" %8s %10s" % tuple(EXTRA_COLUMNS) if extra else "") + "\n")
        for r in rows:
            line = "%s %4d %8d %4s %11s %11s %8s %13s" % (
                pad(r["dist"]), r["bits"], r["block"], r["mode"], "%.4e" % r["rel_l2"],
                "%.4e" % r["max_abs"], "%.2f" % r["snr_db"], "%.4f" % r["bits_per_elem"])
            if extra:
                line += " %8d %10s" % (r["hadamard"], r["rounding"])
            out.append(line + "\n")
    return "".join(out)


def print_run(o, source: str, out) -> None:
    """The run's settings, one '#' line (the C tool's, with this name)."""
    L = _lib.get()
    v = L.ffi.new("int *")
    L.check(L.lib.zpp_get_version(v))
    print("# %s (zpp %d.%d.%d, cpu path %s): %s seed=%d dtype=%s decode-to=%s" % (
        PROG, v[0] // 10000, v[0] // 100 % 100, v[0] % 100, L.string(L.lib.zpp_quant_cpu_isa()),
        source, o.seed, o.dtype or "file's", o.decode_to), file=out)


# ---- flags: the C tool's set ---------------------------------------------------

def _list(flag: str, item):
    def parse(s: str):
        if not s or len(s) >= 1024:
            raise argparse.ArgumentTypeError("%s '%s': must be a comma list of 1 to %d items"
                                             % (flag, s, MAX_LIST))
        toks = s.split(",")
        if "" in toks:
            raise argparse.ArgumentTypeError("%s '%s': empty item in the list" % (flag, s))
        if len(toks) > MAX_LIST:
            raise argparse.ArgumentTypeError("%s '%s': more than %d items" % (flag, s, MAX_LIST))
        return [item(flag, t) for t in toks]
    return parse


def _size(flag: str, t: str) -> int:
    if not re.fullmatch(r"[0-9]+", t) or int(t) >= 2 ** 64:
        raise argparse.ArgumentTypeError("%s %s: must be a non-negative integer" % (flag, t))
    return int(t)


def _choice(*names):
    def item(flag: str, t: str):
        if t not in names:
            alts = [", ".join(names[:-1]), names[-1]] if len(names) > 2 else names
            raise argparse.ArgumentTypeError("%s %s: must be %s" % (flag, t, " or ".join(alts)))
        return int(t) if t.isdigit() else t
    return item


def _one(flag: str, *names):
    item = _choice(*names)
    return lambda s: item(flag, s)


def _hadamard(flag: str, t: str) -> int:
    g = _size(flag, t)
    if g != 0 and (g < 2 or g & (g - 1)):
        raise argparse.ArgumentTypeError("%s %s: must be 0 (off) or a power of two >= 2"
                                         % (flag, t))
    return g


def _dtype(flag: str):
    def parse(s: str) -> str:
        L = _lib.get()
        d = L.ffi.new("zpp_dtype_t *")
        # the library's spellings (fp32, float32, half, bf16, ...); u8 parses
        # (zpp_allgather moves bytes) but is no data to quantize
        if L.lib.zpp_dtype_parse(s.encode(), d) != 0 or d[0] == L.lib.ZPP_UINT8:
            raise argparse.ArgumentTypeError("%s %s: must be fp32, fp16 or bf16" % (flag, s))
        return L.string(L.lib.zpp_dtype_name(d[0]))
    return parse


def _seed(s: str) -> int:
    if not re.fullmatch(r"[0-9]+", s) or int(s) >= 2 ** 64:
        raise argparse.ArgumentTypeError("--seed %s: must be an unsigned 64-bit integer" % s)
    return int(s)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m " + PROG, allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Quantization error of the zpp block quantizer (encode then decode through "
                    "the public API) for every tensor of a file and every combination of bits, "
                    "mode and block size.  Sums are float64.  The flags and columns of the C "
                    "tool zpp-quant-error, which makes synthetic data.",
        epilog="Exit status: 0 ok, 2 bad flag or input file, 1 library error.")
    d = p.add_argument_group("data (synthetic: the C tool zpp-quant-error only; refused here)")
    for f in SYNTHETIC_FLAGS:
        d.add_argument(f, metavar="X", dest="synthetic_" + f[2:].replace("-", "_"))
    d = p.add_argument_group("data (from a file)")
    d.add_argument("--input", metavar="FILE",
                   help=".npy, .safetensors, a torch checkpoint (.pt, .pth, .ckpt, .bin) or, with "
                        "--input-dtype, a raw little-endian file")
    d.add_argument("--input-dtype", type=_dtype("--input-dtype"), metavar="T",
                   help="dtype of a raw file: fp32, fp16 or bf16")
    d.add_argument("--seed", type=_seed, default=DEFAULT_SEED, metavar="S",
                   help="seed of stochastic rounding (default %d; printed)" % DEFAULT_SEED)
    q = p.add_argument_group("quantizer")
    q.add_argument("--bits", type=_list("--bits", _choice("8", "4")), default=[8, 4],
                   metavar="LIST", help="8 and/or 4 (default 8,4)")
    q.add_argument("--block", type=_list("--block", _size), default=DEFAULT_BLOCKS,
                   metavar="LIST",
                   help="block sizes in elements; 0: one scale for the whole tensor "
                        "(default 32,64,128,256,512,1024,2048,4096,0)")
    q.add_argument("--mode", type=_list("--mode", _choice("sym", "asym")), action="append",
                   default=[], dest="mode_lists", metavar="LIST",
                   help="sym and/or asym (default sym,asym)")
    q.add_argument("--sym", action="append_const", const=["sym"], dest="mode_lists",
                   help="add one mode (same as --mode)")
    q.add_argument("--asym", action="append_const", const=["asym"], dest="mode_lists")
    q.add_argument("--dtype", type=_dtype("--dtype"), metavar="T",
                   help="fp32, fp16 or bf16: the data is rounded to T (RNE; bf16 from fp32, never "
                        "through fp16) and encoded from T (default: the file's dtype)")
    q.add_argument("--decode-to", type=_one("--decode-to", "same", "fp32"), default="same",
                   metavar="D",
                   help="same (decode into the data's dtype, as a collective would; default) or "
                        "fp32 (quantizer error alone)")
    q.add_argument("--hadamard", type=_list("--hadamard", _hadamard), metavar="LIST",
                   help="Hadamard group sizes (powers of two >= 2; 0: off; default 0): rotate in "
                        "groups of G (zpp_hadamard), encode and decode in fp32, rotate back, store "
                        "in the data's dtype; a block must be a multiple of G (other pairs are "
                        "skipped with a note)")
    q.add_argument("--rounding", type=_list("--rounding", _choice("nearest", "stochastic")),
                   metavar="LIST",
                   help="nearest and/or stochastic (default nearest; the stochastic seed is "
                        "--seed).  With --hadamard or --rounding the columns hadamard,rounding "
                        "follow bits_per_elem")
    out = p.add_argument_group("output")
    out.add_argument("--format", type=_one("--format", "table", "csv", "json"), default="table",
                     metavar="F",
                     help="table (default), csv or json; columns " + ",".join(COLUMNS)
                          + "; the run's settings go to stdout as a '#' line for table, to "
                            "stderr for csv/json")
    out.add_argument("--print-settings", action="store_true",
                     help="print every ZPP_* setting and exit")
    return p


def parse_args(argv=None):
    p = parser()
    o = p.parse_args(argv)
    if o.print_settings:
        return o
    for f in SYNTHETIC_FLAGS:
        if getattr(o, "synthetic_" + f[2:].replace("-", "_")) is not None:
            p.error("%s: synthetic data comes from the C tool zpp-quant-error (same flags and "
                    "columns); this front end reads --input files" % f)
    if o.input is None:
        p.error("--input FILE is required here: synthetic data comes from the C tool "
                "zpp-quant-error (same flags and columns)")
    if o.input == "":
        p.error("--input: empty file name")
    o.modes = list(dict.fromkeys(m for lst in o.mode_lists for m in lst)) or ["sym", "asym"]
    o.extra = o.hadamard is not None or o.rounding is not None
    o.hadamard = o.hadamard or [0]
    o.rounding = o.rounding or ["nearest"]
    return o


def main(argv=None) -> int:
    o = parse_args(argv)
    L = _lib.get()
    if o.print_settings:
        sys.stdout.flush()
        L.check(L.lib.zpp_settings_print(sys.stdout))
        return 0
    info = sys.stdout if o.format == "table" else sys.stderr
    try:
        rows = run(o, info)
    except _lib.Error as e:
        print("%s: %s" % (PROG, e), file=sys.stderr)
        return 1
    except UsageError as e:
        print("%s: %s" % (PROG, e), file=sys.stderr)
        return 2
    sys.stdout.write(format_rows(rows, o.format, o.extra))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
