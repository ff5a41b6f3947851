#!/usr/bin/env bash
# Stages what bench/peer/run_gpu.sh needs into .gpu/ (git-ignored): the executor's GPU tests, megatune, the
# benches, shared/anchors' sdpa_bench.py and bench/peer/sdpa_head_dims.py, stripped, as one xz archive (.gpu/bins.tar.xz, which run_gpu.sh
# unpacks on the device: unpacked they exceed a device call's 64 MiB carry limit), and the real-text corpus
# (.corpus/, built by make_text_corpus.py) as another unless --no-corpus.
#   bash bench/peer/stage_gpu.sh BUILD_DIR [ANCHORS_DIR] [--no-corpus]
set -eu
build=${1:?usage: $0 BUILD_DIR [ANCHORS_DIR] [--no-corpus]}
anchors=../shared/anchors
corpus=1
for arg in "${@:2}"; do
  case "$arg" in --no-corpus) corpus=0 ;; *) anchors=$arg ;; esac
done
staging=$(mktemp -d)
trap 'rm -rf "$staging"' EXIT
cp "$build"/bin/{megatune,bench_train_gpu,bench_attention_gpu,bench_optimizer_gpu,bench_gemm_gpu,bench_memory_kernels_gpu} "$staging"/
cp "$build"/tests/executor_*_gpu_test "$staging"/
strip "$staging"/* 2>/dev/null || true
# Shared libraries the GPU machine lacks (SentencePiece: the tokenizer): into lib/, for LD_LIBRARY_PATH.
for lib in $(ldd "$build"/bin/megatune | awk '/libsentencepiece/ {print $3}'); do
  mkdir -p "$staging"/lib && cp -L "$lib" "$staging"/lib/
done
if [ -f "$anchors/sdpa_bench.py" ]; then cp "$anchors/sdpa_bench.py" "$staging"/; fi
cp bench/peer/sdpa_head_dims.py "$staging"/
rm -rf .gpu && mkdir -p .gpu
tar cJf .gpu/bins.tar.xz -C "$staging" .
if [ "$corpus" = 1 ] && [ -f .corpus/text_text_document.bin ]; then
  tar cJf .gpu/corpus.tar.xz -C .corpus text_text_document.bin text_text_document.idx
fi
du -sh .gpu
