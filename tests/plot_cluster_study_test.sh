#!/bin/bash
# perf/plot_cluster_study.py --markdown on a made-up study: the rows
# mpi-best[<algorithm>] are one series, each table row names its
# algorithm, and the targets are measured against the fastest of zpp's
# bf16 and every Open MPI peer (mpi, mpi-han, mpi-best), named in the cell.
# Usage: plot_cluster_study_test.sh SOURCE_DIR
set -euo pipefail
src=${1:?source dir}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
hdr="mode,link,coll,variant,size,count,dtype,time_us,algbw,busbw,intra_bytes,inter_bytes,ratio,max_err,wrong,inter_bytes_max,time_med_us,time_min_us,time_max_us,inter_bytes_node_max"
row() { # variant size median_us
  echo "real,400mbit,allgather,$1,$2,1,bf16,$3,1,1,,,1,0,0,,$3,$3,$3,"
}
m4=$((4 << 20)) m16=$((16 << 20))
# study OUT [BF16_4M_US [HIER_16M_US]]: the made-up study through the script
study() {
  {
    echo "$hdr"
    row bf16 $m4 "${2:-10000}"; row mpi $m4 12000; row mpi-han $m4 9000
    row "mpi-best[ring]" $m4 8000; row qwz8 $m4 4000
    row bf16-flat $m4 9500; row bf16-hier $m4 11000
    row bf16 $m16 40000; row mpi $m16 30000; row mpi-han $m16 50000
    row "mpi-best[bruck]" $m16 45000; row qwz8 $m16 15000
    row bf16-flat $m16 48000; row bf16-hier $m16 "${3:-40000}"
  } >"$dir/study.csv"
  python3 "$src/perf/plot_cluster_study.py" --markdown "$dir/study.csv" \
    "$dir/cmds" "$dir/meta" >"$dir/$1"
}
echo "real|400mbit|zpp-bench --coll allgather" >"$dir/cmds"
echo "start 2026-01-01" >"$dir/meta"
study out.md
fail() { echo "FAIL: $*"; cat "$dir/${out:-out.md}"; exit 1; }
grep -q '| 4 MiB | mpi-best\[ring\] | 8.00 |' "$dir/out.md" ||
  fail "no table row mpi-best[ring] at 4 MiB"
grep -q '| 16 MiB | mpi-best\[bruck\] | 45.0 |' "$dir/out.md" ||
  fail "no table row mpi-best[bruck] at 16 MiB"
# 4 MiB: the fastest bf16 is mpi-best's 8 ms: 4 / 8; 16 MiB: mpi's 30 ms
grep -q '| qwz8 <= 0.6 x best bf16 | 0.4 Gbit/s | 4 MiB | 0.50 (mpi-best\[ring\]) | yes |' \
  "$dir/out.md" || fail "qwz8 at 4 MiB not against mpi-best[ring]"
grep -q '| qwz8 <= 0.6 x best bf16 | 0.4 Gbit/s | 16 MiB | 0.50 (mpi) | yes |' \
  "$dir/out.md" || fail "qwz8 at 16 MiB not against mpi"
# zpp bf16 / the fastest peer: 10 / 8 at 4 MiB, 40 / 30 at 16 MiB
grep -q 'worst 1.33 (16 MiB, mpi) | no |' "$dir/out.md" ||
  fail "bf16 not against the fastest Open MPI peer"
# auto (bf16) / the fastest of bf16-flat, bf16-hier: 10 / 9.5 at 4 MiB,
# 40 / 40 at 16 MiB
grep -q "| auto bf16 / zpp's best algorithm all-gather <= 1.1 at every size | 0.4 Gbit/s | 4 MiB..16 MiB | worst 1.05 (4 MiB, bf16-flat) | yes |" \
  "$dir/out.md" || fail "auto not against the fastest of zpp's own algorithms"
# the bound target's factor is 1.2
grep -q '| bf16 all-gather <= 1.2 x bound | 0.4 Gbit/s | 4 MiB |' "$dir/out.md" ||
  fail "no bound target at 1.2"
# the misses: bf16-hier at 16 MiB in 35 ms: auto 40 / 35 = 1.14 > 1.1
out=auto_no.md
study $out 10000 35000
grep -q "| auto bf16 / zpp's best algorithm all-gather <= 1.1 at every size | 0.4 Gbit/s | 4 MiB..16 MiB | worst 1.14 (16 MiB, bf16-hier) | no |" \
  "$dir/$out" || fail "auto's miss not reported"
# bf16 at 4 MiB in 500 ms against the bound of 4 shards of 4 MiB at
# 0.4 Gbit/s (335.5 ms): 1.49 > 1.2
out=bound_no.md
study $out 500000
grep -q '| bf16 all-gather <= 1.2 x bound | 0.4 Gbit/s | 4 MiB | 1.49 | no |' \
  "$dir/$out" || fail "the bound target's miss not reported"
echo "plot_cluster_study: ok"
