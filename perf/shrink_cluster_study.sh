#!/usr/bin/env bash
# The time from a rank's SIGKILL to the survivors' first exact collective,
# on the namespace cluster (scripts/netns_cluster.sh, 2 nodes x 4 ranks,
# the node map discovered): tests/shrink_cluster_worker.c's "kill" mode.
# Rank 5 SIGKILLs itself in the middle of a COLL call, writing the time of
# the kill first; the 7 survivors see the failure (at most ZPP_TIMEOUT_S
# T), shrink over zpp's own sockets, check an all-gather bitwise, and new
# rank 0 prints the slowest survivor's time from the kill to that result.
# RUNS runs for each T in TIMEOUTS (alternated); per T the median and
# min..max, against the target of ZPP_TIMEOUT_S + 2 s (docs/runtime.md,
# "Measured", quotes a run).
#   usage: perf/shrink_cluster_study.sh [BUILD_DIR]
#   env:   RUNS (5), TIMEOUTS ("3 5": ZPP_TIMEOUT_S of the runs, seconds),
#          COLL (qwz, or hpz, qgz: the call rank 5 dies in), RATE (per node
#          link, default 1gbit)
# Needs root and iproute2 (exits 1 saying why otherwise); one cluster at a
# time (/run/zpp-cluster.lock); torn down on exit.  About 10-15 s per run.
# Each launch runs under scripts/softirq_wait.sh: one during which
# ksoftirqd waited more than ZPP_SOFTIRQ_MAX_WAIT_S (5) s on a run queue is
# run again (at most ZPP_SOFTIRQ_TRIES, 3, tries; a launch discarded every
# time is left out of the summary, its row says so and the script exits 1).
set -uo pipefail
prog=shrink_cluster_study.sh
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-build}" && pwd) || { echo "$prog: no build dir ${1:-build}" >&2; exit 1; }
worker=$build/tests/shrink_cluster_worker
cluster=$root/scripts/netns_cluster.sh
[ -x "$worker" ] || { echo "$prog: no $worker: build first (target shrink_cluster_worker)" >&2; exit 1; }
. "$root/scripts/softirq_wait.sh"
. "$root/scripts/reported_run.sh"
runs=${RUNS:-5}
read -r -a tmos <<< "${TIMEOUTS:-3 5}"
coll=${COLL:-qwz}
rate=${RATE:-1gbit}
case $runs in ''|*[!0-9]*|0) echo "$prog: RUNS '$runs': must be a positive integer" >&2; exit 2 ;; esac
[ "$runs" -le 50 ] || { echo "$prog: RUNS $runs: at most 50" >&2; exit 2; }
case $coll in qwz|hpz|qgz) ;; *) echo "$prog: COLL '$coll': must be qwz, hpz or qgz" >&2; exit 2 ;; esac
for t in "${tmos[@]}"; do
  [[ $t =~ ^[0-9]+$ && $t -ge 1 && $t -le 60 ]] || { echo "$prog: TIMEOUTS: '$t' must be an integer 1..60" >&2; exit 2; }
done

why=$("$cluster" check) || { echo "$prog: no cluster: ${why#*: }" >&2; exit 1; }
exec 9> /run/zpp-cluster.lock
flock -w 600 9 || { echo "$prog: another cluster run holds /run/zpp-cluster.lock" >&2; exit 1; }
log=$(mktemp /tmp/zpp-shrink-study.XXXXXX)
stamp=$(mktemp /tmp/zpp-shrink-study-stamp.XXXXXX)
trap 'softirq_stop; "$cluster" down > /dev/null 2>&1; rm -f "$log" "$stamp"' EXIT
trap 'exit 130' INT TERM
"$cluster" up -n 2 -p 4 -r "$rate" > /dev/null || exit 1
echo "# $prog: 2x4 namespace cluster, $rate per node link, rank 5 SIGKILLed in a $coll call; load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# command of each run: scripts/netns_cluster.sh run --enable-recovery -np 8 -x ZPP_TIMEOUT_S=T -x ZPP_TEST_KILL_STAMP=FILE $worker kill $coll"
echo "timeout_s,run,kill_to_first_exact_s,survivors_passed"
status=0
declare -A got=()
for ((r = 1; r <= runs; r++)); do
  for t in "${tmos[@]}"; do
    rm -f "$stamp"
    softirq_launch "run $r, ZPP_TIMEOUT_S=$t" "$log" '&1' \
      reported_run 7 90 "$log" "$cluster" run --enable-recovery -x OMPI_MCA_mpi_yield_when_idle=1 -np 8 \
      -x ZPP_TIMEOUT_S="$t" -x ZPP_TEST_KILL_STAMP="$stamp" "$worker" kill "$coll"
    if [ "$softirq_gave_up" = 1 ]; then
      echo "$t,$r,given up: ksoftirqd waited more than $softirq_max s in each of $softirq_tries tries,"
      status=1
      continue
    fi
    np=$(grep -c '^PASS rank' "$log")
    s=$(sed -n 's/^kill to the first exact collective on every survivor.*: \([0-9.]*\) s$/\1/p' "$log")
    if [ "$np" -ne 7 ] || [ -z "$s" ]; then
      echo "$t,$r,failed: $(grep -m1 '^FAIL rank' "$log" || tail -1 "$log"),$np"
      status=1
      continue
    fi
    echo "$t,$r,$s,$np"
    got[$t]+="$s "
  done
done
echo "# per ZPP_TIMEOUT_S: median, min..max of the kill to the first exact collective on every survivor (target T + 2 s)"
for t in "${tmos[@]}"; do
  # shellcheck disable=SC2086
  python3 - "$t" ${got[$t]:-} <<'PY'
import statistics, sys
t = float(sys.argv[1]); v = sorted(float(x) for x in sys.argv[2:])
if not v:
    print("# ZPP_TIMEOUT_S %g: no run passed" % t)
else:
    print("# ZPP_TIMEOUT_S %g: median %.2f s, %.2f..%.2f s over %d runs (target %.0f s: %s)"
          % (t, statistics.median(v), v[0], v[-1], len(v), t + 2,
             "met" if v[-1] <= t + 2 else "missed by %d of %d runs" % (sum(x > t + 2 for x in v), len(v))))
PY
done
echo "# load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# $(softirq_summary)"
exit $status
