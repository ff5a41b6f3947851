// SyntheticDevice: roofline-model runners over a FakeTracer.
#include "profiler/synthetic_device.h"

#include <algorithm>
#include <cmath>

#include "cost_models/hardware_catalog.h"
#include "profiler/trace_timing.h"

namespace megatune::profiler {

double catalog_h200_peak_flops_per_s() {
  return cost_models::HardwareCatalog::embedded().gpu("H200").peak_bf16_tflops * 1e12;
}

double catalog_h200_hbm_bytes_per_s() {
  return cost_models::HardwareCatalog::embedded().gpu("H200").hbm_bandwidth_bytes_per_s;
}

SyntheticDevice::SyntheticDevice(const SyntheticDeviceSpec& spec, int world_size)
    : spec_(spec), world_size_(world_size), tracer_(/*launch_gap_ns=*/1500) {}

double SyntheticDevice::ideal_gemm_s(const GemmItem& item) const {
  const double out_bytes = item.variant == GemmVariant::kBackwardWeight ? 4.0 * 2 : 2.0;  // fp32 read+write
  const double bytes = 2.0 * (item.m * item.k + item.k * item.n) + out_bytes * item.m * item.n;
  return std::max(item.flops() / (spec_.peak_flops_per_s * spec_.gemm_efficiency),
                  bytes / spec_.memory_bytes_per_s) +
         spec_.launch_latency_s;
}

double SyntheticDevice::ideal_attention_s(const AttentionItem& item) const {
  const auto& s = item.shape;
  double flops = 4.0 * s.batch * s.heads * double(s.seq_q) * double(s.seq_kv) * s.head_dim;
  if (s.causal) flops /= 2;
  if (item.backward) flops *= 2.5;
  return flops / (spec_.peak_flops_per_s * spec_.attention_efficiency) + spec_.launch_latency_s;
}

double SyntheticDevice::ideal_memory_bound_s(const MemoryBoundItem& item) const {
  return static_cast<double>(item.bytes) / spec_.memory_bytes_per_s + spec_.launch_latency_s;
}

double SyntheticDevice::ideal_collective_s(const CollectiveItem& item) const {
  const double factor = cost_models::bus_factor(item.op, item.group_size);
  return spec_.collective_latency_s + static_cast<double>(item.bytes) * factor / spec_.link_bytes_per_s;
}

std::vector<double> SyntheticDevice::run(const char* name, double time_s, int kernels,
                                         const RepeatPolicy& policy) {
  const auto per_kernel_ns = static_cast<std::uint64_t>(std::llround(time_s * 1e9 / kernels));
  for (int w = 0; w < policy.warmup; ++w) {
    for (int i = 0; i < kernels; ++i) tracer_.launch(name, per_kernel_ns * 3);  // cold: slower, untimed
  }
  std::vector<std::uint64_t> ids;
  for (int r = 0; r < policy.repeats; ++r) {
    const std::uint64_t id = next_range_++;
    ids.push_back(id);
    // Deterministic jitter, symmetric around 1 so the median is the ideal time.
    const double wobble = 1.0 + spec_.jitter * std::sin(1.7 * static_cast<double>(id));
    TraceRange range(tracer_, id);
    for (int i = 0; i < kernels; ++i) {
      tracer_.launch(name, static_cast<std::uint64_t>(std::llround(per_kernel_ns * wobble)));
      ++kernels_launched_;
    }
  }
  return range_busy_seconds(tracer_.flush(), ids);
}

TimingSamples SyntheticDevice::time_gemm(const GemmItem& item, const RepeatPolicy& policy) {
  return run("synthetic_gemm", ideal_gemm_s(item), 1, policy);
}

TimingSamples SyntheticDevice::time_attention(const AttentionItem& item, const RepeatPolicy& policy) {
  if (item.shape.head_dim != 64 && item.shape.head_dim != 128) return std::nullopt;
  // The backward is three launches (preprocess, main pass, dq conversion), like the executor's.
  return run(item.backward ? "synthetic_attention_bwd" : "synthetic_attention_fwd", ideal_attention_s(item),
             item.backward ? 3 : 1, policy);
}

TimingSamples SyntheticDevice::time_memory_bound(const MemoryBoundItem& item, const RepeatPolicy& policy) {
  return run("synthetic_memory_bound", ideal_memory_bound_s(item), 1, policy);
}

TimingSamples SyntheticDevice::time_collective(const CollectiveItem& item, const RepeatPolicy& policy) {
  if (item.group_size > world_size_) return std::nullopt;
  return run("synthetic_nccl", ideal_collective_s(item), 1, policy);
}

}  // namespace megatune::profiler
