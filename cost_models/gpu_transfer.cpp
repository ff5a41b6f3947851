// GpuTransfer: the achieved fraction of the profiled GPU's roofline, applied to the target's roofline.
#include "cost_models/gpu_transfer.h"

#include <algorithm>

#include "cost_models/gemm_cost_model.h"
#include "cost_models/hardware_catalog.h"

namespace megatune::cost_models {

GpuTransfer::GpuTransfer(const GpuModel& profiled, const GpuModel& target, double kernel_launch_latency_s)
    : profiled_(profiled), target_(target), kernel_launch_latency_s_(kernel_launch_latency_s) {}

double GpuTransfer::roofline_transfer_s(double profiled_time_s, double flops, double bytes,
                                        layouts::DType dtype) const {
  const double latency_s = std::min(profiled_time_s, kernel_launch_latency_s_);
  const double work_s = profiled_time_s - latency_s;
  if (work_s <= 0) return profiled_time_s;
  const double profiled_roofline_s =
      std::max(flops / (peak_tflops(profiled_, dtype) * 1e12), bytes / profiled_.hbm_bandwidth_bytes_per_s);
  const double target_roofline_s =
      std::max(flops / (peak_tflops(target_, dtype) * 1e12), bytes / target_.hbm_bandwidth_bytes_per_s);
  if (profiled_roofline_s <= 0) return profiled_time_s;
  const double fraction_of_roofline = profiled_roofline_s / work_s;
  return latency_s + target_roofline_s / fraction_of_roofline;
}

double GpuTransfer::gemm_time_s(double profiled_time_s, std::int64_t m, std::int64_t n, std::int64_t k,
                                layouts::DType dtype) const {
  const double bytes = static_cast<double>(m * k + k * n + m * n) * layouts::dtype_bytes(dtype);
  return roofline_transfer_s(profiled_time_s, GemmCostModel::flops(m, n, k), bytes, dtype);
}

double GpuTransfer::attention_time_s(double profiled_time_s, AttentionDirection direction,
                                     const layouts::AttentionShape& shape, layouts::DType dtype) const {
  // Flash attention reads Q, K, V and writes O once (backward: also dO, dQ, dK, dV).
  const double rows_q = static_cast<double>(shape.batch) * shape.heads * shape.seq_q;
  const double kv_heads = shape.kv_heads > 0 ? shape.kv_heads : shape.heads;
  const double rows_kv = static_cast<double>(shape.batch) * kv_heads * shape.seq_kv;
  const double qk = static_cast<double>(shape.head_dim), v = static_cast<double>(shape.value_head_dim());
  const double forward_bytes = (rows_q * (qk + v) + rows_kv * (qk + v)) * layouts::dtype_bytes(dtype);
  const double bytes = direction == AttentionDirection::kForward ? forward_bytes : 2.0 * forward_bytes;
  return roofline_transfer_s(profiled_time_s, AttentionCostModel::flops(direction, shape), bytes, dtype);
}

double GpuTransfer::memory_bound_time_s(double profiled_time_s) const {
  const double latency_s = std::min(profiled_time_s, kernel_launch_latency_s_);
  return latency_s + (profiled_time_s - latency_s) * profiled_.hbm_bandwidth_bytes_per_s /
                         target_.hbm_bandwidth_bytes_per_s;
}

}  // namespace megatune::cost_models
