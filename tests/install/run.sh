#!/usr/bin/env bash
# Installs the build tree into a scratch prefix, then builds and runs a
# tiny C program against it twice: through find_package(zpp) (shared and
# static) and through pkg-config.  Also checks that libzpp exports only
# zpp_* symbols.   usage: run.sh <build-dir> <source-dir>
set -euo pipefail
build=$1
src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" > "$work/install.log"
lib=$(ls "$work"/prefix/lib*/libzpp.so | head -n1)

bad=$(nm -D --defined-only "$lib" | awk '{print $3}' | grep -v '^zpp_' || true)
if [ -n "$bad" ]; then
  echo "FAIL: libzpp.so exports non-zpp symbols:"; echo "$bad" | head -20; exit 1
fi
if readelf -d "$lib" | grep -E 'NEEDED.*(libcuda\.so|libnccl|libnvidia-ml)'; then
  echo "FAIL: libzpp.so has a link-time dependency on the CUDA driver/NCCL/NVML"
  exit 1
fi

cmake -S "$src/tests/install" -B "$work/cm" -DCMAKE_PREFIX_PATH="$work/prefix" > "$work/cm.log"
cmake --build "$work/cm" > "$work/cmb.log"
LD_LIBRARY_PATH="$work/prefix/lib:$(dirname "$lib")" "$work/cm/consumer"
"$work/cm/consumer_static"

export PKG_CONFIG_PATH="$(dirname "$lib")/pkgconfig"
cc -std=c11 "$src/tests/install/consumer.c" -o "$work/pc" $(pkg-config --cflags --libs zpp) -lm
LD_LIBRARY_PATH="$(dirname "$lib")" "$work/pc"
echo "install test passed: find_package(zpp) shared+static and pkg-config"
