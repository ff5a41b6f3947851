#!/usr/bin/env bash
# Issue 5, "loss on real text (byte-level) falls steadily over a few hundred steps": trains a gpt-125m-shaped
# model (byte vocabulary 257, padded to 384; seq 1024; global batch 32) for 400 iterations on the corpus of
# bench/peer/make_text_corpus.py with `megatune train`, logs Megatron's lines to $OUT/real_text_train.log,
# then checks them: the lm loss averaged over WINDOWS equal runs of log lines falls strictly from each
# window to the next, the last window ends below FINAL_MAX (ln 257 = 5.55 is a uniform guess) at least
# MIN_DROP below the first, every loss is finite and no iteration was skipped. Exit 0 only if all hold.
#
#   bash bench/peer/real_text_gpu.sh          # CUDA (default): 400 iterations, ~13 M tokens; an estimated
#                                             # 25-60 s of training on an H200 (time limit 240 s)
#   bash bench/peer/real_text_gpu.sh --cpu    # CPU backend, `tiny` model, 120 short iterations (~20 s)
#   bash bench/peer/real_text_gpu.sh --check LOG [--cpu]   # only the check, on an existing log
#
# Environment: MEGATUNE (default .gpu/megatune, else build/bin/megatune), DATA (default
# .corpus/text_text_document), OUT (default /tmp/real_text_out), TRAIN_ITERS, WINDOWS, FINAL_MAX, MIN_DROP.
set -u
mode=cuda
check_only=
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu) mode=cpu ;;
    --check)
      [ $# -ge 2 ] || { echo "usage: $0 [--cpu] [--check LOG]" >&2; exit 2; }
      check_only=$2
      shift
      ;;
    *)
      echo "usage: $0 [--cpu] [--check LOG]" >&2
      exit 2
      ;;
  esac
  shift
done
OUT=${OUT:-/tmp/real_text_out}
DATA=${DATA:-.corpus/text_text_document}
if [ -z "${MEGATUNE:-}" ]; then
  MEGATUNE=.gpu/megatune
  [ -x "$MEGATUNE" ] || MEGATUNE=build/bin/megatune
fi
mkdir -p "$OUT"
if [ -z "$check_only" ] && [ ! -x "$MEGATUNE" ]; then
  echo "real_text: no megatune executable at $MEGATUNE; set MEGATUNE=path/to/megatune" >&2
  exit 2
fi
if [ -z "$check_only" ] && { [ ! -f "$DATA.bin" ] || [ ! -f "$DATA.idx" ]; }; then
  echo "real_text: no dataset $DATA.bin/.idx; build it with bench/peer/make_text_corpus.py --megatune $MEGATUNE" >&2
  exit 2
fi

common=(--vocab-size 257 --split 1,0,0 --data-path "$DATA" --log-interval 10 --weight-decay 0.1
  --clip-grad 1.0 --lr-decay-style cosine --seed 1234)
if [ "$mode" = cuda ]; then
  TRAIN_ITERS=${TRAIN_ITERS:-400}
  WINDOWS=${WINDOWS:-6}
  FINAL_MAX=${FINAL_MAX:-2.5}
  # The first window already averages iterations 10-60, past the steep start (H200, 2026-11-30: window
  # means 3.03 2.46 2.38 2.28 2.19 2.11, a drop of 0.92), so the whole-run drop asked for is 0.5.
  MIN_DROP=${MIN_DROP:-0.5}
  args=(--model gpt-125m --seq-length 1024 --max-position-embeddings 1024 --micro-batch-size 8
    --global-batch-size 32 --lr 6e-4 --min-lr 6e-5 --lr-warmup-iters 40 --device cuda)
  limit=240
else
  TRAIN_ITERS=${TRAIN_ITERS:-120}
  WINDOWS=${WINDOWS:-4}
  FINAL_MAX=${FINAL_MAX:-3.2}
  MIN_DROP=${MIN_DROP:-1.0}
  args=(--model tiny --seq-length 128 --max-position-embeddings 128 --micro-batch-size 8
    --global-batch-size 16 --lr 3e-3 --min-lr 3e-4 --lr-warmup-iters 10 --device cpu --bf16)
  limit=300
fi
log="$OUT/real_text_train.log"
if [ -n "$check_only" ]; then
  log=$check_only
else
  echo "real_text ($mode): $MEGATUNE train ${args[*]} ${common[*]} --train-iters $TRAIN_ITERS"
  start=$(date +%s)
  timeout "$limit" "$MEGATUNE" train "${args[@]}" "${common[@]}" --train-iters "$TRAIN_ITERS" >"$log" 2>&1
  rc=$?
  echo "real_text: megatune train exited $rc after $(($(date +%s) - start)) s; log $log"
  if [ $rc -ne 0 ]; then
    tail -n 5 "$log"
    exit 1
  fi
fi

# The check, over the Megatron log lines: "iteration N/ M | ... | lm loss: X | ... | number of skipped
# iterations: K |".
awk -v windows="$WINDOWS" -v final_max="$FINAL_MAX" -v min_drop="$MIN_DROP" '
  / iteration +[0-9]+\/ *[0-9]+ \|/ && /lm loss:/ {
    n = split($0, field, "|")
    for (i = 1; i <= n; ++i) {
      f = field[i]
      if (f ~ /lm loss:/) {
        sub(/.*lm loss: */, "", f)
        sub(/ +$/, "", f)
        if (f !~ /^[0-9.]+([eE][-+]?[0-9]+)?$/) { bad = bad " non-finite loss \"" f "\" at line " (lines + 1) ";" }
        loss[++lines] = f + 0
      } else if (f ~ /number of skipped iterations:/) {
        sub(/.*number of skipped iterations: */, "", f)
        skipped += f + 0
      }
    }
  }
  END {
    if (lines < 2 * windows) {
      printf "real_text: FAIL: %d log lines with a loss; need at least %d\n", lines, 2 * windows
      exit 1
    }
    ok = 1
    for (w = 0; w < windows; ++w) {
      lo = int(w * lines / windows) + 1
      hi = int((w + 1) * lines / windows)
      sum = 0
      for (i = lo; i <= hi; ++i) sum += loss[i]
      mean[w] = sum / (hi - lo + 1)
      printf "real_text: window %d (log lines %d-%d): mean lm loss %.4f", w + 1, lo, hi, mean[w]
      if (w > 0 && !(mean[w] < mean[w - 1])) { printf "  <- not below the previous window"; ok = 0 }
      printf "\n"
    }
    printf "real_text: first logged loss %.4f, last %.4f; skipped iterations %d\n", loss[1], loss[lines], skipped
    if (bad != "") { print "real_text: FAIL:" bad; ok = 0 }
    if (skipped > 0) { print "real_text: FAIL: skipped (non-finite) iterations"; ok = 0 }
    if (!(mean[windows - 1] < final_max)) {
      printf "real_text: FAIL: last window %.4f is not below %.2f\n", mean[windows - 1], final_max; ok = 0
    }
    if (!(mean[0] - mean[windows - 1] >= min_drop)) {
      printf "real_text: FAIL: the loss fell by %.4f, less than %.2f\n", mean[0] - mean[windows - 1], min_drop; ok = 0
    }
    if (ok) printf "real_text: PASS: the loss falls in every window, %.4f -> %.4f (ln 257 = 5.55)\n", mean[0], mean[windows - 1]
    else print "real_text: FAIL (see the lines above)"
    exit ok ? 0 : 1
  }' "$log" | tee "$OUT/real_text_check.txt"
exit "${PIPESTATUS[0]}"
