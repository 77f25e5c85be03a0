"""zpp.Comm: a communicator and its collectives on numpy arrays and CPU
torch tensors, or with ``memory="device"`` on CUDA torch tensors and
``__cuda_array_interface__`` arrays (include/zpp/zpp_comm.h,
include/zpp/zpp_coll.h)."""

from __future__ import annotations

import atexit
import ctypes
import ctypes.util
import numbers
import os
import threading
import time
from typing import Any, Optional, Sequence

from . import _lib
from ._lib import Buf, DeviceError, DtypeError, Error, empty_like

# Communicators still open, closed at exit in reverse creation order (every
# rank creates them in the same order, and destroy is collective).
_live: list["Comm"] = []


def _close_all() -> None:
    while _live:
        _live[-1].close()


atexit.register(_close_all)

_SIZE_MAX = (1 << 64) - 1


def _integer(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def check_bits(name: str, v, allowed: Sequence[int], meaning: str) -> int:
    """``v`` as an int when it is one of ``allowed``; else ValueError naming
    ``name`` and ``meaning`` (the accepted values in words)."""
    if _integer(v) and int(v) in allowed:
        return int(v)
    raise ValueError("%s %r: must be %s" % (name, v, meaning))


def check_block(name: str, v) -> int:
    """A block size (elements per scale): an integer from 1 to 2**64 - 1 (the
    C library's size_t, zpp_quant_config_t.block_size >= 1)."""
    if _integer(v) and 1 <= int(v) <= _SIZE_MAX:
        return int(v)
    raise ValueError("%s %r: must be an integer from 1 to 2**64 - 1 (elements per scale)"
                     % (name, v))


def check_hadamard(name: str, v, block: int, block_name: str) -> int:
    """A Hadamard group (zpp_qgz_config_t.hadamard): 0 (off) or a power of
    two >= 2 that divides the block."""
    if _integer(v):
        h = int(v)
        if h == 0 or (h >= 2 and not h & (h - 1) and block % h == 0):
            return h
    raise ValueError("%s %r: must be 0 (off) or a power of two >= 2 that divides %s %d"
                     % (name, v, block_name, block))


def _positive_bits(name: str, v, meaning: str) -> int:
    """Bits of a collective: an integer >= 1 that fits a C int, else
    ValueError naming ``name``; which ones are valid the C library's check
    says, naming the config field."""
    if _integer(v) and 1 <= int(v) < 1 << 31:
        return int(v)
    raise ValueError("%s %r: must be %s" % (name, v, meaning))


def _c_value(name: str, v, lo: int, hi: int, meaning: str) -> None:
    # a value the C field cannot hold (cffi would raise OverflowError or
    # TypeError without the argument's name); the C check judges the rest
    if not (_integer(v) and lo <= int(v) <= hi):
        raise ValueError("%s %r: must be %s" % (name, v, meaning))


def _config(topology: Optional[str], backend: Optional[str], timeout_s: Optional[float],
            memory: Optional[str] = None, device: Optional[int] = None):
    L = _lib.get()
    cfg = L.new("zpp_comm_config_t")
    if memory not in (None, "host", "device"):
        raise ValueError("memory %r: must be 'host' (numpy, CPU tensors) or 'device' "
                         "(CUDA tensors, __cuda_array_interface__)" % (memory,))
    if memory == "device":
        cfg.memory = L.lib.ZPP_MEMORY_DEVICE
    if device is not None:
        if memory != "device":
            raise ValueError("device %r: only with memory='device'" % (device,))
        if isinstance(device, bool) or not isinstance(device, int) or device < 0:
            raise ValueError("device %r: a CUDA device index >= 0" % (device,))
        cfg.cuda_device = device
    keep = None
    if topology is not None:
        if not isinstance(topology, str):
            raise ValueError("topology %r: must be a string such as '2x4' (2 nodes of 4 ranks) "
                             "or '0,0,1,1' (the node of each rank)" % (topology,))
        if topology:
            keep = L.ffi.new("char[]", topology.encode())
            cfg.topology = keep
    if backend is not None:
        name = "ZPP_BACKEND_" + backend.upper() if isinstance(backend, str) else ""
        if not backend or not hasattr(L.lib, name):
            raise ValueError("backend %r: must be 'auto', 'mpi', 'nccl' or 'ucx'" % (backend,))
        cfg.backend = getattr(L.lib, name)
    if timeout_s is not None:
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, numbers.Real) or \
                not timeout_s > 0:
            raise ValueError("timeout_s %r: must be a number of seconds > 0 (None: "
                             "ZPP_TIMEOUT_S)" % (timeout_s,))
        cfg.timeout_s = float(timeout_s)
    return cfg, keep


def check_config(topology: Optional[str] = None, backend: Optional[str] = None,
                 timeout_s: Optional[float] = None, memory: Optional[str] = None,
                 device: Optional[int] = None) -> None:
    """Raises ValueError naming the argument when a communicator could not
    be made with these keywords (the checks of :func:`_config` and of
    zpp_comm_config_check); opens nothing."""
    L = _lib.get()
    cfg, keep = _config(topology, backend, timeout_s, memory, device)
    if L.lib.zpp_comm_config_check(cfg) != 0:
        raise ValueError(L.string(L.lib.zpp_get_last_error()))
    del keep


class Work:
    """A started collective (``async_op=True``).

    Host memory: ``wait()`` waits on the host until it finished, raises
    zpp's error if it failed, and returns True; the arrays it uses must not
    be touched before.

    Device memory: ``wait()`` is stream-ordered, as ProcessGroupNCCL's: it
    makes a stream wait for the collective (zpp_request_order_stream) and
    returns without the host waiting.  The stream is ``stream=`` (an int
    handle, a torch.cuda.Stream, anything with ``cuda_stream`` or ``ptr``),
    else torch's current stream of the tensors' device when the arrays
    include CUDA tensors, else the stream the call used (handle 2, the
    per-thread default stream, is then the waiting thread's).  Work queued
    on that stream afterwards sees the results.  Every such wait orders
    the stream it names, also after a first one (as c10d's Work: FSDP2's
    ``wait()``, ``synchronize()`` and ``block_current_stream()`` each
    order torch's current stream then); once the device ran the
    collective there is nothing left to order.  It raises the errors
    known at that moment only (a bad stream, a communicator broken
    earlier); later ones break the communicator and its next call raises
    them.  ``wait(host=True)``, or a ``timeout`` (seconds or a timedelta,
    as c10d's ``wait(timeout)``), waits on the host instead until the
    device ran it (zpp_request_wait; with ``timeout``, zpp.Error
    ZPP_ERR_TIMEOUT past it, and the Work can be waited for again).

    ``is_completed()`` polls on the host (zpp_request_test; device memory:
    whether the device ran it), before and after a stream-ordered wait;
    after a host wait it is True.

    Lifetimes: the communicator holds every started Work until it is
    waited for, so its arrays stay alive even when the caller drops the
    Work; ``Comm.close()`` waits on the host for the ones left.  On device
    memory the device may use the arrays after a stream-ordered ``wait()``
    returns: CUDA torch tensors are marked used by the stream(s) that run
    or wait for the collective (``Tensor.record_stream``, as
    ProcessGroupNCCL does), so torch's allocator reuses their memory only
    after those streams passed it; the communicator keeps the other arrays
    (``__cuda_array_interface__``) alive until the device ran the
    collective: each call, wait and ``is_completed()`` of the communicator
    frees the requests the device ran (zpp_request_test) and lets their
    arrays go.

    Threads may wait for one Work together, and ``Comm.close()`` may run
    while one waits: the request is freed once."""

    def __init__(self, comm: "Comm", req, keep: tuple, result: Any, stream=None):
        self._comm = comm
        self._lock = threading.Lock()  # guards _req, _keep, _error, _ordered
        self._req = req  # zpp_request_t * while the request lives, then None
        self._keep = keep  # the arrays stay alive until the request is freed
        self._error: Optional[Error] = None  # of a wait done by Comm.close
        self._stream = stream  # _Stream of the call; None on host memory
        # ordered onto a stream: nobody needs to wait for it on the host,
        # so the communicator frees it once the device ran it (Comm._reap)
        self._ordered = False
        self._freed = threading.Event()  # set once the request was freed
        self.result = result
        comm._add(self)

    def is_completed(self) -> bool:
        self._comm._reap()
        with self._lock:
            if self._req is None:
                return self._freed.is_set()
            return self._test()

    def _test(self) -> bool:
        """zpp_request_test of the live request; under self._lock."""
        L = _lib.get()
        done = L.ffi.new("int *")
        L.check(L.lib.zpp_request_test(self._req[0], done), self._comm._c)
        return bool(done[0])

    def wait(self, timeout=None, *, stream=None, host: bool = False) -> bool:
        limit = _seconds(timeout)
        if self._stream is None or host or limit:
            if stream is not None:
                raise ValueError("stream: only for a stream-ordered wait (device memory, "
                                 "without host=True or timeout)")
            self._wait_host(limit)
        else:
            self._wait_stream(stream)
        self._comm._reap()
        with self._lock:
            e, self._error = self._error, None
        if e is not None:
            raise e
        return True

    def _wait_host(self, limit: float) -> None:
        L = _lib.get()
        deadline = time.monotonic() + limit
        if limit:
            pause = 1e-6
            while True:
                with self._lock:  # another thread may free it meanwhile
                    if self._req is None or self._test():
                        break
                if time.monotonic() >= deadline:
                    self._timeout(limit)
                self._freed.wait(pause)
                pause = min(pause * 2, 1e-3)
        with self._lock:
            req, self._req = self._req, None
        if req is None:
            # another thread freed it or is freeing it (a host wait, the
            # communicator once the device ran it, close()): its wait is
            # bounded by the communicator's timeout
            if not self._freed.wait(max(deadline - time.monotonic(), 0) if limit else None):
                self._timeout(limit)
            return
        self._comm._drop(self)
        self._finish(L.lib.zpp_request_wait(req[0]))

    @staticmethod
    def _timeout(limit: float) -> None:
        L = _lib.get()
        raise Error(L.lib.ZPP_ERR_TIMEOUT, "ZPP_ERR_TIMEOUT",
                    "Work.wait: not completed within timeout %.3g s (the "
                    "collective goes on: wait for it again)" % limit)

    def _wait_stream(self, stream) -> None:
        L = _lib.get()
        target = self._comm._wait_target(self._stream, stream)  # a valid handle
        with self._lock:
            if self._req is not None:
                st = L.lib.zpp_request_order_stream(self._req[0],
                                                    L.ffi.cast("zpp_stream_t", target.handle))
                L.check(st, self._comm._c)  # not ordered: the request stays
                self._ordered = True
                self._keep = self._comm._hold(self._keep, target)
                return
        # freed: the device ran it (nothing to order), or a host wait of
        # another thread is freeing it
        self._freed.wait()

    def _free_if_done(self) -> None:
        """Frees the request once the device ran it (Comm._reap)."""
        L = _lib.get()
        with self._lock:
            if self._req is None or not self._test():
                return
            req, self._req = self._req, None
        self._comm._drop(self)
        self._finish(L.lib.zpp_request_wait(req[0]))

    def _finish(self, st: int) -> None:
        """After the request was freed: where the arrays go, and the error."""
        L = _lib.get()
        with self._lock:
            keep, self._keep = self._keep, ()
            if st != 0:
                # a failed wait may leave work running on the device or the
                # engine (a plan stops at its next step): its arrays outlive it
                _abandoned.append(keep)
                try:
                    L.check(st, self._comm._c)
                except Error as e:
                    self._error = e
        self._freed.set()


def _seconds(timeout) -> float:
    """A wait's ``timeout``: None, seconds, or a datetime.timedelta (c10d's
    timedelta(0) default means none); 0 when none."""
    if timeout is None:
        return 0.0
    if hasattr(timeout, "total_seconds"):
        timeout = timeout.total_seconds()
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0:
        raise ValueError("timeout %r: seconds >= 0 or a datetime.timedelta" % (timeout,))
    return float(timeout)


class _Stream:
    """A stream of a device collective: the cudaStream_t handle zpp gets
    (0 for the legacy default stream) and, when the arrays include CUDA
    torch tensors, the torch stream for ``record_stream`` (None for the
    per-thread default stream, which torch has no object for)."""

    __slots__ = ("handle", "torch", "device")

    def __init__(self, handle: int, torch_stream=None, device=None):
        self.handle = handle
        self.torch = torch_stream
        self.device = device  # torch.device of the CUDA tensors, or None


# Arrays of requests whose wait failed (see Work._finish), and of calls
# that failed after they may have queued work (Comm._run): never freed.
_abandoned: list = []

# Statuses a collective returns before it queued anything (argument
# checks, include/zpp/zpp_coll.h: "a call on a capturing stream returns
# ZPP_ERR_UNSUPPORTED before anything is queued", a communicator broken
# earlier); after the others its arrays may still be in use.
_NOTHING_QUEUED = ("ZPP_ERR_INVALID_ARGUMENT", "ZPP_ERR_NULL_POINTER", "ZPP_ERR_BUFFER_TOO_SMALL",
                   "ZPP_ERR_OVERFLOW", "ZPP_ERR_UNSUPPORTED", "ZPP_ERR_MISMATCH")


def _is_cuda_tensor(a) -> bool:
    return _lib.is_torch(a) and a.device.type == "cuda"


def _stream_arg(stream, device) -> _Stream:
    """A ``stream=`` argument as a _Stream; ``device``: the CUDA tensors'
    torch.device (their torch stream is then needed), or None."""
    obj = stream
    for attr in ("cuda_stream", "ptr"):
        if not isinstance(stream, int) and hasattr(stream, attr):
            stream = getattr(stream, attr)
    if isinstance(stream, bool) or not isinstance(stream, int) or not 0 <= stream < 1 << 64:
        raise TypeError("stream %r: a cudaStream_t as an int (0 to 2**64 - 1), a "
                        "torch.cuda.Stream, or an object with .cuda_stream or .ptr" % (obj,))
    ts = None
    if device is not None:
        import torch

        if isinstance(obj, torch.cuda.Stream):
            ts = obj
        elif stream in (0, 1):  # torch's default stream is the legacy one
            ts = torch.cuda.default_stream(device)
        elif stream != 2:  # (the per-thread default stream has no torch object)
            ts = torch.cuda.ExternalStream(stream, device=device)
    return _Stream(stream, ts, device)


class Comm:
    """A zpp communicator.  Make one with :meth:`from_mpi` (an mpirun world),
    :meth:`from_env` (torchrun's variables), :meth:`from_unique_id`,
    :meth:`from_process_group` (a torch ProcessGroup: the unique id goes
    through the group's store) or :meth:`from_ranks` / :meth:`split` (a
    subset of this one).  ``close()`` is collective; open communicators are
    closed at exit.

    On device memory (``memory="device"``) the collectives are
    stream-ordered and return without waiting for the device or for
    peers.  A call's stream is ``stream=``, else torch's current stream of
    CUDA tensors, else the stream the arrays' ``__cuda_array_interface__``
    names, else the legacy default stream; the collective comes after the
    work queued there before the call.  The blocking form makes that
    stream wait for the collective: work queued there afterwards sees the
    results.  With ``async_op`` only :meth:`Work.wait` orders a stream
    after it: on NCCL the call's stream runs the collective, but on MPI
    or UCX staging the engine's own stream does and the call's stream
    does not wait for it.  See :class:`Work` for waiting and for how long
    the arrays are kept alive."""

    def __init__(self, handle, keep: Any = None):
        self._c = handle
        self._keep = keep
        # id -> Work whose request lives: started and not waited for on
        # the host; those ordered onto a stream are freed once done (_reap)
        self._pending: dict = {}
        self._lock = threading.Lock()  # guards _pending
        self._memory: Optional[str] = None  # fixed at creation; read once
        _live.append(self)

    # ---- creation ---------------------------------------------------------

    @classmethod
    def _make(cls, fn, *args, keep=None) -> "Comm":
        L = _lib.get()
        out = L.ffi.new("zpp_comm_t *")
        L.check(fn(*args, out))
        return cls(out[0], keep)

    @staticmethod
    def unique_id() -> bytes:
        """A new id of zpp's TCP bootstrap; this process listens, so it must
        be one of the ranks of :meth:`from_unique_id`."""
        L = _lib.get()
        uid = L.ffi.new("zpp_unique_id_t *")
        L.check(L.lib.zpp_get_unique_id(uid))
        return bytes(L.ffi.buffer(uid))

    @classmethod
    def from_unique_id(cls, uid: bytes, nranks: int, rank: int, *, topology: str = None,
                       backend: str = None, timeout_s: float = None, memory: str = None,
                       device: int = None) -> "Comm":
        L = _lib.get()
        if len(uid) != L.lib.ZPP_UNIQUE_ID_BYTES:
            raise ValueError("uid: %d bytes, must be %d" % (len(uid), L.lib.ZPP_UNIQUE_ID_BYTES))
        cid = L.ffi.new("zpp_unique_id_t *")
        L.ffi.memmove(cid, uid, len(uid))
        cfg, keep = _config(topology, backend, timeout_s, memory, device)
        return cls._make(L.lib.zpp_comm_create_from_id, cid, nranks, rank, cfg, keep=keep)

    @classmethod
    def from_env(cls, *, topology: str = None, backend: str = None,
                 timeout_s: float = None, memory: str = None, device: int = None) -> "Comm":
        """From torchrun's RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (rank 0
        listens on MASTER_PORT + 1, or ZPP_BOOTSTRAP_PORT); no MPI."""
        L = _lib.get()
        cfg, keep = _config(topology, backend, timeout_s, memory, device)
        return cls._make(L.lib.zpp_comm_create_from_env, cfg, keep=keep)

    @classmethod
    def from_mpi(cls, *, topology: str = None, backend: str = None,
                 timeout_s: float = None, memory: str = None, device: int = None) -> "Comm":
        """The world of an mpirun job, over MPI (MPI_COMM_WORLD).  MPI is
        initialised here (MPI_THREAD_MULTIPLE) when nobody did, and finalised
        at exit after the communicators are closed."""
        L = _lib.get()
        if not hasattr(L.lib, "zpp_comm_create_mpi"):
            raise Error(L.lib.ZPP_ERR_UNSUPPORTED, "ZPP_ERR_UNSUPPORTED",
                        "%s has no zpp_comm_create_mpi (built without MPI, or zpp_mpi.h "
                        "missing from %s): use Comm.from_env or from_process_group"
                        % (L.path, L.include_dir))
        mpi = _mpi()
        world = ctypes.addressof(ctypes.c_char.in_dll(mpi, "ompi_mpi_comm_world"))
        cfg, keep = _config(topology, backend, timeout_s, memory, device)
        return cls._make(L.lib.zpp_comm_create_mpi, L.ffi.cast("MPI_Comm", world), cfg, keep=keep)

    @classmethod
    def world(cls, **kw) -> "Comm":
        """torchrun's environment when set, else the mpirun world."""
        if all(v in os.environ for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")):
            return cls.from_env(**kw)
        if "OMPI_COMM_WORLD_SIZE" in os.environ:
            return cls.from_mpi(**kw)
        raise RuntimeError("zpp.Comm.world: neither torchrun's RANK/WORLD_SIZE/MASTER_ADDR/"
                           "MASTER_PORT nor an Open MPI mpirun world is in the environment")

    @classmethod
    def from_process_group(cls, group=None, *, topology: str = None, backend: str = None,
                           timeout_s: float = None, memory: str = None, device: int = None) -> "Comm":
        """A communicator of the ranks of a torch ProcessGroup (default: the
        world), in the group's rank order.  The group's first rank makes a
        unique id (zpp's TCP bootstrap: ZPP_BOOTSTRAP_ADDR, else MASTER_ADDR,
        else 127.0.0.1) and the others read it from the default store."""
        import torch.distributed as dist

        L = _lib.get()
        # the keywords are checked before the first rank listens
        check_config(topology, backend, timeout_s, memory, device)
        group = group or dist.group.WORLD
        rank, size = dist.get_rank(group), dist.get_world_size(group)
        ranks = dist.get_process_group_ranks(group)
        store = dist.distributed_c10d._get_default_store()
        n = _pg_counter.get(tuple(ranks), 0)
        _pg_counter[tuple(ranks)] = n + 1
        key = "zpp/uid/%s/%d" % ("-".join(map(str, ranks)), n)
        if rank == 0:
            uid = cls.unique_id()
            try:
                store.set(key, uid)
            except BaseException:
                # nobody will join: stop listening
                cid = L.ffi.new("zpp_unique_id_t *")
                L.ffi.memmove(cid, uid, len(uid))
                L.lib.zpp_release_unique_id(cid)
                raise
        else:
            uid = bytes(store.get(key))
        return cls.from_unique_id(uid, size, rank, topology=topology, backend=backend,
                                  timeout_s=timeout_s, memory=memory, device=device)

    def from_ranks(self, ranks: Sequence[int]) -> Optional["Comm"]:
        """Collective over this communicator, the same list on every rank:
        rank i of the result is ranks[i]; None on the ranks not listed."""
        L = _lib.get()
        arr = L.ffi.new("int[]", list(ranks))
        out = L.ffi.new("zpp_comm_t *")
        L.check(L.lib.zpp_comm_create_from_ranks(self._c, len(ranks), arr, out), self._c)
        return Comm(out[0]) if out[0] != L.ffi.NULL else None

    def split(self, color: int, key: int = 0) -> Optional["Comm"]:
        """Collective over this communicator: ranks of one ``color`` (>= 0)
        form a communicator ordered by (key, rank); color -1 gives None."""
        L = _lib.get()
        out = L.ffi.new("zpp_comm_t *")
        L.check(L.lib.zpp_comm_split(self._c, color, key, out), self._c)
        return Comm(out[0]) if out[0] != L.ffi.NULL else None

    def shrink(self, *, timeout_s: float = None, join_s: float = None) -> "Comm":
        """After a rank died (or at any time): called by every survivor, it
        aborts this communicator and returns one of exactly the ranks that
        are alive and took part, renumbered in the order of their ranks
        here (zpp_comm_shrink).  ``old_ranks`` of the result lists, for
        each new rank, its rank in this communicator.  ``timeout_s`` bounds
        the call (default: 3 times the communicator's timeout), ``join_s``
        is how long the coordinator waits for live ranks that have not
        joined (default: half of the bound).  Raises :class:`Error` with
        ZPP_ERR_EXCLUDED when this rank came too late, ZPP_ERR_PEER_FAILED
        when another rank died during the shrink.  Close this communicator
        afterwards; it is unusable."""
        L = _lib.get()
        cfg = L.new("zpp_shrink_config_t")
        if timeout_s is not None:
            cfg.timeout_s = float(timeout_s)
        if join_s is not None:
            cfg.join_s = float(join_s)
        n = self.size
        new_rank_of = L.ffi.new("int[]", n)
        out = L.ffi.new("zpp_comm_t *")
        L.check(L.lib.zpp_comm_shrink(self._c, cfg, new_rank_of, out), self._c)
        c = Comm(out[0])
        c.old_ranks = [r for r in range(n) if new_rank_of[r] >= 0]
        return c

    def close(self) -> None:
        """Collective: waits on the host for the started collectives not
        waited for, frees the communicator (which waits for the device to
        finish its collectives) and lets go of the device arrays it held."""
        if self._c is None:
            return
        L = _lib.get()
        # zpp_comm_destroy drops the requests not waited for (their handles
        # are freed, a running plan stops at its next step): wait for them
        # on the host first; an error is kept for the Work's own wait()
        with self._lock:
            pending = list(self._pending.values())
        for w in pending:
            try:
                w.wait(host=True)
            except Error as e:
                with w._lock:
                    w._error = e
        c, self._c = self._c, None
        if self in _live:
            _live.remove(self)
        L.check(L.lib.zpp_comm_destroy(c))

    def _add(self, w: Work) -> None:
        with self._lock:
            self._pending[id(w)] = w

    def _drop(self, w: Work) -> None:
        with self._lock:
            self._pending.pop(id(w), None)

    def _reap(self) -> None:
        """Frees the requests ordered onto a stream (blocking calls and
        stream-ordered waits on device memory) that the device ran, and
        lets their arrays go: the communicator holds only what is in
        flight."""
        if self._c is None:
            return
        with self._lock:
            ordered = [w for w in self._pending.values() if w._ordered]
        for w in ordered:
            w._free_if_done()

    def __enter__(self) -> "Comm":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- queries ------------------------------------------------------------

    def _int(self, fn, *args) -> int:
        L = _lib.get()
        v = L.ffi.new("int *")
        L.check(fn(self._c, *args, v), self._c)
        return v[0]

    @property
    def rank(self) -> int:
        return self._int(_lib.get().lib.zpp_comm_rank)

    @property
    def size(self) -> int:
        return self._int(_lib.get().lib.zpp_comm_size)

    @property
    def nnodes(self) -> int:
        return self._int(_lib.get().lib.zpp_comm_nnodes)

    @property
    def local_rank(self) -> int:
        return self._int(_lib.get().lib.zpp_comm_local_rank)

    @property
    def local_size(self) -> int:
        return self._int(_lib.get().lib.zpp_comm_local_size)

    def node_of(self, rank: int) -> int:
        return self._int(_lib.get().lib.zpp_comm_node_of, rank)

    @property
    def backend(self) -> str:
        L = _lib.get()
        b = L.ffi.new("zpp_backend_t *")
        L.check(L.lib.zpp_comm_backend(self._c, b), self._c)
        return L.string(L.lib.zpp_backend_name(b[0]))

    @property
    def algorithm(self) -> str:
        """"auto", "hier" or "flat": how all-gathers and reduce-scatters over
        several nodes move their bytes (zpp_comm_algorithm; ZPP_ALGO); under
        "auto" each call chooses (choose_algorithm)."""
        L = _lib.get()
        a = L.ffi.new("zpp_algorithm_t *")
        L.check(L.lib.zpp_comm_algorithm(self._c, a), self._c)
        return {L.lib.ZPP_ALGORITHM_FLAT: "flat", L.lib.ZPP_ALGORITHM_HIER: "hier"}.get(a[0], "auto")

    def choose_algorithm(self, coll: str, count: int, dtype: str = "float32") -> tuple:
        """(family, chunks) that a world "allgather", "reduce_scatter" or
        "allreduce" of `count` elements of `dtype` runs: ("hier", chunks)
        or ("flat", 0), the same on every rank
        (zpp_comm_choose_algorithm)."""
        L = _lib.get()
        colls = {"allgather": L.lib.ZPP_ALGO_COLL_ALLGATHER,
                 "reduce_scatter": L.lib.ZPP_ALGO_COLL_REDUCE_SCATTER,
                 "allreduce": L.lib.ZPP_ALGO_COLL_ALLREDUCE}
        if coll not in colls:
            raise ValueError("coll %r: must be allgather, reduce_scatter or allreduce" % (coll,))
        dt = L.ffi.new("zpp_dtype_t *")
        L.check(L.lib.zpp_dtype_parse(dtype.encode(), dt), self._c)
        a = L.ffi.new("zpp_algorithm_t *")
        c = L.ffi.new("int *")
        L.check(L.lib.zpp_comm_choose_algorithm(self._c, colls[coll], count, dt[0], a, c), self._c)
        return ("hier" if a[0] == L.lib.ZPP_ALGORITHM_HIER else "flat", c[0])

    @property
    def topology_emulated(self) -> bool:
        """True when the node map comes from ZPP_TOPO or ``topology=``."""
        return bool(self._int(_lib.get().lib.zpp_comm_topo_emulated))

    @property
    def bootstrap(self) -> str:
        L = _lib.get()
        return L.string(L.lib.zpp_comm_bootstrap_name(self._c))

    def stats(self) -> dict:
        """Exact bytes this rank sent and received per link class, calls per
        group, and the emulation settings (zpp_comm_stats_t)."""
        L = _lib.get()
        s = L.new("zpp_comm_stats_t")
        L.check(L.lib.zpp_comm_get_stats(self._c, s), self._c)
        out = {}
        for name, _ in L.ffi.typeof("zpp_comm_stats_t").fields:
            if name == "struct_size":
                continue
            v = getattr(s, name)
            out[name] = list(v) if name == "calls" else v
        return out

    def reset_stats(self) -> None:
        L = _lib.get()
        L.check(L.lib.zpp_comm_reset_stats(self._c), self._c)

    @property
    def memory(self) -> str:
        """"host" (numpy arrays, CPU tensors) or "device" (CUDA tensors,
        ``__cuda_array_interface__`` arrays): the memory space of every
        buffer of this communicator's collectives (``memory=`` at creation;
        communicators split from it inherit it)."""
        if self._memory is None:
            L = _lib.get()
            m = L.ffi.new("zpp_memory_t *")
            L.check(L.lib.zpp_comm_memory(self._c, m), self._c)
            self._memory = "device" if m[0] == L.lib.ZPP_MEMORY_DEVICE else "host"
        return self._memory

    # ---- collectives ---------------------------------------------------------

    def _stream(self, bufs, stream) -> Optional[_Stream]:
        """The stream a device collective goes to (None on host memory):
        ``stream`` (an int handle, a torch.cuda.Stream, or anything with
        ``cuda_stream`` or ``ptr``), else torch's current stream of a CUDA
        tensor's device, else the stream a ``__cuda_array_interface__``
        names (1: the legacy default stream, 2: the per-thread default
        stream of the calling thread), else the legacy default stream.
        Without ``stream``, arrays that name different streams (torch's
        current stream for a CUDA tensor, the interface's "stream" for the
        others) are an error: the collective runs on one stream and would
        not be ordered after the others.  With ``stream`` the caller orders
        the arrays' streams before it."""
        if self.memory != "device":
            if stream is not None:
                raise ValueError("stream: only for a communicator on device memory "
                                 "(this one works on host memory)")
            return None
        tdev = next((b.array.device for b in bufs if _is_cuda_tensor(b.array)), None)
        if stream is not None:
            return _stream_arg(stream, tdev)
        # every array's stream must be ordered before the collective: it
        # runs on that stream, so they must all name the same one
        named = []
        for b in bufs:
            if _is_cuda_tensor(b.array):
                import torch

                ts = torch.cuda.current_stream(b.array.device)
                named.append((b, ts.cuda_stream, ts))
            elif b.stream is not None:
                named.append((b, 0 if b.stream == 1 else b.stream, None))
        if len({h for _, h, _ in named}) > 1:
            raise ValueError("stream: the arrays are on different streams (%s): pass "
                             "stream= (the caller then orders the others before it)"
                             % ", ".join("%s on %#x" % (b.what, h) for b, h, _ in named))
        if not named:
            return _Stream(0)
        ts = next((t for _, _, t in named if t is not None), None)
        return _Stream(named[0][1], ts, tdev)

    def _wait_target(self, call: _Stream, stream) -> _Stream:
        """The stream a stream-ordered Work.wait makes wait: ``stream``,
        else torch's current stream when the arrays include CUDA tensors,
        else the call's."""
        if stream is not None:
            return _stream_arg(stream, call.device)
        if call.device is not None:
            import torch

            ts = torch.cuda.current_stream(call.device)
            return _Stream(ts.cuda_stream, ts, call.device)
        return call

    def _hold(self, keep: tuple, target: _Stream) -> tuple:
        """Marks the CUDA tensors of ``keep`` used by ``target``, which runs or
        waits for the collective (``record_stream``: torch's allocator reuses
        their memory only after target passed this point, as with
        ProcessGroupNCCL), and returns the arrays the Work must keep alive
        until the device ran it: the others (``__cuda_array_interface__``
        arrays, tensors on the per-thread default stream, which torch has
        no object for).  The configs in ``keep`` are not kept: the call
        copied them.  A CUDA tensor is never asked for the interface
        (torch raises for one that requires grad)."""
        rest = []
        for a in keep:
            if _is_cuda_tensor(a):
                if target.torch is not None:
                    a.record_stream(target.torch)
                else:
                    rest.append(a)
            elif hasattr(a, "__cuda_array_interface__"):
                rest.append(a)
        return tuple(rest)

    def _check_memory(self, bufs) -> None:
        mem = self.memory
        for b in bufs:
            if (b.device is not None) != (mem == "device"):
                L = _lib.get()
                fix = ("create it with memory='device'" if mem == "host"
                       else "pass CUDA tensors or __cuda_array_interface__ arrays")
                raise DeviceError(L.lib.ZPP_ERR_INVALID_ARGUMENT, "ZPP_ERR_INVALID_ARGUMENT",
                                  "%s is %s but this communicator works on %s memory: %s"
                                  % (b.what, b.where(), mem, fix))

    def _run(self, fn, args: tuple, keep: tuple, result, async_op: bool, bufs=(), stream=None):
        L = _lib.get()
        self._open()
        self._check_memory(bufs)
        st = self._stream(bufs, stream)
        self._reap()
        # device memory: the blocking form is a started call ordered onto
        # its stream, freed once the device ran it (its arrays with it)
        req = L.ffi.new("zpp_request_t *") if async_op or st is not None else L.ffi.NULL
        status = fn(*args, L.ffi.NULL if st is None else L.ffi.cast("zpp_stream_t", st.handle),
                    req)
        if status != 0:
            if st is not None and status not in [getattr(L.lib, n) for n in _NOTHING_QUEUED]:
                _abandoned.append(keep)  # it may have queued work before failing
            L.check(status, self._c)
        if st is None:
            return Work(self, req, keep, result) if async_op else result
        w = Work(self, req, keep, result, st)  # registered before anything can raise
        if async_op:
            # the stream running it (NCCL) uses the tensors; the Work keeps
            # every array until its wait
            self._hold(keep, st)
            return w
        # the call's stream waits for the collective (on MPI or UCX staging
        # the engine's stream runs it)
        with w._lock:
            ordered = L.lib.zpp_request_order_stream(req[0],
                                                     L.ffi.cast("zpp_stream_t", st.handle))
            w._ordered = True
            if ordered == 0:
                w._keep = self._hold(keep, st)
        L.check(ordered, self._c)
        return result

    def _open(self) -> None:
        if self._c is None:
            raise ValueError("the communicator is closed")

    def _gather_bufs(self, send, out, floats_only: bool):
        self._open()
        s = Buf(send, "send", floats_only)
        self._check_memory([s])
        n = self.size
        if out is None:
            out = empty_like(send, s.numel * n)
        o = Buf(out, "out", floats_only, written=True)
        if o.dtype != s.dtype:
            raise DtypeError(-1, "ZPP_ERR_INVALID_ARGUMENT",
                             "out has dtype %s, send %s: they must be equal" % (o.dtype_name, s.dtype_name))
        if o.numel != s.numel * n:
            raise ValueError("out: %d elements, must be size x send = %d" % (o.numel, s.numel * n))
        return s, o, out

    def _scatter_bufs(self, send, out):
        self._open()
        s = Buf(send, "send", True)
        self._check_memory([s])
        n = self.size
        if s.numel % n:
            raise ValueError("send: %d elements, must be a multiple of the size %d" % (s.numel, n))
        if out is None:
            out = empty_like(send, s.numel // n)
        o = Buf(out, "out", True, written=True)
        if o.dtype != s.dtype:
            raise DtypeError(-1, "ZPP_ERR_INVALID_ARGUMENT",
                             "out has dtype %s, send %s: they must be equal" % (o.dtype_name, s.dtype_name))
        if o.numel != s.numel // n:
            raise ValueError("out: %d elements, must be send / size = %d" % (o.numel, s.numel // n))
        return s, o, out

    def allgather(self, send, out=None, *, async_op: bool = False, stream=None):
        """out[r*n:(r+1)*n] = rank r's send (n elements; fp32, fp16, bf16 or
        uint8).  In place when send is the view out[rank*n:(rank+1)*n].
        Returns out, or a :class:`Work` with ``async_op``."""
        s, o, out = self._gather_bufs(send, out, False)
        L = _lib.get()
        return self._run(L.lib.zpp_allgather, (self._c, s.cptr, o.cptr, s.numel, s.dtype),
                         (send, out), out, async_op, (s, o), stream)

    def qwz_allgather(self, send, out=None, *, bits: int = 8, block: int = 256,
                      asymmetric: bool = False, async_op: bool = False, stream=None):
        """qwZ: the all-gather with every shard block-quantized to ``bits``
        (8 or 4) on the wire; every rank gets bitwise the same output."""
        bits = _positive_bits("bits", bits, "4 or 8")
        block = check_block("block", block)
        s, o, out = self._gather_bufs(send, out, True)
        L = _lib.get()
        q = quant_config(bits, block, asymmetric)
        return self._run(L.lib.zpp_qwz_allgather, (self._c, q, s.cptr, o.cptr, s.numel, s.dtype),
                         (send, out, q), out, async_op, (s, o), stream)

    def reduce_scatter(self, send, out=None, *, op: str = "sum", async_op: bool = False,
                       stream=None):
        """out = slice ``rank`` of the sum (op "sum") or mean ("mean") of
        every rank's send, accumulated in fp32 in a fixed order (on several
        nodes each node's partial first, rounded to the dtype; else rank
        order) and rounded to the dtype (zpp_reduce_scatter)."""
        s, o, out = self._scatter_bufs(send, out)
        L = _lib.get()
        return self._run(L.lib.zpp_reduce_scatter,
                         (self._c, s.cptr, o.cptr, o.numel, s.dtype, _op(op)),
                         (send, out), out, async_op, (s, o), stream)

    def qgz_residual_count(self, count: int, *, intra_bits: int = 4) -> int:
        """Floats of the error-feedback residual of a qgz_reduce_scatter with
        ``count`` output elements per rank and ``intra_bits`` (the fp32
        residual of zpp_qgz_residual_bytes: with 4 or 8 that of both stages,
        zpp_qgz_residual_count, (W + M) count on M > 1 equal nodes, else
        W count; with 16, the intra-node stage unquantized, only the
        quantized stages': M count on equal nodes, W count on uneven ones
        (their flat stage quantizes in inter_bits), 0 on one node)."""
        intra_bits = _check_intra_bits(intra_bits)
        L = _lib.get()
        n = L.ffi.new("size_t *")
        if intra_bits in (4, 8):
            L.check(L.lib.zpp_qgz_residual_count(self._c, count, n), self._c)
            return n[0]
        cfg = qgz_config(intra_bits=intra_bits)
        L.check(L.lib.zpp_qgz_residual_bytes(self._c, cfg, count, n), self._c)
        return n[0] // 4

    def qgz_residual(self, count: int, *, like=None, intra_bits: int = 4):
        """A zeroed fp32 error-feedback residual for qgz_reduce_scatter with
        ``count`` output elements per rank and ``intra_bits``
        (:meth:`qgz_residual_count` floats): a torch tensor on ``like``'s
        device when ``like`` is one, else a numpy array.  On device memory
        ``like`` must be a CUDA tensor (other device arrays: allocate and
        zero that many floats)."""
        n = self.qgz_residual_count(count, intra_bits=intra_bits)
        if like is not None and _lib.is_torch(like):
            import torch

            return torch.zeros(n, dtype=torch.float32, device=like.device)
        if self.memory == "device":
            raise ValueError("qgz_residual: on device memory pass like=<a CUDA tensor>, or "
                             "allocate qgz_residual_count(%d, intra_bits=%d) = %d zeroed "
                             "floats yourself" % (count, intra_bits, n))
        import numpy as np

        return np.zeros(n, dtype=np.float32)

    def qgz_reduce_scatter(self, send, out=None, *, op: str = "mean", intra_bits: int = 4,
                           inter_bits: int = 4, block: int = 256, residual=None,
                           hadamard: int = 0, async_op: bool = False, stream=None):
        """qgZ: hierarchical quantized reduce-scatter (intra-node all-to-all
        in ``intra_bits``, 16 for the dtype unquantized, one inter-node
        crossing in ``inter_bits``).
        ``residual`` (from :meth:`qgz_residual` with the same ``intra_bits``,
        zero at first) turns on error feedback and is updated in place; with
        ``intra_bits`` 16 on one node nothing is quantized and the residual
        has 0 floats.  Its size must be exactly that of qgz_residual for
        this ``intra_bits`` (the C library takes any buffer of at least
        zpp_qgz_residual_bytes; the binding refuses the others, since a
        residual kept for intra 4 or 8 holds stage-1 errors where intra 16
        keeps its stage-2 ones)."""
        intra_bits = _check_intra_bits(intra_bits)
        inter_bits = _positive_bits("inter_bits", inter_bits, "4 or 8")
        block = check_block("block", block)
        _c_value("hadamard", hadamard, 0, _SIZE_MAX,
                 "0 (off) or a power of two >= 2 that divides block %d" % block)
        s, o, out = self._scatter_bufs(send, out)
        L = _lib.get()
        cfg = qgz_config(intra_bits=intra_bits, inter_bits=inter_bits, block=block,
                         hadamard=hadamard)
        res = L.ffi.NULL
        bufs = [s, o]
        if residual is not None:
            r = Buf(residual, "residual", written=True)
            want = self.qgz_residual_count(o.numel, intra_bits=intra_bits)
            if r.dtype_name.endswith("float32"):
                if r.numel != want:
                    raise ValueError("residual: %d floats, must be %d (qgz_residual with "
                                     "intra_bits %d)" % (r.numel, want, intra_bits))
            else:
                raise DtypeError(-1, "ZPP_ERR_INVALID_ARGUMENT",
                                 "residual has dtype %s: must be float32" % r.dtype_name)
            self._check_memory([r])
            if want:  # (none kept where nothing is quantized)
                res = r.cptr
                bufs.append(r)
        return self._run(L.lib.zpp_qgz_reduce_scatter,
                         (self._c, cfg, s.cptr, o.cptr, o.numel, s.dtype, _op(op), res),
                         (send, out, residual, cfg), out, async_op, bufs, stream)


_pg_counter: dict = {}


def _check_intra_bits(v) -> int:
    return _positive_bits("intra_bits", v, "4, 8 or 16 (not quantized inside the node)")


def _op(op: str) -> int:
    L = _lib.get()
    if op in ("sum", "SUM"):
        return L.lib.ZPP_OP_SUM
    if op in ("mean", "avg", "MEAN", "AVG"):
        return L.lib.ZPP_OP_MEAN
    raise ValueError("op %r: must be 'sum' or 'mean'" % (op,))


def quant_config(bits: int = 8, block: int = 256, asymmetric: bool = False,
                 stochastic: bool = False, seed: int = 0):
    _c_value("bits", bits, -(1 << 31), (1 << 31) - 1, "4 or 8")
    _c_value("block", block, 0, _SIZE_MAX,
             "an integer from 1 to 2**64 - 1 (elements per scale)")
    _c_value("seed", seed, 0, _SIZE_MAX, "an integer from 0 to 2**64 - 1")
    L = _lib.get()
    q = L.new("zpp_quant_config_t")
    q.bits = bits
    q.block_size = block
    q.mode = L.lib.ZPP_QUANT_ASYMMETRIC if asymmetric else L.lib.ZPP_QUANT_SYMMETRIC
    q.rounding = L.lib.ZPP_ROUND_STOCHASTIC if stochastic else L.lib.ZPP_ROUND_NEAREST
    q.seed = seed
    L.check(L.lib.zpp_quant_config_check(q))
    return q


def qgz_config(*, intra_bits: int = 4, inter_bits: int = 4, block: int = 256,
               hadamard: int = 0):
    _c_value("intra_bits", intra_bits, -(1 << 31), (1 << 31) - 1,
             "4, 8 or 16 (not quantized inside the node)")
    _c_value("inter_bits", inter_bits, -(1 << 31), (1 << 31) - 1, "4 or 8")
    _c_value("block", block, 0, _SIZE_MAX,
             "an integer from 1 to 2**64 - 1 (elements per scale)")
    _c_value("hadamard", hadamard, 0, _SIZE_MAX,
             "0 (off) or a power of two >= 2 that divides block")
    L = _lib.get()
    c = L.new("zpp_qgz_config_t")
    c.intra_bits = intra_bits
    c.inter_bits = inter_bits
    c.block_size = block
    c.hadamard = hadamard
    return c


_mpi_lib = None
_mpi_we_init = False


def _mpi():
    """libmpi (Open MPI), initialised with MPI_THREAD_MULTIPLE when nobody
    did; finalised at exit after zpp's communicators are closed."""
    global _mpi_lib, _mpi_we_init
    if _mpi_lib is not None:
        return _mpi_lib
    name = ctypes.util.find_library("mpi")
    if name is None:
        raise Error(-5, "ZPP_ERR_UNSUPPORTED", "libmpi not found (Comm.from_mpi needs Open MPI)")
    mpi = ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)
    try:
        ctypes.c_char.in_dll(mpi, "ompi_mpi_comm_world")
    except ValueError:
        raise Error(-5, "ZPP_ERR_UNSUPPORTED",
                    "%s is not Open MPI: Comm.from_mpi knows Open MPI's MPI_Comm only" % name) from None
    flag = ctypes.c_int(0)
    mpi.MPI_Initialized(ctypes.byref(flag))
    if not flag.value:
        provided = ctypes.c_int(0)
        rc = mpi.MPI_Init_thread(None, None, 3, ctypes.byref(provided))  # MPI_THREAD_MULTIPLE
        if rc != 0:
            raise Error(-9, "ZPP_ERR_MPI", "MPI_Init_thread failed (%d)" % rc)
        _mpi_we_init = True

        def _fin():
            _close_all()
            fin = ctypes.c_int(0)
            mpi.MPI_Finalized(ctypes.byref(fin))
            if not fin.value:
                mpi.MPI_Finalize()

        atexit.register(_fin)  # runs before _close_all's own registration
    _mpi_lib = mpi
    return mpi
