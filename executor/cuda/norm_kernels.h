// Fused LayerNorm / RMSNorm kernels (bf16 in/out, fp32 statistics): forward with optional residual add,
// backward with a deterministic two-stage reduction for dgamma/dbeta. Same math as reference_norm.h.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "executor/kernels/norm_kind.h"

namespace megatune::executor::cuda {

using bf16 = __nv_bfloat16;

// hidden must be a multiple of 8 and at most 32768.
bool norm_supports(int64_t hidden);

// sum_out = x + residual (when residual != null; sum_out may alias x), y = norm(sum) * gamma (+ beta).
// x, residual, sum_out, y: [rows, hidden] bf16; gamma, beta [hidden] bf16 (beta may be null; RMSNorm
// ignores it); mean [rows] fp32 (LayerNorm only, may be null for RMSNorm), rstd [rows] fp32.
void norm_forward(NormKind kind, const bf16* x, const bf16* residual, const bf16* gamma, const bf16* beta,
                  bf16* y, bf16* sum_out, float* mean, float* rstd, int64_t rows, int64_t hidden, float eps,
                  cudaStream_t stream);

// y = norm(x) * gamma (+ beta) from the statistics norm_forward stored for this x (mean may be null for
// RMSNorm): a recompute of the forward's output without its reductions; the same bits as norm_forward's y.
void norm_apply(NormKind kind, const bf16* x, const bf16* gamma, const bf16* beta, const float* mean,
                const float* rstd, bf16* y, int64_t rows, int64_t hidden, cudaStream_t stream);

size_t norm_backward_workspace_bytes(int64_t rows, int64_t hidden);

// dx [rows, hidden] bf16 = norm backward of dy given the norm's input (the sum when residual was fused)
// (+ d_residual [rows, hidden] when not null; dx may alias d_residual). dgamma, dbeta [hidden] fp32
// (main grads): overwritten, or added to with accumulate; dbeta may be null. Deterministic.
// kernel: kFused (default; rows up to 8192 wide, wider ones use kSeparate) reads dy and input once per
// chunk of rows for dx and the dgamma/dbeta partials; kSeparate runs the partials and dx as two passes.
// Both give the same dgamma/dbeta bit for bit.
enum class NormBackwardKernel { kFused, kSeparate };
void norm_backward(NormKind kind, const bf16* dy, const bf16* input, const bf16* gamma, const float* mean,
                   const float* rstd, const bf16* d_residual, bf16* dx, float* dgamma, float* dbeta,
                   int64_t rows, int64_t hidden, bool accumulate, void* workspace, size_t workspace_bytes,
                   cudaStream_t stream, NormBackwardKernel kernel = NormBackwardKernel::kFused);

}  // namespace megatune::executor::cuda
