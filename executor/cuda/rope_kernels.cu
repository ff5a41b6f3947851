// RoPE kernels: one thread per (token, head, rotation pair), angles in fp32 with accurate sincosf.
#include <stdexcept>

#include "executor/cuda/cuda_check.h"
#include "executor/cuda/kernel_utils.cuh"
#include "executor/cuda/rope_kernels.h"

namespace megatune::executor::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void rope_kernel(bf16* base, int64_t token_stride, int64_t heads, int64_t seq_len, int64_t tokens,
                            int64_t head_dim, float theta, int64_t position_offset, float direction) {
  const int64_t half = head_dim / 2;
  const int64_t total = tokens * heads * half;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = idx % half;
    const int64_t head = (idx / half) % heads;
    const int64_t token = idx / (half * heads);
    const float position = float(position_offset + token % seq_len);
    const float inv_freq = 1.0f / powf(theta, float(2 * i) / float(head_dim));
    float s, c;
    sincosf(position * inv_freq, &s, &c);
    s *= direction;
    bf16* x = base + token * token_stride + head * head_dim;
    const float x1 = __bfloat162float(x[i]), x2 = __bfloat162float(x[i + half]);
    x[i] = __float2bfloat16_rn(x1 * c - x2 * s);
    x[i + half] = __float2bfloat16_rn(x2 * c + x1 * s);
  }
}

void launch(const AttentionShape& shape, bf16* q, bf16* k, float theta, int64_t position_offset,
            float direction, cudaStream_t stream) {
  validate_attention_shape(shape);
  if (shape.head_dim % 2 != 0) throw std::invalid_argument("rope: head_dim must be even");
  const int64_t tokens = shape.batch * shape.seq_len, half = shape.head_dim / 2;
  if (q != nullptr) {
    rope_kernel<<<detail::grid_for(tokens * shape.num_heads * half, kThreads), kThreads, 0, stream>>>(
        q, shape.q_stride(), shape.num_heads, shape.seq_len, tokens, shape.head_dim, theta, position_offset,
        direction);
    MEGATUNE_CUDA_CHECK_LAUNCH();
  }
  if (k != nullptr) {
    rope_kernel<<<detail::grid_for(tokens * shape.num_kv_heads * half, kThreads), kThreads, 0, stream>>>(
        k, shape.kv_stride(), shape.num_kv_heads, shape.seq_len, tokens, shape.head_dim, theta,
        position_offset, direction);
    MEGATUNE_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace

void rope_forward_inplace(const AttentionShape& shape, bf16* q, bf16* k, float theta, int64_t position_offset,
                          cudaStream_t stream) {
  launch(shape, q, k, theta, position_offset, 1.0f, stream);
}

void rope_backward_inplace(const AttentionShape& shape, bf16* dq, bf16* dk, float theta,
                           int64_t position_offset, cudaStream_t stream) {
  launch(shape, dq, dk, theta, position_offset, -1.0f, stream);
}

}  // namespace megatune::executor::cuda
