// Benchmark: every distinct GEMM of a model's training step (the step program's shapes: forward, data
// gradient, weight gradient into fp32 main grads) through GemmRunner on reproducible random data, with
// cuBLASLt's first heuristic pick against the timed choice GemmRunner makes, and the weight gradients also
// accumulating (beta = 1) as later micro-batches and LM-head chunks run them. The peer is
// bench/peer/gemm_bench.py (torch.matmul on the same shapes) in the same device run.
#include <cuda_runtime.h>

#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "bench/gpu_timing.h"
#include "executor/cuda/cuda_check.h"
#include "executor/cuda/gemm_runner.h"
#include "layouts/model_spec.h"
#include "layouts/parallel_config.h"
#include "layouts/step_program.h"
#include "profiler/cuda/device_fill.h"

namespace cuda = megatune::executor::cuda;
namespace layouts = megatune::layouts;
using megatune::bench::device_alloc;
using megatune::bench::median_ms;

namespace {

struct Shape {
  std::string label;
  cuda::GemmSpec spec;
  bool accumulate = false;
};

// The distinct GEMMs (layer 0 and the LM head) of one iteration of `model` at micro-batch `mbs`, one GPU.
std::vector<Shape> step_gemms(const layouts::ModelSpec& model, int mbs) {
  layouts::ParallelConfig config;
  config.micro_batch_size = mbs;
  const layouts::StepProgram program = layouts::build_step_program(model, config, 0);
  std::vector<Shape> shapes;
  std::set<std::tuple<std::string, std::int64_t, std::int64_t, std::int64_t>> seen;
  for (const layouts::Op& op : program.ops) {
    if (op.kind != layouts::OpKind::kGemm || op.layer > 0) continue;
    if (!seen.insert({op.label, op.m, op.n, op.k}).second) continue;
    Shape s;
    s.label = op.label;
    s.spec.m = op.m, s.spec.n = op.n, s.spec.k = op.k;
    const bool wgrad = op.label.ends_with("_wgrad"), dgrad = op.label.ends_with("_dgrad");
    if (wgrad) {
      s.spec.trans_a = true;
      s.spec.d_type = cuda::GemmDType::kFP32;
      s.accumulate = true;
    } else if (!dgrad) {
      s.spec.trans_b = true;
    }
    shapes.push_back(s);
  }
  return shapes;
}

double time_gemm(cuda::GemmRunner& runner, const cuda::GemmSpec& spec, cuda::GemmArgs args, int repeats) {
  return median_ms([&] { runner.run(spec, args, nullptr); }, 3, repeats);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::pair<std::string, int>> models = {{"gpt-1.3b", 4}, {"llama-1b", 2}};
  if (argc == 3) models = {{argv[1], std::stoi(argv[2])}};
  const int repeats = 20;
  cuda::GemmRunner tuned, heuristic;
  heuristic.set_tuning(false);
  for (const auto& [name, mbs] : models) {
    const layouts::ModelSpec model = layouts::torch_anchor_model(name);
    const std::vector<Shape> shapes = step_gemms(model, mbs);
    std::int64_t max_a = 0, max_b = 0, max_d = 0;
    for (const Shape& s : shapes) {
      max_a = std::max(max_a, s.spec.m * s.spec.k);
      max_b = std::max(max_b, s.spec.k * s.spec.n);
      max_d = std::max(max_d, s.spec.m * s.spec.n);
    }
    cuda::bf16* a = device_alloc<cuda::bf16>(max_a);
    cuda::bf16* b = device_alloc<cuda::bf16>(max_b);
    float* d = device_alloc<float>(max_d);  // bf16 outputs use the first half
    megatune::profiler::cuda::fill_uniform_bf16(a, max_a, -1.0f, 1.0f, 1, nullptr);
    megatune::profiler::cuda::fill_uniform_bf16(b, max_b, -0.05f, 0.05f, 2, nullptr);
    megatune::profiler::cuda::fill_uniform_fp32(d, max_d, -0.01f, 0.01f, 3, nullptr);
    std::printf("GEMMS model=%s mbs=%d (TFLOP/s; median of %d; random operands)\n", name.c_str(), mbs,
                repeats);
    std::printf("  %-14s %6s %6s %6s  %9s %9s %s\n", "gemm", "m", "n", "k", "heuristic", "tuned",
                "weight gradient accumulating (tuned)");
    double total_ms = 0, total_flops = 0;
    for (const Shape& s : shapes) {
      cuda::GemmArgs args;
      args.a = a, args.b = b, args.d = d;
      const double flops = s.spec.flops();
      // Overwriting first (the call GemmRunner tunes on), then, for weight gradients, accumulating as the
      // later micro-batches and LM-head chunks do.
      const double h_ms = time_gemm(heuristic, s.spec, args, repeats);
      const double t_ms = time_gemm(tuned, s.spec, args, repeats);
      std::printf("  %-14s %6lld %6lld %6lld  %9.0f %9.0f", s.label.c_str(), (long long)s.spec.m,
                  (long long)s.spec.n, (long long)s.spec.k, flops / h_ms / 1e9, flops / t_ms / 1e9);
      double engine_ms = t_ms;
      if (s.accumulate) {
        cuda::GemmArgs acc = args;
        acc.beta = 1.0f;
        engine_ms = time_gemm(tuned, s.spec, acc, repeats);
        std::printf("  %.0f", flops / engine_ms / 1e9);
      }
      std::printf("\n");
      total_ms += engine_ms;
      total_flops += flops;
    }
    std::printf("  all distinct GEMMs (weight gradients accumulating): %.0f TFLOP/s\n", total_flops / total_ms / 1e9);
    MEGATUNE_CUDA_CHECK(cudaFree(a));
    MEGATUNE_CUDA_CHECK(cudaFree(b));
    MEGATUNE_CUDA_CHECK(cudaFree(d));
  }
  return 0;
}
