// Tests of the CPU reference attention: closed forms, causal masking, GQA and the backward against
// finite differences; blocks of queries against blocks of keys (seq_q != seq_kv, causal offsets, a v head
// dim of its own) against a naive softmax, and key blocks merged by their log-sum-exp against the whole.
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
  return Packed{shape, random_vector(shape.batch * shape.seq_q * shape.packed_token_stride(), seed)};
}

TEST(ReferenceAttention, FirstCausalRowCopiesFirstValueAndLseIsScore) {
  Packed p =
      make({.batch = 1, .seq_q = 4, .num_heads = 2, .num_kv_heads = 1, .head_dim = 4, .causal = true}, 1);
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
      .batch = 2, .seq_q = 5, .num_heads = 4, .num_kv_heads = 2, .head_dim = 4, .causal = false};
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
      .batch = 1, .seq_q = 5, .num_heads = 4, .num_kv_heads = 2, .head_dim = 4, .causal = GetParam()};
  Packed p = make(shape, 3);
  const int64_t o_size = shape.seq_q * shape.num_heads * shape.head_dim;
  std::vector<float> o(o_size), lse(shape.num_heads * shape.seq_q), r = random_vector(o_size, 4);
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

// Separate q [b, seq_q, n_q, d], k [b, seq_kv, n_kv, d], v [b, seq_kv, n_kv, d_v], each with a padded
// token stride of its own.
struct Separate {
  AttentionShape shape;
  std::vector<float> q, k, v;
};

Separate make_separate(AttentionShape shape, uint32_t seed) {
  shape.q_token_stride = shape.num_heads * shape.head_dim + 3;
  shape.k_token_stride = shape.num_kv_heads * shape.head_dim + 1;
  shape.v_token_stride = shape.num_kv_heads * shape.v_dim() + 2;
  shape.o_token_stride = shape.num_heads * shape.v_dim() + 5;
  return Separate{shape, random_vector(shape.batch * shape.seq_q * shape.q_stride(), seed),
                  random_vector(shape.batch * shape.kv_len() * shape.k_stride(), seed + 1),
                  random_vector(shape.batch * shape.kv_len() * shape.v_stride(), seed + 2)};
}

struct Output {
  std::vector<float> o, lse;
};

Output forward(const Separate& p) {
  const AttentionShape& s = p.shape;
  Output out{std::vector<float>(s.batch * s.seq_q * s.o_stride()),
             std::vector<float>(s.batch * s.num_heads * s.seq_q)};
  attention_forward(s, p.q.data(), p.k.data(), p.v.data(), out.o.data(), out.lse.data());
  return out;
}

// softmax(scale q k^T + mask) v written out directly: the score matrix of one (batch, head), a mask from
// the shape's causal rule, a row softmax.
double naive_output(const Separate& p, int64_t b, int64_t h, int64_t i, int64_t x, double* lse) {
  const AttentionShape& s = p.shape;
  const int64_t g = h / (s.num_heads / s.num_kv_heads);
  std::vector<double> score;
  for (int64_t j = 0; j < s.kv_len(); ++j) {
    if (s.causal && j > i + s.causal_offset) break;
    double dot = 0;
    for (int64_t c = 0; c < s.head_dim; ++c)
      dot += p.q[(b * s.seq_q + i) * s.q_stride() + h * s.head_dim + c] *
             p.k[(b * s.kv_len() + j) * s.k_stride() + g * s.head_dim + c];
    score.push_back(dot * s.scale());
  }
  double sum = 0, out = 0;
  for (size_t j = 0; j < score.size(); ++j) {
    sum += std::exp(score[j]);
    out += std::exp(score[j]) * p.v[(b * s.kv_len() + int64_t(j)) * s.v_stride() + g * s.v_dim() + x];
  }
  *lse = std::log(sum);
  return score.empty() ? 0.0 : out / sum;
}

struct BlockCase {
  int64_t seq_q, seq_kv, head_dim, head_dim_v;
  bool causal;
  int64_t causal_offset;
};

class ReferenceAttentionBlocks : public ::testing::TestWithParam<BlockCase> {
 protected:
  AttentionShape shape() const {
    const BlockCase c = GetParam();
    return {.batch = 2,
            .seq_q = c.seq_q,
            .seq_kv = c.seq_kv,
            .num_heads = 4,
            .num_kv_heads = 2,
            .head_dim = c.head_dim,
            .head_dim_v = c.head_dim_v,
            .causal = c.causal,
            .causal_offset = c.causal_offset};
  }
};

TEST_P(ReferenceAttentionBlocks, ForwardMatchesNaiveSoftmax) {
  const Separate p = make_separate(shape(), 11);
  const AttentionShape& s = p.shape;
  const Output out = forward(p);
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.num_heads; ++h)
      for (int64_t i = 0; i < s.seq_q; ++i) {
        double lse = 0;
        for (int64_t x = 0; x < s.v_dim(); ++x)
          EXPECT_NEAR(out.o[(b * s.seq_q + i) * s.o_stride() + h * s.v_dim() + x],
                      naive_output(p, b, h, i, x, &lse), 1e-5);
        const float got = out.lse[(b * s.num_heads + h) * s.seq_q + i];
        if (s.keys_attended(i) == 0) {
          EXPECT_TRUE(std::isinf(got) && got < 0) << "a query without keys has lse -inf";
        } else {
          EXPECT_NEAR(got, lse, 1e-5);
        }
      }
}

TEST_P(ReferenceAttentionBlocks, BackwardMatchesNumericGradient) {
  Separate p = make_separate(shape(), 21);
  const AttentionShape& s = p.shape;
  const std::vector<float> r = random_vector(s.batch * s.seq_q * s.o_stride(), 22);
  auto loss = [&] {
    const Output out = forward(p);
    double sum = 0;
    for (size_t i = 0; i < out.o.size(); ++i) sum += double(out.o[i]) * r[i];
    return sum;
  };
  const Output out = forward(p);
  std::vector<float> dq(p.q.size(), 0.0f), dk(p.k.size(), 0.0f), dv(p.v.size(), 0.0f);
  attention_backward(s, p.q.data(), p.k.data(), p.v.data(), out.o.data(), out.lse.data(), r.data(), dq.data(),
                     dk.data(), dv.data());
  const float step = 1e-3f;
  for (auto [x, dx] : {std::pair{&p.q, &dq}, {&p.k, &dk}, {&p.v, &dv}}) {
    for (size_t i = 0; i < x->size(); i += 3) {  // every third element keeps the test fast
      const float saved = (*x)[i];
      (*x)[i] = saved + step;
      const double plus = loss();
      (*x)[i] = saved - step;
      const double minus = loss();
      (*x)[i] = saved;
      EXPECT_NEAR((*dx)[i], (plus - minus) / (2 * step), 5e-3) << "element " << i;
    }
  }
}

// Keys split at `split` into two blocks (the second's causal offset shifted by split): each block's forward,
// merged by the log-sum-exp, equals the whole; each block's backward from the merged o and lse, dq summed
// and dk, dv side by side, equals the whole's backward.
TEST_P(ReferenceAttentionBlocks, KeyBlocksMergedByLseEqualTheWhole) {
  const Separate whole = make_separate(shape(), 31);
  const AttentionShape& s = whole.shape;
  const int64_t split = s.kv_len() / 2, d = s.head_dim, dv = s.v_dim();
  auto block = [&](int64_t first, int64_t keys) {
    Separate part{s, whole.q, {}, {}};
    part.shape.seq_kv = keys;
    part.shape.causal_offset = s.causal_offset - first;
    for (int64_t b = 0; b < s.batch; ++b)
      for (int64_t j = first; j < first + keys; ++j) {
        const float* k_row = whole.k.data() + (b * s.kv_len() + j) * s.k_stride();
        const float* v_row = whole.v.data() + (b * s.kv_len() + j) * s.v_stride();
        part.k.insert(part.k.end(), k_row, k_row + s.k_stride());
        part.v.insert(part.v.end(), v_row, v_row + s.v_stride());
      }
    return part;
  };
  const Separate first = block(0, split), second = block(split, s.kv_len() - split);
  const Output full = forward(whole), a = forward(first), b = forward(second);
  Output merged{std::vector<float>(full.o.size(), 0.0f), std::vector<float>(full.lse.size())};
  for (int64_t bi = 0; bi < s.batch; ++bi)
    for (int64_t h = 0; h < s.num_heads; ++h)
      for (int64_t i = 0; i < s.seq_q; ++i) {
        const int64_t at = (bi * s.num_heads + h) * s.seq_q + i,
                      o_at = (bi * s.seq_q + i) * s.o_stride() + h * dv;
        const double hi = std::max(a.lse[at], b.lse[at]);
        if (std::isinf(hi) && hi < 0) {
          merged.lse[at] = float(hi);
          continue;
        }
        const double wa = std::exp(a.lse[at] - hi), wb = std::exp(b.lse[at] - hi);
        merged.lse[at] = float(hi + std::log(wa + wb));
        for (int64_t x = 0; x < dv; ++x)
          merged.o[o_at + x] = float((wa * a.o[o_at + x] + wb * b.o[o_at + x]) / (wa + wb));
        EXPECT_NEAR(merged.lse[at], full.lse[at], 1e-5);
        for (int64_t x = 0; x < dv; ++x) EXPECT_NEAR(merged.o[o_at + x], full.o[o_at + x], 1e-5);
      }

  const std::vector<float> d_o = random_vector(full.o.size(), 32);
  auto backward = [&](const Separate& p, const Output& out, std::vector<float>& dq, std::vector<float>& dk,
                      std::vector<float>& d_v) {
    dq.assign(p.q.size(), 0.0f);
    dk.assign(p.k.size(), 0.0f);
    d_v.assign(p.v.size(), 0.0f);
    attention_backward(p.shape, p.q.data(), p.k.data(), p.v.data(), out.o.data(), out.lse.data(), d_o.data(),
                       dq.data(), dk.data(), d_v.data());
  };
  std::vector<float> dq, dk, dv_full, dq_a, dk_a, dv_a, dq_b, dk_b, dv_b;
  backward(whole, full, dq, dk, dv_full);
  backward(first, merged, dq_a, dk_a, dv_a);
  backward(second, merged, dq_b, dk_b, dv_b);
  for (size_t i = 0; i < dq.size(); ++i) EXPECT_NEAR(dq_a[i] + dq_b[i], dq[i], 1e-4) << "dq " << i;
  for (int64_t bi = 0; bi < s.batch; ++bi)
    for (int64_t j = 0; j < s.kv_len(); ++j) {
      const bool in_first = j < split;
      const int64_t local = (bi * (in_first ? split : s.kv_len() - split) + (in_first ? j : j - split));
      for (int64_t x = 0; x < s.num_kv_heads * d; ++x)
        EXPECT_NEAR((in_first ? dk_a : dk_b)[local * s.k_stride() + x],
                    dk[(bi * s.kv_len() + j) * s.k_stride() + x], 1e-4);
      for (int64_t x = 0; x < s.num_kv_heads * dv; ++x)
        EXPECT_NEAR((in_first ? dv_a : dv_b)[local * s.v_stride() + x],
                    dv_full[(bi * s.kv_len() + j) * s.v_stride() + x], 1e-4);
    }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, ReferenceAttentionBlocks,
    ::testing::Values(BlockCase{3, 5, 4, 4, false, 0},   // fewer queries than keys, no mask
                      BlockCase{5, 3, 4, 6, false, 0},   // more queries than keys, d_v > d
                      BlockCase{4, 6, 6, 4, true, 2},    // bottom-right alignment (seq_kv - seq_q)
                      BlockCase{6, 4, 4, 4, true, -2},   // the first two queries attend no key
                      BlockCase{4, 4, 4, 2, true, 0},    // self-attention, d_v < d
                      BlockCase{4, 8, 4, 4, true, 5}));  // a later query block

TEST(ReferenceAttention, BottomRightCausalBlockEqualsTheLastRowsOfSelfAttention) {
  // The last 3 queries of a causal self-attention over 7 tokens = those 3 queries against all 7 keys with
  // causal offset 7 - 3.
  AttentionShape self{
      .batch = 1, .seq_q = 7, .num_heads = 2, .num_kv_heads = 1, .head_dim = 4, .causal = true};
  Packed p = make(self, 41);
  std::vector<float> o(7 * 2 * 4), lse(2 * 7);
  attention_forward(self, p.q(), p.k(), p.v(), o.data(), lse.data());
  AttentionShape tail = self;
  tail.seq_q = 3;
  tail.seq_kv = 7;
  tail.causal_offset = 4;
  tail.q_token_stride = tail.k_token_stride = tail.v_token_stride = self.packed_token_stride();
  std::vector<float> o_tail(3 * 2 * 4), lse_tail(2 * 3);
  attention_forward(tail, p.q() + 4 * self.packed_token_stride(), p.k(), p.v(), o_tail.data(),
                    lse_tail.data());
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t x = 0; x < 2 * 4; ++x) EXPECT_NEAR(o_tail[i * 8 + x], o[(4 + i) * 8 + x], 1e-6);
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t i = 0; i < 3; ++i) EXPECT_NEAR(lse_tail[h * 3 + i], lse[h * 7 + 4 + i], 1e-6);
}

TEST(AttentionShape, AttendedPairsAndFlopsCountTheMaskedPairsOnly) {
  for (int64_t sq : {1, 4, 9})
    for (int64_t skv : {1, 5, 9})
      for (int64_t offset = -12; offset <= 12; ++offset) {
        AttentionShape s{.batch = 2,
                         .seq_q = sq,
                         .seq_kv = skv,
                         .num_heads = 3,
                         .num_kv_heads = 1,
                         .head_dim = 8,
                         .head_dim_v = 4,
                         .causal = true,
                         .causal_offset = offset};
        int64_t pairs = 0;
        for (int64_t i = 0; i < sq; ++i)
          for (int64_t j = 0; j < skv; ++j) pairs += j <= i + offset ? 1 : 0;
        EXPECT_EQ(s.attended_pairs(), double(pairs)) << sq << " " << skv << " " << offset;
        EXPECT_EQ(s.forward_flops(), 2.0 * 2 * 3 * double(pairs) * (8 + 4));
        EXPECT_EQ(s.backward_flops(), 2.0 * 2 * 3 * double(pairs) * (3 * 8 + 2 * 4));
        s.causal = false;
        EXPECT_EQ(s.attended_pairs(), double(sq * skv));
      }
  AttentionShape self{.batch = 1, .seq_q = 1024, .num_heads = 1, .num_kv_heads = 1, .head_dim = 64};
  EXPECT_EQ(self.backward_flops(), 2.5 * self.forward_flops());
}

TEST(ReferenceAttention, RejectsBadShapes) {
  std::vector<float> buf(1000);
  AttentionShape bad{.batch = 1, .seq_q = 2, .num_heads = 3, .num_kv_heads = 2, .head_dim = 4};
  EXPECT_THROW(attention_forward(bad, buf.data(), buf.data(), buf.data(), buf.data(), buf.data()),
               std::invalid_argument);
}

}  // namespace
}  // namespace megatune::executor::reference
