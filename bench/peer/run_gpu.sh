#!/usr/bin/env bash
# One GPU-machine run of the engine's checks and benchmarks, from the repository root, with the executables
# copied into .gpu/ (bench_train_gpu, executor_engine_cuda_backend_gpu_test, megatune). Logs go to $OUT.
# Order: GPU tests, PyTorch parity, `megatune train` gpt-125m, megatune perf, then the PyTorch peer in the
# same run. Each step has its own time limit so one slow step cannot eat the others.
set -u
OUT=${OUT:-/tmp/engine_out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
G=.gpu
step() {  # step NAME SECONDS COMMAND...
  local name=$1 limit=$2
  shift 2
  local t0=$(date +%s)
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "== $name rc=$rc $(( $(date +%s) - t0 ))s" | tee -a "$OUT/summary.txt"
  tail -n 4 "$OUT/$name.log" | tee -a "$OUT/summary.txt"
}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$OUT/gpu.txt" 2>&1
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" >>"$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"
step gpu_test 90 $G/executor_engine_cuda_backend_gpu_test
mkdir -p "$OUT/parity_gpt" "$OUT/parity_llama"
step parity_export_gpt 45 $G/bench_train_gpu parity --out "$OUT/parity_gpt"
step parity_gpt 60 python3 bench/peer/parity.py "$OUT/parity_gpt"
step parity_export_llama 45 $G/bench_train_gpu parity --llama --out "$OUT/parity_llama"
step parity_llama 60 python3 bench/peer/parity.py "$OUT/parity_llama"
step train_gpt125m 90 $G/megatune train --model gpt-125m --mock-data --train-iters 50 --log-interval 10 --device cuda
step perf_gpt13b 75 $G/bench_train_gpu perf --model gpt-1.3b --mbs 4 --seq 2048 --iters 10
step perf_llama1b 75 $G/bench_train_gpu perf --model llama-1b --mbs 2 --seq 4096 --iters 10
step peer_gpt13b_compiled 150 python3 bench/peer/torch_gpt.py --model gpt-1.3b --mbs 4 --steps 12 --compile
step peer_llama1b_compiled 150 python3 bench/peer/torch_gpt.py --model llama-1b --mbs 2 --steps 12 --compile
step peer_gpt13b_eager 60 python3 bench/peer/torch_gpt.py --model gpt-1.3b --mbs 4 --steps 12
step peer_llama1b_eager 60 python3 bench/peer/torch_gpt.py --model llama-1b --mbs 2 --steps 12
