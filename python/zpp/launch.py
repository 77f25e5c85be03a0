"""torch.distributed's process group started the same way under torchrun,
mpirun (Open MPI) and srun (Slurm), with no MASTER_ADDR / MASTER_PORT to
set by hand.

    import zpp
    zpp.init_process_group("gloo")       # then torch.distributed as usual

Where the variables come from:

- RANK, WORLD_SIZE, LOCAL_RANK: torchrun's when set; else Open MPI's
  OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK; else srun's SLURM_PROCID /
  SLURM_NTASKS / SLURM_LOCALID (not in the ranks of an MPI launcher that
  runs inside an allocation and leaves its SLURM_* to them: see
  :func:`launcher`).  They are written to ``os.environ`` once the process
  group is made (a failed call leaves the environment as it was).
- The rendezvous: MASTER_ADDR and MASTER_PORT when both are set (an
  explicit setting wins; torchrun sets them).  Otherwise:

  - under mpirun, rank 0 opens torch's TCPStore on a port the kernel picks
    (race-free) and sends its address and port to the other ranks over MPI
    (a zpp communicator from :meth:`zpp.Comm.from_mpi`, closed after one
    all-gather).  The address is the one zpp's TCP bootstrap would listen
    on: ZPP_BOOTSTRAP_ADDR, else MASTER_ADDR, else 127.0.0.1 when every
    rank runs on rank 0's host; ranks on several hosts need one of the two
    set (``mpirun -x ZPP_BOOTSTRAP_ADDR=<rank 0's host> ...``).
    MASTER_PORT, when set alone, replaces the kernel's pick.
  - under srun, the address is the first host of SLURM_STEP_NODELIST
    (else SLURM_JOB_NODELIST; srun's default block distribution puts task
    0 there) and the port MASTER_PORT, else :func:`slurm_port` (10000 + 2 *
    ((SLURM_JOB_ID * 61 + SLURM_STEP_ID) mod 11000): steps 0 to 10999 of a
    job get different ports, as do the steps 0 of jobs whose ids differ by
    less than 11000; steps of two jobs can meet, job J step 61 is job J + 1
    step 0: set MASTER_PORT when such steps share a node).  Rank 0 opens
    torch's TCPStore there.

  The rendezvous (a rank waiting for rank 0's store) is bounded by
  ``timeout=`` when given, else by ZPP_TIMEOUT_S (zpp's setting, 300 s by
  default; 0: torch's default, 30 minutes).  MASTER_ADDR and MASTER_PORT are
  then written to ``os.environ`` as well,
  so what reads torchrun's variables later works the same:
  :meth:`zpp.Comm.from_env` listens on MASTER_PORT + 1 (ZPP_BOOTSTRAP_PORT
  overrides it) and :meth:`zpp.Comm.from_process_group` on MASTER_ADDR.

Errors name the missing or malformed variable.
"""

from __future__ import annotations

import json
import os
import re
from typing import Optional

__all__ = ["init_process_group", "launcher", "slurm_first_host", "slurm_port"]

# what rank 0 sends under mpirun (JSON, zero-padded)
_MSG_BYTES = 1024


def _hydra(env) -> bool:
    """MPI variables that are not srun's own: MPICH's or Intel MPI's hydra
    inside an allocation starts its proxies with srun, so its ranks inherit
    a proxy's SLURM_PROCID (the node's index).  srun's PMI plugins (--mpi=pmi2,
    pmix) set PMI_RANK / PMIX_RANK to SLURM_PROCID and no MPI_LOCALRANKID.
    The rule of zpp's C bootstrap (src/comm/tcp_id.c, zpp_env_slurm)."""
    p = env.get("SLURM_PROCID")
    if "MPI_LOCALRANKID" in env:
        return True
    if "PMI_RANK" in env or "PMI_SIZE" in env:
        if env.get("PMI_RANK") != p:
            return True
        if "PMI_SIZE" in env and env["PMI_SIZE"] != env.get("SLURM_NTASKS"):
            return True
    return "PMIX_RANK" in env and env["PMIX_RANK"] != p


def launcher(env=None) -> Optional[str]:
    """Which launcher started this process, by its variables: "torchrun"
    (RANK set), "mpirun" (Open MPI's OMPI_COMM_WORLD_RANK), "srun"
    (SLURM_PROCID), else None.  A launcher started inside a Slurm
    allocation leaves the allocation's SLURM_* to its ranks, so Open MPI's
    come first, and SLURM_PROCID does not count beside MPICH's or Intel
    MPI's (MPI_LOCALRANKID, or PMI_RANK / PMI_SIZE / PMIX_RANK unlike
    SLURM_PROCID / SLURM_NTASKS): None then."""
    env = os.environ if env is None else env
    if env.get("RANK"):
        return "torchrun"
    if env.get("OMPI_COMM_WORLD_RANK"):
        return "mpirun"
    if env.get("SLURM_PROCID") and not _hydra(env):
        return "srun"
    return None


def _int(env, name: str, hint: str) -> int:
    v = env.get(name)
    if v is None or v == "":
        raise RuntimeError("zpp.init_process_group: %s is not set (%s)" % (name, hint))
    if not re.fullmatch(r"[0-9]+", v):
        raise RuntimeError("zpp.init_process_group: %s %r: must be a non-negative integer"
                           % (name, v))
    return int(v)


_OMPI = "mpirun sets OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE and OMPI_COMM_WORLD_LOCAL_RANK"
_SLURM = ("srun sets SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_JOB_ID, SLURM_STEP_ID "
          "and SLURM_STEP_NODELIST")


def _rank_env(env):
    """(launcher, {RANK, WORLD_SIZE, LOCAL_RANK}) from the launcher's
    variables, checked; nothing is written."""
    how = launcher(env)
    if how == "torchrun":
        hint = "torchrun sets RANK and WORLD_SIZE"
        rank, size = _int(env, "RANK", hint), _int(env, "WORLD_SIZE", hint)
        if size < 1:
            raise RuntimeError("zpp.init_process_group: WORLD_SIZE 0: must be at least 1")
        if rank >= size:
            raise RuntimeError("zpp.init_process_group: RANK %d: must be below WORLD_SIZE %d"
                               % (rank, size))
        return how, {}
    if how == "mpirun":
        rank = _int(env, "OMPI_COMM_WORLD_RANK", _OMPI)
        size = _int(env, "OMPI_COMM_WORLD_SIZE", _OMPI)
        local = _int(env, "OMPI_COMM_WORLD_LOCAL_RANK", _OMPI)
    elif how == "srun":
        if not env.get("SLURM_STEP_ID"):
            raise RuntimeError(
                "zpp.init_process_group: SLURM_PROCID is set but SLURM_STEP_ID is not: this "
                "process is a batch script's (sbatch, salloc), not a task of srun; start the "
                "ranks with srun, or set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT")
        rank = _int(env, "SLURM_PROCID", _SLURM)
        size = _int(env, "SLURM_NTASKS", _SLURM)
        local = _int(env, "SLURM_LOCALID", _SLURM)
    elif env.get("SLURM_PROCID"):
        raise RuntimeError(
            "zpp.init_process_group: RANK and OMPI_COMM_WORLD_RANK are not set, and "
            "SLURM_PROCID is the allocation's, not this rank's (MPI_LOCALRANKID, PMI_RANK, "
            "PMI_SIZE or PMIX_RANK say another MPI launcher, such as MPICH's or Intel MPI's "
            "mpiexec, started it): set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT, or "
            "start the ranks with torchrun, Open MPI's mpirun or srun")
    else:
        raise RuntimeError(
            "zpp.init_process_group: RANK is not set, and neither is OMPI_COMM_WORLD_RANK nor "
            "SLURM_PROCID: start the ranks with torchrun, mpirun or srun")
    if rank >= size:
        raise RuntimeError("zpp.init_process_group: rank %d: must be below the world size %d"
                           % (rank, size))
    return how, {"RANK": str(rank), "WORLD_SIZE": str(size), "LOCAL_RANK": str(local)}


def slurm_first_host(nodelist: str, name: str = "SLURM_STEP_NODELIST") -> str:
    """The first host of a Slurm hostlist expression: "node[01-04,07],gpu3"
    -> "node01", "a-[1-2]-b" -> "a-1-b" (zero padding as written).  The
    whole list is checked (as zpp's C bootstrap does); a malformed one
    raises ValueError naming ``name`` and the value."""
    rng = r"[0-9]{1,18}(?:-[0-9]{1,18})?"
    part = r"(?:[A-Za-z0-9._-]|\[%s(?:,%s)*\])+" % (rng, rng)
    if not nodelist or not re.fullmatch(r"%s(?:,%s)*" % (part, part), nodelist):
        raise ValueError("%s %r: not a Slurm hostlist such as node[01-04,07],gpu3"
                         % (name, nodelist))
    for a, b in re.findall(r"([0-9]+)-([0-9]+)", "".join(re.findall(r"\[[^]]*\]", nodelist))):
        if int(b) < int(a):
            raise ValueError("%s %r: a range whose end is below its start (%s-%s)"
                             % (name, nodelist, a, b))
    first = re.match(part, nodelist).group(0)
    return re.sub(r"\[([0-9]+)[^]]*\]", r"\1", first)


def slurm_port(env=None) -> int:
    """The rendezvous port under srun without MASTER_PORT: 10000 + 2 *
    ((SLURM_JOB_ID * 61 + SLURM_STEP_ID) mod 11000), in [10000, 31998]
    (below Linux's ephemeral ports); zpp's own bootstrap
    (:meth:`zpp.Comm.from_env`) takes the next one.  Steps 0 to 10999 of a
    job get different ports, as do the steps 0 of jobs whose ids differ by
    less than 11000; steps of two jobs can meet (job J step 61 is job J + 1
    step 0): set MASTER_PORT when such steps share a node."""
    env = os.environ if env is None else env
    hint = "srun sets it; or set MASTER_PORT"
    job, step = _int(env, "SLURM_JOB_ID", hint), _int(env, "SLURM_STEP_ID", hint)
    for n, v in (("SLURM_JOB_ID", job), ("SLURM_STEP_ID", step)):
        if v >= 1 << 32:
            raise RuntimeError("zpp.init_process_group: %s %d: must be below 2^32" % (n, v))
    return 10000 + 2 * ((job * 61 + step) % 11000)


def _root_address(env) -> str:
    """What rank 0's store is reached by: zpp's TCP bootstrap's rule."""
    for name in ("ZPP_BOOTSTRAP_ADDR", "MASTER_ADDR"):
        if env.get(name):
            return env[name]
    size = _int(env, "OMPI_COMM_WORLD_SIZE", _OMPI)
    local = env.get("OMPI_COMM_WORLD_LOCAL_SIZE")
    if local is not None and local == str(size):
        return "127.0.0.1"
    raise RuntimeError(
        "the ranks run on several hosts (OMPI_COMM_WORLD_LOCAL_SIZE %s of OMPI_COMM_WORLD_SIZE "
        "%d) and neither ZPP_BOOTSTRAP_ADDR nor MASTER_ADDR names an address of rank 0's host "
        "that the others reach: set one (mpirun -x ZPP_BOOTSTRAP_ADDR=<host>)" % (local, size))


# a host name is at most 253 characters; an IPv4 or IPv6 address fewer
_ADDR_MAX = 255


def _fit(msg: dict, key: str) -> bytes:
    """``msg`` as JSON (ASCII) in at most _MSG_BYTES bytes, ``msg[key]``
    shortened until it fits (a character takes up to 12 bytes escaped)."""
    text = msg[key]
    while True:
        raw = json.dumps(dict(msg, **{key: text})).encode()
        if len(raw) <= _MSG_BYTES:
            return raw
        over = len(raw) - _MSG_BYTES
        text = text[:max(0, len(text) - max(1, over // 12))]


def _rank0_message(env, size: int, timeout):
    """Rank 0: (its store or None, what it sends the others: its address
    and port, or the error, in at most _MSG_BYTES bytes)."""
    import torch.distributed as dist

    try:
        host = _root_address(env)
        name = "ZPP_BOOTSTRAP_ADDR" if env.get("ZPP_BOOTSTRAP_ADDR") else "MASTER_ADDR"
        if len(host.encode()) > _ADDR_MAX:
            raise RuntimeError("%s %r...: %d bytes, longer than the %d of a host name or "
                               "address" % (name, host[:40], len(host.encode()), _ADDR_MAX))
        port = _int(env, "MASTER_PORT", "") if env.get("MASTER_PORT") else 0
        store = dist.TCPStore(host, port, size, is_master=True, timeout=timeout,
                              wait_for_workers=False)
        raw = json.dumps({"addr": host, "port": store.port}).encode()
        if len(raw) > _MSG_BYTES:  # (bounded by the check above)
            raise RuntimeError("rank 0's address and port: %d bytes of JSON, more than %d"
                               % (len(raw), _MSG_BYTES))
        return store, raw
    except Exception as e:  # every rank must hear of it
        return None, _fit({"error": "%s: %s" % (type(e).__name__, e)}, "error")


def _mpi_store(env, rank: int, size: int, timeout):
    """Rank 0's TCPStore, its address and port sent to every rank over MPI."""
    import numpy as np
    import torch.distributed as dist

    from .comm import Comm

    store, raw = None, b"{}"
    if rank == 0:
        store, raw = _rank0_message(env, size, timeout)
    buf = np.zeros(_MSG_BYTES, np.uint8)
    buf[:len(raw)] = np.frombuffer(raw, np.uint8)
    # one emulated node on the MPI transport: the exchange is the same
    # whatever ZPP_TOPO, ZPP_BACKEND or the link emulation say
    comm = Comm.from_mpi(topology="1x%d" % size, backend="mpi")
    try:
        out = comm.allgather(buf)
    finally:
        comm.close()
    got = json.loads(bytes(out[:_MSG_BYTES]).rstrip(b"\0").decode())
    if "error" in got:
        raise RuntimeError("zpp.init_process_group: rank 0 could not open the rendezvous "
                           "store: %s" % got["error"])
    if rank != 0:
        store = dist.TCPStore(got["addr"], got["port"], size, is_master=False, timeout=timeout)
    return store, got["addr"], got["port"]


def _rendezvous_timeout(kwargs):
    """``timeout=`` when given, else ZPP_TIMEOUT_S (zpp's setting)."""
    from datetime import timedelta

    if kwargs.get("timeout") is not None:
        return kwargs["timeout"]
    from . import _lib

    L = _lib.get()
    v = L.ffi.new("const char **")
    L.check(L.lib.zpp_settings_get(b"ZPP_TIMEOUT_S", v))
    text = L.string(v[0])
    try:
        secs = float(text)
    except ValueError:
        raise RuntimeError("zpp.init_process_group: ZPP_TIMEOUT_S %r: must be a number of "
                           "seconds" % text) from None
    if secs <= 0:  # zpp: no limit; torch's default then
        from torch.distributed.constants import default_pg_timeout

        return default_pg_timeout
    return timedelta(seconds=min(secs, 1e9))


def init_process_group(backend: str = "gloo", **kwargs) -> None:
    """``torch.distributed.init_process_group(backend, **kwargs)`` under
    torchrun, mpirun or srun with no rendezvous variables to set (see the
    module's docstring).  ``kwargs`` go to torch, with the rank and world
    size this function read unless given (``timeout=`` also bounds the
    rendezvous; ``store``/``init_method`` given there skip it).  RANK,
    WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT are written to
    ``os.environ`` only once the process group is made."""
    import torch.distributed as dist

    env = os.environ
    how, ranks = _rank_env(env)
    rank = int(ranks.get("RANK", env.get("RANK", "0")))
    size = int(ranks.get("WORLD_SIZE", env.get("WORLD_SIZE", "1")))
    kw = dict(kwargs)
    kw.setdefault("rank", rank)
    kw.setdefault("world_size", size)
    master = {}
    if "store" in kwargs or "init_method" in kwargs:
        pass  # the caller's rendezvous
    elif env.get("MASTER_ADDR") and env.get("MASTER_PORT"):
        pass  # env:// with the given rendezvous
    elif how == "mpirun":
        store, addr, port = _mpi_store(env, rank, size, _rendezvous_timeout(kwargs))
        master = {"MASTER_ADDR": addr, "MASTER_PORT": str(port)}
        kw["store"] = store
    elif how == "srun":
        addr, port = env.get("MASTER_ADDR"), env.get("MASTER_PORT")
        if not addr:
            name = "SLURM_STEP_NODELIST" if env.get("SLURM_STEP_NODELIST") else "SLURM_JOB_NODELIST"
            if not env.get(name):
                raise RuntimeError("zpp.init_process_group: neither MASTER_ADDR nor "
                                   "SLURM_STEP_NODELIST nor SLURM_JOB_NODELIST is set")
            addr = slurm_first_host(env[name], name)
        if port:
            port = _int(env, "MASTER_PORT", "")
        else:
            port = slurm_port(env)
        kw["store"] = dist.TCPStore(addr, port, size, is_master=rank == 0,
                                    timeout=_rendezvous_timeout(kwargs))
        master = {"MASTER_ADDR": addr, "MASTER_PORT": str(port)}
    else:
        missing = [v for v in ("MASTER_ADDR", "MASTER_PORT") if not env.get(v)]
        raise RuntimeError("zpp.init_process_group: %s not set (torchrun sets MASTER_ADDR and "
                           "MASTER_PORT)" % " and ".join(missing))
    dist.init_process_group(backend, **kw)
    for k, v in ranks.items():
        if k == "LOCAL_RANK":
            env.setdefault(k, v)
        else:
            env[k] = v
    env.update(master)
