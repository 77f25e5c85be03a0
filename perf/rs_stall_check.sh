#!/usr/bin/env bash
# The wait-spin check on real links (docs/design.md, "Waiting"): Open MPI's
# TCP transport reads its sockets only every so many progress calls while it
# has no send of its own in flight, so a zpp wait that sleeps between polls
# can leave an inter-node transfer unread for seconds.  This runs zpp-bench's
# hierarchical bf16 reduce-scatter on scripts/netns_cluster.sh (2 nodes x 4
# ranks) with a short timeout, RUNS times for each ZPP_NET_SPIN_US in SPINS
# (alternated), and prints per run the ranks that timed out and the median,
# fastest and slowest of the timed iterations.
#   usage: perf/rs_stall_check.sh [BUILD_DIR]
#   env:   RATE (per node link, default 1600mbit), SIZE (input per rank,
#          default 16M), ITERS (timed iterations, 12), RUNS (4),
#          SPINS ("1000 100000": the old and the new default, microseconds),
#          TIMEOUT_S (1.5: ZPP_TIMEOUT_S of the runs)
# Needs root and iproute2 (exits 1 saying why otherwise); one cluster at a
# time (/run/zpp-cluster.lock); torn down on exit.  About 20 s per run.
# Each launch runs under scripts/softirq_wait.sh: one during which
# ksoftirqd waited more than ZPP_SOFTIRQ_MAX_WAIT_S (5) s on a run queue is
# run again (at most ZPP_SOFTIRQ_TRIES, 3, tries; discarded every time: its
# row says so and the script exits 1); the last line gives the count.
set -uo pipefail
prog=rs_stall_check.sh
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-build}" && pwd) || { echo "$prog: no build dir ${1:-build}" >&2; exit 1; }
bench=$build/perf/zpp-bench
cluster=$root/scripts/netns_cluster.sh
[ -x "$bench" ] || { echo "$prog: no $bench: build first" >&2; exit 1; }
. "$root/scripts/softirq_wait.sh"
rate=${RATE:-1600mbit}
size=${SIZE:-16M}
iters=${ITERS:-12}
runs=${RUNS:-4}
read -r -a spins <<< "${SPINS:-1000 100000}"
timeout_s=${TIMEOUT_S:-1.5}
case $runs in ''|*[!0-9]*|0) echo "$prog: RUNS '$runs': must be a positive integer" >&2; exit 2 ;; esac
[ "$runs" -le 50 ] || { echo "$prog: RUNS $runs: at most 50" >&2; exit 2; }

why=$("$cluster" check) || { echo "$prog: no cluster: ${why#*: }" >&2; exit 1; }
exec 9> /run/zpp-cluster.lock
flock -w 600 9 || { echo "$prog: another cluster run holds /run/zpp-cluster.lock" >&2; exit 1; }
log=$(mktemp /tmp/zpp-rs-stall.XXXXXX)
trap 'softirq_stop; "$cluster" down > /dev/null 2>&1; rm -f "$log"' EXIT
trap 'exit 130' INT TERM
"$cluster" up -n 2 -p 4 -r "$rate" > /dev/null || exit 1
echo "# $prog: 2x4 namespace cluster, $rate per node link, bf16 reduce-scatter of $size per rank, $iters timed iterations, ZPP_TIMEOUT_S=$timeout_s; load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# command of each run: scripts/netns_cluster.sh run -np 8 -x ZPP_TIMEOUT_S=$timeout_s -x ZPP_NET_SPIN_US=S zpp-bench --coll reducescatter --variant bf16 -b $size -e $size -n $iters -w 2 -c 1"
echo "spin_us,run,ranks_timed_out,med_ms,min_ms,max_ms"
status=0
for ((r = 1; r <= runs; r++)); do
  for s in "${spins[@]}"; do
    softirq_launch "run $r, ZPP_NET_SPIN_US=$s" "$log" '&1' \
      timeout -k 10 300 "$cluster" run -x OMPI_MCA_mpi_yield_when_idle=1 -np 8 \
      -x ZPP_TIMEOUT_S="$timeout_s" -x ZPP_NET_SPIN_US="$s" \
      "$bench" --coll reducescatter --variant bf16 -b "$size" -e "$size" \
      -n "$iters" -w 2 -c 1 --format csv
    if [ "$softirq_gave_up" = 1 ]; then
      echo "$s,$r,given up: ksoftirqd waited more than $softirq_max s in each of $softirq_tries tries,,,"
      status=1
      continue
    fi
    tmo=$(grep -c 'no completion within' "$log")
    # zpp-bench's CSV row of the variant, by column name
    row=$(grep -v '^#' "$log" | awk -F, '
      $1 == "coll" { for (i = 1; i <= NF; i++) c[$i] = i; next }
      c["variant"] && $c["variant"] == "bf16" {
        printf "%.1f,%.1f,%.1f", $c["time_med_us"] / 1000, $c["time_min_us"] / 1000,
          $c["time_max_us"] / 1000 }')
    echo "$s,$r,$tmo,${row:-,,}"
  done
done
echo "# load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# $(softirq_summary)"
exit $status
