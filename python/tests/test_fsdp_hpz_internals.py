"""zpp.fsdp.enable() with hpZ on refuses a torch whose FSDP2 lacks the
internals zpp's hpZ reads (the training state that tells a backward
gather, a param group's attributes), naming the missing one and asking for
hpz=False, before it opens a communicator or sets a hook; hpz=False takes
the same model.  One process: a 1-rank gloo process group."""

import os

import pytest

from conftest import free_port

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402

import zpp.fsdp  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def world1():
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % free_port(), rank=0,
                            world_size=1)
    yield
    dist.destroy_process_group()


def _model():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))
    fully_shard(m[0])
    fully_shard(m)
    return m


def _hooks(m):
    return [(g._all_gather_comm, g._reduce_scatter_comm) for x in m.modules()
            if isinstance(x, zpp.fsdp.FSDPModule) for g in x._get_fsdp_state()._fsdp_param_groups]


def test_no_training_state_refused_with_hpz_taken_without(monkeypatch):
    m = _model()
    before = _hooks(m)
    monkeypatch.setattr(zpp.fsdp, "_TrainingState", None)
    with pytest.raises(ValueError, match=r"zpp's hpZ \(hpz=None: on with qwz_bits\) reads "
                       r"FSDP2's .*TrainingState\.PRE_BACKWARD, .* pass hpz=False"):
        zpp.fsdp.enable(m, qwz_bits=8)
    assert _hooks(m) == before
    z = zpp.fsdp.enable(m, qwz_bits=8, hpz=False)
    assert all(isinstance(g, zpp.fsdp.AllGather) for g, _ in _hooks(m))
    z.close()
    assert _hooks(m) == before


def test_missing_param_group_attribute_named_with_its_module():
    m = _model()
    before = _hooks(m)
    g = m[0]._get_fsdp_state()._fsdp_param_groups[0]
    state = g._training_state
    del g._training_state
    try:
        with pytest.raises(ValueError, match=r"hpz=True\) reads FSDP2's "
                           r"FSDPParamGroup\._training_state \(FSDP module '0'\)"):
            zpp.fsdp.enable(m, qwz_bits=8, hpz=True)
        assert _hooks(m) == before
    finally:
        g._training_state = state
    zpp.fsdp.enable(m, qwz_bits=8, hpz=True).close()
