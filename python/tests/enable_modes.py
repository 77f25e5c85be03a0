"""Run by fsdp_runs.py ("enable-modes", under mpirun): zpp.fsdp.enable()
in each mode its docstring documents, on a small model of Linear layers
(U FSDP modules), S training steps each; one JSON line (rank 0)
{"enable_modes": {mode: U, S, the hook counts, the losses, a digest of
the last step's gradients}}.  Also the stale secondary shard: forward,
the parameters changed (in place, by a foreach or fused optimizer step,
through .data or the local shard and invalidate()), backward; training
patterns (gradient accumulation, activation checkpointing, a module
called twice, two forwards and one backward, an eval forward in between),
the root's reshard_after_forward left to FSDP2 or set to False between
steps, and nodes of different
sizes, each with hpZ on and off; and hpz=True refused with FSDP2's
reshard_after_forward=<int>."""
import json

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.utils.checkpoint
from torch.distributed.fsdp import fully_shard

import zpp
import zpp.fsdp

STEPS = 2
CHANGES = ("sgd foreach", "adamw foreach", "adamw fused", "data", "local")
SCENARIOS = ("accumulate", "checkpoint one", "checkpoint region", "called twice",
             "two forwards", "eval between")


def model(raf):
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64), nn.Linear(64, 1))
    fully_shard(m[0], reshard_after_forward=raf)
    fully_shard(m[1], reshard_after_forward=raf)
    fully_shard(m, reshard_after_forward=raf)
    return m


def units(m):
    return sum(1 for x in m.modules() if isinstance(x, zpp.fsdp.FSDPModule))


def digest(m):
    h = 0.0
    for p in m.parameters():
        g = p.grad.full_tensor().double().flatten()
        h += float((g * torch.arange(1, g.numel() + 1, dtype=torch.float64).sin()).sum())
    return h


def train(world, raf, **kw):
    m = model(raf)
    z = zpp.fsdp.enable(m, comm=world, **kw)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    losses = []
    for step in range(STEPS):
        g = torch.Generator().manual_seed(100 * step + dist.get_rank())
        x = torch.randn(8, 64, generator=g)
        loss = m(x).square().mean()
        loss.backward()
        d = digest(m)
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
    out = {"units": units(m), "steps": STEPS, "calls": z.hook_calls(), "losses": losses,
           "grad_digest": d, "hpz_modules": sum(1 for h in z.gathers if h.hpz)}
    out.update(close(z))
    return out


def close(z):
    """z.close(), and the hpZ handles before it and whether it freed them."""
    hs = [h for g in z.gathers for h in g._hpz.values()]
    z.close()
    return {"handles": len(hs), "freed": all(h._h is None for h in hs)
            and not any(g._hpz for g in z.gathers)}


def change(m, how, z):
    """Every parameter changed between a forward and its backward, in one of
    the ways a training loop does: an optimizer step (foreach, fused: their
    _foreach_* ops leave the version counters alone), an in-place op on the
    parameter, a write to .data or to the local shard (then invalidate())."""
    ps = list(m.parameters())
    if how in ("sgd foreach", "adamw foreach", "adamw fused"):
        kind, impl = how.split()
        opt = (torch.optim.SGD(ps, lr=0.1, **{impl: True}) if kind == "sgd"
               else torch.optim.AdamW(ps, lr=0.1, **{impl: True}))
        for p in ps:
            p.grad = torch.full_like(p, 0.25)
        opt.step()
        for p in ps:
            p.grad = None
    elif how == "inplace":
        with torch.no_grad():
            for p in ps:
                p.mul_(0.5)
    elif how == "data":
        for p in ps:
            p.data.mul_(0.5)
        z.invalidate()
    elif how == "local":
        with torch.no_grad():
            for p in ps:
                p.to_local().mul_(0.5)
        z.invalidate()
    else:
        raise ValueError(how)


def stale(world, hpz, how="inplace"):
    """Forward, then every parameter changed (change()), then backward: the
    backward gathers must see the changed parameters, as FSDP2 does."""
    m = model(True)
    z = zpp.fsdp.enable(m, comm=world, qwz_bits=8, qgz_bits=4, hpz=hpz)
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(7 + dist.get_rank()))
    loss = m(x).square().mean()
    change(m, how, z)
    loss.backward()
    out = {"units": units(m), "calls": z.hook_calls(), "grad_digest": digest(m)}
    z.close()
    return out


class Net(nn.Module):
    """Three FSDP modules (l0, l1, the root) run in the patterns of
    scenario(): activation checkpointing, a module called twice."""

    def __init__(self):
        super().__init__()
        self.l0, self.l1, self.l2 = nn.Linear(64, 64), nn.Linear(64, 64), nn.Linear(64, 1)
        self.how = ""

    def forward(self, x):
        ck = torch.utils.checkpoint.checkpoint
        if self.how == "checkpoint one":
            h = ck(self.l1, self.l0(x), use_reentrant=False)
        elif self.how == "checkpoint region":
            h = ck(lambda y: self.l1(torch.tanh(self.l0(y))), x, use_reentrant=False)
        elif self.how == "called twice":
            h = self.l1(torch.tanh(self.l1(self.l0(x))))
        else:
            h = self.l1(self.l0(x))
        return self.l2(h)


def scenario(world, hpz, how):
    """One training pattern with zpp's hpZ on or off (the gradients must not
    depend on it): gradient accumulation without sync, activation
    checkpointing, a module called twice, two forwards and one backward,
    an eval forward between forward and backward."""
    torch.manual_seed(0)
    m = Net()
    fully_shard(m.l0)
    fully_shard(m.l1)
    fully_shard(m, reshard_after_forward=True)
    z = zpp.fsdp.enable(m, comm=world, qwz_bits=8, qgz_bits=4, hpz=hpz)
    xs = [torch.randn(8, 64, generator=torch.Generator().manual_seed(11 * i + dist.get_rank()))
          for i in range(2)]
    m.how = how
    if how == "accumulate":
        m.set_requires_gradient_sync(False)
        m(xs[0]).square().mean().backward()
        m.set_requires_gradient_sync(True)
        m(xs[1]).square().mean().backward()
    elif how == "two forwards":
        (m(xs[0]).square().mean() + m(xs[1]).abs().mean()).backward()
    elif how == "eval between":
        loss = m(xs[0]).square().mean()
        with torch.no_grad():
            m(xs[1])
        loss.backward()
    else:
        m(xs[0]).square().mean().backward()
    out = {"calls": z.hook_calls(), "grad_digest": digest(m)}
    z.close()
    return out


def auto_root(world, hpz):
    """The usual wrapping: fully_shard(model) after the blocks, with
    reshard_after_forward left to FSDP2, which keeps the root's parameters
    from the forward to the backward (no backward gather): zpp's hpZ keeps
    no copy of it."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64), nn.Linear(64, 1))
    fully_shard(m[0])
    fully_shard(m[1])
    fully_shard(m)
    z = zpp.fsdp.enable(m, comm=world, qwz_bits=8, qgz_bits=4, hpz=hpz)
    summary = zpp.fsdp._hpz(zpp.fsdp._fsdp_modules(m), world, z.options)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    for step in range(STEPS):
        g = torch.Generator().manual_seed(100 * step + dist.get_rank())
        x = torch.randn(8, 64, generator=g)
        m(x).square().mean().backward()
        d = digest(m)
        opt.step()
        opt.zero_grad()
    root = z.gathers[[g.param_group for g in z.gathers].index(
        m._get_fsdp_state()._fsdp_param_groups[0])]
    out = {"calls": z.hook_calls(), "grad_digest": d, "summary": summary,
           "root_handles": len(root._hpz)}
    out.update(close(z))
    return out


def stops_resharding(world, hpz):
    """One step, then set_reshard_after_forward(False) on every module (as
    before an eval) and a second step: FSDP2 no longer gathers in the
    backward, and zpp's hpZ frees the copies it kept."""
    m = model(True)
    z = zpp.fsdp.enable(m, comm=world, qwz_bits=8, qgz_bits=4, hpz=hpz)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    held = []
    for step in range(2):
        if step == 1:
            m.set_reshard_after_forward(False)
        x = torch.randn(8, 64, generator=torch.Generator().manual_seed(5 * step + dist.get_rank()))
        m(x).square().mean().backward()
        held.append(sum(len(g._hpz) for g in z.gathers))
        d = digest(m)
        opt.step()
        opt.zero_grad()
    out = {"calls": z.hook_calls(), "grad_digest": d, "held": held,
           "hpz_modules": sum(1 for g in z.gathers if g.hpz)}
    z.close()
    return out


def check() -> None:
    world = zpp.Comm.from_mpi()
    zpp_ = dict(qwz_bits=8, qgz_bits=4, error_feedback=True)
    res = {
        "exact": train(world, True),
        "zeropp": train(world, True, **zpp_),
        "zeropp hpz=False": train(world, True, hpz=False, **zpp_),
        "zeropp fsdp2 hpz": train(world, 2, **zpp_),
        "exact hpz=True": train(world, True, hpz=True),
        "stale hpz": stale(world, None),
        "stale no hpz": stale(world, False),
    }
    for how in CHANGES:
        res["stale %s hpz" % how] = stale(world, None, how)
        res["stale %s no hpz" % how] = stale(world, False, how)
    for how in SCENARIOS:
        res["%s hpz" % how] = scenario(world, None, how)
        res["%s no hpz" % how] = scenario(world, False, how)
    res["stops resharding hpz"] = stops_resharding(world, None)
    res["stops resharding no hpz"] = stops_resharding(world, False)
    res["auto root hpz"] = auto_root(world, None)
    res["auto root no hpz"] = auto_root(world, False)
    # nodes of different sizes (3 + 1 ranks): zpp's hpZ keeps no copy there
    uneven = zpp.Comm.from_mpi(topology="0,0,0,1")
    res["uneven hpz"] = train(uneven, True, qwz_bits=8, qgz_bits=4)
    res["uneven no hpz"] = train(uneven, True, qwz_bits=8, qgz_bits=4, hpz=False)
    uneven.close()
    try:
        zpp.fsdp.enable(model(2), comm=world, qwz_bits=8, hpz=True)
        res["refused"] = "accepted"
    except ValueError as e:
        res["refused"] = str(e)
    world.close()
    if dist.get_rank() == 0:
        print(json.dumps({"enable_modes": res}), flush=True)
