// The CUDA backend's MoE kernels against the CPU reference (reference_moe.h) on bf16-exact inputs: the
// permutation (exact), the weighted and unweighted combine and the combine's backward (d_rows within one bf16
// rounding, d_probs within fp32 summation-order error), the plan uploaded once while it is unchanged, and
// the per-expert GEMMs on bucketed plans (run_ragged) against a host GEMM for uneven row counts.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "executor/cuda/cuda_backend.h"
#include "executor/kernels/reference_elementwise.h"
#include "executor/kernels/reference_moe.h"
#include "executor/parallel/tensor_parallel.h"

namespace megatune::executor {
namespace {

constexpr std::int64_t kArenaBytes = std::int64_t(96) << 20;

std::vector<float> random_values(std::size_t n, std::uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = reference::round_to_bf16(dist(rng));
  return v;
}

// Megatron's permutation order: the (token, choice) pairs sorted by expert, tokens in order within one;
// every `drop_every`-th pair is dropped (token_rows -1), as a capacity factor drops choices.
MoePermutation make_plan(std::int64_t tokens, int topk, int experts, int drop_every, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int> expert(static_cast<std::size_t>(tokens * topk));
  for (std::int64_t t = 0; t < tokens; ++t) {
    std::vector<int> all(experts);
    for (int e = 0; e < experts; ++e) all[e] = e;
    std::shuffle(all.begin(), all.end(), rng);
    // Uneven loads: the first choice leans to the low experts.
    if (rng() % 2 == 0) std::sort(all.begin(), all.begin() + std::min(experts, 3));
    for (int j = 0; j < topk; ++j) expert[t * topk + j] = all[j];
  }
  MoePermutation p;
  p.tokens = tokens;
  p.topk = topk;
  p.token_rows.assign(expert.size(), -1);
  p.token_probs.assign(expert.size(), 0.0f);
  std::uniform_real_distribution<float> prob(0.05f, 0.95f);
  for (int e = 0; e < experts; ++e)
    for (std::int64_t t = 0; t < tokens; ++t)
      for (int j = 0; j < topk; ++j) {
        const std::int64_t i = t * topk + j;
        if (expert[i] != e || (drop_every > 0 && i % drop_every == drop_every - 1)) continue;
        p.token_rows[i] = static_cast<std::int32_t>(p.row_token.size());
        p.token_probs[i] = prob(rng);
        p.row_token.push_back(static_cast<std::int32_t>(t));
      }
  return p;
}

class MoeKernels : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaBackend::device_count() == 0) GTEST_SKIP() << "no CUDA device";
    gpu_ = std::make_unique<CudaBackend>(0);
    gpu_->reserve_arena(kArenaBytes);
  }
  Tensor tensor(DType dtype, std::int64_t rows, std::int64_t cols, const std::vector<float>& values) {
    Tensor t = gpu_->allocate(dtype, rows, cols, "test");
    gpu_->upload(t, values.data());
    return t;
  }
  std::vector<float> host(Tensor t) {
    std::vector<float> out(static_cast<std::size_t>(t.numel()));
    gpu_->download(t, out.data());
    return out;
  }
  std::unique_ptr<CudaBackend> gpu_;
};

// |got - want| within one bf16 rounding of want (2^-8 relative) plus `absolute`.
void expect_bf16_close(const std::vector<float>& got, const std::vector<float>& want, float absolute,
                       const char* what) {
  ASSERT_EQ(got.size(), want.size());
  int bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (!(std::fabs(got[i] - want[i]) <= std::fabs(want[i]) / 256.0f + absolute) && ++bad <= 5)
      ADD_FAILURE() << what << "[" << i << "] = " << got[i] << ", reference " << want[i];
  EXPECT_EQ(bad, 0) << what;
}

TEST_F(MoeKernels, PermuteCombineAndBackwardMatchTheReference) {
  for (const std::int64_t hidden : {256, 1032, 12}) {  // 12: not a multiple of 8, the host path
    SCOPED_TRACE("hidden " + std::to_string(hidden));
    const std::int64_t tokens = 301;
    const int topk = 2;
    const MoePermutation plan = make_plan(tokens, topk, 8, /*drop_every=*/7, 11);
    const std::int64_t R = plan.rows();
    ASSERT_LT(R, tokens * topk);  // some choices dropped
    const std::vector<float> x = random_values(tokens * hidden, 1), expert_out = random_values(R * hidden, 2),
                             dy = random_values(tokens * hidden, 3);
    const Tensor x_d = tensor(DType::kBF16, tokens, hidden, x),
                 rows_d = tensor(DType::kBF16, R, hidden, expert_out),
                 dy_d = tensor(DType::kBF16, tokens, hidden, dy);
    const Tensor permuted = gpu_->allocate(DType::kBF16, R, hidden, "test"),
                 combined = gpu_->allocate(DType::kBF16, tokens, hidden, "test"),
                 summed = gpu_->allocate(DType::kBF16, tokens, hidden, "test"),
                 d_rows = gpu_->allocate(DType::kBF16, R, hidden, "test");

    gpu_->moe_permute(x_d, plan, permuted, {"permute"});
    std::vector<float> want(R * hidden);
    reference::moe_permute(x.data(), plan.row_token.data(), R, hidden, want.data());
    EXPECT_EQ(host(permuted), want) << "the permutation copies rows exactly";

    gpu_->moe_unpermute(rows_d, plan, true, combined, {"unpermute"});
    std::vector<float> want_combined(tokens * hidden), want_summed(tokens * hidden);
    reference::moe_unpermute(expert_out.data(), plan.token_rows.data(), plan.token_probs.data(), tokens, topk,
                             hidden, want_combined.data());
    expect_bf16_close(host(combined), want_combined, 1e-6f, "weighted combine");
    gpu_->moe_unpermute(rows_d, plan, false, summed, {"unpermute"});
    reference::moe_unpermute(expert_out.data(), plan.token_rows.data(), nullptr, tokens, topk, hidden,
                             want_summed.data());
    expect_bf16_close(host(summed), want_summed, 1e-6f, "unweighted combine");

    std::vector<float> d_probs, want_d_rows(R * hidden, 0.0f), want_d_probs(tokens * topk);
    gpu_->moe_unpermute_backward(dy_d, rows_d, plan, d_rows, d_probs, {"unpermute"});
    reference::moe_unpermute_backward(dy.data(), expert_out.data(), plan.token_rows.data(),
                                      plan.token_probs.data(), tokens, topk, hidden, want_d_rows.data(),
                                      want_d_probs.data());
    expect_bf16_close(host(d_rows), want_d_rows, 1e-6f, "d_rows");
    ASSERT_EQ(d_probs.size(), want_d_probs.size());
    // fp32 dot products of `hidden` unit-normal pairs: the summation order's error is ~1e-6 * hidden.
    for (std::size_t i = 0; i < d_probs.size(); ++i)
      EXPECT_NEAR(d_probs[i], want_d_probs[i], 1e-5 * hidden) << "d_probs[" << i << "]";
    for (std::size_t i = 0; i < d_probs.size(); ++i) {
      if (plan.token_rows[i] < 0) {
        EXPECT_EQ(d_probs[i], 0.0f) << "a dropped choice has no gradient";
      }
    }
  }
}

TEST_F(MoeKernels, PlanIsUploadedOnceWhileUnchanged) {
  const std::int64_t tokens = 64, hidden = 64;
  MoePermutation plan = make_plan(tokens, 2, 4, 0, 5);
  const Tensor x = tensor(DType::kBF16, tokens, hidden, random_values(tokens * hidden, 7));
  const Tensor rows = gpu_->allocate(DType::kBF16, plan.rows(), hidden, "test"),
               y = gpu_->allocate(DType::kBF16, tokens, hidden, "test");
  std::vector<float> d_probs;
  const std::int64_t before = gpu_->moe_transfers().plan_uploads;
  gpu_->moe_permute(x, plan, rows, {"permute"});
  gpu_->moe_unpermute(rows, plan, true, y, {"unpermute"});
  gpu_->moe_unpermute_backward(y, rows, plan, rows, d_probs, {"unpermute"});
  gpu_->moe_unpermute(rows, plan, false, y, {"permute"});
  EXPECT_EQ(gpu_->moe_transfers().plan_uploads - before, 1) << "one upload for the layer's four kernels";
  EXPECT_EQ(gpu_->moe_transfers().d_probs_downloads, 1);
  // New routing in the same plan object (the next step): uploaded again, and the kernels use it.
  plan = make_plan(tokens, 2, 4, 0, 6);
  gpu_->moe_permute(x, plan, rows, {"permute"});
  EXPECT_EQ(gpu_->moe_transfers().plan_uploads - before, 2);
  std::vector<float> want(plan.rows() * hidden), xs = host(x);
  reference::moe_permute(xs.data(), plan.row_token.data(), plan.rows(), hidden, want.data());
  EXPECT_EQ(host(rows), want);
}

// C (m, n) (+)= op(A) op(B) on the host in double, for row-major A, B as GemmArgs describes them.
std::vector<float> host_gemm(const GemmArgs& g, const std::vector<float>& a, const std::vector<float>& b,
                             std::vector<float> c) {
  for (std::int64_t i = 0; i < g.m; ++i)
    for (std::int64_t j = 0; j < g.n; ++j) {
      double sum = g.accumulate ? c[i * g.n + j] : 0.0;
      for (std::int64_t p = 0; p < g.k; ++p) {
        const float av = g.transpose_a ? a[p * g.m + i] : a[i * g.k + p];
        const float bv = g.transpose_b ? b[j * g.k + p] : b[p * g.n + j];
        sum += double(av) * bv;
      }
      c[i * g.n + j] = float(sum);
    }
  return c;
}

TEST_F(MoeKernels, RaggedExpertGemmsMatchAHostGemm) {
  // Expert row counts around and between the plans' buckets, one of them empty; two steps with different
  // counts reuse the bucket plans.
  const std::int64_t in = 256, out = 384;
  for (const std::vector<std::int64_t>& counts : {std::vector<std::int64_t>{37, 200, 0, 513, 128, 1},
                                                  std::vector<std::int64_t>{64, 190, 3, 520, 129, 9}}) {
    std::int64_t total = 0;
    for (std::int64_t n : counts) total += n;
    const std::vector<float> xs = random_values(total * in, 21), dys = random_values(total * out, 22);
    const Tensor x = tensor(DType::kBF16, total, in, xs), dy = tensor(DType::kBF16, total, out, dys);
    const Tensor y = gpu_->allocate(DType::kBF16, total, out, "test");
    std::vector<Tensor> weights, grads;
    std::vector<std::vector<float>> ws, gs;
    std::vector<GemmArgs> forward, wgrad;
    std::int64_t first = 0;
    for (std::size_t e = 0; e < counts.size(); ++e) {
      ws.push_back(random_values(out * in, 30 + e, 0.1f));
      gs.push_back(random_values(out * in, 40 + e));
      weights.push_back(tensor(DType::kBF16, out, in, ws.back()));
      grads.push_back(tensor(DType::kFP32, out, in, gs.back()));
      const std::int64_t n = counts[e];
      if (n > 0) {
        forward.push_back(
            linear_forward_args(rows_of(x, first, n, 2), weights.back(), rows_of(y, first, n, 2), {}, n));
        wgrad.push_back(linear_weight_grad_args(rows_of(dy, first, n, 2), rows_of(x, first, n, 2),
                                                weights.back(), grads.back(), {}, n));
      }
      first += n;
    }
    gpu_->grouped_gemm(forward, {"expert_fc1"});
    gpu_->grouped_gemm(wgrad, {"expert_fc1_wgrad"});
    const std::vector<float> y_host = host(y);
    first = 0;
    for (std::size_t e = 0; e < counts.size(); ++e) {
      const std::int64_t n = counts[e];
      if (n == 0) continue;
      SCOPED_TRACE("expert " + std::to_string(e) + " rows " + std::to_string(n));
      const std::vector<float> x_e(xs.begin() + first * in, xs.begin() + (first + n) * in),
          dy_e(dys.begin() + first * out, dys.begin() + (first + n) * out);
      GemmArgs f = linear_forward_args({}, weights[e], {}, {}, n);
      const std::vector<float> want_y = host_gemm(f, x_e, ws[e], std::vector<float>(n * out));
      const std::vector<float> got_y(y_host.begin() + first * out, y_host.begin() + (first + n) * out);
      expect_bf16_close(got_y, want_y, 1e-3f, "expert forward");
      GemmArgs w = linear_weight_grad_args({}, {}, weights[e], {}, {}, n);
      const std::vector<float> want_g = host_gemm(w, dy_e, x_e, gs[e]);
      const std::vector<float> got_g = host(grads[e]);
      for (std::size_t i = 0; i < got_g.size(); ++i)
        ASSERT_NEAR(got_g[i], want_g[i], 1e-4 * std::sqrt(double(n)) + 1e-5 * std::fabs(want_g[i]))
            << "weight gradient [" << i << "]";
      first += n;
    }
  }
}

}  // namespace
}  // namespace megatune::executor
