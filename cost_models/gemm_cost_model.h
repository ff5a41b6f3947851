// GEMM cost: measured exact shape -> measured; measured neighbours within a factor -> interpolated
// efficiency (log space) scaled by the query's FLOPs; a fitted efficiency surface -> fitted; else the
// roofline max(FLOPs / (peak x efficiency), bytes / (HBM x efficiency)) + launch latency -> analytic.
// An FP8 GEMM with no FP8 measurement or fit of this GPU is priced from the bf16 price of its shape by
// fp8_from_bf16_time_s (transferred: a rule, not a measurement of FP8).
#pragma once
#include <cstdint>
#include <map>

#include "cost_models/fitted_forms.h"
#include "cost_models/measured_tables.h"
#include "cost_models/op_cost.h"
#include "cost_models/records.h"

namespace megatune::cost_models {

class GemmCostModel {
 public:
  GemmCostModel(const GpuModel& gpu, const AnalyticDefaults& defaults);
  // A "gemm" kernel_timings row of this GPU (dtype from the row).
  void add_measurement(const KernelTiming& timing);
  void set_fitted_surface(layouts::DType dtype, EfficiencySurface surface);
  bool has_fitted_surface(layouts::DType dtype) const;
  bool has_measurements(layouts::DType dtype) const { return measured_.count(dtype) > 0; }
  // Training samples for a fit: the measured efficiencies of `dtype`.
  std::vector<EfficiencySurface::Sample> samples(layouts::DType dtype) const;

  // (m, k) x (k, n) in `dtype`.
  OpCost cost(std::int64_t m, std::int64_t n, std::int64_t k, layouts::DType dtype) const;
  double analytic_time_s(std::int64_t m, std::int64_t n, std::int64_t k, layouts::DType dtype) const;
  // Whether FP8 GEMMs are priced from this GPU's FP8 records (measurements or a fit), not transferred.
  bool prices_fp8_from_records() const {
    return has_measurements(layouts::DType::kFP8) || has_fitted_surface(layouts::DType::kFP8);
  }
  // The FP8 time of a GEMM whose bf16 time is bf16_s (the rule and its source: gemm_cost_model.cpp), and
  // the factor it divides the time above the launch latency by (1.90 on H200).
  double fp8_from_bf16_time_s(double bf16_s, std::int64_t m, std::int64_t n, std::int64_t k) const;
  double fp8_speedup_over_bf16() const;
  static double flops(std::int64_t m, std::int64_t n, std::int64_t k) { return 2.0 * m * n * k; }

 private:
  double peak_flops_per_s(layouts::DType dtype) const;
  GpuModel gpu_;
  AnalyticDefaults defaults_;
  std::map<layouts::DType, MeasuredShapeTable> measured_;
  std::map<layouts::DType, EfficiencySurface> fitted_;
};

}  // namespace megatune::cost_models
