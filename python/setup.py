"""Copies zpp's public headers (always) and libzpp (when ZPP_LIBRARY names
it at install time, or build/libzpp.so exists) into the package, so that
the installed package finds both beside it (zpp/_lib.py)."""

import os
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
SRC = HERE.parent


class BuildPy(build_py):
    def run(self):
        super().run()
        dst = Path(self.build_lib) / "zpp"
        inc = SRC / "include" / "zpp"
        if inc.is_dir():
            (dst / "include" / "zpp").mkdir(parents=True, exist_ok=True)
            for h in inc.glob("*.h"):
                shutil.copy2(h, dst / "include" / "zpp" / h.name)
        lib = os.environ.get("ZPP_LIBRARY") or str(SRC / "build" / "libzpp.so")
        if Path(lib).is_file():
            shutil.copy2(Path(lib).resolve(), dst / "libzpp.so")


setup(cmdclass={"build_py": BuildPy})
