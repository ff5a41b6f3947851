// Memory-bound kernels (norms, activations, RoPE, cross-entropy, embedding, optimizer, copies, ...):
// time = launch latency + bytes / bandwidth. Measured exact size -> measured; between measured sizes ->
// interpolated (log-log); a fitted latency + bandwidth line per kind -> fitted; else HBM bandwidth x
// default efficiency -> analytic.
#pragma once
#include <map>
#include <string>

#include "cost_models/fitted_forms.h"
#include "cost_models/measured_tables.h"
#include "cost_models/op_cost.h"
#include "cost_models/records.h"

namespace megatune::cost_models {

class MemoryBoundCostModel {
 public:
  MemoryBoundCostModel(const GpuModel& gpu, const AnalyticDefaults& defaults);
  // A kernel_timings row of a memory-bound kind (op_kind = layouts::op_kind_name of the kind).
  void add_measurement(const KernelTiming& timing);
  void set_fit(const std::string& op_kind, LinearTimeModel model);
  bool has_fit(const std::string& op_kind) const;
  const std::map<std::string, MeasuredSeries>& measured() const { return measured_; }

  OpCost cost(layouts::OpKind kind, double bytes) const;
  OpCost cost(const std::string& op_kind, double bytes) const;
  double analytic_time_s(double bytes) const;

 private:
  GpuModel gpu_;
  AnalyticDefaults defaults_;
  std::map<std::string, MeasuredSeries> measured_;
  std::map<std::string, LinearTimeModel> fitted_;
};

}  // namespace megatune::cost_models
