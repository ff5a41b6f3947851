// Log-sum-exp merge of a partial attention output: one warp per (sequence, head, query) row.
#include "executor/cuda/attention_merge_kernels.h"
#include "executor/cuda/cuda_check.h"

namespace megatune::executor::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;

__global__ void attention_merge_kernel(AttentionMergeShape s, int64_t stride, __nv_bfloat16* out, float* lse,
                                       const __nv_bfloat16* block_out, const float* block_lse) {
  const int64_t rows = s.batch * s.heads * s.queries;
  const int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = threadIdx.x % 32;
  const int64_t i = row % s.queries, h = (row / s.queries) % s.heads, b = row / (s.queries * s.heads);
  float* running = lse + (b * s.heads + h) * s.seq + s.query_begin + i;
  const float block = block_lse[(b * s.heads + h) * s.queries + i];
  const float old = *running, high = fmaxf(old, block);
  if (high == -INFINITY) return;
  const float merged = high + logf(expf(old - high) + expf(block - high));
  const float w_old = expf(old - merged), w_block = expf(block - merged);
  __nv_bfloat16* o = out + (b * s.seq + s.query_begin + i) * stride + h * s.head_dim;
  const __nv_bfloat16* p = block_out + (b * s.queries + i) * (s.heads * s.head_dim) + h * s.head_dim;
  for (int64_t x = lane; x < s.head_dim; x += 32)
    o[x] = __float2bfloat16_rn(w_old * __bfloat162float(o[x]) + w_block * __bfloat162float(p[x]));
  __syncwarp();
  if (lane == 0) *running = merged;
}

}  // namespace

void attention_merge(const AttentionMergeShape& shape, __nv_bfloat16* out, float* lse,
                     const __nv_bfloat16* block_out, const float* block_lse, cudaStream_t stream) {
  const int64_t rows = shape.batch * shape.heads * shape.queries;
  if (rows <= 0) return;
  const int64_t blocks = (rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
  attention_merge_kernel<<<static_cast<unsigned>(blocks), kWarpsPerBlock * 32, 0, stream>>>(
      shape, shape.stride(), out, lse, block_out, block_lse);
  MEGATUNE_CUDA_CHECK_LAUNCH();
}

}  // namespace megatune::executor::cuda
