"""`python -m zpp` on bad input, and where the bindings take the headers
from (zpp/_lib.py, _include_candidates), in the layout `pip install .`
makes: a copy of the package with libzpp.so and the headers inside it,
run in a subprocess with no source tree on the path."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import LIB, ROOT

# the variables that point the bindings at a tree or a library
_ZPP_VARS = ("ZPP_LIBRARY", "PYTHONPATH", "ZPP_INCLUDE_DIR", "ZPP_BUILD_DIR")


@pytest.fixture
def site(tmp_path):
    """An installed zpp: site/zpp with libzpp.so and include/zpp/*.h."""
    site = (tmp_path / "site").resolve()
    pkg = site / "zpp"
    shutil.copytree(ROOT / "python" / "zpp", pkg, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(LIB, pkg / "libzpp.so")
    shutil.copytree(ROOT / "include" / "zpp", pkg / "include" / "zpp")
    return site


def zpp_main(site: Path, *args, **env) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items()
         if k not in _ZPP_VARS and k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
         and not k.startswith("OMPI_")}
    e["PYTHONPATH"] = str(site)
    e.update(env)
    return subprocess.run([sys.executable, "-m", "zpp", *args], env=e, capture_output=True,
                          text=True, cwd=site.parent, timeout=60)


def test_unknown_argument_is_rejected_before_the_library_loads(site):
    # no library anywhere: the usage error must still come first
    for args in (["--bogus"], ["--json", "--bogus"]):
        p = zpp_main(site, *args, ZPP_LIBRARY=str(site / "nope.so"))
        assert p.returncode == 2, p
        assert p.stderr == "python -m zpp: unknown argument '--bogus' (--json, --help)\n"


def test_help_needs_no_library(site):
    p = zpp_main(site, "--help", ZPP_LIBRARY=str(site / "nope.so"))
    assert p.returncode == 0 and p.stdout.startswith("``python -m zpp``"), p


@pytest.mark.parametrize("args", [[], ["--json"]])
def test_load_failures_are_one_line_and_exit_1(site, args, tmp_path):
    not_elf = tmp_path / "not_elf.so"
    not_elf.write_text("not a shared library\n")
    # headers of another version than the library's (ImportError)
    other = tmp_path / "other_include"
    shutil.copytree(ROOT / "include" / "zpp", other / "zpp")
    h = other / "zpp" / "zpp.h"
    text = h.read_text()
    assert "#define ZPP_VERSION_MINOR " in text
    h.write_text(text.replace("#define ZPP_VERSION_MINOR ", "#define ZPP_VERSION_MINOR 9"))
    cases = [
        ({"ZPP_LIBRARY": str(site / "nope.so")}, "ZPP_LIBRARY=%s: no such file" % (site / "nope.so")),
        ({"ZPP_LIBRARY": str(not_elf)}, str(not_elf)),
        ({"ZPP_INCLUDE_DIR": str(other)}, "install the package from the same source tree"),
    ]
    # no library beside the package either
    bare = tmp_path / "bare"
    shutil.copytree(site / "zpp", bare / "zpp", ignore=shutil.ignore_patterns("libzpp.so"))
    cases.append(({}, "libzpp not found beside the package"))
    for i, (env, want) in enumerate(cases):
        p = zpp_main(bare if i == 3 else site, *args, **env)
        assert p.returncode == 1, (env, p)
        assert p.stderr.startswith("python -m zpp: ") and want in p.stderr, (env, p.stderr)
        assert "Traceback" not in p.stderr and len(p.stderr.splitlines()) == 1, p.stderr
        assert p.stdout == ""


def test_launcher_variables_that_are_not_integers(site):
    for env, name, bad in (
            ({"RANK": "x", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"},
             "torchrun", "RANK='x'"),
            ({"OMPI_COMM_WORLD_SIZE": "two", "OMPI_COMM_WORLD_RANK": "1"}, "mpirun",
             "OMPI_COMM_WORLD_SIZE='two'")):
        p = zpp_main(site, "--json", **env)
        assert p.returncode == 0, p.stderr
        la = json.loads(p.stdout)["runtime"]["launcher"]
        assert la["name"] == name and bad in la["bad"], la
        assert (la["rank"], la["size"]) == ((None, 2) if name == "torchrun" else (1, None)), la
        p = zpp_main(site, **env)
        assert p.returncode == 0, p.stderr
        assert "launcher: %s, rank " % name in p.stdout and bad in p.stdout, p.stdout


def _tree(at: Path) -> Path:
    """A source tree's include/ and a build/libzpp.so in it."""
    shutil.copytree(ROOT / "include" / "zpp", at / "include" / "zpp")
    (at / "build").mkdir()
    shutil.copy2(LIB, at / "build" / "libzpp.so")
    return at


def test_headers_come_from_the_library_s_tree_when_zpp_library_is_set(site, tmp_path):
    def headers(**env):
        p = zpp_main(site, "--json", **env)
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout)["headers"]

    pkg_inc = str(site / "zpp" / "include")
    tree = _tree(tmp_path / "tree")
    lib = str(tree / "build" / "libzpp.so")
    # the package's own library: the package's headers
    assert headers() == pkg_inc
    # ZPP_LIBRARY in a build directory of a tree: that tree's headers, not
    # the package's
    assert headers(ZPP_LIBRARY=lib) == str(tree / "include")
    # ZPP_BUILD_DIR: the source directory its CMake cache names
    other = _tree(tmp_path / "other")
    b = tmp_path / "b2"
    b.mkdir()
    (b / "CMakeCache.txt").write_text("CMAKE_HOME_DIRECTORY:INTERNAL=%s\n" % other)
    assert headers(ZPP_LIBRARY=lib, ZPP_BUILD_DIR=str(b)) == str(other / "include")
    # ZPP_INCLUDE_DIR before all of them
    assert headers(ZPP_LIBRARY=lib, ZPP_BUILD_DIR=str(b), ZPP_INCLUDE_DIR=str(tree / "include")) \
        == str(tree / "include")
    # a library outside any tree: the package's headers
    alone = tmp_path / "alone" / "x" / "y" / "z"
    alone.mkdir(parents=True)
    shutil.copy2(LIB, alone / "libzpp.so")
    assert headers(ZPP_LIBRARY=str(alone / "libzpp.so")) == pkg_inc
