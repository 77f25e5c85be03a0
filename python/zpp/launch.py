"""torch.distributed's process group started the same way under torchrun,
mpirun (Open MPI) and srun (Slurm), with no MASTER_ADDR / MASTER_PORT to
set by hand.

    import zpp
    zpp.init_process_group("gloo")       # then torch.distributed as usual

Where the variables come from:

- RANK, WORLD_SIZE, LOCAL_RANK: torchrun's when set; else Open MPI's
  OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK; else srun's SLURM_PROCID /
  SLURM_NTASKS / SLURM_LOCALID.  They are written to ``os.environ``.
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
    ((SLURM_JOB_ID * 61 + SLURM_STEP_ID) mod 11000): two steps of a job,
    and neighbouring jobs, get different ports).

  MASTER_ADDR and MASTER_PORT are then written to ``os.environ`` as well,
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


def launcher(env=None) -> Optional[str]:
    """Which launcher started this process, by its variables: "torchrun"
    (RANK set), "mpirun" (OMPI_COMM_WORLD_RANK), "srun" (SLURM_PROCID;
    mpirun inside an allocation inherits the allocation's SLURM_*, so Open
    MPI's come first), else None."""
    env = os.environ if env is None else env
    if env.get("RANK"):
        return "torchrun"
    if env.get("OMPI_COMM_WORLD_RANK"):
        return "mpirun"
    if env.get("SLURM_PROCID"):
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


def _fill_rank_env(env) -> str:
    """Writes RANK, WORLD_SIZE, LOCAL_RANK from the launcher's variables;
    returns the launcher."""
    how = launcher(env)
    if how == "torchrun":
        _int(env, "WORLD_SIZE", "torchrun sets RANK and WORLD_SIZE")
        return how
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
    else:
        raise RuntimeError(
            "zpp.init_process_group: RANK is not set, and neither is OMPI_COMM_WORLD_RANK nor "
            "SLURM_PROCID: start the ranks with torchrun, mpirun or srun")
    if rank >= size:
        raise RuntimeError("zpp.init_process_group: rank %d: must be below the world size %d"
                           % (rank, size))
    env["RANK"], env["WORLD_SIZE"] = str(rank), str(size)
    env.setdefault("LOCAL_RANK", str(local))
    return how


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
    (:meth:`zpp.Comm.from_env`) takes the next one."""
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


def _mpi_store(env, timeout):
    """Rank 0's TCPStore, its address and port sent to every rank over MPI."""
    import numpy as np
    import torch.distributed as dist

    from .comm import Comm

    rank, size = int(env["RANK"]), int(env["WORLD_SIZE"])
    store, msg = None, {}
    if rank == 0:
        try:
            host = _root_address(env)
            port = _int(env, "MASTER_PORT", "") if env.get("MASTER_PORT") else 0
            store = dist.TCPStore(host, port, size, is_master=True, timeout=timeout,
                                  wait_for_workers=False)
            msg = {"addr": host, "port": store.port}
        except Exception as e:  # every rank must hear of it
            # (cut to fit the message with its JSON escapes)
            msg = {"error": ("%s: %s" % (type(e).__name__, e))[:_MSG_BYTES // 8]}
    buf = np.zeros(_MSG_BYTES, np.uint8)
    raw = json.dumps(msg).encode()  # ASCII: at most 6 bytes a character
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


def init_process_group(backend: str = "gloo", **kwargs) -> None:
    """``torch.distributed.init_process_group(backend, **kwargs)`` under
    torchrun, mpirun or srun with no rendezvous variables to set (see the
    module's docstring).  ``kwargs`` go to torch (``timeout=`` also bounds
    the rendezvous; ``store``/``init_method`` given there skip it)."""
    import torch.distributed as dist

    env = os.environ
    how = _fill_rank_env(env)
    if "store" in kwargs or "init_method" in kwargs:
        dist.init_process_group(backend, **kwargs)
        return
    rank, size = int(env["RANK"]), int(env["WORLD_SIZE"])
    kw = dict(kwargs)
    kw.setdefault("rank", rank)
    kw.setdefault("world_size", size)
    if env.get("MASTER_ADDR") and env.get("MASTER_PORT"):
        pass  # env:// with the given rendezvous
    elif how == "mpirun":
        from torch.distributed.constants import default_pg_timeout

        store, addr, port = _mpi_store(env, kwargs.get("timeout") or default_pg_timeout)
        env["MASTER_ADDR"], env["MASTER_PORT"] = addr, str(port)
        dist.init_process_group(backend, store=store, **kw)
        return
    elif how == "srun":
        if not env.get("MASTER_ADDR"):
            name = "SLURM_STEP_NODELIST" if env.get("SLURM_STEP_NODELIST") else "SLURM_JOB_NODELIST"
            if not env.get(name):
                raise RuntimeError("zpp.init_process_group: neither MASTER_ADDR nor "
                                   "SLURM_STEP_NODELIST nor SLURM_JOB_NODELIST is set")
            env["MASTER_ADDR"] = slurm_first_host(env[name], name)
        if not env.get("MASTER_PORT"):
            env["MASTER_PORT"] = str(slurm_port(env))
    else:
        missing = [v for v in ("MASTER_ADDR", "MASTER_PORT") if not env.get(v)]
        raise RuntimeError("zpp.init_process_group: %s not set (torchrun sets MASTER_ADDR and "
                           "MASTER_PORT)" % " and ".join(missing))
    dist.init_process_group(backend, **kw)
