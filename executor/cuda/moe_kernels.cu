// MoE permutation kernels: one block per row (permute) or per token (combine and its backward), eight
// columns (16 bytes) per access, fp32 accumulation in choice order.
#include <algorithm>

#include "executor/cuda/cuda_check.h"
#include "executor/cuda/kernel_utils.cuh"
#include "executor/cuda/moe_kernels.h"

namespace megatune::executor::cuda {
namespace {

using detail::Bf16x8;

constexpr int kThreads = 256;

unsigned threads_for(int64_t vectors) {
  const int64_t warps = (vectors + 31) / 32;
  return unsigned(std::min<int64_t>(kThreads, std::max<int64_t>(32, warps * 32)));
}

__global__ void permute_kernel(const bf16* x, const int32_t* row_token, int64_t hidden, bf16* out) {
  const int64_t r = blockIdx.x;
  const auto* src = reinterpret_cast<const Bf16x8*>(x + int64_t(row_token[r]) * hidden);
  auto* dst = reinterpret_cast<Bf16x8*>(out + r * hidden);
  for (int64_t v = threadIdx.x; v < hidden / 8; v += blockDim.x) dst[v] = src[v];
}

__global__ void unpermute_kernel(const bf16* rows, const int32_t* token_rows, const float* token_probs,
                                 int topk, int64_t hidden, bf16* out) {
  const int64_t t = blockIdx.x;
  const int32_t* choice_rows = token_rows + t * topk;
  auto* dst = reinterpret_cast<Bf16x8*>(out + t * hidden);
  for (int64_t v = threadIdx.x; v < hidden / 8; v += blockDim.x) {
    float sum[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int j = 0; j < topk; ++j) {
      const int32_t r = choice_rows[j];
      if (r < 0) continue;
      const float w = token_probs == nullptr ? 1.0f : token_probs[t * topk + j];
      float value[8];
      detail::unpack(reinterpret_cast<const Bf16x8*>(rows + int64_t(r) * hidden)[v], value);
#pragma unroll
      for (int i = 0; i < 8; ++i) sum[i] += w * value[i];
    }
    dst[v] = detail::pack(sum);
  }
}

__global__ void unpermute_backward_kernel(const bf16* d_out, const bf16* rows, const int32_t* token_rows,
                                          const float* token_probs, int topk, int64_t hidden, bf16* d_rows,
                                          float* d_probs) {
  const int64_t t = blockIdx.x;
  const auto* dy = reinterpret_cast<const Bf16x8*>(d_out + t * hidden);
  for (int j = 0; j < topk; ++j) {
    const int32_t r = token_rows[t * topk + j];
    if (r < 0) {  // uniform over the block
      if (threadIdx.x == 0) d_probs[t * topk + j] = 0.0f;
      continue;
    }
    const float w = token_probs[t * topk + j];
    const auto* src = reinterpret_cast<const Bf16x8*>(rows + int64_t(r) * hidden);
    auto* dst = reinterpret_cast<Bf16x8*>(d_rows + int64_t(r) * hidden);
    float dot = 0.0f;
    for (int64_t v = threadIdx.x; v < hidden / 8; v += blockDim.x) {
      float g[8], value[8], scaled[8];
      detail::unpack(dy[v], g);
      detail::unpack(src[v], value);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        scaled[i] = w * g[i];
        dot += g[i] * value[i];
      }
      dst[v] = detail::pack(scaled);
    }
    dot = detail::block_sum(dot);
    if (threadIdx.x == 0) d_probs[t * topk + j] = dot;
  }
}

}  // namespace

void moe_permute(const bf16* x, const int32_t* row_token, int64_t rows, int64_t hidden, bf16* out,
                 cudaStream_t stream) {
  if (rows <= 0) return;
  permute_kernel<<<unsigned(rows), threads_for(hidden / 8), 0, stream>>>(x, row_token, hidden, out);
  MEGATUNE_CUDA_CHECK_LAUNCH();
}

void moe_unpermute(const bf16* rows, const int32_t* token_rows, const float* token_probs, int64_t tokens,
                   int topk, int64_t hidden, bf16* out, cudaStream_t stream) {
  if (tokens <= 0) return;
  unpermute_kernel<<<unsigned(tokens), threads_for(hidden / 8), 0, stream>>>(rows, token_rows, token_probs,
                                                                             topk, hidden, out);
  MEGATUNE_CUDA_CHECK_LAUNCH();
}

void moe_unpermute_backward(const bf16* d_out, const bf16* rows, const int32_t* token_rows,
                            const float* token_probs, int64_t tokens, int topk, int64_t hidden, bf16* d_rows,
                            float* d_probs, cudaStream_t stream) {
  if (tokens <= 0) return;
  unpermute_backward_kernel<<<unsigned(tokens), threads_for(hidden / 8), 0, stream>>>(
      d_out, rows, token_rows, token_probs, topk, hidden, d_rows, d_probs);
  MEGATUNE_CUDA_CHECK_LAUNCH();
}

}  // namespace megatune::executor::cuda
