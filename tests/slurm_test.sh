#!/usr/bin/env bash
# `make test-slurm` (part of `make test`): zpp under a real Slurm on this
# machine: one node (this host), munged, slurmctld and slurmd started here
# from a slurm.conf written to a temporary directory (Debian 12's slurm-wlm
# 22.05 and munge; scripts/install-deps.sh installs them as root).
#   usage: tests/slurm_test.sh [BUILD_DIR] [VENV]     (defaults: build .venv-torch)
# Steps, each bounded (`timeout -k`, srun -t, loops by wall time):
#   the daemons up, the node idle (sinfo, at most 30 s)
#   srun -n 4 zpp-bench       all-gather over zpp's TCP bootstrap from
#                             srun's variables (header: bootstrap tcp)
#   srun -n 2 fsdp2_train.py  --comm zppenv --steps 2 --json: the JSON
#                             line's world, losses, zpp's hooks and bytes
#   the srun lines README.md and the examples print (tests/launch_lines_test.py
#                             --list srun), each as printed, from the root
# Each daemon runs in the foreground (-D, munged -F) as a child of this
# script, its pid recorded at once; on exit, also on failure, every job
# left is cancelled (scancel, then up to 20 s for the queue to empty), each
# daemon is stopped by its recorded pid after checking the process is still
# that daemon (TERM, up to 10 s, then KILL), and the directory removed.
# Not root, or no slurm or munge installed: prints SKIPPED and why, and
# exits 0.  About 40-70 s here.
set -uo pipefail
prog=slurm_test.sh
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-build}
venv=${2:-.venv-torch}
cd "$root" || exit 1

skip() {
  echo "$prog: ======== SKIPPED: $* ========"
  exit 0
}
[ "$(id -u)" -eq 0 ] || skip "not root (the test starts munged, slurmctld and slurmd)"
for t in munged mungekey slurmctld slurmd srun sinfo squeue scancel; do
  command -v "$t" > /dev/null ||
    skip "$t is not installed (as root, scripts/install-deps.sh installs slurm-wlm and munge)"
done
for f in "$build/perf/zpp-bench" "$build/libzpp.so" "$venv/bin/python"; do
  [ -e "$f" ] || { echo "$prog: $f is missing (make build deps-python)" >&2; exit 1; }
done
build=$(cd "$build" && pwd)
venv=$(cd "$venv" && pwd)

tmp=$(mktemp -d /tmp/zpp-slurm.XXXXXX) || exit 1
chmod 700 "$tmp"
# The daemons this script started: name and pid, in start order.
daemons=()
# Starts "$@" (a daemon in the foreground) in the background; records it.
start_daemon() {
  local name=$1
  shift
  "$@" > "$tmp/$name.out" 2>&1 &
  daemons+=("$name:$!")
}
# Cancels every job left, waits (at most 20 s) for the queue to empty.
# (Only this script's cluster: $conf is set once its slurm.conf is written.)
conf=""
cancel_jobs() {
  local ids t
  [ -n "$conf" ] || return 0
  ids=$(SLURM_CONF=$conf timeout -k 2 5 squeue -h -o %i 2> /dev/null) || return 0
  [ -n "$ids" ] || return 0
  # shellcheck disable=SC2086
  SLURM_CONF=$conf timeout -k 2 10 scancel $ids 2> /dev/null
  t=$((SECONDS + 20))
  while [ $SECONDS -lt $t ]; do
    ids=$(SLURM_CONF=$conf timeout -k 2 5 squeue -h -o %i 2> /dev/null) || break
    [ -z "$ids" ] && return 0
    sleep 0.5
  done
  echo "$prog: jobs still queued after scancel: ${ids:-?}" >&2
}
# Stops the daemons, last started first, by recorded pid, each only while
# the pid is still that daemon (/proc/PID/comm): TERM, up to 10 s, KILL.
stop() {
  local i name pid t
  for ((i = ${#daemons[@]} - 1; i >= 0; i--)); do
    name=${daemons[i]%%:*}
    pid=${daemons[i]#*:}
    [ "$(cat "/proc/$pid/comm" 2> /dev/null)" = "$name" ] || continue
    kill -TERM "$pid" 2> /dev/null || continue
    t=$((SECONDS + 10))
    while [ $SECONDS -lt $t ] && kill -0 "$pid" 2> /dev/null; do
      sleep 0.1
    done
    [ "$(cat "/proc/$pid/comm" 2> /dev/null)" = "$name" ] && kill -KILL "$pid" 2> /dev/null
    wait "$pid" 2> /dev/null
  done
}
cleanup() {
  cancel_jobs
  stop
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

fail() {
  echo "$prog: FAILED: $*" >&2
  for log in "$tmp"/*.log; do
    [ -f "$log" ] && { echo "--- $log (end)"; tail -n 15 "$log"; } >&2
  done
  exit 1
}

# ---- munge ------------------------------------------------------------------
mungekey --create --keyfile="$tmp/munge.key" > /dev/null 2>&1 || fail "mungekey --create"
chmod 600 "$tmp/munge.key"
# --force: the temporary directory lies under /tmp (world-writable)
start_daemon munged munged --foreground --force --socket="$tmp/munge.socket" \
  --key-file="$tmp/munge.key" --pid-file="$tmp/munged.pid" \
  --log-file="$tmp/munged.log" --seed-file="$tmp/munged.seed"
t=$((SECONDS + 10))
until [ -S "$tmp/munge.socket" ]; do
  [ $SECONDS -lt $t ] || fail "munged's socket did not appear within 10 s"
  kill -0 "${daemons[0]#*:}" 2> /dev/null || fail "munged exited"
  sleep 0.1
done

# ---- slurm.conf: one node, this host ---------------------------------------
node=$(hostname -s)
ports=$(python3 -c '
import socket
ss = [socket.socket() for _ in range(2)]
for s in ss: s.bind(("", 0))
print(*[s.getsockname()[1] for s in ss])')
read -r ctld_port d_port <<< "$ports"
# at least 4 CPUs, whatever the machine has (config_overrides): srun -n 4
cpus=$(nproc)
[ "$cpus" -ge 4 ] || cpus=4
mkdir -p "$tmp/state" "$tmp/spool"
cat > "$tmp/slurm.conf" << EOF
ClusterName=zpptest
SlurmctldHost=$node
SlurmctldPort=$ctld_port
SlurmdPort=$d_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$tmp/munge.socket
CredType=cred/munge
StateSaveLocation=$tmp/state
SlurmdSpoolDir=$tmp/spool
SlurmctldPidFile=$tmp/slurmctld.pid
SlurmdPidFile=$tmp/slurmd.pid
SlurmctldLogFile=$tmp/slurmctld.log
SlurmdLogFile=$tmp/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
NodeName=$node CPUs=$cpus State=UNKNOWN
PartitionName=zpp Nodes=$node Default=YES MaxTime=10 State=UP OverSubscribe=FORCE:4
EOF
conf=$tmp/slurm.conf
export SLURM_CONF=$conf

start_daemon slurmctld slurmctld -D -f "$SLURM_CONF"
start_daemon slurmd slurmd -D -f "$SLURM_CONF"
# at most 30 s of wall time, whatever sinfo takes
state=""
t=$((SECONDS + 30))
while [ $SECONDS -lt $t ]; do
  for d in "${daemons[@]}"; do
    kill -0 "${d#*:}" 2> /dev/null || fail "${d%%:*} exited"
  done
  state=$(timeout -k 1 3 sinfo -h -n "$node" -o %t 2> /dev/null)
  [ "$state" = idle ] && break
  sleep 0.5
done
[ "$state" = idle ] || fail "node $node not idle after 30 s (sinfo: '${state:-no answer}')"
echo "$prog: Slurm up (node $node, $cpus CPUs, slurmctld port $ctld_port)"

# ---- the runs -----------------------------------------------------------------
export PATH=$venv/bin:$PATH
# zpp installed in the venv (make test gives the venv of make test-wheel,
# where `pip install .` put it): the runs use the install and nothing else;
# otherwise the package and the library of the tree (README.md, "run from
# the tree").
unset ZPP_INCLUDE_DIR ZPP_BUILD_DIR
if (cd / && env -u PYTHONPATH -u ZPP_LIBRARY "$venv/bin/python" -c \
      'import os, sys, zpp; d = os.path.dirname(zpp.__file__); sys.exit(0 if d.startswith(sys.prefix) and os.path.isfile(os.path.join(d, "libzpp.so")) else 1)') \
      > /dev/null 2>&1; then
  unset PYTHONPATH ZPP_LIBRARY
  echo "$prog: zpp as installed in $venv (no PYTHONPATH, no ZPP_LIBRARY)"
else
  export PYTHONPATH=$root/python${PYTHONPATH:+:$PYTHONPATH} ZPP_LIBRARY=$build/libzpp.so
fi
unset RANK WORLD_SIZE LOCAL_RANK MASTER_ADDR MASTER_PORT
failed=()

echo "== srun -n 4 zpp-bench: the TCP bootstrap from srun's variables"
out=$(timeout -k 10 60 srun -t 2 -n 4 "$build/perf/zpp-bench" --coll allgather -b 64K -e 256K \
  -n 2 -w 1 2>&1)
rc=$?
if [ $rc -eq 0 ] && grep -q "bootstrap tcp" <<< "$out" && grep -q PASSED <<< "$out"; then
  echo "   passed"
else
  echo "$out" | tail -n 20
  echo "   FAILED (exit $rc; want 'bootstrap tcp' and PASSED)"
  failed+=(zpp-bench)
fi

echo "== srun -n 2 examples/fsdp2_train.py --comm zppenv --steps 2 --json"
out=$(timeout -k 10 90 srun -t 2 -n 2 "$venv/bin/python" examples/fsdp2_train.py --comm zppenv \
  --steps 2 --json --quiet 2>&1)
rc=$?
check='
import json, math, sys
rows = [json.loads(l) for l in sys.stdin if l.startswith("{")]
assert len(rows) == 1, "%d JSON lines (want 1, from rank 0)" % len(rows)
r = rows[0]
assert r["world"] == 2 and r["comm"] == "zppenv", r
assert len(r["losses"]) == 2 and all(math.isfinite(x) for x in r["losses"]), r["losses"]
assert r["zpp_comms"] >= 1 and sum(r["hook_calls"].values()) > 0, r
assert r["inter_bytes_per_step"] + r["intra_bytes_per_step"] > 0, r
'
if [ $rc -eq 0 ] && why=$(python3 -c "$check" <<< "$out" 2>&1); then
  echo "   passed"
else
  echo "$out" | tail -n 20
  echo "   FAILED (exit $rc) ${why:-}"
  failed+=(fsdp2_train)
fi

# The printed srun lines (identical ones once), as printed.
mapfile -t lines < <(python3 tests/launch_lines_test.py --list srun | sort -u)
[ ${#lines[@]} -ge 1 ] || failed+=("no printed srun line found")
for line in "${lines[@]}"; do
  echo "== as printed: $line"
  # SLURM_TIMELIMIT: srun's -t for the line as printed (2 minutes)
  out=$(SLURM_TIMELIMIT=2 timeout -k 10 90 bash -c "$line" 2>&1)
  rc=$?
  if [ $rc -eq 0 ]; then
    echo "   passed"
  else
    echo "$out" | tail -n 20
    echo "   FAILED (exit $rc)"
    failed+=("$line")
  fi
done

if [ ${#failed[@]} -gt 0 ]; then
  fail "${failed[*]}"
fi
echo "$prog: all passed"
