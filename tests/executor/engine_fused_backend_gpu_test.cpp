// The CUDA backend's fused entries against the CPU backend (bf16 emulated) on the same inputs: linear + GELU
// (cuBLASLt GELU_AUX_BIAS), weight gradients with the bias gradient in the epilogue (BGRADB, fp32
// accumulation), each on a width the epilogues take
// and on one that falls back to the unfused kernels; the embedding lookup from fp32 tables; SwiGLU's
// backward in place over its input.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "executor/cpu/cpu_backend.h"
#include "executor/cuda/cuda_backend.h"
#include "tests/executor/kernel_gpu_test_util.h"

namespace megatune::executor {
namespace {

constexpr std::int64_t kArenaBytes = std::int64_t(64) << 20;

// One backend with an arena and the kernel scratch the model would give it.
struct Side {
  explicit Side(Backend& b) : backend(b) {
    backend.reserve_arena(kArenaBytes);
    Backend::ScratchNeeds needs;
    needs.tokens = 256;
    needs.hidden = 512;
    needs.max_bias_cols = 512;
    needs.vocab = 512;
    const std::int64_t bytes = backend.scratch_bytes(needs);
    if (bytes > 0) backend.set_scratch(backend.allocate(DType::kFP32, 1, (bytes + 3) / 4, "scratch"));
  }
  Tensor tensor(DType dtype, std::int64_t rows, std::int64_t cols, const std::vector<float>& values) {
    Tensor t = backend.allocate(dtype, rows, cols, "test");
    backend.upload(t, values.data());
    return t;
  }
  std::vector<float> host(Tensor t) {
    std::vector<float> out(t.numel());
    backend.download(t, out.data());
    return out;
  }
  Backend& backend;
};

// CPU and CUDA backends side by side; the CUDA one asks for every fused epilogue (the defaults leave
// BGRADB off for speed: the *DefaultEpilogues test covers that path).
struct Pair {
  explicit Pair(bool all_epilogues = true) {
    if (all_epilogues) gpu_backend.set_gemm_epilogues({true, true});
  }
  CpuBackend cpu_backend{/*emulate_bf16=*/true};
  CudaBackend gpu_backend{0};
  Side cpu{cpu_backend}, gpu{gpu_backend};
};

const OpTag kTag{"test", 0, layouts::OpPhase::kForward};

// x (T, k) . w^T (n, k) + bias -> pre (T, n), out = gelu(pre).
void check_linear_gelu(std::int64_t T, std::int64_t n, std::int64_t k, bool bias) {
  MEGATUNE_REQUIRE_GPU();
  Pair p;
  const auto x = test::random_bf16_values(T * k, 1, 0.5f), w = test::random_bf16_values(n * k, 2, 0.1f),
             b = test::random_bf16_values(n, 3, 0.5f);
  std::vector<float> pre[2], out[2];
  int i = 0;
  for (Side* s : {&p.cpu, &p.gpu}) {
    GemmArgs g;
    g.a = s->tensor(DType::kBF16, T, k, x);
    g.b = s->tensor(DType::kBF16, n, k, w);
    g.transpose_b = true;
    g.c = s->tensor(DType::kBF16, T, n, std::vector<float>(T * n, 0.0f));
    if (bias) g.bias = s->tensor(DType::kBF16, 1, n, b);
    g.m = T, g.n = n, g.k = k;
    const Tensor y = s->tensor(DType::kBF16, T, n, std::vector<float>(T * n, 0.0f));
    s->backend.linear_gelu_forward(g, y, kTag);
    pre[i] = s->host(g.c);
    out[i] = s->host(y);
    ++i;
  }
  EXPECT_LT(test::relative_error(pre[1], pre[0]), 1e-2) << "n " << n;
  // Widths that are multiples of 8 run in cuBLASLt's GELU_AUX_BIAS epilogue (as GemmRunnerGpu tests),
  // others fall back; without a bias (GELU_AUX) cuBLASLt decides: report which path ran.
  if (bias) {
    EXPECT_EQ(p.gpu_backend.gelu_forward_use().fused, n % 8 == 0 ? 1 : 0);
    EXPECT_EQ(p.gpu_backend.gelu_forward_use().unfused, n % 8 == 0 ? 0 : 1);
  }
  std::printf("linear + gelu (n %lld, bias %d): %lld fused, %lld unfused\n", static_cast<long long>(n),
              int(bias), static_cast<long long>(p.gpu_backend.gelu_forward_use().fused),
              static_cast<long long>(p.gpu_backend.gelu_forward_use().unfused));
  EXPECT_LT(test::relative_error(out[1], out[0]), 1.5e-2) << "n " << n;
}

TEST(FusedBackendGpu, LinearGeluForwardWithBias) { check_linear_gelu(192, 136, 264, true); }
TEST(FusedBackendGpu, LinearGeluForwardWithoutBias) { check_linear_gelu(192, 136, 264, false); }
TEST(FusedBackendGpu, LinearGeluForwardOddWidthFallsBack) { check_linear_gelu(64, 100, 72, true); }

// dW (n, k) fp32 += dy^T (n, T) . x (T, k), d_bias (n) fp32 += column sums of dy.
void check_weight_gradient_with_bias(std::int64_t T, std::int64_t n, std::int64_t k,
                                     bool all_epilogues = true) {
  MEGATUNE_REQUIRE_GPU();
  Pair p(all_epilogues);
  const auto dy = test::random_bf16_values(T * n, 7, 0.5f), x = test::random_bf16_values(T * k, 8, 0.5f);
  std::vector<float> dw[2], db[2];
  int i = 0;
  for (Side* s : {&p.cpu, &p.gpu}) {
    GemmArgs g;
    g.a = s->tensor(DType::kBF16, T, n, dy);
    g.transpose_a = true;
    g.b = s->tensor(DType::kBF16, T, k, x);
    g.c = s->tensor(DType::kFP32, n, k, std::vector<float>(n * k, 0.5f));
    g.bias_grad = s->tensor(DType::kFP32, 1, n, std::vector<float>(n, -1.0f));
    g.m = n, g.n = k, g.k = T;
    g.accumulate = true;
    s->backend.gemm(g, kTag);
    s->backend.gemm(g, kTag);
    dw[i] = s->host(g.c);
    db[i] = s->host(g.bias_grad);
    ++i;
  }
  EXPECT_LT(test::relative_error(dw[1], dw[0]), 1e-4) << "n " << n;  // fp32 output of bf16-exact products
  // Whether cuBLASLt runs BGRADB with an accumulating fp32 output is its choice; report which path ran.
  EXPECT_EQ(p.gpu_backend.wgrad_bias_use().fused + p.gpu_backend.wgrad_bias_use().unfused, 2);
  if (!all_epilogues) {
    EXPECT_EQ(p.gpu_backend.wgrad_bias_use().unfused, 2);
  }
  std::printf("wgrad + bias gradient (n %lld): %lld fused (BGRADB), %lld unfused\n",
              static_cast<long long>(n), static_cast<long long>(p.gpu_backend.wgrad_bias_use().fused),
              static_cast<long long>(p.gpu_backend.wgrad_bias_use().unfused));
  EXPECT_LT(test::relative_error(db[1], db[0]), 1e-4) << "n " << n;
}

TEST(FusedBackendGpu, WeightGradientCarriesTheBiasGradient) {
  check_weight_gradient_with_bias(256, 136, 264);
}
TEST(FusedBackendGpu, WeightGradientBiasGradientOddWidth) { check_weight_gradient_with_bias(64, 100, 72); }

TEST(FusedBackendGpu, WeightGradientBiasGradientDefaultEpilogues) {
  EXPECT_FALSE(CudaBackend::GemmEpilogues{}.wgrad_bias);
  check_weight_gradient_with_bias(256, 136, 264, false);
}

TEST(FusedBackendGpu, EmbeddingFromFp32TablesMatchesBf16Tables) {
  MEGATUNE_REQUIRE_GPU();
  Pair p;
  const std::int64_t vocab = 300, hidden = 136, seq = 16, tokens = 64;
  const auto word = test::random_bf16_values(vocab * hidden, 9),
             position = test::random_bf16_values(seq * hidden, 10);
  std::vector<std::int32_t> ids(tokens);
  for (std::int64_t t = 0; t < tokens; ++t) ids[t] = static_cast<std::int32_t>((t * 37) % vocab);
  std::vector<float> out[3];
  int i = 0;
  for (Side* s : {&p.cpu, &p.gpu, &p.gpu}) {
    const DType table_dtype = i == 2 ? DType::kBF16 : DType::kFP32;
    Tensor id_t = s->backend.allocate_int32(tokens, 1, "ids");
    s->backend.upload_int32(id_t, ids.data());
    const Tensor out_t = s->tensor(DType::kBF16, tokens, hidden, std::vector<float>(tokens * hidden, 0.0f));
    s->backend.embedding_forward(id_t, s->tensor(table_dtype, vocab, hidden, word),
                                 s->tensor(table_dtype, seq, hidden, position), seq, out_t, kTag);
    out[i++] = s->host(out_t);
  }
  EXPECT_EQ(out[1], out[2]);  // bf16-exact tables: fp32 and bf16 lookups agree bit for bit
  EXPECT_LT(test::relative_error(out[1], out[0]), 1e-2);
}

TEST(FusedBackendGpu, SwigluBackwardInPlaceOverItsInput) {
  MEGATUNE_REQUIRE_GPU();
  for (std::int64_t f : {136, 100}) {  // vectorized, and the scalar fallback
    Pair p;
    const std::int64_t T = 96;
    const auto x = test::random_bf16_values(T * 2 * f, 11), dy = test::random_bf16_values(T * f, 12);
    std::vector<float> y[2], dx[2];
    int i = 0;
    for (Side* s : {&p.cpu, &p.gpu}) {
      const Tensor in = s->tensor(DType::kBF16, T, 2 * f, x);
      const Tensor out = s->tensor(DType::kBF16, T, f, std::vector<float>(T * f, 0.0f));
      s->backend.activation_forward(ActivationKind::kSwiglu, in, out, kTag);
      y[i] = s->host(out);
      s->backend.activation_backward(ActivationKind::kSwiglu, in, s->tensor(DType::kBF16, T, f, dy), in,
                                     kTag);
      dx[i] = s->host(in);
      ++i;
    }
    EXPECT_LT(test::relative_error(y[1], y[0]), 1e-2) << "f " << f;
    EXPECT_LT(test::relative_error(dx[1], dx[0]), 1e-2) << "f " << f;
  }
}

// The model's MLP backward: one pass turns fc2's data gradient into fc1's output gradient (in place over the
// fc1 output) and recomputes the activation output (in place over the data gradient).
TEST(FusedBackendGpu, ActivationBackwardRecomputesTheOutputInPlace) {
  MEGATUNE_REQUIRE_GPU();
  for (ActivationKind kind : {ActivationKind::kGelu, ActivationKind::kSwiglu})
    for (std::int64_t f : {136, 100}) {  // vectorized, and the scalar fallback
      Pair p;
      const std::int64_t T = 96, in_cols = kind == ActivationKind::kSwiglu ? 2 * f : f;
      const auto x = test::random_bf16_values(T * in_cols, 13, 1.5f),
                 dy = test::random_bf16_values(T * f, 14);
      std::vector<float> y[2], dx[2];
      int i = 0;
      for (Side* s : {&p.cpu, &p.gpu}) {
        const Tensor in = s->tensor(DType::kBF16, T, in_cols, x);
        const Tensor d = s->tensor(DType::kBF16, T, f, dy);
        s->backend.activation_backward_recompute(kind, in, d, in, d, kTag);
        dx[i] = s->host(in);
        y[i] = s->host(d);
        ++i;
      }
      const char* name = kind == ActivationKind::kGelu ? "gelu" : "swiglu";
      EXPECT_LT(test::relative_error(y[1], y[0]), 1e-2) << name << " f " << f;
      EXPECT_LT(test::relative_error(dx[1], dx[0]), 1e-2) << name << " f " << f;
    }
}

}  // namespace
}  // namespace megatune::executor
