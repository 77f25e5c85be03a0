#!/usr/bin/env bash
# perf/convergence_study.sh with a stand-in zpp-train (a shell script that
# logs its command line and prints a few steps and the JSON line the study
# reads), launched directly (ZPP_CONV_LAUNCH=env, no mpirun):
#   1. a study of two configurations runs both;
#   2. the same study again runs nothing (the runs are kept);
#   3. other --steps: both run again (a kept run of other flags is stale);
#   4. another binary (same flags): both run again;
#   5. the summary uses only this study's runs, not a stale one of a
#      configuration left out by ZPP_CONV_CONFIGS;
#   6. a run that hangs is killed after ZPP_CONV_RUN_TIMEOUT_S and the
#      study fails naming it, within the limit plus a few seconds.
# usage: convergence_study_test.sh SOURCE_DIR
set -euo pipefail
src=$1
study=$src/perf/convergence_study.sh
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/build/tools"
fake=$work/build/tools/zpp-train
write_fake() { # $1: a comment that changes the binary's bytes
  cat > "$fake" <<EOF
#!/usr/bin/env bash
# stand-in zpp-train ($1)
echo "\$*" >> "$work/calls"
steps=3
while [ \$# -gt 0 ]; do
  case \$1 in --steps) steps=\$2; shift ;; esac
  shift
done
if [ -n "\${FAKE_HANG:-}" ]; then sleep 1000; fi
for ((i = 0; i < steps; i++)); do
  echo "step \$i loss 0.\$((500 - i))"
done
echo '{"inter_bytes_per_step": 100, "intra_bytes_per_step": 50, "model_state_bytes": 10, "buffers": {"qgz_residual": 0}, "step_time_s": 0.1}'
EOF
  chmod +x "$fake"
}
fail() { echo "FAIL: $*" >&2; exit 1; }
calls() { if [ -f "$work/calls" ]; then wc -l < "$work/calls"; else echo 0; fi; }
study_run() { # extra environment as arguments
  env ZPP_CONV_LAUNCH=env ZPP_CONV_PLOT=0 ZPP_CONV_SEEDS=1 ZPP_CONV_STEPS=3 \
    ZPP_CONV_CONFIGS="bf16 zeropp" "$@" \
    timeout 60 bash "$study" "$work/out" "$work/build" 2> "$work/err"
}

write_fake v1
study_run || fail "first study: $(tail -3 "$work/err")"
[ "$(calls)" = 2 ] || fail "first study: $(calls) runs, want 2"
grep -q "^| bf16 (ZeRO-3) " "$work/out/convergence_study.md" || fail "no bf16 row in the table"

study_run || fail "second study: $(tail -3 "$work/err")"
[ "$(calls)" = 2 ] || fail "the same study again ran $(( $(calls) - 2 )) runs, want 0 (kept)"

study_run ZPP_CONV_STEPS=4 || fail "third study: $(tail -3 "$work/err")"
[ "$(calls)" = 4 ] || fail "--steps 4 after --steps 3: $(( $(calls) - 2 )) runs, want 2 (stale)"
tail -n 2 "$work/calls" | grep -q -- "--steps 4" || fail "the rerun did not use --steps 4"

write_fake v2
study_run ZPP_CONV_STEPS=4 || fail "fourth study: $(tail -3 "$work/err")"
[ "$(calls)" = 6 ] || fail "another binary: $(( $(calls) - 4 )) runs, want 2 (stale)"

# zeropp's kept run is from this binary and --steps 4; with --steps 5 and
# only bf16 run, zeropp's run is stale and must not reach the summary
study_run ZPP_CONV_STEPS=5 ZPP_CONV_CONFIGS=bf16 || fail "fifth study: $(tail -3 "$work/err")"
[ "$(calls)" = 7 ] || fail "fifth study: $(( $(calls) - 6 )) runs, want 1"
grep -q "^| ZeRO++" "$work/out/convergence_study.md" && fail "a stale run (other --steps) is in the summary"

t0=$(date +%s)
if study_run FAKE_HANG=1 ZPP_CONV_RUN_TIMEOUT_S=2 ZPP_CONV_STEPS=6; then
  fail "a hanging run did not fail the study"
fi
t1=$(date +%s); echo "hang case took $((t1 - t0)) s" >&2
grep -q "bf16 seed 1 timed out after 2 s" "$work/err" || fail "the timeout is not named: $(tail -3 "$work/err")"
[ $((t1 - t0)) -le 20 ] || fail "the hanging run was stopped after $((t1 - t0)) s, limit 2 s"
echo "convergence_study_test: passed (stale runs rerun, timeouts kill and name the run)"
