#!/usr/bin/env bash
# Installs the Debian packages zpp needs to build and test, when they are
# missing.  As root it installs them with apt-get; otherwise it lists the
# missing ones and fails.  The CUDA toolkit (with NCCL) is not a Debian
# package here: it is used from /usr/local/cuda when present and skipped
# otherwise (ZPP_WITH_CUDA=AUTO).
#
# --python: also the Python environment of the bindings' tests and of the
# FSDP2 demo, a venv in .venv-torch/ with the pinned python/requirements.txt
# (torch from PyPI, about 1 GB to download, 2 GB on disk).  Idempotent: a
# venv whose stamp matches the requirements file is left alone (< 1 s).
set -euo pipefail
python_env=0
[ "${1:-}" = "--python" ] && python_env=1

install_python_env() {
  local root venv req stamp want
  root=$(cd "$(dirname "$0")/.." && pwd)
  venv="$root/.venv-torch"
  req="$root/python/requirements.txt"
  stamp="$venv/.zpp-requirements.sha256"
  want=$(sha256sum "$req" | cut -d' ' -f1)
  if [ -x "$venv/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
    return 0
  fi
  echo "zpp: installing the Python environment into $venv (pinned: $req)"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check --no-deps -r "$req"
  "$venv/bin/python" -c "import torch, numpy, cffi, pytest" # fails loudly if incomplete
  echo "$want" > "$stamp"
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

# ccache: the wheel's build (make test-wheel) takes the library's objects
# that build/ compiled from it.  cmake and ninja-build: also the build
# tools of the Python wheel
# (pyproject.toml; its Python half, scikit-build-core, is pinned in
# python/requirements.txt).  iproute2 (ip, tc) and util-linux (unshare,
# flock): the namespace cluster
# of scripts/netns_cluster.sh (make test-cluster).  clang and its runtime
# libraries (libFuzzer, the sanitizers) build the fuzz targets of
# tests/fuzz (make test-fuzz).
pkgs=(cmake ninja-build ccache make gcc g++ pkg-config libopenmpi-dev openmpi-bin libucx-dev
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
