// GemmCostModel: measured -> interpolated -> fitted -> roofline.
#include "cost_models/gemm_cost_model.h"

#include <algorithm>

#include "cost_models/hardware_catalog.h"

namespace megatune::cost_models {
namespace {

// FP8 efficiency over bf16 efficiency (each against its own dense peak) of cuBLASLt's GEMMs on Hopper at
// the same shapes: on one H200 the GEMMs of gpt-1.3b's step (seq 2048, mbs 4) ran at 1302 TFLOP/s with
// FP8 linears against 684 TFLOP/s in bf16 (bench/RESULTS.md, 2026-12-03, CUDA events around each op):
// (1302 / 1978.9) / (684 / 989.4) = 0.952. A kernel-level figure: the step times of those runs (125.6 ms
// against 137.8 ms) were not used, and stay a check of the whole prediction (GEMMs, casts, the rest).
constexpr double kFp8OverBf16Efficiency = 0.952;

}  // namespace

GemmCostModel::GemmCostModel(const GpuModel& gpu, const AnalyticDefaults& defaults)
    : gpu_(gpu), defaults_(defaults) {}

double GemmCostModel::peak_flops_per_s(layouts::DType dtype) const { return peak_tflops(gpu_, dtype) * 1e12; }

void GemmCostModel::add_measurement(const KernelTiming& timing) {
  if (timing.m <= 0 || timing.n <= 0 || timing.k <= 0 || timing.median_s <= 0) return;
  const layouts::DType dtype = parse_dtype(timing.dtype);
  const double ideal_s = flops(timing.m, timing.n, timing.k) / peak_flops_per_s(dtype);
  measured_[dtype].add({timing.m, timing.n, timing.k, 1}, ideal_s / timing.median_s);
}

void GemmCostModel::set_fitted_surface(layouts::DType dtype, EfficiencySurface surface) {
  fitted_[dtype] = std::move(surface);
}

bool GemmCostModel::has_fitted_surface(layouts::DType dtype) const { return fitted_.count(dtype) > 0; }

std::vector<EfficiencySurface::Sample> GemmCostModel::samples(layouts::DType dtype) const {
  std::vector<EfficiencySurface::Sample> out;
  const auto table = measured_.find(dtype);
  if (table == measured_.end()) return out;
  for (const auto& [shape, efficiency] : table->second.entries()) {
    EfficiencySurface::Sample sample;
    sample.shape = {static_cast<double>(shape[0]), static_cast<double>(shape[1]),
                    static_cast<double>(shape[2]), 1.0};
    sample.efficiency = efficiency;
    sample.ideal_time_s = flops(shape[0], shape[1], shape[2]) / peak_flops_per_s(dtype);
    out.push_back(sample);
  }
  return out;
}

double GemmCostModel::analytic_time_s(std::int64_t m, std::int64_t n, std::int64_t k,
                                      layouts::DType dtype) const {
  const double compute_s = flops(m, n, k) / (peak_flops_per_s(dtype) * defaults_.gemm_compute_efficiency);
  const double bytes =
      static_cast<double>(m * k + k * n + m * n) * static_cast<double>(layouts::dtype_bytes(dtype));
  const double memory_s = bytes / (gpu_.hbm_bandwidth_bytes_per_s * defaults_.memory_bandwidth_efficiency);
  return std::max(compute_s, memory_s) + defaults_.kernel_launch_latency_s;
}

// The rule: the launch latency stays; the rest runs at the FP8 peak over the bf16 peak (2x on Hopper) times
// kFp8OverBf16Efficiency faster (1.90x on H200), but never below the FP8 roofline of the GEMM's bytes (FP8
// operands, a bf16 output). Small GEMMs, bound by latency or bytes, gain less than large ones, as measured.
double GemmCostModel::fp8_speedup_over_bf16() const {
  return peak_flops_per_s(layouts::DType::kFP8) / peak_flops_per_s(layouts::DType::kBF16) *
         kFp8OverBf16Efficiency;
}

double GemmCostModel::fp8_from_bf16_time_s(double bf16_s, std::int64_t m, std::int64_t n,
                                           std::int64_t k) const {
  const double latency_s = defaults_.kernel_launch_latency_s;
  const double speedup = fp8_speedup_over_bf16();
  const double bytes = static_cast<double>(m * k + k * n) + 2.0 * static_cast<double>(m * n);
  const double memory_s = bytes / (gpu_.hbm_bandwidth_bytes_per_s * defaults_.memory_bandwidth_efficiency);
  return latency_s + std::max(std::max(bf16_s - latency_s, 0.0) / speedup, memory_s);
}

OpCost GemmCostModel::cost(std::int64_t m, std::int64_t n, std::int64_t k, layouts::DType dtype) const {
  if (m <= 0 || n <= 0 || k <= 0) return {0.0, Provenance::kAnalytic};
  if (dtype == layouts::DType::kFP8 && !prices_fp8_from_records()) {
    const OpCost bf16 = cost(m, n, k, layouts::DType::kBF16);
    return {fp8_from_bf16_time_s(bf16.time_s, m, n, k), weaker(bf16.provenance, Provenance::kTransferred)};
  }
  const double ideal_s = flops(m, n, k) / peak_flops_per_s(dtype);
  const ShapeKey shape{m, n, k, 1};
  if (const auto table = measured_.find(dtype); table != measured_.end()) {
    if (const auto efficiency = table->second.exact(shape))
      return {ideal_s / *efficiency, Provenance::kMeasured};
    if (const auto efficiency = table->second.interpolate(shape, defaults_.interpolation_max_ratio)) {
      return {ideal_s / *efficiency, Provenance::kInterpolated};
    }
  }
  if (const auto surface = fitted_.find(dtype); surface != fitted_.end()) {
    const double efficiency = surface->second.efficiency(
        {static_cast<double>(m), static_cast<double>(n), static_cast<double>(k), 1.0});
    return {ideal_s / efficiency, Provenance::kFitted};
  }
  return {analytic_time_s(m, n, k, dtype), Provenance::kAnalytic};
}

}  // namespace megatune::cost_models
