// The vectorized optimizer kernels against the scalar ones on tensors that take every path: 16-byte groups,
// a tensor whose buffers are misaligned (element accesses), partial last groups, several chunks, no bf16
// copy. AdamW and clipping must agree bitwise; the gradient norm must not depend on alignment; tensors
// flagged decoupled (--decoupled-lr) step at their own rate.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "executor/cuda/optimizer_kernels.h"
#include "executor/kernels/reference_optimizer.h"
#include "tests/executor/kernel_gpu_test_util.h"

namespace megatune::executor {
namespace {

using cuda::OptimizerKernelVariant;
using test::DeviceBuffer;
using bf16 = __nv_bfloat16;

struct TensorShape {
  int64_t numel;
  int64_t misalign;  // elements added to the 64-aligned offset (1: 4-byte aligned buffers only)
  bool decay;
  bool model_copy;
  bool decoupled = false;  // updated at AdamWHyper::decoupled_lr
};

// Sizes: three chunks plus a partial group; shorter than one group; misaligned over two chunks; an exact
// number of groups; one element; no bf16 copy.
const std::vector<TensorShape> kShapes = {
    {65536 * 3 + 5, 0, true, true}, {7, 0, false, true}, {100000, 1, true, true},
    {4096 * 2, 0, false, true},     {1, 0, true, true},  {70001, 0, true, false}};

// One flat buffer per role with every tensor at a fixed offset (the engine's layout), filled from host data.
class FlatOptimizerState {
 public:
  FlatOptimizerState(const std::vector<TensorShape>& shapes, int64_t extra_misalign, uint32_t seed) {
    int64_t offset = 0;
    for (const TensorShape& s : shapes) {
      offset = (offset + 63) / 64 * 64 + s.misalign + extra_misalign;
      offsets_.push_back(offset);
      offset += s.numel;
    }
    total_ = offset;
    // Each tensor's values depend on the seed and its index only (not on where it lies in the buffers).
    for (auto* v : {&param_, &grad_, &exp_avg_, &exp_avg_sq_}) v->assign(total_, 0.0f);
    for (size_t i = 0; i < shapes.size(); ++i) {
      const auto fill = [&](std::vector<float>& flat, uint32_t role, float scale) {
        const std::vector<float> values =
            test::random_bf16_values(shapes[i].numel, seed + 10 * i + role, scale);
        std::copy(values.begin(), values.end(), flat.begin() + offsets_[i]);
      };
      fill(param_, 0, 1.0f);
      fill(grad_, 1, 0.01f);
      fill(exp_avg_, 2, 0.001f);
      fill(exp_avg_sq_, 3, 0.03f);
    }
    for (float& x : exp_avg_sq_) x *= x;
    for (auto* d : {&param_d_, &grad_d_, &exp_avg_d_, &exp_avg_sq_d_})
      d->reset(new DeviceBuffer<float>(total_));
    model_d_.reset(new DeviceBuffer<bf16>(total_));
    model_d_->zero();
    test::upload(*param_d_, param_);
    test::upload(*grad_d_, grad_);
    test::upload(*exp_avg_d_, exp_avg_);
    test::upload(*exp_avg_sq_d_, exp_avg_sq_);
    std::vector<cuda::AdamWTensor> tensors;
    for (size_t i = 0; i < shapes.size(); ++i) {
      cuda::AdamWTensor t;
      t.main_param = param_d_->get() + offsets_[i];
      t.main_grad = grad_d_->get() + offsets_[i];
      t.exp_avg = exp_avg_d_->get() + offsets_[i];
      t.exp_avg_sq = exp_avg_sq_d_->get() + offsets_[i];
      t.model_param = shapes[i].model_copy ? model_d_->get() + offsets_[i] : nullptr;
      t.numel = shapes[i].numel;
      t.apply_weight_decay = shapes[i].decay ? 1 : 0;
      t.decoupled_lr = shapes[i].decoupled ? 1 : 0;
      tensors.push_back(t);
    }
    table_ = std::make_unique<cuda::MultiTensorTable>(tensors);
  }

  const cuda::MultiTensorTable& table() const { return *table_; }
  const std::vector<float>& host_param() const { return param_; }
  const std::vector<float>& host_grad() const { return grad_; }
  const std::vector<int64_t>& offsets() const { return offsets_; }
  std::vector<float> param() const { return test::download(*param_d_); }
  std::vector<float> grad() const { return test::download(*grad_d_); }
  std::vector<float> exp_avg() const { return test::download(*exp_avg_d_); }
  std::vector<float> exp_avg_sq() const { return test::download(*exp_avg_sq_d_); }
  std::vector<float> model() const { return test::download_bf16(*model_d_); }

 private:
  int64_t total_ = 0;
  std::vector<int64_t> offsets_;
  std::vector<float> param_, grad_, exp_avg_, exp_avg_sq_;
  std::unique_ptr<DeviceBuffer<float>> param_d_, grad_d_, exp_avg_d_, exp_avg_sq_d_;
  std::unique_ptr<DeviceBuffer<bf16>> model_d_;
  std::unique_ptr<cuda::MultiTensorTable> table_;
};

// Index of the first element whose bits differ (-1: none).
int64_t first_bit_difference(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return int64_t(i);
  return -1;
}

float device_norm(const FlatOptimizerState& state, OptimizerKernelVariant variant) {
  DeviceBuffer<float> norm(1);
  DeviceBuffer<unsigned char> workspace(cuda::grad_norm_workspace_bytes(state.table()));
  cuda::global_grad_norm(state.table(), norm.get(), workspace.get(), workspace.size(), nullptr, variant);
  return test::download(norm)[0];
}

TEST(OptimizerKernelsGpu, VectorizedAdamWIsBitwiseTheScalarKernel) {
  MEGATUNE_REQUIRE_GPU();
  FlatOptimizerState scalar(kShapes, 0, 700), vectorized(kShapes, 0, 700);
  ASSERT_EQ(scalar.table().num_chunks(), 4 + 1 + 2 + 1 + 1 + 2);
  // Both variants clip by the same device norm (half of it: clipping is active), over three steps with a
  // changing learning rate; the decay flag differs per tensor.
  const float norm = device_norm(scalar, OptimizerKernelVariant::kScalar);
  DeviceBuffer<float> norm_d(1);
  test::upload(norm_d, std::vector<float>{norm});
  for (int step = 1; step <= 3; ++step) {
    AdamWHyper hyper{.lr = 1e-3f * step, .weight_decay = 0.1f, .step = step, .max_grad_norm = norm / 2};
    cuda::adamw_step(scalar.table(), hyper, norm_d.get(), nullptr, OptimizerKernelVariant::kScalar);
    cuda::adamw_step(vectorized.table(), hyper, norm_d.get(), nullptr, OptimizerKernelVariant::kVectorized);
  }
  EXPECT_EQ(first_bit_difference(vectorized.param(), scalar.param()), -1);
  EXPECT_EQ(first_bit_difference(vectorized.exp_avg(), scalar.exp_avg()), -1);
  EXPECT_EQ(first_bit_difference(vectorized.exp_avg_sq(), scalar.exp_avg_sq()), -1);
  EXPECT_EQ(first_bit_difference(vectorized.model(), scalar.model()), -1);
  // The update did happen, and the tensor without a bf16 copy left its slot of the copy buffer untouched.
  EXPECT_NE(first_bit_difference(vectorized.param(), vectorized.host_param()), -1);
  const std::vector<float> model = vectorized.model();
  const int64_t no_copy = vectorized.offsets().back();
  for (int64_t i = no_copy; i < no_copy + kShapes.back().numel; i += 977) EXPECT_EQ(model[i], 0.0f) << i;
  EXPECT_NE(model[vectorized.offsets()[2] + 99999], 0.0f);  // misaligned tensor's last element written
}

// One step of both kernels over `shapes` against the host reference at each tensor's rate.
void expect_adamw_matches_host(const std::vector<TensorShape>& shapes, const AdamWHyper& hyper) {
  FlatOptimizerState state(shapes, 0, 1100), scalar(shapes, 0, 1100);
  const std::vector<float> p0 = state.param(), m0 = state.exp_avg(), v0 = state.exp_avg_sq();
  cuda::adamw_step(state.table(), hyper, nullptr, nullptr);
  cuda::adamw_step(scalar.table(), hyper, nullptr, nullptr, OptimizerKernelVariant::kScalar);
  const std::vector<float> p = state.param(), m = state.exp_avg(), v = state.exp_avg_sq();
  EXPECT_EQ(first_bit_difference(p, scalar.param()), -1);
  for (size_t i = 0; i < shapes.size(); ++i) {
    const int64_t o = state.offsets()[i], n = shapes[i].numel;
    std::vector<float> rp(p0.begin() + o, p0.begin() + o + n), rm(m0.begin() + o, m0.begin() + o + n),
        rv(v0.begin() + o, v0.begin() + o + n), model(n);
    AdamWHyper own = hyper;
    own.lr = hyper.lr_of(shapes[i].decoupled);
    reference::adamw_step(rp.data(), state.host_grad().data() + o, rm.data(), rv.data(), model.data(), n, own,
                          shapes[i].decay, 1.0f);
    for (int64_t j = 0; j < n; ++j) {
      // A few ulps of the operands: the device fuses multiply-adds the host reference rounds twice.
      const float update = std::fabs(rp[j] - p0[o + j]);
      ASSERT_NEAR(p[o + j], rp[j], 1e-6f * (std::fabs(rp[j]) + update) + 1e-9f)
          << "tensor " << i << " at " << j;
      ASSERT_NEAR(m[o + j], rm[j], 1e-6f * std::fabs(rm[j]) + 1e-9f) << "tensor " << i << " at " << j;
      ASSERT_NEAR(v[o + j], rv[j], 1e-6f * std::fabs(rv[j]) + 1e-12f) << "tensor " << i << " at " << j;
    }
  }
}

TEST(OptimizerKernelsGpu, VectorizedAdamWMatchesTheHostReference) {
  MEGATUNE_REQUIRE_GPU();
  expect_adamw_matches_host(kShapes, {.lr = 2e-3f, .weight_decay = 0.1f, .step = 5, .max_grad_norm = 0});
}

// --decoupled-lr: the flagged tensors (one aligned over chunks, one misaligned, one without decay) step at
// the decoupled rate, the others at lr; a rate 20x the default one moves them visibly further.
TEST(OptimizerKernelsGpu, DecoupledTensorsStepAtTheirOwnRate) {
  MEGATUNE_REQUIRE_GPU();
  std::vector<TensorShape> shapes = kShapes;
  for (size_t i : {0u, 2u, 3u}) shapes[i].decoupled = true;
  const AdamWHyper hyper{
      .lr = 1e-4f, .decoupled_lr = 2e-3f, .weight_decay = 0.1f, .step = 3, .max_grad_norm = 0};
  expect_adamw_matches_host(shapes, hyper);
  FlatOptimizerState flagged(shapes, 0, 1100), plain(kShapes, 0, 1100);
  cuda::adamw_step(flagged.table(), hyper, nullptr, nullptr);
  cuda::adamw_step(plain.table(), hyper, nullptr, nullptr);
  const std::vector<float> a = flagged.param(), b = plain.param(), p0 = plain.host_param();
  const int64_t o = flagged.offsets()[2];
  double moved_flagged = 0, moved_plain = 0;
  for (int64_t j = 0; j < kShapes[2].numel; ++j) {
    moved_flagged += std::fabs(a[o + j] - p0[o + j]);
    moved_plain += std::fabs(b[o + j] - p0[o + j]);
  }
  EXPECT_GT(moved_flagged, 10 * moved_plain);
  const int64_t unflagged = flagged.offsets()[1];  // not decoupled: the same update in both tables
  for (int64_t j = 0; j < kShapes[1].numel; ++j) EXPECT_EQ(a[unflagged + j], b[unflagged + j]);
}

TEST(OptimizerKernelsGpu, GradNormIsDeterministicAndIndependentOfAlignment) {
  MEGATUNE_REQUIRE_GPU();
  // The same tensors once 64-element aligned and once shifted by one element (every buffer misaligned):
  // the vectorized kernel sums each thread's elements in the same order on both paths.
  FlatOptimizerState aligned(kShapes, 0, 300), shifted(kShapes, 1, 300);
  std::vector<reference::GradTensor> grads;
  for (size_t i = 0; i < kShapes.size(); ++i)
    grads.push_back({aligned.host_grad().data() + aligned.offsets()[i], kShapes[i].numel});
  const float expected = reference::global_grad_norm(grads);
  const float vector_aligned = device_norm(aligned, OptimizerKernelVariant::kVectorized);
  const float vector_shifted = device_norm(shifted, OptimizerKernelVariant::kVectorized);
  const float scalar = device_norm(aligned, OptimizerKernelVariant::kScalar);
  EXPECT_EQ(std::memcmp(&vector_aligned, &vector_shifted, sizeof(float)), 0)
      << vector_aligned << " vs " << vector_shifted;
  EXPECT_EQ(device_norm(aligned, OptimizerKernelVariant::kVectorized), vector_aligned);
  EXPECT_NEAR(vector_aligned, expected, 1e-5f * expected);
  EXPECT_NEAR(scalar, expected, 1e-5f * expected);
}

TEST(OptimizerKernelsGpu, VectorizedClipIsBitwiseTheScalarKernelAndANonFiniteNormSkipsAdamW) {
  MEGATUNE_REQUIRE_GPU();
  FlatOptimizerState scalar(kShapes, 0, 500), vectorized(kShapes, 0, 500);
  const float norm = device_norm(scalar, OptimizerKernelVariant::kScalar);
  DeviceBuffer<float> norm_d(1);
  test::upload(norm_d, std::vector<float>{norm});
  cuda::clip_grads_by_norm(scalar.table(), norm_d.get(), norm / 3, nullptr, OptimizerKernelVariant::kScalar);
  cuda::clip_grads_by_norm(vectorized.table(), norm_d.get(), norm / 3, nullptr,
                           OptimizerKernelVariant::kVectorized);
  const std::vector<float> clipped = vectorized.grad();
  EXPECT_EQ(first_bit_difference(clipped, scalar.grad()), -1);
  const float coefficient = adamw_clip_coefficient(norm, norm / 3);
  const int64_t o = vectorized.offsets()[2];  // the misaligned tensor
  for (int64_t j = 0; j < kShapes[2].numel; j += 331)
    EXPECT_EQ(clipped[o + j], vectorized.host_grad()[o + j] * coefficient) << j;

  test::upload(norm_d, std::vector<float>{INFINITY});
  const std::vector<float> before = vectorized.param();
  const AdamWHyper hyper{.lr = 1e-3f, .weight_decay = 0.1f, .step = 1, .max_grad_norm = 1.0f};
  cuda::adamw_step(vectorized.table(), hyper, norm_d.get(), nullptr);
  EXPECT_EQ(first_bit_difference(vectorized.param(), before), -1);
  for (float x : vectorized.model()) ASSERT_EQ(x, 0.0f);  // the bf16 copy was never written
}

}  // namespace
}  // namespace megatune::executor
