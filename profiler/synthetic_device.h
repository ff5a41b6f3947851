// SyntheticDevice: a KernelRunner and CollectiveRunner over a roofline model of a GPU, issuing "kernels"
// into a FakeTracer and reading their times back through the same trace-timing path as the CUDA runners.
// For tests, and for `megatune profile --dry-run` on machines without a GPU. Like the executor it has
// attention kernels for head dims 64 and 128 only.
#pragma once
#include <cstdint>

#include "profiler/fake_tracer.h"
#include "profiler/microbenchmark_runner.h"

namespace megatune::profiler {

// The H200's dense BF16 peak and HBM bandwidth in the hardware catalog (the synthetic device's default GPU).
double catalog_h200_peak_flops_per_s();
double catalog_h200_hbm_bytes_per_s();

struct SyntheticDeviceSpec {
  double peak_flops_per_s = catalog_h200_peak_flops_per_s();
  double gemm_efficiency = 0.80;
  double attention_efficiency = 0.45;
  double memory_bytes_per_s = catalog_h200_hbm_bytes_per_s() * 0.8;
  double launch_latency_s = 4e-6;
  double link_bytes_per_s = 450e9 * 0.8;  // per direction
  double collective_latency_s = 15e-6;
  double jitter = 0.02;  // relative spread of repeats (deterministic pattern)
};

class SyntheticDevice : public KernelRunner, public CollectiveRunner {
 public:
  explicit SyntheticDevice(const SyntheticDeviceSpec& spec = {}, int world_size = 1);

  TimingSamples time_gemm(const GemmItem& item, const RepeatPolicy& policy) override;
  TimingSamples time_attention(const AttentionItem& item, const RepeatPolicy& policy) override;
  TimingSamples time_memory_bound(const MemoryBoundItem& item, const RepeatPolicy& policy) override;

  int rank() const override { return 0; }
  int world_size() const override { return world_size_; }
  TimingSamples time_collective(const CollectiveItem& item, const RepeatPolicy& policy) override;

  // The model's noiseless time of each item (what the median should recover).
  double ideal_gemm_s(const GemmItem& item) const;
  double ideal_attention_s(const AttentionItem& item) const;
  double ideal_memory_bound_s(const MemoryBoundItem& item) const;
  double ideal_collective_s(const CollectiveItem& item) const;

  FakeTracer& tracer() { return tracer_; }
  std::int64_t kernels_launched() const { return kernels_launched_; }

 private:
  // Launches `kernels` kernels that together take `time_s`, warm-up runs outside any range, then one range
  // per repeat; returns the per-repeat device times read from the trace.
  std::vector<double> run(const char* name, double time_s, int kernels, const RepeatPolicy& policy);

  SyntheticDeviceSpec spec_;
  int world_size_;
  FakeTracer tracer_;
  std::uint64_t next_range_ = 1;
  std::int64_t kernels_launched_ = 0;
};

}  // namespace megatune::profiler
