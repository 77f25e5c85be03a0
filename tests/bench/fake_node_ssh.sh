#!/bin/sh
# Stands in for ssh as Open MPI's plm_rsh_agent: drops the options and the
# host name and runs the command (the remote orted) on this machine.  With
# a hostfile of made-up node names, mpirun then starts one daemon per
# "node", and Open MPI treats ranks under different daemons as remote
# peers (what HAN needs to select itself), while they all run here.
# Each made-up node's daemon gets a session directory base of its own,
# $ZPP_FAKE_NODE_DIR/<node> (OMPI_MCA_orte_tmpdir_base; the tests set it in
# the build tree): with the real host name shared by every daemon, their
# session directories would otherwise be the same path, and two daemons
# creating it at once fail ("mkdir ... File exists").
host=
while [ $# -gt 0 ]; do
  case "$1" in
  -*) shift ;;
  *) host=$1; shift; break ;;
  esac
done
case "$host" in
*[!A-Za-z0-9._-]* | "") echo "fake_node_ssh.sh: bad host name '$host'" >&2; exit 2 ;;
esac
[ -n "${ZPP_FAKE_NODE_DIR:-}" ] || { echo "fake_node_ssh.sh: ZPP_FAKE_NODE_DIR is not set" >&2; exit 2; }
base=$ZPP_FAKE_NODE_DIR/$host
mkdir -p "$base" || exit 1
OMPI_MCA_orte_tmpdir_base=$base exec /bin/sh -c "$*"
