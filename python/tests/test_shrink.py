"""zpp.Comm.shrink on four plain processes (zpp's TCP bootstrap from
RANK/WORLD_SIZE/MASTER_*, no launcher that would end the job when a rank
dies): rank 2 SIGKILLs itself, the survivors shrink and check the next
collectives exactly (python/tests/shrink_driver.py)."""
import json
import signal
import subprocess
import sys

from conftest import TESTS, env, kill_group


def test_survivors_shrink_after_a_sigkill():
    n, victim = 4, 2
    e = env(WORLD_SIZE=n, ZPP_TOPO="2x2")
    procs = []
    for r in range(n):
        er = dict(e, RANK=str(r), LOCAL_RANK=str(r))
        procs.append(subprocess.Popen([sys.executable, str(TESTS / "shrink_driver.py"), str(victim)],
                                      env=er, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, start_new_session=True))
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=60)
            outs.append((p.returncode, out, err))
    finally:
        for p in procs:
            if p.poll() is None:
                kill_group(p, grace=1.0)
    for r, (rc, out, err) in enumerate(outs):
        if r == victim:
            assert rc == -signal.SIGKILL, (rc, err[-2000:])
        else:
            assert rc == 0, "rank %d: %s" % (r, err[-2000:])
    line = json.loads(outs[0][1].strip().splitlines()[-1])
    assert line["old_ranks"] == [0, 1, 3] and line["size"] == 3
    assert line["failed_with"] in ("ZPP_ERR_SYSTEM", "ZPP_ERR_TIMEOUT")
    # the all-gather's timeout (3 s) on the slowest survivor, then the shrink
    assert line["seconds"] < 3.0 + 2.0
    print(line)
