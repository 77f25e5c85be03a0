#!/usr/bin/env bash
# Convergence study of the transforms, three parts on an EMULATED 2x4 cluster (8
# ranks, ZPP_TOPO=2x4), every configuration and every seed, then per part a
# table of the final loss relative to bf16 and of the inter-node bytes per
# step, in the layout of the SDP4Bit paper's table, and a plot of the loss
# curves (perf/plot_convergence_study.py):
#   mlp: zpp-train --large (an MLP regressing onto an exact teacher; its
#        loss goes to 0, so a relative gap measures noise on a vanishing
#        loss), time below;
#   floor: the same runs with Gaussian noise on every target
#        (zpp-train --label-noise ZPP_CONV_NOISE, default 0.2: 8% of the
#        targets' variance, about 0.5), so the loss has a floor, the noise's
#        variance, as a language model's has its entropy rate; the gaps are
#        also given as a fraction of bf16's final loss above the floor (the
#        teacher's own loss on the same noisy targets and steps); files
#        OUT_DIR/convergence_floor_*, runs in OUT_DIR/convergence_floor_runs
#        (ZPP_CONV_FLOOR_RUNS);
#   lm:  examples/fsdp2_train.py, a small transformer language model under
#        PyTorch FSDP2 with zpp as its all-gather and reduce-scatter, on a
#        Markov chain whose entropy rate is the loss's floor (in nats, as the
#        paper's), about 30 minutes (sizing below, "LM part").
#   usage: perf/convergence_study.sh OUT_DIR [BUILD_DIR]
#   ZPP_CONV_PARTS: "mlp floor lm" (default), or any of them.
# Writes OUT_DIR/convergence_runs/<config>_seed<S>.{log,json,key} (one per
# run; a run is not run again when its .json exists and its .key, the
# exact command line, launcher and sha256 of the zpp-train binary, and the
# ZPP_* settings of the environment (the ranks inherit them: ZPP_ALGO
# changes the bytes and the sums), is the same, so an interrupted study
# resumes; a run of other flags, steps, batch, settings or another build is
# run again), OUT_DIR/convergence_losses.csv
# (config,seed,step,loss),
# OUT_DIR/convergence_summary.csv, OUT_DIR/convergence_study.md and
# OUT_DIR/convergence_study.png.
#
# Final loss = mean of the last 10% of the steps of a run; its gap to bf16
# is taken seed by seed (same data, same initial weights) and reported as
# the mean over seeds with the smallest and largest seed.  Inter-node bytes
# per step are the trainer's counters (sent, summed over all ranks), as a
# ratio to bf16 ZeRO-3 (docs/runtime.md, "Inter-node bytes per step").
#
# Sizing.  On the 2-core machine of docs/benchmarks.md (shared with other
# jobs) one step of 8 ranks took 3-4.5 s at the trainer's default global
# batch of 64 and about 1.1-1.5 s at 8-16, so the study uses a global batch
# of 16 (2 samples per rank): 300 steps x 8 configurations x 3 seeds is
# then about 3 hours.  (Those times are from before tools/train_math.h;
# the trainer's arithmetic is 4-5x faster since, perf/train_compute_time.sh:
# the floor part's 24 runs took 1613 s, about 70 s each, niced at a load
# of about 10; the plain MLP part runs the same steps.)  Runs go seed by
# seed (every configuration of seed 1 first), so a study stopped early
# still compares like with like.  Run it
# in the background, niced:  nice -n 10 perf/convergence_study.sh ...
# Environment: ZPP_CONV_STEPS (300), ZPP_CONV_SEEDS ("1 2 3"),
# ZPP_CONV_BATCH (16), ZPP_CONV_CONFIGS (names below; default all),
# ZPP_CONV_RUNS (where the per-run files go; OUT_DIR/convergence_runs),
# ZPP_CONV_EXTRA (flags added to every zpp-train run),
# ZPP_CONV_RUN_TIMEOUT_S (wall-clock limit of one run: 600 + 30 s per
# step by default, 5x the slowest step seen here; a run past it is killed
# and the study stops naming it), ZPP_CONV_LAUNCH (the launcher prefix;
# default: mpirun of 8 ranks as below), ZPP_CONV_PLOT (0: no plot).
#
# LM part.  8 ranks of `fsdp2_train.py --comm zppmpi --dtype bf16
# --reduce-dtype bf16` (bf16 gathers and bf16 reduce-scatter: bf16 ZeRO-3
# on the wire; the compressed rows quantize the same bf16 tensors) with
# --vocab 256 --dim 128 --layers 2 --seq 64 --batch 8 (470,784 parameters,
# 4096 tokens per step, AdamW lr 3e-3).  Final loss = mean of the last 10%
# of the steps; its gap to bf16 is taken seed by seed (same chain, batches
# and initial weights), also as a fraction of bf16's distance to the floor
# (bf16 final - entropy rate of that seed's chain).  Sizing, measured on the
# 2-core machine of docs/benchmarks.md (shared): the default size of the
# example (vocab 64, dim 64) is at 2.22 nats after 20 steps against a floor
# of 1.84, too easy; at the size above one step of 8 ranks took 0.19 s (bf16)
# to 0.25 s (ZeRO++), a run of 300 steps 95-106 s with the start of 8
# torch processes, and bf16 was at 2.75 nats at step 300 (floor 2.58, 3.82
# over steps 0-29, 2.761 over 240-269, 2.751 over 270-299): learnable, still
# falling, clearly above the floor.  6 configurations x 3 seeds: about 30
# minutes on a quiet machine; measured 2959 s (49 minutes) with other jobs
# loading it (load average 10-12), niced.  Environment: ZPP_CONV_PYTHON (the venv's python; default
# .venv-torch/bin/python, scripts/install-deps.sh --python), ZPP_CONV_LM_SIZE
# (the size flags above), ZPP_CONV_LM_LAUNCH (launcher prefix; default:
# mpirun of 8 ranks, MASTER_PORT a free port per run), ZPP_CONV_LM_EXTRA
# (flags added to every LM run); the run-file scheme, ZPP_CONV_STEPS,
# ZPP_CONV_SEEDS, ZPP_CONV_CONFIGS (LM names start with lm_) and
# ZPP_CONV_RUN_TIMEOUT_S (default for an LM run: 300 + 5 s per step) are the
# MLP part's.  An LM run's key holds the sha256 of the example, of
# python/zpp/*.py and of libzpp.so, and torch's version.
# tests/convergence_study_test.sh runs the three parts with stand-ins (a fake
# zpp-train, a fake python).
set -euo pipefail
prog=convergence_study.sh
if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  echo "usage: $prog OUT_DIR [BUILD_DIR]" >&2
  exit 2
fi
out=$1
build=${2:-build}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
read -r -a parts <<< "${ZPP_CONV_PARTS:-mlp floor lm}"
for p in "${parts[@]}"; do
  case $p in
    mlp|floor|lm) ;;
    *) echo "$prog: ZPP_CONV_PARTS '${ZPP_CONV_PARTS:-}': parts are mlp, floor and lm" >&2; exit 2 ;;
  esac
done
[ ${#parts[@]} -gt 0 ] || { echo "$prog: ZPP_CONV_PARTS is empty: name mlp, floor, lm or several" >&2; exit 2; }
noise=${ZPP_CONV_NOISE:-0.2}
python3 -c 'import math, sys; x = float(sys.argv[1]); sys.exit(not (math.isfinite(x) and x > 0))' \
    "$noise" 2> /dev/null || {
  echo "$prog: ZPP_CONV_NOISE '$noise': must be a number > 0 (the targets' noise, a standard deviation)" >&2
  exit 2
}
part_on() { [[ " ${parts[*]} " == *" $1 "* ]]; }
steps=${ZPP_CONV_STEPS:-300}
# (steps reaches $((...)) below: only digits may)
case $steps in
  ''|*[!0-9]*|0*) echo "$prog: ZPP_CONV_STEPS '$steps': must be a positive integer" >&2; exit 2 ;;
esac
read -r -a seeds <<< "${ZPP_CONV_SEEDS:-1 2 3}"
[ ${#seeds[@]} -gt 0 ] || { echo "$prog: ZPP_CONV_SEEDS is empty" >&2; exit 2; }
for s in "${seeds[@]}"; do
  case $s in
    ''|*[!0-9]*) echo "$prog: ZPP_CONV_SEEDS '${ZPP_CONV_SEEDS:-}': seeds are non-negative integers" >&2; exit 2 ;;
  esac
done
case ${ZPP_CONV_RUN_TIMEOUT_S:-1} in
  ''|*[!0-9]*|0) echo "$prog: ZPP_CONV_RUN_TIMEOUT_S '$ZPP_CONV_RUN_TIMEOUT_S': must be a positive integer (seconds)" >&2; exit 2 ;;
esac
want=${ZPP_CONV_CONFIGS:-}
export OMPI_MCA_mpi_yield_when_idle=1
runs=${ZPP_CONV_RUNS:-$out/convergence_runs}
mkdir -p "$out" "$runs"
floor_runs=${ZPP_CONV_FLOOR_RUNS:-$out/convergence_floor_runs}
# the two MLP parts' runs have the same file names: in one directory each
# part would find the other's run under its name and run it again, every time
if part_on floor && mkdir -p "$floor_runs" &&
    [ "$(cd "$runs" && pwd -P)" = "$(cd "$floor_runs" && pwd -P)" ]; then
  echo "$prog: ZPP_CONV_FLOOR_RUNS '$floor_runs' is the MLP part's directory (ZPP_CONV_RUNS): give the floor part its own" >&2
  exit 2
fi

# run_one NAME SEED KEY LIMIT SHOWN CMD...: runs CMD (stdout to
# $runs/NAME_seedSEED.log, stderr to .err, killed after LIMIT s) unless the
# run's .json exists and its .key is KEY; then .json = the log's last line
# that starts with '{', .key = KEY.  SHOWN goes to $cmds, and a run that is
# this study's (run now, or kept with the same key) to $valid.  A
# configuration left out by ZPP_CONV_CONFIGS is not run.
run_one() {
  local name=$1 seed=$2 key=$3 limit=$4 shown=$5
  shift 5
  # the ranks inherit the environment: zpp's settings are part of what the
  # result depends on (not the study's own ZPP_CONV_*, nor ZPP_LIBRARY,
  # whose file's sha256 is in the LM key)
  key="$key | env $(env | grep -E '^ZPP_' | grep -vE '^ZPP_(CONV_[A-Z_]*|LIBRARY)=' | sort | tr '\n' ' ' || true)"
  local base=$runs/${name}_seed$seed fresh=0 rc=0
  if [ -s "$base.json" ] && [ -f "$base.key" ] && [ "$(cat "$base.key")" = "$key" ]; then
    fresh=1
  fi
  if [ -n "$want" ] && [[ " $want " != *" $name "* ]]; then
    # not run now; summarised only if an earlier run is this study's
    if [ "$fresh" = 1 ]; then echo "${name}_seed$seed" >> "$valid"; fi
    return 0
  fi
  echo "$shown" >> "$cmds"
  if [ "$fresh" = 1 ]; then
    echo "$prog: $name seed $seed: done before with the same command and binary, kept" >&2
    echo "${name}_seed$seed" >> "$valid"
    return 0
  fi
  rm -f "$base.json" "$base.key"
  echo "$prog: $name seed $seed ($(date -u +%H:%M:%S), limit ${limit} s)" >&2
  timeout --kill-after=30 "$limit" "$@" > "$base.log" 2> "$base.err" || rc=$?
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    echo "$prog: $name seed $seed timed out after $limit s (ZPP_CONV_RUN_TIMEOUT_S); killed" >&2
    exit 1
  fi
  if [ "$rc" != 0 ]; then
    echo "$prog: $name seed $seed failed (exit $rc):" >&2
    tail -5 "$base.err" >&2
    exit 1
  fi
  if ! grep '^{' "$base.log" | tail -n 1 > "$base.json.tmp" || ! [ -s "$base.json.tmp" ]; then
    rm -f "$base.json.tmp"
    echo "$prog: $name seed $seed printed no JSON line ($base.log)" >&2
    exit 1
  fi
  mv "$base.json.tmp" "$base.json"
  printf '%s\n' "$key" > "$base.key"
  echo "${name}_seed$seed" >> "$valid"
}

# ==== MLP part: zpp-train --large ==========================================
# mlp_part STEM RUNS NOISE: the MLP configurations, each run's files in
# RUNS, the tables OUT_DIR/STEM_* and the runs' list OUT_DIR/STEM_study.*;
# NOISE (a standard deviation, or empty) adds --label-noise NOISE to every
# run (after the configuration's flags, before ZPP_CONV_EXTRA) and the
# columns of a loss with a floor.
mlp_part() {
local stem=$1 runs=$2 noise=$3
local -a noiseflags=()
[ -z "$noise" ] || noiseflags=(--label-noise "$noise")
mkdir -p "$runs"
train=$build/tools/zpp-train
[ -x "$train" ] || { echo "$prog: no $train: build first" >&2; exit 1; }
batch=${ZPP_CONV_BATCH:-16}
read -r -a extra <<< "${ZPP_CONV_EXTRA:-}"
run_timeout=${ZPP_CONV_RUN_TIMEOUT_S:-$((600 + 30 * steps))}

# name | label | zpp-train flags.  bf16 is ZeRO-3 without compression
# (bitwise equal to zero1/zero2/dp, docs/runtime.md).  4-bit weights: the
# SDP4Bit setting, block 2048, in zero2 (which keeps the full weights
# between steps, as qWD needs), gradients in bf16 so that only the weights
# differ from bf16.
configs=(
  "bf16|bf16 (ZeRO-3)|--mode zero3"
  "zeropp|ZeRO++: qwZ8 + hpZ + qgZ4|--mode zeropp --qwz 8 --hpz 1 --qgz 4 --qgz-intra 4 --ef 0"
  "zeropp_ef|ZeRO++ + error feedback (fp32)|--mode zeropp --qwz 8 --hpz 1 --qgz 4 --qgz-intra 4 --ef 1"
  "zeropp_ef8|ZeRO++ + error feedback (INT8)|--mode zeropp --qwz 8 --hpz 1 --qgz 4 --qgz-intra 4 --ef 1 --ef-bits 8"
  "zeropp_had|ZeRO++ + Hadamard 32|--mode zeropp --qwz 8 --hpz 1 --qgz 4 --qgz-intra 4 --ef 0 --hadamard 32"
  "w4|4-bit weights, no qWD|--mode zero2 --qwz 4 --qwz-block 2048"
  "w4_qwd|4-bit weights, qWD|--mode zero2 --qwd 4 --qwd-block 2048"
  "sdp4bit|SDP4Bit-like: qWD4 + qgZ 8/4 + Hadamard 32|--mode zero2 --qwd 4 --qwd-block 2048 --qgz 4 --qgz-intra 8 --hadamard 32 --ef 0"
)

if [ -n "${ZPP_CONV_LAUNCH:-}" ]; then
  read -r -a mpirun <<< "$ZPP_CONV_LAUNCH"
else
  mpirun=(mpirun --allow-run-as-root --oversubscribe --mca btl self,vader
          --bind-to none -np 8 -x ZPP_TOPO=2x4 -x OMPI_MCA_mpi_yield_when_idle)
fi
train_sum=$(sha256sum "$train" | cut -d' ' -f1)
cmds=$out/${stem}_study.cmds
: > "$cmds"
# the runs the summary may use: those whose key is this study's
valid=$out/${stem}_study.valid
: > "$valid"
t0=$(date +%s)
for seed in "${seeds[@]}"; do
  for c in "${configs[@]}"; do
    IFS='|' read -r name label flags <<< "$c"
    read -r -a f <<< "$flags"
    args=(--large --steps "$steps" --batch "$batch" --seed "$seed" "${f[@]}" "${noiseflags[@]}"
          "${extra[@]}" --json)
    # what the run's result depends on: a run with another key is stale
    key="${mpirun[*]} $train ${args[*]} | zpp-train sha256 $train_sum"
    run_one "$name" "$seed" "$key" "$run_timeout" \
      "ZPP_TOPO=2x4 mpirun -np 8 zpp-train ${args[*]}" "${mpirun[@]}" "$train" "${args[@]}"
  done
done
t1=$(date +%s)
echo "$prog: MLP runs ($stem) took $((t1 - t0)) s" >&2

# ---- losses and summary -------------------------------------------------
python3 - "$out" "$steps" "${seeds[*]}" "$runs" "$valid" "$stem" "$batch" "$noise" "${configs[@]}" <<'PY'
import csv, json, math, pathlib, re, statistics, sys
out = pathlib.Path(sys.argv[1]); steps = int(sys.argv[2])
seeds = [int(s) for s in sys.argv[3].split()]
runs = pathlib.Path(sys.argv[4])
valid = set(pathlib.Path(sys.argv[5]).read_text().split())  # this study's runs only
stem = sys.argv[6]
batch = int(sys.argv[7])
noise = float(sys.argv[8]) if sys.argv[8] else 0.0
configs = [c.split("|") for c in sys.argv[9:]]
tail = max(1, steps // 10)
step_re = re.compile(r"^step\s+(\d+) loss ([0-9.eE+-]+|nan|inf)")
floor_re = re.compile(r"  floor ([0-9.eE+-]+)$")
rows, summ = [], {}
for name, label, flags in configs:
    for s in seeds:
        log, js = runs / f"{name}_seed{s}.log", runs / f"{name}_seed{s}.json"
        if f"{name}_seed{s}" not in valid or not js.exists():
            continue
        losses, floors = [], []
        for line in log.read_text().splitlines():
            m = step_re.match(line)
            if m:
                losses.append(float(m.group(2)))
                rows.append((name, s, int(m.group(1)), m.group(2)))
                f = floor_re.search(line)
                if f:
                    floors.append(float(f.group(1)))
        j = json.loads(js.read_text())
        if noise and (j.get("label_noise") is None or abs(j["label_noise"] - noise) > 1e-6 * noise
                      or len(floors) != len(losses)):
            sys.exit(f"convergence_study.sh: {log}: not a run with --label-noise {noise} "
                     f"(every step line ends with its floor)")
        final = sum(losses[-tail:]) / len(losses[-tail:])
        # the floor over the same steps: the teacher's loss on these noisy
        # targets (the same in every configuration of a seed)
        floor = statistics.mean(floors[-tail:]) if noise else 0.0
        summ[(name, s)] = dict(final=final, first=losses[0], floor=floor,
                               inter=j["inter_bytes_per_step"],
                               intra=j["intra_bytes_per_step"],
                               state=j["model_state_bytes"], buffers=j["buffers"],
                               time=j["step_time_s"])
with open(out / f"{stem}_losses.csv", "w", newline="") as f:
    w = csv.writer(f); w.writerow(["config", "seed", "step", "loss"]); w.writerows(rows)

def spread(v):
    return (statistics.mean(v), min(v), max(v)) if v else (math.nan,) * 3
table, csvrows = [], []
bf_inter = statistics.mean([summ[("bf16", s)]["inter"] for s in seeds if ("bf16", s) in summ] or [math.nan])
for name, label, flags in configs:
    have = [s for s in seeds if (name, s) in summ]
    if not have:
        continue
    fin = [summ[(name, s)]["final"] for s in have]
    gaps = [summ[(name, s)]["final"] / summ[("bf16", s)]["final"] - 1
            for s in have if ("bf16", s) in summ]
    # the same gap as a fraction of the loss bf16 removed in training
    # (first step's loss minus bf16's final): context for a loss that
    # tends to 0 here, where the paper's tends to an entropy floor
    # (with a floor: as a fraction of what bf16 still has above it, the
    # LM part's column)
    drop = [(summ[(name, s)]["final"] - summ[("bf16", s)]["final"]) /
            ((summ[("bf16", s)]["final"] - summ[("bf16", s)]["floor"]) if noise else
             (summ[("bf16", s)]["first"] - summ[("bf16", s)]["final"]))
            for s in have if ("bf16", s) in summ]
    inter = statistics.mean(summ[(name, s)]["inter"] for s in have)
    b = summ[(name, have[0])]["buffers"]
    f_m, f_lo, f_hi = spread(fin)
    g_m, g_lo, g_hi = spread(gaps)
    d_m = statistics.mean(drop) if drop else math.nan
    table.append((label, flags, len(have), f_m, f_lo, f_hi, g_m, g_lo, g_hi, d_m, inter,
                  inter / bf_inter, summ[(name, have[0])]["state"], b.get("qgz_residual", 0)))
    csvrows.append([name, label, len(have), f_m, f_lo, f_hi, g_m, g_lo, g_hi, d_m, inter,
                    inter / bf_inter,
                    b.get("qgz_residual", 0), b.get("qgz_residual_fp32", 0),
                    statistics.mean(summ[(name, s)]["time"] for s in have)])
with open(out / f"{stem}_summary.csv", "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["config", "label", "seeds", "final_loss_mean", "final_loss_min", "final_loss_max",
                "gap_mean", "gap_min", "gap_max",
                "gap_of_excess_over_floor" if noise else "gap_of_loss_drop", "inter_bytes_per_step",
                "inter_ratio_vs_bf16",
                "qgz_residual_bytes", "qgz_residual_fp32_bytes", "step_time_s"])
    w.writerows(csvrows)
md = []
md.append("| configuration | final loss (mean of last %d steps), mean over seeds (min..max) | vs bf16, same seed: mean (min..max) | %s | inter-node bytes / step | x bf16 ZeRO-3 |"
          % (tail, "gap / (bf16 final - floor)" if noise else "gap / bf16's loss drop"))
md.append("|---|---:|---:|---:|---:|---:|")
for (label, flags, n, f_m, f_lo, f_hi, g_m, g_lo, g_hi, d_m, inter, ratio, state, res) in table:
    md.append("| %s | %.5f (%.5f..%.5f) | %+.1f%% (%+.1f..%+.1f) | %+.3f%% | %.0f | %.3f |" %
              (label, f_m, f_lo, f_hi, 100 * g_m, 100 * g_lo, 100 * g_hi, 100 * d_m, inter, ratio))
md.append("")
nf = " --label-noise %g" % noise if noise else ""
if noise:
    bs = [s for s in seeds if ("bf16", s) in summ]
    md.append("Floor: every target carries Gaussian noise of standard deviation %g (`--label-noise`),"
              " so no model's expected loss is below %g; the teacher's own loss on the same noisy"
              " targets over the same last %d steps, seeds %s: %s; bf16's final loss above it: %s." % (
                  noise, noise * noise, tail, ", ".join(map(str, bs)),
                  " / ".join("%.5f" % summ[("bf16", s)]["floor"] for s in bs),
                  " / ".join("%.5f" % (summ[("bf16", s)]["final"] - summ[("bf16", s)]["floor"])
                             for s in bs)))
    md.append("")
md.append("Runs: %d steps, seeds %s, 8 ranks as 2 nodes x 4 (emulated), `zpp-train --large`"
          " (6,319,108 parameters), global batch %d." % (steps, ", ".join(map(str, seeds)), batch))
md.append("")
md.append("Flags of each configuration (each run: `ZPP_TOPO=2x4 mpirun -np 8 zpp-train --large --steps %d --batch %d --seed S FLAGS%s --json`):" % (steps, batch, nf))
md.append("")
for name, label, flags in configs:
    md.append("- %s: `%s`" % (label, flags))
(out / f"{stem}_study.md").write_text("\n".join(md) + "\n")
PY
# the plot is relative to bf16: none without a bf16 run of this study (e.g.
# ZPP_CONV_CONFIGS naming only lm_ configurations; the LM part still runs)
if [ "${ZPP_CONV_PLOT:-1}" = 0 ] || ! grep -q '^bf16,' "$out/${stem}_losses.csv"; then
  why="ZPP_CONV_PLOT=0"
  [ "${ZPP_CONV_PLOT:-1}" = 0 ] || why="no bf16 run"
  echo "$prog: wrote $out/${stem}_study.md and $out/${stem}_summary.csv (no plot: $why)" >&2
  return 0
fi
local -a plotflags=()
[ -z "$noise" ] || plotflags=(--floor "$(python3 -c 'import sys; print(float(sys.argv[1]) ** 2)' "$noise")"
  --floor-label "noise floor (--label-noise squared)"
  --title "zpp-train --large, targets with noise (--label-noise $noise), emulated 2x4")
python3 "$here/plot_convergence_study.py" "$out/${stem}_losses.csv" \
  -o "$out/${stem}_study.png" --steps "$steps" "${plotflags[@]}" || {
  echo "$prog: the plot failed (is matplotlib installed?)" >&2
  exit 1
}
echo "$prog: wrote $out/${stem}_study.md, $out/${stem}_summary.csv and $out/${stem}_study.png" >&2
}

# ==== LM part: the FSDP2 transformer (examples/fsdp2_train.py) ============
lm_part() {
py=${ZPP_CONV_PYTHON:-$root/.venv-torch/bin/python}
command -v "$py" > /dev/null || {
  echo "$prog: no python $py (scripts/install-deps.sh --python makes .venv-torch; or set ZPP_CONV_PYTHON)" >&2
  exit 1
}
example=$root/examples/fsdp2_train.py
lib=$(cd "$build" && pwd)/libzpp.so
[ -f "$lib" ] || { echo "$prog: no $lib: build first (target zpp)" >&2; exit 1; }
read -r -a size <<< "${ZPP_CONV_LM_SIZE:---vocab 256 --dim 128 --layers 2 --seq 64 --batch 8}"
read -r -a lmextra <<< "${ZPP_CONV_LM_EXTRA:-}"
lm_timeout=${ZPP_CONV_RUN_TIMEOUT_S:-$((300 + 5 * steps))}

# name | label | fsdp2_train.py flags (on top of --dtype bf16 --reduce-dtype
# bf16).  hpZ: reshard_after_forward=4, the ranks of a node of the 2x4
# topology (the backward gather stays in the node).  qWD has no row here:
# it sends weight differences against full weights kept between steps
# (ZeRO-1/2), and FSDP2 is ZeRO-3 (the weights are sharded between steps);
# 4-bit weights without qWD are qwZ4 gathers, which FSDP2 can do (the last
# row, the SDP4Bit-like setting less qWD).
lm_configs=(
  "lm_bf16|bf16 (FSDP2 ZeRO-3, zpp exact gathers and reduce-scatter)|"
  "lm_zeropp|ZeRO++: qwZ8 + hpZ + qgZ4|--qwz-bits 8 --hpz 4 --qgz-bits 4 --ef 0"
  "lm_zeropp_ef|ZeRO++ + error feedback (fp32)|--qwz-bits 8 --hpz 4 --qgz-bits 4 --ef 1"
  "lm_zeropp_had|ZeRO++ + Hadamard 32|--qwz-bits 8 --hpz 4 --qgz-bits 4 --ef 0 --hadamard 32"
  "lm_qgz84_had|ZeRO++ with qgZ 8/4 + Hadamard 32|--qwz-bits 8 --hpz 4 --qgz-bits 4 --qgz-intra-bits 8 --hadamard 32 --ef 0"
  "lm_qwz4_qgz84_had|4-bit weights without qWD (qwZ4) + hpZ + qgZ 8/4 + Hadamard 32|--qwz-bits 4 --hpz 4 --qgz-bits 4 --qgz-intra-bits 8 --hadamard 32 --ef 0"
)
if [ -n "${ZPP_CONV_LM_LAUNCH:-}" ]; then
  read -r -a launch <<< "$ZPP_CONV_LM_LAUNCH"
else
  launch=(mpirun --allow-run-as-root --oversubscribe --mca btl self,vader
          --bind-to none -np 8 -x ZPP_TOPO=2x4 -x OMPI_MCA_mpi_yield_when_idle
          -x PYTHONPATH -x ZPP_LIBRARY -x MASTER_ADDR -x MASTER_PORT)
fi
export PYTHONPATH=$root/python${PYTHONPATH:+:$PYTHONPATH}
export ZPP_LIBRARY=$lib MASTER_ADDR=127.0.0.1
torch_v=$("$py" -c 'import importlib.metadata as m; print(m.version("torch"))') || {
  echo "$prog: $py has no torch (scripts/install-deps.sh --python, or set ZPP_CONV_PYTHON)" >&2
  exit 1
}
code_sum=$(cat "$example" "$root"/python/zpp/*.py "$lib" | sha256sum | cut -d' ' -f1)
cmds=$out/convergence_study_lm.cmds
: > "$cmds"
valid=$out/convergence_study_lm.valid
: > "$valid"
t0=$(date +%s)
for seed in "${seeds[@]}"; do
  for c in "${lm_configs[@]}"; do
    IFS='|' read -r name label flags <<< "$c"
    read -r -a f <<< "$flags"
    args=(--comm zppmpi --dtype bf16 --reduce-dtype bf16 "${size[@]}" --steps "$steps"
          --seed "$seed" "${f[@]}" "${lmextra[@]}" --json --quiet)
    key="${launch[*]} $py examples/fsdp2_train.py ${args[*]} | example+python/zpp+libzpp sha256 $code_sum | torch $torch_v"
    # torch's rendezvous port (not part of the key: it does not change the
    # run): a random one that nothing on 127.0.0.1 answers on
    for _ in 1 2 3 4 5 6 7 8 9 10; do
      MASTER_PORT=$((20000 + RANDOM % 30000))
      (exec 3<> "/dev/tcp/127.0.0.1/$MASTER_PORT") 2> /dev/null || break
    done
    export MASTER_PORT
    run_one "$name" "$seed" "$key" "$lm_timeout" \
      "ZPP_TOPO=2x4 mpirun -np 8 python examples/fsdp2_train.py ${args[*]}" \
      "${launch[@]}" "$py" "$example" "${args[@]}"
  done
done
t1=$(date +%s)
echo "$prog: LM runs took $((t1 - t0)) s" >&2

# ---- losses and summary -------------------------------------------------
floor=$(python3 - "$out" "$steps" "${seeds[*]}" "$runs" "$valid" "${size[*]}" "${lm_configs[@]}" <<'PY'
import csv, json, math, pathlib, statistics, sys
out = pathlib.Path(sys.argv[1]); steps = int(sys.argv[2])
seeds = [int(s) for s in sys.argv[3].split()]
runs = pathlib.Path(sys.argv[4])
valid = set(pathlib.Path(sys.argv[5]).read_text().split())  # this study's runs only
size = sys.argv[6]
configs = [c.split("|") for c in sys.argv[7:]]
tail = max(1, steps // 10)
rows, summ = [], {}
for name, label, flags in configs:
    for s in seeds:
        js = runs / f"{name}_seed{s}.json"
        if f"{name}_seed{s}" not in valid or not js.exists():
            continue
        j = json.loads(js.read_text())
        L = j["losses"]
        if len(L) != steps:
            sys.exit(f"convergence_study.sh: {js}: {len(L)} losses, want {steps}")
        # the plot's names: without the lm_ prefix (bf16 is its reference)
        rows += [(name[3:], s, i, "%.6f" % v) for i, v in enumerate(L)]
        summ[(name, s)] = dict(final=statistics.mean(L[-tail:]), floor=j["entropy_floor"],
                               inter=j.get("inter_bytes_per_step", math.nan),
                               intra=j.get("intra_bytes_per_step", math.nan),
                               time=j["step_time_s"], params=j["params"],
                               tokens=j["tokens_per_step"])
with open(out / "convergence_lm_losses.csv", "w", newline="") as f:
    w = csv.writer(f); w.writerow(["config", "seed", "step", "loss"]); w.writerows(rows)

def spread(v):
    return (statistics.mean(v), min(v), max(v)) if v else (math.nan,) * 3
base = {s: summ[("lm_bf16", s)] for s in seeds if ("lm_bf16", s) in summ}
bf_inter = statistics.mean([b["inter"] for b in base.values()] or [math.nan])
table, csvrows = [], []
for name, label, flags in configs:
    have = [s for s in seeds if (name, s) in summ]
    if not have:
        continue
    fin = spread([summ[(name, s)]["final"] for s in have])
    paired = [s for s in have if s in base]
    gap = spread([summ[(name, s)]["final"] / base[s]["final"] - 1 for s in paired])
    # the same difference against what bf16 still has above the floor
    frac = spread([(summ[(name, s)]["final"] - base[s]["final"]) / (base[s]["final"] - base[s]["floor"])
                   for s in paired])
    inter = statistics.mean(summ[(name, s)]["inter"] for s in have)
    t = statistics.mean(summ[(name, s)]["time"] for s in have)
    table.append((label, fin, gap, frac, inter, inter / bf_inter))
    csvrows.append([name, label, len(have), *fin, *gap, *frac, inter, inter / bf_inter,
                    statistics.mean(summ[(name, s)]["intra"] for s in have), t])
with open(out / "convergence_lm_summary.csv", "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["config", "label", "seeds", "final_loss_mean", "final_loss_min", "final_loss_max",
                "gap_mean", "gap_min", "gap_max", "gap_of_excess_mean", "gap_of_excess_min",
                "gap_of_excess_max", "inter_bytes_per_step", "inter_ratio_vs_bf16",
                "intra_bytes_per_step", "step_time_s"])
    w.writerows(csvrows)
pc = lambda v: "%+.2f%% (%+.2f..%+.2f)" % tuple(100 * x for x in v)
md = []
md.append("| configuration | final loss, nats (mean of last %d steps): mean over seeds (min..max) "
          "| vs bf16, same seed: mean (min..max) | gap / (bf16 final - floor), same seed: mean (min..max) "
          "| inter-node bytes / step | x bf16 |" % tail)
md.append("|---|---:|---:|---:|---:|---:|")
for label, fin, gap, frac, inter, ratio in table:
    md.append("| %s | %.4f (%.4f..%.4f) | %s | %s | %.0f | %.3f |"
              % (label, *fin, pc(gap), pc(frac), inter, ratio))
md.append("| 4-bit weights with qWD, SDP4Bit-like (qWD4 + qgZ 8/4 + Hadamard) "
          "| not applicable: qWD sends weight differences against full weights kept between steps "
          "(ZeRO-1/2, the MLP part's zero2 rows); FSDP2 is ZeRO-3 | | | | |")
md.append("")
if base:
    fl = [base[s]["floor"] for s in sorted(base)]
    ex = [base[s]["final"] - base[s]["floor"] for s in sorted(base)]
    md.append("Entropy floor (entropy rate of the seed's Markov chain), seeds %s: %s nats; "
              "bf16's final loss above it: %s nats." % (
                  ", ".join(map(str, sorted(base))), " / ".join("%.4f" % v for v in fl),
                  " / ".join("%.4f" % v for v in ex)))
    md.append("")
any_run = next(iter(summ.values()), None)
if any_run:
    md.append("Runs: %d steps, seeds %s, 8 ranks as 2 nodes x 4 (emulated), `examples/fsdp2_train.py` "
              "(PyTorch FSDP2 on CPU, zpp as its all-gather and reduce-scatter; %d parameters, "
              "%d tokens per step, `%s`)." % (steps, ", ".join(map(str, seeds)), any_run["params"],
                                              any_run["tokens"], size))
    md.append("")
md.append("Flags of each configuration (each run: `ZPP_TOPO=2x4 mpirun -np 8 python "
          "examples/fsdp2_train.py --comm zppmpi --dtype bf16 --reduce-dtype bf16 %s --steps %d "
          "--seed S FLAGS --json --quiet`):" % (size, steps))
md.append("")
for name, label, flags in configs:
    md.append("- %s: `%s`" % (label, flags or "(none)"))
(out / "convergence_study_lm.md").write_text("\n".join(md) + "\n")
if base:  # the floor line of the plot: the mean over seeds, as the curves
    print("%.6f" % statistics.mean(b["floor"] for b in base.values()))
PY
)
if [ "${ZPP_CONV_PLOT:-1}" = 0 ] || [ -z "$floor" ]; then
  why="ZPP_CONV_PLOT=0"
  [ -n "$floor" ] || why="no bf16 run"
  echo "$prog: wrote $out/convergence_study_lm.md and $out/convergence_lm_summary.csv (no plot: $why)" >&2
  return 0
fi
python3 "$here/plot_convergence_study.py" "$out/convergence_lm_losses.csv" \
  -o "$out/convergence_study_lm.png" --steps "$steps" --linear --floor "$floor" \
  --title "FSDP2 transformer LM (examples/fsdp2_train.py), emulated 2x4" || {
  echo "$prog: the plot failed (is matplotlib installed?)" >&2
  exit 1
}
echo "$prog: wrote $out/convergence_study_lm.md, $out/convergence_lm_summary.csv and $out/convergence_study_lm.png" >&2
}

if part_on mlp; then mlp_part convergence "$runs" ""; fi
if part_on floor; then mlp_part convergence_floor "$floor_runs" "$noise"; fi
if part_on lm; then lm_part; fi
