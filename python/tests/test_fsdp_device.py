"""examples/fsdp2_train.py's --device option on a machine without a GPU:
cpu is the default, --comm gloo --device cuda is refused by name before
any rendezvous (gloo's collectives there take CPU tensors), and --device
cuda where torch sees no CUDA device stops with a message that says so,
before the process group.  The CUDA run itself is perf/gpu_check.sh's
FSDP2 step (a machine with a GPU)."""

import subprocess
import sys

import pytest

from conftest import EXAMPLE, env

sys.path.insert(0, str(EXAMPLE.parent))
import fsdp2_train  # noqa: E402


def test_device_defaults_to_cpu_and_takes_cuda():
    assert fsdp2_train.parse([]).device == "cpu"
    for comm in ("zpp", "zppmpi", "zppenv"):
        assert fsdp2_train.parse(["--comm", comm, "--device", "cuda"]).device == "cuda"


def test_gloo_on_cuda_is_refused_by_name(capsys):
    with pytest.raises(SystemExit) as e:
        fsdp2_train.parse("--comm gloo --device cuda".split())
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--device cuda: --comm gloo" in err and "CPU tensors" in err, err


def test_cuda_without_a_device_stops_before_the_rendezvous():
    import torch

    if torch.cuda.is_available():
        pytest.skip("torch sees a CUDA device here: perf/gpu_check.sh runs that case")
    # no launcher: a rendezvous would fail on torch's missing RANK instead
    e = {k: v for k, v in env().items() if k not in ("RANK", "WORLD_SIZE")}
    r = subprocess.run([sys.executable, str(EXAMPLE), "--comm", "zpp", "--device", "cuda"],
                       env=e, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "--device cuda: torch" in r.stderr \
        and "sees no CUDA device" in r.stderr, (r.returncode, r.stderr)
