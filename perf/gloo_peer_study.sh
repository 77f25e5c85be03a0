#!/usr/bin/env bash
# gloo as a peer: torch.distributed's gloo backend (what FSDP2 runs on CPU)
# and zpp's Python package on the same tensors, on the real cluster of
# scripts/netns_cluster.sh (network namespaces as nodes, each node's link
# shaped by tc tbf in both directions, the topology discovered).
# For each layout (2 nodes x 2 and x 4 ranks) and link rate (400mbit,
# 1600mbit, none: perf/cluster_study.sh explains them) ONE launch of
# perf/gloo_peer.py, which per size (64 KiB .. 64 MiB x4, bytes of the full
# gathered / reduced tensor in bf16) and collective runs, interleaved
# (gloo, zpp, gloo, zpp, ... REPS rounds, each starting one variant later,
# the same tensors):
#   all-gather      gloo bf16 and fp32 (dist.all_gather_into_tensor), zpp
#                   bf16 (Comm.allgather), zpp qwZ INT8 (Comm.qwz_allgather)
#   reduce-scatter  gloo bf16 and fp32 (dist.reduce_scatter_tensor with the
#                   op FSDP2 picks for a gloo group: AVG in torch 2.15), zpp
#                   bf16 (Comm.reduce_scatter, mean), zpp qgZ INT4
#                   (Comm.qgz_reduce_scatter, mean)
# and checks every output (perf/gloo_peer.py says how): a wrong row cannot
# be fast.  The table (perf/gloo_peer_table.py): median time, the median of
# the paired ratios to gloo's bf16 and fp32 rows of the same repetition,
# the link bound (the bytes the exact collective must carry over a node
# link / the rate), zpp's own link bytes, wrong elements.
#   usage: perf/gloo_peer_study.sh OUT_DIR [BUILD_DIR]
# BUILD_DIR (default build) holds libzpp.so (ZPP_LIBRARY; its headers from
# its CMakeCache's source tree, ZPP_BUILD_DIR).  Writes
# OUT_DIR/gloo_peer_study.csv (one row per timed call) and
# OUT_DIR/gloo_peer_study.md.  Needs root (exits 77 saying why where a
# cluster cannot be made), 1 if a launch failed (its rows are left out),
# 2 on a bad setting.
# Settings (environment):
#   ZPP_GLOO_STUDY_LAYOUTS    "2x2 2x4" (2xP: 2 nodes of P ranks, P 1..16)
#   ZPP_GLOO_STUDY_RATES      "400mbit 1600mbit none"
#   ZPP_GLOO_STUDY_SIZES      "64K 256K 1M 4M 16M 64M"
#   ZPP_GLOO_STUDY_REPS       repetitions (5), after one checked untimed call
#   ZPP_GLOO_STUDY_TIMEOUT_S  limit of one launch (1800)
#   ZPP_GLOO_STUDY_PYTHON     the python with torch, numpy, cffi (default
#                             .venv-torch/bin/python of the source tree)
#   ZPP_SOFTIRQ_MAX_WAIT_S, ZPP_SOFTIRQ_TRIES  every launch runs under
#                             scripts/softirq_wait.sh: one during which
#                             ksoftirqd waited more than 5 s on a run queue
#                             is discarded and run again, at most 3 tries (a
#                             launch discarded every time is a failed one);
#                             the table's note gives the count
# Small: ZPP_GLOO_STUDY_LAYOUTS=2x2 ZPP_GLOO_STUDY_RATES=1600mbit
# ZPP_GLOO_STUDY_SIZES="64K 256K 1M" ZPP_GLOO_STUDY_REPS=2 (about a minute).
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
for s in "${sizes[@]}"; do
  # a whole number of bf16 elements for up to 32 ranks, at least 64 KiB
  [[ "$s" =~ ^([0-9]{1,6})([KM])$ ]] && [ "$((10#${BASH_REMATCH[1]}))" -ge 1 ] ||
    bad "ZPP_GLOO_STUDY_SIZES: size '$s': must be an integer with K or M (e.g. 64K)"
  n=$((10#${BASH_REMATCH[1]} << 10))
  [ "${BASH_REMATCH[2]}" = M ] && n=$((n << 10))
  [ "$n" -ge 65536 ] || bad "ZPP_GLOO_STUDY_SIZES: size '$s': must be at least 64K"
  [ $((n % 64)) = 0 ] || bad "ZPP_GLOO_STUDY_SIZES: size '$s': must be a multiple of 64 bytes"
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
exec 9> /run/zpp-cluster.lock
flock -w 900 9 || { echo "$prog: another cluster run holds /run/zpp-cluster.lock" >&2; exit 1; }
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
size_list=$(IFS=,; echo "${sizes[*]}")
# the ranks: the package of this tree, the library of BUILD_DIR; rank 0's
# node (zpp-n0) holds torch's rendezvous store (zpp.init_process_group);
# gloo's sockets on the cluster link; Open MPI's waits yield the core
envs=(-x PYTHONPATH="$root/python" -x ZPP_LIBRARY="$lib" -x ZPP_BUILD_DIR="$build"
      -x ZPP_BOOTSTRAP_ADDR=zpp-n0 -x GLOO_SOCKET_IFNAME=zpp-veth
      -x OMPI_MCA_mpi_yield_when_idle=1)
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
    args=(--sizes "$size_list" --reps "$reps" --label "$layout,$rate")
    text="scripts/netns_cluster.sh up -n 2 -p $ppn -r $shape; scripts/netns_cluster.sh run -np $np -x ZPP_BOOTSTRAP_ADDR=zpp-n0 -x GLOO_SOCKET_IFNAME=zpp-veth -x OMPI_MCA_mpi_yield_when_idle=1 python perf/gloo_peer.py ${args[*]}"
    echo "$layout|$rate|$text" >> "$cmds"
    echo "\$ $text" >&2
    nlaunch=$((nlaunch + 1))
    rc=0
    softirq_launch "launch $nlaunch ($layout, $rate)" "$out/.launch.out" "$out/.launch.err" \
      timeout -k 10 "$tmo" "$cluster" run -np "$np" "${envs[@]}" \
      "$py" "$here/gloo_peer.py" "${args[@]}" || rc=$?
    if [ "$softirq_gave_up" = 1 ]; then
      status=1
      continue
    fi
    if [ "$rc" -ne 0 ]; then
      echo "$prog: exit $rc ($layout, $rate; 124: past ZPP_GLOO_STUDY_TIMEOUT_S $tmo s): its rows are left out" >&2
      tail -n 20 "$out/.launch.err" >&2
      status=1
      continue
    fi
    grep -E "^$layout,$rate," "$out/.launch.out" >> "$csv" || {
      echo "$prog: the launch ($layout, $rate) printed no rows" >&2
      status=1
    }
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
