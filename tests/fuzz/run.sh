#!/usr/bin/env bash
# One fuzz target as a test: replay every committed input of its corpus,
# then fuzz for SECONDS more (new inputs go to WORK_DIR, never into the
# source tree).  A crash leaves its input in WORK_DIR (crash-*, leak-*,
# timeout-*): fix the bug, then commit the input to the corpus as a
# regression input.
#   usage: run.sh FUZZER CORPUS_DIR WORK_DIR SECONDS [libFuzzer flags...]
set -euo pipefail
fuzzer=$1 corpus=$2 work=$3 secs=$4
shift 4
name=$(basename "$fuzzer")
dict=$(dirname "$corpus")/../$name.dict
mkdir -p "$work/new"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
flags=(-timeout=10 -rss_limit_mb=2048 -max_len=4096 -artifact_prefix="$work/")
[ -f "$dict" ] && flags+=(-dict="$dict")

# 1. the committed corpus, each input once (regression inputs included)
mapfile -t inputs < <(find "$corpus" -type f | sort)
if [ ${#inputs[@]} -eq 0 ]; then
  echo "$name: no inputs in $corpus" >&2
  exit 1
fi
"$fuzzer" "${flags[@]}" "$@" "${inputs[@]}" > "$work/replay.log" 2>&1 || {
  cat "$work/replay.log" >&2
  echo "$name: FAILED on a committed input (see above)" >&2
  exit 1
}
# Each target prints "<name>: N inputs, A accepted" at exit: a replay in
# which no committed input got past the argument checks tests nothing (an
# input format or a command line that drifted from the code).
accepted=$(sed -n "s/^$name: [0-9]* inputs, \([0-9]*\) accepted\$/\1/p" "$work/replay.log" | tail -n 1)
if [ -z "$accepted" ] || [ "$accepted" -eq 0 ]; then
  cat "$work/replay.log" >&2
  echo "$name: FAILED: no committed input was accepted (${accepted:-no summary}): the target runs nothing" >&2
  exit 1
fi
echo "$name: replayed ${#inputs[@]} committed inputs, $accepted accepted"

# 2. fuzzing, starting from the corpus and what earlier runs found
if [ "$secs" -gt 0 ]; then
  if ! "$fuzzer" "${flags[@]}" -max_total_time="$secs" -print_final_stats=1 \
       "$@" "$work/new" "$corpus" > "$work/fuzz.log" 2>&1; then
    tail -n 60 "$work/fuzz.log" >&2
    echo "$name: FAILED: the input is in $work/ (crash-*, leak-*, timeout-*)" >&2
    exit 1
  fi
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/fuzz.log")
  if [ -z "$execs" ] || [ "$execs" -eq 0 ]; then
    tail -n 20 "$work/fuzz.log" >&2
    echo "$name: FAILED: libFuzzer ran no input" >&2
    exit 1
  fi
  cov=$(grep -o 'cov: [0-9]*' "$work/fuzz.log" | tail -n 1)
  echo "$name: ${execs:-?} executions in ${secs} s, ${cov:-cov: ?}, corpus $(find "$work/new" "$corpus" -type f | wc -l) inputs, no crash"
fi
