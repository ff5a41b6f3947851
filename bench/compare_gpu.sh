#!/usr/bin/env bash
# Predicted vs measured on one GPU: gpt-1.3b (seq 2048, global batch 32, micro-batch 4, no recomputation) trained
# plain and with --trace-dir, then `megatune compare` on the trace; nvidia-smi samples SM clock and power.
# Usage (on the GPU machine): bash bench/compare_gpu.sh MEGATUNE_BINARY OUT_DIR
set -uo pipefail
B=${1:?megatune binary}; OUT=${2:?output folder}
export NCCL_NVLS_ENABLE=0
ARGS=(--model gpt-1.3b --mock-data --train-iters 8 --gbs 32 --mbs 4 --lr 1e-4 --log-interval 1)
{
  nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv
  nvcc --version 2>/dev/null | tail -1
  echo "== plain"; "$B" train "${ARGS[@]}"
  nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw --format=csv,noheader -lms 250 > "$OUT/smi.csv" &
  smi=$!
  echo "== traced"; "$B" train "${ARGS[@]}" --trace-dir "$OUT/run1" --trace-iterations 4:3
  kill "$smi"
  echo "== compare"; "$B" compare --run "$OUT/run1" --html "$OUT/report.html" --perfetto "$OUT/trace.json" --top 20
} > "$OUT/log.txt" 2>&1
tail -80 "$OUT/log.txt"
