#!/usr/bin/env bash
# perf/bandwidth_study.sh bounds every launch: with a stand-in mpirun that
# hangs (on PATH before the real one) and ZPP_STUDY_RUN_TIMEOUT_S=2, the
# study must kill each launch after about 2 s, say so naming the setting,
# go on, and exit non-zero, all within a few seconds per launch (3
# collectives x 1 link speed here, plus 2 x 1 training launches: a stand-in
# zpp-train exists in the stand-in build).  A bad ZPP_STUDY_RUN_TIMEOUT_S
# is refused by name.
# usage: bandwidth_study_timeout_test.sh SOURCE_DIR
set -euo pipefail
src=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
mkdir -p "$work/bin" "$work/build/perf" "$work/build/tools"
printf '#!/bin/sh\nexit 0\n' > "$work/build/perf/zpp-bench"
printf '#!/bin/sh\nexit 0\n' > "$work/build/tools/zpp-train"
# the stand-in mpirun: counts its launches, then hangs (as a process
# named by this test's marker, to find any left behind)
marker=zpp-bwtest-$$-$RANDOM
trap 'pkill -f "$marker" 2> /dev/null || true; rm -rf "$work"' EXIT
cat > "$work/bin/mpirun" <<EOS
#!/usr/bin/env bash
echo x >> "$work/launches"
exec -a $marker sleep 1000
EOS
chmod +x "$work/bin/mpirun" "$work/build/perf/zpp-bench" "$work/build/tools/zpp-train"
t0=$(date +%s)
rc=0
PATH="$work/bin:$PATH" ZPP_STUDY_SPEEDS=unlimited ZPP_STUDY_TRAIN_REPS=1 ZPP_STUDY_RUN_TIMEOUT_S=2 \
  timeout 120 bash "$src/perf/bandwidth_study.sh" "$work/out" "$work/build" > "$work/log" 2>&1 || rc=$?
t1=$(date +%s)
echo "study with hanging launches: exit $rc after $((t1 - t0)) s" >&2
[ "$rc" != 0 ] || fail "the study exited 0 although every launch hung"
[ "$rc" != 124 ] || fail "the study itself hung (killed by the test's own 120 s limit): $(tail -3 "$work/log")"
n=$(wc -l < "$work/launches")
# 3 collectives at one speed, then 2 batches x 2 modes of training
[ "$n" = 7 ] || fail "$n launches, want 7 (each killed and the study going on): $(tail -5 "$work/log")"
[ "$(grep -c 'timed out after 2 s (ZPP_STUDY_RUN_TIMEOUT_S); killed' "$work/log")" = 7 ] \
  || fail "not every launch was named as timed out: $(grep -i 'timed out' "$work/log" | head -3)"
[ $((t1 - t0)) -le 60 ] || fail "7 launches of a 2 s limit took $((t1 - t0)) s"
if pgrep -f "$marker" > /dev/null; then
  pkill -f "$marker" || true
  fail "a stand-in launch was left running"
fi
for v in 0 x -5 1234567; do
  if ZPP_STUDY_RUN_TIMEOUT_S=$v bash "$src/perf/bandwidth_study.sh" "$work/out2" "$work/build" 2> "$work/err"; then
    fail "ZPP_STUDY_RUN_TIMEOUT_S=$v was accepted"
  fi
  grep -q "ZPP_STUDY_RUN_TIMEOUT_S '$v'" "$work/err" || fail "ZPP_STUDY_RUN_TIMEOUT_S=$v: not named: $(cat "$work/err")"
done
echo "bandwidth_study_timeout_test: passed (7 hanging launches killed after 2 s each, the study went on and failed naming them)"
