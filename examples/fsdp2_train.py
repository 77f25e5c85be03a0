#!/usr/bin/env python3
"""A small transformer language model trained with PyTorch FSDP2 on CPU
(or, with --device cuda, on CUDA), with zpp as FSDP2's all-gather and
reduce-scatter.

Launch under mpirun (Open MPI), torchrun or srun (Slurm), from the
repository's root with zpp importable (PYTHONPATH=python
ZPP_LIBRARY=build/libzpp.so, or `pip install .` from the root); gloo bootstraps
torch through zpp.init_process_group, which finds the rendezvous from the
launcher's variables (no MASTER_ADDR or MASTER_PORT to set):

    ZPP_TOPO=2x2 mpirun -np 4 python examples/fsdp2_train.py --comm zppmpi --zeropp --steps 5
    torchrun --standalone --nproc-per-node 2 examples/fsdp2_train.py --comm zpp --steps 5
    srun -n 2 python examples/fsdp2_train.py --comm zppenv --steps 5

--comm gloo       FSDP2's own collectives over gloo (the reference)
--comm zpp        zpp, communicator over torch's store (zpp's TCP bootstrap)
--comm zppmpi     zpp, communicator over MPI (mpirun only)
--comm zppenv     zpp, communicator from torchrun's or srun's variables (no MPI)
--zeropp          qwZ INT8 gathers, qgZ INT4 gradients with error feedback,
                  and zpp's hpZ over several nodes (enable()'s default with
                  qwZ: the forward gather keeps the node's copy of the
                  parameters encoded, the backward gather stays inside the
                  node)
--zpp-hpz 0|1     zpp's hpZ off or on (default: enable()'s, on with qwZ)
--hpz N           FSDP2's hpZ instead: reshard_after_forward=N (the
                  backward gathers exact, on groups of N ranks; zpp's hpZ
                  then off)
--qgz-intra-bits, --hadamard   qgZ's intra-node bits and Hadamard group
--dtype bf16 --reduce-dtype bf16   bf16 gathers and bf16 reduce-scatter
                  (bf16 ZeRO-3 on the wire; perf/convergence_study.sh)
--device cuda     the model and the data on CUDA device (local rank) % (device
                  count); zpp's communicators then work on device memory
                  (ranks that share a GPU: MPI or UCX staging, not NCCL).
                  Not with --comm gloo (gloo's collectives here take CPU
                  tensors)
--unshard-async   FSDP2's pre-forward and pre-backward gathers with
                  async_op=True (FSDPModule._set_unshard_async_op, where
                  the installed torch has it; said when it has not), so
                  zpp's hook returns its Work and FSDP2 waits on it; the
                  JSON line counts those gathers ("async_gathers")

The data: sequences of a fixed random Markov chain over --vocab tokens
(the same chain on every rank, a different batch per rank and step), so
the loss has a floor (the chain's entropy rate, printed).  One JSON line
at the end (rank 0) holds the losses, step times and zpp's byte counters.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--comm", choices=["gloo", "zpp", "zppmpi", "zppenv"], default="zpp")
    p.add_argument("--zeropp", action="store_true",
                   help="qwZ8 + qgZ4 + error feedback + zpp's hpZ (over several nodes)")
    p.add_argument("--qwz-bits", type=int, default=None)
    p.add_argument("--qgz-bits", type=int, default=None)
    p.add_argument("--qgz-intra-bits", type=int, default=0,
                   help="qgZ intra-node bits (0: --qgz-bits)")
    p.add_argument("--hadamard", type=int, default=0,
                   help="qgZ Hadamard rotation group (0: off)")
    p.add_argument("--ef", type=int, default=None, help="error feedback 0/1")
    p.add_argument("--hpz", type=int, default=None,
                   help="FSDP2's hpZ: reshard_after_forward=<this many ranks> (0: True)")
    p.add_argument("--zpp-hpz", type=int, choices=[0, 1], default=None,
                   help="zpp's hpZ off (0) or on (1); default: on with qwZ "
                        "(zpp.fsdp.enable's hpz=None)")
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32",
                   help="parameter dtype of the gathers (bf16: mixed precision, fp32 master)")
    p.add_argument("--reduce-dtype", choices=["fp32", "bf16"], default=None,
                   help="gradient dtype of the reduce-scatter (default: fp32; "
                        "with --dtype fp32 it must be fp32)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="where the model and the data live (cuda: device local rank %% count)")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--batch", type=int, default=8, help="sequences per rank")
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--vocab", type=int, default=64)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--divide-factor", type=float, default=None,
                   help="set_gradient_divide_factor(f) on every module (PREMUL_SUM)")
    p.add_argument("--force-sum", action="store_true", help="set_force_sum_reduction_for_comms(True)")
    p.add_argument("--mixed", action="store_true",
                   help="a frozen bf16 final LayerNorm: the root's gather is uint8")
    p.add_argument("--unshard-async", action="store_true",
                   help="FSDP2's gathers with async_op=True (zpp's Work; "
                        "FSDPModule._set_unshard_async_op where torch has it)")
    p.add_argument("--json", action="store_true", help="print one JSON line (rank 0)")
    p.add_argument("--quiet", action="store_true")
    a = p.parse_args(argv)
    # options that would otherwise be dropped without a word
    if a.device == "cuda" and a.comm == "gloo":
        p.error("--device cuda: --comm gloo (FSDP2's own collectives over gloo) takes CPU "
                "tensors only here; use --comm zpp, zppmpi or zppenv")
    if a.unshard_async and a.comm == "gloo":
        p.error("--unshard-async counts zpp's gathers: not with --comm gloo")
    if a.zpp_hpz is not None and a.comm == "gloo":
        p.error("--zpp-hpz: --comm gloo uses FSDP2's own all-gather")
    if a.zpp_hpz == 1 and a.hpz:
        p.error("--zpp-hpz 1 with --hpz %d: FSDP2's hpZ already gathers the backward "
                "inside groups of %d; pick one" % (a.hpz, a.hpz))
    if a.reduce_dtype == "bf16" and a.dtype != "bf16":
        p.error("--reduce-dtype bf16 needs --dtype bf16 (the gathers' dtype)")
    qgz = a.qgz_bits if a.qgz_bits is not None else (4 if a.zeropp else 0)
    for flag, v in (("--qgz-intra-bits", a.qgz_intra_bits), ("--hadamard", a.hadamard)):
        if v and not qgz:
            p.error("%s %d needs qgZ (--qgz-bits 4 or 8, or --zeropp)" % (flag, v))
        if v and a.comm == "gloo":
            p.error("%s %d: --comm gloo uses FSDP2's own reduce-scatter" % (flag, v))
    return a


class _AsyncCount:
    """An all-gather hook that forwards to ``hook`` and appends 1 to
    ``seen`` for each call with async_op=True that returned a Work."""

    def __init__(self, hook, seen: list):
        self.hook, self.seen = hook, seen

    def allocate(self, size, *, dtype, device):
        return self.hook.allocate(size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, async_op: bool = False):
        import torch.distributed as dist

        w = self.hook(output_tensor, input_tensor, group, async_op=async_op)
        if async_op and isinstance(w, dist.Work):
            self.seen.append(1)
        return w


def main(argv=None) -> int:
    """One training run (the command line)."""
    return run([argv if argv is not None else sys.argv[1:]])


def run(argvs, before=None) -> int:
    """Several training runs in one process group (tests compare them);
    ``before()``, when given, runs first in that group."""
    runs = [parse(argv) for argv in argvs]  # bad flags fail before any rendezvous
    import torch
    import torch.distributed as dist

    import zpp

    torch.set_num_threads(1)
    cuda = any(a.device == "cuda" for a in runs)
    if cuda and not torch.cuda.is_available():
        sys.exit("fsdp2_train: --device cuda: torch %s sees no CUDA device" % torch.__version__)
    # torchrun's, mpirun's or srun's variables (LOCAL_RANK among them): no
    # MASTER_ADDR / MASTER_PORT to set by hand
    zpp.init_process_group("gloo")
    if cuda:
        # one device per local rank while there are enough, else shared;
        # CUDA initialised now, or DeviceMesh would set the device LOCAL_RANK
        # names (past the last one when ranks share a GPU)
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())
        torch.cuda.init()
    if before is not None:
        before()
    for a in runs:
        train(a)
    # no barrier right before destroy_process_group: it aborts at exit under
    # gloo (a torch bug)
    dist.destroy_process_group()
    return 0


def train(a) -> dict:
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    rank, world = dist.get_rank(), dist.get_world_size()
    zeropp = a.zeropp
    qwz = a.qwz_bits if a.qwz_bits is not None else (8 if zeropp else 0)
    qgz = a.qgz_bits if a.qgz_bits is not None else (4 if zeropp else 0)
    ef = bool(a.ef) if a.ef is not None else (zeropp and qgz > 0)
    hpz = a.hpz if a.hpz is not None else 0

    class Block(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
            self.heads = 4

        def forward(self, x):
            B, T, D = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(D, dim=-1)
            sh = lambda t: t.view(B, T, self.heads, D // self.heads).transpose(1, 2)
            y = nn.functional.scaled_dot_product_attention(sh(q), sh(k), sh(v), is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(B, T, D))
            return x + self.fc2(nn.functional.gelu(self.fc1(self.ln2(x))))

    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(a.vocab, a.dim)
            self.pos = nn.Parameter(torch.randn(a.seq, a.dim) * 0.02)
            self.blocks = nn.ModuleList(Block(a.dim) for _ in range(a.layers))
            self.ln = nn.LayerNorm(a.dim)
            self.head = nn.Linear(a.dim, a.vocab)

        def forward(self, t):
            x = self.emb(t) + self.pos[: t.shape[1]]
            for b in self.blocks:
                x = b(x)
            h = self.ln(x.to(self.ln.weight.dtype))
            return self.head(h.to(self.head.weight.dtype))

    cuda = a.device == "cuda"
    dev = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    torch.manual_seed(a.seed)
    model = LM()  # made on the CPU: the same initial weights on either device
    if a.mixed:
        # a frozen bf16 LayerNorm beside fp32 parameters in the root's group:
        # FSDP2 then gathers that group as uint8
        model.ln.to(torch.bfloat16).requires_grad_(False)
    nparams = sum(p.numel() for p in model.parameters())
    model.to(dev)
    mesh = init_device_mesh(a.device, (world,))
    red = {"bf16": torch.bfloat16, "fp32": torch.float32}[a.reduce_dtype or "fp32"]
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if a.dtype == "bf16" else None,
                              reduce_dtype=red if a.dtype == "bf16" else None)
    raf = hpz if hpz else True
    for b in model.blocks:
        fully_shard(b, mesh=mesh, reshard_after_forward=raf, mp_policy=mp)
    fully_shard(model, mesh=mesh, reshard_after_forward=raf, mp_policy=mp)
    fsdp_modules = [m for m in model.modules() if hasattr(m, "set_custom_all_gather")]
    if a.divide_factor is not None:
        for m in fsdp_modules:
            m.set_gradient_divide_factor(a.divide_factor)
    if a.force_sum:
        for m in fsdp_modules:
            m.set_force_sum_reduction_for_comms(True)

    z, comm = None, None
    if a.comm != "gloo":
        import zpp
        import zpp.fsdp

        # --comm zpp: enable() makes the communicator, on device memory when
        # the parameters are on CUDA; the others are made here, so they are
        # told
        mem = {"memory": "device", "device": dev.index} if cuda else {}
        make = {"zppmpi": zpp.Comm.from_mpi, "zppenv": zpp.Comm.from_env}.get(a.comm)
        comm = make(**mem) if make else None
        z = zpp.fsdp.enable(model, comm=comm, qwz_bits=qwz, qgz_bits=qgz,
                            qgz_intra_bits=a.qgz_intra_bits, error_feedback=ef,
                            hadamard=a.hadamard,
                            hpz=None if a.zpp_hpz is None else bool(a.zpp_hpz))

    # FSDP2 passes async_op=True to the all-gather hook only for an
    # unshard(async_op=True) or after _set_unshard_async_op(True) (a private
    # method, absent from older torch); then it keeps the returned Work and
    # waits on it before the gathered parameters are used
    unshard_async, async_gathers = None, []
    if a.unshard_async:
        unshard_async = all(hasattr(m, "_set_unshard_async_op") for m in fsdp_modules)
        if unshard_async:
            for m in fsdp_modules:
                m._set_unshard_async_op(True)
            # FSDP2 calls the hook through its type: wrap each module's hook
            for m, h in zip(fsdp_modules, z.gathers, strict=True):
                m.set_custom_all_gather(_AsyncCount(h, async_gathers))
        elif rank == 0:
            print("fsdp2_train: --unshard-async: torch %s's FSDPModule has no "
                  "_set_unshard_async_op; the gathers stay synchronous" % torch.__version__,
                  file=sys.stderr, flush=True)

    # the data: a fixed random Markov chain (sharp rows, so there is something to learn)
    g = torch.Generator().manual_seed(1000 + a.seed)
    trans = torch.softmax(3.0 * torch.randn(a.vocab, a.vocab, generator=g), dim=-1)
    stat = torch.full((a.vocab,), 1.0 / a.vocab)
    for _ in range(200):
        stat = stat @ trans
    entropy = float(-(stat[:, None] * trans * trans.clamp_min(1e-30).log()).sum())

    def batch(step):
        gen = torch.Generator().manual_seed(a.seed * 1000003 + step * world + rank)
        t = torch.empty(a.batch, a.seq + 1, dtype=torch.long)
        t[:, 0] = torch.randint(a.vocab, (a.batch,), generator=gen)
        for i in range(a.seq):
            t[:, i + 1] = torch.multinomial(trans[t[:, i]], 1, generator=gen)[:, 0]
        return t[:, :-1], t[:, 1:]

    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.0)
    losses, times, tok_var, ntok = [], [], [], 0
    step_stats = []
    for step in range(a.steps):
        x, y = batch(step)
        x, y = x.to(dev), y.to(dev)
        if z is not None:
            z.reset_stats()
        t0 = time.perf_counter()
        tok = nn.functional.cross_entropy(model(x).float().reshape(-1, a.vocab), y.reshape(-1),
                                          reduction="none")
        loss = tok.mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        # the loss of the whole global batch (mean over ranks), for the record
        # (gloo: CPU tensors)
        t = tok.detach().double().cpu()
        l = torch.stack([t.sum(), (t * t).sum(), torch.tensor(float(t.numel()), dtype=torch.float64)])
        dist.all_reduce(l)
        losses.append(float(l[0] / l[2]))
        tok_var.append(float(l[1] / l[2] - (l[0] / l[2]) ** 2))
        ntok = int(l[2])
        if z is not None:
            step_stats.append(z.stats())
        if rank == 0 and not a.quiet and (step % 10 == 0 or step == a.steps - 1):
            print("step %3d loss %.4f  %.3f s" % (step, losses[-1], times[-1]), flush=True)

    # bytes per step, all ranks together (each rank's sent bytes, summed)
    out = {"comm": a.comm, "device": a.device, "world": world, "zeropp": zeropp,
           "qwz_bits": qwz, "qgz_bits": qgz, "error_feedback": ef, "hpz": hpz, "dtype": a.dtype,
           "reduce_dtype": a.reduce_dtype or "fp32", "qgz_intra_bits": a.qgz_intra_bits,
           "hadamard": a.hadamard, "params": nparams, "fsdp_modules": len(fsdp_modules),
           "steps": a.steps,
           "entropy_floor": entropy, "losses": losses, "tokens_per_step": ntok,
           "token_loss_std_last10": math.sqrt(sum(tok_var[-10:]) / len(tok_var[-10:])),
           "step_time_s": sorted(times[1:])[len(times[1:]) // 2] if len(times) > 1 else times[0],
           "step_times_s": times}
    if z is not None and step_stats:
        per = torch.tensor([[s["inter_bytes_sent"], s["intra_bytes_sent"]] for s in step_stats[1:] or step_stats],
                           dtype=torch.float64)
        dist.all_reduce(per)
        out["inter_bytes_per_step"] = float(per[:, 0].mean())
        out["intra_bytes_per_step"] = float(per[:, 1].mean())
        out["zpp_comms"] = len(z.comms.all())
        out["backend"] = z.comms.world.backend
        out["memory"] = z.comms.world.memory
        out["hook_calls"] = z.hook_calls()
        # zpp's hpZ: on for this many modules (0: off)
        out["zpp_hpz_modules"] = sum(1 for g in z.gathers if g.hpz)
    if a.unshard_async:
        # gathers FSDP2 made with async_op=True that returned a Work, all
        # ranks together (None: torch has no _set_unshard_async_op)
        n = torch.tensor([len(async_gathers)], dtype=torch.float64)
        dist.all_reduce(n)
        out["unshard_async"] = unshard_async
        out["async_gathers"] = int(n[0])
        out["torch"] = torch.__version__
    # a digest of the trained parameters (the full tensors, gathered; on
    # CUDA through CPU copies of the shards, which gloo takes: FSDP2 shards
    # dim 0 as torch.chunk does, so the shards in rank order are the tensor)
    def full_tensor(p):
        if not cuda:
            return p.full_tensor()
        parts = [None] * world
        dist.all_gather_object(parts, p.to_local().detach().cpu())
        return torch.cat(parts, dim=0)

    h = 0.0
    with torch.no_grad():
        for p in model.parameters():
            full = full_tensor(p).double()
            h += float((full * torch.arange(1, full.numel() + 1, dtype=torch.float64).view_as(full).sin()).sum())
    out["param_digest"] = h
    if rank == 0 and a.json:
        print(json.dumps(out), flush=True)
    if rank == 0 and not a.json and not a.quiet:
        print("final loss %.4f (floor %.4f), step %.3f s" % (losses[-1], entropy, out["step_time_s"]))
    if z is not None:
        z.close()  # the communicators enable() made; not the one given as comm=
    if comm is not None:
        comm.close()
    return out


if __name__ == "__main__":
    sys.exit(main())
