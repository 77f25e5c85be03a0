#!/usr/bin/env bash
# zpp-quant-bench --cold: inputs read from memory, where the SIMD encoders
# and the element-wise kernels prefetch (src/kernels/quant_cpu.h).  The
# benchmark compares every row bytewise with the scalar path and exits 1
# on any difference: the prefetches must not change a byte (where they
# point is tested by QuantPrefetch.* in test_quant.cc; a request past a
# buffer would not fault here).  Odd lengths run the block tails, block 32
# the one-block encoder, block 1000 the long-block path.
# usage: quant_bench_test.sh ZPP_QUANT_BENCH
set -euo pipefail
qb=$1
fail() { echo "FAIL: $*" >&2; exit 1; }
for args in "--n 100003" "--n 4099 --asym --block 32" "--n 65537 --block 1000"; do
  # shellcheck disable=SC2086
  out=$("$qb" $args --iters 1 --warmup 0 --cold --format csv) ||
    fail "zpp-quant-bench $args --cold exited $?: $out"
  head -n 1 <<< "$out"
  grep -q '^# zpp-quant-bench: .*, cold (256 MiB written before each run)$' <<< "$out" ||
    fail "$args: the header does not say cold"
  rows=$(grep -c '^\(encode\|decode\|decode_acc\|ef_fused\|ef_passes\),' <<< "$out" || true)
  [ "$rows" -ge 16 ] || fail "$args: $rows rows"
  awk -F, 'NR > 2 && $NF != 0 { exit 1 }' <<< "$out" || fail "$args: a row differs: $out"
done
# without --cold the header says nothing of it
out=$("$qb" --n 1000 --iters 1 --warmup 0)
! grep -q cold <<< "$out" || fail "a warm run says cold"
echo "quant_bench_cold: ok"
