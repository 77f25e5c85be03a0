#!/usr/bin/env bash
# A real multi-node cluster on one machine: network namespaces as nodes,
# each behind its own (optionally shaped) link into one bridge, and Open MPI
# launching ranks into them through its rsh agent.  Needs root and iproute2
# (scripts/install-deps.sh installs iproute2).
#
#   scripts/netns_cluster.sh up [-n NODES] [-p RANKS] [-r RATE]
#                                 make it: NODES nodes (default 2) of RANKS
#                                 slots each (default 4: mpirun -np N*RANKS
#                                 puts ranks 0..RANKS-1 on zpp-n0, ...);
#                                 RATE: tc rate per node link and direction,
#                                 e.g. 400mbit; 0 or none = unshaped (default);
#                                 ZPP_CLUSTER_BURST=BYTES: the tbf burst
#                                 (default 73728; up prints the one it set)
#   scripts/netns_cluster.sh down              remove everything it made, by name
#   scripts/netns_cluster.sh run [MPIRUN ARGS...]
#                                 mpirun from the head namespace onto the
#                                 nodes (the cluster flags are prepended; give
#                                 -np, -x VAR, --map-by, the program ...)
#   scripts/netns_cluster.sh shape RATE        reshape every node link (the
#                                 burst of up, or ZPP_CLUSTER_BURST)
#   scripts/netns_cluster.sh link NODE down|up|loss|unloss
#                                 cut node NODE's link (down: the bridge port
#                                 goes down; loss: 100% loss both ways) and
#                                 restore it
#   scripts/netns_cluster.sh exec NODE CMD...  run CMD in node NODE (its own
#                                 hostname)
#   scripts/netns_cluster.sh status            what exists, the qdiscs
#   scripts/netns_cluster.sh check             exit 0 if a cluster can be made
#                                 here, else print why and exit 77
#
# What it makes (every name starts with zpp-, the prefix teardown matches):
#   namespace zpp-sw     the switch: bridge zpp-br0 and one port per node
#                        (zpp-p<i>, and zpp-ph for the head); no address
#   namespace zpp-n<i>   node i: lo and zpp-veth (10.213.0.(11+i)/24), its
#                        hostname zpp-n<i> (unshare --uts at every launch)
#   namespace zpp-head   where mpirun (Open MPI's HNP) runs: zpp-veth at
#                        10.213.0.1/24, unshaped; it runs no ranks
#   /etc/netns/zpp-*/    hosts and resolv.conf seen inside each namespace
#                        (ip netns exec bind-mounts them over /etc/): every
#                        cluster name resolves from files, no DNS is asked
#   /run/zpp-cluster/    the state: hostfile, rsh agent, settings (nodes,
#                        rate, burst, subnet)
# up and down take /run/zpp-cluster.lock (not waiting: they refuse while
# another run holds it), unless their caller holds it as fd 9.
# The subnet (ZPP_CLUSTER_SUBNET, default 10.213.0) exists only inside these
# namespaces: the root namespace gets no address or route, so no traffic
# leaves them.
#
# Shaping (docs/bench/real_links.md): a tbf on each node's link in
# both directions, its egress in the node (what the node sends) and the
# egress of its bridge port (what it receives).  The queue is sized so that
# TCP does not see drops: latency 400 ms of queue (at 400 Mbit/s 20 MB, more
# than the 4 ranks' TCP windows together), so the queue, not loss, paces the
# senders (with a 32 KiB queue TCP over tbf dropped, backed off and one run
# in ten took 10x longer).  The burst is 72 KiB (ZPP_CLUSTER_BURST, bytes,
# 1514..16777216), the smallest round size that holds one whole GSO packet
# as tbf counts it: TCP hands the veth (gso_max_size 65536) up to about
# 65 KB of data, and tbf adds the headers of every segment, about 68 KB in
# all.  tbf cuts a packet longer than its bucket into segments, and at
# 1600mbit that halved what one TCP flow got of the link (0.7-0.9 Gbit/s
# with 65536, 1.4 with 73728, 1.4-1.5 with 262144 on the 2 loaded cores;
# 0.36-0.38 Gbit/s of 400mbit with either).  A larger bucket fills while
# a sender is idle and then lets it send above the rate until it drains:
# bursty traffic (a compressed collective's short transfers between idle
# gaps) would beat the rate and flatter the compressed rows.
#
# Open MPI: ob1 with the btls self, vader (shared memory, ranks of one
# node) and tcp (between nodes, on the cluster subnet only:
# btl_tcp_if_include, and oob_tcp_if_include so the daemons reach the HNP on
# the bridge); plm_rsh_agent is /run/zpp-cluster/rsh, which runs the
# daemon with `ip netns exec zpp-nI unshare --uts` and hostname zpp-nI and a
# clean environment (as ssh gives); no tree spawn.
set -euo pipefail
prog=netns_cluster.sh
state=/run/zpp-cluster
lock=/run/zpp-cluster.lock
net=${ZPP_CLUSTER_SUBNET:-10.213.0}
# A cluster that is up keeps the subnet it was made with (run, the hosts).
[ "${1:-}" != up ] && [ -f "$state/subnet" ] && net=$(cat "$state/subnet")
head_ns=zpp-head
sw_ns=zpp-sw
bridge=zpp-br0

die() { echo "$prog: $*" >&2; exit 1; }

# Why a cluster cannot be made here (empty: it can).
why_not() {
  if [ "$(id -u)" -ne 0 ]; then echo "not root (network namespaces need root)"; return; fi
  command -v ip > /dev/null || { echo "no ip command (install iproute2)"; return; }
  command -v tc > /dev/null || { echo "no tc command (install iproute2)"; return; }
  command -v unshare > /dev/null || { echo "no unshare command (util-linux)"; return; }
  command -v flock > /dev/null || { echo "no flock command (util-linux)"; return; }
  command -v python3 > /dev/null || { echo "no python3 (the reachability check)"; return; }
  command -v mpirun > /dev/null || { echo "no mpirun (Open MPI)"; return; }
  local probe=zpp-probe$$
  if ! ip netns add "$probe" 2> /dev/null; then
    echo "ip netns add failed (no CAP_SYS_ADMIN, or namespaces disabled)"; return
  fi
  if ! ip netns exec "$probe" unshare --uts true 2> /dev/null; then
    ip netns del "$probe" 2> /dev/null || true
    echo "cannot enter a namespace with a hostname of its own (ip netns exec, unshare --uts)"; return
  fi
  if ! ip -n "$probe" link add zpp-t0 type veth peer name zpp-t1 2> /dev/null; then
    ip netns del "$probe" 2> /dev/null || true
    echo "cannot create veth pairs (no veth module?)"; return
  fi
  if ! ip -n "$probe" link add zpp-tb type bridge 2> /dev/null; then
    ip netns del "$probe" 2> /dev/null || true
    echo "cannot create a bridge (no bridge module?)"; return
  fi
  if ! ip netns exec "$probe" tc qdisc add dev zpp-t0 root tbf rate 100mbit \
       burst 73728 latency 400ms 2> /dev/null; then
    ip netns del "$probe" 2> /dev/null || true
    echo "tc cannot add a tbf qdisc (no sch_tbf?)"; return
  fi
  ip netns del "$probe"
}

# Every namespace of ours, by name.
our_namespaces() {
  ip netns list 2> /dev/null | awk '{print $1}' | grep -E '^zpp-(n[0-9]+|sw|head)$' || true
}

teardown() {
  local ns pids p i
  for ns in $(our_namespaces); do
    # Processes still inside (a failed run's ranks or daemons) would keep
    # the namespace alive after its name is gone: end them, by namespace.
    pids=$(ip netns pids "$ns" 2> /dev/null || true)
    for p in $pids; do kill -TERM "$p" 2> /dev/null || true; done
  done
  for i in 1 2 3 4 5 6 7 8 9 10; do
    pids=""
    for ns in $(our_namespaces); do pids+=$(ip netns pids "$ns" 2> /dev/null || true); done
    [ -z "$pids" ] && break
    sleep 0.3
  done
  for ns in $(our_namespaces); do
    for p in $(ip netns pids "$ns" 2> /dev/null || true); do kill -KILL "$p" 2> /dev/null || true; done
  done
  for ns in $(our_namespaces); do ip netns del "$ns" 2> /dev/null || true; done
  rm -rf /etc/netns/zpp-n[0-9]* /etc/netns/$sw_ns /etc/netns/$head_ns "$state"
  rmdir /etc/netns 2> /dev/null || true
  [ -z "$(our_namespaces)" ] || { echo "$prog: could not remove: $(our_namespaces)" >&2; return 1; }
}

# Every node opens a TCP connection to the head (python3: no ping here).
reach_check() { # nodes
  local n=$1 i rc=0 port=47213
  ip netns exec "$head_ns" python3 -c '
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(64); s.settimeout(10)
for _ in range(int(sys.argv[3])): s.accept()[0].close()
' "$net.1" "$port" "$n" &
  local srv=$!
  for ((i = 0; i < n; i++)); do
    ip netns exec "zpp-n$i" python3 -c '
import socket, sys, time
for k in range(50):  # the listener may not be up yet: 5 s of tries
    try:
        socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2).close(); break
    except OSError as e:
        err = e; time.sleep(0.1)
else:
    sys.exit("zpp-n%s: %s" % (sys.argv[3], err))
' "$net.1" "$port" "$i" || rc=1
  done
  if [ $rc -ne 0 ]; then kill "$srv" 2> /dev/null || true; fi
  wait "$srv" 2> /dev/null || rc=1
  return $rc
}

nnodes() { cat "$state/nodes" 2> /dev/null || die "no cluster: run '$prog up' first"; }

# The tbf of one direction of a link: rate in tc units, "none" removes it;
# burst in bytes (cluster_burst).  Anything that was there (a netem of a
# cut) is replaced.
tbf() { # ns dev rate burst
  local ns=$1 dev=$2 rate=$3 burst=$4
  if [ "$rate" = none ] || [ "$rate" = 0 ]; then
    ip netns exec "$ns" tc qdisc del dev "$dev" root 2> /dev/null || true
    return
  fi
  ip netns exec "$ns" tc qdisc replace dev "$dev" root handle 1: tbf rate "$rate" \
    burst "$burst" latency 400ms
}

# The tbf burst in bytes: ZPP_CLUSTER_BURST where set, else the one the
# cluster was made with, else 73728 (see "Shaping" above).  At least one
# Ethernet frame (1514 bytes; tbf drops a frame longer than its bucket that
# it cannot cut).  A bad value dies naming it, before anything is made or
# reshaped.
cluster_burst() {
  local b=${ZPP_CLUSTER_BURST:-}
  if [ -z "$b" ]; then
    if [ "${1:-}" != up ] && [ -f "$state/burst" ]; then cat "$state/burst"; else echo 73728; fi
    return
  fi
  [[ "$b" =~ ^[0-9]{1,9}$ ]] && [ "$((10#$b))" -ge 1514 ] && [ "$((10#$b))" -le 16777216 ] ||
    die "ZPP_CLUSTER_BURST '$b': must be a number of bytes, 1514 (one Ethernet frame) to 16777216"
  echo $((10#$b))
}

# tc rate -> bit/s (accepts bit, kbit, mbit, gbit; a plain number is bit/s).
# Anything else (a fraction, another unit, garbage) dies naming the rate,
# before anything is made or reshaped.
rate_bits() {
  local r=$1 v mul
  [[ "$r" =~ ^([0-9]{1,6})(bit|kbit|mbit|gbit)?$ ]] && [ "${BASH_REMATCH[1]}" -gt 0 ] ||
    die "rate '$r': must be a positive integer (at most 6 digits) with bit, kbit, mbit or gbit (e.g. 400mbit), or none"
  v=$((10#${BASH_REMATCH[1]}))
  case "${BASH_REMATCH[2]}" in
    gbit) mul=1000000000 ;;
    mbit) mul=1000000 ;;
    kbit) mul=1000 ;;
    *) mul=1 ;;
  esac
  echo $((v * mul))
}

# A RATE argument as up -r and shape take it: none, 0 or a tc rate.
check_rate() {
  [ "$1" = none ] || [ "$1" = 0 ] || rate_bits "$1" > /dev/null
}

# One cluster at a time per machine.  up and down take /run/zpp-cluster.lock
# (without waiting) unless the caller holds it and handed it down as fd 9
# (tests/cluster_tests.sh, perf/cluster_study.sh): a second `up` or `down`
# would tear down the cluster of the run that holds it, killing its ranks.
take_lock() {
  if [ -e /proc/self/fd/9 ] && [ /proc/self/fd/9 -ef "$lock" ]; then return; fi
  exec 9> "$lock"
  flock -n 9 || die "another cluster run holds $lock (tests/cluster_tests.sh or perf/cluster_study.sh); leaving its namespaces alone"
}

shape_all() { # rate burst
  local n i
  n=$(nnodes)
  for ((i = 0; i < n; i++)); do
    tbf "zpp-n$i" zpp-veth "$1" "$2"
    tbf "$sw_ns" "zpp-p$i" "$1" "$2"
  done
  echo "$1" > "$state/rate"
  echo "$2" > "$state/burst"
}

# What a link setting is, for the messages of up and shape.
link_words() { # rate burst
  if [ "$1" = none ] || [ "$1" = 0 ]; then
    echo "link rate $1 per node and direction (unshaped: no tbf)"
  else
    echo "link rate $1 per node and direction, tbf burst $2 bytes"
  fi
}

cmd_up() {
  local n=2 ppn=4 rate=none i why burst
  while [ $# -gt 0 ]; do
    case "$1" in
      -n) n=$2; shift 2 ;;
      -p) ppn=$2; shift 2 ;;
      -r) rate=$2; shift 2 ;;
      *) die "up: unknown argument '$1'" ;;
    esac
  done
  [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le 64 ] || die "-n $n: must be 1..64"
  [[ "$ppn" =~ ^[0-9]+$ ]] && [ "$ppn" -ge 1 ] && [ "$ppn" -le 256 ] || die "-p $ppn: must be 1..256"
  check_rate "$rate"
  burst=$(cluster_burst up) || exit 1
  [[ "$net" =~ ^([0-9]{1,3})\.([0-9]{1,3})\.([0-9]{1,3})$ ]] &&
    [ "${BASH_REMATCH[1]}" -le 255 ] && [ "${BASH_REMATCH[2]}" -le 255 ] &&
    [ "${BASH_REMATCH[3]}" -le 255 ] ||
    die "ZPP_CLUSTER_SUBNET '$net': must be the first three octets of an IPv4 /24, e.g. 10.213.0"
  why=$(why_not)
  [ -z "$why" ] || die "cannot make a cluster here: $why"
  take_lock
  teardown   # leftovers of an earlier run, by name
  # Any failure from here on (set -e inside the helper functions too, a
  # die, a signal) tears down what was made: an EXIT trap, since an ERR
  # trap set here is not inherited by the functions (no errtrace).
  trap 'rc=$?; trap - EXIT; if [ $rc -ne 0 ]; then echo "$prog: up failed; tearing down" >&2; teardown || true; fi; exit $rc' EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  mkdir -p "$state" /etc/netns
  echo "$n" > "$state/nodes"
  echo "$net" > "$state/subnet"

  # hosts: every name of the cluster, from files (no DNS inside)
  {
    echo "127.0.0.1 localhost"
    echo "$net.1 $head_ns"
    for ((i = 0; i < n; i++)); do echo "$net.$((11 + i)) zpp-n$i"; done
  } > "$state/hosts"
  : > "$state/resolv.conf"

  ip netns add "$sw_ns"
  ip -n "$sw_ns" link set lo up
  ip -n "$sw_ns" link add "$bridge" type bridge forward_delay 0 stp_state 0
  ip -n "$sw_ns" link set "$bridge" up
  add_port() { # ns port addr
    ip netns add "$1"
    mkdir -p "/etc/netns/$1"
    cp "$state/hosts" "/etc/netns/$1/hosts"
    cp "$state/resolv.conf" "/etc/netns/$1/resolv.conf"
    ip -n "$1" link set lo up
    ip -n "$sw_ns" link add "$2" type veth peer name zpp-veth netns "$1"
    ip -n "$sw_ns" link set "$2" master "$bridge" up
    ip -n "$1" addr add "$3/24" dev zpp-veth
    ip -n "$1" link set zpp-veth up
  }
  add_port "$head_ns" zpp-ph "$net.1"
  : > "$state/hostfile"
  for ((i = 0; i < n; i++)); do
    add_port "zpp-n$i" "zpp-p$i" "$net.$((11 + i))"
    echo "zpp-n$i slots=$ppn" >> "$state/hostfile"
  done
  shape_all "$rate" "$burst"

  # Open MPI's rsh agent: "rsh HOST CMD..." runs CMD in node HOST with its
  # own hostname and a clean environment, as ssh would.
  cat > "$state/rsh" <<EOF
#!/bin/sh
# Open MPI plm_rsh_agent of scripts/netns_cluster.sh: HOST CMD...
host=\$1; shift
case "\$host" in zpp-n[0-9]*) ;; *) echo "zpp-cluster rsh: unknown host '\$host'" >&2; exit 255 ;; esac
exec env -i PATH="$PATH" HOME="\${HOME:-/root}" LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}" \\
  ip netns exec "\$host" unshare --uts sh -c 'hostname "\$0" && exec sh -c "\$1"' "\$host" "\$*"
EOF
  chmod 755 "$state/rsh"
  # Reachability: every node connects to the head across the bridge (TCP,
  # what Open MPI's daemons do next).  ZPP_CLUSTER_KEEP=1 keeps the cluster
  # of a failed check for a look.
  if ! reach_check "$n"; then
    [ -z "${ZPP_CLUSTER_KEEP:-}" ] || trap - EXIT
    die "a node cannot reach the head at $net.1 (see above)"
  fi
  trap - EXIT INT TERM
  echo "$prog: $n nodes up (zpp-n0..zpp-n$((n - 1)), $net.11..), $(link_words "$rate" "$burst")" >&2
}

# mpirun from the head namespace; the cluster flags come first.
cmd_run() {
  [ -f "$state/hostfile" ] || die "no cluster: run '$prog up' first"
  local flags=(--allow-run-as-root --oversubscribe --bind-to none
    --hostfile "$state/hostfile"
    --mca plm_rsh_agent "$state/rsh" --mca plm_rsh_no_tree_spawn 1
    --mca pml ob1 --mca btl self,vader,tcp
    --mca oob_tcp_if_include "$net.0/24" --mca btl_tcp_if_include "$net.0/24")
  exec ip netns exec "$head_ns" unshare --uts sh -c 'hostname "$0" && exec "$@"' \
    "$head_ns" mpirun "${flags[@]}" "$@"
}

# 100% loss on one direction: netem where the kernel has it; else (this
# machine's kernel has no sch_netem) a tbf whose bucket (10 bytes) is
# smaller than any frame, with a 1-byte queue, which drops every packet.
drop_all() { # ns dev
  ip netns exec "$1" tc qdisc replace dev "$2" root netem loss 100% 2> /dev/null ||
    ip netns exec "$1" tc qdisc replace dev "$2" root tbf rate 8bit burst 10 limit 1
}

cmd_link() {
  local i=${1:-} what=${2:-} n rate burst
  n=$(nnodes)
  [[ "$i" =~ ^[0-9]+$ ]] && [ "$i" -lt "$n" ] || die "link: node '$i': must be 0..$((n - 1))"
  rate=$(cat "$state/rate")
  burst=$(cat "$state/burst" 2> /dev/null || echo 73728)
  case "$what" in
    down) ip -n "$sw_ns" link set "zpp-p$i" down ;;
    up) ip -n "$sw_ns" link set "zpp-p$i" up ;;
    loss) drop_all "zpp-n$i" zpp-veth; drop_all "$sw_ns" "zpp-p$i" ;;
    unloss)
      ip netns exec "zpp-n$i" tc qdisc del dev zpp-veth root 2> /dev/null || true
      ip netns exec "$sw_ns" tc qdisc del dev "zpp-p$i" root 2> /dev/null || true
      tbf "zpp-n$i" zpp-veth "$rate" "$burst"
      tbf "$sw_ns" "zpp-p$i" "$rate" "$burst" ;;
    *) die "link: '$what': must be down, up, loss or unloss" ;;
  esac
}

cmd_exec() {
  local i=${1:-} n
  n=$(nnodes)
  [[ "$i" =~ ^[0-9]+$ ]] && [ "$i" -lt "$n" ] || die "exec: node '$i': must be 0..$((n - 1))"
  shift
  exec ip netns exec "zpp-n$i" unshare --uts sh -c 'hostname "$0" && exec "$@"' "zpp-n$i" "$@"
}

cmd_status() {
  local ns
  echo "namespaces: $(our_namespaces | tr '\n' ' ')"
  [ -f "$state/nodes" ] && echo "nodes: $(cat "$state/nodes"), rate: $(cat "$state/rate"), tbf burst: $(cat "$state/burst" 2> /dev/null || echo ?) bytes"
  for ns in $(our_namespaces); do
    ip netns exec "$ns" tc qdisc show | grep -v 'noqueue\|qdisc noop' | sed "s/^/$ns: /" || true
  done
}

case "${1:-}" in
  up) shift; cmd_up "$@" ;;
  down) take_lock; teardown ;;
  run) shift; cmd_run "$@" ;;
  shape)
    [ $# -eq 2 ] || die "usage: $prog shape RATE"
    nnodes > /dev/null; check_rate "$2"
    burst=$(cluster_burst) || exit 1
    shape_all "$2" "$burst"
    echo "$prog: $(link_words "$2" "$burst")" >&2 ;;
  link) shift; cmd_link "$@" ;;
  exec) shift; cmd_exec "$@" ;;
  status) cmd_status ;;
  check)
    why=$(why_not)
    if [ -n "$why" ]; then echo "$prog: cannot make a cluster here: $why"; exit 77; fi ;;
  *) sed -n '2,31p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
