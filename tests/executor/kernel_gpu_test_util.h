// Helpers of the kernel GPU tests: GPU presence (skip otherwise), device buffers with bf16/fp32 up- and
// download, NaN poisoning, random bf16-exact data and relative errors.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "executor/cuda/cuda_check.h"
#include "executor/kernels/reference_elementwise.h"

namespace megatune::executor::test {

inline bool has_gpu() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

#define MEGATUNE_REQUIRE_GPU() \
  if (!::megatune::executor::test::has_gpu()) GTEST_SKIP() << "no CUDA device"

// Random normal values already rounded to bf16 (so host reference and device see the same inputs).
inline std::vector<float> random_bf16_values(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = reference::round_to_bf16(dist(rng));
  return v;
}

template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t count) : count_(count) {
    MEGATUNE_CUDA_CHECK(cudaMalloc(&data_, std::max<size_t>(count, 1) * sizeof(T)));
  }
  ~DeviceBuffer() { cudaFree(data_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  T* get() const { return data_; }
  size_t size() const { return count_; }
  void poison() { MEGATUNE_CUDA_CHECK(cudaMemset(data_, 0xff, count_ * sizeof(T))); }  // NaN in bf16 and fp32
  void zero() { MEGATUNE_CUDA_CHECK(cudaMemset(data_, 0, count_ * sizeof(T))); }

 private:
  T* data_ = nullptr;
  size_t count_;
};

inline void upload_bf16(DeviceBuffer<__nv_bfloat16>& buffer, const std::vector<float>& values) {
  std::vector<__nv_bfloat16> host(values.size());
  for (size_t i = 0; i < values.size(); ++i) host[i] = __float2bfloat16_rn(values[i]);
  MEGATUNE_CUDA_CHECK(cudaMemcpy(buffer.get(), host.data(), host.size() * 2, cudaMemcpyHostToDevice));
}

inline std::vector<float> download_bf16(const DeviceBuffer<__nv_bfloat16>& buffer) {
  MEGATUNE_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<__nv_bfloat16> host(buffer.size());
  MEGATUNE_CUDA_CHECK(cudaMemcpy(host.data(), buffer.get(), host.size() * 2, cudaMemcpyDeviceToHost));
  std::vector<float> values(host.size());
  for (size_t i = 0; i < host.size(); ++i) values[i] = __bfloat162float(host[i]);
  return values;
}

template <typename T>
inline void upload(DeviceBuffer<T>& buffer, const std::vector<T>& values) {
  MEGATUNE_CUDA_CHECK(
      cudaMemcpy(buffer.get(), values.data(), values.size() * sizeof(T), cudaMemcpyHostToDevice));
}

template <typename T>
inline std::vector<T> download(const DeviceBuffer<T>& buffer) {
  MEGATUNE_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<T> host(buffer.size());
  MEGATUNE_CUDA_CHECK(cudaMemcpy(host.data(), buffer.get(), host.size() * sizeof(T), cudaMemcpyDeviceToHost));
  return host;
}

// ||got - want|| / ||want|| over the elements where mask(i) is true; NaN anywhere -> +inf.
template <typename Mask>
double relative_error(const std::vector<float>& got, const std::vector<float>& want, Mask mask) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!mask(i)) continue;
    if (!std::isfinite(got[i])) return INFINITY;
    diff += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    norm += double(want[i]) * want[i];
  }
  return norm == 0 ? std::sqrt(diff) : std::sqrt(diff / norm);
}

inline double relative_error(const std::vector<float>& got, const std::vector<float>& want) {
  return relative_error(got, want, [](size_t) { return true; });
}

}  // namespace megatune::executor::test
