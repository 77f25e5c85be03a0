#!/usr/bin/env python3
"""Every launch line the documentation prints runs as printed.

A launch line starts ranks: a command (after an optional `$ ` prompt, an
optional `env`, and any VAR=value prefixes) that begins with mpirun,
mpiexec, torchrun or srun (also by a path, e.g. .venv-torch/bin/torchrun),
`python3 tests/launch_env.py` (started the way torchrun starts workers) or
`scripts/netns_cluster.sh run`.  They are taken from the fenced code blocks
and the inline code spans of README.md and docs/*.md (not docs/lab/, not
docs/generated/), and from the indented example blocks of the examples'
module docstrings (examples/*.py), continuation lines (a trailing
backslash) joined.

Every code line and inline code span there that mentions mpirun, mpiexec,
torchrun or srun is classified, and the test fails on one that is not:
  run       a launch line this test runs
  srun      a launch line that needs Slurm: tests/slurm_test.sh runs it
            (it asks for them with --list srun)
  cluster   a launch line of the namespace cluster: listed, not run as
            printed (make test-cluster runs the same tools through
            scripts/netns_cluster.sh)
  mention   not a launch line, by rule: a span of the launcher's name
            alone, a comment line of a shell block, a line of a C or Python
            block
  allowed   not run, by the ALLOWED list below, each with its reason
            (a template, a failure the text describes, ...)
An ALLOWED entry that no longer matches a line fails the test too, and
each of run, srun and cluster must have at least MIN_LINES[kind] distinct
lines.

Each line to run runs exactly as printed (a leading `$ ` prompt left out;
a line printed in several places runs once),
from the repository's root, through bash, with only environment added:
  - OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 (as root;
    README: "as root, mpirun needs --allow-run-as-root --oversubscribe")
    and OMPI_MCA_rmaps_base_oversubscribe=1 (always: the lines start more
    ranks than this machine may have cores);
  - PATH starts with the venv's bin/, so `python` and `torchrun` are the
    venv's;
  - where zpp is not installed in the venv (make test gives the venv of
    make test-wheel, where `pip install .` put it, and sets nothing else),
    PYTHONPATH=python and ZPP_LIBRARY=build/libzpp.so, as the README's
    "run from the tree" says; where it is installed, neither is set (and
    inherited ones are dropped), so the lines use the install.
The lines name build/: the build directory must be build/.  A line that
runs past --timeout is ended with its whole process group (SIGTERM, then
SIGKILL).

  tests/launch_lines_test.py [--venv DIR] [--timeout S]   run them
  tests/launch_lines_test.py --list [KIND]   print the lines (KIND: run,
                                             srun, cluster, mention,
                                             allowed; default all)

Exit status: 0 when every line is classified and every line to run exited
0; 1 otherwise, naming each failing or unclassified line (file:line) with
the end of its output.
"""
import argparse
import glob
import os
import re
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROMPT = re.compile(r"^\$\s+")
LAUNCH = re.compile(r"^(?:env\s+(?:-\S+\s+)*)?(?:[A-Za-z_][A-Za-z0-9_]*=\S*\s+)*"
                    r"(?:\S*/)?(mpirun|mpiexec|torchrun|srun|python3? tests/launch_env\.py|"
                    r"scripts/netns_cluster\.sh\s+run)(?=\s|$)")
MENTION = re.compile(r"\b(mpirun|mpiexec|torchrun|srun)\b")
SHELL = ("", "sh", "bash", "shell", "console")
# at least this many distinct lines of each kind: fewer means the
# extraction broke (or the documentation lost its examples), and a test
# that finds nothing passes
MIN_LINES = {"run": 8, "srun": 2, "cluster": 1}
# Lines that mention a launcher and are not run: (file, the text's start,
# why).  The text is the line or span as printed (continuations joined,
# whitespace runs made one space).
ALLOWED = [
    ("docs/collectives.md", "ZPP_TOPO=2x4 mpirun -np 8 zpp-bench --coll reducescatter",
     "a measurement (8 ranks, up to 16 MiB, 4 variants) with the installed zpp-bench; "
     "README.md's build/perf/zpp-bench lines run the same tool"),
    ("docs/design.md", "UCX_TLS=posix,self ZPP_BACKEND=ucx ZPP_TOPO=2x2 mpirun",
     "the text describes this line failing (UCX's shared-memory transports)"),
    ("docs/design.md", "mpirun --enable-recovery",
     "an Open MPI option named in the text"),
    ("docs/design.md", "ZPP_BACKEND=ucx ZPP_TOPO=2x2 tests/fault_inject.sh kill",
     "tests/fault_inject.sh's arguments (mpirun is one); make test-fault runs it"),
    ("docs/runtime.md", "mpirun -np 4 ./example",
     "the reader's own program, built against an installed zpp"),
    ("docs/runtime.md", "ZPP_TOPO=2x2 mpirun -np 4 zpp-train --mode zeropp --qgz 4 FLAGS",
     "a template (FLAGS, S) of a 200-step study"),
]


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
    """(line, text, what) of the fenced code blocks' lines ("shell" or
    "code") and of the inline code spans ("span")."""
    block, lang, out, prose = [], None, [], []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            s = line.strip()
            if s.startswith("```"):
                if lang is None:
                    lang, block = s[3:].strip(), []
                else:
                    what = "shell" if lang in SHELL else "code"
                    out += [(m, t, what) for m, t in _joined(block)]
                    lang = None
                prose.append("")
                continue
            if lang is not None:
                block.append((n, line.rstrip("\n")))
                prose.append("")
            else:
                prose.append(line.rstrip("\n"))
    text = "\n".join(prose)
    for m in re.finditer(r"(`+)(.+?)\1", text, re.S):
        span = " ".join(m.group(2).split())
        out.append((text[:m.start()].count("\n") + 1, span, "span"))
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
    return [(n, t, "shell") for n, t in _joined(lines)]


def _classify(rel, cmd, what):
    """(kind, the command to run or list, reason); kind None: a line that
    mentions a launcher and fits no rule."""
    bare = PROMPT.sub("", cmd) if what != "code" else cmd
    m = LAUNCH.match(bare) if what != "code" else None
    flat = " ".join(cmd.split())
    for f, start, why in ALLOWED:
        if rel == f and flat.startswith(start):
            return "allowed", flat, why
    if what == "span" and MENTION.fullmatch(flat):
        return "mention", flat, "the launcher's name in the text"
    if m is not None:
        if m.group(1) == "srun":
            return "srun", bare, "needs a Slurm cluster: tests/slurm_test.sh runs it"
        if "netns_cluster.sh" in m.group(1):
            return ("cluster", bare, "needs the namespace cluster (root, scripts/netns_cluster.sh "
                    "up): make test-cluster runs the tools on one")
        return "run", bare, ""
    if what == "shell" and flat.startswith("#"):
        return "mention", flat, "a comment of a shell block"
    if what == "code":
        return "mention", flat, "a line of a C or Python block"
    return None, flat, "mentions a launcher but is no launch line this test knows"


def inventory(root=ROOT):
    """(kind, "file:line", command, reason) of every line that mentions a
    launcher; kind None: unclassified."""
    files = [os.path.join(root, "README.md")] + sorted(glob.glob(os.path.join(root, "docs", "*.md")))
    found = []
    for path in files:
        if os.path.isfile(path):
            found += [(path, n, c, w) for n, c, w in _markdown(path)]
    for path in sorted(glob.glob(os.path.join(root, "examples", "*.py"))):
        found += [(path, n, c, w) for n, c, w in _docstring(path)]
    out = []
    for path, n, cmd, what in found:
        if not MENTION.search(cmd) and LAUNCH.match(PROMPT.sub("", cmd)) is None:
            continue
        rel = os.path.relpath(path, root)
        kind, text, why = _classify(rel, cmd, what)
        out.append((kind, "%s:%d" % (rel, n), text, why))
    return out


def check_inventory(lines):
    """What is wrong with the inventory: unclassified lines, ALLOWED
    entries that match nothing, kinds below their minimum."""
    bad = ["%s: %s: %s" % (where, why, cmd) for kind, where, cmd, why in lines if kind is None]
    for f, start, _ in ALLOWED:
        if not any(k == "allowed" and w.startswith(f + ":") and c.startswith(start)
                   for k, w, c, _ in lines):
            bad.append("ALLOWED entry (%s, %r) matches no line" % (f, start))
    for kind, least in MIN_LINES.items():
        # distinct commands: a line printed in several places runs once
        n = len({l[2] for l in lines if l[0] == kind})
        if n < least:
            bad.append("only %d %s lines found (distinct, at least %d expected): the "
                       "extraction no longer matches the documentation" % (n, kind, least))
    return bad


def installed(venv):
    """Whether the venv's python imports zpp from its own site-packages
    (with a clean environment, away from the tree), with its library
    beside it."""
    e = {k: v for k, v in os.environ.items()
         if k not in ("PYTHONPATH", "ZPP_LIBRARY", "ZPP_INCLUDE_DIR", "ZPP_BUILD_DIR")}
    code = ("import os, sys, zpp; d = os.path.dirname(zpp.__file__); "
            "sys.exit(0 if d.startswith(sys.prefix) and "
            "os.path.isfile(os.path.join(d, 'libzpp.so')) else 1)")
    try:
        r = subprocess.run([os.path.join(venv, "bin", "python"), "-c", code], env=e,
                           cwd="/", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           timeout=60)
    except (OSError, subprocess.TimeoutExpired):  # no such venv, or stuck
        return False
    return r.returncode == 0


def test_env(venv):
    e = dict(os.environ)
    if os.geteuid() == 0:
        e.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    # the lines start up to 8 ranks, whatever the machine's cores
    e["OMPI_MCA_rmaps_base_oversubscribe"] = "1"
    e["PATH"] = os.path.join(venv, "bin") + os.pathsep + e.get("PATH", "")
    if installed(venv):
        # `pip install .` put zpp in the venv: the lines run on the install
        for k in ("PYTHONPATH", "ZPP_LIBRARY", "ZPP_INCLUDE_DIR", "ZPP_BUILD_DIR"):
            e.pop(k, None)
    else:
        # the README's way of running from the tree: the package and the
        # library of build/
        e["PYTHONPATH"] = os.path.join(ROOT, "python") + (
            os.pathsep + e["PYTHONPATH"] if e.get("PYTHONPATH") else "")
        e["ZPP_LIBRARY"] = os.path.join(ROOT, "build", "libzpp.so")
    e["OMPI_MCA_mpi_yield_when_idle"] = "1"  # 2 cores, up to 8 ranks
    return e


def _end_group(p, grace=10.0):
    """SIGTERM to the line's process group, up to ``grace`` s, then
    SIGKILL (up to 5 s more)."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            return
        t0 = time.monotonic()
        while time.monotonic() - t0 < wait:
            p.poll()  # reaps bash itself
            try:
                os.killpg(p.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)


def run_line(cmd, env, timeout):
    """(ok, seconds, output) of one line, as printed, from the root; past
    ``timeout`` every process the line started is ended."""
    t0 = time.monotonic()
    with subprocess.Popen(["bash", "-c", cmd], cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          errors="replace", start_new_session=True) as p:
        try:
            out, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _end_group(p)
            out, _ = p.communicate()
            return False, time.monotonic() - t0, "timed out after %g s\n%s" % (timeout, out)
        _end_group(p, grace=1.0)  # what the line left running
        return p.returncode == 0, time.monotonic() - t0, "exit %d\n%s" % (p.returncode, out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--list", nargs="?", const="all",
                    choices=["all", "run", "srun", "cluster", "mention", "allowed"])
    ap.add_argument("--venv", default=os.path.join(ROOT, ".venv-torch"))
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per line")
    a = ap.parse_args()
    lines = inventory()
    if a.list:
        for kind, where, cmd, why in lines:
            if a.list == "all":
                print("%-8s %-32s %s%s" % (kind or "UNCLASSIFIED", where, cmd,
                                           "\n%42s(%s)" % ("", why) if why else ""))
            elif a.list == kind:
                print(cmd)
        return 0
    bad = check_inventory(lines)
    if bad:
        print("launch_lines_test: the inventory is wrong:\n  " + "\n  ".join(bad))
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
    counts = {}
    for l in lines:
        counts[l[0]] = counts.get(l[0], 0) + 1
    print("launch_lines_test: %d lines mention a launcher (%s)"
          % (len(lines), ", ".join("%d %s" % (v, k) for k, v in sorted(counts.items()))))
    failed, t_all = [], time.monotonic()
    done = {}  # a line printed in several places runs once (same root, same env)
    for kind, where, cmd, why in lines:
        if kind != "run":
            print("  SKIP %s %s: %s\n       %s" % (kind, where, why, cmd))
            continue
        if cmd in done:
            ok, first, out = done[cmd]
            print("  %s %s (the line of %s, run once)\n       %s"
                  % ("ok  " if ok else "FAIL", where, first, cmd), flush=True)
            if not ok:
                failed.append((where, cmd, out))
            continue
        ok, secs, out = run_line(cmd, env, a.timeout)
        done[cmd] = (ok, where, out)
        print("  %s %s (%.1f s)\n       %s" % ("ok  " if ok else "FAIL", where, secs, cmd),
              flush=True)
        if not ok:
            failed.append((where, cmd, out))
    for where, cmd, out in failed:
        print("\n--- FAILED %s: %s\n%s" % (where, cmd, out[-4000:]))
    ran = counts.get("run", 0)
    print("launch_lines_test: %d passed, %d failed, %d not run (listed above with why) (%.0f s)"
          % (ran - len(failed), len(failed), len(lines) - ran, time.monotonic() - t_all))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
