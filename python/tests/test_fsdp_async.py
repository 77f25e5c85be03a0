"""FSDP2's gathers with async_op=True (examples/fsdp2_train.py
--unshard-async, FSDPModule._set_unshard_async_op): FSDP2 keeps the
zpp.fsdp.Work the all-gather hook returns and waits on it before it
copies the gathered parameters out.  On CPU tensors that wait is the
host's, for the gather's completion, and each collective computes the
same thing either way, so ZeRO++ with async gathers must train bitwise as
with synchronous ones: the same loss at every step and the same digest of
the trained parameters.  A Work that returned before its gather was done,
or whose wait did not wait, would break that."""

import pytest

from conftest import TESTS, mpirun

RUNS = TESTS / "fsdp_runs.py"
Q = "--json --quiet"


def test_zeropp_async_gathers_train_bitwise_as_synchronous_ones(have_mpirun):
    from torch.distributed.fsdp import FSDPModule

    if not hasattr(FSDPModule, "_set_unshard_async_op"):
        pytest.skip("this torch's FSDPModule has no _set_unshard_async_op: FSDP2 makes no "
                    "async gather")
    run = "--comm zppmpi --zeropp --steps 4 " + Q
    # two emulated nodes: every forward gather crosses them, so each one is
    # qwZ's, and every backward gather is zpp's hpZ inside the node
    sync, asy = mpirun(2, [RUNS, run, run + " --unshard-async"], ZPP_TOPO="2x1")
    assert "async_gathers" not in sync
    assert asy["unshard_async"] is True, asy
    # every gather FSDP2 made was async and returned a Work: the count (all
    # ranks) is the world size times rank 0's gathers, none of them exact
    calls = asy["hook_calls"]
    gathers = calls.get("qwz float32", 0) + calls.get("hpz-node float32", 0)
    assert calls.get("qwz float32", 0) == calls.get("hpz-node float32", 0) > 0, asy
    assert not any(k.startswith("exact") for k in calls), asy
    assert asy["async_gathers"] == 2 * gathers, asy
    assert asy["hook_calls"] == sync["hook_calls"], (asy["hook_calls"], sync["hook_calls"])
    assert asy["losses"] == sync["losses"], (asy["losses"], sync["losses"])
    assert asy["param_digest"] == sync["param_digest"]
