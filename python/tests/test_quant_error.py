"""The quantization-error tool's two front ends (docs/api.md, "Quantization
error tool"): python -m zpp.quant_error (files through numpy, safetensors,
torch) and the C tool zpp-quant-error (synthetic data, raw files).

- On the same raw file, with every flag that changes the numbers
  (--dtype, --decode-to, --hadamard, --rounding, --seed) and every
  --format, both print the same stdout byte for byte: the same library
  calls, float64 sums in element order, the same number text.
- A tensor saved as .npy (C or Fortran order, little- or big-endian, bf16
  as '<V2'), in a .safetensors file or a torch checkpoint gives the rows
  of its raw bytes read by the C tool (only the name differs).
- The "overall" rows of a file of several tensors equal a float64
  reference computed here from zpp.quant.encode/decode: the per-tensor
  sums of squares added up, to 1e-12 relative (n <= 3000 terms of one
  sign in another order: at most n * 2^-53 ~ 3e-13; the square roots
  halve it).
- Each front end refuses the other's data, naming the other; bad files
  exit 2 naming the file (and the tensor).

Seed: ZPP_TEST_SEED (default 20261130), printed.
"""

import csv
import io
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from conftest import BUILD, env

import zpp
from zpp import quant_error as qe

SEED = int(os.environ.get("ZPP_TEST_SEED", "20261130"))
TOOL = BUILD / "tools" / "zpp-quant-error"
BLOCKS = "1,64,100,1000,0"


def _run(cmd):
    p = subprocess.run([str(c) for c in cmd], env=env(), capture_output=True, text=True,
                       timeout=120)
    return p.returncode, p.stdout, p.stderr


def c_tool(*args):
    if not TOOL.is_file():
        pytest.fail("%s not built: cmake --build <dir> --target zpp-quant-error (make test builds "
                    "it); ZPP_BUILD_DIR names the build directory" % TOOL)
    return _run([TOOL, *args])


def py_tool(*args):
    return _run([sys.executable, "-m", "zpp.quant_error", *args])


def py_main(*args):
    """The Python front end in this process (faster than a launch)."""
    out, err = io.StringIO(), io.StringIO()
    so, se = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = out, err
    try:
        rc = qe.main([str(a) for a in args])
    except SystemExit as e:  # argparse's errors
        rc = e.code
    finally:
        sys.stdout, sys.stderr = so, se
    return rc, out.getvalue(), err.getvalue()


def rows(text):
    return list(csv.DictReader(io.StringIO(text)))


def data(rng, n, dt):
    """Normal values with 1% outliers x50, as dt's numpy storage (bf16:
    uint16 bits, rounded to nearest even by torch)."""
    x = rng.standard_normal(n) * np.where(rng.random(n) < 0.01, 50.0, 1.0)
    x = x.astype(np.float32)
    if dt == "fp32":
        return x
    if dt == "fp16":
        return x.astype(np.float16)
    return torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


def as_torch(a, dt):
    t = torch.from_numpy(a.copy())
    return t.view(torch.bfloat16) if dt == "bf16" else t


@pytest.fixture(scope="module")
def rng():
    print("seed %d (ZPP_TEST_SEED)" % SEED)
    return np.random.default_rng(SEED)


# ---- the two front ends on the same raw file ----------------------------------

FLAG_SETS = [
    [],
    ["--hadamard", "0,32,256", "--rounding", "nearest,stochastic", "--seed", "7"],
    ["--dtype", "bf16", "--decode-to", "fp32"],
    ["--dtype", "fp16", "--hadamard", "64", "--asym"],
]


@pytest.mark.parametrize("dt", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("flags", range(len(FLAG_SETS)))
def test_raw_file_gives_the_c_tools_stdout_byte_for_byte(tmp_path, rng, dt, flags):
    f = tmp_path / "x.bin"
    data(rng, 4099, dt).tofile(f)  # prime: every block leaves a tail
    for fmt in ("csv", "json", "table"):
        args = ["--input", f, "--input-dtype", dt, "--bits", "8,4", "--block", BLOCKS,
                "--format", fmt] + FLAG_SETS[flags]
        rc, c_out, c_err = c_tool(*args)
        assert rc == 0, c_err
        rc, p_out, p_err = py_main(*args)
        assert rc == 0, p_err
        assert c_out.count("\n") > 4
        # a table carries the run's '#' line, which names each front end
        strip = lambda s: "\n".join(l for l in s.splitlines() if not l.startswith("# "))
        assert strip(p_out) == strip(c_out), (fmt, FLAG_SETS[flags])
        if fmt == "csv":  # the notes (skipped block/group pairs) too
            assert p_err.replace("zpp.quant_error", "zpp-quant-error").splitlines()[1:] == \
                c_err.splitlines()[1:]


@pytest.mark.parametrize("dt", ["fp32", "fp16", "bf16"])
def test_non_finite_data_gives_the_same_text(tmp_path, rng, dt):
    """Random bytes: NaN and infinities among the values ("nan", "inf" in
    the rows; a NaN error, once met, stays the max as in numpy)."""
    f = tmp_path / "r.bin"
    f.write_bytes(rng.integers(0, 256, 6000, dtype=np.uint8).tobytes())
    x = np.fromfile(f, qe._STORAGE[dt])
    assert not np.all(np.isfinite(qe._to_f32(x, dt)))
    args = ["--input", f, "--input-dtype", dt, "--block", "16,0", "--hadamard", "0,16",
            "--format", "csv"]
    rc, c_out, err = c_tool(*args)
    assert rc == 0, err
    assert "nan" in c_out
    assert py_main(*args)[1] == c_out


def test_the_module_runs_as_a_program(tmp_path, rng):
    f = tmp_path / "x.bin"
    data(rng, 1000, "fp32").tofile(f)
    args = ["--input", f, "--input-dtype", "fp32", "--block", "32,0", "--format", "csv"]
    rc, out, err = py_tool(*args)
    assert rc == 0, err
    assert out == c_tool(*args)[1]
    assert "# zpp.quant_error (zpp " in err and "seed=20261129" in err


# ---- files through numpy, safetensors and torch ----------------------------------

def _same_rows(c, p, name):
    """The C tool's rows of a raw file against the Python one's of a tensor:
    the same text in every column but the name."""
    assert len(c) == len(p) > 0
    for a, b in zip(c, p):
        assert b["dist"] == name
        assert {k: v for k, v in a.items() if k != "dist"} == \
            {k: v for k, v in b.items() if k != "dist"}


@pytest.mark.parametrize("dt", ["fp32", "fp16", "bf16"])
def test_npy_gives_the_rows_of_its_raw_bytes(tmp_path, rng, dt):
    x = data(rng, 37 * 29, dt)
    x.tofile(tmp_path / "w.bin")
    base = ["--bits", "8,4", "--block", BLOCKS, "--format", "csv"]
    rc, c_out, err = c_tool("--input", tmp_path / "w.bin", "--input-dtype", dt, *base)
    assert rc == 0, err
    m = x.reshape(37, 29)
    if dt == "bf16":
        m = m.view(np.dtype("V2"))  # how ml_dtypes' bfloat16 arrays are saved
    files = {"c": m, "f": np.asfortranarray(m)}
    if dt != "bf16":
        files["be"] = m.astype(m.dtype.newbyteorder(">"))
    for tag, arr in files.items():
        np.save(tmp_path / ("w_%s.npy" % tag), arr)
        rc, p_out, err = py_main("--input", tmp_path / ("w_%s.npy" % tag), *base)
        assert rc == 0, err
        _same_rows(rows(c_out), rows(p_out), "w_%s" % tag)


def _reference(x, dt, bits, block, asym):
    """Float64 sums of one tensor: zpp.quant.encode/decode, numpy sums."""
    t = as_torch(x, dt)
    n = t.numel()
    blk = block or n
    enc = zpp.quant.encode(t, bits=bits, block=blk, asymmetric=asym)
    y = zpp.quant.decode(enc, n, dtype=t.dtype, bits=bits, block=blk, asymmetric=asym)
    xs, ys = t.to(torch.float64).numpy(), y.to(torch.float64).numpy()
    return (float(np.sum(xs * xs)), float(np.sum((ys - xs) ** 2)),
            float(np.max(np.abs(ys - xs))), enc.numel(), n)


def test_safetensors_rows_per_tensor_and_overall(tmp_path, rng):
    ts = {"layers.0.w": ("fp32", data(rng, 3 * 5 * 7, "fp32")),
          'emb "x",y': ("fp16", data(rng, 100, "fp16")),
          "norm.bias": ("bf16", data(rng, 64 * 3, "bf16"))}
    tensors = {k: as_torch(a, dt) for k, (dt, a) in ts.items()}
    tensors["position_ids"] = torch.arange(6)
    save_file(tensors, str(tmp_path / "m.safetensors"))
    base = ["--bits", "8,4", "--block", BLOCKS, "--format", "csv"]
    rc, out, err = py_main("--input", tmp_path / "m.safetensors", *base)
    assert rc == 0, err
    assert "skipping tensor 'position_ids' (int64 is not floating point)" in err
    got = rows(out)
    assert len(got) == 4 * 2 * 2 * 5  # three tensors and "overall"
    for name, (dt, a) in ts.items():
        a.tofile(tmp_path / "t.bin")
        rc, c_out, err = c_tool("--input", tmp_path / "t.bin", "--input-dtype", dt, *base)
        assert rc == 0, err
        _same_rows(rows(c_out), [r for r in got if r["dist"] == name], name)
    overall = [r for r in got if r["dist"] == "overall"]
    assert len(overall) == 20
    for r in overall:
        sx = se = mx = nbytes = n = 0
        for dt, a in ts.values():
            s = _reference(a, dt, int(r["bits"]), int(r["block"]), r["mode"] == "asym")
            sx, se, mx, nbytes, n = sx + s[0], se + s[1], max(mx, s[2]), nbytes + s[3], n + s[4]
        if se == 0:  # block 1 INT8 symmetric: every element is its own scale
            assert (r["rel_l2"], r["snr_db"]) == ("0", "inf"), r
        else:
            rel = math.sqrt(se) / math.sqrt(sx)
            snr = 20 * math.log10(math.sqrt(sx) / math.sqrt(se))
            assert float(r["rel_l2"]) == pytest.approx(rel, rel=1e-12), r
            assert float(r["snr_db"]) == pytest.approx(snr, rel=1e-12), r
        assert float(r["max_abs"]) == mx  # exact: no sum
        assert float(r["bits_per_elem"]) == 8.0 * nbytes / n


def test_torch_checkpoint_equals_its_safetensors(tmp_path, rng):
    t = {"w": as_torch(data(rng, 2000, "fp32"), "fp32"),
         "b": as_torch(data(rng, 777, "bf16"), "bf16"),
         "h": as_torch(data(rng, 100, "fp16"), "fp16"), "steps": torch.arange(5)}
    save_file(t, str(tmp_path / "b.safetensors"))
    torch.save({"model": t, "opt": [t["w"][:10].clone()]}, str(tmp_path / "b.pt"))
    base = ["--bits", "8,4", "--block", "64,0", "--format", "csv", "--hadamard", "0,32"]
    st, pt = py_main("--input", tmp_path / "b.safetensors", *base), \
        py_main("--input", tmp_path / "b.pt", *base)
    assert st[0] == 0 and pt[0] == 0, (st[2], pt[2])
    s, p = rows(st[1]), rows(pt[1])
    names = {r["dist"] for r in p}
    assert names == {"model.w", "model.b", "model.h", "opt.0", "overall"}  # int skipped
    for name in ("w", "b", "h"):
        a = [r for r in s if r["dist"] == name]
        b = [r for r in p if r["dist"] == "model." + name]
        assert len(a) == len(b) == 2 * 2 * 2 * 2  # bits, modes, blocks, groups
        for x, y in zip(a, b):
            assert dict(x, dist="") == dict(y, dist="")


# ---- refusals ------------------------------------------------------------------

def test_each_front_end_refuses_the_others_data_naming_it(tmp_path):
    f = tmp_path / "w.npy"
    np.save(f, np.ones(10, np.float32))
    rc, out, err = c_tool("--input", f)
    assert rc == 2 and out == "" and "python -m zpp.quant_error --input %s" % f in err
    rc, out, err = c_tool("--input", f, "--input-dtype", "fp32")
    assert rc == 2 and "--input-dtype" in err and "header" in err
    for args in (["--dist", "normal"], ["--n", "100", "--input", f], []):
        rc, out, err = py_main(*args)
        assert rc == 2 and out == "" and "synthetic data comes from the C tool zpp-quant-error" \
            in err, (args, err)


@pytest.mark.parametrize("flags, words", [
    (["--dist", "laplace"], ["--dist", "zpp-quant-error"]),
    ([], ["--input", "zpp-quant-error"]),
    (["--input", "x", "--bits", "8,16"], ["--bits 16"]),
    (["--input", "x", "--block", "32,,64"], ["--block", "empty item"]),
    (["--input", "x", "--hadamard", "3"], ["--hadamard 3"]),
    (["--input", "x", "--rounding", "up"], ["--rounding up"]),
    (["--input", "x", "--dtype", "u8"], ["--dtype u8"]),
    (["--input", "x", "--format", "xml"], ["--format xml"]),
    (["--input", "x", "--blo", "3"], ["--blo"]),  # no abbreviations, as the C tool
])
def test_bad_flags_exit_two_naming_the_flag(flags, words):
    rc, out, err = py_main(*flags)
    assert rc == 2 and out == "", err
    for w in words:
        assert w in err, (w, err)


def test_unusable_files_exit_two_naming_the_file(tmp_path):
    cases = []
    np.save(tmp_path / "i.npy", np.arange(16, dtype=np.int32))
    cases.append(("i.npy", ["no fp32, fp16 or bf16 tensor"]))
    np.save(tmp_path / "f64.npy", np.ones(8))
    cases.append(("f64.npy", ["'<f8'"]))
    save_file({"t": torch.ones(4, dtype=torch.float64)}, str(tmp_path / "f64.safetensors"))
    cases.append(("f64.safetensors", ["'t'", "float64"]))
    (tmp_path / "cut.safetensors").write_bytes((tmp_path / "f64.safetensors").read_bytes()[:-8])
    cases.append(("cut.safetensors", ["cannot read it"]))
    (tmp_path / "x.txt").write_text("1 2 3")
    cases.append(("x.txt", ["not .npy", "--input-dtype"]))
    (tmp_path / "raw.bin").write_bytes(bytes(10))
    cases.append(("raw.bin", ["cannot read it", "--input-dtype"]))
    cases.append(("missing.npy", ["No such file"]))
    for name, words in cases:
        rc, out, err = py_main("--input", tmp_path / name)
        assert rc == 2 and out == "", (name, err)
        for w in [str(tmp_path / name)] + words:
            assert w in err, (name, w, err)
    rc, out, err = py_main("--input", tmp_path / "raw.bin", "--input-dtype", "fp32")
    assert rc == 2 and "10 bytes is not a positive multiple of 4" in err
