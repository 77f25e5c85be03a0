"""python -m zpp.quant_error against the C tool zpp-quant-error: the same
rows and columns from the same files (.npy, .safetensors), the float64
sums equal to 1e-12 relative (numpy sums in another order), max_abs and
bits_per_elem exactly; a torch checkpoint of the same tensors gives the
same rows as their .safetensors file (names prefixed by the dict path)."""

import csv
import io
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from conftest import BUILD, ROOT, env

SEED = int(os.environ.get("ZPP_TEST_SEED", "20261130"))
TOOL = BUILD / "tools" / "zpp-quant-error"
ARGS = ["--bits", "8,4", "--block", "64,0", "--format", "csv"]


def _rows(cmd):
    p = subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return list(csv.DictReader(io.StringIO(p.stdout)))


def _py(path):
    return _rows([sys.executable, "-m", "zpp.quant_error", "--input", str(path)] + ARGS)


def _same(c, p, rename=lambda s: s):
    assert len(c) == len(p) > 0
    for a, b in zip(c, p):
        assert rename(a["dist"]) == b["dist"]
        for k in ("bits", "block", "mode", "max_abs", "bits_per_elem"):
            assert a[k] == b[k], (k, a, b)
        for k in ("rel_l2", "snr_db"):
            assert float(b[k]) == pytest.approx(float(a[k]), rel=1e-12), (k, a, b)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("qe")
    r = np.random.default_rng(SEED)
    print("seed %d" % SEED)
    np.save(d / "a.npy", (r.standard_normal(3001) * 3).astype(np.float32))
    g = torch.Generator().manual_seed(SEED)
    t = {"w": torch.randn(2000, generator=g), "b": torch.randn(777, generator=g).to(torch.bfloat16),
         "h": torch.randn(100, generator=g).half(), "steps": torch.arange(5)}
    save_file(t, str(d / "b.safetensors"))
    torch.save({"model": t}, str(d / "b.pt"))
    return d


@pytest.mark.skipif(not TOOL.is_file(), reason="zpp-quant-error not built")
@pytest.mark.parametrize("name", ["a.npy", "b.safetensors"])
def test_same_rows_as_the_c_tool(files, name):
    _same(_rows([str(TOOL), "--input", str(files / name)] + ARGS), _py(files / name))


def test_torch_checkpoint_equals_its_safetensors(files):
    st, pt = _py(files / "b.safetensors"), _py(files / "b.pt")
    _same(st, pt, rename=lambda s: s if s == "overall" else "model." + s)
    assert {r["dist"] for r in pt} == {"model.w", "model.b", "model.h", "overall"}  # int skipped


def test_unknown_file_is_refused_naming_it(tmp_path):
    f = tmp_path / "x.txt"
    f.write_text("1 2 3")
    p = subprocess.run([sys.executable, "-m", "zpp.quant_error", "--input", str(f)],
                       env=env(), capture_output=True, text=True)
    assert p.returncode == 2 and "x.txt" in p.stderr
