#!/usr/bin/env bash
# The inter-node message cut on real links (docs/design.md, "Host
# algorithms and the MPI backend"): Open MPI's acknowledgement of a
# rendezvous leaves through the TCP connection's own send queue, behind the
# receiver's own data, so a large exchange both ways can run one direction
# after the other.  zpp's MPI transport cuts inter-node transfers in
# messages under the TCP eager limit (ZPP_NET_SEGMENT, 65408 by default on
# real links).  This runs zpp-bench's hierarchical bf16 all-gather and
# reduce-scatter on scripts/netns_cluster.sh (2 nodes x PPN ranks) with the
# cut (ZPP_NET_SEGMENT unset) and without (ZPP_NET_SEGMENT=0), alternated,
# RUNS times, and prints each row's median, fastest and slowest timed
# iteration, the busiest node link's bytes and the ratio of the median to
# that link's limit (bytes / rate).
#   usage: perf/net_segment_check.sh [BUILD_DIR]
#   env:   RATE (per node link, default 400mbit), SIZES (zpp-bench -b/-e,
#          default "4M 16M"), ITERS (timed iterations, 5), RUNS (2),
#          AG / RS (zpp-bench variants of each collective, default bf16;
#          e.g. AG=bf16,qwz8 RS=bf16,qgz4; mpi is Open MPI's own
#          collective on the same buffers), PPN (ranks per node, 4; with 1
#          there is no intra-node stage: one TCP flow each way), SEGS (the
#          ZPP_NET_SEGMENT settings each run alternates, default "unset 0";
#          "unset" alone compares the variants with the default cut)
# Needs root and iproute2 (exits 1 saying why otherwise); one cluster at a
# time (/run/zpp-cluster.lock); torn down on exit.  About 45 s per run at
# 400mbit.  Each launch runs under scripts/softirq_wait.sh: one during
# which ksoftirqd waited more than ZPP_SOFTIRQ_MAX_WAIT_S (5) s on a run
# queue is run again (at most ZPP_SOFTIRQ_TRIES, 3, tries; discarded every
# time: a failed launch); the last line gives the count.
set -uo pipefail
prog=net_segment_check.sh
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-build}" && pwd) || { echo "$prog: no build dir ${1:-build}" >&2; exit 1; }
bench=$build/perf/zpp-bench
cluster=$root/scripts/netns_cluster.sh
[ -x "$bench" ] || { echo "$prog: no $bench: build first" >&2; exit 1; }
. "$root/scripts/softirq_wait.sh"
rate=${RATE:-400mbit}
read -r lo hi <<< "${SIZES:-4M 16M}"
hi=${hi:-$lo}
iters=${ITERS:-5}
runs=${RUNS:-2}
[ -n "$lo" ] || { echo "$prog: SIZES '${SIZES:-}': must be one or two sizes" >&2; exit 2; }
case $iters in ''|*[!0-9]*|0) echo "$prog: ITERS '$iters': must be a positive integer" >&2; exit 2 ;; esac
[ "$iters" -le 100 ] || { echo "$prog: ITERS $iters: at most 100" >&2; exit 2; }
ppn=${PPN:-4}
case $ppn in 1|2|3|4|5|6|7|8) ;; *) echo "$prog: PPN '$ppn': 1 to 8" >&2; exit 2 ;; esac
declare -A variants=([allgather]=${AG:-bf16} [reducescatter]=${RS:-bf16})
for v in "${variants[@]}"; do
  [[ "$v" =~ ^[a-z0-9,-]+$ ]] || { echo "$prog: variants '$v': names like bf16,qwz8" >&2; exit 2; }
done
read -r -a segs <<< "${SEGS:-unset 0}"
[ ${#segs[@]} -gt 0 ] || { echo "$prog: SEGS is empty: name unset, 0 or a segment size" >&2; exit 2; }
for seg in "${segs[@]}"; do
  case $seg in
    unset) ;;
    ''|*[!0-9]*) echo "$prog: SEGS '${SEGS:-}': each is unset or a ZPP_NET_SEGMENT value (bytes, 0 = no cut)" >&2; exit 2 ;;
  esac
done
case $runs in ''|*[!0-9]*|0) echo "$prog: RUNS '$runs': must be a positive integer" >&2; exit 2 ;; esac
[ "$runs" -le 20 ] || { echo "$prog: RUNS $runs: at most 20" >&2; exit 2; }
[[ "$rate" =~ ^([0-9]+)mbit$ ]] || { echo "$prog: RATE '$rate': must be <n>mbit" >&2; exit 2; }
mbit=${BASH_REMATCH[1]}

why=$("$cluster" check) || { echo "$prog: no cluster: ${why#*: }" >&2; exit 1; }
exec 9> /run/zpp-cluster.lock
flock -w 600 9 || { echo "$prog: another cluster run holds /run/zpp-cluster.lock" >&2; exit 1; }
out=$(mktemp /tmp/zpp-net-seg.XXXXXX)
trap 'softirq_stop; "$cluster" down > /dev/null 2>&1; rm -f "$out"' EXIT
trap 'exit 130' INT TERM
"$cluster" up -n 2 -p "$ppn" -r "$rate" > /dev/null || exit 1
echo "# $prog: 2x$ppn namespace cluster, $rate per node link, all-gather ${variants[allgather]}, reduce-scatter ${variants[reducescatter]}, $lo..$hi per rank, $iters timed iterations; load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "run | ZPP_NET_SEGMENT | collective | variant | size | median ms | fastest..slowest ms | busiest node link MB | median / link limit"
status=0
for run in $(seq "$runs"); do
  for seg in "${segs[@]}"; do
    env_seg=()
    [ "$seg" = unset ] || env_seg=(-x ZPP_NET_SEGMENT="$seg")
    for coll in allgather reducescatter; do
      if ! softirq_launch "run $run, ZPP_NET_SEGMENT=$seg, $coll" "$out" '&1' \
          timeout -k 10 600 "$cluster" run -np $((2 * ppn)) -x OMPI_MCA_mpi_yield_when_idle=1 "${env_seg[@]}" \
          "$bench" --coll "$coll" --variant "${variants[$coll]}" -b "$lo" -e "$hi" -f 4 -n "$iters" -w 1 -c 1 \
          --format csv; then
        echo "$prog: run $run, ZPP_NET_SEGMENT=$seg, $coll failed:" >&2
        tail -5 "$out" >&2
        status=1
        continue
      fi
      # zpp-bench's CSV rows, by column name;
      # inter_bytes_node_max: the bytes over the busiest node link
      grep -v '^#' "$out" |
        awk -F, -v r="$run" -v s="$seg" -v m="$mbit" -v p="$prog" -v co="$coll" '
          $1 == "coll" { for (i = 1; i <= NF; i++) c[$i] = i; next }
          c["variant"] && $c["coll"] == co {
            if (!c["inter_bytes_node_max"]) { print p ": no inter_bytes_node_max column: rebuild zpp-bench" > "/dev/stderr"; exit 1 }
            med = $c["time_med_us"] / 1e3; b = $c["inter_bytes_node_max"]
            lim = b * 8 / (m * 1e6) * 1e3
            printf "%s | %s | %s | %s | %d | %.1f | %.1f..%.1f | %.2f | %.2f\n", r, s, $c["coll"], $c["variant"], $c["size"],
                   med, $c["time_min_us"] / 1e3, $c["time_max_us"] / 1e3, b / 1e6, (lim > 0 ? med / lim : 0)
          }' || status=1
    done
  done
done
echo "# load average at the end $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# $(softirq_summary)"
exit $status
