#!/usr/bin/env bash
# The main job of `make demo`.  It grows with the project: for now the
# quantization-error table (issue 2); the topology, zpp-bench and
# zpp-train steps are added as they land.
set -euo pipefail
build=${1:-build}
bin=$build/tools
echo "== zpp demo =="
if [ -x "$bin/zpp-quant-error" ]; then
  echo
  echo "-- quantization error per block size (1M normal and outlier-heavy values) --"
  echo "\$ zpp-quant-error --dist normal,normal-outliers --bits 8,4 --block 32,256,4096,0 --n 1048576"
  "$bin/zpp-quant-error" --dist normal,normal-outliers --bits 8,4 \
    --block 32,256,4096,0 --n 1048576
fi
if [ -x "$build/perf/zpp-quant-bench" ]; then
  echo
  echo "-- quantizer throughput vs memcpy, one core (4M elements) --"
  "$build/perf/zpp-quant-bench" --n 4194304 --iters 5
fi
echo
echo "demo finished."
