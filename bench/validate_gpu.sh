#!/usr/bin/env bash
# One GPU-machine call that checks a build before it is called done, from the repository root:
# every executor GPU test; `megatune train` refusing a model that does not fit before it allocates; the
# held-out predicted-vs-measured layouts (bench/sweep_gpu.sh with SWEEP_SET=heldout); the training step
# against compiled PyTorch (gpt-1.3b, seq 2048, mbs 4); the tokenizer throughput against Python's tokenizers
# and tiktoken when .gpu/tokenizers/ holds the files; the PyTorch MoE peer's step.
# Stage with `bash bench/peer/stage_gpu.sh BUILD_DIR --no-corpus` (.gpu/bins.tar.xz), carry .gpu, run
# `bash bench/validate_gpu.sh`. Logs go to $OUT; summary.txt has every step's exit code and last lines, and the
# traced runs come back as heldout.tar.xz.
set -u
OUT=${OUT:-/tmp/validate_out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
G=.gpu
if [ -f $G/bins.tar.xz ]; then tar xJf $G/bins.tar.xz -C $G && rm -f $G/bins.tar.xz; fi
export LD_LIBRARY_PATH=$PWD/$G/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}  # staged libraries (stage_gpu.sh)
step() {  # step NAME SECONDS COMMAND...
  local name=$1 limit=$2
  shift 2
  local t0=$(date +%s)
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "== $name rc=$rc $(( $(date +%s) - t0 ))s" | tee -a "$OUT/summary.txt"
  tail -n 3 "$OUT/$name.log" | cut -c1-400 | tee -a "$OUT/summary.txt"
}
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"; } >"$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"
for t in "$G"/executor_*_gpu_test; do step "$(basename "$t")" 150 "$t"; done
step refuses_llama3_8b 60 $G/megatune train --model llama3-8b --mock-data --train-iters 2 --device cuda
step heldout 240 env SWEEP_SET=heldout bash bench/sweep_gpu.sh measure $G/megatune "$OUT/heldout"
tar cJf "$OUT/heldout.tar.xz" -C "$OUT" heldout && rm -rf "$OUT/heldout"
step perf_gpt13b 90 $G/bench_train_gpu perf --model gpt-1.3b --mbs 4 --seq 2048 --iters 10
step peer_gpt13b 150 python3 bench/peer/torch_gpt.py --model gpt-1.3b --mbs 4 --steps 12 --compile
if [ -d $G/tokenizers ]; then
  step tokenizers 120 python3 bench/tokenizers/throughput.py \
    --megatune $G/megatune --corpus $G/tokenizers/corpus.jsonl --files $G/tokenizers/files --workers 16
fi
step peer_moe 150 python3 bench/peer/torch_moe.py --compile
