// Helpers of the GPU benchmarks: the median time of a body over CUDA events (after warm-up runs) and a
// checked cudaMalloc.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <functional>
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

}  // namespace megatune::bench
