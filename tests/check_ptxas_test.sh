#!/usr/bin/env bash
# tools/check_ptxas.sh must refuse what it names: a kernel whose local
# array is indexed at run time (a stack frame in local memory) and a
# kernel that spills registers (96 live values under a bound of 32
# registers per thread), each named with ptxas's numbers; it must pass a
# clean kernel and a file without kernels (checking the files after it),
# and give 2 for a file that does not compile.
set -euo pipefail
nvcc=${1:?usage: check_ptxas_test.sh NVCC SOURCE_ROOT}
src=${2:?usage: check_ptxas_test.sh NVCC SOURCE_ROOT}
chk=$src/tools/check_ptxas.sh
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
pass=0 failn=0
expect() { # name want-status pattern file
  local out rc=0
  # $4: one file, or several separated by spaces (no spaces in $work)
  # shellcheck disable=SC2086
  out=$("$chk" --nvcc "$nvcc" --arch sm_90 $4 2>&1) || rc=$?
  if [ "$rc" -ne "$2" ]; then
    echo "FAIL: $1: exit $rc, want $2:"; echo "$out"; failn=$((failn + 1)); return
  fi
  if grep -q -- "$3" <<<"$out"; then
    echo "ok: $1"; pass=$((pass + 1))
  else
    echo "FAIL: $1: the output does not name '$3':"; echo "$out"; failn=$((failn + 1))
  fi
}

cat > "$work/clean.cu" <<'CU'
__global__ void twice(float *x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= 2.0f;
}
CU
expect "a clean kernel passes" 0 'no spill, no local memory' "$work/clean.cu"

cat > "$work/lmem.cu" <<'CU'
__global__ void local_array(const int *idx, float *out) {
  float a[32];
  for (int i = 0; i < 32; i++) a[i] = 0.0f;
  for (int i = 0; i < 32; i++) a[idx[i] & 31] += out[i];
  out[threadIdx.x] = a[idx[threadIdx.x] & 31];
}
__global__ void twice(float *x) { x[threadIdx.x] *= 2.0f; }
CU
expect "a local array indexed at run time" 1 \
  'local_array(int const\*, float\*): [1-9][0-9]* bytes stack frame' "$work/lmem.cu"

cat > "$work/spill.cu" <<'CU'
__global__ void __launch_bounds__(1024, 2) many_live(const float *in, float *out) {
  float v[96];
#pragma unroll
  for (int i = 0; i < 96; i++) v[i] = in[i * 1024 + threadIdx.x];
  float s = 0;
#pragma unroll
  for (int i = 0; i < 96; i++) s += v[i] * v[(i * 7) % 96];
#pragma unroll
  for (int i = 0; i < 96; i++) out[i * 1024 + threadIdx.x] = v[i] * s;
}
CU
expect "a kernel that spills" 1 'many_live(float const\*, float\*): .* [1-9][0-9]* bytes spill stores' \
  "$work/spill.cu"

# host code only: ptxas reports no function; the next file is still checked
cat > "$work/host.cu" <<'CU'
int twice_on_host(int x) { return 2 * x; }
CU
expect "a file without kernels passes" 0 'host.cu: no kernels for sm_90' "$work/host.cu"
expect "the file after one without kernels is checked" 1 \
  'local_array(int const\*, float\*): [1-9][0-9]* bytes stack frame' "$work/host.cu $work/lmem.cu"

printf '__global__ void broken(float *x) { x[0] = undeclared; }\n' > "$work/broken.cu"
expect "a file that does not compile" 2 'does not compile' "$work/broken.cu"

# --logs: the reports the library's build saves through tools/ptxas_log.sh
# (one compile for both architectures, as CMake compiles), read without
# compiling: the same verdicts; refused: a file without its report (never
# built, or its compile failed), a report older than its file, an
# architecture the build did not compile for, a file with kernels and a
# report without them.
logs=$work/logs
launch() { # file: compile it for sm_80 and sm_90 through the launcher
  "$src/tools/ptxas_log.sh" "$logs" "$nvcc" -gencode arch=compute_80,code=sm_80 \
    --generate-code=arch=compute_90,code=[sm_90] -std=c++17 -Xptxas=-v -c "$work/$1.cu" \
    -o "$work/$1.o" 2>> "$work/launcher.err"
}
: > "$work/launcher.err"
for f in clean lmem spill host; do launch $f; done
if grep -q -E 'ptxas info|bytes stack frame' "$work/launcher.err"; then
  echo "FAIL: tools/ptxas_log.sh passed ptxas's report on to the build's output:"
  cat "$work/launcher.err"; failn=$((failn + 1))
else
  echo "ok: the launcher keeps ptxas's report out of the build's output"; pass=$((pass + 1))
fi
rc=0; launch broken || rc=$?
if [ "$rc" -ne 0 ] && grep -q 'undeclared' "$work/launcher.err" && \
   ! ls "$logs" | grep -q broken; then
  echo "ok: a failed compile: its status and error pass through, no report"; pass=$((pass + 1))
else
  echo "FAIL: a failed compile through the launcher: exit $rc, reports: $(ls "$logs")"
  failn=$((failn + 1))
fi
expect_logs() { # name want-status pattern arch files...
  local out rc=0 name=$1 want=$2 pat=$3 arch=$4
  shift 4
  out=$("$chk" --logs "$logs" --arch "$arch" "$@" 2>&1) || rc=$?
  if [ "$rc" -ne "$want" ]; then
    echo "FAIL: --logs: $name: exit $rc, want $want:"; echo "$out"; failn=$((failn + 1)); return
  fi
  if grep -q -- "$pat" <<<"$out"; then
    echo "ok: --logs: $name"; pass=$((pass + 1))
  else
    echo "FAIL: --logs: $name: the output does not name '$pat':"; echo "$out"; failn=$((failn + 1))
  fi
}
expect_logs "a clean kernel passes on both architectures" 0 'clean.cu: 1 functions for sm_90' \
  sm_80,sm_90 "$work/clean.cu"
expect_logs "a local array on sm_80" 1 'local_array(int const\*, float\*): .*sm_80' \
  sm_80 "$work/clean.cu" "$work/lmem.cu"
expect_logs "a spill on sm_90" 1 'many_live(float const\*, float\*): .* [1-9][0-9]* bytes spill stores.*sm_90' \
  sm_90 "$work/spill.cu"
expect_logs "a file without kernels passes" 0 'host.cu: no kernels for sm_80' sm_80 "$work/host.cu"
expect_logs "a file whose compile failed" 2 'no ptxas report' sm_90 "$work/broken.cu"
expect_logs "an architecture the build did not compile for" 2 'not sm_100' \
  sm_100 "$work/clean.cu"
expect_logs "a file without kernels, an architecture not built" 2 'not sm_100' \
  sm_100 "$work/host.cu"
printf '\n// changed after the build\n' >> "$work/spill.cu"
expect_logs "a report older than its file" 2 'older than' sm_90 "$work/spill.cu"
lg=$logs/$(realpath "$work/clean.cu" | tr / _).log
{ head -1 "$lg"; echo "ptxas info    : 0 bytes gmem"; } > "$lg.cut" && mv "$lg.cut" "$lg"
expect_logs "a report cut short of a file's kernels" 2 "no ptxas report on .*clean.cu's kernels" \
  sm_80 "$work/clean.cu"

echo "check_ptxas_test: $pass passed, $failn failed"
[ "$failn" -eq 0 ]
