// Checked CUDA runtime / cuBLAS(Lt) calls: every failure throws std::runtime_error naming the call,
// the error and file:line. Host-side header (usable from .cpp and .cu).
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace megatune::executor::cuda {

[[noreturn]] inline void throw_cuda_error(const char* what, const char* error, const char* file, int line) {
  throw std::runtime_error(std::string(file) + ":" + std::to_string(line) + ": " + what +
                           " failed: " + error);
}

inline void check_cuda(cudaError_t status, const char* what, const char* file, int line) {
  if (status != cudaSuccess) throw_cuda_error(what, cudaGetErrorString(status), file, line);
}

inline void check_cublas(cublasStatus_t status, const char* what, const char* file, int line) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw_cuda_error(what, (std::string("cublas status ") + std::to_string(int(status))).c_str(), file, line);
  }
}

}  // namespace megatune::executor::cuda

#define MEGATUNE_CUDA_CHECK(call) ::megatune::executor::cuda::check_cuda((call), #call, __FILE__, __LINE__)
#define MEGATUNE_CUBLAS_CHECK(call) \
  ::megatune::executor::cuda::check_cublas((call), #call, __FILE__, __LINE__)
// After a kernel launch: reports launch-configuration errors at the launch site.
#define MEGATUNE_CUDA_CHECK_LAUNCH() \
  ::megatune::executor::cuda::check_cuda(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)
