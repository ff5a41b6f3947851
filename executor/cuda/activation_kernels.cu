// GELU (tanh approximation) and SwiGLU kernels in bf16 with fp32 math.
#include "executor/cuda/activation_kernels.h"
#include "executor/cuda/cuda_check.h"
#include "executor/cuda/kernel_utils.cuh"

namespace megatune::executor::cuda {
namespace {

constexpr int kThreads = 256;
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;

__device__ __forceinline__ float gelu(float x) {
  return 0.5f * x * (1.0f + tanhf(kSqrt2OverPi * (x + kGeluCubic * x * x * x)));
}

__device__ __forceinline__ float gelu_derivative(float x) {
  const float t = tanhf(kSqrt2OverPi * (x + kGeluCubic * x * x * x));
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * x * x);
}

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

__global__ void bias_gelu_kernel(const bf16* x, const bf16* bias, bf16* pre_out, bf16* y, int64_t n,
                                 int64_t cols) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    float v = __bfloat162float(x[i]);
    if (bias != nullptr) v += __bfloat162float(bias[i % cols]);
    const bf16 pre = __float2bfloat16_rn(v);
    if (pre_out != nullptr) pre_out[i] = pre;
    // gelu of the stored (rounded) pre-activation, so the backward sees exactly what the forward used.
    y[i] = __float2bfloat16_rn(gelu(__bfloat162float(pre)));
  }
}

__global__ void gelu_backward_kernel(const bf16* dy, const bf16* pre, bf16* dx, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    dx[i] = __float2bfloat16_rn(__bfloat162float(dy[i]) * gelu_derivative(__bfloat162float(pre[i])));
}

__global__ void swiglu_kernel(const bf16* x, bf16* y, int64_t rows, int64_t f) {
  const int64_t n = rows * f;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / f, c = i - r * f;
    const float gate = __bfloat162float(x[r * 2 * f + c]), up = __bfloat162float(x[r * 2 * f + f + c]);
    y[i] = __float2bfloat16_rn(gate * sigmoid(gate) * up);
  }
}

__global__ void swiglu_backward_kernel(const bf16* dy, const bf16* x, bf16* dx, int64_t rows, int64_t f) {
  const int64_t n = rows * f;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / f, c = i - r * f;
    const float gate = __bfloat162float(x[r * 2 * f + c]), up = __bfloat162float(x[r * 2 * f + f + c]);
    const float g = __bfloat162float(dy[i]), s = sigmoid(gate);
    dx[r * 2 * f + c] = __float2bfloat16_rn(g * up * s * (1.0f + gate * (1.0f - s)));
    dx[r * 2 * f + f + c] = __float2bfloat16_rn(g * gate * s);
  }
}

}  // namespace

void bias_gelu_forward(const bf16* x, const bf16* bias, bf16* pre_out, bf16* y, int64_t rows, int64_t cols,
                       cudaStream_t stream) {
  const int64_t n = rows * cols;
  if (n <= 0) return;
  bias_gelu_kernel<<<detail::grid_for(n, kThreads), kThreads, 0, stream>>>(x, bias, pre_out, y, n, cols);
  MEGATUNE_CUDA_CHECK_LAUNCH();
}

void gelu_backward(const bf16* dy, const bf16* pre, bf16* dx, int64_t rows, int64_t cols,
                   cudaStream_t stream) {
  const int64_t n = rows * cols;
  if (n <= 0) return;
  gelu_backward_kernel<<<detail::grid_for(n, kThreads), kThreads, 0, stream>>>(dy, pre, dx, n);
  MEGATUNE_CUDA_CHECK_LAUNCH();
}

void swiglu_forward(const bf16* x, bf16* y, int64_t rows, int64_t f, cudaStream_t stream) {
  if (rows * f <= 0) return;
  swiglu_kernel<<<detail::grid_for(rows * f, kThreads), kThreads, 0, stream>>>(x, y, rows, f);
  MEGATUNE_CUDA_CHECK_LAUNCH();
}

void swiglu_backward(const bf16* dy, const bf16* x, bf16* dx, int64_t rows, int64_t f, cudaStream_t stream) {
  if (rows * f <= 0) return;
  swiglu_backward_kernel<<<detail::grid_for(rows * f, kThreads), kThreads, 0, stream>>>(dy, x, dx, rows, f);
  MEGATUNE_CUDA_CHECK_LAUNCH();
}

}  // namespace megatune::executor::cuda
