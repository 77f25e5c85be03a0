#!/usr/bin/env bash
# `make test-cluster` (part of `make test`): zpp on a real cluster of
# network namespaces (scripts/netns_cluster.sh), where the topology is
# discovered, not told (no ZPP_TOPO): every node has its own hostname and
# network, ranks of one node share memory, ranks of different nodes talk TCP
# over their shaped links.
#   usage: tests/cluster_tests.sh [BUILD_DIR]
#   ZPP_CLUSTER_STEPS=faults: only the 2x4 cluster's fault steps
#   (shrink_cluster_worker), the other binaries not needed
# Steps, each bounded by `timeout`:
#   netns_cluster.sh         a failed up tears down what it made; up and
#                            down refuse while another run holds the lock
#   2 nodes x 4 ranks, 1 Gbit/s per node link:
#     zpp-topo --json        2 nodes, hosts zpp-n0 and zpp-n1, not emulated
#     test_transport         every operation, counts, errors (not Emu.*)
#     test_coll              baselines, qwZ, hpZ, qgZ, qWD
#     test_tuner             ZPP_ALGO=auto's probe: counters left at zero,
#                            ranks per core of the whole machine (both
#                            nodes' ranks), the rate between nodes a
#                            rank's share of the link, every rank choosing
#                            alike
#     test_linkcut           link down (bridge port) and 100% loss: a cut
#                            shorter than the timeout completes exactly, a
#                            longer one times out on every rank, no hang
#     shrink_cluster_worker  faults (mpirun --enable-recovery; MPI only
#                            starts the ranks, zpp's TCP bootstrap and UCX
#                            carry the communicator, ZPP_TIMEOUT_S T = 3 s
#                            unless said; tests/shrink_cluster_worker.c):
#       kill qwz|hpz|qgz     rank 5 SIGKILLed in the middle of that call:
#                            the 7 survivors shrink, the node map is
#                            rediscovered (4 and 3 ranks), all-gather and
#                            reduce-scatter exact, qwZ within its bound;
#                            the kill to the first exact collective printed
#       node                 node 1's 4 ranks SIGKILLed: shrink to one node,
#                            a group recovered bitwise from hpZ's copies, a
#                            stale one ZPP_ERR_DATA_LOST naming the rank
#       cut (T = 2 s)        node 1's link down while collectives run: node
#                            0 shrinks to its 4 ranks (exact), node 1's ranks
#                            end in a named error, all within T + 3 T + 2 s
#       second               rank 6 SIGKILLs itself after the decision: every
#                            other survivor ZPP_ERR_PEER_FAILED naming it
#   3 nodes x 2 ranks, unshaped:
#     test_transport, test_coll
# Where a cluster cannot be made (not root, no iproute2, no namespaces) it
# prints why and exits 0 (skipped).  One cluster at a time per machine:
# /run/zpp-cluster.lock.  Everything is torn down on exit, also on failure.
# Wall time here: 68 s at a load average of 5, 114 s at 20; with the
# netns_cluster.sh checks and the 16 s short-cut timeout 157 and 187 s at
# 20-22 (test_coll 2x4 alone 29 and 83 s of its 180; test_tuner 2x4 about 5 s).  The shrink_cluster_worker
# steps add 83 s at a load average of 45 (11-13 s per kill, 18 s for the
# cut, 19 s for the second kill, timed without its survivors' hold of
# their communicator until 4 T + 1 s after the kill, about 4 s more; each
# launch about 5 s of it, and 3 s of waiting for mpirun to end).
set -uo pipefail
prog=cluster_tests.sh
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-build}" && pwd) || { echo "$prog: no build dir ${1:-build}" >&2; exit 1; }
cluster=$root/scripts/netns_cluster.sh

# check exits 77 (and says why) where a cluster cannot be made: a skip.
# Any other failure of it is a failure, not a skip.
why=$("$cluster" check) && rc=0 || rc=$?
if [ $rc -eq 77 ]; then
  echo "$prog: SKIPPED: ${why#*: }"
  exit 0
elif [ $rc -ne 0 ]; then
  echo "$prog: scripts/netns_cluster.sh check failed (exit $rc): $why" >&2
  exit 1
fi
only=${ZPP_CLUSTER_STEPS:-all}
case $only in
  all) bins="tools/zpp-topo tests/test_transport tests/test_coll tests/test_tuner tests/test_linkcut tests/shrink_cluster_worker" ;;
  faults) bins=tests/shrink_cluster_worker ;;
  *) echo "$prog: ZPP_CLUSTER_STEPS '$only': must be all or faults" >&2; exit 1 ;;
esac
for b in $bins; do
  [ -x "$build/$b" ] || { echo "$prog: no $build/$b: build first" >&2; exit 1; }
done

exec 9> /run/zpp-cluster.lock
flock -w 900 9 || { echo "$prog: another cluster run holds /run/zpp-cluster.lock" >&2; exit 1; }
trap 'exit 130' INT TERM

failed=()
t_all=$(date +%s)
# step NAME LIMIT_S MPIRUN_ARGS...: one bounded mpirun on the cluster
step() {
  local name=$1 limit=$2 t0 rc
  shift 2
  echo "== $name"
  t0=$(date +%s)
  # 9>&-: the ranks and daemons do not inherit the lock (a straggler would
  # keep it held after this script)
  timeout -k 10 "$limit" "$cluster" run -x OMPI_MCA_mpi_yield_when_idle=1 "$@" \
    > "$log" 2>&1 9>&-
  rc=$?
  if [ $rc -eq 0 ]; then
    grep -E '^\[ (seed|cut|wait) |^\[ retry\] |^\[  (PASSED|SKIPPED) ' "$log" | sed 's/^/   /'
    echo "   passed ($(( $(date +%s) - t0 )) s)"
  else
    # the failures first (gtest's, and every rank's), then the end of the log
    grep -E -A4 ': Failure$|^\[rank [0-9]+\] ' "$log" | head -60 | sed 's/^/   /'
    echo "   ... (the end of the log:)"
    tail -25 "$log" | sed 's/^/   /'
    [ $rc -eq 124 ] && echo "   TIMED OUT after $limit s"
    echo "   FAILED (exit $rc, $(( $(date +%s) - t0 )) s)"
    failed+=("$name")
  fi
}
log=$(mktemp /tmp/zpp-cluster-tests.XXXXXX)
stamp=$(mktemp /tmp/zpp-cluster-stamp.XXXXXX)
trap '"$cluster" down; rm -f "$log" "$stamp"' EXIT

. "$root/scripts/reported_run.sh"
# fault_step NAME LIMIT_S RANKS MPIRUN_ARGS...: a run of
# shrink_cluster_worker, which survives the death of ranks
# (--enable-recovery: the job goes on without them); it passes when the
# ranks that printed PASS are exactly RANKS (sorted, "0,1,2,3") and none
# printed FAIL (a hung rank prints nothing and the run ends at LIMIT_S).
# mpirun's own status is not judged (the survivors end without
# MPI_Finalize), but for 124: the limit.  A pass shows one line of each
# node (2x4: ranks 0-3 on node 0, 4-7 on node 1).
fault_step() {
  local name=$1 limit=$2 ranks=$3 t0 rc got nf want node line
  shift 3
  want=$(tr ',' '\n' <<< "$ranks" | grep -c .)
  echo "== $name"
  t0=$(date +%s)
  rm -f "$stamp"
  reported_run "$want" "$limit" "$log" "$cluster" run --enable-recovery \
    -x OMPI_MCA_mpi_yield_when_idle=1 -x ZPP_TEST_KILL_STAMP="$stamp" "$@" > "$log" 2>&1 9>&-
  rc=$?
  got=$(sed -n 's/^PASS rank \([0-9]*\):.*/\1/p' "$log" | sort -n | paste -sd, -)
  nf=$(grep -c '^FAIL rank' "$log")
  if [ "$got" = "$ranks" ] && [ "$nf" -eq 0 ] && [ $rc -ne 124 ]; then
    grep -E '^(seed|kill to) ' "$log" | sed 's/^/   /'
    for node in '[0-3]' '[4-7]'; do
      line=$(grep -E "^PASS rank $node:" "$log" | sort -k3n | head -1)
      [ -n "$line" ] && echo "   $line"
    done
    echo "   passed: ranks $got ($(( $(date +%s) - t0 )) s)"
  else
    grep -E '^(FAIL|PASS) rank' "$log" | sed 's/^/   /'
    echo "   ... (the end of the log:)"
    tail -15 "$log" | sed 's/^/   /'
    [ $rc -eq 124 ] && echo "   TIMED OUT after $limit s"
    echo "   FAILED (PASS from ranks '$got', want $ranks; $nf FAIL; mpirun exit $rc, $(( $(date +%s) - t0 )) s)"
    failed+=("$name")
  fi
}
worker=$build/tests/shrink_cluster_worker
fault_steps() {
  local c
  for c in qwz hpz qgz; do
    fault_step "shrink_cluster_worker 2x4: rank 5 killed during $c" 60 0,1,2,3,4,6,7 -np 8 \
      -x ZPP_TIMEOUT_S=3 "$worker" kill $c
  done
  fault_step "shrink_cluster_worker 2x4: node 1 killed, recover" 60 0,1,2,3 -np 8 \
    -x ZPP_TIMEOUT_S=3 "$worker" node
  fault_step "shrink_cluster_worker 2x4: node 1's link cut" 60 0,1,2,3,4,5,6,7 -np 8 -x ZPP_TIMEOUT_S=2 \
    -x ZPP_TEST_LINK_CUT="$cluster link 1 down" -x ZPP_TEST_LINK_RESTORE="$cluster link 1 up" \
    "$worker" cut
  # the worker restores the link after every rank's bound; a failed run
  # may not have
  if ! "$cluster" link 1 up; then
    echo "   FAILED: node 1's link could not be brought up"
    failed+=("node 1's link up after the cut")
  fi
  fault_step "shrink_cluster_worker 2x4: second kill during the shrink" 60 0,1,2,3,4,7 -np 8 \
    -x ZPP_TIMEOUT_S=3 "$worker" second
}
if [ "$only" = faults ]; then
  "$cluster" up -n 2 -p 4 -r 1gbit || exit 1
  fault_steps
  echo "$prog: $(( $(date +%s) - t_all )) s"
  if [ ${#failed[@]} -gt 0 ]; then echo "$prog: FAILED: ${failed[*]}"; exit 1; fi
  echo "$prog: the fault steps passed"
  exit 0
fi

# ---- netns_cluster.sh itself ---------------------------------------------------
# A failed up (here: tc refuses to shape, through a stand-in tc first in
# PATH) tears down what it made; while this script holds the lock, an up
# or down from a process without it (9>&-) refuses and touches nothing.
echo "== netns_cluster.sh: teardown after a failed up; the lock"
shim=$(mktemp -d /tmp/zpp-cluster-tc.XXXXXX)
printf '#!/bin/sh\ncase " $* " in *" replace "*) echo "stand-in tc: refusing $*" >&2; exit 1 ;; esac\nexec %s "$@"\n' \
  "$(command -v tc)" > "$shim/tc"
chmod 755 "$shim/tc"
self_ok=1
if PATH=$shim:$PATH timeout -k 5 60 "$cluster" up -n 2 -p 1 -r 100mbit > "$log" 2>&1; then
  echo "   up succeeded although tc refused"; self_ok=0
fi
left=$(ip netns list | awk '{print $1}' | grep -E '^zpp-(n[0-9]+|sw|head)$' | tr '\n' ' ')
if [ -n "$left" ] || [ -e /run/zpp-cluster ]; then
  echo "   a failed up left: ${left}$( [ -e /run/zpp-cluster ] && echo /run/zpp-cluster)"; self_ok=0
fi
rm -rf "$shim"
timeout -k 5 60 "$cluster" up -n 1 -p 1 > "$log" 2>&1 || { echo "   up -n 1 failed"; self_ok=0; }
for c in "up -n 1 -p 1" down; do
  # shellcheck disable=SC2086
  if timeout -k 5 30 "$cluster" $c > "$log" 2>&1 9>&-; then
    echo "   '$c' without the lock succeeded"; self_ok=0
  elif ! grep -q "holds /run/zpp-cluster.lock" "$log"; then
    echo "   '$c' without the lock: $(tail -1 "$log")"; self_ok=0
  fi
done
ip netns list | grep -q '^zpp-n0' || { echo "   the cluster was torn down by a process without the lock"; self_ok=0; }
if [ $self_ok = 1 ]; then echo "   passed"; else echo "   FAILED"; failed+=(netns_cluster.sh); fi

# ---- 2 nodes x 4 ranks, shaped ----------------------------------------------
"$cluster" up -n 2 -p 4 -r 1gbit || exit 1
echo "== zpp-topo --json (2 nodes x 4 ranks, discovered)"
if timeout -k 10 60 "$cluster" run -np 8 "$build/tools/zpp-topo" --json > "$log" 2>&1 9>&- &&
   python3 - "$log" <<'PY'
import json, sys
text = open(sys.argv[1]).read()
d = json.loads(text[text.index("{"):text.rindex("}") + 1])
hosts = [sorted({r["host"] for r in d["ranks"] if r["node"] == n}) for n in range(len(d["nodes"]))]
want = [["zpp-n0"], ["zpp-n1"]]
ok = (d["emulated"] is False and d["world_size"] == 8 and len(d["nodes"]) == 2
      and [len(n["ranks"]) for n in d["nodes"]] == [4, 4] and hosts == want)
print("   nodes %d, ranks per node %s, hosts %s, emulated %s"
      % (len(d["nodes"]), [len(n["ranks"]) for n in d["nodes"]], hosts, d["emulated"]))
sys.exit(0 if ok else 1)
PY
then
  echo "   passed"
else
  tail -20 "$log" | sed 's/^/   /'
  echo "   FAILED: expected 2 discovered nodes of 4 ranks on hosts zpp-n0, zpp-n1"
  failed+=(zpp-topo)
fi
step "test_transport 2x4" 180 -np 8 -x ZPP_TEST_EXPECT_NODES=2x4 \
  "$build/tests/test_transport" --gtest_filter=-Emu.*
step "test_coll 2x4" 180 -np 8 "$build/tests/test_coll"
step "test_tuner 2x4, the probe on real links" 120 -np 8 -x ZPP_TEST_LINK_GBIT=1 \
  "$build/tests/test_tuner" \
  --gtest_filter='Auto.StatsAreZeroAfterCreation:Auto.RanksPerCore*:Auto.ProbedRate*:Auto.EveryRankChoosesAlike'
# A failed or killed run may leave the link cut: restore it after each
# step, so that one failure does not turn into the next step's.  Each test
# runs in its own mpirun: its TCP connections are fresh, not still backing
# off from the cut of the test before it.
for v in "link down:down:up" "100% loss:loss:unloss"; do
  IFS=: read -r what cut restore <<< "$v"
  for t in ShortCutCompletes LongCutTimesOut; do
    step "test_linkcut 2x4, $what, $t" 120 -np 8 \
      -x ZPP_TEST_LINK_CUT="$cluster link 1 $cut" -x ZPP_TEST_LINK_RESTORE="$cluster link 1 $restore" \
      "$build/tests/test_linkcut" --gtest_filter="LinkCut.$t"
    "$cluster" link 1 "$restore"
  done
done
fault_steps

# ---- 3 nodes x 2 ranks, unshaped ----------------------------------------------
"$cluster" up -n 3 -p 2 || exit 1
step "test_transport 3x2" 180 -np 6 -x ZPP_TEST_EXPECT_NODES=3x2 \
  "$build/tests/test_transport" --gtest_filter=-Emu.*
step "test_coll 3x2" 180 -np 6 "$build/tests/test_coll"

echo "$prog: $(( $(date +%s) - t_all )) s"
if [ ${#failed[@]} -gt 0 ]; then
  echo "$prog: FAILED: ${failed[*]}"
  exit 1
fi
echo "$prog: all cluster suites passed"
