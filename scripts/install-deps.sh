#!/usr/bin/env bash
# Installs the Debian packages zpp needs to build and test, when they are
# missing.  As root it installs them with apt-get; otherwise it lists the
# missing ones and fails.  The CUDA toolkit (with NCCL) is not a Debian
# package here: it is used from /usr/local/cuda when present and skipped
# otherwise (ZPP_WITH_CUDA=AUTO).  ccache, ninja-build, slurm-wlm and
# munge are optional: installed as root, else a note and the build goes on
# without them.
#
# --python: also the Python environment of the bindings' tests and of the
# FSDP2 demo: the wheels of the pinned python/requirements.txt downloaded
# once into .wheelhouse/ (about 1.1 GB; the fresh venvs of make test-wheel
# install from there too), and a venv in .venv-torch/ installed from them
# with --no-index (2 GB on disk).  Needs a python3 >= 3.11 (the pins are
# for it).  Idempotent: a wheelhouse and a venv whose stamps match the
# requirements file are left alone (< 1 s).
set -euo pipefail
python_env=0
[ "${1:-}" = "--python" ] && python_env=1

# pip without the user's settings that change where packages come from or
# go: PIP_FIND_LINKS adds to --find-links, PIP_NO_INDEX stops a download,
# PIP_USER, PIP_TARGET and PIP_PREFIX send a venv's installs elsewhere or
# make them fail.  pip.conf (proxy, certificates, index) stays for the
# download; the installs from the wheelhouse read no configuration at all.
pip_clean() {
  env -u PIP_FIND_LINKS -u PIP_USER -u PIP_TARGET -u PIP_PREFIX -u PIP_NO_INDEX "$@"
}

# The stamp of a wheelhouse: the requirements' hash and the interpreter the
# wheels are for (tests/wheel/run.sh computes the same to check it).
wheelhouse_stamp() {
  echo "$(sha256sum "$1" | cut -d' ' -f1) $(python3 -c \
    'import sys, sysconfig; print(sys.implementation.cache_tag, sysconfig.get_platform())')"
}

install_python_env() {
  local root venv req house stamp want have_venv=0
  root=$(cd "$(dirname "$0")/.." && pwd)
  venv="$root/.venv-torch"
  req="$root/python/requirements.txt"
  house="$root/.wheelhouse"
  stamp="$venv/.zpp-requirements.sha256"
  if ! python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    echo "zpp: $(command -v python3) is Python $(python3 -c 'import platform; print(platform.python_version())'):" \
      "the pins of $req need Python >= 3.11 (put a python3 >= 3.11 first on PATH)" >&2
    return 1
  fi
  want=$(sha256sum "$req" | cut -d' ' -f1)
  [ -x "$venv/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ] && have_venv=1
  if [ "$have_venv" = 1 ] &&
     [ "$(cat "$house/.zpp-wheelhouse" 2>/dev/null)" = "$(wheelhouse_stamp "$req")" ]; then
    return 0
  fi
  if [ "$have_venv" = 0 ]; then
    echo "zpp: making the Python environment $venv (pinned: $req)"
    python3 -m venv --clear "$venv"
  fi
  if [ "$(cat "$house/.zpp-wheelhouse" 2>/dev/null)" != "$(wheelhouse_stamp "$req")" ]; then
    echo "zpp: downloading the wheels of $req into $house (about 1.1 GB)"
    rm -rf "$house" "$house.partial"
    pip_clean "$venv/bin/pip" download -q --disable-pip-version-check --no-cache-dir \
      --no-deps -d "$house.partial" -r "$req"
    wheelhouse_stamp "$req" > "$house.partial/.zpp-wheelhouse"
    mv "$house.partial" "$house"
  fi
  if [ "$have_venv" = 0 ]; then
    pip_clean PIP_CONFIG_FILE=/dev/null "$venv/bin/pip" install -q --disable-pip-version-check \
      --no-index --find-links "$house" --no-deps -r "$req"
    # fails loudly if incomplete
    "$venv/bin/python" -c "import torch, numpy, cffi, pytest, scikit_build_core"
    echo "$want" > "$stamp"
  fi
}
# matplotlib for the python3 on PATH: perf/bandwidth_study.sh draws its
# plots with it and refuses to start without it, and make test runs the
# study's own tests (tests/bandwidth_study_timeout_test.sh).  From PyPI,
# pinned; where that python3 takes no pip installs (a Debian system
# python, PEP 668) Debian's python3-matplotlib, as root.
install_matplotlib() {
  python3 -c 'import matplotlib' 2>/dev/null && return 0
  echo "zpp: installing matplotlib for $(command -v python3)"
  if ! python3 -m pip install -q --disable-pip-version-check \
       'matplotlib==3.9.2' 2>/dev/null; then
    if [ "$(id -u)" -ne 0 ]; then
      echo "zpp: run as root, or: python3 -m pip install matplotlib" >&2
      return 1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
      --no-install-recommends python3-matplotlib
  fi
  python3 -c 'import matplotlib' # fails loudly if still missing
}

# slurm-wlm (slurmctld, slurmd, srun, sinfo) and munge: tests/slurm_test.sh
# (make test-slurm) starts a one-node Slurm of its own on this machine (its
# own slurm.conf, ports and munge socket; the packages' services are not
# used).  As root only: without them that test says why and is skipped.
install_slurm() {
  local p missing=()
  for p in slurm-wlm munge; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" \
      || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" -ne 0 ]; then
    echo "zpp: ${missing[*]} not installed (not root): make test-slurm will be skipped"
    return 0
  fi
  echo "zpp: installing ${missing[*]} (make test-slurm)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
    "${missing[@]}" || {
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      "${missing[@]}"
  }
}
install_slurm

# ccache (tools/ccache_launcher.sh; the wheel's build, make test-wheel,
# takes the library's objects that build/ compiled from it) and
# ninja-build (the wheel's CMake generator; else make): optional, as root
# only.
install_optional_build_tools() {
  local p missing=()
  for p in ccache ninja-build; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" \
      || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" -ne 0 ]; then
    echo "zpp: ${missing[*]} not installed (not root): builds go on without them" \
      "(no compiler cache; the wheel's CMake uses make)"
    return 0
  fi
  echo "zpp: installing ${missing[*]} (compiler cache, the wheel's generator)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
    "${missing[@]}" || {
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      "${missing[@]}" || echo "zpp: ${missing[*]} could not be installed: builds go on without them"
  }
}
install_optional_build_tools

# cmake: also the build tool of the Python wheel (pyproject.toml; its
# Python half, scikit-build-core, is pinned in python/requirements.txt).
# iproute2 (ip, tc) and util-linux (unshare,
# flock): the namespace cluster
# of scripts/netns_cluster.sh (make test-cluster).  clang and its runtime
# libraries (libFuzzer, the sanitizers) build the fuzz targets of
# tests/fuzz (make test-fuzz).
pkgs=(cmake make gcc g++ pkg-config libopenmpi-dev openmpi-bin libucx-dev
      libgtest-dev googletest python3 python3-venv iproute2 util-linux clang
      libclang-rt-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" \
    || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  install_matplotlib
  [ "$python_env" = 1 ] && install_python_env
  exit 0
fi
echo "zpp: missing packages: ${missing[*]}"
if [ "$(id -u)" -ne 0 ]; then
  echo "zpp: run as root, or: sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends "${missing[@]}"
install_matplotlib
[ "$python_env" = 1 ] && install_python_env
exit 0
