"""Parts of perf/gpu_check.sh that can run without a GPU, each function
taken from the script as it stands (its text between "NAME() {" and the
closing "}" at the start of a line) and run in bash:

- gtest_result reads a launch that timeout -k had to KILL (exit 137) as
  timed out, as one that ended on its TERM (124), and any other status
  as an exit with that status;
- install_wheels unpacks the carried wheels into the site folder when the
  python has no pip (a wheel is a zip of what goes into site-packages)."""

import os
import re
import subprocess
import sys
import zipfile

from conftest import ROOT

SCRIPT = ROOT / "perf" / "gpu_check.sh"


def _functions(*names) -> str:
    text = SCRIPT.read_text()
    out = []
    for n in names:
        m = re.search(r"^%s\(\) \{\n.*?^\}\n" % re.escape(n), text, re.S | re.M)
        assert m, "%s: no function %s()" % (SCRIPT, n)
        out.append(m.group(0))
    return "".join(out)


def _bash(script: str, **env) -> subprocess.CompletedProcess:
    e = dict(os.environ)
    e.update(env)
    return subprocess.run(["bash", "-c", script], env=e, capture_output=True, text=True,
                          timeout=60)


def test_gtest_result_reads_a_killed_launch_as_timed_out(tmp_path):
    log = tmp_path / "gtest.log"
    log.write_text("[  PASSED  ] 3 tests.\n[  FAILED  ] 1 test, listed below:\n")
    # a command that ignores TERM: timeout -k sends KILL a second later
    r = _bash(_functions("timed_out", "gtest_result") + """
timeout -k 1 1 bash -c 'trap "" TERM; sleep 20'
rc=$?
echo "rc=$rc"
gtest_result "$LOG" $rc
gtest_result "$LOG" 124
gtest_result "$LOG" 1
gtest_result "$LOG" 0
""", LOG=str(log))
    lines = r.stdout.splitlines()
    assert r.returncode == 0 and len(lines) == 5, (r.stdout, r.stderr)
    assert lines[0] == "rc=137", lines
    assert lines[1].startswith("3 passed, 1 failed, 0 skipped, **TIMED OUT**"), lines
    assert lines[2] == "3 passed, 1 failed, 0 skipped, **TIMED OUT**", lines
    assert lines[3] == "3 passed, 1 failed, 0 skipped, **exit 1**", lines
    assert lines[4] == "3 passed, 1 failed, 0 skipped", lines


def test_install_wheels_unzips_when_the_python_has_no_pip(tmp_path):
    # a wheel of one module, and a python whose "-m pip" fails as it does
    # where pip is not installed
    whl = tmp_path / "gpucheckprobe-1.0-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        z.writestr("gpucheckprobe/__init__.py", "ANSWER = 42\n")
        z.writestr("gpucheckprobe-1.0.dist-info/METADATA",
                   "Metadata-Version: 2.1\nName: gpucheckprobe\nVersion: 1.0\n")
    nopip = tmp_path / "python"
    nopip.write_text('#!/bin/sh\nif [ "$1" = -m ] && [ "$2" = pip ]; then\n'
                     '  echo "No module named pip" >&2; exit 1\nfi\nexec "%s" "$@"\n'
                     % sys.executable)
    nopip.chmod(0o755)
    site = tmp_path / "site"
    r = _bash(_functions("install_wheels") + 'install_wheels "$SITE" "$WHL"',
              PY=str(nopip), SITE=str(site), WHL=str(whl))
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert "has no pip" in r.stdout, r.stdout
    p = subprocess.run([str(nopip), "-c", "import gpucheckprobe; print(gpucheckprobe.ANSWER)"],
                       env=dict(os.environ, PYTHONPATH=str(site)), capture_output=True,
                       text=True, timeout=60)
    assert p.stdout.strip() == "42", (p.stdout, p.stderr)
