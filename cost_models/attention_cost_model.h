// Flash-attention forward and backward cost. Shapes are keyed by (batch*heads, seq_q, seq_kv, head_dim)
// and the causal flag; efficiency = attention FLOPs / (time x peak). Same provenance ladder as GEMMs:
// measured, interpolated, fitted surface, analytic (causal FLOPs halved; backward = 2.5x forward).
#pragma once
#include <map>
#include <tuple>

#include "cost_models/fitted_forms.h"
#include "cost_models/measured_tables.h"
#include "cost_models/op_cost.h"
#include "cost_models/records.h"

namespace megatune::cost_models {

enum class AttentionDirection : unsigned char { kForward, kBackward };
const char* attention_direction_name(AttentionDirection direction);  // "fwd" | "bwd"

class AttentionCostModel {
 public:
  AttentionCostModel(const GpuModel& gpu, const AnalyticDefaults& defaults);
  // An "attention_fwd" or "attention_bwd" kernel_timings row of this GPU.
  void add_measurement(const KernelTiming& timing);
  void set_fitted_surface(AttentionDirection direction, layouts::DType dtype, bool causal,
                          EfficiencySurface surface);
  bool has_fitted_surface(AttentionDirection direction, layouts::DType dtype, bool causal) const;
  bool has_measurements() const { return !measured_.empty(); }
  std::vector<EfficiencySurface::Sample> samples(AttentionDirection direction, layouts::DType dtype,
                                                 bool causal) const;

  OpCost cost(AttentionDirection direction, const layouts::AttentionShape& shape, layouts::DType dtype) const;
  double analytic_time_s(AttentionDirection direction, const layouts::AttentionShape& shape,
                         layouts::DType dtype) const;
  // Forward FLOPs 4*b*h*sq*skv*d (causal: only the unmasked part, half for sq == skv); backward 2.5x.
  static double flops(AttentionDirection direction, const layouts::AttentionShape& shape);
  static ShapeKey shape_key(const layouts::AttentionShape& shape);

 private:
  using Variant = std::tuple<AttentionDirection, layouts::DType, bool>;
  GpuModel gpu_;
  AnalyticDefaults defaults_;
  std::map<Variant, MeasuredShapeTable> measured_;
  std::map<Variant, EfficiencySurface> fitted_;
};

}  // namespace megatune::cost_models
