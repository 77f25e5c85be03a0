#!/usr/bin/env bash
# tools/ccache_launcher.sh, the compiler launcher of the Makefile's and the
# wheel's builds (run by tests/wheel/run.sh; a few seconds):
#  - with a ccache whose cache directory cannot be made, the compile runs
#    without it and succeeds (ccache alone fails it);
#  - with no ccache on PATH, the compile runs as it is;
#  - with a working ccache, the second compile of a source is a hit, and
#    the compiler's stderr comes back on the hit: through tools/ptxas_log.sh
#    (the library's CUDA launcher, which saves that stderr, ptxas's
#    report) the saved log holds it after the hit too;
#  - a failing compile fails with the compiler's status.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
launcher=$root/tools/ccache_launcher.sh
tmp=$(mktemp -d /tmp/zpp-ccache-launcher.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "ccache_launcher_test: FAIL: $*" >&2; exit 1; }
cc=$(command -v gcc || command -v cc) || fail "no C compiler"
# a source whose compile writes to stderr (as nvcc -Xptxas=-v does)
printf '#warning zpp-launcher-probe\nint zpp_probe(void) { return 7; }\n' > "$tmp/p.c"

# no ccache on PATH: a bin of its own holding only the compiler and the
# assembler
mkdir "$tmp/bin"
ln -s "$cc" "$tmp/bin/cc"
ln -s "$(command -v as)" "$tmp/bin/as"
PATH=$tmp/bin /bin/bash "$launcher" cc -c "$tmp/p.c" -o "$tmp/a.o" 2> "$tmp/err" \
  || fail "without ccache on PATH: the compile failed: $(cat "$tmp/err")"
[ -s "$tmp/a.o" ] || fail "without ccache on PATH: no object"

if ! command -v ccache > /dev/null; then
  echo "ccache_launcher_test: passed (ccache not installed: its cases skipped)"
  exit 0
fi

# a broken ccache: its cache directory cannot be made
rm -f "$tmp/a.o"
CCACHE_DIR=/proc/zpp-no-such-dir "$launcher" "$cc" -c "$tmp/p.c" -o "$tmp/a.o" 2> "$tmp/err" \
  || fail "ccache with an unusable CCACHE_DIR: the compile failed: $(cat "$tmp/err")"
[ -s "$tmp/a.o" ] || fail "ccache with an unusable CCACHE_DIR: no object"

# a working ccache in a directory of its own: miss, then hit with the
# stderr replayed, through ptxas_log.sh
export CCACHE_DIR=$tmp/cache CCACHE_STATSLOG=$tmp/stats.log
for i in 1 2; do
  rm -f "$tmp/a.o"
  bash "$root/tools/ptxas_log.sh" "$tmp/logs" "$launcher" "$cc" -c "$tmp/p.c" -o "$tmp/a.o" \
    2> "$tmp/err$i" || fail "compile $i through ptxas_log.sh and the launcher failed"
  [ -s "$tmp/a.o" ] || fail "compile $i: no object"
  grep -q zpp-launcher-probe "$tmp/logs/"*.log || fail "compile $i: the saved log lacks the compiler's stderr"
  grep -q zpp-launcher-probe "$tmp/err$i" || fail "compile $i: the compiler's stderr is not passed on"
done
hits=$(grep -c '^direct_cache_hit\|^preprocessed_cache_hit' "$tmp/stats.log" || true)
[ "$hits" = 1 ] || fail "want 1 ccache hit of 2 compiles, got $hits: $(cat "$tmp/stats.log")"

# the compiler's failure is the launcher's
if "$launcher" "$cc" -c "$tmp/none.c" -o "$tmp/b.o" 2> /dev/null; then
  fail "a compile of a missing file succeeded"
fi
echo "ccache_launcher_test: passed (no ccache, broken ccache, hit replaying stderr, failure)"
