// FP8 encodings and the CPU reference of FP8 casts (layouts/fp8.h, executor/kernels/reference_fp8.h): values
// of each encoding, rounding to nearest even, saturation, current and delayed scaling (an amax spike and
// the recovery after it), the transposed copy, and the CPU backend's FP8 GEMM against the dequantized one.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "executor/cpu/cpu_backend.h"
#include "executor/kernels/reference_fp8.h"
#include "layouts/fp8.h"

namespace megatune::executor {
namespace {

using layouts::Fp8Encoding;
using layouts::round_to_fp8;

TEST(Fp8Encoding, RoundsToNearestEvenAndSaturates) {
  const Fp8Encoding e4 = Fp8Encoding::kE4M3, e5 = Fp8Encoding::kE5M2;
  EXPECT_EQ(round_to_fp8(1.0f, e4), 1.0f);
  EXPECT_EQ(round_to_fp8(1.0625f, e4), 1.0f);   // halfway between 1 and 1.125: to the even mantissa
  EXPECT_EQ(round_to_fp8(1.1875f, e4), 1.25f);  // halfway between 1.125 and 1.25: to the even one
  EXPECT_EQ(round_to_fp8(1.07f, e4), 1.125f);
  EXPECT_EQ(round_to_fp8(-3.3f, e4), -3.25f);
  EXPECT_EQ(round_to_fp8(448.0f, e4), 448.0f);
  EXPECT_EQ(round_to_fp8(1e6f, e4), 448.0f);  // saturating, not infinity
  EXPECT_EQ(round_to_fp8(-1e6f, e4), -448.0f);
  EXPECT_EQ(round_to_fp8(std::ldexp(1.0f, -9), e4), std::ldexp(1.0f, -9));  // the smallest subnormal
  EXPECT_EQ(round_to_fp8(std::ldexp(1.0f, -11), e4), 0.0f);
  EXPECT_EQ(round_to_fp8(1.1f, e5), 1.0f);  // two mantissa bits: 1, 1.25, 1.5, 1.75
  EXPECT_EQ(round_to_fp8(1.2f, e5), 1.25f);
  EXPECT_EQ(round_to_fp8(1e9f, e5), 57344.0f);
  EXPECT_EQ(round_to_fp8(std::ldexp(1.0f, -16), e5), std::ldexp(1.0f, -16));
  EXPECT_TRUE(std::isnan(round_to_fp8(std::numeric_limits<float>::quiet_NaN(), e4)));
  EXPECT_FLOAT_EQ(layouts::fp8_scale_for_amax(2.0f, e4, 0), 224.0f);
  EXPECT_FLOAT_EQ(layouts::fp8_scale_for_amax(2.0f, e4, 1), 112.0f);
  EXPECT_EQ(layouts::fp8_scale_for_amax(0.0f, e4, 0), 1.0f);
}

std::vector<float> fresh_state(int history) {
  std::vector<float> state(layouts::kFp8History + history, 0.0f);
  state[layouts::kFp8Scale] = state[layouts::kFp8ScaleInv] = 1.0f;
  return state;
}

TEST(Fp8Cast, CurrentScalingUsesTheTensorsOwnAmaxAndWritesTheTranspose) {
  const std::vector<float> src = {0.5f, -2.0f, 1.0f, 0.25f, 0.1f, -0.3f};  // [2, 3]
  std::vector<float> out(6), out_t(6), state = fresh_state(1), bias(3, 1.0f);
  reference::Fp8CastParams params;
  reference::fp8_cast(src.data(), 2, 3, 3, out.data(), out_t.data(), state.data(), params, bias.data());
  EXPECT_FLOAT_EQ(state[layouts::kFp8Scale], 224.0f);  // 448 / 2
  EXPECT_FLOAT_EQ(state[layouts::kFp8ScaleInv], 1.0f / 224.0f);
  EXPECT_EQ(out[1], -448.0f);
  for (int r = 0; r < 2; ++r)
    for (int c = 0; c < 3; ++c) {
      EXPECT_EQ(out_t[c * 2 + r], out[r * 3 + c]);
      EXPECT_EQ(out[r * 3 + c], round_to_fp8(src[r * 3 + c] * 224.0f, Fp8Encoding::kE4M3));
      // Dequantized, every value is within E4M3's relative step (2^-4) of the input.
      EXPECT_NEAR(out[r * 3 + c] / 224.0f, src[r * 3 + c], std::fabs(src[r * 3 + c]) / 16 + 1e-6f);
    }
  EXPECT_FLOAT_EQ(bias[0], 1.0f + 0.5f + 0.25f);
  EXPECT_FLOAT_EQ(bias[1], 1.0f - 2.0f + 0.1f);
}

TEST(Fp8Cast, DelayedScalingFollowsTheHistoryAndRecoversFromASpike) {
  reference::Fp8CastParams params;
  params.current_scaling = false;
  params.history_len = 4;
  params.amax_max = true;
  std::vector<float> state = fresh_state(4), out(1);
  auto cast = [&](float value) {
    reference::fp8_cast(&value, 1, 1, 1, out.data(), nullptr, state.data(), params, nullptr);
    return state[layouts::kFp8Scale];
  };
  EXPECT_EQ(cast(1.0f), 1.0f);      // the first use: the initial scale, its amax pending
  EXPECT_EQ(cast(1.0f), 448.0f);    // from the history {1}
  EXPECT_EQ(cast(100.0f), 448.0f);  // a spike: cast with the old scale, saturating
  EXPECT_EQ(out[0], 448.0f);
  EXPECT_FLOAT_EQ(cast(1.0f), 4.48f);  // the spike leads the history
  EXPECT_FLOAT_EQ(cast(1.0f), 4.48f);
  EXPECT_FLOAT_EQ(cast(1.0f), 4.48f);
  EXPECT_FLOAT_EQ(cast(1.0f), 4.48f);
  EXPECT_FLOAT_EQ(cast(1.0f), 448.0f);  // four rolls later it has left the history: recovered
  // most_recent: the newest entry alone.
  params.amax_max = false;
  state = fresh_state(4);
  cast(1.0f);
  cast(100.0f);
  EXPECT_FLOAT_EQ(cast(1.0f), 4.48f);
  EXPECT_FLOAT_EQ(cast(1.0f), 448.0f);
}

TEST(Fp8Gemm, CpuBackendDequantizesByBothScales) {
  CpuBackend backend(/*emulate_bf16=*/false);
  backend.reserve_arena(1 << 16);
  const Tensor a = backend.allocate(DType::kFP8, 2, 16, "a"), b = backend.allocate(DType::kFP8, 3, 16, "b");
  const Tensor c = backend.allocate(DType::kFP32, 2, 3, "c"), sa = backend.allocate(DType::kFP32, 1, 1, "sa"),
               sb = backend.allocate(DType::kFP32, 1, 1, "sb");
  std::vector<float> av(32), bv(48);
  for (int i = 0; i < 32; ++i) av[i] = round_to_fp8(0.5f * (i % 7) - 1.0f, Fp8Encoding::kE4M3);
  for (int i = 0; i < 48; ++i) bv[i] = round_to_fp8(0.25f * (i % 5), Fp8Encoding::kE4M3);
  backend.upload(a, av.data());
  backend.upload(b, bv.data());
  const float scale_a = 0.125f, scale_b = 4.0f;
  backend.upload(sa, &scale_a);
  backend.upload(sb, &scale_b);
  GemmArgs g{.a = a, .b = b, .transpose_b = true, .c = c, .m = 2, .n = 3, .k = 16};
  g.a_scale_inv = sa;
  g.b_scale_inv = sb;
  backend.gemm(g, {"fp8", -1, layouts::OpPhase::kForward});
  std::vector<float> got(6);
  backend.download(c, got.data());
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j) {
      double want = 0;
      for (int k = 0; k < 16; ++k) want += av[i * 16 + k] * bv[j * 16 + k];
      EXPECT_NEAR(got[i * 3 + j], want * scale_a * scale_b, 1e-5);
    }
}

}  // namespace
}  // namespace megatune::executor
