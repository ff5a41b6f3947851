#!/usr/bin/env bash
# On a GPU machine: Megatron-LM script flags on the CUDA backend, end to end. A Llama 3 script's flags (its
# bf16 variant, shrunk to 2 layers) train with --train-samples, --exit-interval and --tensorboard-dir; the
# checkpoint resumes, then fine-tunes (--finetune); the event file is read back by TensorBoard's own
# EventAccumulator when the tensorboard package is installed, and compared with megatune's reader.
#   bash bench/megatron_flags_gpu.sh build/bin/megatune
set -euo pipefail
B=${1:-build/bin/megatune}
work=${OUT:-$(mktemp -d)}  # the device tool's $OUT brings the event files back
export NCCL_NVLS_ENABLE=0
llama=(--use-mcore-models --num-layers 2 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32
  --group-query-attention --num-query-groups 8 --kv-channels 128 --seq-length 8192 --max-position-embeddings 8192
  --position-embedding-type rope --rotary-base 1000000 --rotary-percent 1.0 --attention-dropout 0.0
  --hidden-dropout 0.0 --swiglu --normalization RMSNorm --init-method-std 0.0134 --attention-backend fused
  --apply-layernorm-1p --untie-embeddings-and-output-weights --disable-bias-linear --micro-batch-size 1
  --global-batch-size 8 --lr 0.00015 --min-lr 0.00001 --lr-decay-style cosine --clip-grad 1.0
  --weight-decay 0.1 --adam-beta1 0.9 --adam-beta2 0.95 --bf16 --grad-reduce-in-bf16 --cross-entropy-loss-fusion
  --calculate-per-token-loss --manual-gc --empty-unused-memory-level 1 --use-distributed-optimizer
  --overlap-grad-reduce --overlap-param-gather --tensor-model-parallel-size 1 --context-parallel-size 1
  --sequence-parallel --mock-data --tokenizer-type NullTokenizer --vocab-size 128256 --split 99,1,0
  --no-create-attention-mask-in-dataloader --no-mmap-bin-files --num-workers 1 --log-interval 2
  --eval-iters 1 --eval-interval 4 --log-throughput --ckpt-format torch_dist --device cuda)
echo "== train: 96 samples of 8 (12 iterations), exit at 6, TensorBoard"
"$B" train "${llama[@]}" --train-samples 96 --lr-warmup-samples 16 --lr-decay-samples 80 --exit-interval 6 \
  --save "$work/ck" --tensorboard-dir "$work/tb" | tee "$work/a.log"
grep -q "exiting program at iteration 6" "$work/a.log"
[ "$(cat "$work/ck/latest_checkpointed_iteration.txt")" = 6 ]
echo "== resume to 12"
"$B" train "${llama[@]}" --train-samples 96 --lr-warmup-samples 16 --lr-decay-samples 80 --save "$work/ck" \
  --load "$work/ck" --tensorboard-dir "$work/tb" | tee "$work/b.log"
grep -q "iteration       12/      12" "$work/b.log"
echo "== fine-tune from it"
"$B" train "${llama[@]}" --train-iters 4 --load "$work/ck" --finetune --save "$work/ft" | tee "$work/c.log"
grep -q "for fine-tuning" "$work/c.log"
[ "$(cat "$work/ft/latest_checkpointed_iteration.txt")" = 4 ]
if "$B" --help 2>&1 | grep -q "^ *report "; then
  "$B" report --run "$work/tb" --html "$work/run.html" | tee "$work/report.txt"
else
  : > "$work/report.txt"  # an executable from before `report`: read the events back where it is
fi
rm -rf "$work/ck" "$work/ft"
python3 - "$work" <<'PY'
import glob, re, sys
work = sys.argv[1]
ours = {}
for line in open(f"{work}/report.txt"):
    m = re.match(r"  (\S.*?)\s+(\d+)\s+(\d+)\s+(\d+)\s", line)
    if m and m.group(1) != "scalar":
        ours[m.group(1)] = int(m.group(2))
try:
    from tensorboard.backend.event_processing import event_accumulator
except ImportError:
    print("tensorboard not installed: its reader is not run (megatune's reader checked the CRCs)")
    sys.exit(0)
points = {}
for f in sorted(glob.glob(f"{work}/tb/events.out.tfevents.*")):
    acc = event_accumulator.EventAccumulator(f, size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    for tag in acc.Tags()["scalars"]:
        for e in acc.Scalars(tag):
            points.setdefault(tag, {})[e.step] = e.value
for tag in ("lm loss", "learning-rate", "grad-norm", "throughput", "lm loss validation"):
    assert tag in points, tag
    assert not ours or len(points[tag]) == ours[tag], (tag, len(points[tag]), ours[tag])
    print(f"  {tag}: {len(points[tag])} points, steps {min(points[tag])}..{max(points[tag])}")
print("tensorboard's EventAccumulator read", sum(len(v) for v in points.values()), "points of", len(points),
      "tags; lm loss at 12:", points["lm loss"][12])
PY
echo "megatron_flags_gpu: all checks passed"
