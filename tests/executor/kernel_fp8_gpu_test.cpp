// FP8 on the CUDA backend against the CPU reference (executor/kernels/reference_fp8.h): the casts (both
// recipes, the transposed copy, the scaling state) bit for bit, the FP8 GEMMs of a linear layer within fp32
// accumulation's error of the dequantized reference, and a small model trained with FP8 linears following
// its bf16 curve on the GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <sstream>
#include <vector>

#include "executor/cpu/cpu_backend.h"
#include "executor/cuda/cuda_backend.h"
#include "executor/kernels/reference_elementwise.h"
#include "executor/kernels/reference_fp8.h"
#include "executor/parallel/communicator.h"
#include "executor/training/training_run.h"
#include "tests/executor/small_models.h"

namespace megatune::executor {
namespace {

constexpr std::int64_t kArena = std::int64_t(64) << 20;

std::vector<float> bf16_values(std::int64_t n, unsigned seed, float spread) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, spread);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (float& x : v) x = normal(rng);
  reference::round_to_bf16_inplace(v.data(), n);
  return v;
}

std::vector<float> initial_state(int history) {
  std::vector<float> s(layouts::kFp8History + history, 0.0f);
  s[layouts::kFp8Scale] = s[layouts::kFp8ScaleInv] = 1.0f;
  return s;
}

// An FP8 tensor downloaded as floats: the CUDA backend stores one byte per element.
std::vector<float> fp8_values(CudaBackend& backend, Tensor t, layouts::Fp8Encoding e) {
  std::vector<unsigned char> bytes(static_cast<std::size_t>(t.numel()));
  backend.synchronize();
  cudaMemcpy(bytes.data(), t.data, bytes.size(), cudaMemcpyDeviceToHost);
  std::vector<float> out(bytes.size());
  // Decode by rounding every candidate: the byte's value is the one FP8 value with that bit pattern.
  static std::vector<float> table[2];
  std::vector<float>& decode = table[e == layouts::Fp8Encoding::kE5M2 ? 1 : 0];
  if (decode.empty()) {
    decode.resize(256);
    const int mantissa = e == layouts::Fp8Encoding::kE5M2 ? 2 : 3,
              bias = e == layouts::Fp8Encoding::kE5M2 ? 15 : 7;
    for (int b = 0; b < 256; ++b) {
      const int sign = b >> 7, exponent = (b >> mantissa) & ((1 << (7 - mantissa)) - 1),
                m = b & ((1 << mantissa) - 1);
      const float magnitude = exponent == 0 ? std::ldexp(float(m), 1 - bias - mantissa)
                                            : std::ldexp(1.0f + float(m) / (1 << mantissa), exponent - bias);
      decode[b] = sign ? -magnitude : magnitude;
    }
  }
  for (std::size_t i = 0; i < bytes.size(); ++i) out[i] = decode[bytes[i]];
  return out;
}

enum class CastOutputs { kBoth, kRowsOnly, kTransposedOnly };

// rows x cols with both outputs: 96 x 80 takes the element-wise kernel, 128 x 192 the 64 x 64 tiles of
// 8-value vectors, 128 x 256 the 64 x 128 tiles transposed through byte permutes; with the rows only, 96 x 80
// and 128 x 256 take the vector kernel (80: a partial block of vectors); the transposed copy only, the
// tiles without their row-major stores. When strided, src is a view of the first cols of rows 64 values
// wider.
void expect_cast_matches_reference(bool current, layouts::Fp8Encoding e, std::int64_t rows, std::int64_t cols,
                                   CastOutputs outputs = CastOutputs::kBoth, bool strided = false) {
  if (CudaBackend::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  CudaBackend backend(0);
  backend.reserve_arena(kArena);
  const std::int64_t ld = strided ? cols + 64 : cols;
  const Tensor buffer = backend.allocate(DType::kBF16, rows, ld, "src");
  Tensor src = buffer;
  src.cols = cols;
  src.row_stride = ld;
  const Tensor out =
      outputs == CastOutputs::kTransposedOnly ? Tensor{} : backend.allocate(DType::kFP8, rows, cols, "out");
  const Tensor out_t =
      outputs == CastOutputs::kRowsOnly ? Tensor{} : backend.allocate(DType::kFP8, cols, rows, "out_t");
  const int history = 3;
  const Tensor state = backend.allocate(DType::kFP32, 1, layouts::kFp8History + history, "state");
  std::vector<float> ref_state = initial_state(history);
  backend.upload(state, ref_state.data());
  reference::Fp8CastParams params{e, current, /*margin=*/1, history, /*amax_max=*/true};
  for (int use = 0; use < 4; ++use) {  // spreads that change from use to use move the delayed scale
    std::vector<float> host = bf16_values(rows * ld, 7 + use, use == 2 ? 40.0f : 1.5f);
    if (use == 3) host[static_cast<std::size_t>((rows / 2) * ld + cols - 1)] = 900.0f;  // saturates E4M3
    backend.upload(buffer, host.data());
    Fp8CastArgs args{.src = src,
                     .out = out,
                     .out_transposed = out_t,
                     .encoding = e,
                     .state = state,
                     .current_scaling = current,
                     .margin = 1,
                     .history_len = history,
                     .amax_max = true};
    backend.fp8_cast(args, {"cast", -1, layouts::OpPhase::kForward});
    std::vector<float> want(rows * cols), want_t(rows * cols);
    reference::fp8_cast(host.data(), rows, cols, ld, want.data(), want_t.data(), ref_state.data(), params,
                        nullptr);
    if (!out.empty()) {
      EXPECT_EQ(fp8_values(backend, out, e), want) << "use " << use;
    }
    if (!out_t.empty()) {
      EXPECT_EQ(fp8_values(backend, out_t, e), want_t) << "use " << use;
    }
    std::vector<float> got_state(ref_state.size());
    backend.download(state, got_state.data());
    for (std::size_t i = 0; i < got_state.size(); ++i)
      EXPECT_EQ(got_state[i], ref_state[i]) << "use " << use << " state field " << i;
  }
}

TEST(Fp8Gpu, CurrentScalingCastMatchesTheReference) {
  expect_cast_matches_reference(true, layouts::Fp8Encoding::kE4M3, 96, 80);
  expect_cast_matches_reference(true, layouts::Fp8Encoding::kE4M3, 128, 192);
  expect_cast_matches_reference(true, layouts::Fp8Encoding::kE4M3, 128, 256);
  expect_cast_matches_reference(true, layouts::Fp8Encoding::kE4M3, 192, 384, CastOutputs::kBoth, true);
}
TEST(Fp8Gpu, DelayedScalingCastMatchesTheReference) {
  expect_cast_matches_reference(false, layouts::Fp8Encoding::kE5M2, 96, 80);
  expect_cast_matches_reference(false, layouts::Fp8Encoding::kE5M2, 128, 192);
  expect_cast_matches_reference(false, layouts::Fp8Encoding::kE5M2, 128, 256);
  expect_cast_matches_reference(false, layouts::Fp8Encoding::kE4M3, 192, 384, CastOutputs::kBoth, true);
}
TEST(Fp8Gpu, CastsWithOneOutputMatchTheReference) {
  for (bool current : {true, false}) {
    expect_cast_matches_reference(current, layouts::Fp8Encoding::kE4M3, 96, 80, CastOutputs::kRowsOnly);
    expect_cast_matches_reference(current, layouts::Fp8Encoding::kE4M3, 128, 256, CastOutputs::kRowsOnly,
                                  true);
    expect_cast_matches_reference(current, layouts::Fp8Encoding::kE4M3, 200, 264, CastOutputs::kRowsOnly);
    expect_cast_matches_reference(current, layouts::Fp8Encoding::kE4M3, 128, 256,
                                  CastOutputs::kTransposedOnly);
    expect_cast_matches_reference(current, layouts::Fp8Encoding::kE4M3, 96, 80, CastOutputs::kTransposedOnly);
  }
}

// y = x . W^T (bf16 out, E4M3 x E4M3) and dW = dy^T . x (fp32 out accumulated, E5M2 x E4M3) on cuBLASLt's
// FP8 kernels against the dequantized reference.
TEST(Fp8Gpu, GemmsMatchTheDequantizedReference) {
  if (CudaBackend::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  CudaBackend backend(0);
  backend.reserve_arena(kArena);
  const std::int64_t m = 128, n = 96, k = 160;
  auto fp8_tensor = [&](std::int64_t r, std::int64_t c, layouts::Fp8Encoding e, unsigned seed,
                        Tensor& scale_inv, std::vector<float>& dequantized) {
    const std::vector<float> host = bf16_values(r * c, seed, 1.0f);
    const Tensor src = backend.allocate(DType::kBF16, r, c, "src");
    backend.upload(src, host.data());
    const Tensor out = backend.allocate(DType::kFP8, r, c, "fp8");
    const Tensor state = backend.allocate(DType::kFP32, 1, layouts::kFp8History + 1, "state");
    const std::vector<float> init = initial_state(1);
    backend.upload(state, init.data());
    backend.fp8_cast({.src = src, .out = out, .encoding = e, .state = state},
                     {"cast", -1, layouts::OpPhase::kForward});
    scale_inv = carve(state, layouts::kFp8ScaleInv, 1, 1, 4);
    std::vector<float> st(init.size());
    backend.download(state, st.data());
    dequantized = fp8_values(backend, out, e);
    for (float& v : dequantized) v *= st[layouts::kFp8ScaleInv];
    return out;
  };
  Tensor sa, sb;
  std::vector<float> a, b;
  const Tensor x = fp8_tensor(m, k, layouts::Fp8Encoding::kE4M3, 1, sa, a);
  const Tensor w = fp8_tensor(n, k, layouts::Fp8Encoding::kE4M3, 2, sb, b);
  const Tensor y = backend.allocate(DType::kFP32, m, n, "y");
  GemmArgs g{.a = x, .b = w, .transpose_b = true, .c = y, .m = m, .n = n, .k = k};
  g.a_scale_inv = sa;
  g.b_scale_inv = sb;
  g.fast_accumulate = true;
  backend.gemm(g, {"fp8_fwd", -1, layouts::OpPhase::kForward});
  std::vector<float> got(m * n);
  backend.download(y, got.data());
  double worst = 0;
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      double want = 0, magnitude = 0;
      for (std::int64_t q = 0; q < k; ++q) {
        want += double(a[i * k + q]) * b[j * k + q];
        magnitude += std::fabs(double(a[i * k + q]) * b[j * k + q]);
      }
      worst = std::max(worst, std::fabs(got[i * n + j] - want) / (magnitude + 1e-6));
    }
  EXPECT_LT(worst, 1e-3);  // fp32 (fast) accumulation of exact products
  // Accumulating into the fp32 output (the weight gradient's beta = 1), an E5M2 A.
  Tensor sg;
  std::vector<float> gd;
  const Tensor dy = fp8_tensor(m, k, layouts::Fp8Encoding::kE5M2, 3, sg, gd);
  std::vector<float> before = got;
  GemmArgs acc{.a = dy, .b = w, .transpose_b = true, .c = y, .m = m, .n = n, .k = k, .accumulate = true};
  acc.a_encoding = layouts::Fp8Encoding::kE5M2;
  acc.a_scale_inv = sg;
  acc.b_scale_inv = sb;
  backend.gemm(acc, {"fp8_acc", -1, layouts::OpPhase::kBackward});
  backend.download(y, got.data());
  worst = 0;
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      double want = before[i * n + j], magnitude = std::fabs(before[i * n + j]);
      for (std::int64_t q = 0; q < k; ++q) {
        want += double(gd[i * k + q]) * b[j * k + q];
        magnitude += std::fabs(double(gd[i * k + q]) * b[j * k + q]);
      }
      worst = std::max(worst, std::fabs(got[i * n + j] - want) / (magnitude + 1e-6));
    }
  EXPECT_LT(worst, 1e-4);
}

// A 2-layer Llama-shaped model (head dim 64 for the CUDA attention) trained 40 iterations on mock data with
// FP8 linears under each recipe: the loss falls and every logged point after warm-up (5-iteration means)
// stays within 4% of the bf16 run on the same GPU. The CPU test holds 1.5% on text; here the loss falls
// from log(512) = 6.2 to a small fraction of it in 40 steps of 4 sequences, so one absolute deviation is a
// larger fraction late in the run (measured on H200: at most 2.7%, delayed scaling over a 16-entry max
// history).
TEST(Fp8Gpu, TrainingFollowsTheBf16Curve) {
  if (CudaBackend::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  auto train = [](const layouts::Fp8Settings& fp8) {
    RunConfig run;
    TrainerConfig& c = run.trainer;
    c.model = test::two_layer_model(/*llama=*/true, 512, 128);
    c.model.fp8 = fp8;
    c.batch.micro_batch = 2;
    c.batch.seq = 128;
    c.batch.num_microbatches = 2;
    c.compute_dtype = DType::kBF16;
    c.lr.max_lr = 3e-3;
    c.lr.min_lr = 3e-4;
    c.lr.style = LrDecayStyle::kCosine;
    c.lr.warmup_samples = 4 * c.global_batch_size();
    c.lr.decay_samples = 40 * c.global_batch_size();
    run.train_iters = 40;
    run.data.mock_data = true;
    run.data.gpt.vocab_size = 512;
    run.data.gpt.eod_token = 0;
    run.data.mock.vocab_size = 512;
    run.data.mock.max_sequence_length = 200;
    run.data.mock.num_sequences = 2000;
    run.log_interval = 1000;
    CudaBackend backend(0);
    SingleRankCommunicator communicator(backend);
    std::ostringstream log;
    TrainingRun training(run, backend, communicator, log);
    return training.run();
  };
  const std::vector<IterationRecord> bf16 = train({});
  layouts::Fp8Settings delayed;
  delayed.format = layouts::Fp8Format::kHybrid;
  delayed.amax_history_len = 16;
  delayed.amax_max = true;
  layouts::Fp8Settings tensorwise;
  tensorwise.format = layouts::Fp8Format::kE4M3;
  tensorwise.recipe = layouts::Fp8Recipe::kTensorwise;
  for (const layouts::Fp8Settings& fp8 : {delayed, tensorwise}) {
    const std::vector<IterationRecord> run = train(fp8);
    ASSERT_EQ(run.size(), bf16.size());
    EXPECT_LT(run.back().step.loss, run.front().step.loss - 0.5) << layouts::describe(fp8);
    for (std::size_t end = 10; end <= run.size(); end += 5) {
      double a = 0, b = 0;
      for (std::size_t i = end - 5; i < end; ++i) {
        a += run[i].step.loss / 5;
        b += bf16[i].step.loss / 5;
      }
      EXPECT_NEAR(a / b, 1.0, 0.04) << layouts::describe(fp8) << " at iteration " << end;
    }
  }
}

}  // namespace
}  // namespace megatune::executor
