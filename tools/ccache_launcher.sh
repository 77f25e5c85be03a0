#!/usr/bin/env bash
# The compiler launcher (CMAKE_<LANG>_COMPILER_LAUNCHER) of the builds the
# Makefile configures and of the wheel's (tests/wheel/run.sh): the compile
# through ccache when ccache is installed and its cache directory can be
# written, else the compile itself.  The builds remember only this
# script's path, so installing, removing or breaking ccache later changes
# nothing but whether the cache is used.  The library's CUDA compiles run
# under tools/ptxas_log.sh, which runs this script: ccache replays the
# compiler's stderr (ptxas's resource report) on a hit.
#
#   usage: tools/ccache_launcher.sh COMPILER ARGS...
#   ZPP_CCACHE=0: never use ccache.
# Exit status: the compiler's (or ccache's, which is the compiler's).
[ $# -ge 1 ] || { echo "usage: ccache_launcher.sh COMPILER ARGS..." >&2; exit 2; }
if [ "${ZPP_CCACHE:-1}" != 0 ] && command -v ccache > /dev/null 2>&1; then
  # ccache fails every compile when it cannot make its cache directory
  dir=$(ccache -k cache_dir 2> /dev/null) &&
    [ -n "$dir" ] && mkdir -p "$dir" 2> /dev/null && [ -w "$dir" ] &&
    exec ccache "$@"
fi
exec "$@"
