#!/usr/bin/env bash
# The CUDA compiler launcher of the library's build (CMakeLists.txt,
# CUDA_COMPILER_LAUNCHER): runs the compile command it is given, which
# carries -Xptxas -v, saves everything the compiler printed to
# LOGDIR/FILE.cu.log (FILE.cu: the source after -c, by its base name) for
# tools/check_ptxas.sh --logs, and passes on to the build's output only
# what is not ptxas's resource report (warnings and errors stay visible).
#
#   usage: tools/ptxas_log.sh LOGDIR COMPILER ARGS...
# Exit status: the compiler's.
set -uo pipefail
logdir=${1:?usage: ptxas_log.sh LOGDIR COMPILER ARGS...}
shift
src=
prev=
for a in "$@"; do
  [ "$prev" = "-c" ] && src=$a
  prev=$a
done
mkdir -p "$logdir"
out=$(mktemp)
"$@" > "$out" 2>&1
rc=$?
if [ -n "$src" ]; then
  cp "$out" "$logdir/$(basename "$src").log"
fi
grep -v -E '^ptxas info|^ +[0-9]+ bytes stack frame' "$out" >&2
rm -f "$out"
exit $rc
