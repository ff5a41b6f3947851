// Filling benchmark buffers with reproducible non-zero data (timing on zeros flatters kernels): uniform
// bf16 / fp32 values from a counter hash, and int32 class targets.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace megatune::profiler::cuda {

// x[i] uniform in [low, high) as bf16 (`bf16_bits` points to 2-byte elements).
void fill_uniform_bf16(void* bf16_bits, std::int64_t count, float low, float high, std::uint64_t seed,
                       cudaStream_t stream);
void fill_uniform_fp32(float* x, std::int64_t count, float low, float high, std::uint64_t seed,
                       cudaStream_t stream);
// targets[i] uniform in [0, classes).
void fill_targets_int32(std::int32_t* targets, std::int64_t count, std::int32_t classes, std::uint64_t seed,
                        cudaStream_t stream);

}  // namespace megatune::profiler::cuda
