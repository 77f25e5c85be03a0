"""zpp as the collectives of PyTorch FSDP2 (``fully_shard``).

    from torch.distributed.fsdp import fully_shard
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    z = zpp.fsdp.enable(model, qwz_bits=8, qgz_bits=4, error_feedback=True)  # ZeRO++
    ...train...; z.stats()  # bytes per link class, all of zpp's communicators

FSDP2 calls the all-gather hook as ``(output[W*n], input[n], group,
async_op)`` in place (input is output[rank*n:]), flat, in fp32/bf16 or
uint8 when a group mixes dtypes; and the reduce-scatter hook as
``(output[n], input[W*n], group, op)`` with op AVG, SUM or PREMUL_SUM
(``op.factor``, from ``set_gradient_divide_factor``).  The setters act on
one module only, so :func:`enable` installs the hooks on every FSDPModule,
each with its own instance (its own error-feedback residual, its own hpZ
secondary shard).

hpZ comes in two kinds.  zpp's (``enable(hpz=...)``, on by default with
``qwz_bits`` over several nodes): the modules keep FSDP2's default
``reshard_after_forward=True``, and the all-gather hook of each module
runs zpp_hpz_forward_gather in the forward, which keeps this rank's share
of its node's copy of the parameters in qwZ's encoding (a quarter of fp32's
bytes at 8 bits), and zpp_hpz_backward_gather in the backward, which
rebuilds the parameters from the node's ranks alone: zero inter-node bytes,
the same encoded bytes inside the node as the forward's intra-node stage,
and the output bitwise equal to the forward's.  FSDP2's
(``reshard_after_forward=<ranks per node>``): after the forward FSDP2
keeps a copy of the node's share of the gathered parameters in their dtype
(fp32: four times the bytes), and the backward gather runs on the node's
group, which zpp maps to a communicator of the node and gathers exactly
in that dtype (zero inter-node bytes when zpp's node map agrees, e.g.
ZPP_TOPO=2x4 with reshard_after_forward=4).  qwZ quantizes the gathers
that cross nodes; gathers inside a node stay exact, or move zpp's hpZ
encoded copy.

:func:`enable` checks its options, the model's FSDP modules, their
mixed-precision policies and every parameter's dtype and device before it
opens a communicator or sets a hook, and refuses a model that already has
zpp's hooks from an open :class:`Zpp`.  It then says once, on rank 0,
what it chose and why: one INFO line of the ``"zpp"`` logger (see
:func:`enable` for where it goes when logging is not configured).
"""

from __future__ import annotations

import logging
import os
import sys
import weakref
from dataclasses import dataclass, fields
from typing import Optional

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather as _FsdpAllGather
from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter as _FsdpReduceScatter
from torch.optim.optimizer import register_optimizer_step_post_hook

try:
    # what zpp's hpZ reads to tell a backward gather from a forward one;
    # enable() names what is missing when hpZ is asked for without it
    from torch.distributed.fsdp._fully_shard._fsdp_common import TrainingState as _TrainingState
except ImportError:  # pragma: no cover (another torch's layout)
    _TrainingState = None

from . import _lib
from ._lib import Buf
from .comm import Comm, check_bits, check_block, check_config, check_hadamard, quant_config

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
    hpz: bool = False        # zpp's hpZ on the gathers of reshard_after_forward=True modules


class Comms:
    """zpp communicators for the ProcessGroups FSDP2 hands to the hooks:
    the world, and the node groups of ``reshard_after_forward=<int>``,
    made on first use with a collective split of the world (FSDP2 calls a
    module's gather on every rank in the same order, so all ranks split
    together)."""

    def __init__(self, world: Optional[Comm] = None, **comm_kw):
        made_here = world is None
        if world is None:
            world = Comm.from_process_group(**comm_kw)
        if world.rank != dist.get_rank() or world.size != dist.get_world_size():
            if made_here:
                world.close()
            raise ValueError(
                "zpp world communicator is rank %d of %d, torch rank %d of %d: they must agree"
                % (world.rank, world.size, dist.get_rank(), dist.get_world_size())
            )
        self.world = world
        self._by_ranks = {tuple(range(world.size)): world}
        # the log level of a line per communicator made (enable() sets it
        # from ZPP_DEBUG and the "zpp" logger); None: no lines
        self.detail: Optional[int] = None

    def get(self, group) -> Comm:
        ranks = tuple(dist.get_process_group_ranks(group))
        c = self._by_ranks.get(ranks)
        if c is None:
            me = self.world.rank
            c = self.world.split(min(ranks), ranks.index(me))
            self._by_ranks[ranks] = c
            if self.detail is not None:
                _emit(self.detail, "zpp.fsdp: rank %d: communicator of torch ranks %s (a split "
                      "of the world, for FSDP2's group of them): %s"
                      % (self.world.rank, list(ranks), _describe(c)))
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

    def close(self, world: bool = True) -> None:
        """Collective: the node communicators, then the world (``world=False``:
        not the world, which its owner closes)."""
        for c in reversed(list(self._by_ranks.values())):
            if world or c is not self.world:
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


class _Hpz:
    """zpp's hpZ (``zpp_hpz_*``) for the gathers of one FSDP module: the
    forward gather is a world gather (qwZ when ``bits``) that keeps this
    rank's secondary shard, *encoded* (INT8: a quarter of fp32's bytes);
    the backward gather rebuilds the parameters from the node's secondary
    shards, inside the node, bitwise equal to the forward's output."""

    def __init__(self, comm: Comm, count: int, dtype: int, bits: int, block: int):
        L = _lib.get()
        cfg = L.new("zpp_hpz_config_t")
        cfg.quantized = 1 if bits else 0
        if bits:
            cfg.quant = quant_config(bits, block)[0]
        h = L.ffi.new("zpp_hpz_t *")
        L.check(L.lib.zpp_hpz_create(comm._c, cfg, count, dtype, h), comm._c)
        self.comm, self._h = comm, h[0]
        info = L.new("zpp_hpz_info_t")
        L.check(L.lib.zpp_hpz_get_info(self._h, info), comm._c)
        # 0: nodes of different sizes, where zpp keeps no secondary shard
        # and its backward gather is a world gather
        self.hierarchical = bool(info.hierarchical)
        # the parameters' state its secondary shard was cut from: the
        # generation of the Zpp and the versions of the parameters
        self.fresh = None

    def gather(self, send, out, backward: bool, async_op: bool):
        L = _lib.get()
        s, o, out = self.comm._gather_bufs(send, out, True)
        fn = L.lib.zpp_hpz_backward_gather if backward else L.lib.zpp_hpz_forward_gather
        return self.comm._run(fn, (self._h, s.cptr, o.cptr), (send, out), out, async_op, (s, o))

    def close(self) -> None:
        if self._h is not None:
            L = _lib.get()
            h, self._h = self._h, None
            L.check(L.lib.zpp_hpz_destroy(h), self.comm._c)


class _Generation:
    """A count of the writes to the parameters that no version counter
    shows: every torch.optim step (foreach and fused steps write through
    _foreach_* ops, which leave the counters alone) and every
    Zpp.invalidate().  One per Zpp, read by all its gathers."""

    __slots__ = ("n",)

    def __init__(self):
        self.n = 0

    def bump(self, *_args) -> None:
        self.n += 1


def _versions(param_group) -> tuple:
    """The sharded parameters' identities and version counters: an
    in-place op on a parameter bumps its DTensor's counter, one on its
    local tensor that one's, and a parameter or storage swapped for
    another changes the id or the address.  Writes through ``.data``, the
    optimizers' _foreach_* ops and fused kernels change none of them: the
    generation (_Generation) covers those."""
    out = []
    for fp in param_group.fsdp_params:
        p = fp.sharded_param
        t = p._local_tensor
        out.append((id(p), p._version, t._version, t.data_ptr()))
    return tuple(out)


class AllGather(_FsdpAllGather):
    """FSDP2's all-gather hook over zpp (qwZ when ``qwz_bits`` and the group
    spans nodes; the exact gather otherwise and for uint8).

    With ``options.hpz`` and ``param_group`` (the module's FSDP parameter
    group, which says whether FSDP2 gathers for the forward or the
    backward), a float gather over several nodes is zpp's hpZ: the forward
    gather keeps this rank's share of the node's copy of the parameters
    in qwZ's encoding (or exact without qwZ), and the backward gather
    rebuilds them from the node's ranks alone, bitwise equal to what the
    forward gathered.  A backward gather with no forward before it, or
    after a change of the parameters since that forward (a torch.optim
    step or :meth:`Zpp.invalidate`, which bump ``generation``, or an
    in-place write that moved their version counters), gathers over the
    world instead."""

    def __init__(self, comms: Comms, options: Options, param_group=None,
                 generation: Optional[_Generation] = None):
        self.comms = comms
        self.options = options
        self.param_group = param_group
        self.generation = generation if generation is not None else _Generation()
        self._want = bool(options.hpz and param_group is not None)
        self.calls: dict = {}  # "qwz fp32", "exact uint8", "hpz-node float32" ... -> calls
        self._hpz: dict = {}   # (comm, count, dtype) -> _Hpz
        self._uneven: set = set()  # the keys of _hpz whose nodes differ in size: no hpZ

    @property
    def hpz(self) -> bool:
        """zpp's hpZ on this module now: asked for (``options.hpz``), FSDP2
        reshards it after the forward over its whole mesh, so that it
        gathers it again in the backward (``reshard_after_forward`` True at
        this moment: FSDP2 sets the root's to False at its first forward
        unless the application set it), and its nodes are of one size.
        Each gather decides anew."""
        return self._want and _raf(self.param_group) is True and not self._uneven

    def allocate(self, size, *, dtype, device):
        return torch.empty(*size, dtype=dtype, device=device)

    def close(self) -> None:
        """Frees the hpZ secondary shards (before their communicators close):
        every one, then raises the first error."""
        hs, self._hpz = list(self._hpz.values()), {}
        first = None
        for h in hs:
            try:
                h.close()
            except Exception as e:  # noqa: BLE001 (the others are freed first)
                first = first or e
        if first is not None:
            raise first

    def _handle(self, comm: Comm, input_tensor) -> "Optional[_Hpz]":
        """The hpZ handle of this gather, made on first use; None where hpZ
        does not apply now: FSDP2 keeps the module's parameters from the
        forward to the backward (no backward gather: its handles are freed),
        or the nodes differ in size (zpp keeps no copy there)."""
        if _raf(self.param_group) is not True:
            if self._hpz:
                self.close()
            return None
        key = (id(comm), input_tensor.numel(), input_tensor.dtype)
        h = self._hpz.get(key)
        if h is None and key not in self._uneven:
            dtype = Buf(input_tensor, "the all-gather input").dtype
            o = self.options
            h = _Hpz(comm, input_tensor.numel(), dtype, o.qwz_bits, o.qwz_block)
            if h.hierarchical:
                self._hpz[key] = h
            else:
                h.close()
                self._uneven.add(key)
                h = None
        return h

    def __call__(self, output_tensor, input_tensor, group, async_op: bool = False):
        comm = self.comms.get(group)
        _check_tensor(output_tensor, "the all-gather output", comm)
        _check_tensor(input_tensor, "the all-gather input", comm)
        o = self.options
        floats = input_tensor.dtype in (torch.float32, torch.bfloat16, torch.float16)
        quantize = bool(o.qwz_bits) and comm.nnodes > 1 and floats
        pg = self.param_group
        h = self._handle(comm, input_tensor) if self._want and comm.nnodes > 1 and floats else None
        if h is not None:
            now = (self.generation.n, _versions(pg))
            backward = pg._training_state == _TrainingState.PRE_BACKWARD and h.fresh == now
            w = h.gather(input_tensor, output_tensor, backward, async_op)
            h.fresh = None if backward else now  # a secondary shard serves one backward
            k = "%s %s" % ("hpz-node" if backward else "qwz" if quantize else "exact",
                           str(input_tensor.dtype)[6:])
        else:
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
    """What :func:`enable` returns: the communicators and the hooks.

    ``close()`` (collective) puts back the hooks the FSDP modules had
    before :func:`enable` (FSDP2's own collectives over its process
    group, unless others were set) and frees the communicators
    :func:`enable` made; the model can then train on those, or be given
    to :func:`enable` again.  Communicators the caller passed stay open
    (``comms=``: all of them; ``comm=``: that world, while the node
    communicators made from it for hpZ are closed).

    zpp's hpZ serves a backward gather from the copy its forward kept
    only while the parameters are unchanged: every torch.optim step of
    the process (a global step hook, removed by ``close()``) and every
    :meth:`invalidate` mark the copies stale."""

    def __init__(self, comms: Comms, options: Options, gathers: list, scatters: list,
                 modules: Optional[list] = None, owns: str = "all",
                 generation: Optional[_Generation] = None):
        self.comms = comms
        self.options = options
        self.gathers = gathers
        self.scatters = scatters
        # bumped by every torch.optim step (the hook below) and invalidate()
        self.generation = generation if generation is not None else _Generation()
        self._step_hook = register_optimizer_step_post_hook(self.generation.bump)
        # (module, its param groups, their hooks before enable())
        self._modules = modules if modules is not None else []
        # what close() frees: "all" (enable made the world), "splits" (the
        # world was passed as comm=), "none" (comms= passed)
        self._owns = owns
        self.closed = False

    def __repr__(self) -> str:
        o = self.options
        opts = ", ".join("%s=%r" % (f.name, getattr(o, f.name)) for f in fields(o)
                         if getattr(o, f.name) != f.default)
        return "<zpp.fsdp.Zpp id=%#x, %d FSDP modules, %s, %s>" % (
            id(self), len(self._modules), opts or "exact (no qwZ, no qgZ)",
            "closed" if self.closed else "open")

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

    def invalidate(self) -> None:
        """The parameters changed outside torch.optim (a write through
        ``.data`` or to a parameter's local shard, a checkpoint load):
        hpZ's copies of them are stale, and each module's next backward
        gather goes over the world.  Call it on every rank, after every
        such write between a forward and its backward: the ranks must
        agree on which gathers run (a torch.optim step needs no call).
        Local, no communication."""
        self.generation.bump()

    def close(self) -> None:
        """Collective: puts back the FSDP modules' hooks from before
        :func:`enable`, then frees the communicators it made (not those
        passed as ``comm=`` or ``comms=``).  A second close() does
        nothing."""
        if self.closed:
            return
        self.closed = True
        self._step_hook.remove()
        _restore(self._modules, self)
        for h in self.scatters:
            h.residuals.clear()
        try:
            for g in self.gathers:
                g.close()  # hpZ's secondary shards, before their communicators
        finally:
            if self._owns != "none":
                self.comms.close(world=self._owns == "all")


def _restore(modules: list, z) -> None:
    """Puts back the hooks the param groups had before enable()."""
    for m, groups, before in modules:
        for g, (ag, rs) in zip(groups, before):
            g._all_gather_comm = ag
            g._reduce_scatter_comm = rs
        if _installed.get(m) is z:
            del _installed[m]


# FSDP module -> the open Zpp whose hooks it has (a second enable() is refused)
_installed: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()

_log = logging.getLogger("zpp")

# dtypes the hooks take: a gather of one dtype in these (or a group of
# mixed dtypes, which FSDP2 gathers as uint8), a reduce-scatter in these
_FLOATS = (torch.float32, torch.float16, torch.bfloat16)
_FLOAT_NAMES = "torch.float32, torch.float16 or torch.bfloat16"
_COMM_KW = ("topology", "backend", "timeout_s", "memory", "device")


def _emit(level: int, msg: str) -> None:
    """``msg`` through the "zpp" logger when the application configured
    logging (a handler on "zpp" or above it): its levels and handlers
    decide.  Otherwise to stderr, as logging.lastResort would write it but
    at any level, unless the "zpp" logger's own level is set above
    ``level``; no handler is added, so a logging configuration made later
    is not doubled."""
    if _log.hasHandlers():
        _log.log(level, msg)
        return
    if _log.level != logging.NOTSET and level < _log.level:
        return
    h = logging.StreamHandler(sys.stderr)
    h.handle(_log.makeRecord(_log.name, level, __file__, 0, msg, (), None))


def _zpp_debug() -> bool:
    """ZPP_DEBUG asks the C library for INFO or TRACE: the per-communicator
    lines of zpp.fsdp are then written at INFO."""
    L = _lib.get()
    v = L.ffi.new("const char **")
    if L.lib.zpp_settings_get(b"ZPP_DEBUG", v) != 0:
        return False
    return L.string(v[0]).strip().upper() in ("INFO", "TRACE")


def _detail_level() -> Optional[int]:
    """The level of the per-communicator lines, or None when they are off."""
    if _zpp_debug():
        return logging.INFO
    if _log.isEnabledFor(logging.DEBUG):
        return logging.DEBUG
    return None


def _describe(c: Comm) -> str:
    return ("%d ranks on %d nodes (%s), local rank %d of %d, bootstrap %s, backend %s, "
            "memory %s, algorithm %s" % (
                c.size, c.nnodes, "emulated" if c.topology_emulated else "discovered",
                c.local_rank, c.local_size, c.bootstrap, c.backend, c.memory, c.algorithm))


def _name(qual: str) -> str:
    return "'%s'" % qual if qual else "(the root)"


def _error(msg: str, cls=ValueError):
    return cls("zpp.fsdp.enable: " + msg)


def _device_error(msg: str):
    L = _lib.get()
    return _lib.DeviceError(L.lib.ZPP_ERR_INVALID_ARGUMENT, "ZPP_ERR_INVALID_ARGUMENT",
                            "zpp.fsdp.enable: " + msg)


def _options(qwz_bits, qwz_block, qgz_bits, qgz_intra_bits, qgz_block, error_feedback,
             hadamard) -> Options:
    qwz_bits = check_bits("qwz_bits", qwz_bits, (0, 4, 8), "0 (off), 4 or 8")
    qgz_bits = check_bits("qgz_bits", qgz_bits, (0, 4, 8), "0 (off), 4 or 8")
    qgz_intra_bits = check_bits("qgz_intra_bits", qgz_intra_bits, (0, 4, 8, 16),
                                "0 (qgz_bits), 4, 8 or 16 (not quantized inside the node)")
    qwz_block = check_block("qwz_block", qwz_block)
    qgz_block = check_block("qgz_block", qgz_block)
    if not isinstance(error_feedback, bool):
        raise ValueError("error_feedback %r: must be True or False" % (error_feedback,))
    # qwZ's and qgZ's options without qwz_bits / qgz_bits: the exact
    # collective runs and would drop them silently (a run would claim a
    # setting it did not use)
    d = Options()
    if qwz_block != d.qwz_block and not qwz_bits:
        raise ValueError("qwz_block %d needs qwz_bits (4 or 8)" % qwz_block)
    if error_feedback and not qgz_bits:
        raise ValueError("error_feedback needs qgz_bits (4 or 8)")
    if qgz_intra_bits and not qgz_bits:
        raise ValueError("qgz_intra_bits %d needs qgz_bits (4 or 8)" % qgz_intra_bits)
    if qgz_block != d.qgz_block and not qgz_bits:
        raise ValueError("qgz_block %d needs qgz_bits (4 or 8)" % qgz_block)
    if hadamard and not qgz_bits:
        raise ValueError("hadamard %r needs qgz_bits (4 or 8)" % (hadamard,))
    hadamard = check_hadamard("hadamard", hadamard, qgz_block, "qgz_block")
    return Options(qwz_bits, qwz_block, qgz_bits, qgz_intra_bits, qgz_block,
                   error_feedback, hadamard)


def _fsdp_modules(model) -> list:
    """[(qualified name, module, its FSDP param groups)] of every FSDPModule;
    refuses what set_custom_all_gather would refuse half-way through."""
    out = []
    for qual, m in model.named_modules():
        if not isinstance(m, FSDPModule):
            continue
        groups = list(m._get_fsdp_state()._fsdp_param_groups)
        if len(groups) > 1:
            raise _error("FSDP module %s has %d parameter groups (shard_placement_fn with "
                         "per-parameter meshes): FSDP2 takes one custom all-gather and "
                         "reduce-scatter per module only with one group"
                         % (_name(qual), len(groups)))
        out.append((qual, m, groups))
    if not out:
        raise _error("no FSDPModule in the model (call fully_shard first)")
    return out


def _check_model(model, mods) -> torch.device:
    """The policies, dtypes and devices of every parameter the hooks will
    move; returns the device of the collectives (FSDP2's mesh device).
    Parameters are judged in model.named_parameters() order, so the first
    one named is the first bad one of the model."""
    for qual, m, _ in mods:
        pol = m._get_fsdp_state()._mp_policy
        for field in ("param_dtype", "reduce_dtype"):
            v = getattr(pol, field)
            if v is not None and v not in _FLOATS:
                raise _error("FSDP module %s: MixedPrecisionPolicy.%s %s: zpp's %s takes %s "
                             "(or None)" % (_name(qual), field, v,
                                            "all-gather" if field == "param_dtype"
                                            else "reduce-scatter", _FLOAT_NAMES))
    order = {id(p): (i, n) for i, (n, p) in
             enumerate(model.named_parameters(remove_duplicate=False))}
    params = []  # (position, name, FSDPParam, its group)
    for qual, _, groups in mods:
        for g in groups:
            gather = set()
            for fp in g.fsdp_params:
                p = fp.sharded_param
                pos, pn = order.get(id(p), (len(order), "%s.<unnamed>" % qual))
                params.append((pos, pn, fp, g))
                pd = fp.mp_policy.param_dtype
                gather.add(pd if pd is not None and p.dtype.is_floating_point else p.dtype)
            # one dtype: the gather's; several: FSDP2 gathers them as uint8
            g_bad = next(iter(gather)) if len(gather) == 1 else None
            if g_bad in _FLOATS:
                g_bad = None
            for i in range(len(params) - len(g.fsdp_params), len(params)):
                params[i] = params[i] + (g_bad,)
    params.sort(key=lambda t: t[0])
    for _, pn, fp, g, g_bad in params:
        p = fp.sharded_param
        if g_bad is not None:
            raise _error("parameter '%s' has dtype %s: zpp's all-gather takes %s (or a group "
                         "of mixed dtypes, which FSDP2 gathers as torch.uint8): cast the "
                         "model (model.float(), .bfloat16()) or set "
                         "MixedPrecisionPolicy(param_dtype=torch.bfloat16) in fully_shard"
                         % (pn, g_bad, _FLOAT_NAMES))
        if p.requires_grad:
            rd = fp.mp_policy.reduce_dtype
            if rd is None:
                rd = fp.sharded_grad_dtype if fp._has_sharded_grad_dtype_override else p.dtype
            if rd is not None and rd not in _FLOATS:
                raise _error("parameter '%s' has dtype %s: its gradient would be "
                             "reduce-scattered in %s, and zpp's reduce-scatter takes %s: cast "
                             "the model (model.float(), .bfloat16()) or set "
                             "MixedPrecisionPolicy(reduce_dtype=torch.float32) in fully_shard"
                             % (pn, p.dtype, rd, _FLOAT_NAMES))
    device, first = None, None
    for _, pn, _, g, _ in params:
        gd = torch.device(g.device)
        if gd.type not in ("cpu", "cuda"):
            raise _device_error("parameter '%s' is on device %s: zpp's communicators take "
                                "CPU tensors (host memory) or CUDA tensors (device memory)"
                                % (pn, gd))
        if device is None:
            device, first = gd, pn
        elif gd != device:
            raise _device_error("parameter '%s' is on %s but '%s' is on %s: zpp's "
                                "communicators work on one device (fully_shard every "
                                "module on the same device mesh)" % (pn, gd, first, device))
    if device is None:
        raise _error("the FSDP modules hold no parameters: nothing for zpp to move")
    return device


def _hpz_missing(mods) -> Optional[str]:
    """What of FSDP2's internals zpp's hpZ reads is missing in this torch
    (the first one, named), or None."""
    if _TrainingState is None or not hasattr(_TrainingState, "PRE_BACKWARD"):
        return "torch.distributed.fsdp._fully_shard._fsdp_common.TrainingState.PRE_BACKWARD"
    for qual, _, groups in mods:
        for g in groups:
            for a in ("_training_state", "post_forward_mesh_info", "mesh_info", "fsdp_params"):
                if not hasattr(g, a):
                    return "FSDPParamGroup.%s (FSDP module %s)" % (a, _name(qual))
            for fp in g.fsdp_params:
                if not hasattr(getattr(fp, "sharded_param", None), "_local_tensor"):
                    return "FSDPParam.sharded_param._local_tensor (FSDP module %s)" % _name(qual)
    return None


def _memory_of(device: torch.device) -> str:
    return "device" if device.type == "cuda" else "host"


def _raf(g):
    """A param group's reshard_after_forward as FSDP2 keeps it: True (over
    its mesh), False, or the int size of the groups its backward gathers
    over (FSDP2's own hpZ)."""
    pf = g.post_forward_mesh_info
    if pf is None:
        return False
    if pf is g.mesh_info or pf.shard_mesh_size == g.mesh_info.shard_mesh_size:
        return True
    return pf.shard_mesh_size


def _raf_from_first_forward(qual: str, m, g, quals) -> object:
    """_raf(g) as it will be from the first forward on: FSDP2's lazy init
    sets the root's to False (it keeps the root's parameters gathered from
    the forward to the backward) unless the application set it.  The root
    is the outermost FSDP module, until the lazy init says which it is."""
    raf = _raf(g)
    st = m._get_fsdp_state()
    if raf is not True or getattr(st, "_is_root", True) is not None:
        return raf  # decided (or a torch that does not say: as it is now)
    outer = not any(q != qual and (q == "" or qual.startswith(q + ".")) for q in quals)
    return False if outer and getattr(st, "_auto_reshard_after_forward", False) else raf


def _hpz(mods, world: Comm, opts: Options) -> str:
    """What hpZ is for these modules, in words: zpp's (in the hooks), FSDP2's
    reshard_after_forward=<int>, or both."""
    quals = [q for q, _, _ in mods]
    sizes, roots = [], 0
    for qual, m, groups in mods:
        for g in groups:
            raf = _raf_from_first_forward(qual, m, g, quals)
            roots += raf is False and _raf(g) is True
            sizes.append(raf)
    ints = sorted({s for s in sizes if not isinstance(s, bool)})
    n = sum(1 for s in sizes if s is True)
    parts = []
    if opts.hpz and world.nnodes > 1 and n:
        even = world.nnodes * world.local_size == world.size
        parts.append(
            "hpZ: zpp's, on for %d of %d modules (reshard_after_forward=True): the "
            "forward gather keeps this rank's share of the node's copy %s, the backward "
            "gather rebuilds the parameters inside the node%s%s" % (
                n, len(sizes), "in qwZ's encoding" if opts.qwz_bits else "exact",
                "" if even else " (nodes of different sizes here: no copy is kept, the "
                "backward gathers go over the world)",
                "" if not roots else "; the root keeps its parameters gathered from the "
                "forward to the backward (FSDP2's default for it): no copy"))
    if ints:
        k = sum(1 for s in sizes if not isinstance(s, bool))
        where = ", ".join(str(s) for s in ints)
        if (len(ints) == 1 and ints[0] == world.local_size
                and world.nnodes * world.local_size == world.size):
            agree = "zpp's nodes have %d ranks: the backward gathers stay inside the node" % ints[0]
        else:
            agree = ("zpp's nodes have %d ranks: backward gathers over groups of %s may cross "
                     "nodes" % (world.local_size, where))
        parts.append("%s, on for %d of %d modules (reshard_after_forward=%s; %s; exact "
                     "gathers of the parameters in their dtype)"
                     % ("FSDP2's" if parts else "hpZ: FSDP2's", k, len(sizes), where, agree))
    if parts:
        return "; ".join(parts)
    raf = "reshard_after_forward=%s" % "/".join(
        str(v) for v in sorted({s for s in sizes}, reverse=True))
    why = ("one node" if world.nnodes == 1
           else "no module is gathered again in the backward" if opts.hpz
           else "hpz=False" if opts.qwz_bits else "exact gathers: hpz=True asks for it")
    return "hpZ: off (%s; %s)" % (raf, why)


def _summary(comms: Comms, opts: Options, mods, device, made: Optional[dict]) -> str:
    """The INFO line of enable(): what was chosen and why."""
    w = comms.world
    L = _lib.get()

    def setting(name: str) -> str:
        # the value libzpp read from the environment; "" when it is unset
        # there (zpp_settings_get answers the default then)
        if name not in os.environ:
            return ""
        v = L.ffi.new("const char **")
        return L.string(v[0]) if L.lib.zpp_settings_get(name.encode(), v) == 0 else ""

    if made is None:
        boot = "world communicator passed to enable() (%s bootstrap)" % w.bootstrap
    else:
        boot = ("world communicator over torch's store (%s bootstrap)"
                % ("TCP" if w.bootstrap == "tcp" else w.bootstrap))
    # the rule of backend auto (include/zpp/zpp_comm.h, zpp_backend_t)
    env_b = setting("ZPP_BACKEND")
    if env_b and env_b != "auto":
        auto = "ZPP_BACKEND=%s" % env_b
    elif w.memory == "device":
        auto = ("ZPP_BACKEND unset: NCCL loads and every rank has a GPU of its own"
                if w.backend == "nccl" else
                "ZPP_BACKEND unset: NCCL not usable on every rank, device memory staged "
                "through host buffers")
    elif w.backend == "mpi":
        auto = "ZPP_BACKEND unset: MPI under an MPI bootstrap"
    else:
        auto = "ZPP_BACKEND unset: UCX for host memory without an MPI bootstrap"
    if made is None:
        why_b = "as that communicator was made: its backend=, else %s" % auto
    elif made.get("backend"):
        why_b = "backend=%r" % made["backend"]
    else:
        why_b = auto
    if made is None:
        why_m = "the communicator passed; parameters on %s" % device
    elif "memory" in made:
        why_m = "memory=%r; parameters on %s" % (made["memory"], device)
    else:
        why_m = "parameters on %s" % device
    env_a = setting("ZPP_ALGO")
    why_a = "ZPP_ALGO=%s" % env_a if env_a else "ZPP_ALGO unset"
    if w.nnodes > 1:
        algo = "algorithm %s across nodes (%s)" % (w.algorithm, why_a)
    else:
        algo = "algorithm: one node, no inter-node stage"
    if opts.qwz_bits:
        qwz = "qwZ %d bits block %d on inter-node gathers" % (opts.qwz_bits, opts.qwz_block)
        if w.nnodes == 1:
            qwz += " (one node here: every gather exact)"
    else:
        qwz = "qwZ: off (exact gathers)"
    if opts.qgz_bits:
        intra = opts.qgz_intra_bits or opts.qgz_bits
        qgz = "qgZ %d bits across nodes, %s inside, block %d%s%s" % (
            opts.qgz_bits, "unquantized" if intra == 16 else "%d bits" % intra,
            opts.qgz_block, ", error feedback" if opts.error_feedback else "",
            ", Hadamard %d" % opts.hadamard if opts.hadamard else "")
    else:
        qgz = "qgZ: off (exact reduce-scatter, fp32 sums)"
    if not w.topology_emulated:
        nodes = "discovered nodes"
    elif made is not None and made.get("topology"):
        nodes = "emulated nodes (topology=%r)" % made["topology"]
    elif setting("ZPP_TOPO"):
        nodes = "emulated nodes (ZPP_TOPO=%s)" % setting("ZPP_TOPO")
    else:
        nodes = "emulated nodes"
    if w.nnodes == 1:
        nodes = nodes.replace("nodes", "node", 1)
    return ("zpp.fsdp: %d FSDP module%s, %d rank%s on %d %s; %s; backend %s (%s); "
            "memory %s (%s); %s; %s; %s; %s" % (
                len(mods), "s"[:len(mods) != 1], w.size, "s"[:w.size != 1], w.nnodes,
                nodes,
                boot, w.backend, why_b, w.memory, why_m, algo, qwz, qgz, _hpz(mods, w, opts)))


def enable(model: torch.nn.Module, *, comm: Optional[Comm] = None,
           comms: Optional[Comms] = None, qwz_bits: int = 0, qwz_block: int = 256,
           qgz_bits: int = 0, qgz_intra_bits: int = 0, qgz_block: int = 256,
           error_feedback: bool = False, hadamard: int = 0, hpz: Optional[bool] = None,
           **comm_kw) -> Zpp:
    """Installs zpp's all-gather and reduce-scatter on every FSDPModule of
    ``model`` (after ``fully_shard``).  ``comm``: the world communicator
    (default: one made over torch's default group and store, with
    ``comm_kw``: topology, backend, timeout_s, memory, device); the
    defaults of the other arguments are zpp's exact baselines.  When the
    model's parameters are on CUDA and neither ``comm`` nor ``memory=`` is
    given, the communicators work on device memory of the parameters'
    device (``memory="device", device=<index>``): the hooks then run on
    torch's current stream (FSDP2's all-gather and reduce-scatter
    streams) and return once the collective is queued there
    (stream-ordered, as with ProcessGroupNCCL).

    ``hpz``: zpp's hpZ on the gathers of the modules FSDP2 gathers over
    the world in the backward too (``reshard_after_forward=True``, its
    default).  None (the default): on when ``qwz_bits`` is set (ZeRO++:
    qwZ plus hpZ), off for the exact baseline; True or False decide.  It
    acts only where the world spans several nodes: the backward gather,
    a qwZ world gather without it, becomes a gather of the same encoded
    bytes inside the node, so its inter-node bytes go and its intra-node
    bytes stay; the cost is a secondary shard per module of (nodes x the
    encoded shard) bytes (at 8 bits about nodes / 4 times the fp32 primary
    shard) and a copy of it per forward gather.  So it pays where the
    inter-node link is slower than the node's own path, as on a real
    network; where the node's ranks share too few cores (8 ranks on 2
    cores) its node-local gathers can take longer than the link time it
    saves: measure (perf/fsdp2_hpz_profile.py, perf/fsdp2_hpz_study.sh)
    and pass hpz=False there if so.  The secondary shard is allocated by
    zpp (host memory, or device memory outside torch's caching
    allocator: torch.cuda.memory_* does not count it) at the module's
    first forward gather and held until close(), through the optimizer
    step and eval.  Each gather decides anew: a module FSDP2 keeps
    gathered from the forward to the backward (the root when
    ``fully_shard(model)`` left reshard_after_forward unset: FSDP2 sets
    it False at the first forward; set_reshard_after_forward(False)) has
    no backward gather, keeps no secondary shard (one it kept is freed)
    and is gathered with qwZ alone.  On nodes of different sizes zpp
    keeps no secondary shard and the backward gathers cross nodes as
    without hpZ (counted as "qwz").  A backward gather whose
    parameters changed since the forward gathers over the world: a
    torch.optim step (any optimizer of the process: a global step hook,
    removed by ``close()``) or an in-place op that moves the parameters'
    version counters is seen; a write outside torch.optim (through
    ``.data``, to a parameter's local shard, a checkpoint load) must be
    followed by :meth:`Zpp.invalidate` on every rank, since the ranks must
    agree on which gathers run.  hpz=True is refused for a module with
    ``reshard_after_forward=<int>`` (FSDP2's own hpZ, which zpp serves with
    exact gathers on the node's communicator; hpz unset leaves those
    modules to it).

    Before it opens a communicator or sets a hook it checks, and raises
    ValueError (TypeError for an unknown keyword) naming the argument,
    module or parameter: every option; the communicator's keywords
    (topology a string, backend auto/mpi/nccl/ucx, timeout_s > 0, and the
    rest of zpp_comm_config_check); each FSDP module's
    MixedPrecisionPolicy (param_dtype, reduce_dtype: float32, float16,
    bfloat16 or None); every parameter's gather and gradient dtype (by its
    qualified name); that all parameters are on one device, CPU or CUDA,
    the one of the communicators' memory; hpz (None, True or False, and
    True only with reshard_after_forward True or False on every module;
    with hpZ on, that this torch's FSDP2 has the internals it reads: the
    param groups' training state and reshard state, the sharded
    parameters' local tensors); that the model has an FSDPModule, and
    none of them has the hooks of a :class:`Zpp` that is still open
    (close it first).  A failure while the hooks are set puts
    back every hook it set, closes the communicators it made and raises.

    Logging: one INFO line on rank 0 of the ``"zpp"`` logger says which
    bootstrap, backend, memory space, algorithm, qwZ, qgZ and hpZ setting
    it chose and why (best-effort: a failure to make or write it does
    not fail enable()).  When the application configured logging (a handler
    on ``"zpp"`` or the root logger), that configuration decides whether
    it shows (``logging.getLogger("zpp").setLevel(logging.INFO)``);
    otherwise it is written to stderr, without any handler being added,
    unless the ``"zpp"`` logger's level is set above INFO.  With
    ``ZPP_DEBUG=INFO`` (or TRACE), or the ``"zpp"`` logger at DEBUG, every
    rank adds a line per communicator (world, and each node communicator
    of hpZ when it is made)."""
    try:
        opts = _options(qwz_bits, qwz_block, qgz_bits, qgz_intra_bits, qgz_block,
                        error_feedback, hadamard)
        if hpz is not None and not isinstance(hpz, bool):
            raise ValueError("hpz %r: must be None (on with qwz_bits), True or False" % (hpz,))
        opts.hpz = bool(opts.qwz_bits) if hpz is None else hpz
    except ValueError as e:
        raise _error(str(e)) from None
    unknown = sorted(set(comm_kw) - set(_COMM_KW))
    if unknown:
        raise TypeError("zpp.fsdp.enable: unknown keyword %s (the communicator's are %s)"
                        % (", ".join(unknown), ", ".join(_COMM_KW)))
    if comm_kw and (comm is not None or comms is not None):
        raise _error("%s: only for the communicator enable() makes, not with %s= (make it "
                     "with them)" % (", ".join("%s=" % k for k in sorted(comm_kw)),
                                     "comm" if comm is not None else "comms"))
    if comm is not None and comms is not None:
        raise _error("comm= and comms=: pass one")
    mem = comm_kw.get("memory")
    if mem not in (None, "host", "device"):
        raise _error("memory %r: must be 'host' (CPU tensors) or 'device' (CUDA tensors)"
                     % (mem,))
    if not isinstance(model, torch.nn.Module):
        raise TypeError("zpp.fsdp.enable: model is a %s, not a torch.nn.Module"
                        % type(model).__name__)
    mods = _fsdp_modules(model)
    for qual, m, _ in mods:
        z = _installed.get(m)
        if z is not None and not z.closed:
            raise _error("FSDP module %s already has zpp's hooks from %r: call its close() "
                         "first (or keep using it)" % (_name(qual), z))
    device = _check_model(model, mods)
    if hpz:
        for qual, _, groups in mods:
            raf = _raf(groups[0])
            if not isinstance(raf, bool):
                raise _error("hpz=True but FSDP module %s has reshard_after_forward=%d "
                             "(FSDP2's own hpZ, whose backward gathers run inside groups of "
                             "%d ranks): zpp's hpZ takes reshard_after_forward=True; or leave "
                             "hpz unset" % (_name(qual), raf, raf))
    if opts.hpz:
        missing = _hpz_missing(mods)
        if missing is not None:
            raise _error("zpp's hpZ (hpz=%s) reads FSDP2's %s, which this torch %s lacks: "
                         "pass hpz=False" % ("True" if hpz else "None: on with qwz_bits",
                                             missing, torch.__version__))
    want = _memory_of(device)
    if comms is not None and isinstance(comms, Comms):
        comm = comms.world
    if comm is not None and comm.memory != want:
        raise _device_error("the communicator works on %s memory but the parameters are on "
                            "%s (%s memory)" % (comm.memory, device, want))
    if mem is not None and mem != want:
        raise _device_error("memory=%r but the parameters are on %s (%s memory)"
                            % (mem, device, want))
    dev = comm_kw.get("device")
    if dev is not None and (device.type != "cuda" or dev != device.index):
        raise _device_error("device=%r but the parameters are on %s" % (dev, device))
    if not dist.is_initialized():
        raise _error("torch.distributed is not initialised (init_process_group first)",
                     RuntimeError)

    # the communicator enable() makes: its keywords checked as zpp_comm_create
    # checks its config, before anything listens
    made = None
    if comms is None and comm is None:
        made = dict(comm_kw)
        if want == "device":
            comm_kw["memory"] = "device"
            comm_kw.setdefault("device", device.index if device.index is not None
                               else torch.cuda.current_device())
        try:
            check_config(**comm_kw)
        except ValueError as e:
            raise _error(str(e)) from None

    # checked: from here on communicators are opened and hooks set
    owns = "none" if comms is not None else "all" if comm is None else "splits"
    if comms is None:
        comms = Comms(comm, **comm_kw)
    gathers, scatters, installed = [], [], []
    z = Zpp(comms, opts, gathers, scatters, installed, owns)
    gen = z.generation
    line = detail = None
    try:
        if isinstance(comms, Comms):
            detail = _detail_level()
            if dist.get_rank() == 0:
                # the line is best-effort: a failure here is rank 0's alone,
                # and must not leave it out of what the other ranks do
                try:
                    line = _summary(comms, opts, mods, device, made)
                except Exception as e:  # noqa: BLE001
                    line = ("zpp.fsdp: %d FSDP modules; the summary of the choices failed: "
                            "%s: %s" % (len(mods), type(e).__name__, e))
        for _, m, groups in mods:
            g, s = AllGather(comms, opts, groups[0], gen), ReduceScatter(comms, opts)
            before = [(pg._all_gather_comm, pg._reduce_scatter_comm) for pg in groups]
            installed.append((m, groups, before))
            m.set_custom_all_gather(g)
            m.set_custom_reduce_scatter(s)
            gathers.append(g)
            scatters.append(s)
        for _, m, _ in mods:
            _installed[m] = z
    except BaseException:
        # nothing of this call stays: the hooks from before, no handle, and
        # the communicators it made closed
        z.closed = True
        z._step_hook.remove()
        _restore(installed, z)
        if owns != "none":
            try:
                comms.close(world=owns == "all")
            except Exception:  # noqa: BLE001 (the first error is the one to see)
                pass
        raise
    if isinstance(comms, Comms):
        comms.detail = detail
        # the lines are best-effort: a failing handler must not undo enable()
        try:
            if line is not None:
                _emit(logging.INFO, line)
            if detail is not None:
                _emit(detail, "zpp.fsdp: rank %d: world communicator: %s"
                      % (dist.get_rank(), _describe(comms.world)))
        except Exception as e:  # noqa: BLE001
            try:
                sys.stderr.write("zpp.fsdp.enable: the log line failed: %s: %s\n"
                                 % (type(e).__name__, e))
            except Exception:  # noqa: BLE001
                pass
    return z
