#!/usr/bin/env bash
# make test-wheel: the zpp wheel as a user gets it.
#
#   tests/wheel/run.sh PYTHON BUILD [JOBS]
#
# 1. Builds the wheel of pyproject.toml from this tree with PYTHON's pip
#    (--no-build-isolation: PYTHON's venv holds the pinned scikit-build-core,
#    python/requirements.txt) into BUILD/wheel-dist; the CMake build
#    directory BUILD/wheel-build persists, so a rebuild is incremental.
# 2. Makes a fresh venv BUILD/wheel-venv (removed first) with the pinned
#    python/requirements.txt, from the wheels kept in BUILD/wheelhouse
#    (downloaded once per version of that file), and the zpp wheel.
# 3. With no ZPP_LIBRARY, PYTHONPATH or LD_LIBRARY_PATH and the working
#    directory outside the tree: libzpp.so's RUNPATH is $ORIGIN and points
#    nowhere into the tree, `python -m zpp` (checked: the installed library
#    and headers, CUDA exactly when nvcc is found, MPI when mpicc is), a
#    2-rank all-gather checked bit for bit (tests/wheel/allgather.py) under
#    mpirun and torchrun, and 2 steps of examples/fsdp2_train.py under
#    mpirun and torchrun.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
py_build=${1:?usage: run.sh PYTHON BUILD [JOBS]}
build=$(mkdir -p "$2" && cd "$2" && pwd)
jobs=${3:-2}
dist=$build/wheel-dist
venv=$build/wheel-venv
house=$build/wheelhouse
req=$root/python/requirements.txt
t_all=$SECONDS

step() { echo "test-wheel: $*"; }
took() { step "$1: $(($SECONDS - $2)) s"; }

# ---- 1. the wheel -------------------------------------------------------------
t=$SECONDS
rm -rf "$dist"
# ccache where installed: the sources compiled as BUILD/ compiled them
# come from the cache (Makefile, LAUNCHER_ARGS)
launcher=()
if cc=$(command -v ccache); then
  for l in C CXX CUDA; do launcher+=(-C "cmake.define.CMAKE_${l}_COMPILER_LAUNCHER=$cc"); done
fi
CMAKE_BUILD_PARALLEL_LEVEL=$jobs "$py_build" -m pip wheel "$root" -q --no-build-isolation \
  --no-deps -w "$dist" -C build-dir="$build/wheel-build" "${launcher[@]}"
whl=$(ls "$dist"/zpp-*.whl)
took "wheel $(basename "$whl") built" $t

# ---- 2. a fresh venv ----------------------------------------------------------
t=$SECONDS
rm -rf "$venv"
python3 -m venv "$venv"
want=$(sha256sum "$req" | cut -d' ' -f1)
if [ "$(cat "$house/.requirements.sha256" 2>/dev/null)" != "$want" ]; then
  step "downloading the wheels of $req into $house"
  rm -rf "$house"
  "$venv/bin/pip" download -q --no-deps -d "$house" -r "$req"
  echo "$want" > "$house/.requirements.sha256"
fi
"$venv/bin/pip" install -q --no-compile --no-index --find-links "$house" --no-deps -r "$req"
# the wheel's own dependencies must be met by what is there (--no-index)
"$venv/bin/pip" install -q --no-index --find-links "$house" "$whl"
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
took "fresh venv $venv" $t

# ---- 3. the installed package -----------------------------------------------------
lib=$site/zpp/libzpp.so
runpath=$(readelf -d "$lib" | sed -n 's/.*(RUNPATH).*\[\(.*\)\]/\1/p')
step "libzpp.so RUNPATH: $runpath"
case ":$runpath:" in
  *':$ORIGIN:'*) ;;
  *) echo "test-wheel: $lib: RUNPATH '$runpath' lacks \$ORIGIN" >&2; exit 1 ;;
esac
case "$runpath" in
  *"$root"*) echo "test-wheel: $lib: RUNPATH '$runpath' points into $root" >&2; exit 1 ;;
esac
if readelf -d "$lib" | grep -q '(RPATH)'; then
  echo "test-wheel: $lib has an RPATH (want RUNPATH only)" >&2; exit 1
fi

work=$(mktemp -d /tmp/zpp-wheel-test.XXXXXX)
trap 'rm -rf "$work"' EXIT
cd "$work"
# the user's environment: nothing that points at the tree or a library
run() {
  env -u ZPP_LIBRARY -u PYTHONPATH -u ZPP_INCLUDE_DIR -u ZPP_BUILD_DIR -u LD_LIBRARY_PATH \
    PATH="$venv/bin:$PATH" OMPI_MCA_mpi_yield_when_idle=1 "$@"
}
if run ldd "$lib" | grep 'not found'; then
  echo "test-wheel: $lib: libraries not found with LD_LIBRARY_PATH unset" >&2; exit 1
fi

t=$SECONDS
run python -m zpp
cuda=0
if command -v nvcc > /dev/null || [ -n "${CUDACXX:-}" ] || [ -x /usr/local/cuda/bin/nvcc ]; then
  cuda=1
fi
mpi=0
command -v mpicc > /dev/null && mpi=1
version=$(sed -n 's/^project(zpp VERSION \([0-9.]*\).*/\1/p' "$root/CMakeLists.txt")
run python -m zpp --json | run python "$root/tests/wheel/check.py" info "$site" $cuda $mpi "$version"
took "python -m zpp" $t

mpirun_=(mpirun --allow-run-as-root --oversubscribe --mca btl self,vader --bind-to none -np 2
         -x OMPI_MCA_mpi_yield_when_idle)
port() { run python "$root/tests/wheel/check.py" port; }

t=$SECONDS
run "${mpirun_[@]}" python "$root/tests/wheel/allgather.py" --site "$site"
took "all-gather, mpirun -np 2" $t
t=$SECONDS
run torchrun --nproc-per-node 2 --master-addr 127.0.0.1 --master-port "$(port)" \
  "$root/tests/wheel/allgather.py" --site "$site"
took "all-gather, torchrun --nproc-per-node 2" $t

fsdp=("$root/examples/fsdp2_train.py" --steps 2 --json --quiet)
t=$SECONDS
# MASTER_ADDR/MASTER_PORT: torch's env:// initialisation in the example
# needs them under mpirun
run env MASTER_ADDR=127.0.0.1 MASTER_PORT="$(port)" \
  "${mpirun_[@]}" -x MASTER_ADDR -x MASTER_PORT python "${fsdp[@]}" --comm zppmpi \
  | run python "$root/tests/wheel/check.py" fsdp 2
took "examples/fsdp2_train.py --comm zppmpi, mpirun -np 2" $t
t=$SECONDS
run torchrun --nproc-per-node 2 --master-addr 127.0.0.1 --master-port "$(port)" \
  "${fsdp[@]}" --comm zpp | run python "$root/tests/wheel/check.py" fsdp 2
took "examples/fsdp2_train.py --comm zpp, torchrun --nproc-per-node 2" $t

took "passed" $t_all
