#!/usr/bin/env bash
# Surviving a rank's death in training, on an EMULATED 2x4 cluster (8 ranks,
# ZPP_TOPO=2x4): zpp-train --survive with rank ZPP_SURV_KILL_RANK SIGKILLed
# at the start of step ZPP_SURV_KILL_STEP's backward (the survivors shrink
# the communicator, rebuild every layer's group from hpZ's copies with
# zpp_pgroup_recover and redo the step on 7 ranks; docs/runtime.md,
# "Recovery"), against an uninterrupted run on the 7 ranks the survivors
# form (ZPP_TOPO 0,0,0,0,1,1,1 for a victim on node 1: the node map of the
# survivors), every seed.
#   usage: perf/survive_study.sh OUT_DIR [BUILD_DIR]
# Writes OUT_DIR/survive_runs/<run>_seed<S>.{log,err,json},
# OUT_DIR/survive_study.csv and OUT_DIR/survive_study.md.
#
# Final loss: the convergence study's (perf/convergence_study.sh): the mean
# of the last 10% of the steps; the gap of the interrupted run to the
# uninterrupted one is taken seed by seed (same data, same initial
# weights).  The band it is compared with is the convergence study's
# seed-by-seed gap of the same configuration to bf16 ZeRO-3, min..max over
# its seeds (row ZPP_SURV_BAND_CONFIG of ZPP_SURV_BAND_CSV, by default
# zeropp_ef of docs/generated/convergence_floor_summary.csv, the floor part
# this study's defaults repeat: -6.5%..-0.6%), widened to include 0 and
# made symmetric: |gap| <= the larger of |min| and |max|.  A gap inside it
# is no larger than what the compression itself moves the final loss by.
#
# Defaults (the full study; the machine is shared: run it niced in the
# background):  ZPP_SURV_STEPS 300, ZPP_SURV_KILL_STEP 50,
# ZPP_SURV_KILL_RANK 5, ZPP_SURV_SEEDS "1 2 3", ZPP_SURV_MODEL "--large",
# ZPP_SURV_BATCH 56 (a multiple of 8 and of 7: both rank counts split it
# evenly; the convergence study's 16 is not a multiple of 7),
# ZPP_SURV_FLAGS "--mode zeropp --qwz 8 --hpz 1 --qgz 4 --qgz-intra 4 --ef 1
# --label-noise 0.2" (the convergence study's zeropp_ef, floor part),
# ZPP_SURV_TIMEOUT_S 10 (ZPP_TIMEOUT_S of the runs: the failure is seen
# within it), ZPP_SURV_LAUNCH (mpirun prefix; it must let a job lose a
# rank: Open MPI's --enable-recovery).  A reduced run, to check the script:
#   ZPP_SURV_STEPS=40 ZPP_SURV_KILL_STEP=10 ZPP_SURV_SEEDS=1 \
#   ZPP_SURV_MODEL="--depth 4 --width 64" perf/survive_study.sh /tmp/s
# Exit status: 0 when every interrupted run survived (failure seen at the
# kill step, 7 ranks after it), 1 otherwise, 2 for bad settings.
set -euo pipefail
prog=survive_study.sh
[ $# -ge 1 ] || { echo "usage: $prog OUT_DIR [BUILD_DIR]" >&2; exit 2; }
out=$1
build=${2:-build}
train=$build/tools/zpp-train
[ -x "$train" ] || { echo "$prog: no $train: build first (target zpp-train)" >&2; exit 2; }
steps=${ZPP_SURV_STEPS:-300}
kstep=${ZPP_SURV_KILL_STEP:-50}
krank=${ZPP_SURV_KILL_RANK:-5}
seeds=${ZPP_SURV_SEEDS:-1 2 3}
model=${ZPP_SURV_MODEL:---large}
batch=${ZPP_SURV_BATCH:-56}
flags=${ZPP_SURV_FLAGS:---mode zeropp --qwz 8 --hpz 1 --qgz 4 --qgz-intra 4 --ef 1 --label-noise 0.2}
tmo=${ZPP_SURV_TIMEOUT_S:-10}
here=$(cd "$(dirname "$0")/.." && pwd)
band_csv=${ZPP_SURV_BAND_CSV:-$here/docs/generated/convergence_floor_summary.csv}
band_cfg=${ZPP_SURV_BAND_CONFIG:-zeropp_ef}
launch=${ZPP_SURV_LAUNCH:-mpirun --allow-run-as-root --oversubscribe --enable-recovery --mca btl self,vader --bind-to none}
for v in "$steps" "$kstep" "$batch" "$tmo"; do
  [[ $v =~ ^[0-9]+$ && $v -ge 1 ]] || { echo "$prog: '$v': steps, kill step, batch and timeout must be integers >= 1" >&2; exit 2; }
done
[[ $krank =~ ^[0-7]$ ]] || { echo "$prog: ZPP_SURV_KILL_RANK '$krank': must be 0..7" >&2; exit 2; }
[ "$kstep" -le "$steps" ] || { echo "$prog: ZPP_SURV_KILL_STEP $kstep: past ZPP_SURV_STEPS $steps" >&2; exit 2; }
(( batch % 56 == 0 )) || { echo "$prog: ZPP_SURV_BATCH $batch: must be a multiple of 8 and of 7" >&2; exit 2; }
[ -f "$band_csv" ] || { echo "$prog: no $band_csv (ZPP_SURV_BAND_CSV)" >&2; exit 2; }
# the survivors' node map: 2x4 without the victim
topo7=$(for r in 0 1 2 3 4 5 6 7; do [ "$r" = "$krank" ] || printf '%d,' $((r / 4)); done)
topo7=${topo7%,}
runs=$out/survive_runs
mkdir -p "$runs"

# run NAME SEED NP TOPO EXTRA...: one zpp-train run, its JSON kept
run() {
  local name=$1 seed=$2 np=$3 topo=$4
  shift 4
  local base=$runs/${name}_seed$seed
  # shellcheck disable=SC2206 # the launcher, model and flags are word lists
  local cmd=(env ZPP_TOPO="$topo" ZPP_TIMEOUT_S="$tmo" OMPI_MCA_mpi_yield_when_idle=1
             $launch -np "$np" -x ZPP_TOPO -x ZPP_TIMEOUT_S "$train" $model --steps "$steps"
             --batch "$batch" --seed "$seed" $flags --survive "$@" --json)
  echo "$prog: ${cmd[*]}" >&2
  if ! "${cmd[@]}" > "$base.log" 2> "$base.err"; then
    echo "$prog: $name seed $seed failed:" >&2
    tail -5 "$base.err" >&2
    return 1
  fi
  grep '^{' "$base.log" | tail -n 1 > "$base.json"
  [ -s "$base.json" ] || { echo "$prog: $name seed $seed: no JSON in $base.log" >&2; return 1; }
}

status=0
for s in $seeds; do
  run killed "$s" 8 2x4 --kill-rank "$krank" --kill-step "$kstep" || status=1
  run ranks7 "$s" 7 "$topo7" || status=1
done

# shellcheck disable=SC2086 # one argument per seed
python3 - "$out" "$steps" "$kstep" "$krank" "$band_csv" "$band_cfg" "$topo7" "$batch" \
    "$model $flags" $seeds <<'EOF' || status=1
import csv, json, pathlib, statistics, sys
out = pathlib.Path(sys.argv[1]); steps = int(sys.argv[2]); kstep = int(sys.argv[3])
krank = int(sys.argv[4]); band_csv, band_cfg, topo7 = sys.argv[5], sys.argv[6], sys.argv[7]
batch, flags = sys.argv[8], sys.argv[9]
seeds = [int(s) for s in sys.argv[10:]]
runs = out / "survive_runs"
tail = max(1, steps // 10)  # the convergence study's final loss
band = None
with open(band_csv) as f:
    for row in csv.DictReader(f):
        if row["config"] == band_cfg:
            band = max(abs(float(row["gap_min"])), abs(float(row["gap_max"])))
if band is None:
    sys.exit(f"survive_study.sh: no row {band_cfg} in {band_csv}")
rows, ok = [], True
for s in seeds:
    try:
        k = json.loads((runs / f"killed_seed{s}.json").read_text())
        u = json.loads((runs / f"ranks7_seed{s}.json").read_text())
    except (OSError, ValueError) as e:
        print(f"survive_study.sh: seed {s}: {e}", file=sys.stderr); ok = False; continue
    sv = k["survive"]
    if sv["failure_step"] != kstep or sv["world_size_after"] != 7:
        print(f"survive_study.sh: seed {s}: failure at step {sv['failure_step']}, "
              f"{sv['world_size_after']} ranks after it", file=sys.stderr)
        ok = False
    fk = statistics.mean(k["loss_curve"][-tail:]); fu = statistics.mean(u["loss_curve"][-tail:])
    gap = fk / fu - 1
    rows.append(dict(seed=s, final_killed=fk, final_7=fu, gap=gap, within=abs(gap) <= band,
                     failure_step=sv["failure_step"], detect_s=sv["detect_s"],
                     shrink_s=sv["shrink_s"], recover_s=sv["recover_s"], cleanup_s=sv["cleanup_s"],
                     rebuilt=sv["rebuilt_elements"], state_lost=sv["state_lost_elements"],
                     exact=sv["rebuilt_exact"],
                     loss_before=k["loss_curve"][kstep - 2] if kstep >= 2 else float("nan"),
                     loss_at=k["loss_curve"][kstep - 1],
                     loss_7_at=u["loss_curve"][kstep - 1]))
with open(out / "survive_study.csv", "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=list(rows[0].keys()) if rows else ["seed"])
    w.writeheader(); w.writerows(rows)
md = [f"| seed | final loss, killed run | final loss, 7 ranks throughout | gap | within +-{100*band:.1f}% | "
      "failure seen at step | detect (s) | shrink (s) | recover (s) | cleanup (s) | elements rebuilt | rebuilt exactly | "
      f"loss at step {kstep}: killed / 7 ranks |",
      "|---:|---:|---:|---:|:---:|---:|---:|---:|---:|---:|---:|:---:|---:|"]
for r in rows:
    md.append(f"| {r['seed']} | {r['final_killed']:.6f} | {r['final_7']:.6f} | {100*r['gap']:+.2f}% | "
              f"{'yes' if r['within'] else 'no'} | {r['failure_step']} | {r['detect_s']:.2f} | "
              f"{r['shrink_s']:.2f} | {r['recover_s']:.2f} | {r['cleanup_s']:.2f} | {r['rebuilt']} | "
              f"{'yes' if r['exact'] else 'no (qwZ bound)'} | {r['loss_at']:.6f} / {r['loss_7_at']:.6f} |")
md += ["", f"Runs: {steps} steps, final loss = mean of the last {tail} steps, global batch {batch}, "
       f"`{flags} --survive`; killed: 8 ranks as 2x4 (emulated), rank {krank} SIGKILLed at step {kstep}; "
       f"reference: 7 ranks as ZPP_TOPO={topo7}. Band: the convergence study's gap of `{band_cfg}` "
       f"to bf16 ({band_csv.split('/')[-1]}), |gap| <= {100*band:.1f}%. Times: the slowest survivor's "
       "(detect: from the last exchange the killed rank took part in to the failed call; recover: every "
       "layer's zpp_pgroup_recover and zpp_pgroup_recover_state; cleanup: the old communicator destroyed)."]
(out / "survive_study.md").write_text("\n".join(md) + "\n")
print("\n".join(md))
sys.exit(0 if ok and rows else 1)
EOF
exit $status
