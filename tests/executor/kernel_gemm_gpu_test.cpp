// GemmRunner (cuBLASLt) against the CPU reference GEMM: linear forward/backward, each epilogue, fp32
// main-grad accumulation, transposes, the plan cache and the timed algorithm choice.
#include <gtest/gtest.h>

#include "executor/cuda/gemm_runner.h"
#include "executor/kernels/reference_activation.h"
#include "executor/kernels/reference_gemm.h"
#include "tests/executor/kernel_gpu_test_util.h"

namespace megatune::executor {
namespace {

using cuda::bf16;
using test::DeviceBuffer;

constexpr int64_t kM = 192, kN = 136, kK = 264;

struct Inputs {
  std::vector<float> x = test::random_bf16_values(kM * kK, 1, 0.5f);
  std::vector<float> w = test::random_bf16_values(kN * kK, 2, 0.5f);
  std::vector<float> bias = test::random_bf16_values(kN, 3);
  std::vector<float> dy = test::random_bf16_values(kM * kN, 4, 0.5f);
  DeviceBuffer<bf16> x_d{size_t(kM * kK)}, w_d{size_t(kN * kK)}, bias_d{size_t(kN)}, dy_d{size_t(kM * kN)};
  Inputs() {
    test::upload_bf16(x_d, x), test::upload_bf16(w_d, w), test::upload_bf16(bias_d, bias);
    test::upload_bf16(dy_d, dy);
  }
};

TEST(GemmRunnerGpu, LinearForwardWithBiasAndCache) {
  MEGATUNE_REQUIRE_GPU();
  Inputs in;
  cuda::GemmRunner runner;
  DeviceBuffer<bf16> y_d(kM * kN);
  y_d.poison();
  cuda::linear_forward(runner, in.x_d.get(), in.w_d.get(), in.bias_d.get(), y_d.get(), kM, kN, kK, nullptr);
  std::vector<float> y(kM * kN);
  reference::linear_forward(in.x.data(), in.w.data(), in.bias.data(), y.data(), kM, kN, kK);
  EXPECT_LT(test::relative_error(test::download_bf16(y_d), y), 8e-3);
  EXPECT_EQ(runner.cached_plans(), 1u);
  cuda::linear_forward(runner, in.x_d.get(), in.w_d.get(), nullptr, y_d.get(), kM, kN, kK, nullptr);
  cuda::linear_forward(runner, in.x_d.get(), in.w_d.get(), nullptr, y_d.get(), kM, kN, kK, nullptr);
  EXPECT_EQ(runner.cached_plans(), 2u);  // bias and no-bias plans, reused
  reference::linear_forward(in.x.data(), in.w.data(), nullptr, y.data(), kM, kN, kK);
  EXPECT_LT(test::relative_error(test::download_bf16(y_d), y), 8e-3);
}

// The timed algorithm choice is one per process and spec: two runners give identical bits; a runner that
// keeps the heuristic's first choice computes the same function within bf16 rounding.
TEST(GemmRunnerGpu, TunedAlgorithmIsProcessWide) {
  MEGATUNE_REQUIRE_GPU();
  constexpr int64_t m = 1024, n = 768, k = 512;
  const auto x = test::random_bf16_values(m * k, 21, 0.5f), w = test::random_bf16_values(n * k, 22, 0.5f);
  DeviceBuffer<bf16> x_d(m * k), w_d(n * k), y1(m * n), y2(m * n), y3(m * n);
  test::upload_bf16(x_d, x), test::upload_bf16(w_d, w);
  cuda::GemmRunner first, second, untuned;
  untuned.set_tuning(false);
  y1.poison(), y2.poison(), y3.poison();
  cuda::linear_forward(first, x_d.get(), w_d.get(), nullptr, y1.get(), m, n, k, nullptr);
  cuda::linear_forward(second, x_d.get(), w_d.get(), nullptr, y2.get(), m, n, k, nullptr);
  cuda::linear_forward(untuned, x_d.get(), w_d.get(), nullptr, y3.get(), m, n, k, nullptr);
  const auto a = test::download_bf16(y1), b = test::download_bf16(y2), c = test::download_bf16(y3);
  EXPECT_EQ(a, b);
  EXPECT_LT(test::relative_error(c, a), 8e-3);
  std::vector<float> want(m * n);
  reference::linear_forward(x.data(), w.data(), nullptr, want.data(), m, n, k);
  EXPECT_LT(test::relative_error(a, want), 8e-3);
}

TEST(GemmRunnerGpu, GeluAuxBiasAndDGeluBGrad) {
  MEGATUNE_REQUIRE_GPU();
  Inputs in;
  cuda::GemmRunner runner;
  DeviceBuffer<bf16> pre_d(kM * kN), y_d(kM * kN);
  cuda::linear_forward_gelu(runner, in.x_d.get(), in.w_d.get(), in.bias_d.get(), pre_d.get(), y_d.get(), kM,
                            kN, kK, nullptr);
  std::vector<float> pre(kM * kN), y(kM * kN);
  reference::linear_forward(in.x.data(), in.w.data(), in.bias.data(), pre.data(), kM, kN, kK);
  reference::bias_gelu_forward(pre.data(), nullptr, nullptr, y.data(), kM, kN);
  EXPECT_LT(test::relative_error(test::download_bf16(pre_d), pre), 8e-3);
  EXPECT_LT(test::relative_error(test::download_bf16(y_d), y), 1e-2);
  // Backward through the next layer (w2 [kK, kN] as nn.Linear of in=kN, out=kK) into the GELU: dx_pre [kM,
  // kN].
  const auto w2 = test::random_bf16_values(kK * kN, 5, 0.5f);
  const auto dz = test::random_bf16_values(kM * kK, 6, 0.5f);
  DeviceBuffer<bf16> w2_d(kK * kN), dz_d(kM * kK), dpre_d(kM * kN), dbias_d(kN);
  test::upload_bf16(w2_d, w2), test::upload_bf16(dz_d, dz);
  cuda::linear_backward_data_dgelu(runner, dz_d.get(), w2_d.get(), pre_d.get(), dpre_d.get(), dbias_d.get(),
                                   kM, kK, kN, nullptr);
  std::vector<float> da(kM * kN), dpre(kM * kN), dbias(kN);
  reference::linear_backward_data(dz.data(), w2.data(), da.data(), kM, kK, kN);
  reference::gelu_backward(da.data(), test::download_bf16(pre_d).data(), dpre.data(), dbias.data(), kM, kN,
                           false);
  EXPECT_LT(test::relative_error(test::download_bf16(dpre_d), dpre), 1.5e-2);
  EXPECT_LT(test::relative_error(test::download_bf16(dbias_d), dbias), 1.5e-2);
}

TEST(GemmRunnerGpu, BackwardDataAndWeightAccumulateIntoFp32) {
  MEGATUNE_REQUIRE_GPU();
  Inputs in;
  cuda::GemmRunner runner;
  DeviceBuffer<bf16> dx_d(kM * kK);
  cuda::linear_backward_data(runner, in.dy_d.get(), in.w_d.get(), dx_d.get(), kM, kN, kK, nullptr);
  std::vector<float> dx(kM * kK), dw(kN * kK, 0.25f);
  reference::linear_backward_data(in.dy.data(), in.w.data(), dx.data(), kM, kN, kK);
  EXPECT_LT(test::relative_error(test::download_bf16(dx_d), dx), 8e-3);
  DeviceBuffer<float> dw_d(kN * kK);
  std::vector<float> preset(kN * kK, 0.25f);
  test::upload(dw_d, preset);
  cuda::linear_backward_weight(runner, in.dy_d.get(), in.x_d.get(), dw_d.get(), kM, kN, kK, true, nullptr);
  cuda::linear_backward_weight(runner, in.dy_d.get(), in.x_d.get(), dw_d.get(), kM, kN, kK, true, nullptr);
  reference::linear_backward_weight(in.dy.data(), in.x.data(), dw.data(), nullptr, kM, kN, kK, true);
  reference::linear_backward_weight(in.dy.data(), in.x.data(), dw.data(), nullptr, kM, kN, kK, true);
  EXPECT_LT(test::relative_error(test::download(dw_d), dw), 1e-4);  // fp32 output, exact bf16 products
}

TEST(GemmRunnerGpu, BiasGradientOfWeightGemm) {
  MEGATUNE_REQUIRE_GPU();
  Inputs in;
  cuda::GemmRunner runner;
  cuda::GemmSpec spec = cuda::GemmSpec::linear_backward_weight(kM, kN, kK, cuda::GemmDType::kBF16);
  spec.epilogue = cuda::GemmEpilogue::kBGradA;
  DeviceBuffer<bf16> dw_d(kN * kK), db_d(kN);
  cuda::GemmArgs args;
  args.a = in.dy_d.get(), args.b = in.x_d.get(), args.d = dw_d.get(), args.bias_grad = db_d.get();
  runner.run(spec, args, nullptr);
  std::vector<float> dw(kN * kK), db(kN);
  reference::linear_backward_weight(in.dy.data(), in.x.data(), dw.data(), db.data(), kM, kN, kK, false);
  EXPECT_LT(test::relative_error(test::download_bf16(dw_d), dw), 8e-3);
  EXPECT_LT(test::relative_error(test::download_bf16(db_d), db), 8e-3);
}

TEST(GemmRunnerGpu, GeneralTransposesAndStridedBatch) {
  MEGATUNE_REQUIRE_GPU();
  const int64_t m = 64, n = 48, k = 80, batch = 3;
  const auto at = test::random_bf16_values(batch * k * m, 7), b = test::random_bf16_values(batch * k * n, 8);
  DeviceBuffer<bf16> at_d(batch * k * m), b_d(batch * k * n);
  DeviceBuffer<float> c_d(batch * m * n);
  test::upload_bf16(at_d, at), test::upload_bf16(b_d, b);
  cuda::GemmRunner runner;
  cuda::GemmSpec spec;
  spec.m = m, spec.n = n, spec.k = k, spec.trans_a = true, spec.d_type = cuda::GemmDType::kFP32;
  spec.batch_count = int(batch);
  cuda::GemmArgs args;
  args.a = at_d.get(), args.b = b_d.get(), args.d = c_d.get(), args.alpha = 0.5f;
  runner.run(spec, args, nullptr);
  std::vector<float> c(batch * m * n);
  for (int64_t i = 0; i < batch; ++i)
    reference::gemm(true, false, m, n, k, 0.5f, at.data() + i * k * m, m, b.data() + i * k * n, n, 0.0f,
                    c.data() + i * m * n, n);
  EXPECT_LT(test::relative_error(test::download(c_d), c), 1e-5);
}

}  // namespace
}  // namespace megatune::executor
