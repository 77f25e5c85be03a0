#!/usr/bin/env bash
# FSDP2 training step with zpp as its collectives, on an emulated cluster
# with a slow emulated inter-node link: zpp's bf16 baseline against zpp
# ZeRO++ (qwZ INT8 gathers, qgZ INT4 gradients with error feedback, zpp's
# hpZ: examples/fsdp2_train.py --zeropp), both in one launch, one table.
# Not a test: a benchmark (the speed claim is the ratio of the two rows,
# measured in the same run).
#
#   perf/fsdp2_step.sh [BUILD]      env: NP=8 TOPO=2x4 GBIT=0.1 STEPS=6
#                                        DIM=256 LAYERS=4 BATCH=4 SEQ=64
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
NP=${NP:-8} TOPO=${TOPO:-2x4} GBIT=${GBIT:-0.1} STEPS=${STEPS:-6}
DIM=${DIM:-256} LAYERS=${LAYERS:-4} BATCH=${BATCH:-4} SEQ=${SEQ:-64}
py=${ZPP_PYTHON:-$root/.venv-torch/bin/python}
[ -x "$py" ] || { echo "fsdp2_step: $py missing (scripts/install-deps.sh --python)" >&2; exit 1; }
port=$((20000 + RANDOM % 20000))
common="--steps $STEPS --dim $DIM --layers $LAYERS --batch $BATCH --seq $SEQ --dtype bf16 --vocab 256 --json --quiet"
mpirun --allow-run-as-root --oversubscribe --mca btl self,vader --bind-to none -np "$NP" \
  -x ZPP_TOPO="$TOPO" -x ZPP_EMU_INTER_GBIT="$GBIT" -x OMPI_MCA_mpi_yield_when_idle=1 \
  -x PYTHONPATH="$root/python" -x ZPP_LIBRARY="$build/libzpp.so" \
  -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=$port \
  "$py" "$root/python/tests/fsdp_runs.py" \
  "--comm zppmpi $common" "--comm zppmpi --zeropp $common" |
"$py" -c '
import json, sys
rows = [json.loads(l) for l in sys.stdin if l.startswith("{")]
print("%-36s %10s %16s %16s %10s" % ("FSDP2 + zpp", "step s", "inter MB/step", "intra MB/step", "loss"))
for d in rows:
    name = "ZeRO++ (qwZ8 + qgZ4 + EF + hpZ)" if d["zeropp"] else "bf16 baseline"
    print("%-36s %10.3f %16.2f %16.2f %10.4f" % (name, d["step_time_s"], d["inter_bytes_per_step"] / 1e6,
          d["intra_bytes_per_step"] / 1e6, d["losses"][-1]))
if len(rows) == 2:
    b, z = rows
    print("params %d; ZeRO++ / baseline: step time %.3fx, inter-node bytes %.3fx"
          % (b["params"], z["step_time_s"] / b["step_time_s"],
             z["inter_bytes_per_step"] / b["inter_bytes_per_step"]))
'
