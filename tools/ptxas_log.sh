#!/usr/bin/env bash
# The CUDA compiler launcher of the library's build (CMakeLists.txt,
# CUDA_COMPILER_LAUNCHER): runs the compile command it is given, which
# carries -Xptxas -v, and passes on to the build's output only what is not
# ptxas's resource report (warnings and errors stay visible).  When the
# compile succeeds it saves the report for tools/check_ptxas.sh --logs as
# LOGDIR/<the source's absolute path, / as _>.log, opening with one header
# line:
#   # ptxas_log source=PATH sha256=HASH archs=sm_80,sm_90
# (the source's hash when it was compiled, and the machine-code
# architectures the command names); a failed compile leaves no report.
#
#   usage: tools/ptxas_log.sh LOGDIR COMPILER ARGS...
# Exit status: the compiler's.
set -uo pipefail
logdir=${1:?usage: ptxas_log.sh LOGDIR COMPILER ARGS...}
shift
src=
prev=
archs=
for a in "$@"; do
  [ "$prev" = "-c" ] && src=$a
  for m in $(grep -oE '(code=\[?|-arch=|^)sm_[0-9]+[a-z]?' <<<"$a" | grep -oE 'sm_[0-9]+[a-z]?'); do
    case ",$archs," in *",$m,"*) ;; *) archs=${archs:+$archs,}$m ;; esac
  done
  prev=$a
done
log=
if [ -n "$src" ]; then
  src=$(realpath "$src")
  mkdir -p "$logdir"
  log=$logdir/$(tr / _ <<<"$src").log
  rm -f "$log"
fi
out=$(mktemp)
trap 'rm -f "$out" "$out.new"' EXIT
"$@" > "$out" 2>&1
rc=$?
if [ "$rc" -eq 0 ] && [ -n "$log" ]; then
  { echo "# ptxas_log source=$src sha256=$(sha256sum < "$src" | cut -d' ' -f1) archs=$archs"
    cat "$out"; } > "$out.new"
  # readable by whoever runs the tests; in place only when whole
  chmod 644 "$out.new"
  mv "$out.new" "$log"
fi
grep -v -E '^ptxas info|^ +[0-9]+ bytes stack frame' "$out" >&2
exit $rc
