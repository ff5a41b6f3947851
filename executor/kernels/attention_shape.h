// AttentionShape: the shape and memory layout of one (flash) attention call, shared by the CPU reference
// and the CUDA kernels.
//
// Layout the engine must produce (the output of a fused QKV GEMM): one packed tensor per micro-batch
//   qkv [b, s, (n_q + 2 n_kv) * d]   token-major, heads contiguous inside a token:
//     q head h   of token (bi, si) at qkv[(bi*s + si) * T + h * d],                 h < n_q
//     k head g   of token (bi, si) at qkv[(bi*s + si) * T + (n_q + g) * d],         g < n_kv
//     v head g   of token (bi, si) at qkv[(bi*s + si) * T + (n_q + n_kv + g) * d],  g < n_kv
//   with T = token stride = (n_q + 2 n_kv) * d. So the QKV weight [(n_q + 2 n_kv) * d, h] has its rows
//   ordered [all q heads | all k heads | all v heads]. Query head h reads kv group h / (n_q / n_kv).
// Separate contiguous q [b, s, n_q, d], k/v [b, s, n_kv, d] are the same thing with other strides.
// The attention output o (and do) is [b, s, n_q, d] with token stride o_token_stride (n_q * d when
// contiguous), ready for the output projection GEMM. The log-sum-exp is lse [b, n_q, s] fp32 (natural log
// of sum_j exp(scale * q.k_j), the quantity context parallelism merges).
#pragma once
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace megatune::executor {

struct AttentionShape {
  int64_t batch = 1;
  int64_t seq_len = 0;       // s (queries and keys: self-attention)
  int64_t num_heads = 0;     // n_q
  int64_t num_kv_heads = 0;  // n_kv (query groups); divides num_heads
  int64_t head_dim = 0;      // d: 64 or 128 for the CUDA kernels, anything for the reference
  bool causal = true;        // query i attends keys j <= i
  float softmax_scale = 0;   // 0 means 1/sqrt(d)
  // Strides between consecutive tokens, in elements. Batch stride = seq_len * token stride, head stride = d.
  int64_t q_token_stride = 0;   // q and dq; 0 means packed: (n_q + 2 n_kv) * d
  int64_t kv_token_stride = 0;  // k, v, dk, dv; 0 means packed: (n_q + 2 n_kv) * d
  int64_t o_token_stride = 0;   // o and do; 0 means contiguous: n_q * d

  float scale() const { return softmax_scale != 0 ? softmax_scale : 1.0f / std::sqrt(float(head_dim)); }
  int64_t packed_token_stride() const { return (num_heads + 2 * num_kv_heads) * head_dim; }
  int64_t q_stride() const { return q_token_stride ? q_token_stride : packed_token_stride(); }
  int64_t kv_stride() const { return kv_token_stride ? kv_token_stride : packed_token_stride(); }
  int64_t o_stride() const { return o_token_stride ? o_token_stride : num_heads * head_dim; }
  // Offsets of k and v inside the packed qkv tensor (elements), for callers that hold one qkv pointer.
  int64_t packed_k_offset() const { return num_heads * head_dim; }
  int64_t packed_v_offset() const { return (num_heads + num_kv_heads) * head_dim; }
  // Model FLOPs of the forward pass (two GEMMs), causal counted half: 4 b n s^2 d (/2).
  double forward_flops() const {
    double f = 4.0 * double(batch) * double(num_heads) * double(seq_len) * double(seq_len) * double(head_dim);
    return causal ? f / 2 : f;
  }
  // Backward FLOPs by the usual convention (2.5 x forward: five GEMMs vs two).
  double backward_flops() const { return 2.5 * forward_flops(); }
};

// Throws std::invalid_argument when the shape is not one attention kernels accept (a programming error of
// the caller, not user input).
inline void validate_attention_shape(const AttentionShape& shape) {
  auto fail = [](const std::string& why) { throw std::invalid_argument("attention shape: " + why); };
  if (shape.batch <= 0 || shape.seq_len <= 0 || shape.num_heads <= 0 || shape.num_kv_heads <= 0 ||
      shape.head_dim <= 0)
    fail("batch, seq_len, num_heads, num_kv_heads and head_dim must be positive");
  if (shape.num_heads % shape.num_kv_heads != 0) fail("num_kv_heads must divide num_heads");
  if (shape.q_stride() < shape.num_heads * shape.head_dim) fail("q_token_stride < num_heads * head_dim");
  if (shape.kv_stride() < shape.num_kv_heads * shape.head_dim)
    fail("kv_token_stride < num_kv_heads * head_dim");
  if (shape.o_stride() < shape.num_heads * shape.head_dim) fail("o_token_stride < num_heads * head_dim");
}

}  // namespace megatune::executor
