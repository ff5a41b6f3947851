// Memory-bound kernels (norms, activations, RoPE, cross-entropy, embedding, optimizer, copies, ...):
// time = launch latency + bytes / bandwidth. Measured exact size -> measured; between measured sizes ->
// interpolated (log-log); a fitted latency + bandwidth line per kind -> fitted; else HBM bandwidth x
// default efficiency -> analytic. A kernel that writes FP8 (the casts of FP8 linears, layouts/fp8.h:
// kElementwise ops of dtype kFP8) is measured and fitted as a series of its own ("elementwise:fp8"); until
// that series has a measurement or a fit, it is priced by its bytes from its kind's series (the bf16
// element-wise kernels), as any memory-bound op.
#pragma once
#include <map>
#include <string>

#include "cost_models/fitted_forms.h"
#include "cost_models/measured_tables.h"
#include "cost_models/op_cost.h"
#include "cost_models/records.h"

namespace megatune::cost_models {

// The series a kernel_timings row is measured and fitted under: its op_kind, with ":fp8" for dtype fp8.
std::string memory_bound_series(const std::string& op_kind, layouts::DType dtype);
std::string memory_bound_series(const KernelTiming& timing);

class MemoryBoundCostModel {
 public:
  MemoryBoundCostModel(const GpuModel& gpu, const AnalyticDefaults& defaults);
  // A kernel_timings row of a memory-bound kind (op_kind = layouts::op_kind_name of the kind).
  void add_measurement(const KernelTiming& timing);
  void set_fit(const std::string& series, LinearTimeModel model);
  bool has_fit(const std::string& series) const;
  const std::map<std::string, MeasuredSeries>& measured() const { return measured_; }

  // A kernel of `kind` writing `dtype` (kFP8: from the FP8 series when it has data, else as the kind's).
  OpCost cost(layouts::OpKind kind, double bytes, layouts::DType dtype = layouts::DType::kBF16) const;
  OpCost cost(const std::string& series, double bytes) const;
  double analytic_time_s(double bytes) const;

 private:
  GpuModel gpu_;
  AnalyticDefaults defaults_;
  std::map<std::string, MeasuredSeries> measured_;
  std::map<std::string, LinearTimeModel> fitted_;
};

}  // namespace megatune::cost_models
