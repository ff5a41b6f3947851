// FLOPs: Megatron's formula against hand-computed values; MFU; the GPU peak table.
#include "layouts/flops.h"

#include <gtest/gtest.h>

#include "base/user_error.h"

namespace megatune::layouts {
namespace {

TEST(Flops, Gpt3_175bMatchesClosedForm) {
  // 72 B s L h^2 (1 + s/(12h) + V/(12hL)) with B 1536, s 2048, L 96, h 12288, V 50304 (50257 padded to 128).
  const double expected = 72.0 * 1536 * 2048 * 96 * 12288.0 * 12288.0 *
                          (1.0 + 2048.0 / (12.0 * 12288.0) + 50304.0 / (12.0 * 12288.0 * 96.0));
  const double actual = model_flops_per_iteration(model_preset("gpt3-175b"), 1536);
  EXPECT_NEAR(actual / expected, 1.0, 1e-12);
  EXPECT_NEAR(actual, 3.34e18, 0.01e18);  // ~6 x 175e9 params x 3.1M tokens + attention
}

TEST(Flops, Llama3_8bByHand) {
  // B 4, s 8192, L 32, h 4096, q 4096, kv 1024, F 14336 (SwiGLU: f 3), V 128256.
  const double tokens = 4.0 * 8192;
  const double mlp = 6.0 * 4096 * 14336 * 3 * 32;
  const double attention_linear = 6.0 * (4096.0 * (4096 + 2 * 1024) + 4096.0 * 4096) * 32;
  const double logits = 6.0 * 4096 * 128256;
  const double core = 4.0 * 8192 * 8192 * 6 * 4096 * 32;
  const double expected = tokens * (mlp + attention_linear + logits) + core;
  const FlopsBreakdown f = model_flops_breakdown(model_preset("llama3-8b"), 4);
  EXPECT_NEAR(f.total / expected, 1.0, 1e-12);
  EXPECT_NEAR(f.mlp / (tokens * mlp), 1.0, 1e-12);
  EXPECT_NEAR(f.attention_core / core, 1.0, 1e-12);
  EXPECT_NEAR(f.logits / (tokens * logits), 1.0, 1e-12);
}

TEST(Flops, MixtralCountsTopKExperts) {
  // All 32 layers MoE, top-2 of 8 experts with F_moe 14336, SwiGLU; vocab 32000; s 4096.
  const double tokens = 1.0 * 4096;
  const double mlp = 6.0 * 4096 * (14336.0 * 2 * 3) * 32;
  const FlopsBreakdown f = model_flops_breakdown(model_preset("mixtral-8x7b"), 1);
  EXPECT_NEAR(f.mlp / (tokens * mlp), 1.0, 1e-12);
}

TEST(Flops, DeepSeekV3MlaSharedExpertsAndMtp) {
  // 61 layers (3 dense + 58 MoE) + 1 MTP layer counted as MoE; MLA; top-8 of F_moe 2048 + shared 2048.
  const double h = 7168, s = 4096, tokens = 1.0 * s;
  const double mlp = 6 * h * (18432.0 * 3 * 3 + (2048.0 * 8 * 3 + 2048.0 * 3) * 59);
  const double q_term = 1536.0 * (h + 128.0 * (128 + 64) + 1);
  const double attention_linear =
      6 * (q_term + 512.0 * (h + 128.0 * (128 + 128) + 1) + h * 64 + 128.0 * 128 * h) * 62;
  const double core = s * s * 6 * (128.0 * (128 + 64) / 2 + 128.0 * 128 / 2) * 62;
  const double mtp = 6.0 * 1 * (3 * h + 2 * h * h);
  const double logits = 6 * h * 129280.0 * 2;
  const double expected = tokens * (mlp + attention_linear + mtp + logits) + core;
  EXPECT_NEAR(model_flops_per_iteration(model_preset("deepseek-v3"), 1) / expected, 1.0, 1e-12);
}

TEST(Flops, PaddedVocabFollowsTp) {
  const ModelSpec gpt = model_preset("gpt-125m");
  const double tp1 = model_flops_breakdown(gpt, 8, 1).logits;
  const double tp8 = model_flops_breakdown(gpt, 8, 8).logits;
  EXPECT_NEAR(tp8 / tp1, 51200.0 / 50304.0, 1e-12);
}

TEST(Flops, Mfu) {
  EXPECT_DOUBLE_EQ(mfu(989.4e12, 1.0, 1, 989.4), 1.0);
  EXPECT_DOUBLE_EQ(mfu(989.4e12 * 8 * 0.5, 2.0, 8, 989.4), 0.25);
  EXPECT_EQ(mfu(1e12, 0.0, 1, 989.4), 0.0);
}

}  // namespace
}  // namespace megatune::layouts
