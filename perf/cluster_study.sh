#!/usr/bin/env bash
# The bandwidth study on real links (perf/bandwidth_study.sh --cluster):
# 8 ranks as 2 nodes x 4 ranks of scripts/netns_cluster.sh (network
# namespaces, the topology discovered), each node's link shaped by tc tbf in
# both directions:
#   1600mbit  per node = 4 ranks x 0.4 Gbit/s: the compute:network ratio of
#             H200s on 400 Gb/s NDR, as the emulated study scales it
#             (docs/bench/collectives.md, "Why 0.4 Gbit/s")
#   400mbit   per node = 4 x 0.1 Gbit/s: 100 Gb Ethernet
#   none      unshaped veth (what 2 shared cores move through TCP)
# At each: zpp-bench all-gather (bf16 as ZPP_ALGO=auto chooses, bf16-flat
# and bf16-hier (each of zpp's algorithms forced), qwz8, qwz4, Open MPI's
# MPI_Allgather) and reduce-scatter (bf16, bf16-flat, bf16-hier, qgz4,
# qgz8-4, qgz16-4
# (bf16 inside the node, INT4 across), Open MPI's
# MPI_Reduce_scatter_block), 64 KiB .. 16 MiB (x4): median and spread of
# 50 timed iterations below 1 MiB (-w 5; one call takes milliseconds, and 5
# left the zpp / Open MPI ratio at the mercy of one scheduling hiccup), 15
# at 1-4 MiB (-w 2) and 5 from 16 MiB (-w 1) (ZPP_CLUSTER_STUDY_SMALL_ITERS,
# _MID_ITERS, _ITERS), the variants of each launch timed round-robin
# (zpp-bench --interleave: a slow phase of the shared machine slows every
# variant of a size alike, not one); and zpp on its UCX backend (--backend ucx:
# bf16 and qwz8, bf16 and qgz4; rows ucx-*), UCX's TCP between the nodes.
# Then the same benchmark on zpp's in-library emulation (ZPP_TOPO=2x4,
# ZPP_EMU_INTER_GBIT, root namespace, shared memory) at the per-rank share
# of each shaped rate (rate / 4) and at the whole rate (one NIC per node),
# 1 and 4 MiB.
#   usage: perf/cluster_study.sh OUT_DIR [BUILD_DIR]
# Writes OUT_DIR/cluster_study.csv (every row: mode real|emu, the link
# setting, zpp-bench's columns), OUT_DIR/cluster_study.md (tables, the
# command above each) and OUT_DIR/cluster_study_time.png,
# OUT_DIR/cluster_study_emu.png.  Needs root (exits 1 saying why if a
# cluster cannot be made).  Run time on 2 idle cores: the three links to
# 4 MiB without the UCX launches (ZPP_CLUSTER_STUDY_MAXBYTES=4M
# ZPP_CLUSTER_STUDY_UCX=0 ZPP_CLUSTER_STUDY_MID_ITERS=10
# ZPP_CLUSTER_STUDY_ITERS=3) 410 s on the cluster and 35 s of emulation;
# the defaults (to 16 MiB, every tuned algorithm of mpi-best at each
# size, the UCX launches) take longer, and discarded launches run again.
# Smaller: ZPP_CLUSTER_STUDY_RATES="400mbit" ZPP_CLUSTER_STUDY_MAXBYTES=1M
# ZPP_CLUSTER_STUDY_EMU=0 ZPP_CLUSTER_STUDY_UCX=0 (no UCX launches: no
# ucx-* rows).
# Every launch on the cluster runs under scripts/softirq_wait.sh: one during
# which ksoftirqd waited more than ZPP_SOFTIRQ_MAX_WAIT_S (5) s on a run
# queue is discarded and run again (at most ZPP_SOFTIRQ_TRIES, 3, tries; a
# launch discarded every time is a failed one, its rows left out); the
# table's notes give the count and the waits of the launches kept.
set -euo pipefail
prog=cluster_study.sh
if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  echo "usage: $prog OUT_DIR [BUILD_DIR]" >&2
  exit 2
fi
out=$1
build=${2:-build}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cluster=$here/../scripts/netns_cluster.sh
. "$here/../scripts/softirq_wait.sh"
bench=$(cd "$build" && pwd)/perf/zpp-bench
[ -x "$bench" ] || { echo "$prog: no $bench: build first" >&2; exit 1; }
python3 -c 'import matplotlib' 2> /dev/null || {
  echo "$prog: python3 matplotlib is missing (pip install matplotlib)" >&2
  exit 1
}
if ! why=$("$cluster" check); then
  echo "$prog: $why" >&2
  exit 1
fi
mkdir -p "$out"
exec 9> /run/zpp-cluster.lock
flock -w 900 9 || { echo "$prog: another cluster run holds /run/zpp-cluster.lock" >&2; exit 1; }
trap 'softirq_stop; "$cluster" down; rm -f "$out/.bench.out" "$out/.bench.err"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

read -r -a rates <<< "${ZPP_CLUSTER_STUDY_RATES:-1600mbit 400mbit none}"
maxbytes=${ZPP_CLUSTER_STUDY_MAXBYTES:-16M}
ucx=${ZPP_CLUSTER_STUDY_UCX:-1}
[[ "$ucx" =~ ^[01]$ ]] || {
  echo "$prog: ZPP_CLUSTER_STUDY_UCX '$ucx': must be 0 or 1" >&2; exit 2; }
iters=${ZPP_CLUSTER_STUDY_ITERS:-5}
small_iters=${ZPP_CLUSTER_STUDY_SMALL_ITERS:-50}
mid_iters=${ZPP_CLUSTER_STUDY_MID_ITERS:-15}
for v in iters small_iters mid_iters; do
  [[ "${!v}" =~ ^[1-9][0-9]{0,3}$ ]] || {
    echo "$prog: ZPP_CLUSTER_STUDY_${v^^} '${!v}': must be an integer 1..9999" >&2; exit 2; }
done
# bytes of a size as zpp-bench reads it (an integer, optional K/M/G)
bytes_of() {
  [[ "$1" =~ ^([0-9]{1,12})([KkMmGg]?)$ ]] || return 1
  local n=$((10#${BASH_REMATCH[1]}))
  case ${BASH_REMATCH[2]} in
    K|k) n=$((n << 10)) ;; M|m) n=$((n << 20)) ;; G|g) n=$((n << 30)) ;;
  esac
  echo "$n"
}
maxb=$(bytes_of "$maxbytes") && [ "$maxb" -ge $((64 << 10)) ] || {
  echo "$prog: ZPP_CLUSTER_STUDY_MAXBYTES '$maxbytes': must be an integer with an optional K, M or G suffix, at least 64K" >&2
  exit 2
}
# zpp-bench's sizes, 64 KiB x 4^k up to maxbytes, one launch each ("-b S
# -e S -n N -w W"): the ksoftirqd rule below is a total over a launch, and
# a launch of two sizes with every tuned algorithm of mpi-best runs for
# minutes, long enough for the waits of an ordinary launch to add up past
# the limit.  Below 1 MiB small_iters timed iterations after 5 untimed
# ones, 1-4 MiB mid_iters after 2 (one slow TCP recovery among 5 moved a
# median by 2.8x there), from 16 MiB iters after 1.
size_runs=()
for ((sz = 64 << 10; sz <= maxb; sz *= 4)); do
  if [ "$sz" -lt $((1 << 20)) ]; then
    size_runs+=("-b $((sz >> 10))K -e $((sz >> 10))K -n $small_iters -w 5")
  elif [ "$sz" -lt $((16 << 20)) ]; then
    size_runs+=("-b $((sz >> 20))M -e $((sz >> 20))M -n $mid_iters -w 2")
  else
    size_runs+=("-b $((sz >> 20))M -e $((sz >> 20))M -n $iters -w 1")
  fi
done
# mpi-han, mpi-best: Open MPI's HAN and the fastest of tuned's algorithms
# per size (perf/bench_mpi_peers.c), beside its default selection (mpi).
declare -A variants=([allgather]=bf16,bf16-flat,bf16-hier,qwz8,qwz4,mpi,mpi-han,mpi-best [reducescatter]=bf16,bf16-flat,bf16-hier,qgz4,qgz8-4,qgz16-4,mpi,mpi-han,mpi-best)
declare -A emu_variants=([allgather]=bf16,qwz8 [reducescatter]=bf16,qgz4)
# zpp over its UCX backend on the same links (UCX's TCP between the nodes,
# shared memory inside one): rows named ucx-<variant>.
declare -A ucx_variants=([allgather]=bf16,qwz8 [reducescatter]=bf16,qgz4)
ucx_env=(-x UCX_TLS=tcp,sm,self -x UCX_NET_DEVICES=zpp-veth)
# Both backends' runs: zpp-bench's MPI_Barrier between the timed calls
# yields the core instead of spinning (8 ranks on 2 cores).
yield_env=(-x OMPI_MCA_mpi_yield_when_idle=1)
# Put before each row's variant name by run (ucx- for the UCX runs); set
# here so that a variable of the caller's environment cannot rename rows.
row_prefix=
csv=$out/cluster_study.csv
cmds=$out/cluster_study.cmds
meta=$out/cluster_study.meta
echo "mode,link,coll,variant,size,count,dtype,time_us,algbw,busbw,intra_bytes,inter_bytes,ratio,max_err,wrong,inter_bytes_max,time_med_us,time_min_us,time_max_us,inter_bytes_node_max" > "$csv"
: > "$cmds"
{
  echo "start $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "load_start $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "cores $(nproc)"
  echo "iters $iters"
  echo "small_iters $small_iters"
  echo "mid_iters $mid_iters"
  echo "interleave 1"
  echo "cpu $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
} > "$meta"
status=0
nlaunch=0

# run MODE LINK KEY: one zpp-bench run (arguments after the key), its rows
# appended to the CSV, the command (key: its text) to the command list.
# row_prefix (empty but for the UCX runs) is put before each row's variant
# name.  Only zpp-bench's rows (first field a collective) go to the CSV:
# anything else on stdout (a library's log line) is left out.  A run on the
# cluster (mode real) goes through softirq_launch: a discarded try's rows
# never reach the CSV, nor do those of a launch given up.
run() {
  local mode=$1 link=$2 text=$3 rc=0 prefix=$row_prefix
  shift 3
  echo "$mode|$link|$text" >> "$cmds"
  echo "\$ $text" >&2
  if [ "$mode" = real ]; then
    nlaunch=$((nlaunch + 1))
    softirq_launch "launch $nlaunch ($link)" "$out/.bench.out" "$out/.bench.err" "$@" || rc=$?
    if [ "$softirq_gave_up" = 1 ]; then
      status=1
      return
    fi
  else
    "$@" > "$out/.bench.out" 2> "$out/.bench.err" 9>&- || rc=$?  # 9>&-: no lock for the ranks
  fi
  if [ "$rc" -ne 0 ]; then
    echo "$prog: exit $rc: $text" >&2
    tail -5 "$out/.bench.err" >&2
    status=1
  fi
  grep -E '^(allgather|reducescatter),' "$out/.bench.out" |
    sed "s/^\([^,]*\),/\1,$prefix/; s/^/$mode,$link,/" >> "$csv" || true
}

t0=$(date +%s)
"$cluster" up -n 2 -p 4
for rate in "${rates[@]}"; do
  "$cluster" shape "$rate"
  for coll in allgather reducescatter; do
  for sz in "${size_runs[@]}"; do
    read -r -a sargs <<< "$sz"
    args=(--coll "$coll" --variant "${variants[$coll]}" "${sargs[@]}" -f 4
          --interleave -c 1 --format csv)
    run real "$rate" "scripts/netns_cluster.sh up -n 2 -p 4 -r $rate; scripts/netns_cluster.sh run -np 8 ${yield_env[*]} zpp-bench ${args[*]}" \
      timeout -k 10 900 "$cluster" run -np 8 "${yield_env[@]}" "$bench" "${args[@]}"
    [ "$ucx" = 1 ] || continue
    args=(--backend ucx --coll "$coll" --variant "${ucx_variants[$coll]}" "${sargs[@]}"
          -f 4 --interleave -c 1 --format csv)
    row_prefix=ucx- run real "$rate" "scripts/netns_cluster.sh run -np 8 ${yield_env[*]} ${ucx_env[*]} zpp-bench ${args[*]} (rows ucx-*)" \
      timeout -k 10 600 "$cluster" run -np 8 "${yield_env[@]}" "${ucx_env[@]}" "$bench" "${args[@]}"
  done
  done
done
"$cluster" down
t1=$(date +%s)

# The same benchmark on zpp's emulation: one machine, ZPP_TOPO=2x4, shared
# memory between the ranks, the per-rank NIC clock of docs/design.md.
if [ "${ZPP_CLUSTER_STUDY_EMU:-1}" != 0 ]; then
  export OMPI_MCA_mpi_yield_when_idle=1
  mpirun=(mpirun --allow-run-as-root --oversubscribe --mca btl self,vader
          --bind-to none -np 8 -x ZPP_TOPO=2x4 -x OMPI_MCA_mpi_yield_when_idle)
  declare -A done_g=()
  for rate in "${rates[@]}"; do
    [[ "$rate" =~ ^[0-9]+mbit$ ]] || continue
    mbit=${rate%mbit}
    for g in $(python3 -c "print('%g %g' % ($mbit / 4000, $mbit / 1000))"); do
      [ -n "${done_g[$g]:-}" ] && continue   # 0.4: 1600mbit / 4 and 400mbit
      done_g[$g]=1
      for coll in allgather reducescatter; do
        args=(--coll "$coll" --variant "${emu_variants[$coll]}" -b 1M -e 4M -f 4
              -n "$mid_iters" -w 2 --interleave -c 1 --format csv)
        run emu "$g" "ZPP_TOPO=2x4 ZPP_EMU_INTER_GBIT=$g mpirun -np 8 zpp-bench ${args[*]}" \
          timeout -k 10 900 "${mpirun[@]}" -x ZPP_EMU_INTER_GBIT="$g" "$bench" "${args[@]}"
      done
    done
  done
fi
t2=$(date +%s)
echo "load_end $(cut -d' ' -f1-3 /proc/loadavg)" >> "$meta"
echo "seconds_real $((t1 - t0))" >> "$meta"
echo "seconds_emu $((t2 - t1))" >> "$meta"

python3 "$here/plot_cluster_study.py" --markdown "$csv" "$cmds" "$meta" > "$out/cluster_study.md"
softirq_md_note "$out/cluster_study.md"
python3 "$here/plot_cluster_study.py" --plot "$csv" "$out"
rm -f "$cmds" "$meta"
echo "wrote $out/cluster_study.{csv,md} and PNGs ($((t1 - t0)) s real links, $((t2 - t1)) s emulation); $softirq_discards launches discarded for ksoftirqd's run-queue wait, $softirq_given_up given up" >&2
exit "$status"
