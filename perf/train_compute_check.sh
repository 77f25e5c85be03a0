#!/usr/bin/env bash
# Bitwise check of a change to zpp-train's compute (tools/train_math.h):
# runs two zpp-train binaries on the same configurations and compares
# first_loss, final_loss, loss_last10, loss_curve_checksum (every step's
# loss, bitwise) and param_checksum (the final fp32 master parameters).
# A change that only reorders independent sums must leave all of them
# unchanged in every mode, for every samples-per-rank count (odd ones and
# 1 too: the forward's padding lanes), shape (row tails) and rank count.
#   usage: perf/train_compute_check.sh OLD_BIN NEW_BIN
# Exit status 0 when every configuration agrees, 1 otherwise.  About two
# minutes on the 2-core machine of docs/benchmarks.md.
set -euo pipefail
old=${1:?usage: train_compute_check.sh OLD_BIN NEW_BIN}
new=${2:?usage: train_compute_check.sh OLD_BIN NEW_BIN}
for b in "$old" "$new"; do
  [ -x "$b" ] || { echo "train_compute_check: $b: not an executable" >&2; exit 1; }
done
export OMPI_MCA_mpi_yield_when_idle=1
keys="first_loss final_loss loss_last10 loss_curve_checksum param_checksum"

# one configuration: "TOPO NP ARGS..."; prints the compared fields
fields() {
  local bin=$1 topo=$2 np=$3
  shift 3
  local out
  out=$(ZPP_TOPO=$topo timeout 600 mpirun --allow-run-as-root --oversubscribe \
          --mca btl self,vader --bind-to none -np "$np" \
          -x ZPP_TOPO -x OMPI_MCA_mpi_yield_when_idle \
          "$bin" --json --quiet "$@" 2>&1) || {
    echo "FAILED: $bin $*" >&2
    echo "$out" | tail -n 5 >&2
    return 1
  }
  local j
  j=$(echo "$out" | grep '^{"mode"' | tail -n 1)
  for k in $keys; do
    printf '%s=%s ' "$k" "$(echo "$j" | grep -o "\"$k\": [^,}]*" | sed 's/.*: //')"
  done
}

configs=()
for m in dp zero1 zero2 zero3 zeropp; do
  configs+=("2x4 8 --mode $m --steps 3")                      # 8 samples/rank
  configs+=("2x4 8 --mode $m --large --batch 64 --steps 2")
done
for m in dp zero3 zeropp; do
  for bt in 8 16 24; do                                       # 1, 2, 3 samples/rank
    configs+=("2x4 8 --mode $m --batch $bt --steps 3")
  done
  configs+=("2x4 8 --mode $m --overlap 0 --steps 3")
done
configs+=("2x4 8 --mode zero3 --width 61 --in 13 --out 5 --batch 40 --steps 3")
configs+=("2x4 8 --mode zero2 --qwd 8 --steps 3")
configs+=("2x2 4 --mode zero3 --steps 3")
configs+=("2x2 4 --mode zeropp --steps 3 --sr 1 --hadamard 32")
configs+=("1x1 1 --mode dp --batch 3 --steps 3")
configs+=("1x1 1 --mode zero3 --steps 3")
configs+=("1x1 1 --mode zero3 --large --batch 5 --steps 2")

bad=0
for c in "${configs[@]}"; do
  read -r -a a <<<"$c"
  fo=$(fields "$old" "${a[@]}") || { bad=$((bad + 1)); continue; }
  fn=$(fields "$new" "${a[@]}") || { bad=$((bad + 1)); continue; }
  if [ "$fo" = "$fn" ] && ! echo "$fo" | grep -q '= '; then
    echo "same    ZPP_TOPO=${a[0]} -np ${a[1]} ${a[*]:2}: $fn"
  else
    echo "DIFFER  ZPP_TOPO=${a[0]} -np ${a[1]} ${a[*]:2}"
    echo "  old: $fo"
    echo "  new: $fn"
    bad=$((bad + 1))
  fi
done
echo "train_compute_check: ${#configs[@]} configurations, $bad differ or failed"
[ "$bad" -eq 0 ]
