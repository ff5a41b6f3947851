#!/usr/bin/env bash
# Predicted vs measured on one GPU over a sweep of layouts (the simulator-accuracy targets):
# gpt-1.3b (seq 2048, global batch 32) at micro-batch 1/2/4/8 x recompute none/selective/full, llama3-1b at
# seq 4096 and llama3-3b at seq 4096.
#   bash bench/sweep_gpu.sh predict MEGATUNE OUT.tsv   -> each layout's predicted step time and memory (no GPU)
#   bash bench/sweep_gpu.sh measure MEGATUNE OUT_DIR   -> on the GPU: each layout trained with --trace-dir
#                                                         into OUT_DIR/<name>/ (log in OUT_DIR/<name>.log)
# Then, anywhere: megatune compare --run OUT_DIR/<name> ... (one --run per layout) for the errors and tau.
# SWEEP_SET=heldout picks layouts the shipped calibration was not fitted on (other sequence lengths and
# micro-batches of the same models): the test of a calibration fitted on the sweep. SWEEP_SET=generalise:
# see below.
# SWEEP_SET=fp8: FP8 linears (delayed scaling with --fp8-format hybrid, tensorwise with e4m3) beside bf16, one
# micro-batch per step as bench/fp8_gpu.sh's perf steps: gpt-1.3b and llama3-1b (whose FP8 steps
# bench/RESULTS.md 2026-12-03 measured), gpt-2.7b, llama3-3b, gpt-125m.
set -uo pipefail
mode=${1:?predict|measure}; B=${2:?megatune binary}; out=${3:?output}
layouts=()
if [ "${SWEEP_SET:-sweep}" = heldout ]; then
  layouts+=("gpt-1.3b_seq4096_mbs2|--model gpt-1.3b --seq-length 4096 --max-position-embeddings 4096 --gbs 16 --mbs 2")
  layouts+=("gpt-1.3b_seq1024_mbs8|--model gpt-1.3b --seq-length 1024 --max-position-embeddings 1024 --gbs 64 --mbs 8")
  layouts+=("llama3-1b_seq2048_mbs4|--model llama3-1b --seq-length 2048 --gbs 32 --mbs 4")
  layouts+=("llama3-1b_seq8192_mbs1_selective|--model llama3-1b --seq-length 8192 --gbs 8 --mbs 1 --recompute-granularity selective")
  layouts+=("llama3-3b_seq2048_mbs2|--model llama3-3b --seq-length 2048 --gbs 32 --mbs 2")
  layouts+=("llama3-3b_seq4096_mbs1_full|--model llama3-3b --seq-length 4096 --gbs 16 --mbs 1 --recompute-granularity full --recompute-method uniform --recompute-num-layers 1")
fi
# SWEEP_SET=generalise: shapes of another kind than the calibration's (head dims 80 / 96 / 256, sequences of
# 512 and 1024 and of 16384 and 32768, a small model, another GQA ratio, MoE and MLA), predicted before
# their first measurement (bench/predictions/h200_generalise_*.tsv).
if [ "${SWEEP_SET:-sweep}" = generalise ]; then
  layouts+=("gpt-1.3b_hd256_seq2048_mbs4|--model gpt-1.3b --num-attention-heads 8 --seq-length 2048 --gbs 16 --mbs 4")
  layouts+=("gpt-1.3b_hd96_seq2048_mbs4|--model gpt-1.3b --num-attention-heads 24 --kv-channels 96 --seq-length 2048 --gbs 16 --mbs 4")
  layouts+=("gpt-2.7b_hd80_seq2048_mbs4|--model gpt-2.7b --seq-length 2048 --gbs 16 --mbs 4")
  layouts+=("gpt-1.3b_seq512_mbs32|--model gpt-1.3b --seq-length 512 --max-position-embeddings 512 --gbs 64 --mbs 32")
  layouts+=("llama3-1b_seq1024_mbs16|--model llama3-1b --seq-length 1024 --gbs 64 --mbs 16")
  layouts+=("llama3-1b_seq16384_mbs1|--model llama3-1b --seq-length 16384 --gbs 4 --mbs 1")
  layouts+=("llama3-1b_seq32768_mbs1|--model llama3-1b --seq-length 32768 --max-position-embeddings 32768 --gbs 2 --mbs 1")
  layouts+=("llama3-3b_seq8192_mbs1_selective|--model llama3-3b --seq-length 8192 --gbs 8 --mbs 1 --recompute-granularity selective")
  layouts+=("gpt-125m_seq2048_mbs16|--model gpt-125m --seq-length 2048 --gbs 64 --mbs 16")
  layouts+=("mixtral-small_seq2048_mbs2|--model mixtral-small --seq-length 2048 --gbs 8 --mbs 2")
  layouts+=("mixtral-small_seq2048_mbs4|--model mixtral-small --seq-length 2048 --gbs 8 --mbs 4")
  layouts+=("mixtral-scaled_top2_e8|--model mixtral-8x7b --num-layers 4 --hidden-size 1024 --num-attention-heads 8 --num-query-groups 4 --seq-length 1024 --max-position-embeddings 1024 --vocab-size 32000 --ffn-hidden-size 3584 --moe-ffn-hidden-size 3584 --gbs 8 --mbs 4")
  layouts+=("deepseek-v3-scaled_mla_e16_top4|--model deepseek-v3 --num-layers 4 --hidden-size 1024 --num-attention-heads 8 --seq-length 1024 --max-position-embeddings 1024 --vocab-size 32000 --ffn-hidden-size 2816 --num-experts 16 --moe-router-topk 4 --moe-ffn-hidden-size 512 --moe-shared-expert-intermediate-size 512 --moe-layer-freq [0,1,1,1] --q-lora-rank 384 --kv-lora-rank 256 --mtp-num-layers 1 --gbs 8 --mbs 4")
fi
[ "${SWEEP_SET:-sweep}" = sweep ] && for mbs in 1 2 4 8; do
  for rc in none selective full; do
    flags="--model gpt-1.3b --seq-length 2048 --gbs 32 --mbs $mbs"
    [ "$rc" = selective ] && flags+=" --recompute-granularity selective"
    [ "$rc" = full ] && flags+=" --recompute-granularity full --recompute-method uniform --recompute-num-layers 1"
    layouts+=("gpt-1.3b_mbs${mbs}_${rc}|$flags")
  done
done
if [ "${SWEEP_SET:-sweep}" = fp8 ]; then
  for m in "gpt-1.3b_seq2048_mbs4|--model gpt-1.3b --seq-length 2048 --gbs 4 --mbs 4" \
           "llama3-1b_seq4096_mbs2|--model llama3-1b --seq-length 4096 --gbs 2 --mbs 2" \
           "gpt-2.7b_seq2048_mbs4|--model gpt-2.7b --seq-length 2048 --gbs 4 --mbs 4" \
           "llama3-3b_seq4096_mbs1|--model llama3-3b --seq-length 4096 --gbs 1 --mbs 1" \
           "gpt-125m_seq2048_mbs8|--model gpt-125m --seq-length 2048 --max-position-embeddings 2048 --gbs 8 --mbs 8"; do
    name=${m%%|*}; flags=${m#*|}
    layouts+=("${name}_bf16|$flags")
    layouts+=("${name}_fp8_delayed|$flags --fp8-format hybrid --fp8-recipe delayed")
    case "$name" in gpt-1.3b*|llama3-1b*) layouts+=("${name}_fp8_tensorwise|$flags --fp8-format e4m3 --fp8-recipe tensorwise") ;; esac
  done
fi
if [ "${SWEEP_SET:-sweep}" = sweep ]; then
  layouts+=("llama3-1b_seq4096_mbs2|--model llama3-1b --seq-length 4096 --gbs 32 --mbs 2")
  layouts+=("llama3-3b_seq4096_mbs1|--model llama3-3b --seq-length 4096 --gbs 16 --mbs 1")
  layouts+=("llama3-3b_seq4096_mbs2_selective|--model llama3-3b --seq-length 4096 --gbs 16 --mbs 2 --recompute-granularity selective")
fi

case "$mode" in
  predict)
    printf 'layout\tpredicted_step_s\tpredicted_mfu_pct\tpredicted_memory_gib\tpredicted_uncalibrated_step_s\n' > "$out"
    for entry in "${layouts[@]}"; do
      name=${entry%%|*}; flags=${entry#*|}
      # shellcheck disable=SC2086
      report=$("$B" simulate $flags --cluster 1x1xH200) || exit 1
      # shellcheck disable=SC2086
      raw=$("$B" simulate $flags --cluster 1x1xH200 --no-calibration) || exit 1
      step=$(awk '/^  step time/ {print $3}' <<< "$report")
      mfu=$(awk '/^  MFU/ {print $2}' <<< "$report")
      mem=$(awk '/^  total/ {print $2}' <<< "$report")
      raw_step=$(awk '/^  step time/ {print $3}' <<< "$raw")
      printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$step" "$mfu" "$mem" "$raw_step" >> "$out"
    done
    column -t "$out"
    ;;
  measure)
    export NCCL_NVLS_ENABLE=0
    mkdir -p "$out"
    nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv > "$out/gpu.txt"
    for entry in "${layouts[@]}"; do
      name=${entry%%|*}; flags=${entry#*|}
      # shellcheck disable=SC2086
      "$B" train $flags --mock-data --train-iters 6 --lr 1e-4 --log-interval 1 \
        --trace-dir "$out/$name" --trace-iterations 3:3 > "$out/$name.log" 2>&1
      echo "$name rc=$? $(grep -o 'elapsed time per iteration (ms): [0-9.]*' "$out/$name.log" | tail -1)"
    done
    ;;
  *) echo "usage: $0 predict|measure MEGATUNE OUT" >&2; exit 2 ;;
esac
