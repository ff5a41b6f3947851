// The fused CUDA kernels (norms, RoPE, activations, embedding, cross-entropy, optimizer, element-wise)
// against the CPU reference kernels on random inputs, within bf16 tolerance.
#include <gtest/gtest.h>

#include <numeric>
#include <tuple>

#include "executor/cuda/activation_kernels.h"
#include "executor/cuda/cross_entropy_kernels.h"
#include "executor/cuda/elementwise_kernels.h"
#include "executor/cuda/embedding_kernels.h"
#include "executor/cuda/norm_kernels.h"
#include "executor/cuda/optimizer_kernels.h"
#include "executor/cuda/rope_kernels.h"
#include "executor/kernels/reference_activation.h"
#include "executor/kernels/reference_cross_entropy.h"
#include "executor/kernels/reference_embedding.h"
#include "executor/kernels/reference_norm.h"
#include "executor/kernels/reference_optimizer.h"
#include "executor/kernels/reference_rope.h"
#include "executor/kernels/rope_scaling.h"
#include "tests/executor/kernel_gpu_test_util.h"

namespace megatune::executor {
namespace {

using cuda::bf16;
using test::DeviceBuffer;

// Widths: 1032 and 2048 take the warp-per-row forward (1032: lanes with a partial last vector), 3000 and
// 5000 the block-per-row forward; the fused backward holds 1 (1032, 2048), 2 (3000) or 4 (5000) vectors per
// thread; each width also runs the two-pass backward.
class NormGpu : public ::testing::TestWithParam<std::tuple<NormKind, int64_t>> {};

TEST_P(NormGpu, ForwardAndBackwardMatchReference) {
  MEGATUNE_REQUIRE_GPU();
  const NormKind kind = std::get<0>(GetParam());
  const int64_t rows = 300, hidden = std::get<1>(GetParam());
  const auto x = test::random_bf16_values(rows * hidden, 1), res = test::random_bf16_values(rows * hidden, 2);
  const auto gamma = test::random_bf16_values(hidden, 3), beta = test::random_bf16_values(hidden, 4);
  const auto dy = test::random_bf16_values(rows * hidden, 5),
             d_res = test::random_bf16_values(rows * hidden, 6);
  DeviceBuffer<bf16> x_d(rows * hidden), res_d(rows * hidden), g_d(hidden), b_d(hidden), y_d(rows * hidden),
      sum_d(rows * hidden), dy_d(rows * hidden), dres_d(rows * hidden), dx_d(rows * hidden);
  DeviceBuffer<float> mean_d(rows), rstd_d(rows), dg_d(hidden), db_d(hidden);
  test::upload_bf16(x_d, x), test::upload_bf16(res_d, res), test::upload_bf16(g_d, gamma),
      test::upload_bf16(b_d, beta);
  test::upload_bf16(dy_d, dy), test::upload_bf16(dres_d, d_res);
  y_d.poison(), sum_d.poison(), dx_d.poison();
  cuda::norm_forward(kind, x_d.get(), res_d.get(), g_d.get(), b_d.get(), y_d.get(), sum_d.get(), mean_d.get(),
                     rstd_d.get(), rows, hidden, 1e-5f, nullptr);
  std::vector<float> y(rows * hidden), sum(rows * hidden), mean(rows), rstd(rows);
  reference::norm_forward(kind, x.data(), res.data(), gamma.data(), beta.data(), y.data(), sum.data(),
                          mean.data(), rstd.data(), rows, hidden, 1e-5f);
  EXPECT_LT(test::relative_error(test::download_bf16(sum_d), sum), 4e-3);
  EXPECT_LT(test::relative_error(test::download_bf16(y_d), y), 1e-2);
  EXPECT_LT(test::relative_error(test::download(rstd_d), rstd), 1e-3);
  {  // the recompute from the stored statistics gives the forward's output bit for bit
    DeviceBuffer<bf16> y_again(rows * hidden);
    y_again.poison();
    cuda::norm_apply(kind, sum_d.get(), g_d.get(), b_d.get(), mean_d.get(), rstd_d.get(), y_again.get(), rows,
                     hidden, nullptr);
    EXPECT_EQ(test::download_bf16(y_again), test::download_bf16(y_d));
  }
  // Backward on the GPU's stored sum; accumulate into preset dgamma to test accumulate.
  const auto sum_gpu = test::download_bf16(sum_d);
  std::vector<float> ones(hidden, 1.0f);
  test::upload(dg_d, ones), test::upload(db_d, ones);
  DeviceBuffer<unsigned char> ws(cuda::norm_backward_workspace_bytes(rows, hidden));
  cuda::norm_backward(kind, dy_d.get(), sum_d.get(), g_d.get(), mean_d.get(), rstd_d.get(), dres_d.get(),
                      dx_d.get(), dg_d.get(), db_d.get(), rows, hidden, true, ws.get(), ws.size(), nullptr);
  std::vector<float> dx(rows * hidden), dg(hidden, 1.0f), db(hidden, 1.0f);
  reference::norm_backward(kind, dy.data(), sum_gpu.data(), gamma.data(), test::download(mean_d).data(),
                           test::download(rstd_d).data(), d_res.data(), dx.data(), dg.data(),
                           kind == NormKind::kLayerNorm ? db.data() : nullptr, rows, hidden, true);
  EXPECT_LT(test::relative_error(test::download_bf16(dx_d), dx), 1e-2);
  EXPECT_LT(test::relative_error(test::download(dg_d), dg), 1e-4);
  if (kind == NormKind::kLayerNorm) {
    EXPECT_LT(test::relative_error(test::download(db_d), db), 1e-4);
  }
  // Deterministic: a second run gives identical bits.
  const auto dg_first = test::download(dg_d), db_first = test::download(db_d);
  test::upload(dg_d, ones), test::upload(db_d, ones);
  cuda::norm_backward(kind, dy_d.get(), sum_d.get(), g_d.get(), mean_d.get(), rstd_d.get(), dres_d.get(),
                      dx_d.get(), dg_d.get(), db_d.get(), rows, hidden, true, ws.get(), ws.size(), nullptr);
  EXPECT_EQ(test::download(dg_d), dg_first);
  if (kind == NormKind::kLayerNorm) {
    EXPECT_EQ(test::download(db_d), db_first);
  }
  // The two-pass backward: the same dgamma/dbeta bits, dx within rounding of the reference.
  test::upload(dg_d, ones), test::upload(db_d, ones);
  DeviceBuffer<bf16> dx_separate(rows * hidden);
  dx_separate.poison();
  cuda::norm_backward(kind, dy_d.get(), sum_d.get(), g_d.get(), mean_d.get(), rstd_d.get(), dres_d.get(),
                      dx_separate.get(), dg_d.get(), db_d.get(), rows, hidden, true, ws.get(), ws.size(),
                      nullptr, cuda::NormBackwardKernel::kSeparate);
  EXPECT_EQ(test::download(dg_d), dg_first);
  if (kind == NormKind::kLayerNorm) {
    EXPECT_EQ(test::download(db_d), db_first);
  }
  EXPECT_LT(test::relative_error(test::download_bf16(dx_separate), dx), 1e-2);
}

INSTANTIATE_TEST_SUITE_P(KindsAndWidths, NormGpu,
                         ::testing::Combine(::testing::Values(NormKind::kLayerNorm, NormKind::kRMSNorm),
                                            ::testing::Values(int64_t(1032), int64_t(2048), int64_t(3000),
                                                              int64_t(5000))));

TEST(RopeGpu, MatchesReferenceOnPackedQkv) {
  MEGATUNE_REQUIRE_GPU();
  // Head dims 256, 128, 64 and 48 take the 8-pairs-per-thread kernel (48: 3 groups of 8 pairs per half;
  // 128 with 32 + 8 heads: llama's head counts); 8 (4 pairs) the one-pair-per-thread kernel.
  struct Case {
    int64_t head_dim, heads, kv_heads;
  };
  for (const Case c : {Case{128, 32, 8}, Case{64, 4, 2}, Case{256, 4, 2}, Case{48, 4, 2}, Case{8, 4, 2}}) {
    const int64_t head_dim = c.head_dim;
    AttentionShape shape{
        .batch = 2, .seq_q = 1000, .num_heads = c.heads, .num_kv_heads = c.kv_heads, .head_dim = head_dim};
    const int64_t n = shape.batch * shape.seq_q * shape.packed_token_stride();
    auto qkv = test::random_bf16_values(n, 7);
    DeviceBuffer<bf16> qkv_d(n);
    test::upload_bf16(qkv_d, qkv);
    cuda::rope_forward_inplace(shape, qkv_d.get(), qkv_d.get() + shape.packed_k_offset(), 500000.0f, 0,
                               nullptr);
    auto want = qkv;
    reference::rope_forward_inplace(shape, want.data(), want.data() + shape.packed_k_offset(), 500000.0f);
    const auto got = test::download_bf16(qkv_d);
    EXPECT_LT(test::relative_error(got, want), 5e-3) << "head_dim " << head_dim;
    // v (the last n_kv * d of each token) is untouched.
    for (int64_t t = 0; t < shape.batch * shape.seq_q; ++t)
      for (int64_t x = shape.packed_v_offset(); x < shape.packed_token_stride(); ++x)
        ASSERT_EQ(got[t * shape.packed_token_stride() + x], qkv[t * shape.packed_token_stride() + x]);
    cuda::rope_backward_inplace(shape, qkv_d.get(), qkv_d.get() + shape.packed_k_offset(), 500000.0f, 0,
                                nullptr);
    EXPECT_LT(test::relative_error(test::download_bf16(qkv_d), qkv), 8e-3) << "head_dim " << head_dim;
  }
}

// YaRN (DeepSeek-V3's factor 40 at Megatron's default mscales, so cos and sin carry 0.1 ln 40 + 1): both
// kernels against the reference with the same scaling, visibly apart from plain RoPE; the backward returns
// the input times the factor squared.
TEST(RopeGpu, YarnScalingMatchesReference) {
  MEGATUNE_REQUIRE_GPU();
  const YarnSettings yarn{.factor = 40, .mscale = 1.0, .mscale_all_dim = 0.0, .original_max_positions = 4096};
  for (const int64_t head_dim : {int64_t(64), int64_t(8)}) {  // the 8-pairs kernel, the one-pair kernel
    const RopeScaling scaling = yarn_rope_scaling(yarn, head_dim, 10000.0);
    AttentionShape shape{.batch = 2, .seq_q = 1000, .num_heads = 4, .num_kv_heads = 1, .head_dim = head_dim};
    const int64_t n = shape.batch * shape.seq_q * shape.packed_token_stride();
    auto qkv = test::random_bf16_values(n, 9);
    DeviceBuffer<bf16> qkv_d(n);
    test::upload_bf16(qkv_d, qkv);
    cuda::rope_forward_inplace(shape, qkv_d.get(), qkv_d.get() + shape.packed_k_offset(), 10000.0f, 0,
                               nullptr, scaling);
    auto want = qkv, plain = qkv;
    reference::rope_forward_inplace(shape, want.data(), want.data() + shape.packed_k_offset(), 10000.0f, 0,
                                    scaling);
    reference::rope_forward_inplace(shape, plain.data(), plain.data() + shape.packed_k_offset(), 10000.0f);
    const auto got = test::download_bf16(qkv_d);
    EXPECT_LT(test::relative_error(got, want), 5e-3) << "head_dim " << head_dim;
    EXPECT_GT(test::relative_error(got, plain), 5e-2) << "head_dim " << head_dim;
    cuda::rope_backward_inplace(shape, qkv_d.get(), qkv_d.get() + shape.packed_k_offset(), 10000.0f, 0,
                                nullptr, scaling);
    std::vector<float> squared = qkv;
    const float m2 = scaling.concentration * scaling.concentration;
    for (int64_t t = 0; t < shape.batch * shape.seq_q; ++t)
      for (int64_t x = 0; x < shape.packed_v_offset(); ++x)
        squared[t * shape.packed_token_stride() + x] *= m2;
    EXPECT_LT(test::relative_error(test::download_bf16(qkv_d), squared), 8e-3) << "head_dim " << head_dim;
  }
}

TEST(ActivationGpu, GeluAndSwigluMatchReference) {
  MEGATUNE_REQUIRE_GPU();
  const int64_t rows = 64, cols = 520;
  const auto x = test::random_bf16_values(rows * cols, 8, 2.0f), bias = test::random_bf16_values(cols, 9);
  const auto dy = test::random_bf16_values(rows * cols, 10);
  DeviceBuffer<bf16> x_d(rows * cols), b_d(cols), pre_d(rows * cols), y_d(rows * cols), dy_d(rows * cols),
      dx_d(rows * cols);
  test::upload_bf16(x_d, x), test::upload_bf16(b_d, bias), test::upload_bf16(dy_d, dy);
  cuda::bias_gelu_forward(x_d.get(), b_d.get(), pre_d.get(), y_d.get(), rows, cols, nullptr);
  std::vector<float> pre(rows * cols), y(rows * cols), dx(rows * cols);
  reference::bias_gelu_forward(x.data(), bias.data(), pre.data(), y.data(), rows, cols);
  EXPECT_LT(test::relative_error(test::download_bf16(pre_d), pre), 5e-3);
  EXPECT_LT(test::relative_error(test::download_bf16(y_d), y), 1e-2);
  const auto pre_gpu = test::download_bf16(pre_d);
  cuda::gelu_backward(dy_d.get(), pre_d.get(), dx_d.get(), rows, cols, nullptr);
  reference::gelu_backward(dy.data(), pre_gpu.data(), dx.data(), nullptr, rows, cols, false);
  EXPECT_LT(test::relative_error(test::download_bf16(dx_d), dx), 1e-2);
  // SwiGLU: x [rows, 2f] with f = cols / 2.
  const int64_t f = cols / 2;
  DeviceBuffer<bf16> s_d(rows * f), ds_d(rows * f), dxs_d(rows * cols);
  cuda::swiglu_forward(x_d.get(), s_d.get(), rows, f, nullptr);
  std::vector<float> s(rows * f), dxs(rows * cols);
  reference::swiglu_forward(x.data(), s.data(), rows, f);
  EXPECT_LT(test::relative_error(test::download_bf16(s_d), s), 1e-2);
  std::vector<float> ds(dy.begin(), dy.begin() + rows * f);
  test::upload_bf16(ds_d, ds);
  cuda::swiglu_backward(ds_d.get(), x_d.get(), dxs_d.get(), rows, f, nullptr);
  reference::swiglu_backward(ds.data(), x.data(), dxs.data(), rows, f);
  EXPECT_LT(test::relative_error(test::download_bf16(dxs_d), dxs), 1e-2);
}

TEST(EmbeddingGpu, ForwardAndDeterministicBackward) {
  MEGATUNE_REQUIRE_GPU();
  const int64_t vocab = 50, hidden = 64, seq = 40, tokens = 3 * seq;
  std::mt19937 rng(11);
  std::vector<int32_t> ids(tokens);
  for (auto& id : ids) id = int32_t(rng() % 7);  // many repeats
  const auto word = test::random_bf16_values(vocab * hidden, 12),
             pos = test::random_bf16_values(seq * hidden, 13);
  const auto d_out = test::random_bf16_values(tokens * hidden, 14);
  DeviceBuffer<int32_t> ids_d(tokens);
  DeviceBuffer<bf16> word_d(vocab * hidden), pos_d(seq * hidden), out_d(tokens * hidden),
      dout_d(tokens * hidden);
  DeviceBuffer<float> dword_d(vocab * hidden), dpos_d(seq * hidden);
  test::upload(ids_d, ids), test::upload_bf16(word_d, word), test::upload_bf16(pos_d, pos);
  test::upload_bf16(dout_d, d_out);
  cuda::embedding_forward(ids_d.get(), word_d.get(), pos_d.get(), out_d.get(), tokens, seq, vocab, hidden,
                          nullptr);
  std::vector<float> out(tokens * hidden), dword(vocab * hidden, 0.0f), dpos(seq * hidden, 0.0f);
  reference::embedding_forward(ids.data(), word.data(), pos.data(), out.data(), tokens, seq, vocab, hidden);
  EXPECT_LT(test::relative_error(test::download_bf16(out_d), out), 4e-3);
  dword_d.zero(), dpos_d.zero();
  DeviceBuffer<unsigned char> ws(cuda::embedding_backward_workspace_bytes(tokens, vocab));
  cuda::embedding_backward(ids_d.get(), dout_d.get(), dword_d.get(), dpos_d.get(), tokens, seq, vocab, hidden,
                           ws.get(), ws.size(), nullptr);
  reference::embedding_backward(ids.data(), d_out.data(), dword.data(), dpos.data(), tokens, seq, vocab,
                                hidden);
  const auto first = test::download(dword_d);
  EXPECT_LT(test::relative_error(first, dword), 1e-6);
  EXPECT_LT(test::relative_error(test::download(dpos_d), dpos), 1e-6);
  dword_d.zero();
  cuda::embedding_backward(ids_d.get(), dout_d.get(), dword_d.get(), nullptr, tokens, seq, vocab, hidden,
                           ws.get(), ws.size(), nullptr);
  EXPECT_EQ(test::download(dword_d), first);
}

TEST(CrossEntropyGpu, LossAndInPlaceGradientMatchReference) {
  MEGATUNE_REQUIRE_GPU();
  const int64_t tokens = 37, vocab = 50304;
  auto logits = test::random_bf16_values(tokens * vocab, 15, 3.0f);
  std::vector<int32_t> targets(tokens);
  std::mt19937 rng(16);
  for (auto& t : targets) t = int32_t(rng() % vocab);
  targets[5] = -1;
  DeviceBuffer<bf16> logits_d(tokens * vocab);
  DeviceBuffer<int32_t> targets_d(tokens);
  DeviceBuffer<float> loss_d(tokens);
  test::upload_bf16(logits_d, logits), test::upload(targets_d, targets);
  const float scale = 1.0f / 36;
  cuda::cross_entropy_forward_backward(logits_d.get(), targets_d.get(), loss_d.get(), tokens, vocab, true,
                                       scale, nullptr);
  std::vector<float> loss(tokens);
  reference::cross_entropy(logits.data(), targets.data(), loss.data(), tokens, vocab, true, scale);
  const auto loss_gpu = test::download(loss_d);
  for (int64_t t = 0; t < tokens; ++t) EXPECT_NEAR(loss_gpu[t], loss[t], 2e-3 * std::max(1.0f, loss[t])) << t;
  EXPECT_LT(test::relative_error(test::download_bf16(logits_d), logits), 1e-2);
}

// The vocab-parallel passes over two halves of the vocabulary (two TP ranks; the reductions between the
// passes done on the host) give the fused kernel's losses and gradients.
TEST(CrossEntropyGpu, VocabParallelPassesMatchTheFusedReference) {
  MEGATUNE_REQUIRE_GPU();
  const int64_t tokens = 29, vocab = 2 * 4096, half = vocab / 2;
  auto logits = test::random_bf16_values(tokens * vocab, 21, 3.0f);
  std::vector<int32_t> targets(tokens);
  std::mt19937 rng(22);
  for (auto& t : targets) t = int32_t(rng() % vocab);
  targets[3] = -1;
  const float scale = 1.0f / 28;
  std::vector<float> loss(tokens), expected = logits;
  reference::cross_entropy(expected.data(), targets.data(), loss.data(), tokens, vocab, true, scale);
  DeviceBuffer<bf16> part0(tokens * half), part1(tokens * half);
  DeviceBuffer<bf16>* part_d[2] = {&part0, &part1};
  std::vector<std::vector<float>> parts(2);
  for (int r = 0; r < 2; ++r) {
    for (int64_t t = 0; t < tokens; ++t)
      parts[r].insert(parts[r].end(), logits.begin() + t * vocab + r * half,
                      logits.begin() + t * vocab + (r + 1) * half);
    test::upload_bf16(*part_d[r], parts[r]);
  }
  DeviceBuffer<int32_t> targets_d(tokens);
  test::upload(targets_d, targets);
  DeviceBuffer<float> max_d(tokens), target_d(tokens), sum_d(tokens), loss_d(tokens);
  std::vector<float> row_max(tokens, -INFINITY), target_logit(tokens, 0.0f), sum_exp(tokens, 0.0f);
  for (int r = 0; r < 2; ++r) {
    cuda::cross_entropy_row_max(part_d[r]->get(), max_d.get(), tokens, half, nullptr);
    const auto m = test::download(max_d);
    for (int64_t t = 0; t < tokens; ++t) row_max[t] = std::max(row_max[t], m[t]);
  }
  test::upload(max_d, row_max);
  for (int r = 0; r < 2; ++r) {
    cuda::cross_entropy_target_sum_exp(part_d[r]->get(), targets_d.get(), max_d.get(), target_d.get(),
                                       sum_d.get(), tokens, half, r * half, nullptr);
    const auto tl = test::download(target_d), se = test::download(sum_d);
    for (int64_t t = 0; t < tokens; ++t) target_logit[t] += tl[t], sum_exp[t] += se[t];
  }
  test::upload(target_d, target_logit), test::upload(sum_d, sum_exp);
  for (int r = 0; r < 2; ++r) {
    cuda::cross_entropy_finish(part_d[r]->get(), targets_d.get(), max_d.get(), target_d.get(), sum_d.get(),
                               loss_d.get(), tokens, half, r * half, scale, nullptr);
    const auto loss_gpu = test::download(loss_d);
    for (int64_t t = 0; t < tokens; ++t)
      EXPECT_NEAR(loss_gpu[t], loss[t], 2e-3 * std::max(1.0f, loss[t])) << t;
    std::vector<float> expected_part;
    for (int64_t t = 0; t < tokens; ++t)
      expected_part.insert(expected_part.end(), expected.begin() + t * vocab + r * half,
                           expected.begin() + t * vocab + (r + 1) * half);
    EXPECT_LT(test::relative_error(test::download_bf16(*part_d[r]), expected_part), 1e-2);
  }
}

TEST(OptimizerGpu, GradNormAndAdamWMatchReference) {
  MEGATUNE_REQUIRE_GPU();
  const std::vector<int64_t> sizes = {100000, 7, 65536 * 2 + 3};
  std::vector<std::unique_ptr<DeviceBuffer<float>>> buffers;
  std::vector<std::unique_ptr<DeviceBuffer<bf16>>> model;
  std::vector<cuda::AdamWTensor> tensors;
  std::vector<std::vector<float>> p, g, m, v;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const int64_t n = sizes[i];
    p.push_back(test::random_bf16_values(n, 20 + i));
    g.push_back(test::random_bf16_values(n, 30 + i, 0.01f));
    m.push_back(test::random_bf16_values(n, 40 + i, 0.001f));
    std::vector<float> vv = test::random_bf16_values(n, 50 + i, 0.001f);
    for (float& x : vv) x = x * x;
    v.push_back(vv);
    cuda::AdamWTensor t;
    for (auto* host : {&p.back(), &g.back(), &m.back(), &v.back()}) {
      buffers.push_back(std::make_unique<DeviceBuffer<float>>(n));
      test::upload(*buffers.back(), *host);
    }
    const size_t b = buffers.size();
    t.main_param = buffers[b - 4]->get(), t.main_grad = buffers[b - 3]->get();
    t.exp_avg = buffers[b - 2]->get(), t.exp_avg_sq = buffers[b - 1]->get();
    model.push_back(std::make_unique<DeviceBuffer<bf16>>(n));
    t.model_param = model.back()->get();
    t.numel = n;
    t.apply_weight_decay = i != 1;
    tensors.push_back(t);
  }
  cuda::MultiTensorTable table(tensors);
  EXPECT_EQ(table.num_chunks(), 2 + 1 + 3);
  DeviceBuffer<float> norm_d(1);
  DeviceBuffer<unsigned char> ws(cuda::grad_norm_workspace_bytes(table));
  cuda::global_grad_norm(table, norm_d.get(), ws.get(), ws.size(), nullptr);
  std::vector<reference::GradTensor> grads;
  for (size_t i = 0; i < sizes.size(); ++i) grads.push_back({g[i].data(), sizes[i]});
  const float norm = reference::global_grad_norm(grads);
  const float norm_gpu = test::download(norm_d)[0];
  EXPECT_NEAR(norm_gpu, norm, 1e-5 * norm);
  // Clipping in place by half the norm scales every gradient by ~1/2 (then restore all the gradients).
  cuda::clip_grads_by_norm(table, norm_d.get(), norm_gpu / 2, nullptr);
  const auto clipped = test::download(*buffers[1]);
  const float expected_clip = adamw_clip_coefficient(norm_gpu, norm_gpu / 2);
  for (size_t i = 0; i < clipped.size(); i += 997) EXPECT_FLOAT_EQ(clipped[i], g[0][i] * expected_clip);
  for (size_t i = 0; i < sizes.size(); ++i)
    test::upload(*buffers[4 * i + 1], g[i]);  // clip touched every tensor
  AdamWHyper hyper{.lr = 1e-3f, .weight_decay = 0.1f, .step = 3, .max_grad_norm = norm / 2};
  cuda::adamw_step(table, hyper, norm_d.get(), nullptr);
  const float clip = adamw_clip_coefficient(norm_gpu, hyper.max_grad_norm);
  for (size_t i = 0; i < sizes.size(); ++i) {
    std::vector<float> model_ref(sizes[i]);
    reference::adamw_step(p[i].data(), g[i].data(), m[i].data(), v[i].data(), model_ref.data(), sizes[i],
                          hyper, i != 1, clip);
    EXPECT_LT(test::relative_error(test::download(*buffers[4 * i]), p[i]), 1e-6) << i;
    EXPECT_LT(test::relative_error(test::download(*buffers[4 * i + 2]), m[i]), 1e-5) << i;
    EXPECT_LT(test::relative_error(test::download(*buffers[4 * i + 3]), v[i]), 1e-5) << i;
    EXPECT_LT(test::relative_error(test::download_bf16(*model[i]), model_ref), 1e-2) << i;
  }
  // A non-finite norm skips the step entirely.
  const auto before = test::download(*buffers[0]);
  std::vector<float> nan_norm = {NAN};
  test::upload(norm_d, nan_norm);
  cuda::adamw_step(table, hyper, norm_d.get(), nullptr);
  EXPECT_EQ(test::download(*buffers[0]), before);
}

TEST(ElementwiseGpu, CastsSumsColumnSumsAndNonfinite) {
  MEGATUNE_REQUIRE_GPU();
  const int64_t rows = 130, cols = 300, n = rows * cols;
  auto x = test::random_bf16_values(n, 60);
  DeviceBuffer<bf16> x_d(n), back_d(n);
  DeviceBuffer<float> f_d(n), sums_d(cols), total_d(1);
  test::upload_bf16(x_d, x);
  cuda::cast_bf16_to_fp32(x_d.get(), f_d.get(), n, nullptr);
  EXPECT_EQ(test::download(f_d), x);
  cuda::cast_fp32_to_bf16(f_d.get(), back_d.get(), n, nullptr);
  EXPECT_EQ(test::download_bf16(back_d), x);
  DeviceBuffer<unsigned char> ws(cuda::column_sum_workspace_bytes(rows, cols));
  sums_d.zero();
  cuda::column_sum_bf16(x_d.get(), sums_d.get(), rows, cols, true, ws.get(), ws.size(), nullptr);
  std::vector<float> sums(cols, 0.0f);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) sums[c] += x[r * cols + c];
  EXPECT_LT(test::relative_error(test::download(sums_d), sums), 1e-5);
  {  // a width that is a multiple of 8 takes the 16-byte-load kernel: same sums, accumulated onto ones
    const int64_t rows8 = 130, cols8 = 296;
    const auto x8 = test::random_bf16_values(rows8 * cols8, 61);
    DeviceBuffer<bf16> x8_d(rows8 * cols8);
    DeviceBuffer<float> sums8_d(cols8);
    test::upload_bf16(x8_d, x8);
    test::upload(sums8_d, std::vector<float>(cols8, 1.0f));
    DeviceBuffer<unsigned char> ws8(cuda::column_sum_workspace_bytes(rows8, cols8));
    cuda::column_sum_bf16(x8_d.get(), sums8_d.get(), rows8, cols8, true, ws8.get(), ws8.size(), nullptr);
    std::vector<float> want(cols8, 1.0f);
    for (int64_t r = 0; r < rows8; ++r)
      for (int64_t c = 0; c < cols8; ++c) want[c] += x8[r * cols8 + c];
    EXPECT_LT(test::relative_error(test::download(sums8_d), want), 1e-5);
  }
  cuda::sum_fp32(f_d.get(), n, total_d.get(), nullptr);
  const double total = std::accumulate(x.begin(), x.end(), 0.0);
  EXPECT_NEAR(test::download(total_d)[0], total, 1e-2);
  // add / axpby / scale.
  DeviceBuffer<bf16> sum_d(n);
  cuda::add_bf16(x_d.get(), back_d.get(), sum_d.get(), n, nullptr);
  const auto doubled = test::download_bf16(sum_d);
  for (int64_t i = 0; i < n; i += 101) EXPECT_EQ(doubled[i], 2.0f * x[i]);
  DeviceBuffer<float> out_d(n);
  test::upload(out_d, std::vector<float>(n, 1.0f));
  cuda::axpby_fp32(2.0f, f_d.get(), 3.0f, out_d.get(), n, nullptr);
  cuda::scale_fp32_inplace(out_d.get(), n, 0.5f, nullptr);
  const auto out = test::download(out_d);
  for (int64_t i = 0; i < n; i += 101) EXPECT_FLOAT_EQ(out[i], 0.5f * (2.0f * x[i] + 3.0f));
  DeviceBuffer<int> count_d(1);
  count_d.zero();
  cuda::count_nonfinite_fp32(f_d.get(), n, count_d.get(), nullptr);
  EXPECT_EQ(test::download(count_d)[0], 0);
  x[17] = NAN, x[n - 1] = INFINITY;
  test::upload_bf16(x_d, x);
  cuda::count_nonfinite_bf16(x_d.get(), n, count_d.get(), nullptr);
  EXPECT_EQ(test::download(count_d)[0], 2);
}

}  // namespace
}  // namespace megatune::executor
