#!/usr/bin/env bash
# Step time of two zpp-train binaries in one run (the compute change of
# tools/train_math.h against the per-sample loops it replaced): 8 ranks
# as an EMULATED 2x4, --large, the default global batch (64, 8 samples
# per rank), --steps 5; zero3 and zeropp on the unlimited link
# (ZPP_EMU_INTER_GBIT=0, compute-dominated) and at 0.1 Gbit/s per rank
# (the training target: zeropp at least 2x faster than zero3 there).  The
# binaries alternate run by run, REPEATS times, so a slow phase of a
# shared machine hits both; the table has the median of zpp-train's
# step_time_s (mean over steps 2.., max over ranks) per binary, the ratio
# new/old, and zero3/zeropp per binary.  The load average is printed at
# the start and the end.
#   usage: perf/train_compute_time.sh OLD_BIN NEW_BIN [REPEATS]
# About 2-3 minutes at 3 repeats on the 2-core machine of docs/benchmarks.md.
set -euo pipefail
old=${1:?usage: train_compute_time.sh OLD_BIN NEW_BIN [REPEATS]}
new=${2:?usage: train_compute_time.sh OLD_BIN NEW_BIN [REPEATS]}
reps=${3:-3}
for b in "$old" "$new"; do
  [ -x "$b" ] || { echo "train_compute_time: $b: not an executable" >&2; exit 1; }
done
export OMPI_MCA_mpi_yield_when_idle=1
raw=$(mktemp)
trap 'rm -f "$raw"' EXIT
echo "# start: $(uptime)"
for r in $(seq "$reps"); do
  for cfg in "zero3 0" "zeropp 0" "zero3 0.1" "zeropp 0.1"; do
    read -r mode gbit <<<"$cfg"
    for side in old new; do
      bin=$old; [ $side = new ] && bin=$new
      out=$(ZPP_TOPO=2x4 ZPP_EMU_INTER_GBIT=$gbit timeout 600 mpirun \
              --allow-run-as-root --oversubscribe --mca btl self,vader \
              --bind-to none -np 8 -x ZPP_TOPO -x ZPP_EMU_INTER_GBIT \
              -x OMPI_MCA_mpi_yield_when_idle \
              "$bin" --mode "$mode" --large --steps 5 --json --quiet 2>&1) || {
        echo "train_compute_time: $bin --mode $mode at $gbit Gbit/s failed:" >&2
        echo "$out" | tail -n 5 >&2
        exit 1
      }
      t=$(echo "$out" | grep '^{"mode"' | grep -o '"step_time_s": [^,]*' | sed 's/.*: //')
      echo "$side $mode $gbit $t" >>"$raw"
      echo "# run $r: $side $mode ZPP_EMU_INTER_GBIT=$gbit step_time_s $t"
    done
  done
done
echo "# end: $(uptime)"
python3 - "$raw" <<'EOF'
import statistics, sys
t = {}
for line in open(sys.argv[1]):
    side, mode, gbit, s = line.split()
    t.setdefault((side, mode, gbit), []).append(float(s))
med = {k: statistics.median(v) for k, v in t.items()}
print("| mode | link per rank | old step (ms) | new step (ms) | new/old | runs |")
print("|---|---|---:|---:|---:|---:|")
for gbit in ("0", "0.1"):
    for mode in ("zero3", "zeropp"):
        o, n = med[("old", mode, gbit)], med[("new", mode, gbit)]
        link = "unlimited" if gbit == "0" else gbit + " Gbit/s"
        print(f"| {mode} | {link} | {1e3*o:.1f} | {1e3*n:.1f} | {n/o:.3f} | "
              f"{len(t[('old', mode, gbit)])} |")
print()
for gbit in ("0", "0.1"):
    link = "unlimited" if gbit == "0" else gbit + " Gbit/s"
    for side in ("old", "new"):
        z3, zp = med[(side, "zero3", gbit)], med[(side, "zeropp", gbit)]
        print(f"zeropp speedup over zero3 at {link}, {side}: {z3/zp:.2f}x")
EOF
