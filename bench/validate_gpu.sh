#!/usr/bin/env bash
# One GPU-machine call that checks a build before it is called done, from the repository root:
# every executor GPU test; `megatune train` refusing a model that does not fit before it allocates; the
# held-out predicted-vs-measured layouts (bench/sweep_gpu.sh with SWEEP_SET=heldout; HELDOUT=0 leaves them
# out); the training step against compiled PyTorch (gpt-1.3b, seq 2048, mbs 4) and the mixtral-small MoE step
# against bench/peer/torch_moe.py; the tiny Mixtral / DeepSeek-V3 presets training on the GPU; the tokenizer
# throughput against Python's tokenizers and tiktoken when .gpu/tokenizers/ holds the files.
# Stage with `bash bench/peer/stage_gpu.sh BUILD_DIR --no-corpus` (.gpu/bins.tar.xz), carry .gpu, run
# `bash bench/validate_gpu.sh`. Logs go to $OUT (logs.tar.xz); summary.txt has every step's exit code and last lines, and the
# traced runs come back as heldout.tar.xz.
set -u
source "$(dirname "$0")/peer/gpu_steps.sh"
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"; } >"$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"
for t in "$G"/executor_*_gpu_test; do step "$(basename "$t")" 150 "$t"; done
step refuses_llama3_8b 60 $G/megatune train --model llama3-8b --mock-data --train-iters 2 --device cuda
if [ "${HELDOUT:-1}" = 1 ]; then
  step heldout 240 env SWEEP_SET=heldout bash bench/sweep_gpu.sh measure $G/megatune "$OUT/heldout"
  tar cJf "$OUT/heldout.tar.xz" -C "$OUT" heldout && rm -rf "$OUT/heldout"
fi
step perf_gpt13b 90 $G/bench_train_gpu perf --model gpt-1.3b --mbs 4 --seq 2048 --iters 10
step peer_gpt13b 150 python3 bench/peer/torch_gpt.py --model gpt-1.3b --mbs 4 --steps 12 --compile
# The Mixtral-shaped MoE step against its compiled PyTorch peer (same shapes), and the scaled-down Mixtral and
# DeepSeek-V3 presets (MoE, MLA, multi-token prediction) training on the GPU.
step perf_mixtral_small 120 $G/bench_train_gpu perf --model mixtral-small --mbs 4 --seq 2048 --iters 10
step peer_mixtral_small 240 python3 bench/peer/torch_moe.py --mbs 4 --steps 16 --compile regional
for preset in "tiny-mixtral" "tiny-deepseek-v3-full --moe-router-score-function sigmoid \
  --moe-router-enable-expert-bias" "tiny-deepseek-v3-mla --mtp-num-layers 1 --tp 1"; do
  step "train_${preset%% *}" 60 $G/megatune train --device cuda --model $preset --mock-data --train-iters 30 \
    --gbs 8 --mbs 2 --lr 3e-3 --log-interval 10
done
if [ -d $G/tokenizers ]; then
  step tokenizers 120 python3 bench/tokenizers/throughput.py \
    --megatune $G/megatune --corpus $G/tokenizers/corpus.jsonl --files $G/tokenizers/files --workers 16
fi
# A device call returns at most 8 files: the step logs travel as one archive beside summary.txt.
tar cJf "$OUT/logs.tar.xz" -C "$OUT" $(cd "$OUT" && ls *.log) && rm -f "$OUT"/*.log
