// CPU reference MoE token permutation: rows of a token-major activation copied to the expert-sorted rows
// the experts read, and the experts' rows combined back per token (weighted by the routing
// probabilities), with the combine's backward.
#pragma once
#include <cstdint>

namespace megatune::executor::reference {

// out (R, h): out[r] = x[row_token[r]] for x (T, h).
void moe_permute(const float* x, const std::int32_t* row_token, std::int64_t rows, std::int64_t hidden,
                 float* out);

// out (T, h): out[t] = sum_j w[t, j] * rows[token_rows[t, j]] over the k choices of token t (token_rows
// (T, k), -1: no row; w = token_probs (T, k), or 1 when token_probs is null). Sums in choice order.
void moe_unpermute(const float* rows, const std::int32_t* token_rows, const float* token_probs,
                   std::int64_t tokens, int topk, std::int64_t hidden, float* out);

// The backward of the weighted moe_unpermute: d_rows[token_rows[t, j]] = w[t, j] * d_out[t] and
// d_probs[t, j] = <d_out[t], rows[token_rows[t, j]]> (0 where there is no row). Rows no token reads keep
// their d_rows value.
void moe_unpermute_backward(const float* d_out, const float* rows, const std::int32_t* token_rows,
                            const float* token_probs, std::int64_t tokens, int topk, std::int64_t hidden,
                            float* d_rows, float* d_probs);

}  // namespace megatune::executor::reference
