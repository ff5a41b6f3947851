// GemmCostModel: measured -> interpolated -> fitted -> roofline.
#include "cost_models/gemm_cost_model.h"

#include <algorithm>

#include "cost_models/hardware_catalog.h"

namespace megatune::cost_models {

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

OpCost GemmCostModel::cost(std::int64_t m, std::int64_t n, std::int64_t k, layouts::DType dtype) const {
  if (m <= 0 || n <= 0 || k <= 0) return {0.0, Provenance::kAnalytic};
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
