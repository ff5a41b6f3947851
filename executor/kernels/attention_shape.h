// AttentionShape: the shape and memory layout of one (flash) attention call, shared by the CPU reference
// and the CUDA kernels: queries of one block against keys/values of another (self-attention is the case
// seq_kv == seq_q, causal_offset 0), causal with an offset, GQA, and a v head dim of its own (MLA).
//
// Tensors, token-major, heads contiguous inside a token (elements; every tensor has its own token stride):
//   q  [b, seq_q,  n_q,  d]    q head h of token (bi, i) at q[(bi*seq_q + i) * q_stride + h * d]
//   k  [b, seq_kv, n_kv, d]    k head g of token (bi, j) at k[(bi*seq_kv + j) * k_stride + g * d]
//   v  [b, seq_kv, n_kv, d_v]  v head g of token (bi, j) at v[(bi*seq_kv + j) * v_stride + g * d_v]
//   o  [b, seq_q,  n_q,  d_v]  (and d_o) with o_stride, ready for the output projection GEMM
//   lse [b, n_q, seq_q] fp32: natural log of sum_j exp(scale * q_i.k_j) over the keys query i attends, the
//       quantity blocks are merged by: lse = log(sum_blocks exp(lse_block)), o = sum exp(lse_block - lse)
//       o_block. A query that attends no key (causal_offset < 0) gets o = 0 and lse = -inf.
//   dq, dk, dv: the layouts of q, k, v with their own strides (0: the forward tensor's).
// Query head h reads kv group h / (n_q / n_kv). Causal: query i attends keys j <= i + causal_offset
// (0 for self-attention; seq_kv - seq_q is FlashAttention's bottom-right alignment).
//
// A packed qkv activation (the output of a fused QKV GEMM) [b, s, n_q*d | n_kv*d | n_kv*d_v] is these
// tensors with q_stride = k_stride = v_stride = packed_token_stride() and k, v at packed_k_offset(),
// packed_v_offset(); the QKV weight's rows are ordered [all q heads | all k heads | all v heads].
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace megatune::executor {

struct AttentionShape {
  int64_t batch = 1;
  int64_t seq_q = 0;         // queries per sequence
  int64_t seq_kv = 0;        // keys / values per sequence; 0 means seq_q
  int64_t num_heads = 0;     // n_q
  int64_t num_kv_heads = 0;  // n_kv (query groups); divides num_heads
  int64_t head_dim = 0;      // d of q and k
  int64_t head_dim_v = 0;    // d_v of v, o; 0 means head_dim
  bool causal = true;        // query i attends keys j <= i + causal_offset
  int64_t causal_offset = 0;
  float softmax_scale = 0;  // 0 means 1/sqrt(d)
  // Strides between consecutive tokens, in elements; 0 means packed qkv (q, k, v, dq, dk, dv) or
  // contiguous n_q * d_v (o, d_o). Batch stride = seq * token stride.
  int64_t q_token_stride = 0;
  int64_t k_token_stride = 0;
  int64_t v_token_stride = 0;
  int64_t o_token_stride = 0;   // o and d_o
  int64_t dq_token_stride = 0;  // 0: q's
  int64_t dk_token_stride = 0;  // 0: k's
  int64_t dv_token_stride = 0;  // 0: v's

  int64_t kv_len() const { return seq_kv ? seq_kv : seq_q; }
  int64_t v_dim() const { return head_dim_v ? head_dim_v : head_dim; }
  float scale() const { return softmax_scale != 0 ? softmax_scale : 1.0f / std::sqrt(float(head_dim)); }
  int64_t packed_token_stride() const {
    return (num_heads + num_kv_heads) * head_dim + num_kv_heads * v_dim();
  }
  int64_t q_stride() const { return q_token_stride ? q_token_stride : packed_token_stride(); }
  int64_t k_stride() const { return k_token_stride ? k_token_stride : packed_token_stride(); }
  int64_t v_stride() const { return v_token_stride ? v_token_stride : packed_token_stride(); }
  int64_t o_stride() const { return o_token_stride ? o_token_stride : num_heads * v_dim(); }
  int64_t dq_stride() const { return dq_token_stride ? dq_token_stride : q_stride(); }
  int64_t dk_stride() const { return dk_token_stride ? dk_token_stride : k_stride(); }
  int64_t dv_stride() const { return dv_token_stride ? dv_token_stride : v_stride(); }
  // Offsets of k and v inside the packed qkv tensor (elements), for callers that hold one qkv pointer.
  int64_t packed_k_offset() const { return num_heads * head_dim; }
  int64_t packed_v_offset() const { return (num_heads + num_kv_heads) * head_dim; }
  // Keys query i attends: [0, keys_attended(i)).
  int64_t keys_attended(int64_t i) const {
    return causal ? std::clamp<int64_t>(i + causal_offset + 1, 0, kv_len()) : kv_len();
  }
  // (query, key) pairs one (batch, head) computes: sum over i of keys_attended(i), in closed form.
  double attended_pairs() const {
    const int64_t sq = seq_q, skv = kv_len();
    if (!causal) return double(sq) * double(skv);
    const int64_t a = causal_offset + 1;                           // keys_attended(i) = clamp(i + a, 0, skv)
    const int64_t ramp_begin = std::clamp<int64_t>(1 - a, 0, sq);  // first i attending >= 1 key
    const int64_t full_begin = std::clamp<int64_t>(skv - a, ramp_begin, sq);  // first i attending all
    const double n = double(full_begin - ramp_begin);
    const double ramp = n * (double(ramp_begin + a) + double(full_begin - 1 + a)) / 2;
    return ramp + double(sq - full_begin) * double(skv);
  }
  // Model FLOPs of the forward pass: S = Q K^T (2 d per pair) and O = P V (2 d_v per pair).
  double forward_flops() const {
    return 2.0 * double(batch) * double(num_heads) * attended_pairs() * double(head_dim + v_dim());
  }
  // Backward: S recomputed and dQ, dK (3 GEMMs over d), dP and dV (2 over d_v); 2.5 x forward when d_v = d.
  double backward_flops() const {
    return 2.0 * double(batch) * double(num_heads) * attended_pairs() * double(3 * head_dim + 2 * v_dim());
  }
};

// Throws std::invalid_argument when the shape is not one attention kernels accept (a programming error of
// the caller, not user input).
inline void validate_attention_shape(const AttentionShape& shape) {
  auto fail = [](const std::string& why) { throw std::invalid_argument("attention shape: " + why); };
  if (shape.batch <= 0 || shape.seq_q <= 0 || shape.kv_len() <= 0 || shape.num_heads <= 0 ||
      shape.num_kv_heads <= 0 || shape.head_dim <= 0 || shape.v_dim() <= 0)
    fail("batch, seq_q, seq_kv, num_heads, num_kv_heads, head_dim and head_dim_v must be positive");
  if (shape.num_heads % shape.num_kv_heads != 0) fail("num_kv_heads must divide num_heads");
  const int64_t qk = shape.head_dim, dv = shape.v_dim();
  if (shape.q_stride() < shape.num_heads * qk || shape.dq_stride() < shape.num_heads * qk)
    fail("q / dq token stride < num_heads * head_dim");
  if (shape.k_stride() < shape.num_kv_heads * qk || shape.dk_stride() < shape.num_kv_heads * qk)
    fail("k / dk token stride < num_kv_heads * head_dim");
  if (shape.v_stride() < shape.num_kv_heads * dv || shape.dv_stride() < shape.num_kv_heads * dv)
    fail("v / dv token stride < num_kv_heads * head_dim_v");
  if (shape.o_stride() < shape.num_heads * dv) fail("o_token_stride < num_heads * head_dim_v");
}

}  // namespace megatune::executor
