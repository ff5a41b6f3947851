// YaRN's RoPE scaling (--rotary-scaling-factor, --mscale, --mscale-all-dim) against the formula of Hugging
// Face transformers' _compute_yarn_parameters written out here in double precision (DeepSeek-V3's settings
// and a blend-heavy small one), the concentration and softmax factors, plain RoPE at factor 1, and the CPU
// reference rotation with scaling (its angle, its factor on cos and sin, its backward).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <vector>

#include "executor/kernels/reference_rope.h"
#include "executor/kernels/rope_scaling.h"

namespace megatune::executor {
namespace {

// transformers' rope_utils._compute_yarn_parameters (truncate = True): inverse frequencies of a rotary
// dimension `dim`, and the attention factor get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim).
struct HfYarn {
  std::vector<double> inv_freq;
  double attention_factor = 1.0;
};

HfYarn hf_yarn(double base, int dim, double factor, double mscale, double mscale_all_dim, double original_max,
               double beta_fast = 32, double beta_slow = 1) {
  const auto get_mscale = [](double scale, double m) {
    return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0;
  };
  const auto find_correction_dim = [&](double rotations) {
    return (dim * std::log(original_max / (rotations * 2 * std::numbers::pi))) / (2 * std::log(base));
  };
  double low = std::floor(find_correction_dim(beta_fast)), high = std::ceil(find_correction_dim(beta_slow));
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;
  HfYarn out;
  for (int i = 0; i < dim / 2; ++i) {
    const double pos_freq = std::pow(base, (2.0 * i) / dim);
    const double extrapolation = 1.0 / pos_freq, interpolation = 1.0 / (factor * pos_freq);
    const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    const double extrapolation_factor = 1.0 - ramp;
    out.inv_freq.push_back(interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor);
  }
  out.attention_factor = get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim);
  return out;
}

void expect_inv_freq_matches(const YarnSettings& yarn, int dim, double base) {
  const RopeScaling s = yarn_rope_scaling(yarn, dim, base);
  const HfYarn want = hf_yarn(base, dim, yarn.factor, yarn.mscale, yarn.mscale_all_dim,
                              static_cast<double>(yarn.original_max_positions));
  int interpolated = 0;
  for (int i = 0; i < dim / 2; ++i) {
    const double got = rope_inv_freq(i, dim, static_cast<float>(base), s);
    EXPECT_NEAR(got, want.inv_freq[i], 2e-6 * want.inv_freq[i]) << "pair " << i;
    const double plain = 1.0 / std::pow(base, 2.0 * i / dim);
    interpolated += std::fabs(got - plain / yarn.factor) < 1e-6 * plain;
  }
  EXPECT_GT(interpolated, 0);  // the low frequencies are divided by the factor
  EXPECT_NEAR(s.concentration, want.attention_factor, 1e-6);
}

TEST(RopeScaling, DeepSeekV3YarnMatchesTheHuggingFaceFormula) {
  // DeepSeek-V3: qk_rope_head_dim 64, rope_theta 10000, factor 40, mscale 1, mscale_all_dim 1, 4096.
  const YarnSettings yarn{.factor = 40, .mscale = 1.0, .mscale_all_dim = 1.0, .original_max_positions = 4096};
  expect_inv_freq_matches(yarn, 64, 10000.0);
  const RopeScaling s = yarn_rope_scaling(yarn, 64, 10000.0);
  EXPECT_EQ(s.ramp_low, 10.0f);  // floor(10.2..) and ceil(22.2..): pairs 10..23 blend
  EXPECT_EQ(s.ramp_high, 23.0f);
  EXPECT_FLOAT_EQ(s.concentration, 1.0f);  // mscale == mscale_all_dim
  // The softmax scale's factor: (0.1 ln 40 + 1)^2.
  EXPECT_NEAR(yarn_attention_mscale(yarn), 0.1 * std::log(40.0) + 1.0, 1e-12);
}

TEST(RopeScaling, MegatronDefaultsPutTheMscaleOnCosAndSin) {
  // Megatron's defaults --mscale 1.0, --mscale-all-dim 0.0: cos and sin carry 0.1 ln f + 1, the softmax none.
  const YarnSettings yarn{.factor = 8, .original_max_positions = 256};
  expect_inv_freq_matches(yarn, 16, 500000.0);
  EXPECT_NEAR(yarn_rope_scaling(yarn, 16, 500000.0).concentration, 0.1 * std::log(8.0) + 1.0, 1e-6);
  EXPECT_EQ(yarn_attention_mscale(yarn), 1.0);
}

TEST(RopeScaling, FactorOneIsPlainRope) {
  const RopeScaling s = yarn_rope_scaling(YarnSettings{}, 64, 10000.0);
  EXPECT_EQ(s.factor, 1.0f);
  EXPECT_EQ(s.concentration, 1.0f);
  for (int i = 0; i < 32; ++i)
    EXPECT_EQ(rope_inv_freq(i, 64, 10000.0f, s), 1.0f / std::pow(10000.0f, float(2 * i) / 64.0f)) << i;
}

TEST(RopeScaling, ReferenceRotationUsesTheScaledFrequenciesAndFactor) {
  using reference::rope_backward_inplace;
  using reference::rope_forward_inplace;
  AttentionShape shape{.batch = 1, .seq_q = 40, .num_heads = 2, .num_kv_heads = 1, .head_dim = 16};
  const YarnSettings yarn{.factor = 8, .mscale = 1.0, .mscale_all_dim = 0.0, .original_max_positions = 64};
  const RopeScaling s = yarn_rope_scaling(yarn, 16, 10000.0);
  const int64_t t = shape.packed_token_stride();
  std::vector<float> qkv(shape.seq_q * t);
  for (size_t i = 0; i < qkv.size(); ++i) qkv[i] = std::sin(0.37f * float(i)) + 0.1f;
  const std::vector<float> original = qkv;
  rope_forward_inplace(shape, qkv.data(), qkv.data() + shape.packed_k_offset(), 10000.0f, 0, s);
  // Token 37, the key head (after the two query heads), each pair: m (x1 cos - x2 sin), m (x2 cos + x1 sin).
  const HfYarn want = hf_yarn(10000.0, 16, 8, 1.0, 0.0, 64);
  for (int i = 0; i < 8; ++i) {
    const int64_t at = 37 * t + 2 * 16 + i;
    const double angle = 37.0 * want.inv_freq[i], m = want.attention_factor;
    const double x1 = original[at], x2 = original[at + 8];
    EXPECT_NEAR(qkv[at], m * (x1 * std::cos(angle) - x2 * std::sin(angle)), 2e-5) << i;
    EXPECT_NEAR(qkv[at + 8], m * (x2 * std::cos(angle) + x1 * std::sin(angle)), 2e-5) << i;
  }
  // The backward is the transpose: m^2 times the input after both.
  rope_backward_inplace(shape, qkv.data(), qkv.data() + shape.packed_k_offset(), 10000.0f, 0, s);
  const double m2 = double(s.concentration) * s.concentration;
  for (int64_t tok = 0; tok < shape.seq_q; ++tok)
    for (int64_t x = 0; x < shape.packed_v_offset(); ++x)
      ASSERT_NEAR(qkv[tok * t + x], m2 * original[tok * t + x], 1e-4) << tok << " " << x;
}

}  // namespace
}  // namespace megatune::executor
