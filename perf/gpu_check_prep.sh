#!/usr/bin/env bash
# Prepares, on THIS machine, what perf/gpu_check.sh needs on a GPU machine
# that reaches no network: GoogleTest's source and Debian's Open MPI
# (binaries, headers, libraries), unpacked under build-gpu-deps/ (git
# ignores build*/).  Then call the device tool with
#   carry: ["build-gpu-deps"]   command: bash perf/gpu_check.sh $OUT/gpu_check.md
# Needs apt-get (downloads the .deb files only; installs nothing here).
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
pkgs=(openmpi-bin openmpi-common libopenmpi3 libopenmpi-dev libhwloc15
      libevent-core-2.1-7 libevent-pthreads-2.1-7 libpmix2 libudev1
      libnl-3-200 libnl-route-3-200 libibverbs1 libfabric1 libpsm2-2
      libucx0 libnuma1 libxnvctrl0 libmunge2)
( cd "$dest/debs" && apt-get download "${pkgs[@]}" 2>&1 | tail -2 ) || true
rm -rf "$dest/mpi"
mkdir -p "$dest/mpi"
for d in "$dest"/debs/*.deb; do dpkg -x "$d" "$dest/mpi"; done
rm -rf "$dest/debs"
du -sh "$dest"
echo "ready: $dest (carry it to the device tool)"
