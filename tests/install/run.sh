#!/usr/bin/env bash
# Installs the build tree into a scratch prefix, then builds and runs a
# tiny C program against it: through find_package(zpp) (shared, and static
# where its dependencies are found) and through pkg-config, first as the
# machine is, then with CUDA hidden (no nvcc on PATH, CUDAToolkit_ROOT and
# CUDA_PATH pointing nowhere, /usr/local/cuda* ignored by CMake's find_*):
# a host-only user must find and link zpp::zpp without a CUDA toolkit.
# Every program, and the installed tools, run with LD_LIBRARY_PATH unset
# (RUNPATH).  Also checks that libzpp exports only zpp_* symbols.
#   usage: run.sh <build-dir> <source-dir>
set -euo pipefail
build=$1
src=$2
work=$(mktemp -d)
trap '[ -n "${KEEP_WORK:-}" ] || rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
cmake --install "$build" --prefix "$work/prefix" > "$work/install.log"
lib=$(ls "$work"/prefix/lib*/libzpp.so | head -n1)
libdir=$(dirname "$lib")
cfgdir=$libdir/cmake/zpp

bad=$(nm -D --defined-only "$lib" | awk '{print $3}' | grep -v '^zpp_' || true)
if [ -n "$bad" ]; then
  echo "FAIL: libzpp.so exports non-zpp symbols:"; echo "$bad" | head -20; exit 1
fi
if readelf -d "$lib" | grep -E 'NEEDED.*(libcuda\.so|libnccl|libnvidia-ml)'; then
  fail "libzpp.so has a link-time dependency on the CUDA driver/NCCL/NVML"
fi
if grep -q CUDAToolkit "$cfgdir/zppTargets.cmake"; then
  fail "zppTargets.cmake (the shared library's) names CUDA: host-only users would need it"
fi
built_with_cuda=0
grep -q "_zpp_static_dep(CUDAToolkit" "$cfgdir/zppConfig.cmake" && built_with_cuda=1

# RUNPATH: libzpp and every installed program, none of them needing
# LD_LIBRARY_PATH (ldd resolves everything with it unset)
for f in "$lib" "$work"/prefix/bin/*; do
  [ -f "$f" ] || continue
  readelf -d "$f" | grep -q 'RUNPATH.*\$ORIGIN' || fail "$(basename "$f") has no RUNPATH with \$ORIGIN"
  if env -u LD_LIBRARY_PATH ldd "$f" | grep -q "not found"; then
    fail "$(basename "$f") does not find a library without LD_LIBRARY_PATH: $(env -u LD_LIBRARY_PATH ldd "$f" | grep 'not found')"
  fi
done
for t in zpp-plan zpp-topo; do
  [ -x "$work/prefix/bin/$t" ] || continue
  case $t in
    zpp-plan) args=(--params 1M --ranks 8 --format json) ;;
    zpp-topo) args=(--offline --topo 2x2) ;;
  esac
  env -u LD_LIBRARY_PATH "$work/prefix/bin/$t" "${args[@]}" > "$work/$t.out" ||
    fail "installed $t does not run without LD_LIBRARY_PATH"
done

# A PATH without nvcc: directories holding it are replaced by copies
# made of links to everything else.
hidden_path() {
  local out="" d i=0
  local -a dirs
  IFS=: read -r -a dirs <<< "$PATH"
  for d in "${dirs[@]}"; do
    case $d in *cuda*) continue ;; esac
    if [ -e "$d/nvcc" ]; then
      i=$((i + 1))
      mkdir -p "$work/path$i"
      for f in "$d"/*; do
        case $(basename "$f") in nvcc*) ;; *) ln -s "$f" "$work/path$i/" ;; esac
      done
      d=$work/path$i
    fi
    out=${out:+$out:}$d
  done
  echo "$out"
}

# consumer <name> <static 0|1> <hide 0|1>: configure, build, run
consumer() {
  local name=$1 static=$2 hide=$3
  local -a envs=() defs=(-DCMAKE_PREFIX_PATH="$work/prefix" -DZPP_CONSUMER_STATIC="$static")
  if [ "$hide" = 1 ]; then
    envs=(env -u CUDA_PATH -u CUDA_HOME -u CUDACXX -u CUDAToolkit_ROOT PATH="$HIDDEN_PATH")
    defs+=(-DZPP_CONSUMER_EXPECT_NO_CUDA=ON -DCUDAToolkit_ROOT=/nonexistent
      "-DCMAKE_IGNORE_PREFIX_PATH=$(ls -d /usr/local/cuda* 2>/dev/null | paste -sd';')"
      "-DCMAKE_IGNORE_PATH=$NVCC_DIRS")
  fi
  "${envs[@]}" cmake -S "$src/tests/install" -B "$work/$name" "${defs[@]}" > "$work/$name.log" 2>&1 ||
    fail "$name: configure failed: $(tail -5 "$work/$name.log")"
  "${envs[@]}" cmake --build "$work/$name" > "$work/$name.build.log" 2>&1 ||
    fail "$name: build failed: $(tail -5 "$work/$name.build.log")"
  env -u LD_LIBRARY_PATH "$work/$name/consumer" || fail "$name: consumer did not run"
  if [ "$static" = 1 ]; then
    env -u LD_LIBRARY_PATH "$work/$name/consumer_static" || fail "$name: consumer_static did not run"
  fi
}

consumer cm 1 0

export PKG_CONFIG_PATH="$libdir/pkgconfig"
cc -std=c11 "$src/tests/install/consumer.c" -o "$work/pc" $(pkg-config --cflags --libs zpp) -lm
env -u LD_LIBRARY_PATH "$work/pc" || fail "the pkg-config consumer does not run without LD_LIBRARY_PATH"

# CUDA hidden.  CMake's find_program also looks in <prefix>/bin of its
# system prefixes (/usr/local/bin, /usr/bin), whatever PATH says: every
# directory that holds an nvcc is ignored too.
HIDDEN_PATH=$(hidden_path)
NVCC_DIRS=$( { IFS=:; for d in $PATH /usr/local/bin /usr/bin /bin; do
  if [ -e "$d/nvcc" ]; then echo "$d"; fi; done; } | sort -u | paste -sd";")
if PATH="$HIDDEN_PATH" command -v nvcc > /dev/null; then fail "nvcc still on the hidden PATH"; fi
consumer cm_nocuda 0 1
if [ "$built_with_cuda" = 1 ]; then
  # the archive needs the CUDA runtime: asked for, it fails, naming it
  if (consumer cm_nocuda_static 1 1) 2> /dev/null; then
    fail "zpp::zpp_static was found although its CUDA runtime is hidden"
  fi
  grep -q "needs the CUDA toolkit" "$work/cm_nocuda_static.log" ||
    fail "the missing static component is not explained: $(tail -5 "$work/cm_nocuda_static.log")"
fi
PATH="$HIDDEN_PATH" cc -std=c11 "$src/tests/install/consumer.c" -o "$work/pc2" \
  $(PATH="$HIDDEN_PATH" pkg-config --cflags --libs zpp) -lm
env -u LD_LIBRARY_PATH "$work/pc2" || fail "the pkg-config consumer (CUDA hidden) does not run"
echo "install test passed: find_package(zpp) shared+static and pkg-config; with CUDA hidden" \
  "(zpp built with CUDA: $built_with_cuda) shared and pkg-config; no LD_LIBRARY_PATH needed"
