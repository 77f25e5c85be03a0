#!/usr/bin/env bash
# The main job of `make demo`: one machine plays a 2-node x 4-rank cluster
# (emulated topology) with a slow emulated network, and zpp's compressed
# collectives are measured against the full-precision baselines in the same
# run.  Steps that need a component not built are skipped with a note.
set -euo pipefail
build=${1:-build}
np=8
topo=2x4
gbit=${ZPP_DEMO_GBIT:-0.4}
export OMPI_MCA_mpi_yield_when_idle=1
mpirun=(mpirun --allow-run-as-root --oversubscribe --mca btl self,vader
        --bind-to none -np "$np" -x ZPP_TOPO="$topo" -x OMPI_MCA_mpi_yield_when_idle)

echo "== zpp demo: $np ranks on this machine, EMULATED as $topo (ZPP_TOPO), inter-node link EMULATED at $gbit Gbit/s per rank =="
echo "   (real-link figures: docs/bench/real_links.md; see the end of this demo)"

if [ -x "$build/tools/zpp-topo" ]; then
  echo
  echo "-- 1. topology (emulated) --"
  echo "\$ ZPP_TOPO=$topo mpirun -np $np zpp-topo"
  "${mpirun[@]}" "$build/tools/zpp-topo"
fi

if [ -x "$build/perf/zpp-bench" ]; then
  echo
  echo "-- 2. weight all-gather: bf16 baseline vs qwZ INT8/INT4, 4 MiB per rank --"
  echo "\$ ZPP_EMU_INTER_GBIT=$gbit mpirun -np $np zpp-bench --coll allgather -b 4M -e 4M -n 2 -w 1"
  "${mpirun[@]}" -x ZPP_EMU_INTER_GBIT="$gbit" "$build/perf/zpp-bench" \
    --coll allgather -b 4M -e 4M -n 2 -w 1
  echo
  echo "-- 3. gradient reduce-scatter: bf16 baseline vs qgZ, 16 MiB input per rank --"
  echo "\$ ZPP_EMU_INTER_GBIT=$gbit mpirun -np $np zpp-bench --coll reducescatter -b 16M -e 16M -n 2 -w 1"
  "${mpirun[@]}" -x ZPP_EMU_INTER_GBIT="$gbit" "$build/perf/zpp-bench" \
    --coll reducescatter --variant bf16,qgz4,qgz8-4 -b 16M -e 16M -n 2 -w 1
  echo
  echo "-- 4. hpZ: the backward gather stays inside the node (inter_bytes 0) --"
  "${mpirun[@]}" -x ZPP_EMU_INTER_GBIT="$gbit" "$build/perf/zpp-bench" \
    --coll hpz-gather --variant bf16,hpz-fwd8,hpz-bwd8 -b 4M -e 4M -n 2 -w 1
fi

if [ -x "$build/tools/zpp-train" ]; then
  echo
  # The trainer's step is compute-heavy on 2 cores; at 0.4 Gbit/s the two
  # modes are close (docs/benchmarks.md), at 0.1 Gbit/s (100 Gb/s Ethernet
  # scaled) the network decides.
  tgbit=${ZPP_DEMO_TRAIN_GBIT:-0.1}
  echo "-- 5. a training step: ZeRO-3 vs ZeRO++ (qwZ INT8 + hpZ + qgZ INT4), MLP of 6.3M parameters, link EMULATED at $tgbit Gbit/s --"
  for mode in zero3 zeropp; do
    echo "\$ ZPP_EMU_INTER_GBIT=$tgbit mpirun -np $np zpp-train --mode $mode --large --steps 3 --json"
    "${mpirun[@]}" -x ZPP_EMU_INTER_GBIT="$tgbit" "$build/tools/zpp-train" \
      --mode "$mode" --large --steps 3 --quiet --json | tail -n 1 | python3 -c '
import json, sys
d = json.loads(sys.stdin.read())
print("   %-7s step %.3f s   inter-node %6.2f MB/step   intra-node %6.2f MB/step   loss %.4f   model state %.1f MB/rank"
      % (d["mode"], d["step_time_s"], d["inter_bytes_per_step"] / 1e6,
         d["intra_bytes_per_step"] / 1e6, d["final_loss"], d["model_state_bytes"] / 1e6))'
  done
fi

if [ -x "$build/tools/zpp-quant-error" ]; then
  echo
  echo "-- 6. quantization error per block size (1M normal and outlier-heavy values) --"
  echo "\$ zpp-quant-error --dist normal,normal-outliers --bits 8,4 --block 32,256,4096,0 --n 1048576"
  "$build/tools/zpp-quant-error" --dist normal,normal-outliers --bits 8,4 \
    --block 32,256,4096,0 --n 1048576
fi

if [ -x "$build/perf/zpp-quant-bench" ]; then
  echo
  echo "-- 7. quantizer throughput vs memcpy, one core (16M elements, out of cache) --"
  "$build/perf/zpp-quant-bench" --n 16777216 --iters 5
fi

if [ -x .venv-torch/bin/python ] && [ -f "$build/libzpp.so" ]; then
  echo
  fgbit=${ZPP_DEMO_FSDP_GBIT:-0.1}
  echo "-- 8. PyTorch FSDP2 with zpp as its collectives: bf16 baseline vs ZeRO++, 4 ranks EMULATED as 2x2, link EMULATED at $fgbit Gbit/s --"
  echo "\$ NP=4 TOPO=2x2 GBIT=$fgbit STEPS=3 DIM=256 LAYERS=2 BATCH=2 SEQ=32 perf/fsdp2_step.sh"
  NP=4 TOPO=2x2 GBIT="$fgbit" STEPS=3 DIM=256 LAYERS=2 BATCH=2 SEQ=32 bash perf/fsdp2_step.sh "$build"
fi

echo
echo "== summary =="
echo "ratio < 1 in the zpp-bench tables is the compressed collective's time relative to the"
echo "bf16 baseline measured in the same run, on an EMULATED network of $gbit Gbit/s per rank."
echo "inter_bytes shows what crosses the (emulated) network: qwZ INT8 about half of bf16,"
echo "qgZ INT4 about 1/4 (the bf16 reduce-scatter is hierarchical too: each gradient crosses"
echo "once, in bf16; against the flat pairwise one qgZ INT4 is about 1/15), the hpZ backward"
echo "gather none. Docs: docs/collectives.md, docs/benchmarks.md."
echo
echo "Real links: this demo EMULATES the network inside zpp (it needs no root). The same"
echo "benchmarks on real, kernel-shaped links (network namespaces as nodes, tc tbf on each"
echo "node's link, Open MPI's TCP between nodes, the topology discovered) and next to"
echo "Open MPI's own MPI_Allgather / MPI_Reduce_scatter_block are in docs/bench/real_links.md"
echo "(all tables: docs/generated/cluster_study.md); as root, reproduce them with"
echo "  perf/bandwidth_study.sh --cluster OUT_DIR $build     (7-8 minutes on 2 cores)"
echo "or make such a cluster yourself: scripts/netns_cluster.sh up -n 2 -p 4 -r 400mbit;"
echo "scripts/netns_cluster.sh run -np 8 $build/perf/zpp-bench --coll allgather --variant bf16,qwz8,mpi;"
echo "scripts/netns_cluster.sh down."
