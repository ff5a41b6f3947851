// AttentionCostModel: flash-attention forward/backward, measured -> interpolated -> fitted -> analytic.
#include "cost_models/attention_cost_model.h"

#include <algorithm>

#include "cost_models/hardware_catalog.h"

namespace megatune::cost_models {

const char* attention_direction_name(AttentionDirection direction) {
  return direction == AttentionDirection::kForward ? "fwd" : "bwd";
}

AttentionCostModel::AttentionCostModel(const GpuModel& gpu, const AnalyticDefaults& defaults)
    : gpu_(gpu), defaults_(defaults) {}

double AttentionCostModel::flops(AttentionDirection direction, const layouts::AttentionShape& shape) {
  // Q.K^T over the q/k head dim and P.V over the value head dim (they differ under MLA).
  double forward = 2.0 * static_cast<double>(shape.batch) * static_cast<double>(shape.heads) *
                   static_cast<double>(shape.seq_q) * static_cast<double>(shape.seq_kv) *
                   static_cast<double>(shape.head_dim + shape.value_head_dim());
  if (shape.causal) {
    // Bottom-right aligned mask: query i of seq_q sees seq_kv - seq_q + i + 1 keys; half when seq_q ==
    // seq_kv.
    const double fraction =
        shape.seq_q <= shape.seq_kv
            ? 1.0 - static_cast<double>(shape.seq_q) / (2.0 * static_cast<double>(shape.seq_kv))
            : 0.5 * static_cast<double>(shape.seq_kv) / static_cast<double>(shape.seq_q);
    forward *= fraction;
  }
  return direction == AttentionDirection::kForward ? forward : 2.5 * forward;
}

ShapeKey AttentionCostModel::shape_key(const layouts::AttentionShape& shape) {
  return {shape.batch * shape.heads, shape.seq_q, shape.seq_kv, shape.head_dim};
}

void AttentionCostModel::add_measurement(const KernelTiming& timing) {
  AttentionDirection direction;
  if (timing.op_kind == "attention_fwd") {
    direction = AttentionDirection::kForward;
  } else if (timing.op_kind == "attention_bwd") {
    direction = AttentionDirection::kBackward;
  } else {
    return;
  }
  layouts::AttentionShape shape;
  shape.batch = timing.batch;
  shape.heads = timing.heads;
  shape.kv_heads = timing.kv_heads;
  shape.seq_q = timing.seq_q;
  shape.seq_kv = timing.seq_kv;
  shape.head_dim = timing.head_dim;
  shape.causal = timing.causal;
  if (shape.batch <= 0 || shape.heads <= 0 || shape.seq_q <= 0 || shape.seq_kv <= 0 || shape.head_dim <= 0 ||
      timing.median_s <= 0) {
    return;
  }
  const layouts::DType dtype = parse_dtype(timing.dtype);
  const double ideal_s = flops(direction, shape) / (peak_tflops(gpu_, dtype) * 1e12);
  measured_[{direction, dtype, shape.causal}].add(shape_key(shape), ideal_s / timing.median_s);
}

void AttentionCostModel::set_fitted_surface(AttentionDirection direction, layouts::DType dtype, bool causal,
                                            EfficiencySurface surface) {
  fitted_[{direction, dtype, causal}] = std::move(surface);
}

bool AttentionCostModel::has_fitted_surface(AttentionDirection direction, layouts::DType dtype,
                                            bool causal) const {
  return fitted_.count({direction, dtype, causal}) > 0;
}

std::vector<EfficiencySurface::Sample> AttentionCostModel::samples(AttentionDirection direction,
                                                                   layouts::DType dtype, bool causal) const {
  std::vector<EfficiencySurface::Sample> out;
  const auto table = measured_.find({direction, dtype, causal});
  if (table == measured_.end()) return out;
  const double peak = peak_tflops(gpu_, dtype) * 1e12;
  for (const auto& [key, efficiency] : table->second.entries()) {
    layouts::AttentionShape shape;
    shape.batch = key[0];
    shape.heads = 1;
    shape.seq_q = key[1];
    shape.seq_kv = key[2];
    shape.head_dim = key[3];
    shape.causal = causal;
    EfficiencySurface::Sample sample;
    sample.shape = {static_cast<double>(key[0]), static_cast<double>(key[1]), static_cast<double>(key[2]),
                    static_cast<double>(key[3])};
    sample.efficiency = efficiency;
    sample.ideal_time_s = flops(direction, shape) / peak;
    out.push_back(sample);
  }
  return out;
}

double AttentionCostModel::analytic_time_s(AttentionDirection direction, const layouts::AttentionShape& shape,
                                           layouts::DType dtype) const {
  const double forward_s = flops(AttentionDirection::kForward, shape) /
                           (peak_tflops(gpu_, dtype) * 1e12 * defaults_.attention_forward_efficiency);
  const double compute_s = direction == AttentionDirection::kForward ? forward_s : 2.5 * forward_s;
  return compute_s + defaults_.kernel_launch_latency_s;
}

OpCost AttentionCostModel::cost(AttentionDirection direction, const layouts::AttentionShape& shape,
                                layouts::DType dtype) const {
  if (shape.batch <= 0 || shape.heads <= 0 || shape.seq_q <= 0 || shape.seq_kv <= 0 || shape.head_dim <= 0) {
    return {0.0, Provenance::kAnalytic};
  }
  const double ideal_s = flops(direction, shape) / (peak_tflops(gpu_, dtype) * 1e12);
  const Variant variant{direction, dtype, shape.causal};
  const ShapeKey key = shape_key(shape);
  if (const auto table = measured_.find(variant); table != measured_.end()) {
    if (const auto efficiency = table->second.exact(key))
      return {ideal_s / *efficiency, Provenance::kMeasured};
    if (const auto efficiency = table->second.interpolate(key, defaults_.interpolation_max_ratio)) {
      return {ideal_s / *efficiency, Provenance::kInterpolated};
    }
  }
  if (const auto surface = fitted_.find(variant); surface != fitted_.end()) {
    const double efficiency =
        surface->second.efficiency({static_cast<double>(key[0]), static_cast<double>(key[1]),
                                    static_cast<double>(key[2]), static_cast<double>(key[3])});
    return {ideal_s / efficiency, Provenance::kFitted};
  }
  return {analytic_time_s(direction, shape, dtype), Provenance::kAnalytic};
}

}  // namespace megatune::cost_models
