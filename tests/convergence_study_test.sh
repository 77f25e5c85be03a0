#!/usr/bin/env bash
# perf/convergence_study.sh with a stand-in zpp-train (a shell script that
# logs its command line and prints a few steps and the JSON line the study
# reads) and a stand-in python for the LM part (prints the JSON line of
# examples/fsdp2_train.py with losses made from its flags), launched
# directly (ZPP_CONV_LAUNCH=env, ZPP_CONV_LM_LAUNCH=env, no mpirun):
#   1. a study of two configurations runs both;
#   2. the same study again runs nothing (the runs are kept);
#   3. other --steps: both run again (a kept run of other flags is stale);
#   4. another binary (same flags): both run again; so does a zpp setting
#      in the environment (ZPP_ALGO=flat), not one of the study's own;
#   5. the summary uses only this study's runs, not a stale one of a
#      configuration left out by ZPP_CONV_CONFIGS;
#   6. a run that hangs is killed after ZPP_CONV_RUN_TIMEOUT_S and the
#      study fails naming it, within the limit plus a few seconds;
#   7. the LM part: its table's final losses, seed-by-seed gaps (also as a
#      fraction of bf16's distance to the floor) and byte ratios are the
#      ones computed here from the stand-in's losses; the same study again
#      runs nothing, another libzpp.so runs both again; ZPP_CONV_PARTS=lm
#      runs no zpp-train, and a study of both parts that names no lm_
#      configuration runs no LM run;
#   8. only an LM configuration with both parts on (no MLP bf16 to plot)
#      runs it; bad ZPP_CONV_STEPS / ZPP_CONV_SEEDS are refused by name;
#   9. the floor part (ZPP_CONV_PARTS=floor): its runs carry --label-noise
#      and go to their own directory, its table's gaps (also as a fraction
#      of bf16's final loss above the floor the runs print) are the ones
#      computed here; another noise runs again; logs without floors, a
#      bad ZPP_CONV_NOISE and the MLP part's run directory are refused by
#      name; the default parts (all three) run each part once.
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
steps=3 seed=1 noise= qgz=0
while [ \$# -gt 0 ]; do
  case \$1 in
    --steps) steps=\$2; shift ;;
    --seed) seed=\$2; shift ;;
    --label-noise) noise=\$2; shift ;;
    --qgz) qgz=1; shift ;;
  esac
  shift
done
if [ -n "\${FAKE_HANG:-}" ]; then sleep 1000; fi
# with --label-noise: every step line ends with the floor, 0.4 - seed / 10
# (FAKE_NO_FLOOR: not the last one), and with --qgz the last loss is
# bf16's times (1 + seed / 100)
for ((i = 0; i < steps; i++)); do
  l=0.\$((500 - i)) tailtxt=
  if [ -n "\$noise" ]; then
    if [ \$i = \$((steps - 1)) ] && [ "\$qgz" = 1 ]; then
      l=\$(awk -v l="\$l" -v s="\$seed" 'BEGIN { printf "%.9f", l * (1 + s / 100) }')
    fi
    if [ -z "\${FAKE_NO_FLOOR:-}" ] || [ \$i != \$((steps - 1)) ]; then
      tailtxt=\$(awk -v s="\$seed" 'BEGIN { printf "  floor %.6f", 0.4 - s / 10 }')
    fi
  fi
  echo "step \$i loss \$l  time 0.1 s  bytes sent intra/inter per rank: r0 1/2\$tailtxt"
done
if [ -n "\$noise" ]; then nz=", \\"label_noise\\": \$noise"; else nz=; fi
echo "{\\"inter_bytes_per_step\\": \$((qgz ? 25 : 100)), \\"intra_bytes_per_step\\": 50, \\"model_state_bytes\\": 10, \\"buffers\\": {\\"qgz_residual\\": 0}, \\"step_time_s\\": 0.1\$nz}"
EOF
  chmod +x "$fake"
}
# the LM stand-in: loss 3.0 - 0.1 * step; with --qgz-bits the last step's
# loss is bf16's times (1 + seed / 100); floor 1.7 - seed / 10; inter-node
# bytes 1000 per step, 250 with --qgz-bits
fakepy=$work/fakepy
cat > "$fakepy" <<EOF
#!/usr/bin/env python3
import json, sys
if sys.argv[1] == "-c":  # the study asks for torch's version
    print("0.0+fake")
    sys.exit(0)
with open("$work/lmcalls", "a") as f:
    f.write(" ".join(sys.argv[1:]) + "\n")
a = sys.argv[2:]
val = lambda k, d: int(a[a.index(k) + 1]) if k in a else d
steps, seed, qgz = val("--steps", 3), val("--seed", 1), val("--qgz-bits", 0)
losses = [3.0 - 0.1 * i for i in range(steps)]
if qgz:
    losses[-1] *= 1 + seed / 100
print(json.dumps({"losses": losses, "entropy_floor": 1.7 - seed / 10, "params": 123,
                  "tokens_per_step": 456, "step_time_s": 0.1,
                  "inter_bytes_per_step": 250.0 if qgz else 1000.0,
                  "intra_bytes_per_step": 10.0}))
EOF
chmod +x "$fakepy"
echo "libzpp v1" > "$work/build/libzpp.so"
fail() { echo "FAIL: $*" >&2; exit 1; }
calls() { if [ -f "$work/calls" ]; then wc -l < "$work/calls"; else echo 0; fi; }
study_run() { # extra environment as arguments
  env ZPP_CONV_LAUNCH=env ZPP_CONV_LM_LAUNCH=env ZPP_CONV_PYTHON="$fakepy" ZPP_CONV_PLOT=0 \
    ZPP_CONV_PARTS=mlp ZPP_CONV_SEEDS=1 ZPP_CONV_STEPS=3 ZPP_CONV_CONFIGS="bf16 zeropp" "$@" \
    timeout 60 bash "$study" "$work/out" "$work/build" 2> "$work/err"
}

write_fake v1
# the mlp and lm parts, no lm_ configuration named: no LM run
study_run ZPP_CONV_PARTS="mlp lm" || fail "first study: $(tail -3 "$work/err")"
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

# a zpp setting in the environment (the ranks inherit it) makes the kept
# runs stale; the study's own ZPP_CONV_* settings do not
study_run ZPP_CONV_STEPS=4 ZPP_CONV_RUNS="$work/out/convergence_runs" \
  || fail "fourth study, again: $(tail -3 "$work/err")"
[ "$(calls)" = 6 ] || fail "ZPP_CONV_RUNS set to its default: $(( $(calls) - 6 )) runs, want 0"
study_run ZPP_CONV_STEPS=4 ZPP_ALGO=flat || fail "study with ZPP_ALGO=flat: $(tail -3 "$work/err")"
[ "$(calls)" = 8 ] || fail "ZPP_ALGO=flat: $(( $(calls) - 6 )) runs, want 2 (stale)"
study_run ZPP_CONV_STEPS=4 || fail "fourth study, third time: $(tail -3 "$work/err")"
[ "$(calls)" = 10 ] || fail "ZPP_ALGO unset again: $(( $(calls) - 8 )) runs, want 2 (stale)"

# zeropp's kept run is from this binary and --steps 4; with --steps 5 and
# only bf16 run, zeropp's run is stale and must not reach the summary
study_run ZPP_CONV_STEPS=5 ZPP_CONV_CONFIGS=bf16 || fail "fifth study: $(tail -3 "$work/err")"
[ "$(calls)" = 11 ] || fail "fifth study: $(( $(calls) - 10 )) runs, want 1"
grep -q "^| ZeRO++" "$work/out/convergence_study.md" && fail "a stale run (other --steps) is in the summary"

t0=$(date +%s)
if study_run FAKE_HANG=1 ZPP_CONV_RUN_TIMEOUT_S=2 ZPP_CONV_STEPS=6; then
  fail "a hanging run did not fail the study"
fi
t1=$(date +%s); echo "hang case took $((t1 - t0)) s" >&2
grep -q "bf16 seed 1 timed out after 2 s" "$work/err" || fail "the timeout is not named: $(tail -3 "$work/err")"
[ $((t1 - t0)) -le 20 ] || fail "the hanging run was stopped after $((t1 - t0)) s, limit 2 s"
lmcalls() { if [ -f "$work/lmcalls" ]; then wc -l < "$work/lmcalls"; else echo 0; fi; }
[ "$(lmcalls)" = 0 ] || fail "the studies above ran $(lmcalls) LM runs, want 0 (no lm_ configuration named)"
lm_run() {
  study_run ZPP_CONV_PARTS=lm ZPP_CONV_SEEDS="1 2" ZPP_CONV_STEPS=10 \
    ZPP_CONV_CONFIGS="lm_bf16 lm_zeropp" "$@"
}
n=$(calls)
lm_run || fail "LM study: $(tail -3 "$work/err")"
[ "$(lmcalls)" = 4 ] || fail "LM study: $(lmcalls) runs, want 4 (2 configurations x 2 seeds)"
[ "$(calls)" = "$n" ] || fail "ZPP_CONV_PARTS=lm ran zpp-train"
grep -q -- "--comm zppmpi --dtype bf16 --reduce-dtype bf16 .* --seed 2 --qwz-bits 8 --hpz 4 --qgz-bits 4 --ef 0 " \
  "$work/lmcalls" || fail "no ZeRO++ seed 2 run with the expected flags: $(cat "$work/lmcalls")"
md=$work/out/convergence_study_lm.md
# steps 10: final = the last step (10%), 3.0 - 0.9 = 2.1; ZeRO++ 2.1 x 1.01
# and x 1.02 (gaps +1%, +2%); floor 1.6 / 1.5, so bf16 is 0.5 / 0.6 above
# it and the gaps are 0.021 / 0.5 = 4.2% and 0.042 / 0.6 = 7.0% of that
grep -qF "| bf16 (FSDP2 ZeRO-3, zpp exact gathers and reduce-scatter) | 2.1000 (2.1000..2.1000) | +0.00% (+0.00..+0.00) | +0.00% (+0.00..+0.00) | 1000 | 1.000 |" "$md" \
  || fail "LM bf16 row: $(grep '^| bf16' "$md")"
grep -qF "| ZeRO++: qwZ8 + hpZ + qgZ4 | 2.1315 (2.1210..2.1420) | +1.50% (+1.00..+2.00) | +5.60% (+4.20..+7.00) | 250 | 0.250 |" "$md" \
  || fail "LM ZeRO++ row: $(grep '^| ZeRO++' "$md")"
grep -q "^| 4-bit weights .* not applicable" "$md" || fail "no 'not applicable' row for qWD in the LM table"
grep -qF "seeds 1, 2: 1.6000 / 1.5000 nats; bf16's final loss above it: 0.5000 / 0.6000 nats" "$md" \
  || fail "LM floor line: $(grep floor "$md")"
[ "$(grep -c '^zeropp,2,' "$work/out/convergence_lm_losses.csv")" = 10 ] || fail "LM losses csv: not 10 steps of zeropp seed 2"
lm_run || fail "LM study again: $(tail -3 "$work/err")"
[ "$(lmcalls)" = 4 ] || fail "the same LM study again ran $(( $(lmcalls) - 4 )) runs, want 0 (kept)"
echo "libzpp v2" > "$work/build/libzpp.so"
lm_run || fail "LM study, another library: $(tail -3 "$work/err")"
[ "$(lmcalls)" = 8 ] || fail "another libzpp.so: $(( $(lmcalls) - 4 )) LM runs, want 4 (stale)"
# the mlp and lm parts and only an LM configuration, no bf16 in either:
# the MLP part has nothing to plot and must not stop the study before the
# LM part runs (the plot refuses a losses file without bf16); plots on
n=$(lmcalls)
study_run ZPP_CONV_PARTS="mlp lm" ZPP_CONV_PLOT=1 ZPP_CONV_STEPS=7 ZPP_CONV_CONFIGS=lm_zeropp \
  || fail "a study of only lm_zeropp failed: $(tail -3 "$work/err")"
[ "$(lmcalls)" = $((n + 1)) ] || fail "a study of only lm_zeropp ran $(( $(lmcalls) - n )) LM runs, want 1"
for v in 0 x 1e3 -5; do
  if study_run ZPP_CONV_STEPS=$v; then fail "ZPP_CONV_STEPS=$v was accepted"; fi
  grep -q "ZPP_CONV_STEPS '$v': must be a positive integer" "$work/err" \
    || fail "ZPP_CONV_STEPS=$v: the error does not name it: $(tail -2 "$work/err")"
done
if study_run ZPP_CONV_SEEDS="1 two"; then fail "ZPP_CONV_SEEDS='1 two' was accepted"; fi
grep -q "ZPP_CONV_SEEDS '1 two': seeds are non-negative integers" "$work/err" \
  || fail "ZPP_CONV_SEEDS: the error does not name it: $(tail -2 "$work/err")"
# the floor part: the MLP runs with --label-noise, in runs of their own;
# steps 10, final = the last step: bf16 0.491 (both seeds), ZeRO++ 0.491 x
# 1.01 / x 1.02 (gaps +1%, +2%); floor 0.3 / 0.2, so bf16 is 0.191 / 0.291
# above it and the gaps are 0.00491 / 0.191 and 0.00982 / 0.291 of that
floor_run() {
  study_run ZPP_CONV_PARTS=floor ZPP_CONV_SEEDS="1 2" ZPP_CONV_STEPS=10 ZPP_CONV_NOISE=0.25 "$@"
}
n=$(calls)
floor_run || fail "floor study: $(tail -3 "$work/err")"
[ "$(calls)" = $((n + 4)) ] || fail "floor study: $(( $(calls) - n )) runs, want 4"
[ "$(tail -n 4 "$work/calls" | grep -c -- "--label-noise 0.25 --json")" = 4 ] \
  || fail "the floor runs lack --label-noise 0.25: $(tail -n 4 "$work/calls")"
[ -s "$work/out/convergence_floor_runs/zeropp_seed2.json" ] || fail "no run file in convergence_floor_runs"
python3 - "$work/out/convergence_floor_summary.csv" <<'PY' || fail "floor summary: $(cat "$work/out/convergence_floor_summary.csv")"
import csv, sys
rows = {r["config"]: r for r in csv.DictReader(open(sys.argv[1]))}
want = {"bf16": (0.491, 0.0, 0.0, 100), "zeropp": (0.491 * 1.015, 0.015,
        (0.00491 / 0.191 + 0.00982 / 0.291) / 2, 25)}
for c, (fin, gap, ex, inter) in want.items():
    r = rows[c]
    got = (float(r["final_loss_mean"]), float(r["gap_mean"]), float(r["gap_of_excess_over_floor"]),
           float(r["inter_bytes_per_step"]))
    for g, w in zip(got, (fin, gap, ex, inter)):
        if abs(g - w) > 1e-6:
            sys.exit("%s: got %s, want %s" % (c, got, (fin, gap, ex, inter)))
PY
grep -qF "seeds 1, 2: 0.30000 / 0.20000; bf16's final loss above it: 0.19100 / 0.29100." \
  "$work/out/convergence_floor_study.md" || fail "floor line: $(grep Floor "$work/out/convergence_floor_study.md")"
grep -q "gap / (bf16 final - floor)" "$work/out/convergence_floor_study.md" || fail "no floor column"
floor_run || fail "floor study again: $(tail -3 "$work/err")"
[ "$(calls)" = $((n + 4)) ] || fail "the same floor study again ran $(( $(calls) - n - 4 )) runs, want 0"
# another noise: every run again; a log without its floors fails the study
floor_run ZPP_CONV_NOISE=0.5 ZPP_CONV_CONFIGS=bf16 || fail "floor study, noise 0.5: $(tail -3 "$work/err")"
[ "$(calls)" = $((n + 6)) ] || fail "ZPP_CONV_NOISE=0.5: $(( $(calls) - n - 4 )) runs, want 2"
if floor_run FAKE_NO_FLOOR=1 ZPP_CONV_FLOOR_RUNS="$work/nofloor"; then fail "runs without floors were summarised"; fi
grep -q "not a run with --label-noise 0.25" "$work/err" || fail "no floors: the error does not say: $(tail -2 "$work/err")"
for v in 0 -1 x inf; do
  if floor_run ZPP_CONV_NOISE=$v; then fail "ZPP_CONV_NOISE=$v was accepted"; fi
  grep -q "ZPP_CONV_NOISE '$v': must be a number > 0" "$work/err" \
    || fail "ZPP_CONV_NOISE=$v: the error does not name it: $(tail -2 "$work/err")"
done
# the default parts (ZPP_CONV_PARTS empty or unset: mlp floor lm): one run
# of each, the MLP one without --label-noise, the floor one with the
# default 0.2, each part's table written
n=$(calls) nlm=$(lmcalls)
rm -f "$work/out/convergence_study.md" "$work/out/convergence_floor_study.md" "$work/out/convergence_study_lm.md"
study_run ZPP_CONV_PARTS= ZPP_CONV_CONFIGS="bf16 lm_bf16" || fail "default parts: $(tail -3 "$work/err")"
[ "$(calls)" = $((n + 2)) ] && [ "$(lmcalls)" = $((nlm + 1)) ] \
  || fail "default parts: $(( $(calls) - n )) zpp-train and $(( $(lmcalls) - nlm )) LM runs, want 2 and 1"
tail -n 2 "$work/calls" | head -n 1 | grep -q -- "--label-noise" && fail "the mlp run has --label-noise"
tail -n 1 "$work/calls" | grep -q -- "--label-noise 0.2 --json" || fail "the floor run lacks --label-noise 0.2"
for f in convergence_study.md convergence_floor_study.md convergence_study_lm.md; do
  [ -s "$work/out/$f" ] || fail "default parts: no $f"
done
# the floor part in the MLP part's directory: each would rerun the other's
# runs (same names, other keys) every time
if floor_run ZPP_CONV_RUNS="$work/same" ZPP_CONV_FLOOR_RUNS="$work/same/."; then
  fail "the floor part was given the MLP part's run directory"
fi
grep -q "ZPP_CONV_FLOOR_RUNS '$work/same/.' is the MLP part's directory" "$work/err" \
  || fail "one run directory: the error does not say: $(tail -2 "$work/err")"
echo "convergence_study_test: passed (stale runs rerun, timeouts kill and name the run, LM and floor tables as computed)"
