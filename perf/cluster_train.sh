#!/usr/bin/env bash
# The training step on real links: zpp-train --large, ZeRO-3 against ZeRO++,
# 8 ranks as 2 nodes x 4 ranks of scripts/netns_cluster.sh (network
# namespaces, the topology discovered, each node's link shaped by tc tbf in
# both directions; perf/cluster_study.sh explains the rates: 400mbit per
# node = 100 GbE scaled, 1600mbit = NDR scaled, none = unshaped).
# Per (rate, global batch) block: wait (bounded) for the machine's load to
# fall, take /run/zpp-cluster.lock, make the cluster at that rate, run
#   zpp-train --mode zero3 --large --batch B --steps S --json
#   zpp-train --mode zeropp ...
# alternated, R times (zero3, zeropp, zero3, zeropp, ...), tear the cluster
# down and let the lock go (another cluster run can take its turn between
# blocks).  Alternating puts both modes in the same minutes of a shared
# machine; each repetition's zero3 / zeropp is a paired ratio.
#   usage: perf/cluster_train.sh OUT_DIR [BUILD_DIR]
# Writes, at the end, OUT_DIR/cluster_train.csv (one row per zpp-train run:
# perf/cluster_train.py names the columns) and OUT_DIR/cluster_train.md
# (medians, min..max, speedup of the medians, median paired speedup,
# inter-node bytes per step and rank, the load averages, the commands).
# Exits 77 saying why where a cluster cannot be made (not root, no
# namespaces: scripts/netns_cluster.sh check), 1 if a run failed (its row
# says how; the tables leave it out), 2 on a bad setting.
# Settings (environment):
#   ZPP_CLUSTER_TRAIN_RATES    tc rates per node link ("400mbit 1600mbit none")
#   ZPP_CLUSTER_TRAIN_BATCHES  global batches, multiples of 8 ("64 8")
#   ZPP_CLUSTER_TRAIN_REPS     repetitions of the zero3, zeropp pair (5)
#   ZPP_CLUSTER_TRAIN_STEPS    steps per run, >= 2: step 1 is not timed (20)
#   ZPP_CLUSTER_TRAIN_TIMEOUT_S  limit of one zpp-train launch (600)
#   ZPP_CLUSTER_TRAIN_MAX_LOAD   before each block wait until the 1-minute
#                              load average is below this (3; 0: no wait)
#   ZPP_CLUSTER_TRAIN_LOAD_WAIT_S  ... but at most this long (1200), then
#                              run anyway (the table shows the load)
#   ZPP_SOFTIRQ_MAX_WAIT_S, ZPP_SOFTIRQ_TRIES  every launch runs under
#                              scripts/softirq_wait.sh: one during which
#                              ksoftirqd waited more than 5 s on a run queue
#                              is discarded and run again, at most 3 tries
#                              (a launch discarded every time is a failed
#                              run); the table's notes give the count
# For the stand-in test only (tests/cluster_train_test.sh):
#   ZPP_CLUSTER_TRAIN_CLUSTER (another scripts/netns_cluster.sh),
#   ZPP_CLUSTER_TRAIN_LOCK (another lock file), ZPP_CLUSTER_TRAIN_LOADAVG
#   (a file read instead of /proc/loadavg); ZPP_SOFTIRQ_PROC (a fake proc
#   root for scripts/softirq_wait.sh).
# Run time with the defaults on 2 cores: about 10 minutes of runs (6 blocks
# of 1-2 minutes, launches of 5-16 s) plus the load waits: 1-2 minutes
# before each block on an otherwise quiet machine (the load of the block
# before must decay), 17 minutes in all for the table of docs/bench/training.md.
# The target's point alone: ZPP_CLUSTER_TRAIN_RATES=400mbit
# ZPP_CLUSTER_TRAIN_BATCHES=64 (about 2 minutes of runs; 4 with
# ZPP_CLUSTER_TRAIN_REPS=10).  A TERM (INT) takes effect at once,
# also during a load wait, a wait for the lock or a launch.
set -euo pipefail
prog=cluster_train.sh
if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  echo "usage: $prog OUT_DIR [BUILD_DIR]" >&2
  exit 2
fi
out=$1
build=${2:-build}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cluster=${ZPP_CLUSTER_TRAIN_CLUSTER:-$here/../scripts/netns_cluster.sh}
lock=${ZPP_CLUSTER_TRAIN_LOCK:-/run/zpp-cluster.lock}
loadavg=${ZPP_CLUSTER_TRAIN_LOADAVG:-/proc/loadavg}
. "$here/../scripts/softirq_wait.sh"

bad() { echo "$prog: $1" >&2; exit 2; }
read -r -a rates <<< "${ZPP_CLUSTER_TRAIN_RATES-400mbit 1600mbit none}"
read -r -a batches <<< "${ZPP_CLUSTER_TRAIN_BATCHES-64 8}"
reps=${ZPP_CLUSTER_TRAIN_REPS-5}
steps=${ZPP_CLUSTER_TRAIN_STEPS-20}
tmo=${ZPP_CLUSTER_TRAIN_TIMEOUT_S-600}
max_load=${ZPP_CLUSTER_TRAIN_MAX_LOAD-3}
load_wait=${ZPP_CLUSTER_TRAIN_LOAD_WAIT_S-1200}
[ ${#rates[@]} -gt 0 ] || bad "ZPP_CLUSTER_TRAIN_RATES is empty: give tc rates, e.g. 400mbit, or none"
# (a rate or batch given twice would make two blocks whose rows the tables
# cannot tell apart: one repetition's runs would replace the other's)
declare -A seen=()
for r in "${rates[@]}"; do
  [[ "$r" =~ ^(none|[1-9][0-9]{0,5}(bit|kbit|mbit|gbit))$ ]] ||
    bad "ZPP_CLUSTER_TRAIN_RATES: rate '$r': must be none or a positive integer with bit, kbit, mbit or gbit (e.g. 400mbit)"
  [ -z "${seen[r$r]:-}" ] || bad "ZPP_CLUSTER_TRAIN_RATES: rate '$r' given twice"
  seen[r$r]=1
done
[ ${#batches[@]} -gt 0 ] || bad "ZPP_CLUSTER_TRAIN_BATCHES is empty: give global batches, e.g. 64 8"
for b in "${batches[@]}"; do
  [[ "$b" =~ ^[1-9][0-9]{0,5}$ ]] && [ $((b % 8)) = 0 ] ||
    bad "ZPP_CLUSTER_TRAIN_BATCHES: batch '$b': must be a positive multiple of the 8 ranks"
  [ -z "${seen[b$b]:-}" ] || bad "ZPP_CLUSTER_TRAIN_BATCHES: batch '$b' given twice"
  seen[b$b]=1
done
[[ "$reps" =~ ^[1-9][0-9]?$ ]] || bad "ZPP_CLUSTER_TRAIN_REPS '$reps': must be an integer 1..99"
[[ "$steps" =~ ^[1-9][0-9]{0,4}$ ]] && [ "$steps" -ge 2 ] ||
  bad "ZPP_CLUSTER_TRAIN_STEPS '$steps': must be an integer 2..99999 (step 1 is not timed)"
[[ "$tmo" =~ ^[1-9][0-9]{0,4}$ ]] || bad "ZPP_CLUSTER_TRAIN_TIMEOUT_S '$tmo': must be a positive integer (seconds)"
[[ "$max_load" =~ ^[0-9]{1,3}(\.[0-9]{1,2})?$ ]] ||
  bad "ZPP_CLUSTER_TRAIN_MAX_LOAD '$max_load': must be a number >= 0 (0: no wait)"
[[ "$load_wait" =~ ^[0-9]{1,5}$ ]] || bad "ZPP_CLUSTER_TRAIN_LOAD_WAIT_S '$load_wait': must be an integer >= 0 (seconds)"

# (a missing BUILD_DIR must reach the message, not end the script under
# set -e in the command substitution)
train=$(cd "$build" 2> /dev/null && pwd)/tools/zpp-train || train=
[ -n "$train" ] && [ -x "$train" ] || { echo "$prog: no $build/tools/zpp-train: build first" >&2; exit 1; }
rc=0
why=$("$cluster" check) || rc=$?
if [ $rc -ne 0 ]; then
  echo "$prog: skipped: ${why:-scripts/netns_cluster.sh check exited $rc}" >&2
  exit 77
fi
mkdir -p "$out"
# The rows go to a hidden file until the end: a study that stops half way
# (TERM, the lock not free, a cluster that would not come up) leaves
# OUT_DIR's cluster_train.{csv,md} as they were, never a half CSV beside
# the old table (make_benchmarks_doc.sh writes into docs/generated); its
# rows stay in OUT_DIR/.cluster_train.csv for a look.
csv=$out/.cluster_train.csv
meta=$out/.cluster_train.meta
tmp=$out/.cluster_train
python3 "$here/cluster_train.py" --header > "$csv"
{
  echo "start $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "cores $(nproc)"
  echo "cpu $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
  echo "reps $reps"
  echo "steps $steps"
  echo "max_load $max_load"
  echo "load_wait_s $load_wait"
  echo "timeout_s $tmo"
} > "$meta"

# The cluster is ours only while we hold the lock (fd 9): the exit trap
# tears down only then, never another run's namespaces.
up=0
child=
cleanup() {
  if [ -n "$child" ]; then  # a load or lock wait
    kill -TERM "$child" 2> /dev/null || true
    wait "$child" 2> /dev/null || true
  fi
  softirq_stop  # a launch: timeout passes the TERM on to it
  if [ "$up" = 1 ]; then "$cluster" down || true; fi
  rm -f "$tmp.out" "$tmp.err"
}
trap 'cleanup' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

load() { cut -d' ' -f1-3 "$loadavg"; }
# Wait until the 1-minute load average is below max_load, polling every
# 30 s, at most load_wait seconds; sets waited (seconds).  Not in a $( ):
# a TERM to this script is not passed to a command substitution's
# subshell, which went on waiting up to load_wait s before the trap ran.
# The sleep runs in the background and is waited for, so that the trap
# runs at once (cleanup ends the sleep).
waited=0
wait_load() {
  local t0 now left
  t0=$(date +%s)
  while awk -v l="$(cut -d' ' -f1 "$loadavg")" -v m="$max_load" 'BEGIN { exit !(m > 0 && l >= m) }'; do
    now=$(date +%s)
    left=$((t0 + load_wait - now))
    if [ "$left" -le 0 ]; then
      echo "$prog: load $(load) still not below $max_load after $load_wait s; running anyway" >&2
      break
    fi
    echo "$prog: load $(load): waiting for the 1-minute figure to fall below $max_load ($left s left)" >&2
    sleep $((left < 30 ? left : 30)) &
    child=$!
    wait "$child"
    child=
  done
  waited=$(($(date +%s) - t0))
}

status=0
for rate in "${rates[@]}"; do
  for batch in "${batches[@]}"; do
    wait_load
    exec 9> "$lock"
    if ! flock -n 9; then
      # flock in the background, waited for: a TERM ends the wait at once
      # (cleanup ends the flock; up is still 0, so nothing is torn down)
      echo "$prog: another cluster run holds $lock: waiting for it (at most 900 s)" >&2
      flock -w 900 9 &
      child=$!
      rc=0
      wait "$child" || rc=$?
      child=
      [ "$rc" = 0 ] || { echo "$prog: another cluster run held $lock for 900 s" >&2; exit 1; }
    fi
    # the load, the time and the block's seconds from here: a wait for the
    # lock is another run's time, and its load is not "before" ours
    before=$(load)
    tb=$(date +%s)
    start=$(date -u +%H:%M:%S)
    up=1
    "$cluster" up -n 2 -p 4 -r "$rate"
    for ((rep = 1; rep <= reps; rep++)); do
      for mode in zero3 zeropp; do
        targs=(--mode "$mode" --large --batch "$batch" --steps "$steps" --json)
        echo "\$ [$rate, rep $rep/$reps] scripts/netns_cluster.sh run -np 8 -x OMPI_MCA_mpi_yield_when_idle=1 zpp-train ${targs[*]}" >&2
        rc=0
        # softirq_launch runs it in the background and waits, so that a
        # TERM or INT to this script is handled at once (the trap ends the
        # launch and tears down), not after the launch; the ranks do not
        # get the lock's fd 9.  The wall time is the kept try's.
        softirq_launch "$rate, batch $batch, rep $rep, $mode" "$tmp.out" "$tmp.err" \
          timeout -k 10 "$tmo" "$cluster" run -np 8 -x OMPI_MCA_mpi_yield_when_idle=1 \
          "$train" "${targs[@]}" || rc=$?
        ts=$softirq_t0 te=$softirq_t1
        st=ok
        if [ "$softirq_gave_up" = 1 ]; then
          st="ksoftirqd waited more than $softirq_max s on a run queue in each of $softirq_tries tries"
        elif [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
          st="timeout after $tmo s"
        elif [ "$rc" != 0 ]; then
          st="exit $rc"
        fi
        wall=$(awk -v a="$ts" -v b="$te" 'BEGIN { printf "%.3f", b - a }')
        prc=0
        python3 "$here/cluster_train.py" --row "$rate" "$batch" "$rep" "$mode" "$steps" \
          "$st" "$wall" "$tmp.out" >> "$csv" || prc=$?
        if [ "$st" != ok ] || [ "$prc" != 0 ]; then
          echo "$prog: $rate, batch $batch, rep $rep, $mode failed: $(tail -n 1 "$csv" | cut -d, -f6)" >&2
          tail -n 5 "$tmp.err" >&2 || true
          status=1
        fi
      done
    done
    "$cluster" down
    up=0
    exec 9>&-
    echo "block $rate $batch $before $(load) $waited $(($(date +%s) - tb)) $start" >> "$meta"
  done
done

python3 "$here/cluster_train.py" --markdown "$csv" "$meta" > "$out/.cluster_train.md"
softirq_md_note "$out/.cluster_train.md"
mv "$csv" "$out/cluster_train.csv"
mv "$out/.cluster_train.md" "$out/cluster_train.md"
rm -f "$meta"
echo "wrote $out/cluster_train.{csv,md} ($softirq_discards launches discarded for ksoftirqd's run-queue wait, $softirq_given_up given up)" >&2
exit "$status"
