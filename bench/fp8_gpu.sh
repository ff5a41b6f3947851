#!/usr/bin/env bash
# On a GPU machine: FP8 linears end to end. The FP8 GPU test (casts bit for bit against the CPU reference,
# cuBLASLt FP8 GEMMs against the dequantized reference, a small model's FP8 curve against its bf16 one), every
# other executor GPU test (the GEMM runner and the CUDA backend changed under them), the training step of
# gpt-1.3b (seq 2048, mbs 4) and llama3-1b (seq 4096, mbs 2) in bf16 and in FP8 (delayed hybrid, tensorwise
# E4M3), the compiled PyTorch peer of gpt-1.3b in the same call, `megatune train --fp8-format` on CUDA, and
# (PREDICTIONS=1, the default) the traced FP8 runs of SWEEP_SET=fp8 against their predictions.
# Stage with `bash bench/peer/stage_gpu.sh BUILD_DIR --no-corpus`, carry .gpu, run `bash bench/fp8_gpu.sh`.
set -u
source "$(dirname "$0")/peer/gpu_steps.sh"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
step fp8_gpu_test 240 $G/executor_kernel_fp8_gpu_test
if [ "${ALL_TESTS:-1}" = 1 ]; then
  for t in "$G"/executor_*_gpu_test; do
    case "$t" in *kernel_fp8_gpu_test) continue ;; esac
    step "$(basename "$t")" 150 "$t"
  done
fi
for m in "gpt-1.3b --mbs 4 --seq 2048" "llama3-1b --mbs 2 --seq 4096"; do
  name=${m%% *}
  step "perf_${name}_bf16" 90 $G/bench_train_gpu perf --model $m --iters 10
  step "perf_${name}_fp8_delayed" 90 $G/bench_train_gpu perf --model $m --iters 10 --fp8 hybrid --fp8-recipe delayed
  step "perf_${name}_fp8_tensorwise" 90 $G/bench_train_gpu perf --model $m --iters 10 --fp8 e4m3 --fp8-recipe tensorwise
done
step peer_gpt13b 150 python3 bench/peer/torch_gpt.py --model gpt-1.3b --mbs 4 --steps 12 --compile
step train_cli_fp8 120 $G/megatune train --device cuda --model llama3-1b --num-layers 2 --seq-length 2048 \
  --mock-data --train-iters 30 --gbs 8 --mbs 2 --lr 3e-4 --log-interval 10 --fp8-format hybrid \
  --fp8-amax-history-len 16 --fp8-amax-compute-algo max
# The FP8 pricing predictions (bench/predictions/h200_fp8_*.tsv, written before this run): each layout of
# SWEEP_SET=fp8 trained with --trace-dir (bf16 and FP8 of one model in the same call, for the ratio), then
# compare sets each traced run beside simulate's prediction (FP8 GEMM prices transferred from bf16).
if [ "${PREDICTIONS:-1}" = 1 ]; then
  step fp8_sweep_measure 900 env SWEEP_SET=fp8 bash bench/sweep_gpu.sh measure $G/megatune "$OUT/fp8_runs"
  for run in "$OUT"/fp8_runs/*/; do
    step "compare_$(basename "$run")" 120 $G/megatune compare --run "$run" --top 10
  done
  tar cJf "$OUT/fp8_runs.tar.xz" -C "$OUT" fp8_runs && rm -rf "$OUT/fp8_runs"
fi
tar cJf "$OUT/logs.tar.xz" -C "$OUT" $(cd "$OUT" && ls *.log) && rm -f "$OUT"/*.log
