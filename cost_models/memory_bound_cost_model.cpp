// MemoryBoundCostModel: bytes over bandwidth plus launch latency, measured -> interpolated -> fitted ->
// analytic.
#include "cost_models/memory_bound_cost_model.h"

namespace megatune::cost_models {

std::string memory_bound_series(const std::string& op_kind, layouts::DType dtype) {
  return dtype == layouts::DType::kFP8 ? op_kind + ":fp8" : op_kind;
}

std::string memory_bound_series(const KernelTiming& timing) {
  return memory_bound_series(timing.op_kind, parse_dtype(timing.dtype));
}

MemoryBoundCostModel::MemoryBoundCostModel(const GpuModel& gpu, const AnalyticDefaults& defaults)
    : gpu_(gpu), defaults_(defaults) {}

void MemoryBoundCostModel::add_measurement(const KernelTiming& timing) {
  if (timing.bytes <= 0 || timing.median_s <= 0) return;
  measured_[memory_bound_series(timing)].add(timing.bytes, timing.median_s);
}

void MemoryBoundCostModel::set_fit(const std::string& series, LinearTimeModel model) {
  fitted_[series] = model;
}

bool MemoryBoundCostModel::has_fit(const std::string& series) const { return fitted_.count(series) > 0; }

double MemoryBoundCostModel::analytic_time_s(double bytes) const {
  return defaults_.kernel_launch_latency_s +
         bytes / (gpu_.hbm_bandwidth_bytes_per_s * defaults_.memory_bandwidth_efficiency);
}

OpCost MemoryBoundCostModel::cost(layouts::OpKind kind, double bytes, layouts::DType dtype) const {
  if (measured_.empty() && fitted_.empty())
    return {bytes > 0 ? analytic_time_s(bytes) : 0.0, Provenance::kAnalytic};
  const std::string name = layouts::op_kind_name(kind);
  if (dtype == layouts::DType::kFP8) {
    const std::string fp8 = memory_bound_series(name, dtype);
    if (measured_.count(fp8) > 0 || fitted_.count(fp8) > 0) return cost(fp8, bytes);
  }
  return cost(name, bytes);
}

OpCost MemoryBoundCostModel::cost(const std::string& name, double bytes) const {
  if (bytes <= 0) return {0.0, Provenance::kAnalytic};
  if (const auto series = measured_.find(name); series != measured_.end()) {
    const double whole = static_cast<double>(static_cast<std::int64_t>(bytes));
    if (whole == bytes) {
      if (const auto time_s = series->second.exact(static_cast<std::int64_t>(bytes))) {
        return {*time_s, Provenance::kMeasured};
      }
    }
    if (const auto time_s = series->second.interpolate(bytes)) return {*time_s, Provenance::kInterpolated};
  }
  if (const auto fit = fitted_.find(name); fit != fitted_.end()) {
    return {fit->second.time_s(bytes), Provenance::kFitted};
  }
  return {analytic_time_s(bytes), Provenance::kAnalytic};
}

}  // namespace megatune::cost_models
