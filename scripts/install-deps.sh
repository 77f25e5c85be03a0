#!/usr/bin/env bash
# Installs the Debian packages zpp needs to build and test, when they are
# missing.  As root it installs them with apt-get; otherwise it lists the
# missing ones and fails.  The CUDA toolkit (with NCCL) is not a Debian
# package here: it is used from /usr/local/cuda when present and skipped
# otherwise (ZPP_WITH_CUDA=AUTO).
set -euo pipefail

# iproute2 (ip, tc) and util-linux (unshare, flock): the namespace cluster
# of scripts/netns_cluster.sh (make test-cluster).
pkgs=(cmake make gcc g++ pkg-config libopenmpi-dev openmpi-bin libucx-dev
      libgtest-dev googletest python3 iproute2 util-linux)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" \
    || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
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
