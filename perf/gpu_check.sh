#!/usr/bin/env bash
# One-shot check of the device path on a machine with a GPU: build
# (CUDA, NCCL and MPI on), run the unit tests (test_quant, test_quant_cuda),
# the device-memory collective tests (test_coll with ZPP_TEST_MEMORY=device:
# 4 ranks sharing the GPU through MPI staging, and 1 rank on NCCL; the
# transport's Device.* tests on 2 ranks), and zpp-quant-bench-gpu against a
# device-to-device copy in the same run (goals: INT8 encode and decode at
# least 0.8 of the copy's bandwidth, INT4 at least 0.7), and write a
# markdown summary plus the raw logs.
#
# How to run it through the device tool (one call, from the repository
# root; the summary and logs come back from $OUT).  Here first:
#
#   bash perf/gpu_check_prep.sh
#
# which puts GoogleTest's source and Debian's Open MPI (unpacked) under
# build-gpu-deps/ (build*/ is git-ignored).  Then the call:
#
#   run  command:   bash perf/gpu_check.sh $OUT/gpu_check.md
#        carry:     ["build-gpu-deps"]
#        timeout_s: 540
#
# Time: the script cuts every step's time limit to what is left of its
# budget, ZPP_GPU_CHECK_BUDGET_S (default 420 s), and skips a step that
# would start with less than 10 s left; it then ends within about 20 s of
# the budget (the benchmark's two runs keep 10 s each, a killed launch 10 s
# more).  With the copy of the working tree and build-gpu-deps/ to the
# machine that is 8 minutes, inside the call's 540 s; the machine's start
# (a minute or two) comes on top.
#
# That machine reaches no network, so nothing can be installed there.
# GoogleTest is built from build-gpu-deps/googletest (or /usr/src/googletest)
# unless installed; Open MPI is used from build-gpu-deps/mpi when the
# machine has no mpicc and mpirun of its own that start a rank.  NCCL:
# libnccl.so.2 from the loader path, else the one of the nvidia-nccl Python
# package (ZPP_NCCL_LIBRARY).
#
# Usage: bash perf/gpu_check.sh [SUMMARY.md]   (default perf/results/gpu_check.md)
# Environment: ZPP_CUDA_ARCH (default 90-real: the H100/H200 code only, to
# keep the build short), ZPP_GPU_CHECK_BUDGET_S (default 420),
# ZPP_GPU_CHECK_JOBS (default 16), ZPP_GPU_CHECK_GTEST_SRC (build GoogleTest
# from this source tree even if it is installed), ZPP_TEST_SEED (the tests'
# seed).
# Logs: gpu_check_build.log, gpu_check_test_quant.log,
# gpu_check_test_quant_cuda.log, gpu_check_<collective test>.log and
# gpu_check_bench.log, packed at the end into gpu_check_logs.tar.gz beside
# the summary (the device tool brings back at most 8 files).
# Exit status: 0 when the build, every test and the benchmark's check
# passed; 1 otherwise.
set -u

cd "$(dirname "$0")/.." || exit 1
ROOT=$(pwd)
SUMMARY=${1:-perf/results/gpu_check.md}
mkdir -p "$(dirname "$SUMMARY")" || exit 1
SUMMARY=$(cd "$(dirname "$SUMMARY")" && pwd)/$(basename "$SUMMARY")
LOGDIR=$(dirname "$SUMMARY")
BUILD=$ROOT/build-gpu
ARCH=${ZPP_CUDA_ARCH:-90-real}
BUDGET=${ZPP_GPU_CHECK_BUDGET_S:-420}
JOBS=${ZPP_GPU_CHECK_JOBS:-16}
START=$SECONDS
FAIL=0
ROWS=()   # summary table rows

say() { printf '[gpu_check %3ds] %s\n' $((SECONDS - START)) "$*"; }

# seconds left for a step: its own cap, or what is left of the budget
limit() {
  local left=$((BUDGET - (SECONDS - START)))
  ((left < 10)) && left=10
  ((left < $1)) && echo "$left" || echo "$1"
}

row() { ROWS+=("| $1 | $2 | $3 s |"); }

# true (and a FAILED row for step $1) when less than 10 s of the budget are
# left: the step is not started
spent() {
  ((BUDGET - (SECONDS - START) >= 10)) && return 1
  say "FAIL: $1 not run: the budget of $BUDGET s is spent"
  FAIL=1
  row "$1" "**not run: budget of $BUDGET s spent**" 0
  return 0
}

# ---- tools: cmake and nvcc may live off the PATH ---------------------------
if ! command -v cmake >/dev/null; then
  for c in /opt/torch/.venv/bin/cmake /usr/local/bin/cmake; do
    [ -x "$c" ] && PATH=$(dirname "$c"):$PATH && break
  done
fi
if ! command -v nvcc >/dev/null && [ ! -x /usr/local/cuda/bin/nvcc ]; then
  for c in /usr/local/cuda*/bin/nvcc /opt/cuda/bin/nvcc; do
    [ -x "$c" ] && export CUDACXX=$c && break
  done
fi
: >"$LOGDIR/gpu_check_build.log"

# ---- GoogleTest ---------------------------------------------------------------
GTEST_ARGS=()
have_gtest() {
  local f
  for f in /usr/lib/*/cmake/GTest/GTestConfig.cmake /usr/lib/cmake/GTest/GTestConfig.cmake \
           /usr/local/lib/cmake/GTest/GTestConfig.cmake /usr/local/lib/*/cmake/GTest/GTestConfig.cmake \
           /usr/lib64/cmake/GTest/GTestConfig.cmake; do
    [ -e "$f" ] && return 0
  done
  # FindGTest's way: the header and the library
  [ -f /usr/include/gtest/gtest.h ] || return 1
  for f in /usr/lib/*/libgtest.a /usr/lib/*/libgtest.so /usr/lib/libgtest.a /usr/lib64/libgtest.a; do
    [ -e "$f" ] && return 0
  done
  return 1
}
t0=$SECONDS
if [ -n "${ZPP_GPU_CHECK_GTEST_SRC:-}" ]; then
  have_gtest() { return 1; }  # build GoogleTest from the given source
fi
gtest_src() {
  local d
  for d in ${ZPP_GPU_CHECK_GTEST_SRC:-} "$ROOT/build-gpu-deps/googletest" /usr/src/googletest; do
    [ -f "$d/CMakeLists.txt" ] && echo "$d" && return 0
  done
  return 1
}
# apt-get only when no source is at hand: without a network it can wait
# for its mirror until the timeout
if ! have_gtest && ! gtest_src >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    say "GoogleTest missing: trying apt-get install -y libgtest-dev"
    timeout 30 apt-get install -y libgtest-dev >>"$LOGDIR/gpu_check_build.log" 2>&1 || true
  fi
fi
if ! have_gtest; then
  SRC=$(gtest_src)
  if [ -z "$SRC" ]; then
    say "FAIL: GoogleTest is not installed and no source found (see the header of $0)"
    echo "# zpp GPU check: FAILED, no GoogleTest (see perf/gpu_check.sh)" >"$SUMMARY"
    exit 1
  fi
  say "building GoogleTest from $SRC"
  # shellcheck disable=SC2016  # bash -c's script expands its own arguments
  if ! timeout "$(limit 120)" bash -c '
      cmake -S "$1" -B "$2/_gtest" -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_INSTALL_PREFIX="$2/_gtest_install" -DBUILD_GMOCK=OFF \
        -DCMAKE_POSITION_INDEPENDENT_CODE=ON &&
      cmake --build "$2/_gtest" -j"$3" &&
      cmake --install "$2/_gtest"' _ "$SRC" "$BUILD" "$JOBS" >>"$LOGDIR/gpu_check_build.log" 2>&1; then
    say "FAIL: GoogleTest build (gpu_check_build.log)"
    echo "# zpp GPU check: FAILED, GoogleTest build" >"$SUMMARY"
    exit 1
  fi
  GTEST_ARGS=(-DCMAKE_PREFIX_PATH="$BUILD/_gtest_install")
fi

# ---- MPI and NCCL ---------------------------------------------------------------
HAVE_MPI=0
# an MPI is used when its mpirun starts a rank (one that fails, or an image
# whose mpirun is a stub, gives way to the carried one)
mpi_runs() {
  timeout 30 mpirun --allow-run-as-root --oversubscribe -np 1 true >>"$LOGDIR/gpu_check_build.log" 2>&1
}
if command -v mpicc >/dev/null && command -v mpirun >/dev/null && mpi_runs; then
  HAVE_MPI=1
elif [ -x "$ROOT/build-gpu-deps/mpi/usr/bin/mpicc.openmpi" ]; then
  R=$ROOT/build-gpu-deps/mpi
  mkdir -p "$BUILD/_mpibin"
  ln -sf "$R/usr/bin/mpicc.openmpi" "$BUILD/_mpibin/mpicc"
  ln -sf "$R/usr/bin/mpiexec.openmpi" "$BUILD/_mpibin/mpirun"
  export OPAL_PREFIX=$R/usr PATH=$BUILD/_mpibin:$R/usr/bin:$PATH
  export LD_LIBRARY_PATH=$R/usr/lib/x86_64-linux-gnu:$R/usr/lib/x86_64-linux-gnu/openmpi/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  # ctypes.util.find_library("mpi") (zpp.Comm.from_mpi) asks ldconfig,
  # then gcc, which searches LIBRARY_PATH
  export LIBRARY_PATH=$R/usr/lib/x86_64-linux-gnu/openmpi/lib${LIBRARY_PATH:+:$LIBRARY_PATH}
  if mpi_runs; then
    HAVE_MPI=1
    say "MPI: Open MPI carried in build-gpu-deps/mpi"
  else
    say "the carried Open MPI's mpirun -np 1 true failed (gpu_check_build.log): MPI off, the collective tests will not run"
  fi
else
  say "no MPI here (run perf/gpu_check_prep.sh and carry build-gpu-deps): the collective tests will not run"
fi
NCCL_ARGS=()
if [ -z "${ZPP_NCCL_LIBRARY:-}" ] && ! ldconfig -p 2>/dev/null | grep -q 'libnccl.so.2 '; then
  d=$(python3 -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__) or list(nvidia.nccl.__path__)[0])' 2>/dev/null)
  [ -z "$d" ] && d=$(python3 -c 'import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])' 2>/dev/null)
  if [ -n "$d" ] && [ -e "$d/lib/libnccl.so.2" ]; then
    export ZPP_NCCL_LIBRARY=$d/lib/libnccl.so.2
    [ -e "$d/include/nccl.h" ] && NCCL_ARGS=(-DZPP_NCCL_INCLUDE_DIR="$d/include")
  fi
fi
say "NCCL: ${ZPP_NCCL_LIBRARY:-libnccl.so.2 from the loader path}"

# ---- build ----------------------------------------------------------------------
say "configure + build in build-gpu (CUDA arch $ARCH, -j$JOBS)"
TARGETS=(test_quant test_quant_cuda zpp-quant-bench-gpu)
[ $HAVE_MPI = 1 ] && TARGETS+=(test_coll test_transport)
# shellcheck disable=SC2016  # bash -c's script expands its own arguments
if timeout "$(limit 300)" bash -c '
    cmake -S "$1" -B "$2" -DZPP_WITH_CUDA=ON -DZPP_BUILD_TESTS=ON -DZPP_BUILD_TOOLS=ON \
      -DZPP_WITH_MPI=$5 -DZPP_WITH_NCCL=AUTO -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_CUDA_ARCHITECTURES="$3" "${@:7}" &&
    cmake --build "$2" -j"$4" --target $6' \
    _ "$ROOT" "$BUILD" "$ARCH" "$JOBS" "$([ $HAVE_MPI = 1 ] && echo ON || echo OFF)" \
    "${TARGETS[*]}" "${GTEST_ARGS[@]}" "${NCCL_ARGS[@]}" >>"$LOGDIR/gpu_check_build.log" 2>&1; then
  row build ok $((SECONDS - t0))
else
  rc=$?
  why="see gpu_check_build.log"
  [ $rc = 124 ] && why="timed out, $why"
  say "FAIL: build ($why):"
  grep -E 'error:|Error [0-9]|CMake Error|fatal' "$LOGDIR/gpu_check_build.log" | head -20
  row build "**FAILED** ($why)" $((SECONDS - t0))
  printf '# zpp GPU check: build FAILED\n\n| step | result | time |\n| --- | --- | --- |\n%s\n' \
    "${ROWS[@]}" >"$SUMMARY"
  exit 1
fi

# ---- tests ------------------------------------------------------------------------
# gtest result line: "N passed, M failed, K skipped"
gtest_result() {
  local log=$1 rc=$2 p f s
  p=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$log" | tail -1)
  f=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' "$log" | tail -1)
  s=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) test.*/\1/p' "$log" | tail -1)
  local r="${p:-0} passed, ${f:-0} failed, ${s:-0} skipped"
  if [ "$rc" != 0 ]; then
    [ "$rc" = 124 ] && r="$r, **TIMED OUT**" || r="$r, **exit $rc**"
  fi
  echo "$r"
}

run_test() {
  local name=$1 cap=$2 log="$LOGDIR/gpu_check_$1.log" t=$SECONDS rc
  spent "$name" && return
  say "running $name"
  timeout "$(limit "$cap")" "$BUILD/tests/$name" --gtest_color=no >"$log" 2>&1
  rc=$?
  local res
  res=$(gtest_result "$log" $rc)
  say "$name: $res"
  if [ $rc != 0 ]; then
    FAIL=1
    grep -E '^\[  FAILED  \] [A-Za-z]' "$log" | sort -u | head -20
    res="**FAILED**: $res"
  fi
  row "$name" "$res" $((SECONDS - t))
}

run_test test_quant 60
run_test test_quant_cuda 240
if grep -q 'no CUDA device' "$LOGDIR/gpu_check_test_quant_cuda.log"; then
  say "FAIL: test_quant_cuda skipped: no CUDA device visible"
  FAIL=1
  ROWS+=("| device | **no CUDA device: the device tests skipped** | |")
fi

# ---- device-memory collectives ---------------------------------------------------
# run_mpi NAME CAP NP ENV... -- BINARY ARGS...
run_mpi() {
  local name=$1 cap=$2 np=$3 log="$LOGDIR/gpu_check_$1.log" t=$SECONDS rc res
  shift 3
  local envs=()
  while [ "$1" != "--" ]; do envs+=(-x "$1"); shift; done
  shift
  spent "$name" && return
  say "running $name (mpirun -np $np)"
  timeout -k 10 "$(limit "$cap")" mpirun --allow-run-as-root --oversubscribe --bind-to none \
    -np "$np" -x OMPI_MCA_mpi_yield_when_idle=1 -x ZPP_TIMEOUT_S=60 \
    ${ZPP_NCCL_LIBRARY:+-x ZPP_NCCL_LIBRARY} "${envs[@]}" "$@" --gtest_color=no >"$log" 2>&1
  rc=$?
  res=$(gtest_result "$log" $rc)
  say "$name: $res"
  if [ $rc != 0 ]; then
    FAIL=1
    grep -E '^\[  FAILED  \] [A-Za-z]|rank [0-9]+\] FAILURE' "$log" | sort -u | head -20
    res="**FAILED**: $res"
  fi
  row "$name" "$res" $((SECONDS - t))
}
if [ $HAVE_MPI = 1 ] && [ -x "$BUILD/tests/test_coll" ]; then
  run_mpi coll_device_mpi_2x2 150 4 ZPP_TOPO=2x2 ZPP_TEST_MEMORY=device \
    ZPP_TEST_BACKEND=mpi ZPP_PIPE_MIN_CHUNK=4096 -- "$BUILD/tests/test_coll"
  run_mpi coll_device_nccl_1x1 90 1 ZPP_TOPO=1x1 ZPP_TEST_MEMORY=device \
    ZPP_TEST_BACKEND=nccl -- "$BUILD/tests/test_coll"
  run_mpi transport_device_2x1 60 2 ZPP_TOPO=2x1 -- "$BUILD/tests/test_transport" \
    --gtest_filter='Device.*:Nccl.*'
else
  FAIL=1
  ROWS+=("| device collectives | **not run: no MPI (perf/gpu_check_prep.sh)** | |")
fi

# ---- benchmark ----------------------------------------------------------------------
BENCH="$BUILD/perf/zpp-quant-bench-gpu"
BLOG="$LOGDIR/gpu_check_bench.log"
: >"$BLOG"
t=$SECONDS
brc=0
for mode in sym asym; do
  say "zpp-quant-bench-gpu --mode $mode"
  echo "## mode $mode" >>"$BLOG"
  timeout "$(limit 90)" "$BENCH" --mode "$mode" --count 134217728 \
    --block 32,256,4096,1048576 --format csv >"$BLOG.$mode.csv" 2>>"$BLOG"
  rc=$?
  cat "$BLOG.$mode.csv" >>"$BLOG"
  [ $rc != 0 ] && brc=$rc
done
if [ $brc != 0 ]; then
  FAIL=1
  row zpp-quant-bench-gpu "**FAILED** (exit $brc, see gpu_check_bench.log)" $((SECONDS - t))
else
  row zpp-quant-bench-gpu ok $((SECONDS - t))
fi

# ---- summary --------------------------------------------------------------------------
{
  gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)
  rev=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
  [ -n "$(git -C "$ROOT" status --porcelain 2>/dev/null | head -1)" ] && rev="$rev+local changes"
  echo "# zpp GPU check: $([ $FAIL = 0 ] && echo passed || echo FAILED)"
  echo
  echo "$(date -u '+%Y-%m-%d %H:%M UTC'), GPU: ${gpu:-unknown}, commit $rev," \
       "CUDA arch $ARCH, seed ZPP_TEST_SEED=${ZPP_TEST_SEED:-20261129 (default)}, $((SECONDS - START)) s in all."
  echo
  echo "| step | result | time |"
  echo "| --- | --- | --- |"
  printf '%s\n' "${ROWS[@]}"
  for mode in sym asym; do
    f="$BLOG.$mode.csv"
    [ -s "$f" ] || continue
    echo
    echo "## Throughput, $mode (134217728 elements; GB/s = bytes read + written per second;"
    echo "d2d = cudaMemcpyAsync of the same traffic in the same run; ratio = GB/s / d2d)"
    echo
    echo "| op | dtype | bits | block | GB/s | d2d GB/s | ratio | goal |"
    echo "| --- | --- | --- | --- | ---: | ---: | ---: | --- |"
    # the codec's device goal: INT8 encode/decode >= 0.8 of the copy, INT4 >= 0.7
    tail -n +2 "$f" | awk -F, '{
      g = ($3 == 8) ? 0.8 : 0.7; v = "";
      if ($1 == "encode" || $1 == "decode")
        v = ($7 + 0 >= g) ? sprintf(">= %.1f met", g) : sprintf("**< %.1f missed**", g);
      printf "| %s | %s | %s | %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5, $6, $7, v}'
  done
  if [ $FAIL != 0 ]; then
    echo
    echo "## Failed tests"
    echo
    grep -hE '^\[  FAILED  \] [A-Za-z]' "$LOGDIR"/gpu_check_*.log 2>/dev/null |
      sort -u | sed 's/^/    /' | head -40
  fi
} >"$SUMMARY"
rm -f "$BLOG".*.csv
# the logs in one file: the device tool brings back at most 8 files
if (cd "$LOGDIR" && logs=(gpu_check_*.log) && [ -e "${logs[0]}" ] &&
    tar -czf gpu_check_logs.tar.gz "${logs[@]}" && rm -f "${logs[@]}"); then
  say "logs: $LOGDIR/gpu_check_logs.tar.gz"
fi

say "summary: $SUMMARY"
cat "$SUMMARY"
exit $FAIL
