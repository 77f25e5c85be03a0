#!/usr/bin/env python3
"""Every launch line the documentation prints runs as printed.

A launch line starts ranks: a command (after any VAR=value prefixes) that
begins with mpirun, torchrun, srun, `python3 tests/launch_env.py` (started
the way torchrun starts workers) or `scripts/netns_cluster.sh run`.  They
are taken from the fenced code blocks of README.md and docs/*.md (not
docs/lab/, not docs/generated/) and from the indented example blocks of
the examples' module docstrings (examples/*.py), continuation lines
(a trailing backslash) joined.

Each line runs exactly as printed, from the repository's root, through
bash, with only environment added:
  - as root, OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    OMPI_MCA_rmaps_base_oversubscribe=1 (README: "as root, mpirun needs
    --allow-run-as-root --oversubscribe");
  - PATH starts with the venv's bin/, so `python` and `torchrun` are the
    venv's;
  - PYTHONPATH=python and ZPP_LIBRARY=build/libzpp.so, which the README's
    "run from the tree" tells the reader to export (not needed once zpp
    is pip-installed into the venv).
The lines name build/: the build directory must be build/.

Lines that need what this test does not set up are listed with the
reason and run elsewhere: srun lines by tests/slurm_test.sh (which asks
for them with --list srun), the namespace cluster's by nobody as printed
(make test-cluster runs the same tools through scripts/netns_cluster.sh).

  tests/launch_lines_test.py [--venv DIR] [--timeout S]   run them
  tests/launch_lines_test.py --list [KIND]   print the lines (KIND: run,
                                             srun, cluster; default all)

Exit status: 0 when every line to run exited 0; 1 otherwise, naming each
failing line (file:line) with the end of its output.
"""
import argparse
import glob
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCH = re.compile(r"^(?:[A-Za-z_][A-Za-z0-9_]*=\S*\s+)*"
                    r"(mpirun|torchrun|srun|python3? tests/launch_env\.py|"
                    r"scripts/netns_cluster\.sh\s+run)\b")
# at least this many lines: fewer means the extraction broke (or the
# documentation lost its examples), and a test that finds nothing passes
MIN_LINES = 8


def _joined(lines):
    """(first line number, text) of each logical line: continuations
    joined, as bash would read them."""
    out, cur, start = [], "", 0
    for n, text in lines:
        if not cur:
            start = n
        if text.rstrip().endswith("\\"):
            cur += text.rstrip()[:-1] + " "
            continue
        out.append((start, (cur + text).strip()))
        cur = ""
    if cur:
        out.append((start, cur.strip()))
    return out


def _markdown(path):
    """The lines of the fenced code blocks that are not C or Python."""
    block, lang, out = [], None, []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            s = line.strip()
            if s.startswith("```"):
                if lang is None:
                    lang, block = s[3:].strip(), []
                else:
                    if lang in ("", "sh", "bash", "shell", "console"):
                        out += _joined(block)
                    lang = None
                continue
            if lang is not None:
                block.append((n, line.rstrip("\n")))
    return out


def _docstring(path):
    """The indented lines of the module docstring (its example blocks)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    m = re.search(r'"""(.*?)"""', text, re.S)
    if m is None:
        return []
    first = text[:m.start(1)].count("\n") + 1
    lines = [(first + i, l[4:]) for i, l in enumerate(m.group(1).split("\n"))
             if l.startswith("    ") and l.strip()]
    return _joined(lines)


def inventory():
    """(kind, "file:line", command, reason) of every launch line."""
    files = [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
    found = []
    for path in files:
        found += [(path, n, c) for n, c in _markdown(path)]
    for path in sorted(glob.glob(os.path.join(ROOT, "examples", "*.py"))):
        found += [(path, n, c) for n, c in _docstring(path)]
    out = []
    for path, n, cmd in found:
        m = LAUNCH.match(cmd)
        if m is None:
            continue
        where = "%s:%d" % (os.path.relpath(path, ROOT), n)
        if m.group(1) == "srun":
            out.append(("srun", where, cmd, "needs a Slurm cluster: tests/slurm_test.sh runs it"))
        elif "netns_cluster.sh" in m.group(1):
            out.append(("cluster", where, cmd,
                        "needs the namespace cluster (root, scripts/netns_cluster.sh up): "
                        "make test-cluster runs the tools on one"))
        else:
            out.append(("run", where, cmd, ""))
    return out


def test_env(venv):
    e = dict(os.environ)
    if os.geteuid() == 0:
        e.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                 OMPI_MCA_rmaps_base_oversubscribe="1")
    e["PATH"] = os.path.join(venv, "bin") + os.pathsep + e.get("PATH", "")
    # Until zpp is pip-installed into the venv, the README's way of
    # running from the tree: the package and the library of build/.
    e["PYTHONPATH"] = os.path.join(ROOT, "python") + (
        os.pathsep + e["PYTHONPATH"] if e.get("PYTHONPATH") else "")
    e["ZPP_LIBRARY"] = os.path.join(ROOT, "build", "libzpp.so")
    e["OMPI_MCA_mpi_yield_when_idle"] = "1"  # 2 cores, up to 8 ranks
    return e


def run_line(cmd, env, timeout):
    """(ok, seconds, output) of one line, as printed, from the root."""
    t0 = time.monotonic()
    try:
        p = subprocess.run(["bash", "-c", cmd], cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=timeout, start_new_session=True)
        return p.returncode == 0, time.monotonic() - t0, "exit %d\n%s" % (p.returncode, p.stdout)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        return False, time.monotonic() - t0, "timed out after %g s\n%s" % (timeout, out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--list", nargs="?", const="all", choices=["all", "run", "srun", "cluster"])
    ap.add_argument("--venv", default=os.path.join(ROOT, ".venv-torch"))
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per line")
    a = ap.parse_args()
    lines = inventory()
    if a.list:
        for kind, where, cmd, _ in lines:
            if a.list in ("all", kind):
                print(cmd if a.list != "all" else "%-8s %-32s %s" % (kind, where, cmd))
        return 0
    if len(lines) < MIN_LINES:
        print("launch_lines_test: only %d launch lines found (at least %d expected): the "
              "extraction no longer matches the documentation" % (len(lines), MIN_LINES))
        return 1
    if not os.path.isfile(os.path.join(ROOT, "build", "libzpp.so")):
        print("launch_lines_test: build/libzpp.so is missing: the printed lines name build/ "
              "(make build)")
        return 1
    if not os.access(os.path.join(a.venv, "bin", "python"), os.X_OK):
        print("launch_lines_test: no venv at %s (scripts/install-deps.sh --python)" % a.venv)
        return 1
    env = test_env(os.path.abspath(a.venv))
    # the runner itself: a line that fails must be reported as failing
    ok, _, _ = run_line("ZPP_TOPO=1x1 mpirun -np 1 false", env, 30)
    if ok:
        print("launch_lines_test: a failing mpirun line was not seen failing")
        return 1
    print("launch_lines_test: %d launch lines" % len(lines))
    failed, t_all = [], time.monotonic()
    for kind, where, cmd, why in lines:
        if kind != "run":
            print("  SKIP %s: %s\n       %s" % (where, why, cmd))
            continue
        ok, secs, out = run_line(cmd, env, a.timeout)
        print("  %s %s (%.1f s)\n       %s" % ("ok  " if ok else "FAIL", where, secs, cmd),
              flush=True)
        if not ok:
            failed.append((where, cmd, out))
    for where, cmd, out in failed:
        print("\n--- FAILED %s: %s\n%s" % (where, cmd, out[-4000:]))
    ran = sum(1 for l in lines if l[0] == "run")
    print("launch_lines_test: %d passed, %d failed, %d skipped (%.0f s)"
          % (ran - len(failed), len(failed), len(lines) - ran, time.monotonic() - t_all))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
