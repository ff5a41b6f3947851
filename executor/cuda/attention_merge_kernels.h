// Log-sum-exp merge of a partial attention output (context parallelism's ring) on the GPU: bf16 outputs,
// fp32 log-sum-exp, fp32 math (layouts of executor/kernels/attention_merge.h).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "executor/kernels/attention_merge.h"

namespace megatune::executor::cuda {

void attention_merge(const AttentionMergeShape& shape, __nv_bfloat16* out, float* lse,
                     const __nv_bfloat16* block_out, const float* block_lse, cudaStream_t stream);

}  // namespace megatune::executor::cuda
