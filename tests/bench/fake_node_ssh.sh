#!/bin/sh
# Stands in for ssh as Open MPI's plm_rsh_agent: drops the options and the
# host name and runs the command (the remote orted) on this machine.  With
# a hostfile of made-up node names, mpirun then starts one daemon per
# "node", and Open MPI treats ranks under different daemons as remote
# peers (what HAN needs to select itself), while they all run here.
while [ $# -gt 0 ]; do
  case "$1" in
  -*) shift ;;
  *) shift; break ;;
  esac
done
exec /bin/sh -c "$*"
