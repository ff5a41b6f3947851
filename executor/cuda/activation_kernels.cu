// GELU (tanh approximation) and SwiGLU kernels in bf16 with fp32 math (16-byte vectorized where aligned).
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

// Vectorized variants: each thread moves 8 bf16 (16 bytes) per access, so the kernels run at memory
// bandwidth. Used when the widths are multiples of 8 and the pointers 16-byte aligned (the arena's are).
using detail::Bf16x8;

__global__ void gelu_vec_kernel(const Bf16x8* x, Bf16x8* y, int64_t n8) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n8;
       i += int64_t(gridDim.x) * blockDim.x) {
    float v[8];
    detail::unpack(x[i], v);
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = gelu(v[j]);
    y[i] = detail::pack(v);
  }
}

__global__ void gelu_backward_vec_kernel(const Bf16x8* dy, const Bf16x8* pre, Bf16x8* dx, int64_t n8) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n8;
       i += int64_t(gridDim.x) * blockDim.x) {
    float g[8], p[8];
    detail::unpack(dy[i], g);
    detail::unpack(pre[i], p);
#pragma unroll
    for (int j = 0; j < 8; ++j) g[j] *= gelu_derivative(p[j]);
    dx[i] = detail::pack(g);
  }
}

// Row r of x holds f8 = f / 8 gate vectors then f8 up vectors.
__global__ void swiglu_vec_kernel(const Bf16x8* x, Bf16x8* y, int64_t rows, int64_t f8) {
  const int64_t n8 = rows * f8;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n8;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / f8, c = i - r * f8;
    float gate[8], up[8];
    detail::unpack(x[r * 2 * f8 + c], gate);
    detail::unpack(x[r * 2 * f8 + f8 + c], up);
#pragma unroll
    for (int j = 0; j < 8; ++j) gate[j] = gate[j] * sigmoid(gate[j]) * up[j];
    y[i] = detail::pack(gate);
  }
}

__global__ void swiglu_backward_vec_kernel(const Bf16x8* dy, const Bf16x8* x, Bf16x8* dx, int64_t rows,
                                           int64_t f8) {
  const int64_t n8 = rows * f8;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n8;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / f8, c = i - r * f8;
    float gate[8], up[8], g[8], d_gate[8], d_up[8];
    detail::unpack(x[r * 2 * f8 + c], gate);
    detail::unpack(x[r * 2 * f8 + f8 + c], up);
    detail::unpack(dy[i], g);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float s = sigmoid(gate[j]);
      d_gate[j] = g[j] * up[j] * s * (1.0f + gate[j] * (1.0f - s));
      d_up[j] = g[j] * gate[j] * s;
    }
    dx[r * 2 * f8 + c] = detail::pack(d_gate);
    dx[r * 2 * f8 + f8 + c] = detail::pack(d_up);
  }
}

// Backward + recomputed output. Each thread reads all its inputs before writing, so outputs may alias inputs
// element for element (no __restrict__).
__global__ void gelu_backward_recompute_kernel(const bf16* dy, const bf16* pre, bf16* dx, bf16* y,
                                               int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float p = __bfloat162float(pre[i]), g = __bfloat162float(dy[i]);
    dx[i] = __float2bfloat16_rn(g * gelu_derivative(p));
    y[i] = __float2bfloat16_rn(gelu(p));
  }
}

__global__ void gelu_backward_recompute_vec_kernel(const Bf16x8* dy, const Bf16x8* pre, Bf16x8* dx, Bf16x8* y,
                                                   int64_t n8) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n8;
       i += int64_t(gridDim.x) * blockDim.x) {
    float g[8], p[8];
    detail::unpack(dy[i], g);
    detail::unpack(pre[i], p);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      g[j] *= gelu_derivative(p[j]);
      p[j] = gelu(p[j]);
    }
    dx[i] = detail::pack(g);
    y[i] = detail::pack(p);
  }
}

__global__ void swiglu_backward_recompute_kernel(const bf16* dy, const bf16* x, bf16* dx, bf16* y,
                                                 int64_t rows, int64_t f) {
  const int64_t n = rows * f;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / f, c = i - r * f;
    const float gate = __bfloat162float(x[r * 2 * f + c]), up = __bfloat162float(x[r * 2 * f + f + c]);
    const float g = __bfloat162float(dy[i]), s = sigmoid(gate);
    dx[r * 2 * f + c] = __float2bfloat16_rn(g * up * s * (1.0f + gate * (1.0f - s)));
    dx[r * 2 * f + f + c] = __float2bfloat16_rn(g * gate * s);
    y[i] = __float2bfloat16_rn(gate * s * up);
  }
}

__global__ void swiglu_backward_recompute_vec_kernel(const Bf16x8* dy, const Bf16x8* x, Bf16x8* dx, Bf16x8* y,
                                                     int64_t rows, int64_t f8) {
  const int64_t n8 = rows * f8;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n8;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / f8, c = i - r * f8;
    float gate[8], up[8], g[8], d_gate[8], d_up[8], out[8];
    detail::unpack(x[r * 2 * f8 + c], gate);
    detail::unpack(x[r * 2 * f8 + f8 + c], up);
    detail::unpack(dy[i], g);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float s = sigmoid(gate[j]);
      d_gate[j] = g[j] * up[j] * s * (1.0f + gate[j] * (1.0f - s));
      d_up[j] = g[j] * gate[j] * s;
      out[j] = gate[j] * s * up[j];
    }
    dx[r * 2 * f8 + c] = detail::pack(d_gate);
    dx[r * 2 * f8 + f8 + c] = detail::pack(d_up);
    y[i] = detail::pack(out);
  }
}

bool vectorizable(int64_t width, const void* a, const void* b, const void* c = nullptr) {
  return width % 8 == 0 && detail::aligned16(a) && detail::aligned16(b) &&
         (c == nullptr || detail::aligned16(c));
}

}  // namespace

void bias_gelu_forward(const bf16* x, const bf16* bias, bf16* pre_out, bf16* y, int64_t rows, int64_t cols,
                       cudaStream_t stream) {
  const int64_t n = rows * cols;
  if (n <= 0) return;
  if (bias == nullptr && pre_out == nullptr && vectorizable(cols, x, y)) {
    gelu_vec_kernel<<<detail::grid_for(n / 8, kThreads), kThreads, 0, stream>>>(
        reinterpret_cast<const Bf16x8*>(x), reinterpret_cast<Bf16x8*>(y), n / 8);
    MEGATUNE_CUDA_CHECK_LAUNCH();
    return;
  }
  bias_gelu_kernel<<<detail::grid_for(n, kThreads), kThreads, 0, stream>>>(x, bias, pre_out, y, n, cols);
  MEGATUNE_CUDA_CHECK_LAUNCH();
}

void gelu_backward(const bf16* dy, const bf16* pre, bf16* dx, int64_t rows, int64_t cols,
                   cudaStream_t stream) {
  const int64_t n = rows * cols;
  if (n <= 0) return;
  if (vectorizable(cols, dy, pre, dx)) {
    gelu_backward_vec_kernel<<<detail::grid_for(n / 8, kThreads), kThreads, 0, stream>>>(
        reinterpret_cast<const Bf16x8*>(dy), reinterpret_cast<const Bf16x8*>(pre),
        reinterpret_cast<Bf16x8*>(dx), n / 8);
    MEGATUNE_CUDA_CHECK_LAUNCH();
    return;
  }
  gelu_backward_kernel<<<detail::grid_for(n, kThreads), kThreads, 0, stream>>>(dy, pre, dx, n);
  MEGATUNE_CUDA_CHECK_LAUNCH();
}

void swiglu_forward(const bf16* x, bf16* y, int64_t rows, int64_t f, cudaStream_t stream) {
  if (rows * f <= 0) return;
  if (vectorizable(f, x, y)) {
    swiglu_vec_kernel<<<detail::grid_for(rows * f / 8, kThreads), kThreads, 0, stream>>>(
        reinterpret_cast<const Bf16x8*>(x), reinterpret_cast<Bf16x8*>(y), rows, f / 8);
    MEGATUNE_CUDA_CHECK_LAUNCH();
    return;
  }
  swiglu_kernel<<<detail::grid_for(rows * f, kThreads), kThreads, 0, stream>>>(x, y, rows, f);
  MEGATUNE_CUDA_CHECK_LAUNCH();
}

void swiglu_backward(const bf16* dy, const bf16* x, bf16* dx, int64_t rows, int64_t f, cudaStream_t stream) {
  if (rows * f <= 0) return;
  if (vectorizable(f, dy, x, dx)) {
    swiglu_backward_vec_kernel<<<detail::grid_for(rows * f / 8, kThreads), kThreads, 0, stream>>>(
        reinterpret_cast<const Bf16x8*>(dy), reinterpret_cast<const Bf16x8*>(x),
        reinterpret_cast<Bf16x8*>(dx), rows, f / 8);
    MEGATUNE_CUDA_CHECK_LAUNCH();
    return;
  }
  swiglu_backward_kernel<<<detail::grid_for(rows * f, kThreads), kThreads, 0, stream>>>(dy, x, dx, rows, f);
  MEGATUNE_CUDA_CHECK_LAUNCH();
}

void gelu_backward_recompute(const bf16* dy, const bf16* pre, bf16* dx, bf16* y, int64_t rows, int64_t cols,
                             cudaStream_t stream) {
  const int64_t n = rows * cols;
  if (n <= 0) return;
  if (vectorizable(cols, dy, pre, dx) && detail::aligned16(y)) {
    gelu_backward_recompute_vec_kernel<<<detail::grid_for(n / 8, kThreads), kThreads, 0, stream>>>(
        reinterpret_cast<const Bf16x8*>(dy), reinterpret_cast<const Bf16x8*>(pre),
        reinterpret_cast<Bf16x8*>(dx), reinterpret_cast<Bf16x8*>(y), n / 8);
  } else {
    gelu_backward_recompute_kernel<<<detail::grid_for(n, kThreads), kThreads, 0, stream>>>(dy, pre, dx, y, n);
  }
  MEGATUNE_CUDA_CHECK_LAUNCH();
}

void swiglu_backward_recompute(const bf16* dy, const bf16* x, bf16* dx, bf16* y, int64_t rows, int64_t f,
                               cudaStream_t stream) {
  if (rows * f <= 0) return;
  if (vectorizable(f, dy, x, dx) && detail::aligned16(y)) {
    swiglu_backward_recompute_vec_kernel<<<detail::grid_for(rows * f / 8, kThreads), kThreads, 0, stream>>>(
        reinterpret_cast<const Bf16x8*>(dy), reinterpret_cast<const Bf16x8*>(x),
        reinterpret_cast<Bf16x8*>(dx), reinterpret_cast<Bf16x8*>(y), rows, f / 8);
  } else {
    swiglu_backward_recompute_kernel<<<detail::grid_for(rows * f, kThreads), kThreads, 0, stream>>>(
        dy, x, dx, y, rows, f);
  }
  MEGATUNE_CUDA_CHECK_LAUNCH();
}

}  // namespace megatune::executor::cuda
