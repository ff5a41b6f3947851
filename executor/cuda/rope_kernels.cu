// RoPE kernels, angles in fp32 with accurate sincosf. The main kernel gives a thread 8 rotation pairs of one
// token: it computes their 8 angles once and rotates those pairs in every q and k head (16-byte loads of both
// halves), so the sincosf cost is shared by all heads and the pass is memory-bound. Shapes it cannot take
// (half the head dim not a multiple of 8, unaligned strides) use one thread per (token, head, pair).
#include <stdexcept>

#include "executor/cuda/cuda_check.h"
#include "executor/cuda/kernel_utils.cuh"
#include "executor/cuda/rope_kernels.h"

namespace megatune::executor::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void rope_kernel(bf16* base, int64_t token_stride, int64_t heads, int64_t seq_len, int64_t tokens,
                            int64_t head_dim, float theta, int64_t position_offset, float direction,
                            RopeScaling scaling) {
  const int64_t half = head_dim / 2;
  const int64_t total = tokens * heads * half;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = idx % half;
    const int64_t head = (idx / half) % heads;
    const int64_t token = idx / (half * heads);
    const float position = float(position_offset + token % seq_len);
    const float inv_freq = rope_inv_freq(i, head_dim, theta, scaling);
    float s, c;
    sincosf(position * inv_freq, &s, &c);
    c *= scaling.concentration;
    s *= direction * scaling.concentration;
    bf16* x = base + token * token_stride + head * head_dim;
    const float x1 = __bfloat162float(x[i]), x2 = __bfloat162float(x[i + half]);
    x[i] = __float2bfloat16_rn(x1 * c - x2 * s);
    x[i + half] = __float2bfloat16_rn(x2 * c + x1 * s);
  }
}

__global__ void rope_vector_kernel(bf16* q, bf16* k, int64_t q_stride, int64_t kv_stride, int q_heads,
                                   int kv_heads, int64_t seq_len, int64_t tokens, int head_dim, float theta,
                                   int64_t position_offset, float direction, RopeScaling scaling) {
  const int half = head_dim / 2, groups = half / 8;
  const int64_t total = tokens * groups;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int first = int(idx % groups) * 8;
    const int64_t token = idx / groups;
    const float position = float(position_offset + token % seq_len);
    float c[8], s[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const float inv_freq = rope_inv_freq(first + e, head_dim, theta, scaling);
      sincosf(position * inv_freq, &s[e], &c[e]);
      c[e] *= scaling.concentration;
      s[e] *= direction * scaling.concentration;
    }
    for (int h = 0; h < q_heads + kv_heads; ++h) {
      bf16* x = h < q_heads ? q + token * q_stride + int64_t(h) * head_dim
                            : k + token * kv_stride + int64_t(h - q_heads) * head_dim;
      auto* lo = reinterpret_cast<detail::Bf16x8*>(x + first);
      auto* hi = reinterpret_cast<detail::Bf16x8*>(x + half + first);
      float x1[8], x2[8], y1[8], y2[8];
      detail::unpack(*lo, x1);
      detail::unpack(*hi, x2);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        y1[e] = x1[e] * c[e] - x2[e] * s[e];
        y2[e] = x2[e] * c[e] + x1[e] * s[e];
      }
      *lo = detail::pack(y1);
      *hi = detail::pack(y2);
    }
  }
}

bool vector_path(const AttentionShape& shape, const bf16* q, const bf16* k) {
  auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return (shape.head_dim / 2) % 8 == 0 && shape.q_stride() % 8 == 0 && shape.k_stride() % 8 == 0 &&
         (q == nullptr || aligned(q)) && (k == nullptr || aligned(k));
}

void launch(const AttentionShape& shape, bf16* q, bf16* k, float theta, int64_t position_offset,
            float direction, cudaStream_t stream, const RopeScaling& scaling) {
  validate_attention_shape(shape);
  if (shape.head_dim % 2 != 0) throw std::invalid_argument("rope: head_dim must be even");
  const int64_t tokens = shape.batch * shape.seq_q, half = shape.head_dim / 2;
  if (vector_path(shape, q, k)) {
    const int q_heads = q != nullptr ? int(shape.num_heads) : 0;
    const int kv_heads = k != nullptr ? int(shape.num_kv_heads) : 0;
    rope_vector_kernel<<<detail::grid_for(tokens * (half / 8), kThreads), kThreads, 0, stream>>>(
        q, k, shape.q_stride(), shape.k_stride(), q_heads, kv_heads, shape.seq_q, tokens, int(shape.head_dim),
        theta, position_offset, direction, scaling);
    MEGATUNE_CUDA_CHECK_LAUNCH();
    return;
  }
  if (q != nullptr) {
    rope_kernel<<<detail::grid_for(tokens * shape.num_heads * half, kThreads), kThreads, 0, stream>>>(
        q, shape.q_stride(), shape.num_heads, shape.seq_q, tokens, shape.head_dim, theta, position_offset,
        direction, scaling);
    MEGATUNE_CUDA_CHECK_LAUNCH();
  }
  if (k != nullptr) {
    rope_kernel<<<detail::grid_for(tokens * shape.num_kv_heads * half, kThreads), kThreads, 0, stream>>>(
        k, shape.k_stride(), shape.num_kv_heads, shape.seq_q, tokens, shape.head_dim, theta, position_offset,
        direction, scaling);
    MEGATUNE_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace

void rope_forward_inplace(const AttentionShape& shape, bf16* q, bf16* k, float theta, int64_t position_offset,
                          cudaStream_t stream, const RopeScaling& scaling) {
  launch(shape, q, k, theta, position_offset, 1.0f, stream, scaling);
}

void rope_backward_inplace(const AttentionShape& shape, bf16* dq, bf16* dk, float theta,
                           int64_t position_offset, cudaStream_t stream, const RopeScaling& scaling) {
  launch(shape, dq, dk, theta, position_offset, -1.0f, stream, scaling);
}

}  // namespace megatune::executor::cuda
