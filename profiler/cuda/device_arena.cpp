// DeviceArena: a grow-only device allocation carved into aligned buffers.
#include "profiler/cuda/device_arena.h"

#include <cuda_runtime.h>

#include <stdexcept>

#include "executor/cuda/cuda_check.h"

namespace megatune::profiler::cuda {

DeviceArena::~DeviceArena() {
  if (base_ != nullptr) cudaFree(base_);
}

void DeviceArena::begin(std::size_t total_bytes) {
  if (total_bytes > capacity_) {
    if (base_ != nullptr) MEGATUNE_CUDA_CHECK(cudaFree(base_));
    base_ = nullptr;
    capacity_ = 0;
    MEGATUNE_CUDA_CHECK(cudaMalloc(&base_, total_bytes));
    capacity_ = total_bytes;
  }
  limit_ = total_bytes;
  offset_ = 0;
}

void* DeviceArena::take(std::size_t bytes) {
  const std::size_t size = rounded(bytes);
  if (offset_ + size > limit_) throw std::logic_error("DeviceArena: take() beyond the size given to begin()");
  void* out = static_cast<char*>(base_) + offset_;
  offset_ += size;
  return out;
}

}  // namespace megatune::profiler::cuda
