#!/usr/bin/env bash
# Hugging Face interchange against transformers (needs python3 with torch, transformers, safetensors;
# no network). Usage, from the repository root:
#   bash bench/hf_interchange_check.sh build/bin/megatune [WORK_DIR]
# DEVICE=cpu (default: megatune's fp32 CPU backend, tolerance 1e-4 relative, head dim 16) or DEVICE=cuda
# (bf16, tolerance 3e-2 relative, head dim 64).
# (a) megatune trains a tiny GPT-2, Llama (GQA) and Mixtral 5 iterations, exports them with `convert --to-hf`;
#     transformers' loss on the validation sample equals megatune's validation loss (and so does the loss of
#     a plain-Python forward pass of the export, which needs no torch).
# (b) transformers makes random GPT-2 and Llama models; `convert --from-hf` imports them and megatune's
#     validation loss of `train --load` (no model flags) equals transformers' loss.
# Prints a PASS or FAIL line per check and exits non-zero when any fails.
set -u
if [ $# -lt 1 ]; then
  echo "usage: bash bench/hf_interchange_check.sh MEGATUNE_BINARY [WORK_DIR]" >&2
  exit 2
fi
B=$(realpath "$1")
HERE=$(cd "$(dirname "$0")" && pwd)
WORK=${2:-$(mktemp -d)}
mkdir -p "$WORK"
DEVICE=${DEVICE:-cpu}
if [ "$DEVICE" = cpu ]; then TOLERANCE=1e-4; DEFAULT_SHAPE=small; else TOLERANCE=3e-2; DEFAULT_SHAPE=wide; fi
SHAPE=${SHAPE:-$DEFAULT_SHAPE}  # SHAPE=wide on the CPU runs the CUDA shapes in fp32
PY="python3 $HERE/hf_interchange_check.py"
DATA="$WORK/data"
FAILED=0
COMMON=(--device "$DEVICE" --data-path "$DATA" --split 969,30,1 --gbs 2 --mbs 2 --eval-iters 1
        --eval-interval 1000 --log-interval 1)
# Head dim 16 on the CPU (the tiny preset's), 64 on CUDA (a head dim its attention kernels take).
if [ $SHAPE = small ]; then
  GPT2=(--num-layers 2 --hidden-size 64 --num-attention-heads 4)
  LLAMA=(--model tiny)  # 2 layers, h 64, 4 heads on 2 key/value heads, untied
  MIXTRAL=(--model tiny-mixtral)  # tiny's attention, 8 experts top-2 in every layer
else
  GPT2=(--num-layers 2 --hidden-size 128 --num-attention-heads 2)
  LLAMA=(--model tiny --hidden-size 128 --kv-channels 64 --ffn-hidden-size 256)
  MIXTRAL=(--model tiny-mixtral --hidden-size 128 --kv-channels 64)
fi
GPT2+=(--seq-length 32 --max-position-embeddings 32 --vocab-size 256)

# The final validation loss a megatune train log holds.
megatune_loss() { sed -n 's/.*on validation set | lm loss value: \([0-9.E+-]*\).*/\1/p' "$1" | tail -1; }

compare() {  # NAME LOSS REFERENCE_LOSS [NAMES OF THE TWO]
  local names=${4:-"megatune transformers"}
  local first=${names% *} second=${names#* }
  if python3 -c "import sys; m, h = float('$2'), float('$3'); sys.exit(0 if abs(m - h) <= $TOLERANCE * abs(h) else 1)" 2>/dev/null; then
    echo "PASS $1: $first $2, $second $3 (tolerance $TOLERANCE relative)"
  else
    echo "FAIL $1: $first '$2', $second '$3' (tolerance $TOLERANCE relative)"
    FAILED=1
  fi
}

run() {  # LOG COMMAND...: runs it, its output into LOG; a failure is a FAIL line
  local log=$1
  shift
  if ! "$@" >"$log" 2>&1; then
    echo "FAIL command: $* (see $log)"
    tail -5 "$log"
    FAILED=1
    return 1
  fi
}

$PY make-data "$DATA" || { echo "FAIL making the dataset"; exit 1; }

# (a) megatune -> HF
for name in gpt2 llama mixtral; do
  case $name in
    gpt2) MODEL=("${GPT2[@]}") ;;
    llama) MODEL=("${LLAMA[@]}") ;;
    mixtral) MODEL=("${MIXTRAL[@]}") ;;
  esac
  rm -rf "$WORK/$name-trained" "$WORK/$name-hf"
  run "$WORK/$name-train.log" "$B" train "${MODEL[@]}" "${COMMON[@]}" --train-iters 5 --lr 1e-3 \
      --save "$WORK/$name-trained" || continue
  run "$WORK/$name-export.log" "$B" convert --to-hf "$WORK/$name-hf" --load "$WORK/$name-trained" || continue
  # The export's loss from a plain-Python forward pass of HF's GPT-2 / Llama (no torch needed).
  compare "(a) $name megatune -> HF, plain-Python forward" "$(megatune_loss "$WORK/$name-train.log")" \
          "$($PY reference-loss "$WORK/$name-hf" "$DATA")" "megatune plain-Python"
  hf=$($PY hf-loss "$WORK/$name-hf" "$DATA" 2>"$WORK/$name-hf-loss.err") ||
    { echo "FAIL (a) $name: transformers could not load the export (see $WORK/$name-hf-loss.err)"; tail -3 "$WORK/$name-hf-loss.err"; FAILED=1; continue; }
  compare "(a) $name megatune -> HF" "$(megatune_loss "$WORK/$name-train.log")" "$hf"
done

# (b) HF -> megatune
for name in gpt2 llama; do
  rm -rf "$WORK/$name-random" "$WORK/$name-imported"
  $PY make-hf $name $SHAPE "$WORK/$name-random" 2>"$WORK/$name-make-hf.err" ||
    { echo "FAIL (b) $name: transformers could not make the model (see $WORK/$name-make-hf.err)"; FAILED=1; continue; }
  hf=$($PY hf-loss "$WORK/$name-random" "$DATA" 2>>"$WORK/$name-make-hf.err") ||
    { echo "FAIL (b) $name: transformers loss (see $WORK/$name-make-hf.err)"; FAILED=1; continue; }
  compare "(b) $name transformers vs plain-Python forward" "$hf" \
          "$($PY reference-loss "$WORK/$name-random" "$DATA")" "transformers plain-Python"
  run "$WORK/$name-import.log" "$B" convert --from-hf "$WORK/$name-random" --save "$WORK/$name-imported" ||
    continue
  # One step at lr 0 leaves the imported parameters as they are; the validation after it is theirs.
  run "$WORK/$name-load.log" "$B" train --load "$WORK/$name-imported" "${COMMON[@]}" --train-iters 1 --lr 0 ||
    continue
  compare "(b) $name HF -> megatune" "$(megatune_loss "$WORK/$name-load.log")" "$hf"
done

if [ $FAILED = 0 ]; then echo "PASS all Hugging Face interchange checks (work dir $WORK)"; else echo "FAIL some checks (logs in $WORK)"; fi
exit $FAILED
