"""The hook calls of each documented mode of examples/fsdp2_train.py and of
zpp.fsdp.enable(), against what their docs say, on ZPP_TOPO=2x2 (4 ranks,
2 emulated nodes), 2 training steps of a small model, one launch.

The expected counts are derived from the model's FSDP modules U (each
module one all-gather input and one reduce-scatter per pass: the example
wraps each of its L blocks and the root, U = L + 1) and the steps S.  FSDP2
with reshard_after_forward=True gathers every module twice a step (forward
and backward) and reduce-scatters it once:

  mode                          world gathers       node gathers         reduce-scatters
  exact (defaults)              2US "exact"         -                    US "exact avg"
  ZeRO++ (qwZ; zpp's hpZ)       US "qwz"            US "hpz-node" (zpp)  US "qgz avg"
  ZeRO++, hpZ off               2US "qwz"           -                    US "qgz avg"
  ZeRO++ + FSDP2's hpZ (int)    US "qwz"            US "exact" (fp32)    US "qgz avg"

hpZ moves no number: the three ZeRO++ rows train bitwise alike (losses,
parameters); zpp's hpZ and FSDP2's have the same inter-node bytes, and
zpp's moves fewer intra-node bytes (its node copy is qwZ-encoded, FSDP2's
is fp32).
"""

import re

from conftest import TESTS, mpirun

RUNS = TESTS / "fsdp_runs.py"
LAYERS, STEPS = 2, 2
SMALL = "--dim 32 --layers %d --steps %d --batch 2 --seq 8 --vocab 16 --json --quiet" % (LAYERS, STEPS)


def expect(U, S, world_gathers, node_gathers, scatters, gather_kind="qwz", node_kind="hpz-node",
           scatter_kind="qgz avg"):
    out = {}
    for k, n in (("%s float32" % gather_kind, world_gathers), ("%s float32" % node_kind, node_gathers),
                 (scatter_kind, scatters)):
        if n:
            out[k] = out.get(k, 0) + n * U * S
    return out


def test_hook_calls_of_every_documented_mode(have_mpirun):
    modes = {
        "exact": "--comm zppmpi",
        "zeropp": "--comm zppmpi --zeropp",
        "zeropp, zpp hpZ off": "--comm zppmpi --zeropp --zpp-hpz 0",
        "zeropp, FSDP2 hpZ": "--comm zppmpi --zeropp --hpz 2",
    }
    out = mpirun(4, [RUNS, "enable-modes"] + ["%s %s" % (m, SMALL) for m in modes.values()],
                 ZPP_TOPO="2x2", timeout=240)
    en, runs = out[0]["enable_modes"], dict(zip(modes, out[1:]))
    assert len(runs) == len(modes)

    # the example: U = L + 1 (each block and the root)
    for name, r in runs.items():
        assert r["fsdp_modules"] == LAYERS + 1 and r["steps"] == STEPS, (name, r)
    U, S = LAYERS + 1, STEPS
    want = {
        "exact": expect(U, S, 2, 0, 1, gather_kind="exact", scatter_kind="exact avg"),
        "zeropp": expect(U, S, 1, 1, 1),
        "zeropp, zpp hpZ off": expect(U, S, 2, 0, 1),
        "zeropp, FSDP2 hpZ": expect(U, S, 1, 1, 1, node_kind="exact"),
    }
    for name in modes:
        assert runs[name]["hook_calls"] == want[name], (name, runs[name]["hook_calls"], want[name])
    for name in modes:
        assert runs[name]["zpp_hpz_modules"] == (U if name == "zeropp" else 0), (name, runs[name])
    # hpZ moves no number; FSDP2's and zpp's hpZ take the backward gathers
    # off the network alike, and zpp's moves encoded bytes inside the node
    z, off, f2 = runs["zeropp"], runs["zeropp, zpp hpZ off"], runs["zeropp, FSDP2 hpZ"]
    for r in (off, f2):
        assert r["losses"] == z["losses"] and r["param_digest"] == z["param_digest"]
    assert z["inter_bytes_per_step"] == f2["inter_bytes_per_step"] < off["inter_bytes_per_step"]
    # the node gather moves the encoded bytes the qwZ gather moves inside the node
    assert z["intra_bytes_per_step"] == off["intra_bytes_per_step"], (z, off)
    assert z["intra_bytes_per_step"] < f2["intra_bytes_per_step"], (z, f2)

    # enable(): the model of enable_modes.py
    for name, r in en.items():
        if isinstance(r, dict) and "units" in r:
            assert r["units"] == 3, (name, r)
    U = 3
    want = {
        "exact": expect(U, S, 2, 0, 1, gather_kind="exact", scatter_kind="exact avg"),
        "zeropp": expect(U, S, 1, 1, 1),
        "zeropp hpz=False": expect(U, S, 2, 0, 1),
        "zeropp fsdp2 hpz": expect(U, S, 1, 1, 1, node_kind="exact"),
        "exact hpz=True": expect(U, S, 1, 1, 1, gather_kind="exact", scatter_kind="exact avg"),
        # one forward and one backward; the parameters changed in between:
        # the backward gathers go over the world again
        "stale hpz": expect(U, 1, 2, 0, 1, scatter_kind="qgz avg"),
        "stale no hpz": expect(U, 1, 2, 0, 1, scatter_kind="qgz avg"),
    }
    for name, w in want.items():
        assert en[name]["calls"] == w, (name, en[name]["calls"], w)
    for name in ("zeropp hpz=False", "zeropp fsdp2 hpz"):
        assert en[name]["losses"] == en["zeropp"]["losses"], name
        assert en[name]["grad_digest"] == en["zeropp"]["grad_digest"], name
    assert en["exact hpz=True"]["grad_digest"] == en["exact"]["grad_digest"]
    # the stale secondary shard is not used: the gradients of the changed
    # parameters, as without hpZ; for every way of changing them (an
    # optimizer step with foreach or fused kernels, which move no version
    # counter; a write through .data or to the local shard, then
    # invalidate()): the backward gathers go over the world
    assert en["stale hpz"]["grad_digest"] == en["stale no hpz"]["grad_digest"]
    for how in ("sgd foreach", "adamw foreach", "adamw fused", "data", "local"):
        on, off = en["stale %s hpz" % how], en["stale %s no hpz" % how]
        assert on["calls"] == off["calls"] == expect(U, 1, 2, 0, 1), (how, on, off)
        assert on["grad_digest"] == off["grad_digest"], (how, on, off)
    # the changes changed the gradients (the check above can fail)
    assert en["stale sgd foreach no hpz"]["grad_digest"] != en["stale no hpz"]["grad_digest"]
    assert en["zeropp"]["hpz_modules"] == 3 and en["zeropp hpz=False"]["hpz_modules"] == 0
    # close() frees every hpZ handle (one per module with hpZ)
    for name in ("zeropp", "exact hpz=True", "auto root hpz"):
        assert en[name]["handles"] > 0 and en[name]["freed"], (name, en[name])

    # fully_shard(model) with reshard_after_forward unset: FSDP2 keeps the
    # root's parameters gathered from its forward to its backward, so the
    # root has one world gather a step and no hpZ copy, and its blocks
    # (L = 2 here) one world and one node gather each
    L = U - 1
    on, off = en["auto root hpz"], en["auto root no hpz"]
    assert on["calls"] == {"qwz float32": (L + 1) * S, "hpz-node float32": L * S,
                           "qgz avg": U * S}, on
    assert off["calls"] == {"qwz float32": (2 * L + 1) * S, "qgz avg": U * S}, off
    assert on["root_handles"] == 0 and on["handles"] == L, on
    assert on["grad_digest"] == off["grad_digest"]
    assert "on for %d of %d modules" % (L, U) in on["summary"], on["summary"]
    assert "the root keeps its parameters gathered" in on["summary"], on["summary"]

    # set_reshard_after_forward(False) after one step: the second step has
    # no backward gathers, and the copies kept for them are freed
    on, off = en["stops resharding hpz"], en["stops resharding no hpz"]
    assert on["calls"] == {"qwz float32": 2 * U, "hpz-node float32": U, "qgz avg": 2 * U}, on
    assert off["calls"] == {"qwz float32": 3 * U, "qgz avg": 2 * U}, off
    assert on["held"] == [U, 0] and on["hpz_modules"] == 0, on
    assert on["grad_digest"] == off["grad_digest"]

    # nodes of different sizes (3 + 1 ranks): no copy, every gather over the
    # world and named so, the gradients of hpZ off
    on, off = en["uneven hpz"], en["uneven no hpz"]
    assert on["calls"] == off["calls"] == expect(U, S, 2, 0, 1), (on, off)
    assert on["handles"] == 0 and on["hpz_modules"] == 0, on
    assert on["grad_digest"] == off["grad_digest"] and on["losses"] == off["losses"]

    # training patterns whose gradients must not depend on hpZ: each
    # module's copy serves one backward gather (two in "accumulate": two
    # forward-backward passes), every other gather of hpZ off stays a world
    # gather, and the gradients are hpZ off's bitwise
    for how in ("accumulate", "checkpoint one", "checkpoint region", "called twice",
                "two forwards", "eval between"):
        on, off = en["%s hpz" % how]["calls"], en["%s no hpz" % how]["calls"]
        node = on.get("hpz-node float32", 0)
        assert node == U * (2 if how == "accumulate" else 1), (how, on)
        assert on["qwz float32"] + node == off["qwz float32"], (how, on, off)
        assert on["qgz avg"] == off["qgz avg"] == U, (how, on, off)
        assert en["%s hpz" % how]["grad_digest"] == en["%s no hpz" % how]["grad_digest"], how
    assert re.search(r"hpz=True but FSDP module .* reshard_after_forward=2", en["refused"]), en
