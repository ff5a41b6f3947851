// Tests of the CPU reference kernels (norms, RoPE, activations, embedding, cross-entropy, AdamW, GEMM,
// element-wise) against finite differences and closed forms.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "executor/kernels/reference_activation.h"
#include "executor/kernels/reference_cross_entropy.h"
#include "executor/kernels/reference_elementwise.h"
#include "executor/kernels/reference_embedding.h"
#include "executor/kernels/reference_gemm.h"
#include "executor/kernels/reference_norm.h"
#include "executor/kernels/reference_optimizer.h"
#include "executor/kernels/reference_rope.h"

namespace megatune::executor::reference {
namespace {

std::vector<float> random_vector(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

double dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += double(a[i]) * b[i];
  return s;
}

// Central finite difference of f at x[i].
double numeric_derivative(std::vector<float>& x, size_t i, const std::function<double()>& f,
                          float h = 1e-2f) {
  const float saved = x[i];
  x[i] = saved + h;
  const double plus = f();
  x[i] = saved - h;
  const double minus = f();
  x[i] = saved;
  return (plus - minus) / (2.0 * h);
}

TEST(ReferenceGemm, LinearMatchesLoops) {
  const int64_t m = 5, n = 7, k = 3;
  auto x = random_vector(m * k, 1), w = random_vector(n * k, 2), bias = random_vector(n, 3);
  std::vector<float> y(m * n);
  linear_forward(x.data(), w.data(), bias.data(), y.data(), m, n, k);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double expected = bias[j];
      for (int64_t t = 0; t < k; ++t) expected += double(x[i * k + t]) * w[j * k + t];
      EXPECT_NEAR(y[i * n + j], expected, 1e-5);
    }
  // Backward: L = sum(y * r); dL/dx = r . w, dL/dw = r^T . x, dL/db = colsum(r).
  auto r = random_vector(m * n, 4);
  std::vector<float> dx(m * k), dw(n * k, 1.0f), db(n, 2.0f);
  linear_backward_data(r.data(), w.data(), dx.data(), m, n, k);
  linear_backward_weight(r.data(), x.data(), dw.data(), db.data(), m, n, k, /*accumulate=*/true);
  auto loss = [&] {
    linear_forward(x.data(), w.data(), bias.data(), y.data(), m, n, k);
    return dot(y, r);
  };
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(dx[i], numeric_derivative(x, i, loss), 2e-3);
  for (size_t i = 0; i < w.size(); ++i) EXPECT_NEAR(dw[i] - 1.0f, numeric_derivative(w, i, loss), 2e-3);
  for (size_t i = 0; i < bias.size(); ++i) EXPECT_NEAR(db[i] - 2.0f, numeric_derivative(bias, i, loss), 2e-3);
}

TEST(ReferenceGemm, TransposedOperandsAndBeta) {
  const int64_t m = 4, n = 3, k = 6;
  auto at = random_vector(k * m, 5), bt = random_vector(n * k, 6);
  std::vector<float> c(m * n, 1.0f);
  gemm(true, true, m, n, k, 2.0f, at.data(), m, bt.data(), k, 0.5f, c.data(), n);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t t = 0; t < k; ++t) s += double(at[t * m + i]) * bt[j * k + t];
      EXPECT_NEAR(c[i * n + j], 2.0 * s + 0.5, 1e-5);
    }
}

class ReferenceNorm : public ::testing::TestWithParam<NormKind> {};

TEST_P(ReferenceNorm, BackwardMatchesNumericGradient) {
  const NormKind kind = GetParam();
  const int64_t rows = 3, hidden = 8;
  auto x = random_vector(rows * hidden, 7), res = random_vector(rows * hidden, 8);
  auto gamma = random_vector(hidden, 9), beta = random_vector(hidden, 10);
  auto r = random_vector(rows * hidden, 11), d_res = random_vector(rows * hidden, 12);
  std::vector<float> y(rows * hidden), sum(rows * hidden), mean(rows), rstd(rows);
  auto loss = [&] {
    norm_forward(kind, x.data(), res.data(), gamma.data(), beta.data(), y.data(), sum.data(), mean.data(),
                 rstd.data(), rows, hidden, 1e-5f);
    return dot(y, r);
  };
  loss();
  for (size_t i = 0; i < sum.size(); ++i) EXPECT_FLOAT_EQ(sum[i], x[i] + res[i]);
  std::vector<float> dx(rows * hidden), dgamma(hidden), dbeta(hidden);
  norm_backward(kind, r.data(), sum.data(), gamma.data(), mean.data(), rstd.data(), d_res.data(), dx.data(),
                dgamma.data(), dbeta.data(), rows, hidden, false);
  for (size_t i = 0; i < x.size(); ++i)
    EXPECT_NEAR(dx[i] - d_res[i], numeric_derivative(x, i, loss, 1e-3f), 1e-2) << i;
  for (size_t i = 0; i < gamma.size(); ++i)
    EXPECT_NEAR(dgamma[i], numeric_derivative(gamma, i, loss, 1e-3f), 1e-2);
  if (kind == NormKind::kLayerNorm) {
    for (size_t i = 0; i < beta.size(); ++i)
      EXPECT_NEAR(dbeta[i], numeric_derivative(beta, i, loss, 1e-3f), 1e-2);
  }
}

TEST_P(ReferenceNorm, OutputIsNormalized) {
  const int64_t rows = 2, hidden = 64;
  auto x = random_vector(rows * hidden, 13, 3.0f);
  std::vector<float> gamma(hidden, 1.0f), beta(hidden, 0.0f), y(rows * hidden), mean(rows), rstd(rows);
  norm_forward(GetParam(), x.data(), nullptr, gamma.data(), beta.data(), y.data(), nullptr, mean.data(),
               rstd.data(), rows, hidden, 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    double s = 0, s2 = 0;
    for (int64_t c = 0; c < hidden; ++c)
      s += y[r * hidden + c], s2 += double(y[r * hidden + c]) * y[r * hidden + c];
    if (GetParam() == NormKind::kLayerNorm) {
      EXPECT_NEAR(s / hidden, 0.0, 1e-5);
    }
    EXPECT_NEAR(s2 / hidden - (GetParam() == NormKind::kLayerNorm ? (s / hidden) * (s / hidden) : 0.0), 1.0,
                1e-4);
  }
}

INSTANTIATE_TEST_SUITE_P(Kinds, ReferenceNorm, ::testing::Values(NormKind::kLayerNorm, NormKind::kRMSNorm));

TEST(ReferenceRope, RotationPreservesNormAndBackwardInverts) {
  AttentionShape shape{.batch = 2, .seq_q = 5, .num_heads = 4, .num_kv_heads = 2, .head_dim = 8};
  auto qkv = random_vector(shape.batch * shape.seq_q * shape.packed_token_stride(), 14);
  const auto original = qkv;
  rope_forward_inplace(shape, qkv.data(), qkv.data() + shape.packed_k_offset(), 10000.0f);
  // Position 0 is not rotated; v untouched; norms of each pair preserved.
  for (int64_t h = 0; h < shape.num_heads + shape.num_kv_heads; ++h)
    for (int64_t x = 0; x < shape.head_dim; ++x) EXPECT_FLOAT_EQ(qkv[h * 8 + x], original[h * 8 + x]);
  const int64_t t = shape.packed_token_stride();
  for (int64_t tok = 0; tok < shape.batch * shape.seq_q; ++tok) {
    for (int64_t x = shape.packed_v_offset(); x < t; ++x) EXPECT_EQ(qkv[tok * t + x], original[tok * t + x]);
    for (int64_t h = 0; h < shape.num_heads + shape.num_kv_heads; ++h)
      for (int64_t i = 0; i < 4; ++i) {
        const float* a = &qkv[tok * t + h * 8];
        const float* b = &original[tok * t + h * 8];
        EXPECT_NEAR(a[i] * a[i] + a[i + 4] * a[i + 4], b[i] * b[i] + b[i + 4] * b[i + 4], 1e-4);
      }
  }
  // Token 1 of sequence 0, head 0, pair 0: angle 1 radian.
  EXPECT_NEAR(qkv[t + 0], original[t + 0] * std::cos(1.0f) - original[t + 4] * std::sin(1.0f), 1e-5);
  rope_backward_inplace(shape, qkv.data(), qkv.data() + shape.packed_k_offset(), 10000.0f);
  for (size_t i = 0; i < qkv.size(); ++i) EXPECT_NEAR(qkv[i], original[i], 1e-5);
}

TEST(ReferenceActivation, GeluAndSwigluMatchNumericGradients) {
  for (float x : {-3.0f, -0.5f, 0.0f, 0.7f, 2.5f}) {
    const double h = 1e-3;
    EXPECT_NEAR(gelu_tanh_derivative(x), (gelu_tanh(x + h) - gelu_tanh(x - h)) / (2 * h), 1e-3);
  }
  EXPECT_NEAR(gelu_tanh(1.0f), 0.841192f, 1e-5);  // tanh approximation at 1
  const int64_t rows = 3, f = 4;
  auto x = random_vector(rows * 2 * f, 15), r = random_vector(rows * f, 16);
  std::vector<float> y(rows * f), dx(rows * 2 * f);
  auto loss = [&] {
    swiglu_forward(x.data(), y.data(), rows, f);
    return dot(y, r);
  };
  swiglu_backward(r.data(), x.data(), dx.data(), rows, f);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(dx[i], numeric_derivative(x, i, loss, 1e-3f), 2e-3);
  // bias-gelu backward and its bias gradient.
  auto pre = random_vector(rows * f, 17), bias = random_vector(f, 18);
  std::vector<float> gx(rows * f), dbias(f, 0.0f);
  gelu_backward(r.data(), pre.data(), gx.data(), dbias.data(), rows, f, false);
  for (int64_t c = 0; c < f; ++c) {
    double s = 0;
    for (int64_t rr = 0; rr < rows; ++rr) s += r[rr * f + c] * gelu_tanh_derivative(pre[rr * f + c]);
    EXPECT_NEAR(dbias[c], s, 1e-5);
  }
}

TEST(ReferenceActivation, BackwardWithRecomputedOutputInPlace) {
  const int64_t rows = 3, f = 5;
  std::mt19937 rng(4);
  std::normal_distribution<float> dist(0.0f, 1.5f);
  std::vector<float> x(rows * 2 * f), dy(rows * f);
  for (float& v : x) v = dist(rng);
  for (float& v : dy) v = dist(rng);
  // SwiGLU: separate outputs equal swiglu_backward + swiglu_forward; then in place (dx over x, y over dy).
  std::vector<float> dx(x.size()), y(dy.size()), want_dx(x.size()), want_y(dy.size());
  swiglu_backward(dy.data(), x.data(), want_dx.data(), rows, f);
  swiglu_forward(x.data(), want_y.data(), rows, f);
  swiglu_backward_recompute(dy.data(), x.data(), dx.data(), y.data(), rows, f);
  EXPECT_EQ(dx, want_dx);
  EXPECT_EQ(y, want_y);
  std::vector<float> x_inout = x, dy_inout = dy;
  swiglu_backward_recompute(dy_inout.data(), x_inout.data(), x_inout.data(), dy_inout.data(), rows, f);
  EXPECT_EQ(x_inout, want_dx);
  EXPECT_EQ(dy_inout, want_y);
  // GELU over (rows, 2f): the same.
  std::vector<float> g_dy(x.size()), g_dx(x.size()), g_y(x.size()), g_want_dx(x.size()), g_want_y(x.size());
  for (float& v : g_dy) v = dist(rng);
  gelu_backward(g_dy.data(), x.data(), g_want_dx.data(), nullptr, rows, 2 * f, false);
  bias_gelu_forward(x.data(), nullptr, nullptr, g_want_y.data(), rows, 2 * f);
  std::vector<float> pre_inout = x, d_inout = g_dy;
  gelu_backward_recompute(d_inout.data(), pre_inout.data(), pre_inout.data(), d_inout.data(), rows, 2 * f);
  EXPECT_EQ(pre_inout, g_want_dx);
  EXPECT_EQ(d_inout, g_want_y);
}

TEST(ReferenceEmbedding, LookupAndScatterAdd) {
  const int64_t vocab = 6, hidden = 3, seq = 2, tokens = 4;
  auto word = random_vector(vocab * hidden, 19), pos = random_vector(seq * hidden, 20);
  std::vector<int32_t> ids = {2, 5, 2, 0};
  std::vector<float> out(tokens * hidden);
  embedding_forward(ids.data(), word.data(), pos.data(), out.data(), tokens, seq, vocab, hidden);
  EXPECT_FLOAT_EQ(out[2 * hidden + 1], word[2 * hidden + 1] + pos[0 * hidden + 1]);
  EXPECT_FLOAT_EQ(out[3 * hidden + 2], word[0 * hidden + 2] + pos[1 * hidden + 2]);
  std::vector<float> d_out(tokens * hidden, 1.0f), d_word(vocab * hidden, 0.5f), d_pos(seq * hidden, 0.0f);
  d_out[0] = 3.0f;
  embedding_backward(ids.data(), d_out.data(), d_word.data(), d_pos.data(), tokens, seq, vocab, hidden);
  EXPECT_FLOAT_EQ(d_word[2 * hidden + 0], 0.5f + 3.0f + 1.0f);
  EXPECT_FLOAT_EQ(d_word[1 * hidden + 0], 0.5f);
  EXPECT_FLOAT_EQ(d_pos[0], 3.0f + 1.0f);
  ids[1] = 6;
  EXPECT_THROW(embedding_forward(ids.data(), word.data(), nullptr, out.data(), tokens, seq, vocab, hidden),
               std::out_of_range);
}

TEST(ReferenceCrossEntropy, LossAndGradient) {
  const int64_t tokens = 4, vocab = 11;
  auto logits = random_vector(tokens * vocab, 21, 2.0f);
  std::vector<int32_t> targets = {3, 0, -1, 10};
  std::vector<float> loss(tokens), grad = logits;
  const float scale = 0.25f;
  cross_entropy(grad.data(), targets.data(), loss.data(), tokens, vocab, true, scale);
  for (int64_t t = 0; t < tokens; ++t) {
    double row_sum = 0;
    for (int64_t v = 0; v < vocab; ++v) row_sum += grad[t * vocab + v];
    EXPECT_NEAR(row_sum, 0.0, 1e-6);  // softmax - onehot sums to zero
  }
  EXPECT_EQ(loss[2], 0.0f);
  for (int64_t v = 0; v < vocab; ++v) EXPECT_EQ(grad[2 * vocab + v], 0.0f);
  // Gradient of scale * sum(loss) matches finite differences.
  std::vector<float> work(tokens * vocab), l(tokens);
  auto total = [&] {
    work = logits;
    cross_entropy(work.data(), targets.data(), l.data(), tokens, vocab, false, 0);
    double s = 0;
    for (float x : l) s += x;
    return scale * s;
  };
  for (size_t i = 0; i < logits.size(); ++i)
    EXPECT_NEAR(grad[i], numeric_derivative(logits, i, total, 1e-3f), 1e-3);
  // Uniform logits: loss = log(vocab).
  std::vector<float> flat(vocab, 0.5f);
  int32_t target = 4;
  float one_loss;
  cross_entropy(flat.data(), &target, &one_loss, 1, vocab, false, 0);
  EXPECT_NEAR(one_loss, std::log(11.0), 1e-6);
}

TEST(ReferenceOptimizer, AdamWOneStepByHand) {
  AdamWHyper hyper{.lr = 0.1f, .beta1 = 0.9f, .beta2 = 0.99f, .eps = 1e-8f, .weight_decay = 0.5f, .step = 1};
  float p = 2.0f, g = 0.5f, m = 0.0f, v = 0.0f, model = 0.0f;
  adamw_step(&p, &g, &m, &v, &model, 1, hyper, true, 1.0f);
  // m = 0.05, v = 0.0025; mhat = 0.5, vhat = 0.25; decay: 2 - 0.1*0.5*2 = 1.9; update: 1.9 - 0.1 * 0.5/0.5
  // = 1.8.
  EXPECT_NEAR(m, 0.05f, 1e-7);
  EXPECT_NEAR(v, 0.0025f, 1e-8);
  EXPECT_NEAR(p, 1.8f, 1e-6);
  EXPECT_EQ(model, round_to_bf16(p));
  // No decay, clip by half: g = 0.25 -> mhat = 0.25, vhat = 0.0625 -> step of exactly lr.
  float p2 = 2.0f, m2 = 0.0f, v2 = 0.0f;
  adamw_step(&p2, &g, &m2, &v2, nullptr, 1, hyper, false, 0.5f);
  EXPECT_NEAR(p2, 1.9f, 1e-6);
}

TEST(ReferenceOptimizer, GradNormAndClip) {
  std::vector<float> a = {3.0f, 0.0f}, b = {4.0f};
  const GradTensor grads[] = {{a.data(), 2}, {b.data(), 1}};
  EXPECT_FLOAT_EQ(global_grad_norm(grads), 5.0f);
  EXPECT_NEAR(adamw_clip_coefficient(5.0f, 1.0f), 0.2f, 1e-6);
  EXPECT_EQ(adamw_clip_coefficient(5.0f, 10.0f), 1.0f);
  EXPECT_EQ(adamw_clip_coefficient(5.0f, 0.0f), 1.0f);
  scale_inplace(a.data(), 2, 0.5f);
  EXPECT_EQ(a[0], 1.5f);
}

TEST(ReferenceElementwise, Bf16RoundingAndHelpers) {
  EXPECT_EQ(round_to_bf16(1.0f), 1.0f);
  EXPECT_EQ(round_to_bf16(1.0f + 1.0f / 256), 1.0f);               // tie -> even (down)
  EXPECT_EQ(round_to_bf16(1.0f + 3.0f / 256), 1.0f + 4.0f / 256);  // tie -> even (up)
  EXPECT_EQ(round_to_bf16(1.0f + 1.5f / 256), 1.0f + 2.0f / 256);
  EXPECT_TRUE(std::isnan(round_to_bf16(NAN)));
  EXPECT_TRUE(std::isinf(round_to_bf16(INFINITY)));
  std::vector<float> x = {1.0f, NAN, 2.0f, -INFINITY};
  EXPECT_EQ(count_nonfinite(x.data(), 4), 2);
  std::vector<float> m = {1, 2, 3, 4, 5, 6}, sums = {10, 20, 30};
  column_sum(m.data(), sums.data(), 2, 3, true);
  EXPECT_EQ(sums[0], 15.0f);
  EXPECT_EQ(sums[2], 39.0f);
  std::vector<float> out = {NAN, NAN};
  axpby(2.0f, m.data(), 0.0f, out.data(), 2);
  EXPECT_EQ(out[1], 4.0f);
}

}  // namespace
}  // namespace megatune::executor::reference
