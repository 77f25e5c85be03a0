"""tests/launch_lines_test.py's minimum counts distinct commands: a line
printed in several places runs once, so it counts once."""
import importlib.util

from conftest import ROOT

_spec = importlib.util.spec_from_file_location("launch_lines_test",
                                               ROOT / "tests" / "launch_lines_test.py")
ll = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ll)


def _lines(cmds):
    return [("run", "README.md:%d" % i, c, "") for i, c in enumerate(cmds, 1)]


def test_a_line_printed_twice_counts_once():
    least = ll.MIN_LINES["run"]
    cmds = ["mpirun -np %d ./a" % i for i in range(least - 1)]
    bad = ll.check_inventory(_lines(cmds + cmds[:1]))
    assert any("only %d run lines found" % (least - 1) in b for b in bad), bad
    bad = ll.check_inventory(_lines(cmds + ["mpirun -np 99 ./a"]))
    assert not any(" run lines found" in b for b in bad), bad
