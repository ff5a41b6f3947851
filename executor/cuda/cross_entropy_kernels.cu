// Fused cross-entropy: one block per token row; pass 1 keeps a per-thread online (max, sum-exp) over 16-byte
// vectors of bf16 logits, merged across the block; pass 2 rewrites the row as the scaled gradient.
#include <stdexcept>

#include "executor/cuda/cross_entropy_kernels.h"
#include "executor/cuda/cuda_check.h"
#include "executor/cuda/kernel_utils.cuh"

namespace megatune::executor::cuda {
namespace {

using detail::Bf16x8;
constexpr int kThreads = 512;

__global__ void cross_entropy_kernel(bf16* logits, const int32_t* targets, float* loss, int64_t vocab,
                                     bool write_gradient, float grad_scale) {
  const int64_t row = blockIdx.x;
  const int32_t target = targets[row];
  auto* row_v = reinterpret_cast<Bf16x8*>(logits + row * vocab);
  const int64_t vectors = vocab / 8;
  if (target < 0 || target >= vocab) {  // ignored (out-of-range targets are rejected by the data checks)
    if (threadIdx.x == 0) loss[row] = 0.0f;
    if (write_gradient) {
      const float zeros[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int64_t v = threadIdx.x; v < vectors; v += blockDim.x) row_v[v] = detail::pack(zeros);
    }
    return;
  }
  float thread_max = -INFINITY, thread_sum = 0.0f;
  for (int64_t v = threadIdx.x; v < vectors; v += blockDim.x) {
    float a[8];
    detail::unpack(row_v[v], a);
    float vector_max = a[0];
#pragma unroll
    for (int i = 1; i < 8; ++i) vector_max = fmaxf(vector_max, a[i]);
    if (vector_max > thread_max) {
      thread_sum *= __expf(thread_max - vector_max);
      thread_max = vector_max;
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) thread_sum += __expf(a[i] - thread_max);
  }
  const float row_max = detail::block_max(thread_max);
  const float scaled = thread_max == -INFINITY ? 0.0f : thread_sum * __expf(thread_max - row_max);
  const float row_sum = detail::block_sum(scaled);
  const float lse = row_max + logf(row_sum);
  if (threadIdx.x == 0) loss[row] = lse - __bfloat162float(logits[row * vocab + target]);
  if (!write_gradient) return;
  __syncthreads();  // everyone has read the target logit before it is overwritten
  for (int64_t v = threadIdx.x; v < vectors; v += blockDim.x) {
    float a[8];
    detail::unpack(row_v[v], a);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float onehot = (v * 8 + i == target) ? 1.0f : 0.0f;
      a[i] = (__expf(a[i] - lse) - onehot) * grad_scale;
    }
    row_v[v] = detail::pack(a);
  }
}

}  // namespace

void cross_entropy_forward_backward(bf16* logits, const int32_t* targets, float* loss, int64_t tokens,
                                    int64_t vocab, bool write_gradient, float grad_scale,
                                    cudaStream_t stream) {
  if (vocab % 8 != 0) throw std::invalid_argument("cross_entropy: vocab must be a multiple of 8 (pad it)");
  if (!detail::aligned16(logits))
    throw std::invalid_argument("cross_entropy: logits must be 16-byte aligned");
  if (tokens <= 0) return;
  cross_entropy_kernel<<<unsigned(tokens), kThreads, 0, stream>>>(logits, targets, loss, vocab,
                                                                  write_gradient, grad_scale);
  MEGATUNE_CUDA_CHECK_LAUNCH();
}

}  // namespace megatune::executor::cuda
