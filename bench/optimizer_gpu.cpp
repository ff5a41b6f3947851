// Benchmark: the optimizer step's kernels (global gradient norm, AdamW with the bf16 model copy) on the
// parameter tensors of a real model (the engine's ParameterLayout: one flat fp32 buffer per role, every
// tensor 64-element aligned), vectorized against scalar, with achieved GB/s held against a device-to-device
// copy measured in the same run. CUDA-event timing, warm-up, median of repeats.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "bench/gpu_timing.h"
#include "executor/cuda/cuda_check.h"
#include "executor/cuda/optimizer_kernels.h"
#include "executor/model/parameter_layout.h"
#include "executor/model/transformer_config.h"
#include "layouts/model_spec.h"

namespace cuda = megatune::executor::cuda;
using megatune::executor::AdamWHyper;
using megatune::executor::ParameterEntry;
using megatune::executor::ParameterLayout;

namespace {

using megatune::bench::device_alloc;
using megatune::bench::median_ms;

void usage() {
  std::fprintf(stderr,
               "usage: bench_optimizer_gpu [--model NAME] [--repeats N]\n"
               "  NAME: a torch anchor model (default gpt-1.3b; also llama-1b), or any model preset\n");
}

int run(int argc, char** argv) {
  std::string model_name = "gpt-1.3b";
  int repeats = 20;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--model" && i + 1 < argc) {
      model_name = argv[++i];
    } else if (arg == "--repeats" && i + 1 < argc) {
      repeats = std::max(1, std::stoi(argv[++i]));
    } else {
      usage();
      return 2;
    }
  }
  megatune::layouts::ModelSpec spec;
  try {
    spec = megatune::layouts::torch_anchor_model(model_name);
  } catch (const std::exception&) {
    try {
      spec = megatune::layouts::model_preset(model_name);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "bench_optimizer_gpu: %s\n", e.what());
      usage();
      return 2;
    }
  }
  const ParameterLayout layout(megatune::executor::transformer_config_from(spec, 1, 10000.0f, 1e-5f, 0.02f));

  cudaDeviceProp prop{};
  MEGATUNE_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  const int64_t n = layout.total_elements();
  std::printf("device %s; model %s: %zu tensors, %.3f B parameters (%.3f B buffer elements)\n", prop.name,
              model_name.c_str(), layout.entries().size(), layout.parameter_count() / 1e9, n / 1e9);

  // One flat buffer per role, as in the engine (CudaBackend views the arena the same way).
  float* main_param = device_alloc<float>(n);
  float* main_grad = device_alloc<float>(n);
  float* exp_avg = device_alloc<float>(n);
  float* exp_avg_sq = device_alloc<float>(n);
  cuda::bf16* model_param = device_alloc<cuda::bf16>(n);
  float* norm = device_alloc<float>(1);
  // Finite values (0x3c bytes: 0.0115 as fp32; grads 0x3a: 7.1e-4); the timing does not depend on them.
  MEGATUNE_CUDA_CHECK(cudaMemset(main_param, 0x3c, n * sizeof(float)));
  MEGATUNE_CUDA_CHECK(cudaMemset(main_grad, 0x3a, n * sizeof(float)));
  MEGATUNE_CUDA_CHECK(cudaMemset(exp_avg, 0, n * sizeof(float)));
  MEGATUNE_CUDA_CHECK(cudaMemset(exp_avg_sq, 0, n * sizeof(float)));
  std::vector<cuda::AdamWTensor> tensors;
  for (const ParameterEntry& e : layout.entries()) {
    cuda::AdamWTensor t;
    t.main_param = main_param + e.offset;
    t.main_grad = main_grad + e.offset;
    t.exp_avg = exp_avg + e.offset;
    t.exp_avg_sq = exp_avg_sq + e.offset;
    t.model_param = model_param + e.offset;
    t.numel = e.numel();
    t.apply_weight_decay = e.weight_decay ? 1 : 0;
    tensors.push_back(t);
  }
  const cuda::MultiTensorTable table(tensors);
  const int64_t elements = table.total_elements();
  const size_t workspace_bytes = cuda::grad_norm_workspace_bytes(table);
  void* workspace = device_alloc<unsigned char>(workspace_bytes);
  AdamWHyper hyper;
  hyper.lr = 1e-4f;
  hyper.weight_decay = 0.1f;
  hyper.step = 10;
  hyper.max_grad_norm = 1.0f;

  // Device-to-device copy of the fp32 parameters: reads and writes 4 bytes per element.
  const int warmup = 3;
  const double copy_ms = median_ms(
      [&] {
        MEGATUNE_CUDA_CHECK(
            cudaMemcpyAsync(exp_avg, main_param, elements * sizeof(float), cudaMemcpyDeviceToDevice));
      },
      warmup, repeats);
  MEGATUNE_CUDA_CHECK(cudaMemset(exp_avg, 0, n * sizeof(float)));
  const double copy_gbps = 2.0 * 4.0 * elements / (copy_ms * 1e6);

  struct Row {
    std::string name;
    double ms, bytes;
  };
  std::vector<Row> rows;
  for (const auto variant :
       {cuda::OptimizerKernelVariant::kVectorized, cuda::OptimizerKernelVariant::kScalar}) {
    const std::string label = variant == cuda::OptimizerKernelVariant::kVectorized ? "vectorized" : "scalar";
    const double norm_ms =
        median_ms([&] { cuda::global_grad_norm(table, norm, workspace, workspace_bytes, nullptr, variant); },
                  warmup, repeats);
    const double adamw_ms =
        median_ms([&] { cuda::adamw_step(table, hyper, norm, nullptr, variant); }, warmup, repeats);
    rows.push_back({"grad norm, " + label, norm_ms, 4.0 * elements});
    rows.push_back({"AdamW, " + label, adamw_ms, double(cuda::kAdamWBytesPerElement) * elements});
    rows.push_back(
        {"norm + AdamW, " + label, norm_ms + adamw_ms, double(4 + cuda::kAdamWBytesPerElement) * elements});
  }
  MEGATUNE_CUDA_CHECK(cudaDeviceSynchronize());
  float norm_host = 0;
  MEGATUNE_CUDA_CHECK(cudaMemcpy(&norm_host, norm, sizeof(float), cudaMemcpyDeviceToHost));

  std::printf("device-to-device copy of %.2f GB: %.3f ms, %.0f GB/s (read + write)\n", 4.0 * elements / 1e9,
              copy_ms, copy_gbps);
  std::printf("%-26s %10s %10s %10s %14s\n", "kernel", "ms", "GB moved", "GB/s", "of copy GB/s");
  for (const Row& r : rows)
    std::printf("%-26s %10.3f %10.2f %10.0f %13.1f%%\n", r.name.c_str(), r.ms, r.bytes / 1e9,
                r.bytes / (r.ms * 1e6), 100.0 * (r.bytes / (r.ms * 1e6)) / copy_gbps);
  std::printf("floor at copy bandwidth (4 + %lld bytes/param): %.3f ms; last grad norm %.4g\n",
              static_cast<long long>(cuda::kAdamWBytesPerElement),
              (4.0 + cuda::kAdamWBytesPerElement) * elements / (copy_gbps * 1e6), norm_host);

  for (void* p :
       {static_cast<void*>(main_param), static_cast<void*>(main_grad), static_cast<void*>(exp_avg),
        static_cast<void*>(exp_avg_sq), static_cast<void*>(model_param), static_cast<void*>(norm), workspace})
    MEGATUNE_CUDA_CHECK(cudaFree(p));
  return 0;
}
}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_optimizer_gpu: %s\n", e.what());
    return 1;
  }
}
