// Reproducible non-zero fills for benchmark buffers.
#include <cuda_bf16.h>

#include "executor/cuda/cuda_check.h"
#include "profiler/cuda/device_fill.h"

namespace megatune::profiler::cuda {
namespace {

__device__ __forceinline__ float unit_hash(std::uint64_t index, std::uint64_t seed) {
  std::uint64_t z = index * 0x9E3779B97F4A7C15ull + seed * 0xBF58476D1CE4E5B9ull + 0x94D049BB133111EBull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return float(z >> 40) * (1.0f / 16777216.0f);  // [0, 1)
}

__global__ void fill_bf16_kernel(__nv_bfloat16* x, std::int64_t count, float low, float span,
                                 std::uint64_t seed) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < count;
       i += std::int64_t(gridDim.x) * blockDim.x)
    x[i] = __float2bfloat16(low + span * unit_hash(i, seed));
}

__global__ void fill_fp32_kernel(float* x, std::int64_t count, float low, float span, std::uint64_t seed) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < count;
       i += std::int64_t(gridDim.x) * blockDim.x)
    x[i] = low + span * unit_hash(i, seed);
}

__global__ void fill_targets_kernel(std::int32_t* x, std::int64_t count, std::int32_t classes,
                                    std::uint64_t seed) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < count;
       i += std::int64_t(gridDim.x) * blockDim.x)
    x[i] = min(classes - 1, std::int32_t(unit_hash(i, seed) * float(classes)));
}

int grid_for(std::int64_t count) {
  const std::int64_t blocks = (count + 255) / 256;
  return int(blocks < 132 * 16 ? (blocks > 0 ? blocks : 1) : 132 * 16);
}

}  // namespace

void fill_uniform_bf16(void* bf16_bits, std::int64_t count, float low, float high, std::uint64_t seed,
                       cudaStream_t stream) {
  if (count <= 0) return;
  fill_bf16_kernel<<<grid_for(count), 256, 0, stream>>>(static_cast<__nv_bfloat16*>(bf16_bits), count, low,
                                                        high - low, seed);
  MEGATUNE_CUDA_CHECK_LAUNCH();
}

void fill_uniform_fp32(float* x, std::int64_t count, float low, float high, std::uint64_t seed,
                       cudaStream_t stream) {
  if (count <= 0) return;
  fill_fp32_kernel<<<grid_for(count), 256, 0, stream>>>(x, count, low, high - low, seed);
  MEGATUNE_CUDA_CHECK_LAUNCH();
}

void fill_targets_int32(std::int32_t* targets, std::int64_t count, std::int32_t classes, std::uint64_t seed,
                        cudaStream_t stream) {
  if (count <= 0) return;
  fill_targets_kernel<<<grid_for(count), 256, 0, stream>>>(targets, count, classes, seed);
  MEGATUNE_CUDA_CHECK_LAUNCH();
}

}  // namespace megatune::profiler::cuda
