#!/usr/bin/env bash
# Injects a real fault into a running zpp job (tests/fault_worker.cc) and
# checks that the job fails cleanly and boundedly:
#   kill: rank ZPP_FAULT_VICTIM (default 2) is killed with SIGKILL while
#         the job runs collectives back to back; every survivor must return
#         an error within ZPP_TIMEOUT_S + 5 s of the kill, naming the
#         victim ("rank 2 (pid P) is gone", or the transfers "from 2" /
#         "to 2"), and zpp_comm_destroy must return;
#   stop: the victim is stopped with SIGSTOP for 2 s, then SIGCONT; the job
#         must then finish with every result equal to its reference (no
#         error, no wrong element) -- the stop is shorter than the timeout.
#
# usage: fault_inject.sh kill|stop WORKER [MPIEXEC]
# env:   ZPP_FAULT_LAUNCH  the launcher prefix, the worker is appended
#                          (default: "$MPIEXEC --allow-run-as-root
#                          --oversubscribe --enable-recovery --mca btl
#                          self,vader --bind-to none -np 4"); it must keep
#                          the survivors running when a rank dies (Open MPI:
#                          --enable-recovery) and pass the environment
#                          below to the ranks (mpirun -x, or an exported
#                          environment; ZPP_BACKEND too, when set);
#        ZPP_FAULT_NP      ranks the launcher starts (default 4);
#        ZPP_FAULT_VICTIM  the rank to kill or stop (default 2);
#        ZPP_FAULT_SIGNAL  the command that signals a rank's pid (default
#                          "kill"; the pids are the ranks' own getpid(), so
#                          it must run where those pids mean something);
#        ZPP_TIMEOUT_S     zpp's timeout in the job (default 3 for kill, 5
#                          for stop).
# Every process is reaped: the launcher runs under timeout(1) with a kill
# after a grace period, and the script waits for it.  Exit 0: the checks
# passed; 1: a check failed (the reason is printed); 2: bad usage.
set -u
mode=${1:-}
worker=${2:-}
mpiexec=${3:-mpirun}
if [[ "$mode" != kill && "$mode" != stop ]] || [[ ! -x "$worker" ]]; then
  echo "usage: $0 kill|stop WORKER [MPIEXEC]" >&2
  exit 2
fi
np=${ZPP_FAULT_NP:-4}
victim=${ZPP_FAULT_VICTIM:-2}
signal_cmd=${ZPP_FAULT_SIGNAL:-kill}
if [[ "$mode" == kill ]]; then timeout_s=${ZPP_TIMEOUT_S:-3}; else timeout_s=${ZPP_TIMEOUT_S:-5}; fi
launch=${ZPP_FAULT_LAUNCH:-"$mpiexec --allow-run-as-root --oversubscribe --enable-recovery --mca btl self,vader --bind-to none -np $np"}
out=$(mktemp -d "${TMPDIR:-/tmp}/zpp_fault.XXXXXX")
log="$out/launcher.log"
export ZPP_FAULT_OUT="$out" ZPP_TIMEOUT_S="$timeout_s"
fail=0
note() { echo "fault_inject[$mode]: $*"; }
bad() { note "FAIL: $*"; fail=1; }

# Open MPI forwards these with -x; other launchers inherit the exports.
xargs=""
if [[ -z "${ZPP_FAULT_LAUNCH:-}" ]]; then
  for v in ZPP_FAULT_OUT ZPP_TIMEOUT_S ZPP_TOPO ZPP_TEST_SEED ZPP_BACKEND OMPI_MCA_mpi_yield_when_idle; do
    [[ -n "${!v:-}" ]] && xargs="$xargs -x $v"
  done
fi
# shellcheck disable=SC2086
timeout -k 5 90 $launch $xargs "$worker" >"$log" 2>&1 &
job=$!
cleanup() {
  if kill -0 "$job" 2>/dev/null; then
    kill -TERM "$job" 2>/dev/null
    sleep 2
    kill -KILL "$job" 2>/dev/null
  fi
  wait "$job" 2>/dev/null
}
trap cleanup EXIT

# The ranks write their pids once their communicator exists (<= 30 s).
for _ in $(seq 1 300); do
  [[ $(ls "$out"/pid.* 2>/dev/null | wc -l) -ge $np ]] && break
  kill -0 "$job" 2>/dev/null || break
  sleep 0.1
done
if [[ $(ls "$out"/pid.* 2>/dev/null | wc -l) -lt $np ]]; then
  note "the job did not start:"; cat "$log"; exit 1
fi
vpid=$(cat "$out/pid.$victim")
sleep 1  # mid-run: the ranks run collectives back to back

if [[ "$mode" == kill ]]; then
  t_kill=$(date +%s.%N)
  $signal_cmd -KILL "$vpid"
  note "killed rank $victim (pid $vpid) at $t_kill; ZPP_TIMEOUT_S=$timeout_s"
  # the survivors' results, bounded by the timeout and a margin
  want=$((np - 1))
  for _ in $(seq 1 $(( (timeout_s + 20) * 10 ))); do
    [[ $(ls "$out"/result.* 2>/dev/null | wc -l) -ge $want ]] && break
    sleep 0.1
  done
  for r in $(seq 0 $((np - 1))); do
    [[ $r -eq $victim ]] && continue
    f="$out/result.$r"
    if [[ ! -f "$f" ]]; then bad "rank $r wrote no result (hung?)"; continue; fi
    status=$(awk '$1=="status"{print $2}' "$f")
    at=$(awk '$1=="failed_at"{print $2}' "$f")
    msg=$(sed -n 's/^msg //p' "$f")
    destroyed=$(awk '$1=="destroyed"{print $2}' "$f")
    iters=$(awk '$1=="iters"{print $2}' "$f")
    wrong=$(awk '$1=="wrong"{print $2}' "$f")
    dt=$(awk -v a="$at" -v k="$t_kill" 'BEGIN{printf "%.2f", a-k}')
    note "rank $r: status $status after ${dt} s (iteration $iters): $msg"
    [[ -n "$status" && "$status" -ne 0 ]] || bad "rank $r finished without an error"
    [[ "$at" =~ ^[0-9]+\.[0-9]+$ && "$at" != 0.000 ]] || bad "rank $r: no time of failure ($at)"
    awk -v d="$dt" -v t="$timeout_s" 'BEGIN{exit !(d <= t + 5)}' ||
      bad "rank $r returned ${dt} s after the kill (bound $timeout_s + 5 s)"
    [[ "$msg" == *"rank $victim "* || "$msg" == *"from $victim"* || "$msg" == *"to $victim"* ]] ||
      bad "rank $r's error does not name rank $victim"
    [[ "$destroyed" == 1 ]] || bad "rank $r: zpp_comm_destroy failed"
    [[ "$wrong" == 0 ]] || bad "rank $r: $wrong wrong results before the kill"
  done
else
  $signal_cmd -STOP "$vpid"
  note "stopped rank $victim (pid $vpid) for 2 s; ZPP_TIMEOUT_S=$timeout_s"
  sleep 2
  $signal_cmd -CONT "$vpid"
  sleep 0.5
  touch "$out/stop"
  for _ in $(seq 1 $(( (timeout_s + 20) * 10 ))); do
    [[ $(ls "$out"/result.* 2>/dev/null | wc -l) -ge $np ]] && break
    sleep 0.1
  done
  for r in $(seq 0 $((np - 1))); do
    f="$out/result.$r"
    if [[ ! -f "$f" ]]; then bad "rank $r wrote no result (hung?)"; continue; fi
    status=$(awk '$1=="status"{print $2}' "$f")
    iters=$(awk '$1=="iters"{print $2}' "$f")
    wrong=$(awk '$1=="wrong"{print $2}' "$f")
    note "rank $r: status $status, $iters iterations, $wrong wrong"
    [[ "$status" == 0 ]] || bad "rank $r failed (status '$status'): $(sed -n 's/^msg //p' "$f")"
    [[ "$wrong" == 0 ]] || bad "rank $r: $wrong results differ from the reference"
  done
fi

# The launcher must end by itself now (the survivors exit after their
# error; in the stop case every rank finalizes).
for _ in $(seq 1 300); do kill -0 "$job" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$job" 2>/dev/null; then bad "the launcher did not exit within 30 s"; fi
cleanup
trap - EXIT
if [[ $fail -ne 0 ]]; then
  note "launcher output:"; grep -v "zpp WARN" "$log" | tail -20
  note "files kept in $out"
  exit 1
fi
rm -rf "$out"
note "passed"
exit 0
