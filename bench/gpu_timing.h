// Helpers of the GPU benchmarks: the median time of a body over CUDA events (after warm-up runs), a
// checked cudaMalloc and random bf16 device data.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "executor/cuda/cuda_check.h"

namespace megatune::bench {

// Median milliseconds of body over repeats runs on the default stream, after warmup untimed runs.
inline double median_ms(const std::function<void()>& body, int warmup, int repeats) {
  for (int i = 0; i < warmup; ++i) body();
  cudaEvent_t start = nullptr, stop = nullptr;
  MEGATUNE_CUDA_CHECK(cudaEventCreate(&start));
  MEGATUNE_CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<float> times;
  for (int i = 0; i < repeats; ++i) {
    MEGATUNE_CUDA_CHECK(cudaEventRecord(start));
    body();
    MEGATUNE_CUDA_CHECK(cudaEventRecord(stop));
    MEGATUNE_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    MEGATUNE_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    times.push_back(ms);
  }
  MEGATUNE_CUDA_CHECK(cudaEventDestroy(start));
  MEGATUNE_CUDA_CHECK(cudaEventDestroy(stop));
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

template <typename T>
T* device_alloc(std::size_t n) {
  T* p = nullptr;
  MEGATUNE_CUDA_CHECK(cudaMalloc(&p, n * sizeof(T)));
  return p;
}

// n standard-normal bf16 values: a block of up to 2^20 drawn on the host, repeated over the buffer.
inline void fill_random(__nv_bfloat16* device, std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<__nv_bfloat16> host(std::min<std::size_t>(n, std::size_t(1) << 20));
  for (auto& x : host) x = __float2bfloat16_rn(dist(rng));
  for (std::size_t at = 0; at < n; at += host.size()) {
    const std::size_t count = std::min(host.size(), n - at);
    MEGATUNE_CUDA_CHECK(
        cudaMemcpy(device + at, host.data(), count * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice));
  }
}

}  // namespace megatune::bench
