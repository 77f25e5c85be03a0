"""zpp as the collectives of PyTorch FSDP2 (``fully_shard``).

    from torch.distributed.fsdp import fully_shard
    for block in model.blocks:
        fully_shard(block, reshard_after_forward=ranks_per_node)   # hpZ
    fully_shard(model)
    z = zpp.fsdp.enable(model, qwz_bits=8, qgz_bits=4, error_feedback=True)
    ...train...; z.stats()  # bytes per link class, all of zpp's communicators

FSDP2 calls the all-gather hook as ``(output[W*n], input[n], group,
async_op)`` in place (input is output[rank*n:]), flat, in fp32/bf16 or
uint8 when a group mixes dtypes; and the reduce-scatter hook as
``(output[n], input[W*n], group, op)`` with op AVG, SUM or PREMUL_SUM
(``op.factor``, from ``set_gradient_divide_factor``).  The setters act on
one module only, so :func:`enable` installs the hooks on every FSDPModule,
each with its own instance (its own error-feedback residual).

hpZ is FSDP2's ``reshard_after_forward=<ranks per node>``: after the
forward the parameters stay sharded over the node, and the backward
all-gather runs on that node's group, which zpp maps to a communicator of
the node (zero inter-node bytes when the zpp node map agrees, e.g.
ZPP_TOPO=2x4 with reshard_after_forward=4).  qwZ quantizes the gathers
that cross nodes; gathers inside a node stay exact.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather as _FsdpAllGather
from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter as _FsdpReduceScatter

from . import _lib
from .comm import Comm

__all__ = ["Options", "Comms", "AllGather", "ReduceScatter", "Work", "enable", "Zpp"]


@dataclass
class Options:
    """What the hooks do.  All zeros/False: zpp's full-precision baselines
    (fp32 sums in a fixed order, zpp_reduce_scatter)."""

    qwz_bits: int = 0        # 0: exact all-gather; 8 or 4: qwZ on gathers across nodes
    qwz_block: int = 256     # elements per scale
    qgz_bits: int = 0        # 0: exact reduce-scatter; 4 or 8: qgZ inter-node bits
    qgz_intra_bits: int = 0  # qgZ intra-node bits; 0: qgz_bits; 16: not quantized
    qgz_block: int = 256
    error_feedback: bool = False  # qgZ residual per module (fp32)
    hadamard: int = 0        # qgZ Hadamard group (0: off)


class Comms:
    """zpp communicators for the ProcessGroups FSDP2 hands to the hooks:
    the world, and the node groups of ``reshard_after_forward=<int>``,
    made on first use with a collective split of the world (FSDP2 calls a
    module's gather on every rank in the same order, so all ranks split
    together)."""

    def __init__(self, world: Optional[Comm] = None, **comm_kw):
        if world is None:
            world = Comm.from_process_group(**comm_kw)
        if world.rank != dist.get_rank() or world.size != dist.get_world_size():
            raise ValueError(
                "zpp world communicator is rank %d of %d, torch rank %d of %d: they must agree"
                % (world.rank, world.size, dist.get_rank(), dist.get_world_size())
            )
        self.world = world
        self._by_ranks = {tuple(range(world.size)): world}

    def get(self, group) -> Comm:
        ranks = tuple(dist.get_process_group_ranks(group))
        c = self._by_ranks.get(ranks)
        if c is None:
            me = self.world.rank
            c = self.world.split(min(ranks), ranks.index(me))
            self._by_ranks[ranks] = c
        return c

    def all(self) -> list:
        return list(self._by_ranks.values())

    def stats(self) -> dict:
        """This rank's byte counters summed over every communicator."""
        tot = {"intra_bytes_sent": 0, "intra_bytes_recv": 0, "inter_bytes_sent": 0,
               "inter_bytes_recv": 0, "emu_wait_s": 0.0}
        for c in self._by_ranks.values():
            s = c.stats()
            for k in tot:
                tot[k] += s[k]
        return tot

    def reset_stats(self) -> None:
        for c in self._by_ranks.values():
            c.reset_stats()

    def close(self) -> None:
        """Collective: the node communicators, then the world."""
        for c in reversed(list(self._by_ranks.values())):
            c.close()
        self._by_ranks.clear()


class Work(dist.Work):
    """What an ``async_op`` gather returns: FSDP2 waits on instances of
    ``dist.Work`` only, so this is one, wrapping a :class:`zpp.Work`.

    As ProcessGroupNCCL's work: on CUDA tensors ``wait()`` (and
    ``synchronize()``, ``block_current_stream()``) makes torch's current
    stream wait for the gather and returns without the host waiting;
    FSDP2 calls it on its compute stream before it copies the gathered
    parameters out, so the compute queued after it runs behind the
    gather.  ``wait(timeout)`` with a timeout (a timedelta above 0) waits
    on the host, as c10d's does.  CPU tensors: the host waits.
    ``is_completed()`` polls on the host."""

    def __init__(self, work):
        super().__init__()
        self._w = work

    def wait(self, timeout=None) -> bool:
        return self._w.wait(timeout)

    def synchronize(self) -> None:
        self._w.wait()

    def block_current_stream(self) -> None:
        self._w.wait()

    def is_completed(self) -> bool:
        return self._w.is_completed()


def _check_tensor(t: torch.Tensor, what: str, comm: Comm) -> None:
    want = "cuda" if comm.memory == "device" else "cpu"
    if t.device.type != want:
        L = _lib.get()
        raise _lib.DeviceError(
            L.lib.ZPP_ERR_UNSUPPORTED, "ZPP_ERR_UNSUPPORTED",
            "zpp.fsdp: %s is on device %s but zpp's communicators work on %s memory (%s "
            "tensors): enable() picks device memory when the model's parameters are on "
            "CUDA, or pass memory='host'/'device'" % (what, t.device, comm.memory, want))


class AllGather(_FsdpAllGather):
    """FSDP2's all-gather hook over zpp (qwZ when ``qwz_bits`` and the group
    spans nodes; the exact gather otherwise and for uint8)."""

    def __init__(self, comms: Comms, options: Options):
        self.comms = comms
        self.options = options
        self.calls: dict = {}  # "qwz fp32", "exact uint8", ... -> calls

    def allocate(self, size, *, dtype, device):
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, async_op: bool = False):
        comm = self.comms.get(group)
        _check_tensor(output_tensor, "the all-gather output", comm)
        _check_tensor(input_tensor, "the all-gather input", comm)
        o = self.options
        quantize = (o.qwz_bits and comm.nnodes > 1
                    and input_tensor.dtype in (torch.float32, torch.bfloat16, torch.float16))
        if quantize:
            w = comm.qwz_allgather(input_tensor, output_tensor, bits=o.qwz_bits,
                                   block=o.qwz_block, async_op=async_op)
        else:
            w = comm.allgather(input_tensor, output_tensor, async_op=async_op)
        k = "%s %s" % ("qwz" if quantize else "exact", str(input_tensor.dtype)[6:])
        self.calls[k] = self.calls.get(k, 0) + 1
        return Work(w) if async_op else None


class ReduceScatter(_FsdpReduceScatter):
    """FSDP2's reduce-scatter hook over zpp: AVG (the true mean), SUM, and
    PREMUL_SUM (the input is scaled by ``op.factor`` first, then summed);
    qgZ when ``qgz_bits``, with a residual kept per call site when
    ``error_feedback``."""

    def __init__(self, comms: Comms, options: Options):
        self.comms = comms
        self.options = options
        self.residuals: dict = {}
        self.calls: dict = {}  # "qgz avg", "exact premul_sum", ... -> calls

    def allocate(self, size, *, dtype, device):
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, op, async_op: bool = False):
        comm = self.comms.get(group)
        _check_tensor(output_tensor, "the reduce-scatter output", comm)
        _check_tensor(input_tensor, "the reduce-scatter input", comm)
        R = dist.ReduceOp
        if op == R.AVG:
            zop = name = "avg"
        elif op == R.SUM:
            zop = name = "sum"
        elif op == R.PREMUL_SUM:
            name = "premul_sum"
            # FSDP2 hands us its own flat input buffer: scaling in place is safe
            input_tensor.mul_(op.factor)
            zop = "sum"
        else:
            raise ValueError("zpp.fsdp: reduce op %r: zpp takes AVG, SUM and PREMUL_SUM" % (op,))
        o = self.options
        if o.qgz_bits:
            res = None
            if o.error_feedback:
                key = (id(comm), output_tensor.numel(), o.qgz_intra_bits or o.qgz_bits)
                res = self.residuals.get(key)
                if res is None:
                    res = comm.qgz_residual(output_tensor.numel(), like=output_tensor,
                                            intra_bits=o.qgz_intra_bits or o.qgz_bits)
                    self.residuals[key] = res
            w = comm.qgz_reduce_scatter(input_tensor, output_tensor, op=zop,
                                        intra_bits=o.qgz_intra_bits or o.qgz_bits,
                                        inter_bits=o.qgz_bits, block=o.qgz_block,
                                        residual=res, hadamard=o.hadamard, async_op=async_op)
        else:
            w = comm.reduce_scatter(input_tensor, output_tensor, op=zop, async_op=async_op)
        k = "%s %s" % ("qgz" if o.qgz_bits else "exact", name)
        self.calls[k] = self.calls.get(k, 0) + 1
        return Work(w) if async_op else None


class Zpp:
    """What :func:`enable` returns: the communicators and the hooks."""

    def __init__(self, comms: Comms, options: Options, gathers: list, scatters: list):
        self.comms = comms
        self.options = options
        self.gathers = gathers
        self.scatters = scatters

    def stats(self) -> dict:
        return self.comms.stats()

    def hook_calls(self) -> dict:
        """Calls of the hooks so far, by kind ("qwz float32", "exact uint8",
        "qgz avg", "exact premul_sum", ...), all modules together."""
        out: dict = {}
        for h in self.gathers + self.scatters:
            for k, v in h.calls.items():
                out[k] = out.get(k, 0) + v
        return out

    def reset_stats(self) -> None:
        self.comms.reset_stats()

    def close(self) -> None:
        """Collective: frees zpp's communicators (the model must not run
        again with these hooks)."""
        self.comms.close()


def enable(model: torch.nn.Module, *, comm: Optional[Comm] = None,
           comms: Optional[Comms] = None, qwz_bits: int = 0, qwz_block: int = 256,
           qgz_bits: int = 0, qgz_intra_bits: int = 0, qgz_block: int = 256,
           error_feedback: bool = False, hadamard: int = 0, **comm_kw) -> Zpp:
    """Installs zpp's all-gather and reduce-scatter on every FSDPModule of
    ``model`` (after ``fully_shard``).  ``comm``: the world communicator
    (default: one made over torch's default group and store); the defaults
    of the other arguments are zpp's exact baselines.  When the model's
    parameters are on CUDA and neither ``comm`` nor ``memory=`` is given,
    the communicators work on device memory of the parameters' device
    (``memory="device", device=<index>``): the hooks then run on torch's
    current stream (FSDP2's all-gather and reduce-scatter streams) and
    return once the collective is queued there (stream-ordered, as with
    ProcessGroupNCCL)."""
    opts = Options(qwz_bits, qwz_block, qgz_bits, qgz_intra_bits, qgz_block,
                   error_feedback, hadamard)
    for b, name in ((qwz_bits, "qwz_bits"), (qgz_bits, "qgz_bits")):
        if b not in (0, 4, 8):
            raise ValueError("%s %d: must be 0 (off), 4 or 8" % (name, b))
    if qgz_intra_bits not in (0, 4, 8, 16):
        raise ValueError("qgz_intra_bits %d: must be 0 (qgz_bits), 4, 8 or 16 (not "
                         "quantized inside the node)" % qgz_intra_bits)
    if error_feedback and not qgz_bits:
        raise ValueError("error_feedback needs qgz_bits (4 or 8)")
    # qgZ's options: without qgz_bits the reduce-scatter is the exact one and
    # would drop them silently (a run would claim a setting it did not use)
    if qgz_intra_bits and not qgz_bits:
        raise ValueError("qgz_intra_bits %d needs qgz_bits (4 or 8)" % qgz_intra_bits)
    if hadamard:
        if not qgz_bits:
            raise ValueError("hadamard %d needs qgz_bits (4 or 8)" % hadamard)
        if hadamard < 2 or hadamard & (hadamard - 1) or qgz_block % hadamard:
            raise ValueError("hadamard %d: must be 0 (off) or a power of two >= 2 that "
                             "divides qgz_block %d" % (hadamard, qgz_block))
    if comms is None:
        if comm is None and "memory" not in comm_kw:
            p = next(model.parameters(), None)
            if p is not None and p.device.type == "cuda":
                comm_kw["memory"] = "device"
                comm_kw.setdefault("device", p.device.index if p.device.index is not None
                                   else torch.cuda.current_device())
        comms = Comms(comm, **comm_kw)
    gathers, scatters = [], []
    for m in model.modules():
        if isinstance(m, FSDPModule):
            g, s = AllGather(comms, opts), ReduceScatter(comms, opts)
            m.set_custom_all_gather(g)
            m.set_custom_reduce_scatter(s)
            gathers.append(g)
            scatters.append(s)
    if not gathers:
        raise ValueError("zpp.fsdp.enable: no FSDPModule in the model (call fully_shard first)")
    return Zpp(comms, opts, gathers, scatters)
