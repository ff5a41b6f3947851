#!/bin/bash
# Copies the executables the profiler's GPU call needs from a CUDA build into .gpu-profiler/ (ignored through .git/info/exclude).
set -eu
BUILD=${1:-build-profiler-cuda}
mkdir -p .gpu-profiler
cp "$BUILD/bin/megatune" "$BUILD/bin/bench_profiler_gpu" "$BUILD/tests/profiler_cupti_tracer_gpu_test" .gpu-profiler/
strip --strip-debug .gpu-profiler/* 2>/dev/null || true
ls -la .gpu-profiler
