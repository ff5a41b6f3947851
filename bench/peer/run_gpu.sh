#!/usr/bin/env bash
# One GPU-machine run of the engine's checks and benchmarks, from the repository root. Stage them with
# `bash bench/peer/stage_gpu.sh BUILD_DIR` (the executables and sdpa_bench.py as .gpu/bins.tar.xz, unpacked
# here, and the real-text corpus),
# carry .gpu, then run `bash bench/peer/run_gpu.sh [checks|perf|all]`. Logs go to $OUT; summary.txt lists
# every step with its exit code and last lines.
#   checks: every executor GPU test, the attention kernels vs torch SDPA, PyTorch parity (gpt and llama
#           shapes), `megatune train` gpt-125m for 50 iterations, the real-text run with its loss check, the
#           optimizer and memory-bound kernel benches;
#   perf:   the engine perf shapes (gpt-1.3b, llama-1b; and with the former 256 MiB LM-head chunks) and the
#           compiled PyTorch peer in the same run, with the SM clock and power sampled during megatune's runs;
#   breakdown: the step's GEMM shapes (bench_gemm_gpu vs torch.matmul) and the peer's kernel-time breakdown.
#   all:    checks, perf and breakdown.
#   ncu:    Nsight Compute on the Hopper attention kernels (backward, forward; head dim NCU_HEAD_DIM, default
#           64 = llama-1b's shape): stall reasons, opcode mix and the hottest SASS lines (not part of all).
# Each step has its own time limit so one slow step cannot eat the others.
set -u
stage=${1:-all}
case "$stage" in checks | perf | breakdown | all | ncu) ;; *) echo "usage: $0 [checks|perf|breakdown|all|ncu]" >&2; exit 2 ;; esac
source "$(dirname "$0")/gpu_steps.sh"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader >"$OUT/gpu.txt" 2>&1
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" >>"$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"
if [ "$stage" = ncu ]; then
  for kernel in backward forward; do
    step "ncu_$kernel" 120 ncu --clock-control none -o "$OUT/ncu_$kernel" --set full --import-source no \
      -k "regex:flash_${kernel}_hopper_kernel" -c 1 $G/bench_attention_gpu --once "${NCU_HEAD_DIM:-64}"
    ncu -i "$OUT/ncu_$kernel.ncu-rep" --page source --csv --print-source sass >"$OUT/ncu_${kernel}_source.csv" 2>&1
    python3 bench/peer/ncu_source_summary.py "$OUT/ncu_${kernel}_source.csv" | tee "$OUT/ncu_${kernel}_summary.txt"
  done
  exit 0
fi
if [ "$stage" = checks ] || [ "$stage" = all ]; then
  for t in "$G"/executor_*_gpu_test; do step "$(basename "$t")" 120 "$t"; done
  step bench_attention 90 $G/bench_attention_gpu
  step sdpa 90 python3 $G/sdpa_bench.py
  mkdir -p "$OUT/parity_gpt" "$OUT/parity_llama"
  step parity_export_gpt 45 $G/bench_train_gpu parity --out "$OUT/parity_gpt"
  step parity_gpt 60 python3 bench/peer/parity.py "$OUT/parity_gpt"
  step parity_export_llama 45 $G/bench_train_gpu parity --llama --out "$OUT/parity_llama"
  step parity_llama 60 python3 bench/peer/parity.py "$OUT/parity_llama"
  step train_gpt125m 90 $G/megatune train --model gpt-125m --mock-data --train-iters 50 --log-interval 10 --device cuda
  if [ -f $G/corpus.tar.xz ]; then
    mkdir -p .corpus && tar xJf $G/corpus.tar.xz -C .corpus
    MEGATUNE=$G/megatune OUT=$OUT step real_text 250 bash bench/peer/real_text_gpu.sh
  fi
  step bench_optimizer 60 $G/bench_optimizer_gpu
  step bench_memory_kernels 60 $G/bench_memory_kernels_gpu
fi
if [ "$stage" = perf ] || [ "$stage" = all ]; then
  # SM clock and power every 100 ms while megatune trains (the step runs at the power cap: bench/RESULTS.md).
  nvidia-smi --query-gpu=clocks.sm,power.draw,power.limit,clocks_throttle_reasons.active --format=csv,noheader \
    -lms 100 >"$OUT/smi_perf.csv" 2>&1 &
  smi=$!
  step perf_gpt13b 75 $G/bench_train_gpu perf --model gpt-1.3b --mbs 4 --seq 2048 --iters 10
  step perf_llama1b 75 $G/bench_train_gpu perf --model llama-1b --mbs 2 --seq 4096 --iters 10
  kill "$smi" 2>/dev/null
  step power 30 python3 bench/peer/smi_summary.py "$OUT/smi_perf.csv"
  step peer_gpt13b_compiled 150 python3 bench/peer/torch_gpt.py --model gpt-1.3b --mbs 4 --steps 12 --compile
  step peer_llama1b_compiled 150 python3 bench/peer/torch_gpt.py --model llama-1b --mbs 2 --steps 12 --compile
  step perf_gpt13b_chunk256 75 $G/bench_train_gpu perf --model gpt-1.3b --mbs 4 --seq 2048 --iters 10 --loss-chunk-mib 256
  step perf_llama1b_chunk256 75 $G/bench_train_gpu perf --model llama-1b --mbs 2 --seq 4096 --iters 10 --loss-chunk-mib 256
fi
if [ "$stage" = breakdown ] || [ "$stage" = all ]; then
  step bench_gemm 90 $G/bench_gemm_gpu
  step peer_gemm 90 python3 bench/peer/gemm_bench.py
  step peer_kernels_gpt13b 150 python3 bench/peer/torch_kernels.py --model gpt-1.3b --mbs 4 --compile
  step peer_kernels_llama1b 150 python3 bench/peer/torch_kernels.py --model llama-1b --mbs 2 --compile
fi
