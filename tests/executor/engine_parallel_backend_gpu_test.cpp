// The Backend hooks of the parallel runtime on the CUDA backend against the CPU backend: scale(), a
// grad_norm() over the tensors flagged in_grad_norm only, set_grad_norm() clipping the next AdamW step, and a
// non-finite norm set from outside skipping it.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "executor/cpu/cpu_backend.h"
#include "executor/cuda/cuda_backend.h"

namespace megatune::executor {
namespace {

constexpr std::int64_t kSizes[] = {70001, 129, 65536 * 2 + 3};
constexpr std::int64_t kTotal = 70016 + 192 + 65536 * 2 + 3;

// Flat fp32 buffers and the optimizer table over them (the middle tensor left out of the norm).
struct Optimizer {
  explicit Optimizer(Backend& b) : backend(b) {
    backend.reserve_arena(5 * kTotal * 4 + 4096);
    for (Tensor* t : {&params, &grads, &exp_avg, &exp_avg_sq})
      *t = backend.allocate(DType::kFP32, 1, kTotal, "t");
    std::int64_t offset = 0;
    std::vector<OptimizerTensor> table;
    for (int i = 0; i < 3; ++i) {
      auto view = [&](Tensor t) {
        Tensor v = t;
        v.data = static_cast<float*>(t.data) + offset;
        v.cols = v.row_stride = kSizes[i];
        return v;
      };
      OptimizerTensor o{view(params), view(grads), view(exp_avg), view(exp_avg_sq), Tensor{}, i != 1};
      o.in_grad_norm = i != 1;
      table.push_back(o);
      offset = (offset + kSizes[i] + 63) / 64 * 64;
    }
    backend.prepare_optimizer(table);
  }
  void upload(const std::vector<float>& p, const std::vector<float>& g) {
    backend.upload(params, p.data());
    backend.upload(grads, g.data());
    backend.fill_zero(exp_avg);
    backend.fill_zero(exp_avg_sq);
  }
  std::vector<float> read(Tensor t) {
    std::vector<float> host(kTotal);
    backend.download(t, host.data());
    return host;
  }
  Backend& backend;
  Tensor params, grads, exp_avg, exp_avg_sq;
};

std::vector<float> random_values(unsigned seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(kTotal);
  for (float& x : v) x = normal(rng);
  return v;
}

TEST(CudaParallelHooks, ScaleNormSubsetAndExternalNormMatchTheCpu) {
  if (CudaBackend::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  CpuBackend cpu;
  CudaBackend gpu(0);
  Optimizer c(cpu), g(gpu);
  const std::vector<float> p = random_values(1, 1.0f), grad = random_values(2, 0.1f);
  for (Optimizer* o : {&c, &g}) {
    o->upload(p, grad);
    o->backend.scale(o->grads, 0.5f, {});
  }
  EXPECT_EQ(c.read(c.grads), g.read(g.grads));  // x * 0.5 is exact
  double sum = 0.0;                             // the norm of tensors 0 and 2 only
  for (std::int64_t i = 0; i < kSizes[0]; ++i) sum += 0.25 * grad[i] * grad[i];
  for (std::int64_t i = 70016 + 192; i < kTotal; ++i) sum += 0.25 * grad[i] * grad[i];
  const float cpu_norm = cpu.grad_norm({}), gpu_norm = gpu.grad_norm({});
  EXPECT_NEAR(cpu_norm, std::sqrt(sum), 1e-5 * std::sqrt(sum));
  EXPECT_NEAR(gpu_norm, std::sqrt(sum), 1e-5 * std::sqrt(sum));

  AdamWHyper hyper;
  hyper.lr = 1e-2f;
  hyper.max_grad_norm = 1.0f;
  for (Optimizer* o : {&c, &g}) {
    o->backend.set_grad_norm(40.0f);  // an outside (global) norm: clip = 1 / 40
    o->backend.adamw_step(hyper, {});
  }
  const std::vector<float> cpu_params = c.read(c.params), gpu_params = g.read(g.params);
  const std::vector<float> cpu_m = c.read(c.exp_avg), gpu_m = g.read(g.exp_avg);
  for (std::int64_t i = 0; i < kTotal; i += 97) {
    ASSERT_NEAR(gpu_params[i], cpu_params[i], 1e-6f) << i;
    ASSERT_NEAR(gpu_m[i], cpu_m[i], 1e-9f) << i;
  }
  EXPECT_NEAR(cpu_m[5], 0.1f * 0.5f * grad[5] / (40.0f + 1e-6f), 1e-9f);  // (1 - beta1) * clipped grad

  for (Optimizer* o : {&c, &g}) {
    o->backend.set_grad_norm(std::numeric_limits<float>::quiet_NaN());
    o->backend.adamw_step(hyper, {});
  }
  EXPECT_EQ(c.read(c.params), cpu_params);  // skipped
  EXPECT_EQ(g.read(g.params), gpu_params);
}

}  // namespace
}  // namespace megatune::executor
