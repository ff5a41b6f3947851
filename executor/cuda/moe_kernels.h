// MoE token permutation kernels in bf16: the gather of a token-major activation into the expert-sorted rows,
// the per-token combine of the experts' rows (weighted by the routing probabilities, or unweighted: the
// permutation's backward) and the combine's backward. Same math as reference_moe.h; deterministic (each token
// sums its own k rows in choice order, fp32 accumulation, no atomics).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace megatune::executor::cuda {

using bf16 = __nv_bfloat16;

// Whether the kernels take rows of `hidden` columns (16-byte accesses: a multiple of 8 columns).
inline bool moe_kernels_support(int64_t hidden) { return hidden > 0 && hidden % 8 == 0; }

// out [rows, hidden] : out[r] = x[row_token[r]]. x, out contiguous, 16-byte aligned.
void moe_permute(const bf16* x, const int32_t* row_token, int64_t rows, int64_t hidden, bf16* out,
                 cudaStream_t stream);

// out [tokens, hidden] : out[t] = sum_j w[t, j] * rows[token_rows[t, j]] (j in order; -1: no row; w =
// token_probs [tokens, topk], or 1 when null).
void moe_unpermute(const bf16* rows, const int32_t* token_rows, const float* token_probs, int64_t tokens,
                   int topk, int64_t hidden, bf16* out, cudaStream_t stream);

// The weighted combine's backward: d_rows[token_rows[t, j]] = w[t, j] * d_out[t]; d_probs [tokens, topk]
// fp32 = <d_out[t], rows[token_rows[t, j]]> (0 where there is no row). Rows no token reads are not written.
void moe_unpermute_backward(const bf16* d_out, const bf16* rows, const int32_t* token_rows,
                            const float* token_probs, int64_t tokens, int topk, int64_t hidden, bf16* d_rows,
                            float* d_probs, cudaStream_t stream);

}  // namespace megatune::executor::cuda
