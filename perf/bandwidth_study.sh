#!/usr/bin/env bash
# Cross-node bandwidth study: 8 ranks as an EMULATED 2x4 cluster, the
# inter-node link EMULATED at 0.1, 0.4, 1 and 10 Gbit/s per rank and not
# slowed ("unlimited"); every variant of the all-gather (bf16, qwz8, qwz4),
# the reduce-scatter (bf16, qgz4, qgz8-4) and the hpZ gathers (bf16,
# hpz-fwd8, hpz-bwd8) at 256 KiB .. 16 MiB (x4).  Each speedup is the bf16
# baseline's time divided by the variant's, both measured in the same
# zpp-bench run, the variants round-robin (--interleave).  Then, when BUILD_DIR/tools/zpp-train exists, a training
# step study (zpp-train --large --mode zero3 vs zeropp) at the same link
# speeds: ZPP_STUDY_TRAIN_REPS (3) repetitions of the two modes alternated,
# ZPP_STUDY_TRAIN_STEPS (5) steps each; medians and paired ratios.
#   usage: perf/bandwidth_study.sh OUT_DIR [BUILD_DIR]
#          perf/bandwidth_study.sh --cluster OUT_DIR [BUILD_DIR]
# --cluster runs the study on real links instead (perf/cluster_study.sh:
# scripts/netns_cluster.sh, root needed) and writes OUT_DIR/cluster_study.*.
# Writes OUT_DIR/bandwidth_study.csv (every zpp-bench row, the link speed
# first), OUT_DIR/bandwidth_study.md (tables and the exact commands),
# OUT_DIR/bandwidth_study_busbw.png, OUT_DIR/bandwidth_study_speedup.png
# and, with zpp-train, OUT_DIR/bandwidth_study_train.{csv,png}.
#
# Run time on 2 cores: about 5-8 minutes of collectives and, with the
# default 3 repetitions of 5 steps, about 3 minutes of training runs (60
# launches; ZPP_STUDY_TRAIN_REPS=1 is the old single run per point).  To
# keep the collectives there every row is -w 1 -n 2 (one untimed, two
# timed iterations), and at 0.1 Gbit/s -n 1:
# a bf16 all-gather of 16 MiB shards moves 7 * 16 MiB through one rank per
# node there, about 10 s per iteration.
# For a quick smoke run: ZPP_STUDY_SPEEDS="1 unlimited" ZPP_STUDY_MAXBYTES=1M.
# ZPP_STUDY_RUN_TIMEOUT_S (900): each launch is killed after that many
# seconds, the study goes on and exits 1 naming it
# (tests/bandwidth_study_timeout_test.sh).
set -euo pipefail
prog=bandwidth_study.sh
if [ "${1:-}" = --cluster ]; then
  shift
  exec bash "$(dirname "${BASH_SOURCE[0]}")/cluster_study.sh" "$@"
fi
if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  echo "usage: $prog [--cluster] OUT_DIR [BUILD_DIR]" >&2
  exit 2
fi
out=$1
build=${2:-build}
train_reps=${ZPP_STUDY_TRAIN_REPS:-3}
train_steps=${ZPP_STUDY_TRAIN_STEPS:-5}
[[ "$train_reps" =~ ^[1-9][0-9]?$ ]] || {
  echo "$prog: ZPP_STUDY_TRAIN_REPS '$train_reps': must be an integer 1..99" >&2; exit 2; }
[[ "$train_steps" =~ ^[1-9][0-9]{0,4}$ ]] && [ "$train_steps" -ge 2 ] || {
  echo "$prog: ZPP_STUDY_TRAIN_STEPS '$train_steps': must be an integer 2..99999 (step 1 is not timed)" >&2; exit 2; }
# every launch (zpp-bench or zpp-train, 8 ranks) is killed after this many
# seconds: a hung rank must not hold the study (the longest launch, the
# 16 MiB bf16 all-gather at 0.1 Gbit/s, takes well under a minute)
run_timeout=${ZPP_STUDY_RUN_TIMEOUT_S:-900}
[[ "$run_timeout" =~ ^[1-9][0-9]{0,5}$ ]] || {
  echo "$prog: ZPP_STUDY_RUN_TIMEOUT_S '$run_timeout': must be an integer 1..999999 (seconds)" >&2; exit 2; }
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
bench=$build/perf/zpp-bench
train=$build/tools/zpp-train
[ -x "$bench" ] || { echo "$prog: no $bench: build first" >&2; exit 1; }
python3 -c 'import matplotlib' 2> /dev/null || {
  echo "$prog: python3 matplotlib is missing (pip install matplotlib)" >&2
  exit 1
}
mkdir -p "$out"

export OMPI_MCA_mpi_yield_when_idle=1
mpirun=(mpirun --allow-run-as-root --oversubscribe --mca btl self,vader
        --bind-to none -np 8 -x ZPP_TOPO=2x4 -x OMPI_MCA_mpi_yield_when_idle)
read -r -a speeds <<< "${ZPP_STUDY_SPEEDS:-0.1 0.4 1 10 unlimited}"
maxbytes=${ZPP_STUDY_MAXBYTES:-16M}
colls=(allgather reducescatter hpz-gather)
declare -A variants=([allgather]=bf16,qwz8,qwz4 [reducescatter]=bf16,qgz4,qgz8-4
                     [hpz-gather]=bf16,hpz-fwd8,hpz-bwd8)

csv=$out/bandwidth_study.csv
cmds=$out/bandwidth_study.cmds
echo "link_gbit,coll,variant,size,count,dtype,time_us,algbw,busbw,intra_bytes,inter_bytes,ratio,max_err,wrong,inter_bytes_max,time_med_us,time_min_us,time_max_us,inter_bytes_node_max" > "$csv"
: > "$cmds"
status=0
t0=$(date +%s)
for gbit in "${speeds[@]}"; do
  iters=2
  [ "$gbit" = 0.1 ] && iters=1
  emu=${gbit/unlimited/0}
  for coll in "${colls[@]}"; do
    args=(--coll "$coll" --variant "${variants[$coll]}" -b 256K -e "$maxbytes" -f 4
          -n "$iters" -w 1 -c 1 --interleave --format csv)
    cmd="ZPP_TOPO=2x4 ZPP_EMU_INTER_GBIT=$emu mpirun -np 8 zpp-bench ${args[*]}"
    echo "$cmd" >> "$cmds"
    echo "\$ $cmd" >&2
    # A failed check (exit 1) still prints its rows: keep them, report it.
    rc=0
    timeout -k 10 "$run_timeout" "${mpirun[@]}" -x ZPP_EMU_INTER_GBIT="$emu" "$bench" "${args[@]}" \
        > "$out/.bench.out" 2> "$out/.bench.err" || rc=$?
    if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
      echo "$prog: zpp-bench at $gbit Gbit/s, $coll: timed out after $run_timeout s (ZPP_STUDY_RUN_TIMEOUT_S); killed" >&2
      status=1
    elif [ "$rc" -ne 0 ]; then
      echo "$prog: zpp-bench exited $rc at $gbit Gbit/s, $coll:" >&2
      tail -5 "$out/.bench.err" >&2
      status=1
    fi
    grep -v '^#' "$out/.bench.out" | grep -v '^coll,' | sed "s/^/$gbit,/" >> "$csv" || true
  done
done
rm -f "$out/.bench.out" "$out/.bench.err"
t1=$(date +%s)

# ---- training step study --------------------------------------------------
tcsv=$out/bandwidth_study_train.csv
tmd=$out/.train.md
rm -f "$tcsv"
if [ -x "$train" ]; then
  echo "batch,link_gbit,mode,steps,wall_s,step_time_s,step_time_source,inter_bytes_per_step,inter_bytes_per_step_per_rank,rep" > "$tcsv"
  # Two global batches: 8 (one sample per rank) keeps the step's compute
  # small next to its traffic, as on GPUs, where a step's FLOPs take far
  # less time than here; 64 (the trainer's default) is compute-heavy on
  # 2 shared cores.  docs/bench/training.md has the results.
  # Each point: train_reps repetitions of zero3 then zeropp, alternated,
  # so that both modes see the same minutes of the shared machine; the
  # table gives medians and the median of each repetition's ratio.
  for batch in 8 64; do
  for gbit in "${speeds[@]}"; do
    emu=${gbit/unlimited/0}
    for ((rep = 1; rep <= train_reps; rep++)); do
    for mode in zero3 zeropp; do
      targs=(--mode "$mode" --large --batch "$batch" --steps "$train_steps" --json)
      cmd="ZPP_TOPO=2x4 ZPP_EMU_INTER_GBIT=$emu mpirun -np 8 zpp-train ${targs[*]}"
      [ "$rep" = 1 ] && echo "$cmd" >> "$cmds"
      echo "\$ [rep $rep/$train_reps] $cmd" >&2
      ts=$(date +%s.%N)
      rc=0
      timeout -k 10 "$run_timeout" "${mpirun[@]}" -x ZPP_EMU_INTER_GBIT="$emu" "$train" "${targs[@]}" \
          2> "$out/.train.err" | python3 "$here/plot_bandwidth_study.py" --stamp \
          > "$out/.train.out" || rc=$?
      te=$(date +%s.%N)
      if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
        echo "$prog: zpp-train at $gbit Gbit/s, --mode $mode, rep $rep: timed out after $run_timeout s (ZPP_STUDY_RUN_TIMEOUT_S); killed" >&2
        status=1
        continue
      elif [ "$rc" -ne 0 ]; then
        echo "$prog: zpp-train exited $rc at $gbit Gbit/s, --mode $mode, rep $rep:" >&2
        tail -5 "$out/.train.err" >&2
        status=1
        continue
      fi
      python3 "$here/plot_bandwidth_study.py" --train-row "$batch" "$gbit" "$mode" \
          "$train_steps" "$ts" "$te" "$out/.train.out" "$rep" >> "$tcsv" || status=1
    done
    done
  done
  done
  rm -f "$out/.train.out" "$out/.train.err"
fi
t2=$(date +%s)

# ---- markdown and plots ----------------------------------------------------
python3 "$here/plot_bandwidth_study.py" --markdown "$csv" "$cmds" \
    "$tcsv" "$train" "$((t1 - t0))" "$((t2 - t1))" > "$out/bandwidth_study.md"
python3 "$here/plot_bandwidth_study.py" --plot "$csv" "$tcsv" "$out"
rm -f "$cmds" "$tmd"
echo "wrote $out/bandwidth_study.{csv,md} and PNGs ($((t1 - t0)) s collectives, $((t2 - t1)) s training)" >&2
exit "$status"
