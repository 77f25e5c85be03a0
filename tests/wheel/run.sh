#!/usr/bin/env bash
# make test-wheel: the zpp wheel as a user gets it.
#
#   tests/wheel/run.sh PYTHON BUILD [JOBS]
#
# 1. Builds the wheel of pyproject.toml from this tree with PYTHON's pip
#    (--no-build-isolation: PYTHON's venv holds the pinned scikit-build-core,
#    python/requirements.txt) into BUILD/wheel-dist; the CMake build
#    directory BUILD/wheel-build persists, so a rebuild is incremental.
#    Every compile goes through tools/ccache_launcher.sh, as BUILD/'s do
#    (Makefile), with BUILD/'s C and C++ compilers: the sources BUILD/
#    compiled come from ccache, and the cache's hits and misses of this
#    build are printed.
# 2. Checks the wheel's contents (zpp/*.py, zpp/libzpp.so,
#    zpp/include/zpp/*.h, the dist-info; nothing else), and makes a fresh
#    venv BUILD/wheel-venv (removed first) with the pinned
#    python/requirements.txt and the zpp wheel, with --no-index from the
#    wheels that scripts/install-deps.sh --python downloaded into
#    .wheelhouse/ (missing or stale: this fails, naming it).
# 3. With no ZPP_LIBRARY, PYTHONPATH or LD_LIBRARY_PATH and the working
#    directory outside the tree: every RUNPATH entry of libzpp.so is
#    $ORIGIN or a directory outside the tree and BUILD, ldd finds every
#    library, `python -m zpp` (checked: the installed library and headers,
#    CUDA exactly when nvcc is found, NCCL and UCX as the wheel's CMake
#    found their headers, MPI when mpicc is; the installed metadata's
#    version is the library's), a 2-rank all-gather checked bit for bit
#    (tests/wheel/allgather.py) under mpirun and torchrun, and 2 steps of
#    examples/fsdp2_train.py under mpirun and torchrun.  Without MPI in
#    the wheel the mpirun steps are skipped, saying so.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
py_build=${1:?usage: run.sh PYTHON BUILD [JOBS]}
build=$(mkdir -p "$2" && cd "$2" && pwd)
jobs=${3:-2}
dist=$build/wheel-dist
venv=$build/wheel-venv
house=$root/.wheelhouse
req=$root/python/requirements.txt
t_all=$SECONDS

step() { echo "test-wheel: $*"; }
took() { step "$1: $(($SECONDS - $2)) s"; }
die() { echo "test-wheel: $*" >&2; exit 1; }
# pip with none of the user's settings that add sources (PIP_FIND_LINKS,
# pip.conf), allow the index (--no-index overridden) or send installs out
# of the venv (PIP_USER, PIP_TARGET, PIP_PREFIX)
pip_isolated() {
  env -u PIP_FIND_LINKS -u PIP_USER -u PIP_TARGET -u PIP_PREFIX -u PIP_NO_INDEX \
    PIP_CONFIG_FILE=/dev/null "$@"
}

# the pinned wheels of the fresh venv (step 2), checked first: the stamp of
# scripts/install-deps.sh (wheelhouse_stamp)
want="$(sha256sum "$req" | cut -d' ' -f1) $(python3 -c \
  'import sys, sysconfig; print(sys.implementation.cache_tag, sysconfig.get_platform())')"
if [ "$(cat "$house/.zpp-wheelhouse" 2>/dev/null)" != "$want" ]; then
  die "$house: no wheelhouse of $req for this python3 (stamp '$want'):" \
    "make it with scripts/install-deps.sh --python (make deps-python)"
fi

# ---- 0. the compiler launcher ---------------------------------------------------
bash "$root/tests/wheel/ccache_launcher_test.sh"

# ---- 1. the wheel -------------------------------------------------------------
t=$SECONDS
rm -rf "$dist"
launcher=$root/tools/ccache_launcher.sh
defs=()
for l in C CXX CUDA; do
  defs+=("--config-settings=cmake.define.CMAKE_${l}_COMPILER_LAUNCHER=$launcher")
done
# the compilers of BUILD/ (a compiler's other name is a ccache miss):
# scikit-build-core sets CC to Python's own (sysconfig) where CC is unset
cc_env=()
for v in C:CC CXX:CXX; do
  c=$(sed -n "s/^CMAKE_${v%%:*}_COMPILER:[A-Z]*=//p" "$build/CMakeCache.txt" 2>/dev/null || true)
  if [ -n "$c" ]; then cc_env+=("${v#*:}=$c"); fi
done
# this build's ccache results alone (the cache is shared with BUILD/'s)
stats=$build/wheel-ccache-stats.log
rm -f "$stats"
pip_isolated "${cc_env[@]}" CCACHE_STATSLOG="$stats" CMAKE_BUILD_PARALLEL_LEVEL="$jobs" \
  "$py_build" -m pip wheel "$root" -q --disable-pip-version-check --no-build-isolation --no-deps -w "$dist" \
  "--config-settings=build-dir=$build/wheel-build" "${defs[@]}"
whl=$(ls "$dist"/zpp-*.whl)
took "wheel $(basename "$whl") built" $t
if [ -s "$stats" ]; then
  step "ccache during the wheel's build (CCACHE_STATSLOG=$stats):"
  CCACHE_STATSLOG=$stats ccache --show-log-stats | sed 's/^/  /'
elif command -v ccache > /dev/null; then
  step "ccache: no compile went through it (nothing recompiled, or the cache is unusable)"
else
  step "ccache not installed: the wheel's sources were compiled without a cache"
fi
"$py_build" "$root/tests/wheel/check.py" wheel "$whl" "$root"

# ---- 2. a fresh venv ----------------------------------------------------------
t=$SECONDS
rm -rf "$venv"
python3 -m venv "$venv"
pip_isolated "$venv/bin/pip" install -q --disable-pip-version-check --no-compile --no-index \
  --find-links "$house" --no-deps -r "$req"
# the wheel's own dependencies must be met by what is there (--no-index)
pip_isolated "$venv/bin/pip" install -q --disable-pip-version-check --no-index \
  --find-links "$house" "$whl"
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
took "fresh venv $venv" $t

# ---- 3. the installed package -----------------------------------------------------
lib=$site/zpp/libzpp.so
runpath=$(readelf -d "$lib" | sed -n 's/.*(RUNPATH).*\[\(.*\)\]/\1/p')
step "libzpp.so RUNPATH: $runpath"
"$py_build" "$root/tests/wheel/check.py" runpath "$runpath" "$root" "$build"
if readelf -d "$lib" | grep -q '(RPATH)'; then
  die "$lib has an RPATH (want RUNPATH only)"
fi

work=$(mktemp -d /tmp/zpp-wheel-test.XXXXXX)
trap 'rm -rf "$work"' EXIT
cd "$work"
# the user's environment: nothing that points at the tree or a library
run() {
  env -u ZPP_LIBRARY -u PYTHONPATH -u ZPP_INCLUDE_DIR -u ZPP_BUILD_DIR -u LD_LIBRARY_PATH \
    PATH="$venv/bin:$PATH" OMPI_MCA_mpi_yield_when_idle=1 "$@"
}
ldd_out=$(run ldd "$lib") || die "$lib: ldd failed: $ldd_out"
if grep 'not found' <<<"$ldd_out"; then
  die "$lib: libraries not found with LD_LIBRARY_PATH unset"
fi

t=$SECONDS
run python -m zpp
cuda=0
if command -v nvcc > /dev/null || [ -n "${CUDACXX:-}" ] || [ -x /usr/local/cuda/bin/nvcc ]; then
  cuda=1
fi
mpi=0
command -v mpicc > /dev/null && mpi=1
# NCCL and UCX as the wheel's CMake decided: nccl.h found (ZPP_NCCL_INCLUDE_DIR
# in its cache) with CUDA; ucp/api/ucp.h found by its C compiler, as
# src/transport/transport_ucx.c looks (__has_include)
cache=$build/wheel-build/CMakeCache.txt
nccl=0
if [ $cuda = 1 ] && grep -q '^ZPP_NCCL_INCLUDE_DIR:PATH=/' "$cache"; then nccl=1; fi
cc=$(sed -n 's/^CMAKE_C_COMPILER:[A-Z]*=//p' "$cache")
[ -n "$cc" ] || die "$cache: no CMAKE_C_COMPILER"
ucx=0
if printf '#include <ucp/api/ucp.h>\n' | "$cc" -E -x c - > /dev/null 2>&1; then ucx=1; fi
version=$(sed -n 's/^project(zpp VERSION \([0-9.]*\).*/\1/p' "$root/CMakeLists.txt")
run python -m zpp --json | run python "$root/tests/wheel/check.py" info "$site" $cuda $mpi "$version" \
  $nccl $ucx
took "python -m zpp" $t

mpirun_=(mpirun --allow-run-as-root --oversubscribe --mca btl self,vader --bind-to none -np 2
         -x OMPI_MCA_mpi_yield_when_idle)
port() { run python "$root/tests/wheel/check.py" port; }

if [ $mpi = 1 ]; then
  t=$SECONDS
  run "${mpirun_[@]}" python "$root/tests/wheel/allgather.py" --site "$site"
  took "all-gather, mpirun -np 2" $t
else
  step "all-gather, mpirun -np 2: skipped: the wheel has no MPI (mpicc not found)"
fi
t=$SECONDS
run torchrun --nproc-per-node 2 --master-addr 127.0.0.1 --master-port "$(port)" \
  "$root/tests/wheel/allgather.py" --site "$site"
took "all-gather, torchrun --nproc-per-node 2" $t

fsdp=("$root/examples/fsdp2_train.py" --steps 2 --json --quiet)
if [ $mpi = 1 ]; then
  t=$SECONDS
  # MASTER_ADDR/MASTER_PORT: torch's env:// initialisation in the example
  # needs them under mpirun
  run env MASTER_ADDR=127.0.0.1 MASTER_PORT="$(port)" \
    "${mpirun_[@]}" -x MASTER_ADDR -x MASTER_PORT python "${fsdp[@]}" --comm zppmpi \
    | run python "$root/tests/wheel/check.py" fsdp 2
  took "examples/fsdp2_train.py --comm zppmpi, mpirun -np 2" $t
else
  step "examples/fsdp2_train.py --comm zppmpi, mpirun -np 2: skipped: the wheel has no MPI"
fi
t=$SECONDS
run torchrun --nproc-per-node 2 --master-addr 127.0.0.1 --master-port "$(port)" \
  "${fsdp[@]}" --comm zpp | run python "$root/tests/wheel/check.py" fsdp 2
took "examples/fsdp2_train.py --comm zpp, torchrun --nproc-per-node 2" $t

took "passed" $t_all
