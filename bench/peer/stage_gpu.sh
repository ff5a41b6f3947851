#!/usr/bin/env bash
# Stages what bench/peer/run_gpu.sh needs into .gpu/ (git-ignored): the executor's GPU tests, megatune, the
# benches, shared/anchors' sdpa_bench.py and the real-text corpus (.corpus/, built by make_text_corpus.py)
# as one xz archive, all stripped to fit a device call's carry limit.
#   bash bench/peer/stage_gpu.sh BUILD_DIR [ANCHORS_DIR]
set -eu
build=${1:?usage: $0 BUILD_DIR [ANCHORS_DIR]}
anchors=${2:-../shared/anchors}
rm -rf .gpu && mkdir -p .gpu
cp "$build"/bin/{megatune,bench_train_gpu,bench_attention_gpu,bench_optimizer_gpu,bench_gemm_gpu,bench_memory_kernels_gpu} .gpu/
cp "$build"/tests/executor_*_gpu_test .gpu/
strip .gpu/* 2>/dev/null || true
if [ -f "$anchors/sdpa_bench.py" ]; then cp "$anchors/sdpa_bench.py" .gpu/; fi
if [ -f .corpus/text_text_document.bin ]; then
  tar cJf .gpu/corpus.tar.xz -C .corpus text_text_document.bin text_text_document.idx
fi
du -sh .gpu
