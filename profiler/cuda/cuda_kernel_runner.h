// CudaKernelRunner: times the executor's own CUDA work on the current device: GEMMs through
// executor::cuda::GemmRunner (the same specs, epilogues and cached heuristic algorithm as the engine),
// flash attention forward/backward, and the norm, activation, RoPE, element-wise, FP8 cast, cross-entropy,
// grad-norm and AdamW kernels; FP8 GEMMs as the executor's FP8 linears run them. Each repeat runs in its own
// tracer range; the times are the ranges' device busy times from the Tracer (CUPTI), never host clocks.
// Inputs are random, not zeros.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <functional>

#include "executor/cuda/gemm_runner.h"
#include "profiler/cuda/device_arena.h"
#include "profiler/microbenchmark_runner.h"
#include "profiler/tracer.h"

namespace megatune::profiler::cuda {

class CudaKernelRunner : public KernelRunner {
 public:
  // `stream` 0 is the default stream. External ids start at `first_range_id` (distinct per process when
  // several share a trace).
  explicit CudaKernelRunner(Tracer& tracer, cudaStream_t stream = nullptr,
                            std::uint64_t first_range_id = std::uint64_t(1) << 32);

  TimingSamples time_gemm(const GemmItem& item, const RepeatPolicy& policy) override;
  TimingSamples time_attention(const AttentionItem& item, const RepeatPolicy& policy) override;
  TimingSamples time_memory_bound(const MemoryBoundItem& item, const RepeatPolicy& policy) override;

  // Runs `launch` policy.warmup times untraced-range, then policy.repeats times each in its own range;
  // returns the per-repeat device times in seconds.
  std::vector<double> time_launches(const std::function<void()>& launch, const RepeatPolicy& policy);

  executor::cuda::GemmRunner& gemm_runner() { return gemm_; }
  DeviceArena& arena() { return arena_; }
  cudaStream_t stream() const { return stream_; }

 private:
  TimingSamples time_fp8_gemm(const GemmItem& item, const RepeatPolicy& policy);
  TimingSamples time_fp8_cast(const MemoryBoundItem& item, const RepeatPolicy& policy);
  // Random bf16 values written to `bf16_source`, then cast by the executor's FP8 cast (current scaling) into
  // `fp8` ([rows, cols], E4M3) with `state`'s scale: finite, non-zero FP8 operands.
  void cast_random_fp8(void* bf16_source, void* fp8, float* state, std::int64_t rows, std::int64_t cols);
  // A GEMM's buffers in the arena (operands of element_bytes each, the output, GELU aux, bias and bias
  // gradient vectors, then extra_bytes handed out in *extra), aux, bias and an fp32 output filled, beta set
  // for the weight gradient's accumulation; the operands are left for the caller to fill.
  executor::cuda::GemmArgs gemm_buffers(const GemmItem& item, const executor::cuda::GemmSpec& spec,
                                        std::size_t element_bytes, std::size_t extra_bytes, void** extra);
  Tracer& tracer_;
  cudaStream_t stream_;
  std::uint64_t next_range_id_;
  executor::cuda::GemmRunner gemm_;
  DeviceArena arena_;
  std::uint64_t fill_seed_ = 1;
};

}  // namespace megatune::profiler::cuda
