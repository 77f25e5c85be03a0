"""tests/launch_lines_test.py itself (make test-launch): what it counts as a
launch line, that every code line or span naming a launcher is classified,
the environment it adds, and that a line past its timeout leaves no
process behind."""
import importlib.util
import os
import time

import pytest

from conftest import ROOT, kill_group, run_bounded

_spec = importlib.util.spec_from_file_location("launch_lines_test",
                                               ROOT / "tests" / "launch_lines_test.py")
ll = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ll)


def _procs_with_args(args):
    """pids of the processes whose command line is exactly ``args``."""
    want = "\0".join(args).encode() + b"\0"
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open("/proc/%s/cmdline" % d, "rb") as f:
                    if f.read() == want:
                        out.append(int(d))
            except OSError:
                pass
    return out


def test_a_timed_out_line_leaves_no_process_behind():
    arg = "%.6f" % (100 + (os.getpid() % 1000) / 1000.0 + time.time() % 1 / 1e4)
    t0 = time.monotonic()
    ok, secs, out = ll.run_line("sleep %s & sleep %s; wait" % (arg, arg), dict(os.environ), 1.0)
    left = []
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        left = _procs_with_args(["sleep", arg])
        if not left:
            break
        time.sleep(0.1)
    for pid in left:  # (this test's own sleeps, by pid)
        os.kill(pid, 9)
    assert not ok and out.startswith("timed out after 1 s"), out
    assert left == [], "the line's processes outlived its timeout: %s" % left
    assert time.monotonic() - t0 < 30


def test_oversubscription_is_set_whoever_runs_it(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    e = ll.test_env("/nonexistent-venv")
    assert e["OMPI_MCA_rmaps_base_oversubscribe"] == "1"
    assert "OMPI_ALLOW_RUN_AS_ROOT" not in e or os.environ.get("OMPI_ALLOW_RUN_AS_ROOT")
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    e = ll.test_env("/nonexistent-venv")
    assert e["OMPI_ALLOW_RUN_AS_ROOT"] == "1" and e["OMPI_MCA_rmaps_base_oversubscribe"] == "1"


def test_the_documentation_is_classified_in_full():
    lines = ll.inventory()
    assert ll.check_inventory(lines) == []
    kinds = {k for k, *_ in lines}
    assert {"run", "srun", "cluster", "mention", "allowed"} <= kinds, kinds


def _doc(tmp_path, text):
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text(text)
    return ll.inventory(str(tmp_path))


def test_forms_of_launch_lines_are_recognised(tmp_path):
    lines = _doc(tmp_path, "\n".join([
        "```sh",
        "$ mpirun -np 2 build/tools/zpp-topo",
        "env ZPP_TOPO=1x2 mpirun -np 2 build/tools/zpp-topo",
        ".venv-torch/bin/torchrun --nproc-per-node 2 x.py",
        "A=1 B=2 \\",
        "  srun -n 2 x",
        "mpiexec -n 2 y",
        "# a comment naming mpirun",
        "```",
        "Run `ZPP_TOPO=1x2 mpirun -np 2 build/tools/zpp-topo` or name `srun`.",
        "```python",
        "zpp.init_process_group()  # torchrun",
        "```",
    ]))
    got = [(k, " ".join(c.split())) for k, _, c, _ in lines]
    assert got == [
        ("run", "mpirun -np 2 build/tools/zpp-topo"),
        ("run", "env ZPP_TOPO=1x2 mpirun -np 2 build/tools/zpp-topo"),
        ("run", ".venv-torch/bin/torchrun --nproc-per-node 2 x.py"),
        ("srun", "A=1 B=2 srun -n 2 x"),
        ("run", "mpiexec -n 2 y"),
        ("mention", "# a comment naming mpirun"),
        ("mention", "zpp.init_process_group() # torchrun"),
        ("run", "ZPP_TOPO=1x2 mpirun -np 2 build/tools/zpp-topo"),
        ("mention", "srun"),
    ], got


@pytest.mark.parametrize("text", [
    "Then `cd build && mpirun -np 2 ./t` runs it.",            # inline, not a launch form
    "```sh\nsudo mpirun -np 2 x\n```",                          # code line, not a launch form
    "```\nOMPI_X=1 ./wrapper mpirun\n```",
])
def test_a_line_naming_a_launcher_in_no_known_form_fails(tmp_path, text):
    lines = _doc(tmp_path, text + "\n")
    bad = ll.check_inventory(lines)
    assert any("mentions a launcher but is no launch line this test knows" in b for b in bad), bad


def test_stale_allowed_entry_and_too_few_lines_fail(tmp_path):
    bad = ll.check_inventory(_doc(tmp_path, "nothing here\n"))
    assert any("ALLOWED entry" in b for b in bad), bad
    assert any("only 0 run lines found" in b for b in bad), bad


def test_bounded_runner_of_the_python_tests_ends_the_group():
    """conftest.run_bounded, which the multi-rank tests use: past its
    timeout the command's whole session goes, not only the command."""
    arg = "%.6f" % (200 + time.time() % 1)
    import subprocess

    with pytest.raises(subprocess.TimeoutExpired):
        run_bounded(["bash", "-c", "sleep %s & sleep %s; wait" % (arg, arg)], 1.0)
    left = []
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        left = _procs_with_args(["sleep", arg])
        if not left:
            break
        time.sleep(0.1)
    for pid in left:
        os.kill(pid, 9)
    assert left == []
    assert kill_group is not None
