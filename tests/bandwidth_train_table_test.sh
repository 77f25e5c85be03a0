#!/usr/bin/env bash
# The training table of perf/bandwidth_study.sh (perf/plot_bandwidth_study.py):
#   1. --train-row puts the repetition last and takes the step time from
#      zpp-train's JSON;
#   2. from a CSV of random step times (seed printed), 3 repetitions of
#      each mode at two batches and two links, the table's medians,
#      min..max, speedup of the medians and median paired speedup are the
#      ones computed here; a CSV of the old format (no rep column: one run
#      per point) still makes a table, and so does a CSV without rows
#      (every training run failed);
#   3. the study refuses a bad ZPP_STUDY_TRAIN_REPS / ZPP_STUDY_TRAIN_STEPS
#      by name, before it runs anything.
# usage: bandwidth_train_table_test.sh SOURCE_DIR
set -euo pipefail
src=$1
plot=$src/perf/plot_bandwidth_study.py
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# ---- 1. one row -----------------------------------------------------------
printf '1.0\tstep 1 loss 1\n1.5\tstep 2 loss 1\n1.6\t{"world_size": 8, "step_time_s": 0.25, "inter_bytes_per_step": 800}\n' > "$work/stamped"
row=$(python3 "$plot" --train-row 64 0.1 zero3 5 10.0 12.5 "$work/stamped" 2)
[ "$row" = "64,0.1,zero3,5,2.500,0.250000,zpp-train step_time_s,800,100,2" ] || fail "train row: $row"

# ---- 2. the table ---------------------------------------------------------
seed=${SEED:-$RANDOM}
echo "seed $seed" >&2
python3 - "$work" "$seed" <<'PY'
import random, sys
work, seed = sys.argv[1], int(sys.argv[2])
rnd = random.Random(seed)
hdr = ("batch,link_gbit,mode,steps,wall_s,step_time_s,step_time_source,"
       "inter_bytes_per_step,inter_bytes_per_step_per_rank")
new, old, want = [hdr + ",rep"], [hdr], []
for b in ("8", "64"):
    for g in ("0.1", "unlimited"):
        t = {"zero3": [], "zeropp": []}
        for rep in (1, 2, 3):
            for m in ("zero3", "zeropp"):
                v = rnd.uniform(0.4, 0.8) if m == "zero3" else rnd.uniform(0.2, 0.4)
                t[m].append(v)
                ib = 4746240 if m == "zero3" else 1211280
                line = f"{b},{g},{m},5,3.0,{v:.6f},zpp-train step_time_s,{ib * 8},{ib}"
                new.append(f"{line},{rep}")
                if rep == 1:
                    old.append(line)
        z3 = [float(f"{v:.6f}") for v in t["zero3"]]
        zp = [float(f"{v:.6f}") for v in t["zeropp"]]
        pairs = sorted(a / c for a, c in zip(z3, zp))
        label = "0.1 Gbit/s" if g == "0.1" else "unlimited"
        want.append(f"| {b} | {label} | {sorted(z3)[1] * 1e3:.1f} | {min(z3) * 1e3:.1f}.."
                    f"{max(z3) * 1e3:.1f} | {sorted(zp)[1] * 1e3:.1f} | {min(zp) * 1e3:.1f}.."
                    f"{max(zp) * 1e3:.1f} | {sorted(z3)[1] / sorted(zp)[1]:.2f} | "
                    f"{pairs[1]:.2f} | {pairs[0]:.2f}..{pairs[2]:.2f} | 4.75 | 1.21 |")
open(f"{work}/new.csv", "w").write("\n".join(new) + "\n")
open(f"{work}/old.csv", "w").write("\n".join(old) + "\n")
open(f"{work}/want", "w").write("\n".join(want) + "\n")
PY
head -2 "$src/docs/generated/bandwidth_study.csv" > "$work/study.csv"  # any one row
echo "a command" > "$work/cmds"
python3 "$plot" --markdown "$work/study.csv" "$work/cmds" "$work/new.csv" zpp-train 1 2 > "$work/new.md" ||
  fail "markdown of the new CSV"
while IFS= read -r line; do
  grep -qF -- "$line" "$work/new.md" || fail "seed $seed: the table lacks: $line"
done < "$work/want"
grep -q "the median over 3 repetition(s)" "$work/new.md" || fail "the repetitions are not said"
python3 "$plot" --markdown "$work/study.csv" "$work/cmds" "$work/old.csv" zpp-train 1 2 > "$work/old.md" ||
  fail "markdown of an old CSV"
[ "$(grep -c '^| [0-9]* | .* | zpp-train step_time_s |$' "$work/old.md")" = 4 ] || fail "old CSV: not 4 rows"
# every zpp-train run failed: the CSV is its header, the table has no rows
head -1 "$work/new.csv" > "$work/empty.csv"
python3 "$plot" --markdown "$work/study.csv" "$work/cmds" "$work/empty.csv" zpp-train 1 2 > "$work/empty.md" ||
  fail "markdown of a CSV without rows (every training run failed)"
[ "$(grep -c '^| [0-9]* | .* | zpp-train step_time_s |$' "$work/empty.md")" = 0 ] || fail "empty CSV: rows in the table"

# ---- 3. bad settings --------------------------------------------------------
mkdir -p "$work/build/perf"
printf '#!/bin/sh\necho ran >> %s/ran\n' "$work" > "$work/build/perf/zpp-bench"
chmod +x "$work/build/perf/zpp-bench"
for bad in "ZPP_STUDY_TRAIN_REPS=0" "ZPP_STUDY_TRAIN_REPS=x" "ZPP_STUDY_TRAIN_STEPS=1" "ZPP_STUDY_TRAIN_STEPS=2.5"; do
  rc=0
  env "$bad" timeout 60 bash "$src/perf/bandwidth_study.sh" "$work/out" "$work/build" 2> "$work/err" || rc=$?
  [ "$rc" = 2 ] || fail "$bad: exit $rc, want 2"
  grep -q "${bad%%=*}" "$work/err" || fail "$bad: not named: $(cat "$work/err")"
  [ ! -e "$work/ran" ] || fail "$bad: the study ran zpp-bench"
done
echo "PASS: bandwidth_train_table_test.sh (seed $seed)" >&2
