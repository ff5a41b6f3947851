#!/usr/bin/env bash
# On a GPU machine: FP8 linears end to end, in parts that can run in separate device calls (each 1 unless set
# to 0):
#   ALL_TESTS    the FP8 GPU test (casts bit for bit against the CPU reference, cuBLASLt FP8 GEMMs against the
#                dequantized reference, a small model's FP8 curve against its bf16 one) and every other
#                executor GPU test;
#   KERNELS      bench_memory_kernels_gpu: the FP8 casts at gpt-1.3b's linear shapes (and the other
#                memory-bound kernels) as GB/s against a device-to-device copy;
#   PERF         the training step of gpt-1.3b (seq 2048, mbs 4), llama3-1b (seq 4096, mbs 2) and llama3-8b cut
#                to 16 layers (seq 4096, mbs 1) in bf16 and FP8 (delayed hybrid, tensorwise E4M3), and
#                `megatune train --fp8-format` on CUDA;
#   PEERS        the compiled PyTorch bf16 peer of gpt-1.3b and the FP8 peer (bench/peer/torch_gpt_fp8.py) of
#                gpt-1.3b and the 16-layer llama3-8b;
#   PROFILE      `megatune profile --fp8-format` of the FP8 sweep models' GEMMs and casts into
#                $OUT/fp8_profile.db (hybrid delayed and E4M3 tensorwise);
#   PREDICTIONS  the traced FP8 runs of SWEEP_SET=fp8 against their predictions.
# Stage with `bash bench/peer/stage_gpu.sh BUILD_DIR --no-corpus`, carry .gpu, run `bash bench/fp8_gpu.sh`.
set -u
source "$(dirname "$0")/peer/gpu_steps.sh"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
if [ "${ALL_TESTS:-1}" = 1 ]; then
  step fp8_gpu_test 240 $G/executor_kernel_fp8_gpu_test
  for t in "$G"/executor_*_gpu_test; do
    case "$t" in *kernel_fp8_gpu_test) continue ;; esac
    step "$(basename "$t")" 150 "$t"
  done
fi
if [ "${KERNELS:-1}" = 1 ]; then
  step memory_kernels 120 $G/bench_memory_kernels_gpu --repeats 20
fi
if [ "${PERF:-1}" = 1 ]; then
  for m in "gpt-1.3b --mbs 4 --seq 2048" "llama3-1b --mbs 2 --seq 4096" "llama3-8b --num-layers 16 --mbs 1 --seq 4096"; do
    name=${m%% *}
    step "perf_${name}_bf16" 90 $G/bench_train_gpu perf --model $m --iters 10
    step "perf_${name}_fp8_delayed" 90 $G/bench_train_gpu perf --model $m --iters 10 --fp8 hybrid --fp8-recipe delayed
    step "perf_${name}_fp8_tensorwise" 90 $G/bench_train_gpu perf --model $m --iters 10 --fp8 e4m3 --fp8-recipe tensorwise
  done
  step train_cli_fp8 120 $G/megatune train --device cuda --model llama3-1b --num-layers 2 --seq-length 2048 \
    --mock-data --train-iters 30 --gbs 8 --mbs 2 --lr 3e-4 --log-interval 10 --fp8-format hybrid \
    --fp8-amax-history-len 16 --fp8-amax-compute-algo max
fi
# The peers (PEERS=1): the compiled bf16 anchor, and bench/peer/torch_gpt_fp8.py (torch._scaled_mm linears,
# tensorwise with E5M2 gradients and rowwise E4M3) on gpt-1.3b and Llama 3 8B cut to 16 layers.
if [ "${PEERS:-1}" = 1 ]; then
  step peer_gpt13b 150 python3 bench/peer/torch_gpt.py --model gpt-1.3b --mbs 4 --steps 12 --compile
  for r in tensorwise rowwise; do
    step "peer_gpt13b_fp8_$r" 150 python3 bench/peer/torch_gpt_fp8.py --model gpt-1.3b --mbs 4 --recipe $r
  done
  for r in none tensorwise rowwise; do
    step "peer_llama3-8b-16l_$r" 150 python3 bench/peer/torch_gpt_fp8.py --model llama3-8b-16l --mbs 1 --seq 4096 --recipe $r
  done
fi
if [ "${PROFILE:-1}" = 1 ]; then
  for m in gpt-1.3b llama3-1b gpt-2.7b llama3-3b gpt-125m; do
    step "profile_fp8_${m}_hybrid" 150 $G/megatune profile --model $m --fp8-format hybrid --fp8-recipe delayed \
      --no-grid --no-collectives --no-fit --tp 1 --cp 1 --mbs 1 2 4 8 --db "$OUT/fp8_profile.db"
    step "profile_fp8_${m}_tensorwise" 150 $G/megatune profile --model $m --fp8-format e4m3 --fp8-recipe tensorwise \
      --no-grid --no-collectives --no-fit --tp 1 --cp 1 --mbs 1 2 4 8 --db "$OUT/fp8_profile.db"
  done
fi
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
