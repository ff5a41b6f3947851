// CPU reference of the log-sum-exp merge of a partial attention output (executor/kernels/attention_merge.h).
#pragma once
#include "executor/kernels/attention_merge.h"

namespace megatune::executor::reference {

// Merges block_out / block_lse into out / lse in place (layouts of attention_merge.h).
void attention_merge(const AttentionMergeShape& shape, float* out, float* lse, const float* block_out,
                     const float* block_lse);

}  // namespace megatune::executor::reference
