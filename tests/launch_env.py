#!/usr/bin/env python3
"""Starts N plain processes the way torchrun starts workers: environment
only (MASTER_ADDR=127.0.0.1, MASTER_PORT, RANK, LOCAL_RANK, WORLD_SIZE,
LOCAL_WORLD_SIZE), no MPI, loopback only, bounded time.

  launch_env.py -n 4 [--timeout 60] -- ./test_coll --gtest_filter=...
      every process must exit 0.

Bad launches (tests of zpp's bootstrap errors):
  --ranks 0,1,1,3     the RANK each process gets (default 0..n-1)
  --world W           WORLD_SIZE (default n)
  --hold-port         this launcher listens on the bootstrap port
                      (MASTER_PORT + 1) and never answers: a port in use
  --expect-fail RE    every process must exit non-zero within --within
                      seconds, and the output of each must match RE (a
                      list of RE separated by '|||' may give one per rank)
  --within S          the bound for --expect-fail (default: --timeout)
  --expect-output RE  (a good launch) every process must exit 0 and their
                      output together must match RE

Exit status: 0 when the expectation holds, 1 otherwise (the reason is
printed), 2 for bad arguments.
"""
import argparse
import os
import re
import socket
import subprocess
import sys
import time


def free_port_pair():
    """A port P such that P and P + 1 are both free on 127.0.0.1."""
    for _ in range(50):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        p = s.getsockname()[1]
        s.close()
        if p >= 65535:
            continue
        t = socket.socket()
        try:
            t.bind(("127.0.0.1", p + 1))
            t.close()
            return p
        except OSError:
            t.close()
    raise SystemExit("no free port pair found")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, required=True)
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--ranks", default=None)
    ap.add_argument("--world", type=int, default=None)
    ap.add_argument("--hold-port", action="store_true")
    ap.add_argument("--expect-fail", default=None)
    ap.add_argument("--within", type=float, default=None)
    ap.add_argument("--expect-output", default=None)
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = a.cmd[1:] if a.cmd and a.cmd[0] == "--" else a.cmd
    if not cmd or a.n < 1:
        ap.print_usage()
        return 2
    ranks = [int(x) for x in a.ranks.split(",")] if a.ranks else list(range(a.n))
    if len(ranks) != a.n:
        print("--ranks must list -n ranks", file=sys.stderr)
        return 2
    world = a.world if a.world is not None else a.n
    port = free_port_pair()
    holder = None
    if a.hold_port:
        holder = socket.socket()
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("127.0.0.1", port + 1))
        holder.listen(64)  # accepts into the backlog, never answers
    capture = a.expect_fail is not None or a.expect_output is not None
    procs = []
    start = time.monotonic()
    for i, r in enumerate(ranks):
        env = dict(os.environ)
        env.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                    "RANK": str(r), "LOCAL_RANK": str(r),
                    "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(a.n),
                    "ZPP_TEST_LAUNCH": "env"})
        for k in [k for k in env if k.startswith("OMPI_") or k.startswith("PMIX_")]:
            del env[k]
        procs.append(subprocess.Popen(
            cmd, env=env,
            stdout=subprocess.PIPE if capture else None,
            stderr=subprocess.STDOUT if capture else None, text=True))
    outs = [""] * a.n
    codes = [None] * a.n
    limit = a.timeout
    timed_out = False
    for i, p in enumerate(procs):
        left = max(0.1, limit - (time.monotonic() - start))
        try:
            out, _ = p.communicate(timeout=left)
            outs[i] = out or ""
            codes[i] = p.returncode
        except subprocess.TimeoutExpired:
            timed_out = True
            break
    elapsed = time.monotonic() - start
    if timed_out:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for i, p in enumerate(procs):
            out, _ = p.communicate()
            outs[i] = outs[i] or (out or "")
            codes[i] = p.returncode if codes[i] is None else codes[i]
        print("launch_env: processes still running after %.1f s: killed"
              % limit)
        for i, o in enumerate(outs):
            if o:
                print("---- process %d (RANK %d) ----\n%s" % (i, ranks[i], o))
        return 1
    if holder is not None:
        holder.close()
    if a.expect_fail is None:
        bad = [i for i, c in enumerate(codes) if c != 0]
        text = "".join(outs)
        if capture:
            sys.stdout.write(text)
            if not re.search(a.expect_output, text):
                print("launch_env: the output does not match /%s/"
                      % a.expect_output)
                return 1
        if bad:
            print("launch_env: processes %s exited non-zero (%s)"
                  % (bad, [codes[i] for i in bad]))
            return 1
        print("launch_env: %d processes passed in %.1f s" % (a.n, elapsed))
        return 0
    pats = a.expect_fail.split("|||")
    within = a.within if a.within is not None else a.timeout
    ok = True
    for i, o in enumerate(outs):
        pat = pats[i] if len(pats) > 1 else pats[0]
        first = next((l for l in o.splitlines() if "zpp_comm_create" in l), "")
        print("process %d (RANK %d): exit %s: %s" % (i, ranks[i], codes[i],
                                                     first.strip()))
        if codes[i] == 0:
            print("  expected a failure")
            ok = False
        if not re.search(pat, o):
            print("  output does not match /%s/:\n%s" % (pat, o))
            ok = False
    if elapsed > within:
        print("launch_env: took %.1f s, more than %.1f s" % (elapsed, within))
        ok = False
    print("launch_env: every process failed as expected in %.1f s" % elapsed
          if ok else "launch_env: expectation not met")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
