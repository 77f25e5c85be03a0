#!/usr/bin/env bash
# Sourced by the scripts that launch tests/shrink_cluster_worker.c on the
# namespace cluster (tests/cluster_tests.sh, perf/shrink_cluster_study.sh).
#   reported_run WANT LIMIT_S FILE CMD...
#       CMD (an mpirun whose output the caller sends to FILE) under
#       timeout LIMIT_S, in the background.  Once FILE holds WANT lines
#       "PASS rank" or "FAIL rank", CMD gets 3 s more (by the clock) to
#       end and is then stopped (exit 143): mpirun with --enable-recovery
#       does not always end after a rank was killed, its daemons wait
#       (Open MPI 4.1).  Returns CMD's status; 124: the limit ran out first
#       (a rank hung).
reported_run() {
  local want=$1 limit=$2 file=$3 pid seen=''
  shift 3
  timeout -k 10 "$limit" "$@" &
  pid=$!
  while kill -0 "$pid" 2> /dev/null; do
    if [ -z "$seen" ]; then
      [ "$(grep -c -E '^(PASS|FAIL) rank' "$file" 2> /dev/null)" -ge "$want" ] &&
        seen=$(date +%s%N)
    elif [ $(($(date +%s%N) - seen)) -ge 3000000000 ]; then
      kill -TERM "$pid" 2> /dev/null
      break
    fi
    sleep 0.1
  done
  wait "$pid"
}
