// The shape of a log-sum-exp merge of a partial attention output (one key block's) into a running one, as
// context parallelism's ring merges its blocks; shared by the CPU reference and the CUDA kernel.
//
// Running output out [batch, seq, heads * head_dim] (token stride out_stride) and lse [batch, heads, seq]
// fp32; the block covers queries [query_begin, query_begin + queries) of every sequence: block_out
// [batch, queries, heads * head_dim] (contiguous) and block_lse [batch, heads, queries] fp32. Per (query,
// head):
//   lse' = log(exp(lse) + exp(block_lse)),  out' = exp(lse - lse') out + exp(block_lse - lse') block_out.
// A row with lse' = -inf (no key attended in either) keeps out = 0.
#pragma once
#include <cstdint>

namespace megatune::executor {

struct AttentionMergeShape {
  std::int64_t batch = 1, seq = 0, heads = 0, head_dim = 0;
  std::int64_t query_begin = 0, queries = 0;
  std::int64_t out_stride = 0;  // 0: heads * head_dim
  std::int64_t stride() const { return out_stride ? out_stride : heads * head_dim; }
};

}  // namespace megatune::executor
