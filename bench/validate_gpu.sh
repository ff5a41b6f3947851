#!/usr/bin/env bash
# One GPU-machine call that checks a build before it is called done, from the repository root:
# every executor GPU test; `megatune train` refusing a model that does not fit before it allocates and
# training a tp2 layout's ranks on one GPU (--ranks-on-one-gpu); the
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
# PARTS (default: all) picks what runs: tests, dense (gpt-1.3b against its peer), moe (mixtral-small against
# its peer; the scaled-down Mixtral and DeepSeek-V3 shapes training), heldout.
parts=${PARTS:-tests dense moe heldout}
has() { case " $parts " in *" $1 "*) return 0 ;; esac; return 1; }
if has tests; then
  for t in "$G"/executor_*_gpu_test; do step "$(basename "$t")" 150 "$t"; done
  step refuses_llama3_8b 60 $G/megatune train --model llama3-8b --mock-data --train-iters 2 --device cuda
  # A tp2 + sp layout's two ranks as threads on this one GPU, from the command line.
  step ranks_on_one_gpu_tp2 120 $G/megatune train --model tiny --hidden-size 256 --num-attention-heads 4 \
    --seq-length 64 --max-position-embeddings 64 --device cuda --mock-data --tp 2 --sequence-parallel \
    --world-size 2 --gbs 8 --mbs 2 --train-iters 20 --log-interval 10 --lr 3e-3 --ranks-on-one-gpu
fi
if has heldout && [ "${HELDOUT:-1}" = 1 ]; then
  step heldout 240 env SWEEP_SET=heldout bash bench/sweep_gpu.sh measure $G/megatune "$OUT/heldout"
  tar cJf "$OUT/heldout.tar.xz" -C "$OUT" heldout && rm -rf "$OUT/heldout"
fi
if has dense; then
  step perf_gpt13b 90 $G/bench_train_gpu perf --model gpt-1.3b --mbs 4 --seq 2048 --iters 10
  step peer_gpt13b 150 python3 bench/peer/torch_gpt.py --model gpt-1.3b --mbs 4 --steps 12 --compile
fi
if has moe; then
  # The Mixtral-shaped MoE step against its compiled PyTorch peer (same shapes).
  step perf_mixtral_small 120 $G/bench_train_gpu perf --model mixtral-small --mbs 4 --seq 2048 --iters 10
  step peer_mixtral_small 240 python3 bench/peer/torch_moe.py --mbs 4 --steps 16 --compile regional
  # Mixtral-8x7b and DeepSeek-V3 scaled down to one GPU (the tiny presets' head dims are below the CUDA
  # kernels'): DeepSeek-V3 with MLA (q/k 192, v 128), sigmoid routing with the expert bias, a shared expert
  # after a first dense layer, and one MTP layer.
  small="--num-layers 4 --hidden-size 1024 --num-attention-heads 8 --seq-length 1024 --max-position-embeddings 1024 --vocab-size 32000"
  step train_mixtral_scaled 90 $G/megatune train --device cuda --model mixtral-8x7b $small --num-query-groups 4 \
    --ffn-hidden-size 3584 --moe-ffn-hidden-size 3584 --moe-aux-loss-coeff 1e-2 --mock-data --train-iters 40 \
    --gbs 8 --mbs 4 --lr 3e-4 --log-interval 10
  step train_deepseek_v3_scaled 90 $G/megatune train --device cuda --model deepseek-v3 $small \
    --ffn-hidden-size 2816 --num-experts 16 --moe-router-topk 4 --moe-ffn-hidden-size 512 \
    --moe-shared-expert-intermediate-size 512 --moe-layer-freq '[0,1,1,1]' --q-lora-rank 384 --kv-lora-rank 256 \
    --mtp-num-layers 1 --moe-router-score-function sigmoid --moe-router-enable-expert-bias --mock-data \
    --train-iters 40 --gbs 8 --mbs 4 --lr 3e-4 --log-interval 10
fi
if [ -d $G/tokenizers ]; then
  step tokenizers 120 python3 bench/tokenizers/throughput.py \
    --megatune $G/megatune --corpus $G/tokenizers/corpus.jsonl --files $G/tokenizers/files --workers 16
fi
# A device call returns at most 8 files: the step logs travel as one archive beside summary.txt.
tar cJf "$OUT/logs.tar.xz" -C "$OUT" $(cd "$OUT" && ls *.log) && rm -f "$OUT"/*.log
