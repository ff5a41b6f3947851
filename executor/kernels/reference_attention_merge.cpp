// CPU reference: log-sum-exp merge of a block's partial attention output into the running output.
#include "executor/kernels/reference_attention_merge.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace megatune::executor::reference {

void attention_merge(const AttentionMergeShape& s, float* out, float* lse, const float* block_out,
                     const float* block_lse) {
  const std::int64_t width = s.heads * s.head_dim;
  for (std::int64_t b = 0; b < s.batch; ++b)
    for (std::int64_t h = 0; h < s.heads; ++h)
      for (std::int64_t i = 0; i < s.queries; ++i) {
        float& running = lse[(b * s.heads + h) * s.seq + s.query_begin + i];
        const float block = block_lse[(b * s.heads + h) * s.queries + i];
        const float high = std::max(running, block);
        if (high == -std::numeric_limits<float>::infinity()) continue;
        const float merged = high + std::log(std::exp(running - high) + std::exp(block - high));
        const float w_running = std::exp(running - merged), w_block = std::exp(block - merged);
        float* o = out + (b * s.seq + s.query_begin + i) * s.stride() + h * s.head_dim;
        const float* p = block_out + (b * s.queries + i) * width + h * s.head_dim;
        for (std::int64_t x = 0; x < s.head_dim; ++x) o[x] = w_running * o[x] + w_block * p[x];
        running = merged;
      }
}

}  // namespace megatune::executor::reference
