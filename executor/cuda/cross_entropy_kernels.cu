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

// Vocab-parallel passes (see cross_entropy_kernels.h): one block per row, 16-byte vectors.
__global__ void row_max_kernel(const bf16* logits, float* row_max, int64_t vocab) {
  const int64_t row = blockIdx.x;
  const auto* row_v = reinterpret_cast<const Bf16x8*>(logits + row * vocab);
  float m = -INFINITY;
  for (int64_t v = threadIdx.x; v < vocab / 8; v += blockDim.x) {
    float a[8];
    detail::unpack(row_v[v], a);
#pragma unroll
    for (int i = 0; i < 8; ++i) m = fmaxf(m, a[i]);
  }
  m = detail::block_max(m);
  if (threadIdx.x == 0) row_max[row] = m;
}

__device__ __forceinline__ int64_t local_target(int32_t target, int64_t vocab, int64_t vocab_offset) {
  const int64_t local = int64_t(target) - vocab_offset;
  return target >= 0 && local >= 0 && local < vocab ? local : -1;
}

__global__ void target_sum_exp_kernel(const bf16* logits, const int32_t* targets, const float* row_max,
                                      float* target_logit, float* sum_exp, int64_t vocab,
                                      int64_t vocab_offset) {
  const int64_t row = blockIdx.x;
  const auto* row_v = reinterpret_cast<const Bf16x8*>(logits + row * vocab);
  const float m = row_max[row];
  float sum = 0.0f;
  for (int64_t v = threadIdx.x; v < vocab / 8; v += blockDim.x) {
    float a[8];
    detail::unpack(row_v[v], a);
#pragma unroll
    for (int i = 0; i < 8; ++i) sum += __expf(a[i] - m);
  }
  sum = detail::block_sum(sum);
  if (threadIdx.x == 0) {
    sum_exp[row] = sum;
    const int64_t local = local_target(targets[row], vocab, vocab_offset);
    target_logit[row] = local >= 0 ? __bfloat162float(logits[row * vocab + local]) : 0.0f;
  }
}

__global__ void finish_kernel(bf16* logits, const int32_t* targets, const float* row_max,
                              const float* target_logit, const float* sum_exp, float* loss, int64_t vocab,
                              int64_t vocab_offset, float grad_scale) {
  const int64_t row = blockIdx.x;
  auto* row_v = reinterpret_cast<Bf16x8*>(logits + row * vocab);
  const bool masked = targets[row] < 0;
  const float lse = row_max[row] + logf(sum_exp[row]);
  if (threadIdx.x == 0) loss[row] = masked ? 0.0f : lse - target_logit[row];
  const int64_t local = local_target(targets[row], vocab, vocab_offset);
  for (int64_t v = threadIdx.x; v < vocab / 8; v += blockDim.x) {
    float a[8];
    detail::unpack(row_v[v], a);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float onehot = (v * 8 + i == local) ? 1.0f : 0.0f;
      a[i] = masked ? 0.0f : (__expf(a[i] - lse) - onehot) * grad_scale;
    }
    row_v[v] = detail::pack(a);
  }
}

void check_logits(const bf16* logits, int64_t vocab) {
  if (vocab % 8 != 0) throw std::invalid_argument("cross_entropy: vocab must be a multiple of 8 (pad it)");
  if (!detail::aligned16(logits))
    throw std::invalid_argument("cross_entropy: logits must be 16-byte aligned");
}

}  // namespace

void cross_entropy_row_max(const bf16* logits, float* row_max, int64_t tokens, int64_t vocab,
                           cudaStream_t stream) {
  check_logits(logits, vocab);
  if (tokens <= 0) return;
  row_max_kernel<<<unsigned(tokens), kThreads, 0, stream>>>(logits, row_max, vocab);
  MEGATUNE_CUDA_CHECK_LAUNCH();
}

void cross_entropy_target_sum_exp(const bf16* logits, const int32_t* targets, const float* row_max,
                                  float* target_logit, float* sum_exp, int64_t tokens, int64_t vocab,
                                  int64_t vocab_offset, cudaStream_t stream) {
  check_logits(logits, vocab);
  if (tokens <= 0) return;
  target_sum_exp_kernel<<<unsigned(tokens), kThreads, 0, stream>>>(logits, targets, row_max, target_logit,
                                                                   sum_exp, vocab, vocab_offset);
  MEGATUNE_CUDA_CHECK_LAUNCH();
}

void cross_entropy_finish(bf16* logits, const int32_t* targets, const float* row_max,
                          const float* target_logit, const float* sum_exp, float* loss, int64_t tokens,
                          int64_t vocab, int64_t vocab_offset, float grad_scale, cudaStream_t stream) {
  check_logits(logits, vocab);
  if (tokens <= 0) return;
  finish_kernel<<<unsigned(tokens), kThreads, 0, stream>>>(logits, targets, row_max, target_logit, sum_exp,
                                                           loss, vocab, vocab_offset, grad_scale);
  MEGATUNE_CUDA_CHECK_LAUNCH();
}

void cross_entropy_forward_backward(bf16* logits, const int32_t* targets, float* loss, int64_t tokens,
                                    int64_t vocab, bool write_gradient, float grad_scale,
                                    cudaStream_t stream) {
  check_logits(logits, vocab);
  if (tokens <= 0) return;
  cross_entropy_kernel<<<unsigned(tokens), kThreads, 0, stream>>>(logits, targets, loss, vocab,
                                                                  write_gradient, grad_scale);
  MEGATUNE_CUDA_CHECK_LAUNCH();
}

}  // namespace megatune::executor::cuda
