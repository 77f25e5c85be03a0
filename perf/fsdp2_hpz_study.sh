#!/usr/bin/env bash
# hpZ under FSDP2 on real links: examples/fsdp2_train.py (--dim 256
# --layers 4) on scripts/netns_cluster.sh clusters (network namespaces as
# nodes, each node's link shaped by tc tbf both ways, the tbf burst the
# cluster script's default unless ZPP_CLUSTER_BURST says otherwise), in
# up to five modes: FSDP2 over gloo, zpp exact, ZeRO++ without hpZ
# (--zeropp --zpp-hpz 0), ZeRO++ with zpp's hpZ (--zeropp) and ZeRO++ with
# FSDP2's hpZ (--zeropp --hpz <ranks per node>).
# Per (topology, rate) block: take /run/zpp-cluster.lock, make the
# cluster, then R repetitions, each one launch running the modes
# (ZPP_HPZ_STUDY_MODES, all five unless said) one after the other in one process group (python/tests/fsdp_runs.py), their
# order rotated from one repetition to the next; tear the cluster down
# and let the lock go.  Each launch runs under scripts/softirq_wait.sh: one
# during which ksoftirqd waited more than ZPP_SOFTIRQ_MAX_WAIT_S (5 s) on a
# run queue is discarded and run again (ZPP_SOFTIRQ_TRIES, 3, at most).
#   usage: perf/fsdp2_hpz_study.sh OUT_DIR [BUILD_DIR]
# Writes OUT_DIR/fsdp2_hpz_study.csv (one row per mode and launch:
# perf/fsdp2_hpz_study.py names the columns) and OUT_DIR/fsdp2_hpz_study.md
# (per block: the median step of each mode, min..max, the median paired
# ratio ZeRO++ with hpZ / without it (the same launch), inter- and
# intra-node MB per step, the final loss; the load averages, the commands).
# Exits 77 saying why where no cluster can be made (not root, no
# namespaces), 1 if a launch failed (the table leaves it out and says so),
# 2 on a bad setting.
# Settings (environment):
#   ZPP_HPZ_STUDY_TOPOS    NODESxRANKS clusters ("2x2 2x4")
#   ZPP_HPZ_STUDY_RATES    tc rates per node link ("400mbit 1600mbit"; none: unshaped)
#   ZPP_HPZ_STUDY_MODES    the modes each launch runs, of gloo exact
#                          zeropp-nohpz zeropp zeropp-fsdp2hpz (all five;
#                          "zeropp-nohpz zeropp": the paired ratio alone,
#                          in launches half as long)
#   ZPP_HPZ_STUDY_REPS     repetitions (5)
#   ZPP_HPZ_STUDY_STEPS    steps per run, >= 2: step 0 is not timed (12)
#   ZPP_HPZ_STUDY_ARGS     the model ("--dim 256 --layers 4")
#   ZPP_HPZ_STUDY_TIMEOUT_S  limit of one launch (600)
#   ZPP_HPZ_STUDY_PYTHON   the Python with torch (.venv-torch/bin/python)
# Run time on 2 cores with the defaults: launches of 30-90 s (five runs of
# 12 steps, 4 or 8 ranks), 20 launches, 15-30 minutes; the smallest check:
# ZPP_HPZ_STUDY_TOPOS=2x2 ZPP_HPZ_STUDY_RATES=400mbit ZPP_HPZ_STUDY_REPS=2
# ZPP_HPZ_STUDY_STEPS=3 (about 2 minutes).  A TERM (INT) takes effect at once.
set -euo pipefail
prog=fsdp2_hpz_study.sh
if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  echo "usage: $prog OUT_DIR [BUILD_DIR]" >&2
  exit 2
fi
out=$1
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
build=${2:-$root/build}
cluster=$root/scripts/netns_cluster.sh
lock=/run/zpp-cluster.lock
. "$root/scripts/softirq_wait.sh"

bad() { echo "$prog: $1" >&2; exit 2; }
read -r -a topos <<< "${ZPP_HPZ_STUDY_TOPOS-2x2 2x4}"
read -r -a rates <<< "${ZPP_HPZ_STUDY_RATES-400mbit 1600mbit}"
read -r -a want <<< "${ZPP_HPZ_STUDY_MODES-gloo exact zeropp-nohpz zeropp zeropp-fsdp2hpz}"
[ ${#want[@]} -gt 0 ] || bad "ZPP_HPZ_STUDY_MODES is empty: give modes, e.g. zeropp-nohpz zeropp"
seen_modes=" "
for m in "${want[@]}"; do
  case $m in
    gloo | exact | zeropp-nohpz | zeropp | zeropp-fsdp2hpz) ;;
    *) bad "ZPP_HPZ_STUDY_MODES: '$m': must be gloo, exact, zeropp-nohpz, zeropp or zeropp-fsdp2hpz" ;;
  esac
  [[ "$seen_modes" != *" $m "* ]] || bad "ZPP_HPZ_STUDY_MODES: '$m' given twice"
  seen_modes+="$m "
done
export ZPP_HPZ_STUDY_MODES="${want[*]}"
reps=${ZPP_HPZ_STUDY_REPS-5}
steps=${ZPP_HPZ_STUDY_STEPS-12}
margs=${ZPP_HPZ_STUDY_ARGS---dim 256 --layers 4}
tmo=${ZPP_HPZ_STUDY_TIMEOUT_S-600}
py=${ZPP_HPZ_STUDY_PYTHON-$root/.venv-torch/bin/python}
[ ${#topos[@]} -gt 0 ] || bad "ZPP_HPZ_STUDY_TOPOS is empty: give clusters, e.g. 2x2"
for t in "${topos[@]}"; do
  [[ "$t" =~ ^[2-8]x[1-8]$ ]] || bad "ZPP_HPZ_STUDY_TOPOS: '$t': must be NODESxRANKS, 2..8 x 1..8 (e.g. 2x4)"
done
[ ${#rates[@]} -gt 0 ] || bad "ZPP_HPZ_STUDY_RATES is empty: give tc rates, e.g. 400mbit, or none"
for r in "${rates[@]}"; do
  [[ "$r" =~ ^(none|[1-9][0-9]{0,5}(bit|kbit|mbit|gbit))$ ]] ||
    bad "ZPP_HPZ_STUDY_RATES: rate '$r': must be none or a positive integer with bit, kbit, mbit or gbit"
done
[[ "$reps" =~ ^[1-9][0-9]?$ ]] || bad "ZPP_HPZ_STUDY_REPS '$reps': must be an integer 1..99"
[[ "$steps" =~ ^[1-9][0-9]{0,4}$ ]] && [ "$steps" -ge 2 ] ||
  bad "ZPP_HPZ_STUDY_STEPS '$steps': must be an integer 2..99999 (step 0 is not timed)"
[[ "$tmo" =~ ^[1-9][0-9]{0,4}$ ]] || bad "ZPP_HPZ_STUDY_TIMEOUT_S '$tmo': must be a positive integer (seconds)"
[ -x "$py" ] || { echo "$prog: no Python at $py (ZPP_HPZ_STUDY_PYTHON; scripts/install-deps.sh --python)" >&2; exit 1; }
lib=$(cd "$build" 2> /dev/null && pwd)/libzpp.so || lib=
[ -n "$lib" ] && [ -f "$lib" ] || { echo "$prog: no $build/libzpp.so: build first" >&2; exit 1; }
rc=0
why=$("$cluster" check) || rc=$?
if [ $rc -ne 0 ]; then
  echo "$prog: skipped: ${why:-scripts/netns_cluster.sh check exited $rc}" >&2
  exit 77
fi
mkdir -p "$out"
# rows go to hidden files until the end: a study stopped half way leaves
# OUT_DIR's table as it was
csv=$out/.fsdp2_hpz_study.csv
meta=$out/.fsdp2_hpz_study.meta
tmp=$out/.fsdp2_hpz_study
"$py" "$here/fsdp2_hpz_study.py" --header > "$csv"
{
  echo "start $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "cores $(nproc)"
  echo "cpu $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
  echo "reps $reps"
  echo "steps $steps"
  echo "args $margs"
  echo "burst ${ZPP_CLUSTER_BURST:-73728}"
} > "$meta"

up=0
child=
cleanup() {
  if [ -n "$child" ]; then # a wait for the lock
    kill -TERM "$child" 2> /dev/null || true
    wait "$child" 2> /dev/null || true
  fi
  softirq_stop
  if [ "$up" = 1 ]; then "$cluster" down || true; fi
  rm -f "$tmp.out" "$tmp.err"
}
trap 'cleanup' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

load() { cut -d' ' -f1-3 /proc/loadavg; }
status=0
for topo in "${topos[@]}"; do
  nodes=${topo%x*} ppn=${topo#*x}
  np=$((nodes * ppn))
  common="$margs --steps $steps --json --quiet"
  modes=()
  for m in "${want[@]}"; do
    case $m in
      gloo) modes+=("--comm gloo $common") ;;
      exact) modes+=("--comm zppmpi $common") ;;
      zeropp-nohpz) modes+=("--comm zppmpi --zeropp --zpp-hpz 0 $common") ;;
      zeropp) modes+=("--comm zppmpi --zeropp $common") ;;
      zeropp-fsdp2hpz) modes+=("--comm zppmpi --zeropp --hpz $ppn $common") ;;
    esac
  done
  for rate in "${rates[@]}"; do
    exec 9> "$lock"
    if ! flock -n 9; then
      echo "$prog: another cluster run holds $lock: waiting for it (at most 900 s)" >&2
      # in the background, waited for: a TERM ends the wait at once
      flock -w 900 9 &
      child=$!
      rc=0
      wait "$child" || rc=$?
      child=
      [ "$rc" = 0 ] || { echo "$prog: another cluster run held $lock for 900 s" >&2; exit 1; }
    fi
    before=$(load)
    up=1
    "$cluster" up -n "$nodes" -p "$ppn" -r "$rate"
    subnet=$(cat /run/zpp-cluster/subnet 2> /dev/null || echo 10.213.0)
    for ((rep = 1; rep <= reps; rep++)); do
      # the modes rotated by one per repetition: each mode runs early and late
      runs=()
      for ((i = 0; i < ${#modes[@]}; i++)); do
        runs+=("${modes[$(((i + rep - 1) % ${#modes[@]}))]}")
      done
      cmd=(timeout -k 10 "$tmo" "$cluster" run -np "$np" -x OMPI_MCA_mpi_yield_when_idle=1
        -x PYTHONPATH="$root/python" -x ZPP_LIBRARY="$lib"
        -x MASTER_ADDR="$subnet.11" -x MASTER_PORT=$((29400 + rep))
        "$py" "$root/python/tests/fsdp_runs.py" "${runs[@]}")
      [ "$rep" != 1 ] || echo "cmd [$topo, $rate] scripts/netns_cluster.sh run -np $np -x OMPI_MCA_mpi_yield_when_idle=1 ... python/tests/fsdp_runs.py $(printf "'%s' " "${modes[@]}")" >> "$meta"
      echo "\$ [$topo, $rate, rep $rep/$reps] fsdp_runs.py with ${#runs[@]} modes" >&2
      rc=0
      softirq_launch "$topo, $rate, rep $rep" "$tmp.out" "$tmp.err" "${cmd[@]}" || rc=$?
      st=ok
      if [ "$softirq_gave_up" = 1 ]; then
        st="ksoftirqd waited more than $softirq_max s in each of $softirq_tries tries"
      elif [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
        st="timeout after $tmo s"
      elif [ "$rc" != 0 ]; then
        st="exit $rc"
      fi
      wall=$(awk -v a="$softirq_t0" -v b="$softirq_t1" 'BEGIN { printf "%.1f", b - a }')
      "$py" "$here/fsdp2_hpz_study.py" --rows "$topo" "$rate" "$rep" "$st" "$wall" "$tmp.out" >> "$csv"
      if [ "$st" != ok ]; then
        echo "$prog: $topo, $rate, rep $rep: $st" >&2
        tail -n 5 "$tmp.err" >&2 || true
        status=1
      fi
    done
    "$cluster" down
    up=0
    exec 9>&-
    echo "block $topo $rate $before $(load)" >> "$meta"
  done
done

"$py" "$here/fsdp2_hpz_study.py" --markdown "$csv" "$meta" > "$out/.fsdp2_hpz_study.md"
softirq_md_note "$out/.fsdp2_hpz_study.md"
mv "$csv" "$out/fsdp2_hpz_study.csv"
mv "$out/.fsdp2_hpz_study.md" "$out/fsdp2_hpz_study.md"
rm -f "$meta"
echo "wrote $out/fsdp2_hpz_study.{csv,md} ($softirq_discards launches discarded for ksoftirqd's run-queue wait, $softirq_given_up given up)" >&2
exit "$status"
