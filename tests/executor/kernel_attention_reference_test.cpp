// Tests of the CPU reference attention: closed forms, causal masking, GQA and the backward against
// finite differences.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "executor/kernels/reference_attention.h"

namespace megatune::executor::reference {
namespace {

std::vector<float> random_vector(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

struct Packed {
  AttentionShape shape;
  std::vector<float> qkv;
  float* q() { return qkv.data(); }
  float* k() { return qkv.data() + shape.packed_k_offset(); }
  float* v() { return qkv.data() + shape.packed_v_offset(); }
};

Packed make(AttentionShape shape, uint32_t seed) {
  return Packed{shape, random_vector(shape.batch * shape.seq_len * shape.packed_token_stride(), seed)};
}

TEST(ReferenceAttention, FirstCausalRowCopiesFirstValueAndLseIsScore) {
  Packed p =
      make({.batch = 1, .seq_len = 4, .num_heads = 2, .num_kv_heads = 1, .head_dim = 4, .causal = true}, 1);
  std::vector<float> o(4 * 2 * 4), lse(2 * 4);
  attention_forward(p.shape, p.q(), p.k(), p.v(), o.data(), lse.data());
  for (int h = 0; h < 2; ++h) {
    for (int x = 0; x < 4; ++x) EXPECT_NEAR(o[h * 4 + x], p.v()[x], 1e-6);
    double score = 0;
    for (int x = 0; x < 4; ++x) score += p.q()[h * 4 + x] * p.k()[x];
    EXPECT_NEAR(lse[h * 4 + 0], score * 0.5, 1e-5);
  }
}

TEST(ReferenceAttention, GqaEqualsRepeatedKvHeads) {
  // n_q = 4, n_kv = 2 must equal n_q = 4, n_kv = 4 with kv heads repeated (0,0,1,1).
  AttentionShape gqa{
      .batch = 2, .seq_len = 5, .num_heads = 4, .num_kv_heads = 2, .head_dim = 4, .causal = false};
  Packed p = make(gqa, 2);
  AttentionShape mha = gqa;
  mha.num_kv_heads = 4;
  Packed r{mha, std::vector<float>(size_t(2 * 5 * mha.packed_token_stride()))};
  for (int64_t tok = 0; tok < 10; ++tok) {
    for (int64_t h = 0; h < 4; ++h)
      for (int64_t x = 0; x < 4; ++x) {
        const float* src = p.qkv.data() + tok * gqa.packed_token_stride();
        float* dst = r.qkv.data() + tok * mha.packed_token_stride();
        dst[h * 4 + x] = src[h * 4 + x];
        dst[mha.packed_k_offset() + h * 4 + x] = src[gqa.packed_k_offset() + (h / 2) * 4 + x];
        dst[mha.packed_v_offset() + h * 4 + x] = src[gqa.packed_v_offset() + (h / 2) * 4 + x];
      }
  }
  std::vector<float> o1(10 * 16), o2(10 * 16), l1(2 * 4 * 5), l2(2 * 4 * 5);
  attention_forward(gqa, p.q(), p.k(), p.v(), o1.data(), l1.data());
  attention_forward(mha, r.q(), r.k(), r.v(), o2.data(), l2.data());
  for (size_t i = 0; i < o1.size(); ++i) EXPECT_NEAR(o1[i], o2[i], 1e-6);
  for (size_t i = 0; i < l1.size(); ++i) EXPECT_NEAR(l1[i], l2[i], 1e-6);
}

class ReferenceAttentionBackward : public ::testing::TestWithParam<bool> {};

TEST_P(ReferenceAttentionBackward, MatchesNumericGradient) {
  AttentionShape shape{
      .batch = 1, .seq_len = 5, .num_heads = 4, .num_kv_heads = 2, .head_dim = 4, .causal = GetParam()};
  Packed p = make(shape, 3);
  const int64_t o_size = shape.seq_len * shape.num_heads * shape.head_dim;
  std::vector<float> o(o_size), lse(shape.num_heads * shape.seq_len), r = random_vector(o_size, 4);
  auto loss = [&] {
    attention_forward(shape, p.q(), p.k(), p.v(), o.data(), lse.data());
    double s = 0;
    for (int64_t i = 0; i < o_size; ++i) s += double(o[i]) * r[i];
    return s;
  };
  loss();
  std::vector<float> dqkv(p.qkv.size(), NAN);
  attention_backward(shape, p.q(), p.k(), p.v(), o.data(), lse.data(), r.data(), dqkv.data(),
                     dqkv.data() + shape.packed_k_offset(), dqkv.data() + shape.packed_v_offset());
  const float h = 1e-3f;
  for (size_t i = 0; i < p.qkv.size(); ++i) {
    const float saved = p.qkv[i];
    p.qkv[i] = saved + h;
    const double plus = loss();
    p.qkv[i] = saved - h;
    const double minus = loss();
    p.qkv[i] = saved;
    EXPECT_NEAR(dqkv[i], (plus - minus) / (2 * h), 5e-3) << "element " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Causal, ReferenceAttentionBackward, ::testing::Bool());

TEST(ReferenceAttention, RejectsBadShapes) {
  std::vector<float> buf(1000);
  AttentionShape bad{.batch = 1, .seq_len = 2, .num_heads = 3, .num_kv_heads = 2, .head_dim = 4};
  EXPECT_THROW(attention_forward(bad, buf.data(), buf.data(), buf.data(), buf.data(), buf.data()),
               std::invalid_argument);
}

}  // namespace
}  // namespace megatune::executor::reference
