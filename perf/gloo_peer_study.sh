#!/usr/bin/env bash
# gloo as a peer: torch.distributed's gloo backend (what FSDP2 runs on CPU)
# and zpp's Python package on the same tensors, on the real cluster of
# scripts/netns_cluster.sh (network namespaces as nodes, each node's link
# shaped by tc tbf in both directions, the topology discovered).
# For each layout (2 nodes x 2 and x 4 ranks), link rate (400mbit,
# 1600mbit, none: perf/cluster_study.sh explains them) and size (64 KiB ..
# 64 MiB x4, bytes of the full gathered / reduced tensor in bf16) one
# launch of perf/gloo_peer.py (short launches, as perf/cluster_study.sh's:
# the ksoftirqd rule below is a total over a launch), which per collective
# runs, interleaved (gloo, zpp, gloo, zpp, ... after two untimed calls of
# each, REPS rounds, each starting one variant later, the same tensors):
#   all-gather      gloo bf16 and fp32 (dist.all_gather_into_tensor), zpp
#                   bf16 (Comm.allgather), zpp qwZ INT8 (Comm.qwz_allgather)
#   reduce-scatter  gloo bf16 and fp32 (dist.reduce_scatter_tensor with the
#                   op FSDP2 picks for a gloo group: AVG in torch 2.15), zpp
#                   bf16 (Comm.reduce_scatter, mean), zpp qgZ INT4
#                   (Comm.qgz_reduce_scatter, mean)
# and checks every output (perf/gloo_peer.py says how; a launch with a
# wrong output exits 3: its rows are kept, their wrong column counts it,
# and the study ends with status 1).  The table (perf/gloo_peer_table.py):
# median time, the median of the paired ratios to gloo's bf16 and fp32
# rows of the same repetition, the link bound (the bytes the exact
# collective must carry over a node link / the rate), zpp's own link
# bytes, wrong elements.
#   usage: perf/gloo_peer_study.sh OUT_DIR [BUILD_DIR]
# BUILD_DIR (default build) holds libzpp.so (ZPP_LIBRARY; its headers from
# its CMakeCache's source tree, ZPP_BUILD_DIR).  Writes
# OUT_DIR/gloo_peer_study.csv (one row per timed call) and
# OUT_DIR/gloo_peer_study.md; above each table the commands that rerun its
# launches from the source tree.  Needs root (exits 77 saying why where a
# cluster cannot be made); exits 1 if a launch failed (its rows are left
# out) or had a wrong output (its rows are kept), 2 on a bad setting
# (before any cluster is made: every layout, rate, size and (layout, size)
# pair is checked first).
# Settings (environment):
#   ZPP_GLOO_STUDY_LAYOUTS    "2x2 2x4" (2xP: 2 nodes of P ranks, P 1..16)
#   ZPP_GLOO_STUDY_RATES      "400mbit 1600mbit none"
#   ZPP_GLOO_STUDY_SIZES      "64K 256K 1M 4M 16M 64M" (each N = size / 2
#                             elements a multiple of every layout's 2P
#                             ranks, no size twice)
#   ZPP_GLOO_STUDY_REPS       repetitions (5; 2 is a smoke test only: a
#                             median of two is their mean)
#   ZPP_GLOO_STUDY_TIMEOUT_S  limit of one launch (1800)
#   ZPP_GLOO_STUDY_PYTHON     the python with torch, numpy, cffi (default
#                             .venv-torch/bin/python of the source tree)
#   ZPP_GLOO_STUDY_LOCK       the cluster's lock file
#                             (/run/zpp-cluster.lock; tests give their own)
#   ZPP_SOFTIRQ_MAX_WAIT_S, ZPP_SOFTIRQ_TRIES  every launch runs under
#                             scripts/softirq_wait.sh: one during which
#                             ksoftirqd waited more than 5 s on a run queue
#                             is discarded and run again, at most 3 tries (a
#                             launch discarded every time is a failed one);
#                             the table's note gives the count
# A smoke test: ZPP_GLOO_STUDY_LAYOUTS=2x2 ZPP_GLOO_STUDY_RATES=1600mbit
# ZPP_GLOO_STUDY_SIZES="64K 256K 1M" ZPP_GLOO_STUDY_REPS=2 (3 launches,
# about a minute).
set -euo pipefail
prog=gloo_peer_study.sh
if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  echo "usage: $prog OUT_DIR [BUILD_DIR]" >&2
  exit 2
fi
out=$1
build=${2:-build}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
cluster=$root/scripts/netns_cluster.sh
lock=${ZPP_GLOO_STUDY_LOCK:-/run/zpp-cluster.lock}
. "$root/scripts/softirq_wait.sh"

bad() { echo "$prog: $1" >&2; exit 2; }
read -r -a layouts <<< "${ZPP_GLOO_STUDY_LAYOUTS-2x2 2x4}"
read -r -a rates <<< "${ZPP_GLOO_STUDY_RATES-400mbit 1600mbit none}"
read -r -a sizes <<< "${ZPP_GLOO_STUDY_SIZES-64K 256K 1M 4M 16M 64M}"
reps=${ZPP_GLOO_STUDY_REPS-5}
tmo=${ZPP_GLOO_STUDY_TIMEOUT_S-1800}
py=${ZPP_GLOO_STUDY_PYTHON:-$root/.venv-torch/bin/python}
[ ${#layouts[@]} -gt 0 ] || bad "ZPP_GLOO_STUDY_LAYOUTS is empty: give layouts such as 2x4"
[ ${#rates[@]} -gt 0 ] || bad "ZPP_GLOO_STUDY_RATES is empty: give tc rates, e.g. 400mbit, or none"
[ ${#sizes[@]} -gt 0 ] || bad "ZPP_GLOO_STUDY_SIZES is empty: give sizes, e.g. 64K 1M"
for l in "${layouts[@]}"; do
  [[ "$l" =~ ^2x([1-9]|1[0-6])$ ]] || bad "ZPP_GLOO_STUDY_LAYOUTS: '$l': must be 2xP, P 1..16 (2 nodes of P ranks)"
done
for r in "${rates[@]}"; do
  [[ "$r" =~ ^(none|[1-9][0-9]{0,5}(bit|kbit|mbit|gbit))$ ]] ||
    bad "ZPP_GLOO_STUDY_RATES: rate '$r': must be none or a positive integer with bit, kbit, mbit or gbit (e.g. 400mbit)"
done
declare -A seen_size=()
for s in "${sizes[@]}"; do
  [[ "$s" =~ ^([0-9]{1,6})([KM])$ ]] && [ "$((10#${BASH_REMATCH[1]}))" -ge 1 ] ||
    bad "ZPP_GLOO_STUDY_SIZES: size '$s': must be an integer with K or M (e.g. 64K)"
  n=$((10#${BASH_REMATCH[1]} << 10))
  [ "${BASH_REMATCH[2]}" = M ] && n=$((n << 10))
  [ "$n" -ge 65536 ] || bad "ZPP_GLOO_STUDY_SIZES: size '$s': must be at least 64K"
  [ -z "${seen_size[$n]:-}" ] || bad "ZPP_GLOO_STUDY_SIZES: size '$s': the size of '${seen_size[$n]}' again"
  seen_size[$n]=$s
  # every rank's shard a whole number of bf16 elements: N = n / 2 a
  # multiple of the layout's 2P ranks
  for l in "${layouts[@]}"; do
    np=$((2 * ${l#2x}))
    [ $((n / 2 % np)) = 0 ] ||
      bad "ZPP_GLOO_STUDY_SIZES, ZPP_GLOO_STUDY_LAYOUTS: size '$s' with layout '$l': $((n / 2)) bf16 elements are not a multiple of its $np ranks"
  done
done
[[ "$reps" =~ ^[1-9][0-9]{0,2}$ ]] || bad "ZPP_GLOO_STUDY_REPS '$reps': must be an integer 1..999"
[[ "$tmo" =~ ^[1-9][0-9]{0,4}$ ]] || bad "ZPP_GLOO_STUDY_TIMEOUT_S '$tmo': must be an integer 1..99999 (seconds)"
[ -x "$py" ] || { echo "$prog: no python $py (scripts/install-deps.sh --python makes .venv-torch; or set ZPP_GLOO_STUDY_PYTHON)" >&2; exit 1; }
lib=$(cd "$build" 2> /dev/null && pwd)/libzpp.so
[ -f "$lib" ] || { echo "$prog: no $build/libzpp.so: build first (BUILD_DIR '$build')" >&2; exit 1; }
build=$(cd "$build" && pwd)
"$py" -c 'import torch, numpy, cffi' 2> /dev/null ||
  { echo "$prog: $py lacks torch, numpy or cffi" >&2; exit 1; }
if ! why=$("$cluster" check); then
  echo "$prog: $why" >&2
  exit 77
fi
mkdir -p "$out"
exec 9> "$lock"
flock -w 900 9 || { echo "$prog: another cluster run holds $lock" >&2; exit 1; }
trap 'softirq_stop; "$cluster" down > /dev/null 2>&1 || true; rm -f "$out/.launch.out" "$out/.launch.err"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

csv=$out/gloo_peer_study.csv
cmds=$out/gloo_peer_study.cmds
meta=$out/gloo_peer_study.meta
"$py" "$here/gloo_peer.py" --print-header > "$csv"
: > "$cmds"
{
  echo "start $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "load_start $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "cores $(nproc)"
  echo "reps $reps"
  echo "cpu $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
} > "$meta"
# the ranks: the package of this tree, the library of BUILD_DIR; rank 0's
# node (zpp-n0) holds torch's rendezvous store (zpp.init_process_group);
# gloo's sockets on the cluster link; Open MPI's waits yield the core
envs=(-x PYTHONPATH="$root/python" -x ZPP_LIBRARY="$lib" -x ZPP_BUILD_DIR="$build"
      -x ZPP_BOOTSTRAP_ADDR=zpp-n0 -x GLOO_SOCKET_IFNAME=zpp-veth
      -x OMPI_MCA_mpi_yield_when_idle=1)
# the commands above the tables: the same launches, run from the source
# tree (its paths relative to it; one outside it stays absolute)
rel() { case $1 in "$root"/*) echo "${1#"$root"/}" ;; *) echo "$1" ;; esac; }
q() { printf '%q' "$1"; }
show_envs="-x PYTHONPATH=python -x ZPP_LIBRARY=$(q "$(rel "$lib")") -x ZPP_BUILD_DIR=$(q "$(rel "$build")") -x ZPP_BOOTSTRAP_ADDR=zpp-n0 -x GLOO_SOCKET_IFNAME=zpp-veth -x OMPI_MCA_mpi_yield_when_idle=1"
show_py=$(q "$(rel "$py")")
status=0
nlaunch=0
t0=$(date +%s)
for layout in "${layouts[@]}"; do
  ppn=${layout#2x}
  np=$((2 * ppn))
  "$cluster" up -n 2 -p "$ppn" > /dev/null
  for rate in "${rates[@]}"; do
    shape=$rate; [ "$rate" = none ] && shape=0
    "$cluster" shape "$shape"
    echo "$layout|$rate|scripts/netns_cluster.sh up -n 2 -p $ppn -r $shape" >> "$cmds"
    for size in "${sizes[@]}"; do
      args=(--sizes "$size" --reps "$reps" --label "$layout,$rate")
      text="scripts/netns_cluster.sh run -np $np $show_envs $show_py perf/gloo_peer.py ${args[*]}"
      echo "$layout|$rate|$text" >> "$cmds"
      echo "\$ $text" >&2
      nlaunch=$((nlaunch + 1))
      rc=0
      softirq_launch "launch $nlaunch ($layout, $rate, $size)" "$out/.launch.out" "$out/.launch.err" \
        timeout -k 10 "$tmo" "$cluster" run -np "$np" "${envs[@]}" \
        "$py" "$here/gloo_peer.py" "${args[@]}" || rc=$?
      if [ "$softirq_gave_up" = 1 ]; then
        status=1
        continue
      fi
      if [ "$rc" = 3 ]; then  # every row printed, some wrong: kept
        echo "$prog: exit 3 ($layout, $rate, $size): a wrong output (the rows' wrong column)" >&2
        status=1
      elif [ "$rc" -ne 0 ]; then
        echo "$prog: exit $rc ($layout, $rate, $size; 124: past ZPP_GLOO_STUDY_TIMEOUT_S $tmo s): its rows are left out" >&2
        tail -n 20 "$out/.launch.err" >&2
        status=1
        continue
      fi
      grep -E "^$layout,$rate," "$out/.launch.out" >> "$csv" || {
        echo "$prog: the launch ($layout, $rate, $size) printed no rows" >&2
        status=1
      }
    done
  done
done
"$cluster" down > /dev/null
t1=$(date +%s)
echo "load_end $(cut -d' ' -f1-3 /proc/loadavg)" >> "$meta"
echo "seconds $((t1 - t0))" >> "$meta"
if [ "$(wc -l < "$csv")" -gt 1 ]; then
  "$py" "$here/gloo_peer_table.py" "$csv" "$out/gloo_peer_study.md" --cmds "$cmds" --meta "$meta"
  softirq_md_note "$out/gloo_peer_study.md"
else
  echo "$prog: no rows: no table" >&2
  status=1
fi
rm -f "$cmds" "$meta"
echo "$prog: wrote $csv and $out/gloo_peer_study.md ($((t1 - t0)) s; $softirq_discards launches discarded for ksoftirqd's run-queue wait, $softirq_given_up given up)" >&2
exit "$status"
