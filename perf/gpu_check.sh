#!/usr/bin/env bash
# One-shot check of the device path on a machine with a GPU: build
# (CUDA, NCCL and MPI on), run the unit tests (test_quant, test_quant_cuda),
# the device-memory collective tests (test_coll with ZPP_TEST_MEMORY=device:
# 4 ranks sharing the GPU through MPI staging, and 1 rank on NCCL; the
# transport's Device.* tests on 2 ranks), an FSDP2 training step with CUDA
# tensors (examples/fsdp2_train.py --device cuda, 2 ranks sharing the GPU,
# zpp's communicators on device memory: zpp's bf16 baseline and ZeRO++, the
# loss finite and ZeRO++'s within a derived tolerance of the baseline's),
# and zpp-quant-bench-gpu against a device-to-device copy in the same run
# (goals: INT8 encode and decode at least 0.8 of the copy's bandwidth, INT4
# at least 0.7), and write a markdown summary plus the raw logs.
#
# How to run it through the device tool (one call, from the repository
# root; the summary and logs come back from $OUT).  Here first:
#
#   bash perf/gpu_check_prep.sh
#
# which puts GoogleTest's source, Debian's Open MPI and UCX with its
# headers (unpacked) and the wheels of the Python packages the bindings
# need that the GPU image lacks (cffi, pycparser) under build-gpu-deps/
# (build*/ is git-ignored; 38 MiB, with the tracked files about 43: a call
# carries at most 64 MiB).
# Then the call:
#
#   run  command:   bash perf/gpu_check.sh $OUT/gpu_check.md
#        carry:     ["build-gpu-deps"]
#        timeout_s: 540
#
# Time: the script cuts every step's time limit to what is left of its
# budget, ZPP_GPU_CHECK_BUDGET_S (default 420 s), and skips a step (each
# of the benchmark's two runs is one) that would start with less than 10 s
# left; it then ends within about 10 s of the budget (a step that started
# with 10 s left and is killed 10 s after its TERM: timeout -k 10).  With
# the copy of the working tree and build-gpu-deps/ to the machine that is
# 8 minutes, inside the call's 540 s; the machine's start (a minute or two)
# comes on top.  Expected on 16 cores: GoogleTest 15 s
# of CPU (2 compiles), the build of the targets below 78 s of CPU in 53
# compiles whose longest chain (quant_cuda.cu, then test_quant.cc, each
# then linked) is about 31 s (measured on a 2-core machine), so with the
# configure steps about a minute; the caps of the tests, the FSDP2 step
# and the benchmark add up to more than the rest of the budget, which is
# what bounds them.
#
# That machine reaches no network, so nothing can be installed there.
# GoogleTest is built from build-gpu-deps/googletest (or /usr/src/googletest)
# unless installed; Open MPI is used from build-gpu-deps/mpi when the
# machine has no mpicc and mpirun of its own that start a rank, UCX's
# headers from there when the compiler finds none (libzpp's UCX backend is
# compiled only with them) and its libraries when the FSDP2 step has to do
# without mpirun; the wheels are installed (with pip, else unzipped) under
# build-gpu/_pysite when python3 cannot import cffi.  NCCL:
# libnccl.so.2 from the loader path, else the one of the nvidia-nccl Python
# package (ZPP_NCCL_LIBRARY).
#
# The FSDP2 step: python/tests/fsdp_runs.py runs both trainings in one
# launch, 2 ranks, ZPP_TOPO=2x1 (two emulated nodes, so qwZ and qgZ
# quantize what crosses them), --dtype bf16, 50 steps of 2 x 8 sequences
# of 32 tokens; ZeRO++ with --unshard-async (FSDP2's gathers with
# async_op=True, so FSDP2 waits on zpp.fsdp's Work).  With mpirun:
# --comm zppmpi, and the backend zpp's AUTO picks for ranks that share a
# GPU (MPI staging through pinned host memory; NCCL takes one GPU per
# rank).  Without a working mpirun: torchrun and --comm zpp (zpp's TCP
# bootstrap over torch's store), where AUTO picks UCX staging (a libzpp
# built without UCX's headers has no UCX backend: the row then says "not
# run: no UCX headers").  Pass: 50 finite losses in each run, both on
# device memory, ZeRO++'s gathers async (at least one; where torch has no
# FSDPModule._set_unshard_async_op they stay synchronous and the row says
# so), and ZeRO++'s mean loss over the last 10 steps within
# 3 s / sqrt(10 T) of the baseline's (s: the baseline's token-loss standard
# deviation over those steps, T: tokens a step; the tolerance of
# python/tests/test_fsdp.py, derived there) with at least 90% of the
# baseline's drop in loss.
#
# Usage: bash perf/gpu_check.sh [SUMMARY.md]   (default perf/results/gpu_check.md)
# Environment: ZPP_CUDA_ARCH (default 90-real: the H100/H200 code only, to
# keep the build short), ZPP_GPU_CHECK_BUDGET_S (default 420),
# ZPP_GPU_CHECK_JOBS (default 16), ZPP_GPU_CHECK_GTEST_SRC (build GoogleTest
# from this source tree even if it is installed), ZPP_GPU_CHECK_PYTHON (the
# python with torch; default the python3 on PATH, else
# /opt/torch/.venv/bin/python3), ZPP_GPU_CHECK_FSDP_LAUNCH (mpirun or
# torchrun: the FSDP2 step's launcher; default mpirun when MPI works),
# ZPP_GPU_CHECK_FSDP_DEVICE (default cuda; cpu runs the same step on host
# memory, to try the script on a machine without a GPU), ZPP_TEST_SEED
# (the tests' seed).
# Logs: gpu_check_build.log, gpu_check_test_quant.log,
# gpu_check_test_quant_cuda.log, gpu_check_<collective test>.log,
# gpu_check_fsdp2_cuda.log and gpu_check_bench.log, packed at the end into
# gpu_check_logs.tar.gz beside the summary (the device tool brings back at
# most 8 files).
# Exit status: 0 when the build, every test, the FSDP2 step and the
# benchmark's check passed; 1 otherwise.
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

# the words for a step's exit status $1 that timeout gave: 124 when the
# step ended on its TERM, 137 when timeout -k had to KILL it; else nothing
timed_out() {
  case $1 in
    124) echo "**TIMED OUT**" ;;
    137) echo "**TIMED OUT** (killed after the TERM)" ;;
    *) return 1 ;;
  esac
}

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
  timeout -k 5 30 mpirun --allow-run-as-root --oversubscribe -np 1 true >>"$LOGDIR/gpu_check_build.log" 2>&1
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

# ---- UCX headers ----------------------------------------------------------------
# libzpp's UCX backend (the FSDP2 step's under torchrun) is compiled only
# where <ucp/api/ucp.h> is found (src/transport/transport_ucx.c): the
# carried libucx-dev's when the compiler finds none.  Its folders alone,
# so that the rest of the carried include tree stays out of the way.
UCX_ARGS=()
UCX_INC=$ROOT/build-gpu-deps/mpi/usr/include
if ! echo '#include <ucp/api/ucp.h>' | "${CC:-cc}" -E -x c - >/dev/null 2>&1 &&
   [ -f "$UCX_INC/ucp/api/ucp.h" ]; then
  rm -rf "$BUILD/_ucx_include" && mkdir -p "$BUILD/_ucx_include" &&
    ln -s "$UCX_INC"/uc[mpst] "$BUILD/_ucx_include/"
  UCX_ARGS=(-DCMAKE_C_FLAGS="-isystem $BUILD/_ucx_include")
  say "UCX headers: libucx-dev carried in build-gpu-deps/mpi"
fi

# ---- build ----------------------------------------------------------------------
say "configure + build in build-gpu (CUDA arch $ARCH, -j$JOBS)"
TARGETS=(zpp test_quant test_quant_cuda zpp-quant-bench-gpu)
[ $HAVE_MPI = 1 ] && TARGETS+=(test_coll test_transport)
# shellcheck disable=SC2016  # bash -c's script expands its own arguments
if timeout "$(limit 300)" bash -c '
    cmake -S "$1" -B "$2" -DZPP_WITH_CUDA=ON -DZPP_BUILD_TESTS=ON -DZPP_BUILD_TOOLS=ON \
      -DZPP_WITH_MPI=$5 -DZPP_WITH_NCCL=AUTO -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_CUDA_ARCHITECTURES="$3" "${@:7}" &&
    cmake --build "$2" -j"$4" --target $6' \
    _ "$ROOT" "$BUILD" "$ARCH" "$JOBS" "$([ $HAVE_MPI = 1 ] && echo ON || echo OFF)" \
    "${TARGETS[*]}" "${GTEST_ARGS[@]}" "${NCCL_ARGS[@]}" "${UCX_ARGS[@]}" \
    >>"$LOGDIR/gpu_check_build.log" 2>&1; then
  row build ok $((SECONDS - t0))
else
  rc=$?
  why="see gpu_check_build.log"
  timed_out $rc >/dev/null && why="timed out, $why"
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
    r="$r, $(timed_out "$rc" || echo "**exit $rc**")"
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

# ---- FSDP2 step with CUDA tensors --------------------------------------------------
# examples/fsdp2_train.py through python/tests/fsdp_runs.py: zpp's bf16
# baseline and ZeRO++ in one launch of 2 ranks sharing the GPU (see the
# header for the launch and the pass rule).
FSDP_DEVICE=${ZPP_GPU_CHECK_FSDP_DEVICE:-cuda}
FSDP_STEPS=50
PY=${ZPP_GPU_CHECK_PYTHON:-}
if [ -z "$PY" ]; then
  for c in python3 /opt/torch/.venv/bin/python3; do
    if command -v "$c" >/dev/null && "$c" -c 'import torch' 2>/dev/null; then
      PY=$(command -v "$c")
      break
    fi
  done
fi

# the step's result line (stdout) from the JSON lines of the two runs;
# exit 1 when the step failed
fsdp_verdict() {
  "$PY" - "$@" <<'EOF'
import json, math, sys

path, steps, device = sys.argv[1], int(sys.argv[2]), sys.argv[3]
runs = [json.loads(l) for l in open(path) if l.startswith("{")]
if len(runs) != 2:
    print("**FAILED**: %d of the 2 runs printed their result" % len(runs))
    sys.exit(1)
b, z = runs
bad = []
want = "device" if device == "cuda" else "host"
for name, r, kinds in (("baseline", b, ("exact",)), ("ZeRO++", z, ("qwz", "qgz"))):
    ls = r["losses"]
    if len(ls) != steps:
        bad.append("%s: %d losses, not %d" % (name, len(ls), steps))
    elif not all(math.isfinite(x) for x in ls):
        bad.append("%s: loss %r at step %d" % (name, *next((x, i) for i, x in enumerate(ls)
                                                             if not math.isfinite(x))))
    if r.get("memory") != want:
        bad.append("%s on %s memory, not %s" % (name, r.get("memory"), want))
    for k in kinds:  # the hooks did run, quantizing in ZeRO++
        if not any(c.startswith(k) for c in r.get("hook_calls", {})):
            bad.append("%s made no %s call (%s)" % (name, k, r.get("hook_calls")))
# ZeRO++ ran with --unshard-async: FSDP2's gathers with async_op=True, so
# zpp.fsdp's Work is what FSDP2 waits on (where torch can do that)
if z.get("unshard_async") is None:
    bad.append("ZeRO++ did not report its async gathers")
elif z["unshard_async"] and not z.get("async_gathers"):
    bad.append("ZeRO++ made no gather with async_op=True")
asyncs = ("%d gathers async" % z["async_gathers"] if z.get("unshard_async") else
          "gathers synchronous: torch %s has no _set_unshard_async_op" % z.get("torch"))
if bad:
    print("**FAILED**: " + "; ".join(bad))
    sys.exit(1)
# python/tests/test_fsdp.py's tolerance: 3 standard errors of the mean of
# the last 10 steps' losses, and at least 90% of the baseline's drop
mb, mz = sum(b["losses"][-10:]) / 10, sum(z["losses"][-10:]) / 10
tol = 3 * b["token_loss_std_last10"] / math.sqrt(10 * b["tokens_per_step"])
drop_b, drop_z = b["losses"][0] - mb, z["losses"][0] - mz
ok = abs(mz - mb) <= tol and drop_z >= 0.9 * drop_b
print("%s: loss %.3f at step 0; last 10 steps baseline %.4f, ZeRO++ %.4f (gap %.4f, "
      "tolerance %.4f; drops %.3f / %.3f); backend %s, %s memory; %.3f / %.3f s a step; "
      "ZeRO++: %s"
      % ("ok" if ok else "**FAILED**", b["losses"][0], mb, mz, mz - mb, tol, drop_b, drop_z,
         b.get("backend"), b.get("memory"), b["step_time_s"], z["step_time_s"], asyncs))
sys.exit(0 if ok else 1)
EOF
}

# fsdp_fail NAME T0 WHY: a failed step that did not launch
fsdp_fail() {
  say "FAIL: $1: $3"
  FAIL=1
  row "$1" "**FAILED**: $3" $((SECONDS - $2))
}

# install_wheels SITE WHEEL...: with pip, else unpacked (a wheel is a zip
# of what goes into site-packages; these two run no install code)
install_wheels() {
  local site=$1 w
  shift
  if "$PY" -m pip --version >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --upgrade --target "$site" "$@"
  else
    echo "$PY has no pip: unzipping the wheels into $site"
    mkdir -p "$site" || return 1
    for w in "$@"; do
      "$PY" -m zipfile -e "$w" "$site" || return 1
    done
  fi
}

fsdp_step() {
  local name=fsdp2_$FSDP_DEVICE log="$LOGDIR/gpu_check_fsdp2_$FSDP_DEVICE.log" t=$SECONDS
  local rc res launch site=$BUILD/_pysite port=$((20000 + RANDOM % 20000)) ucx
  spent "$name" && return
  : >"$log"
  if [ -z "$PY" ]; then
    fsdp_fail "$name" $t "no python3 that imports torch (ZPP_GPU_CHECK_PYTHON)"
    return
  fi
  # the bindings need cffi (and pycparser), which the GPU image may lack
  if ! "$PY" -c 'import cffi' 2>/dev/null; then
    if ! compgen -G "$ROOT/build-gpu-deps/wheels/*.whl" >/dev/null ||
       ! install_wheels "$site" "$ROOT"/build-gpu-deps/wheels/*.whl >>"$log" 2>&1 ||
       ! PYTHONPATH=$site "$PY" -c 'import cffi' >>"$log" 2>&1; then
      fsdp_fail "$name" $t "$PY cannot import cffi, and no wheel of it installs from build-gpu-deps/wheels (perf/gpu_check_prep.sh)"
      return
    fi
    say "cffi: installed from build-gpu-deps/wheels into $site"
  fi
  # the runs' environment (env: the rest of the script keeps its own)
  local envs=(PYTHONPATH="$ROOT/python:$site${PYTHONPATH:+:$PYTHONPATH}"
              ZPP_LIBRARY="$BUILD/libzpp.so" MASTER_ADDR=127.0.0.1 MASTER_PORT="$port"
              ZPP_TOPO=2x1 ZPP_TIMEOUT_S=60)
  local common="--device $FSDP_DEVICE --dtype bf16 --steps $FSDP_STEPS --batch 8 --json --quiet"
  launch=${ZPP_GPU_CHECK_FSDP_LAUNCH:-$([ $HAVE_MPI = 1 ] && echo mpirun || echo torchrun)}
  # zpp.Comm.from_mpi loads libmpi by ctypes.util.find_library("mpi")
  if [ "$launch" = mpirun ] && [ -z "${ZPP_GPU_CHECK_FSDP_LAUNCH:-}" ] &&
     ! "$PY" -c 'import ctypes.util, sys; sys.exit(ctypes.util.find_library("mpi") is None)'; then
    say "$name: python finds no libmpi (ctypes.util.find_library): torchrun instead of mpirun"
    launch=torchrun
  fi
  # torchrun's --comm zpp needs zpp's UCX backend, absent from a libzpp
  # built without UCX's headers (the message it then gives names them)
  if [ "$launch" = torchrun ] && grep -qa 'built without the UCX headers' "$BUILD/libzpp.so"; then
    say "FAIL: $name not run: no UCX headers (libzpp has no UCX backend, which torchrun's --comm zpp needs)"
    FAIL=1
    row "$name" "**not run: no UCX headers** (libzpp has no UCX backend, which the launch without mpirun needs; perf/gpu_check_prep.sh carries libucx-dev)" \
      $((SECONDS - t))
    return
  fi
  say "running $name ($launch, 2 ranks, $FSDP_STEPS steps twice)"
  if [ "$launch" = mpirun ]; then
    env "${envs[@]}" timeout -k 10 "$(limit 120)" mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 \
      -x PYTHONPATH -x ZPP_LIBRARY -x MASTER_ADDR -x MASTER_PORT -x ZPP_TOPO -x ZPP_TIMEOUT_S \
      -x OMPI_MCA_mpi_yield_when_idle=1 ${ZPP_NCCL_LIBRARY:+-x ZPP_NCCL_LIBRARY} \
      "$PY" "$ROOT/python/tests/fsdp_runs.py" "--comm zppmpi $common" \
      "--comm zppmpi --zeropp --unshard-async $common" >"$log.out" 2>>"$log"
  else
    # zpp's TCP bootstrap has no MPI backend: AUTO takes UCX, loaded with
    # dlopen; the carried one when the loader knows none (its own folder:
    # the carried Open MPI's libraries stay out of the way)
    ucx=$ROOT/build-gpu-deps/mpi/usr/lib/x86_64-linux-gnu
    if ! ldconfig -p 2>/dev/null | grep -q 'libucp.so.0 ' && [ -e "$ucx/libucp.so.0" ]; then
      mkdir -p "$BUILD/_ucx"
      ln -sf "$ucx"/libuc[pstm].so.0* "$ucx/ucx" "$BUILD/_ucx/"
      [ -e "$ucx/libnuma.so.1" ] && ! ldconfig -p 2>/dev/null | grep -q 'libnuma.so.1 ' &&
        ln -sf "$ucx"/libnuma.so.1* "$BUILD/_ucx/"
      envs+=(LD_LIBRARY_PATH="$BUILD/_ucx${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
    fi
    env "${envs[@]}" timeout -k 10 "$(limit 120)" "$PY" -m torch.distributed.run --nproc-per-node 2 \
      --master-addr 127.0.0.1 --master-port "$port" \
      "$ROOT/python/tests/fsdp_runs.py" "--comm zpp $common" \
      "--comm zpp --zeropp --unshard-async $common" \
      >"$log.out" 2>>"$log"
  fi
  rc=$?
  cat "$log.out" >>"$log"
  if [ $rc != 0 ]; then
    res=$(timed_out $rc || echo "**FAILED**: exit $rc")
    res="$res ($launch; see gpu_check_fsdp2_$FSDP_DEVICE.log)"
    FAIL=1
    grep -E 'Error|error:' "$log" | sort -u | head -10
  else
    res=$(fsdp_verdict "$log.out" "$FSDP_STEPS" "$FSDP_DEVICE" 2>>"$log") || FAIL=1
    [ -n "$res" ] || res="**FAILED**: the runs' output could not be read (see the log)"
    res="$res ($launch)"
  fi
  rm -f "$log.out"
  say "$name: $res"
  row "$name" "$res" $((SECONDS - t))
}
fsdp_step

# ---- benchmark ----------------------------------------------------------------------
BENCH="$BUILD/perf/zpp-quant-bench-gpu"
BLOG="$LOGDIR/gpu_check_bench.log"
: >"$BLOG"
t=$SECONDS
brc=0
modes=()
for mode in sym asym; do
  spent "zpp-quant-bench-gpu --mode $mode" && continue
  modes+=("$mode")
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
  row zpp-quant-bench-gpu "**FAILED** ($(timed_out $brc || echo "exit $brc"), see gpu_check_bench.log)" \
    $((SECONDS - t))
elif [ ${#modes[@]} != 0 ]; then
  row "zpp-quant-bench-gpu (${modes[*]})" ok $((SECONDS - t))
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
    # (the element-wise rows, bits "-", have their own table below)
    tail -n +2 "$f" | awk -F, '$3 != "-" {
      g = ($3 == 8) ? 0.8 : 0.7; v = "";
      if ($1 == "encode" || $1 == "decode")
        v = ($7 + 0 >= g) ? sprintf(">= %.1f met", g) : sprintf("**< %.1f missed**", g);
      printf "| %s | %s | %s | %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5, $6, $7, v}'
  done
  # the element-wise kernels: the same in both modes, so from the first
  # run; goal >= 0.7 of the copy ("bf16+2", "bf16+1": the bf16 buffer 2 or
  # 1 bytes past a 256-byte boundary)
  f="$BLOG.sym.csv"
  [ -s "$f" ] || f="$BLOG.asym.csv"
  if [ -s "$f" ] && awk -F, '$3 == "-" {found = 1} END {exit !found}' "$f"; then
    echo
    echo "## Element-wise kernels (134217728 elements; GB/s = bytes read + written per"
    echo "second; d2d = cudaMemcpyAsync of the same traffic in the same run)"
    echo
    echo "| op | dtype | GB/s | d2d GB/s | ratio | goal |"
    echo "| --- | --- | ---: | ---: | ---: | --- |"
    tail -n +2 "$f" | awk -F, '$3 == "-" {
      v = ($7 + 0 >= 0.7) ? ">= 0.7 met" : "**< 0.7 missed**";
      printf "| %s | %s | %s | %s | %s | %s |\n", $1, $2, $5, $6, $7, v}'
  fi
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
