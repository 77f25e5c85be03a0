#!/usr/bin/env bash
# Prepares, on THIS machine, what perf/gpu_check.sh needs on a GPU machine
# that reaches no network, under build-gpu-deps/ (git ignores build*/):
#   googletest/  GoogleTest's source (from /usr/src/googletest)
#   mpi/         Debian's Open MPI and UCX, unpacked: binaries, headers,
#                libraries (not installed: gpu_check.sh points the paths there;
#                UCX's headers, libucx-dev, let libzpp build its UCX backend
#                on a machine that has none)
#   wheels/      the Python packages zpp's bindings need that the GPU image
#                lacks (cffi, pycparser; pinned as in python/requirements.txt),
#                for its python3 (CPython 3.12, x86-64)
# Then call the device tool with
#   carry: ["build-gpu-deps"]   command: bash perf/gpu_check.sh $OUT/gpu_check.md
#   timeout_s: 540
# It must stay under the 64 MiB a call may carry with the working tree; the
# size is printed at the end.
# Needs apt-get (downloads the .deb files only; installs nothing here) and
# pip (downloads the wheels only).
# Usage: bash perf/gpu_check_prep.sh
set -euo pipefail
cd "$(dirname "$0")/.."
dest=build-gpu-deps
mkdir -p "$dest/debs"
if [ -d /usr/src/googletest ] && [ ! -d "$dest/googletest" ]; then
  cp -r /usr/src/googletest "$dest/"
fi
# Open MPI and the libraries its library and launcher load (the set that
# `ldd` shows for libmpi.so.40 and orterun, plus the MCA plugins' common
# needs); plugins whose libraries are missing are skipped by Open MPI.
# libucx0 also serves zpp's UCX backend (the FSDP2 step without mpirun),
# which is compiled only where <ucp/api/ucp.h> is found: libucx-dev.
pkgs=(openmpi-bin openmpi-common libopenmpi3 libopenmpi-dev libhwloc15
      libevent-core-2.1-7 libevent-pthreads-2.1-7 libpmix2 libudev1
      libnl-3-200 libnl-route-3-200 libibverbs1 libfabric1 libpsm2-2
      libucx0 libucx-dev libnuma1 libxnvctrl0 libmunge2)
( cd "$dest/debs" && apt-get download "${pkgs[@]}" 2>&1 | tail -2 ) || true
rm -rf "$dest/mpi"
mkdir -p "$dest/mpi"
for d in "$dest"/debs/*.deb; do dpkg -x "$d" "$dest/mpi"; done
rm -rf "$dest/debs"
# the wheels: the versions python/requirements.txt pins, built for the GPU
# image's python3 (pip matches each manylinux tag exactly, so several)
mapfile -t wheels < <(grep -E '^(cffi|pycparser)==' python/requirements.txt)
rm -rf "$dest/wheels"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux1_x86_64 -d "$dest/wheels" "${wheels[@]}"
ls "$dest/wheels"
du -sh "$dest"
echo "ready: $dest (carry it to the device tool)"
