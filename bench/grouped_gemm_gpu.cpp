// Benchmark: an MoE layer's expert GEMMs (SwiGLU experts: fc1 h -> 2 ffn, fc2 ffn -> h; forward, data and
// weight gradients, the weight gradients into fp32) over uneven per-expert row counts, three ways:
//   ragged   one cuBLASLt GEMM per expert on bucketed plans (GemmRunner::run_ragged: the executor's choice)
//   exact    one cuBLASLt GEMM per expert on a plan per exact size (GemmRunner::run), counts fixed
//   grouped  cuBLAS's grouped GEMM (cublasGemmGroupedBatchedEx, one call per pass; the per-call upload of
//            the pointer arrays is timed with it)
// and, as a ceiling, one GEMM over all rows with one expert's weights (the same FLOPs, no split). Also the
// cost of exact plans when the counts change every step (each new size is planned and tuned).
//   bench_grouped_gemm_gpu [--tokens T] [--hidden H] [--ffn F] [--experts E] [--topk K] [--iters N]
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "bench/gpu_timing.h"
#include "executor/cuda/cuda_check.h"
#include "executor/cuda/gemm_runner.h"

namespace cuda = megatune::executor::cuda;
using megatune::bench::device_alloc;
using megatune::bench::fill_random;
using megatune::bench::median_ms;

namespace {

std::int64_t arg(int argc, char** argv, const char* name, std::int64_t fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return std::stoll(argv[i + 1]);
  return fallback;
}

// One pass over the experts (row-major, GemmSpec's conventions; the spec's row count, m or k, left 0): A
// advances by rows; B by experts (weights) or by rows (weight gradients); D by rows, or by experts (fp32
// weight gradients).
struct Pass {
  const char* name;
  cuda::GemmSpec spec;  // sizes with the row count left 0
  bool rows_in_k;       // weight gradients: the row count is k
  const cuda::bf16* a;  // activations (rows, ...) for m-ragged; dy (rows, m) for k-ragged
  const cuda::bf16* b;  // weights (E, ...) for m-ragged; x (rows, n) for k-ragged
  void* d;              // (rows, n) bf16, or (E, m, n) fp32 for k-ragged
  std::int64_t a_row, b_row_or_expert, d_row_or_expert;  // elements per row / per expert
};

cuda::GemmSpec expert_spec(const Pass& p, std::int64_t rows) {
  cuda::GemmSpec s = p.spec;
  (p.rows_in_k ? s.k : s.m) = rows;
  return s;
}

cuda::GemmArgs expert_args(const Pass& p, std::int64_t first_row, int expert) {
  cuda::GemmArgs a;
  a.a = p.a + first_row * p.a_row;
  if (p.rows_in_k) {
    a.b = p.b + first_row * p.b_row_or_expert;
    a.d = static_cast<float*>(p.d) + expert * p.d_row_or_expert;
  } else {
    a.b = p.b + expert * p.b_row_or_expert;
    a.d = static_cast<cuda::bf16*>(p.d) + first_row * p.d_row_or_expert;
  }
  return a;
}

void run_loop(cuda::GemmRunner& runner, const Pass& p, const std::vector<std::int64_t>& counts, bool ragged) {
  std::int64_t first = 0;
  for (std::size_t e = 0; e < counts.size(); ++e) {
    if (counts[e] > 0) {
      const cuda::GemmSpec s = expert_spec(p, counts[e]);
      const cuda::GemmArgs a = expert_args(p, first, int(e));
      ragged ? runner.run_ragged(s, a, nullptr) : runner.run(s, a, nullptr);
    }
    first += counts[e];
  }
}

// cublasGemmGroupedBatchedEx over the experts (one group each), column-major as GemmRunner maps it.
struct Grouped {
  cublasHandle_t handle = nullptr;
  const void** device_pointers = nullptr;  // A, B, C arrays of E each
  const void** pinned_pointers = nullptr;
  // The call's status: cuBLAS refuses some type combinations (CUBLAS_STATUS_NOT_SUPPORTED).
  cublasStatus_t run(const Pass& p, const std::vector<std::int64_t>& counts) {
    const cuda::GemmSpec base = p.spec;
    std::vector<cublasOperation_t> ta, tb;
    std::vector<int> m, n, k, lda, ldb, ldc, size;
    std::vector<float> alpha, beta;
    const std::size_t E = counts.size();
    std::int64_t first = 0;
    int groups = 0;
    for (std::size_t e = 0; e < E; ++e) {
      const std::int64_t rows = counts[e];
      const std::int64_t at = first;
      first += rows;
      if (rows == 0) continue;
      const cuda::GemmSpec s = expert_spec(p, rows);
      const cuda::GemmArgs a = expert_args(p, at, int(e));
      ta.push_back(s.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N);  // cuBLAS A = our B
      tb.push_back(s.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N);
      m.push_back(int(s.n)), n.push_back(int(s.m)), k.push_back(int(s.k));
      lda.push_back(int(s.trans_b ? s.k : s.n)), ldb.push_back(int(s.trans_a ? s.m : s.k));
      ldc.push_back(int(s.n)), size.push_back(1), alpha.push_back(1.0f), beta.push_back(0.0f);
      pinned_pointers[groups] = a.b;
      pinned_pointers[E + groups] = a.a;
      pinned_pointers[2 * E + groups] = a.d;
      ++groups;
    }
    MEGATUNE_CUDA_CHECK(cudaMemcpyAsync(device_pointers, pinned_pointers, 3 * E * sizeof(void*),
                                        cudaMemcpyHostToDevice, nullptr));
    const cudaDataType_t c_type = base.d_type == cuda::GemmDType::kFP32 ? CUDA_R_32F : CUDA_R_16BF;
    const cublasStatus_t status =
        cublasGemmGroupedBatchedEx(handle, ta.data(), tb.data(), m.data(), n.data(), k.data(), alpha.data(),
                                   device_pointers, CUDA_R_16BF, lda.data(), device_pointers + E, CUDA_R_16BF,
                                   ldb.data(), beta.data(), const_cast<void* const*>(device_pointers + 2 * E),
                                   c_type, ldc.data(), groups, size.data(), CUBLAS_COMPUTE_32F);
    // The pinned arrays are rewritten by the next call: wait for this copy first.
    MEGATUNE_CUDA_CHECK(cudaStreamSynchronize(nullptr));
    return status;
  }
};

std::vector<std::int64_t> uneven_counts(std::int64_t rows, int experts, std::uint32_t seed, double skew) {
  // Loads proportional to 1 + skew * u (u uniform), rounded so that they sum to `rows`.
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<double> w(experts);
  double sum = 0;
  for (double& x : w) sum += (x = 1.0 + skew * u(rng));
  std::vector<std::int64_t> counts(experts);
  std::int64_t left = rows;
  for (int e = 0; e < experts; ++e) left -= (counts[e] = std::int64_t(rows * w[e] / sum));
  counts[0] += left;
  return counts;
}

}  // namespace

int main(int argc, char** argv) {
  const std::int64_t T = arg(argc, argv, "--tokens", 4096), h = arg(argc, argv, "--hidden", 2048),
                     ffn = arg(argc, argv, "--ffn", 4096), E = arg(argc, argv, "--experts", 8),
                     K = arg(argc, argv, "--topk", 2);
  const int iters = int(arg(argc, argv, "--iters", 20));
  const std::int64_t R = T * K;
  cuda::bf16* x = device_alloc<cuda::bf16>(R * 2 * ffn);  // big enough for every activation operand
  cuda::bf16* y = device_alloc<cuda::bf16>(R * 2 * ffn);
  cuda::bf16* w = device_alloc<cuda::bf16>(E * 2 * ffn * h);
  float* dw = device_alloc<float>(E * 2 * ffn * h);
  fill_random(x, R * 2 * ffn, 1);
  fill_random(w, E * 2 * ffn * h, 2);
  // fc1 forward (m rows, 2 ffn, h), fc2 forward (rows, h, ffn), fc2 data grad (rows, ffn, h), fc1 data grad
  // (rows, h, 2 ffn), fc2 weight grad (h, ffn, rows), fc1 weight grad (2 ffn, h, rows).
  const std::vector<Pass> passes = {
      {"fc1 fwd", cuda::GemmSpec::linear_forward(0, 2 * ffn, h), false, x, w, y, h, 2 * ffn * h, 2 * ffn},
      {"fc2 fwd", cuda::GemmSpec::linear_forward(0, h, ffn), false, x, w, y, ffn, h * ffn, h},
      {"fc2 dgrad", cuda::GemmSpec::linear_backward_data(0, h, ffn), false, x, w, y, h, h * ffn, ffn},
      {"fc1 dgrad", cuda::GemmSpec::linear_backward_data(0, 2 * ffn, h), false, x, w, y, 2 * ffn, 2 * ffn * h,
       h},
      {"fc2 wgrad", cuda::GemmSpec::linear_backward_weight(0, h, ffn, cuda::GemmDType::kFP32), true, x, y, dw,
       h, ffn, h * ffn},
      {"fc1 wgrad", cuda::GemmSpec::linear_backward_weight(0, 2 * ffn, h, cuda::GemmDType::kFP32), true, x, y,
       dw, 2 * ffn, h, 2 * ffn * h},
  };
  cuda::GemmRunner ragged_runner, exact_runner;
  Grouped grouped;
  MEGATUNE_CUBLAS_CHECK(cublasCreate(&grouped.handle));
  grouped.device_pointers = device_alloc<const void*>(3 * E);
  MEGATUNE_CUDA_CHECK(cudaMallocHost(&grouped.pinned_pointers, 3 * E * sizeof(void*)));
  void* cublas_workspace = device_alloc<char>(32 << 20);
  MEGATUNE_CUBLAS_CHECK(cublasSetWorkspace(grouped.handle, cublas_workspace, 32 << 20));

  const std::vector<std::int64_t> balanced(E, R / E), uneven = uneven_counts(R, int(E), 7, 1.5);
  std::printf("MEGATUNE grouped-gemm tokens=%lld topk=%lld rows=%lld hidden=%lld ffn=%lld experts=%lld\n",
              (long long)T, (long long)K, (long long)R, (long long)h, (long long)ffn, (long long)E);
  std::printf("  uneven counts:");
  for (std::int64_t c : uneven) std::printf(" %lld", (long long)c);
  std::printf("\n  %-10s %-9s %9s %9s %9s %9s   (ms; TFLOP/s of ragged)\n", "pass", "counts", "ragged",
              "exact", "grouped", "one-GEMM");
  double total[4] = {0, 0, 0, 0};
  for (const Pass& p : passes) {
    for (const auto* counts : {&balanced, &uneven}) {
      const bool is_uneven = counts == &uneven;
      const double ragged = median_ms([&] { run_loop(ragged_runner, p, *counts, true); }, 3, iters);
      const double exact = median_ms([&] { run_loop(exact_runner, p, *counts, false); }, 3, iters);
      const cublasStatus_t status = grouped.run(p, *counts);
      const double group =  // -1: refused
          status == CUBLAS_STATUS_SUCCESS ? median_ms([&] { grouped.run(p, *counts); }, 3, iters) : -1.0;
      if (status != CUBLAS_STATUS_SUCCESS)
        std::printf("  (cuBLAS's grouped GEMM refused %s: status %d)\n", p.name, int(status));
      const cuda::GemmSpec whole = expert_spec(p, R);
      const cuda::GemmArgs whole_args = expert_args(p, 0, 0);
      const double one = median_ms([&] { exact_runner.run(whole, whole_args, nullptr); }, 3, iters);
      const double tflops = whole.flops() / ragged / 1e9;
      std::printf("  %-10s %-9s %9.3f %9.3f %9.3f %9.3f   %.0f\n", p.name, is_uneven ? "uneven" : "balanced",
                  ragged, exact, group, one, tflops);
      if (is_uneven) {
        total[0] += ragged, total[1] += exact, total[2] += group, total[3] += one;
      }
    }
  }
  std::printf("  %-10s %-9s %9.3f %9.3f %9.3f %9.3f   (sum of the six passes, uneven counts)\n", "layer",
              "uneven", total[0], total[1], total[2], total[3]);
  // Counts that change every step: exact plans pay a plan (and its tuning) per new size; ragged plans
  // reuse their buckets.
  std::vector<std::vector<std::int64_t>> steps;
  for (int s = 0; s < 6; ++s) steps.push_back(uneven_counts(R, int(E), 100 + s, 1.5));
  cuda::GemmRunner fresh_exact, fresh_ragged;
  auto changing = [&](cuda::GemmRunner& runner, bool ragged) {
    return median_ms(
        [&, s = 0]() mutable {
          for (const Pass& p : passes) run_loop(runner, p, steps[s % steps.size()], ragged);
          ++s;
        },
        0, int(steps.size()));
  };
  const double changing_exact = changing(fresh_exact, false), changing_ragged = changing(fresh_ragged, true);
  std::printf(
      "  counts changing every step (6 steps, median, planning included): exact %.3f ms (%zu plans), "
      "ragged %.3f ms (%zu plans)\n",
      changing_exact, fresh_exact.cached_plans(), changing_ragged, fresh_ragged.cached_plans());
  cudaFreeHost(grouped.pinned_pointers);
  cublasDestroy(grouped.handle);
  return 0;
}
